//! `cordon-mcp`: Cordon's Model Context Protocol server. It exposes one
//! [`cordon_runtime::Session`]'s enabled tools to any MCP client (Claude Code, Claude Desktop,
//! Codex, …) over newline-delimited JSON-RPC on stdio, using the official Rust SDK (`rmcp`):
//!
//! - `tools/list`: every enabled tool with its description, JSON Schema and behaviour hints;
//! - `tools/call`: the same pipeline as `cordon exec` (prepare, validate, policy, execute,
//!   after hooks, audit); invalid arguments and policy denials are tool errors the client's
//!   model reads (`isError: true`), never protocol failures;
//! - bash partial output as `notifications/progress` when the request carries a progress
//!   token; `notifications/cancelled` aborts the call and kills its process tree;
//! - concurrent calls run in parallel (edits and writes to one file stay serial through the
//!   tools' mutation queue);
//! - malformed JSON, batches, unknown methods and oversized messages get JSON-RPC errors and
//!   the session goes on; closing stdin ends the session cleanly: in-flight calls get a short
//!   grace to answer, are then cancelled and awaited, and the backend is shut down.
//!
//! A policy `ask` becomes a question to the person behind the client (MCP elicitation) when
//! the client declared that capability and the session's approver is an
//! [`ElicitationApprover`]; otherwise it is a denial.
//!
//! With `--http`, the same server speaks MCP's streamable HTTP transport on a loopback
//! address, behind a bearer token ([`McpServer::serve_http`]).
//!
//! It owns no tool, policy or backend logic.
#![warn(missing_docs)]

mod approval;
mod convert;
mod framing;
mod http;
mod server;
mod transport;

pub use approval::{DEFAULT_APPROVAL_TIMEOUT, ElicitationApprover};
pub use convert::{DETAILS_META_KEY, PROGRESS_MESSAGE_MAX_BYTES};
pub use framing::DEFAULT_MAX_MESSAGE_BYTES;
pub use http::{AccessToken, HTTP_PATH};
pub use server::{McpServer, ServeEnd, ServeOptions};

/// Why the MCP server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// A tool's parameter schema is not a JSON object, which MCP requires.
    #[error("failed to expose tool {tool} over MCP: its parameter schema is not a JSON object")]
    SchemaNotObject {
        /// The tool.
        tool: String,
    },
    /// The MCP session could not be established.
    #[error("failed to start the MCP session")]
    Initialize {
        /// What the SDK reported (boxed: it carries whole protocol messages).
        #[source]
        source: Box<rmcp::service::ServerInitializeError>,
    },
    /// `--http` was given an address that is not loopback.
    #[error(
        "failed to serve MCP over HTTP on {address}: only loopback addresses (127.0.0.1, ::1) \
         are allowed"
    )]
    NotLoopback {
        /// The refused address.
        address: std::net::SocketAddr,
    },
    /// The HTTP listener's address could not be read.
    #[error("failed to read the HTTP listener's address")]
    Listen {
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No random token could be generated.
    #[error("failed to generate an access token")]
    Token {
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The operator's token is too weak.
    #[error("failed to accept the access token: use at least {min} visible ASCII characters")]
    WeakToken {
        /// The minimum length.
        min: usize,
    },
    /// The session's shutdown lost work (copy mode's workspace not copied back).
    #[error(transparent)]
    Shutdown(cordon_runtime::ShutdownError),
    /// The service task failed.
    #[error("failed to run the MCP service")]
    Service {
        /// The task's failure.
        #[source]
        source: tokio::task::JoinError,
    },
}
