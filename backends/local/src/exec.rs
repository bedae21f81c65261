//! [`BashOperations`] of the local backend: `bash -c COMMAND` (or `sh -c`) inside the command
//! sandbox of `cordon-sandbox` (Landlock, seccomp, no capabilities, `no_new_privs`, rlimits,
//! PID + mount + IPC namespaces), stdin `/dev/null`, stdout and stderr on ONE pipe (so their
//! interleaving is kept), output streamed to the caller's channel as it arrives.
//!
//! Before each spawn the protected and denied patterns are expanded to the paths as they are
//! now ([`crate::expand`]) and handed to the sandbox, so a `.env` or `.git` that appeared
//! since the last command is masked or read-only for this one.
//!
//! Ending a command: on timeout or cancel the whole sandbox gets SIGTERM (its init forwards it
//! to every process), then SIGKILL after [`KILL_GRACE`] (killing the init tears down the PID
//! namespace). When the main process exits by itself, the init kills every process left in
//! the namespace, whatever its session or process group, so nothing outlives the call and the
//! output pipe closes. The pipe is still drained with an idle grace ([`DRAIN_IDLE`], capped
//! at [`DRAIN_CAP`]) for the degraded mode without namespaces, where descendants that left
//! the process group are out of reach.
//!
//! A layer the host lacks fails every command with an error naming it, unless the spec
//! allows a degraded sandbox; [`missing_layers`] then names what is not in force.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cordon_core::sandbox::SandboxSpec;
use cordon_ops::denial::{DenialLayout, PathEntry};
use cordon_ops::{
    BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest, ExitStatus, FsError,
    Termination,
};
use cordon_sandbox::{
    ExitStatus as SandboxExit, HostSupport, Layer, PreparedSandbox, SandboxError, SandboxedChild,
    SetupStep, SpawnRequest, TreeSignaller,
};
use nix::fcntl::OFlag;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::backend::Shared;
use crate::egress::CommandEgress;
use crate::roots::{Access, Verdict};

/// Time between SIGTERM and SIGKILL when a command is stopped.
pub(crate) const KILL_GRACE: Duration = Duration::from_secs(1);
/// After the main process exited: stop waiting for output once the pipe was idle this long.
pub(crate) const DRAIN_IDLE: Duration = Duration::from_millis(100);
/// After the main process exited: stop waiting for output after this long in any case.
pub(crate) const DRAIN_CAP: Duration = Duration::from_secs(2);
/// Read size from the output pipe.
const CHUNK: usize = 256 * 1024;
/// Capacity asked for the output pipe (the default 64 KiB makes a chatty command and the
/// reader switch every 64 KiB); the kernel caps it at `/proc/sys/fs/pipe-max-size`, and a
/// refusal keeps the default.
const PIPE_CAPACITY: i32 = 1 << 20;
/// A protected/denied expansion that looked at no more entries than this last time (one
/// `lstat` per cached directory) runs on the async worker, like small file reads do.
const INLINE_EXPANSION_ENTRIES: usize = 512;
/// `PATH` used to find the shell when the host has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The output pipe of a command (read end, write end), enlarged to [`PIPE_CAPACITY`] when
/// the kernel allows it.
fn output_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    // Past the per-user pipe quota the kernel refuses; the default size still works.
    let _ = nix::fcntl::fcntl(
        &write_end,
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_CAPACITY),
    );
    Ok((read_end, write_end))
}

/// The command sandbox of a backend: prepared once, or the reason it could not be.
#[derive(Debug)]
pub(crate) enum CommandSandbox {
    /// Ready (possibly degraded, when the spec allows it).
    Ready(Arc<PreparedSandbox>),
    /// Not available; every command fails with this error (fail closed).
    Unavailable {
        /// The layer (or step) that failed, e.g. `landlock-fs`.
        layer: &'static str,
        /// The sandbox's message.
        reason: String,
    },
}

impl CommandSandbox {
    /// Prepare the sandbox for a host supporting `support` (this host's probe, or a subset
    /// a test simulates), keeping a failure as the error every command will get.
    pub(crate) fn prepare(
        config: cordon_sandbox::SandboxConfig,
        support: HostSupport,
    ) -> CommandSandbox {
        match PreparedSandbox::prepare_with_support(config, support) {
            Ok(sandbox) => CommandSandbox::Ready(Arc::new(sandbox)),
            Err(error) => CommandSandbox::Unavailable {
                layer: layer_of(&error),
                reason: error.to_string(),
            },
        }
    }
}

