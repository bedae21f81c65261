//! [`BashOperations`] of the local backend: `bash -c COMMAND` (or `sh -c`) in its own process
//! group, stdin `/dev/null`, stdout and stderr on ONE pipe (so their interleaving is kept),
//! an environment built from scratch, output streamed to the caller's channel as it arrives.
//!
//! Ending a command: on timeout or cancel the whole group gets SIGTERM, then SIGKILL after
//! [`KILL_GRACE`]. After the main process exits the pipe is drained until it closes, or until
//! it has been idle for [`DRAIN_IDLE`] (re-armed by every chunk, capped at [`DRAIN_CAP`]) so a
//! background child holding the pipe cannot hang the call; then whatever is left of the group
//! is killed. Descendants that left the group (`setsid`) are out of reach here: containing
//! them needs the PID namespace of the command sandbox.
//!
//! The spawn itself is one small function, [`spawn_shell`], which the command sandbox
//! (`cordon-sandbox`: Landlock, seccomp, rlimits) wraps. Until it does, [`missing_layers`]
//! names what is not in force, and commands only run when the spec allows a degraded sandbox.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cordon_core::sandbox::SandboxSpec;
use cordon_tools::ops::{
    BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest, ExitStatus, FsError,
    Termination,
};
use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::backend::Shared;
use crate::roots::Verdict;

/// Time between SIGTERM and SIGKILL when a command is stopped.
pub(crate) const KILL_GRACE: Duration = Duration::from_secs(1);
/// After the main process exited: stop waiting for output once the pipe was idle this long.
pub(crate) const DRAIN_IDLE: Duration = Duration::from_millis(100);
/// After the main process exited: stop waiting for output after this long in any case.
pub(crate) const DRAIN_CAP: Duration = Duration::from_secs(2);
/// Read size from the output pipe.
const CHUNK: usize = 64 * 1024;
/// `PATH` for commands when the host has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The sandbox layers [`spawn_shell`] does not apply yet (the command sandbox adds them).
const UNAPPLIED_LAYERS: &[&str] = &["landlock", "seccomp", "no_new_privs", "rlimits"];

/// The layers not in force for commands, as reported by `Backend::missing_layers`: non-empty
/// only when the spec allows a degraded sandbox (otherwise commands are refused).
pub(crate) fn missing_layers(spec: &SandboxSpec) -> Vec<String> {
    if spec.allow_degraded {
        UNAPPLIED_LAYERS.iter().map(|l| l.to_string()).collect()
    } else {
        Vec::new()
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

/// Everything needed to start one command. Plain data: the command sandbox wraps this step.
#[derive(Debug)]
pub(crate) struct ShellLaunch<'a> {
    /// The shell binary.
    pub shell: &'a Path,
    /// The script for `-c`.
    pub command: &'a str,
    /// Working directory (canonical, inside an allowed root).
    pub cwd: &'a Path,
    /// The complete environment.
    pub env: &'a BTreeMap<OsString, OsString>,
    /// Write end of the output pipe, used for both stdout and stderr.
    pub output: OwnedFd,
}

/// Start the shell in its own process group with stdin `/dev/null` and stdout + stderr on the
/// output pipe. This is the single place where a command process is created.
pub(crate) fn spawn_shell(launch: ShellLaunch<'_>) -> io::Result<tokio::process::Child> {
    let ShellLaunch {
        shell,
        command,
        cwd,
        env,
        output,
    } = launch;
    let stderr = output.try_clone()?;
    let mut cmd = tokio::process::Command::new(shell);
    cmd.arg("-c")
        .arg(command)
        .current_dir(cwd)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::from(output))
        .stderr(Stdio::from(stderr))
        .process_group(0);
    cmd.spawn()
}

/// The inputs of a command's environment besides the host's variables.
pub(crate) struct EnvLayers<'a> {
    /// `env.pass` and `env.set`.
    pub spec: &'a SandboxSpec,
    /// `HOME`.
    pub home: Option<&'a Path>,
    /// `TMPDIR`.
    pub tmp: &'a Path,
    /// The request's own variables (applied last).
    pub request: &'a [(String, String)],
}

