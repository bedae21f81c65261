//! [`BashOperations`] over the connection's workers (module `workers`): each command is one
//! request to a `cordon-remote` worker, driven by `cordon_remote::exec::drive`: streaming merged
//! output, timeout and cancel killing the whole remote tree (SIGTERM, grace, SIGKILL;
//! setsid/nohup escapees found by their tag or by the output they hold), idle-grace drain, no
//! survivors. A dropped connection fails the call with a clear error; the worker, seeing its
//! stdin close, kills the tree on the remote side, and a sweep over a fresh connection makes
//! sure of it.
//!
//! Fail closed: the remote host cannot enforce the policy's sandbox for commands in this phase
//! (no network cut, no limits, no filesystem confinement), so commands are refused unless the
//! operator accepted that with `allow_degraded` (`--allow-degraded`).

use async_trait::async_trait;
use cordon_remote::exec::{
    DriveOutcome, DriveRequest, KILL_GRACE, TransportEvent, drive, kill_argv,
};
use cordon_remote::worker::ExecLine;
use cordon_tools::ops::{
    BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest, Termination,
};
use futures::Stream;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::remote::{RemoteExec, StdinEnd, run_collect};
use crate::workers::Lease;

/// The sandbox layer the SSH backend cannot provide for commands.
pub(crate) const REMOTE_SANDBOX_LAYER: &str = "remote-sandbox";

fn event_stream(
    exec: &mut RemoteExec,
) -> impl Stream<Item = Result<TransportEvent, String>> + Unpin + '_ {
    Box::pin(futures::stream::unfold(exec, |exec| async move {
        exec.next().await.map(|event| (event, exec))
    }))
}

impl Inner {
    /// The environment of a command: passed host variables, fixed ones, then the request's.
    fn command_env(&self, extra: Vec<(String, String)>) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .spec
            .env
            .pass
            .iter()
            .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
            .collect();
        env.extend(self.spec.env.set.iter().cloned());
        env.extend(extra);
        env
    }

    /// Last resort when the worker could not confirm the kill: sweep by tag and session.
    async fn kill_by_tag(&self, tag: &str, pid: Option<u32>, session: Option<u32>) {
        let argv = kill_argv(tag, pid, session, KILL_GRACE);
        let sweep = run_collect(&self.pool, &argv, None, StdinEnd::AfterInput);
        let _ = tokio::time::timeout(KILL_GRACE * 20, sweep).await;
    }

    /// Start a spare worker in the background when none is idle (off the calls' path).
    pub(crate) fn keep_a_spare(&self) {
        if self.workers.wants_spare() {
            let inner = self.this();
            tokio::spawn(async move { inner.workers.warm(&inner.pool).await });
        }
    }

    /// Why commands are refused without `allow_degraded`.
    fn refusal(&self) -> ExecError {
        ExecError::Sandbox {
            layer: REMOTE_SANDBOX_LAYER,
            reason: format!(
                "the SSH backend cannot confine commands on {}: the remote host enforces none \
                 of the policy's command sandbox in this phase (network off, resource limits, \
                 filesystem confinement); pass --allow-degraded (allow_degraded in the sandbox \
                 spec) to run commands there with the remote account's own rights. File tools \
                 stay confined to the remote roots either way",
                self.pool.label()
            ),
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
                .take(&self.pool)
                .await
                .map_err(|reason| ExecError::Backend { reason })?;
            let mut control = lease.exec.stdin();
            let sent = control.write_all(line).await;
            if sent.is_err() && lease.pooled && !retried {
                retried = true;
                continue;
            }
            let outcome = drive(event_stream(&mut lease.exec), control, request.clone()).await?;
            let stale = lease.pooled && outcome.unanswered() && !retried;
            if stale {
                // The idle worker was gone before it read the request: nothing ran.
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
        if !self.spec.allow_degraded {
            return Err(self.refusal());
        }
        if cancel.is_cancelled() {
            return Ok(ExecOutcome {
                status: None,
                termination: Termination::Cancelled,
                notes: Vec::new(),
            });
        }
        let ExecLine { tag, id, line } = ExecLine::new(command, cwd.clone(), self.command_env(env))
            .map_err(|e| ExecError::Spawn {
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
            })?;
        let result = self
            .run_request(
                &line,
                DriveRequest {
                    timeout,
                    cancel,
                    output,
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
        let Lease { exec, .. } = lease;
        let lost = outcome.transport_error.is_some() || exec.live.is_closed();
        if lost {
            self.pool.invalidate(&exec.live).await;
        }
        let not_started = (!exec.started()).then(|| exec.not_started_reason());
        if outcome.reusable && !lost {
            self.workers.give_back(exec);
        } else {
            // Closing the channel tells the worker to kill whatever is left.
            drop(exec);
        }
        self.keep_a_spare();
        if !outcome.clean {
            self.kill_by_tag(&tag, outcome.pid, outcome.session).await;
        }
        if outcome.missing_cwd {
            return Err(ExecError::MissingCwd { cwd });
        }
        if outcome.status.is_none() {
            if lost {
                return Err(ExecError::Backend {
                    reason: format!(
                        "the SSH connection to {} was lost while the command ran{}; its remote \
                         processes were killed. The connection is re-established on the next \
                         call: run the command again",
                        self.pool.label(),
                        outcome
                            .transport_error
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    ),
                });
            }
            if let Some(reason) = not_started {
                return Err(ExecError::Backend { reason });
            }
        }
        Ok(ExecOutcome {
            status: outcome.status,
            termination: outcome.termination,
            notes: Vec::new(),
        })
    }
}
