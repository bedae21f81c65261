//! The `bash` tool (docs/semantics.md#bash): runs the model's command through
//! [`BashOperations::exec`] and builds everything the model sees from the raw output stream.
//!
//! It owns: argument parsing and timeout resolution (a default and a maximum, never "no
//! timeout"), consuming the output channel concurrently with `exec` (through
//! [`OutputAccumulator`]: streaming decode, sanitising, tail truncation, the raw spill file),
//! throttled partial updates, and the result text, `details` and `structuredContent` — the same
//! for success and error results, so the full-output path is never lost.
//!
//! It never runs a process itself: the backend spawns, kills the process tree on timeout or cancel,
//! and drains stdio. Commands are not coordinated with the edit/write mutation queue; a command
//! that changes files races with concurrent file tools (docs/semantics.md#mutation-queue).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use cordon_core::protocol::Content;
use cordon_core::sandbox::{DEFAULT_SPILL_BYTES, DEFAULT_SPILL_SESSION_BYTES};
use cordon_core::tool::{AgentTool, AgentToolResult, ToolError, ToolInvocation, UpdateCallback};
use cordon_ops::bounds::MAX_COMMAND_CHARS;
use cordon_ops::denial::{self, DenialLayout, Evidence};
use cordon_ops::{
    BashOperations, EgressLog, EgressRecord, ExecError, ExecOutcome, ExecRequest, ExitStatus,
    FileOperations, Termination, ToolKind,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::output::{
    AccumulatorStats, FinalOutput, FullOutput, OutputAccumulator, Redact, Snapshot, SpillAccount,
    SpillLimits,
};
use crate::truncate::{DEFAULT_MAX_BYTES, DEFAULT_MAX_LINES, Limits};

/// Partial updates are sent at most this often (a final one is always sent).
pub const UPDATE_THROTTLE: Duration = Duration::from_millis(100);

/// Most egress proxy records of one command kept in the result's `details.egress` (for the
/// audit log); the rest are counted in `details.egressOmitted`. Which ones are kept: each
/// destination's first attempt before repeats ([`EgressLog`]).
pub const MAX_EGRESS_DETAILS: usize = 256;
/// Output chunks in flight between the backend and the tool; awaiting a full channel is the
/// back-pressure that keeps memory bounded.
const OUTPUT_CHANNEL_CHUNKS: usize = 16;
/// The largest timeout accepted, in seconds (2^31-1 milliseconds).
pub const MAX_TIMEOUT_SECONDS: f64 = 2_147_483.647;

const DESCRIPTION: &str = "Execute a bash command in the current working directory. Returns \
stdout and stderr. Output is truncated to last 2000 lines or 50KB (whichever is hit first). If \
truncated, full output is saved to a temp file. Optionally provide a timeout in seconds.";

/// Timeouts of the bash tool (from the policy's `[limits]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BashOptions {
    /// Used when the model gives no timeout.
    pub default_timeout: Duration,
    /// Larger requested timeouts are clamped to this.
    pub max_timeout: Duration,
}

impl Default for BashOptions {
    fn default() -> Self {
        BashOptions {
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(1800),
        }
    }
}

/// Why a bash call could not produce a command result. The texts are read by the model.
#[derive(Debug, thiserror::Error)]
pub enum BashError {
    /// The arguments do not have the documented shape.
    #[error(
        "Invalid arguments for bash: {reason}. Expected {{\"command\": string, \"timeout\"?: number}}."
    )]
    InvalidArguments {
        /// What is wrong.
        reason: String,
    },
    /// The timeout is not a positive finite number.
    #[error(
        "Invalid timeout: must be a finite number of seconds greater than 0 (got {value}). \
         Omit timeout to use the default of {default} seconds."
    )]
    InvalidTimeout {
        /// The value the model sent.
        value: String,
        /// The default timeout, seconds.
        default: String,
    },
    /// The timeout is beyond what any backend can arm.
    #[error(
        "Invalid timeout: maximum is 2147483.647 seconds (got {value}). The timeout is in \
         seconds; values above {max} are clamped to {max}."
    )]
    TimeoutTooLarge {
        /// The value the model sent.
        value: String,
        /// The configured maximum, seconds.
        max: String,
    },
    /// The backend could not run the command at all.
    #[error("{}", exec_message(.source))]
    Exec {
        /// The backend's error.
        #[source]
        source: ExecError,
    },
}

fn exec_message(error: &ExecError) -> String {
    match error {
        ExecError::MissingCwd { cwd } => format!(
            "Working directory does not exist: {}\nCannot execute bash commands.",
            cwd.display()
        ),
        ExecError::Spawn { source } => {
            format!("Failed to start the shell: {source}. The command was not run.")
        }
        ExecError::Sandbox { layer, reason } => format!(
            "The command was not run: the sandbox layer {layer} could not be applied ({reason}). \
             Cordon fails closed; this is a host configuration problem, not a problem with the \
             command."
        ),
        ExecError::Backend { reason } => format!(
            "The command could not be run: the backend is unavailable ({reason}). Retry later; \
             if it keeps failing, tell the user the sandbox host is unreachable."
        ),
    }
}

/// The effective timeout of one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResolvedTimeout {
    /// Seconds, as reported to the model.
    pub seconds: f64,
    /// Set when the requested timeout was above the maximum and clamped to it.
    pub clamped_to: Option<f64>,
}

impl ResolvedTimeout {
    /// The timeout as a duration.
    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }
}

/// Resolve the model's `timeout` (seconds): the default when absent; ≤ 0, NaN, infinite or
/// above [`MAX_TIMEOUT_SECONDS`] is an error; above `options.max_timeout` it is clamped.
pub fn resolve_timeout(
    requested: Option<f64>,
    options: &BashOptions,
) -> Result<ResolvedTimeout, BashError> {
    let max = options.max_timeout.as_secs_f64();
    let default = options.default_timeout.as_secs_f64().min(max);
    let Some(seconds) = requested else {
        return Ok(ResolvedTimeout {
            seconds: default,
            clamped_to: None,
        });
    };
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(BashError::InvalidTimeout {
            value: format_seconds(seconds),
            default: format_seconds(default),
        });
    }
    if seconds > MAX_TIMEOUT_SECONDS {
        return Err(BashError::TimeoutTooLarge {
            value: format_seconds(seconds),
            max: format_seconds(max),
        });
    }
    if seconds > max {
        return Ok(ResolvedTimeout {
            seconds: max,
            clamped_to: Some(max),
        });
    }
    Ok(ResolvedTimeout {
        seconds,
        clamped_to: None,
    })
}

/// `120`, `0.01`, `2147483.647`: whole numbers without a fraction.
fn format_seconds(seconds: f64) -> String {
    format!("{seconds}")
}

/// Seconds as JSON: an integer when whole.
fn seconds_json(seconds: f64) -> Value {
    if seconds.fract() == 0.0 && seconds.abs() < 9.0e15 {
        json!(seconds as i64)
    } else {
        json!(seconds)
    }
}

#[derive(Deserialize)]
struct BashArgs {
    command: String,
    #[serde(default)]
    timeout: Option<Value>,
}

/// The timeout argument as a number: JSON numbers, and numeric strings a hook may have left.
fn timeout_number(value: Option<Value>, options: &BashOptions) -> Result<Option<f64>, BashError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => Ok(number.as_f64()),
        Some(Value::String(text)) => match text.trim().parse::<f64>() {
            Ok(seconds) => Ok(Some(seconds)),
            Err(_) => Err(BashError::InvalidTimeout {
                value: format!("{text:?}"),
                default: format_seconds(
                    options
                        .default_timeout
                        .min(options.max_timeout)
                        .as_secs_f64(),
                ),
            }),
        },
        Some(other) => Err(BashError::InvalidArguments {
            reason: format!("timeout must be a number of seconds, got {other}"),
        }),
    }
}

/// The `bash` tool; see the module docs.
pub struct BashTool {
    bash: Arc<dyn BashOperations>,
    files: Arc<dyn FileOperations>,
    options: BashOptions,
    parameters: Value,
    redact: Option<Redact>,
    spill_cap: Option<u64>,
    spill_account: Option<Arc<SpillAccount>>,
    last_stats: Mutex<Option<AccumulatorStats>>,
}

