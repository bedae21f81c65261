//! [`FileOperations`] through the session's workers: each operation is one request to a
//! `cordon-remote` worker (no exec, no inspect: the helper's records say how it went); spill
//! files, which keep their exec open while bash writes, use a one-shot exec. Paths are confined
//! and canonicalised inside the container; protected/denied rules are judged here on the
//! canonical path before anything is written (writes and mkdir wait for our `go`).

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use async_trait::async_trait;
use cordon_remote::files::{
    FileOp, FsRecord, GO_LINE, STOP_LINE, files_argv, files_record_parser, fs_error, go_line,
    is_read_only_fs, parse_fs_record, spill_file_name,
};
use cordon_remote::records::RecordParser;
use cordon_remote::runner::Lease;
use cordon_remote::worker::{EndMarker, WorkerRequest, new_request_id};
use cordon_tools::ops::{BackendId, DirEntry, FileMeta, FileOperations, FsError, SpillWriter};
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::Inner;
use crate::client::{self, ExecInput, ExecOutput};

/// A file request in flight: on a worker (ends with its marker and `done` record, after which
/// the worker can serve the next call) or on a one-shot exec (ends with its streams). Records
/// arrive one by one; stdout is collected.
struct HelperExec {
    output: ExecOutput,
    input: ExecInput,
    parser: RecordParser,
    queue: std::collections::VecDeque<FsRecord>,
    stdout: Vec<u8>,
    op: &'static str,
    path: PathBuf,
    /// The worker's request: its id, end marker and whether `done` came.
    request: Option<(String, EndMarker, bool)>,
    /// The exec's id (a worker's, to give it back).
    id: String,
    /// Anything arrived for this request.
    answered: bool,
}

