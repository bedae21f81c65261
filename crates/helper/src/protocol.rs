//! The messages of the helper protocol (docs/helper.md#messages): what a frame's JSON header
//! says. Every header is an [`Envelope`]: the request id that multiplexes many calls over one
//! stream, and a [`Request`] (client → helper) or a [`Response`] (helper → client).
//!
//! Paths travel as [`WirePath`]: a string when the path is UTF-8, base64 of its bytes
//! otherwise, so a file name the model made from arbitrary bytes survives the trip. Errors
//! travel as [`WireError`], one variant per variant of the backend traits' errors, and come
//! back as exactly the error the local backend returned (same text, same `errno`).
//!
//! This module owns the data only; the server and client own what is done with it.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use cordon_core::sandbox::SandboxSpec;
use cordon_ops::denial::PathEntry;
use cordon_ops::{
    DirEntry, ExecError, ExecOutcome, ExecRequest, FileMeta, FindOutput, FindRequest, FsError,
    GrepFile, GrepLine, GrepOutput, GrepRequest, SearchError,
};
use serde::{Deserialize, Serialize};

/// The protocol version both sides must speak; a helper of another version refuses the
/// session in `hello`.
pub const PROTOCOL_VERSION: u32 = 2;

/// Most requests one helper serves at a time; one more is refused with an error (the client
/// holds the same bound, so it never sends more).
pub const MAX_IN_FLIGHT: usize = 256;

/// Bytes of one command's output the helper sends before the client acknowledges them
/// (`ack`): the client's memory for a command it does not read fast enough, and the
/// back-pressure that pauses the command.
pub const OUTPUT_WINDOW: u64 = 1024 * 1024;

/// Most spill files one helper keeps open at a time.
pub const MAX_OPEN_SPILLS: usize = 64;

/// Most `[network] ask` questions one helper has waiting for the client's answer; its proxy
/// gets "nobody to ask" for more. The client holds the same bound on the questions it takes.
pub const MAX_OPEN_QUESTIONS: usize = 16;

/// Longest text of a question's host, entry, source or call the client takes.
pub const MAX_QUESTION_TEXT: usize = 1024;

/// One frame's header.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// The request id (chosen by the client; the helper's responses carry it). Id 0 is the
    /// helper's own: a notice about a frame it could not attribute.
    pub id: u64,
    /// The message.
    #[serde(flatten)]
    pub body: T,
}

/// A path on the wire: UTF-8 as a string, anything else as `{"b64": "..."}` of its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WirePath(pub PathBuf);

impl WirePath {
    /// The path.
    pub fn into_path(self) -> PathBuf {
        self.0
    }
}

impl From<&Path> for WirePath {
    fn from(path: &Path) -> Self {
        WirePath(path.to_path_buf())
    }
}

impl From<PathBuf> for WirePath {
    fn from(path: PathBuf) -> Self {
        WirePath(path)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum PathRepr {
    Text(String),
    Bytes { b64: String },
}

impl Serialize for WirePath {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.to_str() {
            Some(text) => PathRepr::Text(text.to_owned()),
            None => PathRepr::Bytes {
                b64: base64::engine::general_purpose::STANDARD
                    .encode(self.0.as_os_str().as_bytes()),
            },
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for WirePath {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match PathRepr::deserialize(deserializer)? {
            PathRepr::Text(text) => Ok(WirePath(PathBuf::from(text))),
            PathRepr::Bytes { b64 } => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map(|bytes| WirePath(PathBuf::from(OsString::from_vec(bytes))))
                .map_err(serde::de::Error::custom),
        }
    }
}

/// What the client asks to open: the local backend's configuration, on the helper's host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStart {
    /// The workspace root on the helper's host.
    pub root: WirePath,
    /// The sandbox spec the client compiled from the policy.
    pub spec: SandboxSpec,
    /// `~` and commands' `HOME` on the helper's host; `None`: the helper's `$HOME`.
    pub home: Option<WirePath>,
    /// Where the helper keeps per-user state (`<base>/cordon-<uid>/`); `None`: its temp dir.
    pub state_base: Option<WirePath>,
    /// Build the command sandbox as if the host supported only these layers (intersected with
    /// what it really supports): to check failing closed on a weaker host. `None`: the host's.
    #[serde(default)]
    pub simulate_support: Option<ProbeReport>,
    /// Where the helper runs, which decides the sandbox layers commands get from it.
    #[serde(default)]
    pub profile: SandboxProfile,
    /// The workspace is a copy the client copies back without its protected and denied
    /// paths (`LocalConfig::workspace_is_copy`).
    #[serde(default)]
    pub workspace_is_copy: bool,
    /// The client answers questions about `[network] ask` destinations (`ask` frames); `None`:
    /// nobody is asked and such destinations are refused.
    #[serde(default)]
    pub ask: Option<AskSetup>,
}

/// How the client answers `[network] ask` questions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AskSetup {
    /// How long the client's approver waits for a person before it gives up by itself, in
    /// milliseconds (`EgressApprover::answer_within`): the helper's proxy waits that long plus
    /// a margin for the answer.
    pub answer_within_ms: Option<u64>,
}

/// An answer to an `ask` question, on the wire (`cordon_egress::ask::AskAnswer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireAskAnswer {
    /// This connection.
    Once,
    /// The destination, for the rest of the session.
    Session,
    /// Refused.
    Deny,
    /// Asked, no usable answer.
    NoAnswer,
    /// Nobody to ask.
    Unavailable,
}

