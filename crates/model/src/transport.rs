//! One streamed model request over HTTP: send, retry, classify failures, feed the event
//! stream to a provider's decoder, honour cancellation.
//!
//! Owns the policy shared by both providers:
//! - retry on connection failures, HTTP 408 / 429 / 5xx, a connection lost mid-body, and
//!   provider error events the decoder marks transient — but only while NOTHING has been
//!   streamed to the callback yet, so a retry never repeats output the caller already saw;
//! - wait `retry-after-ms` / `retry-after` when the server says so, else exponential backoff
//!   with jitter; fail at once if the server asks for more than the policy allows;
//! - map 401 / 403 / 404 / 400 to errors naming the key's variable, the model and the URL;
//! - cancellation at any point (connecting, waiting to retry, streaming) returns the partial
//!   message with `stopReason: "aborted"`.
//!
//! It knows nothing about either provider's JSON: decoders do (see [`Decoder`]).

use std::time::{Duration, SystemTime};

use cordon_core::protocol::{AssistantMessage, StopReason};
use cordon_core::provider::StreamCallback;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::assemble::MessageBuilder;
use crate::error::ModelError;
use crate::retry::{RetryPolicy, retry_after};
use crate::spec::ProviderKind;
use crate::sse::{SseEvent, SseParser};

/// How long to wait for a TCP/TLS connection.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a response may stay silent between two reads. Generous: a local server may spend
/// minutes on a long prompt before the first byte, and thinking models pause.
pub(crate) const READ_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// How much of an error body is read to find the provider's message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// How much of an unstructured error body is quoted.
const ERROR_TEXT_LIMIT: usize = 500;

/// A stream decoding failure and whether retrying the request could help.
pub(crate) struct StreamFailure {
    /// What went wrong.
    pub(crate) error: ModelError,
    /// Transient (overloaded, server error, connection lost) rather than a bad request.
    pub(crate) retryable: bool,
}

impl StreamFailure {
    /// A failure retrying cannot fix.
    pub(crate) fn fatal(error: ModelError) -> Self {
        StreamFailure {
            error,
            retryable: false,
        }
    }

    /// The stream ended before the provider said why the message stopped: the connection was
    /// probably cut, so a retry may help.
    pub(crate) fn incomplete(provider: ProviderKind) -> Self {
        StreamFailure {
            error: ModelError::IncompleteStream { provider },
            retryable: true,
        }
    }

    /// The provider refused to answer (`content_filter`, `refusal`); asking again is no use.
    pub(crate) fn refused(provider: ProviderKind, reason: &str) -> Self {
        StreamFailure::fatal(ModelError::Refused {
            provider,
            reason: reason.to_owned(),
        })
    }

    /// An error event in the stream, of the provider's `kind` (`error` when it gave none).
    pub(crate) fn provider_error(
        provider: ProviderKind,
        kind: String,
        message: String,
        retryable: bool,
    ) -> Self {
        let kind = if kind.is_empty() {
            "error".to_owned()
        } else {
            kind
        };
        StreamFailure {
            error: ModelError::StreamError {
                provider,
                kind,
                message,
            },
            retryable,
        }
    }
}

/// The JSON payload of an SSE event as `T`; `None` for an event without data (keep-alives).
/// A payload that is not what the provider documents is fatal: retrying would read it again.
pub(crate) fn decode_event<T: DeserializeOwned>(
    provider: ProviderKind,
    event: &SseEvent,
) -> Result<Option<T>, StreamFailure> {
    let data = event.data.trim();
    if data.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(data).map(Some).map_err(|source| {
        StreamFailure::fatal(ModelError::InvalidEvent {
            provider,
            data: shorten(data, 300),
            source,
        })
    })
}

/// Whether the stream goes on after an event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// More events expected.
    Continue,
    /// The provider's end-of-message marker arrived.
    Done,
}