impl HelperExec {
    /// `exec` serving `op` on `path`: a worker's request with this id, or a one-shot exec.
    fn new(exec: client::Exec, op: &'static str, path: &Path, request_id: Option<&str>) -> Self {
        HelperExec {
            output: exec.output,
            input: exec.input,
            parser: files_record_parser(),
            queue: Default::default(),
            stdout: Vec::new(),
            op,
            path: path.to_path_buf(),
            request: request_id.map(|id| (id.to_owned(), EndMarker::new(id), false)),
            id: exec.id,
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
            let Some(frame) = self.output.next().await else {
                return Ok(None);
            };
            match frame.map_err(|e| self.backend_err(e.to_string()))? {
                bollard::container::LogOutput::StdOut { message }
                | bollard::container::LogOutput::Console { message } => {
                    let data = match self.request.as_mut() {
                        Some((_, marker, _)) => marker.feed(&message).data,
                        None => message.to_vec(),
                    };
                    self.answered |= !data.is_empty();
                    self.stdout.extend_from_slice(&data);
                }
                bollard::container::LogOutput::StdErr { message } => {
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
                bollard::container::LogOutput::StdIn { .. } => {}
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
        self.input
            .write_all(bytes)
            .await
            .map_err(|e| self.backend_err(e.to_string()))?;
        self.input
            .flush()
            .await
            .map_err(|e| self.backend_err(e.to_string()))
    }
}

/// How long finishing a request may take before the worker is given up.
const FINISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Inner {
    /// Start `file_op` on a worker and wait for its first record (every operation starts with
    /// `canon` or `err`). A pooled worker that died while idle is replaced by a fresh one once.
    async fn helper(
        &self,
        op: &'static str,
        path: &Path,
        file_op: FileOp,
    ) -> Result<HelperExec, FsError> {
        let backend_err = |reason: String| FsError::Backend {
            op,
            path: path.to_path_buf(),
            reason,
        };
        let id = new_request_id();
        let line = WorkerRequest::Fs {
            roots: self.roots.clone(),
            op: file_op,
        }
        .line(&id)
        .map_err(|e| backend_err(e.to_string()))?;
        let mut retried = false;
        loop {
            let seen = self.recovery.generation();
            let Lease {
                process: exec,
                pooled,
            } = match self.runner.take().await {
                Ok(lease) => lease,
                Err(reason) => {
                    return Err(backend_err(self.explain_failure(seen, reason).await));
                }
            };
            let mut helper = HelperExec::new(exec, op, path, Some(&id));
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
                    continue;
                }
                // Nothing was done: a dead container may explain the silence.
                Ok(None) => {
                    let reason = "the file helper ended without an answer".to_owned();
                    return Err(backend_err(self.explain_failure(seen, reason).await));
                }
                Err(FsError::Backend { reason, .. }) if !helper.answered => {
                    return Err(backend_err(self.explain_failure(seen, reason).await));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The request finished on the helper's side (successfully or with an `err` record): read
    /// to its end and keep the worker for the next call.
    async fn release(&self, mut helper: HelperExec) {
        let drained = tokio::time::timeout(FINISH_TIMEOUT, async {
            while let Ok(Some(_)) = helper.next().await {}
        })
        .await;
        let clean = drained.is_ok()
            && helper.finished()
            && !helper.parser.is_mid_record()
            && !matches!(&helper.request, Some((_, marker, _)) if marker.trailing());
        let exec = crate::client::Exec {
            id: helper.id,
            output: helper.output,
            input: helper.input,
        };
        self.runner.release(exec, clean);
        self.runner.keep_a_spare();
    }

    /// A one-shot exec of `file_op` (for operations that keep their exec: spill files).
    async fn oneshot_helper(
        &self,
        op: &'static str,
        path: &Path,
        file_op: FileOp,
    ) -> Result<HelperExec, FsError> {
        let backend_err = |reason: String| FsError::Backend {
            op,
            path: path.to_path_buf(),
            reason,
        };
        let argv = files_argv(&self.roots, &file_op).map_err(|e| backend_err(e.to_string()))?;
        let seen = self.recovery.generation();
        let exec = match client::start_exec(&self.docker, &self.container, argv, None).await {
            Ok(exec) => exec,
            Err(e) => return Err(backend_err(self.explain_failure(seen, e.to_string()).await)),
        };
        Ok(HelperExec::new(exec, op, path, None))
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
        self.rules.check_read(path, &canon)?;
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
        work: impl AsyncFnOnce(&mut HelperExec) -> Result<T, FsError>,
    ) -> Result<T, FsError> {
        let mut exec = self.helper(op, path, file_op).await?;
        let result = work(&mut exec).await;
        if result.is_ok() || reuse_after_error {
            self.release(exec).await;
        } else {
            drop(exec);
            self.runner.keep_a_spare();
        }
        result
    }

    /// The first step of a mutation: the canonical path, judged by the write rules; a
    /// refusal is sent to the helper (`stop`) before it touches anything.
    async fn approve_write(&self, exec: &mut HelperExec, path: &Path) -> Result<PathBuf, FsError> {
        let canon = exec.expect_canon().await?;
        if let Err(e) = self.rules.check_write(path, &canon) {
            let _ = exec.send(STOP_LINE).await;
            return Err(e);
        }
        Ok(canon)
    }

    fn protected_or(&self, path: &Path, canon: &Path, err: FsError) -> FsError {
        if is_read_only_fs(&err) && self.rules.is_protected(canon) {
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

/// The spill writer: bytes go to a `cat >>` exec's stdin; shutdown closes stdin and waits
/// until the helper has written everything.
struct ExecSpill {
    input: ExecInput,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl AsyncWrite for ExecSpill {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.input.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.input.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.input.as_mut().poll_shutdown(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        if let Some(done) = self.done.as_mut() {
            match Pin::new(done).poll(cx) {
                Poll::Ready(_) => self.done = None,
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

use std::future::Future;

#[async_trait]
impl FileOperations for Inner {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    fn root(&self) -> &Path {
        &self.workspace
    }

    fn home(&self) -> Option<&Path> {
        Some(&self.home)
    }

    fn spill_dir(&self) -> Option<&Path> {
        Some(&self.spill_dir)
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
        self.on_worker("write", path, op, false, async |exec: &mut HelperExec| {
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
        self.on_worker("mkdir", path, op, true, async |exec: &mut HelperExec| {
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
        self.on_worker("stat", path, op, true, async |exec: &mut HelperExec| {
            let canon = exec.expect_canon().await?;
            self.rules.check_read(path, &canon)?;
            let stat = match exec.expect().await? {
                FsRecord::Stat(stat) => stat,
                other => return Err(exec.backend_err(format!("unexpected answer {other:?}"))),
            };
            Ok(FileMeta {
                kind: stat.kind,
                size: stat.size,
                mode: stat.mode,
                writable: stat.unprivileged_writable(self.uid, &[self.gid])
                    && self.rules.allows_write(&canon),
            })
        })
        .await
    }

    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        let op = FileOp::List(path.to_path_buf());
        self.on_worker("list", path, op, true, async |exec: &mut HelperExec| {
            let canon = exec.expect_canon().await?;
            self.rules.check_read(path, &canon)?;
            let mut entries = Vec::new();
            loop {
                match exec.expect().await? {
                    FsRecord::Ent(entry) => entries.push(entry),
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
        self.on_worker("resolve", path, op, true, async |exec: &mut HelperExec| {
            let canon = exec.expect_canon().await?;
            exec.expect_ok().await?;
            if self.rules.is_denied(&canon) {
                return Err(FsError::Denied { path: canon });
            }
            Ok(canon)
        })
        .await
    }

    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        let name = spill_file_name();
        let path = self.spill_dir.join(&name);
        let mut exec = self
            .oneshot_helper(
                "create",
                &path,
                FileOp::Spill {
                    dir: self.spill_dir.clone(),
                    name,
                },
            )
            .await?;
        let created = exec.expect_canon().await?;
        exec.expect_ok().await?;
        let HelperExec {
            mut output, input, ..
        } = exec;
        let done = tokio::spawn(async move { while output.next().await.is_some() {} });
        Ok((
            created,
            Box::new(ExecSpill {
                input,
                done: Some(done),
            }),
        ))
    }
}
