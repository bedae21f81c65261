//! Building the tool set of a session: the tools the policy enables, over the session's
//! backend, each wrapped so partial results are redacted like final ones.

use std::sync::Arc;

use async_trait::async_trait;
use cordon_core::protocol::ToolDefinition;
use cordon_core::sandbox::SandboxSpec;
use cordon_core::tool::{
    AgentTool, AgentToolResult, ExecutionMode, ToolError, ToolInvocation, UpdateCallback,
};
use cordon_policy::{CompiledPolicy, Redactor};
use cordon_tools::bash::{BashOptions, BashTool};
use cordon_tools::edit::EditTool;
use cordon_tools::find::FindTool;
use cordon_tools::grep::GrepTool;
use cordon_tools::ls::LsTool;
use cordon_tools::ops::Backend;
use cordon_tools::read::{ReadOptions, ReadTool};
use cordon_tools::write::WriteTool;
use serde_json::Value;

/// Tools in the order the model sees them (the reference's order).
const TOOL_ORDER: [&str; 7] = ["read", "bash", "edit", "write", "grep", "find", "ls"];

/// The enabled tools over `backend`.
pub(crate) fn build_tools(
    backend: &dyn Backend,
    policy: &Arc<CompiledPolicy>,
    spec: &SandboxSpec,
) -> Vec<Arc<dyn AgentTool>> {
    let files = backend.files();
    TOOL_ORDER
        .iter()
        .filter(|name| policy.is_tool_enabled(name))
        .map(|name| -> Arc<dyn AgentTool> {
            match *name {
                "read" => Arc::new(ReadTool::new(files.clone(), ReadOptions::default())),
                "bash" => Arc::new(BashTool::new(
                    backend.bash(),
                    files.clone(),
                    BashOptions {
                        default_timeout: spec.limits.default_timeout,
                        max_timeout: spec.limits.max_timeout,
                    },
                )),
                "edit" => Arc::new(EditTool::new(files.clone())),
                "write" => Arc::new(WriteTool::new(files.clone())),
                "grep" => Arc::new(GrepTool::new(backend.search(), files.clone())),
                "find" => Arc::new(FindTool::new(backend.search(), files.clone())),
                _ => Arc::new(LsTool::new(files.clone())),
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

fn redact_partial(redactor: &Redactor, mut partial: AgentToolResult) -> AgentToolResult {
    if let Some(patch) = redactor.redact_result(&partial) {
        patch.apply(&mut partial);
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
