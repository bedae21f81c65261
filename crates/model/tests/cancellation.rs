//! Cancellation: mid-stream (from the callback, and from outside while the client waits for
//! more bytes), during a retry backoff, and before the request. The call returns the partial
//! message with `stopReason: "aborted"` and the connection is dropped.

use std::sync::Arc;
use std::time::Duration;

use cordon_core::protocol::{AssistantContent, AssistantMessage, StopReason, ToolCall};
use cordon_core::provider::{AssistantStreamEvent, ModelProvider, ModelRequest};
use cordon_model::{OpenAiConfig, OpenAiProvider, ProviderKind, RetryPolicy};
use serde_json::json;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::server::{Reply, TestServer};
use crate::support::{Recorder, anthropic, fixture, openai, prompt, run, tools};

/// The fixture's events up to and including the first one containing `marker`.
fn events_through(body: &[u8], marker: &str) -> Vec<u8> {
    let at = body
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
        .unwrap_or_else(|| panic!("{marker} not in fixture"));
    let end = at + body[at..].windows(2).position(|w| w == b"\n\n").unwrap() + 2;
    body[..end].to_vec()
}

async fn wait_for_hang_up(hung_up: oneshot::Receiver<()>) {
    tokio::time::timeout(Duration::from_secs(60), hung_up)
        .await
        .expect("the client never closed the cancelled stream")
        .expect("the server task ended without reporting");
}

#[tokio::test]
async fn cancel_from_the_callback_returns_the_partial_message() {
    let body = fixture("openai_text_and_parallel_tool_calls.sse");
    // Everything up to the second argument fragment of the read call; then the server waits.
    let head = events_through(&body, "\"arguments\":\"path\"");
    let (hung_up_tx, hung_up) = oneshot::channel();
    let server = TestServer::start(vec![Reply::StreamThenHold(vec![head], hung_up_tx)]).await;
    let provider = openai(&server, ProviderKind::OpenAi);
    let cancel = CancellationToken::new();
    let recorder = Recorder::default();
    let tools = tools();
    let messages = prompt("go");
    let on_event = |message: &AssistantMessage, event: &AssistantStreamEvent| {
        recorder.record(message, event);
        if matches!(event, AssistantStreamEvent::ToolCallDelta { .. }) {
            cancel.cancel();
        }
    };
    let request = ModelRequest {
        system_prompt: None,
        messages: &messages,
        tools: &tools,
    };
    let message = tokio::time::timeout(
        Duration::from_secs(60),
        provider.stream(request, &cancel, &on_event),
    )
    .await
    .expect("cancellation ends the call")
    .expect("a cancelled call is not an error");

    assert_eq!(message.stop_reason, StopReason::Aborted);
    assert_eq!(
        message.error_message.as_deref(),
        Some("the request was cancelled")
    );
    assert_eq!(
        message.content,
        vec![
            AssistantContent::Text {
                text: "Je vais lire les deux fichiers — d'abord 🌍.".into()
            },
            // The first fragment only: no event after the cancelling one was handled.
            AssistantContent::ToolCall(ToolCall {
                id: "call_Rk2mVb8QWxq1nTz3cL0aYh4e".into(),
                name: "read".into(),
                arguments: json!("{\""),
            }),
        ]
    );
    assert!(matches!(
        recorder.events().last(),
        Some(AssistantStreamEvent::ToolCallDelta { delta, .. }) if delta == "{\""
    ));
    wait_for_hang_up(hung_up).await;
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn cancel_while_waiting_for_more_bytes() {
    let body = fixture("anthropic_thinking_text_tool_calls.sse");
    let head = events_through(&body, "\"text\":\"I'll read \"");
    let (hung_up_tx, hung_up) = oneshot::channel();
    let server = TestServer::start(vec![Reply::StreamThenHold(vec![head], hung_up_tx)]).await;
    let provider = anthropic(&server);
    let cancel = CancellationToken::new();
    let text_arrived = Arc::new(Notify::new());
    let canceller = {
        let cancel = cancel.clone();
        let text_arrived = Arc::clone(&text_arrived);
        tokio::spawn(async move {
            text_arrived.notified().await;
            cancel.cancel();
        })
    };
    let tools = tools();
    let messages = prompt("go");
    let on_event = |_: &AssistantMessage, event: &AssistantStreamEvent| {
        if matches!(event, AssistantStreamEvent::TextDelta { .. }) {
            text_arrived.notify_one();
        }
    };
    let request = ModelRequest {
        system_prompt: None,
        messages: &messages,
        tools: &tools,
    };
    let message = tokio::time::timeout(
        Duration::from_secs(60),
        provider.stream(request, &cancel, &on_event),
    )
    .await
    .expect("cancellation ends the call")
    .expect("a cancelled call is not an error");
    canceller.await.unwrap();

    assert_eq!(message.stop_reason, StopReason::Aborted);
    assert_eq!(message.text(), "I'll read ");
    assert!(matches!(
        &message.content[0],
        AssistantContent::Thinking {
            signature: Some(_),
            ..
        }
    ));
    wait_for_hang_up(hung_up).await;
}

#[tokio::test]
async fn cancel_during_retry_backoff() {
    let server = TestServer::start(vec![Reply::json_with(
        503,
        vec![("retry-after", "300".into())],
        r#"{"error":{"message":"overloaded"}}"#,
    )])
    .await;
    let mut config = OpenAiConfig::new(
        ProviderKind::OpenAiCompatible,
        "qwen3",
        format!("{}/v1", server.url()),
    );
    let mut retry = RetryPolicy::new(3, Duration::from_millis(1));
    retry.max_retry_after = Duration::from_secs(3600);
    config.retry = retry;
    let provider = OpenAiProvider::new(config).unwrap();
    let cancel = CancellationToken::new();
    let messages = prompt("go");
    let recorder = Recorder::default();
    let call = run(&provider, &messages, &cancel, &recorder);
    let cancel_after_first_attempt = async {
        server.wait_for_requests(1).await;
        cancel.cancel();
    };
    // The server asked for 300 s; only cancellation can end the call within run's 120 s.
    let (result, ()) = tokio::join!(call, cancel_after_first_attempt);
    let message = result.expect("a cancelled call is not an error");
    assert_eq!(message.stop_reason, StopReason::Aborted);
    assert!(message.content.is_empty());
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn already_cancelled_sends_nothing() {
    let server = TestServer::start(vec![]).await;
    let provider = openai(&server, ProviderKind::OpenAi);
    let cancel = CancellationToken::new();
    cancel.cancel();
    let message = run(&provider, &prompt("go"), &cancel, &Recorder::default())
        .await
        .unwrap();
    assert_eq!(message.stop_reason, StopReason::Aborted);
    assert_eq!(server.attempts(), 0);
}
