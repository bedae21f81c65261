//! What `cordon policy show` prints: every setting of a policy with its effective value and
//! where it comes from — the file's line, or `default` for a key the file leaves out — and
//! each `[[rules]]` entry with its line.
//!
//! It reads the policy's text only (the caller reads the file); values are shown as TOML.

use serde::Serialize;

use crate::PolicyError;
use crate::error::SourceMap;
use crate::policy::{CompiledPolicy, EnvMap};

/// One setting as `policy show` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShownSetting {
    /// Dotted key (`limits.memory`), or `rules[N]` (1-based) for a rule.
    pub key: String,
    /// The effective value as TOML (a default the format does not spell as TOML is described).
    pub value: String,
    /// 1-based line in the file, or `None` for a built-in default.
    pub line: Option<usize>,
}

/// Every key of the format with the value it has when the file leaves it out. `None`: the
/// default is not a TOML value (no limit, or the value of another key).
const DEFAULTS: &[(&str, Option<&str>)] = &[
    ("version", None),
    ("default", Some("\"allow\"")),
    (
        "tools.enabled",
        Some("[\"read\", \"edit\", \"write\", \"bash\", \"grep\", \"find\", \"ls\"]"),
    ),
    ("filesystem.read", Some("[\"**\"]")),
    ("filesystem.write", Some("[\"**\"]")),
    ("filesystem.deny", Some("[]")),
    ("filesystem.protect", Some("[\".git/**\", \".cordon/**\"]")),
    ("filesystem.nested_git", Some("\"quarantine\"")),
    ("network.enabled", Some("false")),
    ("network.allow", Some("[]")),
    ("network.deny", Some("[]")),
    ("network.unix_sockets", Some("[]")),
    ("limits.timeout", None),
    ("limits.max_timeout", None),
    ("limits.memory", Some("\"2GiB\"")),
    ("limits.pids", Some("512")),
    ("limits.cpus", Some("2.0")),
    ("limits.file_size", Some("\"unlimited\"")),
    ("limits.open_files", None),
    ("limits.cpu_time", None),
    ("limits.edit_file_size", Some("\"64MiB\"")),
    ("limits.spill", Some("\"256MiB\"")),
    ("limits.spill_session", Some("\"1GiB\"")),
    ("bash.unanalysable", None),
    ("env.pass", Some("[]")),
    ("env.set", Some("{}")),
    ("redact.patterns", Some("[]")),
    ("redact.env", Some("[]")),
];

/// The settings of the policy `text` (named `file` in errors), after checking that it
/// compiles: every key of the format in order, then the rules.
pub fn show_policy(file: &str, text: &str, env: &EnvMap) -> Result<Vec<ShownSetting>, PolicyError> {
    let policy = CompiledPolicy::from_toml(file, text, env)?;
    let map = SourceMap::new(file, text);
    let values: toml::Table = toml::from_str(text).map_err(|error| map.toml_error(&error, true))?;
    let spans = toml::de::DeTable::parse(text).map_err(|error| map.toml_error(&error, true))?;
    let spans = spans.get_ref();
    let mut shown = Vec::new();
    for &(key, default) in DEFAULTS {
        let (section, leaf) = match key.split_once('.') {
            Some((section, leaf)) => (Some(section), leaf),
            None => (None, key),
        };
        let value = match section {
            Some(section) => values
                .get(section)
                .and_then(|table| table.as_table())
                .and_then(|table| table.get(leaf)),
            None => values.get(leaf),
        };
        let line = key_offset(spans, section, leaf).map(|offset| map.line(offset));
        let value = match (value, default) {
            (Some(value), _) => value.to_string(),
            (None, Some(default)) => default.to_owned(),
            (None, None) => computed_default(key, &policy),
        };
        shown.push(ShownSetting {
            key: key.to_owned(),
            value,
            line,
        });
    }
    let rules = values.get("rules").and_then(|rules| rules.as_array());
    let rule_spans = spans
        .iter()
        .find(|(name, _)| name.get_ref().as_ref() == "rules")
        .and_then(|(_, value)| value.get_ref().as_array());
    for (index, rule) in rules.into_iter().flatten().enumerate() {
        let line = rule_spans
            .and_then(|spans| spans.get(index))
            .map(|span| map.line(span.span().start));
        shown.push(ShownSetting {
            key: format!("rules[{}]", index + 1),
            value: rule.to_string(),
            line,
        });
    }
    Ok(shown)
}

/// Byte offset of `section.leaf` (or top-level `leaf`) in the file, if it is there.
fn key_offset(spans: &toml::de::DeTable<'_>, section: Option<&str>, leaf: &str) -> Option<usize> {
    match section {
        None => find_key(spans, leaf).map(|(offset, _)| offset),
        Some(section) => {
            let (_, table) = find_key(spans, section)?;
            let table = table.get_ref().as_table()?;
            find_key(table, leaf).map(|(offset, _)| offset)
        }
    }
}

