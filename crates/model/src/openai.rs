//! The OpenAI chat-completions client, also used for OpenAI-compatible servers (llama.cpp,
//! vLLM, Ollama, …) at any base URL.
//!
//! Owns the mapping of Cordon's conversation to `POST {base}/chat/completions` with
//! `"stream": true` and `stream_options.include_usage`, and the decoding of its
//! `chat.completion.chunk` stream. The client, headers and sending live in the endpoint;
//! retrying, status errors and cancellation in the transport.
//!
//! Mapping choices (the chat-completions format has no place for some of our fields):
//! - thinking blocks are not sent back: the format has no field for them, and some servers
//!   (DeepSeek) reject `reasoning_content` in requests;
//! - a failed tool result (`isError`) is sent with its text prefixed `Error: `, the only way
//!   to carry the flag;
//! - tool-call arguments that are not a JSON object (raw text that did not parse) go back as
//!   `{}`: servers such as llama.cpp parse them and would reject the whole request, and the
//!   error result the model received already quotes its text;
//! - tool messages only take text, so images from tool results follow the batch's tool
//!   messages in one user message (`Attached image(s) from tool results:`);
//! - with [`OpenAiConfig::send_images`] off (text-only local models), images become a short
//!   note instead.
//!
//! Stream decoding: `delta.content` is text; the first of `delta.reasoning_content`,
//! `delta.reasoning`, `delta.reasoning_text` is thinking (servers differ in the name); tool
//! calls are keyed by their `index` so interleaved deltas of parallel calls land in the right
//! block. `finish_reason` maps `stop`→`stop`, `length`→`length`, `tool_calls`→`toolUse`;
//! `content_filter` is an error. A message with tool calls never reports `stop` (some servers
//! say `stop` after tool calls).

use async_trait::async_trait;
use cordon_core::protocol::{
    AssistantContent, AssistantMessage, Content, Message, StopReason, ToolResult, Usage,
};
use cordon_core::provider::{ModelProvider, ModelRequest, ProviderError, StreamCallback};
use reqwest::header::AUTHORIZATION;
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
use crate::transport::{Decoder, Step, StreamFailure, decode_event, json_error_message};

/// Settings of an OpenAI (or OpenAI-compatible) provider.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OpenAiConfig {
    /// `OpenAi` or `OpenAiCompatible` (names the provider in messages and picks the
    /// output-limit field).
    pub kind: ProviderKind,
    /// The model name sent as `model`.
    pub model: String,
    /// Base URL up to and including the version, e.g. `https://api.openai.com/v1`;
    /// `/chat/completions` is appended.
    pub base_url: String,
    /// Bearer token; `None` sends no `Authorization` header.
    pub api_key: Option<String>,
    /// Output token limit (`max_completion_tokens` for OpenAI, `max_tokens` for compatible
    /// servers); the server's default when `None`.
    pub max_tokens: Option<u32>,
    /// `reasoning_effort` for reasoning models (`low`, `medium`, `high`); not sent when `None`.
    pub reasoning_effort: Option<String>,
    /// Send images to the model; turn off for text-only models that reject them.
    pub send_images: bool,
    /// Retry behaviour.
    pub retry: RetryPolicy,
}

impl OpenAiConfig {
    /// Defaults for `model` at `base_url`: no key, no limits, images on, default retries.
    pub fn new(kind: ProviderKind, model: impl Into<String>, base_url: impl Into<String>) -> Self {
        OpenAiConfig {
            kind,
            model: model.into(),
            base_url: base_url.into(),
            api_key: None,
            max_tokens: None,
            reasoning_effort: None,
            send_images: true,
            retry: RetryPolicy::default(),
        }
    }
}

/// A streaming chat-completions client.
pub struct OpenAiProvider {
    config: OpenAiConfig,
    endpoint: Endpoint,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not derived: the key must not end up in logs.
        f.debug_struct("OpenAiProvider")
            .field("kind", &self.config.kind)
            .field("model", &self.config.model)
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    /// Validate the configuration and build the HTTP client.
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        let endpoint = Endpoint::new(EndpointSpec {
            provider: config.kind,
            base_url: &config.base_url,
            path: "chat/completions",
            key: config
                .api_key
                .as_ref()
                .map(|key| (AUTHORIZATION, format!("Bearer {key}"))),
            fixed: &[],
        })?;
        Ok(OpenAiProvider { config, endpoint })
    }

    /// The endpoint requests go to.
    pub fn url(&self) -> &str {
        self.endpoint.url().as_str()
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    async fn stream(
        &self,
        request: ModelRequest<'_>,
        cancel: &CancellationToken,
        on_event: StreamCallback<'_>,
    ) -> Result<AssistantMessage, ProviderError> {
        let kind = self.config.kind;
        let turn = Turn {
            model: &self.config.model,
            body: request_body(&self.config, request),
            retry: &self.config.retry,
            cancel,
            on_event,
        };
        Ok(self
            .endpoint
            .stream(turn, || OpenAiDecoder::new(kind))
            .await?)
    }
}

