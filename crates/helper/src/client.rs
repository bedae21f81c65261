//! The client side of the protocol: [`HelperConnection`] (a helper that said hello: probe it,
//! start a session) and [`HelperClient`] (a started session, implementing the backend traits
//! over the stream).
//!
//! One reader task routes answers to the call waiting for their request id, one writer task
//! sends frames in the order calls queue them, so calls overlap on the one stream. When the
//! stream ends or breaks, every waiting call fails with [`HelperError::Closed`] (as the
//! operation's "backend unavailable" error) and [`HelperClient::is_dead`] turns true: the
//! owner starts a new helper for the next call ([`crate::HelperBackend`] does).
//!
//! A call dropped before its answer (the caller gave up) sends `cancel` for it; `exec` also
//! sends it when its cancellation token fires, and the helper kills the command's tree.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};

use async_trait::async_trait;
use cordon_core::sandbox::SandboxSpec;
use cordon_ops::denial::{DenialLayout, PathEntry, TAIL_BYTES, paths_to_classify};
use cordon_ops::{
    BackendId, BashOperations, DirEntry, ExecError, ExecOutcome, ExecRequest, FileMeta,
    FileOperations, FindOutput, FindRequest, FsError, GrepOutput, GrepRequest, SearchError,
    SearchOperations, SpillWriter,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::HelperError;
use crate::frame::{Frame, FrameError, MAX_PAYLOAD_BYTES, read_frame, write_frame};
use cordon_egress::ask::{AskRequest, EgressApprover};

use crate::protocol::{
    AskSetup, Classification, Envelope, MAX_IN_FLIGHT, MAX_OPEN_QUESTIONS, MAX_QUESTION_TEXT,
    OUTPUT_WINDOW, PROTOCOL_VERSION, ProbeReport, Request, Response, SessionInfo, SessionStart,
    WireAskAnswer, WireError, WirePath, WireQuestion,
};
use crate::server::IO_BUFFER;

/// Frames queued for the writer.
const OUT_QUEUE: usize = 64;

/// Bytes of spill output sent per request.
const SPILL_CHUNK: usize = 256 * 1024;

/// An answer and its payload.
type Answer = (Response, Vec<u8>);

/// What the reader and writer tasks share with the calls.
struct Link {
    out: mpsc::Sender<Frame>,
    /// Where each call's answers go. Unbounded so the reader never waits for one call (that
    /// would stall every other): a call gets one answer, except a command, whose output the
    /// helper sends only within the window the call acknowledges (`OUTPUT_WINDOW`). The
    /// reader holds the helper to that ([`Pending::admit`]): the helper may be on a host
    /// that is not trusted, and its answers must not fill this process's memory.
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    in_flight: Arc<Semaphore>,
    dead: CancellationToken,
    death: Mutex<Option<String>>,
    /// Who answers the helper's `[network] ask` questions, once the session asked for them.
    questions: std::sync::OnceLock<Questions>,
}

/// The client's side of `[network] ask` questions (`ask` frames from the helper).
struct Questions {
    approver: Arc<dyn EgressApprover>,
    /// The session label questions carry.
    session: Arc<str>,
    /// The tool calls of the commands running on this connection, how many each has, and a
    /// token cancelled when the last of them ends: a question must name one of them (the
    /// helper may be on a host that is not trusted, and its questions reach a person), and
    /// stops being asked when that call's commands ended, whatever the helper says.
    running: Mutex<HashMap<String, (usize, CancellationToken)>>,
    /// Questions being answered at once ([`MAX_OPEN_QUESTIONS`]).
    open: Arc<Semaphore>,
    /// The questions being answered, by number: cancelled when the helper withdraws one
    /// (its proxy stopped waiting), so the approver stops asking the person.
    asking: Mutex<HashMap<u64, CancellationToken>>,
}

/// A running command's call, registered while it runs (see [`Questions::running`]).
struct RunningCall {
    link: Arc<Link>,
    call: String,
}

impl Drop for RunningCall {
    fn drop(&mut self) {
        if let Some(questions) = self.link.questions.get() {
            let mut running = questions
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some((count, ended)) = running.get_mut(&self.call) {
                *count -= 1;
                if *count == 0 {
                    ended.cancel();
                    running.remove(&self.call);
                }
            }
        }
    }
}

/// One call waiting for answers, and what the helper may still send it.
struct Pending {
    sender: mpsc::UnboundedSender<Answer>,
    /// Bytes of command output delivered to the call and not acknowledged yet.
    unacknowledged: u64,
    /// Whether the call's last answer (anything but output) arrived.
    answered: bool,
}

impl Pending {
    fn new(sender: mpsc::UnboundedSender<Answer>) -> Pending {
        Pending {
            sender,
            unacknowledged: 0,
            answered: false,
        }
    }

    /// Take an answer of `len` payload bytes for this call, or say how it breaks the
    /// protocol: output beyond the window the client acknowledged, or anything after the
    /// last answer. An empty piece of output counts as one byte, so the number of queued
    /// answers is bounded too.
    fn admit(&mut self, answer: &Response, len: usize) -> Result<(), String> {
        if self.answered {
            return Err("it answered one request twice".to_owned());
        }
        if let Response::Output = answer {
            let unacknowledged = self.unacknowledged.saturating_add(len.max(1) as u64);
            if unacknowledged > OUTPUT_WINDOW {
                return Err(format!(
                    "it sent {unacknowledged} bytes of a command's output the client had not \
                     acknowledged, more than the window of {OUTPUT_WINDOW}"
                ));
            }
            self.unacknowledged = unacknowledged;
        } else {
            self.answered = true;
        }
        Ok(())
    }
}

impl Link {
    /// A link whose requests go to `out`, numbered from 1.
    fn new(out: mpsc::Sender<Frame>) -> Arc<Link> {
        Arc::new(Link {
            out,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            dead: CancellationToken::new(),
            death: Mutex::new(None),
            questions: std::sync::OnceLock::new(),
        })
    }

    /// Register `call` as running a command until the guard is dropped (only when questions
    /// are answered on this connection).
    fn running(self: &Arc<Self>, call: Option<&str>) -> Option<RunningCall> {
        let questions = self.questions.get()?;
        let call = call?.to_owned();
        questions
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(call.clone())
            .or_insert_with(|| (0, CancellationToken::new()))
            .0 += 1;
        Some(RunningCall {
            link: Arc::clone(self),
            call,
        })
    }

    /// Answer the helper's question in a task of its own (the reader never waits for a
    /// person), then send the answer. At most [`MAX_OPEN_QUESTIONS`] such tasks exist: beyond
    /// that (or without an approver) the question is refused at once, and when even that
    /// answer does not fit the queue it is dropped (the helper's proxy stops waiting at its
    /// own bound). The helper may be on a host that is not trusted: its questions must not
    /// fill this process's memory.
    fn take_question(self: &Arc<Self>, question: WireQuestion) {
        let number = question.question;
        let permit = self
            .questions
            .get()
            .and_then(|questions| Arc::clone(&questions.open).try_acquire_owned().ok());
        let Some(permit) = permit else {
            tracing::warn!(
                max = MAX_OPEN_QUESTIONS,
                "helper: a question refused without asking (no approver, or too many at once)"
            );
            if let Some(frame) = answer_frame(&self.next_id, number, WireAskAnswer::Unavailable) {
                let _ = self.out.try_send(frame);
            }
            return;
        };
        let Some(questions) = self.questions.get() else {
            return;
        };
        let withdrawn = CancellationToken::new();
        {
            let mut asking = questions
                .asking
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if asking.contains_key(&number) {
                // One number, one question: a second one would take the first's answer.
                drop(asking);
                tracing::warn!(
                    question = number,
                    "helper: a question with the number of one being answered; refused"
                );
                if let Some(frame) = answer_frame(&self.next_id, number, WireAskAnswer::Unavailable)
                {
                    let _ = self.out.try_send(frame);
                }
                return;
            }
            asking.insert(number, withdrawn.clone());
        }
        let link = Arc::clone(self);
        tokio::spawn(async move {
            // Dropping the approver's future withdraws the question from the person: when
            // the helper withdraws it, or when the stream ends.
            let answer = tokio::select! {
                answer = link.answer(question) => Some(answer),
                () = withdrawn.cancelled() => None,
                () = link.dead.cancelled() => None,
            };
            if let Some(questions) = link.questions.get() {
                questions
                    .asking
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&number);
            }
            if let Some(frame) =
                answer.and_then(|answer| answer_frame(&link.next_id, number, answer))
            {
                tokio::select! {
                    _ = link.out.send(frame) => {}
                    () = link.dead.cancelled() => {}
                }
            }
            drop(permit);
        });
    }

    /// The helper's proxy stopped waiting for question `number`: stop asking it.
    fn withdraw(&self, number: u64) {
        let Some(questions) = self.questions.get() else {
            return;
        };
        // The question's task removes it when it ends (so its number stays taken until then).
        let token = questions
            .asking
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&number)
            .cloned();
        match token {
            Some(token) => {
                tracing::debug!(question = number, "helper withdrew a question");
                token.cancel();
            }
            None => tracing::debug!(question = number, "helper withdrew no open question"),
        }
    }

    /// The approver's answer to `question`, or a refusal when it cannot be asked: no approver
    /// on this connection, a question that is malformed or names no command running here.
    async fn answer(&self, question: WireQuestion) -> WireAskAnswer {
        let Some(questions) = self.questions.get() else {
            tracing::warn!("helper asked a question although the session does not answer any");
            return WireAskAnswer::Unavailable;
        };
        let WireQuestion {
            call,
            host,
            port,
            entry,
            source,
            ..
        } = question;
        let long = [&host, &entry, &source]
            .into_iter()
            .chain(call.as_ref())
            .any(|text| text.len() > MAX_QUESTION_TEXT);
        let parsed = cordon_egress::rules::Host::parse(&host);
        let ended = call.as_ref().and_then(|call| {
            questions
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(call)
                .map(|(_, ended)| ended.clone())
        });
        let (Ok(host), Some(call), Some(ended), false) = (parsed, call, ended, long) else {
            // Debug-formatted: the helper's text cannot break the log's lines.
            tracing::warn!(
                host = ?host.chars().take(256).collect::<String>(),
                "helper: a question that is malformed or names no command running here; refused without asking"
            );
            return WireAskAnswer::Unavailable;
        };
        let request = AskRequest {
            session: Arc::clone(&questions.session),
            call: Some(Arc::from(call)),
            host,
            port,
            entry: cordon_egress::rules::Matched {
                entry: Arc::from(entry),
                source: Arc::from(source),
            },
        };
        // The call's commands ended: nobody waits for this answer any more (dropping the
        // approver's future withdraws the question), whether or not the helper says so.
        tokio::select! {
            answer = questions.approver.ask(request) => answer.into(),
            () = ended.cancelled() => WireAskAnswer::Unavailable,
        }
    }

    fn die(&self, reason: String) {
        {
            let mut death = self.death.lock().unwrap_or_else(PoisonError::into_inner);
            if death.is_none() {
                tracing::warn!(%reason, "helper connection lost");
                *death = Some(reason);
            }
        }
        self.dead.cancel();
        // Waiting calls see their channel close.
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    async fn call(
        self: &Arc<Self>,
        request: Request,
        payload: Vec<u8>,
    ) -> Result<Call, HelperError> {
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(FrameError::TooLarge {
                op: "write",
                what: "payload",
                len: payload.len() as u64,
                max: MAX_PAYLOAD_BYTES,
            }
            .into());
        }
        let permit = tokio::select! {
            permit = Arc::clone(&self.in_flight).acquire_owned() => {
                permit.map_err(|_| self.closed())?
            }
            () = self.dead.cancelled() => return Err(self.closed()),
        };
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let header =
            serde_json::to_vec(&Envelope { id, body: request }).map_err(HelperError::Encode)?;
        let (sender, answers) = mpsc::unbounded_channel();
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Pending::new(sender));
        let mut call = Call {
            id,
            answers,
            link: Arc::clone(self),
            finished: false,
            _permit: permit,
        };
        if self.dead.is_cancelled() {
            call.finished = true;
            return Err(self.closed());
        }
        let sent = tokio::select! {
            sent = self.out.send(Frame { header, payload }) => sent.is_ok(),
            () = self.dead.cancelled() => false,
        };
        if !sent {
            call.finished = true;
            return Err(self.closed());
        }
        Ok(call)
    }

    fn closed(&self) -> HelperError {
        let reason = self
            .death
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "the helper stopped answering".to_owned());
        HelperError::Closed { reason }
    }
}

