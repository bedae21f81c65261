//! Commands (`cordon_remote::runner::RemoteBash` over this [`CommandHost`]) through the session's workers (a `cordon_remote::runner::Runner` on the
//! Docker transport of module `client`): each command is one request to a `cordon-remote`
//! worker in the container, driven by `cordon_remote::exec::drive`: streaming output, timeout and cancel killing the whole tree
//! inside the container (tagged descendants and output holders included), idle-grace drain, no
//! survivors. An OOM kill (the container's memory limit) is reported with a clear line in the
//! output.

use std::path::Path;

use cordon_core::sandbox::SandboxSpec;
use cordon_ops::denial::{self, DenialLayout, PathEntry};
use cordon_ops::{BackendId, ExecError, ExecOutcome, ExitStatus};
use cordon_remote::exec::{DriveOutcome, DriveRequest, shell_status};
use cordon_remote::runner::{Attempt, Command, CommandHost, Lease};

use crate::Inner;
use crate::client::Exec;
use crate::recovery::{Check, ENGINE_TIMEOUT, Moment, Replacement};

fn human_bytes(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes.div_ceil(MIB))
    }
}

/// A command that ran: what the driver saw, its worker, the container generation it ran on
/// and the replacement it needed before it could run, if any.
struct Ran {
    outcome: DriveOutcome,
    exec: Exec,
    seen: u64,
    replaced: Option<Replacement>,
}

impl Inner {
    /// Run the command `line` on a worker. When no worker can be started, or a fresh one
    /// ends without a word, nothing ran: the container is checked, and a dead one is replaced
    /// (once per call) and the command runs in the new container.
    async fn run_request(&self, line: &[u8], request: &DriveRequest) -> Result<Ran, ExecError> {
        let mut replaced = None;
        loop {
            let seen = self.recovery.generation();
            match self.runner.run(line, request).await? {
                Attempt::NoWorker(reason) => {
                    if self.replace_before_running(seen, &mut replaced).await? {
                        continue;
                    }
                    return Err(ExecError::Backend { reason });
                }
                Attempt::Ran {
                    outcome,
                    lease: Lease { process, pooled },
                } => {
                    // A fresh worker that never answered: a dead container explains it.
                    if !pooled
                        && outcome.unanswered()
                        && self.replace_before_running(seen, &mut replaced).await?
                    {
                        continue;
                    }
                    return Ok(Ran {
                        outcome,
                        exec: process,
                        seen,
                        replaced,
                    });
                }
            }
        }
    }

    /// Nothing ran: check the container. `true` when a new container was started for this
    /// command (kept in `replaced`); `false` when the container runs (or was replaced once
    /// already during this call); an error for the model when the engine is unreachable or
    /// the replacement failed.
    async fn replace_before_running(
        &self,
        seen: u64,
        replaced: &mut Option<Replacement>,
    ) -> Result<bool, ExecError> {
        if replaced.is_some() {
            return Ok(false);
        }
        match self.check_container(seen).await {
            Check::Replaced(replacement) => {
                *replaced = Some(replacement);
                Ok(true)
            }
            Check::Alive => Ok(false),
            Check::Unreachable(text) | Check::Failed(text) => {
                Err(ExecError::Backend { reason: text })
            }
        }
    }
}

impl CommandHost for Inner {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    /// In filtered network mode a forwarder must run first (a new one when it ended: no
    /// command runs without its way out being the proxy's), and the outcome carries the
    /// attempts made while the command ran (module `egress`).
    async fn run(&self, command: Command) -> Result<ExecOutcome, ExecError> {
        let Some(egress) = &self.egress else {
            return self.run_command(command).await;
        };
        egress
            .ensure_forwarder(&self.docker, &self.container, self.recovery.generation())
            .await
            .map_err(|e| ExecError::Backend {
                reason: e.to_string(),
            })?;
        let ticket = egress.begin(crate::egress::Runner::Shell);
        let ran = self.run_command(command).await;
        let attempts = egress.finish(ticket).await;
        ran.map(|outcome| ExecOutcome {
            egress: attempts,
            ..outcome
        })
    }

    fn denial_layout(&self) -> Option<&dyn DenialLayout> {
        Some(self)
    }
}

