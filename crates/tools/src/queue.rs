//! The per-file mutation queue (docs/semantics.md#mutation-queue).
//!
//! `edit` and `write` run their whole read-compute-write cycle inside
//! [`with_mutation_queue`]. The key is `(backend id, canonical path)`: the backend's
//! [`FileOperations::canonicalize`] of the target, or its lexically normalised path when it
//! does not exist yet, so symlink aliases share one queue. Operations on the same key run
//! strictly one after another in CALL order; different keys run concurrently.
//!
//! Call order is kept although canonicalisation is async: a call takes its place in a
//! per-backend registration chain synchronously, when [`with_mutation_queue`] is called (not
//! when its future is first polled), and resolves its key only after every earlier call of the
//! same backend has registered its own. Each queue position is a one-shot baton released when
//! the holder finishes or is dropped, so a dropped or panicking operation never blocks the
//! queue, and map entries are removed as soon as a key is idle.
//!
//! This module does not know about cancellation: a tool checks its token between awaits and
//! never abandons a filesystem operation in flight, so the queue stays held until the
//! operation has settled.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::oneshot;

use cordon_ops::paths::normalize_lexically;
use cordon_ops::{BackendId, FileOperations, FsError};

/// The queue key of one file: the backend and the file's canonical path.
type FileKey = (BackendId, PathBuf);

/// The last registered holder of one chain.
struct Tail {
    /// Which [`Slot`] registered it, so only that slot removes the entry.
    id: u64,
    /// Resolves (or errors, when the sender is dropped) once that holder is done.
    done: oneshot::Receiver<()>,
}

/// A map of baton chains, one per key.
struct Chains<K> {
    tails: HashMap<K, Tail>,
    next_id: u64,
}

impl<K> Default for Chains<K> {
    fn default() -> Self {
        Chains {
            tails: HashMap::new(),
            next_id: 0,
        }
    }
}

/// A place in one chain. Dropping it lets the next holder run and, when nobody queued after
/// it, removes the chain's map entry.
struct Slot<K: Hash + Eq + 'static> {
    chains: &'static Mutex<Chains<K>>,
    key: K,
    id: u64,
    /// Dropped after `Drop::drop`, which wakes the successor waiting on the receiver.
    _release: oneshot::Sender<()>,
}

impl<K: Hash + Eq + 'static> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut chains = lock(self.chains);
        if chains
            .tails
            .get(&self.key)
            .is_some_and(|tail| tail.id == self.id)
        {
            chains.tails.remove(&self.key);
        }
    }
}

/// A slot plus the baton of the holder before it (if any).
struct Place<K: Hash + Eq + 'static> {
    slot: Slot<K>,
    previous: Option<oneshot::Receiver<()>>,
}

impl<K: Hash + Eq + 'static> Place<K> {
    /// Wait until every earlier holder of this chain is done; returns the held slot.
    async fn wait_turn(self) -> Slot<K> {
        if let Some(previous) = self.previous {
            // Err means the previous holder was dropped: its turn is over either way.
            let _ = previous.await;
        }
        self.slot
    }
}

fn lock<K>(chains: &Mutex<Chains<K>>) -> MutexGuard<'_, Chains<K>> {
    // The map holds no invariant a panic could break halfway (inserts and removes are
    // single calls), so a poisoned lock is still safe to use.
    chains
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Take the next place in `key`'s chain, synchronously.
fn enqueue<K: Hash + Eq + Clone + 'static>(chains: &'static Mutex<Chains<K>>, key: K) -> Place<K> {
    let (release, done) = oneshot::channel();
    let mut guard = lock(chains);
    let id = guard.next_id;
    guard.next_id += 1;
    let previous = guard
        .tails
        .insert(key.clone(), Tail { id, done })
        .map(|tail| tail.done);
    drop(guard);
    Place {
        slot: Slot {
            chains,
            key,
            id,
            _release: release,
        },
        previous,
    }
}

fn registration_chains() -> &'static Mutex<Chains<BackendId>> {
    static CHAINS: OnceLock<Mutex<Chains<BackendId>>> = OnceLock::new();
    CHAINS.get_or_init(Mutex::default)
}

fn file_chains() -> &'static Mutex<Chains<FileKey>> {
    static CHAINS: OnceLock<Mutex<Chains<FileKey>>> = OnceLock::new();
    CHAINS.get_or_init(Mutex::default)
}

