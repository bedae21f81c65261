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
//! It owns no tool, policy or backend logic.
#![warn(missing_docs)]

mod convert;
mod framing;
mod server;
mod transport;

pub use convert::{DETAILS_META_KEY, PROGRESS_MESSAGE_MAX_BYTES};
pub use framing::DEFAULT_MAX_MESSAGE_BYTES;
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
    /// The service task failed.
    #[error("failed to run the MCP service")]
    Service {
        /// The task's failure.
        #[source]
        source: tokio::task::JoinError,
    },
}