/// The sandbox layer an error is about, for [`ExecError::Sandbox`].
pub(crate) fn layer_of(error: &SandboxError) -> &'static str {
    match error {
        SandboxError::MissingLayers { layers } => layers.first().map_or("sandbox", |l| l.name()),
        SandboxError::Unsupported => "sandbox",
        SandboxError::LandlockRuleset { .. } | SandboxError::LandlockRule { .. } => {
            Layer::LandlockFilesystem.name()
        }
        SandboxError::EgressListener { .. } => Layer::NetworkNamespace.name(),
        SandboxError::SeccompBuild { .. } => Layer::Seccomp.name(),
        SandboxError::RelativePath { .. }
        | SandboxError::OpenPath { .. }
        | SandboxError::SessionDir { .. }
        | SandboxError::ProtectedPath { .. }
        | SandboxError::CarveTooLarge { .. }
        | SandboxError::Placeholder { .. } => "filesystem",
        SandboxError::ProgramNotFound { .. }
        | SandboxError::CommandTooLarge { .. }
        | SandboxError::NulByte { .. }
        | SandboxError::Pipe { .. }
        | SandboxError::DevNull { .. }
        | SandboxError::Wait { .. }
        | SandboxError::Signal { .. }
        | SandboxError::UnsupportedSignal { .. }
        | SandboxError::Warden { .. } => "process",
        SandboxError::Clone { .. } => Layer::PidNamespace.name(),
        SandboxError::ChildSetup { step, .. } => match step {
            SetupStep::MapUsers => Layer::UserNamespace.name(),
            SetupStep::MakeMountsPrivate
            | SetupStep::ReadOnlyRoot
            | SetupStep::BindWritable
            | SetupStep::MountProc
            | SetupStep::PinPath
            | SetupStep::ProtectPath
            | SetupStep::MaskPath
            | SetupStep::MountShm
            | SetupStep::BuildRoot => Layer::MountNamespace.name(),
            SetupStep::SetPidMax => Layer::ProcessLimit.name(),
            SetupStep::DropCapabilities | SetupStep::VerifyCapabilities => "capabilities",
            SetupStep::NoNewPrivs => "no_new_privs",
            SetupStep::Landlock => Layer::LandlockFilesystem.name(),
            SetupStep::Seccomp => Layer::Seccomp.name(),
            SetupStep::SetRlimit => "rlimits",
            SetupStep::EgressListener => Layer::NetworkNamespace.name(),
            SetupStep::ResetSignals
            | SetupStep::HideInit
            | SetupStep::ForkCommand
            | SetupStep::NewSession
            | SetupStep::ChangeDirectory
            | SetupStep::RedirectStdio
            | SetupStep::CloseFds
            | SetupStep::Exec => "process",
        },
    }
}

/// The shell: `bash` from the usual places or `PATH`, else `/bin/sh`.
pub(crate) fn find_shell() -> PathBuf {
    let path_dirs = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    ["/bin/bash", "/usr/bin/bash"]
        .iter()
        .map(PathBuf::from)
        .chain(std::env::split_paths(&path_dirs).map(|dir| dir.join("bash")))
        .find(|candidate| is_executable(candidate))
        .unwrap_or_else(|| PathBuf::from("/bin/sh"))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// [`BashOperations`] on this host.
#[derive(Debug)]
pub(crate) struct LocalBash {
    shared: Arc<Shared>,
}

impl LocalBash {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        LocalBash { shared }
    }

    /// The canonical working directory, confined like a file operation.
    fn resolve_cwd(&self, cwd: &Path) -> Result<PathBuf, ExecError> {
        let missing = || ExecError::MissingCwd {
            cwd: cwd.to_path_buf(),
        };
        let absolute = self.shared.absolute(cwd);
        match self
            .shared
            .roots
            .open(&absolute, OFlag::O_PATH | OFlag::O_DIRECTORY, "open")
        {
            Ok(opened) => {
                let canonical = crate::roots::fd_path(std::os::fd::AsFd::as_fd(&opened.fd))
                    .map_err(|_| missing())?;
                match self.shared.verdict(&canonical) {
                    Verdict::Denied => Err(ExecError::Sandbox {
                        layer: "filesystem",
                        reason: format!("working directory {} is denied by policy", cwd.display()),
                    }),
                    Verdict::Protected | Verdict::Free => Ok(canonical),
                }
            }
            Err(FsError::OutsideRoot { .. }) => Err(ExecError::Sandbox {
                layer: "filesystem",
                reason: format!(
                    "working directory {} is outside the allowed roots",
                    cwd.display()
                ),
            }),
            Err(_) => Err(missing()),
        }
    }
}