/// The `answer` request for question `number`, numbered from `next_id`.
fn answer_frame(next_id: &AtomicU64, number: u64, answer: WireAskAnswer) -> Option<Frame> {
    let id = next_id.fetch_add(1, Ordering::SeqCst);
    let request = Request::Answer {
        question: number,
        answer,
    };
    match serde_json::to_vec(&Envelope { id, body: request }) {
        Ok(header) => Some(Frame {
            header,
            payload: Vec::new(),
        }),
        Err(error) => {
            tracing::warn!(%error, "helper: an answer could not be encoded");
            None
        }
    }
}

async fn read_answers<R: AsyncRead + Unpin>(reader: R, link: Weak<Link>) {
    let mut reader = tokio::io::BufReader::with_capacity(IO_BUFFER, reader);
    loop {
        let read = read_frame(&mut reader).await;
        // Nobody left to answer: the client is gone.
        let Some(link) = link.upgrade() else {
            return;
        };
        let frame = match read {
            Ok(frame) => frame,
            Err(FrameError::Eof) => return link.die("the helper exited".to_owned()),
            Err(error) => return link.die(error.to_string()),
        };
        let envelope: Envelope<Response> = match serde_json::from_slice(&frame.header) {
            Ok(envelope) => envelope,
            Err(error) => return link.die(format!("unreadable answer from the helper: {error}")),
        };
        if envelope.id == 0 {
            match envelope.body {
                Response::Error { error } => {
                    tracing::warn!(error = %error.describe(), "helper reported a protocol error");
                }
                Response::Ask(question) => link.take_question(question),
                Response::Withdrawn { question } => link.withdraw(question),
                other => tracing::debug!(answer = ?other, "helper: a notice without a request"),
            }
            continue;
        }
        let admitted = link
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&envelope.id)
            .map(|pending| {
                pending
                    .admit(&envelope.body, frame.payload.len())
                    .map(|()| pending.sender.clone())
            })
            .transpose();
        let sender = match admitted {
            Ok(sender) => sender,
            Err(violation) => {
                tracing::warn!(id = envelope.id, %violation, "helper broke the protocol");
                return link.die(format!("the helper broke the protocol: {violation}"));
            }
        };
        drop(link);
        if let Some(sender) = sender {
            // A call that went away drops its receiver: the answer has nobody to go to.
            let _ = sender.send((envelope.body, frame.payload));
        }
    }
}

