//! The policy file as written (docs/contract.md#policy-file; every key in policies/README.md):
//! serde structs with `deny_unknown_fields` and `toml::Spanned` values, so every semantic error can
//! name the line and column it comes from. Nothing here interprets a value; `compile` does.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use toml::Spanned;

/// A list of strings with the span of each element.
pub(crate) type SpannedList = Spanned<Vec<Spanned<String>>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub version: Spanned<i64>,
    #[serde(default)]
    pub default: Option<Spanned<String>>,
    #[serde(default)]
    pub tools: Option<RawTools>,
    #[serde(default)]
    pub filesystem: Option<RawFilesystem>,
    #[serde(default)]
    pub network: Option<RawNetwork>,
    #[serde(default)]
    pub limits: Option<RawLimits>,
    #[serde(default)]
    pub bash: Option<RawBash>,
    #[serde(default)]
    pub env: Option<RawEnv>,
    #[serde(default)]
    pub rules: Vec<Spanned<RawRule>>,
    #[serde(default)]
    pub redact: Option<RawRedact>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTools {
    pub enabled: Option<SpannedList>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFilesystem {
    pub read: Option<SpannedList>,
    pub write: Option<SpannedList>,
    pub deny: Option<SpannedList>,
    pub protect: Option<SpannedList>,
    pub nested_git: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNetwork {
    pub enabled: Option<Spanned<bool>>,
    pub allow: Option<SpannedList>,
    pub deny: Option<SpannedList>,
    pub ask: Option<SpannedList>,
    pub unix_sockets: Option<SpannedList>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub timeout: Option<Spanned<Seconds>>,
    pub max_timeout: Option<Spanned<Seconds>>,
    pub memory: Option<Spanned<ByteSize>>,
    pub pids: Option<Spanned<Count>>,
    pub cpus: Option<Spanned<Seconds>>,
    pub file_size: Option<Spanned<ByteSize>>,
    pub open_files: Option<Spanned<Count>>,
    pub cpu_time: Option<Spanned<Count>>,
    pub edit_file_size: Option<Spanned<ByteSize>>,
    pub spill: Option<Spanned<ByteSize>>,
    pub spill_session: Option<Spanned<ByteSize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBash {
    pub unanalysable: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnv {
    pub pass: Option<SpannedList>,
    pub set: Option<BTreeMap<String, Spanned<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    pub tool: Option<Spanned<OneOrMany>>,
    pub command: Option<Spanned<CommandPattern>>,
    pub path: Option<Spanned<OneOrMany>>,
    pub decision: Spanned<String>,
    pub reason: Option<String>,
    #[serde(rename = "match")]
    pub match_examples: Option<SpannedList>,
    pub not_match: Option<SpannedList>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedact {
    pub patterns: Option<SpannedList>,
    pub env: Option<SpannedList>,
}

/// A number of seconds (or CPUs): integer or float.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seconds(pub f64);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Seconds;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seconds, E> {
                Ok(Seconds(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seconds, E> {
                Ok(Seconds(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Seconds, E> {
                Ok(Seconds(v))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A non-negative integer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                u64::try_from(v)
                    .map(Count)
                    .map_err(|_| E::custom(format!("expected a non-negative integer, found {v}")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                Ok(Count(v))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A size in bytes: an integer, or a string such as `"512MiB"`, `"2GiB"`, `"1G"`,
/// `"1500MB"`; `"unlimited"` means no limit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ByteSize(pub Option<u64>);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size in bytes (integer) or a string such as \"2GiB\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(|v| ByteSize(Some(v)))
                    .map_err(|_| E::custom(format!("expected a non-negative size, found {v}")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(Some(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_size(v).map(ByteSize).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// Parse `"512MiB"`-style sizes. Binary units: `K`, `KiB`, `M`, `MiB`, `G`, `GiB`, `T`,
/// `TiB`; decimal: `KB`, `MB`, `GB`, `TB`; `B` or no unit: bytes.
pub(crate) fn parse_size(text: &str) -> Result<Option<u64>, String> {
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let bad = || {
        format!("expected a size such as \"512MiB\", \"2GiB\" or \"unlimited\", found \"{text}\"")
    };
    let number: f64 = number.parse().map_err(|_| bad())?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "Ki" => 1 << 10,
        "M" | "m" | "MiB" | "Mi" => 1 << 20,
        "G" | "g" | "GiB" | "Gi" => 1 << 30,
        "T" | "t" | "TiB" | "Ti" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    let bytes = number * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(Some(bytes.round() as u64))
}

/// A string or a list of strings (`tool = "bash"` or `tool = ["edit", "write"]`).
#[derive(Debug)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<Spanned<String>>),
}

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany::One(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OneOrMany, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Spanned<String>>()? {
                    items.push(item);
                }
                Ok(OneOrMany::Many(items))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A command pattern: `"git push"` (split on whitespace) or `["git", "push"]`, where each
/// element may itself be a list of alternatives: `["cargo", ["test", "build"]]`.
#[derive(Debug)]
pub(crate) struct CommandPattern(pub Vec<Vec<String>>);

impl<'de> Deserialize<'de> for CommandPattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Token(Vec<String>);
        impl<'de> Deserialize<'de> for Token {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = Token;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a word or a list of alternative words")
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<Token, E> {
                        Ok(Token(vec![v.to_owned()]))
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Token, A::Error> {
                        let mut items = Vec::new();
                        while let Some(item) = seq.next_element::<String>()? {
                            items.push(item);
                        }
                        Ok(Token(items))
                    }
                }
                deserializer.deserialize_any(V)
            }
        }

        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CommandPattern;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a command as a string or a list of words")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CommandPattern, E> {
                Ok(CommandPattern(
                    v.split_whitespace()
                        .map(|word| vec![word.to_owned()])
                        .collect(),
                ))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CommandPattern, A::Error> {
                let mut tokens = Vec::new();
                while let Some(Token(token)) = seq.next_element::<Token>()? {
                    tokens.push(token);
                }
                Ok(CommandPattern(tokens))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("2GiB"), Ok(Some(2 << 30)));
        assert_eq!(parse_size("2G"), Ok(Some(2 << 30)));
        assert_eq!(parse_size("512 MiB"), Ok(Some(512 << 20)));
        assert_eq!(parse_size("1.5K"), Ok(Some(1536)));
        assert_eq!(parse_size("1500MB"), Ok(Some(1_500_000_000)));
        assert_eq!(parse_size("100"), Ok(Some(100)));
        assert_eq!(parse_size("unlimited"), Ok(None));
        assert!(parse_size("2 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn command_patterns_accept_strings_lists_and_alternatives() {
        #[derive(Deserialize)]
        struct T {
            c: CommandPattern,
        }
        let parsed: T = toml::from_str(r#"c = "git  push""#).unwrap();
        assert_eq!(parsed.c.0, vec![vec!["git"], vec!["push"]]);
        let parsed: T = toml::from_str(r#"c = ["cargo", ["test", "build"]]"#).unwrap();
        assert_eq!(
            parsed.c.0,
            vec![
                vec!["cargo".to_owned()],
                vec!["test".into(), "build".into()]
            ]
        );
    }
}
