//! Execution of one assistant message's tool calls as a batch (docs/semantics.md#pipeline,
//! docs/semantics.md#batches).
//!
//! This module owns every per-batch rule: the length stop, the sequential/parallel choice,
//! preflight (lookup, `prepare_arguments`, validation, `before_tool_call`) in source order,
//! concurrent execution, the update gate, `after_tool_call`, `tool_execution_end` in completion
//! order, ToolResult messages in source order after the whole batch, the terminate rule, and
//! turning every failure (including a panic and cancellation) into an error result.
//!
//! It does not own the conversation: the caller appends the returned results to its context.
//! Calls of a parallel batch run concurrently on the caller's task (no `'static` bound, nothing
//! outlives the batch); a tool with CPU-heavy work offloads it with `spawn_blocking`.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::event::{AgentEvent, EventSink};
use crate::hooks::{AfterToolCall, BeforeOutcome, BeforeToolCall, ToolHooks};
use crate::protocol::{AssistantMessage, Message, StopReason, ToolCall, ToolResult};
use crate::tool::{AgentTool, AgentToolResult, ExecutionMode, ToolInvocation};
use crate::validate::validate_tool_arguments;

/// Text of the result of a call that never ran because the run was cancelled.
pub const ABORTED_TEXT: &str = "Operation aborted";

/// Text of the result of a call blocked by `before_tool_call` without a reason.
pub const BLOCKED_TEXT: &str = "Tool execution was blocked";

/// How a run is observed and stopped: its cancellation token and its event sink.
#[derive(Clone)]
pub struct RunControl {
    /// Cancelling it aborts the run: running tools get it, calls not yet run get
    /// [`ABORTED_TEXT`] results, and no further model call is made.
    pub cancel: CancellationToken,
    /// Receives every event, synchronously, in emission order.
    pub events: EventSink,
}

impl RunControl {
    /// A control from a token and a sink.
    pub fn new(cancel: CancellationToken, events: EventSink) -> Self {
        RunControl { cancel, events }
    }

    pub(crate) fn emit(&self, event: AgentEvent) {
        (self.events)(event);
    }
}

/// One assistant message's tool calls and everything needed to run them.
#[derive(Clone, Copy)]
pub struct ToolBatch<'a> {
    /// The tools the model may call, looked up by exact name (first match wins).
    pub tools: &'a [Arc<dyn AgentTool>],
    /// `before_tool_call` / `after_tool_call`.
    pub hooks: &'a dyn ToolHooks,
    /// The configured mode; any called tool declaring `Sequential` overrides `Parallel`.
    pub mode: ExecutionMode,
    /// The message whose `toolCall` blocks form the batch.
    pub assistant_message: &'a AssistantMessage,
    /// The conversation so far, as the hooks see it.
    pub context: &'a [Message],
    /// Cancellation and events.
    pub control: &'a RunControl,
}

/// What a batch produced.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOutcome {
    /// One result per call, in source order (already emitted as messages).
    pub results: Vec<ToolResult>,
    /// The batch was non-empty and every result asked to terminate: skip the next model call.
    pub terminate: bool,
}

/// Execute the tool calls of `batch.assistant_message` with every rule of the module docs,
/// emitting the tool events and then the ToolResult message events. Never fails: every failure
/// becomes an error result the model can read.
pub async fn execute_tool_calls(batch: ToolBatch<'_>) -> BatchOutcome {
    let calls: Vec<&ToolCall> = batch.assistant_message.tool_calls().collect();
    let results = match batch.assistant_message.stop_reason {
        StopReason::Length => refuse_all(&batch, &calls, truncated_call_text),
        // The loop never hands these over; a direct caller gets the same fail-closed refusal.
        StopReason::Error | StopReason::Aborted => refuse_all(&batch, &calls, failed_response_text),
        StopReason::Stop | StopReason::ToolUse => match effective_mode(&batch, &calls) {
            ExecutionMode::Sequential => run_sequential(&batch, &calls).await,
            ExecutionMode::Parallel => run_parallel(&batch, &calls).await,
        },
    };
    let terminate = !results.is_empty() && results.iter().all(|result| result.terminate);
    let results: Vec<ToolResult> = calls
        .iter()
        .zip(results)
        .map(|(call, result)| result.into_tool_result(&call.id, &call.name))
        .collect();
    for result in &results {
        let message = Message::ToolResult(result.clone());
        batch.control.emit(AgentEvent::MessageStart {
            message: message.clone(),
        });
        batch.control.emit(AgentEvent::MessageEnd { message });
    }
    BatchOutcome { results, terminate }
}

/// The model-facing text for a call of a length-stopped message (docs/semantics.md#stop-reasons).
fn truncated_call_text(name: &str) -> String {
    format!(
        "Tool call \"{name}\" was not executed: the response hit the output token limit, so its \
         arguments may be truncated. Re-issue the tool call with complete arguments."
    )
}

