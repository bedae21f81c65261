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
use cordon_policy::audit::{AuditRecord, args_sha256, rfc3339_utc};
use cordon_policy::{
    CompiledPolicy, Decision, DecisionRequest, PathAccess, PolicyDecision, RuleRef, paths_of,
};
use cordon_tools::ops::{BackendId, FileOperations};
use cordon_tools::paths::resolve_to_cwd;
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

pub(crate) struct InFlight {
    started: Instant,
    decision: PolicyDecision,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RuntimeHooks {
    /// The canonical paths a call touches, as the backend resolves them. A path the backend
    /// cannot resolve (outside every root, broken symlink loop, …) yields its error, which the
    /// caller turns into a denial: what cannot be resolved cannot be judged.
    async fn accesses(&self, tool: &str, args: &Value) -> Result<Vec<PathAccess>, String> {
        let root = self.files.root();
        let home = self.files.home();
        let mut out = Vec::new();
        for (raw, op) in paths_of(tool, args) {
            let lexical = resolve_to_cwd(&raw, root, home);
            let canonical = self.files.canonicalize(&lexical).await.map_err(|error| {
                format!(
                    "Refused: {error} (requested as `{raw}`). Only paths inside the workspace \
                         root {} and the sandbox's other allowed roots can be used.",
                    root.display()
                )
            })?;
            if self.is_spill_read(&canonical, op) {
                continue;
            }
            out.push(PathAccess { canonical, op });
        }
        Ok(out)
    }

    /// Reads of the backend's own spill files (a truncated command's full output) are always
    /// allowed: the output was already the model's.
    fn is_spill_read(&self, canonical: &Path, op: cordon_policy::Op) -> bool {
        matches!(op, cordon_policy::Op::Read)
            && self
                .files
                .spill_dir()
                .is_some_and(|dir| canonical.starts_with(dir))
    }

    /// Whether the call names at least one path and every one is a read of a spill file.
    async fn names_only_spill_files(&self, tool: &str, args: &Value) -> bool {
        let named = paths_of(tool, args);
        if named.is_empty() {
            return false;
        }
        let root = self.files.root();
        let home = self.files.home();
        for (raw, op) in named {
            let lexical = resolve_to_cwd(&raw, root, home);
            match self.files.canonicalize(&lexical).await {
                Ok(canonical) if self.is_spill_read(&canonical, op) => {}
                _ => return false,
            }
        }
        true
    }

    fn spill_read(&self, tool: &str) -> PolicyDecision {
        PolicyDecision {
            decision: Decision::Allow,
            rule: RuleRef {
                file: Arc::from("cordon"),
                line: 0,
            },
            reason: format!(
                "the `{tool}` call only reads this backend's spill files (full command output)"
            ),
            unanalysable: None,
        }
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
        }
    }

    async fn resolve_ask(
        &self,
        tool: &str,
        args: &Value,
        decision: PolicyDecision,
    ) -> PolicyDecision {
        match decision.decision {
            Decision::Allow | Decision::Deny => decision,
            Decision::Ask => {
                if lock(&self.approved_rules).contains(&decision.rule) {
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
                        tool: tool.to_owned(),
                        args: args.clone(),
                        rule: decision.rule.to_string(),
                        reason: decision.reason.clone(),
                    })
                    .await;
                match answer {
                    Approval::Yes => PolicyDecision {
                        decision: Decision::Allow,
                        reason: format!("approved by the user: {}", decision.reason),
                        ..decision
                    },
                    Approval::Always => {
                        lock(&self.approved_rules).insert(decision.rule.clone());
                        PolicyDecision {
                            decision: Decision::Allow,
                            reason: format!(
                                "approved by the user for this session: {}",
                                decision.reason
                            ),
                            ..decision
                        }
                    }
                    Approval::No => PolicyDecision {
                        decision: Decision::Deny,
                        reason: format!(
                            "the user declined this call ({}). Do not retry it; ask the user what to do instead.",
                            decision.reason
                        ),
                        ..decision
                    },
                }
            }
        }
    }

    fn audit(&self, record: AuditRecord, unanalysable: Option<&str>) -> Result<(), HookError> {
        match &self.audit {
            Some(log) => log.append(&record, unanalysable).map_err(Into::into),
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
            // Only this backend's spill files: exempt from the policy's path globs (the output
            // was already the model's), but the tool itself must be enabled.
            Ok(paths)
                if paths.is_empty()
                    && self.policy.is_tool_enabled(tool)
                    && self.names_only_spill_files(tool, args).await =>
            {
                (self.spill_read(tool), false)
            }
            Ok(paths) => {
                let request = DecisionRequest {
                    tool,
                    args,
                    paths: &paths,
                    root: self.files.root(),
                    home: self.files.home(),
                };
                let decision = self.policy.decide(&request);
                (self.resolve_ask(tool, args, decision).await, false)
            }
            Err(reason) => (self.refusal(reason), true),
        };
        let record = self.record(&call.tool_call.id, tool, args, &decision);
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
            Decision::Allow => {
                lock(&self.in_flight).insert(
                    call.tool_call.id.clone(),
                    InFlight {
                        started: Instant::now(),
                        decision,
                    },
                );
                Ok(BeforeOutcome::Continue)
            }
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
            let mut record = self.record(
                &call.tool_call.id,
                &call.tool_call.name,
                call.args,
                &decision,
            );
            record.is_error = Some(is_error);
            record.duration_ms =
                Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
            self.audit(record, None)?;
        }
        Ok(patch)
    }
}
