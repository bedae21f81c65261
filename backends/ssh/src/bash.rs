//! [`BashOperations`] over an exec channel running the `cordon-remote` wrapper, driven by
//! `cordon_remote::exec::drive`: streaming merged output, timeout and cancel killing the whole
//! remote tree (SIGTERM, grace, SIGKILL; setsid/nohup escapees found by their tag), idle-grace
//! drain, no survivors. A dropped connection fails the call with a clear error; the wrapper,
//! seeing its stdin close, kills the tree on the remote side, and a tag sweep over a fresh
//! connection makes sure of it.

use async_trait::async_trait;
use cordon_remote::exec::{
    DriveRequest, KILL_GRACE, TransportEvent, WrapperRequest, drive, kill_argv, new_tag,
    wrapper_argv,
};
use cordon_tools::ops::{
    BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest, Termination,
};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::remote::{RemoteExec, run_collect};

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

    /// Last resort when the wrapper could not confirm the kill: sweep by tag.
    async fn kill_by_tag(&self, tag: &str, pid: Option<u32>) {
        let argv = kill_argv(tag, pid, KILL_GRACE);
        let _ = tokio::time::timeout(KILL_GRACE * 20, run_collect(&self.pool, &argv, None)).await;
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
                termination: Termination::Cancelled,
            });
        }
        let tag = new_tag();
        let env = self.command_env(env);
        let argv = wrapper_argv(&WrapperRequest {
            tag: &tag,
            cwd: &cwd,
            command: &command,
            env: &env,
            kill_grace: KILL_GRACE,
        })
        .map_err(|e| ExecError::Spawn {
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
        })?;
        let mut exec = RemoteExec::start(&self.pool, &argv)
            .await
            .map_err(|reason| ExecError::Backend { reason })?;
        let control = exec.stdin();
        let outcome = drive(
            event_stream(&mut exec),
            control,
            DriveRequest {
                cwd,
                timeout,
                cancel,
                output,
                kill_grace: KILL_GRACE,
            },
        )
        .await?;
        let lost = outcome.transport_error.is_some() || exec.live.is_closed();
        if lost {
            self.pool.invalidate(&exec.live).await;
        }
        if !outcome.clean {
            self.kill_by_tag(&tag, outcome.pid).await;
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
            if !exec.started() {
                return Err(ExecError::Backend {
                    reason: exec.not_started_reason(),
                });
            }
        }
        Ok(ExecOutcome {
            status: outcome.status,
            termination: outcome.termination,
        })
    }
}