/// Everything one spawn needs, moved to a blocking thread.
struct Launch {
    shared: Arc<Shared>,
    sandbox: Arc<PreparedSandbox>,
    command: String,
    cwd: PathBuf,
    env: Vec<(String, String)>,
    output: OwnedFd,
}

/// Bring the protected/denied paths up to date, then start the shell in the sandbox. Runs on
/// a blocking thread: the walk reads directories and the spawn waits for the sandbox's setup.
fn launch(launch: Launch) -> Result<SandboxedChild, ExecError> {
    let Launch {
        shared,
        sandbox,
        command,
        cwd,
        env,
        output,
    } = launch;
    {
        let mut expander = shared.expander();
        let expansion = expander.expand().map_err(|error| ExecError::Sandbox {
            layer: "filesystem",
            reason: error.to_string(),
        })?;
        sandbox
            .set_protected_and_denied(&expansion.protected, &expansion.denied)
            .map_err(|error| sandbox_error(&error))?;
    }
    let stderr = output
        .try_clone()
        .map_err(|source| ExecError::Spawn { source })?;
    sandbox
        .spawn(SpawnRequest {
            program: shared.shell.clone().into_os_string(),
            args: vec!["-c".into(), command.into()],
            cwd,
            env: env
                .into_iter()
                .map(|(name, value)| (name.into(), value.into()))
                .collect(),
            stdin: None,
            stdout: Some(output),
            stderr: Some(stderr),
        })
        .map_err(|error| sandbox_error(&error))
}

/// A sandbox error as the bash tool reports it.
fn sandbox_error(error: &SandboxError) -> ExecError {
    match error {
        SandboxError::ProgramNotFound { .. } => ExecError::Spawn {
            source: io::Error::new(io::ErrorKind::NotFound, error.to_string()),
        },
        SandboxError::CommandTooLarge { .. } | SandboxError::NulByte { .. } => ExecError::Spawn {
            source: io::Error::new(io::ErrorKind::InvalidInput, error.to_string()),
        },
        SandboxError::ChildSetup {
            step: SetupStep::Exec,
            source,
            ..
        } => ExecError::Spawn {
            source: io::Error::new(source.kind(), error.to_string()),
        },
        other => ExecError::Sandbox {
            layer: layer_of(other),
            reason: other.to_string(),
        },
    }
}

fn exit_status(status: SandboxExit) -> ExitStatus {
    match status {
        SandboxExit::Code(code) => ExitStatus::Code(code),
        SandboxExit::Signal(signal) => ExitStatus::Signal(signal),
    }
}

#[async_trait]
impl BashOperations for LocalBash {
    fn backend_id(&self) -> &BackendId {
        &self.shared.id
    }

