//! Shared test fixtures: closure-backed tools and hooks, an event recorder, message builders.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use cordon_core::CancellationToken;
use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::hooks::{
    AfterToolCall, BeforeOutcome, BeforeToolCall, HookError, ResultOverride, ToolHooks,
};
use cordon_core::protocol::{AssistantContent, AssistantMessage, Message, StopReason, ToolCall};
use cordon_core::tool::{AgentTool, AgentToolResult, ExecutionMode, ToolError, ToolInvocation};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Fail instead of hanging when a test's synchronisation is broken (e.g. a batch that should
/// be concurrent runs sequentially and waits forever). Not a timing assertion.
pub async fn within<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 60 s: deadlock?"))
}

type RunFn =
    dyn Fn(ToolInvocation) -> BoxFuture<'static, Result<AgentToolResult, ToolError>> + Send + Sync;

/// A tool whose behaviour is a closure; it records the arguments of every execution.
pub struct FnTool {
    name: String,
    schema: Value,
    mode: ExecutionMode,
    prepare: Option<Box<dyn Fn(Value) -> Value + Send + Sync>>,
    run: Box<RunFn>,
    executed: Mutex<Vec<Value>>,
}

impl FnTool {
    pub fn new<F, Fut>(name: &str, run: F) -> Self
    where
        F: Fn(ToolInvocation) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<AgentToolResult, ToolError>> + Send + 'static,
    {
        FnTool {
            name: name.to_owned(),
            schema: json!({"type": "object"}),
            mode: ExecutionMode::Parallel,
            prepare: None,
            run: Box::new(move |invocation| run(invocation).boxed()),
            executed: Mutex::new(Vec::new()),
        }
    }

    /// A tool answering `NAME ran` .
    pub fn ok(name: &str) -> Self {
        let text = format!("{name} ran");
        Self::new(name, move |_| {
            let text = text.clone();
            async move { Ok(AgentToolResult::text(text)) }
        })
    }

    pub fn schema(mut self, schema: Value) -> Self {
        self.schema = schema;
        self
    }

    pub fn sequential(mut self) -> Self {
        self.mode = ExecutionMode::Sequential;
        self
    }

    pub fn prepare(mut self, prepare: impl Fn(Value) -> Value + Send + Sync + 'static) -> Self {
        self.prepare = Some(Box::new(prepare));
        self
    }

    pub fn arc(self) -> Arc<Self> {
        Arc::new(self)
    }

    /// Arguments of every execution, in start order.
    pub fn executed(&self) -> Vec<Value> {
        lock(&self.executed).clone()
    }
}

#[async_trait]
impl AgentTool for FnTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn label(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        "test tool"
    }
    fn parameters(&self) -> &Value {
        &self.schema
    }
    fn prepare_arguments(&self, args: Value) -> Value {
        match &self.prepare {
            Some(prepare) => prepare(args),
            None => args,
        }
    }
    fn execution_mode(&self) -> ExecutionMode {
        self.mode
    }
    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError> {
        lock(&self.executed).push(invocation.args.clone());
        (self.run)(invocation).await
    }
}

pub fn tools(list: &[&Arc<FnTool>]) -> Vec<Arc<dyn AgentTool>> {
    list.iter()
        .map(|tool| Arc::clone(*tool) as Arc<dyn AgentTool>)
        .collect()
}

type BeforeFn =
    dyn Fn(&ToolCall, &mut Value, &[Message]) -> Result<BeforeOutcome, HookError> + Send + Sync;
type AfterFn =
    dyn Fn(&ToolCall, &AgentToolResult) -> Result<ResultOverride, HookError> + Send + Sync;

/// Hooks whose decisions are closures.
#[derive(Default)]
pub struct FnHooks {
    before: Option<Box<BeforeFn>>,
    after: Option<Box<AfterFn>>,
}

impl FnHooks {
    pub fn before(
        mut self,
        f: impl Fn(&ToolCall, &mut Value, &[Message]) -> Result<BeforeOutcome, HookError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.before = Some(Box::new(f));
        self
    }

    pub fn after(
        mut self,
        f: impl Fn(&ToolCall, &AgentToolResult) -> Result<ResultOverride, HookError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.after = Some(Box::new(f));
        self
    }
}

