//! The MCP server over a Cordon [`Session`]: `tools/list` from the session's enabled tools,
//! `tools/call` through `Session::call` (the same pipeline as `cordon exec`), bash partial
//! output as `notifications/progress`, `notifications/cancelled` as the call's cancel token,
//! and the shutdown sequence (input closed or shutdown requested → in-flight calls cancelled
//! and awaited → backend resources released).
//!
//! It owns the MCP semantics, not the wire format (`transport`, `framing`) nor any policy or
//! tool logic (the session's).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cordon_core::event::{AgentEvent, EventSink};
use cordon_core::executor::RunControl;
use cordon_core::protocol::{ToolCall, ToolResult};
use cordon_core::tool::AgentToolResult;
use cordon_runtime::Session;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CustomRequest, CustomResult, ErrorCode, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProgressToken, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{QuitReason, RequestContext, ServerInitializeError, serve_server_with_ct};
use rmcp::{Peer, RoleServer, ServerHandler};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::McpError;
use crate::approval::ElicitationApprover;
use crate::convert::{call_tool_result, mcp_tool, progress_message};
use crate::framing::{DEFAULT_MAX_MESSAGE_BYTES, Frame, async_frames, stdin_frames};
use crate::transport::LineTransport;

/// How long shutdown waits for cancelled calls to finish (their process trees to be killed)
/// before releasing the backend anyway.
const CALL_SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Tunables of an MCP server.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Largest incoming message (one line), in bytes; longer ones are discarded with an
    /// `Invalid Request` error.
    pub max_message_bytes: usize,
    /// The session's approver, when it is an [`ElicitationApprover`]: each call's `Ask`
    /// decisions are then questions to the client that made the call, if it declared the
    /// elicitation capability. `None`: `Ask` is a denial.
    pub approvals: Option<Arc<ElicitationApprover>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            approvals: None,
        }
    }
}

/// Why a server stopped serving (both are clean ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeEnd {
    /// The client closed the input stream (the MCP stdio way to end a session).
    InputClosed,
    /// The shutdown token was cancelled (e.g. on SIGTERM).
    ShutdownRequested,
}

/// An MCP server exposing one session's enabled tools.
pub struct McpServer {
    session: Arc<Session>,
    options: ServeOptions,
    tools: Arc<[Tool]>,
    info: ServerConfig,
}

impl McpServer {
    /// A server over `session`. Fails when a tool cannot be described in MCP terms.
    pub fn new(session: Arc<Session>, options: ServeOptions) -> Result<McpServer, McpError> {
        let network = session.spec().network;
        let tools = session
            .tools()
            .iter()
            .map(|tool| mcp_tool(tool.definition(), tool.label(), network))
            .collect::<Result<Vec<_>, _>>()?;
        let info = server_config(&session);
        Ok(McpServer {
            session,
            options,
            tools: tools.into(),
            info,
        })
    }

    /// The tools `tools/list` returns.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    pub(crate) fn max_message_bytes(&self) -> usize {
        self.options.max_message_bytes
    }

    /// Serve on this process's stdin and stdout until the client closes stdin or `shutdown`
    /// is cancelled; then cancel and await in-flight calls and shut the session down.
    pub async fn serve_stdio(self, shutdown: CancellationToken) -> Result<ServeEnd, McpError> {
        let frames = stdin_frames(self.options.max_message_bytes);
        self.run(frames, Box::new(tokio::io::stdout()), shutdown)
            .await
    }

    /// [`McpServer::serve_stdio`] over any byte streams (in-process clients, tests).
    pub async fn serve<R, W>(
        self,
        (input, output): (R, W),
        shutdown: CancellationToken,
    ) -> Result<ServeEnd, McpError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let frames = async_frames(input, self.options.max_message_bytes);
        self.run(frames, Box::new(output), shutdown).await
    }

    async fn run(
        self,
        frames: mpsc::Receiver<Frame>,
        output: Box<dyn AsyncWrite + Send + Unpin>,
        shutdown: CancellationToken,
    ) -> Result<ServeEnd, McpError> {
        let transport = LineTransport::new(frames, output, self.options.max_message_bytes);
        let shared = self.into_shared(&shutdown);
        let served = serve_until_done(Handler(shared.clone()), transport, &shutdown).await;
        let finished = shared.finish().await;
        let end = served?;
        finished?;
        Ok(end)
    }

    /// The state every connection's handler shares. Calls are cancelled when `shutdown` is
    /// (at once, even while the SDK still gives calls a grace after stdin EOF) and when
    /// serving ends ([`Shared::finish`]).
    pub(crate) fn into_shared(self, shutdown: &CancellationToken) -> Arc<Shared> {
        let McpServer {
            session,
            options,
            tools,
            info,
        } = self;
        let ServeOptions {
            max_message_bytes: _,
            approvals,
        } = options;
        Arc::new(Shared {
            session,
            approvals,
            tools,
            info,
            next_call: AtomicU64::new(1),
            calls: TaskTracker::new(),
            shutdown: shutdown.child_token(),
        })
    }
}

/// What every connection's handler shares: the session, the tool list, the call counter and
/// the in-flight calls.
pub(crate) struct Shared {
    session: Arc<Session>,
    /// Where each call's client is registered for the session's approver to ask it.
    approvals: Option<Arc<ElicitationApprover>>,
    tools: Arc<[Tool]>,
    info: ServerConfig,
    /// Call ids key the runtime's in-flight bookkeeping, so they are unique per server.
    next_call: AtomicU64,
    calls: TaskTracker,
    shutdown: CancellationToken,
}

