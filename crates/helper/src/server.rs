//! The helper's side of the protocol ([`serve`]): read requests from one stream, run each on
//! the local backend of this host in its own task, write the answers to the other stream as
//! they complete (so many reads overlap on one channel).
//!
//! Order of a session: `hello` first (a client of another protocol version is refused),
//! `probe` whenever, `start` once (the client's spec and root become a `LocalBackend` here,
//! with every layer of the local sandbox, failing closed as it does locally), then any
//! number of operations, `cancel`s and finally `shutdown`. The end of the input stream ends
//! the session: every command still running is cancelled (its process tree killed), open
//! spill files are closed, the backend is shut down, and [`serve`] returns.
//!
//! Bounds: frames ([`crate::frame`]), requests in flight ([`MAX_IN_FLIGHT`]), open spill
//! files ([`MAX_OPEN_SPILLS`]). A malformed or out-of-order request is answered with an error
//! and the session goes on; a broken frame ends it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cordon_backend_local::{LocalBackend, LocalConfig};
use cordon_ops::{Backend, FileOperations, SpillWriter};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::frame::{Frame, FrameError, MAX_PAYLOAD_BYTES, read_frame, write_frame};
use cordon_egress::ask::{AskAnswer, AskRequest, EgressApprover};
use cordon_egress::rules::Host;

use crate::protocol::{
    Classification, Envelope, MAX_IN_FLIGHT, MAX_OPEN_QUESTIONS, MAX_OPEN_SPILLS, OUTPUT_WINDOW,
    PROTOCOL_VERSION, ProbeReport, Request, Response, SessionInfo, SessionStart, WireEntry,
    WireError, WirePath, WireQuestion,
};

/// Buffer of each direction of the stream.
pub(crate) const IO_BUFFER: usize = 64 * 1024;

/// Frames waiting for the writer.
const OUT_QUEUE: usize = 64;

/// Serve one client on `reader`/`writer` until the input ends. Returns the frame error that
/// ended it early, if one did (the session is cleaned up either way).
pub async fn serve<R, W>(reader: R, writer: W) -> Result<(), FrameError>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut reader = tokio::io::BufReader::with_capacity(IO_BUFFER, reader);
    let (out, queue) = mpsc::channel(OUT_QUEUE);
    let writer_task = tokio::spawn(write_frames(writer, queue));
    let server = Server::new(out);
    let mut tasks = JoinSet::new();
    let ended = loop {
        while tasks.try_join_next().is_some() {}
        match read_frame(&mut reader).await {
            Ok(frame) => server.dispatch(frame, &mut tasks),
            Err(FrameError::Eof) => break Ok(()),
            Err(error) => {
                tracing::warn!(%error, "helper: unreadable frame; ending the session");
                server
                    .send(
                        0,
                        &Response::Error {
                            error: WireError::Protocol {
                                message: error.to_string(),
                            },
                        },
                        Vec::new(),
                    )
                    .await;
                break Err(error);
            }
        }
    };
    server.finish(&mut tasks).await;
    drop(server);
    // Every sender is gone once the tasks are: the writer drains what is queued and ends.
    let _ = writer_task.await;
    ended
}

async fn write_frames<W: AsyncWrite + Unpin>(writer: W, mut queue: mpsc::Receiver<Frame>) {
    // One write per batch of frames, not three per frame: flushed when the queue is empty.
    let mut writer = tokio::io::BufWriter::with_capacity(IO_BUFFER, writer);
    while let Some(frame) = queue.recv().await {
        if let Err(error) = write_frame(&mut writer, &frame).await {
            tracing::warn!(%error, "helper: failed to write an answer; the client is gone");
            return;
        }
        if queue.is_empty()
            && let Err(error) = writer.flush().await
        {
            tracing::warn!(%error, "helper: failed to flush answers; the client is gone");
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// A handler's future with its panics caught: `Err` holds the panic's payload. (A panic in a
/// handler must become an error answer, not a request the client waits for forever.)
struct CatchPanic<'a>(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>);

impl std::future::Future for CatchPanic<'_> {
    type Output = Result<(), Box<dyn std::any::Any + Send>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let future = self.0.as_mut();
        // The future is not polled again after a panic (it is dropped with `self`), so no
        // broken state of it is ever observed.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.poll(cx))) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(())) => std::task::Poll::Ready(Ok(())),
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    }
}

/// The text of a panic's payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

/// Most bytes of output in one frame (a piece never exceeds the window).
const OUTPUT_PIECE: usize = 64 * 1024;

/// How much more of one command's output the client has room for
/// ([`crate::protocol::OUTPUT_WINDOW`]).
struct Window {
    credit: Semaphore,
    /// Bytes sent and not acknowledged yet: an acknowledgement never grants more than this.
    outstanding: AtomicU64,
}

impl Window {
    fn new() -> Window {
        Window {
            credit: Semaphore::new(OUTPUT_WINDOW as usize),
            outstanding: AtomicU64::new(0),
        }
    }

    fn acknowledge(&self, bytes: u64) {
        let taken = self
            .outstanding
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |outstanding| {
                Some(outstanding - bytes.min(outstanding))
            })
            .map_or(0, |before| bytes.min(before));
        self.credit
            .add_permits(usize::try_from(taken).unwrap_or(usize::MAX));
    }
}