impl From<cordon_egress::ask::AskAnswer> for WireAskAnswer {
    fn from(answer: cordon_egress::ask::AskAnswer) -> Self {
        use cordon_egress::ask::AskAnswer;
        match answer {
            AskAnswer::Once => WireAskAnswer::Once,
            AskAnswer::Session => WireAskAnswer::Session,
            AskAnswer::Deny => WireAskAnswer::Deny,
            AskAnswer::NoAnswer => WireAskAnswer::NoAnswer,
            AskAnswer::Unavailable => WireAskAnswer::Unavailable,
        }
    }
}

impl From<WireAskAnswer> for cordon_egress::ask::AskAnswer {
    fn from(answer: WireAskAnswer) -> Self {
        use cordon_egress::ask::AskAnswer;
        match answer {
            WireAskAnswer::Once => AskAnswer::Once,
            WireAskAnswer::Session => AskAnswer::Session,
            WireAskAnswer::Deny => AskAnswer::Deny,
            WireAskAnswer::NoAnswer => AskAnswer::NoAnswer,
            WireAskAnswer::Unavailable => AskAnswer::Unavailable,
        }
    }
}

/// A question of the helper's egress proxy (an `ask` frame): may a command of the call
/// `call` connect to `host:port`, which the ask entry `entry` (written at `source`) matches?
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireQuestion {
    /// The question's number (for `answer`).
    pub question: u64,
    /// The tool call whose command connects, when the helper knows it.
    pub call: Option<String>,
    /// The destination host: a name, or an address without brackets.
    pub host: String,
    /// The destination port.
    pub port: u16,
    /// The ask entry that matched.
    pub entry: String,
    /// Where it was written (`FILE:LINE`).
    pub source: String,
}

/// Where a helper runs: which of the local sandbox's layers it applies to commands itself
/// (docs/helper.md, "In a Docker container").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxProfile {
    /// A host of its own (SSH, a local pipe): every layer, namespaces included.
    #[default]
    Host,
    /// Inside a session's container, which provides the namespaces and the process limit:
    /// Landlock, seccomp, rlimits and a process group commands cannot leave.
    Container,
}

impl From<SandboxProfile> for cordon_backend_local::Profile {
    fn from(profile: SandboxProfile) -> Self {
        match profile {
            SandboxProfile::Host => cordon_backend_local::Profile::Host,
            SandboxProfile::Container => cordon_backend_local::Profile::Container,
        }
    }
}

impl SessionStart {
    /// A session over `root` with `spec` and the helper host's defaults.
    pub fn new(root: impl Into<PathBuf>, spec: SandboxSpec) -> Self {
        SessionStart {
            root: WirePath(root.into()),
            spec,
            home: None,
            state_base: None,
            simulate_support: None,
            profile: SandboxProfile::Host,
            workspace_is_copy: false,
            ask: None,
        }
    }
}

/// What a started session is, as the helper sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    /// The local backend's id on the helper's host (`local:<canonical root>`).
    pub backend_id: String,
    /// The canonical workspace root.
    pub root: WirePath,
    /// The home directory used for `~`.
    pub home: Option<WirePath>,
    /// Where spill files live.
    pub spill_dir: WirePath,
    /// Layers commands run without (the spec allowed a degraded sandbox).
    pub missing_layers: Vec<String>,
}

/// The sandbox layers a kernel provides (the helper's `probe`), field for field
/// `cordon_sandbox::HostSupport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeReport {
    /// Landlock ABI version, 0 without Landlock.
    pub landlock_abi: u32,
    /// seccomp filters can be installed.
    pub seccomp: bool,
    /// A user namespace can be created.
    pub user_namespaces: bool,
    /// PID and mount namespaces can be created.
    pub pid_namespaces: bool,
    /// Mount namespaces and the fd-based mount API work.
    pub mount_namespaces: bool,
    /// `pid_max` is per PID namespace.
    pub pid_max_per_namespace: bool,
    /// The helper runs with effective uid 0.
    pub root: bool,
    /// A network namespace can be created (filtered network mode). Absent from an older
    /// helper's report: then false, and filtered mode is refused there.
    #[serde(default)]
    pub network_namespaces: bool,
}