/// The offset of key `name` in `table` and its value.
fn find_key<'t, 'i>(
    table: &'t toml::de::DeTable<'i>,
    name: &str,
) -> Option<(usize, &'t toml::Spanned<toml::de::DeValue<'i>>)> {
    table
        .iter()
        .find(|(key, _)| key.get_ref().as_ref() == name)
        .map(|(key, value)| (key.span().start, value))
}

/// The effective value of a key whose default is not a fixed TOML value.
fn computed_default(key: &str, policy: &CompiledPolicy) -> String {
    let limits = policy.sandbox_spec().limits;
    match key {
        "limits.timeout" => format_seconds(limits.default_timeout.as_secs_f64()),
        "limits.max_timeout" => format_seconds(limits.max_timeout.as_secs_f64()),
        "bash.unanalysable" => format!("\"{}\" (same as `default`)", policy.default_decision()),
        "limits.open_files" | "limits.cpu_time" => "no limit".to_owned(),
        // `version` is required, so a compiled policy always has it.
        _ => "required".to_owned(),
    }
}

/// Seconds as TOML: an integer when whole.
fn format_seconds(seconds: f64) -> String {
    if seconds.fract() == 0.0 {
        format!("{}", seconds as u64)
    } else {
        format!("{seconds}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec and tools of `text`, to compare what two policies mean.
    fn meaning(text: &str) -> String {
        let policy = CompiledPolicy::from_toml("t.toml", text, &EnvMap::new())
            .unwrap_or_else(|error| panic!("{error}\n{text}"));
        // Where each value came from differs by construction; what it means must not.
        let mut spec = serde_json::to_value(policy.sandbox_spec()).unwrap();
        if let Some(object) = spec.as_object_mut() {
            object.remove("sources");
        }
        format!(
            "{:?} {:?} {:?}",
            spec,
            policy.enabled_tools(),
            policy.default_decision()
        )
    }

    #[test]
    fn every_literal_default_means_what_leaving_the_key_out_means() {
        let bare = meaning("version = 1\n");
        for &(key, default) in DEFAULTS {
            let (Some((section, leaf)), Some(default)) = (key.split_once('.'), default) else {
                continue;
            };
            let explicit = format!("version = 1\n[{section}]\n{leaf} = {default}\n");
            assert_eq!(meaning(&explicit), bare, "{key} = {default}");
        }
        let explicit = "version = 1\ndefault = \"allow\"\n";
        assert_eq!(meaning(explicit), bare);
    }

    #[test]
    fn set_keys_show_their_line_and_the_others_their_default() {
        let text = "version = 1\n\n[limits]\n# mine\nmemory = \"1GiB\"\ntimeout = 30\n\n\
                    [[rules]]\ncommand = [\"git\", \"push\"]\ndecision = \"deny\"\n";
        let shown = show_policy("p.toml", text, &EnvMap::new()).unwrap();
        let get = |key: &str| shown.iter().find(|s| s.key == key).unwrap().clone();
        assert_eq!(
            get("version"),
            ShownSetting {
                key: "version".into(),
                value: "1".into(),
                line: Some(1)
            }
        );
        assert_eq!(
            (get("limits.memory").value, get("limits.memory").line),
            ("\"1GiB\"".into(), Some(5))
        );
        assert_eq!(get("limits.timeout").line, Some(6));
        assert_eq!(
            (
                get("limits.max_timeout").value,
                get("limits.max_timeout").line
            ),
            ("1800".into(), None)
        );
        assert_eq!(
            (get("limits.pids").value, get("limits.pids").line),
            ("512".into(), None)
        );
        assert_eq!(
            get("bash.unanalysable").value,
            "\"allow\" (same as `default`)"
        );
        let rule = get("rules[1]");
        assert_eq!(rule.line, Some(8));
        assert!(rule.value.contains("decision = \"deny\""), "{}", rule.value);
        assert_eq!(shown.len(), DEFAULTS.len() + 1);
    }

    #[test]
    fn network_allow_and_deny_show_their_lines() {
        let text = "version = 1\n[network]\nallow = [\"crates.io\", \"*.crates.io\"]\n\
                    deny = [\"evil.crates.io\"]\n";
        let shown = show_policy("p.toml", text, &EnvMap::new()).unwrap();
        let get = |key: &str| {
            let s = shown.iter().find(|s| s.key == key).unwrap();
            (s.value.clone(), s.line)
        };
        assert_eq!(
            get("network.allow"),
            ("[\"crates.io\", \"*.crates.io\"]".into(), Some(3))
        );
        assert_eq!(
            get("network.deny"),
            ("[\"evil.crates.io\"]".into(), Some(4))
        );
        assert_eq!(get("network.enabled"), ("false".into(), None));
        let bare = show_policy("p.toml", "version = 1\n", &EnvMap::new()).unwrap();
        let allow = bare.iter().find(|s| s.key == "network.allow").unwrap();
        assert_eq!((allow.value.as_str(), allow.line), ("[]", None));
    }
}