async fn write_requests<W: AsyncWrite + Unpin>(
    writer: W,
    mut queue: mpsc::Receiver<Frame>,
    link: Weak<Link>,
    dead: CancellationToken,
) {
    // One write per batch of frames, not three per frame: flushed when the queue is empty.
    let mut writer = tokio::io::BufWriter::with_capacity(IO_BUFFER, writer);
    let die = |reason: String| {
        if let Some(link) = link.upgrade() {
            link.die(reason);
        }
    };
    loop {
        // The queue closes when the last holder of the link (client, calls) is gone.
        let frame = tokio::select! {
            frame = queue.recv() => frame,
            () = dead.cancelled() => None,
        };
        let Some(frame) = frame else {
            break;
        };
        if let Err(error) = write_frame(&mut writer, &frame).await {
            return die(error.to_string());
        }
        if queue.is_empty()
            && let Err(error) = writer.flush().await
        {
            return die(format!("failed to send to the helper: {error}"));
        }
    }
    // Closing the helper's input ends its session.
    let _ = writer.shutdown().await;
}

/// One call in flight: its answers, and a `cancel` for it if dropped unanswered.
struct Call {
    id: u64,
    answers: mpsc::UnboundedReceiver<Answer>,
    link: Arc<Link>,
    finished: bool,
    _permit: OwnedSemaphorePermit,
}

impl Call {
    async fn next(&mut self) -> Result<(Response, Vec<u8>), HelperError> {
        match self.answers.recv().await {
            Some(answer) => Ok(answer),
            None => {
                self.finished = true;
                Err(self.link.closed())
            }
        }
    }

    /// Tell the helper the caller took `bytes` of this command's output: it may send that much
    /// more.
    async fn acknowledge(&self, bytes: usize) {
        // Room for the helper to send more is made before it is told so.
        if let Some(pending) = self
            .link
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&self.id)
        {
            pending.unacknowledged = pending.unacknowledged.saturating_sub(bytes as u64);
        }
        let Ok(header) = serde_json::to_vec(&Envelope {
            id: 0,
            body: Request::Ack {
                target: self.id,
                bytes: bytes as u64,
            },
        }) else {
            return;
        };
        let frame = Frame {
            header,
            payload: Vec::new(),
        };
        tokio::select! {
            _ = self.link.out.send(frame) => {}
            () = self.link.dead.cancelled() => {}
        }
    }

    fn cancel(&self) {
        if self.link.dead.is_cancelled() {
            return;
        }
        if let Ok(header) = serde_json::to_vec(&Envelope {
            id: 0,
            body: Request::Cancel { target: self.id },
        }) {
            // Best effort: a full queue means the helper is busy; the command still ends by
            // its timeout.
            let _ = self.link.out.try_send(Frame {
                header,
                payload: Vec::new(),
            });
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.link
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
        if !self.finished {
            self.cancel();
        }
    }
}

/// A helper that answered `hello` with our protocol version: probe it or start a session.
pub struct HelperConnection {
    link: Arc<Link>,
    helper_version: String,
}

impl std::fmt::Debug for HelperConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperConnection")
            .field("helper_version", &self.helper_version)
            .field("dead", &self.link.dead.is_cancelled())
            .finish()
    }
}

