//! Plain input and output types of the sandbox: what a command may touch ([`SandboxConfig`]),
//! one command to run ([`SpawnRequest`]), how it ended ([`ExitStatus`]) and what the host
//! kernel offers ([`HostSupport`], [`Layer`]).
//!
//! Everything here is concrete data: absolute paths, booleans and numbers. Globs, policy files
//! and the workspace layout are the backend's business; it resolves them into these types.

use std::ffi::OsString;
use std::fmt;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

/// What sandboxed commands may touch. Build it once per session and turn it into a
/// `PreparedSandbox` (Linux only).
///
/// Every path must be absolute and canonical (no symlink components): the kernel rules are
/// attached to the inodes these paths name at prepare time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Trees that may be read and executed (system directories, toolchains).
    pub read_exec: Vec<PathBuf>,
    /// Trees that may be read but not executed from.
    pub read: Vec<PathBuf>,
    /// Trees that may be read, written and executed from (the workspace). The per-session
    /// temporary directory and home directory are added automatically.
    pub write: Vec<PathBuf>,
    /// Paths that stay read-only even inside a writable tree (default: the workspace's
    /// `.git`). A protected path that does not exist yet is pinned by an empty read-only
    /// placeholder directory while commands run, so it cannot be created either.
    pub protected: Vec<PathBuf>,
    /// Paths that are neither readable nor writable, even inside a readable or writable
    /// tree: they are masked by an empty, unreadable file or directory.
    pub denied: Vec<PathBuf>,
    /// Whether and how commands may use the network (see [`NetworkAccess`]).
    pub network: NetworkAccess,
    /// Host Unix sockets commands may connect to when the network is on or filtered. Such a
    /// sandbox sees the host through a root that holds only its granted trees, so no other
    /// host socket (pathname: not there; abstract: Landlock scope, or the private network
    /// namespace when filtered) is reachable. Entries that do not exist or are not sockets are
    /// left out. Unused with the network off.
    pub unix_sockets: Vec<PathBuf>,
    /// Resource limits applied to every command.
    pub limits: Rlimits,
    /// Environment variables set in every command, on top of the baseline (`PATH`, `HOME`,
    /// `TMPDIR`, `LANG`, `TERM`); an entry here overrides the baseline value. Nothing from the
    /// host environment reaches a command unless it is listed here.
    pub env: Vec<(OsString, OsString)>,
    /// Directory in which the per-session directory (TMPDIR, HOME, masks) is created.
    /// `None` means the system temporary directory.
    pub session_parent: Option<PathBuf>,
    /// Use exactly this directory as the session directory instead of a new one in
    /// `session_parent`. The caller may have created it and its `tmp` and `home`
    /// subdirectories already (mode 0700, real directories), e.g. to hand them out before the
    /// sandbox is prepared; the rest is created at prepare time. Removed with the sandbox.
    pub session_dir: Option<PathBuf>,
    /// Accept a weaker sandbox when the kernel lacks a required layer. When `false` (the
    /// default) a missing layer is an error naming it.
    pub allow_degraded: bool,
    /// Where the sandbox runs: on a host of its own, or inside a container that already
    /// provides some of the layers (see [`Profile`]).
    pub profile: Profile,
}

/// Which layers the sandbox applies itself, by where it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Profile {
    /// A host of its own: every layer of [`Layer::ALL`] the configuration needs.
    #[default]
    Host,
    /// Inside a container (one per session) that already gives the command PID, mount, IPC
    /// and network namespaces, a read-only root file system, a process limit (its pids
    /// cgroup) and no capabilities, and that cannot create namespaces itself (Docker's
    /// default seccomp profile refuses them to an unprivileged container). The sandbox then
    /// applies what the container does not: Landlock (filesystem, and TCP with the network
    /// off), seccomp, rlimits (not `RLIMIT_NPROC`: the container's pids limit is the process
    /// limit, and `RLIMIT_NPROC` would count the uid's processes across the whole machine),
    /// the scrubbed environment, and a process group the command cannot leave (`setsid` and
    /// `setpgid` fail with `EPERM`), so killing the group kills its whole tree. No nested
    /// namespace is created. Protected and denied paths are enforced by Landlock: the
    /// directories above one lose the rights that would reach it, and their other entries
    /// keep theirs one by one. A filtered network is the container's own (its network
    /// namespace holds only loopback); the sandbox refuses [`NetworkAccess::Filtered`].
    Container,
}

