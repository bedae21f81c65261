//! `cordon-helper`: the local backend on the far side of one byte stream (docs/helper.md).
//!
//! The `cordon-helper serve` program runs where the workspace is (an SSH host, a container)
//! and serves a small framed protocol on its stdin/stdout. The client sends the sandbox spec
//! and the workspace root as data; the helper builds `cordon-backend-local`'s backend from
//! them on its own host, so file operations are confined by `openat2(RESOLVE_BENEATH)` there,
//! searches are the same in-process ripgrep libraries, and commands run under the same
//! sandbox layers as locally (failing closed, or degraded when the spec allows it).
//!
//! - [`binary`]: the architectures a helper is built for and the ELF check of a binary;
//! - [`frame`]: the byte layout (length-prefixed JSON header + raw payload) and its bounds;
//! - [`protocol`]: the messages, wire forms of paths and errors, the version;
//! - [`server`]: the helper's side ([`serve`]);
//! - [`client`]: [`HelperConnection`] (hello, probe) and [`HelperClient`] (a started session
//!   implementing `FileOperations`, `BashOperations` and `SearchOperations`);
//! - [`forward`]: `cordon-helper forward`, relaying a loopback port to an egress proxy's Unix
//!   socket (a container without a network reaches the proxy through it);
//! - [`program`]: the `cordon-helper` program's argument handling and modes;
//! - [`backend`]: [`HelperBackend`], a whole `Backend` that starts a new helper after one
//!   died, over any [`Connector`] ([`PipeConnector`]: a child process on this host).
//!
//! It does not own any transport other than a local pipe (SSH and Docker bring their own
//! [`Connector`]), nor the sandbox itself (that is `cordon-backend-local`'s).
#![warn(missing_docs)]

pub mod backend;
pub mod binary;
pub mod client;
mod error;
pub mod forward;
pub mod frame;
pub mod program;
pub mod protocol;
pub mod server;
mod stdio;

pub use backend::{
    Connection, Connector, HELPER_ENV, HELPER_NAME, HelperBackend, HelperOps, PipeConnector,
    locate_helper,
};
pub use client::{HelperClient, HelperConnection};
pub use cordon_egress::ask::EgressApprover;
pub use error::HelperError;
pub use protocol::{PROTOCOL_VERSION, ProbeReport, SessionInfo, SessionStart};
pub use server::serve;