/// An open spill file: writes to one are serialised by its lock.
type OpenSpill = Arc<tokio::sync::Mutex<SpillWriter>>;

struct Server {
    /// This server (for the approver the session's proxy asks through).
    me: std::sync::Weak<Server>,
    out: mpsc::Sender<Frame>,
    hello: AtomicBool,
    backend: OnceLock<Arc<LocalBackend>>,
    starting: AtomicBool,
    cancels: Mutex<HashMap<u64, CancellationToken>>,
    windows: Mutex<HashMap<u64, Arc<Window>>>,
    spills: Mutex<HashMap<u64, OpenSpill>>,
    next_spill: AtomicU64,
    in_flight: Arc<Semaphore>,
    /// Questions sent to the client (`ask` frames) waiting for its `answer`.
    questions: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<AskAnswer>>>,
    next_question: AtomicU64,
}

impl Server {
    /// A server whose answers go to `out`.
    fn new(out: mpsc::Sender<Frame>) -> Arc<Server> {
        Arc::new_cyclic(|me| Server {
            me: me.clone(),
            out,
            hello: AtomicBool::new(false),
            backend: OnceLock::new(),
            starting: AtomicBool::new(false),
            cancels: Mutex::new(HashMap::new()),
            windows: Mutex::new(HashMap::new()),
            spills: Mutex::new(HashMap::new()),
            next_spill: AtomicU64::new(1),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            questions: Mutex::new(HashMap::new()),
            next_question: AtomicU64::new(1),
        })
    }

    /// Queue one answer. A response that cannot be encoded or is over the header bound
    /// becomes an error answer naming why.
    async fn send(&self, id: u64, response: &Response, payload: Vec<u8>) {
        if payload.len() > MAX_PAYLOAD_BYTES {
            let error = WireError::Protocol {
                message: format!(
                    "the answer's data is {} bytes, more than one frame holds ({MAX_PAYLOAD_BYTES}); read the file in ranges",
                    payload.len()
                ),
            };
            return Box::pin(self.send_error(id, error)).await;
        }
        let frame = match encode(id, response) {
            Ok(header) => Frame { header, payload },
            Err(message) => {
                tracing::warn!(id, %message, "helper: answer could not be encoded");
                let error = Response::Error {
                    error: WireError::Protocol { message },
                };
                match encode(id, &error) {
                    Ok(header) => Frame {
                        header,
                        payload: Vec::new(),
                    },
                    Err(_) => return,
                }
            }
        };
        // A closed queue means the writer is gone (client gone): nothing to tell.
        let _ = self.out.send(frame).await;
    }

    async fn send_error(&self, id: u64, error: WireError) {
        self.send(id, &Response::Error { error }, Vec::new()).await;
    }