/// The canonical path that keys `path`'s queue: the backend's realpath, or the lexically
/// normalised path when the file (or a parent) does not exist yet. Any other failure (outside
/// the roots, permission denied, backend down) is returned: the operation cannot run safely.
pub async fn mutation_key(files: &dyn FileOperations, path: &Path) -> Result<PathBuf, FsError> {
    match files.canonicalize(path).await {
        Ok(canonical) => Ok(canonical),
        Err(FsError::NotFound { .. } | FsError::NotADirectory { .. }) => {
            Ok(normalize_lexically(path))
        }
        Err(other) => Err(other),
    }
}

/// Run `operation` while holding `path`'s mutation queue on `files`' backend.
///
/// The place in the queue is taken when this function is CALLED, so two calls made in order
/// run in that order even if their futures are polled the other way round. The returned future
/// resolves once `operation` has finished; the queue is released right after (also if the
/// future is dropped midway). Fails only when the queue key cannot be resolved (see
/// [`mutation_key`]); `operation` then does not run.
pub fn with_mutation_queue<'a, F>(
    files: &'a dyn FileOperations,
    path: &'a Path,
    operation: F,
) -> impl Future<Output = Result<F::Output, FsError>> + Send + 'a
where
    F: Future + Send + 'a,
    F::Output: Send,
{
    let registration = enqueue(registration_chains(), files.backend_id().clone());
    run_registered(files, path, registration, operation)
}

/// [`with_mutation_queue`] for owned arguments: the returned future is `'static`, so it can be
/// spawned and then keeps the queue until `operation` has finished even when whoever awaited
/// it goes away. The place in the queue is taken when this function is called.
pub fn with_mutation_queue_owned<F>(
    files: Arc<dyn FileOperations>,
    path: PathBuf,
    operation: F,
) -> impl Future<Output = Result<F::Output, FsError>> + Send + 'static
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    let registration = enqueue(registration_chains(), files.backend_id().clone());
    async move { run_registered(&*files, &path, registration, operation).await }
}

/// Run `future` on the caller's task (no hand-off to another thread), and if the caller stops
/// waiting before it has finished, let the rest run as a spawned task: a mutation that holds
/// its queue place keeps it until the operation has settled, as if it had been spawned from the
/// start. Resolves to `Err(())` when the operation panicked.
pub fn finish_on_drop<F>(future: F) -> FinishOnDrop<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    use futures::FutureExt;
    FinishOnDrop {
        inner: Some(std::panic::AssertUnwindSafe(future).catch_unwind().boxed()),
    }
}

/// See [`finish_on_drop`].
pub struct FinishOnDrop<T: Send + 'static> {
    inner: Option<futures::future::BoxFuture<'static, std::thread::Result<T>>>,
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = Result<T, ()>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(inner) = self.inner.as_mut() else {
            return std::task::Poll::Ready(Err(()));
        };
        match inner.as_mut().poll(cx) {
            std::task::Poll::Ready(result) => {
                self.inner = None;
                std::task::Poll::Ready(result.map_err(|_| ()))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        if let Some(rest) = self.inner.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(rest);
        }
    }
}

async fn run_registered<F>(
    files: &dyn FileOperations,
    path: &Path,
    registration: Place<BackendId>,
    operation: F,
) -> Result<F::Output, FsError>
where
    F: Future,
{
    let registration = registration.wait_turn().await;
    // Dropping `registration` on error lets the next registration proceed.
    let key = mutation_key(files, path).await?;
    let place = enqueue(file_chains(), (files.backend_id().clone(), key));
    drop(registration);
    let _held = place.wait_turn().await;
    Ok(operation.await)
}

/// Whether a queue entry exists for this key (tests: entries must not leak).
#[cfg(test)]
pub(crate) fn is_tracked(backend: &BackendId, canonical: &Path) -> bool {
    lock(file_chains())
        .tails
        .contains_key(&(backend.clone(), canonical.to_path_buf()))
}

/// Whether a registration chain exists for this backend (tests: entries must not leak).
#[cfg(test)]
pub(crate) fn registration_tracked(backend: &BackendId) -> bool {
    lock(registration_chains()).tails.contains_key(backend)
}

#[cfg(test)]
pub(crate) mod probe {
    //! A [`FileOperations`] wrapper for tests: reports when operations start and end, can hold
    //! one operation at a gate until the test releases it, and can inject failures.

    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    use async_trait::async_trait;
    use tokio::sync::{mpsc, oneshot};

