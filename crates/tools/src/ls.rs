//! The `ls` tool (docs/semantics.md#ls): list one directory.
//!
//! Entries (dotfiles included) are sorted case-insensitively (lower-case comparison, ties by
//! the raw name), directories get a `/` suffix, and entries whose kind cannot be determined
//! are listed with a note rather than dropped. The entry limit notice appears only when
//! entries were really cut; the listing is also capped at 50 KB.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use cordon_core::tool::{AgentTool, AgentToolResult, ToolError, ToolInvocation};
use cordon_ops::bounds::MAX_PATH_CHARS;
use cordon_ops::leftovers::is_write_temp_name;
use cordon_ops::paths::resolve_model_path;
use cordon_ops::{DirEntry, FileKind, FileOperations, FsError, ToolKind};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::file_tool::{ABORTED, decode_args, whole_number};
use crate::search_format::escape_name;
use crate::truncate::{DEFAULT_MAX_BYTES, Limits, format_size, truncate_head};

/// Entries listed when the model gives no `limit`.
pub const DEFAULT_LS_LIMIT: u64 = 500;

const DESCRIPTION: &str = "List directory contents. Returns entries sorted alphabetically, \
with '/' suffix for directories. Includes dotfiles. Output is truncated to 500 entries or 50KB \
(whichever is hit first).";

/// Why an `ls` call failed; the text is what the model reads.
#[derive(Debug, thiserror::Error)]
pub enum LsError {
    /// The arguments do not match the schema, or `limit` is below 1.
    #[error("{0}")]
    InvalidArguments(String),
    /// The call was cancelled.
    #[error("{ABORTED}")]
    Aborted,
    /// Nothing exists at the path.
    #[error("Path not found: {path}")]
    NotFound {
        /// The path the model sent.
        path: String,
    },
    /// The path is not a directory.
    #[error("Not a directory: {path}")]
    NotADirectory {
        /// The path the model sent.
        path: String,
    },
    /// The directory (or its metadata) could not be read.
    #[error("Cannot read directory: {source}")]
    Unreadable {
        /// The path the model sent.
        path: String,
        /// The backend's error.
        #[source]
        source: FsError,
    },
}

#[derive(Deserialize)]
struct LsArgs {
    path: Option<String>,
    limit: Option<f64>,
}

/// The `ls` tool over one backend's [`FileOperations`].
pub struct LsTool {
    files: Arc<dyn FileOperations>,
}

impl LsTool {
    /// An `ls` tool listing through `files`.
    pub fn new(files: Arc<dyn FileOperations>) -> Self {
        LsTool { files }
    }
}

fn parameters() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        json!({
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "maxLength": MAX_PATH_CHARS,
                    "description": "Directory to list (default: current directory)"
                },
                "limit": {
                    "type": "number",
                    "description": "Maximum number of entries to return (default: 500)"
                }
            }
        })
    })
}

#[async_trait]
impl AgentTool for LsTool {
    fn name(&self) -> &str {
        ToolKind::Ls.name()
    }

    fn label(&self) -> &str {
        "ls"
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn parameters(&self) -> &Value {
        parameters()
    }

    fn prompt_snippet(&self) -> Option<&str> {
        Some("List directory contents")
    }

    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError> {
        let ToolInvocation { args, cancel, .. } = invocation;
        let LsArgs { path, limit } = decode_args("ls", args).map_err(LsError::InvalidArguments)?;
        let limit = match limit {
            Some(value) => whole_number("limit", value, 1).map_err(LsError::InvalidArguments)?,
            None => DEFAULT_LS_LIMIT,
        };
        let path = path.unwrap_or_else(|| ".".to_owned());
        let absolute = resolve_model_path(&path, self.files.root(), self.files.home());
        let listing = async {
            let meta = self
                .files
                .metadata(&absolute)
                .await
                .map_err(|source| match source {
                    FsError::NotFound { .. } | FsError::NotADirectory { .. } => {
                        LsError::NotFound { path: path.clone() }
                    }
                    source => LsError::Unreadable {
                        path: path.clone(),
                        source,
                    },
                })?;
            if meta.kind != FileKind::Dir {
                return Err(LsError::NotADirectory { path: path.clone() });
            }
            self.files
                .read_dir(&absolute)
                .await
                .map_err(|source| LsError::Unreadable {
                    path: path.clone(),
                    source,
                })
        };
        let entries = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(LsError::Aborted.into()),
            entries = listing => entries?,
        };
        Ok(format_listing(entries, limit))
    }
}

