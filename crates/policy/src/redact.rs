//! `after_tool_call` redaction: regex patterns and the values of named host environment
//! variables are replaced by [`REDACTED`] in everything the model sees — every text block,
//! and every string (and object key) inside `details` and `structured_content`. The number
//! of replacements is noted in `details.redactions`.
//!
//! Environment values are taken once, at compile time, from a map the caller provides (not
//! from the process), so they are testable and a later change of the environment does not
//! silently weaken redaction. Values shorter than [`MIN_ENV_VALUE_CHARS`] are skipped with a
//! note: redacting `1` or `true` everywhere would destroy the output.

use cordon_core::hooks::ResultOverride;
use cordon_core::protocol::Content;
use cordon_core::tool::AgentToolResult;
use regex::{Regex, RegexBuilder};
use serde_json::{Map, Value};

/// What replaces a secret.
pub const REDACTED: &str = "[REDACTED]";

/// Environment values shorter than this many characters are not redacted.
pub const MIN_ENV_VALUE_CHARS: usize = 8;

/// Largest compiled redaction automaton (bytes): a pattern like `\w{1000}{1000}` is refused
/// when the policy loads instead of taking the memory it asks for.
pub const REGEX_SIZE_LIMIT: usize = 16 << 20;

/// A compiled set of secrets to remove.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    /// One alternation of every unanchored pattern and escaped env value; `None` when there
    /// is none.
    regex: Option<Regex>,
    /// One alternation of the patterns anchored at the start of a text (`\A…`), tried once
    /// at its start. Kept apart because a single branch that does not begin with a literal
    /// takes the literal prefilter away from the whole alternation, and every text would
    /// then be scanned byte by byte.
    anchored: Option<Regex>,
}

/// Whether every match of `pattern` starts at the start of a text (`\A…`, or `^…` without
/// multi-line mode). A pattern that does not parse is left with the others, whose compilation
/// reports it.
fn is_anchored(pattern: &str) -> bool {
    regex_syntax::Parser::new().parse(pattern).is_ok_and(|hir| {
        hir.properties()
            .look_set_prefix()
            .contains(regex_syntax::hir::Look::Start)
    })
}

fn compile(alternatives: &[String]) -> Result<Option<Regex>, regex::Error> {
    if alternatives.is_empty() {
        return Ok(None);
    }
    RegexBuilder::new(&alternatives.join("|"))
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map(Some)
}

impl Redactor {
    /// Build from patterns (already validated) and literal secret values.
    pub(crate) fn new(patterns: &[String], literals: &[String]) -> Result<Self, regex::Error> {
        let mut alternatives: Vec<String> = Vec::new();
        // Longer literals first so a value containing another is removed whole.
        let mut literals: Vec<&String> = literals.iter().collect();
        literals.sort_by_key(|literal| std::cmp::Reverse(literal.len()));
        literals.dedup();
        alternatives.extend(literals.iter().map(|literal| regex::escape(literal)));
        let (anchored, unanchored): (Vec<&String>, Vec<&String>) =
            patterns.iter().partition(|pattern| is_anchored(pattern));
        alternatives.extend(unanchored.iter().map(|pattern| format!("(?:{pattern})")));
        let anchored: Vec<String> = anchored
            .iter()
            .map(|pattern| format!("(?:{pattern})"))
            .collect();
        Ok(Redactor {
            regex: compile(&alternatives)?,
            anchored: compile(&anchored)?,
        })
    }

    /// Whether this redactor can change anything.
    pub fn is_empty(&self) -> bool {
        self.regex.is_none() && self.anchored.is_none()
    }