/// How sandboxed commands may use the network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NetworkAccess {
    /// No network: no IP, netlink or vsock sockets, no `connect`/`bind`/`listen` on any
    /// socket, no Landlock TCP, no `io_uring`.
    #[default]
    Off,
    /// The host's network (no vsock, no `io_uring`).
    On,
    /// A private network namespace holding only the loopback interface: the one way off it is
    /// `127.0.0.1:`[`EGRESS_PORT`], where the sandbox's init listens and hands the listening
    /// socket to this process (`SandboxedChild::egress_listener`); the caller serves it (an
    /// egress proxy). IP sockets may be created, bound and connected inside the namespace
    /// (a command's own loopback servers work; nothing but loopback exists), netlink, packet,
    /// vsock and `io_uring` stay denied.
    Filtered,
}

impl NetworkAccess {
    /// Whether commands may create IP sockets and connect (on or filtered): such a sandbox
    /// gets the socket-free root that keeps host Unix sockets out of reach.
    pub fn connects(self) -> bool {
        match self {
            NetworkAccess::Off => false,
            NetworkAccess::On | NetworkAccess::Filtered => true,
        }
    }
}

/// The loopback port of a filtered sandbox's egress listener (`127.0.0.1`, inside its private
/// network namespace, so any fixed port is free there).
pub const EGRESS_PORT: u16 = 3128;

/// Resource limits of one command and its descendants. `None` leaves the limit as
/// inherited. Core dumps are always disabled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rlimits {
    /// Maximum number of processes in the sandbox. Enforced by `RLIMIT_NPROC` when Cordon
    /// runs as a regular user and by the PID namespace's `pid_max` when it runs as root (the
    /// kernel ignores `RLIMIT_NPROC` for uid 0). As root `pid_max` is this value + 300: once
    /// 300 pids have been handed out in the namespace the kernel allocates from 300 up, so the
    /// cap is exactly this value from then on, and up to 300 more before.
    pub processes: Option<u64>,
    /// Address-space size of each process, in bytes (`RLIMIT_AS`).
    pub memory_bytes: Option<u64>,
    /// Largest file a process may write, in bytes (`RLIMIT_FSIZE`).
    pub file_size_bytes: Option<u64>,
    /// Maximum number of open file descriptors per process (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
    /// CPU seconds per process (`RLIMIT_CPU`: SIGXCPU, then SIGKILL one second later).
    pub cpu_time_secs: Option<u64>,
}

/// One command to run inside a prepared sandbox.
#[derive(Debug)]
pub struct SpawnRequest {
    /// The program: a path containing `/`, or a name looked up in the sandbox's `PATH`.
    pub program: OsString,
    /// Arguments after `argv[0]` (which is `program` as given).
    pub args: Vec<OsString>,
    /// Working directory (absolute).
    pub cwd: PathBuf,
    /// Extra environment for this command only, on top of the sandbox environment.
    pub env: Vec<(OsString, OsString)>,
    /// Standard input; `None` means `/dev/null`.
    pub stdin: Option<OwnedFd>,
    /// Standard output; `None` means `/dev/null`.
    pub stdout: Option<OwnedFd>,
    /// Standard error; `None` means `/dev/null`. May be a duplicate of `stdout` to merge
    /// both streams.
    pub stderr: Option<OwnedFd>,
}

/// How the sandboxed command ended: the command's own status, never the helper init's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

    /// Whether the command exited with code 0.
    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(code) => write!(f, "exit code {code}"),
            ExitStatus::Signal(signal) => write!(f, "killed by signal {signal}"),
        }
    }
}

