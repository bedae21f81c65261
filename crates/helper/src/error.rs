//! [`HelperError`]: why the client could not talk to a helper, or a helper could not serve.

use std::path::PathBuf;

use crate::frame::FrameError;
use crate::protocol::WireError;

/// Why a helper could not be started, reached or understood.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The helper program was not found where it was looked for.
    #[error(
        "failed to find the cordon-helper program (looked at {}); install it next to cordon or set CORDON_HELPER to its path",
        looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NotFound {
        /// Every place looked at.
        looked: Vec<PathBuf>,
    },
    /// The helper program could not be started.
    #[error("failed to start the helper {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The helper's stream failed or carried a frame over a bound.
    #[error("failed to talk to the helper: {0}")]
    Frame(#[from] FrameError),
    /// The helper's stream ended (the helper exited or the connection dropped).
    #[error("the helper connection closed ({reason}); the next call starts a new helper")]
    Closed {
        /// What ended it.
        reason: String,
    },
    /// A message could not be encoded.
    #[error("failed to encode a helper request: {0}")]
    Encode(#[source] serde_json::Error),
    /// The helper answered something this client does not understand.
    #[error("failed to understand the helper's answer: {0}")]
    Unexpected(String),
    /// The helper speaks another protocol version.
    #[error(
        "failed to start the helper: it speaks protocol version {helper}, this Cordon speaks {client}; install the same Cordon version on both sides"
    )]
    Version {
        /// The helper's version.
        helper: u32,
        /// Ours.
        client: u32,
    },
    /// The helper refused a request (session start, protocol).
    #[error("{}", .0.describe())]
    Remote(WireError),
    /// A restarted helper opened another workspace root than the first one.
    #[error(
        "failed to restart the helper: it opened {found} where the session's root is {expected}"
    )]
    RootChanged {
        /// The session's root.
        expected: PathBuf,
        /// What the new helper reported.
        found: PathBuf,
    },
    /// A new helper's sandbox lacks layers the session's first helper had (another kernel, a
    /// host out of user namespaces): the session's reported layers would understate it.
    #[error(
        "failed to restart the helper: its sandbox lacks what the session started with ({missing}); start a new session to run without it"
    )]
    SandboxWeakened {
        /// The layers the new helper misses, joined.
        missing: String,
    },
}
