//! Output truncation shared by every tool (docs/semantics.md#truncation): head truncation for
//! file reads and searches, tail truncation for command output. Sizes are UTF-8 bytes; a
//! trailing newline never counts as an extra line; head truncation never yields half a line.

use serde::{Deserialize, Serialize};

/// Default line limit of every tool's output.
pub const DEFAULT_MAX_LINES: usize = 2000;
/// Default byte limit of every tool's output (formats as `50.0KB`).
pub const DEFAULT_MAX_BYTES: usize = 50 * 1024;
/// Longest grep line shown, in characters.
pub const GREP_MAX_LINE_CHARS: usize = 500;

/// Which limit cut the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TruncatedBy {
    /// The line limit.
    Lines,
    /// The byte limit.
    Bytes,
}

/// What a truncation kept and dropped; serialised into tools' `details.truncation`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Truncation {
    /// The kept text.
    pub content: String,
    /// Whether anything was dropped.
    pub truncated: bool,
    /// Which limit cut the output, when truncated.
    pub truncated_by: Option<TruncatedBy>,
    /// Lines in the input (a trailing newline does not start a line).
    pub total_lines: usize,
    /// Bytes in the input.
    pub total_bytes: usize,
    /// Lines kept.
    pub output_lines: usize,
    /// Bytes kept.
    pub output_bytes: usize,
    /// Tail only: the one kept line is the end of a longer line.
    pub last_line_partial: bool,
    /// Head only: the first line alone is over the byte limit, nothing was kept.
    pub first_line_exceeds_limit: bool,
    /// The line limit applied.
    pub max_lines: usize,
    /// The byte limit applied.
    pub max_bytes: usize,
}

/// Limits for [`truncate_head`] and [`truncate_tail`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Maximum lines kept.
    pub max_lines: usize,
    /// Maximum bytes kept.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_lines: DEFAULT_MAX_LINES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// Lines for counting: split on `\n`, one trailing empty element (from a final newline)
/// dropped. The empty string has zero lines.
pub fn split_lines_for_counting(content: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = content.split('\n').collect();
    if lines.last() == Some(&"") {
        lines.pop();
    }
    lines
}

/// Number of lines as [`split_lines_for_counting`] counts them.
pub fn count_lines(content: &str) -> usize {
    let newlines = memchr::memchr_iter(b'\n', content.as_bytes()).count();
    if content.is_empty() || content.ends_with('\n') {
        newlines
    } else {
        newlines + 1
    }
}

/// `1023B`, `50.0KB`, `1.5MB`: one decimal, rounded half up.
pub fn format_size(bytes: usize) -> String {
    const KIB: f64 = 1024.0;
    if bytes < 1024 {
        format!("{bytes}B")
    } else if bytes < 1024 * 1024 {
        format!("{:.1}KB", round1(bytes as f64 / KIB))
    } else {
        format!("{:.1}MB", round1(bytes as f64 / (KIB * KIB)))
    }
}

