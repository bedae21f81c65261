//! The text the model sees from `grep` and `find` (docs/semantics.md#grep, docs/semantics.md#find),
//! built once from the backends' structured results so every backend prints the same.
//!
//! It owns: paths relative to the search directory with `/` (the basename for a single-file
//! grep), `rel:N: text` / `rel-N- text` lines, defensive de-duplication of context lines, the
//! 500-character line cut, the 50 KiB byte cap, the limit notices (only when results were
//! really cut: callers ask the backend for one result more than they show), the note about
//! unreadable files, the `details` object, and the model-facing search errors. It does not
//! search (see [`cordon_ops::SearchOperations`]).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use cordon_core::excerpt::excerpt;
use cordon_ops::bounds::{MAX_PATH_CHARS, check_length};
use cordon_ops::paths::resolve_model_path;
use cordon_ops::{FileOperations, FindOutput, GrepFile, GrepLine, GrepOutput, SearchError};

use crate::truncate::{
    DEFAULT_MAX_BYTES, GREP_MAX_LINE_CHARS, Limits, format_size, truncate_head, truncate_line,
};

/// Matches shown by `grep` when the model gives no limit.
pub const DEFAULT_GREP_LIMIT: usize = 100;
/// Paths shown by `find` when the model gives no limit.
pub const DEFAULT_FIND_LIMIT: usize = 1000;
/// How many unreadable paths the note names before summarising the rest.
const UNREADABLE_NAMED: usize = 5;

/// Why a search call failed as a whole; the texts are read by the model.
#[derive(Debug, thiserror::Error)]
pub enum SearchToolError {
    /// The arguments do not have the documented shape.
    #[error("Invalid arguments for {tool}: {reason}")]
    InvalidArguments {
        /// `grep` or `find`.
        tool: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// An argument is longer than its bound (the text names it and the bound).
    #[error("{reason}")]
    Bounds {
        /// What is too long, and what to do.
        reason: String,
    },
    /// The search path does not exist.
    #[error("Path not found: {}", .path.display())]
    PathNotFound {
        /// The resolved path.
        path: PathBuf,
    },
    /// The search path is outside what the sandbox may read.
    #[error(
        "Path is outside the workspace: {}. Search inside the workspace root instead.",
        .path.display()
    )]
    OutsideRoot {
        /// The resolved path.
        path: PathBuf,
    },
    /// The regex or glob does not parse.
    #[error("Invalid {what} `{}`: {reason}. {hint}", excerpt(.pattern))]
    InvalidPattern {
        /// "regex" or "glob".
        what: &'static str,
        /// The pattern.
        pattern: String,
        /// Parser message.
        reason: String,
        /// What to do next.
        hint: &'static str,
    },
    /// The backend's transport failed.
    #[error("Search failed: the backend is unavailable ({reason}). Retry later.")]
    Backend {
        /// What the transport reported.
        reason: String,
    },
    /// The call was cancelled.
    #[error("Operation aborted")]
    Aborted,
}

impl SearchToolError {
    /// The model-facing form of a backend's [`SearchError`].
    pub fn from_search(error: SearchError) -> Self {
        match error {
            SearchError::PathNotFound { path } => SearchToolError::PathNotFound { path },
            SearchError::OutsideRoot { path } => SearchToolError::OutsideRoot { path },
            SearchError::InvalidPattern {
                what,
                pattern,
                reason,
            } => SearchToolError::InvalidPattern {
                hint: if what == "regex" {
                    "Fix the pattern, or set literal=true to search for the text as is."
                } else {
                    "Fix the glob pattern (e.g. '*.rs', '**/*.json', 'src/**/*.ts')."
                },
                what,
                pattern,
                // The text adds its own full stop.
                reason: reason.trim_end_matches('.').to_owned(),
            },
            SearchError::Backend { reason } => SearchToolError::Backend { reason },
            SearchError::Cancelled => SearchToolError::Aborted,
        }
    }
}

