//! The multi-turn agent loop (docs/semantics.md#stop-reasons, docs/semantics.md#terminate):
//! ask the model, execute its tool calls as a batch, feed the results back, repeat until the
//! model stops, a batch terminates, the turn budget is spent, the provider fails, or the run is
//! cancelled.
//!
//! This module owns the turn structure and the message/turn/agent events around the model
//! call. Per-batch rules live in [`crate::executor`]; the model itself is behind
//! [`ModelProvider`]. There is no steering or follow-up queue yet: a run takes one prompt.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::event::AgentEvent;
use crate::executor::{ABORTED_TEXT, BatchOutcome, RunControl, ToolBatch, execute_tool_calls};
use crate::hooks::{NoHooks, ToolHooks};
use crate::protocol::{
    AssistantContent, AssistantMessage, Message, StopReason, ToolDefinition, UserMessage,
};
use crate::provider::{AssistantStreamEvent, ModelProvider, ModelRequest};
use crate::tool::{AgentTool, ExecutionMode};

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// `continue_from` got an empty context.
    #[error("Cannot continue: no messages in context")]
    EmptyContext,
    /// `continue_from` got a context ending with an assistant message: there is nothing for
    /// the model to answer.
    #[error("Cannot continue from message role: assistant")]
    ContinueFromAssistant,
}

/// What the loop runs with.
#[derive(Clone)]
pub struct AgentConfig {
    /// The tools the model may call (looked up by exact name, first match wins).
    pub tools: Vec<Arc<dyn AgentTool>>,
    /// `before_tool_call` / `after_tool_call`; [`NoHooks`] by default.
    pub hooks: Arc<dyn ToolHooks>,
    /// `Parallel` (default) or `Sequential`; a tool declaring `Sequential` forces its batch
    /// sequential either way.
    pub tool_execution: ExecutionMode,
    /// System prompt sent with every model call.
    pub system_prompt: Option<String>,
    /// Stop after this many model calls, once that turn's batch has finished. At least one
    /// turn always runs. `None`: no limit.
    pub max_turns: Option<u32>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            tools: Vec::new(),
            hooks: Arc::new(NoHooks),
            tool_execution: ExecutionMode::Parallel,
            system_prompt: None,
            max_turns: None,
        }
    }
}

/// An agent: a configuration and a model provider.
pub struct Agent {
    config: AgentConfig,
    provider: Arc<dyn ModelProvider>,
    definitions: Vec<ToolDefinition>,
}