/// The JSON request body for one turn.
pub fn request_body(config: &OpenAiConfig, request: ModelRequest<'_>) -> Value {
    let ModelRequest {
        system_prompt,
        messages,
        tools,
    } = request;
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert(
        "messages".into(),
        Value::Array(wire_messages(system_prompt, messages, config.send_images)),
    );
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if !tools.is_empty() {
        let tools = tools
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                }})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(max_tokens) = config.max_tokens {
        let field = match config.kind {
            ProviderKind::OpenAi => "max_completion_tokens",
            ProviderKind::OpenAiCompatible | ProviderKind::Anthropic => "max_tokens",
        };
        body.insert(field.into(), json!(max_tokens));
    }
    if let Some(effort) = &config.reasoning_effort {
        body.insert("reasoning_effort".into(), json!(effort));
    }
    Value::Object(body)
}

const IMAGE_OMITTED: &str = "(image omitted: this model does not accept images)";

/// The `messages` array: system prompt first, then the normalized conversation.
fn wire_messages(system_prompt: Option<&str>, messages: &[Message], images: bool) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(system) = system_prompt.filter(|s| !s.is_empty()) {
        out.push(json!({"role": "system", "content": system}));
    }
    // Images of the current run of tool results, sent after it as one user message.
    let mut result_images: Vec<Value> = Vec::new();
    let context = normalized(messages);
    for (position, message) in context.iter().enumerate() {
        match message.as_ref() {
            Message::User(user) => {
                if let Some(content) = user_content(&user.content, images) {
                    out.push(json!({"role": "user", "content": content}));
                }
            }
            Message::Assistant(assistant) => {
                if let Some(wire) = assistant_message(assistant) {
                    out.push(wire);
                }
            }
            Message::ToolResult(result) => {
                out.push(tool_message(result, images, &mut result_images));
                let run_ends = !matches!(
                    context.get(position + 1).map(AsRef::as_ref),
                    Some(Message::ToolResult(_))
                );
                if run_ends && !result_images.is_empty() {
                    let mut parts = vec![json!({"type": "text",
                        "text": "Attached image(s) from tool results:"})];
                    parts.append(&mut result_images);
                    out.push(json!({"role": "user", "content": parts}));
                }
            }
        }
    }
    out
}

fn image_part(data: &str, mime_type: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": format!("data:{mime_type};base64,{data}")}})
}

/// A user message's `content`: a plain string for one text block, else an array of parts.
/// `None` when there is nothing to send.
fn user_content(content: &[Content], images: bool) -> Option<Value> {
    if let [Content::Text { text }] = content {
        return (!text.is_empty()).then(|| json!(text));
    }
    let parts: Vec<Value> = content
        .iter()
        .filter_map(|block| match block {
            Content::Text { text } if text.is_empty() => None,
            Content::Text { text } => Some(json!({"type": "text", "text": text})),
            Content::Image { data, mime_type } if images => Some(image_part(data, mime_type)),
            Content::Image { .. } => Some(json!({"type": "text", "text": IMAGE_OMITTED})),
        })
        .collect();
    (!parts.is_empty()).then_some(Value::Array(parts))
}

fn assistant_message(message: &AssistantMessage) -> Option<Value> {
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for block in &message.content {
        match block {
            AssistantContent::Text { text } if !text.is_empty() => texts.push(text.as_str()),
            AssistantContent::Text { .. } | AssistantContent::Thinking { .. } => {}
            AssistantContent::ToolCall(call) => {
                // Raw text that did not parse goes back as `{}` (module docs).
                let arguments = sendable_arguments(&call.arguments).to_string();
                calls.push(json!({"id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": arguments}}));
            }
        }
    }
    if texts.is_empty() && calls.is_empty() {
        return None;
    }
    let mut wire = Map::new();
    wire.insert("role".into(), json!("assistant"));
    wire.insert(
        "content".into(),
        if texts.is_empty() {
            Value::Null
        } else {
            json!(texts.join("\n"))
        },
    );
    if !calls.is_empty() {
        wire.insert("tool_calls".into(), Value::Array(calls));
    }
    Some(Value::Object(wire))
}

