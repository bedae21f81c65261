//! `cordon-remote`: what every "POSIX shell over a remote exec" backend shares (docker today,
//! ssh next), independent of the transport.
//!
//! - [`worker`]: the worker script, one shell per remote exec that serves requests one after
//!   another (a call writes a line instead of paying for a new exec), the plain serialisable
//!   [`WorkerRequest`](worker::WorkerRequest)s it takes and the end marker of each request.
//! - [`exec`]: the command request (own process group and session, PID report, descendant
//!   tagging, a fast leftover check, kill on request or client loss) and [`exec::drive`], the
//!   transport-agnostic state machine that turns a running request into an
//!   [`ExecOutcome`](cordon_ops::ExecOutcome): streaming output, timeout, cancel,
//!   idle-grace drain, no survivors, and whether the worker may serve the next call.
//! - [`files`]: the file requests (canonical paths, confinement, atomic writes, listings,
//!   spill files) and the parsing of their answers into [`FsError`](cordon_ops::FsError)s
//!   identical to the local backend's.
//! - [`file_ops`]: the [`FileOperations`](cordon_ops::FileOperations) of a backend
//!   whose files go through its workers (Docker), over any transport.
//! - [`search`]: `rg --json` parsing into [`GrepOutput`](cordon_ops::GrepOutput), a
//!   listing script plus a gitignore engine for find and for images without `rg`, and the
//!   fallback line searcher.
//! - [`records`] and [`quote`]: the NUL-separated control records the scripts print, and shell
//!   quoting for transports that take a command line (SSH).
//!
//! - [`transport`] and [`runner`]: the one thing a backend brings, a [`transport::Transport`]
//!   that starts a process with its streams attached, and everything built on it once for
//!   every backend: leasing a worker, retrying a stale one, giving it back, keeping a spare,
//!   the kill sweep by tag, one-shot commands.
//!
//! Transports (bollard, russh) live in the backend crates; nothing here opens a connection.
//! Docker exec takes the argv the builders return; a transport that takes one command line
//! (SSH) joins it with [`quote::command_line`].
//!
//! What the remote side needs: Linux (`/proc`), a POSIX `sh`, and GNU coreutils/findutils or
//! busybox (`stat -c`, `head -c`, `readlink`, `mktemp`, `find -print0`, `xargs -0 -r`,
//! `grep -z`, `tar`); bash (job control) or `setsid` (util-linux or busybox) for the command's
//! own process group and session; `rg` ≥ 11 for the fast grep (a POSIX fallback is used
//! without it).
#![warn(missing_docs)]

pub mod exec;
pub mod file_ops;
pub mod files;
pub mod pool;
pub mod quote;
pub mod records;
pub mod runner;
pub mod search;
pub mod transport;
pub mod worker;

/// What [`impl_remote_backend!`] names, so a backend need not depend on it under that name.
#[doc(hidden)]
pub mod reexport {
    pub use async_trait::async_trait;
    pub use cordon_ops as ops;
}

/// Why a request could not be turned into a remote script, or an answer could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// An environment variable name a POSIX shell cannot export.
    #[error("failed to pass environment variable `{name}`: not a valid shell variable name")]
    InvalidEnvName {
        /// The offending name.
        name: String,
    },
    /// A path or argument that cannot travel as text (exec argv must be UTF-8, without NUL).
    #[error("failed to pass argument {what}: it must be UTF-8 without NUL bytes")]
    InvalidArgument {
        /// What the argument is, e.g. the path.
        what: String,
    },
    /// The remote helper answered something this version does not understand.
    #[error("failed to parse the remote helper's answer: {detail}")]
    Protocol {
        /// What was wrong.
        detail: String,
    },
}

/// Build the argv that runs `script` with `sh -c`, `$0` = `name` and the given arguments.
pub fn sh_argv(script: &str, name: &str, args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut argv = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        script.to_owned(),
        name.to_owned(),
    ];
    argv.extend(args);
    argv
}

/// Check that `value` can be an exec argument (UTF-8 is guaranteed by `&str`; no NUL).
pub(crate) fn checked_arg(what: &str, value: &str) -> Result<String, RemoteError> {
    if value.contains('\0') {
        return Err(RemoteError::InvalidArgument {
            what: what.to_owned(),
        });
    }
    Ok(value.to_owned())
}

/// A path as an exec argument.
pub(crate) fn path_arg(path: &std::path::Path) -> Result<String, RemoteError> {
    match path.to_str() {
        Some(text) => checked_arg(&path.display().to_string(), text),
        None => Err(RemoteError::InvalidArgument {
            what: path.display().to_string(),
        }),
    }
}