fn round1(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

/// Keep whole lines from the start until a limit is hit.
pub fn truncate_head(content: &str, limits: Limits) -> Truncation {
    let Limits {
        max_lines,
        max_bytes,
    } = limits;
    let total_bytes = content.len();
    let lines = split_lines_for_counting(content);
    let total_lines = lines.len();
    let mut result = Truncation {
        content: String::new(),
        truncated: false,
        truncated_by: None,
        total_lines,
        total_bytes,
        output_lines: total_lines,
        output_bytes: total_bytes,
        last_line_partial: false,
        first_line_exceeds_limit: false,
        max_lines,
        max_bytes,
    };
    if total_lines <= max_lines && total_bytes <= max_bytes {
        result.content = content.to_owned();
        return result;
    }
    result.truncated = true;
    if lines.first().is_some_and(|first| first.len() > max_bytes) {
        result.truncated_by = Some(TruncatedBy::Bytes);
        result.first_line_exceeds_limit = true;
        result.output_lines = 0;
        result.output_bytes = 0;
        return result;
    }
    let mut kept = 0;
    let mut bytes = 0;
    let mut by = TruncatedBy::Lines;
    for (index, line) in lines.iter().enumerate().take(max_lines) {
        let cost = line.len() + usize::from(index > 0);
        if bytes + cost > max_bytes {
            by = TruncatedBy::Bytes;
            break;
        }
        bytes += cost;
        kept += 1;
    }
    result.content = lines[..kept].join("\n");
    result.truncated_by = Some(by);
    result.output_lines = kept;
    result.output_bytes = bytes;
    result
}

/// Keep whole lines from the end until a limit is hit; if not even the last line fits, keep
/// its last `max_bytes` bytes, snapped forward to a character boundary.
pub fn truncate_tail(content: &str, limits: Limits) -> Truncation {
    let Limits {
        max_lines,
        max_bytes,
    } = limits;
    let total_bytes = content.len();
    let lines = split_lines_for_counting(content);
    let total_lines = lines.len();
    let mut result = Truncation {
        content: String::new(),
        truncated: false,
        truncated_by: None,
        total_lines,
        total_bytes,
        output_lines: total_lines,
        output_bytes: total_bytes,
        last_line_partial: false,
        first_line_exceeds_limit: false,
        max_lines,
        max_bytes,
    };
    if total_lines <= max_lines && total_bytes <= max_bytes {
        result.content = content.to_owned();
        return result;
    }
    result.truncated = true;
    let mut start = lines.len();
    let mut bytes = 0;
    let mut by = TruncatedBy::Lines;
    let mut partial: Option<&str> = None;
    while start > 0 && lines.len() - start < max_lines {
        let line = lines[start - 1];
        let cost = line.len() + usize::from(start < lines.len());
        if bytes + cost > max_bytes {
            by = TruncatedBy::Bytes;
            if start == lines.len() {
                let tail = tail_bytes_on_boundary(line, max_bytes);
                bytes = tail.len();
                partial = Some(tail);
            }
            break;
        }
        bytes += cost;
        start -= 1;
    }
    match partial {
        Some(tail) => {
            result.content = tail.to_owned();
            result.output_lines = 1;
            result.last_line_partial = true;
        }
        None => {
            result.content = lines[start..].join("\n");
            result.output_lines = lines.len() - start;
        }
    }
    result.truncated_by = Some(by);
    result.output_bytes = bytes;
    result
}

/// The last at most `max_bytes` bytes of `text`, starting on a character boundary.
pub fn tail_bytes_on_boundary(text: &str, max_bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(max_bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Cut a line to `max_chars` characters, marking the cut: `…... [truncated]`.
/// Returns the line and whether it was cut.
pub fn truncate_line(line: &str, max_chars: usize) -> (std::borrow::Cow<'_, str>, bool) {
    match line.char_indices().nth(max_chars) {
        Some((cut, _)) => (format!("{}... [truncated]", &line[..cut]).into(), true),
        None => (line.into(), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_lines: usize, max_bytes: usize) -> Limits {
        Limits {
            max_lines,
            max_bytes,
        }
    }

    #[test]
    fn utf8_bytes_are_counted() {
        assert_eq!("aé🙂\nb".len(), 9);
        let t = truncate_head("aé🙂\nb", limits(10, 100));
        assert_eq!((t.total_bytes, t.total_lines, t.truncated), (9, 2, false));
    }

    #[test]
    fn trailing_newline_is_not_a_line() {
        let text = "a\n".repeat(2000);
        let head = truncate_head(&text, Limits::default());
        assert!(!head.truncated);
        assert_eq!(head.total_lines, 2000);
        assert_eq!(head.content, text);
        let tail = truncate_tail(&text, Limits::default());
        assert!(!tail.truncated);
        assert_eq!(count_lines(&text), 2000);
        assert_eq!(count_lines(""), 0);
        assert_eq!(count_lines("x"), 1);
    }

    #[test]
    fn head_never_yields_partial_lines() {
        let t = truncate_head("éé\nabc", limits(10, 4));
        assert_eq!(t.content, "éé");
        assert_eq!(t.truncated_by, Some(TruncatedBy::Bytes));
        assert_eq!((t.output_lines, t.output_bytes), (1, 4));
    }

    #[test]
    fn head_first_line_over_limit_keeps_nothing() {
        let t = truncate_head(&"x".repeat(10), limits(10, 4));
        assert_eq!(t.content, "");
        assert!(t.first_line_exceeds_limit && t.truncated);
    }

    #[test]
    fn head_by_lines() {
        let text: String = (1..=2500).map(|i| format!("Line {i}\n")).collect();
        let t = truncate_head(&text, Limits::default());
        assert_eq!(t.truncated_by, Some(TruncatedBy::Lines));
        assert_eq!((t.total_lines, t.output_lines), (2500, 2000));
        assert!(t.content.ends_with("Line 2000"));
    }

    #[test]
    fn tail_partial_line_on_char_boundary() {
        let t = truncate_tail("aé🙂b", limits(10, 5));
        assert_eq!(t.content, "🙂b");
        assert!(t.last_line_partial);
    }

    #[test]
    fn tail_oversized_single_line_with_newline() {
        let text = format!("{}\n", "X".repeat(5000));
        let t = truncate_tail(&text, limits(10, 1024));
        assert_eq!(t.content, "X".repeat(1024));
        assert!(t.last_line_partial);
        assert_eq!(t.total_lines, 1);
    }

    #[test]
    fn tail_drops_oversized_trailing_character() {
        let t = truncate_tail("abc🙂", limits(10, 3));
        assert_eq!(t.content, "");
        assert!(t.last_line_partial);
    }

    #[test]
    fn tail_by_lines_keeps_last_lines() {
        let text: String = (1..=4000).map(|i| format!("line-{i}\n")).collect();
        let t = truncate_tail(&text, Limits::default());
        assert_eq!((t.total_lines, t.output_lines), (4000, 2000));
        assert!(t.content.starts_with("line-2001\n") && t.content.ends_with("line-4000"));
    }

    #[test]
    fn format_size_matches_reference() {
        assert_eq!(format_size(1023), "1023B");
        assert_eq!(format_size(51200), "50.0KB");
        assert_eq!(format_size(1280), "1.3KB");
        assert_eq!(format_size(60000), "58.6KB");
        assert_eq!(format_size(3 * 1024 * 1024 / 2), "1.5MB");
    }

    #[test]
    fn truncate_line_marks_cut() {
        assert_eq!(truncate_line("abc", 3), ("abc".into(), false));
        assert_eq!(
            truncate_line("abcd", 3),
            ("abc... [truncated]".into(), true)
        );
    }
}