fn tool_message(result: &ToolResult, images: bool, result_images: &mut Vec<Value>) -> Value {
    let mut text = result.text();
    let mut image_count = 0;
    for block in &result.content {
        if let Content::Image { data, mime_type } = block {
            image_count += 1;
            if images {
                result_images.push(image_part(data, mime_type));
            }
        }
    }
    if image_count > 0 {
        let note = if images {
            "(image attached in the next message)"
        } else {
            IMAGE_OMITTED
        };
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(note);
    }
    if result.is_error {
        text = format!("Error: {text}");
    } else if text.is_empty() {
        text = "(no output)".to_owned();
    }
    json!({"role": "tool", "tool_call_id": result.tool_call_id, "content": text})
}

// ---- stream decoding ----

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    reasoning_text: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    /// A string fragment per the spec; some servers send the whole object.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    /// DeepSeek's name for cached prompt tokens.
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl WireUsage {
    /// `input` counts prompt tokens NOT read from the cache, as Anthropic's does, so both
    /// providers' usage adds up the same way.
    fn to_usage(&self) -> Usage {
        let prompt = self.prompt_tokens.unwrap_or(0);
        let completion = self.completion_tokens.unwrap_or(0);
        let cached = self
            .prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cached_tokens)
            .or(self.prompt_cache_hit_tokens)
            .unwrap_or(0)
            .min(prompt);
        Usage {
            input: prompt - cached,
            output: completion,
            cache_read: cached,
            cache_write: 0,
            total_tokens: self.total_tokens.unwrap_or(prompt + completion),
        }
    }
}

/// One streamed tool call: its wire `index` (or id) and its content block.
struct Slot {
    index: Option<u64>,
    id: Option<String>,
    block: usize,
    id_generated: bool,
}

/// Decoder of the `chat.completion.chunk` stream.
pub(crate) struct OpenAiDecoder {
    provider: ProviderKind,
    slots: Vec<Slot>,
    finish_reason: Option<String>,
    done: bool,
}

impl OpenAiDecoder {
    pub(crate) fn new(provider: ProviderKind) -> Self {
        OpenAiDecoder {
            provider,
            slots: Vec::new(),
            finish_reason: None,
            done: false,
        }
    }

    fn tool_call_delta(&mut self, delta: ToolCallDelta, builder: &mut MessageBuilder<'_>) {
        let ToolCallDelta {
            index,
            id,
            function,
        } = delta;
        let (name, arguments) = match function {
            Some(FunctionDelta { name, arguments }) => (name, arguments),
            None => (None, None),
        };
        let id = id.filter(|id| !id.is_empty());
        let existing = match (index, &id) {
            (Some(index), _) => self.slots.iter().position(|s| s.index == Some(index)),
            (None, Some(id)) => self
                .slots
                .iter()
                .position(|s| s.id.as_deref() == Some(id.as_str())),
            // Neither index nor id: a continuation of the latest call.
            (None, None) => self.slots.len().checked_sub(1),
        };
        let slot = match existing {
            Some(slot) => {
                let slot = &mut self.slots[slot];
                if let Some(call) = builder.tool_call_mut(slot.block) {
                    if let Some(id) = id.as_ref().filter(|_| slot.id_generated) {
                        call.id = id.clone();
                        slot.id = Some(id.clone());
                        slot.id_generated = false;
                    }
                    // Some servers repeat the full name in every delta: keep the first.
                    if let Some(name) = name.filter(|_| call.name.is_empty()) {
                        call.name = name;
                    }
                }
                slot
            }
            None => {
                let id_generated = id.is_none();
                let call_id = id
                    .clone()
                    .unwrap_or_else(|| format!("call_{}", fastrand_id()));
                let block = builder.start_tool_call(call_id.clone(), name.unwrap_or_default());
                self.slots.push(Slot {
                    index,
                    id: Some(call_id),
                    block,
                    id_generated,
                });
                self.slots.last_mut().expect("slot just pushed")
            }
        };
        let block = slot.block;
        match arguments {
            Some(Value::String(fragment)) => builder.tool_args_delta(block, &fragment),
            Some(Value::Null) | None => {}
            Some(whole) => builder.tool_args_delta(block, &whole.to_string()),
        }
    }
}

fn fastrand_id() -> String {
    (0..24).map(|_| fastrand::alphanumeric()).collect()
}

