//! The sandbox specification: plain, serialisable data describing what commands and file
//! operations may touch. The policy compiles it (one file, both layers); every backend
//! enforces it with its own mechanism (Landlock + seccomp locally, container settings in
//! Docker, …). Nothing here enforces anything.
//!
//! Paths are strings in the backend's namespace: absolute, relative to the workspace root, or
//! starting with `~/` (expanded by the backend to its own home directory).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Whether sandboxed commands may use the network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NetworkMode {
    /// No network: no IP, netlink or vsock sockets, no connect/bind to host Unix sockets.
    #[default]
    Disabled,
    /// Network allowed; host Unix sockets stay unreachable unless listed in
    /// [`SandboxSpec::unix_sockets`].
    Enabled,
    /// Commands reach the network only through Cordon's egress proxy, which allows the
    /// destinations of [`SandboxSpec::egress`]; direct IP sockets stay blocked by the
    /// backend's own layers. Host Unix sockets as with [`NetworkMode::Enabled`].
    Filtered,
}

/// The destinations commands may reach in [`NetworkMode::Filtered`]: entries as the policy
/// wrote them (`crates.io`, `*.crates.io`, `pypi.org:443`, `10.1.2.0/24:5432`), validated by
/// the policy compiler and compiled by the backend that runs the egress proxy. A deny entry
/// beats an allow entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressSpec {
    /// `[network] allow`: the destinations commands may reach.
    pub allow: Vec<String>,
    /// `[network] deny`: destinations refused even when an allow entry matches.
    pub deny: Vec<String>,
    /// `[network] ask`: destinations no allow or deny entry matches that a person may approve
    /// (once or for the session) where Cordon can ask one; refused elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask: Vec<String>,
}

/// Access to the workspace root.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RootAccess {
    /// Read-only.
    ReadOnly,
    /// Read and write (protected paths excepted).
    #[default]
    ReadWrite,
}

/// What happens to git repositories that commands create inside writable roots.
///
/// Host `git` runs programs named in a repository's own files (`core.fsmonitor`,
/// `core.pager`, hooks, …), so a repository the model made would run the model's code the
/// next time the operator runs `git` there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NestedGit {
    /// New git metadata (a `.git` anywhere, a bare repository layout) is renamed to a name
    /// git ignores after every command and at shutdown; file tools refuse to write it;
    /// repositories present at session start are read-only.
    #[default]
    Quarantine,
    /// Commands and file tools may create and change nested repositories.
    Allow,
}

/// Resource limits. `None` means "no limit beyond the backend's own".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Bash timeout when the model gives none.
    #[serde(with = "duration_secs")]
    pub default_timeout: Duration,
    /// Upper bound for a model-requested timeout.
    #[serde(with = "duration_secs")]
    pub max_timeout: Duration,
    /// Memory per command (address space locally, cgroup memory in containers).
    pub memory_bytes: Option<u64>,
    /// Maximum number of processes.
    pub pids: Option<u64>,
    /// CPU share (containers) — locally there is no cgroup, so this is advisory.
    pub cpus: Option<f64>,
    /// Largest file a command may write.
    pub file_size_bytes: Option<u64>,
    /// Maximum open file descriptors.
    pub open_files: Option<u64>,
    /// CPU seconds per command.
    pub cpu_time_secs: Option<u64>,
    /// Largest file the `edit` tool loads (`None`: no limit).
    #[serde(default = "default_edit_file_bytes")]
    pub edit_file_bytes: Option<u64>,
    /// Largest spill file kept of one command's full output (`None`: no cap).
    #[serde(default = "default_spill_bytes")]
    pub spill_bytes: Option<u64>,
    /// Spill space one session may use in total, over all its commands (`None`: no cap).
    #[serde(default = "default_spill_session_bytes")]
    pub spill_session_bytes: Option<u64>,
}

/// Default of [`Limits::spill_bytes`]: 256 MiB.
pub const DEFAULT_SPILL_BYTES: u64 = 256 << 20;

/// Default of [`Limits::spill_session_bytes`]: 1 GiB.
pub const DEFAULT_SPILL_SESSION_BYTES: u64 = 1 << 30;

fn default_spill_bytes() -> Option<u64> {
    Some(DEFAULT_SPILL_BYTES)
}

fn default_spill_session_bytes() -> Option<u64> {
    Some(DEFAULT_SPILL_SESSION_BYTES)
}

/// Default of [`Limits::edit_file_bytes`]: 64 MiB.
pub const DEFAULT_EDIT_FILE_BYTES: u64 = 64 << 20;

fn default_edit_file_bytes() -> Option<u64> {
    Some(DEFAULT_EDIT_FILE_BYTES)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(1800),
            memory_bytes: Some(2 << 30),
            pids: Some(512),
            cpus: Some(2.0),
            file_size_bytes: None,
            open_files: None,
            cpu_time_secs: None,
            edit_file_bytes: default_edit_file_bytes(),
            spill_bytes: default_spill_bytes(),
            spill_session_bytes: default_spill_session_bytes(),
        }
    }
}

/// Environment given to commands: nothing from the host unless named here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvSpec {
    /// Host variables copied by name (on top of the backend's small baseline:
    /// PATH, HOME inside the sandbox, LANG, TERM, TMPDIR).
    pub pass: Vec<String>,
    /// Variables set to fixed values.
    pub set: Vec<(String, String)>,
}