/// A provider's event-stream decoder: turns SSE events into builder calls.
pub(crate) trait Decoder {
    /// Handle one event.
    fn event(
        &mut self,
        event: SseEvent,
        builder: &mut MessageBuilder<'_>,
    ) -> Result<Step, StreamFailure>;

    /// The stream is over (marker seen or body ended cleanly): settle the last blocks and
    /// return the stop reason, or fail if the message is incomplete.
    fn finish(&mut self, builder: &mut MessageBuilder<'_>) -> Result<StopReason, StreamFailure>;

    /// Whether the provider already said why the message stopped (`finish_reason`,
    /// `stop_reason`): the message is complete even if the trailer never arrives.
    fn stop_known(&self) -> bool;
}

/// Where and how to send one request.
pub(crate) struct Exchange<'a> {
    /// The HTTP client (connection pool).
    pub(crate) client: &'a reqwest::Client,
    /// Which provider, for messages.
    pub(crate) provider: ProviderKind,
    /// The model requested, for messages and the message's `model` field.
    pub(crate) model: &'a str,
    /// The endpoint.
    pub(crate) url: &'a reqwest::Url,
    /// Authentication and protocol headers.
    pub(crate) headers: &'a HeaderMap,
    /// The JSON request body.
    pub(crate) body: Vec<u8>,
    /// Retry behaviour.
    pub(crate) retry: &'a RetryPolicy,
    /// Cancellation of the whole call.
    pub(crate) cancel: &'a CancellationToken,
    /// Streamed progress.
    pub(crate) on_event: StreamCallback<'a>,
}

/// Send the request, retrying as the module docs say, and decode the stream.
pub(crate) async fn stream_message<D: Decoder>(
    exchange: Exchange<'_>,
    new_decoder: impl Fn() -> D,
) -> Result<AssistantMessage, ModelError> {
    let Exchange {
        client,
        provider,
        model,
        url,
        headers,
        body,
        retry,
        cancel,
        on_event,
    } = exchange;
    let max_attempts = retry.max_attempts.max(1);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let last_attempt = attempt >= max_attempts;
        let mut builder = MessageBuilder::new(provider.name(), model, on_event);
        let request = client
            .post(url.clone())
            .headers(headers.clone())
            .body(body.clone());
        let sent = tokio::select! {
            biased;
            () = cancel.cancelled() => return Ok(builder.abort()),
            sent = request.send() => sent,
        };
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                if !last_attempt && !error.is_builder() {
                    if sleep_or_cancel(retry.backoff(attempt, fastrand::f64()), cancel).await {
                        return Ok(builder.abort());
                    }
                    continue;
                }
                return Err(ModelError::Connect {
                    provider,
                    url: url.to_string(),
                    attempts: attempt,
                    cause: ModelError::root_cause(&error),
                    source: error,
                });
            }
        };

        let status = response.status();
        if !status.is_success() {
            let response_headers = response.headers().clone();
            let Some(message) = read_error_message(response, cancel).await else {
                return Ok(builder.abort());
            };
            if !is_retryable_status(status) {
                return Err(status_error(
                    StatusContext {
                        provider,
                        model,
                        url,
                        status,
                    },
                    message,
                ));
            }
            let requested = retry_after(&response_headers, SystemTime::now());
            if let Some(wait) = requested
                && wait > retry.max_retry_after
            {
                return Err(ModelError::RetryAfterTooLong {
                    provider,
                    status: status.as_u16(),
                    wait,
                    limit: retry.max_retry_after,
                    message,
                });
            }
            if last_attempt {
                return Err(if status == StatusCode::TOO_MANY_REQUESTS {
                    ModelError::RateLimited {
                        provider,
                        attempts: attempt,
                        message,
                    }
                } else {
                    ModelError::ServerError {
                        provider,
                        status: status.as_u16(),
                        attempts: attempt,
                        message,
                    }
                });
            }
            let wait = requested.unwrap_or_else(|| retry.backoff(attempt, fastrand::f64()));
            if sleep_or_cancel(wait, cancel).await {
                return Ok(builder.abort());
            }
            continue;
        }

        if is_json(response.headers()) {
            // A server that ignored `"stream": true` or answered an error with 200.
            let Some(message) = read_error_message(response, cancel).await else {
                return Ok(builder.abort());
            };
            return Err(ModelError::NotAStream { provider, message });
        }

        let mut decoder = new_decoder();
        match read_stream(response, &mut decoder, &mut builder, cancel, provider).await {
            Outcome::Done(stop_reason) => return Ok(builder.finish(stop_reason)),
            Outcome::Cancelled => return Ok(builder.abort()),
            Outcome::Failed(StreamFailure { error, retryable }) => {
                if retryable && !last_attempt && !builder.has_emitted() {
                    if sleep_or_cancel(retry.backoff(attempt, fastrand::f64()), cancel).await {
                        return Ok(builder.abort());
                    }
                    continue;
                }
                return Err(error);
            }
        }
    }
}