impl Decoder for OpenAiDecoder {
    fn event(
        &mut self,
        event: SseEvent,
        builder: &mut MessageBuilder<'_>,
    ) -> Result<Step, StreamFailure> {
        if event.data.trim() == "[DONE]" {
            self.done = true;
            return Ok(Step::Done);
        }
        let Some(chunk) = decode_event::<Chunk>(self.provider, &event)? else {
            return Ok(Step::Continue);
        };
        let Chunk {
            choices,
            usage,
            error,
        } = chunk;
        if let Some(error) = error.filter(|e| !e.is_null()) {
            return Err(stream_error(self.provider, &error));
        }
        if let Some(usage) = usage {
            builder.set_usage(usage.to_usage());
        }
        // Cordon asks for one choice; a server sending more is only heard on the first.
        for choice in choices
            .into_iter()
            .flatten()
            .filter(|c| c.index.unwrap_or(0) == 0)
        {
            let Choice {
                index: _,
                delta,
                finish_reason,
            } = choice;
            let Delta {
                content,
                refusal,
                reasoning_content,
                reasoning,
                reasoning_text,
                tool_calls,
            } = delta.unwrap_or_default();
            let reasoning = [reasoning_content, reasoning, reasoning_text]
                .into_iter()
                .flatten()
                .find(|r| !r.is_empty());
            if let Some(reasoning) = reasoning {
                builder.thinking_delta_at_tail(&reasoning);
            }
            if let Some(content) = content {
                builder.text_delta_at_tail(&content);
            }
            if let Some(refusal) = refusal {
                builder.text_delta_at_tail(&refusal);
            }
            for call in tool_calls.into_iter().flatten() {
                self.tool_call_delta(call, builder);
            }
            if let Some(reason) = finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = Some(reason);
            }
        }
        Ok(Step::Continue)
    }

    fn stop_known(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// A message with tool calls never ends with `stop`: the builder makes it `toolUse`.
    fn finish(&mut self, _: &mut MessageBuilder<'_>) -> Result<StopReason, StreamFailure> {
        if !self.done && self.finish_reason.is_none() {
            return Err(StreamFailure::incomplete(self.provider));
        }
        match self.finish_reason.as_deref() {
            Some("length" | "max_tokens") => Ok(StopReason::Length),
            Some("tool_calls" | "function_call") => Ok(StopReason::ToolUse),
            Some(reason @ "content_filter") => Err(StreamFailure::refused(self.provider, reason)),
            Some(_) | None => Ok(StopReason::Stop),
        }
    }
}

