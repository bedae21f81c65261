//! The Anthropic Messages client against recorded transcripts: thinking with signatures,
//! redacted thinking, text, several tool calls, usage with cache counts, max_tokens, and the
//! round trip of all of it into the next request.

use cordon_core::protocol::{
    AssistantContent, AssistantMessage, Content, Message, StopReason, ToolCall, ToolResult, Usage,
};
use cordon_core::provider::AssistantStreamEvent;
use cordon_model::anthropic::{REDACTED_SIGNATURE_PREFIX, REDACTED_THINKING_TEXT};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::server::{Reply, TestServer};
use crate::support::{Recorder, anthropic, fixture, prompt, run};

const FULL: &str = "anthropic_thinking_text_tool_calls.sse";
const SIGNATURE: &str = "EqQBCkYIBxgCKkBRs9W5nWm0Xk2tQ3c6V7yA1pL8oE4uJ9fG2hD0iK5sM3nB7vC1xZ6qR8wT4eY2uI0oP9aS3dF5gH7jK1lQ==";
const REDACTED: &str =
    "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB0";

fn expected_full_message() -> AssistantMessage {
    AssistantMessage {
        content: vec![
            AssistantContent::Thinking {
                thinking: "The tests fail in  the parser.\nRead it, then run them.".into(),
                signature: Some(SIGNATURE.into()),
            },
            AssistantContent::Thinking {
                thinking: REDACTED_THINKING_TEXT.into(),
                signature: Some(format!("{REDACTED_SIGNATURE_PREFIX}{REDACTED}")),
            },
            AssistantContent::Text {
                text: "I'll read the parser and run the tests — ça va 🙂".into(),
            },
            AssistantContent::ToolCall(ToolCall {
                id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                name: "read".into(),
                arguments: json!({"path": "crates/model/src/sse.rs"}),
            }),
            AssistantContent::ToolCall(ToolCall {
                id: "toolu_01HQ6rXhXWn7m3b5jYkKx9sP".into(),
                name: "bash".into(),
                arguments: json!({"command": "cargo test -p cordon-model", "timeout": 300}),
            }),
        ],
        stop_reason: StopReason::ToolUse,
        usage: Some(Usage {
            input: 1843,
            output: 187,
            cache_read: 4096,
            cache_write: 2048,
            total_tokens: 1843 + 187 + 4096 + 2048,
        }),
        provider: Some("anthropic".into()),
        model: Some("claude-sonnet-4-5".into()),
        error_message: None,
    }
}

#[tokio::test]
async fn thinking_text_and_two_tool_calls_are_assembled() {
    let server = TestServer::start(vec![Reply::stream(&fixture(FULL))]).await;
    let provider = anthropic(&server);
    let recorder = Recorder::default();
    let message = run(
        &provider,
        &prompt("why do the tests fail?"),
        &CancellationToken::new(),
        &recorder,
    )
    .await
    .expect("the stream succeeds");
    assert_eq!(message, expected_full_message());
    assert_eq!(server.attempts(), 1);

    let events = recorder.events();
    let thinking: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AssistantStreamEvent::ThinkingDelta {
                content_index: 0,
                delta,
            } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        thinking,
        [
            "The tests fail in",
            "  the parser.",
            "\nRead it, then run them."
        ]
    );
    assert_eq!(
        recorder.text_of(2),
        "I'll read the parser and run the tests — ça va 🙂"
    );
    let tool_events: Vec<_> = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                AssistantStreamEvent::ToolCallStart { .. }
                    | AssistantStreamEvent::ToolCallDelta { .. }
            )
        })
        .cloned()
        .collect();
    let delta = |content_index: usize, delta: &str| AssistantStreamEvent::ToolCallDelta {
        content_index,
        delta: delta.into(),
    };
    assert_eq!(
        tool_events,
        vec![
            AssistantStreamEvent::ToolCallStart {
                content_index: 3,
                id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                name: "read".into()
            },
            delta(3, "{\"path\": \""),
            delta(3, "crates/model/s"),
            delta(3, "rc/sse.rs\""),
            delta(3, "}"),
            AssistantStreamEvent::ToolCallStart {
                content_index: 4,
                id: "toolu_01HQ6rXhXWn7m3b5jYkKx9sP".into(),
                name: "bash".into()
            },
            delta(4, "{\"comman"),
            delta(4, "d\": \"cargo test "),
            delta(4, "-p cordon-model\", \"tim"),
            delta(4, "eout\": 300}"),
        ]
    );
    assert_eq!(events.len(), 3 + 3 + 10);

    let request = &server.requests()[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(request.header("authorization"), None);
    assert_eq!(
        request.body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 32000,
            "stream": true,
            "system": [{"type": "text", "text": "You are a careful coding agent.",
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "why do the tests fail?",
                 "cache_control": {"type": "ephemeral"}}
            ]}],
            "tools": [
                {"name": "read", "description": "Read a file",
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"},
                 "limit": {"type": "integer"}}, "required": ["path"]}},
                {"name": "bash", "description": "Run a command",
                 "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                 "timeout": {"type": "integer"}}, "required": ["command"]}}
            ]
        })
    );
}

