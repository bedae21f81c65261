//! The Anthropic Messages API client.
//!
//! Owns the mapping of Cordon's conversation to `POST {base}/v1/messages` with
//! `"stream": true`, and the decoding of its typed event stream (`message_start`,
//! `content_block_start/delta/stop`, `message_delta`, `message_stop`, `ping`, `error`).
//! The client, headers and sending live in the endpoint; retrying, status errors and
//! cancellation in the transport.
//!
//! Mapping choices:
//! - consecutive tool results (and a user message after them) travel in ONE user message,
//!   results first, as the API requires; a failed result carries `is_error: true`;
//! - thinking blocks go back with their signature so the API can verify them; a thinking
//!   block without a signature (from another provider) cannot be verified and is left out;
//! - a `redacted_thinking` block is kept as a thinking block whose text is
//!   `[Reasoning redacted]` and whose signature is the encrypted data prefixed with
//!   [`REDACTED_SIGNATURE_PREFIX`] (a `:` never occurs in a real base64 signature); it goes
//!   back as the same `redacted_thinking` block;
//! - tool-call ids are reduced to `[A-Za-z0-9_-]` (at most 64 characters), the API's
//!   pattern, consistently in calls and results; arguments that are not a JSON object (raw
//!   text that did not parse) go back as `{}`, since the API takes only objects — the error
//!   result the model got already quotes its text;
//! - with [`AnthropicConfig::prompt_caching`] (default on) a cache breakpoint is set on the
//!   system prompt (or the last tool, without one) and on the last block of the last user
//!   message, so every turn of an agent run reads the previous turn's prefix from the cache.

use std::collections::HashMap;

use async_trait::async_trait;
use cordon_core::protocol::{
    AssistantContent, AssistantMessage, Content, Message, StopReason, ToolResult, Usage,
};
use cordon_core::provider::{ModelProvider, ModelRequest, ProviderError, StreamCallback};
use reqwest::header::HeaderName;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::assemble::MessageBuilder;
use crate::context::{normalized, sendable_arguments};
use crate::endpoint::{Endpoint, EndpointSpec, Turn};
use crate::error::ModelError;
use crate::retry::RetryPolicy;
use crate::spec::ProviderKind;
use crate::sse::SseEvent;
use crate::transport::{Decoder, Step, StreamFailure, decode_event};

/// The API version header Cordon speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Marks the signature of a thinking block that stands for a `redacted_thinking` block.
pub const REDACTED_SIGNATURE_PREFIX: &str = "redacted_thinking:";

/// The text of a thinking block standing for a `redacted_thinking` block.
pub const REDACTED_THINKING_TEXT: &str = "[Reasoning redacted]";

/// Settings of an Anthropic provider.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AnthropicConfig {
    /// The model name, e.g. `claude-sonnet-4-5`.
    pub model: String,
    /// Base URL without the version, e.g. `https://api.anthropic.com`; `/v1/messages` is
    /// appended.
    pub base_url: String,
    /// The API key (`x-api-key`).
    pub api_key: String,
    /// Output token limit (required by the API); see [`default_max_tokens`] when `None`.
    pub max_tokens: Option<u32>,
    /// Extended thinking budget in tokens; off when `None`. Must stay below `max_tokens`.
    pub thinking_budget: Option<u32>,
    /// Set prompt-cache breakpoints (module docs).
    pub prompt_caching: bool,
    /// Retry behaviour.
    pub retry: RetryPolicy,
}

impl AnthropicConfig {
    /// Defaults for `model` at `base_url`: no thinking, caching on, default retries.
    pub fn new(
        model: impl Into<String>,
        base_url: impl Into<String>,
        api_key: impl Into<String>,
    ) -> Self {
        AnthropicConfig {
            model: model.into(),
            base_url: base_url.into(),
            api_key: api_key.into(),
            max_tokens: None,
            thinking_budget: None,
            prompt_caching: true,
            retry: RetryPolicy::default(),
        }
    }
}