    async fn exec(
        &self,
        request: ExecRequest,
        cancel: CancellationToken,
        output: mpsc::Sender<Vec<u8>>,
    ) -> Result<ExecOutcome, ExecError> {
        let ExecRequest {
            call_id,
            command,
            cwd,
            timeout,
            env,
        } = request;
        let sandbox = match self.shared.sandbox() {
            CommandSandbox::Ready(sandbox) => Arc::clone(sandbox),
            CommandSandbox::Unavailable { layer, reason } => {
                // Fail closed: no command runs outside the sandbox the spec asks for.
                return Err(ExecError::Sandbox {
                    layer,
                    reason: reason.clone(),
                });
            }
        };
        if cancel.is_cancelled() {
            return Ok(ExecOutcome {
                status: None,
                termination: Termination::Cancelled,
                notes: Vec::new(),
                egress: Vec::new(),
            });
        }
        if let Some(reason) = self.shared.git_failure() {
            return Err(ExecError::Sandbox {
                layer: "filesystem",
                reason,
            });
        }
        let cwd = self.resolve_cwd(&cwd)?;
        let running = Running::start(&self.shared);
        let (read_end, write_end) = output_pipe().map_err(|source| ExecError::Spawn { source })?;
        let reader = pipe::Receiver::from_owned_fd(read_end)
            .map_err(|source| ExecError::Spawn { source })?;
        let job = Launch {
            shared: Arc::clone(&self.shared),
            sandbox,
            command,
            cwd,
            env,
            output: write_end,
        };
        // The hop to a blocking thread costs about as much as the work itself when the walk
        // is small and an idle init only has to take the command: then run it right here.
        let quick = job.sandbox.has_idle_init()
            && self.shared.expander().was_small(INLINE_EXPANSION_ENTRIES);
        let mut child = if quick {
            launch(job)?
        } else {
            tokio::task::spawn_blocking(move || launch(job))
                .await
                .map_err(|join| ExecError::Spawn {
                    source: io::Error::other(join.to_string()),
                })??
        };
        let signaller = child.signaller().map_err(|error| sandbox_error(&error))?;
        let mut egress = match (&self.shared.egress, child.egress_listener()) {
            (Some(egress), Ok(Some(listener))) => Some(egress.command(listener, call_id).map_err(
                |source| ExecError::Sandbox {
                    layer: Layer::NetworkNamespace.name(),
                    reason: format!("failed to serve the command's egress listener: {source}"),
                },
            )?),
            (None, Ok(None)) => None,
            // A filtered sandbox always has a listener and only a filtered one does.
            (Some(_), Ok(None)) | (None, Ok(Some(_))) => {
                return Err(ExecError::Sandbox {
                    layer: Layer::NetworkNamespace.name(),
                    reason: "the command's sandbox does not match the network mode".to_owned(),
                });
            }
            (_, Err(error)) => return Err(sandbox_error(&error)),
        };
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
        let outcome = supervise(Supervised {
            child: &mut child,
            signaller: &signaller,
            reader,
            deadline,
            cancel: &cancel,
            output: &output,
            egress: egress.as_mut(),
        })
        .await;
        // Whatever is left (degraded mode: a group member still draining) does not outlive
        // the call; dropping the child kills the tree too, also when this future is dropped.
        let _ = signaller.kill_tree();
        let unaccepted = child.unaccepted_connections();
        drop(child);
        let egress = match egress {
            Some(egress) => egress.finish(unaccepted).await,
            None => Vec::new(),
        };
        // Every process of the command is gone (the init killed and reaped them before it
        // reported the status, or died with its namespace): nothing can add git metadata
        // after this sweep but another command, whose own sweep follows it.
        let note = if self.shared.git_sweep_is_small(INLINE_EXPANSION_ENTRIES) {
            self.shared.sweep_git()
        } else {
            let shared = Arc::clone(&self.shared);
            tokio::task::spawn_blocking(move || shared.sweep_git())
                .await
                .unwrap_or_else(|join| {
                    Some(format!(
                        "Cordon could not finish checking for git metadata: {join}"
                    ))
                })
        };
        drop(running);
        let mut outcome = outcome;
        outcome.notes.extend(note);
        outcome.egress = egress;
        Ok(outcome)
    }

    fn denial_layout(&self) -> Option<&dyn DenialLayout> {
        Some(&*self.shared)
    }
}

/// Commands see the host's paths (the sandbox's mount namespace keeps them), so a path in an
/// error message is resolved like a file operation's: confined to the roots, without
/// following a symlink out of them, and with `O_PATH` (no FIFO blocks); nothing inside a
/// denied directory is looked at ([`crate::roots::Roots::resolve_outside_denied`]).
impl DenialLayout for Shared {
    fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    fn classify(&self, path: &Path) -> Option<PathEntry> {
        // Nothing inside a denied directory is looked at, so whether a note comes and what
        // it says never depends on what is in there.
        let canonical = self.roots.resolve_outside_denied(path, &self.rules)?;
        if let Some(entry) = self.rules.entry_of(&canonical) {
            return Some(entry);
        }
        if self.rules.judge(&canonical) != Verdict::Free {
            // Restricted, but by no policy entry (the host's secrets): nothing to name.
            return None;
        }
        let (root, _) = self.roots.select_canonical(&canonical)?;
        match root.access {
            Access::ReadOnly => Some(PathEntry::ReadOnly),
            Access::ReadWrite => None,
        }
    }

