//! [`BashOperations`] over the session's workers (module `workers`): each command is one
//! request to a `cordon-remote` worker in the container, driven by
//! `cordon_remote::exec::drive`: streaming output, timeout and cancel killing the whole tree
//! inside the container (tagged descendants and output holders included), idle-grace drain, no
//! survivors. An OOM kill (the container's memory limit) is reported with a clear line in the
//! output.

use async_trait::async_trait;
use cordon_remote::exec::{DriveOutcome, DriveRequest, KILL_GRACE, drive, kill_argv, shell_status};
use cordon_remote::worker::ExecLine;
use cordon_tools::ops::{
    BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest, ExitStatus,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::client;
use crate::files::collect;
use crate::recovery::{Check, ENGINE_TIMEOUT, Moment, Replacement};
use crate::workers::Lease;

fn human_bytes(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes.div_ceil(MIB))
    }
}

impl Inner {
    /// Start a spare worker in the background when none is idle, so the next call finds one.
    pub(crate) fn keep_a_spare(&self) {
        if self.workers.wants_spare() {
            let workers = self.workers.clone();
            let docker = self.docker.clone();
            let container = self.container.clone();
            tokio::spawn(async move { workers.warm(&docker, &container).await });
        }
    }

    /// Last resort when the worker could not confirm the kill: sweep by tag and session.
    async fn kill_by_tag(&self, tag: &str, pid: Option<u32>, session: Option<u32>) {
        let argv = kill_argv(tag, pid, session, KILL_GRACE);
        if let Ok(exec) = client::start_exec(&self.docker, &self.container, argv, None).await {
            let _ = tokio::time::timeout(KILL_GRACE * 20, collect(exec.output)).await;
        }
    }

    /// Send `line` to a worker and drive the request. A pooled worker that died while idle
    /// (it never answered) is replaced by a fresh one once. When no worker can be started, or
    /// a fresh one ends without a word, the container is checked: a dead one is replaced
    /// (once per call) and the command runs in the new container. Returns the container
    /// generation the command ran on, and the replacement it needed, if any.
    async fn run_request(
        &self,
        line: &[u8],
        request: DriveRequest,
    ) -> Result<(DriveOutcome, Lease, u64, Option<Replacement>), ExecError> {
        let mut retried = false;
        let mut replaced = None;
        loop {
            let seen = self.recovery.generation();
            let mut lease = match self.workers.take(&self.docker, &self.container).await {
                Ok(lease) => lease,
                Err(reason) => {
                    if self.replace_before_running(seen, &mut replaced).await? {
                        continue;
                    }
                    return Err(ExecError::Backend { reason });
                }
            };
            let sent = lease.exec.input.write_all(line).await;
            if sent.is_err() && lease.pooled && !retried {
                retried = true;
                continue;
            }
            let outcome = drive(
                client::events_mut(&mut lease.exec.output),
                &mut lease.exec.input,
                request.clone(),
            )
            .await?;
            let stale = lease.pooled && outcome.unanswered() && !retried;
            if stale {
                retried = true;
                continue;
            }
            if !lease.pooled && outcome.unanswered() && replaced.is_none() {
                // A fresh worker that never answered: nothing ran; a dead container explains it.
                if self.replace_before_running(seen, &mut replaced).await? {
                    continue;
                }
            }
            return Ok((outcome, lease, seen, replaced));
        }
    }

    /// Nothing ran (no worker could be started, or a fresh one never answered): check the
    /// container. `true` when a new container was started for this command (kept in
    /// `replaced`); `false` when the container runs (or was replaced once already during
    /// this call); an error for the model when the engine is unreachable or the replacement
    /// failed.
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

#[async_trait]
impl BashOperations for Inner {
    fn backend_id(&self) -> &BackendId {
        &self.id
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
        if cancel.is_cancelled() {
            return Ok(ExecOutcome {
                status: None,
                termination: cordon_tools::ops::Termination::Cancelled,
                notes: Vec::new(),
            });
        }
        let ExecLine { tag, id, line } =
            ExecLine::new(command, cwd.clone(), env).map_err(|e| ExecError::Spawn {
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
            })?;
        let result = self
            .run_request(
                &line,
                DriveRequest {
                    timeout,
                    cancel,
                    output: output.clone(),
                    kill_grace: KILL_GRACE,
                    request_id: Some(id),
                },
            )
            .await;
        let (outcome, lease, seen, replaced_before) = match result {
            Ok(done) => done,
            Err(e) => {
                self.keep_a_spare();
                return Err(e);
            }
        };
        let exec_id = lease.exec.id.clone();
        let reusable = outcome.reusable;
        if reusable {
            self.workers.give_back(lease.exec);
        } else {
            // Closing stdin tells the worker to kill whatever is left.
            drop(lease);
        }
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
            });
        }
        self.keep_a_spare();
        if !outcome.clean {
            self.kill_by_tag(&tag, outcome.pid, outcome.session).await;
        }
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
            let _ = output.send(notice.into_bytes()).await;
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
        })
    }
}
