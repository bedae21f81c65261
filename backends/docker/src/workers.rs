//! The session's workers: attached execs running the `cordon-remote` worker, kept open between
//! operations in a [`WorkerPool`]. A command or file operation is one request line written to
//! an idle worker, so it pays neither for `docker exec` (create, attach, runc: ≈ 50 ms) nor for
//! the script's parsing; a worker goes back to the idle list only when its request finished
//! cleanly. One worker is started with the session and again whenever none is idle after a
//! call, off the calls' path; concurrent operations use further workers, at most [`MAX_IDLE`]
//! stay open.

use bollard::Docker;
use bollard::container::LogOutput;
use cordon_remote::pool::{PooledWorker, ReadyCheck, WorkerPool};
use cordon_remote::worker::worker_argv;
use futures::{FutureExt, StreamExt};

use crate::client::{self, Exec};

/// Idle workers kept per session.
pub(crate) const MAX_IDLE: usize = 4;

impl PooledWorker for Exec {
    /// Still attached and quiet: anything it sent while idle (output, the end of its
    /// streams) means it no longer waits for a request.
    fn idle_alive(&mut self) -> bool {
        self.output.next().now_or_never().is_none()
    }
}

/// The idle workers of one session.
pub(crate) struct Workers(WorkerPool<Exec>);

impl Default for Workers {
    fn default() -> Self {
        Workers(WorkerPool::new(MAX_IDLE))
    }
}

/// A worker for one call.
pub(crate) struct Lease {
    /// The worker's exec.
    pub exec: Exec,
    /// Whether it came from the idle list (it may have died meanwhile: a request it never
    /// answered can be sent to a fresh worker).
    pub pooled: bool,
}

impl Workers {
    /// An idle worker, or a new one (started, not yet ready: the request waits in its stdin).
    pub async fn take(&self, docker: &Docker, container: &str) -> Result<Lease, String> {
        if let Some(exec) = self.0.take_idle() {
            return Ok(Lease { exec, pooled: true });
        }
        let exec = client::start_exec(docker, container, worker_argv(), None)
            .await
            .map_err(|e| format!("failed to start a worker in container {container}: {e}"))?;
        Ok(Lease {
            exec,
            pooled: false,
        })
    }

    /// Keep `exec` for the next call (it finished its request cleanly).
    pub fn give_back(&self, exec: Exec) {
        self.0.give_back(exec);
    }

    /// Whether no worker is idle and none is being started.
    pub fn wants_spare(&self) -> bool {
        self.0.wants_spare()
    }

    /// Start a worker, wait until it reads requests, and keep it idle.
    pub async fn warm(&self, docker: &Docker, container: &str) {
        self.0
            .warm(async {
                let mut exec = client::start_exec(docker, container, worker_argv(), None)
                    .await
                    .ok()?;
                wait_ready(&mut exec).await.then_some(exec)
            })
            .await;
    }

    /// Close every idle worker.
    pub fn clear(&self) {
        self.0.clear();
    }
}

/// Read the worker's first record; `true` if it is `ready`.
async fn wait_ready(exec: &mut Exec) -> bool {
    let mut check = ReadyCheck::default();
    while let Some(frame) = exec.output.next().await {
        match frame {
            Ok(LogOutput::StdErr { message }) => {
                if let Some(ready) = check.feed(&message) {
                    return ready;
                }
            }
            Ok(LogOutput::StdIn { .. }) => {}
            Ok(LogOutput::StdOut { .. } | LogOutput::Console { .. }) | Err(_) => return false,
        }
    }
    false
}
