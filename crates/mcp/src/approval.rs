//! `Ask` decisions answered by the person behind the MCP client, through MCP elicitation: the
//! server sends `elicitation/create` to the client that made the call (a form with the tool,
//! its arguments, the rule and its reason) and the answer decides the call: allow once, allow
//! for the session (the runtime's session approvals, the same as `cordon run`'s "always"), or
//! deny. No answer within the bound, a dismissed question, a malformed reply or a failed
//! request are denials that say so.
//!
//! It owns the routing of a question to the client of the call (registered by the handler for
//! the call's lifetime), the form and the reading of the answer. It does not own what an
//! answer means for the call (the runtime's hooks) nor whether a rule asks (the policy).
//! Clients that did not declare the elicitation capability are never asked: `Ask` stays the
//! denial it is without a person to ask.
//!
//! The egress proxy's questions about `[network] ask` destinations arrive here too, carrying
//! the call whose command opened the connection (the local and SSH backends serve each
//! command's connections on a listener of their own; Docker names the call whose command was
//! the only one running): they go to that call's client, with a form that names the
//! destination and offers it for the session. A question that names no call (a connection the
//! backend could not tie to one) finds no client and is a denial.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use cordon_runtime::{Approval, ApprovalRequest, Approver, NETWORK_QUESTION};
use rmcp::model::{
    CancelledNotificationParam, ClientResult, ConstTitle, ElicitRequest, ElicitRequestParams,
    ElicitResult, ElicitationAction, ElicitationSchema, EnumSchema, PrimitiveSchemaDefinition,
    ProtocolVersion, RequestId, ServerRequest, SingleSelectEnumSchema,
    TitledSingleSelectEnumSchema,
};
use rmcp::service::{ElicitationMode, PeerRequestOptions, RequestContext, ServiceError};
use rmcp::{Peer, RoleServer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// How long a question waits for an answer unless configured otherwise.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest rendering of a call's arguments in a question, in characters.
const MAX_ARGS_CHARS: usize = 2000;
/// Longest string argument shown in full, in characters (longer ones are cut, with their size).
const MAX_STRING_CHARS: usize = 300;
/// Items of an array argument shown (the rest are counted).
const MAX_ARRAY_ITEMS: usize = 5;
/// Longest tool name, rule or reason shown, in characters.
const MAX_FIELD_CHARS: usize = 500;

/// The form's one field and its choices.
const DECISION_FIELD: &str = "decision";
const ALLOW_ONCE: &str = "allow_once";
const ALLOW_SESSION: &str = "allow_session";
const DENY: &str = "deny";

/// Asks the client that made a call, through MCP elicitation. Shared by the session (as its
/// [`Approver`]) and the server, which registers each call's client while the call runs.
pub struct ElicitationApprover {
    timeout: Duration,
    askers: Mutex<HashMap<String, Asker>>,
}

impl std::fmt::Debug for ElicitationApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElicitationApprover")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Who to ask about one call: its client, and the call's cancellation (a cancelled call
/// stops waiting for an answer).
#[derive(Clone)]
struct Asker {
    peer: Peer<RoleServer>,
    cancel: CancellationToken,
}

/// A call's client, registered while the call runs; dropping it unregisters the call.
pub(crate) struct Registration {
    approver: Option<Arc<ElicitationApprover>>,
    call_id: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(approver) = &self.approver {
            approver.askers().remove(&self.call_id);
        }
    }
}

impl ElicitationApprover {
    /// An approver that waits at most `timeout` for each answer.
    pub fn new(timeout: Duration) -> ElicitationApprover {
        ElicitationApprover {
            timeout,
            askers: Mutex::new(HashMap::new()),
        }
    }

    /// How long a question waits for an answer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn askers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Asker>> {
        self.askers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Make `call_id`'s `Ask` decisions questions to the client of `context`, when that client
    /// can answer them (declared form elicitation, on a protocol that allows server requests).
    pub(crate) fn register(
        self: &Arc<Self>,
        call_id: &str,
        context: &RequestContext<RoleServer>,
        cancel: &CancellationToken,
    ) -> Registration {
        let can_ask = client_can_answer(context);
        tracing::debug!(call = call_id, can_ask, "mcp client approvals");
        if !can_ask {
            return Registration {
                approver: None,
                call_id: call_id.to_owned(),
            };
        }
        self.askers().insert(
            call_id.to_owned(),
            Asker {
                peer: context.peer.clone(),
                cancel: cancel.clone(),
            },
        );
        Registration {
            approver: Some(self.clone()),
            call_id: call_id.to_owned(),
        }
    }

