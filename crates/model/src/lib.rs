//! `cordon-model`: Cordon's model provider clients — OpenAI-compatible chat completions and
//! the Anthropic Messages API — each implementing [`cordon_core::provider::ModelProvider`].
//!
//! What it owns:
//! - choosing a provider: [`parse_model_spec`] (`PROVIDER:MODEL`), API keys and base URLs from
//!   the usual environment variables ([`provider_from_env`]);
//! - mapping Cordon's conversation and tool definitions to each wire format
//!   ([`openai::request_body`], [`anthropic::request_body`]);
//! - streaming: a hand-written SSE parser ([`sse`]), per-provider decoders that assemble text,
//!   thinking and tool calls into an [`cordon_core::protocol::AssistantMessage`] and report each
//!   change through the loop's callback;
//! - retries with backoff and `retry-after` before any output, clear errors ([`ModelError`]),
//!   and cancellation (the partial message comes back with `stopReason: "aborted"`).
//!
//! Tool-call arguments: while a call streams, its `arguments` hold the raw JSON text received
//! so far, as a JSON string. In the returned message they are parsed: empty text becomes `{}`,
//! valid JSON becomes its value, and text that does not parse (cut off by a length stop, or
//! malformed by the model) stays the raw string — argument validation then rejects it (a
//! string is not an object) and the model reads its own text in the error and can re-issue
//! the call. When such a message is sent back, the unparsed arguments travel as `{}`.
//!
//! Cancellation is not an error: the call returns the partial message with
//! `stopReason: "aborted"` and `errorMessage: "the request was cancelled"`; a loop must not
//! execute the tool calls of such a message.
//!
//! ```
//! use cordon_model::{ProviderOptions, parse_model_spec, provider_from_env};
//!
//! // `openai-compatible` takes its base URL from the options or OPENAI_COMPATIBLE_BASE_URL,
//! // and its key (optional) from OPENAI_COMPATIBLE_API_KEY.
//! let spec = parse_model_spec("openai-compatible:qwen3:8b")?;
//! let mut options = ProviderOptions::default();
//! options.base_url = Some("http://127.0.0.1:11434/v1".into());
//! let provider = provider_from_env(&spec, &options)?;
//! // `provider.stream(request, &cancel, &on_event)` now drives one turn.
//! # let _ = provider;
//! # Ok::<(), cordon_model::ModelError>(())
//! ```
//!
//! Feature `testing`: `testing::TestServer`, a scripted HTTP/1.1 server on 127.0.0.1 that
//! serves recorded SSE transcripts to a client under test.
//!
//! What it does not own: the agent loop (it only answers `stream`), tool execution, policy.
#![warn(missing_docs)]

pub mod anthropic;
mod assemble;
mod context;
mod endpoint;
mod error;
pub mod openai;
pub mod retry;
mod spec;
pub mod sse;
#[cfg(feature = "testing")]
pub mod testing;
mod transport;

pub use anthropic::{AnthropicConfig, AnthropicProvider};
pub use error::ModelError;
pub use openai::{OpenAiConfig, OpenAiProvider};
pub use retry::RetryPolicy;
pub use spec::{
    ModelSpec, ProviderKind, ProviderOptions, parse_model_spec, provider_from_env,
    provider_with_env,
};