    use crate::testing::StdFiles;
    use cordon_ops::{BackendId, DirEntry, FileMeta, FileOperations, FsError, SpillWriter};

    /// An operation the probe can report, gate or fail.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Op {
        Read,
        Write,
        Metadata,
        Canonicalize,
        CreateDir,
    }

    /// One observed event.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub(crate) struct Event {
        pub op: Op,
        pub file: String,
        pub start: bool,
    }

    struct Gate {
        op: Op,
        file: String,
        release: oneshot::Receiver<()>,
    }

    type Fault = (Op, String, Box<dyn Fn(&Path) -> FsError + Send + Sync>);

    /// `StdFiles` plus events, gates and faults. Files are matched by file name.
    pub(crate) struct ProbeFiles {
        inner: StdFiles,
        events: mpsc::UnboundedSender<Event>,
        gates: Mutex<Vec<Gate>>,
        faults: Mutex<Vec<Fault>>,
    }

    impl ProbeFiles {
        pub(crate) fn new(root: &Path) -> (Self, mpsc::UnboundedReceiver<Event>) {
            let (events, receiver) = mpsc::unbounded_channel();
            let probe = ProbeFiles {
                inner: StdFiles::new(root),
                events,
                gates: Mutex::new(Vec::new()),
                faults: Mutex::new(Vec::new()),
            };
            (probe, receiver)
        }

        /// Hold the next `op` on a file named `file` until the returned sender is used or
        /// dropped.
        pub(crate) fn gate(&self, op: Op, file: &str) -> oneshot::Sender<()> {
            let (tx, release) = oneshot::channel();
            self.gates.lock().unwrap().push(Gate {
                op,
                file: file.to_owned(),
                release,
            });
            tx
        }

        /// Make every `op` on a file named `file` fail with `make(path)`.
        pub(crate) fn fail(
            &self,
            op: Op,
            file: &str,
            make: impl Fn(&Path) -> FsError + Send + Sync + 'static,
        ) {
            self.faults
                .lock()
                .unwrap()
                .push((op, file.to_owned(), Box::new(make)));
        }

        async fn enter(&self, op: Op, path: &Path) -> Result<(), FsError> {
            let file = name_of(path);
            let _ = self.events.send(Event {
                op,
                file: file.clone(),
                start: true,
            });
            let gate = {
                let mut gates = self.gates.lock().unwrap();
                let index = gates.iter().position(|g| g.op == op && g.file == file);
                index.map(|i| gates.remove(i))
            };
            if let Some(gate) = gate {
                let _ = gate.release.await;
            }
            let faults = self.faults.lock().unwrap();
            match faults.iter().find(|(o, f, _)| *o == op && *f == file) {
                Some((_, _, make)) => Err(make(path)),
                None => Ok(()),
            }
        }

        fn leave(&self, op: Op, path: &Path) {
            let _ = self.events.send(Event {
                op,
                file: name_of(path),
                start: false,
            });
        }
    }

    fn name_of(path: &Path) -> String {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    #[async_trait]
    impl FileOperations for ProbeFiles {
        fn backend_id(&self) -> &BackendId {
            self.inner.backend_id()
        }
        fn root(&self) -> &Path {
            self.inner.root()
        }
        fn home(&self) -> Option<&Path> {
            self.inner.home()
        }
        async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
            self.enter(Op::Read, path).await?;
            let out = self.inner.read_file(path).await;
            self.leave(Op::Read, path);
            out
        }
        async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
            self.inner.read_head(path, max_bytes).await
        }
        async fn read_range(
            &self,
            path: &Path,
            offset: u64,
            max_bytes: usize,
        ) -> Result<Vec<u8>, FsError> {
            self.enter(Op::Read, path).await?;
            let out = self.inner.read_range(path, offset, max_bytes).await;
            self.leave(Op::Read, path);
            out
        }
        async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
            self.enter(Op::Write, path).await?;
            let out = self.inner.write_file(path, data).await;
            self.leave(Op::Write, path);
            out
        }
        async fn create_dir_all(&self, path: &Path) -> Result<(), FsError> {
            self.enter(Op::CreateDir, path).await?;
            let out = self.inner.create_dir_all(path).await;
            self.leave(Op::CreateDir, path);
            out
        }
        async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
            self.enter(Op::Metadata, path).await?;
            let out = self.inner.metadata(path).await;
            self.leave(Op::Metadata, path);
            out
        }
        async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
            self.inner.read_dir(path).await
        }
        async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
            self.enter(Op::Canonicalize, path).await?;
            let out = self.inner.canonicalize(path).await;
            self.leave(Op::Canonicalize, path);
            out
        }
        async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
            self.inner.create_spill_file().await
        }
    }

    /// Wait for the next event matching `op`, `file` and `start` (skipping others).
    pub(crate) async fn wait_for(
        events: &mut mpsc::UnboundedReceiver<Event>,
        op: Op,
        file: &str,
        start: bool,
    ) {
        let wanted = Event {
            op,
            file: file.to_owned(),
            start,
        };
        let found = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while let Some(event) = events.recv().await {
                if event == wanted {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(found, Ok(true), "never saw {wanted:?}");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::{Mutex as AsyncMutex, mpsc};

    use super::probe::{Op, ProbeFiles, wait_for};
    use super::*;
    use crate::testing::StdFiles;

    #[tokio::test]
    async fn finish_on_drop_runs_inline_reports_panics_and_finishes_when_dropped() {
        let caller = std::thread::current().id();
        let ran_on = finish_on_drop(async { std::thread::current().id() }).await;
        assert_eq!(ran_on, Ok(caller), "runs on the caller's task");

        let panicked = finish_on_drop(async {
            panic!("boom");
        })
        .await;
        assert_eq!(panicked, Err::<(), ()>(()));

        let (tx, rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let mut pending = Box::pin(finish_on_drop(async move {
            let _ = go_rx.await;
            let _ = tx.send("finished");
        }));
        assert!(futures::poll!(pending.as_mut()).is_pending());
        drop(pending);
        go_tx.send(()).expect("the rest still runs");
        assert_eq!(rx.await, Ok("finished"));
    }

    /// Records "name:start" / "name:end" around an operation that waits for `gate` (if any).
    async fn traced(
        log: Arc<AsyncMutex<Vec<String>>>,
        name: &'static str,
        gate: Option<oneshot::Receiver<()>>,
        started: Option<oneshot::Sender<()>>,
    ) {
        log.lock().await.push(format!("{name}:start"));
        if let Some(started) = started {
            let _ = started.send(());
        }
        if let Some(gate) = gate {
            let _ = gate.await;
        }
        log.lock().await.push(format!("{name}:end"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn same_file_runs_serially_in_call_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "x").unwrap();
        let (probe, _events) = ProbeFiles::new(dir.path());
        // The first call's key resolution is held back: a racing implementation would let
        // the second call register first.
        let release_canonicalize = probe.gate(Op::Canonicalize, "a.txt");
        let files: Arc<dyn FileOperations> = Arc::new(probe);
        let path = files.root().join("a.txt");
        let log = Arc::new(AsyncMutex::new(Vec::new()));
        let (release_first, first_gate) = oneshot::channel();
        let first = with_mutation_queue_owned(
            files.clone(),
            path.clone(),
            traced(log.clone(), "first", Some(first_gate), None),
        );
        let second = with_mutation_queue_owned(
            files.clone(),
            path.clone(),
            traced(log.clone(), "second", None, None),
        );
        // Poll the second call first.
        let second = tokio::spawn(second);
        tokio::task::yield_now().await;
        let first = tokio::spawn(first);
        release_canonicalize.send(()).unwrap();
        tokio::task::yield_now().await;
        release_first.send(()).unwrap();
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert_eq!(
            *log.lock().await,
            ["first:start", "first:end", "second:start", "second:end"]
        );
        let canonical = std::fs::canonicalize(&path).unwrap();
        assert!(!is_tracked(files.backend_id(), &canonical), "entry leaked");
        assert!(
            !registration_tracked(files.backend_id()),
            "registration leaked"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn different_files_run_concurrently() {
        let dir = tempfile::tempdir().unwrap();
        let files: Arc<dyn FileOperations> = Arc::new(StdFiles::new(dir.path()));
        let log = Arc::new(AsyncMutex::new(Vec::new()));
        let (release_a, gate_a) = oneshot::channel();
        let (a_started, a_started_rx) = oneshot::channel();
        let a = tokio::spawn(with_mutation_queue_owned(
            files.clone(),
            files.root().join("a.txt"),
            traced(log.clone(), "a", Some(gate_a), Some(a_started)),
        ));
        a_started_rx.await.unwrap();
        // b must finish while a still holds its own queue.
        with_mutation_queue(
            &*files,
            &files.root().join("b.txt"),
            traced(log.clone(), "b", None, None),
        )
        .await
        .unwrap();
        release_a.send(()).unwrap();
        a.await.unwrap().unwrap();
        assert_eq!(*log.lock().await, ["a:start", "b:start", "b:end", "a:end"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn symlink_alias_shares_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("target.txt"), "x").unwrap();
        std::os::unix::fs::symlink("target.txt", dir.path().join("alias.txt")).unwrap();
        let files: Arc<dyn FileOperations> = Arc::new(StdFiles::new(dir.path()));
        let log = Arc::new(AsyncMutex::new(Vec::new()));
        let (release, gate) = oneshot::channel();
        let (started, started_rx) = oneshot::channel();
        let first = tokio::spawn(with_mutation_queue_owned(
            files.clone(),
            files.root().join("target.txt"),
            traced(log.clone(), "target", Some(gate), Some(started)),
        ));
        started_rx.await.unwrap();
        let second = tokio::spawn(with_mutation_queue_owned(
            files.clone(),
            files.root().join("alias.txt"),
            traced(log.clone(), "alias", None, None),
        ));
        // The alias must not start while the target holds the queue. A bounded wait can only
        // miss a bug on a slow machine, never fail a correct implementation.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*log.lock().await, ["target:start"]);
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert_eq!(
            *log.lock().await,
            ["target:start", "target:end", "alias:start", "alias:end"]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn new_files_key_by_normalised_path() {
        let dir = tempfile::tempdir().unwrap();
        let files = StdFiles::new(dir.path());
        let missing = files.root().join("sub/../new.txt");
        let key = mutation_key(&files, &missing).await.unwrap();
        assert_eq!(key, files.root().join("new.txt"));
        let outside = mutation_key(&files, Path::new("/definitely/outside")).await;
        assert!(
            matches!(outside, Err(FsError::OutsideRoot { .. })),
            "{outside:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_operation_releases_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let files: Arc<dyn FileOperations> = Arc::new(StdFiles::new(dir.path()));
        let path = files.root().join("a.txt");
        let (started, started_rx) = oneshot::channel::<()>();
        let never = async move {
            let _ = started.send(());
            std::future::pending::<()>().await;
        };
        let stuck = tokio::spawn(with_mutation_queue_owned(
            files.clone(),
            path.clone(),
            never,
        ));
        started_rx.await.unwrap();
        stuck.abort();
        let _ = stuck.await;
        let value = with_mutation_queue(&*files, &path, async { 7 })
            .await
            .unwrap();
        assert_eq!(value, 7);
        assert!(!is_tracked(files.backend_id(), &path));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_key_resolution_does_not_block_later_calls() {
        let dir = tempfile::tempdir().unwrap();
        let (probe, mut events) = ProbeFiles::new(dir.path());
        probe.fail(Op::Canonicalize, "bad.txt", |path| FsError::Backend {
            op: "realpath",
            path: path.to_path_buf(),
            reason: "disk offline".to_owned(),
        });
        let files: Arc<dyn FileOperations> = Arc::new(probe);
        let bad = with_mutation_queue(&*files, &files.root().join("bad.txt"), async { 1 }).await;
        assert!(matches!(bad, Err(FsError::Backend { .. })), "{bad:?}");
        wait_for(&mut events, Op::Canonicalize, "bad.txt", true).await;
        let good = files.root().join("good.txt");
        let good = with_mutation_queue(&*files, &good, async { 2 }).await;
        assert_eq!(good.unwrap(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_concurrent_operations_on_one_file_are_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let files: Arc<dyn FileOperations> = Arc::new(StdFiles::new(dir.path()));
        let path = files.root().join("counter.txt");
        let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let mut handles = Vec::new();
        for i in 0..50usize {
            let inside = inside.clone();
            let done_tx = done_tx.clone();
            handles.push(tokio::spawn(with_mutation_queue_owned(
                files.clone(),
                path.clone(),
                async move {
                    let before = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    done_tx.send(i).unwrap();
                    before
                },
            )));
        }
        drop(done_tx);
        for handle in handles {
            assert_eq!(handle.await.unwrap().unwrap(), 0, "two holders at once");
        }
        let mut order = Vec::new();
        while let Some(i) = done_rx.recv().await {
            order.push(i);
        }
        assert_eq!(order, (0..50).collect::<Vec<_>>(), "not in call order");
        assert!(!is_tracked(files.backend_id(), &path));
    }
}