/// The output limit used when none is configured: what every model of the family accepts
/// (Claude 3 Haiku/Opus/Sonnet 4096, Claude 3.5 8192, later models 32000 — the smallest
/// maximum among Claude 4 models), so the request is never rejected for it.
pub fn default_max_tokens(model: &str) -> u32 {
    let model = model.to_ascii_lowercase();
    if model.contains("claude-3-5") || model.contains("claude-3.5") {
        8192
    } else if model.contains("claude-3-7") || model.contains("claude-3.7") {
        32000
    } else if model.contains("claude-3") {
        4096
    } else {
        32000
    }
}

/// A streaming Messages API client.
pub struct AnthropicProvider {
    config: AnthropicConfig,
    endpoint: Endpoint,
}

impl std::fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not derived: the key must not end up in logs.
        f.debug_struct("AnthropicProvider")
            .field("model", &self.config.model)
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

impl AnthropicProvider {
    /// Validate the configuration and build the HTTP client.
    pub fn new(config: AnthropicConfig) -> Result<Self, ModelError> {
        let endpoint = Endpoint::new(EndpointSpec {
            provider: ProviderKind::Anthropic,
            base_url: &config.base_url,
            path: "v1/messages",
            key: Some((HeaderName::from_static("x-api-key"), config.api_key.clone())),
            fixed: &[("anthropic-version", ANTHROPIC_VERSION)],
        })?;
        Ok(AnthropicProvider { config, endpoint })
    }

    /// The endpoint requests go to.
    pub fn url(&self) -> &str {
        self.endpoint.url().as_str()
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
    async fn stream(
        &self,
        request: ModelRequest<'_>,
        cancel: &CancellationToken,
        on_event: StreamCallback<'_>,
    ) -> Result<AssistantMessage, ProviderError> {
        let turn = Turn {
            model: &self.config.model,
            body: request_body(&self.config, request),
            retry: &self.config.retry,
            cancel,
            on_event,
        };
        Ok(self.endpoint.stream(turn, AnthropicDecoder::new).await?)
    }
}

/// The JSON request body for one turn.
pub fn request_body(config: &AnthropicConfig, request: ModelRequest<'_>) -> Value {
    let ModelRequest {
        system_prompt,
        messages,
        tools,
    } = request;
    let cache = || json!({"type": "ephemeral"});
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    let max_tokens = config
        .max_tokens
        .unwrap_or_else(|| default_max_tokens(&config.model));
    body.insert("max_tokens".into(), json!(max_tokens));
    body.insert("stream".into(), json!(true));
    let system = system_prompt.filter(|s| !s.is_empty());
    if let Some(system) = system {
        let mut block = json!({"type": "text", "text": system});
        if config.prompt_caching {
            block["cache_control"] = cache();
        }
        body.insert("system".into(), json!([block]));
    }
    let mut wire = wire_messages(messages);
    if config.prompt_caching
        && let Some(last_user) = wire.iter_mut().rev().find(|m| m["role"] == "user")
        && let Some(Value::Object(block)) = last_user["content"]
            .as_array_mut()
            .and_then(|blocks| blocks.last_mut())
    {
        block.insert("cache_control".into(), cache());
    }
    body.insert("messages".into(), Value::Array(wire));
    if !tools.is_empty() {
        let mut wire_tools: Vec<Value> = tools
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                })
            })
            .collect();
        if config.prompt_caching
            && system.is_none()
            && let Some(last) = wire_tools.last_mut()
        {
            last["cache_control"] = cache();
        }
        body.insert("tools".into(), Value::Array(wire_tools));
    }
    if let Some(budget) = config.thinking_budget {
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    }
    Value::Object(body)
}

