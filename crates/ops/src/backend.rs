//! The backend contract (docs/architecture.md#backend-traits): [`FileOperations`],
//! [`BashOperations`] and [`SearchOperations`], bundled by [`Backend`].
//!
//! Every operation is a plain request with plain data in and out, so that it can later travel
//! over a wire to a resident agent inside a container or on an SSH host. Paths are absolute
//! paths in the backend's namespace (the workspace root is [`FileOperations::root`]); tools
//! resolve the model's relative paths before calling.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWrite;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::EgressRecord;

/// Identifies one backend instance; part of the mutation-queue key
/// (docs/semantics.md#mutation-queue).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BackendId(Arc<str>);

impl BackendId {
    /// A backend id such as `local:/home/me/project` or `docker:cordon-1a2b`.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        BackendId(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for BackendId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a file operation failed. Messages name the path; [`FsError::errno_name`] gives the
/// `ENOENT`-style code the edit tool reports.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The path resolves outside every root the backend may touch (`..`, absolute path,
    /// symlink pointing out). Checked by the kernel or the remote side, never by string only.
    #[error("path is outside the allowed roots: {path}")]
    OutsideRoot {
        /// The offending path.
        path: PathBuf,
    },
    /// The path is readable but protected from writes (e.g. `.git/**`).
    #[error("path is protected (read-only): {path}")]
    Protected {
        /// The offending path.
        path: PathBuf,
    },
    /// The path is denied by the sandbox spec (neither readable nor writable).
    #[error("access to path is denied by policy: {path}")]
    Denied {
        /// The offending path.
        path: PathBuf,
    },
    /// No such file or directory.
    #[error("no such file or directory: {path}")]
    NotFound {
        /// The missing path.
        path: PathBuf,
    },
    /// Permission denied by file permissions.
    #[error("permission denied: {path}")]
    PermissionDenied {
        /// The offending path.
        path: PathBuf,
    },
    /// A directory was expected.
    #[error("not a directory: {path}")]
    NotADirectory {
        /// The offending path.
        path: PathBuf,
    },
    /// A file was expected.
    #[error("is a directory: {path}")]
    IsADirectory {
        /// The offending path.
        path: PathBuf,
    },
    /// Any other operating-system error, with the failing step.
    #[error("failed to {op} {path}: {source}")]
    Io {
        /// The step, e.g. "read", "rename".
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The backend's transport failed (container gone, SSH connection dropped, …).
    #[error("failed to {op} {path}: backend unavailable: {reason}")]
    Backend {
        /// The step.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// What the transport reported.
        reason: String,
    },
    /// The path is git metadata (a `.git` entry, or a part of a bare repository layout) and
    /// the spec does not allow nested repositories.
    #[error(
        "refused to write git metadata {path}: host git would run hooks and programs named in it; leave repositories to the operator (policy setting `[filesystem] nested_git = \"allow\"` permits this)"
    )]
    GitMetadata {
        /// The offending path.
        path: PathBuf,
    },
    /// The operation was cancelled before it started or while it ran.
    #[error("operation aborted")]
    Cancelled,
}

impl FsError {
    /// The POSIX error name matching this error, where one applies.
    pub fn errno_name(&self) -> Option<&'static str> {
        match self {
            FsError::NotFound { .. } => Some("ENOENT"),
            FsError::PermissionDenied { .. }
            | FsError::Protected { .. }
            | FsError::GitMetadata { .. }
            | FsError::Denied { .. } => Some("EACCES"),
            FsError::NotADirectory { .. } => Some("ENOTDIR"),
            FsError::IsADirectory { .. } => Some("EISDIR"),
            FsError::OutsideRoot { .. } => Some("EXDEV"),
            FsError::Io { source, .. } => source.raw_os_error().and_then(errno_name),
            FsError::Backend { .. } | FsError::Cancelled => None,
        }
    }

    /// Map an `io::Error` to the matching variant.
    pub fn from_io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        match source.raw_os_error() {
            Some(code) if code == ENOENT => FsError::NotFound { path },
            Some(code) if code == EACCES || code == EPERM => FsError::PermissionDenied { path },
            Some(code) if code == ENOTDIR => FsError::NotADirectory { path },
            Some(code) if code == EISDIR => FsError::IsADirectory { path },
            Some(code) if code == EXDEV => FsError::OutsideRoot { path },
            _ => FsError::Io { op, path, source },
        }
    }
}