    fn dispatch(self: &Arc<Self>, frame: Frame, tasks: &mut JoinSet<()>) {
        let Frame { header, payload } = frame;
        let value: serde_json::Value = match serde_json::from_slice(&header) {
            Ok(value) => value,
            Err(error) => {
                let server = Arc::clone(self);
                tasks.spawn(async move {
                    server
                        .send_error(
                            0,
                            WireError::Protocol {
                                message: format!("malformed request header (not JSON): {error}"),
                            },
                        )
                        .await;
                });
                return;
            }
        };
        let id = value
            .get("id")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        let request = match serde_json::from_value::<Envelope<Request>>(value) {
            Ok(envelope) => envelope.body,
            Err(error) => {
                let server = Arc::clone(self);
                tasks.spawn(async move {
                    server
                        .send_error(
                            id,
                            WireError::Protocol {
                                message: format!("malformed request: {error}"),
                            },
                        )
                        .await;
                });
                return;
            }
        };
        if let Request::Ack { target, bytes } = request {
            if let Some(window) = self.lock_windows().get(&target) {
                window.acknowledge(bytes);
            }
            return;
        }
        if let Request::Answer { question, answer } = request {
            let waiting = self
                .questions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&question);
            match waiting {
                // The proxy may have stopped waiting (its bound, the command ended).
                Some(sender) => drop(sender.send(answer.into())),
                None => tracing::debug!(question, "helper: an answer to no open question"),
            }
            return;
        }
        if let Request::Cancel { target } = request {
            if let Some(token) = self.lock_cancels().get(&target) {
                tracing::debug!(target, "helper: request cancelled by the client");
                token.cancel();
            }
            return;
        }
        let refusal = if id == 0 {
            Some("request id 0 is reserved; number requests from 1".to_owned())
        } else if !matches!(request, Request::Hello { .. }) && !self.hello.load(Ordering::SeqCst) {
            Some("the first request must be hello".to_owned())
        } else if self.lock_cancels().contains_key(&id) {
            Some(format!("request id {id} is already in flight"))
        } else {
            None
        };
        let permit = match (refusal, Arc::clone(&self.in_flight).try_acquire_owned()) {
            (Some(message), _) => Err(message),
            (None, Ok(permit)) => Ok(permit),
            (None, Err(_)) => Err(format!(
                "too many requests in flight (limit {MAX_IN_FLIGHT}); wait for answers before sending more"
            )),
        };
        let server = Arc::clone(self);
        let token = CancellationToken::new();
        if permit.is_ok() {
            self.lock_cancels().insert(id, token.clone());
        }
        tasks.spawn(async move {
            match permit {
                Ok(_permit) => {
                    let handled =
                        CatchPanic(Box::pin(server.handle(id, request, payload, token))).await;
                    server.lock_cancels().remove(&id);
                    if let Err(panic) = handled {
                        server.answer_panic(id, panic_message(panic.as_ref())).await;
                    }
                }
                Err(message) => {
                    tracing::debug!(id, %message, "helper: request refused");
                    server.send_error(id, WireError::Protocol { message }).await;
                }
            }
        });
    }

    /// A handler panicked: the request gets an error answer (the client must not wait for
    /// one forever) and the session goes on. What the handler held is dropped with it (a
    /// command's child is killed on drop); its output window goes too.
    async fn answer_panic(&self, id: u64, what: String) {
        tracing::error!(id, panic = %what, "helper: a request handler panicked");
        self.lock_windows().remove(&id);
        self.send_error(
            id,
            WireError::Backend {
                reason: format!(
                    "the helper failed while serving this request (internal error: {what}); \
                     the session goes on: try again, or another way"
                ),
            },
        )
        .await;
    }

    fn lock_cancels(&self) -> std::sync::MutexGuard<'_, HashMap<u64, CancellationToken>> {
        self.cancels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_spills(&self) -> std::sync::MutexGuard<'_, HashMap<u64, OpenSpill>> {
        self.spills.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn backend(&self) -> Result<&Arc<LocalBackend>, WireError> {
        self.backend.get().ok_or_else(|| WireError::Protocol {
            message: "no session: send start first".to_owned(),
        })
    }

    async fn handle(&self, id: u64, request: Request, payload: Vec<u8>, cancel: CancellationToken) {
        let answer = match request {
            Request::Hello { version } => self.hello(version),
            Request::Probe => Ok((
                Response::Probe {
                    support: ProbeReport::from(cordon_backend_local::probe_host()),
                },
                Vec::new(),
            )),
            Request::Start { session } => self.start(*session).await,
            Request::Exec { request } => {
                return self.exec(id, request.into(), cancel).await;
            }
            Request::Cancel { .. } | Request::Ack { .. } | Request::Answer { .. } => return,
            #[cfg(test)]
            Request::Panic => panic!("a handler that panics, for the test"),
            other => self.operation(other, payload, cancel).await,
        };
        match answer {
            Ok((response, payload)) => self.send(id, &response, payload).await,
            Err(error) => self.send_error(id, error).await,
        }
    }

    fn hello(&self, version: u32) -> Result<(Response, Vec<u8>), WireError> {
        if version != PROTOCOL_VERSION {
            tracing::warn!(
                client = version,
                helper = PROTOCOL_VERSION,
                "helper: protocol version mismatch; refusing the client"
            );
            return Err(WireError::Version {
                helper: PROTOCOL_VERSION,
                client: version,
            });
        }
        self.hello.store(true, Ordering::SeqCst);
        Ok((
            Response::Hello {
                version: PROTOCOL_VERSION,
                helper: env!("CARGO_PKG_VERSION").to_owned(),
            },
            Vec::new(),
        ))
    }

    async fn start(&self, session: SessionStart) -> Result<(Response, Vec<u8>), WireError> {
        if self.starting.swap(true, Ordering::SeqCst) {
            return Err(WireError::Protocol {
                message: "a session was already started on this helper".to_owned(),
            });
        }
        let SessionStart {
            root,
            spec,
            home,
            state_base,
            simulate_support,
            profile,
            workspace_is_copy,
            ask,
        } = session;
        let approver = ask.map(|setup| {
            Arc::new(ClientApprover {
                server: self.me.clone(),
                within: setup.answer_within_ms.map(std::time::Duration::from_millis),
            }) as Arc<dyn EgressApprover>
        });
        let config = LocalConfig {
            root: root.0,
            spec,
            home: home.map(WirePath::into_path),
            state_base: state_base.map(WirePath::into_path),
            profile: profile.into(),
            workspace_is_copy,
        };
        let built = tokio::task::spawn_blocking(move || {
            let support = simulate_support.map(|wish| {
                let real = ProbeReport::from(cordon_backend_local::probe_host());
                wish.intersect(real).into()
            });
            LocalBackend::with_parts(config, support, None, approver)
        })
        .await;
        let backend = match built {
            Ok(Ok(backend)) => backend,
            Ok(Err(error)) => {
                tracing::warn!(%error, "helper: the session could not start");
                self.starting.store(false, Ordering::SeqCst);
                return Err(WireError::Start {
                    message: error.to_string(),
                });
            }
            Err(error) => {
                self.starting.store(false, Ordering::SeqCst);
                return Err(WireError::Start {
                    message: format!("the start task failed: {error}"),
                });
            }
        };
        let files = backend.files();
        let info = SessionInfo {
            backend_id: backend.id().to_string(),
            root: WirePath::from(backend.root()),
            home: files.home().map(WirePath::from),
            spill_dir: WirePath::from(backend.spill_dir()),
            missing_layers: backend.missing_layers(),
        };
        tracing::info!(
            backend = %info.backend_id,
            missing_layers = ?info.missing_layers,
            "helper: session started"
        );
        // `starting` is set only once, so the cell is empty here.
        let _ = self.backend.set(Arc::new(backend));
        Ok((
            Response::Started {
                session: Box::new(info),
            },
            Vec::new(),
        ))
    }

    async fn operation(
        &self,
        request: Request,
        payload: Vec<u8>,
        cancel: CancellationToken,
    ) -> Result<(Response, Vec<u8>), WireError> {
        let backend = self.backend()?;
        let files = backend.files();
        let fs = |error: cordon_ops::FsError| WireError::from(&error);
        let bytes = |data: Vec<u8>| (Response::Bytes, data);
        match request {
            Request::ReadFile { path } => files.read_file(&path.0).await.map(bytes).map_err(fs),
            Request::ReadHead { path, max_bytes } => files
                .read_head(&path.0, payload_bound(max_bytes))
                .await
                .map(bytes)
                .map_err(fs),
            Request::ReadRange {
                path,
                offset,
                max_bytes,
            } => files
                .read_range(&path.0, offset, payload_bound(max_bytes))
                .await
                .map(bytes)
                .map_err(fs),
            Request::WriteFile { path } => files
                .write_file(&path.0, &payload)
                .await
                .map(|()| (Response::Ok, Vec::new()))
                .map_err(fs),
            Request::CreateDirAll { path } => files
                .create_dir_all(&path.0)
                .await
                .map(|()| (Response::Ok, Vec::new()))
                .map_err(fs),
            Request::Metadata { path } => files
                .metadata(&path.0)
                .await
                .map(|meta| (Response::Metadata { meta }, Vec::new()))
                .map_err(fs),
            Request::ReadDir { path } => files
                .read_dir(&path.0)
                .await
                .map(|entries| (Response::Entries { entries }, Vec::new()))
                .map_err(fs),
            Request::Canonicalize { path } => files
                .canonicalize(&path.0)
                .await
                .map(|path| (Response::Path { path: path.into() }, Vec::new()))
                .map_err(fs),
            Request::SpillCreate => self.spill_create(files.as_ref()).await,
            Request::SpillWrite { spill } => self.spill_write(spill, &payload).await,
            Request::SpillClose { spill } => self.spill_close(spill).await,
            Request::Grep { request } => backend
                .search()
                .grep(request.into(), cancel)
                .await
                .map(|output| {
                    (
                        Response::Grep {
                            output: output.into(),
                        },
                        Vec::new(),
                    )
                })
                .map_err(|error| WireError::from(&error)),
            Request::Find { request } => backend
                .search()
                .find(request.into(), cancel)
                .await
                .map(|output| {
                    (
                        Response::Find {
                            output: output.into(),
                        },
                        Vec::new(),
                    )
                })
                .map_err(|error| WireError::from(&error)),
            Request::Classify { paths } => classify(backend, paths),
            Request::Shutdown => {
                tracing::info!("helper: session shut down by the client");
                self.close_spills().await;
                backend
                    .shutdown()
                    .await
                    .map(|()| (Response::Ok, Vec::new()))
                    .map_err(|error| WireError::Backend {
                        reason: error.to_string(),
                    })
            }
            Request::Hello { .. }
            | Request::Probe
            | Request::Start { .. }
            | Request::Exec { .. }
            | Request::Ack { .. }
            | Request::Answer { .. }
            | Request::Cancel { .. } => Err(WireError::Protocol {
                message: "request routed to the wrong handler".to_owned(),
            }),
            #[cfg(test)]
            Request::Panic => Err(WireError::Protocol {
                message: "request routed to the wrong handler".to_owned(),
            }),
        }
    }

    async fn spill_create(
        &self,
        files: &dyn FileOperations,
    ) -> Result<(Response, Vec<u8>), WireError> {
        if self.lock_spills().len() >= MAX_OPEN_SPILLS {
            return Err(WireError::Protocol {
                message: format!(
                    "too many open spill files (limit {MAX_OPEN_SPILLS}); close one first"
                ),
            });
        }
        let (path, writer) = files
            .create_spill_file()
            .await
            .map_err(|error| WireError::from(&error))?;
        let spill = self.next_spill.fetch_add(1, Ordering::SeqCst);
        self.lock_spills()
            .insert(spill, Arc::new(tokio::sync::Mutex::new(writer)));
        Ok((
            Response::Spill {
                spill,
                path: path.into(),
            },
            Vec::new(),
        ))
    }

    fn open_spill(&self, spill: u64) -> Result<OpenSpill, WireError> {
        self.lock_spills()
            .get(&spill)
            .cloned()
            .ok_or_else(|| WireError::Protocol {
                message: format!("no open spill file with handle {spill}"),
            })
    }

    async fn spill_write(&self, spill: u64, data: &[u8]) -> Result<(Response, Vec<u8>), WireError> {
        let writer = self.open_spill(spill)?;
        let mut writer = writer.lock().await;
        writer
            .write_all(data)
            .await
            .map(|()| (Response::Ok, Vec::new()))
            .map_err(|error| spill_error("write spill file", &error))
    }

    async fn spill_close(&self, spill: u64) -> Result<(Response, Vec<u8>), WireError> {
        let writer = self.open_spill(spill)?;
        self.lock_spills().remove(&spill);
        let mut writer = writer.lock().await;
        writer
            .shutdown()
            .await
            .map(|()| (Response::Ok, Vec::new()))
            .map_err(|error| spill_error("write spill file", &error))
    }

    async fn close_spills(&self) {
        let open: Vec<OpenSpill> = self.lock_spills().drain().map(|(_, spill)| spill).collect();
        for spill in open {
            if let Err(error) = spill.lock().await.shutdown().await {
                tracing::warn!(%error, "helper: failed to close a spill file at the end");
            }
        }
    }

    async fn exec(&self, id: u64, request: cordon_ops::ExecRequest, cancel: CancellationToken) {
        let backend = match self.backend() {
            Ok(backend) => backend,
            Err(error) => return self.send_error(id, error).await,
        };
        let bash = backend.bash();
        let window = Arc::new(Window::new());
        self.lock_windows().insert(id, Arc::clone(&window));
        let (chunks, mut received) = mpsc::channel::<Vec<u8>>(16);
        // Output is forwarded while the command runs (so its timeout and cancel act even while
        // the client is slow to take output); the command's own pipe is the back-pressure.
        let forward = async {
            while let Some(chunk) = received.recv().await {
                self.send_output(id, chunk, &window, &cancel).await;
            }
        };
        let (outcome, ()) = tokio::join!(bash.exec(request, cancel.clone(), chunks), forward);
        self.lock_windows().remove(&id);
        match outcome {
            Ok(outcome) => self.send(id, &Response::Exec { outcome }, Vec::new()).await,
            Err(error) => self.send_error(id, WireError::from(&error)).await,
        }
    }

    /// Send a chunk of output within the window the client acknowledged; once the command is
    /// cancelled, what the client has no room for is dropped (nobody waits for it).
    async fn send_output(
        &self,
        id: u64,
        chunk: Vec<u8>,
        window: &Window,
        cancel: &CancellationToken,
    ) {
        for part in chunk.chunks(OUTPUT_PIECE) {
            let len = part.len() as u32;
            tokio::select! {
                permit = window.credit.acquire_many(len) => match permit {
                    Ok(permit) => permit.forget(),
                    Err(_) => return,
                },
                () = cancel.cancelled() => {
                    tracing::debug!(id, "helper: output of a cancelled command dropped");
                    return;
                }
            }
            window
                .outstanding
                .fetch_add(u64::from(len), Ordering::SeqCst);
            self.send(id, &Response::Output, part.to_vec()).await;
        }
    }

    fn lock_windows(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Window>>> {
        self.windows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The end of the input: cancel what runs (commands' trees are killed), wait for every
    /// task, close spill files, shut the backend down.
    async fn finish(&self, tasks: &mut JoinSet<()>) {
        let running: Vec<CancellationToken> = self.lock_cancels().values().cloned().collect();
        if !running.is_empty() {
            tracing::info!(
                requests = running.len(),
                "helper: input ended; cancelling what still runs"
            );
        }
        for token in running {
            token.cancel();
        }
        while tasks.join_next().await.is_some() {}
        self.close_spills().await;
        if let Some(backend) = self.backend.get() {
            if let Err(error) = backend.shutdown().await {
                tracing::warn!(%error, "helper: backend shutdown lost work");
            }
            tracing::info!("helper: session ended");
        }
    }
}

/// Classify paths a failed command's output names, against the backend's layout.
fn classify(
    backend: &LocalBackend,
    paths: Vec<WirePath>,
) -> Result<(Response, Vec<u8>), WireError> {
    if paths.len() > cordon_ops::denial::MAX_PATHS {
        return Err(WireError::Protocol {
            message: format!(
                "too many paths to classify ({}, limit {})",
                paths.len(),
                cordon_ops::denial::MAX_PATHS
            ),
        });
    }
    let bash = backend.bash();
    let Some(layout) = bash.denial_layout() else {
        return Ok((
            Response::Classified {
                entries: Vec::new(),
            },
            Vec::new(),
        ));
    };
    let entries = paths
        .iter()
        .map(|path| Classification {
            entry: layout.classify(&path.0).map(WireEntry::from),
            mode_allows_write: layout.mode_allows_write(&path.0),
        })
        .collect();
    Ok((Response::Classified { entries }, Vec::new()))
}

/// A `max_bytes` from the wire as a read bound (never more than one payload).
fn payload_bound(max_bytes: u64) -> usize {
    usize::try_from(max_bytes)
        .unwrap_or(usize::MAX)
        .min(MAX_PAYLOAD_BYTES)
}

fn spill_error(op: &'static str, error: &std::io::Error) -> WireError {
    WireError::Io {
        op: op.to_owned(),
        path: WirePath::from(Path::new("spill file")),
        io: error.into(),
    }
}

fn encode<T: Serialize>(id: u64, body: &T) -> Result<Vec<u8>, String> {
    let header = serde_json::to_vec(&Envelope { id, body })
        .map_err(|error| format!("failed to encode the answer: {error}"))?;
    if header.len() > crate::frame::MAX_HEADER_BYTES {
        return Err(format!(
            "the answer is {} bytes, more than one frame holds ({}); narrow the request",
            header.len(),
            crate::frame::MAX_HEADER_BYTES
        ));
    }
    Ok(header)
}

/// The session proxy's approver when the client answers questions: each question goes to
/// the client as an `ask` frame (request id 0) and waits for its `answer`. At most
/// [`MAX_OPEN_QUESTIONS`] wait at once (more get "nobody to ask"); a question the proxy
/// stops waiting for is forgotten and withdrawn (a `withdrawn` frame), and one open when the
/// session ends is unanswered.
struct ClientApprover {
    server: std::sync::Weak<Server>,
    within: Option<std::time::Duration>,
}

/// Removes a question when its asker stops waiting.
struct OpenQuestion {
    server: std::sync::Weak<Server>,
    question: u64,
}

impl Drop for OpenQuestion {
    fn drop(&mut self) {
        let Some(server) = self.server.upgrade() else {
            return;
        };
        let unanswered = server
            .questions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.question)
            .is_some();
        if !unanswered {
            return;
        }
        // Tell the client, so the person is not left with a question nobody waits for. Best
        // effort: with the queue full the client's approver gives up at its own bound.
        match encode(
            0,
            &Response::Withdrawn {
                question: self.question,
            },
        ) {
            Ok(header) => {
                let _ = server.out.try_send(Frame {
                    header,
                    payload: Vec::new(),
                });
            }
            Err(error) => tracing::warn!(%error, "helper: a withdrawal could not be encoded"),
        }
    }
}

#[async_trait::async_trait]
impl EgressApprover for ClientApprover {
    async fn ask(&self, request: AskRequest) -> AskAnswer {
        let Some(server) = self.server.upgrade() else {
            return AskAnswer::Unavailable;
        };
        let (sender, answer) = tokio::sync::oneshot::channel();
        let question = {
            let mut questions = server
                .questions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if questions.len() >= MAX_OPEN_QUESTIONS {
                tracing::warn!(
                    max = MAX_OPEN_QUESTIONS,
                    "helper: too many questions waiting for the client; this one has nobody to ask"
                );
                return AskAnswer::Unavailable;
            }
            let question = server.next_question.fetch_add(1, Ordering::Relaxed);
            questions.insert(question, sender);
            question
        };
        let _open = OpenQuestion {
            server: self.server.clone(),
            question,
        };
        let AskRequest {
            call,
            host,
            port,
            entry,
            ..
        } = request;
        let host = match host {
            Host::Name(name) => name.to_string(),
            Host::Ip(ip) => ip.to_string(),
        };
        server
            .send(
                0,
                &Response::Ask(WireQuestion {
                    question,
                    call: call.map(|call| call.to_string()),
                    host,
                    port,
                    entry: entry.entry.to_string(),
                    source: entry.source.to_string(),
                }),
                Vec::new(),
            )
            .await;
        // Not held while waiting: the session's end must not wait for the person.
        drop(server);
        answer.await.unwrap_or(AskAnswer::Unavailable)
    }

    fn answer_within(&self) -> Option<std::time::Duration> {
        self.within
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn send_request<W: AsyncWrite + Unpin>(writer: &mut W, id: u64, body: Request) {
        let header = serde_json::to_vec(&Envelope { id, body }).expect("encode");
        write_frame(
            writer,
            &Frame {
                header,
                payload: Vec::new(),
            },
        )
        .await
        .expect("send");
        writer.flush().await.expect("flush");
    }

    async fn answer<R: AsyncRead + Unpin>(reader: &mut R) -> Envelope<Response> {
        let frame = read_frame(reader).await.expect("an answer");
        serde_json::from_slice(&frame.header).expect("json")
    }

    /// A handler that panics gets its request an error answer, and the helper goes on
    /// serving the same stream.
    #[tokio::test]
    async fn a_panicking_handler_is_answered_with_an_error_and_the_session_goes_on() {
        let (client, helper) = tokio::io::duplex(64 * 1024);
        let (helper_read, helper_write) = tokio::io::split(helper);
        let served = tokio::spawn(serve(helper_read, helper_write));
        let (mut from_helper, mut to_helper) = tokio::io::split(client);
        send_request(
            &mut to_helper,
            1,
            Request::Hello {
                version: PROTOCOL_VERSION,
            },
        )
        .await;
        assert!(matches!(
            answer(&mut from_helper).await.body,
            Response::Hello { .. }
        ));
        send_request(&mut to_helper, 2, Request::Panic).await;
        let failed = answer(&mut from_helper).await;
        assert_eq!(failed.id, 2);
        match failed.body {
            Response::Error {
                error: WireError::Backend { reason },
            } => assert!(
                reason.contains("internal error: a handler that panics, for the test"),
                "{reason}"
            ),
            other => panic!("expected an error answer, got {other:?}"),
        }
        // The stream is still served: the next request is answered.
        send_request(&mut to_helper, 3, Request::Probe).await;
        let probed = answer(&mut from_helper).await;
        assert_eq!(probed.id, 3);
        assert!(matches!(probed.body, Response::Probe { .. }), "{probed:?}");
        to_helper.shutdown().await.expect("end the input");
        served.await.expect("the server task").expect("a clean end");
    }

    #[test]
    fn acknowledgements_never_grant_more_than_was_sent() {
        let window = Window::new();
        let full = OUTPUT_WINDOW as usize;
        window
            .credit
            .try_acquire_many(u32::try_from(full).expect("fits"))
            .expect("the whole window")
            .forget();
        window.outstanding.store(OUTPUT_WINDOW, Ordering::SeqCst);
        window.acknowledge(100);
        assert_eq!(window.credit.available_permits(), 100);
        // A client acknowledging more than it received gets the window back, not more.
        window.acknowledge(u64::MAX);
        assert_eq!(window.credit.available_permits(), full);
        window.acknowledge(5);
        assert_eq!(window.credit.available_permits(), full);
    }

    fn ask_request() -> AskRequest {
        AskRequest {
            session: Arc::from("test"),
            call: Some(Arc::from("call-1")),
            host: Host::parse("pkg.example").expect("host"),
            port: 443,
            entry: cordon_egress::rules::Matched {
                entry: Arc::from("pkg.example"),
                source: Arc::from("policy.toml:3"),
            },
        }
    }

    /// Questions go to the client as `ask` frames; at most `MAX_OPEN_QUESTIONS` wait at once,
    /// one the proxy stops waiting for is forgotten, and an answer reaches its question.
    #[tokio::test]
    async fn questions_to_the_client_are_bounded_forgotten_and_answered() {
        let (out, mut frames) = mpsc::channel(OUT_QUEUE);
        let server = Server::new(out);
        let approver = Arc::new(ClientApprover {
            server: Arc::downgrade(&server),
            within: None,
        });
        let mut waiting = Vec::new();
        for _ in 0..MAX_OPEN_QUESTIONS {
            let approver = Arc::clone(&approver);
            waiting.push(tokio::spawn(
                async move { approver.ask(ask_request()).await },
            ));
        }
        let mut numbers = Vec::new();
        for _ in 0..MAX_OPEN_QUESTIONS {
            let frame = frames.recv().await.expect("an ask frame");
            let envelope: Envelope<Response> = serde_json::from_slice(&frame.header).expect("json");
            assert_eq!(envelope.id, 0);
            match envelope.body {
                Response::Ask(WireQuestion {
                    question,
                    call,
                    host,
                    port,
                    entry,
                    source,
                }) => {
                    assert_eq!(
                        (
                            call.as_deref(),
                            host.as_str(),
                            port,
                            entry.as_str(),
                            source.as_str()
                        ),
                        (
                            Some("call-1"),
                            "pkg.example",
                            443,
                            "pkg.example",
                            "policy.toml:3"
                        )
                    );
                    numbers.push(question);
                }
                other => panic!("not a question: {other:?}"),
            }
        }
        // One more: nobody to ask.
        assert_eq!(approver.ask(ask_request()).await, AskAnswer::Unavailable);
        // The proxy stops waiting for one: it is forgotten, and there is room again.
        let stopped = waiting.pop().expect("a question");
        stopped.abort();
        let _ = stopped.await;
        assert_eq!(
            server.questions.lock().expect("questions").len(),
            MAX_OPEN_QUESTIONS - 1
        );
        // ... and withdrawn, so the client stops asking the person.
        let open: std::collections::HashSet<u64> = server
            .questions
            .lock()
            .expect("questions")
            .keys()
            .copied()
            .collect();
        // (Bounded only so that a missing withdrawal fails instead of hanging.)
        let frame = tokio::time::timeout(std::time::Duration::from_secs(60), frames.recv())
            .await
            .expect("a withdrawal is sent")
            .expect("a withdrawn frame");
        let envelope: Envelope<Response> = serde_json::from_slice(&frame.header).expect("json");
        assert_eq!(envelope.id, 0);
        match envelope.body {
            Response::Withdrawn { question } => {
                assert!(numbers.contains(&question) && !open.contains(&question));
            }
            other => panic!("not a withdrawal: {other:?}"),
        }
        // The client's answer reaches its question.
        let first = numbers[0];
        let sender = server
            .questions
            .lock()
            .expect("questions")
            .remove(&first)
            .expect("open");
        sender.send(AskAnswer::Session).expect("waiting");
        assert_eq!(waiting.remove(0).await.expect("join"), AskAnswer::Session);
        // The session ends: the rest have nobody to answer them.
        drop(server);
        for question in waiting {
            assert_eq!(question.await.expect("join"), AskAnswer::Unavailable);
        }
    }
}
