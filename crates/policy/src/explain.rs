//! What `cordon policy check FILE`, `cordon policy explain FILE TOOL ARGS_JSON` and `cordon
//! policy explain FILE net HOST[:PORT]` print, as library functions; the CLI only prints their
//! text (or JSON) and picks the exit code.

use std::path::{Path, PathBuf};

use cordon_core::sandbox::NetworkMode;
use cordon_egress::rules::{Decision as EgressDecision, Host, suggested_entry};
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
            NetworkMode::Disabled => "disabled".to_owned(),
            NetworkMode::Enabled => "enabled".to_owned(),
            NetworkMode::Filtered if spec.egress.ask.is_empty() => format!(
                "filtered: {} allow and {} deny entries",
                spec.egress.allow.len(),
                spec.egress.deny.len()
            ),
            NetworkMode::Filtered => format!(
                "filtered: {} allow, {} deny and {} ask entries",
                spec.egress.allow.len(),
                spec.egress.deny.len(),
                spec.egress.ask.len()
            ),
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
    /// `net HOST[:PORT]` names no valid destination.
    #[error(
        "failed to parse destination {destination:?}: {reason}; write HOST, HOST:PORT or \
         [IPV6]:PORT"
    )]
    BadDestination {
        /// The destination as given (cut to a bounded excerpt).
        destination: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The policy's network lists do not compile (a policy that loaded always compiles).
    #[error("failed to compile the network lists: {0}")]
    Rules(#[source] cordon_egress::rules::RulesError),
}

/// The port `net HOST` means without one: HTTPS, what package managers use.
pub const NET_DEFAULT_PORT: u16 = 443;

/// Whether commands may reach one network destination, and what decides it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetExplanation {
    /// `allow` or `deny`.
    pub decision: Decision,
    /// `host:port` as judged (a name lowercased, an IPv6 address in brackets).
    pub destination: String,
    /// The network mode: `disabled`, `enabled` or `filtered`.
    pub network: &'static str,
    /// The deciding `[network] allow`/`deny` entry as written, if one decides.
    pub entry: Option<String>,
    /// Where the deciding setting is written: the entry's `FILE:LINE`, or `[network] enabled`'s
    /// (or where it would go) outside filtered mode; `None` when no entry allows it.
    pub source: Option<String>,
    /// Why, in words.
    pub reason: String,
    /// What to change in the policy to allow it, when it is denied.
    pub fix: Option<String>,
    /// What still applies when the connection is made (the proxy's address check for names).
    pub note: Option<String>,
}

impl NetExplanation {
    /// Human-readable lines, like the other explain forms: decision, rule, reason, then details.
    pub fn to_text(&self) -> String {
        let rule = match (&self.entry, &self.source) {
            (Some(entry), Some(source)) => format!("{entry:?} ({source})"),
            (Some(entry), None) => format!("{entry:?}"),
            (None, Some(source)) => format!("[network] enabled ({source})"),
            (None, None) => "no entry allows it".to_owned(),
        };
        let mut out = format!(
            "decision: {}\nrule: {rule}\nreason: {}\ndestination: {}\nnetwork: {}\n",
            self.decision, self.reason, self.destination, self.network
        );
        if let Some(fix) = &self.fix {
            out.push_str(&format!("fix: {fix}\n"));
        }
        if let Some(note) = &self.note {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }

    /// The JSON object `explain --json` prints.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|error| json!({ "error": error.to_string() }))
    }
}

/// Reads `HOST`, `HOST:PORT`, `[IPV6]`, `[IPV6]:PORT` or a bare IPv6 address.
fn parse_destination(text: &str) -> Result<(Host, u16), ExplainError> {
    let bad = |reason: String| ExplainError::BadDestination {
        destination: cordon_core::excerpt::excerpt(text).into_owned(),
        reason,
    };
    if text.is_empty() {
        return Err(bad("nothing was given".to_owned()));
    }
    // A name, brackets and a port fit; anything longer is not a destination.
    if text.len() > cordon_egress::rules::MAX_ENTRY_LEN {
        return Err(bad(format!(
            "it is {} bytes long, the limit is {}",
            text.len(),
            cordon_egress::rules::MAX_ENTRY_LEN
        )));
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| bad("`[` without `]`".to_owned()))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(bad(format!("unexpected {after:?} after `]`"))),
            },
        }
    } else {
        match text.matches(':').count() {
            0 => (text, None),
            1 => match text.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            },
            // More than one colon: an IPv6 address without a port.
            _ => (text, None),
        }
    };
    let port = match port {
        None => NET_DEFAULT_PORT,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => port,
            Ok(_) | Err(_) => {
                return Err(bad(format!(
                    "port {port:?} is not a number from 1 to 65535"
                )));
            }
        },
    };
    let host = Host::parse(host).map_err(|problem| bad(problem.to_string()))?;
    Ok((host, port))
}

