//! The cross-backend harness: a [`Harness`] is one small factory per backend, a [`Workspace`]
//! is a fresh workspace directory on the host with a `cordon_runtime::Session` over it.
//!
//! Every call goes through the session, i.e. the whole pipeline (prepare, validate, policy,
//! execute, after hooks, audit), never through the raw backend traits. Files are arranged and
//! checked on the HOST side (`put`, `get`, `symlink`), so a backend sees them the way an
//! operator's files would reach it: the same directory locally, a bind mount in Docker, the
//! remote root of an SSH host on localhost.
//!
//! Outputs name paths in the backend's namespace. [`Workspace::normalise`] replaces the
//! backend's workspace root with `$ROOT` and the policy file with `$POLICY`, so one expected
//! string holds for every backend; nothing else is normalised.
//!
//! Adding a backend = implementing [`Harness`] (build `SessionOptions` for a host directory)
//! and one `conformance_tests!(name, factory)` line in the suite.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use cordon_core::CancellationToken;
use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::{AssistantMessage, Message, ToolCall, ToolResult};
use cordon_core::tool::ExecutionMode;
use cordon_runtime::{Approver, Session, SessionOptions};
use serde_json::{Value, json};

/// One backend's factory: how to open a session over a host directory.
///
/// The conformance suite assumes the backend runs on this machine's kernel (the host itself, a
/// container, sshd on localhost): files arranged on the host appear in the workspace, and a
/// command's processes are visible in the host's `/proc`.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// Short name, also the test module name (`local`, `docker`, `ssh`).
    fn name(&self) -> &'static str;

    /// Why this backend's tests do not run: the user opted out explicitly (e.g.
    /// `CORDON_SKIP_DOCKER=1`). `None` (the default) means run, and FAIL with a clear message
    /// when the backend's infrastructure is missing.
    fn opted_out(&self) -> Option<String> {
        None
    }

    /// Session options for a workspace whose host directory is `request.host_root` (it
    /// exists). May start shared infrastructure (a daemon, an sshd) on first use. `Err` says
    /// why the backend is unavailable; the test fails with it.
    async fn session_options(&self, request: SessionRequest) -> Result<SessionOptions, String>;
}

/// What a [`Harness`] is asked to open.
#[derive(Clone, Debug)]
pub struct SessionRequest {
    /// The workspace directory on the host (canonical, exists).
    pub host_root: PathBuf,
    /// Policy file on the host; `None` = the built-in default policy.
    pub policy: Option<PathBuf>,
    /// Audit log file on the host.
    pub audit: Option<PathBuf>,
}

/// How to set up a [`Workspace`].
#[derive(Clone, Default)]
pub struct WorkspaceOptions {
    /// Policy file text (TOML); `None` = the built-in default policy.
    pub policy: Option<String>,
    /// Write an audit log (see [`Workspace::audit_path`]).
    pub audit: bool,
    /// Who the session asks (`ask` rules, `[network] ask` destinations); `None`: nobody.
    pub approver: Option<Arc<dyn Approver>>,
}

impl std::fmt::Debug for WorkspaceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkspaceOptions")
            .field("policy", &self.policy)
            .field("audit", &self.audit)
            .field("approver", &self.approver.as_ref().map(|_| ".."))
            .finish()
    }
}

impl WorkspaceOptions {
    /// Options with this policy text.
    pub fn policy(text: &str) -> Self {
        WorkspaceOptions {
            policy: Some(text.to_owned()),
            audit: false,
            approver: None,
        }
    }
}

/// The result of one [`Workspace::call`].
#[derive(Clone, Debug)]
pub struct Called {
    /// The result; a degraded-sandbox note in `details` is checked and removed.
    pub result: ToolResult,
    /// Its text blocks joined by `\n`, normalised (see [`Workspace::normalise`]).
    pub text: String,
    /// Every event the call emitted, in order.
    pub events: Vec<AgentEvent>,
}

impl Called {
    /// Whether the result is an error.
    pub fn is_error(&self) -> bool {
        self.result.is_error
    }

    /// `details` (`Value::Null` when absent).
    pub fn details(&self) -> Value {
        self.result.details.clone().unwrap_or(Value::Null)
    }

    /// `structuredContent` (`Value::Null` when absent).
    pub fn structured(&self) -> Value {
        self.result
            .structured_content
            .clone()
            .unwrap_or(Value::Null)
    }

    /// Panics (with the result) unless it is a success whose text is exactly `expected`.
    #[track_caller]
    pub fn assert_ok(&self, expected: &str) {
        assert!(
            !self.result.is_error,
            "expected success, got {:#?}",
            self.result
        );
        assert_eq!(self.text, expected, "result: {:#?}", self.result);
    }

