//! The model provider contract: the loop asks a provider for the next assistant message and
//! streams its progress. Real clients live in `cordon-model`; tests use scripted providers.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::protocol::{AssistantMessage, Message, ToolDefinition};

/// One streamed change to the assistant message being generated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum AssistantStreamEvent {
    /// Visible text was appended to block `content_index`.
    TextDelta {
        /// Index of the content block.
        content_index: usize,
        /// Appended text.
        delta: String,
    },
    /// Reasoning text was appended to block `content_index`.
    ThinkingDelta {
        /// Index of the content block.
        content_index: usize,
        /// Appended text.
        delta: String,
    },
    /// A tool call block started.
    ToolCallStart {
        /// Index of the content block.
        content_index: usize,
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// Raw JSON argument text was appended to a tool call block.
    ToolCallDelta {
        /// Index of the content block.
        content_index: usize,
        /// Appended JSON text.
        delta: String,
    },
}

/// What the loop sends to a provider for one turn.
#[derive(Clone, Copy)]
pub struct ModelRequest<'a> {
    /// System prompt, if any.
    pub system_prompt: Option<&'a str>,
    /// The conversation so far.
    pub messages: &'a [Message],
    /// The tools the model may call.
    pub tools: &'a [ToolDefinition],
}

/// Callback for streamed progress: the partial message so far and the event that changed it.
pub type StreamCallback<'a> = &'a (dyn Fn(&AssistantMessage, &AssistantStreamEvent) + Send + Sync);

/// The error a provider returns; the loop records it as an assistant message with
/// `stopReason: "error"` and ends the run.
pub type ProviderError = Box<dyn std::error::Error + Send + Sync>;

/// A model provider.
#[async_trait]
pub trait ModelProvider: Send + Sync {
    /// Produce the next assistant message, streaming progress through `on_event`.
    async fn stream(
        &self,
        request: ModelRequest<'_>,
        cancel: &CancellationToken,
        on_event: StreamCallback<'_>,
    ) -> Result<AssistantMessage, ProviderError>;
}
