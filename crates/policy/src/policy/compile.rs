//! Compiling a parsed policy file into a [`CompiledPolicy`]: defaults, tool enablement,
//! filesystem globs (and the OS-level view derived from them), rules, limits, network, unix
//! sockets and redaction, each checked with errors that name file, line and column; and
//! [`CompiledPolicy::protect_literal`], the runtime's session-long addition. Judging calls is
//! `decide`'s.

use std::sync::Arc;
use std::time::Duration;

use cordon_core::sandbox::{
    EgressSpec, EnvSpec, Limits, NestedGit, NetworkMode, RootAccess, SandboxSpec, SpecSources,
};
use cordon_ops::ToolKind;
use toml::Spanned;

use super::{CompiledPolicy, EnvMap, Rule, RuleKind, SessionProtect};
use crate::decision::{Decision, RuleRef};
use crate::error::{PolicyError, SourceMap};
use crate::format::{CommandPattern, OneOrMany, RawNetwork, RawPolicy, RawRule, SpannedList};
use crate::glob::{Anchor, PathGlob};
use crate::paths::tool_names;
use crate::redact::{MIN_ENV_VALUE_CHARS, Redactor};

impl CompiledPolicy {
    /// Keep `path` read-only for the session, as if the policy listed it under
    /// `[filesystem] protect`: the file tools are refused writes to it and commands see it
    /// read-only. `path` is relative to the workspace root or absolute, and is taken
    /// literally (a path holding glob characters is refused: it could not be protected
    /// exactly). The runtime uses it for the policy file itself when that lies in a writable
    /// root.
    pub fn protect_literal(&mut self, path: &str) -> Result<(), PolicyError> {
        self.protect_for_session(
            path,
            false,
            "builtin:policy-file",
            "the policy file this session runs with",
        )
    }

    /// Keep the directory `path` and everything under it read-only for the session, whether
    /// or not it exists yet (as [`CompiledPolicy::protect_literal`] does for a file). The
    /// runtime uses it for the directories later sessions read their policy and defaults from
    /// (the user's Cordon config directory) when they lie in a writable root.
    pub fn protect_config_dir(&mut self, path: &str) -> Result<(), PolicyError> {
        self.protect_for_session(
            path,
            true,
            "builtin:cordon-config",
            "Cordon's configuration, which later sessions read",
        )
    }

    fn protect_for_session(
        &mut self,
        path: &str,
        tree: bool,
        rule: &'static str,
        what: &'static str,
    ) -> Result<(), PolicyError> {
        let builtin = SourceMap::new(&self.file, "");
        if path.contains(['*', '?', '[', ']', '{', '}', '\\', '\n']) {
            return Err(builtin.bad_glob(
                0,
                path,
                "the path holds glob characters and cannot be protected literally; rename it"
                    .to_owned(),
            ));
        }
        let path = if tree {
            path.trim_end_matches('/')
        } else {
            path
        };
        let subtree = format!("{path}/**");
        let entries: &[&str] = if tree { &[path, &subtree] } else { &[path] };
        for entry in entries {
            let mut glob = PathGlob::compile(entry, 0, &builtin)?;
            glob.line = 0;
            if !self.spec.protected.iter().any(|known| known == entry) {
                self.spec.protected.push((*entry).to_owned());
                // Not a line of the file: Cordon protects it on its own.
                self.spec.sources.protected.push(0);
            }
            self.session_protect
                .push(SessionProtect { glob, rule, what });
        }
        Ok(())
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
        spec.sources.file = self.file.to_string();
        spec.sources.protected = self.protect.iter().map(|g| g.line).collect();
        spec.sources.denied = self.deny.iter().map(|g| g.line).collect();
        spec.sources.write = self.write_at.line;
        spec.allow_degraded = false;
    }
}

/// Longest redaction pattern a policy may give.
const MAX_PATTERN_BYTES: usize = 4096;

fn line_or_zero<T>(value: Option<&Spanned<T>>, map: &SourceMap) -> usize {
    value.map_or(0, |value| map.line(value.span().start))
}

