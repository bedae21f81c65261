//! Cleaning the conversation before it is mapped to a wire format.
//!
//! Both APIs reject a request outright (HTTP 400) when the tool-call bookkeeping is off: an
//! assistant tool call without a result before the next turn, or a result for a call no
//! assistant message made. A history can get that way through cancellation, a provider error
//! or a hand-edited transcript; failing the whole run for it helps nobody. So, before mapping:
//! - assistant messages that ended in `error` or `aborted` are left out: they are incomplete,
//!   and the APIs would take their half-streamed tool calls for real ones;
//! - every tool call without a result gets an error result saying so, placed right after the
//!   results that do exist;
//! - tool results answering no pending call are left out.
//!
//! Everything else passes through unchanged and in order.
//!
//! Also here, for both mappings: tool-call arguments that are not a JSON object go back as `{}`
//! ([`sendable_arguments`]).

use std::borrow::Cow;

use cordon_core::protocol::{Content, Message, StopReason, ToolResult};
use serde_json::{Map, Value};

/// The text of the error result standing in for a missing one.
pub(crate) const MISSING_RESULT: &str = "No result was recorded for this tool call; it may not have run. Re-issue it if it is still needed.";

/// A tool call's arguments as they can be sent back: the object, or `{}` for raw text that did
/// not parse. Both APIs take only objects (llama.cpp and others reject the whole request
/// otherwise), and the error result the model received already quotes its text.
pub(crate) fn sendable_arguments(arguments: &Value) -> Cow<'_, Value> {
    match arguments {
        Value::Object(_) => Cow::Borrowed(arguments),
        _ => Cow::Owned(Value::Object(Map::new())),
    }
}

/// The conversation with the repairs described in the module docs.
pub(crate) fn normalized(messages: &[Message]) -> Vec<Cow<'_, Message>> {
    let mut out: Vec<Cow<'_, Message>> = Vec::with_capacity(messages.len());
    // Calls of the latest assistant message still waiting for a result: (id, name).
    let mut pending: Vec<(String, String)> = Vec::new();
    for message in messages {
        match message {
            Message::ToolResult(result) => {
                if let Some(position) = pending
                    .iter()
                    .position(|(id, _)| *id == result.tool_call_id)
                {
                    pending.remove(position);
                    out.push(Cow::Borrowed(message));
                }
            }
            Message::Assistant(assistant) => {
                let complete = match assistant.stop_reason {
                    StopReason::Stop | StopReason::Length | StopReason::ToolUse => true,
                    StopReason::Error | StopReason::Aborted => false,
                };
                if !complete {
                    continue;
                }
                flush_missing(&mut pending, &mut out);
                pending.extend(
                    assistant
                        .tool_calls()
                        .map(|call| (call.id.clone(), call.name.clone())),
                );
                out.push(Cow::Borrowed(message));
            }
            Message::User(_) => {
                flush_missing(&mut pending, &mut out);
                out.push(Cow::Borrowed(message));
            }
        }
    }
    flush_missing(&mut pending, &mut out);
    out
}

fn flush_missing(pending: &mut Vec<(String, String)>, out: &mut Vec<Cow<'_, Message>>) {
    for (id, name) in pending.drain(..) {
        out.push(Cow::Owned(Message::ToolResult(ToolResult {
            tool_call_id: id,
            tool_name: name,
            content: vec![Content::text(MISSING_RESULT)],
            details: None,
            structured_content: None,
            is_error: true,
        })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_core::protocol::{AssistantContent, AssistantMessage, ToolCall, UserMessage};
    use serde_json::json;

    #[test]
    fn only_object_arguments_are_sent_back() {
        let object = json!({"path": "a.rs"});
        assert_eq!(*sendable_arguments(&object), object);
        for raw in [json!("{\"path\": \"a"), json!(null), json!([1]), json!(3)] {
            assert_eq!(*sendable_arguments(&raw), json!({}), "{raw}");
        }
    }

    fn assistant(stop_reason: StopReason, ids: &[&str]) -> Message {
        Message::Assistant(AssistantMessage {
            content: ids
                .iter()
                .map(|id| {
                    AssistantContent::ToolCall(ToolCall {
                        id: (*id).into(),
                        name: "read".into(),
                        arguments: json!({}),
                    })
                })
                .collect(),
            stop_reason,
            ..AssistantMessage::default()
        })
    }

    fn result(id: &str) -> Message {
        Message::ToolResult(ToolResult {
            tool_call_id: id.into(),
            tool_name: "read".into(),
            content: vec![Content::text("ok")],
            details: None,
            structured_content: None,
            is_error: false,
        })
    }

    fn ids(messages: &[Cow<'_, Message>]) -> Vec<String> {
        messages
            .iter()
            .map(|m| match m.as_ref() {
                Message::User(_) => "user".to_owned(),
                Message::Assistant(a) => format!("assistant:{}", a.tool_calls().count()),
                Message::ToolResult(r) if r.is_error => format!("missing:{}", r.tool_call_id),
                Message::ToolResult(r) => format!("result:{}", r.tool_call_id),
            })
            .collect()
    }

    #[test]
    fn complete_history_passes_unchanged() {
        let history = vec![
            Message::User(UserMessage::text("hi")),
            assistant(StopReason::ToolUse, &["a", "b"]),
            result("a"),
            result("b"),
            assistant(StopReason::Stop, &[]),
        ];
        let out = normalized(&history);
        assert!(out.iter().all(|m| matches!(m, Cow::Borrowed(_))));
        assert_eq!(out.len(), history.len());
    }

    #[test]
    fn repairs_missing_orphaned_and_aborted() {
        let history = vec![
            Message::User(UserMessage::text("hi")),
            assistant(StopReason::ToolUse, &["a", "b"]),
            result("a"),
            result("zzz"),
            Message::User(UserMessage::text("steer")),
            assistant(StopReason::Aborted, &["c"]),
            result("c"),
            assistant(StopReason::ToolUse, &["d"]),
        ];
        assert_eq!(
            ids(&normalized(&history)),
            vec![
                "user",
                "assistant:2",
                "result:a",
                "missing:b",
                "user",
                "assistant:1",
                "missing:d"
            ]
        );
    }
}