#[async_trait]
impl ToolHooks for FnHooks {
    async fn before_tool_call(
        &self,
        call: BeforeToolCall<'_>,
        args: &mut Value,
        _cancel: &CancellationToken,
    ) -> Result<BeforeOutcome, HookError> {
        match &self.before {
            Some(before) => before(call.tool_call, args, call.context),
            None => Ok(BeforeOutcome::Continue),
        }
    }

    async fn after_tool_call(
        &self,
        call: AfterToolCall<'_>,
        _cancel: &CancellationToken,
    ) -> Result<ResultOverride, HookError> {
        match &self.after {
            Some(after) => after(call.tool_call, call.result),
            None => Ok(ResultOverride::default()),
        }
    }
}

type Listener = Box<dyn Fn(&AgentEvent) + Send + Sync>;

/// Records every event; an optional listener reacts to events as they are emitted.
#[derive(Clone, Default)]
pub struct Recorder {
    events: Arc<Mutex<Vec<AgentEvent>>>,
    listener: Arc<Mutex<Option<Listener>>>,
}

impl Recorder {
    pub fn control(&self) -> RunControl {
        self.control_with(CancellationToken::new())
    }

    pub fn control_with(&self, cancel: CancellationToken) -> RunControl {
        let recorder = self.clone();
        RunControl::new(
            cancel,
            Arc::new(move |event: AgentEvent| {
                lock(&recorder.events).push(event.clone());
                if let Some(listener) = lock(&recorder.listener).as_ref() {
                    listener(&event);
                }
            }),
        )
    }

    pub fn on_event(&self, listener: impl Fn(&AgentEvent) + Send + Sync + 'static) {
        *lock(&self.listener) = Some(Box::new(listener));
    }

    pub fn events(&self) -> Vec<AgentEvent> {
        lock(&self.events).clone()
    }

    pub fn kinds(&self) -> Vec<&'static str> {
        lock(&self.events).iter().map(AgentEvent::kind).collect()
    }

    /// Call ids of `tool_execution_end` events, in emission order.
    pub fn end_order(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                AgentEvent::ToolExecutionEnd { tool_call_id, .. } => Some(tool_call_id),
                _ => None,
            })
            .collect()
    }

    /// Call ids of ToolResult `message_end` events, in emission order.
    pub fn result_message_order(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                AgentEvent::MessageEnd {
                    message: Message::ToolResult(result),
                } => Some(result.tool_call_id),
                _ => None,
            })
            .collect()
    }

    /// `(call id, is_error, text)` of every `tool_execution_end`.
    pub fn ends(&self) -> Vec<(String, bool, String)> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                AgentEvent::ToolExecutionEnd {
                    tool_call_id,
                    result,
                    is_error,
                    ..
                } => Some((tool_call_id, is_error, text_of(&result))),
                _ => None,
            })
            .collect()
    }
}

pub fn text_of(result: &AgentToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text())
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn call(id: &str, name: &str, arguments: Value) -> AssistantContent {
    AssistantContent::ToolCall(ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments,
    })
}

/// An assistant message with these blocks and stop reason.
pub fn assistant(content: Vec<AssistantContent>, stop_reason: StopReason) -> AssistantMessage {
    AssistantMessage {
        content,
        stop_reason,
        ..Default::default()
    }
}

/// An assistant message making these tool calls.
pub fn calls(content: Vec<AssistantContent>) -> AssistantMessage {
    assistant(content, StopReason::ToolUse)
}

/// A final text answer.
pub fn answer(text: &str) -> AssistantMessage {
    assistant(
        vec![AssistantContent::Text {
            text: text.to_owned(),
        }],
        StopReason::Stop,
    )
}

/// The roles of a message list.
pub fn roles(messages: &[Message]) -> Vec<&'static str> {
    messages
        .iter()
        .map(|message| match message {
            Message::User(_) => "user",
            Message::Assistant(_) => "assistant",
            Message::ToolResult(_) => "toolResult",
        })
        .collect()
}

/// The tool results of a message list.
pub fn tool_results(messages: &[Message]) -> Vec<cordon_core::protocol::ToolResult> {
    messages
        .iter()
        .filter_map(|message| match message {
            Message::ToolResult(result) => Some(result.clone()),
            Message::User(_) | Message::Assistant(_) => None,
        })
        .collect()
}
