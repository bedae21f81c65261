//! Model protocol types (docs/contract.md#json-shapes): tool calls, tool results, messages.
//!
//! Every type here serialises to the exact camelCase JSON of the contract. Nothing here
//! executes anything.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// A block of content a model can read: text or an image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Content {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// An inline image.
    Image {
        /// Base64-encoded image bytes.
        data: String,
        /// MIME type, e.g. `image/png`.
        #[serde(rename = "mimeType")]
        mime_type: String,
    },
}

impl Content {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Content::Text { text: text.into() }
    }

    /// The text of a text block, `None` for images.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Content::Text { text } => Some(text),
            Content::Image { .. } => None,
        }
    }
}

/// A tool call requested by the model: `{"id","name","arguments"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned call id, echoed in the result.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Raw arguments as the model sent them (not yet prepared or validated).
    #[serde(default)]
    pub arguments: Value,
}

/// One block of an assistant message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum AssistantContent {
    /// Visible text.
    Text {
        /// The text.
        text: String,
    },
    /// Reasoning text, where the provider exposes it.
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Provider signature needed to send the block back, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// A tool call.
    ToolCall(ToolCall),
}

/// Why the model stopped generating.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StopReason {
    /// Natural end of the message.
    #[default]
    Stop,
    /// The output token limit was hit; tool call arguments may be truncated
    /// (docs/semantics.md#stop-reasons).
    Length,
    /// The model asked for tool calls.
    ToolUse,
    /// The provider failed; see `errorMessage`.
    Error,
    /// The run was cancelled.
    Aborted,
}

/// Token usage of one model response.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub input: u64,
    /// Output (completion) tokens.
    pub output: u64,
    /// Tokens read from a prompt cache.
    pub cache_read: u64,
    /// Tokens written to a prompt cache.
    pub cache_write: u64,
    /// Total tokens as reported by the provider.
    pub total_tokens: u64,
}

/// A message produced by the model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssistantMessage {
    /// Text, thinking and tool-call blocks in the order the model produced them.
    #[serde(default)]
    pub content: Vec<AssistantContent>,
    /// Why generation stopped.
    #[serde(default)]
    pub stop_reason: StopReason,
    /// Token usage, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Provider name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Model name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Error text when `stop_reason` is `error` or `aborted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

impl AssistantMessage {
    /// The tool calls of this message, in source order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.content.iter().filter_map(|block| match block {
            AssistantContent::ToolCall(call) => Some(call),
            AssistantContent::Text { .. } | AssistantContent::Thinking { .. } => None,
        })
    }

    /// The concatenated visible text of this message.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|block| match block {
                AssistantContent::Text { text } => Some(text.as_str()),
                AssistantContent::Thinking { .. } | AssistantContent::ToolCall(_) => None,
            })
            .collect()
    }
}

/// A message from the user (a prompt or an injected steering message).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserMessage {
    /// Content blocks; a bare JSON string is accepted as one text block.
    #[serde(deserialize_with = "content_or_string")]
    pub content: Vec<Content>,
}

impl UserMessage {
    /// A user message holding one text block.
    pub fn text(text: impl Into<String>) -> Self {
        UserMessage {
            content: vec![Content::text(text)],
        }
    }
}

fn content_or_string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Content>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Blocks(Vec<Content>),
    }
    Ok(match Either::deserialize(deserializer)? {
        Either::Text(text) => vec![Content::Text { text }],
        Either::Blocks(blocks) => blocks,
    })
}

/// The result of one tool call, as the model and hosts see it (docs/contract.md#tool-result).
///
/// `details` and `structuredContent` are always serialised, as `null` when absent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// The id of the call this answers.
    pub tool_call_id: String,
    /// The tool's name as the model sent it.
    pub tool_name: String,
    /// What the model reads.
    pub content: Vec<Content>,
    /// Metadata for hosts, UIs and logs (truncation, diff, full-output path, …).
    #[serde(default)]
    pub details: Option<Value>,
    /// Machine-readable result for programs (e.g. bash's `{output, exitCode, …}`).
    #[serde(default)]
    pub structured_content: Option<Value>,
    /// Whether the call failed.
    #[serde(default)]
    pub is_error: bool,
}

impl ToolResult {
    /// The concatenated text blocks of the result.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for text in self.content.iter().filter_map(Content::as_text) {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(text);
        }
        out
    }
}

/// A message of the conversation context, tagged by `role`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "camelCase")]
pub enum Message {
    /// From the user.
    User(UserMessage),
    /// From the model.
    Assistant(AssistantMessage),
    /// A tool result fed back to the model.
    ToolResult(ToolResult),
}

/// What a model is told about a tool: name, description, JSON Schema of its arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Tool name.
    pub name: String,
    /// Description shown to the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_result_serialises_as_contract_shape() {
        let result = ToolResult {
            tool_call_id: "call-1".into(),
            tool_name: "read".into(),
            content: vec![
                Content::text("hi"),
                Content::Image {
                    data: "AAAA".into(),
                    mime_type: "image/png".into(),
                },
            ],
            details: None,
            structured_content: None,
            is_error: false,
        };
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            json!({"toolCallId":"call-1","toolName":"read",
                   "content":[{"type":"text","text":"hi"},
                              {"type":"image","data":"AAAA","mimeType":"image/png"}],
                   "details":null,"structuredContent":null,"isError":false})
        );
    }

    #[test]
    fn assistant_message_round_trips_contract_shape() {
        let line = json!({"role":"assistant","content":[{"type":"text","text":"…"},
            {"type":"toolCall","id":"call-1","name":"bash","arguments":{"command":"cargo test"}}],
            "stopReason":"toolUse"});
        let message: Message = serde_json::from_value(line.clone()).unwrap();
        let Message::Assistant(assistant) = &message else {
            panic!("not assistant")
        };
        assert_eq!(assistant.stop_reason, StopReason::ToolUse);
        assert_eq!(assistant.tool_calls().count(), 1);
        assert_eq!(serde_json::to_value(&message).unwrap(), line);
    }

    #[test]
    fn user_message_accepts_plain_string() {
        let message: Message =
            serde_json::from_value(json!({"role":"user","content":"hi"})).unwrap();
        assert_eq!(message, Message::User(UserMessage::text("hi")));
    }
}