/// The project's Cordon directory (policy and defaults later sessions read), always protected.
const PROJECT_CONFIG_GLOB: &str = ".cordon/**";

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

/// `[network]` as the sandbox sees it: the mode, the egress lists and their lines.
struct CompiledNetwork {
    mode: NetworkMode,
    enabled_line: usize,
    egress: EgressSpec,
    allow_lines: Vec<usize>,
    deny_lines: Vec<usize>,
    ask_lines: Vec<usize>,
    unix_sockets: Vec<String>,
}

/// `[network]`: `enabled`, `allow`, `deny`, `ask` and `unix_sockets` together.
///
/// A non-empty `allow` turns filtered mode on (commands reach the network only through the
/// egress proxy); an empty one is as if absent. `allow` with `enabled = true` is an error (the
/// network would be fully on and the list meaningless, or the list would silently win: the
/// operator says which); `deny` without a non-empty `allow` is an error (deny only narrows an
/// allow list), and so is `ask` (a destination to ask about is an addition to an allow list,
/// and filtered mode needs one to be on). Every entry is checked with the proxy's own parser, so what compiles here is
/// what the proxy enforces.
fn compile_network(
    raw: Option<RawNetwork>,
    map: &SourceMap,
) -> Result<CompiledNetwork, PolicyError> {
    let RawNetwork {
        enabled,
        allow,
        deny,
        ask,
        unix_sockets,
    } = raw.unwrap_or(RawNetwork {
        enabled: None,
        allow: None,
        deny: None,
        ask: None,
        unix_sockets: None,
    });
    let enabled_line = line_or_zero(enabled.as_ref(), map);
    let allow = allow.filter(|list| !list.get_ref().is_empty());
    let deny = deny.filter(|list| !list.get_ref().is_empty());
    let ask = ask.filter(|list| !list.get_ref().is_empty());
    let mode = match (&enabled, &allow) {
        (Some(on), Some(list)) if *on.get_ref() => {
            return Err(map.bad_value(
                list.span().start,
                format!(
                    "`allow` lists the only destinations commands may reach, but `enabled = true` \
                     (line {enabled_line}) turns the whole network on; remove `enabled = true` \
                     for filtered access through the egress proxy, or remove `allow` for \
                     unfiltered access"
                ),
            ));
        }
        (_, Some(_)) => NetworkMode::Filtered,
        (Some(on), None) if *on.get_ref() => NetworkMode::Enabled,
        (Some(_) | None, None) => NetworkMode::Disabled,
    };
    if let (Some(list), None) = (&deny, &allow) {
        return Err(map.bad_value(
            list.span().start,
            "`deny` only narrows an `allow` list: without one there is nothing to narrow \
             (the network is fully on or fully off); add `allow` with the destinations commands \
             may reach, or remove `deny`",
        ));
    }
    if let (Some(list), None) = (&ask, &allow) {
        return Err(map.bad_value(
            list.span().start,
            "`ask` adds destinations a person may approve to an `allow` list: without one the \
             network is fully on or fully off; add `allow` with the destinations commands may \
             always reach (filtered mode), or remove `ask`",
        ));
    }
    let (allow, allow_lines) = compile_egress_list(allow.as_ref(), "allow", map)?;
    let (deny, deny_lines) = compile_egress_list(deny.as_ref(), "deny", map)?;
    let (ask, ask_lines) = compile_egress_list(ask.as_ref(), "ask", map)?;
    let unix_sockets = compile_unix_sockets(unix_sockets.as_ref(), mode, map)?;
    Ok(CompiledNetwork {
        mode,
        enabled_line,
        egress: EgressSpec { allow, deny, ask },
        allow_lines,
        deny_lines,
        ask_lines,
        unix_sockets,
    })
}

