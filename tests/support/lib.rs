//! Test support shared by the conformance, escape and end-to-end suites.
//!
//! - [`harness`]: the [`Harness`] trait (one small factory per backend) and [`Workspace`], a
//!   fresh workspace directory on the host with a `cordon_runtime::Session` over it, host ↔
//!   backend path mapping and result normalisation;
//! - [`local`]: the local backend's factory; [`helper`]: the local backend through a
//!   `cordon-helper` child process (the helper protocol on a local pipe); [`remote`]: the Docker and SSH factories, over
//!   the shared infrastructure of [`infra`] (engine + image, a test sshd);
//! - [`procs`]: finding a command's processes from the host (is the process tree gone?);
//! - [`fixtures`]: file contents and messages the suites share (images, numbered lines,
//!   assistant messages).
//!
//! It owns no assertions about tool behaviour; those live in the suites.
#![warn(missing_docs)]

pub mod fixtures;
pub mod harness;
pub mod helper;
pub mod infra;
pub mod local;
pub mod procs;
pub mod remote;

pub use harness::{Called, Harness, Replayed, SessionRequest, Workspace, WorkspaceOptions};
pub use helper::HelperPipe;
pub use local::Local;
pub use remote::{Docker, DockerHelper, Ssh, SshHelper, ssh_helper_options};