/// One independent protection the sandbox applies. A host may lack some; see
/// [`HostSupport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    /// seccomp BPF syscall filter (ptrace, mount, namespaces, keyring, BPF, io_uring and,
    /// with the network off, sockets). Required.
    Seccomp,
    /// Landlock filesystem rules with truncate control (ABI >= 3). Required.
    LandlockFilesystem,
    /// Landlock control of device ioctls (ABI >= 5). Used when available.
    LandlockIoctl,
    /// Landlock TCP bind/connect denial with the network off (ABI >= 4). Used when
    /// available; seccomp already denies every IP socket with the network off. Not used with
    /// the network filtered: its private namespace is the boundary.
    LandlockNetwork,
    /// Landlock scoping of signals and abstract Unix sockets to the sandbox (ABI >= 6).
    /// Used when available; the PID namespace and seccomp cover most of it.
    LandlockScopes,
    /// User namespace, needed to create the other namespaces when not running as root.
    UserNamespace,
    /// PID namespace with a helper init as PID 1: no descendant outlives the command, and a
    /// fresh `/proc` shows only the sandbox's processes. Required.
    PidNamespace,
    /// Mount namespace: protected paths, denied paths, private `/proc` and `/dev/shm`.
    /// Required.
    MountNamespace,
    /// A hard cap on the number of processes (see [`Rlimits::processes`]). Required when a
    /// process limit is configured.
    ProcessLimit,
    /// A private network namespace with only loopback, where the egress listener is the one
    /// way out. Required with the network filtered.
    NetworkNamespace,
}

impl Layer {
    /// Every layer, in reporting order.
    pub const ALL: [Layer; 10] = [
        Layer::LandlockFilesystem,
        Layer::LandlockIoctl,
        Layer::LandlockNetwork,
        Layer::LandlockScopes,
        Layer::Seccomp,
        Layer::UserNamespace,
        Layer::PidNamespace,
        Layer::MountNamespace,
        Layer::ProcessLimit,
        Layer::NetworkNamespace,
    ];

    /// Short stable name, e.g. `landlock-fs`.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Seccomp => "seccomp",
            Layer::LandlockFilesystem => "landlock-fs",
            Layer::LandlockIoctl => "landlock-ioctl",
            Layer::LandlockNetwork => "landlock-net",
            Layer::LandlockScopes => "landlock-scopes",
            Layer::UserNamespace => "user-namespace",
            Layer::PidNamespace => "pid-namespace",
            Layer::MountNamespace => "mount-namespace",
            Layer::ProcessLimit => "process-limit",
            Layer::NetworkNamespace => "network-namespace",
        }
    }

    /// What the layer needs from the kernel, for error messages and `cordon doctor`.
    pub fn requirement(self) -> &'static str {
        match self {
            Layer::Seccomp => "seccomp filter mode (CONFIG_SECCOMP_FILTER)",
            Layer::LandlockFilesystem => "Landlock ABI >= 3 (Linux 6.2)",
            Layer::LandlockIoctl => "Landlock ABI >= 5 (Linux 6.10)",
            Layer::LandlockNetwork => "Landlock ABI >= 4 (Linux 6.7)",
            Layer::LandlockScopes => "Landlock ABI >= 6 (Linux 6.12)",
            Layer::UserNamespace => "unprivileged user namespaces",
            Layer::PidNamespace => "PID namespaces",
            Layer::MountNamespace => "mount namespaces with open_tree/move_mount (Linux 5.12)",
            Layer::ProcessLimit => {
                "RLIMIT_NPROC (non-root) or a per-PID-namespace pid_max (root, Linux 6.14)"
            }
            Layer::NetworkNamespace => {
                "network namespaces (CONFIG_NET_NS), with a user namespace when not root"
            }
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the running kernel (and the privileges of this process) allow. Produced by
/// `probe()`; tests may build one by hand to simulate a weaker host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostSupport {
    /// Landlock ABI version, 0 when Landlock is unavailable.
    pub landlock_abi: u32,
    /// seccomp filters can be installed.
    pub seccomp: bool,
    /// A user namespace can be created (needed when not root).
    pub user_namespaces: bool,
    /// PID and mount namespaces can be created (with a user namespace when not root).
    pub pid_namespaces: bool,
    /// Mount namespaces can be created and the fd-based mount API works.
    pub mount_namespaces: bool,
    /// `pid_max` is per PID namespace (Linux >= 6.14), so it can cap a sandbox's processes.
    pub pid_max_per_namespace: bool,
    /// This process runs with effective uid 0.
    pub root: bool,
    /// A network namespace can be created (with a user namespace when not root) and its
    /// loopback interface brought up.
    pub network_namespaces: bool,
}