/// An `{"error": …}` chunk as a failure; server-side trouble is worth a retry.
fn stream_error(provider: ProviderKind, error: &Value) -> StreamFailure {
    let message = json_error_message(&json!({ "error": error }))
        .unwrap_or_else(|| "no error message".to_owned());
    let kind = ["type", "code"]
        .iter()
        .find_map(|field| match error.get(*field) {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        })
        .unwrap_or_default();
    let lower = kind.to_ascii_lowercase();
    let retryable = [
        "server_error",
        "rate_limit",
        "overloaded",
        "timeout",
        "unavailable",
    ]
    .iter()
    .any(|transient| lower.contains(transient))
        || lower.starts_with('5')
        || lower == "429";
    StreamFailure::provider_error(provider, kind, message, retryable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_core::protocol::{ToolCall, ToolDefinition, UserMessage};

    fn config(kind: ProviderKind) -> OpenAiConfig {
        OpenAiConfig::new(kind, "gpt-4.1", "https://api.openai.com/v1")
    }

    #[test]
    fn body_maps_the_whole_conversation() {
        let messages = vec![
            Message::User(UserMessage {
                content: vec![
                    Content::text("look"),
                    Content::Image {
                        data: "AAAA".into(),
                        mime_type: "image/png".into(),
                    },
                ],
            }),
            Message::Assistant(AssistantMessage {
                content: vec![
                    AssistantContent::Thinking {
                        thinking: "hmm".into(),
                        signature: None,
                    },
                    AssistantContent::Text {
                        text: "Reading.".into(),
                    },
                    AssistantContent::ToolCall(ToolCall {
                        id: "call_1".into(),
                        name: "read".into(),
                        arguments: json!({"path": "a.png"}),
                    }),
                    AssistantContent::ToolCall(ToolCall {
                        id: "call_2".into(),
                        name: "bash".into(),
                        arguments: json!("{\"command\": \"ls"),
                    }),
                ],
                stop_reason: StopReason::ToolUse,
                ..AssistantMessage::default()
            }),
            Message::ToolResult(ToolResult {
                tool_call_id: "call_1".into(),
                tool_name: "read".into(),
                content: vec![
                    Content::text("Read image file [image/png]"),
                    Content::Image {
                        data: "BBBB".into(),
                        mime_type: "image/png".into(),
                    },
                ],
                details: None,
                structured_content: None,
                is_error: false,
            }),
            Message::ToolResult(ToolResult {
                tool_call_id: "call_2".into(),
                tool_name: "bash".into(),
                content: vec![Content::text("bad arguments")],
                details: None,
                structured_content: None,
                is_error: true,
            }),
            Message::User(UserMessage::text("go on")),
        ];
        let tools = vec![ToolDefinition {
            name: "read".into(),
            description: "Read a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }];
        let mut config = config(ProviderKind::OpenAi);
        config.max_tokens = Some(1000);
        let body = request_body(
            &config,
            ModelRequest {
                system_prompt: Some("be brief"),
                messages: &messages,
                tools: &tools,
            },
        );
        assert_eq!(
            body,
            json!({
                "model": "gpt-4.1",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    ]},
                    {"role": "assistant", "content": "Reading.", "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "read", "arguments": "{\"path\":\"a.png\"}"}},
                        {"id": "call_2", "type": "function",
                         "function": {"name": "bash", "arguments": "{}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1",
                     "content": "Read image file [image/png]\n(image attached in the next message)"},
                    {"role": "tool", "tool_call_id": "call_2", "content": "Error: bad arguments"},
                    {"role": "user", "content": [
                        {"type": "text", "text": "Attached image(s) from tool results:"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}
                    ]},
                    {"role": "user", "content": "go on"}
                ],
                "stream": true,
                "stream_options": {"include_usage": true},
                "tools": [{"type": "function", "function": {
                    "name": "read", "description": "Read a file",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}
                }}],
                "max_completion_tokens": 1000
            })
        );
    }

    #[test]
    fn compatible_servers_get_max_tokens_no_empty_tools_and_optional_images() {
        let messages = vec![Message::User(UserMessage {
            content: vec![
                Content::text("what is this"),
                Content::Image {
                    data: "AAAA".into(),
                    mime_type: "image/jpeg".into(),
                },
            ],
        })];
        let mut config = config(ProviderKind::OpenAiCompatible);
        config.max_tokens = Some(256);
        config.send_images = false;
        config.reasoning_effort = Some("low".into());
        let body = request_body(
            &config,
            ModelRequest {
                system_prompt: None,
                messages: &messages,
                tools: &[],
            },
        );
        assert_eq!(
            body,
            json!({
                "model": "gpt-4.1",
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "text", "text": IMAGE_OMITTED}
                ]}],
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": 256,
                "reasoning_effort": "low"
            })
        );
    }

    #[test]
    fn usage_separates_cached_prompt_tokens() {
        let usage: WireUsage = serde_json::from_value(json!({
            "prompt_tokens": 1200, "completion_tokens": 30, "total_tokens": 1230,
            "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0}
        }))
        .unwrap();
        assert_eq!(
            usage.to_usage(),
            Usage {
                input: 176,
                output: 30,
                cache_read: 1024,
                cache_write: 0,
                total_tokens: 1230
            }
        );
    }

    #[test]
    fn null_fields_of_lenient_servers_are_accepted() {
        let chunk: Chunk = serde_json::from_str(
            r#"{"choices":null,"usage":{"prompt_tokens":5,"completion_tokens":null,"total_tokens":null,"prompt_tokens_details":null}}"#,
        )
        .unwrap();
        assert!(chunk.choices.is_none());
        assert_eq!(
            chunk.usage.unwrap().to_usage(),
            Usage {
                input: 5,
                output: 0,
                cache_read: 0,
                cache_write: 0,
                total_tokens: 5
            }
        );
    }

    #[test]
    fn error_chunks_are_classified() {
        let failure = stream_error(
            ProviderKind::OpenAi,
            &json!({"message": "The server had an error", "type": "server_error", "param": null, "code": null}),
        );
        assert!(failure.retryable);
        assert_eq!(
            failure.error.to_string(),
            "failed to complete the response: openai reported an error mid-stream (server_error): The server had an error"
        );
        let failure = stream_error(
            ProviderKind::OpenAiCompatible,
            &json!({"message": "context too long", "type": "invalid_request_error"}),
        );
        assert!(!failure.retryable);
    }
}