impl HelperConnection {
    /// Take over a helper's stream (`reader`: its output, `writer`: its input) and say hello.
    /// A helper of another protocol version is refused with [`HelperError::Version`].
    pub async fn open<R, W>(reader: R, writer: W) -> Result<HelperConnection, HelperError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out, queue) = mpsc::channel(OUT_QUEUE);
        let link = Link::new(out);
        tokio::spawn(read_answers(reader, Arc::downgrade(&link)));
        tokio::spawn(write_requests(
            writer,
            queue,
            Arc::downgrade(&link),
            link.dead.clone(),
        ));
        let connection = HelperConnection {
            link,
            helper_version: String::new(),
        };
        let answer = connection
            .request(
                Request::Hello {
                    version: PROTOCOL_VERSION,
                },
                Vec::new(),
            )
            .await?;
        match answer {
            (Response::Hello { version, helper }, _) if version == PROTOCOL_VERSION => {
                tracing::debug!(helper = %helper, "helper said hello");
                Ok(HelperConnection {
                    helper_version: helper,
                    ..connection
                })
            }
            (Response::Hello { version, .. }, _)
            | (
                Response::Error {
                    error:
                        WireError::Version {
                            helper: version, ..
                        },
                },
                _,
            ) => Err(HelperError::Version {
                helper: version,
                client: PROTOCOL_VERSION,
            }),
            (Response::Error { error }, _) => Err(HelperError::Remote(error)),
            (other, _) => Err(unexpected("hello", &other)),
        }
    }

    /// The helper's package version (from `hello`).
    pub fn helper_version(&self) -> &str {
        &self.helper_version
    }

    /// Which sandbox layers the helper's kernel provides.
    pub async fn probe(&self) -> Result<ProbeReport, HelperError> {
        match self.request(Request::Probe, Vec::new()).await? {
            (Response::Probe { support }, _) => Ok(support),
            (Response::Error { error }, _) => Err(HelperError::Remote(error)),
            (other, _) => Err(unexpected("probe", &other)),
        }
    }

    /// Open the session: the helper builds the local backend for `start` on its host.
    pub async fn start(self, start: SessionStart) -> Result<HelperClient, HelperError> {
        self.start_asking(start, None).await
    }

    /// As [`HelperConnection::start`], with the helper's egress proxy asking `approver` about
    /// destinations an ask entry (`[network] ask`) matches: each question comes as an `ask`
    /// frame, is put to `approver` if it names the call of a command running on this
    /// connection (else it is refused without asking), and is answered. Without an approver
    /// the helper asks nobody.
    pub async fn start_asking(
        self,
        mut start: SessionStart,
        approver: Option<Arc<dyn EgressApprover>>,
    ) -> Result<HelperClient, HelperError> {
        if let Some(approver) = approver {
            start.ask = Some(AskSetup {
                answer_within_ms: approver
                    .answer_within()
                    .map(|within| u64::try_from(within.as_millis()).unwrap_or(u64::MAX)),
            });
            let _ = self.link.questions.set(Questions {
                approver,
                session: Arc::from(format!("helper:{}", start.root.0.display())),
                running: Mutex::new(HashMap::new()),
                open: Arc::new(Semaphore::new(MAX_OPEN_QUESTIONS)),
                asking: Mutex::new(HashMap::new()),
            });
        }
        let spec = start.spec.clone();
        let info = match self
            .request(
                Request::Start {
                    session: Box::new(start),
                },
                Vec::new(),
            )
            .await?
        {
            (Response::Started { session }, _) => *session,
            (Response::Error { error }, _) => return Err(HelperError::Remote(error)),
            (other, _) => return Err(unexpected("start", &other)),
        };
        let SessionInfo {
            backend_id,
            root,
            home,
            spill_dir,
            missing_layers,
        } = info;
        Ok(HelperClient {
            connection: self,
            id: BackendId::new(format!("helper:{backend_id}")),
            root: root.0,
            home: home.map(WirePath::into_path),
            spill_dir: spill_dir.0,
            missing_layers,
            shut_down: AtomicBool::new(false),
            layout: Arc::new(RemoteLayout::new(spec)),
        })
    }

    /// Whether the stream has ended: every call fails; start a new helper.
    pub fn is_dead(&self) -> bool {
        self.link.dead.is_cancelled()
    }

    /// Resolves when the stream has ended.
    pub async fn closed(&self) {
        self.link.dead.cancelled().await;
    }

    async fn call(&self, request: Request, payload: Vec<u8>) -> Result<Call, HelperError> {
        self.link.call(request, payload).await
    }

    async fn request(
        &self,
        request: Request,
        payload: Vec<u8>,
    ) -> Result<(Response, Vec<u8>), HelperError> {
        let mut call = self.call(request, payload).await?;
        let answer = call.next().await?;
        call.finished = true;
        Ok(answer)
    }
}

fn unexpected(what: &str, answer: &Response) -> HelperError {
    let name = serde_json::to_value(answer)
        .ok()
        .and_then(|value| {
            value
                .get("type")
                .and_then(|t| t.as_str())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "?".to_owned());
    HelperError::Unexpected(format!("`{name}` in answer to `{what}`"))
}

/// A started helper session: the local backend on the helper's host, through the traits the
/// backends implement.
pub struct HelperClient {
    connection: HelperConnection,
    id: BackendId,
    root: PathBuf,
    home: Option<PathBuf>,
    spill_dir: PathBuf,
    missing_layers: Vec<String>,
    shut_down: AtomicBool,
    layout: Arc<RemoteLayout>,
}

/// Most classified paths remembered; the memory starts afresh beyond it.
const MAX_KNOWN_PATHS: usize = 1024;

/// The helper's layout as the bash tool's denial notes need it: the spec the session was
/// started with, and what the helper said about the paths failed commands named (asked right
/// after each failed command, before its outcome is returned, so the tool finds them).
#[derive(Debug)]
pub struct RemoteLayout {
    spec: SandboxSpec,
    known: Mutex<HashMap<PathBuf, Classification>>,
}

impl RemoteLayout {
    fn new(spec: SandboxSpec) -> Self {
        RemoteLayout {
            spec,
            known: Mutex::new(HashMap::new()),
        }
    }

    fn learn(&self, paths: Vec<PathBuf>, entries: Vec<Classification>) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() + paths.len() > MAX_KNOWN_PATHS {
            known.clear();
        }
        known.extend(paths.into_iter().zip(entries));
    }

    fn lookup(&self, path: &Path) -> Option<Classification> {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(path)
            .copied()
    }
}

impl DenialLayout for RemoteLayout {
    fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    fn classify(&self, path: &Path) -> Option<PathEntry> {
        self.lookup(path)?.entry.map(PathEntry::from)
    }

    fn mode_allows_write(&self, path: &Path) -> bool {
        self.lookup(path)
            .is_none_or(|classification| classification.mode_allows_write)
    }
}

impl std::fmt::Debug for HelperClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperClient")
            .field("id", &self.id)
            .field("connection", &self.connection)
            .finish()
    }
}