impl BashTool {
    /// A bash tool running commands through `bash`, with the workspace root and spill files of
    /// `files` (the same backend).
    pub fn new(
        bash: Arc<dyn BashOperations>,
        files: Arc<dyn FileOperations>,
        options: BashOptions,
    ) -> Self {
        let timeout_description = format!(
            "Timeout in seconds (optional, default {}, maximum {})",
            format_seconds(options.default_timeout.as_secs_f64()),
            format_seconds(options.max_timeout.as_secs_f64()),
        );
        let parameters = json!({
            "type": "object",
            "required": ["command"],
            "properties": {
                "command": {"type": "string", "maxLength": MAX_COMMAND_CHARS, "description": "Bash command to execute"},
                "timeout": {"type": "number", "description": timeout_description},
            }
        });
        BashTool {
            bash,
            files,
            options,
            parameters,
            redact: None,
            spill_cap: Some(DEFAULT_SPILL_BYTES),
            spill_account: Some(Arc::new(SpillAccount::new(DEFAULT_SPILL_SESSION_BYTES))),
            last_stats: Mutex::new(None),
        }
    }

    /// The same tool keeping at most `per_command` bytes of one command's full output and
    /// `session_total` over all commands of this tool (one session); `None`: no cap.
    pub fn with_spill_limits(
        mut self,
        per_command: Option<u64>,
        session_total: Option<u64>,
    ) -> Self {
        self.spill_cap = per_command;
        self.spill_account = session_total.map(|total| Arc::new(SpillAccount::new(total)));
        self
    }

    /// Redact the output with `redact` before it is truncated (see [`Redact`]); results are
    /// still redacted as a whole afterwards by whoever set the redaction up.
    pub fn with_redaction(mut self, redact: Redact) -> Self {
        self.redact = Some(redact);
        self
    }

