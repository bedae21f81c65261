//! The one error type of `cordon-model`: every way choosing, configuring or calling a model
//! provider can fail, each variant naming the step, the provider and what the operator should
//! check next (the key's environment variable, the model name, the base URL).
//!
//! The agent loop records these as an assistant message with `stopReason: "error"`; the
//! operator reads them, so they say what to fix.

use std::time::Duration;

use crate::spec::ProviderKind;

/// Everything that can go wrong in `cordon-model`.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `--model` had no `PROVIDER:` prefix.
    #[error(
        "failed to parse model {spec:?}: expected PROVIDER:MODEL, e.g. openai:gpt-4.1, \
         anthropic:claude-sonnet-4-5 or openai-compatible:qwen3{hint}"
    )]
    MissingProvider {
        /// The text given.
        spec: String,
        /// A suggestion such as `; did you mean anthropic:claude-…?`, or empty.
        hint: String,
    },

    /// The provider prefix is not one Cordon knows.
    #[error(
        "failed to parse model {spec:?}: unknown provider {provider:?}; \
         use openai, anthropic or openai-compatible"
    )]
    UnknownProvider {
        /// The text given.
        spec: String,
        /// The unknown prefix.
        provider: String,
    },

    /// Nothing after `PROVIDER:`.
    #[error("failed to parse model {spec:?}: the model name after \"{provider}:\" is empty")]
    EmptyModel {
        /// The text given.
        spec: String,
        /// The provider named.
        provider: ProviderKind,
    },

    /// The provider needs an API key and its environment variable is unset or empty.
    #[error("failed to configure {provider}: {env_var} is not set; export your API key in it")]
    MissingApiKey {
        /// The provider.
        provider: ProviderKind,
        /// The variable that should hold the key.
        env_var: &'static str,
    },

    /// `openai-compatible` needs a base URL.
    #[error(
        "failed to configure openai-compatible model {model:?}: no base URL; pass --base-url \
         (llama.cpp: http://127.0.0.1:8080/v1, vLLM: http://127.0.0.1:8000/v1, \
         Ollama: http://127.0.0.1:11434/v1) or set OPENAI_COMPATIBLE_BASE_URL"
    )]
    MissingBaseUrl {
        /// The model name.
        model: String,
    },

    /// The base URL is not an absolute http(s) URL.
    #[error("failed to parse base URL {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The API key cannot be sent as an HTTP header (it holds a newline or similar).
    #[error(
        "failed to configure {provider}: the API key in {env_var} is not a valid HTTP header value"
    )]
    InvalidApiKey {
        /// The provider.
        provider: ProviderKind,
        /// Where the key came from.
        env_var: &'static str,
    },

    /// reqwest could not build its client (TLS roots, resolver).
    #[error("failed to build the HTTP client for {provider}")]
    BuildClient {
        /// The provider.
        provider: ProviderKind,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },

    /// The request body could not be encoded.
    #[error("failed to encode the request to {provider}")]
    EncodeRequest {
        /// The provider.
        provider: ProviderKind,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },

    /// HTTP 401.
    #[error(
        "failed to authenticate with {provider} at {url} (HTTP 401): {message}; \
         check the API key in {env_var}"
    )]
    Unauthorized {
        /// The provider.
        provider: ProviderKind,
        /// The endpoint called.
        url: String,
        /// The variable the key came from.
        env_var: &'static str,
        /// The provider's error message.
        message: String,
    },

    /// HTTP 403.
    #[error(
        "failed to access model {model:?} at {url} (HTTP 403): {message}; the API key is not \
         allowed to use this model or endpoint"
    )]
    Forbidden {
        /// The model requested.
        model: String,
        /// The endpoint called.
        url: String,
        /// The provider's error message.
        message: String,
    },

    /// HTTP 404: a wrong model name or a wrong base URL.
    #[error(
        "failed to find model {model:?} at {url} (HTTP 404): {message}; check the model name \
         and the base URL (OpenAI-compatible servers usually end in /v1)"
    )]
    NotFound {
        /// The model requested.
        model: String,
        /// The endpoint called.
        url: String,
        /// The provider's error message.
        message: String,
    },

    /// HTTP 400, 413 or 422: the provider rejected the request itself.
    #[error(
        "failed to get a response from {provider} for model {model:?}: the request was rejected (HTTP {status}): {message}"
    )]
    BadRequest {
        /// The provider.
        provider: ProviderKind,
        /// The model requested.
        model: String,
        /// The HTTP status.
        status: u16,
        /// The provider's error message.
        message: String,
    },

    /// HTTP 429 on every attempt.
    #[error(
        "failed to get a response from {provider}: rate limited (HTTP 429) on all {attempts} attempt(s): {message}"
    )]
    RateLimited {
        /// The provider.
        provider: ProviderKind,
        /// Attempts made.
        attempts: u32,
        /// The provider's error message.
        message: String,
    },

    /// HTTP 408 or 5xx on every attempt.
    #[error(
        "failed to get a response from {provider}: HTTP {status} on all {attempts} attempt(s): {message}"
    )]
    ServerError {
        /// The provider.
        provider: ProviderKind,
        /// The last HTTP status.
        status: u16,
        /// Attempts made.
        attempts: u32,
        /// The provider's error message.
        message: String,
    },

    /// A retryable response asked for a longer wait than the policy allows.
    #[error(
        "failed to get a response from {provider} (HTTP {status}): the provider asks to retry \
         after {wait:?}, longer than the {limit:?} Cordon waits: {message}"
    )]
    RetryAfterTooLong {
        /// The provider.
        provider: ProviderKind,
        /// The HTTP status.
        status: u16,
        /// The wait requested.
        wait: Duration,
        /// The policy's limit.
        limit: Duration,
        /// The provider's error message.
        message: String,
    },

    /// Any other non-success status.
    #[error("failed to get a response from {provider}: unexpected HTTP {status}: {message}")]
    UnexpectedStatus {
        /// The provider.
        provider: ProviderKind,
        /// The HTTP status.
        status: u16,
        /// The provider's error message or body.
        message: String,
    },

    /// No HTTP response at all on every attempt (refused, reset, timed out).
    #[error("failed to reach {provider} at {url} after {attempts} attempt(s): {cause}")]
    Connect {
        /// The provider.
        provider: ProviderKind,
        /// The endpoint called.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The innermost cause, for one-line display.
        cause: String,
        /// The error of the last attempt.
        #[source]
        source: reqwest::Error,
    },

    /// The connection broke while the response streamed (after output, or on the last attempt).
    #[error("failed to read the response stream from {provider}: {cause}")]
    StreamInterrupted {
        /// The provider.
        provider: ProviderKind,
        /// The innermost cause, for one-line display.
        cause: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },

    /// The body ended cleanly but without the provider's end-of-message marker.
    #[error(
        "failed to read the response stream from {provider}: it ended before the message was complete"
    )]
    IncompleteStream {
        /// The provider.
        provider: ProviderKind,
    },

    /// A success status but a JSON body instead of an event stream.
    #[error(
        "failed to read the response stream from {provider}: the server answered with JSON \
         instead of an event stream: {message}"
    )]
    NotAStream {
        /// The provider.
        provider: ProviderKind,
        /// The message in the body, or the body itself (shortened).
        message: String,
    },

    /// An event's `data` was not the JSON the provider documents.
    #[error("failed to parse an event of the {provider} stream: {data:?}")]
    InvalidEvent {
        /// The provider.
        provider: ProviderKind,
        /// The event data (shortened).
        data: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },

    /// The provider reported an error inside the stream (Anthropic `event: error`, an OpenAI
    /// `{"error": …}` chunk).
    #[error(
        "failed to complete the response: {provider} reported an error mid-stream ({kind}): {message}"
    )]
    StreamError {
        /// The provider.
        provider: ProviderKind,
        /// The provider's error type, e.g. `overloaded_error`.
        kind: String,
        /// The provider's error message.
        message: String,
    },

    /// The provider stopped the message on its own policy grounds (OpenAI `content_filter`,
    /// Anthropic `refusal`).
    #[error(
        "failed to complete the response: {provider} stopped it ({reason}); rephrase the request"
    )]
    Refused {
        /// The provider.
        provider: ProviderKind,
        /// The stop reason it gave.
        reason: String,
    },
}

impl ModelError {
    /// The innermost message of an error chain, e.g. `connection refused` out of reqwest's
    /// `error sending request for url (…)`.
    pub(crate) fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
        let mut current = error;
        while let Some(next) = current.source() {
            current = next;
        }
        current.to_string()
    }
}