impl Inner {
    /// A dead container is replaced (before the command when nothing ran, after it when the
    /// command died with it) and the notes say so; an OOM kill gets a line in the output.
    async fn run_command(&self, command: Command) -> Result<ExecOutcome, ExecError> {
        let Command {
            line,
            request,
            cwd,
            output,
        } = command;
        let Ran {
            outcome,
            exec,
            seen,
            replaced: replaced_before,
        } = match self.run_request(&line.line, &request).await {
            Ok(ran) => ran,
            Err(e) => {
                self.runner.keep_a_spare();
                return Err(e);
            }
        };
        let exec_id = exec.id.clone();
        let reusable = outcome.reusable;
        // Closing the stdin of a worker that is not kept tells it to kill whatever is left.
        self.runner.release(exec, reusable);
        let mut status = outcome.status;
        if status.is_none()
            && let Ok(Ok(inspect)) =
                tokio::time::timeout(ENGINE_TIMEOUT, self.docker.inspect_exec(&exec_id)).await
            && inspect.running == Some(false)
            && let Some(code) = inspect.exit_code
        {
            // The worker itself ended (e.g. killed by the OOM killer) before reporting.
            status = Some(shell_status(code as i32));
        }
        // A worker that did not finish cleanly, or a SIGKILL, may mean the container died.
        let died = if !reusable || status.map(ExitStatus::code) == Some(137) {
            match self.check_container(seen).await {
                Check::Replaced(replacement) => Some(replacement),
                Check::Alive => None,
                Check::Unreachable(text) | Check::Failed(text) => {
                    return Err(ExecError::Backend { reason: text });
                }
            }
        } else {
            None
        };
        // What happened to the container comes first among the notes.
        let mut notes: Vec<String> = replaced_before
            .map(|replacement| replacement.notice(Moment::BeforeThisCall))
            .into_iter()
            .collect();
        if let Some(replacement) = died {
            // Nothing of the command survives its container; the new one has a spare worker.
            notes.push(replacement.notice(Moment::DuringThisCall));
            notes.extend(self.sweep_git().await);
            return Ok(ExecOutcome {
                status,
                termination: outcome.termination,
                notes,
                egress: Vec::new(),
            });
        }
        self.runner.settle(&line.tag, &outcome).await;
        if outcome.missing_cwd {
            return Err(ExecError::MissingCwd { cwd });
        }
        if outcome.oom {
            let limit = self
                .memory_limit
                .map(|m| format!(" of {}", human_bytes(m)))
                .unwrap_or_default();
            let notice = format!(
                "\n[cordon: the command was killed by the out-of-memory killer: the sandbox memory limit{limit} was exceeded]\n"
            );
            // The receiver is gone only when the caller stopped reading the output.
            let _ = output.send(notice.into_bytes()).await;
            // The worker read it from the container's cgroup: the kernel's word, explained.
            notes.extend(
                self.spec
                    .limits
                    .memory_bytes
                    .and_then(|limit| denial::memory_note(limit, &self.spec.sources)),
            );
        }
        if let Some(reason) = outcome.transport_error
            && status.is_none()
        {
            return Err(ExecError::Backend { reason });
        }
        // Processes a command left in the background can still add metadata after this
        // sweep; the next command's sweep or the one after the container is removed finds it.
        notes.extend(self.sweep_git().await);
        Ok(ExecOutcome {
            status,
            termination: outcome.termination,
            notes,
            egress: Vec::new(),
        })
    }
}

/// Paths in messages are container paths, judged lexically (the container's symlinks are not
/// resolved from here): a path the rules restrict, or one on the read-only root file system
/// (every path outside the writable roots but the container's own `/tmp`, home and kernel
/// file systems).
impl DenialLayout for Inner {
    fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    fn classify(&self, path: &Path) -> Option<PathEntry> {
        if let Some(entry) = self.rules.entry_of(path) {
            return Some(entry);
        }
        match self.rules.in_writable_root(path) {
            Some(true) => None,
            Some(false) => Some(PathEntry::ReadOnly),
            None => {
                let own = [
                    Path::new("/tmp"),
                    &self.home,
                    Path::new("/dev"),
                    Path::new("/proc"),
                    Path::new("/sys"),
                ];
                (!own.iter().any(|dir| path.starts_with(dir))).then_some(PathEntry::ReadOnly)
            }
        }
    }
}
