//! The idle list of a backend's workers (see [`crate::worker`]), shared by every transport:
//! a worker goes back to it only when its request finished cleanly, at most `max_idle` are
//! kept, one that stopped waiting while idle is discarded when taken, and one spare can be
//! started ahead, off the calls' path. Starting a worker and telling whether an idle one is
//! still alive are the transport's part ([`PooledWorker`]).

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::exec::{ExecRecord, exec_record_parser, parse_exec_record};
use crate::records::RecordParser;

/// How long a spare worker may take to start before the warm-up gives up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A worker connection a transport keeps between requests.
pub trait PooledWorker: Send + 'static {
    /// Whether the idle worker still waits for a request: its streams are open and it sent
    /// nothing since its last request ended.
    fn idle_alive(&mut self) -> bool;
    /// Whether it may be kept at all (e.g. its connection is still the live one).
    fn keepable(&self) -> bool {
        true
    }
}

/// The idle workers of one backend.
#[derive(Debug)]
pub struct WorkerPool<W> {
    idle: Mutex<Vec<W>>,
    warming: AtomicBool,
    max_idle: usize,
}

impl<W: PooledWorker> WorkerPool<W> {
    /// An empty pool keeping at most `max_idle` workers between calls.
    pub fn new(max_idle: usize) -> Self {
        WorkerPool {
            idle: Mutex::new(Vec::new()),
            warming: AtomicBool::new(false),
            max_idle,
        }
    }

    /// An idle worker that is still alive (dead ones are dropped on the way), if any.
    pub fn take_idle(&self) -> Option<W> {
        loop {
            let mut worker = self.idle.lock().ok().and_then(|mut idle| idle.pop())?;
            if worker.idle_alive() {
                return Some(worker);
            }
        }
    }

    /// Keep `worker` for the next call (it finished its request cleanly), unless enough are
    /// idle or it cannot be kept.
    pub fn give_back(&self, worker: W) {
        if !worker.keepable() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < self.max_idle
        {
            idle.push(worker);
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

    /// Run `start` (start a worker and wait until it is ready, `None` on failure) and keep
    /// its worker idle. At most one warm-up runs at a time; a failure is left for the next
    /// call to meet.
    pub async fn warm(&self, start: impl Future<Output = Option<W>>) {
        if self.warming.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Ok(Some(worker)) = tokio::time::timeout(READY_TIMEOUT, start).await {
            self.give_back(worker);
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

/// Reads a new worker's first record from its stderr chunks: it must be `ready`, alone.
#[derive(Debug)]
pub struct ReadyCheck {
    parser: RecordParser,
}

impl Default for ReadyCheck {
    fn default() -> Self {
        ReadyCheck {
            parser: exec_record_parser(),
        }
    }
}

impl ReadyCheck {
    /// Feed a stderr chunk: `Some(ready)` once decided, `None` while more is needed.
    pub fn feed(&mut self, stderr: &[u8]) -> Option<bool> {
        match self.parser.feed(stderr) {
            Ok(records) => records.first().map(|first| {
                records.len() == 1
                    && matches!(parse_exec_record(first), Ok(ExecRecord::Ready))
                    && !self.parser.is_mid_record()
            }),
            Err(_) => Some(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        alive: bool,
        keepable: bool,
        id: u32,
    }

    impl PooledWorker for Fake {
        fn idle_alive(&mut self) -> bool {
            self.alive
        }
        fn keepable(&self) -> bool {
            self.keepable
        }
    }

    fn fake(id: u32, alive: bool) -> Fake {
        Fake {
            alive,
            keepable: true,
            id,
        }
    }

    #[test]
    fn dead_idle_workers_are_skipped_and_the_list_is_bounded() {
        let pool = WorkerPool::new(2);
        assert!(pool.wants_spare());
        pool.give_back(fake(1, true));
        pool.give_back(fake(2, false));
        pool.give_back(fake(3, true));
        assert!(!pool.wants_spare());
        assert_eq!(
            pool.take_idle().map(|w| w.id),
            Some(1),
            "the dead one is dropped"
        );
        assert!(pool.take_idle().is_none());
        pool.give_back(Fake {
            alive: true,
            keepable: false,
            id: 4,
        });
        assert!(pool.take_idle().is_none());
        pool.give_back(fake(5, true));
        pool.clear();
        assert!(pool.take_idle().is_none());
    }

    #[tokio::test]
    async fn warm_keeps_a_ready_worker_and_survives_a_failed_start() {
        let pool = WorkerPool::new(2);
        pool.warm(async { None }).await;
        assert!(pool.wants_spare());
        pool.warm(async { Some(fake(7, true)) }).await;
        assert_eq!(pool.take_idle().map(|w| w.id), Some(7));
    }

    #[test]
    fn ready_check_wants_exactly_the_ready_record() {
        assert_eq!(ReadyCheck::default().feed(b"ready\0"), Some(true));
        let mut split = ReadyCheck::default();
        assert_eq!(split.feed(b"rea"), None);
        assert_eq!(split.feed(b"dy\0"), Some(true));
        assert_eq!(ReadyCheck::default().feed(b"killed\0"), Some(false));
        assert_eq!(ReadyCheck::default().feed(b"ready\0killed\0"), Some(false));
    }
}
