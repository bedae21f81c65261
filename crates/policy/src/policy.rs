//! [`CompiledPolicy`]: a policy file parsed, validated and compiled once into immutable
//! matchers — tool enablement, filesystem globs, command and path rules, limits, network,
//! redaction — plus [`CompiledPolicy::decide`], which judges one tool call, and
//! [`CompiledPolicy::sandbox_spec`], which gives the backends the same file's OS-level view.
//!
//! This file holds the type, loading and the accessors; compiling is in `compile`, judging
//! calls (`decide`, `check_path`) in `decide`.

mod compile;
mod decide;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use cordon_core::sandbox::SandboxSpec;

use crate::builtin::{BuiltinPolicy, PolicySource};
use crate::decision::{Decision, RuleRef};
use crate::error::{PolicyError, SourceMap};
use crate::format::RawPolicy;
use crate::glob::PathGlob;
use crate::paths::is_path_tool;
use crate::redact::Redactor;
use compile::compile;

/// The text of `policies/default.toml`: what an omitted `--policy` means.
pub const DEFAULT_POLICY_TOML: &str = include_str!("../../../policies/default.toml");

/// The name the built-in default policy reports in rule references.
pub const DEFAULT_POLICY_NAME: &str = "builtin:default.toml";

/// Host environment variables, by name (e.g. `std::env::vars().collect()`).
pub type EnvMap = HashMap<String, String>;

/// The largest policy file [`CompiledPolicy::load`] reads.
pub const MAX_POLICY_BYTES: u64 = 4 << 20;

/// Read a policy file's text the way [`CompiledPolicy::load`] does (no symlink, no FIFO, a
/// regular file of at most [`MAX_POLICY_BYTES`] owned by the user or root and not writable by
/// group or others).
pub fn read_policy_file(path: &Path) -> Result<String, PolicyError> {
    cordon_core::hostfile::read_to_string(
        path,
        cordon_core::hostfile::Trust::Owned,
        MAX_POLICY_BYTES,
    )
    .map_err(|source| PolicyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A path the runtime keeps read-only for the session, and what it is (for the denial).
#[derive(Clone, Debug)]
pub(crate) struct SessionProtect {
    pub glob: PathGlob,
    /// The rule the denial cites (`builtin:…`).
    pub rule: &'static str,
    /// What the path is, as the denial names it.
    pub what: &'static str,
}

/// A policy ready to judge tool calls. Immutable; cheap to share behind an `Arc`.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    file: Arc<str>,
    default: Decision,
    default_at: RuleRef,
    unanalysable: Decision,
    unanalysable_at: RuleRef,
    enabled: Vec<String>,
    enabled_at: RuleRef,
    read: Vec<PathGlob>,
    read_at: RuleRef,
    write: Vec<PathGlob>,
    write_at: RuleRef,
    deny: Vec<PathGlob>,
    protect: Vec<PathGlob>,
    /// Paths protected for the session by the runtime ([`CompiledPolicy::protect_literal`],
    /// [`CompiledPolicy::protect_config_dir`]).
    session_protect: Vec<SessionProtect>,
    rules: Vec<Rule>,
    redactor: Redactor,
    spec: SandboxSpec,
    notes: Vec<String>,
}

#[derive(Clone, Debug)]
struct Rule {
    at: RuleRef,
    tools: Option<Vec<String>>,
    kind: RuleKind,
    decision: Decision,
    reason: Option<String>,
}

#[derive(Clone, Debug)]
enum RuleKind {
    /// Matches every call of its tools.
    Tool,
    /// Argv pattern; each element lists the accepted words.
    Command(Vec<Vec<String>>),
    /// Any path of the call matches one of the globs.
    Path(Vec<PathGlob>),
}

impl Rule {
    fn applies_to(&self, tool: &str) -> bool {
        match &self.tools {
            Some(tools) => tools.iter().any(|t| t == tool),
            None => match self.kind {
                RuleKind::Tool => false,
                RuleKind::Command(_) => tool == "bash",
                RuleKind::Path(_) => is_path_tool(tool),
            },
        }
    }
}

impl CompiledPolicy {
    /// Read and compile a policy file. `env` supplies the values of `[redact] env` variables.
    ///
    /// The file is trusted configuration: it is opened without following a symlink or
    /// blocking on a FIFO, and must be a regular file of at most [`MAX_POLICY_BYTES`], owned
    /// by the current user or root and not writable by group or others.
    pub fn load(path: &Path, env: &EnvMap) -> Result<CompiledPolicy, PolicyError> {
        let text = read_policy_file(path)?;
        CompiledPolicy::from_toml(&path.display().to_string(), &text, env)
    }

    /// The built-in default policy (the content of `policies/default.toml`).
    pub fn builtin_default(env: &EnvMap) -> Result<CompiledPolicy, PolicyError> {
        CompiledPolicy::from_toml(DEFAULT_POLICY_NAME, DEFAULT_POLICY_TOML, env)
    }

    /// A shipped policy; rule references cite it as `builtin:NAME.toml:LINE`.
    pub fn builtin(policy: &BuiltinPolicy, env: &EnvMap) -> Result<CompiledPolicy, PolicyError> {
        CompiledPolicy::from_toml(&policy.file_name(), policy.text, env)
    }

    /// Load a policy from where `source` says: a shipped one or a file ([`CompiledPolicy::load`]).
    pub fn load_source(source: &PolicySource, env: &EnvMap) -> Result<CompiledPolicy, PolicyError> {
        match source {
            PolicySource::Builtin(policy) => CompiledPolicy::builtin(policy, env),
            PolicySource::File(path) => CompiledPolicy::load(path, env),
        }
    }

    /// Compile policy `text`; `file` names it in errors and rule references.
    pub fn from_toml(file: &str, text: &str, env: &EnvMap) -> Result<CompiledPolicy, PolicyError> {
        let map = SourceMap::new(file, text);
        if let Err(error) = toml::from_str::<toml::Table>(text) {
            return Err(map.toml_error(&error, true));
        }
        let raw: RawPolicy = toml::from_str(text).map_err(|error| map.toml_error(&error, false))?;
        compile(&map, raw, env)
    }

    /// The file name given to the loader.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The decision when no rule matches.
    pub fn default_decision(&self) -> Decision {
        self.default
    }

    /// The tools the runtime should register; others are `Tool X not found`.
    pub fn enabled_tools(&self) -> &[String] {
        &self.enabled
    }

    /// Whether `tool` is enabled.
    pub fn is_tool_enabled(&self, tool: &str) -> bool {
        self.enabled.iter().any(|t| t == tool)
    }

    /// The redaction `after_tool_call` applies.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Notes from compilation (skipped `[redact] env` values, …) for `policy check` and logs.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Number of `[[rules]]`.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// The OS/container view of the same policy (see the README for the mapping).
    pub fn sandbox_spec(&self) -> SandboxSpec {
        self.spec.clone()
    }

    fn at(&self, line: usize) -> RuleRef {
        RuleRef {
            file: self.file.clone(),
            line,
        }
    }
}
