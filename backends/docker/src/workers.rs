//! The session's workers: attached execs running the `cordon-remote` worker, kept open between
//! operations. A command or file operation is one request line written to an idle worker, so
//! it pays neither for `docker exec` (create, attach, runc: ≈ 50 ms) nor for the script's
//! parsing; a worker goes back to the idle list only when its request finished cleanly. One
//! worker is started with the session and again whenever none is idle after a call, off the
//! calls' path; concurrent operations use further workers, at most [`MAX_IDLE`] stay open.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use cordon_remote::exec::{ExecRecord, exec_record_parser, parse_exec_record};
use cordon_remote::worker::worker_argv;
use futures::{FutureExt, StreamExt};

use crate::client::{self, Exec};

/// Idle workers kept per session.
pub(crate) const MAX_IDLE: usize = 4;

/// How long a worker may take to start before the warm-up gives up.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The idle workers of one session.
#[derive(Default)]
pub(crate) struct Workers {
    idle: Mutex<Vec<Exec>>,
    warming: AtomicBool,
}

/// A worker for one call.
pub(crate) struct Lease {
    /// The worker's exec.
    pub exec: Exec,
    /// Whether it came from the idle list (it may have died meanwhile: a request it never
    /// answered can be sent to a fresh worker).
    pub pooled: bool,
}

/// Whether an idle worker's exec is still attached and quiet: anything it sent while idle
/// (output, the end of its streams) means it no longer waits for a request.
fn idle_alive(exec: &mut Exec) -> bool {
    exec.output.next().now_or_never().is_none()
}

impl Workers {
    /// An idle worker, or a new one (started, not yet ready: the request waits in its stdin).
    pub async fn take(&self, docker: &Docker, container: &str) -> Result<Lease, String> {
        loop {
            let candidate = self.idle.lock().ok().and_then(|mut idle| idle.pop());
            match candidate {
                Some(mut exec) => {
                    if idle_alive(&mut exec) {
                        return Ok(Lease { exec, pooled: true });
                    }
                }
                None => break,
            }
        }
        let exec = client::start_exec(docker, container, worker_argv(), None)
            .await
            .map_err(|e| format!("failed to start a worker in container {container}: {e}"))?;
        Ok(Lease {
            exec,
            pooled: false,
        })
    }

    /// Keep `exec` for the next call (it finished its request cleanly), unless enough are
    /// idle.
    pub fn give_back(&self, exec: Exec) {
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
    pub async fn warm(&self, docker: &Docker, container: &str) {
        if self.warming.swap(true, Ordering::SeqCst) {
            return;
        }
        let started = async {
            let mut exec = client::start_exec(docker, container, worker_argv(), None)
                .await
                .ok()?;
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
async fn wait_ready(exec: &mut Exec) -> bool {
    let mut parser = exec_record_parser();
    while let Some(frame) = exec.output.next().await {
        match frame {
            Ok(LogOutput::StdErr { message }) => match parser.feed(&message) {
                Ok(records) => {
                    if let Some(first) = records.first() {
                        return records.len() == 1
                            && matches!(parse_exec_record(first), Ok(ExecRecord::Ready))
                            && !parser.is_mid_record();
                    }
                }
                Err(_) => return false,
            },
            Ok(LogOutput::StdIn { .. }) => {}
            Ok(LogOutput::StdOut { .. } | LogOutput::Console { .. }) | Err(_) => return false,
        }
    }
    false
}