    /// Send the question and wait for the answer, the bound, or the call's cancellation.
    async fn ask(&self, asker: Asker, request: &ApprovalRequest) -> Approval {
        let Asker { peer, cancel } = asker;
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: question(request),
            requested_schema: decision_schema(request),
        };
        let sent = peer
            .send_request_with_option(
                ServerRequest::ElicitRequest(ElicitRequest::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await;
        let handle = match sent {
            Ok(handle) => handle,
            Err(error) => return request_failed(&error),
        };
        let id = handle.id.clone();
        // Whoever waits for this answer may stop waiting before it comes (the egress proxy
        // drops a question when the connection it is about is cut or its own bound runs out):
        // the question is then withdrawn all the same, so the client stops showing it and the
        // pending request is forgotten.
        let mut abandoned = Abandoned {
            peer: Some(peer.clone()),
            id: id.clone(),
        };
        let answer = tokio::select! {
            response = handle.await_response() => match response {
                Ok(ClientResult::ElicitResult(result)) => answer_of(&result),
                Ok(other) => Approval::Unanswered(format!(
                    "the client's reply to the question was malformed: expected an elicitation \
                     result, got {}",
                    short_json(&other)
                )),
                Err(error) => request_failed(&error),
            },
            () = tokio::time::sleep(self.timeout) => {
                let reason = format!("no answer within {} s", self.timeout.as_secs());
                withdraw(&peer, id, &reason).await;
                Approval::Unanswered(format!("{reason}, the bound --approval-timeout sets"))
            }
            () = cancel.cancelled() => {
                withdraw(&peer, id, "the tool call was cancelled").await;
                Approval::Unanswered("the tool call was cancelled while waiting for an answer".to_owned())
            }
        };
        abandoned.peer = None;
        answer
    }
}

/// A question sent and not yet settled: dropped while still armed (its waiter went away), it
/// withdraws the question from a task of its own.
struct Abandoned {
    peer: Option<Peer<RoleServer>>,
    id: RequestId,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else {
            return;
        };
        let id = self.id.clone();
        tracing::info!(%id, "withdrawing a question nobody waits for any more");
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    withdraw(&peer, id, "the question is no longer needed").await;
                });
            }
            Err(error) => {
                tracing::debug!(%error, "failed to withdraw an abandoned question: no runtime");
            }
        }
    }
}

#[async_trait]
impl Approver for ElicitationApprover {
    async fn approve(&self, request: ApprovalRequest) -> Approval {
        let asker = self.askers().get(&request.call_id).cloned();
        let Some(asker) = asker else {
            tracing::info!(
                call = %request.call_id,
                tool = %request.tool,
                rule = %request.rule,
                "the mcp client cannot answer questions; ask is a denial"
            );
            return Approval::Unavailable;
        };
        tracing::info!(
            call = %request.call_id,
            tool = %request.tool,
            rule = %request.rule,
            timeout_s = self.timeout.as_secs(),
            "asking the user through mcp elicitation"
        );
        let answer = self.ask(asker, &request).await;
        match &answer {
            Approval::Unanswered(why) => tracing::warn!(
                call = %request.call_id,
                tool = %request.tool,
                rule = %request.rule,
                why = %why,
                "no approval obtained through mcp elicitation"
            ),
            Approval::Yes | Approval::No | Approval::Always | Approval::Unavailable => {
                tracing::info!(
                    call = %request.call_id,
                    tool = %request.tool,
                    rule = %request.rule,
                    answer = ?answer,
                    "mcp elicitation answered"
                );
            }
        }
        answer
    }

    fn answer_within(&self) -> Option<Duration> {
        Some(self.timeout)
    }
}