    /// Panics (with the result) unless it is an error whose text is exactly `expected`.
    #[track_caller]
    pub fn assert_error(&self, expected: &str) {
        assert!(
            self.result.is_error,
            "expected an error, got {:#?}",
            self.result
        );
        assert_eq!(self.text, expected, "result: {:#?}", self.result);
    }
}

/// The results of one [`Workspace::replay`].
#[derive(Clone, Debug)]
pub struct Replayed {
    /// Every ToolResult message, in the order the replay appended them (degraded-sandbox
    /// notes removed as in [`Called::result`]).
    pub results: Vec<ToolResult>,
    /// Their normalised texts.
    pub texts: Vec<String>,
    /// Every event, in order.
    pub events: Vec<AgentEvent>,
}

impl Replayed {
    /// `(type, toolCallId or message role)` of each event, to compare event orders.
    pub fn event_trace(&self) -> Vec<String> {
        self.events.iter().map(event_label).collect()
    }
}

/// A compact label of an event: `tool_execution_end:c2`, `message_end:toolResult:c1`, …
pub fn event_label(event: &AgentEvent) -> String {
    let message_label = |message: &Message| match message {
        Message::User(_) => "user".to_owned(),
        Message::Assistant(_) => "assistant".to_owned(),
        Message::ToolResult(result) => format!("toolResult:{}", result.tool_call_id),
    };
    match event {
        AgentEvent::ToolExecutionStart { tool_call_id, .. }
        | AgentEvent::ToolExecutionUpdate { tool_call_id, .. }
        | AgentEvent::ToolExecutionEnd { tool_call_id, .. } => {
            format!("{}:{tool_call_id}", event.kind())
        }
        AgentEvent::MessageStart { message }
        | AgentEvent::MessageUpdate { message, .. }
        | AgentEvent::MessageEnd { message } => {
            format!("{}:{}", event.kind(), message_label(message))
        }
        AgentEvent::AgentStart
        | AgentEvent::AgentEnd { .. }
        | AgentEvent::TurnStart
        | AgentEvent::TurnEnd { .. } => event.kind().to_owned(),
    }
}

/// A fresh workspace on the host and a session over it. Layout of its temporary directory:
/// `ws/` (the workspace), `outside/` (a sibling the sandbox must not reach), `policy.toml`,
/// `audit.jsonl`. Everything is removed on drop, after the session is shut down.
pub struct Workspace {
    harness: Arc<dyn Harness>,
    session: Option<Session>,
    base: PathBuf,
    host_root: PathBuf,
    backend_root: PathBuf,
    policy: Option<PathBuf>,
    audit: Option<PathBuf>,
    missing_layers: Vec<String>,
    next_call: AtomicU64,
    approver: Option<Arc<dyn Approver>>,
    // Last: removed after the session is shut down.
    _dir: tempfile::TempDir,
}

impl Workspace {
    /// A workspace with the built-in default policy.
    pub async fn open(harness: &Arc<dyn Harness>) -> Workspace {
        Workspace::open_with(harness, WorkspaceOptions::default()).await
    }

    /// A workspace with the given options.
    pub async fn open_with(harness: &Arc<dyn Harness>, options: WorkspaceOptions) -> Workspace {
        let WorkspaceOptions {
            policy,
            audit,
            approver,
        } = options;
        let dir = tempfile::Builder::new()
            .prefix("cordon-conformance-")
            .tempdir()
            .expect("failed to create a temporary directory");
        let base = std::fs::canonicalize(dir.path()).expect("failed to canonicalise temp dir");
        let host_root = base.join("ws");
        std::fs::create_dir(&host_root).expect("failed to create the workspace directory");
        std::fs::create_dir(base.join("outside")).expect("failed to create outside/");
        let policy = policy.map(|text| {
            let path = base.join("policy.toml");
            std::fs::write(&path, text).expect("failed to write the policy file");
            path
        });
        let audit = audit.then(|| base.join("audit.jsonl"));
        let mut workspace = Workspace {
            harness: harness.clone(),
            session: None,
            base,
            backend_root: PathBuf::new(),
            host_root,
            policy,
            audit,
            missing_layers: Vec::new(),
            next_call: AtomicU64::new(1),
            approver,
            _dir: dir,
        };
        workspace.restart().await;
        workspace
    }

