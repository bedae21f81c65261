//! `cordon exec TOOL ARGS_JSON [--json]`: one call through the full pipeline. Exit 0 for a
//! success result, 1 for an error result.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::ToolCall;
use serde_json::Value;

use crate::cmd::common::{CommonArgs, cancel_on_stop_signal, finish_session};
use crate::output::{print_json_line, result_text};

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Tool name (read, write, edit, bash, grep, find, ls).
    pub tool: String,
    /// Arguments as a JSON object; `-` reads them from stdin and `@FILE` from FILE (for
    /// arguments over the kernel's 128 KiB limit on one command-line argument).
    pub args_json: String,
    /// Print the ToolResult as JSON instead of its text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Largest arguments document read from stdin or a file.
const MAX_ARGS_JSON_BYTES: u64 = 256 << 20;

/// The arguments text: as given, or from stdin (`-`) or a file (`@FILE`), bounded.
fn load_args_json(args_json: String) -> anyhow::Result<String> {
    use std::io::Read as _;
    let (source, reader): (String, Box<dyn std::io::Read>) = if args_json == "-" {
        ("stdin".to_owned(), Box::new(std::io::stdin()))
    } else if let Some(path) = args_json.strip_prefix('@') {
        let file = std::fs::File::open(path)
            .with_context(|| format!("failed to open ARGS_JSON file {path}"))?;
        (path.to_owned(), Box::new(file))
    } else {
        return Ok(args_json);
    };
    let mut text = String::new();
    reader
        .take(MAX_ARGS_JSON_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("failed to read ARGS_JSON from {source}"))?;
    if text.len() as u64 > MAX_ARGS_JSON_BYTES {
        bail!("ARGS_JSON from {source} is larger than {MAX_ARGS_JSON_BYTES} bytes");
    }
    Ok(text)
}

/// Run `cordon exec`.
pub async fn exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let ExecArgs {
        tool,
        args_json,
        json,
        common,
    } = args;
    let args_json = load_args_json(args_json)?;
    let shown = cordon_core::excerpt::excerpt(&args_json).into_owned();
    let arguments: Value =
        serde_json::from_str(&args_json).with_context(|| format!("invalid ARGS_JSON {shown:?}"))?;
    drop(args_json);
    if !arguments.is_object() {
        bail!("invalid ARGS_JSON {shown:?}: expected a JSON object");
    }
    // The schema validator's one-time set-up overlaps opening the session.
    std::thread::spawn(cordon_core::validate::warm_up);
    common.warm_up();
    let session = common.open_session().await?;
    let control = RunControl::new(cancel_on_stop_signal(), Arc::new(|_event: AgentEvent| {}));
    let call = ToolCall {
        id: "call-1".to_owned(),
        name: tool,
        arguments,
    };
    let result = session.call(call, &control).await;
    let clean = finish_session(&session).await;
    if json {
        print_json_line(&result);
    } else {
        print!("{}", result_text(&result));
    }
    Ok(if result.is_error || !clean {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