impl HostSupport {
    /// Whether the host can apply `layer`.
    pub fn supports(&self, layer: Layer) -> bool {
        match layer {
            Layer::Seccomp => self.seccomp,
            Layer::LandlockFilesystem => self.landlock_abi >= 3,
            Layer::LandlockIoctl => self.landlock_abi >= 5,
            Layer::LandlockNetwork => self.landlock_abi >= 4,
            Layer::LandlockScopes => self.landlock_abi >= 6,
            Layer::UserNamespace => self.root || self.user_namespaces,
            Layer::PidNamespace => self.namespaces(),
            Layer::MountNamespace => self.namespaces(),
            Layer::ProcessLimit => !self.root || (self.namespaces() && self.pid_max_per_namespace),
            Layer::NetworkNamespace => self.namespaces() && self.network_namespaces,
        }
    }

    /// Whether the PID + mount namespace pair (and a user namespace when not root) can be
    /// created. The sandbox uses both or neither.
    pub fn namespaces(&self) -> bool {
        self.pid_namespaces && self.mount_namespaces && (self.root || self.user_namespaces)
    }

    /// One line per layer for `cordon doctor`, e.g. `landlock-fs: ok (Landlock ABI 7)`.
    pub fn report_lines(&self) -> Vec<String> {
        Layer::ALL
            .iter()
            .map(|&layer| {
                let status = if self.supports(layer) {
                    "ok"
                } else {
                    "missing"
                };
                let detail = match layer {
                    Layer::LandlockFilesystem
                    | Layer::LandlockIoctl
                    | Layer::LandlockNetwork
                    | Layer::LandlockScopes => format!("Landlock ABI {}", self.landlock_abi),
                    Layer::UserNamespace if self.root => "not needed as root".to_owned(),
                    Layer::ProcessLimit if self.root => {
                        "root: per-namespace pid_max of the limit + 300".to_owned()
                    }
                    Layer::ProcessLimit => "RLIMIT_NPROC".to_owned(),
                    Layer::Seccomp
                    | Layer::UserNamespace
                    | Layer::PidNamespace
                    | Layer::MountNamespace
                    | Layer::NetworkNamespace => layer.requirement().to_owned(),
                };
                format!("{}: {status} ({detail})", layer.name())
            })
            .collect()
    }
}

/// Host locations a sandbox needs for everyday commands, computed by
/// `host_defaults()`: system directories, `/etc` minus secrets, toolchains in the home
/// directory minus credential files, and the matching environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostDefaults {
    /// Read + execute trees.
    pub read_exec: Vec<PathBuf>,
    /// Read-only trees.
    pub read: Vec<PathBuf>,
    /// Environment for the toolchains (`PATH`, `CARGO_HOME`, `RUSTUP_HOME`, `PYENV_ROOT`, …).
    pub env: Vec<(OsString, OsString)>,
    /// The secrets found while carving the trees above (e.g. `/etc/shadow`,
    /// `~/.cargo/credentials.toml`): never granted here, and worth denying explicitly when a
    /// broader rule (a policy's readable root) would cover them.
    pub denied: Vec<PathBuf>,
}

/// Whether a configuration needs a layer or merely uses it when the host has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Requirement {
    /// Missing it is an error unless `allow_degraded` is set.
    Required,
    /// Used when available; other layers cover most of what it adds.
    Optional,
}

