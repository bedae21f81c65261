//! `cordon-sandbox`: Cordon's local sandbox boundary, and the only crate with `unsafe`.
//!
//! It turns a [`SandboxConfig`] (readable, writable, protected and denied paths, network
//! on/off, limits, environment) into restrictions applied to each command right before
//! `execve`: Landlock filesystem/TCP rules and scopes, a seccomp filter, no capabilities,
//! `no_new_privs`, rlimits, a scrubbed environment, and new PID + mount (+ user when not root)
//! namespaces whose tiny init makes sure no descendant outlives the command.
//!
//! It does not know about policies, globs or tools: the local backend resolves those into
//! concrete paths. Everything expensive (Landlock ruleset fd, seccomp program, session
//! directory) is built once by `PreparedSandbox::prepare`; each `spawn` only plans the mounts
//! and clones.
//!
//! Linux only; elsewhere every entry point returns [`SandboxError::Unsupported`].
#![warn(missing_docs)]
#![allow(unsafe_code)]

mod config;
mod error;

pub use config::{
    ExitStatus, HostDefaults, HostSupport, Layer, Rlimits, SandboxConfig, SpawnRequest,
};
pub use error::{SandboxError, SetupStep};

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::{PreparedSandbox, SandboxedChild, host_defaults, probe};

#[cfg(not(target_os = "linux"))]
mod unsupported;
#[cfg(not(target_os = "linux"))]
pub use unsupported::{PreparedSandbox, SandboxedChild, host_defaults, probe};
