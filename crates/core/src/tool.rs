//! The agent runtime's tool contract: [`AgentTool`] and [`AgentToolResult`].
//!
//! A tool is an open set, so it is a trait. It never builds messages itself: it returns a
//! result or an error, and the loop turns either into a [`crate::protocol::ToolResult`].

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::protocol::{Content, ToolDefinition, ToolResult};

/// Whether a tool may run concurrently with the other calls of its batch
/// (docs/semantics.md#batches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExecutionMode {
    /// May overlap with other calls of the batch.
    #[default]
    Parallel,
    /// Forces the whole batch to run one call at a time.
    Sequential,
}

/// What a tool returns (docs/contract.md#tool-result).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentToolResult {
    /// What the model reads.
    pub content: Vec<Content>,
    /// Metadata for hosts, UIs and logs.
    #[serde(default)]
    pub details: Option<Value>,
    /// Machine-readable result for programs.
    #[serde(default)]
    pub structured_content: Option<Value>,
    /// Whether this result reports a failure.
    #[serde(default)]
    pub is_error: bool,
    /// Hint that the loop may skip the automatic next model call (docs/semantics.md#terminate).
    #[serde(default)]
    pub terminate: bool,
}

impl AgentToolResult {
    /// A successful result holding one text block.
    pub fn text(text: impl Into<String>) -> Self {
        AgentToolResult {
            content: vec![Content::text(text)],
            ..Default::default()
        }
    }

    /// An error result holding one text block.
    pub fn error(text: impl Into<String>) -> Self {
        AgentToolResult {
            content: vec![Content::text(text)],
            is_error: true,
            ..Default::default()
        }
    }

    /// Builder: set `details`.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// Builder: set `structured_content`.
    pub fn with_structured_content(mut self, structured: Value) -> Self {
        self.structured_content = Some(structured);
        self
    }

    /// The result message the model reads for call `tool_call_id` of tool `tool_name`.
    /// `terminate` is a loop hint and is not carried over.
    pub fn into_tool_result(
        self,
        tool_call_id: impl Into<String>,
        tool_name: impl Into<String>,
    ) -> ToolResult {
        let AgentToolResult {
            content,
            details,
            structured_content,
            is_error,
            terminate: _,
        } = self;
        ToolResult {
            tool_call_id: tool_call_id.into(),
            tool_name: tool_name.into(),
            content,
            details,
            structured_content,
            is_error,
        }
    }
}

/// The error a tool returns; its `Display` text is what the model reads, so write it for the
/// model: what failed and what to do next.
pub type ToolError = Box<dyn std::error::Error + Send + Sync>;

/// Callback through which a running tool reports partial results. The loop turns each call
/// into a `tool_execution_update` event and ignores calls made after the tool settled.
pub type UpdateCallback = Arc<dyn Fn(AgentToolResult) + Send + Sync>;

/// One invocation of [`AgentTool::execute`].
pub struct ToolInvocation {
    /// The model's call id.
    pub call_id: String,
    /// Arguments after `prepare_arguments`, validation and the `before_tool_call` hook.
    pub args: Value,
    /// Cancelled when the run is aborted; stop as soon as it is safe.
    pub cancel: CancellationToken,
    /// Partial-result sink.
    pub on_update: UpdateCallback,
}

/// A tool the agent loop can execute.
#[async_trait]
pub trait AgentTool: Send + Sync {
    /// Name the model calls the tool by.
    fn name(&self) -> &str;

    /// Human-readable label for UIs.
    fn label(&self) -> &str;

    /// Description shown to the model.
    fn description(&self) -> &str;

    /// JSON Schema of the arguments object.
    fn parameters(&self) -> &Value;

    /// One-line summary for a system prompt's tool list.
    fn prompt_snippet(&self) -> Option<&str> {
        None
    }

    /// Usage guidelines for a system prompt.
    fn prompt_guidelines(&self) -> &[&str] {
        &[]
    }

    /// Compatibility shim applied to raw arguments before validation
    /// (docs/semantics.md#pipeline).
    fn prepare_arguments(&self, args: Value) -> Value {
        args
    }

    /// Whether this tool forces its batch to run sequentially.
    fn execution_mode(&self) -> ExecutionMode {
        ExecutionMode::Parallel
    }

    /// Run the tool. `Err` becomes an error result whose text is the error's `Display`.
    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError>;

    /// The definition sent to the model.
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: self.name().to_owned(),
            description: self.description().to_owned(),
            parameters: self.parameters().clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn into_tool_result_keeps_every_field_but_terminate() {
        let mut result = AgentToolResult::error("boom")
            .with_details(json!({"d": 1}))
            .with_structured_content(json!({"s": 2}));
        result.terminate = true;
        assert_eq!(
            result.into_tool_result("call-1", "bash"),
            ToolResult {
                tool_call_id: "call-1".into(),
                tool_name: "bash".into(),
                content: vec![Content::text("boom")],
                details: Some(json!({"d": 1})),
                structured_content: Some(json!({"s": 2})),
                is_error: true,
            }
        );
    }
}
