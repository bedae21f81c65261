//! `cordon-core`: the model protocol, the agent runtime's tool contract, and the agent loop.
//!
//! This crate owns what every other Cordon crate agrees on:
//! - [`protocol`]: the JSON shapes models and hosts exchange (docs/contract.md#json-shapes);
//! - [`tool`]: the [`tool::AgentTool`] trait a tool implements and the result it returns;
//! - [`hooks`]: `before_tool_call` / `after_tool_call`, where policy and redaction plug in;
//! - [`event`]: the agent events streamed to hosts (docs/contract.md#events);
//! - [`provider`]: the small trait a model provider implements to drive the loop;
//! - [`sandbox`]: the plain, serialisable sandbox specification every backend enforces;
//! - [`excerpt`]: short quotations of model input in error texts;
//! - [`validate`]: lenient coercion and JSON Schema validation of tool arguments;
//! - [`hostfile`]: opening Cordon's own files on the host (no symlinks, no FIFOs, owner checks);
//! - [`executor`]: one assistant message's tool calls as a batch (docs/semantics.md#batches);
//! - [`agent`]: the multi-turn loop over a [`provider::ModelProvider`];
//! - [`replay`]: `cordon replay` semantics, the loop without a model;
//! - `testing` (feature `testing`): a scripted provider for tests.
//!
//! It does not know about concrete tools, backends, policies or providers: the dependency
//! arrows point into this crate, never out of it.
#![warn(missing_docs)]

pub mod agent;
pub mod event;
pub mod excerpt;
pub mod executor;
pub mod hooks;
#[cfg(unix)]
pub mod hostfile;
pub mod protocol;
pub mod provider;
pub mod replay;
pub mod sandbox;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tool;
pub mod validate;

pub use agent::{Agent, AgentConfig, AgentError};
pub use executor::{BatchOutcome, RunControl, ToolBatch, execute_tool_calls};
pub use replay::replay;

pub use tokio_util::sync::CancellationToken;
