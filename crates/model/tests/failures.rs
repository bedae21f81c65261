//! Failures: retries with backoff and `retry-after`, status errors, connection resets,
//! error events mid-stream, and streams that end early — with the number of attempts the
//! server saw.

use std::time::{Duration, Instant};

use cordon_core::protocol::{AssistantContent, StopReason};
use cordon_model::{
    AnthropicConfig, AnthropicProvider, OpenAiConfig, OpenAiProvider, ProviderKind,
};
use tokio_util::sync::CancellationToken;

use crate::server::{Reply, TestServer};
use crate::support::{Recorder, anthropic, error_text, fast_retries, fixture, openai, prompt, run};

const OPENAI_OK: &str = "openai_text_and_parallel_tool_calls.sse";

async fn openai_call(
    server: &TestServer,
) -> (
    Result<cordon_core::protocol::AssistantMessage, cordon_core::provider::ProviderError>,
    Recorder,
) {
    let provider = openai(server, ProviderKind::OpenAi);
    let recorder = Recorder::default();
    let result = run(
        &provider,
        &prompt("go"),
        &CancellationToken::new(),
        &recorder,
    )
    .await;
    (result, recorder)
}

const RATE_LIMIT_BODY: &str = r#"{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): Limit 30000, Used 30000, Requested 1200.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;

#[tokio::test]
async fn rate_limit_429_honours_retry_after_then_succeeds() {
    let server = TestServer::start(vec![
        Reply::json_with(429, vec![("retry-after", "1".into())], RATE_LIMIT_BODY),
        Reply::stream(&fixture(OPENAI_OK)),
    ])
    .await;
    let started = Instant::now();
    let (result, recorder) = openai_call(&server).await;
    let message = result.expect("the retry succeeds");
    assert_eq!(message.stop_reason, StopReason::ToolUse);
    assert_eq!(server.attempts(), 2);
    // The policy's own backoff is 1 ms; only the server's `retry-after: 1` explains a wait
    // of a second (a lower bound, so a loaded machine cannot make this fail).
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "retry-after was not honoured: {:?}",
        started.elapsed()
    );
    // Nothing from the failed attempt reached the callback.
    assert_eq!(
        recorder.text_of(0),
        "Je vais lire les deux fichiers — d'abord 🌍."
    );
}

#[tokio::test]
async fn server_error_500_then_success() {
    let server = TestServer::start(vec![
        Reply::json(
            500,
            r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#,
        ),
        Reply::stream(&fixture(OPENAI_OK)),
    ])
    .await;
    let (result, _) = openai_call(&server).await;
    assert_eq!(result.unwrap().stop_reason, StopReason::ToolUse);
    assert_eq!(server.attempts(), 2);
}