impl SandboxConfig {
    /// The layers this configuration uses on a host like `support`, in [`Layer::ALL`] order:
    /// seccomp, Landlock filesystem rules, PID and mount namespaces are always required, a
    /// user namespace when not root, the process limit when one is configured, the network
    /// namespace with the network filtered; Landlock ioctl control, scopes (required with the
    /// network on) and (with the network off or filtered) TCP rules are optional.
    ///
    /// In the [`Profile::Container`] profile the container provides the namespaces and the
    /// process limit: only seccomp and the Landlock layers are listed (all but the
    /// filesystem rules and seccomp optional).
    pub fn layer_requirements(&self, support: &HostSupport) -> Vec<(Layer, Requirement)> {
        match self.profile {
            Profile::Host => self.host_layer_requirements(support),
            Profile::Container => Layer::ALL
                .iter()
                .filter_map(|&layer| {
                    let requirement = match layer {
                        Layer::Seccomp | Layer::LandlockFilesystem => Some(Requirement::Required),
                        // The container's network namespace holds the container's abstract
                        // sockets only, and its PID namespace the session's processes.
                        Layer::LandlockIoctl | Layer::LandlockScopes => Some(Requirement::Optional),
                        Layer::LandlockNetwork => match self.network {
                            NetworkAccess::Off => Some(Requirement::Optional),
                            NetworkAccess::Filtered | NetworkAccess::On => None,
                        },
                        // The container's own.
                        Layer::UserNamespace
                        | Layer::PidNamespace
                        | Layer::MountNamespace
                        | Layer::ProcessLimit
                        | Layer::NetworkNamespace => None,
                    };
                    requirement.map(|requirement| (layer, requirement))
                })
                .collect(),
        }
    }

    fn host_layer_requirements(&self, support: &HostSupport) -> Vec<(Layer, Requirement)> {
        Layer::ALL
            .iter()
            .filter_map(|&layer| {
                let requirement = match layer {
                    Layer::Seccomp
                    | Layer::LandlockFilesystem
                    | Layer::PidNamespace
                    | Layer::MountNamespace => Some(Requirement::Required),
                    Layer::UserNamespace => (!support.root).then_some(Requirement::Required),
                    Layer::ProcessLimit => self
                        .limits
                        .processes
                        .is_some()
                        .then_some(Requirement::Required),
                    Layer::LandlockIoctl => Some(Requirement::Optional),
                    // With the network on, the abstract-socket scope is what keeps the host's
                    // abstract Unix sockets out of reach (filtered: they live in another
                    // network namespace anyway).
                    Layer::LandlockScopes => Some(match self.network {
                        NetworkAccess::On => Requirement::Required,
                        NetworkAccess::Off | NetworkAccess::Filtered => Requirement::Optional,
                    }),
                    // Off: seccomp already denies every IP socket. Filtered: only loopback
                    // exists, and the egress listener is the one way off it.
                    Layer::LandlockNetwork => match self.network {
                        NetworkAccess::Off => Some(Requirement::Optional),
                        NetworkAccess::Filtered | NetworkAccess::On => None,
                    },
                    Layer::NetworkNamespace => match self.network {
                        NetworkAccess::Filtered => Some(Requirement::Required),
                        NetworkAccess::Off | NetworkAccess::On => None,
                    },
                };
                requirement.map(|requirement| (layer, requirement))
            })
            .collect()
    }

