//! [`BashOperations`] over `docker exec` of the `cordon-remote` wrapper, driven by
//! `cordon_remote::exec::drive`: streaming output, timeout and cancel killing the whole tree
//! inside the container (tagged descendants included), idle-grace drain, no survivors. An OOM
//! kill (the container's memory limit) is reported with a clear line in the output.

use async_trait::async_trait;
use cordon_remote::exec::{
    DriveRequest, KILL_GRACE, WrapperRequest, drive, kill_argv, new_tag, shell_status, wrapper_argv,
};
use cordon_tools::ops::{BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::client;
use crate::files::collect;

fn human_bytes(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes.div_ceil(MIB))
    }
}

impl Inner {
    /// Last resort when the wrapper could not confirm the kill: sweep by tag.
    async fn kill_by_tag(&self, tag: &str, pid: Option<u32>) {
        let argv = kill_argv(tag, pid, KILL_GRACE);
        if let Ok(exec) = client::start_exec(&self.docker, &self.container, argv, None).await {
            let _ = tokio::time::timeout(KILL_GRACE * 20, collect(exec.output)).await;
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
            });
        }
        let tag = new_tag();
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
        let exec = client::start_exec(&self.docker, &self.container, argv, None)
            .await
            .map_err(|e| ExecError::Backend {
                reason: format!("failed to start exec in container {}: {e}", self.container),
            })?;
        let exec_id = exec.id.clone();
        let outcome = drive(
            client::events(exec.output),
            exec.input,
            DriveRequest {
                cwd,
                timeout,
                cancel,
                output: output.clone(),
                kill_grace: KILL_GRACE,
            },
        )
        .await?;
        if !outcome.clean {
            self.kill_by_tag(&tag, outcome.pid).await;
        }
        let mut status = outcome.status;
        if status.is_none()
            && let Ok(inspect) = self.docker.inspect_exec(&exec_id).await
            && inspect.running == Some(false)
            && let Some(code) = inspect.exit_code
        {
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
        Ok(ExecOutcome {
            status,
            termination: outcome.termination,
        })
    }
}
