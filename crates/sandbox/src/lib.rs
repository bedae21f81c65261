//! `cordon-sandbox`: Cordon's local sandbox boundary, and the only crate with `unsafe`.
//!
//! It turns a [`SandboxConfig`] (readable, writable, protected and denied paths, network
//! off, on or filtered, limits, environment) into restrictions applied to each command right
//! before `execve`: Landlock filesystem/TCP rules and scopes, a seccomp filter, no
//! capabilities, `no_new_privs`, rlimits, a scrubbed environment, and new PID + mount (+ user
//! when not root, + network when filtered) namespaces whose tiny init makes sure no
//! descendant outlives the command. With the network filtered the init also opens the one
//! listener its commands can reach and hands it to the caller, which serves it (the egress
//! proxy lives elsewhere).
//!
//! It does not know about policies, globs or tools: the local backend resolves those into
//! concrete paths. Everything expensive (Landlock ruleset fd, seccomp program, session
//! directory) is built once by `PreparedSandbox::prepare`; a `spawn` hands the command to an
//! idle init whose namespaces and mounts are still right, and only otherwise plans the mounts
//! and clones a new one.
//!
//! Linux only; elsewhere every entry point returns [`SandboxError::Unsupported`].
//!
//! ```no_run
//! # #[cfg(target_os = "linux")]
//! # async fn demo() -> Result<(), cordon_sandbox::SandboxError> {
//! use cordon_sandbox::{PreparedSandbox, Rlimits, SandboxConfig, SpawnRequest};
//!
//! let mut config = SandboxConfig::with_defaults(cordon_sandbox::host_defaults());
//! config.write.push("/work/project".into());
//! config.protected.push("/work/project/.git".into());
//! config.limits = Rlimits { processes: Some(512), memory_bytes: Some(2 << 30), ..Rlimits::default() };
//! let sandbox = PreparedSandbox::prepare(config)?; // fails closed, naming a missing layer
//! let (read, write) = std::io::pipe().expect("pipe");
//! let mut child = sandbox.spawn(SpawnRequest {
//!     program: "bash".into(),
//!     args: vec!["-c".into(), "cargo test".into()],
//!     cwd: "/work/project".into(),
//!     env: vec![],
//!     stdin: None,
//!     stdout: Some(write.try_clone().expect("dup").into()),
//!     stderr: Some(write.into()),
//! })?;
//! // ... read `read` while it runs; on timeout: child.signal_tree(15)?, then child.kill_tree()?
//! let status = child.wait().await?; // the command's own code or signal
//! # drop(read); let _ = status; Ok(()) }
//! ```
#![warn(missing_docs)]
#![allow(unsafe_code)]

mod config;
mod error;

pub use config::{
    EGRESS_PORT, ExitStatus, HostDefaults, HostSupport, Layer, NetworkAccess, Profile, Requirement,
    Rlimits, SandboxConfig, SpawnRequest,
};
pub use error::{SandboxError, SetupStep};

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::{
    PreparedSandbox, SandboxedChild, TreeSignaller, host_defaults, host_defaults_for_home,
    is_placeholder_dir, is_placeholder_mode, probe, raise_open_files_limit, rename_at,
    start_writeback,
};

/// What [`rename_at`] does when the target name exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// Fail with `EEXIST` (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap the two names atomically; both must exist (`RENAME_EXCHANGE`).
    Exchange,
}

#[cfg(not(target_os = "linux"))]
mod unsupported;
#[cfg(not(target_os = "linux"))]
pub use unsupported::{
    PreparedSandbox, SandboxedChild, TreeSignaller, host_defaults, host_defaults_for_home,
    is_placeholder_dir, is_placeholder_mode, probe, raise_open_files_limit, rename_at,
    start_writeback,
};