/// The `messages` array: the normalized conversation with same-role neighbours merged.
fn wire_messages(messages: &[Message]) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in normalized(messages) {
        let (role, blocks) = match message.as_ref() {
            Message::User(user) => ("user", content_blocks(&user.content)),
            Message::Assistant(assistant) => ("assistant", assistant_blocks(assistant)),
            Message::ToolResult(result) => ("user", vec![tool_result_block(result)]),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

/// Text and image blocks; empty text is left out (the API rejects it).
fn content_blocks(content: &[Content]) -> Vec<Value> {
    content
        .iter()
        .filter_map(|block| match block {
            Content::Text { text } if text.is_empty() => None,
            Content::Text { text } => Some(json!({"type": "text", "text": text})),
            Content::Image { data, mime_type } => Some(json!({"type": "image",
                "source": {"type": "base64", "media_type": mime_type, "data": data}})),
        })
        .collect()
}

fn assistant_blocks(message: &AssistantMessage) -> Vec<Value> {
    message
        .content
        .iter()
        .filter_map(|block| match block {
            AssistantContent::Text { text } if text.is_empty() => None,
            AssistantContent::Text { text } => Some(json!({"type": "text", "text": text})),
            AssistantContent::Thinking {
                thinking,
                signature: Some(signature),
            } if !signature.is_empty() => {
                Some(match signature.strip_prefix(REDACTED_SIGNATURE_PREFIX) {
                    Some(data) => json!({"type": "redacted_thinking", "data": data}),
                    None => {
                        json!({"type": "thinking", "thinking": thinking, "signature": signature})
                    }
                })
            }
            AssistantContent::Thinking { .. } => None,
            AssistantContent::ToolCall(call) => Some(json!({"type": "tool_use",
                "id": tool_id(&call.id), "name": call.name,
                "input": sendable_arguments(&call.arguments)})),
        })
        .collect()
}

fn tool_result_block(result: &ToolResult) -> Value {
    let mut block = json!({"type": "tool_result", "tool_use_id": tool_id(&result.tool_call_id)});
    let content = content_blocks(&result.content);
    if !content.is_empty() {
        block["content"] = Value::Array(content);
    }
    if result.is_error {
        block["is_error"] = json!(true);
    }
    block
}

/// A tool-call id in the API's pattern `^[a-zA-Z0-9_-]{1,64}$`.
fn tool_id(id: &str) -> String {
    let mut clean: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if clean.is_empty() {
        clean.push('_');
    }
    clean
}

// ---- stream decoding ----

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        index: u64,
        content_block: Block,
    },
    ContentBlockDelta {
        index: u64,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: u64,
    },
    MessageDelta {
        #[serde(default)]
        delta: MessageDeltaBody,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: WireError,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct StartMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Option<Value>,
    },
    /// Server tools, web search results, …: not part of Cordon's protocol.
    #[serde(other)]
    Other,
}

