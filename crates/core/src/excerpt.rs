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

/// What one [`excerpt_value`] shows in all, in characters of strings and keys plus
/// [`ENTRY_COST`] per entry; past it, the remaining entries of each array or object are only
/// counted. (Per-level limits alone still let a few nested levels of 32 quote megabytes.)
pub const EXCERPT_TOTAL_CHARS: usize = 4_000;

/// What one shown entry costs out of [`EXCERPT_TOTAL_CHARS`] besides its text: roughly its
/// JSON punctuation and pretty-printed indentation.
const ENTRY_COST: usize = 16;

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
/// were left out, and to what fits in [`EXCERPT_TOTAL_CHARS`] overall. Nesting deeper than 16
/// levels is replaced by a note.
pub fn excerpt_value(value: &Value) -> Value {
    let mut budget = EXCERPT_TOTAL_CHARS;
    excerpt_at(value, 0, &mut budget)
}

/// Take `cost` from `budget`; false when nothing was left.
fn spend(budget: &mut usize, cost: usize) -> bool {
    if *budget == 0 {
        return false;
    }
    *budget = budget.saturating_sub(cost);
    true
}

fn excerpt_at(value: &Value, depth: usize, budget: &mut usize) -> Value {
    const MAX_DEPTH: usize = 16;
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
        Value::String(text) => {
            let shown = excerpt(text).into_owned();
            spend(budget, shown.chars().count());
            Value::String(shown)
        }
        _ if depth >= MAX_DEPTH => Value::String("… (nested too deep to show)".to_owned()),
        Value::Array(items) => {
            let mut shown: Vec<Value> = Vec::new();
            for item in items.iter().take(EXCERPT_ENTRIES) {
                if !spend(budget, ENTRY_COST) {
                    break;
                }
                shown.push(excerpt_at(item, depth + 1, budget));
            }
            if items.len() > shown.len() {
                shown.push(Value::String(format!(
                    "… ({} more items)",
                    items.len() - shown.len()
                )));
            }
            Value::Array(shown)
        }
        Value::Object(entries) => {
            let mut shown = serde_json::Map::new();
            for (key, item) in entries.iter().take(EXCERPT_ENTRIES) {
                let key = excerpt(key).into_owned();
                if !spend(budget, ENTRY_COST + key.chars().count()) {
                    break;
                }
                let item = excerpt_at(item, depth + 1, budget);
                shown.insert(key, item);
            }
            if entries.len() > shown.len() {
                shown.insert(
                    "…".to_owned(),
                    Value::String(format!("{} more properties", entries.len() - shown.len())),
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
    fn wide_nested_values_are_cut_to_the_total_budget() {
        // Four levels of 32 entries, each level within the per-level limit: 1M strings.
        let mut value = json!("w".repeat(300));
        for _ in 0..4 {
            value = Value::Array(vec![value; EXCERPT_ENTRIES]);
        }
        let text = serde_json::to_string_pretty(&excerpt_value(&value)).unwrap();
        assert!(text.len() < 3 * EXCERPT_TOTAL_CHARS, "{}", text.len());
        assert!(text.contains("more items)"), "{text}");
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