    /// The layers a sandbox prepared from this configuration on a host like `support` runs
    /// without: `Err` with the required ones when it cannot run at all (a required layer is
    /// missing and `allow_degraded` is off), else the missing layers, sorted (empty: the
    /// full sandbox). [`crate::PreparedSandbox`] decides with exactly this.
    pub fn missing_layers(&self, support: &HostSupport) -> Result<Vec<Layer>, Vec<Layer>> {
        let requirements = self.layer_requirements(support);
        let missing_required: Vec<Layer> = requirements
            .iter()
            .filter(|(layer, requirement)| {
                *requirement == Requirement::Required && !support.supports(*layer)
            })
            .map(|(layer, _)| *layer)
            .collect();
        if !missing_required.is_empty() && !self.allow_degraded {
            return Err(missing_required);
        }
        let mut missing: Vec<Layer> = requirements
            .iter()
            .map(|(layer, _)| *layer)
            .filter(|layer| !support.supports(*layer))
            .collect();
        missing.sort();
        missing.dedup();
        Ok(missing)
    }

    /// A configuration with the host defaults filled in (see [`HostDefaults`]); add the
    /// workspace to `write` and the protected and denied paths.
    pub fn with_defaults(defaults: HostDefaults) -> SandboxConfig {
        let HostDefaults {
            read_exec,
            read,
            env,
            denied,
        } = defaults;
        SandboxConfig {
            read_exec,
            read,
            env,
            denied,
            ..SandboxConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_code_is_shell_style() {
        assert_eq!(ExitStatus::Code(3).code(), 3);
        assert_eq!(ExitStatus::Signal(9).code(), 137);
        assert!(ExitStatus::Code(0).success());
        assert!(!ExitStatus::Signal(15).success());
    }

    fn full() -> HostSupport {
        HostSupport {
            landlock_abi: 7,
            seccomp: true,
            user_namespaces: true,
            pid_namespaces: true,
            mount_namespaces: true,
            pid_max_per_namespace: true,
            root: true,
            network_namespaces: true,
        }
    }

    #[test]
    fn landlock_layers_follow_the_abi() {
        let host = HostSupport {
            landlock_abi: 4,
            ..full()
        };
        assert!(host.supports(Layer::LandlockFilesystem));
        assert!(host.supports(Layer::LandlockNetwork));
        assert!(!host.supports(Layer::LandlockIoctl));
        assert!(!host.supports(Layer::LandlockScopes));
        let none = HostSupport {
            landlock_abi: 2,
            ..full()
        };
        assert!(!none.supports(Layer::LandlockFilesystem));
    }

    #[test]
    fn process_limit_as_root_needs_per_namespace_pid_max() {
        let old_kernel = HostSupport {
            pid_max_per_namespace: false,
            ..full()
        };
        assert!(!old_kernel.supports(Layer::ProcessLimit));
        let user = HostSupport {
            root: false,
            ..old_kernel
        };
        assert!(user.supports(Layer::ProcessLimit));
    }

    #[test]
    fn non_root_namespaces_need_a_user_namespace() {
        let host = HostSupport {
            root: false,
            user_namespaces: false,
            ..full()
        };
        assert!(!host.supports(Layer::PidNamespace));
        assert!(!host.supports(Layer::MountNamespace));
        assert!(!host.supports(Layer::UserNamespace));
    }

    #[test]
    fn requirements_follow_the_configuration() {
        let config = SandboxConfig {
            limits: Rlimits {
                processes: Some(10),
                ..Rlimits::default()
            },
            ..SandboxConfig::default()
        };
        assert_eq!(
            config.layer_requirements(&full()),
            vec![
                (Layer::LandlockFilesystem, Requirement::Required),
                (Layer::LandlockIoctl, Requirement::Optional),
                (Layer::LandlockNetwork, Requirement::Optional),
                (Layer::LandlockScopes, Requirement::Optional),
                (Layer::Seccomp, Requirement::Required),
                (Layer::PidNamespace, Requirement::Required),
                (Layer::MountNamespace, Requirement::Required),
                (Layer::ProcessLimit, Requirement::Required),
            ]
        );
        let user = HostSupport {
            root: false,
            ..full()
        };
        let networked = SandboxConfig {
            network: NetworkAccess::On,
            ..SandboxConfig::default()
        };
        let layers: Vec<Layer> = networked
            .layer_requirements(&user)
            .into_iter()
            .map(|(layer, _)| layer)
            .collect();
        assert!(layers.contains(&Layer::UserNamespace));
        assert!(!layers.contains(&Layer::LandlockNetwork));
        assert!(!layers.contains(&Layer::ProcessLimit));
        assert!(
            networked
                .layer_requirements(&user)
                .contains(&(Layer::LandlockScopes, Requirement::Required))
        );
    }

    #[test]
    fn the_network_needs_the_abstract_socket_scope() {
        let abi5 = HostSupport {
            landlock_abi: 5,
            ..full()
        };
        let networked = SandboxConfig {
            network: NetworkAccess::On,
            ..SandboxConfig::default()
        };
        assert_eq!(
            networked.missing_layers(&abi5),
            Err(vec![Layer::LandlockScopes])
        );
        assert_eq!(
            SandboxConfig::default().missing_layers(&abi5),
            Ok(vec![Layer::LandlockScopes])
        );
    }

    #[test]
    fn filtered_network_needs_a_network_namespace_but_not_the_scope() {
        let filtered = SandboxConfig {
            network: NetworkAccess::Filtered,
            ..SandboxConfig::default()
        };
        let requirements = filtered.layer_requirements(&full());
        assert!(requirements.contains(&(Layer::NetworkNamespace, Requirement::Required)));
        // The namespace is the boundary; Landlock's TCP rules would only break a command's
        // own loopback servers.
        assert!(
            !requirements
                .iter()
                .any(|(layer, _)| *layer == Layer::LandlockNetwork)
        );
        assert!(requirements.contains(&(Layer::LandlockScopes, Requirement::Optional)));
        let no_netns = HostSupport {
            network_namespaces: false,
            ..full()
        };
        assert_eq!(
            filtered.missing_layers(&no_netns),
            Err(vec![Layer::NetworkNamespace])
        );
        for network in [NetworkAccess::Off, NetworkAccess::On] {
            let config = SandboxConfig {
                network,
                ..SandboxConfig::default()
            };
            assert!(config.missing_layers(&no_netns).is_ok());
        }
    }

    #[test]
    fn the_container_profile_requires_seccomp_and_landlock_only() {
        let config = SandboxConfig {
            profile: Profile::Container,
            limits: Rlimits {
                processes: Some(10),
                ..Rlimits::default()
            },
            ..SandboxConfig::default()
        };
        let user = HostSupport {
            root: false,
            user_namespaces: false,
            pid_namespaces: false,
            mount_namespaces: false,
            network_namespaces: false,
            ..full()
        };
        assert_eq!(
            config.layer_requirements(&user),
            vec![
                (Layer::LandlockFilesystem, Requirement::Required),
                (Layer::LandlockIoctl, Requirement::Optional),
                (Layer::LandlockNetwork, Requirement::Optional),
                (Layer::LandlockScopes, Requirement::Optional),
                (Layer::Seccomp, Requirement::Required),
            ]
        );
        assert_eq!(config.missing_layers(&user), Ok(vec![]));
        let no_landlock = HostSupport {
            landlock_abi: 0,
            ..user
        };
        assert_eq!(
            config.missing_layers(&no_landlock),
            Err(vec![Layer::LandlockFilesystem])
        );
        let no_seccomp = HostSupport {
            seccomp: false,
            ..user
        };
        assert_eq!(
            config.missing_layers(&no_seccomp),
            Err(vec![Layer::Seccomp])
        );
        // The same host in the host profile lacks the namespaces.
        let host = SandboxConfig {
            profile: Profile::Host,
            ..config
        };
        assert_eq!(
            host.missing_layers(&user),
            Err(vec![
                Layer::UserNamespace,
                Layer::PidNamespace,
                Layer::MountNamespace
            ])
        );
    }

    #[test]
    fn report_has_one_line_per_layer() {
        let lines = full().report_lines();
        assert_eq!(lines.len(), Layer::ALL.len());
        assert_eq!(lines[0], "landlock-fs: ok (Landlock ABI 7)");
        assert!(lines.iter().all(|line| line.contains(": ok (")));
    }
}
