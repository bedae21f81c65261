//! `cordon run --model PROVIDER:MODEL [--base-url URL] [--max-turns N] PROMPT`: the full
//! agent in the terminal. A model provider (`cordon-model`) drives the agent loop
//! (`cordon_core::Agent`) over a session's sandboxed tools and policy hooks
//! (`cordon-runtime`) until the model stops.
//!
//! This module owns the wiring and the exit status; the submodules own the system prompt
//! ([`prompt`]), the terminal view ([`render`]), the terminal approver for `Ask` decisions
//! ([`approve`]) and the `--save` transcript ([`transcript`]).
//!
//! Exit codes: 0 when the model finished; 1 when the run ended in an error or aborted
//! message, hit `--max-turns`, or the last answer was cut off at the output token limit;
//! 2 on a usage or configuration error (unknown provider, missing API key, bad base URL,
//! unusable policy or workspace) before anything ran.
//!
//! Ctrl-C (or SIGTERM) cancels the current turn: running tools are killed and record their
//! results, the model is not called again, and the run ends with an aborted message. A second
//! one exits at once (130).

mod approve;
mod prompt;
mod render;
mod transcript;

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use anyhow::{Context, bail};
use clap::Args;
use cordon_core::event::{AgentEvent, EventSink};
use cordon_core::executor::RunControl;
use cordon_core::protocol::{Message, StopReason, UserMessage};
use cordon_core::tool::ExecutionMode;
use cordon_core::{Agent, CancellationToken};
use cordon_model::{ProviderOptions, parse_model_spec, provider_from_env};
use cordon_runtime::{Approver, Session};
use tokio::sync::mpsc;

use crate::cmd::common::{CommonArgs, finish_session, shutdown_reporting};
use crate::output::print_json_line;

use self::approve::TerminalApprover;
use self::prompt::{PromptFacts, system_prompt};
use self::render::{Colour, Renderer};
use self::transcript::Transcript;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The model, as PROVIDER:MODEL: openai:gpt-4.1, anthropic:claude-sonnet-4-5,
    /// openai-compatible:qwen3:8b (llama.cpp, vLLM, Ollama, …). The API key comes from
    /// OPENAI_API_KEY, ANTHROPIC_API_KEY or OPENAI_COMPATIBLE_API_KEY.
    #[arg(long, value_name = "PROVIDER:MODEL")]
    pub model: String,
    /// The provider's base URL (OpenAI style includes the version: http://127.0.0.1:8080/v1).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Stop after this many model calls (the last one's tool calls still run).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_turns: Option<u32>,
    /// Print every agent event as a JSON line instead of the terminal view.
    #[arg(long)]
    pub json: bool,
    /// Write the session's messages (user, assistant, toolResult) as JSON lines to FILE;
    /// `cordon replay FILE` re-runs its tool calls.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// What to ask the model (`-`: read it from standard input).
    pub prompt: String,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// The model finished (or every result of the last batch asked to terminate).
    Finished,
    /// The provider failed; the message says why.
    Failed(String),
    /// The run was cancelled.
    Aborted,
    /// `--max-turns` stopped the run before the model finished.
    TurnBudgetSpent(u32),
    /// The last answer hit the output token limit.
    Truncated,
}

impl Outcome {
    /// How the run that added `messages` ended.
    fn of(messages: &[Message], max_turns: Option<u32>) -> Outcome {
        match messages.last() {
            Some(Message::Assistant(message)) => match message.stop_reason {
                StopReason::Stop | StopReason::ToolUse => Outcome::Finished,
                StopReason::Length => Outcome::Truncated,
                StopReason::Error => Outcome::Failed(
                    message
                        .error_message
                        .clone()
                        .unwrap_or_else(|| "the model request failed".to_owned()),
                ),
                StopReason::Aborted => Outcome::Aborted,
            },
            Some(Message::ToolResult(_)) => {
                let turns = messages
                    .iter()
                    .filter(|message| matches!(message, Message::Assistant(_)))
                    .count();
                match max_turns {
                    Some(max) if u32::try_from(turns).is_ok_and(|turns| turns >= max) => {
                        Outcome::TurnBudgetSpent(max)
                    }
                    Some(_) | None => Outcome::Finished,
                }
            }
            Some(Message::User(_)) | None => {
                Outcome::Failed("the run ended without a model response".to_owned())
            }
        }
    }