// Linux errno values (stable ABI); kept here so this crate needs no libc.
const EPERM: i32 = 1;
const ENOENT: i32 = 2;
const EACCES: i32 = 13;
const EXDEV: i32 = 18;
const ENOTDIR: i32 = 20;
const EISDIR: i32 = 21;

fn errno_name(code: i32) -> Option<&'static str> {
    Some(match code {
        EPERM => "EPERM",
        ENOENT => "ENOENT",
        EACCES => "EACCES",
        EXDEV => "EXDEV",
        ENOTDIR => "ENOTDIR",
        EISDIR => "EISDIR",
        17 => "EEXIST",
        28 => "ENOSPC",
        30 => "EROFS",
        40 => "ELOOP",
        _ => return None,
    })
}

/// Kind of a filesystem entry (after following symlinks, unless stated otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symlink (only reported where links are not followed).
    Symlink,
    /// Socket, FIFO, device, …
    Other,
}

/// Metadata of a path, following symlinks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileMeta {
    /// Entry kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`0o644`, …).
    pub mode: u32,
    /// Whether the sandboxed agent may write this path: file permissions judged as an
    /// unprivileged process would (no root override, since commands run without
    /// capabilities), and the sandbox spec (read-only roots, protected paths).
    pub writable: bool,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DirEntry {
    /// File name (no path).
    pub name: String,
    /// Kind after following symlinks; `None` when it could not be determined.
    pub kind: Option<FileKind>,
    /// Why the kind could not be determined (e.g. dangling symlink, permission denied).
    pub error: Option<String>,
}

/// A sink for a command's full raw output (the spill file).
pub type SpillWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// File operations of one backend, confined to the roots its sandbox spec allows.
#[async_trait]
pub trait FileOperations: Send + Sync {
    /// This backend's id.
    fn backend_id(&self) -> &BackendId;

    /// The workspace root, absolute, in the backend's namespace.
    fn root(&self) -> &Path;

    /// The home directory used to expand `~` in model paths, in the backend's namespace.
    fn home(&self) -> Option<&Path>;

    /// Read a whole file.
    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError>;

    /// Read at most `max_bytes` from the start of a file (magic-byte sniffing).
    async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError>;

    /// Read at most `max_bytes` starting `offset` bytes into a file: fewer at the end of the
    /// file, none past it. Each call opens the path afresh with the same confinement as
    /// [`FileOperations::read_file`]; memory is bounded by `max_bytes` whatever the file's size,
    /// so a tool can stream a file of any size in chunks.
    async fn read_range(
        &self,
        path: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError>;

    /// Replace a file atomically: write a temporary file in the same directory, then rename it
    /// over the target, keeping the existing file's permission bits (0o644 minus umask for a
    /// new file). If the target is a symlink, the file it points to is replaced. Parent
    /// directories must exist. A crash or cancellation never leaves a torn file.
    async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError>;

    /// Create a directory and its missing parents.
    async fn create_dir_all(&self, path: &Path) -> Result<(), FsError>;

    /// Metadata of `path`, following symlinks.
    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError>;

    /// Entries of a directory (without `.` and `..`), unsorted. Entries whose kind cannot be
    /// determined are reported with `kind: None`, never dropped.
    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError>;

    /// The canonical path: symlinks resolved by the backend. For a path that does not exist,
    /// the canonical parent joined with the remaining components. Fails with
    /// [`FsError::OutsideRoot`] when the result is outside every allowed root.
    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError>;

    /// Create a new spill file for a command's full output. It lives where [`read_file`]
    /// can open it later on this backend (also from a later session with the same root),
    /// until age-based cleanup.
    ///
    /// [`read_file`]: FileOperations::read_file
    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError>;

    /// The directory holding this backend's spill files, if it has one. Reads below it are
    /// always allowed to the `read` tool (the runtime exempts it from policy read globs), so a
    /// truncated command's full output stays reachable.
    fn spill_dir(&self) -> Option<&Path> {
        None
    }
}

/// A command to run (docs/semantics.md#bash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecRequest {
    /// Script passed to `bash -c` (fallback `sh -c`).
    pub command: String,
    /// Working directory (absolute, backend namespace).
    pub cwd: PathBuf,
    /// Hard timeout; on expiry the whole process tree is killed (SIGTERM, grace, SIGKILL).
    pub timeout: Duration,
    /// Extra environment on top of the backend's sandbox environment.
    pub env: Vec<(String, String)>,
    /// The tool call that runs the command, when there is one: a backend that can tell the
    /// command's network connections apart from other commands' hands it to the egress proxy,
    /// whose questions about `[network] ask` destinations then go to whoever made that call.
    /// Set by the runtime, never by the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExitStatus {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl ExitStatus {
    /// Shell-style exit code: the code, or 128 + signal.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Code(code) => code,
            ExitStatus::Signal(signal) => 128 + signal,
        }
    }
}