/// A formatted search result.
#[derive(Clone, Debug, PartialEq)]
pub struct Formatted {
    /// What the model reads.
    pub text: String,
    /// Limits hit and notes, for hosts; `None` when there is nothing to report.
    pub details: Option<Value>,
}

/// A limit from the model's arguments: `default` when absent, floored, at least 1.
pub fn effective_limit(requested: Option<f64>, default: usize) -> usize {
    match requested {
        Some(limit) if limit.is_finite() => {
            (limit.floor().max(1.0)).min(usize::MAX as f64) as usize
        }
        Some(_) | None => default,
    }
}

/// What grep and find handle the same way: parsing the model's arguments, the bounds of the
/// pattern and the path, the search path resolved against the workspace, and the limit.
pub(crate) struct SearchCall {
    /// `grep` or `find`.
    pub tool: &'static str,
    /// The bound of the pattern (a regex or a glob).
    pub pattern_max: usize,
    /// The limit when the model gives none.
    pub default_limit: usize,
}

impl SearchCall {
    /// The model's arguments as `A`, or an error naming the tool.
    pub fn parse<A: DeserializeOwned>(&self, args: Value) -> Result<A, SearchToolError> {
        serde_json::from_value(args).map_err(|error| SearchToolError::InvalidArguments {
            tool: self.tool,
            reason: excerpt(&error.to_string()).into_owned(),
        })
    }

    /// Check an optional argument against its bound.
    pub fn check(
        &self,
        name: &str,
        value: Option<&str>,
        max: usize,
    ) -> Result<(), SearchToolError> {
        check_length(self.tool, name, value.unwrap_or(""), max)
            .map_err(|reason| SearchToolError::Bounds { reason })
    }

    /// Check the pattern and the path, then resolve the path (default `.`) against the
    /// workspace of `files`: the search path and the effective limit.
    pub fn scope(
        &self,
        files: &dyn FileOperations,
        pattern: &str,
        path: Option<&str>,
        limit: Option<f64>,
    ) -> Result<(PathBuf, usize), SearchToolError> {
        self.check("pattern", Some(pattern), self.pattern_max)?;
        self.check("path", path, MAX_PATH_CHARS)?;
        let search_path = resolve_model_path(path.unwrap_or("."), files.root(), files.home());
        Ok((search_path, effective_limit(limit, self.default_limit)))
    }
}

