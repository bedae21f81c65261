//! Judging calls against a [`CompiledPolicy`]: [`CompiledPolicy::decide`] (paths, then the
//! bash script's simple commands, then tool rules; the strictest candidate wins and names its
//! rule) and [`CompiledPolicy::check_path`] for one path. Compiling is `compile`'s.

use std::path::Path;
use std::sync::Arc;

use cordon_ops::Op;
use cordon_ops::paths::normalize_lexically;
use serde_json::Value;

use super::{CompiledPolicy, Rule, RuleKind};

use crate::decision::{Decision, DecisionRequest, PathAccess, PolicyDecision, RuleRef};
use crate::glob::{Anchor, PathContext};
use crate::paths::is_path_tool;
use crate::shell::{self, ScriptAnalysis, SimpleCommand, Word};

/// How a command matches a pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Match {
    Yes,
    /// Only if run-time values (dynamic words, `xargs` input) turn out a certain way.
    Maybe,
    No,
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
    /// Every rule that asked, in the order considered: an `Ask` outcome is approved for the
    /// session only when all of them are, not only the one that explains it.
    asked_by: Vec<RuleRef>,
}

impl Judge {
    fn consider(&mut self, priority: u8, candidate: PolicyDecision) {
        if candidate.decision == Decision::Ask && !self.asked_by.contains(&candidate.rule) {
            self.asked_by.push(candidate.rule.clone());
        }
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
        asked_by: Vec::new(),
    }
}

impl CompiledPolicy {
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
                if let Some(held) = self
                    .session_protect
                    .iter()
                    .find(|p| p.glob.matches(path, context, true))
                {
                    return decided(
                        Decision::Deny,
                        &RuleRef {
                            file: Arc::from(held.rule),
                            line: 0,
                        },
                        format!(
                            "{verb} {shown} is not allowed: it is {}, which stays read-only for the whole session; do not try to change it another way",
                            held.what
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
        if is_path_tool(tool) {
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
        if decision.decision == Decision::Ask {
            decision.asked_by = judge.asked_by;
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
        // The shell runs this exact path: only `.` and `..` are collapsed, none of the
        // conveniences of a model's path argument (Unicode spaces, `@`, `file://`) apply.
        let absolute = normalize_lexically(&absolute);
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
    pub(super) fn rule_matches_script(&self, rule: &Rule, script: &str) -> bool {
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