impl Shared {
    /// Serving has ended: cancel the calls still running, wait for them to settle (process
    /// trees killed), then release the backend's resources.
    pub(crate) async fn finish(&self) -> Result<(), McpError> {
        self.shutdown.cancel();
        self.calls.close();
        if tokio::time::timeout(CALL_SETTLE_TIMEOUT, self.calls.wait())
            .await
            .is_err()
        {
            eprintln!(
                "cordon mcp: {} cancelled call(s) did not finish within {}s; shutting the \
                 backend down anyway",
                self.calls.len(),
                CALL_SETTLE_TIMEOUT.as_secs()
            );
        }
        self.session.shutdown().await.map_err(McpError::Shutdown)
    }
}

async fn serve_until_done(
    handler: Handler,
    transport: LineTransport,
    shutdown: &CancellationToken,
) -> Result<ServeEnd, McpError> {
    let service_token = shutdown.child_token();
    let running = match serve_server_with_ct(handler, transport, service_token).await {
        Ok(running) => running,
        // The client left (or we were told to stop) before the session began.
        Err(ServerInitializeError::ConnectionClosed(_)) => return Ok(ServeEnd::InputClosed),
        Err(ServerInitializeError::Cancelled) => return Ok(ServeEnd::ShutdownRequested),
        Err(source) => {
            return Err(McpError::Initialize {
                source: Box::new(source),
            });
        }
    };
    match running.waiting().await {
        Ok(QuitReason::Closed) => Ok(ServeEnd::InputClosed),
        Ok(QuitReason::Cancelled) => Ok(ServeEnd::ShutdownRequested),
        Ok(QuitReason::JoinError(source)) | Err(source) => Err(McpError::Service { source }),
        // A reason added by a later SDK: the loop ended without a failure.
        Ok(_) => Ok(ServeEnd::InputClosed),
    }
}

fn server_config(session: &Session) -> ServerConfig {
    let backend = session.backend().id().to_string();
    let instructions = format!(
        "These tools run inside Cordon's sandbox ({backend}). Relative paths are resolved \
         against the workspace root. A call the policy refuses returns an error result that \
         says why: change the call rather than retrying it unchanged."
    );
    ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        .with_server_info(
            Implementation::new("cordon", env!("CARGO_PKG_VERSION"))
                .with_title("Cordon")
                .with_description("Sandboxed read, edit, write, bash, grep, find and ls tools"),
        )
        .with_instructions(instructions)
}

/// The rmcp handler: one per served connection (stdio) or HTTP session.
#[derive(Clone)]
pub(crate) struct Handler(pub(crate) Arc<Shared>);

impl Handler {
    async fn call(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let CallToolRequestParams {
            name, arguments, ..
        } = params;
        let id = format!("mcp-{}", self.0.next_call.fetch_add(1, Ordering::Relaxed));
        let cancel = self.0.shutdown.child_token();
        // Questions about this call go to its client while it runs.
        let _asks = self
            .0
            .approvals
            .as_ref()
            .map(|approvals| approvals.register(&id, &context, &cancel));
        let call = ToolCall {
            id,
            name: name.into_owned(),
            arguments: Value::Object(arguments.unwrap_or_default()),
        };
        let done = CancellationToken::new();
        let (events, progress) = match context.meta.get_progress_token() {
            Some(token) => {
                let (sender, updates) = watch::channel(None);
                let sink: EventSink = Arc::new(move |event| {
                    if let AgentEvent::ToolExecutionUpdate { partial_result, .. } = event {
                        sender.send_replace(Some(partial_result));
                    }
                });
                (sink, Some((token, updates)))
            }
            None => {
                let sink: EventSink = Arc::new(|_| {});
                (sink, None)
            }
        };
        let control = RunControl::new(cancel.clone(), events);
        let run = async {
            let call = self.0.session.call(call, &control);
            tokio::pin!(call);
            let result = loop {
                tokio::select! {
                    result = &mut call => break result,
                    () = context.ct.cancelled(), if !cancel.is_cancelled() => cancel.cancel(),
                }
            };
            done.cancel();
            result
        };
        let forward = async {
            if let Some((token, updates)) = progress {
                forward_progress(ProgressForward {
                    peer: &context.peer,
                    token,
                    updates,
                    done: &done,
                    cancel: &cancel,
                })
                .await;
            }
        };
        let (result, ()) = tokio::join!(run, forward);
        result
    }
}

/// What [`forward_progress`] needs.
struct ProgressForward<'a> {
    peer: &'a Peer<RoleServer>,
    token: ProgressToken,
    updates: watch::Receiver<Option<AgentToolResult>>,
    done: &'a CancellationToken,
    cancel: &'a CancellationToken,
}

/// Send each partial result as a progress notification (latest value wins when the client
/// reads slower than the tool writes), with increasing progress values, until the call is
/// done — the last partial is sent before the response — or cancelled (then nothing more).
async fn forward_progress(forward: ProgressForward<'_>) {
    let ProgressForward {
        peer,
        token,
        mut updates,
        done,
        cancel,
    } = forward;
    let mut progress = 0u32;
    loop {
        // Biased: an unsent partial is always sent before `done` ends the loop.
        tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            changed = updates.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = done.cancelled() => return,
        }
        let message = updates
            .borrow_and_update()
            .as_ref()
            .and_then(progress_message);
        progress += 1;
        let mut param = ProgressNotificationParam::new(token.clone(), f64::from(progress));
        param.message = message;
        if peer.notify_progress(param).await.is_err() {
            return;
        }
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        self.0.info.clone()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.0.tools.to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = self.0.calls.track_future(self.call(request, context)).await;
        Ok(CallToolResponse::from(call_tool_result(result)))
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!("Method not found: {}", request.method),
            None,
        ))
    }
}