/// Sort, cut and render a directory listing.
fn format_listing(mut entries: Vec<DirEntry>, limit: u64) -> AgentToolResult {
    // The temp file of a write in flight, or one a killed Cordon left (removed by the next
    // session on this root), is not the model's file.
    entries.retain(|entry| !is_write_temp_name(entry.name.as_bytes()));
    if entries.is_empty() {
        return AgentToolResult::text("(empty directory)");
    }
    let mut keyed: Vec<(String, DirEntry)> = entries
        .into_iter()
        .map(|entry| (entry.name.to_lowercase(), entry))
        .collect();
    keyed.sort_unstable_by(|(a_key, a), (b_key, b)| a_key.cmp(b_key).then(a.name.cmp(&b.name)));
    let limit_reached = keyed.len() as u64 > limit;
    let shown = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .min(keyed.len());
    let mut text = String::new();
    for (index, (_, entry)) in keyed[..shown].iter().enumerate() {
        if index > 0 {
            text.push('\n');
        }
        text.push_str(&escape_name(&entry.name));
        match (entry.kind, &entry.error) {
            (Some(FileKind::Dir), _) => text.push('/'),
            (Some(FileKind::File | FileKind::Symlink | FileKind::Other), _) => {}
            (None, reason) => {
                text.push_str(" (unreadable: ");
                text.push_str(reason.as_deref().unwrap_or("unknown kind"));
                text.push(')');
            }
        }
    }
    let truncation = truncate_head(
        &text,
        Limits {
            max_lines: usize::MAX,
            max_bytes: DEFAULT_MAX_BYTES,
        },
    );
    let mut notices = Vec::new();
    let mut details = serde_json::Map::new();
    if limit_reached {
        notices.push(format!(
            "{limit} entries limit reached. Use limit={} for more",
            limit.saturating_mul(2)
        ));
        details.insert("entryLimitReached".to_owned(), json!(limit));
    }
    let mut output = if truncation.truncated {
        notices.push(format!("{} limit reached", format_size(DEFAULT_MAX_BYTES)));
        let content = truncation.content.clone();
        details.insert("truncation".to_owned(), json!(truncation));
        content
    } else {
        text
    };
    if notices.is_empty() {
        return AgentToolResult::text(output);
    }
    output.push_str("\n\n[");
    output.push_str(&notices.join(". "));
    output.push(']');
    AgentToolResult::text(output).with_details(Value::Object(details))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::file_tool::test_util::{call, call_with, error, text};
    use crate::testing::StdFiles;

    fn tool(root: &Path) -> LsTool {
        LsTool::new(Arc::new(StdFiles::new(root)))
    }

    fn entry(name: &str, kind: Option<FileKind>) -> DirEntry {
        DirEntry {
            name: name.to_owned(),
            kind,
            error: kind.is_none().then(|| "permission denied".to_owned()),
        }
    }

    #[tokio::test]
    async fn lists_dotfiles_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".hidden-file"), "").unwrap();
        std::fs::create_dir(dir.path().join(".hidden-dir")).unwrap();
        std::fs::write(dir.path().join("visible.txt"), "").unwrap();
        let result = call(&tool(dir.path()), json!({})).await.unwrap();
        assert_eq!(text(&result), ".hidden-dir/\n.hidden-file\nvisible.txt");
        assert_eq!(result.details, None);
    }

    #[tokio::test]
    async fn names_with_newlines_are_escaped_not_split() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("evil\nsecrets.txt"), "").unwrap();
        std::fs::create_dir(dir.path().join("esc\u{1b}[2Jdir")).unwrap();
        let result = call(&tool(dir.path()), json!({})).await.unwrap();
        assert_eq!(text(&result), "esc\\x1b[2Jdir/\nevil\\nsecrets.txt");
    }

    #[tokio::test]
    async fn sorts_case_insensitively_with_ties_by_raw_name() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.txt", "A.txt", "a.txt", "C", "_x", "B.txt"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let result = call(&tool(dir.path()), json!({"path": "."})).await.unwrap();
        assert_eq!(text(&result), "_x\nA.txt\na.txt\nB.txt\nb.txt\nC\nd/");
    }

    #[tokio::test]
    async fn limit_notice_only_when_entries_were_cut() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..3 {
            std::fs::write(dir.path().join(format!("f{i}")), "").unwrap();
        }
        let tool = tool(dir.path());
        let exact = call(&tool, json!({"limit": 3})).await.unwrap();
        assert_eq!(text(&exact), "f0\nf1\nf2");
        let cut = call(&tool, json!({"limit": 2})).await.unwrap();
        assert_eq!(
            text(&cut),
            "f0\nf1\n\n[2 entries limit reached. Use limit=4 for more]"
        );
        assert_eq!(cut.details.unwrap()["entryLimitReached"], json!(2));
    }

    #[tokio::test]
    async fn limit_below_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "").unwrap();
        let tool = tool(dir.path());
        let message = error(call(&tool, json!({"limit": 0})).await);
        assert_eq!(message, "limit must be at least 1, got 0.");
        let message = error(call(&tool, json!({"limit": -3})).await);
        assert_eq!(message, "limit must be at least 1, got -3.");
    }

    #[tokio::test]
    async fn empty_missing_and_file_paths() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        std::fs::write(dir.path().join("file.txt"), "x").unwrap();
        let tool = tool(dir.path());
        let empty = call(&tool, json!({"path": "empty"})).await.unwrap();
        assert_eq!(text(&empty), "(empty directory)");
        let missing = error(call(&tool, json!({"path": "nope"})).await);
        assert_eq!(missing, "Path not found: nope");
        let file = error(call(&tool, json!({"path": "file.txt"})).await);
        assert_eq!(file, "Not a directory: file.txt");
    }

    #[tokio::test]
    async fn lists_entries_of_unknown_kind_with_a_note() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("missing-target", dir.path().join("dangling")).unwrap();
        std::fs::write(dir.path().join("ok.txt"), "").unwrap();
        let result = call(&tool(dir.path()), json!({})).await.unwrap();
        let listing = text(&result);
        assert!(listing.starts_with("dangling (unreadable: "), "{listing}");
        assert!(listing.ends_with(")\nok.txt"), "{listing}");
    }

    #[test]
    fn byte_limit_notice() {
        let entries: Vec<DirEntry> = (0..3000)
            .map(|i| entry(&format!("{i:05}-{}", "n".repeat(40)), Some(FileKind::File)))
            .collect();
        let result = format_listing(entries, 5000);
        let output = text(&result);
        assert!(
            output.ends_with("\n\n[50.0KB limit reached]"),
            "{}",
            &output[output.len() - 80..]
        );
        assert!(output.len() < DEFAULT_MAX_BYTES + 100);
        assert_eq!(
            result.details.unwrap()["truncation"]["truncated"],
            json!(true)
        );
    }

    #[test]
    fn both_notices_joined() {
        let entries: Vec<DirEntry> = (0..3000)
            .map(|i| entry(&format!("{i:05}-{}", "n".repeat(40)), Some(FileKind::Dir)))
            .collect();
        let result = format_listing(entries, 2000);
        assert!(text(&result).ends_with(
            "[2000 entries limit reached. Use limit=4000 for more. 50.0KB limit reached]"
        ));
    }

    #[test]
    fn unknown_kind_without_reason() {
        let mut unknown = entry("mystery", None);
        unknown.error = None;
        let result = format_listing(vec![unknown], 10);
        assert_eq!(text(&result), "mystery (unreadable: unknown kind)");
    }

    #[tokio::test]
    async fn cancelled_call_is_aborted() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let outcome = call_with(&tool(dir.path()), json!({}), cancel).await;
        assert_eq!(error(outcome), "Operation aborted");
    }

    #[tokio::test]
    async fn write_temp_files_are_not_listed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "").unwrap();
        std::fs::write(dir.path().join(".a.txt.cordon-0123456789abcdef.tmp"), "").unwrap();
        std::fs::write(dir.path().join(".a.txt.cordon-1.tmp"), "").unwrap();
        let result = call(&tool(dir.path()), json!({})).await.unwrap();
        assert_eq!(text(&result), ".a.txt.cordon-1.tmp\na.txt");
        std::fs::remove_file(dir.path().join("a.txt")).unwrap();
        std::fs::remove_file(dir.path().join(".a.txt.cordon-1.tmp")).unwrap();
        let result = call(&tool(dir.path()), json!({})).await.unwrap();
        assert_eq!(text(&result), "(empty directory)");
    }
}
