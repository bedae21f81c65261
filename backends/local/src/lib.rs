//! `cordon-backend-local`: Cordon's local backend. It runs the agent's tool calls on this host,
//! inside the roots a [`SandboxSpec`] allows:
//!
//! - file operations ([`cordon_ops::FileOperations`]) confined by the kernel: every path
//!   is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to an open
//!   directory fd of an allowed root, protected and denied globs are judged on the canonical
//!   path, writes are atomic (temp file + `renameat` in the same directory fd);
//! - searches ([`cordon_ops::SearchOperations`]) with ripgrep's libraries in process,
//!   parallel but with a deterministic, path-sorted result;
//! - commands ([`cordon_ops::BashOperations`]) through `bash -c` inside the command
//!   sandbox of `cordon-sandbox` (Landlock, seccomp, no capabilities, `no_new_privs`,
//!   rlimits, PID + mount + IPC namespaces), with a scrubbed environment, merged output, and
//!   a timeout/cancel that kills the whole tree; nothing a command starts outlives it. A
//!   layer the host lacks fails every command with an error naming it, unless the spec
//!   allows a degraded sandbox.
//!
//! Both layers come from one list of granted trees (`layout`): what file operations may read
//! and write is what commands may read and write. Protected and denied globs are judged on
//! canonical paths by file operations and expanded to concrete paths before each command.
//!
//! It does not own the tools' output formats (those live in `cordon-tools`) nor the policy
//! that produced the spec.
//!
//! Process-wide state (the one thing a caller must remember): writes hand the writeback of
//! the file they swapped in to one background thread per process, shared by every backend.
//! A process that is about to exit calls [`wait_for_writeback`] after its sessions are shut
//! down and its async runtime is dropped (the `cordon` binary does so in `main`); otherwise a
//! queued writeback may be dropped (the data is in the page cache either way, but ext4's
//! early writeback of a replaced file is not started). The command sandbox's own background
//! threads and locks are per process too and need no call (see `cordon-sandbox`).
//!
//! Linux only: on other systems [`LocalBackend::new`] returns [`LocalError::Unsupported`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use cordon_backend_local::{LocalBackend, LocalConfig, SandboxSpec};
//! use cordon_ops::{Backend, FsError, GrepRequest};
//! use tokio_util::sync::CancellationToken;
//!
//! let dir = tempfile::tempdir()?;
//! let backend = LocalBackend::new(LocalConfig {
//!     spec: SandboxSpec { protected: vec![".git/**".into()], ..SandboxSpec::default() },
//!     ..LocalConfig::new(dir.path())
//! })?;
//! let files = backend.files();
//! let notes = backend.root().join("notes.txt");
//! files.write_file(&notes, b"hello\nworld\n").await?;
//! assert_eq!(files.read_file(&notes).await?, b"hello\nworld\n");
//! // Outside every root: refused by the kernel, whatever the spelling.
//! let escape = backend.root().join("../etc/passwd");
//! assert!(matches!(files.read_file(&escape).await, Err(FsError::OutsideRoot { .. })));
//!
//! let found = backend
//!     .search()
//!     .grep(
//!         GrepRequest {
//!             pattern: "wor".into(),
//!             path: backend.root().to_path_buf(),
//!             glob: None,
//!             ignore_case: false,
//!             literal: true,
//!             context: 0,
//!             max_matches: 101,
//!         },
//!         CancellationToken::new(),
//!     )
//!     .await?;
//! assert_eq!(found.files[0].lines[0].number, 2);
//! backend.shutdown().await?;
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

use std::path::PathBuf;

pub use cordon_core::sandbox::SandboxSpec;
pub use cordon_sandbox::{HostSupport, Layer, Profile, Requirement, probe as probe_host};

#[cfg(target_os = "linux")]
mod backend;
#[cfg(target_os = "linux")]
mod egress;
#[cfg(target_os = "linux")]
mod exec;
#[cfg(target_os = "linux")]
mod expand;
#[cfg(target_os = "linux")]
mod files;
#[cfg(target_os = "linux")]
pub mod git_guard;
#[cfg(target_os = "linux")]
mod layout;
#[cfg(target_os = "linux")]
mod roots;
#[cfg(target_os = "linux")]
mod search;
#[cfg(target_os = "linux")]
mod stamp;
#[cfg(target_os = "linux")]
mod state;
#[cfg(target_os = "linux")]
mod temp_sweep;
#[cfg(not(target_os = "linux"))]
mod unsupported;

#[cfg(target_os = "linux")]
pub use backend::LocalBackend;
#[cfg(target_os = "linux")]
pub use files::wait_for_writeback;
#[cfg(not(target_os = "linux"))]
pub use unsupported::{LocalBackend, wait_for_writeback};

/// One sandbox layer as a backend with a given spec needs it on a given host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerStatus {
    /// The layer.
    pub layer: Layer,
    /// Whether commands need it (or use it when present).
    pub requirement: Requirement,
    /// Whether the host has it.
    pub available: bool,
}

/// The sandbox layers commands of a backend with `spec` use on a host like `support`, each
/// required or optional, available or not (for `cordon doctor`). Commands run when every
/// required layer is available, or degraded when the spec allows it.
pub fn sandbox_layers(spec: &SandboxSpec, support: &HostSupport) -> Vec<LayerStatus> {
    sandbox_layers_in(spec, support, Profile::Host)
}