    /// Shut the session down and open a new one over the same directories (state that must
    /// outlive a session, such as spill files, is then checked from the new one).
    pub async fn restart(&mut self) {
        if let Some(old) = self.session.take() {
            old.shutdown().await.expect("shut the session down");
        }
        let request = SessionRequest {
            host_root: self.host_root.clone(),
            policy: self.policy.clone(),
            audit: self.audit.clone(),
        };
        let name = self.harness.name();
        let mut options = self
            .harness
            .session_options(request)
            .await
            .unwrap_or_else(|reason| panic!("the {name} backend is unavailable: {reason}"));
        if let Some(approver) = &self.approver {
            options.approver = Some(Arc::clone(approver));
        }
        let session = Session::open(options).await.unwrap_or_else(|error| {
            panic!(
                "failed to open a {name} session on {}: {error}",
                self.host_root.display()
            )
        });
        self.backend_root = session.backend().files().root().to_path_buf();
        self.missing_layers = session.backend().missing_layers();
        self.session = Some(session);
    }

    /// Shut the session down, as the end of a run does (host programs then see what it left
    /// behind); calls panic until [`Workspace::restart`].
    pub async fn close(&mut self) {
        if let Some(old) = self.session.take() {
            old.shutdown().await.expect("shut the session down");
        }
    }

    /// The session.
    pub fn session(&self) -> &Session {
        self.session.as_ref().expect("the session is open")
    }