impl HelperClient {
    /// Say hello over the helper's stream and start a session: the usual way in.
    pub async fn start<R, W>(
        reader: R,
        writer: W,
        start: SessionStart,
    ) -> Result<HelperClient, HelperError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        HelperConnection::open(reader, writer)
            .await?
            .start(start)
            .await
    }

    /// Which sandbox layers the helper's kernel provides.
    pub async fn probe(&self) -> Result<ProbeReport, HelperError> {
        self.connection.probe().await
    }

    /// The canonical workspace root on the helper's host.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The layers commands run without (the spec allowed a degraded sandbox).
    pub fn missing_layers(&self) -> &[String] {
        &self.missing_layers
    }

    /// Whether the stream has ended: every call fails; start a new helper.
    pub fn is_dead(&self) -> bool {
        self.connection.is_dead()
    }

    /// The layout failed commands are explained against.
    pub fn layout(&self) -> &Arc<RemoteLayout> {
        &self.layout
    }

    /// Use `layout` (another client's, e.g. the helper this one replaces) from now on.
    pub fn share_layout(&mut self, layout: Arc<RemoteLayout>) {
        self.layout = layout;
    }

    /// Ask the helper what the paths a failed command's output names are, so the bash tool's
    /// explanation finds them in [`RemoteLayout`]. Best effort: without an answer, the
    /// command simply gets no path notes.
    async fn classify_named_paths(&self, tail: &[u8], cwd: &Path) {
        let paths = paths_to_classify(&String::from_utf8_lossy(tail), cwd);
        if paths.is_empty() {
            return;
        }
        let request = Request::Classify {
            paths: paths.iter().map(|p| path(p)).collect(),
        };
        match self.connection.request(request, Vec::new()).await {
            Ok((Response::Classified { entries }, _)) if entries.len() == paths.len() => {
                self.layout.learn(paths, entries);
            }
            Ok((Response::Classified { .. }, _)) => {}
            Ok((other, _)) => {
                tracing::debug!(answer = %unexpected("classify", &other), "helper: no classification");
            }
            Err(error) => tracing::debug!(%error, "helper: no classification"),
        }
    }

    /// Resolves when the stream has ended.
    pub async fn closed(&self) {
        self.connection.closed().await;
    }

    /// End the session: the helper shuts its backend down (idempotent; a dead helper has
    /// nothing left to shut down).
    pub async fn shutdown(&self) -> Result<(), HelperError> {
        if self.shut_down.swap(true, Ordering::SeqCst) || self.is_dead() {
            return Ok(());
        }
        match self
            .connection
            .request(Request::Shutdown, Vec::new())
            .await?
        {
            (Response::Ok, _) => Ok(()),
            (Response::Error { error }, _) => Err(HelperError::Remote(error)),
            (other, _) => Err(unexpected("shutdown", &other)),
        }
    }

    async fn file_request(
        &self,
        op: &'static str,
        path: &Path,
        request: Request,
        payload: Vec<u8>,
    ) -> Result<(Response, Vec<u8>), FsError> {
        match self.connection.request(request, payload).await {
            Ok((Response::Error { error }, _)) => Err(error.into_fs(op, path)),
            Ok(answer) => Ok(answer),
            Err(error) => Err(FsError::Backend {
                op,
                path: path.to_path_buf(),
                reason: error.to_string(),
            }),
        }
    }

    async fn expect_bytes(
        &self,
        op: &'static str,
        path: &Path,
        request: Request,
    ) -> Result<Vec<u8>, FsError> {
        match self.file_request(op, path, request, Vec::new()).await? {
            (Response::Bytes, data) => Ok(data),
            (other, _) => Err(fs_unexpected(op, path, &other)),
        }
    }

    async fn expect_ok(
        &self,
        op: &'static str,
        path: &Path,
        request: Request,
        payload: Vec<u8>,
    ) -> Result<(), FsError> {
        match self.file_request(op, path, request, payload).await? {
            (Response::Ok, _) => Ok(()),
            (other, _) => Err(fs_unexpected(op, path, &other)),
        }
    }

    async fn search_request(
        &self,
        request: Request,
        cancel: CancellationToken,
    ) -> Result<Response, SearchError> {
        if cancel.is_cancelled() {
            return Err(SearchError::Cancelled);
        }
        let mut call = self
            .connection
            .call(request, Vec::new())
            .await
            .map_err(|error| SearchError::Backend {
                reason: error.to_string(),
            })?;
        let answer = tokio::select! {
            answer = call.next() => answer,
            () = cancel.cancelled() => {
                // Dropping the call sends `cancel`; the helper stops the walk.
                return Err(SearchError::Cancelled);
            }
        };
        call.finished = true;
        match answer {
            Ok((Response::Error { error }, _)) => Err(error.into_search()),
            Ok((response, _)) => Ok(response),
            Err(error) => Err(SearchError::Backend {
                reason: error.to_string(),
            }),
        }
    }
}

fn fs_unexpected(op: &'static str, path: &Path, answer: &Response) -> FsError {
    FsError::Backend {
        op,
        path: path.to_path_buf(),
        reason: unexpected(op, answer).to_string(),
    }
}

fn path(path: &Path) -> WirePath {
    WirePath::from(path)
}

#[async_trait]
impl FileOperations for HelperClient {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn home(&self) -> Option<&Path> {
        self.home.as_deref()
    }

    async fn read_file(&self, file: &Path) -> Result<Vec<u8>, FsError> {
        self.expect_bytes("read", file, Request::ReadFile { path: path(file) })
            .await
    }

    async fn read_head(&self, file: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
        self.expect_bytes(
            "read",
            file,
            Request::ReadHead {
                path: path(file),
                max_bytes: max_bytes as u64,
            },
        )
        .await
    }

    async fn read_range(
        &self,
        file: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        self.expect_bytes(
            "read",
            file,
            Request::ReadRange {
                path: path(file),
                offset,
                max_bytes: max_bytes as u64,
            },
        )
        .await
    }

    async fn write_file(&self, file: &Path, data: &[u8]) -> Result<(), FsError> {
        self.expect_ok(
            "write",
            file,
            Request::WriteFile { path: path(file) },
            data.to_vec(),
        )
        .await
    }

    async fn create_dir_all(&self, dir: &Path) -> Result<(), FsError> {
        self.expect_ok(
            "create directory",
            dir,
            Request::CreateDirAll { path: path(dir) },
            Vec::new(),
        )
        .await
    }

    async fn metadata(&self, file: &Path) -> Result<FileMeta, FsError> {
        match self
            .file_request(
                "inspect",
                file,
                Request::Metadata { path: path(file) },
                Vec::new(),
            )
            .await?
        {
            (Response::Metadata { meta }, _) => Ok(meta),
            (other, _) => Err(fs_unexpected("inspect", file, &other)),
        }
    }