    /// The line printed on stderr, `None` when the model finished.
    fn report(&self) -> Option<String> {
        match self {
            Outcome::Finished => None,
            Outcome::Failed(reason) => Some(format!("the run failed: {reason}")),
            Outcome::Aborted => Some("the run was aborted".to_owned()),
            Outcome::TurnBudgetSpent(max) => Some(format!(
                "stopped after {max} turn{} (--max-turns) before the model finished",
                if *max == 1 { "" } else { "s" }
            )),
            Outcome::Truncated => Some(
                "the model's last response hit its output token limit and is incomplete".to_owned(),
            ),
        }
    }

    fn exit_code(&self) -> ExitCode {
        match self {
            Outcome::Finished => ExitCode::SUCCESS,
            Outcome::Failed(_)
            | Outcome::Aborted
            | Outcome::TurnBudgetSpent(_)
            | Outcome::Truncated => ExitCode::FAILURE,
        }
    }
}

/// Run `cordon run`.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let RunArgs {
        model,
        base_url,
        max_turns,
        json,
        save,
        prompt,
        common,
    } = args;
    // Configuration first: every usage error is reported before anything starts.
    let prompt = read_prompt(prompt)?;
    let spec = parse_model_spec(&model)?;
    let mut provider_options = ProviderOptions::default();
    provider_options.base_url = base_url;
    let provider = provider_from_env(&spec, &provider_options)?;
    let transcript = save
        .as_deref()
        .map(Transcript::create)
        .transpose()?
        .map(Arc::new);

    let cancel = CancellationToken::new();
    cancel_on_interrupt(cancel.clone())?;
    let mut options = common.session_options()?;
    options.approver = std::io::stdin()
        .is_terminal()
        .then(|| Arc::new(TerminalApprover::new(cancel.clone())) as Arc<dyn Approver>);
    let session = Session::open(options).await?;
    if let Some(path) = &save
        && let Err(error) = session.refuse_in_writable_root(path, "transcript (--save)")
    {
        shutdown_reporting(&session).await;
        return Err(error.into());
    }
    let missing = session.backend().missing_layers();
    if !missing.is_empty() {
        eprintln!(
            "cordon: warning: the sandbox is degraded ({} not in force)",
            missing.join(", ")
        );
    }

    let files = session.backend().files();
    let date = cordon_policy::audit::rfc3339_utc(SystemTime::now());
    let mut config = session.agent_config(ExecutionMode::Parallel);
    config.system_prompt = Some(system_prompt(&PromptFacts {
        tools: session.tools(),
        root: files.root(),
        spec: session.spec(),
        date: date.get(..10).unwrap_or(&date),
    }));
    config.max_turns = max_turns;
    let agent = Agent::new(config, provider);

    let control = RunControl::new(cancel, event_sink(json, transcript.clone()));
    let added = agent.prompt(&[], UserMessage::text(prompt), &control).await;
    let clean = finish_session(&session).await;

    let outcome = Outcome::of(&added, max_turns);
    if let Some(line) = outcome.report() {
        eprintln!("cordon: {line}");
    }
    if let Some(transcript) = &transcript
        && let Err(error) = transcript.finish()
    {
        eprintln!("cordon: {}", crate::output::one_line(&error));
        return Ok(ExitCode::FAILURE);
    }
    if !clean {
        return Ok(ExitCode::FAILURE);
    }
    Ok(outcome.exit_code())
}

/// Where events go: the transcript (if any), then the terminal view or JSON lines.
fn event_sink(json: bool, transcript: Option<Arc<Transcript>>) -> EventSink {
    let view = (!json).then(|| {
        let colour = Colour::detect();
        Mutex::new(Renderer::new(std::io::stdout(), colour))
    });
    Arc::new(move |event: AgentEvent| {
        if let Some(transcript) = &transcript {
            transcript.record(&event);
        }
        match &view {
            Some(view) => view
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .render(&event),
            None => print_json_line(&event),
        }
    })
}

/// The prompt argument, or standard input for `-`; never empty.
fn read_prompt(prompt: String) -> anyhow::Result<String> {
    let prompt = if prompt == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("failed to read the prompt from standard input")?;
        text
    } else {
        prompt
    };
    if prompt.trim().is_empty() {
        bail!("the prompt is empty: say what the agent should do");
    }
    Ok(prompt)
}