/// Whether the client of `context` can be asked: it declared form elicitation and speaks a
/// protocol that still lets servers send it requests (from 2026-07-28 on they may not).
fn client_can_answer(context: &RequestContext<RoleServer>) -> bool {
    let modern = context
        .protocol_version()
        .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28);
    !modern
        && context
            .peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
}

/// Tell the client a question is withdrawn (its answer would come too late).
async fn withdraw(peer: &Peer<RoleServer>, id: RequestId, reason: &str) {
    let notice = CancelledNotificationParam::new(Some(id), Some(reason.to_owned()));
    if let Err(error) = peer.notify_cancelled(notice).await {
        tracing::debug!(%error, "failed to withdraw an elicitation request");
    }
}

fn request_failed(error: &ServiceError) -> Approval {
    Approval::Unanswered(format!(
        "failed to ask the user through the MCP client: {}",
        bounded(&error.to_string(), MAX_FIELD_CHARS)
    ))
}

/// What the client's answer means.
fn answer_of(result: &ElicitResult) -> Approval {
    match result.action {
        ElicitationAction::Decline => Approval::No,
        ElicitationAction::Cancel => {
            Approval::Unanswered("the user dismissed the question without answering".to_owned())
        }
        ElicitationAction::Accept => {
            let choice = result
                .content
                .as_ref()
                .and_then(|content| content.get(DECISION_FIELD))
                .and_then(Value::as_str);
            match choice {
                Some(ALLOW_ONCE) => Approval::Yes,
                Some(ALLOW_SESSION) => Approval::Always,
                Some(DENY) => Approval::No,
                Some(_) | None => Approval::Unanswered(format!(
                    "the client's answer was malformed: expected {{\"{DECISION_FIELD}\": \
                     \"{ALLOW_ONCE}\" | \"{ALLOW_SESSION}\" | \"{DENY}\"}}, got {}",
                    result
                        .content
                        .as_ref()
                        .map_or_else(|| "no content".to_owned(), short_json)
                )),
            }
        }
        // An action a later protocol adds: not an approval.
        _ => Approval::Unanswered(format!(
            "the client's answer was malformed: unknown action {}",
            short_json(&result.action)
        )),
    }
}

/// The form: one required choice.
fn decision_schema(request: &ApprovalRequest) -> ElicitationSchema {
    let session = match network_destination(request) {
        Some(destination) => format!(
            "Allow {} for this session",
            bounded(&escaped(destination), MAX_FIELD_CHARS)
        ),
        None => "Allow for this session (every call this rule asks about)".to_owned(),
    };
    let mut choices = TitledSingleSelectEnumSchema::new(vec![
        ConstTitle::new(ALLOW_ONCE, "Allow once"),
        ConstTitle::new(ALLOW_SESSION, session),
        ConstTitle::new(DENY, "Deny"),
    ]);
    choices.title = Some("Decision".into());
    let choices = EnumSchema::Single(SingleSelectEnumSchema::Titled(choices));
    let mut schema = ElicitationSchema::new(BTreeMap::from([(
        DECISION_FIELD.to_owned(),
        PrimitiveSchemaDefinition::Enum(choices),
    )]));
    schema.required = Some(vec![DECISION_FIELD.to_owned()]);
    schema
}

/// The destination of a question about a network connection (the egress proxy's, see
/// [`cordon_runtime::NETWORK_QUESTION`]), `None` for a question about a tool call.
fn network_destination(request: &ApprovalRequest) -> Option<&str> {
    if request.tool != NETWORK_QUESTION {
        return None;
    }
    request.args.get("destination").and_then(Value::as_str)
}

