//! The connection's workers: exec channels running the `cordon-remote` worker, kept open
//! between commands. A command is one request line written to an idle worker, so a call pays
//! neither for a new channel nor for the login shell, `env` and the script's parsing (all done
//! once per worker); a worker goes back to the idle list only when its request finished cleanly
//! (nothing of the command left, nothing else writing to its output). One worker is started
//! ahead of the first command, and again whenever none is idle after a call, off the call's
//! path. Concurrent commands use further workers; at most [`MAX_IDLE`] stay open between
//! calls (sshd's default `MaxSessions` is 10 per connection, one of them SFTP).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cordon_remote::exec::{ExecRecord, TransportEvent, exec_record_parser, parse_exec_record};
use cordon_remote::worker::worker_argv;

use crate::conn::Pool;
use crate::remote::RemoteExec;

/// Idle workers kept per connection.
pub(crate) const MAX_IDLE: usize = 2;

/// How long a worker may take to start before the warm-up gives up.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The idle workers of one backend.
#[derive(Default)]
pub(crate) struct Workers {
    idle: Mutex<Vec<RemoteExec>>,
    warming: AtomicBool,
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
        loop {
            let candidate = self.idle.lock().ok().and_then(|mut idle| idle.pop());
            match candidate {
                Some(mut exec) => {
                    if exec.idle_alive() {
                        return Ok(Lease { exec, pooled: true });
                    }
                    // Dropping closes the channel.
                }
                None => break,
            }
        }
        let exec = RemoteExec::start(pool, &worker_argv()).await?;
        Ok(Lease {
            exec,
            pooled: false,
        })
    }

    /// Keep `exec` for the next call (it finished its request cleanly), unless enough are
    /// idle or its connection is gone.
    pub fn give_back(&self, exec: RemoteExec) {
        if exec.live.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(exec);
        }
    }

    /// Whether no worker is idle and none is being started.
    pub fn wants_spare(&self) -> bool {
        let empty = self
            .idle
            .lock()
            .map(|idle| idle.is_empty())
            .unwrap_or(false);
        empty && !self.warming.load(Ordering::SeqCst)
    }

    /// Start a worker, wait until it reads requests, and keep it idle. At most one warm-up
    /// runs at a time; errors are left for the next call to meet.
    pub async fn warm(&self, pool: &Pool) {
        if self.warming.swap(true, Ordering::SeqCst) {
            return;
        }
        let started = async {
            let mut exec = RemoteExec::start(pool, &worker_argv()).await.ok()?;
            wait_ready(&mut exec).await.then_some(exec)
        };
        if let Ok(Some(exec)) = tokio::time::timeout(READY_TIMEOUT, started).await {
            self.give_back(exec);
        }
        self.warming.store(false, Ordering::SeqCst);
    }

    /// Close every idle worker.
    pub fn clear(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }
}

/// Read the worker's first record; `true` if it is `ready`.
async fn wait_ready(exec: &mut RemoteExec) -> bool {
    let mut parser = exec_record_parser();
    while let Some(event) = exec.next().await {
        match event {
            Ok(TransportEvent::Stderr(bytes)) => match parser.feed(&bytes) {
                Ok(records) => {
                    if let Some(first) = records.first() {
                        return records.len() == 1
                            && matches!(parse_exec_record(first), Ok(ExecRecord::Ready))
                            && !parser.is_mid_record();
                    }
                }
                Err(_) => return false,
            },
            Ok(TransportEvent::Stdout(_)) | Err(_) => return false,
        }
    }
    false
}
