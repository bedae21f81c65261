//! `cordon replay` semantics (docs/contract.md#subcommands): execute pre-recorded assistant
//! messages' tool calls with full agent-loop semantics, without a model.
//!
//! This module owns the replay turn structure only; each message's batch goes through the same
//! code as a live run ([`crate::executor`]), so the length rule, preflight, hooks (policy) and
//! result ordering are identical. Parsing the JSONL input is the caller's job.
//!
//! Every message is one turn. A replay does not stop early on a message without tool calls or
//! on a terminating batch (there is no model call to skip; every later call still passes the
//! hooks on its own). `error`/`aborted` messages execute nothing, as in a live run. Only
//! cancellation ends a replay early: the current batch still gives every call a result, then
//! `agent_end` follows.

use crate::agent::{AgentConfig, run_tool_turn};
use crate::event::AgentEvent;
use crate::executor::RunControl;
use crate::protocol::{AssistantMessage, Message};

/// Replay `messages` with `config`'s tools, hooks and execution mode. Emits `agent_start`;
/// per message `turn_start`, the assistant message's start/end, its batch, the ToolResult
/// messages and `turn_end`; finally `agent_end`. Returns every message of the replay
/// (assistant messages and tool results, in order).
pub async fn replay(
    config: &AgentConfig,
    messages: impl IntoIterator<Item = AssistantMessage>,
    control: &RunControl,
) -> Vec<Message> {
    control.emit(AgentEvent::AgentStart);
    let mut transcript = Vec::new();
    for assistant in messages {
        if control.cancel.is_cancelled() {
            break;
        }
        control.emit(AgentEvent::TurnStart);
        let message = Message::Assistant(assistant.clone());
        control.emit(AgentEvent::MessageStart {
            message: message.clone(),
        });
        control.emit(AgentEvent::MessageEnd { message });
        run_tool_turn(config, assistant, &mut transcript, control).await;
    }
    control.emit(AgentEvent::AgentEnd {
        messages: transcript.clone(),
    });
    transcript
}