impl From<cordon_backend_local::HostSupport> for ProbeReport {
    fn from(support: cordon_backend_local::HostSupport) -> Self {
        let cordon_backend_local::HostSupport {
            landlock_abi,
            seccomp,
            user_namespaces,
            pid_namespaces,
            mount_namespaces,
            pid_max_per_namespace,
            root,
            network_namespaces,
        } = support;
        ProbeReport {
            landlock_abi,
            seccomp,
            user_namespaces,
            pid_namespaces,
            mount_namespaces,
            pid_max_per_namespace,
            root,
            network_namespaces,
        }
    }
}

impl From<ProbeReport> for cordon_backend_local::HostSupport {
    fn from(report: ProbeReport) -> Self {
        let ProbeReport {
            landlock_abi,
            seccomp,
            user_namespaces,
            pid_namespaces,
            mount_namespaces,
            pid_max_per_namespace,
            root,
            network_namespaces,
        } = report;
        cordon_backend_local::HostSupport {
            landlock_abi,
            seccomp,
            user_namespaces,
            pid_namespaces,
            mount_namespaces,
            pid_max_per_namespace,
            root,
            network_namespaces,
        }
    }
}

impl ProbeReport {
    /// What both reports provide: `self` limited to `real` (a simulated host is never
    /// stronger than the real one).
    pub fn intersect(self, real: ProbeReport) -> ProbeReport {
        ProbeReport {
            landlock_abi: self.landlock_abi.min(real.landlock_abi),
            seccomp: self.seccomp && real.seccomp,
            user_namespaces: self.user_namespaces && real.user_namespaces,
            pid_namespaces: self.pid_namespaces && real.pid_namespaces,
            mount_namespaces: self.mount_namespaces && real.mount_namespaces,
            pid_max_per_namespace: self.pid_max_per_namespace && real.pid_max_per_namespace,
            // Whether the helper is root is a fact, not a capability to simulate.
            root: real.root,
            network_namespaces: self.network_namespaces && real.network_namespaces,
        }
    }
}

/// A command to run on the helper's host ([`ExecRequest`] with wire paths).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireExec {
    /// Script for `bash -c`.
    pub command: String,
    /// Working directory.
    pub cwd: WirePath,
    /// Hard timeout in milliseconds.
    pub timeout_ms: u64,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// The tool call (the helper's proxy names it in its questions about the command's
    /// connections, so the client can tell whose they are).
    #[serde(default)]
    pub call_id: Option<String>,
}

impl From<ExecRequest> for WireExec {
    fn from(request: ExecRequest) -> Self {
        let ExecRequest {
            call_id,
            command,
            cwd,
            timeout,
            env,
        } = request;
        WireExec {
            call_id,
            command,
            cwd: WirePath(cwd),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            env,
        }
    }
}

impl From<WireExec> for ExecRequest {
    fn from(request: WireExec) -> Self {
        let WireExec {
            command,
            cwd,
            timeout_ms,
            env,
            call_id,
        } = request;
        ExecRequest {
            call_id,
            command,
            cwd: cwd.0,
            timeout: Duration::from_millis(timeout_ms),
            env,
        }
    }
}

/// A content search ([`GrepRequest`] with a wire path).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireGrep {
    /// Regex or literal.
    pub pattern: String,
    /// File or directory to search.
    pub path: WirePath,
    /// Glob filter.
    pub glob: Option<String>,
    /// Case-insensitive.
    pub ignore_case: bool,
    /// Literal text.
    pub literal: bool,
    /// Context lines.
    pub context: usize,
    /// Most matching lines.
    pub max_matches: usize,
}

impl From<GrepRequest> for WireGrep {
    fn from(request: GrepRequest) -> Self {
        let GrepRequest {
            pattern,
            path,
            glob,
            ignore_case,
            literal,
            context,
            max_matches,
        } = request;
        WireGrep {
            pattern,
            path: WirePath(path),
            glob,
            ignore_case,
            literal,
            context,
            max_matches,
        }
    }
}

impl From<WireGrep> for GrepRequest {
    fn from(request: WireGrep) -> Self {
        let WireGrep {
            pattern,
            path,
            glob,
            ignore_case,
            literal,
            context,
            max_matches,
        } = request;
        GrepRequest {
            pattern,
            path: path.0,
            glob,
            ignore_case,
            literal,
            context,
            max_matches,
        }
    }
}

/// Matches in one file ([`GrepFile`] with a wire path).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGrepFile {
    /// The file.
    pub path: WirePath,
    /// Its lines.
    pub lines: Vec<GrepLine>,
}

/// A grep's result ([`GrepOutput`] with wire paths).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGrepOutput {
    /// Files with matches.
    pub files: Vec<WireGrepFile>,
    /// Unreadable entries.
    pub errors: Vec<String>,
}

impl From<GrepOutput> for WireGrepOutput {
    fn from(output: GrepOutput) -> Self {
        let GrepOutput { files, errors } = output;
        WireGrepOutput {
            files: files
                .into_iter()
                .map(|GrepFile { path, lines }| WireGrepFile {
                    path: WirePath(path),
                    lines,
                })
                .collect(),
            errors,
        }
    }
}

