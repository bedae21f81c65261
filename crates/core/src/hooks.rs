//! `before_tool_call` and `after_tool_call` hooks (docs/semantics.md#hooks): where policy
//! decisions, audit logging and redaction plug into the loop.

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::protocol::{AssistantMessage, Content, Message, ToolCall};
use crate::tool::AgentToolResult;

/// The error a hook returns; the loop turns it into an error result carrying its text.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// What a `before_tool_call` hook sees.
#[derive(Clone, Copy)]
pub struct BeforeToolCall<'a> {
    /// The assistant message that contains the call.
    pub assistant_message: &'a AssistantMessage,
    /// The call as the model sent it.
    pub tool_call: &'a ToolCall,
    /// The conversation so far.
    pub context: &'a [Message],
}

/// A `before_tool_call` decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BeforeOutcome {
    /// Execute the call (with the possibly mutated arguments).
    Continue,
    /// Do not execute; the model reads `reason` (default `Tool execution was blocked`).
    Block {
        /// Reason shown to the model.
        reason: Option<String>,
        /// Copied onto the error result's `terminate`.
        terminate: bool,
    },
}

/// What an `after_tool_call` hook sees.
#[derive(Clone, Copy)]
pub struct AfterToolCall<'a> {
    /// The assistant message that contains the call.
    pub assistant_message: &'a AssistantMessage,
    /// The call as the model sent it.
    pub tool_call: &'a ToolCall,
    /// The arguments the tool executed with.
    pub args: &'a Value,
    /// The result so far (success or error).
    pub result: &'a AgentToolResult,
    /// The conversation so far.
    pub context: &'a [Message],
}

/// Field-by-field replacement of a result (no deep merge). `None` keeps the original value.
/// Replacing `content` without also replacing `structured_content` clears
/// `structured_content`, so a redacted text never sits beside an unredacted copy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResultOverride {
    /// New content.
    pub content: Option<Vec<Content>>,
    /// New details (`Some(None)` clears them).
    pub details: Option<Option<Value>>,
    /// New structured content (`Some(None)` clears it).
    pub structured_content: Option<Option<Value>>,
    /// New error flag.
    pub is_error: Option<bool>,
    /// New terminate flag.
    pub terminate: Option<bool>,
}

impl ResultOverride {
    /// Apply this override to `result` with the rules above.
    pub fn apply(self, result: &mut AgentToolResult) {
        let ResultOverride {
            content,
            details,
            structured_content,
            is_error,
            terminate,
        } = self;
        let content_replaced = content.is_some();
        if let Some(content) = content {
            result.content = content;
        }
        if let Some(details) = details {
            result.details = details;
        }
        match structured_content {
            Some(structured) => result.structured_content = structured,
            None if content_replaced => result.structured_content = None,
            None => {}
        }
        if let Some(is_error) = is_error {
            result.is_error = is_error;
        }
        if let Some(terminate) = terminate {
            result.terminate = terminate;
        }
    }
}

/// Hooks around every tool call. Both default to doing nothing.
#[async_trait]
pub trait ToolHooks: Send + Sync {
    /// Runs after validation, before execution. May mutate `args` (they are not revalidated)
    /// or block the call.
    async fn before_tool_call(
        &self,
        call: BeforeToolCall<'_>,
        args: &mut Value,
        cancel: &CancellationToken,
    ) -> Result<BeforeOutcome, HookError> {
        let _ = (call, args, cancel);
        Ok(BeforeOutcome::Continue)
    }

    /// Runs after execution, on success and error results alike. An `Err` turns the result
    /// into an error result carrying the hook's message.
    async fn after_tool_call(
        &self,
        call: AfterToolCall<'_>,
        cancel: &CancellationToken,
    ) -> Result<ResultOverride, HookError> {
        let _ = (call, cancel);
        Ok(ResultOverride::default())
    }
}

/// Hooks that do nothing: every call continues and every result is kept as the tool returned
/// it. The default when no policy is configured.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl ToolHooks for NoHooks {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replacing_content_clears_structured_content() {
        let mut result = AgentToolResult::text("secret")
            .with_structured_content(json!({"output": "secret"}))
            .with_details(json!({"a": 1}));
        ResultOverride {
            content: Some(vec![Content::text("[redacted]")]),
            ..Default::default()
        }
        .apply(&mut result);
        assert_eq!(result.content, vec![Content::text("[redacted]")]);
        assert_eq!(result.structured_content, None);
        assert_eq!(result.details, Some(json!({"a": 1})));
    }

    #[test]
    fn override_is_field_by_field() {
        let mut result = AgentToolResult::text("x").with_structured_content(json!({"o": 1}));
        ResultOverride {
            is_error: Some(true),
            terminate: Some(true),
            ..Default::default()
        }
        .apply(&mut result);
        assert!(result.is_error && result.terminate);
        assert_eq!(result.structured_content, Some(json!({"o": 1})));
    }
}