impl Agent {
    /// An agent over `provider`; tool definitions are computed once here.
    pub fn new(config: AgentConfig, provider: Arc<dyn ModelProvider>) -> Self {
        let definitions = config.tools.iter().map(|tool| tool.definition()).collect();
        Agent {
            config,
            provider,
            definitions,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Run the loop for `prompt` after the existing conversation `context`. Emits
    /// `agent_start`, `turn_start`, the prompt's message events, then the turns, then
    /// `agent_end`. Returns the messages the run added (prompt first); append them to the
    /// context to continue the conversation. Provider failures and cancellation end the run
    /// with an `error` / `aborted` assistant message rather than an `Err`.
    pub async fn prompt(
        &self,
        context: &[Message],
        prompt: UserMessage,
        control: &RunControl,
    ) -> Vec<Message> {
        let mut messages = context.to_vec();
        let first_new = messages.len();
        control.emit(AgentEvent::AgentStart);
        control.emit(AgentEvent::TurnStart);
        let prompt = Message::User(prompt);
        control.emit(AgentEvent::MessageStart {
            message: prompt.clone(),
        });
        control.emit(AgentEvent::MessageEnd {
            message: prompt.clone(),
        });
        messages.push(prompt);
        self.run_turns(messages, first_new, control).await
    }

    /// Continue from an existing conversation whose last message is a user message or a tool
    /// result (e.g. after a run was stopped by `max_turns` or `terminate`). Emits
    /// `agent_start` and `turn_start` without message events for the context. Returns only
    /// the messages the run added.
    pub async fn continue_from(
        &self,
        context: &[Message],
        control: &RunControl,
    ) -> Result<Vec<Message>, AgentError> {
        match context.last() {
            None => return Err(AgentError::EmptyContext),
            Some(Message::Assistant(_)) => return Err(AgentError::ContinueFromAssistant),
            Some(Message::User(_) | Message::ToolResult(_)) => {}
        }
        control.emit(AgentEvent::AgentStart);
        control.emit(AgentEvent::TurnStart);
        Ok(self
            .run_turns(context.to_vec(), context.len(), control)
            .await)
    }

    /// The turns of a run; `turn_start` of the first turn is already emitted.
    async fn run_turns(
        &self,
        mut messages: Vec<Message>,
        first_new: usize,
        control: &RunControl,
    ) -> Vec<Message> {
        let mut turns: u32 = 0;
        loop {
            turns = turns.saturating_add(1);
            let assistant = self.next_assistant_message(&messages, control).await;
            let more = run_tool_turn(&self.config, assistant, &mut messages, control).await;
            let budget_spent = self.config.max_turns.is_some_and(|max| turns >= max);
            if !more || budget_spent {
                break;
            }
            control.emit(AgentEvent::TurnStart);
        }
        let added = messages.split_off(first_new);
        control.emit(AgentEvent::AgentEnd {
            messages: added.clone(),
        });
        added
    }

    /// One model call with its message events. Never fails: a provider error becomes an
    /// `error` message, cancellation an `aborted` one.
    async fn next_assistant_message(
        &self,
        messages: &[Message],
        control: &RunControl,
    ) -> AssistantMessage {
        let stream = Mutex::new(StreamProgress::default());
        let on_event = |partial: &AssistantMessage, event: &AssistantStreamEvent| {
            let mut state = lock(&stream);
            if !state.started {
                state.started = true;
                control.emit(AgentEvent::MessageStart {
                    message: Message::Assistant(partial.clone()),
                });
            }
            control.emit(AgentEvent::MessageUpdate {
                message: Message::Assistant(partial.clone()),
                assistant_message_event: event.clone(),
            });
            state.partial = Some(partial.clone());
        };
        let request = ModelRequest {
            system_prompt: self.config.system_prompt.as_deref(),
            messages,
            tools: &self.definitions,
        };
        // Biased: an already-cancelled run never polls (so never calls) the provider.
        let outcome = tokio::select! {
            biased;
            () = control.cancel.cancelled() => None,
            outcome = self.provider.stream(request, &control.cancel, &on_event) => Some(outcome),
        };
        let mut state = lock(&stream);
        let partial = state.partial.take();
        let message = match outcome {
            Some(Ok(message)) => message,
            Some(Err(error)) if !control.cancel.is_cancelled() => {
                failed_message(partial, StopReason::Error, error.to_string())
            }
            Some(Err(_)) | None => {
                failed_message(partial, StopReason::Aborted, ABORTED_TEXT.to_owned())
            }
        };
        if !state.started {
            control.emit(AgentEvent::MessageStart {
                message: Message::Assistant(message.clone()),
            });
        }
        control.emit(AgentEvent::MessageEnd {
            message: Message::Assistant(message.clone()),
        });
        message
    }
}

/// What the stream callback has seen: whether `message_start` went out, and the latest
/// partial message (kept for an `error`/`aborted` message).
#[derive(Default)]
struct StreamProgress {
    started: bool,
    partial: Option<AssistantMessage>,
}

fn lock(progress: &Mutex<StreamProgress>) -> MutexGuard<'_, StreamProgress> {
    progress.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `error`/`aborted` message that ends a run: what was streamed so far (without tool
/// calls, which will never get results) plus the reason.
fn failed_message(
    partial: Option<AssistantMessage>,
    stop_reason: StopReason,
    error_message: String,
) -> AssistantMessage {
    let mut message = partial.unwrap_or_default();
    message.content.retain(|block| match block {
        AssistantContent::ToolCall(_) => false,
        AssistantContent::Text { .. } | AssistantContent::Thinking { .. } => true,
    });
    message.stop_reason = stop_reason;
    message.error_message = Some(error_message);
    message
}

/// The rest of a turn after its assistant message was emitted: append it, run its tool calls
/// as a batch (unless it is an `error`/`aborted` message), append the results, emit
/// `turn_end`. Returns whether the loop should call the model again.
pub(crate) async fn run_tool_turn(
    config: &AgentConfig,
    assistant: AssistantMessage,
    messages: &mut Vec<Message>,
    control: &RunControl,
) -> bool {
    messages.push(Message::Assistant(assistant.clone()));
    let runs_tools = match assistant.stop_reason {
        StopReason::Error | StopReason::Aborted => false,
        StopReason::Stop | StopReason::ToolUse | StopReason::Length => {
            assistant.tool_calls().next().is_some()
        }
    };
    let BatchOutcome { results, terminate } = if runs_tools {
        execute_tool_calls(ToolBatch {
            tools: &config.tools,
            hooks: config.hooks.as_ref(),
            mode: config.tool_execution,
            assistant_message: &assistant,
            context: messages,
            control,
        })
        .await
    } else {
        BatchOutcome {
            results: Vec::new(),
            terminate: false,
        }
    };
    messages.extend(results.iter().cloned().map(Message::ToolResult));
    control.emit(AgentEvent::TurnEnd {
        message: Message::Assistant(assistant),
        tool_results: results,
    });
    runs_tools && !terminate
}
