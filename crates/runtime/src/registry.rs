//! Building the tool set of a session: the tools the policy enables, over the session's
//! backend, each wrapped so partial results are redacted like final ones.

use std::sync::Arc;

use async_trait::async_trait;
use cordon_core::protocol::{Content, ToolDefinition};
use cordon_core::sandbox::SandboxSpec;
use cordon_core::tool::{
    AgentTool, AgentToolResult, ExecutionMode, ToolError, ToolInvocation, UpdateCallback,
};
use cordon_ops::{Backend, ToolKind};
use cordon_policy::{CompiledPolicy, Redactor};
use cordon_tools::bash::{BashOptions, BashTool};
use cordon_tools::edit::EditTool;
use cordon_tools::find::FindTool;
use cordon_tools::grep::GrepTool;
use cordon_tools::ls::LsTool;
use cordon_tools::read::{ReadOptions, ReadTool};
use cordon_tools::write::WriteTool;
use serde_json::Value;

/// The enabled tools over `backend`.
pub(crate) fn build_tools(
    backend: &dyn Backend,
    policy: &Arc<CompiledPolicy>,
    spec: &SandboxSpec,
) -> Vec<Arc<dyn AgentTool>> {
    let files = backend.files();
    // In the order the model sees them (docs/semantics.md#tools).
    ToolKind::MODEL_ORDER
        .into_iter()
        .filter(|kind| policy.is_tool_enabled(kind.name()))
        .map(|kind| -> Arc<dyn AgentTool> {
            match kind {
                ToolKind::Read => Arc::new(ReadTool::new(files.clone(), ReadOptions::default())),
                ToolKind::Bash => {
                    let tool = BashTool::new(
                        backend.bash(),
                        files.clone(),
                        BashOptions {
                            default_timeout: spec.limits.default_timeout,
                            max_timeout: spec.limits.max_timeout,
                        },
                    )
                    .with_spill_limits(spec.limits.spill_bytes, spec.limits.spill_session_bytes);
                    if policy.redactor().is_empty() {
                        Arc::new(tool)
                    } else {
                        // Redacted before the 50 KB tail is cut, so a secret straddling the
                        // cut cannot show its remainder.
                        let policy = policy.clone();
                        Arc::new(tool.with_redaction(Arc::new(move |text: &str| {
                            policy.redactor().redact_text(text)
                        })))
                    }
                }
                ToolKind::Edit => Arc::new(
                    EditTool::new(files.clone()).with_max_file_bytes(spec.limits.edit_file_bytes),
                ),
                ToolKind::Write => Arc::new(WriteTool::new(files.clone())),
                ToolKind::Grep => Arc::new(GrepTool::new(backend.search(), files.clone())),
                ToolKind::Find => Arc::new(FindTool::new(backend.search(), files.clone())),
                ToolKind::Ls => Arc::new(LsTool::new(files.clone())),
            }
        })
        .map(|tool| redacting(tool, policy))
        .collect()
}

fn redacting(tool: Arc<dyn AgentTool>, policy: &Arc<CompiledPolicy>) -> Arc<dyn AgentTool> {
    if policy.redactor().is_empty() {
        tool
    } else {
        Arc::new(RedactingTool {
            inner: tool,
            policy: policy.clone(),
        })
    }
}

/// Redacts a tool's partial results (`on_update`), which never pass `after_tool_call`.
struct RedactingTool {
    inner: Arc<dyn AgentTool>,
    policy: Arc<CompiledPolicy>,
}

/// Bytes at the end of a partial result's text that are held back until more output (or the
/// final result) arrives: a secret still being written would otherwise show its beginning
/// (`ghp_AAAA…`) before the rest makes it match.
const UPDATE_HOLD_BACK_BYTES: usize = 1024;