/// A file name (or path) as the model sees it in listings: control characters and the
/// Unicode controls that reorder or hide text are escaped visibly (`\n`, `\r`, `\t`,
/// `\x1b`, `\u{202e}`), and `\` becomes `\\` so the escape is unambiguous. A name holding a
/// newline can therefore never pose as a separate entry of `ls`, `find` or `grep` output.
pub fn escape_name(name: &str) -> std::borrow::Cow<'_, str> {
    fn needs_escape(c: char) -> bool {
        c == '\\'
            || c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !name.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && needs_escape(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `path` relative to `base`, with `/` separators; `..` components where `path` is outside
/// `base`. Both are absolute, lexically normalised paths.
pub fn relative_path(path: &Path, base: &Path) -> String {
    if let Ok(rest) = path.strip_prefix(base) {
        return join_slash(rest.components());
    }
    let path_parts: Vec<Component> = path.components().collect();
    let base_parts: Vec<Component> = base.components().collect();
    let common = path_parts
        .iter()
        .zip(&base_parts)
        .take_while(|(a, b)| a == b)
        .count();
    let mut parts: Vec<String> = vec!["..".to_owned(); base_parts.len() - common];
    parts.extend(
        path_parts[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

fn join_slash<'a>(components: impl Iterator<Item = Component<'a>>) -> String {
    components
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// How grep names a file: relative to the search directory, or the basename when that is
/// empty (a single-file search) or leaves the directory.
pub fn grep_display_path(file: &Path, search_path: &Path) -> String {
    let relative = relative_path(file, search_path);
    if relative.is_empty() || relative == ".." || relative.starts_with("../") {
        file.file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or(relative)
    } else {
        relative
    }
}

/// Format a grep result showing at most `limit` matches.
pub fn format_grep(
    output: GrepOutput,
    search_path: &Path,
    limit: usize,
    context: usize,
) -> Formatted {
    let GrepOutput { files, errors } = output;
    let mut files = merge_files(files);
    let total_matches: usize = files
        .iter()
        .map(|f| f.lines.iter().filter(|l| l.is_match).count())
        .sum();
    // Judged before temp files are left out: the backend stopped at its cap either way.
    let match_limit_reached = total_matches > limit;
    files.retain(|file| !is_write_temp_file(&file.path));

    let mut lines: Vec<String> = Vec::new();
    let mut shown_matches = 0;
    let mut lines_truncated = false;
    'files: for file in &files {
        let name = grep_display_path(&file.path, search_path);
        let name = escape_name(&name);
        let mut last_match: Option<u64> = None;
        for line in &file.lines {
            if line.is_match {
                if shown_matches == limit {
                    // Cut here: keep only the trailing context of the last shown match.
                    break 'files;
                }
                shown_matches += 1;
                last_match = Some(line.number);
            } else if shown_matches == limit {
                let within = last_match.is_some_and(|m| line.number <= m + context as u64);
                if !within {
                    break 'files;
                }
            }
            let text = line.text.replace('\r', "");
            let (text, cut) = truncate_line(&text, GREP_MAX_LINE_CHARS);
            lines_truncated |= cut;
            let separator = if line.is_match { ':' } else { '-' };
            lines.push(format!(
                "{name}{separator}{}{separator} {text}",
                line.number
            ));
        }
        if shown_matches == limit && match_limit_reached {
            break;
        }
    }

    let mut details = Map::new();
    let mut notices = Vec::new();
    let unreadable = unreadable_note(&errors, search_path, "file(s)");
    if shown_matches == 0 {
        return finish(
            "No matches found".to_owned(),
            notices,
            unreadable,
            &errors,
            details,
        );
    }
    let text = lines.join("\n");
    if match_limit_reached {
        notices.push(format!(
            "{limit} matches limit reached. Use limit={} for more, or refine pattern",
            limit.saturating_mul(2)
        ));
        details.insert("matchLimitReached".into(), json!(limit));
    }
    let text = cap_bytes(text, &mut notices, &mut details);
    if lines_truncated {
        notices.push(format!(
            "Some lines truncated to {GREP_MAX_LINE_CHARS} chars. Use read tool to see full lines"
        ));
        details.insert("linesTruncated".into(), json!(true));
    }
    finish(text, notices, unreadable, &errors, details)
}

/// Format a find result showing at most `limit` paths.
pub fn format_find(output: FindOutput, search_path: &Path, limit: usize) -> Formatted {
    let FindOutput { mut paths, errors } = output;
    paths.dedup();
    // Judged before temp files are left out: the backend stopped at its cap either way.
    let limit_reached = paths.len() > limit;
    paths.retain(|path| !is_write_temp_file(path));
    let mut details = Map::new();
    let mut notices = Vec::new();
    let unreadable = unreadable_note(&errors, search_path, "path(s)");
    if paths.is_empty() && !limit_reached {
        return finish(
            "No files found matching pattern".to_owned(),
            notices,
            unreadable,
            &errors,
            details,
        );
    }
    paths.truncate(limit);
    let text = paths
        .iter()
        .map(|path| escape_name(&relative_path(path, search_path)).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    if limit_reached {
        notices.push(format!(
            "{limit} results limit reached. Use limit={} for more, or refine pattern",
            limit.saturating_mul(2)
        ));
        details.insert("resultLimitReached".into(), json!(limit));
    }
    let text = cap_bytes(text, &mut notices, &mut details);
    finish(text, notices, unreadable, &errors, details)
}

/// Whether `path` names the temp file of an atomic write (Cordon's exact naming): the temp
/// file of a write in flight, or one a killed Cordon left behind, which the next session on
/// that root removes. Searches and listings leave them out on every backend.
fn is_write_temp_file(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| cordon_ops::leftovers::is_write_temp_name(name.as_encoded_bytes()))
}

/// Merge repeated files and, within a file, sort lines and drop duplicates (a line that is a
/// match in any copy stays a match).
fn merge_files(files: Vec<GrepFile>) -> Vec<GrepFile> {
    let mut merged: Vec<GrepFile> = Vec::with_capacity(files.len());
    let mut index: HashMap<PathBuf, usize> = HashMap::new();
    for file in files {
        match index.get(&file.path) {
            Some(&at) => merged[at].lines.extend(file.lines),
            None => {
                index.insert(file.path.clone(), merged.len());
                merged.push(file);
            }
        }
    }
    for file in &mut merged {
        let sorted = file.lines.windows(2).all(|w| w[0].number < w[1].number);
        if sorted {
            continue;
        }
        file.lines.sort_by_key(|line| line.number);
        let mut lines: Vec<GrepLine> = Vec::with_capacity(file.lines.len());
        for line in file.lines.drain(..) {
            match lines.last_mut() {
                Some(last) if last.number == line.number => last.is_match |= line.is_match,
                _ => lines.push(line),
            }
        }
        file.lines = lines;
    }
    merged
}

/// The 50 KiB cap (no line limit): `50.0KB limit reached`.
fn cap_bytes(text: String, notices: &mut Vec<String>, details: &mut Map<String, Value>) -> String {
    let truncation = truncate_head(
        &text,
        Limits {
            max_lines: usize::MAX,
            max_bytes: DEFAULT_MAX_BYTES,
        },
    );
    if !truncation.truncated {
        return text;
    }
    notices.push(format!("{} limit reached", format_size(DEFAULT_MAX_BYTES)));
    let content = truncation.content.clone();
    details.insert(
        "truncation".into(),
        serde_json::to_value(&truncation).unwrap_or(Value::Null),
    );
    content
}

/// `N file(s) could not be read: a.txt (permission denied), …, and K more`.
fn unreadable_note(errors: &[String], search_path: &Path, noun: &str) -> Option<String> {
    if errors.is_empty() {
        return None;
    }
    let prefix = format!("{}/", search_path.display());
    let named: Vec<String> = errors
        .iter()
        .take(UNREADABLE_NAMED)
        .map(|error| {
            let error = escape_name(error.strip_prefix(&prefix).unwrap_or(error));
            match error.split_once(": ") {
                Some((path, reason)) => format!("{path} ({reason})"),
                None => error.into_owned(),
            }
        })
        .collect();
    let mut note = format!(
        "{} {noun} could not be read: {}",
        errors.len(),
        named.join(", ")
    );
    if errors.len() > UNREADABLE_NAMED {
        note.push_str(&format!(", and {} more", errors.len() - UNREADABLE_NAMED));
    }
    Some(note)
}

fn finish(
    mut text: String,
    mut notices: Vec<String>,
    unreadable: Option<String>,
    errors: &[String],
    mut details: Map<String, Value>,
) -> Formatted {
    if let Some(note) = unreadable {
        notices.push(note);
        details.insert("unreadable".into(), json!(errors));
    }
    if !notices.is_empty() {
        text.push_str("\n\n[");
        text.push_str(&notices.join(". "));
        text.push(']');
    }
    Formatted {
        text,
        details: (!details.is_empty()).then_some(Value::Object(details)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WS: &str = "/ws";

    #[test]
    fn a_search_call_resolves_its_scope_and_names_the_tool_in_every_refusal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = crate::testing::StdFiles::new(dir.path());
        let root = files.root().to_path_buf();
        let call = SearchCall {
            tool: "find",
            pattern_max: 4,
            default_limit: 7,
        };
        assert_eq!(
            call.scope(&files, "*.rs", None, None).expect("in bounds"),
            (root.clone(), 7)
        );
        assert_eq!(
            call.scope(&files, "*.rs", Some("src"), Some(2.9))
                .expect("in bounds"),
            (root.join("src"), 2)
        );
        let long = call
            .scope(&files, "*.rust", None, None)
            .expect_err("pattern too long");
        assert!(
            matches!(&long, SearchToolError::Bounds { reason } if reason.contains("find") && reason.contains("pattern")),
            "{long}"
        );
        let long_path = "p".repeat(MAX_PATH_CHARS + 1);
        assert!(matches!(
            call.scope(&files, "*", Some(&long_path), None),
            Err(SearchToolError::Bounds { .. })
        ));
        let bad: Result<Vec<u8>, _> = call.parse(json!({"pattern": 1}));
        assert!(
            matches!(
                &bad,
                Err(SearchToolError::InvalidArguments { tool: "find", .. })
            ),
            "{:?}",
            bad.err()
        );
    }

    fn line(number: u64, text: &str, is_match: bool) -> GrepLine {
        GrepLine {
            number,
            text: text.to_owned(),
            is_match,
        }
    }

    fn file(path: &str, lines: Vec<GrepLine>) -> GrepFile {
        GrepFile {
            path: PathBuf::from(path),
            lines,
        }
    }

    fn grep(files: Vec<GrepFile>, limit: usize, context: usize) -> Formatted {
        format_grep(
            GrepOutput {
                files,
                errors: vec![],
            },
            Path::new(WS),
            limit,
            context,
        )
    }

    fn find(paths: &[&str], limit: usize) -> Formatted {
        format_find(
            FindOutput {
                paths: paths.iter().map(PathBuf::from).collect(),
                errors: vec![],
            },
            Path::new(WS),
            limit,
        )
    }

    #[test]
    fn relative_paths() {
        let base = Path::new("/workspace/project");
        assert_eq!(
            relative_path(Path::new("/workspace/project/a/b.txt"), base),
            "a/b.txt"
        );
        assert_eq!(relative_path(base, base), "");
        assert_eq!(
            relative_path(Path::new("/tmp/results/file.txt"), base),
            "../../tmp/results/file.txt"
        );
        assert_eq!(
            relative_path(Path::new("/home/user/file.txt"), Path::new("/")),
            "home/user/file.txt"
        );
        assert_eq!(
            relative_path(Path::new("/workspace/project2/x"), base),
            "../project2/x",
            "a sibling with a common string prefix is not inside"
        );
        assert_eq!(
            relative_path(Path::new("/ws/dir/file\\"), Path::new("/ws")),
            "dir/file\\"
        );
    }

    #[test]
    fn limits_from_arguments() {
        assert_eq!(effective_limit(None, 100), 100);
        assert_eq!(effective_limit(Some(0.0), 100), 1);
        assert_eq!(effective_limit(Some(-4.0), 100), 1);
        assert_eq!(effective_limit(Some(7.9), 100), 7);
        assert_eq!(effective_limit(Some(f64::NAN), 100), 100);
    }

    #[test]
    fn grep_match_lines_relative_to_search_dir() {
        let out = grep(
            vec![
                file("/ws/src/a.rs", vec![line(3, "fn main() {}", true)]),
                file("/ws/src/deep/b.rs", vec![line(10, "fn main2() {}\r", true)]),
            ],
            100,
            0,
        );
        assert_eq!(
            out.text,
            "src/a.rs:3: fn main() {}\nsrc/deep/b.rs:10: fn main2() {}"
        );
        assert_eq!(out.details, None);
    }

    #[test]
    fn names_with_control_characters_cannot_pose_as_entries() {
        assert_eq!(escape_name("plain name.rs"), "plain name.rs");
        assert_eq!(
            escape_name("a\nfake.rs\r\t\u{1b}[31m\\x\u{7f}\u{85}\u{202e}ok"),
            "a\\nfake.rs\\r\\t\\x1b[31m\\\\x\\x7f\\u{85}\\u{202e}ok"
        );
        let found = find(&["/ws/evil\nsrc/main.rs", "/ws/ok.rs"], 10);
        assert_eq!(found.text, "evil\\nsrc/main.rs\nok.rs");
        let grepped = grep(
            vec![file("/ws/x\n/ws/y.rs:1: fake", vec![line(1, "hit", true)])],
            10,
            0,
        );
        assert_eq!(grepped.text, "x\\n/ws/y.rs:1: fake:1: hit");
        assert_eq!(grepped.text.lines().count(), 1);
    }

    #[test]
    fn grep_single_file_uses_basename() {
        let out = format_grep(
            GrepOutput {
                files: vec![file("/ws/example.txt", vec![line(2, "match line", true)])],
                errors: vec![],
            },
            Path::new("/ws/example.txt"),
            100,
            0,
        );
        assert_eq!(out.text, "example.txt:2: match line");
    }

    #[test]
    fn grep_limit_cut_keeps_trailing_context_only() {
        let lines = vec![
            line(1, "before", false),
            line(2, "match one", true),
            line(3, "after", false),
            line(4, "middle", false),
            line(5, "match two", true),
            line(6, "after two", false),
        ];
        let out = grep(vec![file("/ws/context.txt", lines)], 1, 1);
        assert_eq!(
            out.text,
            "context.txt-1- before\ncontext.txt:2: match one\ncontext.txt-3- after\n\n\
             [1 matches limit reached. Use limit=2 for more, or refine pattern]"
        );
        assert_eq!(out.details, Some(json!({"matchLimitReached": 1})));
    }

    #[test]
    fn grep_limit_cut_across_files() {
        let out = grep(
            vec![
                file("/ws/a.txt", vec![line(1, "x", true), line(2, "x", true)]),
                file("/ws/b.txt", vec![line(1, "x", true)]),
            ],
            2,
            0,
        );
        assert_eq!(
            out.text,
            "a.txt:1: x\na.txt:2: x\n\n[2 matches limit reached. Use limit=4 for more, or refine pattern]"
        );
    }

    #[test]
    fn grep_exactly_limit_matches_has_no_notice() {
        let out = grep(
            vec![file(
                "/ws/a.txt",
                vec![line(1, "x", true), line(2, "after", false)],
            )],
            1,
            1,
        );
        assert_eq!(out.text, "a.txt:1: x\na.txt-2- after");
        assert_eq!(out.details, None);
    }

    #[test]
    fn grep_overlapping_context_is_deduplicated() {
        // A backend that did not merge windows: lines 2-4 twice, out of order.
        let lines = vec![
            line(1, "a", false),
            line(2, "m1", true),
            line(3, "b", false),
            line(2, "m1", false),
            line(3, "b", false),
            line(4, "m2", true),
            line(5, "c", false),
        ];
        let out = grep(vec![file("/ws/f.txt", lines)], 10, 1);
        assert_eq!(
            out.text,
            "f.txt-1- a\nf.txt:2: m1\nf.txt-3- b\nf.txt:4: m2\nf.txt-5- c"
        );
        // The same file reported twice is merged.
        let out = grep(
            vec![
                file("/ws/f.txt", vec![line(1, "m", true)]),
                file("/ws/f.txt", vec![line(1, "m", false), line(2, "n", false)]),
            ],
            10,
            1,
        );
        assert_eq!(out.text, "f.txt:1: m\nf.txt-2- n");
    }

    #[test]
    fn grep_long_lines_are_cut_with_notice() {
        let long = "é".repeat(600);
        let out = grep(vec![file("/ws/a.txt", vec![line(1, &long, true)])], 100, 0);
        assert_eq!(
            out.text,
            format!(
                "a.txt:1: {}... [truncated]\n\n[Some lines truncated to 500 chars. Use read tool to see full lines]",
                "é".repeat(500)
            )
        );
        assert_eq!(out.details, Some(json!({"linesTruncated": true})));
    }

    #[test]
    fn grep_byte_cap_and_joined_notices() {
        let long = "z".repeat(499);
        let lines: Vec<GrepLine> = (1..=201).map(|n| line(n, &long, true)).collect();
        let mut lines = lines;
        lines.push(line(202, &"w".repeat(501), true));
        let out = grep(vec![file("/ws/big.txt", lines)], 150, 0);
        assert!(out.text.len() < DEFAULT_MAX_BYTES + 300);
        assert!(
            out.text.ends_with(
                "\n\n[150 matches limit reached. Use limit=300 for more, or refine pattern. \
                 50.0KB limit reached]"
            ),
            "{}",
            &out.text[out.text.len() - 200..]
        );
        let details = out.details.unwrap();
        assert_eq!(details["matchLimitReached"], 150);
        assert_eq!(details["truncation"]["truncatedBy"], "bytes");
        assert_eq!(details["truncation"]["truncated"], true);

        let lines: Vec<GrepLine> = (1..=120).map(|n| line(n, &"q".repeat(600), true)).collect();
        let out = grep(vec![file("/ws/q.txt", lines)], 100, 0);
        assert!(out.text.ends_with(
            "[100 matches limit reached. Use limit=200 for more, or refine pattern. 50.0KB limit \
             reached. Some lines truncated to 500 chars. Use read tool to see full lines]"
        ));
    }

    #[test]
    fn grep_unreadable_files_are_a_note_not_a_failure() {
        let errors: Vec<String> = (0..7)
            .map(|i| format!("/ws/locked{i}.txt: permission denied"))
            .collect();
        let out = format_grep(
            GrepOutput {
                files: vec![file("/ws/ok.txt", vec![line(1, "hit", true)])],
                errors: errors.clone(),
            },
            Path::new(WS),
            100,
            0,
        );
        assert_eq!(
            out.text,
            "ok.txt:1: hit\n\n[7 file(s) could not be read: locked0.txt (permission denied), \
             locked1.txt (permission denied), locked2.txt (permission denied), locked3.txt \
             (permission denied), locked4.txt (permission denied), and 2 more]"
        );
        assert_eq!(out.details, Some(json!({"unreadable": errors})));
        let out = format_grep(
            GrepOutput {
                files: vec![],
                errors: vec!["/ws/x.bin: invalid data".into()],
            },
            Path::new(WS),
            100,
            0,
        );
        assert_eq!(
            out.text,
            "No matches found\n\n[1 file(s) could not be read: x.bin (invalid data)]"
        );
    }

    #[test]
    fn grep_no_matches() {
        let out = grep(vec![], 100, 0);
        assert_eq!(out.text, "No matches found");
        assert_eq!(out.details, None);
    }

    #[test]
    fn find_relative_paths() {
        let out = find(
            &[
                "/ws/a.txt",
                "/ws/.secret/hidden.txt",
                "/ws/src/foo/bar/x.spec.ts",
            ],
            1000,
        );
        assert_eq!(out.text, "a.txt\n.secret/hidden.txt\nsrc/foo/bar/x.spec.ts");
        assert_eq!(out.details, None);
        let out = find(&["/elsewhere/f.txt"], 1000);
        assert_eq!(out.text, "../elsewhere/f.txt");
    }

    #[test]
    fn find_limit_notice_only_when_cut() {
        let out = find(&["/ws/a", "/ws/b"], 2);
        assert_eq!(out.text, "a\nb");
        let out = find(&["/ws/a", "/ws/b", "/ws/c"], 2);
        assert_eq!(
            out.text,
            "a\nb\n\n[2 results limit reached. Use limit=4 for more, or refine pattern]"
        );
        assert_eq!(out.details, Some(json!({"resultLimitReached": 2})));
    }

    #[test]
    fn find_empty_and_byte_cap() {
        assert_eq!(find(&[], 10).text, "No files found matching pattern");
        let names: Vec<String> = (0..2000)
            .map(|i| format!("/ws/{}{i:04}", "n".repeat(40)))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let out = find(&refs, 5000);
        assert!(out.text.ends_with("\n\n[50.0KB limit reached]"));
        assert!(out.text.len() <= DEFAULT_MAX_BYTES + 30);
        assert_eq!(out.details.unwrap()["truncation"]["truncatedBy"], "bytes");
    }

    #[test]
    fn find_unreadable_note() {
        let out = format_find(
            FindOutput {
                paths: vec![PathBuf::from("/ws/a.txt")],
                errors: vec!["/ws/private: permission denied".into()],
            },
            Path::new(WS),
            10,
        );
        assert_eq!(
            out.text,
            "a.txt\n\n[1 path(s) could not be read: private (permission denied)]"
        );
    }

    #[test]
    fn search_errors_for_the_model() {
        let error = SearchToolError::from_search(SearchError::PathNotFound {
            path: PathBuf::from("/ws/missing"),
        });
        assert_eq!(error.to_string(), "Path not found: /ws/missing");
        let error = SearchToolError::from_search(SearchError::InvalidPattern {
            what: "regex",
            pattern: "(".into(),
            reason: "unclosed group".into(),
        });
        assert_eq!(
            error.to_string(),
            "Invalid regex `(`: unclosed group. Fix the pattern, or set literal=true to search \
             for the text as is."
        );
        assert_eq!(
            SearchToolError::from_search(SearchError::Cancelled).to_string(),
            "Operation aborted"
        );
    }

    const TEMP: &str = "/ws/src/.a.rs.cordon-0123456789abcdef.tmp";

    #[test]
    fn grep_leaves_out_write_temp_files() {
        let formatted = grep(
            vec![
                file(TEMP, vec![line(1, "needle", true)]),
                file("/ws/src/a.rs", vec![line(2, "needle", true)]),
                file(
                    "/ws/src/.a.rs.cordon-nothex.tmp",
                    vec![line(3, "needle", true)],
                ),
            ],
            10,
            0,
        );
        assert_eq!(
            formatted.text,
            "src/a.rs:2: needle\nsrc/.a.rs.cordon-nothex.tmp:3: needle"
        );
    }

    #[test]
    fn grep_keeps_the_limit_notice_when_the_backend_was_cut_by_temp_file_matches() {
        let formatted = grep(
            vec![
                file(TEMP, vec![line(1, "needle", true), line(2, "needle", true)]),
                file("/ws/src/a.rs", vec![line(2, "needle", true)]),
            ],
            2,
            0,
        );
        assert!(
            formatted.text.starts_with("src/a.rs:2: needle"),
            "{}",
            formatted.text
        );
        assert!(
            formatted.text.contains("matches limit reached"),
            "{}",
            formatted.text
        );
    }

    #[test]
    fn find_leaves_out_write_temp_files_and_keeps_the_limit_notice() {
        assert_eq!(find(&[TEMP, "/ws/src/a.rs"], 10).text, "src/a.rs");
        let cut = find(&["/ws/a", TEMP, "/ws/b"], 2);
        assert!(cut.text.starts_with("a\nb\n"), "{}", cut.text);
        assert!(cut.text.contains("2 results limit reached"), "{}", cut.text);
        assert_eq!(find(&[TEMP], 10).text, "No files found matching pattern");
    }
}