fn failed_response_text(name: &str) -> String {
    format!(
        "Tool call \"{name}\" was not executed: the response ended with an error or was \
         aborted, so its arguments may be incomplete. Re-issue the tool call with complete \
         arguments."
    )
}

fn refuse_all(
    batch: &ToolBatch<'_>,
    calls: &[&ToolCall],
    text: fn(&str) -> String,
) -> Vec<AgentToolResult> {
    calls
        .iter()
        .map(|call| {
            emit_start(batch, call);
            let result = AgentToolResult::error(text(&call.name));
            emit_end(batch, call, &result);
            result
        })
        .collect()
}

fn effective_mode(batch: &ToolBatch<'_>, calls: &[&ToolCall]) -> ExecutionMode {
    match batch.mode {
        ExecutionMode::Sequential => ExecutionMode::Sequential,
        ExecutionMode::Parallel => {
            let any_sequential = calls.iter().any(|call| {
                find_tool(batch, &call.name).is_some_and(|tool| match tool.execution_mode() {
                    ExecutionMode::Sequential => true,
                    ExecutionMode::Parallel => false,
                })
            });
            if any_sequential {
                ExecutionMode::Sequential
            } else {
                ExecutionMode::Parallel
            }
        }
    }
}

fn find_tool<'a>(batch: &ToolBatch<'a>, name: &str) -> Option<&'a Arc<dyn AgentTool>> {
    batch.tools.iter().find(|tool| tool.name() == name)
}

async fn run_sequential(batch: &ToolBatch<'_>, calls: &[&ToolCall]) -> Vec<AgentToolResult> {
    let mut results = Vec::with_capacity(calls.len());
    for call in calls {
        let result = match preflight(batch, call).await {
            Preflight::Ready(prepared) => run_prepared(batch, prepared).await,
            Preflight::Done(result) => {
                emit_end(batch, call, &result);
                result
            }
        };
        results.push(result);
    }
    results
}

async fn run_parallel(batch: &ToolBatch<'_>, calls: &[&ToolCall]) -> Vec<AgentToolResult> {
    let mut finished = Vec::with_capacity(calls.len());
    let mut ready = Vec::new();
    for (index, call) in calls.iter().enumerate() {
        match preflight(batch, call).await {
            Preflight::Ready(prepared) => ready.push((index, prepared)),
            Preflight::Done(result) => {
                emit_end(batch, call, &result);
                finished.push((index, result));
            }
        }
    }
    let mut running: FuturesUnordered<_> = ready
        .into_iter()
        .map(|(index, prepared)| async move { (index, run_prepared(batch, prepared).await) })
        .collect();
    while let Some(done) = running.next().await {
        finished.push(done);
    }
    finished.sort_by_key(|(index, _)| *index);
    finished.into_iter().map(|(_, result)| result).collect()
}

/// A call that passed preflight and may execute.
struct Prepared<'a> {
    call: &'a ToolCall,
    tool: &'a Arc<dyn AgentTool>,
    args: Value,
}

enum Preflight<'a> {
    Ready(Prepared<'a>),
    /// Preflight decided the result; the call does not execute.
    Done(AgentToolResult),
}

/// Start event, lookup, `prepare_arguments`, validation, `before_tool_call`.
async fn preflight<'a>(batch: &ToolBatch<'a>, call: &'a ToolCall) -> Preflight<'a> {
    emit_start(batch, call);
    let cancel = &batch.control.cancel;
    if cancel.is_cancelled() {
        return Preflight::Done(AgentToolResult::error(ABORTED_TEXT));
    }
    let Some(tool) = find_tool(batch, &call.name) else {
        return Preflight::Done(AgentToolResult::error(format!(
            "Tool {} not found",
            call.name
        )));
    };
    let raw = call.arguments.clone();
    let prepared = match std::panic::catch_unwind(AssertUnwindSafe(|| tool.prepare_arguments(raw)))
    {
        Ok(prepared) => prepared,
        Err(panic) => return Preflight::Done(tool_crashed(&call.name, panic.as_ref())),
    };
    let mut args = match validate_tool_arguments(tool.name(), tool.parameters(), &prepared) {
        Ok(args) => args,
        Err(message) => return Preflight::Done(AgentToolResult::error(message)),
    };
    let hook_call = BeforeToolCall {
        assistant_message: batch.assistant_message,
        tool_call: call,
        context: batch.context,
    };
    let outcome = AssertUnwindSafe(batch.hooks.before_tool_call(hook_call, &mut args, cancel))
        .catch_unwind()
        .await;
    match outcome {
        Ok(Ok(BeforeOutcome::Continue)) => {}
        Ok(Ok(BeforeOutcome::Block { reason, terminate })) => {
            let reason = reason
                .filter(|reason| !reason.is_empty())
                .unwrap_or_else(|| BLOCKED_TEXT.to_owned());
            let mut result = AgentToolResult::error(reason);
            result.terminate = terminate;
            return Preflight::Done(result);
        }
        Ok(Err(error)) => return Preflight::Done(AgentToolResult::error(error.to_string())),
        Err(panic) => {
            return Preflight::Done(AgentToolResult::error(format!(
                "Tool call {} was not executed: its pre-execution check failed with an \
                 internal error: {}",
                call.name,
                panic_text(panic.as_ref())
            )));
        }
    }
    if cancel.is_cancelled() {
        return Preflight::Done(AgentToolResult::error(ABORTED_TEXT));
    }
    Preflight::Ready(Prepared { call, tool, args })
}

