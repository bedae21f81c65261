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
//! What it does not own: the agent loop (it only answers `stream`), tool execution, policy.
//! How tool-call arguments that are not valid JSON are handled is described in the
//! `assemble` module: they stay the raw string, and argument validation reports them to the
//! model.
#![warn(missing_docs)]

pub mod anthropic;
mod assemble;
mod context;
mod error;
pub mod openai;
pub mod retry;
mod spec;
pub mod sse;
mod transport;

pub use anthropic::{AnthropicConfig, AnthropicProvider};
pub use error::ModelError;
pub use openai::{OpenAiConfig, OpenAiProvider};
pub use retry::RetryPolicy;
pub use spec::{
    ModelSpec, ProviderKind, ProviderOptions, parse_model_spec, provider_from_env,
    provider_with_env,
};