/// One of `[network] allow`/`deny`/`ask`: each entry parsed as the egress proxy will parse it (an
/// error names its line and column and what is wrong), with its line; at most
/// [`cordon_egress::rules::MAX_ENTRIES`] entries.
fn compile_egress_list(
    raw: Option<&SpannedList>,
    key: &str,
    map: &SourceMap,
) -> Result<(Vec<String>, Vec<usize>), PolicyError> {
    let Some(list) = raw else {
        return Ok((Vec::new(), Vec::new()));
    };
    let max = cordon_egress::rules::MAX_ENTRIES;
    if list.get_ref().len() > max {
        return Err(map.bad_value(
            list.span().start,
            format!(
                "`{key}` has {} entries, the limit is {max}",
                list.get_ref().len()
            ),
        ));
    }
    let mut entries = Vec::new();
    let mut lines = Vec::new();
    for entry in list.get_ref() {
        let text = entry.get_ref();
        let line = map.line(entry.span().start);
        let label: Arc<str> = format!("{}:{line}", map.file()).into();
        if let Err(problem) = cordon_egress::rules::Entry::parse(text, label) {
            return Err(map.bad_value(
                entry.span().start,
                format!(
                    "network {key} entry {:?}: {problem}",
                    cordon_core::excerpt::excerpt(text)
                ),
            ));
        }
        entries.push(text.clone());
        lines.push(line);
    }
    Ok((entries, lines))
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
        NetworkMode::Enabled | NetworkMode::Filtered => {}
        NetworkMode::Disabled => {
            return Err(map.bad_value(
                list.span().start,
                "`unix_sockets` needs `enabled = true` or an `allow` list: with the network off \
                 no Unix socket can be connected; remove the list or turn the network on",
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

pub(super) fn compile(
    map: &SourceMap,
    raw: RawPolicy,
    env: &EnvMap,
) -> Result<CompiledPolicy, PolicyError> {
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
        None => ToolKind::ALL.iter().map(|t| t.name().to_owned()).collect(),
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
    let mut protect = compile_globs(fs_protect.as_ref(), &[".git/**", PROJECT_CONFIG_GLOB], map)?;
    // Later sessions read their policy and defaults from the project's `.cordon/`: a session
    // that could write there could choose the next session's policy. So it is protected
    // whatever the policy lists.
    if !protect
        .iter()
        .any(|glob| glob.source == PROJECT_CONFIG_GLOB)
    {
        let builtin = SourceMap::new(map.file(), "");
        let mut glob = PathGlob::compile(PROJECT_CONFIG_GLOB, 0, &builtin)?;
        glob.line = 0;
        protect.push(glob);
    }

    let CompiledNetwork {
        mode: network_mode,
        enabled_line: network_line,
        egress,
        allow_lines,
        deny_lines,
        ask_lines,
        unix_sockets,
    } = compile_network(network, map)?;

    let mut sources = SpecSources {
        network: network_line,
        egress_allow: allow_lines,
        egress_deny: deny_lines,
        egress_ask: ask_lines,
        ..SpecSources::default()
    };
    let limits = compile_limits(limits, map, &mut sources)?;

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
        egress,
        limits,
        env: env_spec,
        nested_git,
        sources,
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
    if ToolKind::from_name(item.get_ref()).is_some() {
        Ok(())
    } else {
        Err(map.bad_value(
            item.span().start,
            format!(
                "unknown tool `{}`; known tools: {}",
                item.get_ref(),
                tool_names(|_| true)
            ),
        ))
    }
}

fn compile_limits(
    raw: Option<crate::format::RawLimits>,
    map: &SourceMap,
    sources: &mut SpecSources,
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
    sources.timeout = line_or_zero(timeout.as_ref(), map);
    sources.max_timeout = line_or_zero(max_timeout.as_ref(), map);
    sources.memory = line_or_zero(memory.as_ref(), map);
    sources.pids = line_or_zero(pids.as_ref(), map);
    sources.file_size = line_or_zero(file_size.as_ref(), map);
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
                && let Some(bad) = tools.iter().find(|t| !crate::paths::is_path_tool(t))
            {
                return Err(map.bad_value(
                    tool_offset,
                    format!(
                        "`path` rules apply to file tools ({}), not `{bad}`",
                        tool_names(ToolKind::takes_paths)
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