    async fn read_dir(&self, dir: &Path) -> Result<Vec<DirEntry>, FsError> {
        match self
            .file_request(
                "list",
                dir,
                Request::ReadDir { path: path(dir) },
                Vec::new(),
            )
            .await?
        {
            (Response::Entries { entries }, _) => Ok(entries),
            (other, _) => Err(fs_unexpected("list", dir, &other)),
        }
    }

    async fn canonicalize(&self, file: &Path) -> Result<PathBuf, FsError> {
        match self
            .file_request(
                "resolve",
                file,
                Request::Canonicalize { path: path(file) },
                Vec::new(),
            )
            .await?
        {
            (Response::Path { path }, _) => Ok(path.0),
            (other, _) => Err(fs_unexpected("resolve", file, &other)),
        }
    }

    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        let dir = self.spill_dir.clone();
        let (spill, created) = match self
            .file_request("create spill file", &dir, Request::SpillCreate, Vec::new())
            .await?
        {
            (Response::Spill { spill, path }, _) => (spill, path.0),
            (other, _) => return Err(fs_unexpected("create spill file", &dir, &other)),
        };
        let (pipe, reader) = tokio::io::duplex(SPILL_CHUNK);
        let link = HelperConnectionRef {
            link: Arc::clone(&self.connection.link),
        };
        let done = tokio::spawn(pump_spill(link, spill, reader));
        Ok((
            created,
            Box::new(HelperSpill {
                pipe,
                done: Some(done),
            }),
        ))
    }

    fn spill_dir(&self) -> Option<&Path> {
        Some(&self.spill_dir)
    }
}

/// What a spill pump needs of the connection (the link outlives the client's borrow).
struct HelperConnectionRef {
    link: Arc<Link>,
}

impl HelperConnectionRef {
    async fn request(&self, request: Request, payload: Vec<u8>) -> io::Result<()> {
        let failed = |error: HelperError| io::Error::other(error.to_string());
        let mut call = self.link.call(request, payload).await.map_err(failed)?;
        let answer = call.next().await.map_err(failed)?;
        call.finished = true;
        match answer {
            (Response::Ok, _) => Ok(()),
            (Response::Error { error }, _) => Err(io::Error::other(error.describe())),
            (other, _) => Err(io::Error::other(unexpected("spill", &other).to_string())),
        }
    }
}

/// Send what the spill writer receives to the helper, in order, then close the file.
async fn pump_spill(
    link: HelperConnectionRef,
    spill: u64,
    mut pipe: DuplexStream,
) -> io::Result<()> {
    let mut buf = vec![0u8; SPILL_CHUNK];
    let written = async {
        loop {
            let read = pipe.read(&mut buf).await?;
            if read == 0 {
                return Ok(());
            }
            link.request(Request::SpillWrite { spill }, buf[..read].to_vec())
                .await?;
        }
    }
    .await;
    let closed = link
        .request(Request::SpillClose { spill }, Vec::new())
        .await;
    if let Err(error) = &written {
        tracing::warn!(%error, "failed to write to the helper's spill file");
    }
    written.and(closed)
}

/// The spill writer handed to the bash tool: a pipe to [`pump_spill`]; its shutdown returns
/// once the helper has stored everything and closed the file.
struct HelperSpill {
    pipe: DuplexStream,
    done: Option<JoinHandle<io::Result<()>>>,
}

impl AsyncWrite for HelperSpill {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.pipe).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.pipe).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(Pin::new(&mut self.pipe).poll_shutdown(cx))?;
        let Some(done) = self.done.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let joined = std::task::ready!(Pin::new(done).poll(cx));
        self.done = None;
        Poll::Ready(joined.unwrap_or_else(|error| Err(io::Error::other(error))))
    }
}

#[async_trait]
impl BashOperations for HelperClient {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    async fn exec(
        &self,
        request: ExecRequest,
        cancel: CancellationToken,
        output: mpsc::Sender<Vec<u8>>,
    ) -> Result<ExecOutcome, ExecError> {
        let backend = |error: HelperError| ExecError::Backend {
            reason: error.to_string(),
        };
        let cwd = request.cwd.clone();
        let _running = self.connection.link.running(request.call_id.as_deref());
        let mut tail: Vec<u8> = Vec::new();
        let mut call = self
            .connection
            .call(
                Request::Exec {
                    request: request.into(),
                },
                Vec::new(),
            )
            .await
            .map_err(backend)?;
        let mut cancel_sent = false;
        loop {
            let answer = tokio::select! {
                answer = call.next() => answer,
                () = cancel.cancelled(), if !cancel_sent => {
                    // The helper kills the tree and answers with a cancelled outcome.
                    call.cancel();
                    cancel_sent = true;
                    continue;
                }
            };
            match answer.map_err(backend)? {
                (Response::Output, chunk) => {
                    keep_tail(&mut tail, &chunk);
                    let taken = chunk.len();
                    // The tool stopped listening (it settled): the rest is not wanted.
                    let _ = output.send(chunk).await;
                    call.acknowledge(taken).await;
                }
                (Response::Exec { outcome }, _) => {
                    call.finished = true;
                    drop(call);
                    if failed(&outcome) {
                        self.classify_named_paths(&tail, &cwd).await;
                    }
                    return Ok(outcome);
                }
                (Response::Error { error }, _) => {
                    call.finished = true;
                    return Err(error.into_exec());
                }
                (other, _) => {
                    call.finished = true;
                    return Err(backend(unexpected("exec", &other)));
                }
            }
        }
    }

    fn denial_layout(&self) -> Option<&dyn DenialLayout> {
        Some(&*self.layout)
    }
}

/// Keep the last `2 * TAIL_BYTES` of a command's output (what a denial is explained from).
fn keep_tail(tail: &mut Vec<u8>, chunk: &[u8]) {
    tail.extend_from_slice(chunk);
    if tail.len() > 2 * TAIL_BYTES {
        let cut = tail.len() - 2 * TAIL_BYTES;
        tail.drain(..cut);
    }
}

/// Whether a command's outcome is one the denial notes explain.
fn failed(outcome: &ExecOutcome) -> bool {
    match outcome.termination {
        cordon_ops::Termination::TimedOut => true,
        cordon_ops::Termination::Cancelled => false,
        cordon_ops::Termination::Exited => {
            !matches!(outcome.status, Some(cordon_ops::ExitStatus::Code(0)))
        }
    }
}

