//! [`FileOperations`] through a backend's workers, for any [`Transport`] ([`RemoteFiles`] over
//! a [`FileHost`]): each operation is one request to a worker (no new process: the helper's
//! records say how it went); spill files, which keep their process open while bash writes,
//! use a one-shot process. Paths are confined and canonicalised on the remote side;
//! protected/denied rules are judged here on the canonical path before anything is written
//! (writes and mkdir wait for our `go`).
//!
//! Docker's file operations are these; a transport without a file protocol of its own (a
//! Kubernetes exec, a resident helper) gets them for free. SSH uses SFTP instead.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use cordon_ops::{BackendId, DirEntry, FileMeta, FileOperations, FsError, SpillWriter};
use futures::{FutureExt, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt, DuplexStream};

use crate::exec::TransportEvent;
use crate::files::{
    FileOp, FsRecord, GO_LINE, PathRules, STOP_LINE, files_argv, files_record_parser, fs_error,
    go_line, is_read_only_fs, parse_fs_record, spill_file_name,
};
use crate::records::RecordParser;
use crate::runner::{Lease, Runner};
use crate::transport::{Process, Transport};
use crate::worker::{EndMarker, WorkerRequest, new_request_id};

/// How long finishing a request may take before the worker is given up.
const FINISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Bytes a spill writer buffers on its way to the spill process.
const SPILL_PIPE: usize = 256 * 1024;

/// A backend's part of the file operations.
pub trait FileHost: Send + Sync + 'static {
    /// Its transport.
    type Transport: Transport;

    /// Its workers.
    fn runner(&self) -> &Arc<Runner<Self::Transport>>;
    /// Its id.
    fn backend_id(&self) -> &BackendId;
    /// The workspace root as the tools see it.
    fn root(&self) -> &Path;
    /// The home directory for `~`.
    fn home(&self) -> Option<&Path>;
    /// Where bash's spill files go.
    fn spill_dir(&self) -> &Path;
    /// The canonical roots every request is confined to.
    fn roots(&self) -> &[PathBuf];
    /// The rules judged on canonical paths.
    fn rules(&self) -> &PathRules;
    /// The account commands run as (uid, groups): what `writable` is judged for.
    fn account(&self) -> (u32, &[u32]);

    /// Empty directories the backend made only to mount them read-only (remote paths), left
    /// out of listings: the file tools show the workspace as the operator left it, as on the
    /// local backend. The default is none.
    fn pinned(&self) -> &[PathBuf] {
        &[]
    }

    /// A marker of the remote side's life, taken before an operation (passed back to
    /// [`FileHost::explain`]).
    fn generation(&self) -> u64 {
        0
    }

    /// An operation that did nothing failed with `reason`: the text for the model (a backend
    /// may check whether its remote side died meanwhile). The default is `reason`.
    fn explain(&self, seen: u64, reason: String) -> impl Future<Output = String> + Send {
        let _ = seen;
        std::future::ready(reason)
    }
}

/// [`FileOperations`] of a remote backend over its [`FileHost`].
pub struct RemoteFiles<H>(pub Arc<H>);

/// A file request in flight: on a worker (ends with its marker and `done` record, after which
/// the worker can serve the next call) or on a one-shot process (ends with its streams).
/// Records arrive one by one; stdout is collected.
struct HelperExec<P> {
    process: P,
    parser: RecordParser,
    queue: std::collections::VecDeque<FsRecord>,
    stdout: Vec<u8>,
    op: &'static str,
    path: PathBuf,
    /// The worker's request: its id, end marker and whether `done` came.
    request: Option<(String, EndMarker, bool)>,
    /// Anything arrived for this request.
    answered: bool,
}