enum Outcome {
    Done(StopReason),
    Cancelled,
    Failed(StreamFailure),
}

async fn read_stream<D: Decoder>(
    mut response: reqwest::Response,
    decoder: &mut D,
    builder: &mut MessageBuilder<'_>,
    cancel: &CancellationToken,
    provider: ProviderKind,
) -> Outcome {
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    loop {
        let chunk = tokio::select! {
            biased;
            () = cancel.cancelled() => return Outcome::Cancelled,
            chunk = response.chunk() => chunk,
        };
        let ended = match chunk {
            Ok(Some(bytes)) => {
                parser.feed(&bytes, &mut events);
                false
            }
            Ok(None) => {
                parser.finish(&mut events);
                true
            }
            // The connection broke after the stop reason: only the trailer (usage, end marker)
            // is missing, and the message itself is whole.
            Err(_) if decoder.stop_known() => {
                return match decoder.finish(builder) {
                    Ok(stop_reason) => Outcome::Done(stop_reason),
                    Err(failure) => Outcome::Failed(failure),
                };
            }
            Err(error) => {
                return Outcome::Failed(StreamFailure {
                    error: ModelError::StreamInterrupted {
                        provider,
                        cause: ModelError::root_cause(&error),
                        source: error,
                    },
                    retryable: true,
                });
            }
        };
        for event in events.drain(..) {
            match decoder.event(event, builder) {
                Ok(Step::Continue) => {}
                Ok(Step::Done) => {
                    return match decoder.finish(builder) {
                        Ok(stop_reason) => Outcome::Done(stop_reason),
                        Err(failure) => Outcome::Failed(failure),
                    };
                }
                Err(failure) => return Outcome::Failed(failure),
            }
            // The callback may have cancelled: stop before handling more.
            if cancel.is_cancelled() {
                return Outcome::Cancelled;
            }
        }
        if ended {
            return match decoder.finish(builder) {
                Ok(stop_reason) => Outcome::Done(stop_reason),
                Err(failure) => Outcome::Failed(failure),
            };
        }
    }
}

fn is_retryable_status(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// Who answered a request with a non-success status.
struct StatusContext<'a> {
    provider: ProviderKind,
    model: &'a str,
    url: &'a reqwest::Url,
    status: StatusCode,
}

fn status_error(context: StatusContext<'_>, message: String) -> ModelError {
    let StatusContext {
        provider,
        model,
        url,
        status,
    } = context;
    let url = url.to_string();
    let model = model.to_owned();
    match status.as_u16() {
        401 => ModelError::Unauthorized {
            provider,
            url,
            env_var: provider.api_key_env(),
            message,
        },
        403 => ModelError::Forbidden {
            model,
            url,
            message,
        },
        404 => ModelError::NotFound {
            model,
            url,
            message,
        },
        400 | 413 | 422 => ModelError::BadRequest {
            provider,
            model,
            status: status.as_u16(),
            message,
        },
        other => ModelError::UnexpectedStatus {
            provider,
            status: other,
            message,
        },
    }
}

/// Sleep for `wait` unless cancelled first; `true` when cancelled.
async fn sleep_or_cancel(wait: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        () = cancel.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}