/// The `delta` of a `content_block_delta` event.
#[derive(Deserialize)]
#[serde(tag = "type")]
enum BlockDelta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "signature_delta")]
    Signature { signature: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
    /// Citations and future delta types.
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct MessageDeltaBody {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireError {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    message: String,
}

/// What an Anthropic block index stands for in our message.
enum BlockState {
    /// Text; the content block is created by the first non-empty delta.
    Text(Option<usize>),
    /// Thinking; created by the first non-empty thinking or signature delta.
    Thinking(Option<usize>),
    /// A tool call and the `input` its start event carried.
    Tool {
        block: usize,
        initial: Option<Value>,
    },
    /// A block type Cordon does not represent.
    Ignored,
}

/// Decoder of the Messages event stream.
pub(crate) struct AnthropicDecoder {
    blocks: HashMap<u64, BlockState>,
    usage: Usage,
    stop_reason: Option<String>,
    stopped: bool,
}

impl AnthropicDecoder {
    pub(crate) fn new() -> Self {
        AnthropicDecoder {
            blocks: HashMap::new(),
            usage: Usage::default(),
            stop_reason: None,
            stopped: false,
        }
    }

    fn update_usage(&mut self, usage: WireUsage, builder: &mut MessageBuilder<'_>) {
        let WireUsage {
            input_tokens,
            output_tokens,
            cache_creation_input_tokens,
            cache_read_input_tokens,
        } = usage;
        // message_delta repeats the cumulative counts it knows; absent fields keep theirs.
        let u = &mut self.usage;
        u.input = input_tokens.unwrap_or(u.input);
        u.output = output_tokens.unwrap_or(u.output);
        u.cache_write = cache_creation_input_tokens.unwrap_or(u.cache_write);
        u.cache_read = cache_read_input_tokens.unwrap_or(u.cache_read);
        u.total_tokens = u.input + u.output + u.cache_read + u.cache_write;
        builder.set_usage(self.usage.clone());
    }

    fn start_block(&mut self, index: u64, block: Block, builder: &mut MessageBuilder<'_>) {
        let state = match block {
            Block::Text { text } => {
                let mut state = BlockState::Text(None);
                append(&mut state, &text, builder);
                state
            }
            Block::Thinking {
                thinking,
                signature,
            } => {
                let mut state = BlockState::Thinking(None);
                append(&mut state, &thinking, builder);
                sign(&mut state, &signature, builder);
                state
            }
            Block::RedactedThinking { data } => {
                BlockState::Thinking(Some(builder.push_block(AssistantContent::Thinking {
                    thinking: REDACTED_THINKING_TEXT.to_owned(),
                    signature: Some(format!("{REDACTED_SIGNATURE_PREFIX}{data}")),
                })))
            }
            Block::ToolUse { id, name, input } => BlockState::Tool {
                block: builder.start_tool_call(id, name),
                initial: input,
            },
            Block::Other => BlockState::Ignored,
        };
        self.blocks.insert(index, state);
    }
}

/// Append streamed text to whatever `state` stands for, creating its block on first use.
fn append(state: &mut BlockState, delta: &str, builder: &mut MessageBuilder<'_>) {
    if delta.is_empty() {
        return;
    }
    match state {
        BlockState::Text(slot) => {
            let block = *slot.get_or_insert_with(|| {
                builder.push_block(AssistantContent::Text {
                    text: String::new(),
                })
            });
            builder.text_delta(block, delta);
        }
        BlockState::Thinking(slot) => {
            let block = *slot.get_or_insert_with(|| new_thinking(builder));
            builder.thinking_delta(block, delta);
        }
        BlockState::Tool { block, .. } => builder.tool_args_delta(*block, delta),
        BlockState::Ignored => {}
    }
}

fn new_thinking(builder: &mut MessageBuilder<'_>) -> usize {
    builder.push_block(AssistantContent::Thinking {
        thinking: String::new(),
        signature: None,
    })
}

fn sign(state: &mut BlockState, signature: &str, builder: &mut MessageBuilder<'_>) {
    if signature.is_empty() {
        return;
    }
    if let BlockState::Thinking(slot) = state {
        let block = *slot.get_or_insert_with(|| new_thinking(builder));
        builder.signature_delta(block, signature);
    }
}

/// A tool call that received no `input_json_delta` takes the `input` of its start event.
fn settle_tool(state: &BlockState, builder: &mut MessageBuilder<'_>) {
    if let BlockState::Tool {
        block,
        initial: Some(initial),
    } = state
        && builder.tool_args(*block).is_some_and(str::is_empty)
        && initial.as_object().is_some_and(|o| !o.is_empty())
    {
        builder.tool_args_delta(*block, &initial.to_string());
    }
}

impl Decoder for AnthropicDecoder {
    fn event(
        &mut self,
        event: SseEvent,
        builder: &mut MessageBuilder<'_>,
    ) -> Result<Step, StreamFailure> {
        let Some(parsed) = decode_event::<Event>(ProviderKind::Anthropic, &event)? else {
            return Ok(Step::Continue);
        };
        match parsed {
            Event::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.update_usage(usage, builder);
                }
            }
            Event::ContentBlockStart {
                index,
                content_block,
            } => self.start_block(index, content_block, builder),
            Event::ContentBlockDelta { index, delta } => {
                let Some(mut state) = self.blocks.remove(&index) else {
                    // A delta for a block that never started: nothing to attach it to.
                    return Ok(Step::Continue);
                };
                match delta {
                    BlockDelta::Text { text } => append(&mut state, &text, builder),
                    BlockDelta::Thinking { thinking } => append(&mut state, &thinking, builder),
                    BlockDelta::InputJson { partial_json } => {
                        append(&mut state, &partial_json, builder)
                    }
                    BlockDelta::Signature { signature } => sign(&mut state, &signature, builder),
                    BlockDelta::Other => {}
                }
                self.blocks.insert(index, state);
            }
            Event::ContentBlockStop { index } => {
                if let Some(state) = self.blocks.get(&index) {
                    settle_tool(state, builder);
                }
            }
            Event::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.stop_reason {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = usage {
                    self.update_usage(usage, builder);
                }
            }
            Event::MessageStop => {
                self.stopped = true;
                return Ok(Step::Done);
            }
            Event::Ping | Event::Unknown => {}
            Event::Error { error } => {
                let retryable = matches!(
                    error.kind.as_str(),
                    "overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error"
                );
                return Err(StreamFailure::provider_error(
                    ProviderKind::Anthropic,
                    error.kind,
                    error.message,
                    retryable,
                ));
            }
        }
        Ok(Step::Continue)
    }

    fn stop_known(&self) -> bool {
        self.stop_reason.is_some()
    }

    fn finish(&mut self, builder: &mut MessageBuilder<'_>) -> Result<StopReason, StreamFailure> {
        for state in self.blocks.values() {
            settle_tool(state, builder);
        }
        let Some(reason) = self.stop_reason.as_deref() else {
            return Err(StreamFailure::incomplete(ProviderKind::Anthropic));
        };
        match reason {
            "max_tokens" | "model_context_window_exceeded" => Ok(StopReason::Length),
            "tool_use" => Ok(StopReason::ToolUse),
            "refusal" => Err(StreamFailure::refused(ProviderKind::Anthropic, reason)),
            // end_turn, stop_sequence, pause_turn and reasons added later; after tool calls
            // the builder makes it `toolUse`.
            _ => Ok(StopReason::Stop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_core::protocol::{ToolCall, ToolDefinition, UserMessage};

    fn config() -> AnthropicConfig {
        AnthropicConfig::new("claude-sonnet-4-5", "https://api.anthropic.com", "sk-ant")
    }

    #[test]
    fn default_output_limits_fit_every_model() {
        assert_eq!(default_max_tokens("claude-3-haiku-20240307"), 4096);
        assert_eq!(default_max_tokens("claude-3-5-sonnet-latest"), 8192);
        assert_eq!(default_max_tokens("claude-3-7-sonnet-latest"), 32000);
        assert_eq!(default_max_tokens("claude-sonnet-4-5"), 32000);
        assert_eq!(default_max_tokens("claude-opus-4-1"), 32000);
    }

    #[test]
    fn tool_ids_fit_the_api_pattern() {
        assert_eq!(tool_id("toolu_01A-b"), "toolu_01A-b");
        assert_eq!(tool_id("call:1|x.y"), "call_1_x_y");
        assert_eq!(tool_id(""), "_");
        assert_eq!(tool_id(&"a".repeat(80)).len(), 64);
    }

    #[test]
    fn body_maps_thinking_tool_results_and_cache_breakpoints() {
        let messages = vec![
            Message::User(UserMessage::text("fix it")),
            Message::Assistant(AssistantMessage {
                content: vec![
                    AssistantContent::Thinking {
                        thinking: "plan".into(),
                        signature: Some("c2ln".into()),
                    },
                    AssistantContent::Thinking {
                        thinking: REDACTED_THINKING_TEXT.into(),
                        signature: Some(format!("{REDACTED_SIGNATURE_PREFIX}ZW5j")),
                    },
                    AssistantContent::Thinking {
                        thinking: "unsigned, from another provider".into(),
                        signature: None,
                    },
                    AssistantContent::Text {
                        text: "Looking.".into(),
                    },
                    AssistantContent::ToolCall(ToolCall {
                        id: "call:1".into(),
                        name: "read".into(),
                        arguments: json!({"path": "a.png"}),
                    }),
                    AssistantContent::ToolCall(ToolCall {
                        id: "toolu_2".into(),
                        name: "bash".into(),
                        arguments: json!("{\"command\": \"ls"),
                    }),
                ],
                stop_reason: StopReason::ToolUse,
                ..AssistantMessage::default()
            }),
            Message::ToolResult(ToolResult {
                tool_call_id: "call:1".into(),
                tool_name: "read".into(),
                content: vec![
                    Content::text("Read image file [image/png]"),
                    Content::Image {
                        data: "QUJD".into(),
                        mime_type: "image/png".into(),
                    },
                ],
                details: None,
                structured_content: None,
                is_error: false,
            }),
            Message::ToolResult(ToolResult {
                tool_call_id: "toolu_2".into(),
                tool_name: "bash".into(),
                content: vec![Content::text("invalid arguments")],
                details: None,
                structured_content: None,
                is_error: true,
            }),
            Message::User(UserMessage::text("and hurry")),
        ];
        let tools = vec![ToolDefinition {
            name: "read".into(),
            description: "Read a file".into(),
            parameters: json!({"type": "object"}),
        }];
        let mut config = config();
        config.thinking_budget = Some(2048);
        let body = request_body(
            &config,
            ModelRequest {
                system_prompt: Some("be careful"),
                messages: &messages,
                tools: &tools,
            },
        );
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 32000,
                "stream": true,
                "system": [{"type": "text", "text": "be careful",
                            "cache_control": {"type": "ephemeral"}}],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "plan", "signature": "c2ln"},
                        {"type": "redacted_thinking", "data": "ZW5j"},
                        {"type": "text", "text": "Looking."},
                        {"type": "tool_use", "id": "call_1", "name": "read",
                         "input": {"path": "a.png"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {}}
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": [
                            {"type": "text", "text": "Read image file [image/png]"},
                            {"type": "image", "source": {"type": "base64",
                             "media_type": "image/png", "data": "QUJD"}}
                        ]},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                         "content": [{"type": "text", "text": "invalid arguments"}]},
                        {"type": "text", "text": "and hurry",
                         "cache_control": {"type": "ephemeral"}}
                    ]}
                ],
                "tools": [{"name": "read", "description": "Read a file",
                           "input_schema": {"type": "object"}}],
                "thinking": {"type": "enabled", "budget_tokens": 2048}
            })
        );
    }

    #[test]
    fn without_system_prompt_the_tools_carry_the_breakpoint_and_caching_can_be_off() {
        let messages = vec![Message::User(UserMessage::text("hi"))];
        let tools = vec![ToolDefinition {
            name: "ls".into(),
            description: "List".into(),
            parameters: json!({"type": "object"}),
        }];
        let request = ModelRequest {
            system_prompt: None,
            messages: &messages,
            tools: &tools,
        };
        let body = request_body(&config(), request);
        assert_eq!(
            body["tools"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
        assert!(body.get("system").is_none());
        let mut plain = config();
        plain.prompt_caching = false;
        plain.max_tokens = Some(100);
        assert_eq!(
            request_body(&plain, request),
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 100,
                "stream": true,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "tools": [{"name": "ls", "description": "List", "input_schema": {"type": "object"}}]
            })
        );
    }
}
