//! The OpenAI chat-completions client against recorded transcripts: assembled messages,
//! streamed events, usage, and the request bodies the server received.

use cordon_core::protocol::{
    AssistantContent, AssistantMessage, Content, Message, StopReason, ToolCall, ToolResult, Usage,
};
use cordon_core::provider::AssistantStreamEvent;
use cordon_model::{
    OpenAiConfig, OpenAiProvider, ProviderKind, ProviderOptions, parse_model_spec,
    provider_with_env,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::server::{Reply, TestServer};
use crate::support::{Recorder, fast_retries, fixture, openai, prompt, run};

const PARALLEL: &str = "openai_text_and_parallel_tool_calls.sse";

fn expected_parallel_message() -> AssistantMessage {
    AssistantMessage {
        content: vec![
            AssistantContent::Text {
                text: "Je vais lire les deux fichiers — d'abord 🌍.".into(),
            },
            AssistantContent::ToolCall(ToolCall {
                id: "call_Rk2mVb8QWxq1nTz3cL0aYh4e".into(),
                name: "read".into(),
                arguments: json!({"path": "src/main.rs", "limit": 40}),
            }),
            AssistantContent::ToolCall(ToolCall {
                id: "call_Zq9uJt5EoW2pXs7dHf1gKr6n".into(),
                name: "bash".into(),
                arguments: json!({"command": "cargo test -p cordon-model", "timeout": 120}),
            }),
        ],
        stop_reason: StopReason::ToolUse,
        usage: Some(Usage {
            input: 256,
            output: 71,
            cache_read: 1280,
            cache_write: 0,
            total_tokens: 1607,
        }),
        provider: Some("openai".into()),
        model: Some("gpt-4.1".into()),
        error_message: None,
    }
}

fn tool_deltas(events: &[AssistantStreamEvent], index: usize) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            AssistantStreamEvent::ToolCallDelta {
                content_index,
                delta,
            } if *content_index == index => Some(delta.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn text_and_interleaved_parallel_tool_calls_are_assembled() {
    let server = TestServer::start(vec![Reply::stream(&fixture(PARALLEL))]).await;
    let provider = openai(&server, ProviderKind::OpenAi);
    let recorder = Recorder::default();
    let message = run(
        &provider,
        &prompt("read main.rs and run the tests"),
        &CancellationToken::new(),
        &recorder,
    )
    .await
    .expect("the stream succeeds");

    assert_eq!(message, expected_parallel_message());
    assert_eq!(server.attempts(), 1);

    let events = recorder.events();
    assert_eq!(
        events[0],
        AssistantStreamEvent::TextDelta {
            content_index: 0,
            delta: "Je vais".into()
        }
    );
    assert_eq!(
        recorder.text_of(0),
        "Je vais lire les deux fichiers — d'abord 🌍."
    );
    let starts: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, AssistantStreamEvent::ToolCallStart { .. }))
        .cloned()
        .collect();
    assert_eq!(
        starts,
        vec![
            AssistantStreamEvent::ToolCallStart {
                content_index: 1,
                id: "call_Rk2mVb8QWxq1nTz3cL0aYh4e".into(),
                name: "read".into()
            },
            AssistantStreamEvent::ToolCallStart {
                content_index: 2,
                id: "call_Zq9uJt5EoW2pXs7dHf1gKr6n".into(),
                name: "bash".into()
            },
        ]
    );
    // Interleaved deltas of the two calls each land in their own block, in order.
    assert_eq!(
        tool_deltas(&events, 1),
        [
            "{\"",
            "path",
            "\":",
            " \"src",
            "/",
            "main.rs\"",
            ", \"limit\": 40}"
        ]
    );
    assert_eq!(
        tool_deltas(&events, 2),
        [
            "{\"command\"",
            ": \"cargo test",
            " -p cordon-model\", \"timeout\"",
            ": 120}"
        ]
    );
    assert_eq!(events.len(), 4 + 2 + 7 + 4);

    // While streaming, a call's arguments are the raw JSON text received so far.
    let partials = recorder.partials();
    let at_third_read_delta = partials
        .iter()
        .zip(&events)
        .filter(|(_, e)| {
            matches!(
                e,
                AssistantStreamEvent::ToolCallDelta {
                    content_index: 1,
                    ..
                }
            )
        })
        .nth(2)
        .map(|(m, _)| m.clone())
        .unwrap();
    let AssistantContent::ToolCall(call) = &at_third_read_delta.content[1] else {
        panic!("block 1 is the read call")
    };
    assert_eq!(call.arguments, json!("{\"path\":"));

    let requests = server.requests();
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(request.header("accept"), Some("text/event-stream"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(
        request.body,
        json!({
            "model": "gpt-4.1",
            "messages": [
                {"role": "system", "content": "You are a careful coding agent."},
                {"role": "user", "content": "read main.rs and run the tests"}
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [
                {"type": "function", "function": {"name": "read", "description": "Read a file",
                 "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                 "limit": {"type": "integer"}}, "required": ["path"]}}},
                {"type": "function", "function": {"name": "bash", "description": "Run a command",
                 "parameters": {"type": "object", "properties": {"command": {"type": "string"},
                 "timeout": {"type": "integer"}}, "required": ["command"]}}}
            ]
        })
    );
}

/// Split points chosen to hurt: inside the 4-byte 🌍, inside the 3-byte —, between the two
/// LFs ending an event, inside `data:`, inside `[DONE]`.
fn awkward_pieces(body: &[u8]) -> Vec<Vec<u8>> {
    let find = |needle: &[u8]| {
        body.windows(needle.len())
            .position(|w| w == needle)
            .expect("needle in fixture")
    };
    let mut cuts = vec![
        find("🌍".as_bytes()) + 1,
        find("🌍".as_bytes()) + 3,
        find("—".as_bytes()) + 2,
        find(b"\n\n") + 1,
        find(b"data: {\"id\"") + 3,
        find(b"[DONE]") + 2,
    ];
    cuts.sort_unstable();
    let mut pieces = Vec::new();
    let mut start = 0;
    for cut in cuts {
        pieces.push(body[start..cut].to_vec());
        start = cut;
    }
    pieces.push(body[start..].to_vec());
    pieces
}

#[tokio::test]
async fn awkward_chunk_boundaries_and_crlf_give_the_same_result() {
    let body = fixture(PARALLEL);
    let crlf = String::from_utf8(body.clone())
        .unwrap()
        .replace('\n', "\r\n")
        .into_bytes();
    // The CRLF variant is cut between every CR and its LF by sending one byte per chunk.
    let bytewise: Vec<Vec<u8>> = crlf.iter().map(|b| vec![*b]).collect();
    let server = TestServer::start(vec![
        Reply::stream(&body),
        Reply::Stream(awkward_pieces(&body)),
        Reply::Stream(bytewise),
    ])
    .await;
    let provider = openai(&server, ProviderKind::OpenAi);

    let baseline = Recorder::default();
    let expected = run(
        &provider,
        &prompt("go"),
        &CancellationToken::new(),
        &baseline,
    )
    .await
    .unwrap();
    assert_eq!(expected, expected_parallel_message());

    for attempt in ["awkward splits", "CRLF byte by byte"] {
        let recorder = Recorder::default();
        let message = run(
            &provider,
            &prompt("go"),
            &CancellationToken::new(),
            &recorder,
        )
        .await
        .unwrap_or_else(|e| panic!("{attempt}: {e}"));
        assert_eq!(message, expected, "{attempt}");
        assert_eq!(recorder.events(), baseline.events(), "{attempt}");
    }
    assert_eq!(server.attempts(), 3);
}

#[tokio::test]
async fn llamacpp_reasoning_content_becomes_thinking_and_no_key_sends_no_auth() {
    let server = TestServer::start(vec![Reply::stream(&fixture(
        "openai_llamacpp_reasoning.sse",
    ))])
    .await;
    let mut config = OpenAiConfig::new(
        ProviderKind::OpenAiCompatible,
        "qwen3-8b",
        format!("{}/v1/", server.url()),
    );
    config.retry = fast_retries();
    let provider = OpenAiProvider::new(config).unwrap();
    let recorder = Recorder::default();
    let message = run(
        &provider,
        &prompt("hi"),
        &CancellationToken::new(),
        &recorder,
    )
    .await
    .unwrap();
    assert_eq!(
        message,
        AssistantMessage {
            content: vec![
                AssistantContent::Thinking {
                    thinking: "The user wants a  greeting. Keep it short.".into(),
                    signature: None
                },
                AssistantContent::Text {
                    text: "Hello! How can I help?".into()
                },
            ],
            stop_reason: StopReason::Stop,
            usage: Some(Usage {
                input: 212,
                output: 38,
                cache_read: 0,
                cache_write: 0,
                total_tokens: 250
            }),
            provider: Some("openai-compatible".into()),
            model: Some("qwen3-8b".into()),
            error_message: None,
        }
    );
    let events = recorder.events();
    assert_eq!(
        events[0],
        AssistantStreamEvent::ThinkingDelta {
            content_index: 0,
            delta: "The user".into()
        }
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, AssistantStreamEvent::ThinkingDelta { .. }))
            .count(),
        4
    );
    assert_eq!(recorder.text_of(1), "Hello! How can I help?");
    let request = &server.requests()[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.header("authorization"), None);
    assert_eq!(request.body["model"], "qwen3-8b");
}

#[tokio::test]
async fn ollama_reasoning_field_and_whole_tool_call_in_one_delta() {
    let server = TestServer::start(vec![Reply::stream(&fixture(
        "openai_ollama_reasoning_tool_call.sse",
    ))])
    .await;
    let provider = openai(&server, ProviderKind::OpenAiCompatible);
    let recorder = Recorder::default();
    let message = run(
        &provider,
        &prompt("ls"),
        &CancellationToken::new(),
        &recorder,
    )
    .await
    .unwrap();
    assert_eq!(
        message.content,
        vec![
            AssistantContent::Thinking {
                thinking: "Need to list files.".into(),
                signature: None
            },
            AssistantContent::ToolCall(ToolCall {
                id: "call_k3j2h1g0".into(),
                name: "ls".into(),
                arguments: json!({"path": "."})
            }),
        ]
    );
    assert_eq!(message.stop_reason, StopReason::ToolUse);
    assert_eq!(
        message.usage,
        Some(Usage {
            input: 90,
            output: 25,
            cache_read: 0,
            cache_write: 0,
            total_tokens: 115
        })
    );
    assert_eq!(
        recorder.events()[2..],
        [
            AssistantStreamEvent::ToolCallStart {
                content_index: 1,
                id: "call_k3j2h1g0".into(),
                name: "ls".into()
            },
            AssistantStreamEvent::ToolCallDelta {
                content_index: 1,
                delta: "{\"path\":\".\"}".into()
            },
        ]
    );
}

#[tokio::test]
async fn length_stop_keeps_truncated_arguments_as_raw_text() {
    let server = TestServer::start(vec![Reply::stream(&fixture("openai_length_stop.sse"))]).await;
    let provider = openai(&server, ProviderKind::OpenAi);
    let message = run(
        &provider,
        &prompt("write notes"),
        &CancellationToken::new(),
        &Recorder::default(),
    )
    .await
    .unwrap();
    assert_eq!(message.stop_reason, StopReason::Length);
    assert_eq!(
        message.content,
        vec![AssistantContent::ToolCall(ToolCall {
            id: "call_Wr1tE9nQ2mZ7kX4p".into(),
            name: "write".into(),
            arguments: Value::String(
                "{\"path\": \"notes.md\", \"content\": \"# Notes\\n\\n- first point\\n- sec".into()
            ),
        })]
    );
    assert_eq!(message.usage.unwrap().output, 16);
}

#[tokio::test]
async fn stop_after_a_tool_call_is_a_tool_use_stop() {
    // Some compatible servers finish with "stop" even when the message holds tool calls.
    let body = [
        r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"read","arguments":"{\"path\": \"a.rs\"}"}}]}}]}"#,
        r#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        "data: [DONE]",
    ]
    .map(|line| format!("{line}\n\n"))
    .concat();
    let server = TestServer::start(vec![Reply::stream(body.as_bytes())]).await;
    let provider = openai(&server, ProviderKind::OpenAiCompatible);
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
            id: "call_1".into(),
            name: "read".into(),
            arguments: json!({"path": "a.rs"}),
        })]
    );
}