impl From<WireGrepOutput> for GrepOutput {
    fn from(output: WireGrepOutput) -> Self {
        let WireGrepOutput { files, errors } = output;
        GrepOutput {
            files: files
                .into_iter()
                .map(|WireGrepFile { path, lines }| GrepFile {
                    path: path.0,
                    lines,
                })
                .collect(),
            errors,
        }
    }
}

/// A file-name search ([`FindRequest`] with a wire path).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireFind {
    /// Glob.
    pub pattern: String,
    /// Directory to search.
    pub path: WirePath,
    /// Most results.
    pub max_results: usize,
}

impl From<FindRequest> for WireFind {
    fn from(request: FindRequest) -> Self {
        let FindRequest {
            pattern,
            path,
            max_results,
        } = request;
        WireFind {
            pattern,
            path: WirePath(path),
            max_results,
        }
    }
}

impl From<WireFind> for FindRequest {
    fn from(request: WireFind) -> Self {
        let WireFind {
            pattern,
            path,
            max_results,
        } = request;
        FindRequest {
            pattern,
            path: path.0,
            max_results,
        }
    }
}

/// A find's result ([`FindOutput`] with wire paths).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireFindOutput {
    /// Matching files.
    pub paths: Vec<WirePath>,
    /// Unreadable entries.
    pub errors: Vec<String>,
}

impl From<FindOutput> for WireFindOutput {
    fn from(output: FindOutput) -> Self {
        let FindOutput { paths, errors } = output;
        WireFindOutput {
            paths: paths.into_iter().map(WirePath).collect(),
            errors,
        }
    }
}

impl From<WireFindOutput> for FindOutput {
    fn from(output: WireFindOutput) -> Self {
        let WireFindOutput { paths, errors } = output;
        FindOutput {
            paths: paths.into_iter().map(WirePath::into_path).collect(),
            errors,
        }
    }
}

/// A request, client → helper.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// The first request: the client's protocol version.
    Hello {
        /// [`PROTOCOL_VERSION`] of the client.
        version: u32,
    },
    /// Which sandbox layers this kernel provides.
    Probe,
    /// Open the session (once per helper).
    Start {
        /// What to open.
        session: Box<SessionStart>,
    },
    /// `FileOperations::read_file`.
    ReadFile {
        /// The file.
        path: WirePath,
    },
    /// `FileOperations::read_head`.
    ReadHead {
        /// The file.
        path: WirePath,
        /// Most bytes.
        max_bytes: u64,
    },
    /// `FileOperations::read_range`.
    ReadRange {
        /// The file.
        path: WirePath,
        /// Where to start.
        offset: u64,
        /// Most bytes.
        max_bytes: u64,
    },
    /// `FileOperations::write_file`; the data is the payload.
    WriteFile {
        /// The file.
        path: WirePath,
    },
    /// `FileOperations::create_dir_all`.
    CreateDirAll {
        /// The directory.
        path: WirePath,
    },
    /// `FileOperations::metadata`.
    Metadata {
        /// The path.
        path: WirePath,
    },
    /// `FileOperations::read_dir`.
    ReadDir {
        /// The directory.
        path: WirePath,
    },
    /// `FileOperations::canonicalize`.
    Canonicalize {
        /// The path.
        path: WirePath,
    },
    /// `FileOperations::create_spill_file`: answered with the spill's handle and path.
    SpillCreate,
    /// Append the payload to an open spill file.
    SpillWrite {
        /// The handle from `spill_create`.
        spill: u64,
    },
    /// Close an open spill file (its content is complete).
    SpillClose {
        /// The handle.
        spill: u64,
    },
    /// `SearchOperations::grep`.
    Grep {
        /// The search.
        request: WireGrep,
    },
    /// `SearchOperations::find`.
    Find {
        /// The search.
        request: WireFind,
    },
    /// `BashOperations::exec`: answered with `output` frames, then `exec`.
    Exec {
        /// The command.
        request: WireExec,
    },
    /// What failed commands' error messages name, in the layout (to explain a denial): at
    /// most `cordon_ops::denial::MAX_PATHS` paths.
    Classify {
        /// The paths (absolute, lexically normal).
        paths: Vec<WirePath>,
    },
    /// The caller took `bytes` of the output of the command `target`: the helper may send that
    /// much more ([`OUTPUT_WINDOW`]). Not answered.
    Ack {
        /// The `exec` request id.
        target: u64,
        /// Bytes taken.
        bytes: u64,
    },
    /// The answer to the helper's question `question` (an `ask` frame). Not answered.
    Answer {
        /// The question's number.
        question: u64,
        /// The answer.
        answer: WireAskAnswer,
    },
    /// Cancel the request `target` (a command's tree is killed). Not answered.
    Cancel {
        /// The request id to cancel.
        target: u64,
    },
    /// Shut the session down (the backend's `shutdown`); the helper then waits for the end
    /// of its input.
    Shutdown,
    /// Tests only: a request whose handler panics (how a panic is answered).
    #[cfg(test)]
    Panic,
}

