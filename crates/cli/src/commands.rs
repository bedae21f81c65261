//! One function per subcommand: open a session, run, print, map to an exit code.

use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use cordon_core::CancellationToken;
use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::{AssistantMessage, Message, ToolCall};
use cordon_core::tool::ExecutionMode;
use cordon_policy::EnvMap;
use cordon_runtime::{BackendChoice, Session, SessionOptions};
use serde_json::Value;

use crate::args::{
    AuditCommand, BackendKind, Cli, Command, CommonArgs, ExecArgs, PolicyCommand, ReplayArgs,
};
use crate::output::{print_json_line, result_text};

/// Run the parsed command. `Err` is a usage or configuration error (exit 2).
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Exec(args) => exec(args).await,
        Command::Replay(args) => replay(args).await,
        Command::Policy(command) => policy(command),
        Command::Audit(command) => audit(command),
    }
}

async fn open_session(common: &CommonArgs) -> anyhow::Result<Session> {
    let CommonArgs {
        backend,
        root,
        policy,
        audit,
        allow_degraded,
    } = common.clone();
    let backend = match backend {
        BackendKind::Local => BackendChoice::Local,
    };
    let options = SessionOptions {
        backend,
        root,
        policy,
        audit,
        approver: None,
        allow_degraded,
    };
    Ok(Session::open(options).await?)
}

/// A token cancelled by the first Ctrl-C (tools are killed and report it); a second Ctrl-C
/// exits at once.
fn cancel_on_ctrl_c() -> CancellationToken {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            token.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    cancel
}

async fn exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let ExecArgs {
        tool,
        args_json,
        json,
        common,
    } = args;
    let arguments: Value = serde_json::from_str(&args_json)
        .with_context(|| format!("invalid ARGS_JSON {args_json:?}"))?;
    if !arguments.is_object() {
        bail!("invalid ARGS_JSON {args_json:?}: expected a JSON object");
    }
    let session = open_session(&common).await?;
    let control = RunControl::new(cancel_on_ctrl_c(), Arc::new(|_event: AgentEvent| {}));
    let call = ToolCall {
        id: "call-1".to_owned(),
        name: tool,
        arguments,
    };
    let result = session.call(call, &control).await;
    session.shutdown().await;
    if json {
        print_json_line(&result);
    } else {
        print!("{}", result_text(&result));
    }
    Ok(if result.is_error {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Parse a JSONL transcript: assistant messages are executed; user and tool-result messages
/// (as `cordon run --save` writes them) are context and skipped. The whole input is checked
/// before anything runs.
fn parse_transcript(text: &str) -> anyhow::Result<Vec<AssistantMessage>> {
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

async fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
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
    let session = open_session(&common).await?;
    let mode = if sequential {
        ExecutionMode::Sequential
    } else {
        ExecutionMode::Parallel
    };
    let config = session.agent_config(mode);
    let control = RunControl::new(
        cancel_on_ctrl_c(),
        Arc::new(|event: AgentEvent| print_json_line(&event)),
    );
    cordon_core::replay(&config, messages, &control).await;
    session.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

fn read_stdin() -> anyhow::Result<String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("failed to read standard input")?;
    Ok(text)
}

fn policy(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    let env: EnvMap = std::env::vars().collect();
    match command {
        PolicyCommand::Check { file } => {
            let summary = cordon_policy::explain::check_policy_file(&file, &env)?;
            println!("{summary}");
        }
        PolicyCommand::Explain {
            file,
            tool,
            args_json,
            root,
            json,
        } => {
            let policy = cordon_policy::CompiledPolicy::load(&file, &env)?;
            let root = std::path::absolute(&root)
                .with_context(|| format!("failed to resolve root {}", root.display()))?;
            let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
            let request = cordon_policy::explain::ExplainCliRequest {
                tool: &tool,
                args_json: &args_json,
                root: &root,
                home: home.as_deref(),
            };
            let explanation = cordon_policy::explain::explain_cli(&policy, &request)?;
            if json {
                print_json_line(&explanation.to_json());
            } else {
                println!("{}", explanation.to_text());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn audit(command: AuditCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuditCommand::Verify { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("failed to read {}", file.display()))?;
            match cordon_policy::audit::verify_audit_log(&text) {
                Ok(report) => {
                    println!("{}", report.to_text());
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("cordon: {}: {error}", file.display());
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}
