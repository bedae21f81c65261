//! [`CompiledPolicy`]: a policy file parsed, validated and compiled once into immutable
//! matchers — tool enablement, filesystem globs, command and path rules, limits, network,
//! redaction — plus [`CompiledPolicy::decide`], which judges one tool call, and
//! [`CompiledPolicy::sandbox_spec`], which gives the backends the same file's OS-level view.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cordon_core::sandbox::{EnvSpec, Limits, NestedGit, NetworkMode, RootAccess, SandboxSpec};
use serde_json::Value;
use toml::Spanned;

use crate::decision::{Decision, DecisionRequest, Op, PathAccess, PolicyDecision, RuleRef};
use crate::error::{PolicyError, SourceMap};
use crate::format::{CommandPattern, OneOrMany, RawPolicy, RawRule, SpannedList};
use crate::glob::{Anchor, PathContext, PathGlob};
use crate::paths::{KNOWN_TOOLS, PATH_TOOLS};
use crate::redact::{MIN_ENV_VALUE_CHARS, Redactor};
use crate::shell::{self, ScriptAnalysis, SimpleCommand, Word};

/// The text of `policies/default.toml`: what an omitted `--policy` means.
pub const DEFAULT_POLICY_TOML: &str = include_str!("../../../policies/default.toml");

/// The name the built-in default policy reports in rule references.
pub const DEFAULT_POLICY_NAME: &str = "builtin:default.toml";

/// Host environment variables, by name (e.g. `std::env::vars().collect()`).
pub type EnvMap = HashMap<String, String>;

/// The largest policy file [`CompiledPolicy::load`] reads.
pub const MAX_POLICY_BYTES: u64 = 4 << 20;

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
    /// Files protected for the session by the runtime ([`CompiledPolicy::protect_literal`]).
    session_protect: Vec<PathGlob>,
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

/// How a command matches a pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Match {
    Yes,
    /// Only if run-time values (dynamic words, `xargs` input) turn out a certain way.
    Maybe,
    No,
}

impl Rule {
    fn applies_to(&self, tool: &str) -> bool {
        match &self.tools {
            Some(tools) => tools.iter().any(|t| t == tool),
            None => match self.kind {
                RuleKind::Tool => false,
                RuleKind::Command(_) => tool == "bash",
                RuleKind::Path(_) => PATH_TOOLS.contains(&tool),
            },
        }
    }
}

/// Whether the argv starts with the pattern (allow rules): every pattern word must be a
/// literal in the same position.
fn match_prefix(pattern: &[Vec<String>], command: &SimpleCommand) -> Match {
    let Some((program, rest)) = pattern.split_first() else {
        return Match::No;
    };
    if !program.contains(&command.program) {
        return Match::No;
    }
    for (index, accepted) in rest.iter().enumerate() {
        match command.args.get(index) {
            Some(Word::Literal(text)) if accepted.contains(text) => {}
            Some(Word::Literal(_)) => return Match::No,
            Some(Word::Dynamic(_)) => return Match::Maybe,
            None if command.open_tail => return Match::Maybe,
            None => return Match::No,
        }
    }
    Match::Yes
}

/// Whether the pattern words occur in order in the argv, the program first (deny and ask
/// rules), so options between them do not hide a match: `git -C x push` matches `git push`.
/// A dynamic word may expand to any words, so it makes an incomplete match a `Maybe`.
fn match_in_order(pattern: &[Vec<String>], command: &SimpleCommand) -> Match {
    let Some((program, rest)) = pattern.split_first() else {
        return Match::No;
    };
    if !program.contains(&command.program) {
        return Match::No;
    }
    let mut next = 0;
    let mut dynamic = false;
    for arg in &command.args {
        if next == rest.len() {
            break;
        }
        match arg {
            Word::Literal(text) if rest[next].contains(text) => next += 1,
            Word::Literal(_) => {}
            Word::Dynamic(_) => dynamic = true,
        }
    }
    if next == rest.len() {
        Match::Yes
    } else if dynamic || command.open_tail {
        Match::Maybe
    } else {
        Match::No
    }
}

fn pattern_text(pattern: &[Vec<String>]) -> String {
    pattern
        .iter()
        .map(|alternatives| match alternatives.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join("|")),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn phrase(decision: Decision) -> &'static str {
    match decision {
        Decision::Allow => "is allowed",
        Decision::Ask => "needs a person's approval",
        Decision::Deny => "is denied",
    }
}

/// Priority of candidates with the same decision: an explicit rule explains a decision
/// better than the allowlist default, which explains it better than the catch-all default.
const BY_RULE: u8 = 3;
const BY_UNANALYSABLE: u8 = 2;
const BY_ALLOWLIST: u8 = 1;
const BY_DEFAULT: u8 = 0;

#[derive(Default)]
struct Judge {
    best: Option<(Decision, u8, PolicyDecision)>,
    flags: Vec<String>,
}

impl Judge {
    fn consider(&mut self, priority: u8, candidate: PolicyDecision) {
        let better = match &self.best {
            None => true,
            Some((decision, best_priority, _)) => {
                (candidate.decision, priority) > (*decision, *best_priority)
            }
        };
        if better {
            self.best = Some((candidate.decision, priority, candidate));
        }
    }

    fn flag(&mut self, reason: String) {
        if !self.flags.contains(&reason) {
            self.flags.push(reason);
        }
    }
}