/// Why an execution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Termination {
    /// The main process ended by itself.
    Exited,
    /// The timeout expired and the process tree was killed.
    TimedOut,
    /// The cancellation token fired and the process tree was killed.
    Cancelled,
}

/// The outcome of [`BashOperations::exec`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecOutcome {
    /// Exit status of the main process; `None` if the backend could not learn it (which the
    /// bash tool reports as an error, never as success).
    pub status: Option<ExitStatus>,
    /// Why it ended.
    pub termination: Termination,
    /// What the backend did on its own after the command (e.g. git metadata it
    /// quarantined), for the model: appended to the result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The connection attempts the command made through the egress proxy (filtered network
    /// mode), allowed and refused, in the order they ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressRecord>,
}

/// Why a command could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The working directory does not exist or is not accessible.
    #[error("working directory does not exist: {cwd}")]
    MissingCwd {
        /// The working directory.
        cwd: PathBuf,
    },
    /// Neither bash nor sh could be started.
    #[error("failed to spawn shell: {source}")]
    Spawn {
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A sandbox layer the spec requires could not be applied (fail closed).
    #[error("failed to apply sandbox layer {layer}: {reason}")]
    Sandbox {
        /// The layer, e.g. "landlock".
        layer: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The backend's transport failed (container gone, SSH connection dropped, …).
    #[error("backend unavailable: {reason}")]
    Backend {
        /// What the transport reported.
        reason: String,
    },
}

/// Command execution of one backend.
#[async_trait]
pub trait BashOperations: Send + Sync {
    /// This backend's id.
    fn backend_id(&self) -> &BackendId;

    /// Run `request.command` in its own session/process group with stdin closed, stdout and
    /// stderr merged in arrival order and sent raw to `output` (awaiting the channel gives
    /// back-pressure, so memory stays bounded). Returns once the main process has exited and
    /// its output is drained (at most a short idle grace after exit), or once the timeout or
    /// `cancel` fired and the whole process tree was killed. No descendant survives the call.
    async fn exec(
        &self,
        request: ExecRequest,
        cancel: CancellationToken,
        output: mpsc::Sender<Vec<u8>>,
    ) -> Result<ExecOutcome, ExecError>;

    /// The layout a failed command's output is matched against to explain a denial
    /// ([`crate::denial`]); `None` (the default) for a backend without a sandbox, whose
    /// commands get no such notes.
    fn denial_layout(&self) -> Option<&dyn crate::denial::DenialLayout> {
        None
    }
}

/// A content search (the grep tool).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrepRequest {
    /// Regex (or literal text when `literal`).
    pub pattern: String,
    /// File or directory to search (absolute).
    pub path: PathBuf,
    /// Glob filter on file paths relative to `path`; a glob containing `/` matches the whole
    /// relative path, otherwise the file name.
    pub glob: Option<String>,
    /// Case-insensitive matching.
    pub ignore_case: bool,
    /// Treat `pattern` as literal text.
    pub literal: bool,
    /// Context lines before and after each match.
    pub context: usize,
    /// Stop after this many matching lines. Backends return up to `max_matches` matches
    /// (callers ask for one more than they show, to know whether results were cut).
    pub max_matches: usize,
}