/// Everything a backend needs to confine commands and file operations.
///
/// The default is the safe baseline: read-write workspace, `.git/**` protected, no network,
/// default limits, an empty environment allowlist, no degraded sandbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// Access to the workspace root.
    pub workspace: RootAccess,
    /// Extra read-only roots (toolchains, shared caches).
    pub readable_roots: Vec<String>,
    /// Extra writable roots.
    pub writable_roots: Vec<String>,
    /// Globs that stay read-only even inside writable roots (default `.git/**`).
    pub protected: Vec<String>,
    /// Globs that are neither readable nor writable.
    pub denied: Vec<String>,
    /// Network access for commands.
    pub network: NetworkMode,
    /// Host Unix sockets (absolute paths or `~/…`) commands may connect to when the network
    /// is on or filtered. Every other host socket stays unreachable; sockets created inside
    /// the sandbox are unaffected. Ignored with the network off, where no Unix socket can be
    /// connected.
    #[serde(default)]
    pub unix_sockets: Vec<String>,
    /// The destinations of [`NetworkMode::Filtered`] (empty in the other modes).
    #[serde(default)]
    pub egress: EgressSpec,
    /// Resource limits.
    pub limits: Limits,
    /// Environment of commands.
    pub env: EnvSpec,
    /// Whether the operator accepted a weaker sandbox when a layer is unavailable.
    /// When `false` (the default) a missing layer is a hard error.
    pub allow_degraded: bool,
    /// Git repositories created inside writable roots.
    #[serde(default)]
    pub nested_git: NestedGit,
    /// Where each entry above was configured, so a denial can name the line to change.
    #[serde(default)]
    pub sources: SpecSources,
}

/// Where the entries of a [`SandboxSpec`] come from: lines of the policy file, so a command
/// that fails against the sandbox can be told which entry blocked it. Line 0 means the entry
/// is not written in the file (a built-in default, or a path Cordon protects on its own).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecSources {
    /// The policy file as it was named to the loader; empty when the spec was not compiled
    /// from a policy.
    pub file: String,
    /// The line of each [`SandboxSpec::protected`] entry, in the same order.
    pub protected: Vec<usize>,
    /// The line of each [`SandboxSpec::denied`] entry, in the same order.
    pub denied: Vec<usize>,
    /// `[filesystem] write`.
    pub write: usize,
    /// `[network] enabled`.
    pub network: usize,
    /// The line of each [`EgressSpec::allow`] entry, in the same order.
    #[serde(default)]
    pub egress_allow: Vec<usize>,
    /// The line of each [`EgressSpec::deny`] entry, in the same order.
    #[serde(default)]
    pub egress_deny: Vec<usize>,
    /// The line of each [`EgressSpec::ask`] entry, in the same order.
    #[serde(default)]
    pub egress_ask: Vec<usize>,
    /// `[limits] timeout`.
    pub timeout: usize,
    /// `[limits] max_timeout`.
    pub max_timeout: usize,
    /// `[limits] memory`.
    pub memory: usize,
    /// `[limits] pids`.
    pub pids: usize,
    /// `[limits] file_size`.
    pub file_size: usize,
}

impl SpecSources {
    /// `FILE:LINE` of an entry, or where it would go when the file does not set it.
    pub fn at(&self, line: usize) -> String {
        match (self.file.as_str(), line) {
            ("", _) => "not from a policy file".to_owned(),
            (file, 0) => format!("{file}, not set there: the built-in default"),
            (file, line) => format!("{file}:{line}"),
        }
    }

    /// `FILE:LINE` of the first `[network] allow` entry: the line that turned filtered mode
    /// on, for a backend that cannot provide it to name.
    pub fn egress_allow_at(&self) -> String {
        self.at(self.egress_allow.first().copied().unwrap_or(0))
    }
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            workspace: RootAccess::ReadWrite,
            readable_roots: Vec::new(),
            writable_roots: Vec::new(),
            protected: vec![".git/**".to_owned()],
            denied: Vec::new(),
            network: NetworkMode::Disabled,
            unix_sockets: Vec::new(),
            egress: EgressSpec::default(),
            limits: Limits::default(),
            env: EnvSpec::default(),
            allow_degraded: false,
            nested_git: NestedGit::Quarantine,
            sources: SpecSources::default(),
        }
    }
}

mod duration_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(value.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(deserializer)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_allow_at_names_the_first_allow_line() {
        let mut sources = SpecSources {
            file: "policy.toml".to_owned(),
            egress_allow: vec![8, 9],
            ..SpecSources::default()
        };
        assert_eq!(sources.egress_allow_at(), "policy.toml:8");
        sources.egress_allow.clear();
        assert_eq!(
            sources.egress_allow_at(),
            "policy.toml, not set there: the built-in default"
        );
    }

    #[test]
    fn a_spec_without_the_egress_fields_still_reads() {
        // A spec serialised before filtered mode existed (a remote helper of an older build).
        let mut json = serde_json::to_value(SandboxSpec::default()).expect("serialise");
        let object = json.as_object_mut().expect("an object");
        object.remove("egress");
        let sources = object["sources"].as_object_mut().expect("sources");
        sources.remove("egressAllow");
        sources.remove("egressDeny");
        let back: SandboxSpec = serde_json::from_value(json).expect("deserialise");
        assert_eq!(back, SandboxSpec::default());

        let filtered = SandboxSpec {
            network: NetworkMode::Filtered,
            egress: EgressSpec {
                allow: vec!["crates.io".to_owned()],
                deny: vec!["evil.crates.io".to_owned()],
                ask: Vec::new(),
            },
            ..SandboxSpec::default()
        };
        let json = serde_json::to_value(&filtered).expect("serialise");
        assert_eq!(json["network"], "filtered");
        assert_eq!(
            json["egress"],
            serde_json::json!({"allow": ["crates.io"], "deny": ["evil.crates.io"]})
        );
        let back: SandboxSpec = serde_json::from_value(json).expect("deserialise");
        assert_eq!(back, filtered);
    }
}
