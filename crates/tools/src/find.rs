//! The `find` tool (docs/semantics.md#find): validates the model's arguments, asks the backend's
//! [`SearchOperations::find`] for one result more than it shows, and formats the structured
//! result with [`crate::search_format`].
//!
//! It never spawns a search program: the backend walks the tree (respecting `.gitignore`
//! inside and outside git repositories, never entering `.git/`), so a pattern such as
//! `--help` is only ever a glob.

use std::sync::Arc;

use async_trait::async_trait;
use cordon_core::protocol::Content;
use cordon_core::tool::{AgentTool, AgentToolResult, ToolError, ToolInvocation};
use cordon_ops::bounds::{MAX_GLOB_CHARS, MAX_PATH_CHARS};
use cordon_ops::{FileOperations, FindRequest, SearchOperations, ToolKind};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::search_format::{DEFAULT_FIND_LIMIT, SearchCall, SearchToolError, format_find};

const DESCRIPTION: &str = "Search for files by glob pattern. Returns matching file paths \
relative to the search directory. Respects .gitignore. Output is truncated to 1000 results or \
50KB (whichever is hit first).";

const CALL: SearchCall = SearchCall {
    tool: "find",
    pattern_max: MAX_GLOB_CHARS,
    default_limit: DEFAULT_FIND_LIMIT,
};

#[derive(Deserialize)]
struct FindArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    limit: Option<f64>,
}

/// The `find` tool; see the module docs.
pub struct FindTool {
    search: Arc<dyn SearchOperations>,
    files: Arc<dyn FileOperations>,
    parameters: Value,
}

impl FindTool {
    /// A find tool searching through `search`, resolving paths against the workspace root of
    /// `files` (the same backend).
    pub fn new(search: Arc<dyn SearchOperations>, files: Arc<dyn FileOperations>) -> Self {
        let parameters = json!({
            "type": "object",
            "required": ["pattern"],
            "properties": {
                "pattern": {"type": "string", "maxLength": MAX_GLOB_CHARS, "description": "Glob pattern to match files, e.g. '*.ts', '**/*.json', or 'src/**/*.spec.ts'"},
                "path": {"type": "string", "maxLength": MAX_PATH_CHARS, "description": "Directory to search in (default: current directory)"},
                "limit": {"type": "number", "description": "Maximum number of results (default: 1000)"},
            }
        });
        FindTool {
            search,
            files,
            parameters,
        }
    }
}

#[async_trait]
impl AgentTool for FindTool {
    fn name(&self) -> &str {
        ToolKind::Find.name()
    }