/// The question's text: the call (tool and bounded arguments), the rule and its reason; or,
/// about a network connection a call's command opened, the destination, the entry and its
/// reason. Everything the model chose is escaped so that it cannot draw lines of its own into
/// it.
pub(crate) fn question(request: &ApprovalRequest) -> String {
    let ApprovalRequest {
        call_id: _,
        tool,
        args,
        rule,
        reason,
    } = request;
    if let Some(destination) = network_destination(request) {
        let destination = bounded(&escaped(destination), MAX_FIELD_CHARS);
        return format!(
            "Cordon's network policy asks before a command of this tool call connects.\n\n\
             Destination: {destination}\nRule: {}\nReason: {}\n\nAllow {destination} once (this \
             connection), for this session (until the server stops), or deny it?",
            bounded(&escaped(rule), MAX_FIELD_CHARS),
            bounded(&escaped(reason), MAX_FIELD_CHARS),
        );
    }
    format!(
        "Cordon's policy asks before this tool call runs.\n\nTool: {}\nArguments: {}\nRule: {}\n\
         Reason: {}\n\nAllow it once, allow it for this session (every call this rule asks \
         about, until the server stops), or deny it?",
        bounded(&escaped(tool), MAX_FIELD_CHARS),
        render_args(args),
        bounded(&escaped(rule), MAX_FIELD_CHARS),
        bounded(&escaped(reason), MAX_FIELD_CHARS),
    )
}

/// The arguments as one line of JSON: the keys that say what the call touches first, long
/// strings and arrays cut (with what was left out), the whole at most [`MAX_ARGS_CHARS`].
fn render_args(args: &Value) -> String {
    let mut out = String::new();
    match args {
        Value::Object(map) => {
            const FIRST: [&str; 3] = ["path", "command", "pattern"];
            let keys = FIRST
                .iter()
                .filter(|key| map.contains_key(**key))
                .map(|key| (*key).to_owned())
                .chain(
                    map.keys()
                        .filter(|key| !FIRST.contains(&key.as_str()))
                        .cloned(),
                );
            out.push('{');
            for (index, key) in keys.enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                render_string(&mut out, &key);
                out.push_str(": ");
                match &map[&key] {
                    // What the call touches is shown whole (up to the question's bound): a
                    // command cut after its first 300 characters could hide what it runs
                    // behind padding.
                    Value::String(text) if FIRST.contains(&key.as_str()) => {
                        render_string_up_to(&mut out, text, MAX_ARGS_CHARS);
                    }
                    value => render_value(&mut out, value),
                }
            }
            out.push('}');
        }
        other => render_value(&mut out, other),
    }
    bounded(&out, MAX_ARGS_CHARS)
}

fn render_value(out: &mut String, value: &Value) {
    match value {
        Value::String(text) => render_string(out, text),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().take(MAX_ARRAY_ITEMS).enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                render_value(out, item);
            }
            if items.len() > MAX_ARRAY_ITEMS {
                // Writing to a String cannot fail.
                let _ = write!(out, ", … {} more", items.len() - MAX_ARRAY_ITEMS);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (index, (key, item)) in map.iter().enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                render_string(out, key);
                out.push_str(": ");
                render_value(out, item);
            }
            out.push('}');
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => out.push_str(&value.to_string()),
    }
}

/// A JSON string, escaped, cut at [`MAX_STRING_CHARS`] with the size of the rest.
fn render_string(out: &mut String, text: &str) {
    render_string_up_to(out, text, MAX_STRING_CHARS);
}

/// A JSON string, escaped, cut at `max` characters with the size of the rest.
fn render_string_up_to(out: &mut String, text: &str, max: usize) {
    let chars = text.chars().count();
    if chars <= max {
        out.push_str(&escaped(&Value::from(text).to_string()));
        return;
    }
    let head: String = text.chars().take(max).collect();
    out.push_str(&escaped(&Value::from(head.as_str()).to_string()));
    // Writing to a String cannot fail.
    let _ = write!(out, "… ({} more bytes)", text.len() - head.len());
}

/// `text` with everything that could draw or hide text in the question written as escapes
/// (see [`cordon_runtime::escape_for_question`]).
fn escaped(text: &str) -> String {
    cordon_runtime::escape_for_question(text)
}

/// `text` cut to `max` characters, saying how much was left out.
fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}… ({} more bytes)", &text[..cut], text.len() - cut),
    }
}

fn short_json(value: &impl serde::Serialize) -> String {
    let text = serde_json::to_string(value).unwrap_or_else(|error| format!("<{error}>"));
    bounded(&escaped(&text), 200)
}

#[cfg(test)]
#[path = "approval_tests.rs"]
mod tests;