#[tokio::test]
async fn second_turn_sends_tool_calls_results_and_images_back() {
    let server = TestServer::start(vec![
        Reply::stream(&fixture(PARALLEL)),
        Reply::stream(&fixture("openai_llamacpp_reasoning.sse")),
    ])
    .await;
    let provider = openai(&server, ProviderKind::OpenAi);
    let mut messages = prompt("read main.rs and run the tests");
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
        tool_call_id: "call_Rk2mVb8QWxq1nTz3cL0aYh4e".into(),
        tool_name: "read".into(),
        content: vec![
            Content::text("fn main() {}"),
            Content::Image {
                data: "iVBORw0KGgo=".into(),
                mime_type: "image/png".into(),
            },
        ],
        details: None,
        structured_content: None,
        is_error: false,
    }));
    messages.push(Message::ToolResult(ToolResult {
        tool_call_id: "call_Zq9uJt5EoW2pXs7dHf1gKr6n".into(),
        tool_name: "bash".into(),
        content: vec![Content::text("test failed\n\nCommand exited with code 101")],
        details: None,
        structured_content: None,
        is_error: true,
    }));
    run(
        &provider,
        &messages,
        &CancellationToken::new(),
        &Recorder::default(),
    )
    .await
    .unwrap();

    // Arguments travel as JSON text; compare them as values (key order is not meaningful).
    let mut sent = server.requests()[1].body["messages"].clone();
    for call in sent[2]["tool_calls"].as_array_mut().unwrap() {
        let text = call["function"]["arguments"].as_str().unwrap().to_owned();
        call["function"]["arguments"] = serde_json::from_str(&text).unwrap();
    }
    assert_eq!(
        sent,
        json!([
            {"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": "read main.rs and run the tests"},
            {"role": "assistant", "content": "Je vais lire les deux fichiers — d'abord 🌍.",
             "tool_calls": [
                {"id": "call_Rk2mVb8QWxq1nTz3cL0aYh4e", "type": "function",
                 "function": {"name": "read", "arguments": {"path": "src/main.rs", "limit": 40}}},
                {"id": "call_Zq9uJt5EoW2pXs7dHf1gKr6n", "type": "function",
                 "function": {"name": "bash",
                              "arguments": {"command": "cargo test -p cordon-model", "timeout": 120}}}
             ]},
            {"role": "tool", "tool_call_id": "call_Rk2mVb8QWxq1nTz3cL0aYh4e",
             "content": "fn main() {}\n(image attached in the next message)"},
            {"role": "tool", "tool_call_id": "call_Zq9uJt5EoW2pXs7dHf1gKr6n",
             "content": "Error: test failed\n\nCommand exited with code 101"},
            {"role": "user", "content": [
                {"type": "text", "text": "Attached image(s) from tool results:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
            ]}
        ])
    );
}

