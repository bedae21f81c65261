//! [`BashOperations`] over the session's workers (module `workers`): each command is one
//! request to a `cordon-remote` worker in the container, driven by
//! `cordon_remote::exec::drive`: streaming output, timeout and cancel killing the whole tree
//! inside the container (tagged descendants and output holders included), idle-grace drain, no
//! survivors. An OOM kill (the container's memory limit) is reported with a clear line in the
//! output.

use async_trait::async_trait;
use cordon_remote::exec::{DriveOutcome, DriveRequest, KILL_GRACE, drive, kill_argv, shell_status};
use cordon_remote::worker::ExecLine;
use cordon_tools::ops::{BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::client;
use crate::files::collect;
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
    /// (it never answered) is replaced by a fresh one once.
    async fn run_request(
        &self,
        line: &[u8],
        request: DriveRequest,
    ) -> Result<(DriveOutcome, Lease), ExecError> {
        let mut retried = false;
        loop {
            let mut lease = self
                .workers
                .take(&self.docker, &self.container)
                .await
                .map_err(|reason| ExecError::Backend { reason })?;
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
            return Ok((outcome, lease));
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
        let (outcome, lease) = match result {
            Ok(done) => done,
            Err(e) => {
                self.keep_a_spare();
                return Err(e);
            }
        };
        let exec_id = lease.exec.id.clone();
        if outcome.reusable {
            self.workers.give_back(lease.exec);
        } else {
            // Closing stdin tells the worker to kill whatever is left.
            drop(lease);
        }
        self.keep_a_spare();
        if !outcome.clean {
            self.kill_by_tag(&tag, outcome.pid, outcome.session).await;
        }
        if outcome.missing_cwd {
            return Err(ExecError::MissingCwd { cwd });
        }
        let mut status = outcome.status;
        if status.is_none()
            && let Ok(inspect) = self.docker.inspect_exec(&exec_id).await
            && inspect.running == Some(false)
            && let Some(code) = inspect.exit_code
        {
            // The worker itself ended (e.g. killed by the OOM killer) before reporting.
            status = Some(shell_status(code as i32));
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
        Ok(ExecOutcome {
            status,
            termination: outcome.termination,
            notes: self.sweep_git().await.into_iter().collect(),
        })
    }
}
