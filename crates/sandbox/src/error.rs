//! The crate's error type: one variant per failing step, carrying the path involved.

use std::io;
use std::path::PathBuf;

use crate::config::Layer;

/// Why preparing the sandbox, spawning a command or managing it failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The local sandbox exists only on Linux.
    #[error("failed to prepare the sandbox: the local sandbox needs Linux")]
    Unsupported,
    /// The kernel lacks layers the configuration needs and `allow_degraded` is off.
    #[error(
        "failed to prepare the sandbox: this host lacks {}; set allow_degraded to accept a weaker sandbox",
        describe_layers(.layers)
    )]
    MissingLayers {
        /// The missing layers.
        layers: Vec<Layer>,
    },
    /// A configured or requested path is not absolute.
    #[error("failed to use sandbox path {path}: it must be absolute")]
    RelativePath {
        /// The offending path.
        path: PathBuf,
    },
    /// A configured root could not be opened.
    #[error("failed to open sandbox path {path}: {source}")]
    OpenPath {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The per-session directory (TMPDIR, HOME, masks) could not be created.
    #[error("failed to create the sandbox session directory {path}: {source}")]
    SessionDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The Landlock ruleset could not be created.
    #[error("failed to create the Landlock ruleset: {source}")]
    LandlockRuleset {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A Landlock rule could not be added.
    #[error("failed to add a Landlock rule for {path}: {source}")]
    LandlockRule {
        /// The path of the rule.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The egress listener a filtered sandbox's init opened did not reach this process.
    #[error("failed to receive the egress listener from the sandbox init: {source}")]
    EgressListener {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The seccomp program could not be built.
    #[error("failed to build the seccomp filter: {reason}")]
    SeccompBuild {
        /// What went wrong.
        reason: &'static str,
    },
    /// The program is not an executable file in the sandbox's `PATH`.
    #[error("failed to find program {program} in the sandbox PATH")]
    ProgramNotFound {
        /// The program name as requested.
        program: PathBuf,
    },
    /// A program name, argument, path or environment entry contains a NUL byte.
    #[error("failed to pass the {what} to the command: it contains a NUL byte")]
    NulByte {
        /// Which input.
        what: &'static str,
    },
    /// A protected or denied path cannot be pinned safely (e.g. it is a symlink).
    #[error("failed to protect {path}: {reason}")]
    ProtectedPath {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
    /// Too many entries in the directories above protected or denied paths to carve the
    /// Landlock rules around them (the container profile, without a mount namespace).
    #[error(
        "failed to confine the command around protected and denied paths: the directories above them (at {path}) hold more than {limit} entries; narrow the protect/deny globs or move those paths into a smaller directory"
    )]
    CarveTooLarge {
        /// The directory being listed when the bound was hit.
        path: PathBuf,
        /// The bound.
        limit: usize,
    },
    /// The placeholder for a missing protected path could not be created or locked.
    #[error("failed to create the placeholder {path} for a missing protected path: {source}")]
    Placeholder {
        /// The placeholder path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The command (program, arguments, environment) is too large to hand to the sandbox.
    #[error(
        "failed to pass the command to the sandbox: it exceeds {limit} bytes or {strings} arguments and environment entries"
    )]
    CommandTooLarge {
        /// Byte limit.
        limit: usize,
        /// Limit on arguments plus environment entries.
        strings: usize,
    },
    /// A pipe for talking to the child could not be created.
    #[error("failed to create a pipe for the sandboxed child: {source}")]
    Pipe {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `/dev/null` could not be opened for a standard stream.
    #[error("failed to open /dev/null for a standard stream: {source}")]
    DevNull {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The sandboxed child could not be created.
    #[error("failed to create the sandboxed child process: {source}")]
    Clone {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The container profile's warden (the process that kills running commands' groups if
    /// this one dies) could not be started or told about a command; the command was killed.
    #[error(
        "the warden of command process groups failed (commands are refused without it): {source}"
    )]
    Warden {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A setup step inside the new child failed; nothing was executed.
    #[error("failed to {step}{} in the sandboxed child: {source}", describe_path(.path))]
    ChildSetup {
        /// The step.
        step: SetupStep,
        /// The path the step worked on, when there is one.
        path: Option<PathBuf>,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Waiting for the command failed.
    #[error("failed to wait for the sandboxed command: {source}")]
    Wait {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Signalling the process tree failed.
    #[error("failed to signal the sandboxed process tree: {source}")]
    Signal {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The sandbox init forwards only a fixed set of signals.
    #[error(
        "failed to signal the sandboxed process tree: signal {signal} is not forwarded (use HUP, INT, QUIT, USR1, USR2, ALRM, TERM, CONT, WINCH, or kill_tree for KILL)"
    )]
    UnsupportedSignal {
        /// The signal.
        signal: i32,
    },
}

fn describe_layers(layers: &[Layer]) -> String {
    layers
        .iter()
        .map(|layer| format!("{} ({})", layer.name(), layer.requirement()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_path(path: &Option<PathBuf>) -> String {
    match path {
        Some(path) => format!(" {}", path.display()),
        None => String::new(),
    }
}

/// A step of the child's setup between `clone` and `execve`, reported by number over a pipe
/// when it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetupStep {
    /// Reset signal dispositions and mask.
    ResetSignals,
    /// Make the init undumpable (no ptrace, root-owned `/proc/1`).
    HideInit,
    /// Write the user namespace's uid/gid maps.
    MapUsers,
    /// Make every mount private to the new namespace.
    MakeMountsPrivate,
    /// Make every mount read-only.
    ReadOnlyRoot,
    /// Bind a writable root writable again.
    BindWritable,
    /// Mount a fresh `/proc`.
    MountProc,
    /// Set the PID namespace's `pid_max`.
    SetPidMax,
    /// Bind-mount a path onto itself (pinning it against rename and removal).
    PinPath,
    /// Bind-mount a protected path read-only.
    ProtectPath,
    /// Mask a denied path.
    MaskPath,
    /// Mount the private `/dev/shm`.
    MountShm,
    /// Fork the command from the init.
    ForkCommand,
    /// Start a new session.
    NewSession,
    /// Set a resource limit.
    SetRlimit,
    /// Change to the working directory.
    ChangeDirectory,
    /// Redirect the standard streams.
    RedirectStdio,
    /// Close inherited file descriptors.
    CloseFds,
    /// Drop every capability.
    DropCapabilities,
    /// Verify no capability is left.
    VerifyCapabilities,
    /// Set `no_new_privs`.
    NoNewPrivs,
    /// Enforce the Landlock ruleset.
    Landlock,
    /// Install the seccomp filter.
    Seccomp,
    /// Execute the program.
    Exec,
    /// Build the socket-free root of a networked sandbox and pivot into it.
    BuildRoot,
    /// Bring up loopback in the private network namespace of a filtered sandbox, listen on
    /// the egress port and hand the listener over.
    EgressListener,
}

// The wire numbering is only used by the Linux child.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
impl SetupStep {
    /// Every step, indexed by its wire number.
    pub(crate) const ALL: [SetupStep; 26] = [
        SetupStep::ResetSignals,
        SetupStep::HideInit,
        SetupStep::MapUsers,
        SetupStep::MakeMountsPrivate,
        SetupStep::ReadOnlyRoot,
        SetupStep::BindWritable,
        SetupStep::MountProc,
        SetupStep::SetPidMax,
        SetupStep::PinPath,
        SetupStep::ProtectPath,
        SetupStep::MaskPath,
        SetupStep::MountShm,
        SetupStep::ForkCommand,
        SetupStep::NewSession,
        SetupStep::SetRlimit,
        SetupStep::ChangeDirectory,
        SetupStep::RedirectStdio,
        SetupStep::CloseFds,
        SetupStep::DropCapabilities,
        SetupStep::VerifyCapabilities,
        SetupStep::NoNewPrivs,
        SetupStep::Landlock,
        SetupStep::Seccomp,
        SetupStep::Exec,
        SetupStep::BuildRoot,
        SetupStep::EgressListener,
    ];

    /// The wire number of this step.
    pub(crate) fn number(self) -> u32 {
        match self {
            SetupStep::ResetSignals => 0,
            SetupStep::HideInit => 1,
            SetupStep::MapUsers => 2,
            SetupStep::MakeMountsPrivate => 3,
            SetupStep::ReadOnlyRoot => 4,
            SetupStep::BindWritable => 5,
            SetupStep::MountProc => 6,
            SetupStep::SetPidMax => 7,
            SetupStep::PinPath => 8,
            SetupStep::ProtectPath => 9,
            SetupStep::MaskPath => 10,
            SetupStep::MountShm => 11,
            SetupStep::ForkCommand => 12,
            SetupStep::NewSession => 13,
            SetupStep::SetRlimit => 14,
            SetupStep::ChangeDirectory => 15,
            SetupStep::RedirectStdio => 16,
            SetupStep::CloseFds => 17,
            SetupStep::DropCapabilities => 18,
            SetupStep::VerifyCapabilities => 19,
            SetupStep::NoNewPrivs => 20,
            SetupStep::Landlock => 21,
            SetupStep::Seccomp => 22,
            SetupStep::Exec => 23,
            SetupStep::BuildRoot => 24,
            SetupStep::EgressListener => 25,
        }
    }

    /// The step with this wire number.
    pub(crate) fn from_number(number: u32) -> Option<SetupStep> {
        SetupStep::ALL.get(number as usize).copied()
    }
}

impl std::fmt::Display for SetupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SetupStep::ResetSignals => "reset signal handlers",
            SetupStep::HideInit => "make the sandbox init undumpable",
            SetupStep::MapUsers => "write the user namespace maps",
            SetupStep::MakeMountsPrivate => "make mounts private",
            SetupStep::ReadOnlyRoot => "make every mount read-only",
            SetupStep::BindWritable => "bind writable the root",
            SetupStep::MountProc => "mount a fresh /proc",
            SetupStep::SetPidMax => "set the PID namespace's pid_max",
            SetupStep::PinPath => "pin directory",
            SetupStep::ProtectPath => "bind read-only the protected path",
            SetupStep::MaskPath => "mask the denied path",
            SetupStep::MountShm => "mount a private /dev/shm",
            SetupStep::ForkCommand => "fork the command",
            SetupStep::NewSession => "start a new session",
            SetupStep::SetRlimit => "set a resource limit",
            SetupStep::ChangeDirectory => "change to the working directory",
            SetupStep::RedirectStdio => "redirect the standard streams",
            SetupStep::CloseFds => "close inherited file descriptors",
            SetupStep::DropCapabilities => "drop capabilities",
            SetupStep::VerifyCapabilities => "verify that no capability is left",
            SetupStep::NoNewPrivs => "set no_new_privs",
            SetupStep::Landlock => "enforce the Landlock ruleset",
            SetupStep::Seccomp => "install the seccomp filter",
            SetupStep::Exec => "execute the program",
            SetupStep::BuildRoot => "build the sandbox root",
            SetupStep::EgressListener => "open the egress listener on loopback",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_numbers_round_trip() {
        for (index, step) in SetupStep::ALL.iter().enumerate() {
            assert_eq!(step.number() as usize, index);
            assert_eq!(SetupStep::from_number(step.number()), Some(*step));
        }
        assert_eq!(SetupStep::from_number(99), None);
    }

    #[test]
    fn missing_layers_message_names_each_layer() {
        let error = SandboxError::MissingLayers {
            layers: vec![Layer::LandlockFilesystem, Layer::PidNamespace],
        };
        assert_eq!(
            error.to_string(),
            "failed to prepare the sandbox: this host lacks landlock-fs (Landlock ABI >= 3 (Linux 6.2)), pid-namespace (PID namespaces); set allow_degraded to accept a weaker sandbox"
        );
    }

    #[test]
    fn child_setup_message_names_step_and_path() {
        let error = SandboxError::ChildSetup {
            step: SetupStep::ProtectPath,
            path: Some(PathBuf::from("/w/.git")),
            source: io::Error::from_raw_os_error(2),
        };
        assert!(error.to_string().starts_with(
            "failed to bind read-only the protected path /w/.git in the sandboxed child: "
        ));
    }
}
