//! `cordon replay [FILE|-] [--sequential]`: execute recorded assistant messages, one batch
//! per message, with full agent-loop semantics; every event is printed as a JSON line. This is
//! the CI entry point for untrusted model output.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::{AssistantMessage, Message};
use cordon_core::tool::ExecutionMode;
use serde_json::Value;

use crate::cmd::common::{CommonArgs, cancel_on_stop_signal, finish_session};
use crate::output::print_json_line;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// JSONL file of assistant messages (`-` or absent: standard input).
    pub file: Option<PathBuf>,
    /// Run each message's calls one at a time instead of in parallel.
    #[arg(long)]
    pub sequential: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Parse a JSONL transcript: assistant messages are executed; user and tool-result messages
/// (as `cordon run --save` writes them) are context and skipped. The whole input is checked
/// before anything runs.
pub fn parse_transcript(text: &str) -> anyhow::Result<Vec<AssistantMessage>> {
    let mut messages = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value =
            serde_json::from_str(line).with_context(|| format!("line {number}: not valid JSON"))?;
        let role = value.get("role").and_then(Value::as_str).map(str::to_owned);
        match role.as_deref() {
            Some("assistant") | Some("user") | Some("toolResult") => {}
            Some(other) => bail!("line {number}: unknown message role {other:?}"),
            None => bail!("line {number}: missing \"role\" (expected an assistant message)"),
        }
        let message: Message = serde_json::from_value(value).with_context(|| {
            format!(
                "line {number}: not a valid {} message",
                role.unwrap_or_default()
            )
        })?;
        if let Message::Assistant(assistant) = message {
            messages.push(assistant);
        }
    }
    Ok(messages)
}

/// Run `cordon replay`.
pub async fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let ReplayArgs {
        file,
        sequential,
        common,
    } = args;
    let text = match file.as_deref() {
        None => read_stdin()?,
        Some(path) if path.as_os_str() == "-" => read_stdin()?,
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("failed to read {}", path.display()))?,
    };
    let messages = parse_transcript(&text)?;
    let session = common.open_session().await?;
    let mode = if sequential {
        ExecutionMode::Sequential
    } else {
        ExecutionMode::Parallel
    };
    let config = session.agent_config(mode);
    let control = RunControl::new(
        cancel_on_stop_signal(),
        Arc::new(|event: AgentEvent| print_json_line(&event)),
    );
    cordon_core::replay(&config, messages, &control).await;
    Ok(if finish_session(&session).await {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn read_stdin() -> anyhow::Result<String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("failed to read standard input")?;
    Ok(text)
}
