//! Building the [`AssistantMessage`] as a stream arrives, and reporting each change through
//! the loop's callback.
//!
//! Both wire decoders drive this one builder, so the partial message and the
//! [`AssistantStreamEvent`]s look the same whichever provider produced them.
//!
//! Tool-call arguments: while a call streams, its `arguments` field holds the raw JSON text
//! received so far as a JSON *string* (appended in place, so long arguments stay linear). When
//! the message is finished, each call's text is parsed:
//! - empty or whitespace-only text becomes `{}` (a call without arguments);
//! - text that parses becomes that JSON value;
//! - text that does not parse (truncated by a length stop, or malformed by the model) is kept as
//!   the raw string. Argument validation then rejects it (a string is not an object) and the
//!   model reads its own broken text in the error, so it can re-issue the call.

use cordon_core::protocol::{AssistantContent, AssistantMessage, StopReason, ToolCall, Usage};
use cordon_core::provider::{AssistantStreamEvent, StreamCallback};
use serde_json::Value;

/// The message under construction plus the callback that watches it.
pub(crate) struct MessageBuilder<'a> {
    message: AssistantMessage,
    on_event: StreamCallback<'a>,
    emitted: bool,
}

impl<'a> MessageBuilder<'a> {
    /// An empty message attributed to `provider` / `model`.
    pub(crate) fn new(provider: &str, model: &str, on_event: StreamCallback<'a>) -> Self {
        MessageBuilder {
            message: AssistantMessage {
                provider: Some(provider.to_owned()),
                model: Some(model.to_owned()),
                ..AssistantMessage::default()
            },
            on_event,
            emitted: false,
        }
    }

    /// Whether any event reached the callback (after that, a retry would repeat output).
    pub(crate) fn has_emitted(&self) -> bool {
        self.emitted
    }

    fn emit(&mut self, event: AssistantStreamEvent) {
        self.emitted = true;
        (self.on_event)(&self.message, &event);
    }

    /// Append an empty block without telling anyone (text arrives through the deltas).
    pub(crate) fn push_block(&mut self, block: AssistantContent) -> usize {
        self.message.content.push(block);
        self.message.content.len() - 1
    }

    /// Append `delta` to the text block at `index`.
    pub(crate) fn text_delta(&mut self, index: usize, delta: &str) {
        if delta.is_empty() {
            return;
        }
        if let Some(AssistantContent::Text { text }) = self.message.content.get_mut(index) {
            text.push_str(delta);
            self.emit(AssistantStreamEvent::TextDelta {
                content_index: index,
                delta: delta.to_owned(),
            });
        }
    }

    /// Append `delta` to the last block if it is text, else to a new text block.
    pub(crate) fn text_delta_at_tail(&mut self, delta: &str) {
        if delta.is_empty() {
            return;
        }
        let index = match self.message.content.last() {
            Some(AssistantContent::Text { .. }) => self.message.content.len() - 1,
            _ => self.push_block(AssistantContent::Text {
                text: String::new(),
            }),
        };
        self.text_delta(index, delta);
    }

    /// Append `delta` to the thinking block at `index`.
    pub(crate) fn thinking_delta(&mut self, index: usize, delta: &str) {
        if delta.is_empty() {
            return;
        }
        if let Some(AssistantContent::Thinking { thinking, .. }) =
            self.message.content.get_mut(index)
        {
            thinking.push_str(delta);
            self.emit(AssistantStreamEvent::ThinkingDelta {
                content_index: index,
                delta: delta.to_owned(),
            });
        }
    }

    /// Append `delta` to the last block if it is thinking, else to a new thinking block.
    pub(crate) fn thinking_delta_at_tail(&mut self, delta: &str) {
        if delta.is_empty() {
            return;
        }
        let index = match self.message.content.last() {
            Some(AssistantContent::Thinking { .. }) => self.message.content.len() - 1,
            _ => self.push_block(AssistantContent::Thinking {
                thinking: String::new(),
                signature: None,
            }),
        };
        self.thinking_delta(index, delta);
    }

    /// Append to the signature of the thinking block at `index` (no event: signatures are
    /// opaque and not shown).
    pub(crate) fn signature_delta(&mut self, index: usize, delta: &str) {
        if let Some(AssistantContent::Thinking { signature, .. }) =
            self.message.content.get_mut(index)
        {
            signature.get_or_insert_with(String::new).push_str(delta);
        }
    }

    /// Start a tool call block and announce it.
    pub(crate) fn start_tool_call(&mut self, id: String, name: String) -> usize {
        let index = self.push_block(AssistantContent::ToolCall(ToolCall {
            id: id.clone(),
            name: name.clone(),
            arguments: Value::String(String::new()),
        }));
        self.emit(AssistantStreamEvent::ToolCallStart {
            content_index: index,
            id,
            name,
        });
        index
    }

    /// The tool call at `index`, to fix up its id or name.
    pub(crate) fn tool_call_mut(&mut self, index: usize) -> Option<&mut ToolCall> {
        match self.message.content.get_mut(index) {
            Some(AssistantContent::ToolCall(call)) => Some(call),
            _ => None,
        }
    }

    /// The raw argument text of the tool call at `index` so far.
    pub(crate) fn tool_args(&self, index: usize) -> Option<&str> {
        match self.message.content.get(index) {
            Some(AssistantContent::ToolCall(ToolCall {
                arguments: Value::String(raw),
                ..
            })) => Some(raw),
            _ => None,
        }
    }

