//! Integration tests of the `cordon-mcp` library: a server over in-memory pipes and a real
//! local session, driven with raw JSON-RPC lines. (The binary, stdio and the Python SDK
//! client are exercised in `crates/cli/tests/mcp.rs`.)

mod approvals;
mod in_process;
