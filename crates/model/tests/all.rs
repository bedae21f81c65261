//! Integration tests of `cordon-model` against a scripted HTTP server on 127.0.0.1: recorded
//! SSE transcripts of both APIs, retries, errors and cancellation. No test needs the network.

mod anthropic;
mod cancellation;
mod failures;
mod openai;
mod server;
mod support;
