//! The `grep` tool (docs/semantics.md#grep): validates the model's arguments, asks the backend's
//! [`SearchOperations::grep`] for one match more than it shows, and formats the structured
//! result with [`crate::search_format`].
//!
//! It never spawns a search program: the backend searches (ripgrep's libraries locally, an
//! equivalent inside remote sandboxes), so a pattern such as `--pre=x` is only ever text.

use std::sync::Arc;

use async_trait::async_trait;
use cordon_core::protocol::Content;
use cordon_core::tool::{AgentTool, AgentToolResult, ToolError, ToolInvocation};
use cordon_ops::bounds::{MAX_GLOB_CHARS, MAX_PATH_CHARS, MAX_REGEX_CHARS, REGEX_SIZE_LIMIT};
use cordon_ops::{FileOperations, GrepRequest, SearchError, SearchOperations, ToolKind};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::search_format::{DEFAULT_GREP_LIMIT, SearchCall, SearchToolError, format_grep};

const DESCRIPTION: &str = "Search file contents for a pattern. Returns matching lines with file \
paths and line numbers. Respects .gitignore. Output is truncated to 100 matches or 50KB \
(whichever is hit first). Long lines are truncated to 500 chars.";

const CALL: SearchCall = SearchCall {
    tool: "grep",
    pattern_max: MAX_REGEX_CHARS,
    default_limit: DEFAULT_GREP_LIMIT,
};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct GrepArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob: Option<String>,
    #[serde(default)]
    ignore_case: Option<bool>,
    #[serde(default)]
    literal: Option<bool>,
    #[serde(default)]
    context: Option<f64>,
    #[serde(default)]
    limit: Option<f64>,
}

/// The `grep` tool; see the module docs.
pub struct GrepTool {
    search: Arc<dyn SearchOperations>,
    files: Arc<dyn FileOperations>,
    parameters: Value,
}

impl GrepTool {
    /// A grep tool searching through `search`, resolving paths against the workspace root of
    /// `files` (the same backend).
    pub fn new(search: Arc<dyn SearchOperations>, files: Arc<dyn FileOperations>) -> Self {
        let parameters = json!({
            "type": "object",
            "required": ["pattern"],
            "properties": {
                "pattern": {"type": "string", "maxLength": MAX_REGEX_CHARS, "description": "Search pattern (regex or literal string)"},
                "path": {"type": "string", "maxLength": MAX_PATH_CHARS, "description": "Directory or file to search (default: current directory)"},
                "glob": {"type": "string", "maxLength": MAX_GLOB_CHARS, "description": "Filter files by glob pattern, e.g. '*.ts' or '**/*.spec.ts'"},
                "ignoreCase": {"type": "boolean", "description": "Case-insensitive search (default: false)"},
                "literal": {"type": "boolean", "description": "Treat pattern as literal string instead of regex (default: false)"},
                "context": {"type": "number", "description": "Number of lines to show before and after each match (default: 0)"},
                "limit": {"type": "number", "description": "Maximum number of matches to return (default: 100)"},
            }
        });
        GrepTool {
            search,
            files,
            parameters,
        }
    }
}

#[async_trait]
impl AgentTool for GrepTool {
    fn name(&self) -> &str {
        ToolKind::Grep.name()
    }

