//! The policy in front of every call: [`RuntimeHooks`] implements `before_tool_call` (resolve
//! paths through the backend, decide, ask or deny, audit) and `after_tool_call` (redact,
//! state a degraded sandbox, audit the finished call).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use async_trait::async_trait;
use cordon_core::CancellationToken;
use cordon_core::hooks::{
    AfterToolCall, BeforeOutcome, BeforeToolCall, HookError, ResultOverride, ToolHooks,
};
use cordon_ops::paths::resolve_model_path;
use cordon_ops::{BackendId, EgressRecord, FileOperations, FsError, Op, paths_of};
use cordon_policy::audit::{AuditRecord, args_sha256, rfc3339_utc};
use cordon_policy::{
    CompiledPolicy, Decision, DecisionRequest, PathAccess, PolicyDecision, RuleRef,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::approval::{Approval, ApprovalRequest, Approver};
use crate::audit::AuditLog;

/// Everything the hooks need, fixed for the session.
pub(crate) struct RuntimeHooks {
    pub(crate) policy: Arc<CompiledPolicy>,
    pub(crate) files: Arc<dyn FileOperations>,
    pub(crate) backend: BackendId,
    pub(crate) missing_layers: Vec<String>,
    pub(crate) audit: Option<Arc<AuditLog>>,
    pub(crate) approver: Option<Arc<dyn Approver>>,
    /// Rules a person answered "always" for.
    pub(crate) approved_rules: Mutex<HashSet<RuleRef>>,
    /// Calls that passed `before_tool_call`, until `after_tool_call` audits them.
    pub(crate) in_flight: Mutex<HashMap<String, InFlight>>,
}

/// The paths of one call: those the policy judges, and how many were reads of the backend's
/// spill files, which are always allowed (the output was already the model's) and so are not
/// subject to the policy's read globs.
struct Accesses {
    paths: Vec<PathAccess>,
    spill_reads: usize,
}

/// The model-facing text for a path the backend refused to resolve.
fn refusal_text(raw: &str, root: &Path, error: &FsError) -> String {
    let hint = match error {
        FsError::Denied { .. } => {
            "This path is denied by the sandbox policy; do not try to reach it another way."
                .to_owned()
        }
        FsError::OutsideRoot { .. } => format!(
            "Only paths inside the workspace root {} and the sandbox's other allowed roots can \
             be used.",
            root.display()
        ),
        FsError::GitMetadata { .. } => {
            "Do not create or change git repositories inside the workspace.".to_owned()
        }
        FsError::Protected { .. }
        | FsError::NotFound { .. }
        | FsError::PermissionDenied { .. }
        | FsError::NotADirectory { .. }
        | FsError::IsADirectory { .. }
        | FsError::Io { .. }
        | FsError::Backend { .. }
        | FsError::Cancelled => "Check the path and try again.".to_owned(),
    };
    format!("Refused: {error} (requested as `{raw}`). {hint}")
}

/// The decision for a call whose only paths are spill-file reads.
fn spill_read_decision() -> PolicyDecision {
    PolicyDecision {
        decision: Decision::Allow,
        rule: RuleRef {
            file: Arc::from("builtin:spill-files"),
            line: 0,
        },
        reason: "reading a command's full output (spill file) is always allowed".to_owned(),
        unanalysable: None,
        asked_by: Vec::new(),
    }
}

/// The decision after a person's `answer` to an `Ask` decision; `Always` adds the rules that
/// asked to `approved_rules` (the session's approvals: every later call only they ask about
/// runs).
fn approved(
    answer: Approval,
    decision: PolicyDecision,
    approved_rules: &Mutex<HashSet<RuleRef>>,
) -> PolicyDecision {
    match answer {
        Approval::Yes => PolicyDecision {
            decision: Decision::Allow,
            reason: format!("approved by the user: {}", decision.reason),
            ..decision
        },
        Approval::Always => {
            lock(approved_rules).extend(decision.asking_rules().iter().cloned());
            PolicyDecision {
                decision: Decision::Allow,
                reason: format!("approved by the user for this session: {}", decision.reason),
                ..decision
            }
        }
        Approval::No => PolicyDecision {
            decision: Decision::Deny,
            reason: format!(
                "the user declined this call ({}). Do not retry it; ask the user what to do \
                 instead.",
                decision.reason
            ),
            ..decision
        },
        Approval::Unavailable => decision.non_interactive(),
        Approval::Unanswered(why) => PolicyDecision {
            decision: Decision::Deny,
            reason: format!(
                "approval required, but no answer was obtained ({why}), so the call was denied \
                 ({}). Do not retry it unchanged; tell the user it needs their approval.",
                decision.reason
            ),
            ..decision
        },
    }
}

pub(crate) struct InFlight {
    started: Instant,
    decision: PolicyDecision,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RuntimeHooks {
    /// The canonical paths a call touches, as the backend resolves them, minus reads of the
    /// backend's spill files (see [`Accesses`]). A path the backend cannot resolve (outside
    /// every root, denied, broken symlink loop, …) yields a refusal for the model: what cannot
    /// be resolved cannot be judged.
    async fn accesses(&self, tool: &str, args: &Value) -> Result<Accesses, String> {
        let root = self.files.root();
        let home = self.files.home();
        let mut accesses = Accesses {
            paths: Vec::new(),
            spill_reads: 0,
        };
        for (raw, op) in paths_of(tool, args) {
            let lexical = resolve_model_path(&raw, root, home);
            let canonical = self
                .files
                .canonicalize(&lexical)
                .await
                .map_err(|error| refusal_text(&raw, root, &error))?;
            if self.is_spill_read(&canonical, op) {
                accesses.spill_reads += 1;
                continue;
            }
            accesses.paths.push(PathAccess { canonical, op });
        }
        Ok(accesses)
    }

    /// Reads of the backend's own spill files (a truncated command's full output) are always
    /// allowed: the output was already the model's.
    fn is_spill_read(&self, canonical: &Path, op: Op) -> bool {
        matches!(op, Op::Read)
            && self
                .files
                .spill_dir()
                .is_some_and(|dir| canonical.starts_with(dir))
    }

    fn refusal(&self, reason: String) -> PolicyDecision {
        PolicyDecision {
            decision: Decision::Deny,
            rule: RuleRef {
                file: Arc::from("cordon"),
                line: 0,
            },
            reason,
            unanalysable: None,
            asked_by: Vec::new(),
        }
    }

    async fn resolve_ask(
        &self,
        call_id: &str,
        tool: &str,
        args: &Value,
        decision: PolicyDecision,
    ) -> PolicyDecision {
        match decision.decision {
            Decision::Allow | Decision::Deny => decision,
            Decision::Ask => {
                // Every rule that asked must be approved: an approval of one does not answer
                // a question another rule asks about the same call.
                let covered = {
                    let approved = lock(&self.approved_rules);
                    decision
                        .asking_rules()
                        .iter()
                        .all(|rule| approved.contains(rule))
                };
                if covered {
                    return PolicyDecision {
                        decision: Decision::Allow,
                        reason: format!("approved for this session: {}", decision.reason),
                        ..decision
                    };
                }
                let Some(approver) = &self.approver else {
                    return decision.non_interactive();
                };
                let answer = approver
                    .approve(ApprovalRequest {
                        call_id: call_id.to_owned(),
                        tool: tool.to_owned(),
                        args: args.clone(),
                        rule: decision
                            .asking_rules()
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", "),
                        reason: decision.reason.clone(),
                    })
                    .await;
                tracing::info!(
                    call = call_id,
                    tool,
                    rule = %decision.rule,
                    answer = ?answer,
                    "approval answered"
                );
                approved(answer, decision, &self.approved_rules)
            }
        }
    }

    /// Append the record `make` builds, when there is an audit log (the record, with its
    /// argument hash, is only built then).
    fn audit(
        &self,
        make: impl FnOnce() -> AuditRecord,
        unanalysable: Option<&str>,
    ) -> Result<(), HookError> {
        match &self.audit {
            Some(log) => log.append(&make(), unanalysable).map_err(Into::into),
            None => Ok(()),
        }
    }

    fn record(
        &self,
        call_id: &str,
        tool: &str,
        args: &Value,
        decision: &PolicyDecision,
    ) -> AuditRecord {
        AuditRecord {
            ts: rfc3339_utc(SystemTime::now()),
            backend: self.backend.to_string(),
            tool_call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            args_sha256: args_sha256(args),
            decision: decision.decision,
            rule: decision.rule.to_string(),
            reason: decision.reason.clone(),
            is_error: None,
            duration_ms: None,
            egress: Vec::new(),
            egress_omitted: 0,
        }
    }
}

#[async_trait]
impl ToolHooks for RuntimeHooks {
    async fn before_tool_call(
        &self,
        call: BeforeToolCall<'_>,
        args: &mut Value,
        _cancel: &CancellationToken,
    ) -> Result<BeforeOutcome, HookError> {
        let tool = call.tool_call.name.as_str();
        let (decision, refused) = match self.accesses(tool, args).await {
            Ok(Accesses { paths, spill_reads }) if paths.is_empty() && spill_reads > 0 => {
                (spill_read_decision(), false)
            }
            Ok(Accesses { paths, .. }) => {
                let request = DecisionRequest {
                    tool,
                    args,
                    paths: &paths,
                    root: self.files.root(),
                    home: self.files.home(),
                };
                let decision = self.policy.decide(&request);
                (
                    self.resolve_ask(&call.tool_call.id, tool, args, decision)
                        .await,
                    false,
                )
            }
            Err(reason) => (self.refusal(reason), true),
        };
        // Arguments only at trace: they may carry what the model wrote into files.
        tracing::trace!(call = %call.tool_call.id, tool, %args, "tool call arguments");
        tracing::debug!(
            call = %call.tool_call.id,
            tool,
            decision = ?decision.decision,
            rule = %decision.rule,
            refused,
            unanalysable = decision.unanalysable.as_deref(),
            "policy decision"
        );
        let record = || self.record(&call.tool_call.id, tool, args, &decision);
        if let Err(error) = self.audit(record, decision.unanalysable.as_deref()) {
            // Fail closed: an operator who asked for an audit trail gets no unaudited calls.
            return Ok(BeforeOutcome::Block {
                reason: Some(format!(
                    "Blocked: the audit log cannot be written ({error})."
                )),
                terminate: false,
            });
        }
        match decision.decision {
            // What the after hook needs for the audit record (only kept with a log).
            Decision::Allow if self.audit.is_some() => {
                lock(&self.in_flight).insert(
                    call.tool_call.id.clone(),
                    InFlight {
                        started: Instant::now(),
                        decision,
                    },
                );
                Ok(BeforeOutcome::Continue)
            }
            Decision::Allow => Ok(BeforeOutcome::Continue),
            Decision::Ask | Decision::Deny => {
                let reason = if refused {
                    decision.reason
                } else {
                    decision.block_message()
                };
                Ok(BeforeOutcome::Block {
                    reason: Some(reason),
                    terminate: false,
                })
            }
        }
    }

    async fn after_tool_call(
        &self,
        call: AfterToolCall<'_>,
        _cancel: &CancellationToken,
    ) -> Result<ResultOverride, HookError> {
        let mut patch = self
            .policy
            .redactor()
            .redact_result(call.result)
            .unwrap_or_default();
        if !self.missing_layers.is_empty() {
            let base = match &patch.details {
                Some(details) => details.clone(),
                None => call.result.details.clone(),
            };
            let mut details = match base {
                Some(Value::Object(map)) => map,
                Some(other) => {
                    let mut map = serde_json::Map::new();
                    map.insert("value".to_owned(), other);
                    map
                }
                None => serde_json::Map::new(),
            };
            details.insert(
                "sandbox".to_owned(),
                json!({"degraded": true, "missingLayers": self.missing_layers}),
            );
            patch.details = Some(Some(Value::Object(details)));
        }
        let finished = lock(&self.in_flight).remove(&call.tool_call.id);
        if let Some(InFlight { started, decision }) = finished {
            let is_error = patch.is_error.unwrap_or(call.result.is_error);
            let record = || {
                let mut record = self.record(
                    &call.tool_call.id,
                    &call.tool_call.name,
                    call.args,
                    &decision,
                );
                record.is_error = Some(is_error);
                record.duration_ms =
                    Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
                (record.egress, record.egress_omitted) =
                    egress_of(&call.tool_call.name, call.result);
                record
            };
            self.audit(record, None)?;
        }
        Ok(patch)
    }
}

/// The connection attempts a bash call made through the egress proxy, as the bash tool put
/// them in its result's `details` (`egress`, and `egressOmitted` beyond its bound): what the
/// finished call's audit line records. Only the bash tool's own details are read (the
/// unredacted result; destinations are not secrets the redaction hides from the operator).
fn egress_of(tool: &str, result: &cordon_core::tool::AgentToolResult) -> (Vec<EgressRecord>, u64) {
    if tool != "bash" {
        return (Vec::new(), 0);
    }
    let Some(details) = result.details.as_ref().and_then(Value::as_object) else {
        return (Vec::new(), 0);
    };
    let records = match details.get("egress") {
        None => Vec::new(),
        Some(value) => match Vec::<EgressRecord>::deserialize(value) {
            Ok(records) => records,
            Err(error) => {
                // The bash tool wrote it; a shape it cannot read back is a bug, logged, and
                // the call is still audited.
                tracing::warn!(%error, "audit: the bash result's egress records do not parse");
                Vec::new()
            }
        },
    };
    let omitted = details
        .get("egressOmitted")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    (records, omitted)
}

#[cfg(test)]
#[path = "hooks_tests.rs"]
mod tests;