#[tokio::test]
async fn each_spelling_sends_only_its_own_key() {
    let body = fixture("openai_llamacpp_reasoning.sse");
    let server = TestServer::start(vec![
        Reply::stream(&body),
        Reply::stream(&body),
        Reply::stream(&body),
    ])
    .await;
    let mut options = ProviderOptions::default();
    options.base_url = Some(format!("{}/v1", server.url()));
    type Vars = &'static [(&'static str, &'static str)];
    let cases: [(&str, Vars, Option<&str>); 3] = [
        // An OpenAI key is never sent to an `openai-compatible` server.
        (
            "openai-compatible:qwen3",
            &[("OPENAI_API_KEY", "sk-openai")],
            None,
        ),
        (
            "openai-compatible:qwen3",
            &[
                ("OPENAI_API_KEY", "sk-openai"),
                ("OPENAI_COMPATIBLE_API_KEY", "local-token"),
            ],
            Some("Bearer local-token"),
        ),
        // `openai` with a custom base URL follows the SDK convention.
        (
            "openai:gpt-4.1",
            &[("OPENAI_API_KEY", "sk-openai")],
            Some("Bearer sk-openai"),
        ),
    ];
    for (index, (spec, vars, expected)) in cases.iter().enumerate() {
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        let provider = provider_with_env(&parse_model_spec(spec).unwrap(), &options, &env).unwrap();
        run(
            provider.as_ref(),
            &prompt("hi"),
            &CancellationToken::new(),
            &Recorder::default(),
        )
        .await
        .unwrap();
        assert_eq!(
            server.requests()[index].header("authorization"),
            *expected,
            "{spec} with {vars:?}"
        );
    }
}