    /// Append raw JSON text to the arguments of the tool call at `index`.
    pub(crate) fn tool_args_delta(&mut self, index: usize, delta: &str) {
        if delta.is_empty() {
            return;
        }
        if let Some(AssistantContent::ToolCall(ToolCall {
            arguments: Value::String(raw),
            ..
        })) = self.message.content.get_mut(index)
        {
            raw.push_str(delta);
            self.emit(AssistantStreamEvent::ToolCallDelta {
                content_index: index,
                delta: delta.to_owned(),
            });
        }
    }

    /// Record usage as reported so far.
    pub(crate) fn set_usage(&mut self, usage: Usage) {
        self.message.usage = Some(usage);
    }

    /// The finished message: tool-call arguments parsed (see the module docs). A message with
    /// tool calls that would stop with `stop` stops with `toolUse` instead: some servers say
    /// `stop` after tool calls (as Anthropic says `end_turn` or `pause_turn`), and the loop
    /// runs a message's calls only for `toolUse`.
    pub(crate) fn finish(mut self, stop_reason: StopReason) -> AssistantMessage {
        let mut has_calls = false;
        for block in &mut self.message.content {
            if let AssistantContent::ToolCall(call) = block {
                has_calls = true;
                call.arguments = parse_arguments(std::mem::take(&mut call.arguments));
            }
        }
        self.message.stop_reason = match stop_reason {
            StopReason::Stop if has_calls => StopReason::ToolUse,
            other => other,
        };
        self.message
    }

    /// The partial message of a cancelled request, `stopReason: "aborted"`.
    pub(crate) fn abort(self) -> AssistantMessage {
        let mut message = self.finish(StopReason::Aborted);
        message.error_message = Some("the request was cancelled".to_owned());
        message
    }
}

/// Turn the raw argument text of a finished call into its JSON value (module docs).
pub(crate) fn parse_arguments(arguments: Value) -> Value {
    match arguments {
        Value::String(raw) if raw.trim().is_empty() => Value::Object(Default::default()),
        Value::String(raw) => serde_json::from_str(&raw).unwrap_or(Value::String(raw)),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    #[test]
    fn arguments_parse_or_stay_raw() {
        assert_eq!(parse_arguments(json!("")), json!({}));
        assert_eq!(parse_arguments(json!("  \n")), json!({}));
        assert_eq!(
            parse_arguments(json!("{\"path\":\"a.rs\"}")),
            json!({"path":"a.rs"})
        );
        assert_eq!(
            parse_arguments(json!("{\"path\":\"a.r")),
            json!("{\"path\":\"a.r")
        );
    }

    #[test]
    fn a_message_with_tool_calls_never_stops_with_stop() {
        let callback = |_: &AssistantMessage, _: &AssistantStreamEvent| {};
        let with_call = |stop_reason| {
            let mut builder = MessageBuilder::new("openai", "m", &callback);
            builder.text_delta_at_tail("Reading.");
            builder.start_tool_call("c1".into(), "read".into());
            builder.finish(stop_reason).stop_reason
        };
        assert_eq!(with_call(StopReason::Stop), StopReason::ToolUse);
        assert_eq!(with_call(StopReason::ToolUse), StopReason::ToolUse);
        assert_eq!(with_call(StopReason::Length), StopReason::Length);
        assert_eq!(with_call(StopReason::Aborted), StopReason::Aborted);
        let mut text_only = MessageBuilder::new("openai", "m", &callback);
        text_only.text_delta_at_tail("Done.");
        assert_eq!(
            text_only.finish(StopReason::Stop).stop_reason,
            StopReason::Stop
        );
    }

    #[test]
    fn events_carry_the_partial_message_as_it_grows() {
        let seen = Mutex::new(Vec::new());
        let callback = |message: &AssistantMessage, event: &AssistantStreamEvent| {
            seen.lock()
                .unwrap()
                .push((message.content.clone(), event.clone()));
        };
        let mut builder = MessageBuilder::new("openai", "m", &callback);
        builder.thinking_delta_at_tail("hm");
        builder.text_delta_at_tail("Hi");
        builder.text_delta_at_tail("");
        builder.text_delta_at_tail(" there");
        let call = builder.start_tool_call("c1".into(), "read".into());
        builder.tool_args_delta(call, "{\"path\":");
        builder.tool_args_delta(call, "\"x\"}");
        builder.text_delta_at_tail("after");
        assert!(builder.has_emitted());
        let message = builder.finish(StopReason::ToolUse);
        assert_eq!(
            message.content,
            vec![
                AssistantContent::Thinking {
                    thinking: "hm".into(),
                    signature: None
                },
                AssistantContent::Text {
                    text: "Hi there".into()
                },
                AssistantContent::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "read".into(),
                    arguments: json!({"path":"x"})
                }),
                AssistantContent::Text {
                    text: "after".into()
                },
            ]
        );
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 7);
        assert_eq!(
            seen[4].0[2],
            AssistantContent::ToolCall(ToolCall {
                id: "c1".into(),
                name: "read".into(),
                arguments: json!("{\"path\":")
            })
        );
        assert_eq!(
            seen[4].1,
            AssistantStreamEvent::ToolCallDelta {
                content_index: 2,
                delta: "{\"path\":".into()
            }
        );
    }
}