/// Execute, settle the update gate, `after_tool_call`, end event.
async fn run_prepared(batch: &ToolBatch<'_>, prepared: Prepared<'_>) -> AgentToolResult {
    let Prepared { call, tool, args } = prepared;
    let cancel = &batch.control.cancel;
    if cancel.is_cancelled() {
        // Cancelled between preflight and execution: the tool never runs.
        let result = AgentToolResult::error(ABORTED_TEXT);
        emit_end(batch, call, &result);
        return result;
    }
    let gate = Arc::new(UpdateGate::default());
    let invocation = ToolInvocation {
        call_id: call.id.clone(),
        args: args.clone(),
        cancel: cancel.clone(),
        on_update: update_callback(batch, call, &args, &gate),
    };
    let outcome = AssertUnwindSafe(tool.execute(invocation))
        .catch_unwind()
        .await;
    gate.settle();
    let result = match outcome {
        Ok(Ok(result)) => result,
        Ok(Err(error)) => AgentToolResult::error(error.to_string()),
        Err(panic) => tool_crashed(&call.name, panic.as_ref()),
    };
    let result = after_hook(batch, call, &args, result).await;
    emit_end(batch, call, &result);
    result
}

async fn after_hook(
    batch: &ToolBatch<'_>,
    call: &ToolCall,
    args: &Value,
    mut result: AgentToolResult,
) -> AgentToolResult {
    let hook_call = AfterToolCall {
        assistant_message: batch.assistant_message,
        tool_call: call,
        args,
        result: &result,
        context: batch.context,
    };
    let outcome = AssertUnwindSafe(
        batch
            .hooks
            .after_tool_call(hook_call, &batch.control.cancel),
    )
    .catch_unwind()
    .await;
    match outcome {
        Ok(Ok(replacement)) => {
            replacement.apply(&mut result);
            result
        }
        Ok(Err(error)) => AgentToolResult::error(error.to_string()),
        // Fail closed: the unprocessed result (maybe unredacted) is withheld.
        Err(panic) => AgentToolResult::error(format!(
            "Tool {} ran, but its result was withheld because processing it failed with an \
             internal error: {}",
            call.name,
            panic_text(panic.as_ref())
        )),
    }
}

/// Drops partial results once the call has settled. The lock is held while emitting, so no
/// update can be emitted after [`UpdateGate::settle`] returns (and thus after the end event).
#[derive(Default)]
struct UpdateGate {
    settled: Mutex<bool>,
}

impl UpdateGate {
    fn settle(&self) {
        *self.settled.lock().unwrap_or_else(PoisonError::into_inner) = true;
    }
}

fn update_callback(
    batch: &ToolBatch<'_>,
    call: &ToolCall,
    args: &Value,
    gate: &Arc<UpdateGate>,
) -> crate::tool::UpdateCallback {
    let events = batch.control.events.clone();
    let gate = Arc::clone(gate);
    let tool_call_id = call.id.clone();
    let tool_name = call.name.clone();
    let args = args.clone();
    Arc::new(move |partial_result: AgentToolResult| {
        let settled = gate.settled.lock().unwrap_or_else(PoisonError::into_inner);
        if !*settled {
            events(AgentEvent::ToolExecutionUpdate {
                tool_call_id: tool_call_id.clone(),
                tool_name: tool_name.clone(),
                args: args.clone(),
                partial_result,
            });
        }
    })
}

fn emit_start(batch: &ToolBatch<'_>, call: &ToolCall) {
    batch.control.emit(AgentEvent::ToolExecutionStart {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        args: call.arguments.clone(),
    });
}

fn emit_end(batch: &ToolBatch<'_>, call: &ToolCall, result: &AgentToolResult) {
    batch.control.emit(AgentEvent::ToolExecutionEnd {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        result: result.clone(),
        is_error: result.is_error,
    });
}

fn tool_crashed(name: &str, panic: &(dyn Any + Send)) -> AgentToolResult {
    AgentToolResult::error(format!(
        "Tool {name} failed with an internal error: {}. This is a bug in the tool, not in \
         your arguments; try another way.",
        panic_text(panic)
    ))
}

fn panic_text(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("panic with a non-text payload")
}