    /// The backend's name (`local`, …).
    pub fn backend_name(&self) -> &'static str {
        self.harness.name()
    }

    /// The workspace directory on the host.
    pub fn host_root(&self) -> &Path {
        &self.host_root
    }

    /// The workspace root as the backend names it.
    pub fn backend_root(&self) -> &Path {
        &self.backend_root
    }

    /// The sandbox layers not in force (degraded sandbox); empty when complete.
    pub fn missing_layers(&self) -> &[String] {
        &self.missing_layers
    }

    /// The audit log on the host, when the workspace was opened with one.
    pub fn audit_path(&self) -> Option<&Path> {
        self.audit.as_deref()
    }

    /// `rel` inside the workspace, on the host.
    pub fn host(&self, rel: &str) -> PathBuf {
        self.host_root.join(rel)
    }

    /// `rel` inside `outside/`, the workspace's sibling on the host.
    pub fn outside(&self, rel: &str) -> PathBuf {
        self.base.join("outside").join(rel)
    }

    /// `rel` inside the workspace, as the backend names it.
    pub fn backend_path(&self, rel: &str) -> PathBuf {
        self.backend_root.join(rel)
    }

    /// The host path of a backend path inside the workspace, `None` outside it.
    pub fn to_host(&self, backend_path: &Path) -> Option<PathBuf> {
        backend_path
            .strip_prefix(&self.backend_root)
            .ok()
            .map(|rel| self.host_root.join(rel))
    }

    /// Create (or replace) a file in the workspace on the host, with its parent directories.
    pub fn put(&self, rel: &str, contents: impl AsRef<[u8]>) {
        let path = self.host(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("failed to create parent directories");
        }
        std::fs::write(&path, contents)
            .unwrap_or_else(|error| panic!("failed to write {}: {error}", path.display()));
    }

    /// Create a directory (and parents) in the workspace on the host.
    pub fn mkdir(&self, rel: &str) {
        std::fs::create_dir_all(self.host(rel)).expect("failed to create directory");
    }

    /// The bytes of a workspace file, read on the host.
    #[track_caller]
    pub fn get(&self, rel: &str) -> Vec<u8> {
        let path = self.host(rel);
        std::fs::read(&path)
            .unwrap_or_else(|error| panic!("failed to read {}: {error}", path.display()))
    }

    /// The text of a workspace file, read on the host.
    #[track_caller]
    pub fn get_text(&self, rel: &str) -> String {
        String::from_utf8(self.get(rel)).expect("file is UTF-8")
    }

    /// Whether `rel` exists in the workspace on the host (symlinks not followed).
    pub fn exists(&self, rel: &str) -> bool {
        std::fs::symlink_metadata(self.host(rel)).is_ok()
    }

    /// Create a symlink `rel` in the workspace pointing at `target` (verbatim).
    pub fn symlink(&self, target: impl AsRef<Path>, rel: &str) {
        let link = self.host(rel);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent).expect("failed to create parent directories");
        }
        std::os::unix::fs::symlink(target.as_ref(), &link)
            .unwrap_or_else(|error| panic!("failed to create symlink {}: {error}", link.display()));
    }

    /// Replace the backend's workspace root with `$ROOT` and the policy file with `$POLICY`.
    pub fn normalise(&self, text: &str) -> String {
        let mut out = text.replace(&*self.backend_root.to_string_lossy(), "$ROOT");
        if let Some(policy) = &self.policy {
            out = out.replace(&*policy.to_string_lossy(), "$POLICY");
        }
        out
    }

    fn next_id(&self) -> String {
        format!("call-{}", self.next_call.fetch_add(1, Ordering::Relaxed))
    }

    /// A fresh call id unique in this workspace (`call-N`).
    pub fn call_id(&self) -> String {
        self.next_id()
    }

    /// One call through the whole pipeline.
    pub async fn call(&self, tool: &str, args: Value) -> Called {
        self.call_with(tool, args, CancellationToken::new()).await
    }

    /// One call through the whole pipeline, cancelled by `cancel`.
    pub async fn call_with(&self, tool: &str, args: Value, cancel: CancellationToken) -> Called {
        let (control, events) = recording_control(cancel, |_| {});
        let call = ToolCall {
            id: self.next_id(),
            name: tool.to_owned(),
            arguments: args,
        };
        let mut result = self.session().call(call, &control).await;
        self.strip_degraded(&mut result);
        let events = take(&events);
        Called {
            text: self.normalise(&result.text()),
            result,
            events,
        }
    }

    /// Replay assistant messages through the agent loop with this session's tools and policy
    /// (`cordon replay` semantics).
    pub async fn replay(&self, messages: Vec<AssistantMessage>, mode: ExecutionMode) -> Replayed {
        self.replay_with(messages, mode, CancellationToken::new())
            .await
    }

    /// [`Workspace::replay`], cancelled by `cancel`.
    pub async fn replay_with(
        &self,
        messages: Vec<AssistantMessage>,
        mode: ExecutionMode,
        cancel: CancellationToken,
    ) -> Replayed {
        self.replay_observed(messages, mode, cancel, |_| {}).await
    }

    /// [`Workspace::replay_with`], calling `observer` with each event as it happens (before it
    /// is recorded), so a test can act on an event instead of waiting some time for it.
    pub async fn replay_observed(
        &self,
        messages: Vec<AssistantMessage>,
        mode: ExecutionMode,
        cancel: CancellationToken,
        observer: impl Fn(&AgentEvent) + Send + Sync + 'static,
    ) -> Replayed {
        let (control, events) = recording_control(cancel, observer);
        let config = self.session().agent_config(mode);
        let transcript = cordon_core::replay(&config, messages, &control).await;
        let results: Vec<ToolResult> = transcript
            .into_iter()
            .filter_map(|message| match message {
                Message::ToolResult(mut result) => {
                    self.strip_degraded(&mut result);
                    Some(result)
                }
                Message::User(_) | Message::Assistant(_) => None,
            })
            .collect();
        Replayed {
            texts: results
                .iter()
                .map(|result| self.normalise(&result.text()))
                .collect(),
            results,
            events: take(&events),
        }
    }

    /// A degraded sandbox adds `details.sandbox` to every executed call. Check it says exactly
    /// which layers are missing, then remove it so expectations hold in both modes.
    fn strip_degraded(&self, result: &mut ToolResult) {
        let Some(Value::Object(details)) = &mut result.details else {
            return;
        };
        match (details.remove("sandbox"), self.missing_layers.is_empty()) {
            (Some(note), false) => assert_eq!(
                note,
                json!({"degraded": true, "missingLayers": self.missing_layers}),
                "details.sandbox must name the missing layers"
            ),
            (Some(note), true) => panic!("a complete sandbox was reported as degraded: {note}"),
            (None, _) => {}
        }
        if details.is_empty() {
            result.details = None;
        }
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        // Release backend resources (containers, connections) before the directory goes.
        // Tests run on the multi-thread runtime, where blocking this worker is allowed.
        if let Ok(handle) = tokio::runtime::Handle::try_current()
            && handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
        {
            // A drop cannot fail the test; a test that cares calls shutdown itself.
            if let Err(error) = tokio::task::block_in_place(|| handle.block_on(session.shutdown()))
            {
                eprintln!("workspace teardown: {error}");
            }
        }
    }
}

type EventLog = Arc<Mutex<Vec<AgentEvent>>>;

fn recording_control(
    cancel: CancellationToken,
    observer: impl Fn(&AgentEvent) + Send + Sync + 'static,
) -> (RunControl, EventLog) {
    let events: EventLog = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let control = RunControl::new(
        cancel,
        Arc::new(move |event: AgentEvent| {
            observer(&event);
            sink.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(event);
        }),
    );
    (control, events)
}

fn take(events: &EventLog) -> Vec<AgentEvent> {
    std::mem::take(&mut *events.lock().unwrap_or_else(PoisonError::into_inner))
}