/// As [`sandbox_layers`], for commands sandboxed in `profile` (e.g. inside a container).
pub fn sandbox_layers_in(
    spec: &SandboxSpec,
    support: &HostSupport,
    profile: Profile,
) -> Vec<LayerStatus> {
    let config = cordon_sandbox::SandboxConfig {
        profile,
        network: match spec.network {
            cordon_core::sandbox::NetworkMode::Disabled => cordon_sandbox::NetworkAccess::Off,
            cordon_core::sandbox::NetworkMode::Enabled => cordon_sandbox::NetworkAccess::On,
            cordon_core::sandbox::NetworkMode::Filtered => cordon_sandbox::NetworkAccess::Filtered,
        },
        limits: cordon_sandbox::Rlimits {
            processes: spec.limits.pids,
            ..cordon_sandbox::Rlimits::default()
        },
        ..cordon_sandbox::SandboxConfig::default()
    };
    config
        .layer_requirements(support)
        .into_iter()
        .map(|(layer, requirement)| LayerStatus {
            layer,
            requirement,
            available: support.supports(layer),
        })
        .collect()
}

/// How to build a [`LocalBackend`].
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// The workspace root (a host directory). Relative paths are taken from the current
    /// directory; the backend works with its canonical form.
    pub root: PathBuf,
    /// What commands and file operations may touch.
    pub spec: SandboxSpec,
    /// The home directory used for `~` (spec roots and model paths) and as `HOME` of
    /// commands. `None`: the host's `$HOME`, else the password database entry.
    pub home: Option<PathBuf>,
    /// Where Cordon keeps its per-user state (spill files, private temp dirs):
    /// `<base>/cordon-<uid>/`. `None`: the system temp dir (`$TMPDIR` or `/tmp`).
    pub state_base: Option<PathBuf>,
    /// Which sandbox layers commands get from this backend and which from where it runs
    /// ([`Profile::Container`]: the container's namespaces, Landlock and seccomp here).
    pub profile: Profile,
    /// The workspace is a copy that is never used in place: whoever copies it back leaves
    /// its protected and denied paths out (Docker's copy mode). Commands are then not confined
    /// around those paths inside the workspace (in [`Profile::Container`] each one would cost
    /// its directory the right to create entries); everywhere else they are.
    pub workspace_is_copy: bool,
}

impl LocalConfig {
    /// A config for `root` with the default sandbox spec.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalConfig {
            root: root.into(),
            spec: SandboxSpec::default(),
            home: None,
            state_base: None,
            profile: Profile::Host,
            workspace_is_copy: false,
        }
    }
}

impl Default for LocalConfig {
    /// The current directory as workspace root, default spec.
    fn default() -> Self {
        LocalConfig::new(".")
    }
}

/// Why a [`LocalBackend`] could not be created.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The workspace root does not exist or cannot be opened.
    #[error("failed to open workspace root {path}: {source}")]
    OpenRoot {
        /// The configured root.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The workspace root is not a directory.
    #[error("failed to use workspace root {path}: not a directory")]
    RootNotDirectory {
        /// The configured root.
        path: PathBuf,
    },
    /// An extra readable or writable root exists but cannot be opened.
    #[error("failed to open sandbox root {path}: {source}")]
    OpenExtraRoot {
        /// The root after `~` expansion.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A protected or denied glob does not parse.
    #[error("failed to compile path glob `{pattern}`: {source}")]
    Glob {
        /// The glob as given in the spec.
        pattern: String,
        /// The parser error.
        #[source]
        source: globset::Error,
    },
    /// The kernel cannot confine path resolution (`openat2` needs Linux 5.6). Fail closed.
    #[error(
        "failed to confine file operations: openat2 with RESOLVE_BENEATH is unavailable: {source}"
    )]
    Openat2Unavailable {
        /// The probe's error.
        #[source]
        source: std::io::Error,
    },
    /// A state directory (spill files, private temp dirs) could not be created or opened.
    #[error("failed to {op} state directory {path}: {source}")]
    StateDir {
        /// The step, e.g. "create", "open".
        op: &'static str,
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A state directory exists but is not safe to use (a symlink, or owned by another user).
    #[error("refusing to use state directory {path}: {reason}")]
    UnsafeStateDir {
        /// The directory.
        path: PathBuf,
        /// Why it is unsafe.
        reason: String,
    },
    /// The git metadata under the writable roots could not be recorded at start (set
    /// `nested_git = "allow"` to run without the check).
    #[cfg(target_os = "linux")]
    #[error("{source}")]
    GitGuard {
        /// What failed.
        #[from]
        source: git_guard::GitGuardError,
    },
    /// Reading a fact about this process (identity, umask) failed.
    #[error("failed to read process {what}: {source}")]
    ProcessInfo {
        /// What was being read.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An `[network] allow` or `deny` entry of the spec is not valid (the policy compiler
    /// checks them, so only a hand-built spec gets here).
    #[error("failed to compile the egress rules of `[network] allow` ({at}): {source}")]
    EgressRules {
        /// `FILE:LINE` of the first `[network] allow` entry.
        at: String,
        /// What is wrong with which entry.
        #[source]
        source: cordon_egress::rules::RulesError,
    },
    /// The local backend only exists on Linux.
    #[error("failed to create local backend: only Linux is supported")]
    Unsupported,
}