/// Build a command's environment: the baseline (`PATH`, `HOME`, `LANG`, `TERM`, `TMPDIR`),
/// then host variables named in `spec.env.pass`, then `spec.env.set`, then the request's.
/// `host` looks up the host's variables.
pub(crate) fn build_env(
    layers: EnvLayers<'_>,
    host: impl Fn(&str) -> Option<OsString>,
) -> BTreeMap<OsString, OsString> {
    let EnvLayers {
        spec,
        home,
        tmp,
        request: request_env,
    } = layers;
    let mut env: BTreeMap<OsString, OsString> = BTreeMap::new();
    let mut set = |key: &str, value: OsString| {
        env.insert(OsString::from(key), value);
    };
    set("PATH", host("PATH").unwrap_or_else(|| DEFAULT_PATH.into()));
    set(
        "HOME",
        home.map(|h| h.as_os_str().to_os_string())
            .unwrap_or_else(|| "/".into()),
    );
    set("LANG", host("LANG").unwrap_or_else(|| "C.UTF-8".into()));
    // Output goes to a model, not a terminal: ask programs for plain text.
    set("TERM", "dumb".into());
    set("TMPDIR", tmp.as_os_str().to_os_string());
    for name in &spec.env.pass {
        if let Some(value) = host(name) {
            set(name, value);
        }
    }
    for (name, value) in &spec.env.set {
        set(name, value.into());
    }
    for (name, value) in request_env {
        set(name, value.into());
    }
    env
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

/// Kills the process group if the exec future is dropped before it finished.
struct GroupGuard {
    pgid: Pid,
    armed: bool,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}

fn exit_status(status: std::process::ExitStatus) -> Option<ExitStatus> {
    status
        .code()
        .map(ExitStatus::Code)
        .or_else(|| status.signal().map(ExitStatus::Signal))
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
            command,
            cwd,
            timeout,
            env,
        } = request;
        if !self.shared.spec.allow_degraded {
            // Fail closed: no command runs without the OS sandbox unless the operator said so.
            return Err(ExecError::Sandbox {
                layer: UNAPPLIED_LAYERS[0],
                reason: format!(
                    "the local backend cannot yet confine commands ({} not applied); \
                     set allow_degraded in the sandbox spec to run them unconfined",
                    UNAPPLIED_LAYERS.join(", ")
                ),
            });
        }
        if cancel.is_cancelled() {
            return Ok(ExecOutcome {
                status: None,
                termination: Termination::Cancelled,
            });
        }
        let cwd = self.resolve_cwd(&cwd)?;
        let layers = EnvLayers {
            spec: &self.shared.spec,
            home: self.shared.home.as_deref(),
            tmp: self.shared.state.tmp.path(),
            request: &env,
        };
        let env = build_env(layers, |name| std::env::var_os(name));
        let (read_end, write_end) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| ExecError::Spawn {
                source: io::Error::from(e),
            })?;
        let spawned = spawn_shell(ShellLaunch {
            shell: &self.shared.shell,
            command: &command,
            cwd: &cwd,
            env: &env,
            output: write_end
                .try_clone()
                .map_err(|source| ExecError::Spawn { source })?,
        });
        let spawned = match spawned {
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && self.shared.shell != Path::new("/bin/sh") =>
            {
                spawn_shell(ShellLaunch {
                    shell: Path::new("/bin/sh"),
                    command: &command,
                    cwd: &cwd,
                    env: &env,
                    output: write_end,
                })
            }
            other => {
                drop(write_end);
                other
            }
        };
        let mut child = spawned.map_err(|source| ExecError::Spawn { source })?;
        let reader = pipe::Receiver::from_owned_fd(read_end)
            .map_err(|source| ExecError::Spawn { source })?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| ExecError::Spawn {
                source: io::Error::other("the shell exited before its pid was known"),
            })?;
        let mut guard = GroupGuard {
            pgid: Pid::from_raw(pid),
            armed: true,
        };
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
        let outcome = supervise(Supervised {
            child: &mut child,
            reader,
            pgid: guard.pgid,
            deadline,
            cancel: &cancel,
            output: &output,
        })
        .await;
        // Whatever is left of the group (background jobs) does not outlive the call.
        let _ = killpg(guard.pgid, Signal::SIGKILL);
        guard.armed = false;
        Ok(outcome)
    }
}