    /// Output volume and memory high-water marks of the most recently finished call (for
    /// tests and diagnostics; concurrent calls overwrite each other's entry).
    pub fn last_output_stats(&self) -> Option<AccumulatorStats> {
        *self
            .last_stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl AgentTool for BashTool {
    fn name(&self) -> &str {
        ToolKind::Bash.name()
    }

    fn label(&self) -> &str {
        "bash"
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn prompt_snippet(&self) -> Option<&str> {
        Some("Execute bash commands (ls, grep, find, etc.)")
    }

    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError> {
        let ToolInvocation {
            call_id,
            args,
            cancel,
            on_update,
        } = invocation;
        let args: BashArgs =
            serde_json::from_value(args).map_err(|error| BashError::InvalidArguments {
                reason: error.to_string(),
            })?;
        let requested = timeout_number(args.timeout, &self.options)?;
        let timeout = resolve_timeout(requested, &self.options)?;
        if cancel.is_cancelled() {
            return Ok(AgentToolResult::error("Command aborted"));
        }
        on_update(AgentToolResult::default());

        let cwd = self.files.root().to_path_buf();
        let request = ExecRequest {
            call_id: Some(call_id),
            command: args.command,
            cwd: cwd.clone(),
            timeout: timeout.duration(),
            env: Vec::new(),
        };
        let (sender, mut receiver) = mpsc::channel::<Vec<u8>>(OUTPUT_CHANNEL_CHUNKS);
        let mut output = OutputAccumulator::new(
            self.files.clone(),
            Limits {
                max_lines: DEFAULT_MAX_LINES,
                max_bytes: DEFAULT_MAX_BYTES,
            },
        );
        if let Some(redact) = &self.redact {
            output.redact_with(redact.clone());
        }
        output.limit_spill(SpillLimits {
            per_command: self.spill_cap,
            session: self.spill_account.clone(),
        });
        let mut updates = Throttle::new(on_update.clone());
        let exec = self.bash.exec(request, cancel, sender);
        tokio::pin!(exec);
        let mut receiving = true;
        let outcome = loop {
            tokio::select! {
                biased;
                chunk = receiver.recv(), if receiving => match chunk {
                    Some(chunk) => {
                        output.push(chunk).await;
                        updates.changed(&output);
                    }
                    None => receiving = false,
                },
                outcome = &mut exec => break outcome,
                () = tokio::time::sleep_until(updates.deadline()), if updates.is_pending() => {
                    updates.flush(&output);
                }
            }
        };
        // Whatever the backend sent before `exec` returned is drained; later sends fail
        // (output after settlement is ignored).
        receiver.close();
        while let Some(chunk) = receiver.recv().await {
            output.push(chunk).await;
        }
        let (final_output, stats) = output.finish().await;
        *self
            .last_stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(stats);
        // The final state is always delivered, so a host's last update holds the last line.
        if final_output.had_output {
            on_update(update_payload(&final_output.snapshot));
        }
        let explained = match (&outcome, self.bash.denial_layout()) {
            (Ok(ended), Some(layout)) => explain_denials(
                &Evidence {
                    status: ended.status,
                    termination: ended.termination,
                    output: &final_output.snapshot.text,
                    cwd: &cwd,
                    timeout: timeout.duration(),
                    timeout_requested: requested.is_some(),
                },
                layout,
                &ended.notes,
            ),
            (Ok(_), None) | (Err(_), _) => Vec::new(),
        };
        let mut explained = explained;
        if let Ok(ended) = &outcome {
            let unknown = cordon_core::sandbox::SpecSources::default();
            let sources = self
                .bash
                .denial_layout()
                .map_or(&unknown, |layout| &layout.spec().sources);
            // Whatever the exit status: the command may have swallowed the refusal.
            if let Some(note) = denial::egress_note(&ended.egress, sources) {
                tracing::info!(
                    refused = ended.egress.iter().filter(|r| r.is_denied()).count(),
                    "bash: the network policy refused connections of the command"
                );
                explained.insert(0, note);
            }
        }
        Ok(build_result(&final_output, outcome, &timeout, explained))
    }
}

/// The sandbox's explanations of a failed command ([`cordon_ops::denial`]) that the backend
/// did not already give.
fn explain_denials(
    evidence: &Evidence<'_>,
    layout: &dyn DenialLayout,
    given: &[String],
) -> Vec<String> {
    let mut notes = denial::explain(evidence, layout);
    notes.retain(|note| !given.contains(note));
    if !notes.is_empty() {
        tracing::debug!(notes = notes.len(), "bash: explained a failed command");
    }
    notes
}

/// Partial-update throttling: at most one update per [`UPDATE_THROTTLE`], the pending one sent
/// when the interval ends.
struct Throttle {
    on_update: UpdateCallback,
    last: Instant,
    dirty: bool,
}

impl Throttle {
    fn new(on_update: UpdateCallback) -> Self {
        Throttle {
            on_update,
            last: Instant::now(),
            dirty: false,
        }
    }

    fn changed(&mut self, output: &OutputAccumulator) {
        self.dirty = true;
        if self.last.elapsed() >= UPDATE_THROTTLE {
            self.flush(output);
        }
    }

    fn is_pending(&self) -> bool {
        self.dirty
    }

    fn deadline(&self) -> Instant {
        self.last + UPDATE_THROTTLE
    }

    fn flush(&mut self, output: &OutputAccumulator) {
        (self.on_update)(update_payload(&output.snapshot()));
        self.last = Instant::now();
        self.dirty = false;
    }
}

/// A partial result: the truncated tail, truncation stats and the full-output path.
fn update_payload(snapshot: &Snapshot) -> AgentToolResult {
    let truncation = if snapshot.truncation.truncated {
        serde_json::to_value(&snapshot.truncation).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    AgentToolResult {
        content: vec![Content::text(snapshot.text.clone())],
        details: Some(json!({
            "truncation": truncation,
            "fullOutputPath": snapshot.full_output.path().map(|p| p.display().to_string()),
        })),
        ..Default::default()
    }
}

/// Why the call failed, if it did.
fn failure_message(
    outcome: &Result<ExecOutcome, ExecError>,
    timeout: &ResolvedTimeout,
) -> Option<String> {
    let ExecOutcome {
        status,
        termination,
        // Neither decides whether the call failed: they become notes after the output.
        notes: _,
        egress: _,
    } = match outcome {
        Ok(outcome) => outcome,
        Err(error) => return Some(exec_message(error)),
    };
    match termination {
        Termination::TimedOut => Some(format!(
            "Command timed out after {} seconds",
            format_seconds(timeout.seconds)
        )),
        Termination::Cancelled => Some("Command aborted".to_owned()),
        Termination::Exited => match status {
            Some(ExitStatus::Code(0)) => None,
            Some(ExitStatus::Code(code)) => Some(format!("Command exited with code {code}")),
            Some(status @ ExitStatus::Signal(signal)) => Some(format!(
                "Command exited with code {} (killed by signal {signal})",
                status.code()
            )),
            None => Some("Command ended without an exit status".to_owned()),
        },
    }
}

fn build_result(
    output: &FinalOutput,
    outcome: Result<ExecOutcome, ExecError>,
    timeout: &ResolvedTimeout,
    explained: Vec<String>,
) -> AgentToolResult {
    let snapshot = &output.snapshot;
    let mut text = snapshot.text.clone();
    if let Some(footer) = snapshot.footer() {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(&footer);
    }
    let failure = failure_message(&outcome, timeout);
    let is_error = failure.is_some();
    let mut text = match failure {
        None if text.is_empty() => "(no output)".to_owned(),
        None => text,
        Some(message) if text.is_empty() => message,
        Some(message) => format!("{text}\n\n{message}"),
    };
    // What the backend did after the command comes last, so truncation never hides it.
    // The sandbox's explanations of the failure close the result.
    let given = match &outcome {
        Ok(ExecOutcome { notes, .. }) => notes.as_slice(),
        Err(_) => &[],
    };
    let notes: Vec<&String> = given.iter().chain(&explained).collect();
    for note in &notes {
        text.push_str("\n\n");
        text.push_str(note);
    }

    let full_output_path = snapshot
        .full_output
        .path()
        .map(|path| path.display().to_string());
    let mut details = Map::new();
    if snapshot.truncation.truncated {
        details.insert(
            "truncation".into(),
            serde_json::to_value(&snapshot.truncation).unwrap_or(Value::Null),
        );
    }
    if let Some(path) = &full_output_path {
        details.insert("fullOutputPath".into(), json!(path));
    }
    match &snapshot.full_output {
        FullOutput::Failed { error, .. } => {
            details.insert("fullOutputError".into(), json!(error));
        }
        FullOutput::Capped { saved, .. } => {
            details.insert("fullOutputCappedAt".into(), json!(saved));
        }
        FullOutput::NotNeeded | FullOutput::Saved(_) => {}
    }
    if let Some(clamped) = timeout.clamped_to {
        details.insert("timeoutClampedTo".into(), seconds_json(clamped));
    }
    if snapshot.redactions > 0 {
        details.insert("redactions".into(), json!(snapshot.redactions));
    }
    // The connection attempts through the egress proxy, for the audit log.
    if let Ok(ExecOutcome { egress, .. }) = &outcome
        && !egress.is_empty()
    {
        let kept = kept_egress(egress);
        details.insert(
            "egress".into(),
            serde_json::to_value(&kept).unwrap_or(Value::Null),
        );
        if egress.len() > kept.len() {
            details.insert("egressOmitted".into(), json!(egress.len() - kept.len()));
        }
    }
    let exit_code = match &outcome {
        Ok(ExecOutcome { status, .. }) => status.map(ExitStatus::code),
        Err(_) => None,
    };
    AgentToolResult {
        content: vec![Content::text(text)],
        details: (!details.is_empty()).then_some(Value::Object(details)),
        structured_content: Some(json!({
            // The same truncated text the model reads: MCP clients that show the structured
            // copy instead of `content` must not get more (or lose the tail and footer).
            "output": snapshot.text,
            "exitCode": exit_code,
            "truncated": snapshot.truncation.truncated,
            "fullOutputPath": full_output_path,
            // The notes after the output (the sandbox's explanations, what the backend did),
            // which such clients would otherwise never show.
            "notes": notes,
        })),
        is_error,
        terminate: false,
    }
}

/// The records `details.egress` keeps, in the order the attempts ended: all of them up to
/// [`MAX_EGRESS_DETAILS`]; beyond, each destination's first attempt before repeats
/// ([`EgressLog`]), so a flood of garbage or of one destination cannot push another
/// destination out of the audit log.
fn kept_egress(egress: &[EgressRecord]) -> Vec<EgressRecord> {
    let mut log = EgressLog::new(MAX_EGRESS_DETAILS);
    for record in egress {
        log.push(record.clone());
    }
    log.into_records()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Mutex;

    use tokio::sync::Notify;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::testing::StdFiles;
    use cordon_ops::BackendId;

    /// One step of a [`ScriptedBash`] run.
    enum Step {
        /// Send this chunk.
        Chunk(Vec<u8>),
        /// Send a copy of this chunk `times` times (large outputs without holding them).
        Repeat { chunk: Vec<u8>, times: usize },
        /// Tell the test this point was reached.
        Reached(Arc<Notify>),
        /// Wait until the test opens the gate.
        Gate(Arc<Notify>),
        /// Sleep (virtual time in paused tests).
        Sleep(Duration),
        /// Wait for the cancellation token.
        WaitForCancel,
        /// Keep a sender; once `go` is notified (after exec returned), try to send and
        /// report whether the send was accepted.
        LateSend {
            go: Arc<Notify>,
            accepted: tokio::sync::oneshot::Sender<bool>,
        },
    }

    /// A [`BashOperations`] double: plays steps, returns a given outcome, records requests.
    struct ScriptedBash {
        id: BackendId,
        steps: Mutex<Option<Vec<Step>>>,
        outcome: Mutex<Option<Result<ExecOutcome, ExecError>>>,
        requests: Mutex<Vec<ExecRequest>>,
    }

    impl ScriptedBash {
        fn new(steps: Vec<Step>, outcome: Result<ExecOutcome, ExecError>) -> Arc<Self> {
            Arc::new(ScriptedBash {
                id: BackendId::new("scripted"),
                steps: Mutex::new(Some(steps)),
                outcome: Mutex::new(Some(outcome)),
                requests: Mutex::new(Vec::new()),
            })
        }

        fn exits(steps: Vec<Step>, status: Option<ExitStatus>) -> Arc<Self> {
            Self::new(
                steps,
                Ok(ExecOutcome {
                    status,
                    termination: Termination::Exited,
                    notes: Vec::new(),
                    egress: Vec::new(),
                }),
            )
        }

        fn requests(&self) -> Vec<ExecRequest> {
            self.requests.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl BashOperations for ScriptedBash {
        fn backend_id(&self) -> &BackendId {
            &self.id
        }

        async fn exec(
            &self,
            request: ExecRequest,
            cancel: CancellationToken,
            output: mpsc::Sender<Vec<u8>>,
        ) -> Result<ExecOutcome, ExecError> {
            self.requests.lock().unwrap().push(request);
            let steps = self
                .steps
                .lock()
                .unwrap()
                .take()
                .expect("one exec per script");
            for step in steps {
                match step {
                    Step::Chunk(chunk) => output.send(chunk).await.expect("tool receives"),
                    Step::Repeat { chunk, times } => {
                        for _ in 0..times {
                            output.send(chunk.clone()).await.expect("tool receives");
                        }
                    }
                    Step::Reached(notify) => notify.notify_one(),
                    Step::Gate(notify) => notify.notified().await,
                    Step::Sleep(duration) => tokio::time::sleep(duration).await,
                    Step::WaitForCancel => cancel.cancelled().await,
                    Step::LateSend { go, accepted } => {
                        let sender = output.clone();
                        tokio::spawn(async move {
                            go.notified().await;
                            let ok = sender.send(b"late\n".to_vec()).await.is_ok();
                            let _ = accepted.send(ok);
                        });
                    }
                }
            }
            self.outcome.lock().unwrap().take().expect("one outcome")
        }
    }

    /// A [`BashOperations`] double that really runs `bash -c` with tokio: own process group,
    /// stdin closed, stdout and stderr merged through one pipe, the group killed on timeout,
    /// cancel and exit (so background children cannot hold the pipe open).
    struct ProcessBash {
        id: BackendId,
    }

    impl ProcessBash {
        fn new() -> Arc<Self> {
            Arc::new(ProcessBash {
                id: BackendId::new("process"),
            })
        }
    }

    #[async_trait]
    impl BashOperations for ProcessBash {
        fn backend_id(&self) -> &BackendId {
            &self.id
        }

        async fn exec(
            &self,
            request: ExecRequest,
            cancel: CancellationToken,
            output: mpsc::Sender<Vec<u8>>,
        ) -> Result<ExecOutcome, ExecError> {
            use std::io::Read;
            use std::os::unix::process::ExitStatusExt;
            if !request.cwd.is_dir() {
                return Err(ExecError::MissingCwd { cwd: request.cwd });
            }
            let spawn_error = |source| ExecError::Spawn { source };
            let (mut reader, writer) = std::io::pipe().map_err(spawn_error)?;
            let mut command = tokio::process::Command::new("bash");
            command
                .arg("-c")
                .arg(&request.command)
                .current_dir(&request.cwd)
                .envs(request.env.iter().map(|(k, v)| (k, v)))
                .stdin(std::process::Stdio::null())
                .stdout(writer.try_clone().map_err(spawn_error)?)
                .stderr(writer)
                .process_group(0)
                .kill_on_drop(true);
            let mut child = command.spawn().map_err(spawn_error)?;
            drop(command); // closes our copies of the pipe's write end
            let pgid = nix::unistd::Pid::from_raw(child.id().expect("running") as i32);
            let pump = tokio::task::spawn_blocking(move || {
                let mut buffer = vec![0u8; 64 * 1024];
                loop {
                    match reader.read(&mut buffer) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if output.blocking_send(buffer[..n].to_vec()).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
            let termination = tokio::select! {
                _ = child.wait() => Termination::Exited,
                () = tokio::time::sleep(request.timeout) => Termination::TimedOut,
                () = cancel.cancelled() => Termination::Cancelled,
            };
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let status = child.wait().await.map_err(spawn_error)?;
            pump.await.expect("pump task");
            let status = match (status.code(), status.signal()) {
                (Some(code), _) => Some(ExitStatus::Code(code)),
                (None, Some(signal)) => Some(ExitStatus::Signal(signal)),
                (None, None) => None,
            };
            Ok(ExecOutcome {
                status,
                termination,
                notes: Vec::new(),
                egress: Vec::new(),
            })
        }
    }

    struct Harness {
        _dir: tempfile::TempDir,
        root: PathBuf,
        tool: BashTool,
        updates: Arc<Mutex<Vec<AgentToolResult>>>,
    }

    impl Harness {
        fn new(bash: Arc<dyn BashOperations>) -> Self {
            Self::with_options(bash, BashOptions::default())
        }

        fn with_options(bash: Arc<dyn BashOperations>, options: BashOptions) -> Self {
            Self::build(bash, options, |root| Arc::new(StdFiles::new(root)))
        }

        fn build(
            bash: Arc<dyn BashOperations>,
            options: BashOptions,
            files: impl FnOnce(&std::path::Path) -> Arc<dyn FileOperations>,
        ) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("ws");
            std::fs::create_dir(&root).unwrap();
            let files = files(&root);
            let root = files.root().to_path_buf();
            Harness {
                _dir: dir,
                root,
                tool: BashTool::new(bash, files, options),
                updates: Arc::new(Mutex::new(Vec::new())),
            }
        }

        async fn call_with(
            &self,
            args: Value,
            cancel: CancellationToken,
        ) -> Result<AgentToolResult, ToolError> {
            let updates = self.updates.clone();
            self.tool
                .execute(ToolInvocation {
                    call_id: "call-1".into(),
                    args,
                    cancel,
                    on_update: Arc::new(move |update| updates.lock().unwrap().push(update)),
                })
                .await
        }

        async fn call(&self, args: Value) -> AgentToolResult {
            self.call_with(args, CancellationToken::new())
                .await
                .expect("bash returns a result")
        }

        fn updates(&self) -> Vec<AgentToolResult> {
            self.updates.lock().unwrap().clone()
        }

        fn stats(&self) -> AccumulatorStats {
            self.tool.last_output_stats().expect("a run finished")
        }

        fn spill_dir(&self) -> PathBuf {
            self.root.with_extension("spill")
        }
    }

    fn text(result: &AgentToolResult) -> &str {
        result.content[0].as_text().expect("text block")
    }

    fn chunk(text: &str) -> Step {
        Step::Chunk(text.as_bytes().to_vec())
    }

    fn numbered(lines: std::ops::RangeInclusive<usize>) -> String {
        lines.map(|i| format!("{i}\n")).collect()
    }

    fn full_output_path(result: &AgentToolResult) -> PathBuf {
        let details = result.details.as_ref().expect("details");
        let from_details = details["fullOutputPath"].as_str().expect("details path");
        let structured = result.structured_content.as_ref().expect("structured");
        assert_eq!(
            structured["fullOutputPath"].as_str(),
            Some(from_details),
            "structuredContent and details agree"
        );
        assert!(text(result).contains(&format!("Full output: {from_details}]")));
        PathBuf::from(from_details)
    }

    fn timed_out() -> Result<ExecOutcome, ExecError> {
        Ok(ExecOutcome {
            status: Some(ExitStatus::Signal(9)),
            termination: Termination::TimedOut,
            notes: Vec::new(),
            egress: Vec::new(),
        })
    }

    // --- definition -------------------------------------------------------------------

    #[test]
    fn definition_matches_reference_with_timeout_bounds() {
        let h = Harness::new(ScriptedBash::exits(vec![], Some(ExitStatus::Code(0))));
        assert_eq!(h.tool.name(), "bash");
        assert_eq!(h.tool.description(), DESCRIPTION);
        assert_eq!(
            h.tool.prompt_snippet(),
            Some("Execute bash commands (ls, grep, find, etc.)")
        );
        let params = h.tool.parameters();
        assert_eq!(params["required"], json!(["command"]));
        assert_eq!(
            params["properties"]["timeout"]["description"],
            "Timeout in seconds (optional, default 120, maximum 1800)"
        );
    }

    // --- results ----------------------------------------------------------------------

    #[tokio::test]
    async fn success_sends_request_with_workspace_root_and_default_timeout() {
        let bash = ScriptedBash::exits(vec![chunk("hi\n")], Some(ExitStatus::Code(0)));
        let h = Harness::new(bash.clone());
        let result = h.call(json!({"command": "echo hi"})).await;
        assert!(!result.is_error);
        assert_eq!(text(&result), "hi\n");
        assert_eq!(result.details, None);
        assert_eq!(
            result.structured_content,
            Some(json!({"output": "hi\n", "exitCode": 0, "truncated": false,
                        "fullOutputPath": null, "notes": []}))
        );
        let requests = bash.requests();
        assert_eq!(
            requests,
            vec![ExecRequest {
                // The call's id goes with its command (the egress proxy's questions name it).
                call_id: Some("call-1".into()),
                command: "echo hi".into(),
                cwd: h.root.clone(),
                timeout: Duration::from_secs(120),
                env: vec![],
            }]
        );
        assert!(!h.spill_dir().exists(), "no spill file for small output");
    }

    #[tokio::test]
    async fn backend_notes_end_the_result() {
        let bash = ScriptedBash::new(
            vec![chunk("made a repo\n")],
            Ok(ExecOutcome {
                status: Some(ExitStatus::Code(3)),
                termination: Termination::Exited,
                notes: vec!["quarantined src/.git".to_owned()],
                egress: Vec::new(),
            }),
        );
        let h = Harness::new(bash);
        let result = h.call(json!({"command": "git init src"})).await;
        assert!(result.is_error);
        assert_eq!(
            text(&result),
            "made a repo\n\n\nCommand exited with code 3\n\nquarantined src/.git"
        );
    }

    /// A [`ScriptedBash`] on a sandbox whose `.git` is protected by `p.toml:4`.
    struct Sandboxed {
        inner: Arc<ScriptedBash>,
        spec: cordon_core::sandbox::SandboxSpec,
    }

    impl DenialLayout for Sandboxed {
        fn spec(&self) -> &cordon_core::sandbox::SandboxSpec {
            &self.spec
        }

        fn classify(&self, path: &std::path::Path) -> Option<denial::PathEntry> {
            path.components()
                .any(|c| c.as_os_str() == ".git")
                .then_some(denial::PathEntry::Protected(0))
        }
    }

    #[async_trait]
    impl BashOperations for Sandboxed {
        fn backend_id(&self) -> &BackendId {
            self.inner.backend_id()
        }

        async fn exec(
            &self,
            request: ExecRequest,
            cancel: CancellationToken,
            output: mpsc::Sender<Vec<u8>>,
        ) -> Result<ExecOutcome, ExecError> {
            self.inner.exec(request, cancel, output).await
        }

        fn denial_layout(&self) -> Option<&dyn DenialLayout> {
            Some(self)
        }
    }

    fn sandboxed(inner: Arc<ScriptedBash>) -> Arc<Sandboxed> {
        let spec = cordon_core::sandbox::SandboxSpec {
            sources: cordon_core::sandbox::SpecSources {
                file: "p.toml".into(),
                protected: vec![4],
                ..Default::default()
            },
            ..Default::default()
        };
        Arc::new(Sandboxed { inner, spec })
    }

    #[tokio::test]
    async fn a_denial_is_explained_after_the_backend_notes() {
        let refused = "touch: cannot touch '.git/config': Read-only file system\n";
        let bash = ScriptedBash::new(
            vec![chunk(refused)],
            Ok(ExecOutcome {
                status: Some(ExitStatus::Code(1)),
                termination: Termination::Exited,
                notes: vec!["quarantined src/.git".to_owned()],
                egress: Vec::new(),
            }),
        );
        let h = Harness::new(sandboxed(bash));
        let result = h.call(json!({"command": "touch .git/config"})).await;
        let root = h.root.display();
        assert_eq!(
            text(&result),
            format!(
                "{refused}\n\nCommand exited with code 1\n\nquarantined src/.git\n\nSandbox: \
                 {root}/.git/config is protected (read-only) by `.git/**` in `[filesystem] \
                 protect` (p.toml:4), so writing it was refused. Leave it unchanged; the \
                 operator can remove or narrow that entry."
            )
        );
        // The same output from a command that succeeded, or from a backend without a
        // sandbox, is not explained.
        let h = Harness::new(sandboxed(ScriptedBash::exits(
            vec![chunk(refused)],
            Some(ExitStatus::Code(0)),
        )));
        let result = h.call(json!({"command": "echo"})).await;
        assert_eq!(text(&result), refused);
        let h = Harness::new(ScriptedBash::exits(
            vec![chunk(refused)],
            Some(ExitStatus::Code(1)),
        ));
        let result = h.call(json!({"command": "touch .git/config"})).await;
        assert_eq!(
            text(&result),
            format!("{refused}\n\nCommand exited with code 1")
        );
    }

    fn egress_record(host: &str, outcome: cordon_ops::EgressOutcome) -> cordon_ops::EgressRecord {
        cordon_ops::EgressRecord {
            protocol: cordon_ops::EgressProtocol::HttpConnect,
            host: host.to_owned(),
            port: 443,
            address: None,
            outcome,
            entry: None,
            source: None,
            suggestion: Some(host.to_owned()),
            asked: None,
            reason: format!("no entry allows {host}:443"),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 2,
        }
    }

    #[tokio::test]
    async fn refused_destinations_end_the_result_even_when_the_command_succeeds() {
        let records = vec![
            cordon_ops::EgressRecord {
                suggestion: None,
                entry: Some("*.crates.io".to_owned()),
                source: Some("p.toml:6".to_owned()),
                reason: "relayed until both sides closed".to_owned(),
                bytes_up: 300,
                bytes_down: 4000,
                ..egress_record("static.crates.io", cordon_ops::EgressOutcome::Allowed)
            },
            egress_record("evil.test", cordon_ops::EgressOutcome::Denied),
        ];
        let bash = ScriptedBash::new(
            vec![chunk("fell back to the cache\n")],
            Ok(ExecOutcome {
                status: Some(ExitStatus::Code(0)),
                termination: Termination::Exited,
                notes: vec!["quarantined src/.git".to_owned()],
                egress: records.clone(),
            }),
        );
        let h = Harness::new(sandboxed(bash));
        let result = h.call(json!({"command": "cargo fetch"})).await;
        assert!(!result.is_error);
        let note = "Sandbox: the network policy refused 1 destination during this command \
                    (commands reach only what `[network] allow` lists, through Cordon's proxy):\n\
                    - evil.test:443: no entry allows evil.test:443; to allow it, the operator can \
                    add \"evil.test\" to `[network] allow` in p.toml";
        assert_eq!(
            text(&result),
            format!("fell back to the cache\n\n\nquarantined src/.git\n\n{note}")
        );
        let structured = result
            .structured_content
            .clone()
            .expect("structured content");
        assert_eq!(structured["notes"], json!(["quarantined src/.git", note]));
        // Every attempt, allowed or not, is in the details for the audit log.
        let details = result.details.expect("details");
        assert_eq!(details["egress"], serde_json::to_value(&records).unwrap());
        assert_eq!(details.get("egressOmitted"), None);

        // Allowed attempts alone: no note.
        let bash = ScriptedBash::new(
            vec![],
            Ok(ExecOutcome {
                status: Some(ExitStatus::Code(0)),
                termination: Termination::Exited,
                notes: vec![],
                egress: records[..1].to_vec(),
            }),
        );
        let result = Harness::new(sandboxed(bash))
            .call(json!({"command": "cargo fetch"}))
            .await;
        assert_eq!(text(&result), "(no output)");
    }

    #[tokio::test]
    async fn a_flood_of_attempts_does_not_push_other_destinations_out_of_the_details() {
        use cordon_ops::EgressOutcome::{Allowed, Denied, Failed};
        // Garbage and repeats first, the connections that matter last.
        let mut records: Vec<_> = (0..MAX_EGRESS_DETAILS)
            .map(|_| egress_record("", Failed))
            .collect();
        records.extend((0..MAX_EGRESS_DETAILS).map(|_| egress_record("crates.test", Allowed)));
        records.extend((0..10).map(|i| egress_record(&format!("h{i}.test"), Denied)));
        records.push(egress_record("paste.test", Allowed));
        records.push(egress_record("evil.test", Denied));
        let total = records.len();
        let bash = ScriptedBash::new(
            vec![],
            Ok(ExecOutcome {
                status: Some(ExitStatus::Code(0)),
                termination: Termination::Exited,
                notes: vec![],
                egress: records,
            }),
        );
        let result = Harness::new(bash).call(json!({"command": "x"})).await;
        let details = result.details.clone().expect("details");
        let kept = details["egress"].as_array().expect("egress");
        assert_eq!(kept.len(), MAX_EGRESS_DETAILS);
        assert_eq!(details["egressOmitted"], total - MAX_EGRESS_DETAILS);
        let hosts: Vec<(&str, &str)> = kept
            .iter()
            .map(|r| {
                (
                    r["host"].as_str().expect("host"),
                    r["outcome"].as_str().expect("outcome"),
                )
            })
            .collect();
        // Each destination once (allowed, then refused, then failed), then repeats, in the
        // order the attempts ended.
        let mut expected = vec![("", "failed"), ("crates.test", "allowed")];
        expected.extend(
            (MAX_EGRESS_DETAILS..MAX_EGRESS_DETAILS * 2 - 14).map(|_| ("crates.test", "allowed")),
        );
        let denied: Vec<String> = (0..10).map(|i| format!("h{i}.test")).collect();
        expected.extend(denied.iter().map(|h| (h.as_str(), "denied")));
        expected.push(("paste.test", "allowed"));
        expected.push(("evil.test", "denied"));
        assert_eq!(hosts, expected);
    }

    #[tokio::test]
    async fn egress_details_are_bounded() {
        let records: Vec<_> = (0..MAX_EGRESS_DETAILS + 5)
            .map(|i| egress_record(&format!("h{i}.test"), cordon_ops::EgressOutcome::Denied))
            .collect();
        let bash = ScriptedBash::new(
            vec![],
            Ok(ExecOutcome {
                status: Some(ExitStatus::Code(1)),
                termination: Termination::Exited,
                notes: vec![],
                egress: records,
            }),
        );
        let result = Harness::new(bash).call(json!({"command": "x"})).await;
        let details = result.details.clone().expect("details");
        assert_eq!(
            details["egress"].as_array().map(Vec::len),
            Some(MAX_EGRESS_DETAILS)
        );
        assert_eq!(details["egressOmitted"], 5);
        // Without a layout the policy file is unknown; the note still names the entry.
        assert!(
            text(&result).contains(
                "- h0.test:443: no entry allows h0.test:443; to allow it, the operator can add \
                 \"h0.test\" to `[network] allow` in the policy\n"
            ),
            "{}",
            text(&result)
        );
        assert!(text(&result).ends_with("\n- and 253 more destinations"));
    }

    #[tokio::test]
    async fn empty_output_says_no_output() {
        let h = Harness::new(ScriptedBash::exits(vec![], Some(ExitStatus::Code(0))));
        let result = h.call(json!({"command": "true"})).await;
        assert!(!result.is_error);
        assert_eq!(text(&result), "(no output)");
        assert_eq!(result.structured_content.unwrap()["output"], "");
    }

    #[tokio::test]
    async fn nonzero_exit_is_an_error_with_output() {
        let h = Harness::new(ScriptedBash::exits(
            vec![chunk("failed\n")],
            Some(ExitStatus::Code(7)),
        ));
        let result = h.call(json!({"command": "x"})).await;
        assert!(result.is_error);
        assert_eq!(text(&result), "failed\n\n\nCommand exited with code 7");
        assert_eq!(result.structured_content.unwrap()["exitCode"], 7);
    }

    #[tokio::test]
    async fn nonzero_exit_without_output_has_no_prefix() {
        let h = Harness::new(ScriptedBash::exits(vec![], Some(ExitStatus::Code(1))));
        let result = h.call(json!({"command": "exit 1"})).await;
        assert!(result.is_error);
        assert_eq!(text(&result), "Command exited with code 1");
    }

    #[tokio::test]
    async fn signal_is_reported_as_128_plus_n() {
        let h = Harness::new(ScriptedBash::exits(
            vec![chunk("partial")],
            Some(ExitStatus::Signal(9)),
        ));
        let result = h.call(json!({"command": "x"})).await;
        assert!(result.is_error);
        assert_eq!(
            text(&result),
            "partial\n\nCommand exited with code 137 (killed by signal 9)"
        );
        assert_eq!(result.structured_content.unwrap()["exitCode"], 137);
    }

    #[tokio::test]
    async fn unknown_exit_status_is_an_error_never_success() {
        let h = Harness::new(ScriptedBash::exits(vec![chunk("out\n")], None));
        let result = h.call(json!({"command": "x"})).await;
        assert!(result.is_error);
        assert_eq!(
            text(&result),
            "out\n\n\nCommand ended without an exit status"
        );
        assert_eq!(result.structured_content.unwrap()["exitCode"], Value::Null);
    }

    #[tokio::test]
    async fn exec_errors_are_written_for_the_model() {
        let bash = ScriptedBash::new(
            vec![],
            Err(ExecError::MissingCwd {
                cwd: PathBuf::from("/gone"),
            }),
        );
        let h = Harness::new(bash);
        let result = h.call(json!({"command": "ls"})).await;
        assert!(result.is_error);
        assert_eq!(
            text(&result),
            "Working directory does not exist: /gone\nCannot execute bash commands."
        );
        let bash = ScriptedBash::new(
            vec![],
            Err(ExecError::Sandbox {
                layer: "landlock",
                reason: "unsupported".into(),
            }),
        );
        let result = Harness::new(bash).call(json!({"command": "ls"})).await;
        assert!(result.is_error);
        assert!(text(&result).contains("sandbox layer landlock could not be applied"));
    }

    // --- timeouts ---------------------------------------------------------------------

    #[test]
    fn resolve_timeout_rules() {
        let options = BashOptions::default();
        let ok = |t| resolve_timeout(t, &options).unwrap();
        assert_eq!(ok(None).seconds, 120.0);
        assert_eq!(ok(Some(0.01)).seconds, 0.01);
        assert_eq!(ok(Some(1800.0)).clamped_to, None);
        let clamped = ok(Some(5000.0));
        assert_eq!(
            (clamped.seconds, clamped.clamped_to),
            (1800.0, Some(1800.0))
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let error = resolve_timeout(Some(bad), &options)
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with("Invalid timeout: must be a finite number of seconds"),
                "{bad}: {error}"
            );
        }
        let error = resolve_timeout(Some(2_147_483.648), &options)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("Invalid timeout: maximum is 2147483.647 seconds"),
            "{error}"
        );
        assert!(resolve_timeout(Some(MAX_TIMEOUT_SECONDS), &options).is_ok());
    }

    #[tokio::test]
    async fn invalid_timeouts_are_rejected_before_running() {
        for timeout in [json!(0), json!(-5), json!(3_000_000), json!("soon")] {
            let bash = ScriptedBash::exits(vec![], Some(ExitStatus::Code(0)));
            let h = Harness::new(bash.clone());
            let error = h
                .call_with(
                    json!({"command": "true", "timeout": timeout}),
                    CancellationToken::new(),
                )
                .await
                .unwrap_err()
                .to_string();
            assert!(error.starts_with("Invalid timeout: "), "{timeout}: {error}");
            assert!(bash.requests().is_empty(), "nothing ran for {timeout}");
        }
    }

    #[tokio::test]
    async fn timeout_above_maximum_is_clamped_and_reported() {
        let bash = ScriptedBash::new(vec![chunk("slow\n")], timed_out());
        let h = Harness::with_options(
            bash.clone(),
            BashOptions {
                default_timeout: Duration::from_secs(30),
                max_timeout: Duration::from_secs(60),
            },
        );
        let result = h.call(json!({"command": "x", "timeout": 5000})).await;
        assert_eq!(bash.requests()[0].timeout, Duration::from_secs(60));
        assert!(result.is_error);
        assert_eq!(
            text(&result),
            "slow\n\n\nCommand timed out after 60 seconds"
        );
        assert_eq!(result.details, Some(json!({"timeoutClampedTo": 60})));
    }

    #[tokio::test]
    async fn configured_default_timeout_is_used() {
        let bash = ScriptedBash::exits(vec![], Some(ExitStatus::Code(0)));
        let h = Harness::with_options(
            bash.clone(),
            BashOptions {
                default_timeout: Duration::from_secs(42),
                max_timeout: Duration::from_secs(600),
            },
        );
        h.call(json!({"command": "true"})).await;
        assert_eq!(bash.requests()[0].timeout, Duration::from_secs(42));
        let bash = ScriptedBash::exits(vec![], Some(ExitStatus::Code(0)));
        let h = Harness::new(bash.clone());
        h.call(json!({"command": "true", "timeout": 0.25})).await;
        assert_eq!(bash.requests()[0].timeout, Duration::from_millis(250));
    }

    #[tokio::test]
    async fn timeout_keeps_output_and_intact_spill_file() {
        let bash = ScriptedBash::new(
            vec![Step::Chunk(numbered(1..=3000).into_bytes())],
            timed_out(),
        );
        let h = Harness::new(bash);
        let result = h.call(json!({"command": "x", "timeout": 5})).await;
        assert!(result.is_error);
        let body = text(&result);
        assert!(
            body.ends_with("\n\nCommand timed out after 5 seconds"),
            "{body}"
        );
        assert!(body.contains("[Showing lines 1001-3000 of 3000. Full output: "));
        assert!(!body.contains("undefined"));
        let path = full_output_path(&result);
        assert_eq!(std::fs::read_to_string(path).unwrap(), numbered(1..=3000));
        let details = result.details.unwrap();
        assert_eq!(details["truncation"]["truncatedBy"], "lines");
        assert_eq!(result.structured_content.unwrap()["truncated"], true);
    }

    #[tokio::test]
    async fn fractional_timeout_is_reported_as_given() {
        let bash = ScriptedBash::new(vec![], timed_out());
        let h = Harness::new(bash.clone());
        let result = h.call(json!({"command": "x", "timeout": 0.01})).await;
        assert_eq!(text(&result), "Command timed out after 0.01 seconds");
        assert_eq!(bash.requests()[0].timeout, Duration::from_millis(10));
    }

    #[tokio::test]
    async fn nonzero_exit_keeps_full_output_path() {
        let bash = ScriptedBash::exits(
            vec![Step::Chunk(numbered(1..=2500).into_bytes())],
            Some(ExitStatus::Code(2)),
        );
        let h = Harness::new(bash);
        let result = h.call(json!({"command": "x"})).await;
        assert!(result.is_error);
        let body = text(&result);
        assert!(body.contains("\n2500\n\n[Showing lines 501-2500 of 2500. Full output: "));
        assert!(body.ends_with("]\n\nCommand exited with code 2"), "{body}");
        let path = full_output_path(&result);
        assert_eq!(std::fs::read_to_string(path).unwrap(), numbered(1..=2500));
        let structured = result.structured_content.unwrap();
        assert_eq!(
            (
                structured["exitCode"].clone(),
                structured["truncated"].clone()
            ),
            (json!(2), json!(true))
        );
    }

    // --- cancellation -----------------------------------------------------------------

    #[tokio::test]
    async fn cancel_keeps_output_and_intact_spill_file() {
        let reached = Arc::new(Notify::new());
        let bash = ScriptedBash::new(
            vec![
                Step::Chunk(numbered(1..=3000).into_bytes()),
                Step::Reached(reached.clone()),
                Step::WaitForCancel,
            ],
            Ok(ExecOutcome {
                status: Some(ExitStatus::Signal(15)),
                termination: Termination::Cancelled,
                notes: Vec::new(),
                egress: Vec::new(),
            }),
        );
        let h = Harness::new(bash);
        let cancel = CancellationToken::new();
        let canceller = {
            let cancel = cancel.clone();
            async move {
                reached.notified().await;
                cancel.cancel();
            }
        };
        let (result, ()) = tokio::join!(h.call_with(json!({"command": "x"}), cancel), canceller);
        let result = result.unwrap();
        assert!(result.is_error);
        let body = text(&result);
        assert!(body.ends_with("\n\nCommand aborted"), "{body}");
        assert!(body.contains("[Showing lines 1001-3000 of 3000. Full output: "));
        let path = full_output_path(&result);
        assert_eq!(std::fs::read_to_string(path).unwrap(), numbered(1..=3000));
    }

    #[tokio::test]
    async fn already_cancelled_call_runs_nothing() {
        let bash = ScriptedBash::exits(vec![], Some(ExitStatus::Code(0)));
        let h = Harness::new(bash.clone());
        let cancel = CancellationToken::new();
        cancel.cancel();
        let result = h.call_with(json!({"command": "x"}), cancel).await.unwrap();
        assert!(result.is_error);
        assert_eq!(text(&result), "Command aborted");
        assert!(bash.requests().is_empty());
    }

    // --- decoding and sanitising ------------------------------------------------------

    #[tokio::test]
    async fn utf8_split_across_chunks() {
        let euro = "€".as_bytes();
        let steps = euro.iter().map(|b| Step::Chunk(vec![*b])).collect();
        let h = Harness::new(ScriptedBash::exits(steps, Some(ExitStatus::Code(0))));
        assert_eq!(text(&h.call(json!({"command": "x"})).await), "€");
    }

    #[tokio::test]
    async fn ansi_and_control_characters_are_stripped_crlf_normalised() {
        let h = Harness::new(ScriptedBash::exits(
            vec![
                chunk("\x1b[31mred\x1b[0m\r\n"),
                chunk("a\x07b\rc\r\nd\x1b]0;title\x07\n"),
            ],
            Some(ExitStatus::Code(0)),
        ));
        let result = h.call(json!({"command": "x"})).await;
        assert_eq!(text(&result), "red\nabc\nd\n");
        assert_eq!(
            result.structured_content.unwrap()["output"],
            "red\nabc\nd\n"
        );
    }

    #[tokio::test]
    async fn spill_file_keeps_raw_escapes() {
        let line = "\x1b[1;32mok\x1b[0m\r\n";
        let raw = line.repeat(4000);
        let h = Harness::new(ScriptedBash::exits(
            vec![Step::Chunk(raw.clone().into_bytes())],
            Some(ExitStatus::Code(0)),
        ));
        let result = h.call(json!({"command": "x"})).await;
        assert!(!result.is_error);
        let body = text(&result);
        assert!(body.starts_with("ok\nok\n"));
        assert!(!body.contains('\x1b') && !body.contains('\r'));
        assert!(body.contains("[Showing lines 2001-4000 of 4000. Full output: "));
        let path = full_output_path(&result);
        assert_eq!(std::fs::read(path).unwrap(), raw.as_bytes());
    }

    // --- streaming updates ------------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn chatty_output_is_throttled_and_final_update_has_last_line() {
        // 5,000 lines over 2.5 s of (virtual) time: unthrottled this would be 5,000 updates.
        let mut steps = Vec::new();
        for i in (1..=5000).step_by(2) {
            steps.push(chunk(&format!("line {i}\n")));
            steps.push(chunk(&format!("line {}\n", i + 1)));
            steps.push(Step::Sleep(Duration::from_millis(1)));
        }
        let h = Harness::new(ScriptedBash::exits(steps, Some(ExitStatus::Code(0))));
        let result = h.call(json!({"command": "x"})).await;
        let updates = h.updates();
        assert!(
            (10..=40).contains(&updates.len()),
            "{} updates for 5,000 lines",
            updates.len()
        );
        assert_eq!(
            updates[0].content,
            vec![],
            "first update announces the start"
        );
        let last = updates.last().unwrap();
        assert!(last.content[0].as_text().unwrap().ends_with("line 5000"));
        let path = last.details.as_ref().unwrap()["fullOutputPath"]
            .as_str()
            .unwrap();
        assert_eq!(path, full_output_path(&result).display().to_string());
        assert_eq!(
            last.details.as_ref().unwrap()["truncation"]["totalLines"],
            5000
        );
    }

    #[tokio::test]
    async fn leaked_sender_does_not_hold_the_call_and_late_output_is_ignored() {
        let go = Arc::new(Notify::new());
        let (accepted, was_accepted) = tokio::sync::oneshot::channel();
        let h = Harness::new(ScriptedBash::exits(
            vec![
                chunk("before\n"),
                Step::LateSend {
                    go: go.clone(),
                    accepted,
                },
            ],
            Some(ExitStatus::Code(0)),
        ));
        // The backend still holds a sender: the call must not wait for it to be dropped.
        let result = tokio::time::timeout(Duration::from_secs(60), h.call(json!({"command": "x"})))
            .await
            .expect("the call returns although a sender is still alive");
        assert_eq!(text(&result), "before\n");
        go.notify_one();
        assert!(
            !was_accepted.await.unwrap(),
            "a send after exec returned is refused"
        );
    }

    #[tokio::test]
    async fn gated_output_streams_before_exit() {
        let gate = Arc::new(Notify::new());
        let reached = Arc::new(Notify::new());
        let h = Harness::new(ScriptedBash::exits(
            vec![
                chunk("first\n"),
                Step::Reached(reached.clone()),
                Step::Gate(gate.clone()),
                chunk("second\n"),
            ],
            Some(ExitStatus::Code(0)),
        ));
        let updates = h.updates.clone();
        let watcher = async {
            reached.notified().await;
            // The first chunk must show up as a partial update while the command still runs.
            loop {
                let seen = updates.lock().unwrap().iter().any(|u| {
                    u.content
                        .first()
                        .and_then(Content::as_text)
                        .is_some_and(|t| t.contains("first"))
                });
                if seen {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            gate.notify_one();
        };
        let (result, ()) = tokio::join!(h.call(json!({"command": "x"})), watcher);
        assert_eq!(text(&result), "first\nsecond\n");
    }

    // --- truncation and spill ---------------------------------------------------------

    #[tokio::test]
    async fn oversized_last_line_footer_reports_real_size() {
        for suffix in ["", "\n"] {
            let h = Harness::new(ScriptedBash::exits(
                vec![Step::Chunk(
                    format!("{}{suffix}", "0".repeat(60_000)).into_bytes(),
                )],
                Some(ExitStatus::Code(0)),
            ));
            let result = h.call(json!({"command": "x"})).await;
            assert!(
                text(&result)
                    .contains("[Showing last 50.0KB of line 1 (line is 58.6KB). Full output: "),
                "suffix {suffix:?}"
            );
            full_output_path(&result);
        }
    }

    #[tokio::test]
    async fn structured_output_is_the_truncated_text_with_the_full_output_path() {
        let line = format!("{}\n", "s".repeat(99));
        let h = Harness::new(ScriptedBash::exits(
            vec![Step::Repeat {
                chunk: line.repeat(640).into_bytes(),
                times: 50,
            }],
            Some(ExitStatus::Code(0)),
        ));
        let result = h.call(json!({"command": "x"})).await;
        let structured = result.structured_content.clone().unwrap();
        let output = structured["output"].as_str().unwrap();
        // Cut like the text: within the 50 KB tail, and exactly what the text shows above its
        // footer.
        assert!(
            output.len() <= crate::truncate::DEFAULT_MAX_BYTES,
            "{}",
            output.len()
        );
        assert!(output.starts_with('s') && output.ends_with('s'));
        let shown = text(&result);
        assert!(
            shown.starts_with(output),
            "the text begins with the structured output"
        );
        assert!(
            shown[output.len()..].starts_with("\n\n["),
            "then the footer"
        );
        assert_eq!(structured["truncated"], true);
        // The full output stays reachable from the structured copy too.
        let path = full_output_path(&result);
        assert_eq!(std::fs::metadata(path).unwrap().len(), 100 * 640 * 50);
    }

    #[tokio::test]
    async fn one_gib_of_output_keeps_memory_bounded() {
        const CHUNK: usize = 64 * 1024;
        const TIMES: usize = 16 * 1024; // 1 GiB
        let line = format!("{}\n", "g".repeat(1023));
        let h = Harness::new(ScriptedBash::exits(
            vec![
                Step::Repeat {
                    chunk: line.repeat(CHUNK / 1024).into_bytes(),
                    times: TIMES,
                },
                chunk("the end\n"),
            ],
            Some(ExitStatus::Code(0)),
        ));
        let result = h.call(json!({"command": "x"})).await;
        let total = (CHUNK * TIMES) as u64 + 8;
        let details = result.details.clone().unwrap();
        let path = PathBuf::from(details["fullOutputPath"].as_str().expect("path"));
        // The spill keeps the first 256 MiB only (it used to grow with the output).
        assert_eq!(std::fs::metadata(&path).unwrap().len(), DEFAULT_SPILL_BYTES);
        assert_eq!(details["fullOutputCappedAt"], DEFAULT_SPILL_BYTES);
        std::fs::remove_file(&path).unwrap();
        let stats = h.stats();
        assert_eq!(stats.raw_bytes, total);
        assert!(
            stats.tail_capacity_high_water <= crate::output::TAIL_KEEP_BYTES + 3 * CHUNK,
            "tail high-water {}",
            stats.tail_capacity_high_water
        );
        assert!(stats.prespill_high_water <= DEFAULT_MAX_BYTES + CHUNK);
        assert_eq!(details["truncation"]["totalLines"], 1024 * 1024 + 1);
        // 49 lines of 1 KiB plus the last line fill the 50 KiB limit: the real end.
        let lines = 1024 * 1024 + 1;
        assert!(text(&result).ends_with(&format!(
            "g\nthe end\n\n[Showing lines {}-{lines} of {lines} (50.0KB limit). Full output \
             capped: only the first 256.0MB are saved in {} (the per-command cap, policy \
             `[limits] spill`); the tail above is the real end of the output]",
            lines - 49,
            path.display()
        )));
    }

    // --- real processes ---------------------------------------------------------------

    #[tokio::test]
    async fn real_process_combines_stdout_and_stderr_in_order() {
        let h = Harness::new(ProcessBash::new());
        let result = h
            .call(json!({"command": "echo out1; echo err1 >&2; echo out2; echo err2 >&2"}))
            .await;
        assert!(!result.is_error, "{result:?}");
        assert_eq!(text(&result), "out1\nerr1\nout2\nerr2\n");
    }

    #[tokio::test]
    async fn real_process_runs_in_workspace_root() {
        let h = Harness::new(ProcessBash::new());
        let result = h.call(json!({"command": "pwd"})).await;
        assert_eq!(text(&result), format!("{}\n", h.root.display()));
    }

    #[tokio::test]
    async fn real_process_exit_codes_and_signals() {
        let h = Harness::new(ProcessBash::new());
        let result = h.call(json!({"command": "echo failed; exit 7"})).await;
        assert!(result.is_error);
        assert_eq!(text(&result), "failed\n\n\nCommand exited with code 7");
        let result = h.call(json!({"command": "kill -TERM $$"})).await;
        assert!(result.is_error);
        assert_eq!(
            text(&result),
            "Command exited with code 143 (killed by signal 15)"
        );
        let result = h.call(json!({"command": "true"})).await;
        assert_eq!(text(&result), "(no output)");
    }

    #[tokio::test]
    async fn real_process_timeout() {
        let h = Harness::new(ProcessBash::new());
        let result = h
            .call(json!({"command": "echo started; sleep 60", "timeout": 2}))
            .await;
        assert!(result.is_error);
        assert!(
            text(&result).ends_with("Command timed out after 2 seconds"),
            "{}",
            text(&result)
        );
    }

    #[tokio::test]
    async fn real_process_line_truncation_only_creates_spill_file() {
        let h = Harness::new(ProcessBash::new());
        let result = h.call(json!({"command": "seq 3000"})).await;
        assert!(!result.is_error);
        let details = result.details.clone().unwrap();
        assert_eq!(details["truncation"]["truncatedBy"], "lines");
        let path = full_output_path(&result);
        assert_eq!(std::fs::read_to_string(path).unwrap(), numbered(1..=3000));
        assert!(text(&result).starts_with("1001\n"));
    }

    #[tokio::test]
    async fn real_process_trailing_newline_is_not_a_line() {
        let h = Harness::new(ProcessBash::new());
        let result = h
            .call(json!({"command": "for i in $(seq 4000); do echo line-$i; done"}))
            .await;
        let body = text(&result);
        assert!(body.contains("line-2001\n") && body.contains("line-4000"));
        assert!(body.contains("[Showing lines 2001-4000 of 4000. Full output: "));
        assert!(!body.contains("4001"));
        let t = &result.details.unwrap()["truncation"];
        assert_eq!(
            (t["totalLines"].clone(), t["outputLines"].clone()),
            (json!(4000), json!(2000))
        );
    }

    #[tokio::test]
    async fn real_process_oversized_final_line() {
        let h = Harness::new(ProcessBash::new());
        for command in ["printf '%060000d' 0", "printf '%060000d\\n' 0"] {
            let result = h.call(json!({"command": command})).await;
            assert!(
                text(&result)
                    .contains("Showing last 50.0KB of line 1 (line is 58.6KB). Full output: "),
                "{command}"
            );
        }
    }

    #[tokio::test]
    async fn real_process_sanitises_colour_and_crlf() {
        let h = Harness::new(ProcessBash::new());
        let result = h
            .call(json!({"command": "printf '\\033[31mred\\033[0m\\r\\n'"}))
            .await;
        assert_eq!(text(&result), "red\n");
    }

    #[tokio::test]
    async fn real_process_cancel_keeps_output() {
        let h = Harness::new(ProcessBash::new());
        let cancel = CancellationToken::new();
        let updates = h.updates.clone();
        let canceller = {
            let cancel = cancel.clone();
            async move {
                loop {
                    let started = updates.lock().unwrap().iter().any(|u| {
                        u.content
                            .first()
                            .and_then(Content::as_text)
                            .is_some_and(|t| t.contains("ready"))
                    });
                    if started {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                cancel.cancel();
            }
        };
        let (result, ()) = tokio::join!(
            h.call_with(json!({"command": "echo ready; sleep 60"}), cancel),
            canceller
        );
        let result = result.unwrap();
        assert!(result.is_error);
        assert_eq!(text(&result), "ready\n\n\nCommand aborted");
    }

    /// Per-call overhead of the tool itself (no sandbox: a plain process backend) against a
    /// bare `bash -c true` spawn, interleaved; run with
    /// `cargo test -p cordon-tools --release bash::tests::tool_overhead -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "benchmark: run explicitly in release mode"]
    async fn tool_overhead() {
        let harness = Harness::new(ProcessBash::new());
        let bare = || {
            let status = std::process::Command::new("bash")
                .args(["-c", "true"])
                .stdin(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success());
        };
        let (mut tool, mut spawn) = (Vec::new(), Vec::new());
        for round in 0..430 {
            let start = std::time::Instant::now();
            let result = harness.call(json!({"command": "true"})).await;
            let took = start.elapsed();
            assert!(!result.is_error);
            let start = std::time::Instant::now();
            bare();
            let bare_took = start.elapsed();
            if round >= 30 {
                tool.push(took);
                spawn.push(bare_took);
            }
        }
        tool.sort();
        spawn.sort();
        let (tool, spawn) = (tool[tool.len() / 2], spawn[spawn.len() / 2]);
        println!(
            "bash tool `true` (no sandbox) p50 {:.3} ms; bare `bash -c true` p50 {:.3} ms; ratio {:.2}x",
            tool.as_secs_f64() * 1e3,
            spawn.as_secs_f64() * 1e3,
            tool.as_secs_f64() / spawn.as_secs_f64()
        );
    }

    /// Throughput of the whole tool on real processes; run with
    /// `cargo test -p cordon-tools --release bash::tests::throughput -- --ignored --nocapture`.
    /// Prints a baseline (the same producer writing straight to a file) next to the tool with
    /// its real spill file and with the spill going to a sink (the tool's own overhead).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "benchmark: run explicitly in release mode"]
    async fn throughput() {
        use crate::output::tests::SpillOverride;
        const GIB: u64 = 1 << 30;
        let disk = Harness::new(ProcessBash::new());
        let sink = Harness::build(ProcessBash::new(), BashOptions::default(), |root| {
            Arc::new(SpillOverride {
                inner: StdFiles::new(root),
                spill: Box::new(|| {
                    let writer: cordon_ops::SpillWriter = Box::new(tokio::io::sink());
                    Ok((PathBuf::from("/dev/null"), writer))
                }),
            })
        });
        let rate = |elapsed: Duration| GIB as f64 / elapsed.as_secs_f64() / 1e6;
        for (name, producer) in [
            (
                "1 KiB lines",
                "yes \"$(head -c 1023 /dev/zero | tr '\\0' x)\" | head -c 1073741824",
            ),
            ("no newline", "head -c 1073741824 /dev/zero"),
        ] {
            let target = disk.root.join("baseline.out");
            let start = std::time::Instant::now();
            let status = std::process::Command::new("bash")
                .arg("-c")
                .arg(format!("{producer} > {}", target.display()))
                .status()
                .unwrap();
            let baseline = start.elapsed();
            assert!(status.success());
            std::fs::remove_file(&target).unwrap();

            let start = std::time::Instant::now();
            let result = disk
                .call(json!({"command": producer, "timeout": 600}))
                .await;
            let with_file = start.elapsed();
            let path = full_output_path(&result);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), GIB);
            std::fs::remove_file(&path).unwrap();
            let high_water = disk.stats().tail_capacity_high_water;

            let start = std::time::Instant::now();
            let result = sink
                .call(json!({"command": producer, "timeout": 600}))
                .await;
            let to_sink = start.elapsed();
            assert_eq!(sink.stats().raw_bytes, GIB);
            assert!(!result.is_error);

            println!(
                "{name}: baseline `producer > file` {:.0} MB/s; bash tool with spill file {:.0} MB/s; \
                 bash tool, spill to sink {:.0} MB/s; tail high-water {} KiB",
                rate(baseline),
                rate(with_file),
                rate(to_sink),
                high_water / 1024
            );
        }
    }
}