impl<P: Process> HelperExec<P> {
    /// `process` serving `op` on `path`: a worker's request with this id, or a one-shot.
    fn new(process: P, op: &'static str, path: &Path, request_id: Option<&str>) -> Self {
        HelperExec {
            process,
            parser: files_record_parser(),
            queue: Default::default(),
            stdout: Vec::new(),
            op,
            path: path.to_path_buf(),
            request: request_id.map(|id| (id.to_owned(), EndMarker::new(id), false)),
            answered: false,
        }
    }

    fn backend_err(&self, reason: impl Into<String>) -> FsError {
        FsError::Backend {
            op: self.op,
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    /// Whether the worker finished the request (marker and `done` seen).
    fn finished(&self) -> bool {
        matches!(&self.request, Some((_, marker, true)) if marker.found())
    }

    /// The next record, or `None` at the end of the request.
    async fn next(&mut self) -> Result<Option<FsRecord>, FsError> {
        loop {
            if let Some(record) = self.queue.pop_front() {
                return Ok(Some(record));
            }
            if self.finished() {
                return Ok(None);
            }
            let event = {
                let (mut events, _control) = self.process.io();
                events.next().await
            };
            let Some(event) = event else {
                return Ok(None);
            };
            match event.map_err(|e| self.backend_err(e))? {
                TransportEvent::Stdout(message) => {
                    let data = match self.request.as_mut() {
                        Some((_, marker, _)) => marker.feed(&message).data,
                        None => message.to_vec(),
                    };
                    self.answered |= !data.is_empty();
                    self.stdout.extend_from_slice(&data);
                }
                TransportEvent::Stderr(message) => {
                    let records = self
                        .parser
                        .feed(&message)
                        .map_err(|e| self.backend_err(e.to_string()))?;
                    for record in records {
                        let parsed = parse_fs_record(&record)
                            .map_err(|e| self.backend_err(e.to_string()))?;
                        match parsed {
                            FsRecord::Ready => {}
                            FsRecord::Done(id) => match self.request.as_mut() {
                                Some((want, _, done)) if *want == id => *done = true,
                                _ => {
                                    return Err(self.backend_err(format!(
                                        "the worker finished request `{id}` instead of this one"
                                    )));
                                }
                            },
                            other => {
                                self.answered = true;
                                self.queue.push_back(other);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The next record, which must exist; `err` records become the matching [`FsError`].
    async fn expect(&mut self) -> Result<FsRecord, FsError> {
        match self.next().await? {
            Some(FsRecord::Err { code, message, .. }) => {
                Err(fs_error(self.op, &self.path, &code, &message))
            }
            Some(record) => Ok(record),
            None => Err(self.backend_err("the file helper ended without an answer")),
        }
    }

    async fn expect_canon(&mut self) -> Result<PathBuf, FsError> {
        match self.expect().await? {
            FsRecord::Canon(path) => Ok(path),
            other => Err(self.backend_err(format!("unexpected answer {other:?}"))),
        }
    }

    async fn expect_ok(&mut self) -> Result<(), FsError> {
        match self.expect().await? {
            FsRecord::Ok => Ok(()),
            other => Err(self.backend_err(format!("unexpected answer {other:?}"))),
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), FsError> {
        let sent = {
            let (_events, mut control) = self.process.io();
            match control.write_all(bytes).await {
                Ok(()) => control.flush().await,
                Err(e) => Err(e),
            }
        };
        sent.map_err(|e| self.backend_err(e.to_string()))
    }
}

impl<H: FileHost> RemoteFiles<H> {
    /// Start `file_op` on a worker and wait for its first record (every operation starts with
    /// `canon` or `err`). A pooled worker that died while idle is replaced by a fresh one once.
    async fn helper(
        &self,
        op: &'static str,
        path: &Path,
        file_op: FileOp,
    ) -> Result<HelperExec<<H::Transport as Transport>::Process>, FsError> {
        let host = &*self.0;
        let backend_err = |reason: String| FsError::Backend {
            op,
            path: path.to_path_buf(),
            reason,
        };
        let id = new_request_id();
        let line = WorkerRequest::Fs {
            roots: host.roots().to_vec(),
            op: file_op,
        }
        .line(&id)
        .map_err(|e| backend_err(e.to_string()))?;
        let mut retried = false;
        loop {
            let seen = host.generation();
            let Lease { process, pooled } = match host.runner().take().await {
                Ok(lease) => lease,
                Err(reason) => return Err(backend_err(host.explain(seen, reason).await)),
            };
            let mut helper = HelperExec::new(process, op, path, Some(&id));
            let sent = helper.send(&line).await;
            let first = match sent {
                Ok(()) => helper.next().await,
                Err(e) => Err(e),
            };
            match first {
                Ok(Some(record)) => {
                    helper.queue.push_front(record);
                    return Ok(helper);
                }
                _ if pooled && !retried && !helper.answered => {
                    retried = true;
                    tracing::debug!(op, "an idle worker was gone before it answered; retrying");
                    continue;
                }
                // Nothing was done: the remote side may explain the silence.
                Ok(None) => {
                    let reason = "the file helper ended without an answer".to_owned();
                    return Err(backend_err(host.explain(seen, reason).await));
                }
                Err(FsError::Backend { reason, .. }) if !helper.answered => {
                    return Err(backend_err(host.explain(seen, reason).await));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The request finished on the helper's side (successfully or with an `err` record): read
    /// to its end and keep the worker for the next call.
    async fn release(&self, mut helper: HelperExec<<H::Transport as Transport>::Process>) {
        let drained = tokio::time::timeout(FINISH_TIMEOUT, async {
            while let Ok(Some(_)) = helper.next().await {}
        })
        .await;
        let clean = drained.is_ok()
            && helper.finished()
            && !helper.parser.is_mid_record()
            && !matches!(&helper.request, Some((_, marker, _)) if marker.trailing());
        let runner = self.0.runner();
        runner.release(helper.process, clean);
        runner.keep_a_spare();
    }

    /// A one-shot process of `file_op` (for operations that keep their process: spill files).
    async fn oneshot_helper(
        &self,
        op: &'static str,
        path: &Path,
        file_op: FileOp,
    ) -> Result<HelperExec<<H::Transport as Transport>::Process>, FsError> {
        let host = &*self.0;
        let backend_err = |reason: String| FsError::Backend {
            op,
            path: path.to_path_buf(),
            reason,
        };
        let argv = files_argv(host.roots(), &file_op).map_err(|e| backend_err(e.to_string()))?;
        let seen = host.generation();
        match host.runner().transport().start(argv).await {
            Ok(process) => Ok(HelperExec::new(process, op, path, None)),
            Err(reason) => Err(backend_err(host.explain(seen, reason).await)),
        }
    }

    async fn read_impl(
        &self,
        path: &Path,
        offset: u64,
        max: Option<usize>,
    ) -> Result<Vec<u8>, FsError> {
        let op = match (offset, max) {
            (1.., Some(max)) => FileOp::ReadRange {
                path: path.to_path_buf(),
                offset,
                max,
            },
            _ => FileOp::Read {
                path: path.to_path_buf(),
                max,
            },
        };
        let mut exec = self.helper("read", path, op).await?;
        let canon = match exec.expect_canon().await {
            Ok(canon) => canon,
            Err(e) => {
                self.release(exec).await;
                return Err(e);
            }
        };
        // Denied content is dropped with the worker, never returned.
        self.0.rules().check_read(path, &canon)?;
        let result = exec.expect_ok().await;
        if result.is_ok() {
            while exec.next().await?.is_some() {}
        }
        let data = std::mem::take(&mut exec.stdout);
        self.release(exec).await;
        result.map(|()| data)
    }

    /// Run `file_op` on a worker and let `work` read its answer, then finish the request and
    /// keep the worker for the next call, unless `work` failed and `reuse_after_error` is
    /// off.
    async fn on_worker<T>(
        &self,
        op: &'static str,
        path: &Path,
        file_op: FileOp,
        reuse_after_error: bool,
        work: impl AsyncFnOnce(
            &mut HelperExec<<H::Transport as Transport>::Process>,
        ) -> Result<T, FsError>,
    ) -> Result<T, FsError> {
        let mut exec = self.helper(op, path, file_op).await?;
        let result = work(&mut exec).await;
        if result.is_ok() || reuse_after_error {
            self.release(exec).await;
        } else {
            drop(exec);
            self.0.runner().keep_a_spare();
        }
        result
    }

    /// The first step of a mutation: the canonical path, judged by the write rules; a
    /// refusal is sent to the helper (`stop`) before it touches anything.
    async fn approve_write(
        &self,
        exec: &mut HelperExec<<H::Transport as Transport>::Process>,
        path: &Path,
    ) -> Result<PathBuf, FsError> {
        let canon = exec.expect_canon().await?;
        if let Err(e) = self.0.rules().check_write(path, &canon) {
            // The helper exits on a closed pipe as on the stop line: the refusal stands either way.
            let _ = exec.send(STOP_LINE).await;
            return Err(e);
        }
        Ok(canon)
    }

    fn protected_or(&self, path: &Path, canon: &Path, err: FsError) -> FsError {
        if is_read_only_fs(&err) && self.0.rules().is_protected(canon) {
            FsError::Protected {
                path: path.to_path_buf(),
            }
        } else if is_read_only_fs(&err) {
            FsError::PermissionDenied {
                path: path.to_path_buf(),
            }
        } else {
            err
        }
    }
}

/// A spill writer whose bytes go through an in-memory pipe to a task that stores them (on
/// any transport); shutdown closes the pipe, then waits for `done`, the task's outcome.
pub struct PipedSpill<F> {
    pipe: DuplexStream,
    done: Option<F>,
}

impl<F> PipedSpill<F> {
    /// The writer end `pipe` of a duplex whose reader a task drains; `done` resolves when
    /// that task has stored everything.
    pub fn new(pipe: DuplexStream, done: F) -> Self {
        PipedSpill {
            pipe,
            done: Some(done),
        }
    }
}

impl<F: Future<Output = std::io::Result<()>> + Unpin> AsyncWrite for PipedSpill<F> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.pipe).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.pipe).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        futures::ready!(Pin::new(&mut self.pipe).poll_shutdown(cx))?;
        let Some(done) = self.done.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let result = futures::ready!(Pin::new(done).poll(cx));
        self.done = None;
        Poll::Ready(result)
    }
}

/// Copy what the spill writer receives to the process's stdin while draining its output;
/// the end of the pipe closes the stdin, and the task ends with the process's output.
async fn pump_spill<P: Process>(mut process: P, mut pipe: DuplexStream) {
    let (mut events, mut control) = process.io();
    let copy = async {
        if let Err(error) = tokio::io::copy(&mut pipe, &mut control).await {
            tracing::warn!(%error, "failed to write to the spill file");
        }
        // A failed close shows as the helper's own error on the event stream.
        let _ = control.shutdown().await;
    };
    let drain = async { while events.next().await.is_some() {} };
    tokio::join!(copy, drain);
}

#[async_trait]
impl<H: FileHost> FileOperations for RemoteFiles<H> {
    fn backend_id(&self) -> &BackendId {
        self.0.backend_id()
    }

    fn root(&self) -> &Path {
        self.0.root()
    }

    fn home(&self) -> Option<&Path> {
        self.0.home()
    }

    fn spill_dir(&self) -> Option<&Path> {
        Some(self.0.spill_dir())
    }

    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        self.read_impl(path, 0, None).await
    }

    async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
        if max_bytes == 0 {
            // Still report a missing/denied path the same way.
            self.metadata(path).await?;
            return Ok(Vec::new());
        }
        self.read_impl(path, 0, Some(max_bytes)).await
    }

    async fn read_range(
        &self,
        path: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        if max_bytes == 0 {
            self.metadata(path).await?;
            return Ok(Vec::new());
        }
        self.read_impl(path, offset, Some(max_bytes)).await
    }

    async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
        // The helper may refuse before reading the data, which would then sit in the worker's
        // input: after a failed write the worker serves no further request.
        let op = FileOp::Write(path.to_path_buf());
        self.on_worker("write", path, op, false, async |exec| {
            let canon = self.approve_write(exec, path).await?;
            // The helper checks the file system after our answer and may refuse without
            // reading the data; its records, not a failed send, say what happened.
            let mut sent = exec.send(&go_line(data.len())).await;
            for chunk in data.chunks(1 << 20) {
                if sent.is_err() {
                    break;
                }
                sent = exec.send(chunk).await;
            }
            match exec.expect_ok().await {
                Ok(()) => sent,
                Err(e) => Err(self.protected_or(path, &canon, e)),
            }
        })
        .await
    }

    async fn create_dir_all(&self, path: &Path) -> Result<(), FsError> {
        let op = FileOp::Mkdir(path.to_path_buf());
        self.on_worker("mkdir", path, op, true, async |exec| {
            let canon = self.approve_write(exec, path).await?;
            let sent = exec.send(GO_LINE).await;
            match exec.expect_ok().await.and(sent) {
                Ok(()) => Ok(()),
                Err(e) => Err(self.protected_or(path, &canon, e)),
            }
        })
        .await
    }

    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
        let op = FileOp::Stat(path.to_path_buf());
        self.on_worker("stat", path, op, true, async |exec| {
            let canon = exec.expect_canon().await?;
            self.0.rules().check_read(path, &canon)?;
            let stat = match exec.expect().await? {
                FsRecord::Stat(stat) => stat,
                other => return Err(exec.backend_err(format!("unexpected answer {other:?}"))),
            };
            let (uid, gids) = self.0.account();
            Ok(FileMeta {
                kind: stat.kind,
                size: stat.size,
                mode: stat.mode,
                writable: stat.unprivileged_writable(uid, gids)
                    && self.0.rules().allows_write(&canon),
            })
        })
        .await
    }

    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        let op = FileOp::List(path.to_path_buf());
        self.on_worker("list", path, op, true, async |exec| {
            let canon = exec.expect_canon().await?;
            self.0.rules().check_read(path, &canon)?;
            let mut entries = Vec::new();
            loop {
                match exec.expect().await? {
                    FsRecord::Ent(entry) => {
                        let pinned = self.0.pinned();
                        if pinned.is_empty() || !pinned.contains(&canon.join(&entry.name)) {
                            entries.push(entry);
                        }
                    }
                    FsRecord::Ok => return Ok(entries),
                    other => {
                        return Err(exec.backend_err(format!("unexpected answer {other:?}")));
                    }
                }
            }
        })
        .await
    }

    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        let op = FileOp::Canon(path.to_path_buf());
        self.on_worker("resolve", path, op, true, async |exec| {
            let canon = exec.expect_canon().await?;
            exec.expect_ok().await?;
            if self.0.rules().is_denied(&canon) {
                return Err(FsError::Denied { path: canon });
            }
            Ok(canon)
        })
        .await
    }

    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        let name = spill_file_name();
        let dir = self.0.spill_dir().to_path_buf();
        let path = dir.join(&name);
        let mut exec = self
            .oneshot_helper("create", &path, FileOp::Spill { dir, name })
            .await?;
        let created = exec.expect_canon().await?;
        exec.expect_ok().await?;
        let (pipe, reader) = tokio::io::duplex(SPILL_PIPE);
        let done = tokio::spawn(pump_spill(exec.process, reader));
        Ok((
            created,
            // The helper's own errors reach the caller on the event stream, not here.
            Box::new(PipedSpill::new(pipe, done.map(|_joined| Ok(())))),
        ))
    }
}