/// The running command being watched.
struct Supervised<'a> {
    child: &'a mut tokio::process::Child,
    reader: pipe::Receiver,
    pgid: Pid,
    deadline: Instant,
    cancel: &'a CancellationToken,
    output: &'a mpsc::Sender<Vec<u8>>,
}

/// Forward output, enforce the timeout and cancellation, and wait for the main process and
/// the drained pipe.
async fn supervise(run: Supervised<'_>) -> ExecOutcome {
    let Supervised {
        child,
        mut reader,
        pgid,
        deadline,
        cancel,
        output,
    } = run;
    let mut buf = vec![0u8; CHUNK];
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

    let stop = |signal: Signal| {
        let _ = killpg(pgid, signal);
    };

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
                stop(Signal::SIGTERM);
                kill_at = Some(Instant::now() + KILL_GRACE);
            }
            _ = sleep_until(deadline), if running && !stopping => {
                termination = Termination::TimedOut;
                stop(Signal::SIGTERM);
                kill_at = Some(Instant::now() + KILL_GRACE);
            }
            _ = sleep_until(kill_at.unwrap_or(far)), if running && kill_at.is_some() => {
                stop(Signal::SIGKILL);
                kill_at = None;
            }
            status = child.wait(), if running => {
                exited = Some(status.ok().and_then(exit_status));
                let now = Instant::now();
                exited_at = Some(now);
                idle_until = now + DRAIN_IDLE;
            }
            read = reader.read(&mut buf), if pipe_open && pending.is_none() => {
                match read {
                    Ok(0) => pipe_open = false,
                    Ok(n) => {
                        if exited_at.is_some() {
                            idle_until = Instant::now() + DRAIN_IDLE;
                        }
                        if listener {
                            pending = Some(buf[..n].to_vec());
                        }
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
            _ = cancel.cancelled(), if !running => break,
            _ = sleep_until(drain_deadline.unwrap_or(far)), if drain_deadline.is_some() => break,
        }
    }
    ExecOutcome {
        status: exited.flatten(),
        termination,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_core::sandbox::EnvSpec;

    #[test]
    fn env_is_built_from_scratch_in_layers() {
        let spec = SandboxSpec {
            env: EnvSpec {
                pass: vec!["CARGO_HOME".into(), "ABSENT".into()],
                set: vec![
                    ("RUST_LOG".into(), "debug".into()),
                    ("TERM".into(), "xterm".into()),
                ],
            },
            ..SandboxSpec::default()
        };
        let host = |name: &str| match name {
            "PATH" => Some(OsString::from("/host/bin")),
            "CARGO_HOME" => Some(OsString::from("/host/cargo")),
            "SECRET" => Some(OsString::from("hunter2")),
            _ => None,
        };
        let request = [("RUST_LOG".to_string(), "trace".to_string())];
        let layers = EnvLayers {
            spec: &spec,
            home: Some(Path::new("/home/me")),
            tmp: Path::new("/tmp/cordon-0/tmp-1-ab"),
            request: &request,
        };
        let env = build_env(layers, host);
        let expected: BTreeMap<OsString, OsString> = [
            ("CARGO_HOME", "/host/cargo"),
            ("HOME", "/home/me"),
            ("LANG", "C.UTF-8"),
            ("PATH", "/host/bin"),
            ("RUST_LOG", "trace"),
            ("TERM", "xterm"),
            ("TMPDIR", "/tmp/cordon-0/tmp-1-ab"),
        ]
        .into_iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect();
        assert_eq!(env, expected);
    }

    #[test]
    fn missing_layers_only_reported_when_degraded_is_allowed() {
        assert!(missing_layers(&SandboxSpec::default()).is_empty());
        let degraded = SandboxSpec {
            allow_degraded: true,
            ..SandboxSpec::default()
        };
        assert_eq!(
            missing_layers(&degraded),
            vec!["landlock", "seccomp", "no_new_privs", "rlimits"]
        );
    }
}