/// One line of grep output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrepLine {
    /// 1-based line number.
    pub number: u64,
    /// Line text without its line terminator (lossy UTF-8).
    pub text: String,
    /// Whether this line matched (otherwise it is context).
    pub is_match: bool,
}

/// Matches in one file, lines in ascending order, no duplicates (overlapping context windows
/// merged).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrepFile {
    /// Absolute path of the file (backend namespace).
    pub path: PathBuf,
    /// Matching and context lines.
    pub lines: Vec<GrepLine>,
}

/// Result of a grep. Files in ascending path order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrepOutput {
    /// Files with matches.
    pub files: Vec<GrepFile>,
    /// Files or directories that could not be read, as `path: reason` notes.
    pub errors: Vec<String>,
}

/// A file-name search (the find tool).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FindRequest {
    /// Glob; with a `/` it matches the whole path relative to `path`, otherwise file names.
    pub pattern: String,
    /// Directory to search (absolute).
    pub path: PathBuf,
    /// Stop after this many results (callers ask for one more than they show).
    pub max_results: usize,
}

/// Result of a find. Paths absolute, ascending order, regular files (and symlinks to them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FindOutput {
    /// Matching files.
    pub paths: Vec<PathBuf>,
    /// Entries that could not be read, as `path: reason` notes.
    pub errors: Vec<String>,
}

/// Why a search failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The search path does not exist.
    #[error("Path not found: {path}")]
    PathNotFound {
        /// The path.
        path: PathBuf,
    },
    /// The search path is outside the allowed roots.
    #[error("path is outside the allowed roots: {path}")]
    OutsideRoot {
        /// The path.
        path: PathBuf,
    },
    /// The regex or glob does not parse.
    #[error("invalid {what} `{}`: {reason}", cordon_core::excerpt::excerpt(.pattern))]
    InvalidPattern {
        /// "regex" or "glob".
        what: &'static str,
        /// The pattern.
        pattern: String,
        /// Parser message.
        reason: String,
    },
    /// The backend's transport failed.
    #[error("backend unavailable: {reason}")]
    Backend {
        /// What the transport reported.
        reason: String,
    },
    /// Cancelled.
    #[error("operation aborted")]
    Cancelled,
}

/// Searches of one backend. Both respect `.gitignore` (and `.ignore`) the same way inside and
/// outside git repositories, include hidden files, and never enter `.git/`.
#[async_trait]
pub trait SearchOperations: Send + Sync {
    /// Search file contents.
    async fn grep(
        &self,
        request: GrepRequest,
        cancel: CancellationToken,
    ) -> Result<GrepOutput, SearchError>;

    /// Search file names.
    async fn find(
        &self,
        request: FindRequest,
        cancel: CancellationToken,
    ) -> Result<FindOutput, SearchError>;
}

/// One backend: its three operation sets plus lifecycle.
#[async_trait]
pub trait Backend: Send + Sync {
    /// This backend's id.
    fn id(&self) -> &BackendId;
    /// File operations.
    fn files(&self) -> Arc<dyn FileOperations>;
    /// Command execution.
    fn bash(&self) -> Arc<dyn BashOperations>;
    /// Searches.
    fn search(&self) -> Arc<dyn SearchOperations>;
    /// Sandbox layers that are NOT in force because the operator allowed a degraded sandbox;
    /// empty when the sandbox is complete. Surfaced in every result's details.
    fn missing_layers(&self) -> Vec<String>;
    /// Release resources (containers, connections). Idempotent: a second call returns `Ok`.
    /// An error means work may be lost (copy mode's workspace not copied back); the resources
    /// are released all the same.
    async fn shutdown(&self) -> Result<(), ShutdownError>;
}

/// Why a backend's shutdown lost something.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    /// The sandbox's copy of the workspace could not be copied back to the host: the
    /// session's changes are not (all) there.
    #[error(
        "failed to copy the workspace back to the host ({backend}): {source}; the session's \
         changes may be missing there (the sandbox is gone)"
    )]
    CopyBack {
        /// The backend.
        backend: BackendId,
        /// The backend's reason.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
