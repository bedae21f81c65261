//! Short quotations of model input in error texts.
//!
//! A model controls every argument, so an error that echoes one back must not grow with it: a
//! 50 MB pattern quoted in full would come back as a 50 MB result. This module owns the one rule
//! every echo follows (a prefix of [`EXCERPT_CHARS`] characters and the full size); it does not
//! decide where echoes happen.

use std::borrow::Cow;

use serde_json::Value;

/// Characters of model input quoted before the rest is elided.
pub const EXCERPT_CHARS: usize = 200;

/// Entries of one array or object shown by [`excerpt_value`] before the rest is summarised.
pub const EXCERPT_ENTRIES: usize = 32;

/// `text` itself when it has at most [`EXCERPT_CHARS`] characters, otherwise its first
/// [`EXCERPT_CHARS`] characters followed by `… (N bytes)` with the full size.
pub fn excerpt(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(EXCERPT_CHARS) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}… ({} bytes)", &text[..cut], text.len())),
    }
}

/// A copy of `value` fit for quoting: every string cut by [`excerpt`] (object keys too), and
/// arrays and objects cut to their first [`EXCERPT_ENTRIES`] entries with a note of how many
/// were left out. Nesting deeper than 16 levels is replaced by a note.
pub fn excerpt_value(value: &Value) -> Value {
    excerpt_at(value, 0)
}

fn excerpt_at(value: &Value, depth: usize) -> Value {
    const MAX_DEPTH: usize = 16;
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
        Value::String(text) => Value::String(excerpt(text).into_owned()),
        _ if depth >= MAX_DEPTH => Value::String("… (nested too deep to show)".to_owned()),
        Value::Array(items) => {
            let mut shown: Vec<Value> = items
                .iter()
                .take(EXCERPT_ENTRIES)
                .map(|item| excerpt_at(item, depth + 1))
                .collect();
            if items.len() > EXCERPT_ENTRIES {
                shown.push(Value::String(format!(
                    "… ({} more items)",
                    items.len() - EXCERPT_ENTRIES
                )));
            }
            Value::Array(shown)
        }
        Value::Object(entries) => {
            let mut shown: serde_json::Map<String, Value> = entries
                .iter()
                .take(EXCERPT_ENTRIES)
                .map(|(key, item)| (excerpt(key).into_owned(), excerpt_at(item, depth + 1)))
                .collect();
            if entries.len() > EXCERPT_ENTRIES {
                shown.insert(
                    "…".to_owned(),
                    Value::String(format!(
                        "{} more properties",
                        entries.len() - EXCERPT_ENTRIES
                    )),
                );
            }
            Value::Object(shown)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn short_text_is_quoted_whole() {
        assert_eq!(excerpt("src/main.rs"), "src/main.rs");
        let exact = "é".repeat(EXCERPT_CHARS);
        assert_eq!(excerpt(&exact), exact);
    }

    #[test]
    fn long_text_keeps_a_prefix_and_the_size() {
        let long = "ab".repeat(1_000_000);
        let quoted = excerpt(&long);
        assert_eq!(
            quoted,
            format!("{}… (2000000 bytes)", "ab".repeat(EXCERPT_CHARS / 2))
        );
        // Multi-byte characters are never split.
        let wide = "é".repeat(EXCERPT_CHARS + 1);
        assert_eq!(
            excerpt(&wide),
            format!("{}… ({} bytes)", "é".repeat(EXCERPT_CHARS), wide.len())
        );
    }

    #[test]
    fn values_are_cut_everywhere() {
        let long = "x".repeat(10_000);
        let many: Vec<u32> = (0..100).collect();
        let value = json!({"path": long, "list": many, "n": 3, long.clone(): true});
        let shown = excerpt_value(&value);
        let text = shown.to_string();
        assert!(text.len() < 2_000, "{}", text.len());
        assert_eq!(shown["n"], json!(3));
        assert_eq!(shown["list"].as_array().unwrap().len(), EXCERPT_ENTRIES + 1);
        assert_eq!(shown["list"][EXCERPT_ENTRIES], json!("… (68 more items)"));
        assert!(text.contains("… (10000 bytes)"));
    }

    #[test]
    fn deep_nesting_is_summarised() {
        let mut value = json!("leaf");
        for _ in 0..1_000 {
            value = json!([value]);
        }
        let text = excerpt_value(&value).to_string();
        assert!(text.contains("nested too deep"), "{text}");
        assert!(text.len() < 100, "{text}");
    }
}