    fn label(&self) -> &str {
        "find"
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn prompt_snippet(&self) -> Option<&str> {
        Some("Find files by glob pattern (respects .gitignore)")
    }

    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError> {
        let ToolInvocation {
            call_id: _,
            args,
            cancel,
            on_update: _,
        } = invocation;
        let FindArgs {
            pattern,
            path,
            limit,
        } = CALL.parse(args)?;
        let (search_path, limit) = CALL.scope(&*self.files, &pattern, path.as_deref(), limit)?;
        let request = FindRequest {
            pattern,
            path: search_path.clone(),
            max_results: limit.saturating_add(1),
        };
        let output = self
            .search
            .find(request, cancel)
            .await
            .map_err(SearchToolError::from_search)?;
        let formatted = format_find(output, &search_path, limit);
        Ok(AgentToolResult {
            content: vec![Content::text(formatted.text)],
            details: formatted.details,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::grep::tests::{ScriptedSearch, run, workspace};
    use cordon_ops::{FindOutput, SearchError};

    fn text(result: &AgentToolResult) -> &str {
        result.content[0].as_text().unwrap()
    }

    #[test]
    fn definition_matches_reference() {
        let (_dir, files) = workspace();
        let tool = FindTool::new(Arc::new(ScriptedSearch::default()), files);
        assert_eq!(tool.name(), "find");
        assert_eq!(tool.description(), DESCRIPTION);
        assert_eq!(
            tool.prompt_snippet(),
            Some("Find files by glob pattern (respects .gitignore)")
        );
        assert_eq!(tool.parameters()["required"], json!(["pattern"]));
    }

    #[tokio::test]
    async fn request_and_relative_results() {
        let (_dir, files) = workspace();
        let root = files.root().to_path_buf();
        let search = Arc::new(ScriptedSearch::default());
        *search.find_result.lock().unwrap() = Some(Ok(FindOutput {
            paths: vec![
                root.join("src/foo/bar/example.spec.ts"),
                root.join("src/z.spec.ts"),
            ],
            errors: vec![],
        }));
        let tool = FindTool::new(search.clone(), files);
        let result = run(
            &tool,
            json!({"pattern": "**/*.spec.ts", "path": "src"}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(text(&result), "foo/bar/example.spec.ts\nz.spec.ts");
        assert_eq!(result.details, None);
        let request = search.find_requests.lock().unwrap()[0].clone();
        assert_eq!(
            request,
            FindRequest {
                pattern: "**/*.spec.ts".into(),
                path: root.join("src"),
                max_results: DEFAULT_FIND_LIMIT + 1,
            }
        );
    }

    #[tokio::test]
    async fn limit_notice_only_when_really_cut() {
        let (_dir, files) = workspace();
        let root = files.root().to_path_buf();
        let search = Arc::new(ScriptedSearch::default());
        let tool = FindTool::new(search.clone(), files);
        *search.find_result.lock().unwrap() = Some(Ok(FindOutput {
            paths: vec![root.join("a"), root.join("b")],
            errors: vec![],
        }));
        let result = run(
            &tool,
            json!({"pattern": "*", "limit": 2}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(text(&result), "a\nb");
        assert_eq!(search.find_requests.lock().unwrap()[0].max_results, 3);
        *search.find_result.lock().unwrap() = Some(Ok(FindOutput {
            paths: vec![root.join("a"), root.join("b"), root.join("c")],
            errors: vec![],
        }));
        let result = run(
            &tool,
            json!({"pattern": "*", "limit": 2}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(
            text(&result),
            "a\nb\n\n[2 results limit reached. Use limit=4 for more, or refine pattern]"
        );
        assert_eq!(result.details, Some(json!({"resultLimitReached": 2})));
    }

    #[tokio::test]
    async fn flag_like_pattern_is_a_glob() {
        let (_dir, files) = workspace();
        let search = Arc::new(ScriptedSearch::default());
        let tool = FindTool::new(search.clone(), files);
        let result = run(
            &tool,
            json!({"pattern": "--help"}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(text(&result), "No files found matching pattern");
        assert_eq!(search.find_requests.lock().unwrap()[0].pattern, "--help");
    }

    #[tokio::test]
    async fn an_oversized_pattern_is_refused_before_the_backend() {
        let (_dir, files) = workspace();
        let search = Arc::new(ScriptedSearch::default());
        let tool = FindTool::new(search.clone(), files);
        assert_eq!(
            tool.parameters()["properties"]["pattern"]["maxLength"],
            json!(MAX_GLOB_CHARS)
        );
        let error = run(
            &tool,
            json!({"pattern": "a".repeat(1_000_000)}),
            CancellationToken::new(),
        )
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(
            error,
            format!(
                "Invalid arguments for find: pattern is 1000000 characters long; at most \
                 {MAX_GLOB_CHARS} are accepted. Use a shorter pattern."
            )
        );
        assert!(search.find_requests.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn glob_errors_and_missing_paths() {
        let (_dir, files) = workspace();
        let search = Arc::new(ScriptedSearch::default());
        let tool = FindTool::new(search.clone(), files.clone());
        *search.find_result.lock().unwrap() = Some(Err(SearchError::InvalidPattern {
            what: "glob",
            pattern: "[".into(),
            reason: "unclosed character class".into(),
        }));
        let error = run(&tool, json!({"pattern": "["}), CancellationToken::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("Invalid glob `[`: unclosed character class. Fix the glob pattern"),
            "{error}"
        );
        let missing = files.root().join("nope");
        *search.find_result.lock().unwrap() = Some(Err(SearchError::PathNotFound {
            path: missing.clone(),
        }));
        let error = run(
            &tool,
            json!({"pattern": "*", "path": "nope"}),
            CancellationToken::new(),
        )
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(error, format!("Path not found: {}", missing.display()));
    }
}
