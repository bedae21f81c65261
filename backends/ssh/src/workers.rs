//! The connection's workers: exec channels running the `cordon-remote` worker, kept open
//! between commands in a [`WorkerPool`]. A command is one request line written to an idle
//! worker, so a call pays neither for a new channel nor for the login shell, `env` and the
//! script's parsing (all done once per worker); a worker goes back to the idle list only when
//! its request finished cleanly (nothing of the command left, nothing else writing to its
//! output). One worker is started ahead of the first command, and again whenever none is idle
//! after a call, off the call's path. Concurrent commands use further workers; at most
//! [`MAX_IDLE`] stay open between calls (sshd's default `MaxSessions` is 10 per connection,
//! one of them SFTP).

use cordon_remote::exec::TransportEvent;
use cordon_remote::pool::{PooledWorker, ReadyCheck, WorkerPool};
use cordon_remote::worker::worker_argv;

use crate::conn::Pool;
use crate::remote::RemoteExec;

/// Idle workers kept per connection.
pub(crate) const MAX_IDLE: usize = 2;

impl PooledWorker for RemoteExec {
    fn idle_alive(&mut self) -> bool {
        RemoteExec::idle_alive(self)
    }

    fn keepable(&self) -> bool {
        !self.live.is_closed()
    }
}

/// The idle workers of one backend.
pub(crate) struct Workers(WorkerPool<RemoteExec>);

impl Default for Workers {
    fn default() -> Self {
        Workers(WorkerPool::new(MAX_IDLE))
    }
}

/// A worker for one call.
pub(crate) struct Lease {
    /// The worker's channel.
    pub exec: RemoteExec,
    /// Whether it came from the idle list (it may have died meanwhile: a request it never
    /// answered can be sent to a fresh worker).
    pub pooled: bool,
}

impl Workers {
    /// An idle worker of the live connection, or a new one (started, not yet ready: the
    /// request waits in its stdin).
    pub async fn take(&self, pool: &Pool) -> Result<Lease, String> {
        if let Some(exec) = self.0.take_idle() {
            return Ok(Lease { exec, pooled: true });
        }
        let exec = RemoteExec::start(pool, &worker_argv()).await?;
        Ok(Lease {
            exec,
            pooled: false,
        })
    }

    /// Keep `exec` for the next call (it finished its request cleanly).
    pub fn give_back(&self, exec: RemoteExec) {
        self.0.give_back(exec);
    }

    /// Whether no worker is idle and none is being started.
    pub fn wants_spare(&self) -> bool {
        self.0.wants_spare()
    }

    /// Start a worker, wait until it reads requests, and keep it idle.
    pub async fn warm(&self, pool: &Pool) {
        self.0
            .warm(async {
                let mut exec = RemoteExec::start(pool, &worker_argv()).await.ok()?;
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
async fn wait_ready(exec: &mut RemoteExec) -> bool {
    let mut check = ReadyCheck::default();
    while let Some(event) = exec.next().await {
        match event {
            Ok(TransportEvent::Stderr(bytes)) => {
                if let Some(ready) = check.feed(&bytes) {
                    return ready;
                }
            }
            Ok(TransportEvent::Stdout(_)) | Err(_) => return false,
        }
    }
    false
}