/// The first Ctrl-C (or SIGTERM) cancels `cancel`; a second exits at once. The handlers are
/// installed before this returns, so no signal is missed once the run starts.
fn cancel_on_interrupt(cancel: CancellationToken) -> anyhow::Result<()> {
    let (sender, signals) = mpsc::unbounded_channel();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt =
            signal(SignalKind::interrupt()).context("failed to install the Ctrl-C handler")?;
        let mut terminate =
            signal(SignalKind::terminate()).context("failed to install the SIGTERM handler")?;
        tokio::spawn(async move {
            loop {
                let received = tokio::select! {
                    received = interrupt.recv() => received,
                    received = terminate.recv() => received,
                };
                if received.is_none() || sender.send(()).is_err() {
                    return;
                }
            }
        });
    }
    #[cfg(not(unix))]
    {
        tokio::spawn(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                if sender.send(()).is_err() {
                    return;
                }
            }
        });
    }
    tokio::spawn(async move {
        if watch_interrupts(signals, cancel).await {
            std::process::exit(130);
        }
    });
    Ok(())
}

/// The first signal cancels the run; returns `true` at the second (exit now), `false` if
/// the signal source went away.
async fn watch_interrupts(
    mut signals: mpsc::UnboundedReceiver<()>,
    cancel: CancellationToken,
) -> bool {
    if signals.recv().await.is_none() {
        return false;
    }
    eprintln!("\ncordon: cancelling: stopping tools and the model (Ctrl-C again to exit now)");
    cancel.cancel();
    signals.recv().await.is_some()
}

#[cfg(test)]
mod tests {
    use cordon_core::protocol::{AssistantMessage, ToolResult};

    use super::*;

    fn assistant(stop_reason: StopReason, error: Option<&str>) -> Message {
        Message::Assistant(AssistantMessage {
            stop_reason,
            error_message: error.map(str::to_owned),
            ..AssistantMessage::default()
        })
    }

    fn tool_result() -> Message {
        Message::ToolResult(ToolResult {
            tool_call_id: "c1".into(),
            tool_name: "read".into(),
            content: Vec::new(),
            details: None,
            structured_content: None,
            is_error: false,
        })
    }

    #[test]
    fn the_last_message_decides_the_outcome() {
        let user = Message::User(UserMessage::text("go"));
        let done = [user.clone(), assistant(StopReason::Stop, None)];
        assert_eq!(Outcome::of(&done, None), Outcome::Finished);
        assert_eq!(Outcome::of(&done, None).exit_code(), ExitCode::SUCCESS);
        let failed = [user.clone(), assistant(StopReason::Error, Some("HTTP 500"))];
        assert_eq!(
            Outcome::of(&failed, None),
            Outcome::Failed("HTTP 500".into())
        );
        let aborted = [user.clone(), assistant(StopReason::Aborted, None)];
        assert_eq!(Outcome::of(&aborted, None), Outcome::Aborted);
        let cut = [user.clone(), assistant(StopReason::Length, None)];
        assert_eq!(Outcome::of(&cut, None), Outcome::Truncated);
        for outcome in [
            Outcome::Failed(String::new()),
            Outcome::Aborted,
            Outcome::Truncated,
            Outcome::TurnBudgetSpent(1),
        ] {
            assert_eq!(outcome.exit_code(), ExitCode::FAILURE);
            assert!(outcome.report().is_some());
        }
    }

    #[test]
    fn a_run_ending_on_tool_results_spent_its_turns_or_terminated() {
        let user = Message::User(UserMessage::text("go"));
        let two_turns = [
            user.clone(),
            assistant(StopReason::ToolUse, None),
            tool_result(),
            assistant(StopReason::ToolUse, None),
            tool_result(),
        ];
        assert_eq!(
            Outcome::of(&two_turns, Some(2)),
            Outcome::TurnBudgetSpent(2)
        );
        assert_eq!(
            Outcome::TurnBudgetSpent(2).report().unwrap(),
            "stopped after 2 turns (--max-turns) before the model finished"
        );
        // Without a budget, only a terminating batch ends a run on tool results.
        assert_eq!(Outcome::of(&two_turns, None), Outcome::Finished);
        assert_eq!(Outcome::of(&two_turns, Some(5)), Outcome::Finished);
        assert_eq!(
            Outcome::of(&[user], None),
            Outcome::Failed("the run ended without a model response".into())
        );
    }

    #[tokio::test]
    async fn the_first_interrupt_cancels_and_the_second_exits() {
        let (sender, signals) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let watcher = tokio::spawn(watch_interrupts(signals, cancel.clone()));
        sender.send(()).unwrap();
        cancel.cancelled().await;
        assert!(!watcher.is_finished(), "one interrupt only cancels the run");
        sender.send(()).unwrap();
        assert!(watcher.await.unwrap(), "the second interrupt exits");

        let (sender, signals) = mpsc::unbounded_channel();
        drop(sender);
        let cancel = CancellationToken::new();
        assert!(!watch_interrupts(signals, cancel.clone()).await);
        assert!(!cancel.is_cancelled());
    }
}
