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

use crate::cmd::common::{CommonArgs, cancel_on_stop_signal, report_audit_head};
use crate::output::{print_json_line, result_text};

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Tool name (read, write, edit, bash, grep, find, ls).
    pub tool: String,
    /// Arguments as a JSON object.
    pub args_json: String,
    /// Print the ToolResult as JSON instead of its text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Run `cordon exec`.
pub async fn exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
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
    session.shutdown().await;
    report_audit_head(&session);
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