/// `text` without its last, possibly unfinished line — or, when that line is longer than
/// [`UPDATE_HOLD_BACK_BYTES`], without its last that many bytes.
fn hold_back_tail(text: &str) -> &str {
    let line_start = text.rfind('\n').map_or(0, |index| index + 1);
    let mut cut = if text.len() - line_start <= UPDATE_HOLD_BACK_BYTES {
        line_start
    } else {
        text.len() - UPDATE_HOLD_BACK_BYTES
    };
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// Redact a partial result, then hold back the end of each text block (see
/// [`hold_back_tail`]); the final result shows everything, redacted as a whole.
fn redact_partial(redactor: &Redactor, mut partial: AgentToolResult) -> AgentToolResult {
    if let Some(patch) = redactor.redact_result(&partial) {
        patch.apply(&mut partial);
    }
    for block in &mut partial.content {
        match block {
            Content::Text { text } => {
                let kept = hold_back_tail(text).len();
                text.truncate(kept);
            }
            Content::Image { .. } => {}
        }
    }
    partial
}

#[async_trait]
impl AgentTool for RedactingTool {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn label(&self) -> &str {
        self.inner.label()
    }
    fn description(&self) -> &str {
        self.inner.description()
    }
    fn parameters(&self) -> &Value {
        self.inner.parameters()
    }
    fn prompt_snippet(&self) -> Option<&str> {
        self.inner.prompt_snippet()
    }
    fn prompt_guidelines(&self) -> &[&str] {
        self.inner.prompt_guidelines()
    }
    fn prepare_arguments(&self, args: Value) -> Value {
        self.inner.prepare_arguments(args)
    }
    fn execution_mode(&self) -> ExecutionMode {
        self.inner.execution_mode()
    }
    fn definition(&self) -> ToolDefinition {
        self.inner.definition()
    }
    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError> {
        let ToolInvocation {
            call_id,
            args,
            cancel,
            on_update,
        } = invocation;
        let policy = self.policy.clone();
        let redacted: UpdateCallback =
            Arc::new(move |partial| on_update(redact_partial(policy.redactor(), partial)));
        self.inner
            .execute(ToolInvocation {
                call_id,
                args,
                cancel,
                on_update: redacted,
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor() -> Arc<CompiledPolicy> {
        Arc::new(
            CompiledPolicy::from_toml(
                "p.toml",
                "version = 1\n[redact]\npatterns = [\"ghp_[A-Za-z0-9]{36,}\"]\n",
                &cordon_policy::EnvMap::new(),
            )
            .unwrap(),
        )
    }

    fn partial(text: &str) -> AgentToolResult {
        AgentToolResult {
            content: vec![Content::text(text)],
            ..Default::default()
        }
    }

    fn shown(result: &AgentToolResult) -> &str {
        result.content[0].as_text().unwrap()
    }

    #[test]
    fn a_secret_arriving_in_pieces_never_shows_its_beginning() {
        let policy = redactor();
        let token = format!("ghp_{}", "A".repeat(36));
        // Each update is the whole output so far, as bash sends them.
        let mut so_far = String::from("line one\nexport TOKEN=");
        let mut updates = Vec::new();
        for piece in token.as_bytes().chunks(7) {
            so_far.push_str(std::str::from_utf8(piece).unwrap());
            updates.push(redact_partial(policy.redactor(), partial(&so_far)));
        }
        so_far.push_str("\nline three");
        updates.push(redact_partial(policy.redactor(), partial(&so_far)));
        for update in &updates {
            assert!(!shown(update).contains("ghp_"), "{:?}", shown(update));
            assert!(!shown(update).contains("AAAA"), "{:?}", shown(update));
        }
        assert_eq!(shown(&updates[0]), "line one\n");
        assert_eq!(
            shown(updates.last().unwrap()),
            "line one\nexport TOKEN=[REDACTED]\n"
        );
    }

    #[test]
    fn a_long_unfinished_line_holds_back_a_window_only() {
        let text = format!(
            "{}é{}",
            "a".repeat(3000),
            "b".repeat(UPDATE_HOLD_BACK_BYTES - 1)
        );
        let kept = hold_back_tail(&text);
        assert_eq!(kept, "a".repeat(3000));
        assert_eq!(hold_back_tail("done\n"), "done\n");
        assert_eq!(hold_back_tail(""), "");
    }
}