#[tokio::test]
async fn signed_and_redacted_thinking_tool_calls_and_results_round_trip() {
    let server = TestServer::start(vec![
        Reply::stream(&fixture(FULL)),
        Reply::stream(&fixture("anthropic_end_turn.sse")),
    ])
    .await;
    let provider = anthropic(&server);
    let mut messages = prompt("why do the tests fail?");
    let first = run(
        &provider,
        &messages,
        &CancellationToken::new(),
        &Recorder::default(),
    )
    .await
    .unwrap();
    messages.push(Message::Assistant(first));
    messages.push(Message::ToolResult(ToolResult {
        tool_call_id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
        tool_name: "read".into(),
        content: vec![Content::text("//! parser")],
        details: None,
        structured_content: None,
        is_error: false,
    }));
    messages.push(Message::ToolResult(ToolResult {
        tool_call_id: "toolu_01HQ6rXhXWn7m3b5jYkKx9sP".into(),
        tool_name: "bash".into(),
        content: vec![Content::text("1 failed\n\nCommand exited with code 101")],
        details: None,
        structured_content: None,
        is_error: true,
    }));
    let second = run(
        &provider,
        &messages,
        &CancellationToken::new(),
        &Recorder::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        second.content,
        vec![AssistantContent::Text {
            text: "All tests pass.".into()
        }]
    );
    assert_eq!(second.stop_reason, StopReason::Stop);
    assert_eq!(
        second.usage,
        Some(Usage {
            input: 950,
            output: 6,
            cache_read: 0,
            cache_write: 0,
            total_tokens: 956
        })
    );

    assert_eq!(
        server.requests()[1].body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "why do the tests fail?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking",
                 "thinking": "The tests fail in  the parser.\nRead it, then run them.",
                 "signature": SIGNATURE},
                {"type": "redacted_thinking", "data": REDACTED},
                {"type": "text", "text": "I'll read the parser and run the tests — ça va 🙂"},
                {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "read",
                 "input": {"path": "crates/model/src/sse.rs"}},
                {"type": "tool_use", "id": "toolu_01HQ6rXhXWn7m3b5jYkKx9sP", "name": "bash",
                 "input": {"command": "cargo test -p cordon-model", "timeout": 300}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                 "content": [{"type": "text", "text": "//! parser"}]},
                {"type": "tool_result", "tool_use_id": "toolu_01HQ6rXhXWn7m3b5jYkKx9sP",
                 "is_error": true,
                 "content": [{"type": "text", "text": "1 failed\n\nCommand exited with code 101"}],
                 "cache_control": {"type": "ephemeral"}}
            ]}
        ])
    );
}

#[tokio::test]
async fn max_tokens_is_a_length_stop_with_raw_arguments() {
    let server = TestServer::start(vec![Reply::stream(&fixture("anthropic_max_tokens.sse"))]).await;
    let provider = anthropic(&server);
    let message = run(
        &provider,
        &prompt("write the readme"),
        &CancellationToken::new(),
        &Recorder::default(),
    )
    .await
    .unwrap();
    assert_eq!(message.stop_reason, StopReason::Length);
    assert_eq!(
        message.content,
        vec![
            AssistantContent::Text {
                text: "Writing the file.".into()
            },
            AssistantContent::ToolCall(ToolCall {
                id: "toolu_01Mx8vQ2wE5rT7yU9iO1pA3s".into(),
                name: "write".into(),
                arguments: Value::String(
                    "{\"path\": \"README.md\", \"content\": \"# Cordon\\n\\nA sand".into()
                ),
            }),
        ]
    );
    assert_eq!(
        message.usage,
        Some(Usage {
            input: 950,
            output: 32,
            cache_read: 0,
            cache_write: 0,
            total_tokens: 982
        })
    );
}

#[tokio::test]
async fn end_turn_after_a_tool_call_is_a_tool_use_stop() {
    let body = [
        r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"read","input":{}}}"#,
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"path\": \"a.rs\"}"}}"#,
        r#"data: {"type":"content_block_stop","index":0}"#,
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#,
        r#"data: {"type":"message_stop"}"#,
    ]
    .map(|line| format!("{line}\n\n"))
    .concat();
    let server = TestServer::start(vec![Reply::stream(body.as_bytes())]).await;
    let provider = anthropic(&server);
    let message = run(
        &provider,
        &prompt("read a.rs"),
        &CancellationToken::new(),
        &Recorder::default(),
    )
    .await
    .unwrap();
    assert_eq!(message.stop_reason, StopReason::ToolUse);
    assert_eq!(
        message.content,
        vec![AssistantContent::ToolCall(ToolCall {
            id: "toolu_1".into(),
            name: "read".into(),
            arguments: json!({"path": "a.rs"}),
        })]
    );
}

#[tokio::test]
async fn one_byte_per_chunk_gives_the_same_message_and_events() {
    let body = fixture(FULL);
    let server = TestServer::start(vec![
        Reply::stream(&body),
        Reply::Stream(body.iter().map(|b| vec![*b]).collect()),
    ])
    .await;
    let provider = anthropic(&server);
    let baseline = Recorder::default();
    let expected = run(
        &provider,
        &prompt("go"),
        &CancellationToken::new(),
        &baseline,
    )
    .await
    .unwrap();
    let recorder = Recorder::default();
    let message = run(
        &provider,
        &prompt("go"),
        &CancellationToken::new(),
        &recorder,
    )
    .await
    .unwrap();
    assert_eq!(message, expected);
    assert_eq!(message, expected_full_message());
    assert_eq!(recorder.events(), baseline.events());
}