/// Explain whether commands under `policy` may reach `destination` (`HOST[:PORT]`, port 443
/// when absent) and which setting decides, without connecting or resolving anything.
pub fn explain_net(
    policy: &CompiledPolicy,
    destination: &str,
) -> Result<NetExplanation, ExplainError> {
    let (host, port) = parse_destination(destination)?;
    let spec = policy.sandbox_spec();
    let judged = format!("{host}:{port}");
    let enabled_at = spec.sources.at(spec.sources.network);
    let suggested = suggested_entry(&host, port);
    let add = format!(
        "add {suggested:?} to [network] allow in {}",
        spec.sources.file
    );
    let explanation = match spec.network {
        NetworkMode::Disabled => NetExplanation {
            decision: Decision::Deny,
            destination: judged,
            network: "disabled",
            entry: None,
            source: Some(enabled_at),
            reason: "the network is off for commands: no destination is reachable".to_owned(),
            fix: Some(format!(
                "{add} (filtered mode: commands then reach only the listed destinations, \
                 through the egress proxy)"
            )),
            note: None,
        },
        NetworkMode::Enabled => NetExplanation {
            decision: Decision::Allow,
            destination: judged,
            network: "enabled",
            entry: None,
            source: Some(enabled_at),
            reason: "the network is on for commands (`enabled = true`): every destination is \
                     reachable, no allow list filters it"
                .to_owned(),
            fix: None,
            note: None,
        },
        NetworkMode::Filtered => {
            let rules = cordon_ops::egress_rules(&spec).map_err(ExplainError::Rules)?;
            let (decision, matched, reason, fix) = match rules.decide(&host, port) {
                EgressDecision::Allowed(matched) => {
                    let reason = format!("allow entry {matched} matches {judged}");
                    (Decision::Allow, Some(matched), reason, None)
                }
                EgressDecision::Denied(matched) => {
                    let reason = format!(
                        "deny entry {matched} matches {judged}, whatever the allow list says"
                    );
                    let fix = format!(
                        "remove or narrow that deny entry in [network] deny ({})",
                        matched.source
                    );
                    (Decision::Deny, Some(matched), reason, Some(fix))
                }
                EgressDecision::Ask(matched) => {
                    let reason = format!(
                        "ask entry {matched} matches {judged} and no allow or deny entry does: \
                         `cordon run` and the MCP server ask a person (once or for the rest of \
                         the session); everywhere else it is refused"
                    );
                    let fix = format!("{add} to reach it without asking");
                    (Decision::Ask, Some(matched), reason, Some(fix))
                }
                EgressDecision::NotAllowed => {
                    let reason = format!("no entry allows {judged}");
                    (Decision::Deny, None, reason, Some(add))
                }
            };
            let note = match (&host, decision) {
                (Host::Name(name), Decision::Allow | Decision::Ask) => Some(format!(
                    "the proxy resolves {name} when a command connects; an address in a \
                     loopback, private, link-local (cloud metadata) or other special range is \
                     refused unless an IP/CIDR allow entry covers it (DNS-rebinding defence)"
                )),
                (Host::Name(_) | Host::Ip(_), _) => None,
            };
            NetExplanation {
                decision,
                destination: judged,
                network: "filtered",
                entry: matched.as_ref().map(|m| m.entry.to_string()),
                source: matched.as_ref().map(|m| m.source.to_string()),
                reason,
                fix,
                note,
            }
        }
    };
    Ok(explanation)
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