    fn label(&self) -> &str {
        "grep"
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn prompt_snippet(&self) -> Option<&str> {
        Some("Search file contents for patterns (respects .gitignore)")
    }

    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError> {
        let ToolInvocation {
            call_id: _,
            args,
            cancel,
            on_update: _,
        } = invocation;
        let GrepArgs {
            pattern,
            path,
            glob,
            ignore_case,
            literal,
            context,
            limit,
        } = CALL.parse(args)?;
        let (search_path, limit) = CALL.scope(&*self.files, &pattern, path.as_deref(), limit)?;
        CALL.check("glob", glob.as_deref(), MAX_GLOB_CHARS)?;
        let context = match context {
            Some(lines) if lines.is_finite() && lines >= 1.0 => lines.floor() as usize,
            Some(_) | None => 0,
        };
        // Judge the regex here, once, so every backend reports an invalid pattern with the same
        // text (and a backend never sees one).
        let literal = literal.unwrap_or(false);
        let ignore_case = ignore_case.unwrap_or(false);
        if !literal
            && let Err(error) = regex::RegexBuilder::new(&pattern)
                .case_insensitive(ignore_case)
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(REGEX_SIZE_LIMIT)
                .build()
        {
            return Err(SearchToolError::from_search(SearchError::InvalidPattern {
                what: "regex",
                pattern,
                reason: error.to_string(),
            })
            .into());
        }
        let request = GrepRequest {
            pattern,
            path: search_path.clone(),
            glob: glob.filter(|glob| !glob.is_empty()),
            ignore_case,
            literal,
            context,
            max_matches: limit.saturating_add(1),
        };
        let output = self
            .search
            .grep(request, cancel)
            .await
            .map_err(SearchToolError::from_search)?;
        let formatted = format_grep(output, &search_path, limit, context);
        Ok(AgentToolResult {
            content: vec![Content::text(formatted.text)],
            details: formatted.details,
            ..Default::default()
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::testing::StdFiles;
    use cordon_ops::{FindOutput, FindRequest, GrepFile, GrepLine, GrepOutput, SearchError};

    /// A [`SearchOperations`] double: returns scripted results, records requests.
    #[derive(Default)]
    pub(crate) struct ScriptedSearch {
        pub(crate) grep_result: Mutex<Option<Result<GrepOutput, SearchError>>>,
        pub(crate) find_result: Mutex<Option<Result<FindOutput, SearchError>>>,
        pub(crate) grep_requests: Mutex<Vec<GrepRequest>>,
        pub(crate) find_requests: Mutex<Vec<FindRequest>>,
    }

    #[async_trait]
    impl SearchOperations for ScriptedSearch {
        async fn grep(
            &self,
            request: GrepRequest,
            cancel: CancellationToken,
        ) -> Result<GrepOutput, SearchError> {
            self.grep_requests.lock().unwrap().push(request);
            if cancel.is_cancelled() {
                return Err(SearchError::Cancelled);
            }
            self.grep_result
                .lock()
                .unwrap()
                .take()
                .unwrap_or_else(|| Ok(GrepOutput::default()))
        }

        async fn find(
            &self,
            request: FindRequest,
            cancel: CancellationToken,
        ) -> Result<FindOutput, SearchError> {
            self.find_requests.lock().unwrap().push(request);
            if cancel.is_cancelled() {
                return Err(SearchError::Cancelled);
            }
            self.find_result
                .lock()
                .unwrap()
                .take()
                .unwrap_or_else(|| Ok(FindOutput::default()))
        }
    }

    pub(crate) fn workspace() -> (tempfile::TempDir, Arc<StdFiles>) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        let files = Arc::new(StdFiles::new(&root).with_home(dir.path()));
        (dir, files)
    }

    pub(crate) async fn run(
        tool: &dyn AgentTool,
        args: Value,
        cancel: CancellationToken,
    ) -> Result<AgentToolResult, ToolError> {
        tool.execute(ToolInvocation {
            call_id: "call-1".into(),
            args,
            cancel,
            on_update: Arc::new(|_| {}),
        })
        .await
    }

    fn text(result: &AgentToolResult) -> &str {
        result.content[0].as_text().unwrap()
    }

    #[test]
    fn definition_matches_reference() {
        let (_dir, files) = workspace();
        let tool = GrepTool::new(Arc::new(ScriptedSearch::default()), files);
        assert_eq!(tool.name(), "grep");
        assert_eq!(tool.description(), DESCRIPTION);
        assert_eq!(
            tool.prompt_snippet(),
            Some("Search file contents for patterns (respects .gitignore)")
        );
        let properties = tool.parameters()["properties"].as_object().unwrap();
        let mut keys: Vec<&str> = properties.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "context",
                "glob",
                "ignoreCase",
                "limit",
                "literal",
                "path",
                "pattern"
            ]
        );
    }

    #[tokio::test]
    async fn request_defaults_ask_for_one_more_match() {
        let (_dir, files) = workspace();
        let search = Arc::new(ScriptedSearch::default());
        let tool = GrepTool::new(search.clone(), files.clone());
        let result = run(&tool, json!({"pattern": "todo"}), CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(text(&result), "No matches found");
        assert_eq!(result.details, None);
        assert_eq!(
            search.grep_requests.lock().unwrap()[0],
            GrepRequest {
                pattern: "todo".into(),
                path: files.root().to_path_buf(),
                glob: None,
                ignore_case: false,
                literal: false,
                context: 0,
                max_matches: DEFAULT_GREP_LIMIT + 1,
            }
        );
    }

    #[tokio::test]
    async fn request_carries_every_option() {
        let (_dir, files) = workspace();
        let search = Arc::new(ScriptedSearch::default());
        let tool = GrepTool::new(search.clone(), files.clone());
        run(
            &tool,
            json!({"pattern": "a.b", "path": "@src/../lib", "glob": "*.rs", "ignoreCase": true,
                   "literal": true, "context": 2.7, "limit": 0}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        run(
            &tool,
            json!({"pattern": "x", "path": "~/other", "context": -3, "limit": 5, "glob": ""}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        let requests = search.grep_requests.lock().unwrap();
        assert_eq!(requests[0].path, files.root().join("lib"));
        assert_eq!(requests[0].glob.as_deref(), Some("*.rs"));
        assert!(requests[0].ignore_case && requests[0].literal);
        assert_eq!((requests[0].context, requests[0].max_matches), (2, 2));
        assert_eq!(requests[1].path, files.home().unwrap().join("other"));
        assert_eq!((requests[1].context, requests[1].max_matches), (0, 6));
        assert_eq!(requests[1].glob, None);
    }

    #[tokio::test]
    async fn flag_like_patterns_are_plain_text() {
        let (_dir, files) = workspace();
        let search = Arc::new(ScriptedSearch::default());
        let tool = GrepTool::new(search.clone(), files);
        for pattern in ["--pre=/tmp/evil.sh", "--help", "-e", "-f/etc/passwd"] {
            let result = run(&tool, json!({"pattern": pattern}), CancellationToken::new())
                .await
                .unwrap();
            assert_eq!(text(&result), "No matches found");
            assert_eq!(
                search.grep_requests.lock().unwrap().last().unwrap().pattern,
                pattern
            );
        }
    }

    #[tokio::test]
    async fn formats_backend_output_with_limit_and_context() {
        let (_dir, files) = workspace();
        let root = files.root().to_path_buf();
        let search = Arc::new(ScriptedSearch::default());
        let line = |number, text: &str, is_match| GrepLine {
            number,
            text: text.into(),
            is_match,
        };
        *search.grep_result.lock().unwrap() = Some(Ok(GrepOutput {
            files: vec![GrepFile {
                path: root.join("context.txt"),
                lines: vec![
                    line(1, "before", false),
                    line(2, "match one", true),
                    line(3, "after", false),
                    line(4, "match two", true),
                    line(5, "after two", false),
                ],
            }],
            errors: vec![],
        }));
        let tool = GrepTool::new(search.clone(), files);
        let result = run(
            &tool,
            json!({"pattern": "match", "limit": 1, "context": 1}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(
            text(&result),
            "context.txt-1- before\ncontext.txt:2: match one\ncontext.txt-3- after\n\n\
             [1 matches limit reached. Use limit=2 for more, or refine pattern]"
        );
        assert_eq!(result.details, Some(json!({"matchLimitReached": 1})));
        assert!(!result.is_error);
    }

    #[tokio::test]
    async fn backend_errors_reach_the_model() {
        let (_dir, files) = workspace();
        let search = Arc::new(ScriptedSearch::default());
        let missing = files.root().join("missing");
        *search.grep_result.lock().unwrap() = Some(Err(SearchError::PathNotFound {
            path: missing.clone(),
        }));
        let tool = GrepTool::new(search.clone(), files);
        let error = run(
            &tool,
            json!({"pattern": "x", "path": "missing"}),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("Path not found: {}", missing.display())
        );

        let cancel = CancellationToken::new();
        cancel.cancel();
        let error = run(&tool, json!({"pattern": "x"}), cancel)
            .await
            .unwrap_err();
        assert_eq!(error.to_string(), "Operation aborted");

        let error = run(&tool, json!({"pattern": 5}), CancellationToken::new())
            .await
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("Invalid arguments for grep: ")
        );
    }

    #[tokio::test]
    async fn oversized_arguments_are_refused_before_the_backend() {
        let (_dir, files) = workspace();
        let search = Arc::new(ScriptedSearch::default());
        let tool = GrepTool::new(search.clone(), files);
        assert_eq!(
            tool.parameters()["properties"]["glob"]["maxLength"],
            json!(MAX_GLOB_CHARS)
        );
        let huge = "a".repeat(50_000_000);
        for args in [
            json!({"pattern": huge}),
            json!({"pattern": "x", "glob": "*".repeat(200_000)}),
            json!({"pattern": "x", "path": "p".repeat(100_000)}),
        ] {
            let error = run(&tool, args, CancellationToken::new())
                .await
                .unwrap_err()
                .to_string();
            assert!(error.starts_with("Invalid arguments for grep: "), "{error}");
            assert!(error.contains("characters long; at most"), "{error}");
            assert!(error.len() < 300, "{error}");
        }
        assert!(search.grep_requests.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_explosive_regex_is_an_invalid_pattern_quoted_by_a_prefix() {
        let (_dir, files) = workspace();
        let tool = GrepTool::new(Arc::new(ScriptedSearch::default()), files);
        // Short to write, huge to compile: refused by the size limit, not compiled.
        let pattern = format!("(?:{}){{1000}}", "[a-z]{1000}".repeat(20));
        let error = run(&tool, json!({"pattern": pattern}), CancellationToken::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("Invalid regex `(?:[a-z]{1000}"),
            "{error}"
        );
        assert!(
            error.contains(&format!("… ({} bytes)`", pattern.len())),
            "{error}"
        );
        assert!(
            error.contains("size limit of 16777216 bytes. Fix"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn unreadable_files_do_not_fail_the_call() {
        let (_dir, files) = workspace();
        let root = files.root().to_path_buf();
        let search = Arc::new(ScriptedSearch::default());
        *search.grep_result.lock().unwrap() = Some(Ok(GrepOutput {
            files: vec![GrepFile {
                path: root.join("ok.txt"),
                lines: vec![GrepLine {
                    number: 1,
                    text: "hit".into(),
                    is_match: true,
                }],
            }],
            errors: vec![format!(
                "{}: permission denied",
                root.join("secret.txt").display()
            )],
        }));
        let tool = GrepTool::new(search, files);
        let result = run(&tool, json!({"pattern": "hit"}), CancellationToken::new())
            .await
            .unwrap();
        assert!(!result.is_error);
        assert_eq!(
            text(&result),
            "ok.txt:1: hit\n\n[1 file(s) could not be read: secret.txt (permission denied)]"
        );
    }
}