    /// Redact one text; returns the new text and the number of replacements.
    pub fn redact_text(&self, text: &str) -> (String, usize) {
        let mut count = 0;
        let mut out = String::new();
        let mut rest = text;
        if let Some(found) = self
            .anchored
            .as_ref()
            .and_then(|anchored| anchored.find(text))
            && found.start() == 0
            && !found.is_empty()
        {
            count += 1;
            out.push_str(REDACTED);
            rest = &text[found.end()..];
        }
        match &self.regex {
            Some(regex) => {
                let replaced = regex.replace_all(rest, |_: &regex::Captures<'_>| {
                    count += 1;
                    REDACTED
                });
                out.push_str(&replaced);
            }
            None => out.push_str(rest),
        }
        (out, count)
    }

    /// Redact every string and object key inside `value`, in place; returns the count.
    pub fn redact_value(&self, value: &mut Value) -> usize {
        if self.is_empty() {
            return 0;
        }
        match value {
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
            Value::String(text) => {
                let (new, count) = self.redact_text(text);
                if count > 0 {
                    *text = new;
                }
                count
            }
            Value::Array(items) => items.iter_mut().map(|item| self.redact_value(item)).sum(),
            Value::Object(map) => {
                let mut count = 0;
                let old = std::mem::take(map);
                let mut new = Map::with_capacity(old.len());
                for (key, mut item) in old {
                    let (key, key_count) = self.redact_text(&key);
                    count += key_count + self.redact_value(&mut item);
                    new.insert(key, item);
                }
                *map = new;
                count
            }
        }
    }

    /// The override an `after_tool_call` hook returns: `None` when nothing was redacted.
    /// Content, details and structured content are all replaced (structured content is
    /// kept, redacted, rather than cleared) and `details.redactions` holds the count. When
    /// `details` is not an object it is wrapped as `{"redactions": N, "details": …}`.
    pub fn redact_result(&self, result: &AgentToolResult) -> Option<ResultOverride> {
        if self.is_empty() {
            return None;
        }
        let mut count = 0;
        let content: Vec<Content> = result
            .content
            .iter()
            .map(|block| match block {
                Content::Text { text } => {
                    let (text, n) = self.redact_text(text);
                    count += n;
                    Content::Text { text }
                }
                Content::Image { .. } => block.clone(),
            })
            .collect();
        let mut details = result.details.clone();
        if let Some(details) = details.as_mut() {
            count += self.redact_value(details);
        }
        let mut structured = result.structured_content.clone();
        if let Some(structured) = structured.as_mut() {
            count += self.redact_value(structured);
        }
        if count == 0 {
            return None;
        }
        let details = match details {
            Some(Value::Object(mut map)) => {
                // Redactions the tool made itself (before truncating) add to these.
                let earlier = map.get("redactions").and_then(Value::as_u64).unwrap_or(0);
                map.insert("redactions".to_owned(), Value::from(earlier + count as u64));
                Value::Object(map)
            }
            None | Some(Value::Null) => serde_json::json!({ "redactions": count }),
            Some(other) => serde_json::json!({ "redactions": count, "details": other }),
        };
        Some(ResultOverride {
            content: Some(content),
            details: Some(Some(details)),
            structured_content: Some(structured),
            is_error: None,
            terminate: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patterns_and_literals_are_replaced_and_counted() {
        let redactor = Redactor::new(&["tok_[a-z]{4}".into()], &["s3cr3t-value".into()]).unwrap();
        let (text, count) = redactor.redact_text("a tok_abcd b s3cr3t-value c tok_zz");
        assert_eq!(text, "a [REDACTED] b [REDACTED] c tok_zz");
        assert_eq!(count, 2);
    }

    #[test]
    fn nested_values_and_keys_are_redacted() {
        let redactor = Redactor::new(&[], &["hunter2hunter2".into()]).unwrap();
        let mut value = json!({"a": ["x hunter2hunter2", {"hunter2hunter2": 1}], "n": 3});
        assert_eq!(redactor.redact_value(&mut value), 2);
        assert_eq!(
            value,
            json!({"a": ["x [REDACTED]", {"[REDACTED]": 1}], "n": 3})
        );
    }

    #[test]
    fn results_get_a_redaction_count_and_keep_structure() {
        let redactor = Redactor::new(&[], &["hunter2hunter2".into()]).unwrap();
        let result = AgentToolResult::text("out: hunter2hunter2")
            .with_structured_content(json!({"output": "hunter2hunter2", "exitCode": 0}))
            .with_details(json!({"fullOutputPath": "/tmp/x"}));
        let mut redacted = result.clone();
        redactor
            .redact_result(&result)
            .unwrap()
            .apply(&mut redacted);
        assert_eq!(redacted.content, vec![Content::text("out: [REDACTED]")]);
        assert_eq!(
            redacted.structured_content,
            Some(json!({"output": "[REDACTED]", "exitCode": 0}))
        );
        assert_eq!(
            redacted.details,
            Some(json!({"fullOutputPath": "/tmp/x", "redactions": 2}))
        );
        assert!(
            redactor
                .redact_result(&AgentToolResult::text("clean"))
                .is_none()
        );
        let odd = AgentToolResult::text("hunter2hunter2").with_details(json!("text details"));
        let mut odd_redacted = odd.clone();
        redactor
            .redact_result(&odd)
            .unwrap()
            .apply(&mut odd_redacted);
        assert_eq!(
            odd_redacted.details,
            Some(json!({"redactions": 1, "details": "text details"}))
        );
    }

    #[test]
    fn anchored_patterns_match_at_the_start_only_and_keep_the_prefilter() {
        let patterns = vec![
            "ghp_[A-Za-z0-9]{36,}".to_owned(),
            "\\A[A-Za-z0-9+/=\\s]*-----END [A-Z ]*PRIVATE KEY-----".to_owned(),
            // An alternation whose second branch is not anchored stays with the others.
            "\\Aonly-at-start|anywhere-[0-9]+".to_owned(),
        ];
        let redactor = Redactor::new(&patterns, &["s3cr3t-value".to_owned()]).unwrap();
        assert_eq!(
            redactor.anchored.as_ref().map(Regex::as_str),
            Some("(?:\\A[A-Za-z0-9+/=\\s]*-----END [A-Z ]*PRIVATE KEY-----)")
        );
        let token = format!("ghp_{}", "a".repeat(36));
        let text = format!(
            "QUJD\nREVG\n-----END RSA PRIVATE KEY-----\nkey {token} and s3cr3t-value, anywhere-42 only-at-start"
        );
        let (out, count) = redactor.redact_text(&text);
        assert_eq!(
            out,
            "[REDACTED]\nkey [REDACTED] and [REDACTED], [REDACTED] only-at-start"
        );
        assert_eq!(count, 4);
        // Not at the start: the anchored pattern does not apply.
        let (out, count) = redactor.redact_text("x: -----END RSA PRIVATE KEY-----");
        assert_eq!(
            (out.as_str(), count),
            ("x: -----END RSA PRIVATE KEY-----", 0)
        );
        let (out, count) = redactor.redact_text("only-at-start here");
        assert_eq!((out.as_str(), count), ("[REDACTED] here", 1));
        // Only anchored patterns: still a redactor.
        let only = Redactor::new(&patterns[1..2], &[]).unwrap();
        assert!(!only.is_empty());
        assert_eq!(
            only.redact_text("ab-----END EC PRIVATE KEY-----").0,
            "[REDACTED]"
        );
    }

    #[test]
    fn empty_redactor_changes_nothing() {
        let redactor = Redactor::new(&[], &[]).unwrap();
        assert!(redactor.is_empty());
        assert_eq!(redactor.redact_text("abc"), ("abc".to_owned(), 0));
        assert!(
            redactor
                .redact_result(&AgentToolResult::text("abc"))
                .is_none()
        );
    }
}
