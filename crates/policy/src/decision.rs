//! Decisions as values: [`Decision`] (`Allow < Ask < Deny`, the strictest matching rule
//! wins), the [`PolicyDecision`] that carries the rule and a reason the model can read, and
//! the [`DecisionRequest`] the runtime builds for each tool call.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordon_ops::Op;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What happens to a tool call. Ordered by strictness: `Allow < Ask < Deny`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Run the call.
    Allow,
    /// A person must approve the call first; non-interactive entry points deny it
    /// ([`PolicyDecision::non_interactive`]).
    Ask,
    /// Do not run the call.
    Deny,
}

impl Decision {
    /// `"allow"`, `"ask"` or `"deny"`, as in the policy file and the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Ask => "ask",
            Decision::Deny => "deny",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Decision> {
        match text {
            "allow" => Some(Decision::Allow),
            "ask" => Some(Decision::Ask),
            "deny" => Some(Decision::Deny),
            _ => None,
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a decision comes from: a line of a policy file. Displays as `FILE:LINE`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuleRef {
    /// The policy file as given to the loader (`builtin:default.toml` for the built-in one).
    pub file: Arc<str>,
    /// 1-based line of the rule, glob or key that decided.
    pub line: usize,
}

impl fmt::Display for RuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

impl Serialize for RuleRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The outcome of judging one tool call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDecision {
    /// Allow, ask or deny.
    pub decision: Decision,
    /// The rule (file:line) that made the decision.
    pub rule: RuleRef,
    /// Why, written for the model: what was decided and what to do instead.
    pub reason: String,
    /// Set when part of a bash script could not be analysed (the audit log's
    /// `unanalysable` field); the call may still be allowed in `default = "allow"` mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unanalysable: Option<String>,
    /// When `decision` is `Ask`: every rule that asked about the call (a command chaining
    /// two asked-about programs is asked about by both). A person's "allow for this session"
    /// covers the call only when it covers each of them; empty means `rule` alone.
    #[serde(skip)]
    pub asked_by: Vec<RuleRef>,
}

impl PolicyDecision {
    /// The rules a person approves when they allow this `Ask` decision: [`Self::asked_by`],
    /// or [`Self::rule`] when that is empty.
    pub fn asking_rules(&self) -> &[RuleRef] {
        if self.asked_by.is_empty() {
            std::slice::from_ref(&self.rule)
        } else {
            &self.asked_by
        }
    }

    /// Map `Ask` to `Deny` for entry points that cannot ask a person (`exec`, `replay`, MCP,
    /// CI). `Allow` and `Deny` are returned unchanged.
    pub fn non_interactive(self) -> PolicyDecision {
        match self.decision {
            Decision::Allow | Decision::Deny => self,
            Decision::Ask => PolicyDecision {
                decision: Decision::Deny,
                reason: format!(
                    "approval required, but this session cannot ask a person, so the call was denied ({}). Do not retry it; ask the user to run it or to change the policy.",
                    self.reason
                ),
                ..self
            },
        }
    }

    /// The text a blocked model reads: `Blocked by policy (FILE:LINE): REASON`.
    pub fn block_message(&self) -> String {
        format!("Blocked by policy ({}): {}", self.rule, self.reason)
    }
}

/// A path a tool call touches, as the backend resolved it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PathAccess {
    /// The backend's canonical path (symlinks resolved; for a file that does not exist yet,
    /// its canonical parent joined with the name). Must be absolute.
    pub canonical: PathBuf,
    /// What the tool does there.
    pub op: Op,
}

/// Everything [`crate::CompiledPolicy::decide`] needs about one tool call.
#[derive(Clone, Copy, Debug)]
pub struct DecisionRequest<'a> {
    /// Tool name as the model called it.
    pub tool: &'a str,
    /// Arguments after preparation and validation.
    pub args: &'a Value,
    /// Canonical paths of the call (from `cordon_ops::paths_of`, resolved by the backend).
    pub paths: &'a [PathAccess],
    /// The workspace root, canonical.
    pub root: &'a Path,
    /// The backend's home directory, canonical, if known (needed for `~/` globs).
    pub home: Option<&'a Path>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_order_by_strictness() {
        assert!(Decision::Allow < Decision::Ask && Decision::Ask < Decision::Deny);
        assert_eq!(
            [Decision::Ask, Decision::Deny, Decision::Allow]
                .iter()
                .max(),
            Some(&Decision::Deny)
        );
    }

    #[test]
    fn ask_becomes_deny_when_nobody_can_answer() {
        let asked = PolicyDecision {
            decision: Decision::Ask,
            rule: RuleRef {
                file: "p.toml".into(),
                line: 3,
            },
            reason: "publishing needs a human".into(),
            unanalysable: None,
            asked_by: Vec::new(),
        };
        let denied = asked.clone().non_interactive();
        assert_eq!(denied.decision, Decision::Deny);
        assert_eq!(denied.rule, asked.rule);
        assert!(denied.reason.contains("approval required"));
        assert!(denied.reason.contains("publishing needs a human"));
        assert_eq!(
            denied.block_message(),
            format!("Blocked by policy (p.toml:3): {}", denied.reason)
        );
        let allowed = PolicyDecision {
            decision: Decision::Allow,
            ..asked
        };
        assert_eq!(allowed.clone().non_interactive(), allowed);
    }
}