/// A response, helper → client.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// The answer to `hello`.
    Hello {
        /// The helper's [`PROTOCOL_VERSION`].
        version: u32,
        /// The helper's package version.
        helper: String,
    },
    /// The answer to `probe`.
    Probe {
        /// The layers.
        support: ProbeReport,
    },
    /// The answer to `start`.
    Started {
        /// The session.
        session: Box<SessionInfo>,
    },
    /// Done, nothing to return.
    Ok,
    /// File contents in the payload.
    Bytes,
    /// Metadata.
    Metadata {
        /// The metadata.
        meta: FileMeta,
    },
    /// A directory's entries.
    Entries {
        /// The entries.
        entries: Vec<DirEntry>,
    },
    /// A path.
    Path {
        /// The path.
        path: WirePath,
    },
    /// A spill file was created.
    Spill {
        /// Its handle for `spill_write`/`spill_close`.
        spill: u64,
        /// Its path.
        path: WirePath,
    },
    /// A grep's result.
    Grep {
        /// The result.
        output: WireGrepOutput,
    },
    /// A find's result.
    Find {
        /// The result.
        output: WireFindOutput,
    },
    /// A chunk of a command's output, in the payload; more follow.
    Output,
    /// The answer to `classify`, one entry per path in order.
    Classified {
        /// The paths' entries.
        entries: Vec<Classification>,
    },
    /// The command ended; the last answer to an `exec`.
    Exec {
        /// How.
        outcome: ExecOutcome,
    },
    /// A question of the helper's egress proxy (request id 0, sent only when the session's
    /// start set `ask`). The client answers with `answer`.
    Ask(WireQuestion),
    /// The helper's proxy no longer waits for the answer to question `question` (request id
    /// 0): the command ended, its connection was cut, or the proxy gave up. The client stops
    /// asking (its approver withdraws the question from the person).
    Withdrawn {
        /// The question's number.
        question: u64,
    },
    /// The request failed.
    Error {
        /// Why.
        error: WireError,
    },
}

/// What a path is in the helper's layout (`cordon_ops::denial::DenialLayout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Classification {
    /// `classify`: the entry that restricts it, if one does.
    pub entry: Option<WireEntry>,
    /// `mode_allows_write`.
    pub mode_allows_write: bool,
}

/// `cordon_ops::denial::PathEntry` on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WireEntry {
    /// Protected by `spec.protected[index]`.
    Protected {
        /// The index.
        index: usize,
    },
    /// Denied by `spec.denied[index]`.
    Denied {
        /// The index.
        index: usize,
    },
    /// Outside every writable root.
    ReadOnly,
}

impl From<PathEntry> for WireEntry {
    fn from(entry: PathEntry) -> Self {
        match entry {
            PathEntry::Protected(index) => WireEntry::Protected { index },
            PathEntry::Denied(index) => WireEntry::Denied { index },
            PathEntry::ReadOnly => WireEntry::ReadOnly,
        }
    }
}

impl From<WireEntry> for PathEntry {
    fn from(entry: WireEntry) -> Self {
        match entry {
            WireEntry::Protected { index } => PathEntry::Protected(index),
            WireEntry::Denied { index } => PathEntry::Denied(index),
            WireEntry::ReadOnly => PathEntry::ReadOnly,
        }
    }
}

/// An `io::Error` on the wire: its OS code when it has one (rebuilt identically), else its
/// kind's name and message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireIo {
    /// `raw_os_error()`.
    pub code: Option<i32>,
    /// The error's text (used when there is no code).
    pub message: String,
}

impl From<&std::io::Error> for WireIo {
    fn from(error: &std::io::Error) -> Self {
        WireIo {
            code: error.raw_os_error(),
            message: error.to_string(),
        }
    }
}

impl From<WireIo> for std::io::Error {
    fn from(io: WireIo) -> Self {
        match io.code {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::other(io.message),
        }
    }
}

