//! Integration tests of `cordon-core`: the batch executor, the agent loop and replay, driven
//! through the public API with scripted providers and in-test tools.

mod agent;
mod executor;
mod replay;
mod support;