    /// The mode bits as the sandbox's user (without capabilities) meets them.
    fn mode_allows_write(&self, path: &Path) -> bool {
        let Some(canonical) = self.roots.resolve_outside_denied(path, &self.rules) else {
            return true;
        };
        for candidate in canonical.ancestors() {
            match self
                .roots
                .open_canonical(candidate, OFlag::O_PATH | OFlag::O_NOFOLLOW, "resolve")
            {
                Ok(opened) => {
                    return nix::sys::stat::fstat(opened.fd.as_fd())
                        .is_ok_and(|stat| self.ident.can_write(&stat));
                }
                Err(FsError::NotFound { .. }) => {}
                Err(_) => return false,
            }
        }
        false
    }
}

/// Counts a running command in [`Shared::running`] until dropped (also when the call's
/// future is dropped).
struct Running<'a> {
    shared: &'a Shared,
}

impl<'a> Running<'a> {
    fn start(shared: &'a Shared) -> Self {
        shared
            .running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Running { shared }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.shared
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The running command being watched.
struct Supervised<'a> {
    child: &'a mut SandboxedChild,
    signaller: &'a TreeSignaller,
    reader: pipe::Receiver,
    deadline: Instant,
    cancel: &'a CancellationToken,
    output: &'a mpsc::Sender<Vec<u8>>,
    /// With the network filtered: the command's egress listener and connections, served
    /// while it runs (and not a moment longer: its init may serve the next command).
    egress: Option<&'a mut CommandEgress>,
}

/// Forward output, enforce the timeout and cancellation, and wait for the main process and
/// the drained pipe.
async fn supervise(run: Supervised<'_>) -> ExecOutcome {
    let Supervised {
        child,
        signaller,
        mut reader,
        deadline,
        cancel,
        output,
        mut egress,
    } = run;
    // Reserved, not zeroed: a command that prints little touches only the pages it fills.
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut termination = Termination::Exited;
    // None: still running; Some(status): exited (status None if it could not be learned).
    let mut exited: Option<Option<ExitStatus>> = None;
    let mut exited_at: Option<Instant> = None;
    let mut idle_until = Instant::now();
    let mut kill_at: Option<Instant> = None;
    let mut pipe_open = true;
    let mut pending: Option<Vec<u8>> = None;
    let mut listener = true;
    let far = deadline.max(Instant::now()) + Duration::from_secs(365 * 24 * 3600);

    let wait = child.wait();
    tokio::pin!(wait);
    loop {
        if exited.is_some() && !pipe_open && pending.is_none() {
            break;
        }
        let running = exited.is_none();
        let stopping = termination != Termination::Exited;
        let drain_deadline = exited_at.map(|at| idle_until.min(at + DRAIN_CAP));
        tokio::select! {
            _ = cancel.cancelled(), if running && !stopping => {
                termination = Termination::Cancelled;
                // A tree that is already gone is fine; the kill below follows after the grace.
                let _ = signaller.signal_tree(libc_sigterm());
                kill_at = Some(Instant::now() + KILL_GRACE);
            }
            _ = sleep_until(deadline), if running && !stopping => {
                termination = Termination::TimedOut;
                // A tree that is already gone is fine; the kill below follows after the grace.
                let _ = signaller.signal_tree(libc_sigterm());
                kill_at = Some(Instant::now() + KILL_GRACE);
            }
            _ = sleep_until(kill_at.unwrap_or(far)), if running && kill_at.is_some() => {
                // ESRCH: the tree is gone, which is the goal.
                let _ = signaller.kill_tree();
                kill_at = None;
            }
            status = &mut wait, if running => {
                exited = Some(status.ok().map(exit_status));
                let now = Instant::now();
                exited_at = Some(now);
                idle_until = now + DRAIN_IDLE;
            }
            read = reader.read_buf(&mut buf), if pipe_open && pending.is_none() => {
                match read {
                    Ok(0) => pipe_open = false,
                    Ok(n) => {
                        if exited_at.is_some() {
                            idle_until = Instant::now() + DRAIN_IDLE;
                        }
                        if listener {
                            pending = Some(buf[..n].to_vec());
                        }
                        buf.clear();
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => pipe_open = false,
                }
            }
            permit = output.reserve(), if pending.is_some() => {
                match permit {
                    Ok(permit) => permit.send(pending.take().unwrap_or_default()),
                    Err(_) => {
                        // Nobody listens any more: keep draining so the command is not blocked.
                        listener = false;
                        pending = None;
                    }
                }
            }
            () = egress_step(&mut egress), if running => {}
            _ = cancel.cancelled(), if !running => break,
            _ = sleep_until(drain_deadline.unwrap_or(far)), if drain_deadline.is_some() => {
                // On a busy machine this task can wake up late, with the deadline passed and
                // output still unread in the pipe (or not yet forwarded): that output was
                // written before the deadline, so it is kept.
                if listener {
                    let mut tail = pending.take().unwrap_or_default();
                    if pipe_open {
                        read_ready(&reader, &mut tail, PIPE_CAPACITY as usize);
                    }
                    if !tail.is_empty() {
                        // The receiver is gone only when the caller stopped reading.
                        let _ = output.send(tail).await;
                    }
                }
                break;
            }
        }
    }
    ExecOutcome {
        status: exited.flatten(),
        termination,
        notes: Vec::new(),
        egress: Vec::new(),
    }
}

/// The next step of the command's egress (never ends without one).
async fn egress_step(egress: &mut Option<&mut CommandEgress>) {
    match egress {
        Some(egress) => egress.step().await,
        None => std::future::pending().await,
    }
}

/// Append what `reader` holds right now to `into`, without waiting, up to `limit` bytes. (A
/// plain non-blocking read: tokio's `try_read` answers from readiness it has seen, not from
/// the pipe.)
fn read_ready(reader: &pipe::Receiver, into: &mut Vec<u8>, limit: usize) {
    use std::os::fd::AsFd;
    let mut chunk = vec![0u8; CHUNK];
    while into.len() < limit {
        match nix::unistd::read(reader.as_fd(), &mut chunk) {
            Ok(0) => break,
            Ok(n) => into.extend_from_slice(&chunk[..n]),
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }
}

/// SIGTERM (a constant, spelled through nix so this crate needs no libc).
fn libc_sigterm() -> i32 {
    nix::sys::signal::Signal::SIGTERM as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_pipe_is_enlarged_up_to_the_kernel_limit() {
        let (_read, write) = output_pipe().unwrap();
        let size = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
        let max: i32 = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(size, PIPE_CAPACITY.min(max).max(64 * 1024));
    }

    #[tokio::test]
    async fn output_already_in_the_pipe_is_read_without_waiting() {
        let (read_end, write_end) = output_pipe().unwrap();
        nix::unistd::write(&write_end, b"written before the deadline\n").unwrap();
        let reader = pipe::Receiver::from_owned_fd(read_end).unwrap();
        let mut tail = b"pending, ".to_vec();
        read_ready(&reader, &mut tail, 1 << 20);
        assert_eq!(tail, b"pending, written before the deadline\n");
        // The write end is still open and nothing is left: it returns at once.
        read_ready(&reader, &mut tail, 1 << 20);
        assert_eq!(tail.len(), 37);
        // Never more than the limit (give or take one read).
        nix::unistd::write(&write_end, &[b'x'; 1000]).unwrap();
        read_ready(&reader, &mut tail, 10);
        assert_eq!(tail.len(), 37);
    }

    #[test]
    fn missing_layers_name_the_first_one() {
        let error = SandboxError::MissingLayers {
            layers: vec![Layer::LandlockFilesystem, Layer::PidNamespace],
        };
        assert_eq!(layer_of(&error), "landlock-fs");
        match sandbox_error(&error) {
            ExecError::Sandbox { layer, reason } => {
                assert_eq!(layer, "landlock-fs");
                assert!(reason.contains("allow_degraded"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let error = SandboxError::ChildSetup {
            step: SetupStep::Exec,
            path: Some(PathBuf::from("/bin/bash")),
            source: io::Error::from_raw_os_error(2),
        };
        match sandbox_error(&error) {
            ExecError::Spawn { source } => assert_eq!(source.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
        let mount = SandboxError::ChildSetup {
            step: SetupStep::ProtectPath,
            path: Some(PathBuf::from("/w/.git")),
            source: io::Error::from_raw_os_error(1),
        };
        assert_eq!(layer_of(&mount), "mount-namespace");
    }
}
