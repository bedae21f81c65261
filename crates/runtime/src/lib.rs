//! `cordon-runtime`: the wiring every entry point shares (CLI `exec`/`replay`/`run`, the MCP
//! server, the test suites). A [`Session`] owns one backend, the tools built over it, and the
//! hooks that put the policy in front of every call:
//!
//! - `before_tool_call`: the paths a call touches are canonicalised by the backend (symlinks
//!   resolved, confined by the kernel or the remote side) and judged by the policy; `Ask` goes
//!   to an [`Approver`] when the front end has one and is a denial otherwise; every decision is
//!   audited.
//! - `after_tool_call`: secrets are redacted from everything the model sees, a degraded
//!   sandbox is stated in the details, the finished call is audited.
//! - partial results (`on_update`) are redacted too, by wrapping each tool.
//!
//! Cordon's own host files are kept out of the sandbox's reach: an audit log (or, through
//! [`Session::refuse_in_writable_root`], a transcript) inside a directory the sandbox can
//! write is refused, and a policy file there is made read-only to the session. The audit log
//! is held open, checked for replacement before every line and ends with a recorded head.
//!
//! The remote backends are cargo features, `docker` and `ssh` (both off here, both on by
//! default in the `cordon` binary); without them only [`BackendChoice::Local`] exists and the
//! build has no container or SSH client code. A third feature, `helper` (off everywhere but
//! the test suites), adds [`BackendChoice::Helper`]: the local backend in a `cordon-helper`
//! child process, reached through the helper protocol (docs/helper.md).
//!
//! It owns no policy logic (`cordon-policy`), no tool logic (`cordon-tools`) and no backend
//! logic (`backends/*`).
#![warn(missing_docs)]

mod approval;
mod audit;
mod hooks;
mod hostpaths;
mod registry;
mod session;

pub use approval::{Approval, ApprovalRequest, Approver, NETWORK_QUESTION, escape_for_question};
pub use audit::{AuditLog, head_file_path};
#[cfg(feature = "docker")]
pub use cordon_backend_docker::UnlistedBind as DockerUnlistedBind;
/// The `cordon-helper` the Docker backend's filtered network mode would mount, for reports.
#[cfg(feature = "docker")]
pub use cordon_backend_docker::choose_helper as docker_egress_helper;
/// How the Docker engine is reached (`DOCKER_HOST`, TLS), for reports such as `cordon doctor`.
#[cfg(feature = "docker")]
pub use cordon_backend_docker::client::Engine as DockerEngine;
/// Which engine serves the Docker API (Docker or Podman), and how to ask it, for reports.
#[cfg(feature = "docker")]
pub use cordon_backend_docker::client::{
    EngineKind as DockerEngineKind, EngineTransport as DockerTransport, connect as docker_connect,
    engine_kind as docker_engine_kind,
};
/// The SSH backend itself, for reports such as `cordon doctor` (the remote helper, its layers).
#[cfg(feature = "ssh")]
pub use cordon_backend_ssh as ssh;
pub use cordon_ops::ShutdownError;
#[cfg(feature = "helper")]
pub use session::HelperOptions;
#[cfg(feature = "ssh")]
pub use session::SshOptions;
pub use session::{BackendChoice, InsideWritableRoot, RuntimeError, Session, SessionOptions};
#[cfg(feature = "docker")]
pub use session::{DockerOptions, FilesHelper as DockerFilesHelper, WorkspaceMode};