#[tokio::test]
async fn anthropic_overloaded_529_with_retry_after_ms_then_success() {
    let server = TestServer::start(vec![
        Reply::json_with(
            529,
            vec![("retry-after-ms", "20".into())],
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
        Reply::stream(&fixture("anthropic_end_turn.sse")),
    ])
    .await;
    let provider = anthropic(&server);
    let message = run(
        &provider,
        &prompt("go"),
        &CancellationToken::new(),
        &Recorder::default(),
    )
    .await
    .unwrap();
    assert_eq!(message.text(), "All tests pass.");
    assert_eq!(server.attempts(), 2);
}

#[tokio::test]
async fn rate_limit_on_every_attempt_gives_up_after_the_bound() {
    let server = TestServer::start(vec![
        Reply::json(429, RATE_LIMIT_BODY),
        Reply::json(429, RATE_LIMIT_BODY),
        Reply::json(429, RATE_LIMIT_BODY),
        Reply::stream(&fixture(OPENAI_OK)),
    ])
    .await;
    let (result, _) = openai_call(&server).await;
    let error = error_text(result);
    assert!(
        error.starts_with("failed to get a response from openai: rate limited (HTTP 429) on all 3 attempt(s): Rate limit reached for gpt-4.1"),
        "{error}"
    );
    assert_eq!(server.attempts(), 3);
}

#[tokio::test]
async fn retry_after_longer_than_the_policy_fails_at_once() {
    let server = TestServer::start(vec![
        Reply::json_with(429, vec![("retry-after", "3600".into())], RATE_LIMIT_BODY),
        Reply::stream(&fixture(OPENAI_OK)),
    ])
    .await;
    let (result, _) = openai_call(&server).await;
    let error = error_text(result);
    assert!(
        error.contains("asks to retry after 3600s, longer than the 60s Cordon waits"),
        "{error}"
    );
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn unauthorized_401_names_the_key_variable_without_retrying() {
    let server = TestServer::start(vec![Reply::json(
        401,
        r#"{"error":{"message":"Incorrect API key provided: sk-test. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
    )])
    .await;
    let (result, _) = openai_call(&server).await;
    let error = error_text(result);
    assert_eq!(
        error,
        format!(
            "failed to authenticate with openai at {}/v1/chat/completions (HTTP 401): Incorrect \
             API key provided: sk-test. You can find your API key at \
             https://platform.openai.com/account/api-keys.; check the API key in OPENAI_API_KEY",
            server.url()
        )
    );
    assert_eq!(server.attempts(), 1);

    let server = TestServer::start(vec![Reply::json(
        401,
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
    )])
    .await;
    let error = error_text(
        run(
            &anthropic(&server),
            &prompt("go"),
            &CancellationToken::new(),
            &Recorder::default(),
        )
        .await,
    );
    assert!(error.contains("(HTTP 401): invalid x-api-key"), "{error}");
    assert!(
        error.ends_with("check the API key in ANTHROPIC_API_KEY"),
        "{error}"
    );
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn forbidden_403_names_the_model() {
    let server = TestServer::start(vec![Reply::json(
        403,
        r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}"#,
    )])
    .await;
    let error = error_text(
        run(
            &anthropic(&server),
            &prompt("go"),
            &CancellationToken::new(),
            &Recorder::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        format!(
            "failed to access model \"claude-sonnet-4-5\" at {}/v1/messages (HTTP 403): Your API \
             key does not have permission to use the specified resource.; the API key is not \
             allowed to use this model or endpoint",
            server.url()
        )
    );
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn not_found_404_names_model_and_url() {
    let server = TestServer::start(vec![Reply::json(
        404,
        r#"{"error":{"message":"The model `gpt-4.1` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
    )])
    .await;
    let (result, _) = openai_call(&server).await;
    let error = error_text(result);
    assert_eq!(
        error,
        format!(
            "failed to find model \"gpt-4.1\" at {}/v1/chat/completions (HTTP 404): The model \
             `gpt-4.1` does not exist or you do not have access to it.; check the model name and \
             the base URL (OpenAI-compatible servers usually end in /v1)",
            server.url()
        )
    );
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn bad_request_400_shows_the_provider_message() {
    let server = TestServer::start(vec![Reply::json(
        400,
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.1.content.0.tool_use.input: Input should be a valid dictionary"}}"#,
    )])
    .await;
    let error = error_text(
        run(
            &anthropic(&server),
            &prompt("go"),
            &CancellationToken::new(),
            &Recorder::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        "failed to get a response from anthropic for model \"claude-sonnet-4-5\": the request \
         was rejected (HTTP 400): messages.1.content.0.tool_use.input: Input should be a valid \
         dictionary"
    );
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn connection_reset_before_headers_is_retried() {
    let server = TestServer::start(vec![Reply::Reset, Reply::stream(&fixture(OPENAI_OK))]).await;
    let (result, _) = openai_call(&server).await;
    assert_eq!(result.unwrap().stop_reason, StopReason::ToolUse);
    assert_eq!(server.attempts(), 2);
}

#[tokio::test]
async fn resets_on_every_attempt_give_a_connect_error() {
    let server = TestServer::start(vec![Reply::Reset, Reply::Reset, Reply::Reset]).await;
    let (result, _) = openai_call(&server).await;
    let error = error_text(result);
    assert!(
        error.starts_with(&format!(
            "failed to reach openai at {}/v1/chat/completions after 3 attempt(s): ",
            server.url()
        )),
        "{error}"
    );
    assert_eq!(server.attempts(), 3);
}

#[tokio::test]
async fn connection_refused_names_the_url() {
    // A port that was just free: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut config = OpenAiConfig::new(
        ProviderKind::OpenAiCompatible,
        "qwen3",
        format!("http://127.0.0.1:{port}/v1"),
    );
    config.retry = fast_retries();
    let provider = OpenAiProvider::new(config).unwrap();
    let error = error_text(
        run(
            &provider,
            &prompt("go"),
            &CancellationToken::new(),
            &Recorder::default(),
        )
        .await,
    );
    assert!(
        error.starts_with(&format!(
            "failed to reach openai-compatible at http://127.0.0.1:{port}/v1/chat/completions \
             after 3 attempt(s): "
        )),
        "{error}"
    );
    assert!(error.to_lowercase().contains("refused"), "{error}");
}

#[tokio::test]
async fn openai_error_chunk_after_output_is_a_provider_error_not_a_retry() {
    let server = TestServer::start(vec![
        Reply::stream(&fixture("openai_error_mid_stream.sse")),
        Reply::stream(&fixture(OPENAI_OK)),
    ])
    .await;
    let (result, recorder) = openai_call(&server).await;
    let error = error_text(result);
    assert_eq!(
        error,
        "failed to complete the response: openai reported an error mid-stream (server_error): \
         The server had an error while processing your request. Sorry about that!"
    );
    assert_eq!(recorder.text_of(0), "Looking at the");
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn anthropic_error_event_after_output_is_a_provider_error() {
    let server = TestServer::start(vec![
        Reply::stream(&fixture("anthropic_error_mid_stream.sse")),
        Reply::stream(&fixture("anthropic_end_turn.sse")),
    ])
    .await;
    let recorder = Recorder::default();
    let error = error_text(
        run(
            &anthropic(&server),
            &prompt("go"),
            &CancellationToken::new(),
            &recorder,
        )
        .await,
    );
    assert_eq!(
        error,
        "failed to complete the response: anthropic reported an error mid-stream \
         (overloaded_error): Overloaded"
    );
    assert_eq!(recorder.text_of(0), "Let me");
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn anthropic_error_event_before_any_output_is_retried() {
    let server = TestServer::start(vec![
        Reply::stream(&fixture("anthropic_error_before_output.sse")),
        Reply::stream(&fixture("anthropic_end_turn.sse")),
    ])
    .await;
    let recorder = Recorder::default();
    let message = run(
        &anthropic(&server),
        &prompt("go"),
        &CancellationToken::new(),
        &recorder,
    )
    .await
    .unwrap();
    assert_eq!(message.text(), "All tests pass.");
    assert_eq!(recorder.events().len(), 1);
    assert_eq!(server.attempts(), 2);
}

#[tokio::test]
async fn stream_ending_early_after_output_is_an_error() {
    let body = fixture(OPENAI_OK);
    let cut = body
        .windows(9)
        .position(|w| w == b"\"read\",\"a")
        .expect("fixture has the read call");
    // Cut at an event boundary after the read call started, before any finish_reason.
    let cut = cut + body[cut..].windows(2).position(|w| w == b"\n\n").unwrap() + 2;
    let server = TestServer::start(vec![
        Reply::Stream(vec![body[..cut].to_vec()]),
        Reply::stream(&body),
    ])
    .await;
    let (result, recorder) = openai_call(&server).await;
    assert_eq!(
        error_text(result),
        "failed to read the response stream from openai: it ended before the message was complete"
    );
    assert!(!recorder.events().is_empty());
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn stream_ending_before_any_output_is_retried() {
    let body = fixture(OPENAI_OK);
    // Only the role chunk (empty content): nothing reached the callback.
    let first_event = body.windows(2).position(|w| w == b"\n\n").unwrap() + 2;
    let server = TestServer::start(vec![
        Reply::Stream(vec![body[..first_event].to_vec()]),
        Reply::stream(&body),
    ])
    .await;
    let (result, _) = openai_call(&server).await;
    assert_eq!(result.unwrap().content.len(), 3);
    assert_eq!(server.attempts(), 2);
}

#[tokio::test]
async fn json_body_instead_of_a_stream_is_explained() {
    let server = TestServer::start(vec![Reply::json(
        200,
        r#"{"error":{"message":"streaming is not supported for this model"}}"#,
    )])
    .await;
    let (result, _) = openai_call(&server).await;
    assert_eq!(
        error_text(result),
        "failed to read the response stream from openai: the server answered with JSON instead \
         of an event stream: streaming is not supported for this model"
    );
}

#[tokio::test]
async fn malformed_event_json_is_reported() {
    let server = TestServer::start(vec![Reply::stream(b"data: {\"choices\": [oops\n\n")]).await;
    let (result, _) = openai_call(&server).await;
    let error = error_text(result);
    assert_eq!(
        error,
        "failed to parse an event of the openai stream: \"{\\\"choices\\\": [oops\""
    );
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn anthropic_base_url_with_trailing_slash_hits_v1_messages() {
    let server = TestServer::start(vec![Reply::stream(&fixture("anthropic_end_turn.sse"))]).await;
    let mut config =
        AnthropicConfig::new("claude-3-5-haiku-latest", format!("{}/", server.url()), "k");
    config.retry = fast_retries();
    let provider = AnthropicProvider::new(config).unwrap();
    let message = run(
        &provider,
        &prompt("go"),
        &CancellationToken::new(),
        &Recorder::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        message.content,
        vec![AssistantContent::Text {
            text: "All tests pass.".into()
        }]
    );
    let request = &server.requests()[0];
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.body["max_tokens"], 8192);
}

/// The fixture up to and including the event containing `marker`.
fn through(body: &[u8], marker: &str) -> Vec<u8> {
    let at = body
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
        .unwrap_or_else(|| panic!("{marker} not in fixture"));
    body[..at + body[at..].windows(2).position(|w| w == b"\n\n").unwrap() + 2].to_vec()
}

#[tokio::test]
async fn connection_lost_after_output_is_an_interrupted_stream() {
    let body = fixture(OPENAI_OK);
    let server = TestServer::start(vec![
        Reply::StreamThenClose(vec![through(&body, "\"content\":\"Je vais\"")]),
        Reply::stream(&body),
    ])
    .await;
    let (result, recorder) = openai_call(&server).await;
    let error = error_text(result);
    assert!(
        error.starts_with("failed to read the response stream from openai: "),
        "{error}"
    );
    assert_eq!(recorder.text_of(0), "Je vais");
    assert_eq!(server.attempts(), 1);
}

#[tokio::test]
async fn connection_lost_before_output_is_retried() {
    let body = fixture(OPENAI_OK);
    let server = TestServer::start(vec![
        Reply::StreamThenClose(vec![through(&body, "\"role\":\"assistant\"")]),
        Reply::stream(&body),
    ])
    .await;
    let (result, recorder) = openai_call(&server).await;
    assert_eq!(result.unwrap().content.len(), 3);
    assert_eq!(
        recorder.text_of(0),
        "Je vais lire les deux fichiers — d'abord 🌍."
    );
    assert_eq!(server.attempts(), 2);
}

#[tokio::test]
async fn connection_lost_after_the_stop_reason_keeps_the_whole_message() {
    let body = fixture(OPENAI_OK);
    let server = TestServer::start(vec![Reply::StreamThenClose(vec![through(
        &body,
        "\"finish_reason\":\"tool_calls\"",
    )])])
    .await;
    let (result, _) = openai_call(&server).await;
    let message = result.expect("the message was complete");
    assert_eq!(message.stop_reason, StopReason::ToolUse);
    assert_eq!(message.content.len(), 3);
    // The usage chunk came after the stop reason and was lost with the connection.
    assert_eq!(message.usage, None);
    assert_eq!(server.attempts(), 1);
}