/// Read (a bounded prefix of) an error body and pull out the provider's message. `None` when
/// cancelled meanwhile.
async fn read_error_message(
    mut response: reqwest::Response,
    cancel: &CancellationToken,
) -> Option<String> {
    let status = response.status();
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_LIMIT {
        let chunk = tokio::select! {
            biased;
            () = cancel.cancelled() => return None,
            chunk = response.chunk() => chunk,
        };
        match chunk {
            Ok(Some(bytes)) => body.extend_from_slice(&bytes),
            // A body we cannot read fully still names the status below.
            Ok(None) | Err(_) => break,
        }
    }
    Some(error_message(status, &body))
}

/// The human-readable message of an error body: `error.message` (OpenAI, Anthropic), a bare
/// `error` string (Ollama), `message` or `detail` (vLLM, FastAPI servers); else the text itself,
/// shortened; else the status's reason phrase.
pub(crate) fn error_message(status: StatusCode, body: &[u8]) -> String {
    if let Ok(json) = serde_json::from_slice::<Value>(body)
        && let Some(message) = json_error_message(&json)
    {
        return message;
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return status
            .canonical_reason()
            .unwrap_or("no error message")
            .to_owned();
    }
    shorten(text, ERROR_TEXT_LIMIT)
}

/// The message inside a provider's JSON error object, if there is one.
pub(crate) fn json_error_message(json: &Value) -> Option<String> {
    let text = |v: &Value| match v {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Value::Null | Value::String(_) => None,
        other => Some(other.to_string()),
    };
    if let Some(error) = json.get("error") {
        if let Some(message) = error.get("message").and_then(text) {
            return Some(message);
        }
        return text(error);
    }
    json.get("message")
        .and_then(text)
        .or_else(|| json.get("detail").and_then(text))
}

/// `text` cut to at most `limit` bytes on a character boundary, with an ellipsis.
pub(crate) fn shorten(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_message_in_every_error_body_shape() {
        let bad = StatusCode::BAD_REQUEST;
        let openai = br#"{"error":{"message":"Invalid schema for function 'read'","type":"invalid_request_error","param":"tools[0]","code":null}}"#;
        assert_eq!(
            error_message(bad, openai),
            "Invalid schema for function 'read'"
        );
        let anthropic = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 99999 > 64000"}}"#;
        assert_eq!(error_message(bad, anthropic), "max_tokens: 99999 > 64000");
        let ollama = br#"{"error":"model \"qwen9\" not found, try pulling it first"}"#;
        assert_eq!(
            error_message(StatusCode::NOT_FOUND, ollama),
            "model \"qwen9\" not found, try pulling it first"
        );
        let vllm = br#"{"object":"error","message":"The model `x` does not exist.","type":"NotFoundError","code":404}"#;
        assert_eq!(
            error_message(StatusCode::NOT_FOUND, vllm),
            "The model `x` does not exist."
        );
        let fastapi = br#"{"detail":"Not authenticated"}"#;
        assert_eq!(
            error_message(StatusCode::UNAUTHORIZED, fastapi),
            "Not authenticated"
        );
        assert_eq!(
            error_message(StatusCode::BAD_GATEWAY, b"<html>upstream down</html>\n"),
            "<html>upstream down</html>"
        );
        assert_eq!(
            error_message(StatusCode::SERVICE_UNAVAILABLE, b""),
            "Service Unavailable"
        );
        let long = "é".repeat(400);
        let shortened = error_message(StatusCode::BAD_GATEWAY, long.as_bytes());
        assert!(shortened.ends_with('…'));
        assert!(shortened.len() <= ERROR_TEXT_LIMIT + '…'.len_utf8());
    }

    #[test]
    fn retryable_statuses() {
        for code in [408, 429, 500, 502, 503, 504, 529] {
            assert!(
                is_retryable_status(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
        for code in [400, 401, 403, 404, 409, 413, 422] {
            assert!(
                !is_retryable_status(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
    }
}