#[async_trait]
impl SearchOperations for HelperClient {
    async fn grep(
        &self,
        request: GrepRequest,
        cancel: CancellationToken,
    ) -> Result<GrepOutput, SearchError> {
        match self
            .search_request(
                Request::Grep {
                    request: request.into(),
                },
                cancel,
            )
            .await?
        {
            Response::Grep { output } => Ok(output.into()),
            other => Err(SearchError::Backend {
                reason: unexpected("grep", &other).to_string(),
            }),
        }
    }

    async fn find(
        &self,
        request: FindRequest,
        cancel: CancellationToken,
    ) -> Result<FindOutput, SearchError> {
        match self
            .search_request(
                Request::Find {
                    request: request.into(),
                },
                cancel,
            )
            .await?
        {
            Response::Find { output } => Ok(output.into()),
            other => Err(SearchError::Backend {
                reason: unexpected("find", &other).to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending() -> (Pending, mpsc::UnboundedReceiver<Answer>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Pending::new(sender), receiver)
    }

    #[test]
    fn output_is_admitted_within_the_acknowledged_window_only() {
        let (mut call, _answers) = pending();
        let window = usize::try_from(OUTPUT_WINDOW).unwrap();
        assert_eq!(call.admit(&Response::Output, window - 1), Ok(()));
        // An empty piece counts as one byte: the window is full now.
        assert_eq!(call.admit(&Response::Output, 0), Ok(()));
        assert_eq!(
            call.admit(&Response::Output, 1),
            Err(format!(
                "it sent {} bytes of a command's output the client had not acknowledged, more \
                 than the window of {OUTPUT_WINDOW}",
                OUTPUT_WINDOW + 1
            ))
        );
        // What the caller took and acknowledged makes room again.
        call.unacknowledged -= 10;
        assert_eq!(call.admit(&Response::Output, 10), Ok(()));
    }

    #[test]
    fn nothing_is_admitted_after_the_last_answer() {
        let (mut call, _answers) = pending();
        assert_eq!(call.admit(&Response::Output, 5), Ok(()));
        assert_eq!(call.admit(&Response::Ok, 0), Ok(()));
        for late in [Response::Ok, Response::Output, Response::Bytes] {
            assert_eq!(
                call.admit(&late, 1),
                Err("it answered one request twice".to_owned())
            );
        }
    }

    /// Answers every question `Once`, counting them.
    struct Counting(AtomicU64);

    #[async_trait]
    impl EgressApprover for Counting {
        async fn ask(&self, request: AskRequest) -> cordon_egress::ask::AskAnswer {
            assert_eq!(request.call.as_deref(), Some("call-7"));
            self.0.fetch_add(1, Ordering::SeqCst);
            cordon_egress::ask::AskAnswer::Once
        }
    }

    fn asking_link(approver: Arc<dyn EgressApprover>) -> (Arc<Link>, mpsc::Receiver<Frame>) {
        let (out, queue) = mpsc::channel(1);
        let link = Link::new(out);
        let _ = link.questions.set(Questions {
            approver,
            session: Arc::from("test"),
            running: Mutex::new(HashMap::new()),
            open: Arc::new(Semaphore::new(MAX_OPEN_QUESTIONS)),
            asking: Mutex::new(HashMap::new()),
        });
        (link, queue)
    }

    fn question(call: Option<&str>, host: &str, entry: &str) -> WireQuestion {
        WireQuestion {
            question: 1,
            call: call.map(str::to_owned),
            host: host.to_owned(),
            port: 443,
            entry: entry.to_owned(),
            source: "policy.toml:7".to_owned(),
        }
    }

    /// The helper may be on a host that is not trusted: its questions reach a person only
    /// when they name a command running on this connection and are well formed.
    #[tokio::test]
    async fn a_question_reaches_the_approver_only_for_a_command_running_here() {
        let approver = Arc::new(Counting(AtomicU64::new(0)));
        let (link, _queue) = asking_link(approver.clone());
        let asked = |link: &Arc<Link>, q| {
            let link = Arc::clone(link);
            async move { link.answer(q).await }
        };
        // No command of that call runs: refused without asking.
        assert_eq!(
            asked(
                &link,
                question(Some("call-7"), "pkg.example", "pkg.example")
            )
            .await,
            WireAskAnswer::Unavailable
        );
        let running = link.running(Some("call-7")).expect("registered");
        assert_eq!(
            asked(
                &link,
                question(Some("call-7"), "pkg.example", "pkg.example")
            )
            .await,
            WireAskAnswer::Once
        );
        // No call named, a host that is no host, an entry beyond the bound: refused.
        assert_eq!(
            asked(&link, question(None, "pkg.example", "pkg.example")).await,
            WireAskAnswer::Unavailable
        );
        assert_eq!(
            asked(
                &link,
                question(Some("call-7"), "not a host!", "pkg.example")
            )
            .await,
            WireAskAnswer::Unavailable
        );
        let long = "x".repeat(MAX_QUESTION_TEXT + 1);
        assert_eq!(
            asked(&link, question(Some("call-7"), "pkg.example", &long)).await,
            WireAskAnswer::Unavailable
        );
        assert_eq!(approver.0.load(Ordering::SeqCst), 1);
        // Once the command ended, its call is no longer asked about.
        drop(running);
        assert_eq!(
            asked(
                &link,
                question(Some("call-7"), "pkg.example", "pkg.example")
            )
            .await,
            WireAskAnswer::Unavailable
        );
        assert_eq!(approver.0.load(Ordering::SeqCst), 1);
    }

    /// The answer frame in `queue`.
    async fn sent_answer(queue: &mut mpsc::Receiver<Frame>) -> (u64, WireAskAnswer) {
        let frame = queue.recv().await.expect("an answer frame");
        let envelope: Envelope<Request> = serde_json::from_slice(&frame.header).expect("json");
        match envelope.body {
            Request::Answer { question, answer } => (question, answer),
            other => panic!("not an answer: {other:?}"),
        }
    }

    #[tokio::test]
    async fn questions_beyond_the_bound_are_refused_without_a_task_or_asking() {
        let approver = Arc::new(Counting(AtomicU64::new(0)));
        let (link, mut queue) = asking_link(approver.clone());
        let _running = link.running(Some("call-7"));
        let questions = link.questions.get().expect("questions");
        let held: Vec<_> = (0..MAX_OPEN_QUESTIONS)
            .map(|_| {
                Arc::clone(&questions.open)
                    .try_acquire_owned()
                    .expect("a slot")
            })
            .collect();
        let mut refused = question(Some("call-7"), "pkg.example", "pkg.example");
        refused.question = 41;
        link.take_question(refused);
        assert_eq!(
            sent_answer(&mut queue).await,
            (41, WireAskAnswer::Unavailable)
        );
        // The queue is full now (one frame): another refusal is dropped, nothing waits.
        let filler = answer_frame(&link.next_id, 0, WireAskAnswer::Deny).expect("frame");
        link.out.try_send(filler).expect("room for one");
        link.take_question(question(Some("call-7"), "pkg.example", "pkg.example"));
        assert_eq!(sent_answer(&mut queue).await, (0, WireAskAnswer::Deny));
        assert!(queue.try_recv().is_err(), "the second refusal was dropped");
        drop(held);
        let mut asked = question(Some("call-7"), "pkg.example", "pkg.example");
        asked.question = 42;
        link.take_question(asked);
        assert_eq!(sent_answer(&mut queue).await, (42, WireAskAnswer::Once));
        assert_eq!(approver.0.load(Ordering::SeqCst), 1);
    }

    /// Never answers: says when it is asked, and when its question is withdrawn (the
    /// future dropped, as the MCP approver withdraws an elicitation).
    struct Stuck {
        asked: mpsc::UnboundedSender<()>,
        withdrawn: mpsc::UnboundedSender<()>,
    }

    struct Withdrawal(mpsc::UnboundedSender<()>);

    impl Drop for Withdrawal {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }

    #[async_trait]
    impl EgressApprover for Stuck {
        async fn ask(&self, _request: AskRequest) -> cordon_egress::ask::AskAnswer {
            let _withdrawal = Withdrawal(self.withdrawn.clone());
            let _ = self.asked.send(());
            std::future::pending().await
        }
    }

    struct StuckLink {
        link: Arc<Link>,
        queue: mpsc::Receiver<Frame>,
        asked: mpsc::UnboundedReceiver<()>,
        withdrawn: mpsc::UnboundedReceiver<()>,
    }

    fn stuck_link() -> StuckLink {
        let (asked_tx, asked) = mpsc::unbounded_channel();
        let (withdrawn_tx, withdrawn) = mpsc::unbounded_channel();
        let (link, queue) = asking_link(Arc::new(Stuck {
            asked: asked_tx,
            withdrawn: withdrawn_tx,
        }));
        StuckLink {
            link,
            queue,
            asked,
            withdrawn,
        }
    }

    /// Fails a test that would otherwise hang.
    async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(60), future)
            .await
            .unwrap_or_else(|_| panic!("{what} never happened"))
    }

    /// Waits until every question task has ended (they hold the slots).
    async fn all_tasks_ended(link: &Link) {
        let open = &link.questions.get().expect("questions").open;
        let all = u32::try_from(MAX_OPEN_QUESTIONS).expect("small");
        drop(within("the tasks' end", open.acquire_many(all)).await);
    }

    /// The helper's proxy stopped waiting (the command ended, the connection was cut): the
    /// person is no longer asked, and no answer is sent.
    #[tokio::test]
    async fn a_question_the_helper_withdraws_is_withdrawn_from_the_approver() {
        let mut stuck = stuck_link();
        let _running = stuck.link.running(Some("call-7"));
        stuck
            .link
            .take_question(question(Some("call-7"), "pkg.example", "pkg.example"));
        within("the question", stuck.asked.recv()).await;
        stuck.link.withdraw(1);
        within("the withdrawal", stuck.withdrawn.recv()).await;
        all_tasks_ended(&stuck.link).await;
        assert!(stuck.queue.try_recv().is_err(), "nothing is answered");
        // Its number is free again.
        assert!(
            stuck
                .link
                .questions
                .get()
                .expect("questions")
                .asking
                .lock()
                .expect("asking")
                .is_empty()
        );
    }

    /// The stream ended: nobody waits for the answer any more.
    #[tokio::test]
    async fn a_question_open_when_the_stream_ends_is_withdrawn_from_the_approver() {
        let mut stuck = stuck_link();
        let _running = stuck.link.running(Some("call-7"));
        stuck
            .link
            .take_question(question(Some("call-7"), "pkg.example", "pkg.example"));
        within("the question", stuck.asked.recv()).await;
        stuck.link.die("the helper exited".to_owned());
        within("the withdrawal", stuck.withdrawn.recv()).await;
        all_tasks_ended(&stuck.link).await;
    }

    /// A second question under the number of one being answered is refused without asking
    /// (it would take the first one's answer).
    #[tokio::test]
    async fn a_question_reusing_an_open_number_is_refused() {
        let mut stuck = stuck_link();
        let _running = stuck.link.running(Some("call-7"));
        stuck
            .link
            .take_question(question(Some("call-7"), "pkg.example", "pkg.example"));
        within("the question", stuck.asked.recv()).await;
        stuck
            .link
            .take_question(question(Some("call-7"), "other.example", "other.example"));
        assert_eq!(
            within("the refusal", sent_answer(&mut stuck.queue)).await,
            (1, WireAskAnswer::Unavailable)
        );
        assert!(stuck.asked.try_recv().is_err(), "asked once only");
    }

    /// The call's commands ended while its question was open: the person is no longer asked,
    /// even when the helper never withdraws it (a helper on a host that is not trusted).
    #[tokio::test]
    async fn a_question_is_withdrawn_when_its_call_s_commands_ended() {
        let mut stuck = stuck_link();
        let running = stuck.link.running(Some("call-7"));
        let second = stuck.link.running(Some("call-7"));
        stuck
            .link
            .take_question(question(Some("call-7"), "pkg.example", "pkg.example"));
        within("the question", stuck.asked.recv()).await;
        // One of the call's two commands ended: still asked.
        drop(running);
        assert!(stuck.withdrawn.try_recv().is_err(), "still asked");
        drop(second);
        within("the withdrawal", stuck.withdrawn.recv()).await;
        assert_eq!(
            within("the answer", sent_answer(&mut stuck.queue)).await,
            (1, WireAskAnswer::Unavailable)
        );
        all_tasks_ended(&stuck.link).await;
    }
}