fn decided(decision: Decision, rule: &RuleRef, reason: String) -> PolicyDecision {
    PolicyDecision {
        decision,
        rule: rule.clone(),
        reason,
        unanalysable: None,
    }
}

impl CompiledPolicy {
    /// Read and compile a policy file. `env` supplies the values of `[redact] env` variables.
    ///
    /// The file is trusted configuration: it is opened without following a symlink or
    /// blocking on a FIFO, and must be a regular file of at most [`MAX_POLICY_BYTES`], owned
    /// by the current user or root and not writable by group or others.
    pub fn load(path: &Path, env: &EnvMap) -> Result<CompiledPolicy, PolicyError> {
        let text = cordon_core::hostfile::read_to_string(
            path,
            cordon_core::hostfile::Trust::Owned,
            MAX_POLICY_BYTES,
        )
        .map_err(|source| PolicyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        CompiledPolicy::from_toml(&path.display().to_string(), &text, env)
    }

    /// The built-in default policy (the content of `policies/default.toml`).
    pub fn builtin_default(env: &EnvMap) -> Result<CompiledPolicy, PolicyError> {
        CompiledPolicy::from_toml(DEFAULT_POLICY_NAME, DEFAULT_POLICY_TOML, env)
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

    /// Keep `path` read-only for the session, as if the policy listed it under
    /// `[filesystem] protect`: the file tools are refused writes to it and commands see it
    /// read-only. `path` is relative to the workspace root or absolute, and is taken
    /// literally (a path holding glob characters is refused: it could not be protected
    /// exactly). The runtime uses it for the policy file itself when that lies in a writable
    /// root.
    pub fn protect_literal(&mut self, path: &str) -> Result<(), PolicyError> {
        let builtin = SourceMap::new(&self.file, "");
        if path.contains(['*', '?', '[', ']', '{', '}', '\\', '\n']) {
            return Err(builtin.bad_glob(
                0,
                path,
                "the path holds glob characters and cannot be protected literally; rename it"
                    .to_owned(),
            ));
        }
        let mut glob = PathGlob::compile(path, 0, &builtin)?;
        glob.line = 0;
        if !self.spec.protected.iter().any(|known| known == path) {
            self.spec.protected.push(path.to_owned());
        }
        self.session_protect.push(glob);
        Ok(())
    }

    /// The OS/container view of the same policy (see the README for the mapping).
    pub fn sandbox_spec(&self) -> SandboxSpec {
        self.spec.clone()
    }

    /// Judge one access of a canonical path against `[filesystem]` (deny, protect, read,
    /// write), as [`CompiledPolicy::decide`] does. Search tools may use it to drop denied files
    /// from results.
    pub fn check_path(
        &self,
        access: &PathAccess,
        root: &Path,
        home: Option<&Path>,
    ) -> PolicyDecision {
        let context = PathContext { root, home };
        let path = &access.canonical;
        let shown = path.display();
        let verb = access.op.verb();
        if !path.is_absolute() {
            return decided(
                Decision::Deny,
                &self.read_at,
                format!(
                    "{verb} {shown} cannot be checked: the path is not absolute (the runtime must pass canonical paths)"
                ),
            );
        }
        if let Some(glob) = self.deny.iter().find(|g| g.matches(path, context, true)) {
            return decided(
                Decision::Deny,
                &self.at(glob.line),
                format!(
                    "{verb} {shown} is denied by the policy (it matches `{}`); do not try to access it another way",
                    glob.source
                ),
            );
        }
        match access.op {
            Op::Write => {
                if self
                    .session_protect
                    .iter()
                    .any(|g| g.matches(path, context, true))
                {
                    return decided(
                        Decision::Deny,
                        &RuleRef {
                            file: Arc::from("builtin:policy-file"),
                            line: 0,
                        },
                        format!(
                            "{verb} {shown} is not allowed: it is the policy file this session runs with, which stays read-only for the whole session; do not try to change it another way"
                        ),
                    );
                }
                if let Some(glob) = self.protect.iter().find(|g| g.matches(path, context, true)) {
                    return decided(
                        Decision::Deny,
                        &self.at(glob.line),
                        format!(
                            "{verb} {shown} is not allowed: the path is protected (read-only) by the policy (`{}`)",
                            glob.source
                        ),
                    );
                }
                match self.write.iter().find(|g| g.matches(path, context, false)) {
                    Some(glob) => decided(
                        Decision::Allow,
                        &self.at(glob.line),
                        format!("{verb} {shown} is allowed (`{}`)", glob.source),
                    ),
                    None => decided(
                        Decision::Deny,
                        &self.write_at,
                        format!(
                            "{verb} {shown} is not allowed: it is outside the policy's writable paths; write inside the workspace instead"
                        ),
                    ),
                }
            }
            Op::Read => match self
                .read
                .iter()
                .chain(&self.write)
                .find(|g| g.matches(path, context, false))
            {
                Some(glob) => decided(
                    Decision::Allow,
                    &self.at(glob.line),
                    format!("{verb} {shown} is allowed (`{}`)", glob.source),
                ),
                None => decided(
                    Decision::Deny,
                    &self.read_at,
                    format!(
                        "{verb} {shown} is not allowed: it is outside the policy's readable paths"
                    ),
                ),
            },
        }
    }

    /// Derive the OS-level filesystem view: the workspace is read-write if any relative
    /// write glob exists; absolute and `~/` globs contribute their literal directory prefix
    /// as readable or writable roots; protect and deny globs pass through as written.
    fn fill_filesystem_spec(&mut self) {
        let spec = &mut self.spec;
        spec.workspace = if self.write.iter().any(|g| g.anchor == Anchor::Root) {
            RootAccess::ReadWrite
        } else {
            RootAccess::ReadOnly
        };
        spec.writable_roots.clear();
        for root in self.write.iter().filter_map(PathGlob::literal_root) {
            if !spec.writable_roots.contains(&root) {
                spec.writable_roots.push(root);
            }
        }
        spec.readable_roots.clear();
        for root in self.read.iter().filter_map(PathGlob::literal_root) {
            if !spec.readable_roots.contains(&root) && !spec.writable_roots.contains(&root) {
                spec.readable_roots.push(root);
            }
        }
        spec.protected = self.protect.iter().map(|g| g.source.clone()).collect();
        spec.denied = self.deny.iter().map(|g| g.source.clone()).collect();
        spec.allow_degraded = false;
    }

    fn at(&self, line: usize) -> RuleRef {
        RuleRef {
            file: self.file.clone(),
            line,
        }
    }

    /// Judge one tool call. The strictest matching rule wins; the result names it.
    pub fn decide(&self, request: &DecisionRequest<'_>) -> PolicyDecision {
        let DecisionRequest {
            tool,
            args,
            paths: _,
            root,
            home,
        } = *request;
        if !self.is_tool_enabled(tool) {
            return decided(
                Decision::Deny,
                &self.enabled_at,
                format!(
                    "the tool `{tool}` is not enabled by the policy; use one of: {}",
                    self.enabled.join(", ")
                ),
            );
        }
        let mut judge = Judge::default();
        for rule in &self.rules {
            if matches!(rule.kind, RuleKind::Tool) && rule.applies_to(tool) {
                let reason = rule.reason.clone().unwrap_or_else(|| {
                    format!("the tool `{tool}` {} by the policy", phrase(rule.decision))
                });
                judge.consider(BY_RULE, decided(rule.decision, &rule.at, reason));
            }
        }
        if PATH_TOOLS.contains(&tool) {
            self.judge_paths(&mut judge, request);
        }
        if tool == "bash" {
            match args.get("command").and_then(Value::as_str) {
                Some(script) => {
                    let analysis = shell::analyse_script(script);
                    self.judge_script(&mut judge, &analysis, root, home);
                }
                None => judge.consider(
                    BY_RULE,
                    decided(
                        Decision::Deny,
                        &self.default_at,
                        "the bash call has no `command` string to check".to_owned(),
                    ),
                ),
            }
        }
        let mut decision = match judge.best {
            Some((_, _, decision)) => decision,
            None => decided(
                self.default,
                &self.default_at,
                format!(
                    "no rule matches this `{tool}` call, so the policy default applies: it {}",
                    phrase(self.default)
                ),
            ),
        };
        if !judge.flags.is_empty() {
            let flags = judge.flags.join("; ");
            decision.unanalysable = Some(self.redactor.redact_text(&flags).0);
        }
        decision.reason = self.redactor.redact_text(&decision.reason).0;
        decision
    }

    fn judge_paths(&self, judge: &mut Judge, request: &DecisionRequest<'_>) {
        let DecisionRequest {
            tool,
            args: _,
            paths,
            root,
            home,
        } = *request;
        if paths.is_empty() {
            judge.consider(
                BY_RULE,
                decided(
                    Decision::Deny,
                    &self.read_at,
                    format!("the `{tool}` call names no path the policy could check"),
                ),
            );
            return;
        }
        let context = PathContext { root, home };
        for access in paths {
            judge.consider(BY_RULE, self.check_path(access, root, home));
        }
        for rule in &self.rules {
            let RuleKind::Path(globs) = &rule.kind else {
                continue;
            };
            if !rule.applies_to(tool) {
                continue;
            }
            let strict = rule.decision > Decision::Allow;
            let hit = paths.iter().find_map(|access| {
                globs
                    .iter()
                    .find(|g| g.matches(&access.canonical, context, strict))
                    .map(|g| (access, g))
            });
            if let Some((access, glob)) = hit {
                let reason = rule.reason.clone().unwrap_or_else(|| {
                    format!(
                        "{} {} with `{tool}` {} by the policy (`{}`)",
                        access.op.verb(),
                        access.canonical.display(),
                        phrase(rule.decision),
                        glob.source
                    )
                });
                judge.consider(BY_RULE, decided(rule.decision, &rule.at, reason));
            }
        }
    }

    fn judge_script(
        &self,
        judge: &mut Judge,
        analysis: &ScriptAnalysis,
        root: &Path,
        home: Option<&Path>,
    ) {
        let tool_allowed = self.rules.iter().any(|rule| {
            matches!(rule.kind, RuleKind::Tool)
                && rule.decision == Decision::Allow
                && rule.applies_to("bash")
        });
        for command in &analysis.commands {
            let mut matched = false;
            for rule in &self.rules {
                let RuleKind::Command(pattern) = &rule.kind else {
                    continue;
                };
                if !rule.applies_to("bash") {
                    continue;
                }
                let result = match rule.decision {
                    Decision::Allow => match match_prefix(pattern, command) {
                        Match::Yes if self.program_path_trusted(command, root, home) => Match::Yes,
                        Match::Yes | Match::Maybe | Match::No => Match::No,
                    },
                    Decision::Ask | Decision::Deny => match_in_order(pattern, command),
                };
                match result {
                    Match::Yes => {
                        matched = true;
                        let reason = match &rule.reason {
                            Some(reason) => format!(
                                "the command `{command}` {}: {reason}",
                                phrase(rule.decision)
                            ),
                            None => format!(
                                "the command `{command}` {} by the policy (rule `{}`)",
                                phrase(rule.decision),
                                pattern_text(pattern)
                            ),
                        };
                        judge.consider(BY_RULE, decided(rule.decision, &rule.at, reason));
                    }
                    Match::Maybe => judge.flag(format!(
                        "`{command}` may match the {} rule `{}` ({}) depending on values only known at run time",
                        rule.decision,
                        pattern_text(pattern),
                        rule.at
                    )),
                    Match::No => {}
                }
            }
            if !matched && self.default == Decision::Deny && !tool_allowed {
                judge.consider(
                    BY_ALLOWLIST,
                    decided(
                        Decision::Deny,
                        &self.default_at,
                        format!(
                            "the command `{command}` is not allowed: the policy only runs commands its rules allow (default = \"deny\"){}",
                            if command.program_path.as_deref().is_some_and(|p| !crate::shell::is_system_program_path(p)) {
                                "; call programs by name, not by a path the agent could have written"
                            } else {
                                ""
                            }
                        ),
                    ),
                );
            }
        }
        for reason in &analysis.unanalysable {
            judge.flag(reason.clone());
        }
        if !judge.flags.is_empty() {
            let first = &judge.flags[0];
            let reason = match self.unanalysable {
                Decision::Allow => format!(
                    "allowed, but the script could not be fully checked and was flagged for audit: {first}"
                ),
                Decision::Ask | Decision::Deny => format!(
                    "the script cannot be fully checked: {first}. Rewrite it with plain commands (program names written literally, no eval, no variables or substitutions as command names)"
                ),
            };
            judge.consider(
                BY_UNANALYSABLE,
                decided(self.unanalysable, &self.unanalysable_at, reason),
            );
        }
        if analysis.commands.is_empty() && analysis.unanalysable.is_empty() {
            judge.consider(
                BY_DEFAULT,
                decided(
                    self.default,
                    &self.default_at,
                    format!(
                        "the script runs no command; the policy default applies: it {}",
                        phrase(self.default)
                    ),
                ),
            );
        }
    }

    /// A program named by a path may be something the agent wrote, so it only satisfies an
    /// allow rule from a system directory or a readable, non-writable, non-workspace root.
    fn program_path_trusted(
        &self,
        command: &SimpleCommand,
        root: &Path,
        home: Option<&Path>,
    ) -> bool {
        let Some(path) = command.program_path.as_deref() else {
            return true;
        };
        if crate::shell::is_system_program_path(path) {
            return true;
        }
        let absolute = match (path.strip_prefix("~/"), home) {
            (Some(rest), Some(home)) => home.join(rest),
            (Some(_), None) => return false,
            (None, _) if path.starts_with('/') => Path::new(path).to_path_buf(),
            (None, _) => return false,
        };
        let absolute = crate::paths::resolve_lexically(&absolute.to_string_lossy(), root, home);
        let context = PathContext { root, home };
        !absolute.starts_with(root)
            && self
                .read
                .iter()
                .any(|g| g.anchor != Anchor::Root && g.matches(&absolute, context, false))
            && !self
                .write
                .iter()
                .any(|g| g.matches(&absolute, context, true))
            && !self
                .deny
                .iter()
                .any(|g| g.matches(&absolute, context, true))
    }

    /// Whether `rule` matches a simple command of `script` (checks `match`/`not_match`
    /// examples at load time, judged without a known workspace or home directory).
    fn rule_matches_script(&self, rule: &Rule, script: &str) -> bool {
        let RuleKind::Command(pattern) = &rule.kind else {
            return false;
        };
        let nowhere = Path::new("/nonexistent-cordon-example-workspace");
        shell::analyse_script(script)
            .commands
            .iter()
            .any(|command| match rule.decision {
                Decision::Allow => {
                    match_prefix(pattern, command) == Match::Yes
                        && self.program_path_trusted(command, nowhere, None)
                }
                Decision::Ask | Decision::Deny => match_in_order(pattern, command) == Match::Yes,
            })
    }
}

/// Longest redaction pattern a policy may give.
const MAX_PATTERN_BYTES: usize = 4096;

fn line_or_zero<T>(value: Option<&Spanned<T>>, map: &SourceMap) -> usize {
    value.map_or(0, |value| map.line(value.span().start))
}

fn compile_globs(
    list: Option<&SpannedList>,
    defaults: &[&str],
    map: &SourceMap,
) -> Result<Vec<PathGlob>, PolicyError> {
    match list {
        Some(list) => list
            .get_ref()
            .iter()
            .map(|item| PathGlob::compile(item.get_ref(), item.span().start, map))
            .collect(),
        None => {
            let builtin = SourceMap::new(map.file(), "");
            defaults
                .iter()
                .map(|text| {
                    PathGlob::compile(text, 0, &builtin).map(|mut glob| {
                        glob.line = 0;
                        glob
                    })
                })
                .collect()
        }
    }
}

fn seconds(
    value: &Spanned<crate::format::Seconds>,
    map: &SourceMap,
    key: &str,
) -> Result<Duration, PolicyError> {
    let secs = value.get_ref().0;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(map.bad_value(
            value.span().start,
            format!("`{key}` must be a positive number of seconds, found {secs}"),
        ));
    }
    Duration::try_from_secs_f64(secs)
        .map_err(|_| map.bad_value(value.span().start, format!("`{key}` is out of range")))
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Most host Unix sockets one policy may name.
const MAX_UNIX_SOCKETS: usize = 64;

/// `[network] unix_sockets`: literal host paths (absolute or `~/…`) of pathname sockets
/// commands may connect to with the network on. Abstract sockets cannot be named: the
/// sandbox scopes them to itself as a whole.
fn compile_unix_sockets(
    raw: Option<&SpannedList>,
    network: NetworkMode,
    map: &SourceMap,
) -> Result<Vec<String>, PolicyError> {
    let Some(list) = raw else {
        return Ok(Vec::new());
    };
    if list.get_ref().is_empty() {
        return Ok(Vec::new());
    }
    match network {
        NetworkMode::Enabled => {}
        NetworkMode::Disabled => {
            return Err(map.bad_value(
                list.span().start,
                "`unix_sockets` needs `enabled = true`: with the network off no Unix socket can \
                 be connected; remove the list or turn the network on",
            ));
        }
    }
    if list.get_ref().len() > MAX_UNIX_SOCKETS {
        return Err(map.bad_value(
            list.span().start,
            format!("at most {MAX_UNIX_SOCKETS} `unix_sockets` may be listed"),
        ));
    }
    let mut out = Vec::new();
    for entry in list.get_ref() {
        let path = entry.get_ref();
        let problem = if path.starts_with('@') {
            Some(
                "abstract sockets cannot be allowed (the sandbox keeps them to itself); name a pathname socket",
            )
        } else if !(path.starts_with('/') || path.starts_with("~/")) {
            Some("a Unix socket must be an absolute path or start with `~/`")
        } else if path.len() > 4096 || path.contains('\0') {
            Some("a Unix socket path must be at most 4096 bytes without NUL bytes")
        } else if path.split('/').any(|part| part == "." || part == "..") {
            Some("a Unix socket path must not contain `.` or `..` components")
        } else if path.contains(['*', '?', '[', '{']) {
            Some("a Unix socket path is literal: no glob characters")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(map.bad_value(entry.span().start, format!("`{path}`: {problem}")));
        }
        if !out.contains(path) {
            out.push(path.clone());
        }
    }
    Ok(out)
}

fn compile(map: &SourceMap, raw: RawPolicy, env: &EnvMap) -> Result<CompiledPolicy, PolicyError> {
    let RawPolicy {
        version,
        default,
        tools,
        filesystem,
        network,
        limits,
        bash,
        env: raw_env,
        rules: raw_rules,
        redact,
    } = raw;
    let file: Arc<str> = map.file().into();
    let at = |line: usize| RuleRef {
        file: file.clone(),
        line,
    };
    if *version.get_ref() != 1 {
        return Err(map.bad_value(
            version.span().start,
            format!(
                "unsupported policy version {}; this Cordon reads version = 1",
                version.get_ref()
            ),
        ));
    }
    let default_decision = match &default {
        None => Decision::Allow,
        Some(value) => match value.get_ref().as_str() {
            "allow" => Decision::Allow,
            "deny" => Decision::Deny,
            other => {
                return Err(map.bad_value(
                    value.span().start,
                    format!("`default` must be \"allow\" or \"deny\", found \"{other}\""),
                ));
            }
        },
    };
    let default_at = at(line_or_zero(default.as_ref(), map));

    let (unanalysable, unanalysable_at) = match bash.and_then(|bash| bash.unanalysable) {
        None => (default_decision, default_at.clone()),
        Some(value) => match Decision::parse(value.get_ref()) {
            Some(decision) => (decision, at(map.line(value.span().start))),
            None => {
                return Err(map.bad_value(
                    value.span().start,
                    format!(
                        "`bash.unanalysable` must be \"allow\", \"ask\" or \"deny\", found \"{}\"",
                        value.get_ref()
                    ),
                ));
            }
        },
    };

    let enabled_list = tools.and_then(|tools| tools.enabled);
    let enabled_at = at(line_or_zero(enabled_list.as_ref(), map));
    let enabled: Vec<String> = match &enabled_list {
        None => KNOWN_TOOLS.iter().map(|t| (*t).to_owned()).collect(),
        Some(list) => {
            let mut names = Vec::new();
            for item in list.get_ref() {
                check_tool(item, map)?;
                if !names.contains(item.get_ref()) {
                    names.push(item.get_ref().clone());
                }
            }
            names
        }
    };

    let (fs_read, fs_write, fs_deny, fs_protect, fs_nested_git) = match filesystem {
        Some(fs) => (fs.read, fs.write, fs.deny, fs.protect, fs.nested_git),
        None => (None, None, None, None, None),
    };
    let nested_git = match &fs_nested_git {
        None => NestedGit::Quarantine,
        Some(value) => match value.get_ref().as_str() {
            "quarantine" => NestedGit::Quarantine,
            "allow" => NestedGit::Allow,
            other => {
                return Err(map.bad_value(
                    value.span().start,
                    format!(
                        "`filesystem.nested_git` must be \"quarantine\" or \"allow\", found \"{other}\""
                    ),
                ));
            }
        },
    };
    let read_at = at(line_or_zero(fs_read.as_ref(), map));
    let write_at = at(line_or_zero(fs_write.as_ref(), map));
    let read = compile_globs(fs_read.as_ref(), &["**"], map)?;
    let write = compile_globs(fs_write.as_ref(), &["**"], map)?;
    let deny = compile_globs(fs_deny.as_ref(), &[], map)?;
    let protect = compile_globs(fs_protect.as_ref(), &[".git/**", ".cordon/**"], map)?;

    let (network_enabled, raw_unix_sockets) = match network {
        Some(network) => (network.enabled, network.unix_sockets),
        None => (None, None),
    };
    let network_mode = match network_enabled {
        Some(enabled) if *enabled.get_ref() => NetworkMode::Enabled,
        Some(_) | None => NetworkMode::Disabled,
    };
    let unix_sockets = compile_unix_sockets(raw_unix_sockets.as_ref(), network_mode, map)?;

    let limits = compile_limits(limits, map)?;

    let env_spec = match raw_env {
        None => EnvSpec::default(),
        Some(raw_env) => {
            let mut pass = Vec::new();
            for name in raw_env.pass.iter().flat_map(|list| list.get_ref()) {
                if !is_variable_name(name.get_ref()) {
                    return Err(map.bad_value(
                        name.span().start,
                        format!(
                            "`{}` is not a valid environment variable name",
                            name.get_ref()
                        ),
                    ));
                }
                pass.push(name.get_ref().clone());
            }
            let mut set = Vec::new();
            for (name, value) in raw_env.set.into_iter().flatten() {
                if !is_variable_name(&name) {
                    return Err(map.bad_value(
                        value.span().start,
                        format!("`{name}` is not a valid environment variable name"),
                    ));
                }
                set.push((name, value.into_inner()));
            }
            EnvSpec { pass, set }
        }
    };

    let mut notes = Vec::new();
    let (patterns, literals) = compile_redact(redact, map, env, &mut notes)?;
    let redactor = Redactor::new(
        &patterns.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
        &literals,
    )
    .map_err(|error| {
        let offset = patterns.first().map_or(0, |(_, offset)| *offset);
        map.bad_regex(
            offset,
            "(all redaction patterns combined)",
            error.to_string(),
        )
    })?;

    // The filesystem part is filled in from the compiled globs below.
    let spec = SandboxSpec {
        network: network_mode,
        unix_sockets,
        limits,
        env: env_spec,
        nested_git,
        ..SandboxSpec::default()
    };

    let mut policy = CompiledPolicy {
        file: file.clone(),
        default: default_decision,
        default_at,
        unanalysable,
        unanalysable_at,
        enabled,
        enabled_at,
        read,
        read_at,
        write,
        write_at,
        deny,
        protect,
        session_protect: Vec::new(),
        rules: Vec::new(),
        redactor,
        spec,
        notes,
    };
    policy.fill_filesystem_spec();
    for raw_rule in raw_rules {
        let rule = compile_rule(&raw_rule, map, &file)?;
        let RawRule {
            match_examples,
            not_match,
            ..
        } = raw_rule.get_ref();
        for (examples, should_match) in [(match_examples, true), (not_match, false)] {
            for example in examples.iter().flat_map(|list| list.get_ref()) {
                if !matches!(rule.kind, RuleKind::Command(_)) {
                    return Err(map.bad_value(
                        example.span().start,
                        "`match`/`not_match` examples are only checked for command rules",
                    ));
                }
                if policy.rule_matches_script(&rule, example.get_ref()) != should_match {
                    return Err(map.bad_value(
                        example.span().start,
                        format!(
                            "the example `{}` {} this rule, but it is listed under `{}`",
                            example.get_ref(),
                            if should_match {
                                "does not match"
                            } else {
                                "matches"
                            },
                            if should_match { "match" } else { "not_match" }
                        ),
                    ));
                }
            }
        }
        policy.rules.push(rule);
    }
    Ok(policy)
}

fn check_tool(item: &Spanned<String>, map: &SourceMap) -> Result<(), PolicyError> {
    if KNOWN_TOOLS.contains(&item.get_ref().as_str()) {
        Ok(())
    } else {
        Err(map.bad_value(
            item.span().start,
            format!(
                "unknown tool `{}`; known tools: {}",
                item.get_ref(),
                KNOWN_TOOLS.join(", ")
            ),
        ))
    }
}

fn compile_limits(
    raw: Option<crate::format::RawLimits>,
    map: &SourceMap,
) -> Result<Limits, PolicyError> {
    let mut limits = Limits::default();
    let Some(raw) = raw else {
        return Ok(limits);
    };
    let crate::format::RawLimits {
        timeout,
        max_timeout,
        memory,
        pids,
        cpus,
        file_size,
        open_files,
        cpu_time,
        edit_file_size,
        spill,
        spill_session,
    } = raw;
    let timeout_value = timeout
        .as_ref()
        .map(|t| seconds(t, map, "timeout"))
        .transpose()?;
    let max_value = max_timeout
        .as_ref()
        .map(|t| seconds(t, map, "max_timeout"))
        .transpose()?;
    match (timeout_value, max_value) {
        (Some(timeout), Some(max)) => {
            if max < timeout {
                let offset = max_timeout.as_ref().map_or(0, |m| m.span().start);
                return Err(map.bad_value(
                    offset,
                    format!(
                        "`max_timeout` ({}s) is below `timeout` ({}s)",
                        max.as_secs_f64(),
                        timeout.as_secs_f64()
                    ),
                ));
            }
            limits.default_timeout = timeout;
            limits.max_timeout = max;
        }
        (Some(timeout), None) => {
            limits.default_timeout = timeout;
            limits.max_timeout = limits.max_timeout.max(timeout);
        }
        (None, Some(max)) => {
            limits.max_timeout = max;
            limits.default_timeout = limits.default_timeout.min(max);
        }
        (None, None) => {}
    }
    let positive =
        |value: &Spanned<crate::format::ByteSize>, key: &str| -> Result<Option<u64>, PolicyError> {
            match value.get_ref().0 {
                Some(0) => Err(map.bad_value(
                    value.span().start,
                    format!("`{key}` must be above zero (or \"unlimited\")"),
                )),
                other => Ok(other),
            }
        };
    if let Some(memory) = &memory {
        limits.memory_bytes = positive(memory, "memory")?;
    }
    if let Some(file_size) = &file_size {
        limits.file_size_bytes = positive(file_size, "file_size")?;
    }
    if let Some(edit_file_size) = &edit_file_size {
        limits.edit_file_bytes = positive(edit_file_size, "edit_file_size")?;
    }
    if let Some(spill) = &spill {
        limits.spill_bytes = positive(spill, "spill")?;
    }
    if let Some(spill_session) = &spill_session {
        limits.spill_session_bytes = positive(spill_session, "spill_session")?;
    }
    let count = |value: &Spanned<crate::format::Count>, key: &str| -> Result<u64, PolicyError> {
        match value.get_ref().0 {
            0 => Err(map.bad_value(value.span().start, format!("`{key}` must be above zero"))),
            other => Ok(other),
        }
    };
    if let Some(pids) = &pids {
        limits.pids = Some(count(pids, "pids")?);
    }
    if let Some(open_files) = &open_files {
        limits.open_files = Some(count(open_files, "open_files")?);
    }
    if let Some(cpu_time) = &cpu_time {
        limits.cpu_time_secs = Some(count(cpu_time, "cpu_time")?);
    }
    if let Some(cpus) = &cpus {
        let value = cpus.get_ref().0;
        if !(value.is_finite() && value > 0.0) {
            return Err(map.bad_value(
                cpus.span().start,
                format!("`cpus` must be a positive number, found {value}"),
            ));
        }
        limits.cpus = Some(value);
    }
    Ok(limits)
}

type CompiledRedact = (Vec<(String, usize)>, Vec<String>);

fn compile_redact(
    redact: Option<crate::format::RawRedact>,
    map: &SourceMap,
    env: &EnvMap,
    notes: &mut Vec<String>,
) -> Result<CompiledRedact, PolicyError> {
    let mut patterns = Vec::new();
    let mut literals = Vec::new();
    let Some(redact) = redact else {
        return Ok((patterns, literals));
    };
    for pattern in redact.patterns.iter().flat_map(|list| list.get_ref()) {
        let offset = pattern.span().start;
        let text = pattern.get_ref();
        if text.len() > MAX_PATTERN_BYTES {
            return Err(map.bad_regex(
                offset,
                &text.chars().take(64).collect::<String>(),
                format!("the pattern is longer than {MAX_PATTERN_BYTES} bytes"),
            ));
        }
        // Parsed, not compiled: every pattern is compiled once, into the redactor's single
        // alternation; loading a policy (paid by every `cordon exec`) builds no automaton.
        let hir = regex_syntax::Parser::new()
            .parse(text)
            .map_err(|error| map.bad_regex(offset, text, error.to_string()))?;
        if hir.properties().minimum_len() == Some(0) {
            return Err(map.bad_regex(
                offset,
                text,
                "the pattern matches the empty string, so it would redact everywhere".to_owned(),
            ));
        }
        patterns.push((text.clone(), offset));
    }
    for name in redact.env.iter().flat_map(|list| list.get_ref()) {
        let name_text = name.get_ref();
        if !is_variable_name(name_text) {
            return Err(map.bad_value(
                name.span().start,
                format!("`{name_text}` is not a valid environment variable name"),
            ));
        }
        match env.get(name_text) {
            None => notes.push(format!(
                "redact.env: {name_text} is not set in the host environment; nothing to redact for it"
            )),
            Some(value) if value.is_empty() => notes.push(format!(
                "redact.env: {name_text} is empty; nothing to redact for it"
            )),
            Some(value) if value.chars().count() < MIN_ENV_VALUE_CHARS => notes.push(format!(
                "redact.env: the value of {name_text} is shorter than {MIN_ENV_VALUE_CHARS} characters and is not redacted (it would mangle ordinary output)"
            )),
            Some(value) => literals.push(value.clone()),
        }
    }
    Ok((patterns, literals))
}

fn compile_rule(
    raw: &Spanned<RawRule>,
    map: &SourceMap,
    file: &Arc<str>,
) -> Result<Rule, PolicyError> {
    let start = raw.span().start;
    let RawRule {
        tool,
        command,
        path,
        decision,
        reason,
        match_examples: _,
        not_match: _,
    } = raw.get_ref();
    let at = RuleRef {
        file: file.clone(),
        line: map.line(start),
    };
    let decision_value = Decision::parse(decision.get_ref()).ok_or_else(|| {
        map.bad_value(
            decision.span().start,
            format!(
                "`decision` must be \"allow\", \"ask\" or \"deny\", found \"{}\"",
                decision.get_ref()
            ),
        )
    })?;
    let tools = match tool {
        None => None,
        Some(tool) => {
            let names: Vec<Spanned<String>> = match tool.get_ref() {
                OneOrMany::One(name) => vec![Spanned::new(tool.span(), name.clone())],
                OneOrMany::Many(names) => names.clone(),
            };
            if names.is_empty() {
                return Err(map.bad_value(tool.span().start, "`tool` must name at least one tool"));
            }
            for name in &names {
                check_tool(name, map)?;
            }
            Some(
                names
                    .into_iter()
                    .map(Spanned::into_inner)
                    .collect::<Vec<String>>(),
            )
        }
    };
    let tool_offset = tool.as_ref().map_or(start, |t| t.span().start);
    let kind = match (command, path) {
        (Some(_), Some(path)) => {
            return Err(map.bad_value(
                path.span().start,
                "a rule has either `command` (bash) or `path` (file tools), not both",
            ));
        }
        (Some(command), None) => {
            if let Some(tools) = &tools
                && tools.iter().any(|t| t != "bash")
            {
                return Err(
                    map.bad_value(tool_offset, "`command` rules apply to the bash tool only")
                );
            }
            let CommandPattern(tokens) = command.get_ref();
            if tokens.is_empty() {
                return Err(map.bad_value(
                    command.span().start,
                    "`command` must name at least the program",
                ));
            }
            for token in tokens {
                if token.is_empty() || token.iter().any(String::is_empty) {
                    return Err(map.bad_value(
                        command.span().start,
                        "`command` words and alternatives must not be empty",
                    ));
                }
            }
            if tokens[0].iter().any(|program| program.contains('/')) {
                return Err(map.bad_value(
                    command.span().start,
                    "the program in `command` is matched by name; write `git`, not `/usr/bin/git`",
                ));
            }
            RuleKind::Command(tokens.clone())
        }
        (None, Some(path)) => {
            if let Some(tools) = &tools
                && let Some(bad) = tools.iter().find(|t| !PATH_TOOLS.contains(&t.as_str()))
            {
                return Err(map.bad_value(
                    tool_offset,
                    format!(
                        "`path` rules apply to file tools ({}), not `{bad}`",
                        PATH_TOOLS.join(", ")
                    ),
                ));
            }
            let globs = match path.get_ref() {
                OneOrMany::One(text) => vec![PathGlob::compile(text, path.span().start, map)?],
                OneOrMany::Many(items) => items
                    .iter()
                    .map(|item| PathGlob::compile(item.get_ref(), item.span().start, map))
                    .collect::<Result<Vec<_>, _>>()?,
            };
            if globs.is_empty() {
                return Err(map.bad_value(path.span().start, "`path` must list at least one glob"));
            }
            RuleKind::Path(globs)
        }
        (None, None) => {
            if tools.is_none() {
                return Err(map.bad_value(start, "a rule needs `tool`, `command` or `path`"));
            }
            RuleKind::Tool
        }
    };
    Ok(Rule {
        at,
        tools,
        kind,
        decision: decision_value,
        reason: reason.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(script: &str) -> SimpleCommand {
        shell::analyse_script(script).commands.remove(0)
    }

    fn pattern(words: &[&str]) -> Vec<Vec<String>> {
        words.iter().map(|w| vec![(*w).to_owned()]).collect()
    }

    #[test]
    fn prefix_matching_for_allow_rules() {
        let p = pattern(&["cargo", "test"]);
        assert_eq!(match_prefix(&p, &command("cargo test --all")), Match::Yes);
        assert_eq!(match_prefix(&p, &command("cargo build")), Match::No);
        assert_eq!(match_prefix(&p, &command("cargo")), Match::No);
        assert_eq!(match_prefix(&p, &command("cargo $x")), Match::Maybe);
        assert_eq!(match_prefix(&p, &command("cargo test $x")), Match::Yes);
        assert_eq!(match_prefix(&p, &command("xargs cargo")), Match::Maybe);
        let alternatives = vec![
            vec!["cargo".to_owned()],
            vec!["test".to_owned(), "build".to_owned()],
        ];
        assert_eq!(
            match_prefix(&alternatives, &command("cargo build")),
            Match::Yes
        );
    }

    #[test]
    fn in_order_matching_for_deny_rules() {
        let p = pattern(&["git", "push"]);
        assert_eq!(match_in_order(&p, &command("git push")), Match::Yes);
        assert_eq!(
            match_in_order(&p, &command("git -C . push --force")),
            Match::Yes
        );
        assert_eq!(match_in_order(&p, &command("git status")), Match::No);
        assert_eq!(match_in_order(&p, &command("git $x")), Match::Maybe);
        assert_eq!(
            match_in_order(&p, &command("echo push | xargs git")),
            Match::No
        );
        let analysis = shell::analyse_script("echo push | xargs git");
        assert_eq!(match_in_order(&p, &analysis.commands[1]), Match::Maybe);
        assert_eq!(
            match_in_order(&pattern(&["git"]), &command("git")),
            Match::Yes
        );
    }
}