/// An error on the wire: every variant of [`FsError`], [`ExecError`] and [`SearchError`], and
/// the protocol's own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WireError {
    /// [`FsError::OutsideRoot`].
    OutsideRoot {
        /// The path.
        path: WirePath,
    },
    /// [`FsError::Protected`].
    Protected {
        /// The path.
        path: WirePath,
    },
    /// [`FsError::Denied`].
    Denied {
        /// The path.
        path: WirePath,
    },
    /// [`FsError::NotFound`].
    NotFound {
        /// The path.
        path: WirePath,
    },
    /// [`FsError::PermissionDenied`].
    PermissionDenied {
        /// The path.
        path: WirePath,
    },
    /// [`FsError::NotADirectory`].
    NotADirectory {
        /// The path.
        path: WirePath,
    },
    /// [`FsError::IsADirectory`].
    IsADirectory {
        /// The path.
        path: WirePath,
    },
    /// [`FsError::Io`].
    Io {
        /// The step.
        op: String,
        /// The path.
        path: WirePath,
        /// The OS error.
        io: WireIo,
    },
    /// [`FsError::Backend`].
    FsBackend {
        /// The step.
        op: String,
        /// The path.
        path: WirePath,
        /// What failed.
        reason: String,
    },
    /// [`FsError::GitMetadata`].
    GitMetadata {
        /// The path.
        path: WirePath,
    },
    /// [`FsError::Cancelled`] or [`SearchError::Cancelled`].
    Cancelled,
    /// [`ExecError::MissingCwd`].
    MissingCwd {
        /// The directory.
        cwd: WirePath,
    },
    /// [`ExecError::Spawn`].
    Spawn {
        /// The OS error.
        io: WireIo,
    },
    /// [`ExecError::Sandbox`].
    Sandbox {
        /// The layer.
        layer: String,
        /// What went wrong.
        reason: String,
    },
    /// [`ExecError::Backend`] or [`SearchError::Backend`].
    Backend {
        /// What failed.
        reason: String,
    },
    /// [`SearchError::PathNotFound`].
    PathNotFound {
        /// The path.
        path: WirePath,
    },
    /// [`SearchError::OutsideRoot`].
    SearchOutsideRoot {
        /// The path.
        path: WirePath,
    },
    /// [`SearchError::InvalidPattern`].
    InvalidPattern {
        /// "regex" or "glob".
        what: String,
        /// The pattern.
        pattern: String,
        /// The parser's message.
        reason: String,
    },
    /// The helper and the client speak different protocol versions.
    Version {
        /// The helper's version.
        helper: u32,
        /// The client's version.
        client: u32,
    },
    /// The session could not be opened (the local backend's error, as text).
    Start {
        /// Why.
        message: String,
    },
    /// A request the helper cannot serve: malformed, out of order, over a bound.
    Protocol {
        /// Why.
        message: String,
    },
}

impl From<&FsError> for WireError {
    fn from(error: &FsError) -> Self {
        let path = |path: &Path| WirePath(path.to_path_buf());
        match error {
            FsError::OutsideRoot { path: p } => WireError::OutsideRoot { path: path(p) },
            FsError::Protected { path: p } => WireError::Protected { path: path(p) },
            FsError::Denied { path: p } => WireError::Denied { path: path(p) },
            FsError::NotFound { path: p } => WireError::NotFound { path: path(p) },
            FsError::PermissionDenied { path: p } => WireError::PermissionDenied { path: path(p) },
            FsError::NotADirectory { path: p } => WireError::NotADirectory { path: path(p) },
            FsError::IsADirectory { path: p } => WireError::IsADirectory { path: path(p) },
            FsError::Io {
                op,
                path: p,
                source,
            } => WireError::Io {
                op: (*op).to_owned(),
                path: path(p),
                io: WireIo::from(source),
            },
            FsError::Backend {
                op,
                path: p,
                reason,
            } => WireError::FsBackend {
                op: (*op).to_owned(),
                path: path(p),
                reason: reason.clone(),
            },
            FsError::GitMetadata { path: p } => WireError::GitMetadata { path: path(p) },
            FsError::Cancelled => WireError::Cancelled,
        }
    }
}

impl From<&ExecError> for WireError {
    fn from(error: &ExecError) -> Self {
        match error {
            ExecError::MissingCwd { cwd } => WireError::MissingCwd {
                cwd: WirePath(cwd.clone()),
            },
            ExecError::Spawn { source } => WireError::Spawn {
                io: WireIo::from(source),
            },
            ExecError::Sandbox { layer, reason } => WireError::Sandbox {
                layer: (*layer).to_owned(),
                reason: reason.clone(),
            },
            ExecError::Backend { reason } => WireError::Backend {
                reason: reason.clone(),
            },
        }
    }
}

impl From<&SearchError> for WireError {
    fn from(error: &SearchError) -> Self {
        match error {
            SearchError::PathNotFound { path } => WireError::PathNotFound {
                path: WirePath(path.clone()),
            },
            SearchError::OutsideRoot { path } => WireError::SearchOutsideRoot {
                path: WirePath(path.clone()),
            },
            SearchError::InvalidPattern {
                what,
                pattern,
                reason,
            } => WireError::InvalidPattern {
                what: (*what).to_owned(),
                pattern: pattern.clone(),
                reason: reason.clone(),
            },
            SearchError::Backend { reason } => WireError::Backend {
                reason: reason.clone(),
            },
            SearchError::Cancelled => WireError::Cancelled,
        }
    }
}

/// The steps file operations name in their errors, so a step received as text becomes the
/// `&'static str` the error types hold. A step not listed reads as "access".
const KNOWN_OPS: [&str; 22] = [
    "access",
    "canonicalize",
    "create",
    "create directory",
    "create spill file",
    "inspect",
    "keep",
    "list",
    "lock",
    "lock spill file",
    "open",
    "read",
    "read link",
    "remove",
    "rename",
    "resolve",
    "restrict permissions of",
    "stat",
    "sync",
    "truncate",
    "write",
    "write spill file",
];

