//! What `cordon policy check FILE` and `cordon policy explain FILE TOOL ARGS_JSON` print,
//! as library functions; the CLI only prints their text (or JSON) and picks the exit code.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use crate::PolicyError;
use crate::builtin::PolicySource;
use crate::decision::{Decision, DecisionRequest, PathAccess, PolicyDecision};
use crate::paths::lexical_accesses;
use crate::policy::{CompiledPolicy, EnvMap};
use crate::shell::{ScriptAnalysis, analyse_script};

/// Load and compile a policy (a file or `builtin:NAME`) and summarise it, for `cordon policy
/// check FILE`. The error displays as `FILE:LINE:COL: message`.
pub fn check_policy_file(path: &Path, env: &EnvMap) -> Result<String, PolicyError> {
    let source = PolicySource::parse(path)?;
    let policy = CompiledPolicy::load_source(&source, env)?;
    Ok(check_summary(&policy))
}

/// The summary `policy check` prints for a compiled policy.
pub fn check_summary(policy: &CompiledPolicy) -> String {
    let spec = policy.sandbox_spec();
    let mut out = format!(
        "{}: ok (default {}, {} rules, tools: {}, network {}, workspace {})\n",
        policy.file(),
        policy.default_decision(),
        policy.rule_count(),
        policy.enabled_tools().join(", "),
        match spec.network {
            cordon_core::sandbox::NetworkMode::Disabled => "disabled",
            cordon_core::sandbox::NetworkMode::Enabled => "enabled",
            cordon_core::sandbox::NetworkMode::Filtered => "filtered",
        },
        match spec.workspace {
            cordon_core::sandbox::RootAccess::ReadOnly => "read-only",
            cordon_core::sandbox::RootAccess::ReadWrite => "read-write",
        },
    );
    for note in policy.notes() {
        out.push_str("note: ");
        out.push_str(note);
        out.push('\n');
    }
    out
}

/// Why a call cannot be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// `ARGS_JSON` is not valid JSON.
    #[error("failed to parse ARGS_JSON: {0}")]
    BadJson(#[source] serde_json::Error),
    /// `ARGS_JSON` is not a JSON object.
    #[error("failed to use ARGS_JSON: tool arguments must be a JSON object")]
    NotAnObject,
    /// The workspace root given is relative.
    #[error("failed to resolve paths: the workspace root {} is not absolute", .0.display())]
    RelativeRoot(PathBuf),
}

/// A decision with what led to it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// Tool name.
    pub tool: String,
    /// The decision, rule, reason and unanalysable flag.
    #[serde(flatten)]
    pub decision: PolicyDecision,
    /// What a non-interactive entry point (exec, replay, MCP) does with it.
    pub non_interactive: Decision,
    /// The paths judged.
    pub paths: Vec<PathAccess>,
    /// Whether `paths` were resolved lexically (symlinks not followed).
    pub lexical_paths: bool,
    /// For bash: the simple commands found and what could not be analysed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub script: Option<ScriptAnalysis>,
}

impl Explanation {
    /// Human-readable lines: decision, rule, reason, then details.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "decision: {}\nrule: {}\nreason: {}\n",
            self.decision.decision, self.decision.rule, self.decision.reason
        );
        if self.non_interactive != self.decision.decision {
            out.push_str(&format!("non-interactive: {}\n", self.non_interactive));
        }
        if let Some(flag) = &self.decision.unanalysable {
            out.push_str(&format!("unanalysable: {flag}\n"));
        }
        for access in &self.paths {
            out.push_str(&format!(
                "path: {} {}{}\n",
                access.op.name(),
                access.canonical.display(),
                if self.lexical_paths {
                    " (resolved lexically; symlinks not followed)"
                } else {
                    ""
                }
            ));
        }
        if let Some(script) = &self.script {
            // Each command with what runs it: `command: prlimit → git push`.
            for command in &script.commands {
                out.push_str(&format!("command: {}\n", command.chain()));
            }
        }
        out
    }

    /// The JSON object `explain --json` prints.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|error| json!({ "error": error.to_string() }))
    }
}

/// Explain a call whose paths the caller already resolved (canonical).
pub fn explain(policy: &CompiledPolicy, request: &DecisionRequest<'_>) -> Explanation {
    let DecisionRequest {
        tool,
        args,
        paths,
        root: _,
        home: _,
    } = *request;
    let decision = policy.decide(request);
    let script = (tool == "bash")
        .then(|| {
            args.get("command")
                .and_then(Value::as_str)
                .map(analyse_script)
        })
        .flatten();
    Explanation {
        tool: tool.to_owned(),
        non_interactive: decision.clone().non_interactive().decision,
        decision,
        paths: paths.to_vec(),
        lexical_paths: false,
        script,
    }
}

/// What `cordon policy explain FILE TOOL ARGS_JSON` asks.
#[derive(Clone, Copy, Debug)]
pub struct ExplainCliRequest<'a> {
    /// Tool name.
    pub tool: &'a str,
    /// The arguments as JSON text.
    pub args_json: &'a str,
    /// The workspace root (absolute) that relative paths resolve against.
    pub root: &'a Path,
    /// The home directory for `~` paths and `~/` globs, if known.
    pub home: Option<&'a Path>,
}

/// Explain a call from the CLI: parse the arguments, resolve their paths lexically against
/// the absolute root (no backend, no symlinks) and judge the call. Nothing is executed.
pub fn explain_cli(
    policy: &CompiledPolicy,
    request: &ExplainCliRequest<'_>,
) -> Result<Explanation, ExplainError> {
    let ExplainCliRequest {
        tool,
        args_json,
        root,
        home,
    } = *request;
    let args: Value = serde_json::from_str(args_json).map_err(ExplainError::BadJson)?;
    if !args.is_object() {
        return Err(ExplainError::NotAnObject);
    }
    if !root.is_absolute() {
        return Err(ExplainError::RelativeRoot(root.to_path_buf()));
    }
    let root: PathBuf = cordon_ops::paths::normalize_lexically(root);
    let paths = lexical_accesses(tool, &args, &root, home);
    let mut explanation = explain(
        policy,
        &DecisionRequest {
            tool,
            args: &args,
            paths: &paths,
            root: &root,
            home,
        },
    );
    explanation.lexical_paths = crate::paths::is_path_tool(tool);
    Ok(explanation)
}