/// The layer names commands fail with (the sandbox's layers and the local backend's
/// groups). A layer not listed reads as "sandbox".
const KNOWN_LAYERS: [&str; 14] = [
    "seccomp",
    "landlock-fs",
    "landlock-ioctl",
    "landlock-net",
    "landlock-scopes",
    "user-namespace",
    "pid-namespace",
    "mount-namespace",
    "process-limit",
    "sandbox",
    "filesystem",
    "process",
    "capabilities",
    "rlimits",
];

fn intern(known: &[&'static str], text: &str, fallback: &'static str) -> &'static str {
    known
        .iter()
        .find(|known| **known == text)
        .copied()
        .unwrap_or(fallback)
}

impl WireError {
    /// This error as the file operations' error; `op` and `path` name the call for errors
    /// that are not a file operation's (protocol errors).
    pub fn into_fs(self, op: &'static str, call_path: &Path) -> FsError {
        match self {
            WireError::OutsideRoot { path } | WireError::SearchOutsideRoot { path } => {
                FsError::OutsideRoot { path: path.0 }
            }
            WireError::Protected { path } => FsError::Protected { path: path.0 },
            WireError::Denied { path } => FsError::Denied { path: path.0 },
            WireError::NotFound { path } | WireError::PathNotFound { path } => {
                FsError::NotFound { path: path.0 }
            }
            WireError::PermissionDenied { path } => FsError::PermissionDenied { path: path.0 },
            WireError::NotADirectory { path } => FsError::NotADirectory { path: path.0 },
            WireError::IsADirectory { path } => FsError::IsADirectory { path: path.0 },
            WireError::Io { op, path, io } => FsError::Io {
                op: intern(&KNOWN_OPS, &op, "access"),
                path: path.0,
                source: io.into(),
            },
            WireError::FsBackend { op, path, reason } => FsError::Backend {
                op: intern(&KNOWN_OPS, &op, "access"),
                path: path.0,
                reason,
            },
            WireError::GitMetadata { path } => FsError::GitMetadata { path: path.0 },
            WireError::Cancelled => FsError::Cancelled,
            other @ (WireError::MissingCwd { .. }
            | WireError::Spawn { .. }
            | WireError::Sandbox { .. }
            | WireError::Backend { .. }
            | WireError::InvalidPattern { .. }
            | WireError::Version { .. }
            | WireError::Start { .. }
            | WireError::Protocol { .. }) => FsError::Backend {
                op,
                path: call_path.to_path_buf(),
                reason: other.describe(),
            },
        }
    }

    /// This error as the command runner's error.
    pub fn into_exec(self) -> ExecError {
        match self {
            WireError::MissingCwd { cwd } => ExecError::MissingCwd { cwd: cwd.0 },
            WireError::Spawn { io } => ExecError::Spawn { source: io.into() },
            WireError::Sandbox { layer, reason } => ExecError::Sandbox {
                layer: intern(&KNOWN_LAYERS, &layer, "sandbox"),
                reason,
            },
            WireError::Backend { reason } => ExecError::Backend { reason },
            other => ExecError::Backend {
                reason: other.describe(),
            },
        }
    }

    /// This error as the searches' error.
    pub fn into_search(self) -> SearchError {
        match self {
            WireError::PathNotFound { path } | WireError::NotFound { path } => {
                SearchError::PathNotFound { path: path.0 }
            }
            WireError::SearchOutsideRoot { path } | WireError::OutsideRoot { path } => {
                SearchError::OutsideRoot { path: path.0 }
            }
            WireError::InvalidPattern {
                what,
                pattern,
                reason,
            } => SearchError::InvalidPattern {
                what: intern(&["regex", "glob"], &what, "pattern"),
                pattern,
                reason,
            },
            WireError::Cancelled => SearchError::Cancelled,
            WireError::Backend { reason } => SearchError::Backend { reason },
            other => SearchError::Backend {
                reason: other.describe(),
            },
        }
    }

    /// A one-line description (for errors that change type on the way).
    pub fn describe(&self) -> String {
        match self {
            WireError::Version { helper, client } => format!(
                "the remote helper speaks protocol version {helper}, this Cordon speaks {client}; install the same Cordon version on both sides"
            ),
            WireError::Start { message } => {
                format!("failed to start the session in the helper: {message}")
            }
            WireError::Protocol { message } => format!("helper protocol error: {message}"),
            WireError::MissingCwd { .. }
            | WireError::Spawn { .. }
            | WireError::Sandbox { .. }
            | WireError::Backend { .. } => self.clone().into_exec().to_string(),
            WireError::PathNotFound { .. }
            | WireError::SearchOutsideRoot { .. }
            | WireError::InvalidPattern { .. } => self.clone().into_search().to_string(),
            WireError::OutsideRoot { .. }
            | WireError::Protected { .. }
            | WireError::Denied { .. }
            | WireError::NotFound { .. }
            | WireError::PermissionDenied { .. }
            | WireError::NotADirectory { .. }
            | WireError::IsADirectory { .. }
            | WireError::Io { .. }
            | WireError::FsBackend { .. }
            | WireError::GitMetadata { .. }
            | WireError::Cancelled => self.clone().into_fs("access", Path::new("")).to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_survive_the_trip_utf8_or_not() {
        let text = WirePath(PathBuf::from("/w/ä b"));
        assert_eq!(serde_json::to_string(&text).expect("json"), r#""/w/ä b""#);
        let bytes = WirePath(PathBuf::from(OsString::from_vec(b"/w/\xff\n".to_vec())));
        let json = serde_json::to_string(&bytes).expect("json");
        assert_eq!(json, r#"{"b64":"L3cv/wo="}"#);
        let back: WirePath = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, bytes);
        assert!(serde_json::from_str::<WirePath>(r#"{"b64":"***"}"#).is_err());
    }

    #[test]
    fn envelope_is_flat_json() {
        let envelope = Envelope {
            id: 7,
            body: Request::ReadHead {
                path: WirePath(PathBuf::from("/w/a")),
                max_bytes: 4,
            },
        };
        assert_eq!(
            serde_json::to_string(&envelope).expect("json"),
            r#"{"id":7,"type":"read_head","path":"/w/a","max_bytes":4}"#
        );
    }

    #[test]
    fn fs_errors_come_back_identical() {
        let errors = [
            FsError::from_io(
                "write",
                "/w/a",
                std::io::Error::from_raw_os_error(28), // ENOSPC
            ),
            FsError::Protected {
                path: "/w/.git/config".into(),
            },
            FsError::GitMetadata {
                path: "/w/sub/.git".into(),
            },
        ];
        for error in errors {
            let wire = WireError::from(&error);
            let json = serde_json::to_string(&wire).expect("json");
            let back: WireError = serde_json::from_str(&json).expect("parse");
            let rebuilt = back.into_fs("read", Path::new("/w/a"));
            assert_eq!(rebuilt.to_string(), error.to_string());
            assert_eq!(rebuilt.errno_name(), error.errno_name());
        }
    }

    #[test]
    fn exec_and_search_errors_come_back_identical() {
        let exec = ExecError::Sandbox {
            layer: "landlock-fs",
            reason: "Landlock ABI >= 3 (Linux 6.2) is unavailable".into(),
        };
        let back = WireError::from(&exec).into_exec();
        assert!(matches!(
            back,
            ExecError::Sandbox {
                layer: "landlock-fs",
                ..
            }
        ));
        assert_eq!(back.to_string(), exec.to_string());
        let search = SearchError::InvalidPattern {
            what: "regex",
            pattern: "(".into(),
            reason: "unclosed group".into(),
        };
        let back = WireError::from(&search).into_search();
        assert_eq!(back.to_string(), search.to_string());
    }

    #[test]
    fn unknown_step_and_layer_names_fall_back() {
        let wire = WireError::Io {
            op: "frobnicate".into(),
            path: WirePath(PathBuf::from("/w/a")),
            io: WireIo {
                code: Some(5),
                message: String::new(),
            },
        };
        assert!(matches!(
            wire.into_fs("read", Path::new("/w/a")),
            FsError::Io { op: "access", .. }
        ));
        let wire = WireError::Sandbox {
            layer: "made-up".into(),
            reason: "r".into(),
        };
        assert!(matches!(
            wire.into_exec(),
            ExecError::Sandbox {
                layer: "sandbox",
                ..
            }
        ));
    }

    #[test]
    fn version_mismatch_says_what_to_do() {
        let wire = WireError::Version {
            helper: 2,
            client: 1,
        };
        assert_eq!(
            wire.describe(),
            "the remote helper speaks protocol version 2, this Cordon speaks 1; install the same Cordon version on both sides"
        );
    }

    #[test]
    fn probe_intersection_never_grants_more() {
        let real = ProbeReport {
            landlock_abi: 4,
            seccomp: true,
            user_namespaces: false,
            pid_namespaces: true,
            mount_namespaces: true,
            pid_max_per_namespace: false,
            root: true,
            network_namespaces: true,
        };
        let wish = ProbeReport {
            landlock_abi: 7,
            seccomp: false,
            user_namespaces: true,
            pid_namespaces: true,
            mount_namespaces: true,
            pid_max_per_namespace: true,
            root: false,
            network_namespaces: false,
        };
        assert_eq!(
            wish.intersect(real),
            ProbeReport {
                landlock_abi: 4,
                seccomp: false,
                user_namespaces: false,
                pid_namespaces: true,
                mount_namespaces: true,
                pid_max_per_namespace: false,
                root: true,
                network_namespaces: false,
            }
        );
    }
}
