//! The `edit` tool (docs/semantics.md#edit): targeted replacements in one file.
//!
//! Owns the argument shim ([`prepare_edit_arguments`]), input validation, and the
//! access-read-compute-write cycle run inside the file's mutation queue; the matching and diff
//! engine is [`crate::edit_diff`]. A UTF-8 BOM is kept, line endings are kept line by line,
//! and files that are not valid UTF-8 are refused rather than rewritten lossily. The write is
//! atomic ([`FileOperations::write_file`]); cancellation is checked between filesystem
//! operations only, so a write in flight completes (and keeps the queue) before the call
//! reports `Operation aborted`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use cordon_core::sandbox::DEFAULT_EDIT_FILE_BYTES;
use cordon_core::tool::{AgentTool, AgentToolResult, ToolError, ToolInvocation};
use cordon_ops::bounds::MAX_PATH_CHARS;
use cordon_ops::paths::resolve_model_path;
use cordon_ops::{FileKind, FileOperations, FsError, ToolKind};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::edit_diff::{EditDiff, EditFailure, Replacement, apply_edits, edit_diff};
use crate::file_tool::{ABORTED, decode_args, fs_error_text};
use crate::queue::{finish_on_drop, with_mutation_queue_owned};
use crate::truncate::format_size;

const DESCRIPTION: &str = "Edit a single file using exact text replacement. Every \
edits[].oldText must match a unique, non-overlapping region of the original file. If two \
changes affect the same block or nearby lines, merge them into one edit instead of emitting \
overlapping edits. Do not include large unchanged regions just to connect distant changes.";

const GUIDELINES: [&str; 4] = [
    "Use edit for precise changes (edits[].oldText must match exactly)",
    "When changing multiple separate locations in one file, use one edit call with multiple \
     entries in edits[] instead of multiple edit calls",
    "Each edits[].oldText is matched against the original file, not after earlier edits are \
     applied. Do not emit overlapping or nested edits. Merge nearby changes into one edit.",
    "Keep edits[].oldText as small as possible while still being unique in the file. Do not pad \
     with large unchanged regions.",
];

/// Files at least this large are matched and diffed on a blocking thread.
const BLOCKING_THRESHOLD: usize = 256 * 1024;

const UTF8_BOM: &str = "\u{FEFF}";

/// Why an `edit` call failed; the text is what the model reads.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The arguments do not match the schema.
    #[error("{0}")]
    InvalidArguments(String),
    /// `edits` is missing, not an array, or empty.
    #[error("Edit tool input is invalid. edits must contain at least one replacement.")]
    NoEdits,
    /// One entry of `edits` is not an `{oldText, newText}` object of strings.
    #[error(
        "Edit tool input is invalid. edits[{index}] must be an object with string oldText and \
         newText."
    )]
    MalformedEdit {
        /// Which entry.
        index: usize,
    },
    /// The call was cancelled.
    #[error("{ABORTED}")]
    Aborted,
    /// The file could not be accessed, read or written.
    #[error("Could not edit file: {path}. {}", fs_error_text(.source))]
    Access {
        /// The path the model sent.
        path: String,
        /// The backend's error.
        #[source]
        source: FsError,
    },
    /// The file is not UTF-8 text; rewriting it would corrupt it.
    #[error(
        "Could not edit file: {path}. It is not valid UTF-8 text (invalid byte at offset \
         {offset}), so edit will not rewrite it. Use bash to change binary or non-UTF-8 files."
    )]
    NotUtf8 {
        /// The path the model sent.
        path: String,
        /// Byte offset of the first invalid sequence.
        offset: usize,
    },
    /// The replacements cannot be applied (not found, ambiguous, overlapping, no change).
    #[error(transparent)]
    Replace(#[from] EditFailure),
    /// The file is larger than the most `edit` loads.
    #[error(
        "Could not edit file: {path}. It is larger than {}, the most edit loads (policy \
         `[limits] edit_file_size`). Use bash (e.g. sed -i) to change a file this large.",
        format_size(usize::try_from(*max).unwrap_or(usize::MAX))
    )]
    TooLarge {
        /// The path the model sent.
        path: String,
        /// The limit in bytes.
        max: u64,
    },
    /// The background task running the edit died (a panic in a backend).
    #[error(
        "Could not edit file: {path}. The edit stopped unexpectedly; read the file to check its \
         state, then retry."
    )]
    Interrupted {
        /// The path the model sent.
        path: String,
    },
}

/// Normalise the shapes models send `edit` arguments in (docs/semantics.md#edit): `edits` as a JSON
/// string (raw control characters inside its strings repaired), as an array of JSON strings, or as
/// a single `{oldText, newText}` object; legacy top-level `oldText`/`newText` appended to `edits`
/// and removed. Anything else, including valid input, is returned unchanged.
pub fn prepare_edit_arguments(args: Value) -> Value {
    let Value::Object(mut map) = args else {
        return args;
    };
    if let Some(edits) = map.get_mut("edits") {
        normalize_edits(edits);
    }
    if let (Some(Value::String(_)), Some(Value::String(_))) =
        (map.get("oldText"), map.get("newText"))
    {
        let old_text = map.remove("oldText").unwrap_or(Value::Null);
        let new_text = map.remove("newText").unwrap_or(Value::Null);
        let mut edits = match map.remove("edits") {
            Some(Value::Array(edits)) => edits,
            _ => Vec::new(),
        };
        edits.push(json!({"oldText": old_text, "newText": new_text}));
        map.insert("edits".to_owned(), Value::Array(edits));
    }
    Value::Object(map)
}

fn looks_like_edit(object: &Map<String, Value>) -> bool {
    object.contains_key("oldText") || object.contains_key("newText")
}

fn normalize_edits(edits: &mut Value) {
    if let Value::String(text) = edits {
        match parse_lenient(text) {
            Some(Value::Array(items)) => *edits = Value::Array(items),
            Some(Value::Object(object)) if looks_like_edit(&object) => {
                *edits = Value::Array(vec![Value::Object(object)]);
            }
            _ => return,
        }
    }
    match edits {
        Value::Object(object) if looks_like_edit(object) => {
            let object = std::mem::take(object);
            *edits = Value::Array(vec![Value::Object(object)]);
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                if let Value::String(text) = item
                    && let Some(Value::Object(object)) = parse_lenient(text)
                {
                    *item = Value::Object(object);
                }
            }
        }
        _ => {}
    }
}

/// Parse JSON; failing that, parse it again with raw control characters inside string
/// literals escaped (models often put literal newlines and tabs in stringified JSON).
fn parse_lenient(text: &str) -> Option<Value> {
    serde_json::from_str(text)
        .ok()
        .or_else(|| serde_json::from_str(&escape_raw_controls(text)).ok())
}

fn escape_raw_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            } else if u32::from(c) < 0x20 {
                match c {
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    other => out.push_str(&format!("\\u{:04x}", u32::from(other))),
                }
                continue;
            }
        } else if c == '"' {
            in_string = true;
        }
        out.push(c);
    }
    out
}

#[derive(Deserialize)]
struct EditArgs {
    path: String,
    edits: Option<Value>,
}

/// The validated replacements of one call.
fn owned_edits(edits: Option<Value>) -> Result<Vec<(String, String)>, EditError> {
    let Some(Value::Array(items)) = edits else {
        return Err(EditError::NoEdits);
    };
    if items.is_empty() {
        return Err(EditError::NoEdits);
    }
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            let Value::Object(mut object) = item else {
                return Err(EditError::MalformedEdit { index });
            };
            match (object.remove("oldText"), object.remove("newText")) {
                (Some(Value::String(old_text)), Some(Value::String(new_text))) => {
                    Ok((old_text, new_text))
                }
                _ => Err(EditError::MalformedEdit { index }),
            }
        })
        .collect()
}

/// The `edit` tool over one backend's [`FileOperations`].
pub struct EditTool {
    files: Arc<dyn FileOperations>,
    max_file_bytes: Option<u64>,
}

impl EditTool {
    /// An `edit` tool editing through `files`, loading files up to
    /// [`DEFAULT_EDIT_FILE_BYTES`].
    pub fn new(files: Arc<dyn FileOperations>) -> Self {
        EditTool {
            files,
            max_file_bytes: Some(DEFAULT_EDIT_FILE_BYTES),
        }
    }

    /// The same tool refusing files over `max_file_bytes` (`None`: no limit).
    pub fn with_max_file_bytes(mut self, max_file_bytes: Option<u64>) -> Self {
        self.max_file_bytes = max_file_bytes;
        self
    }

    /// What a call with `args` would change, without writing anything (for a host's preview
    /// before approval): the same shim, validation, matching and diff as [`AgentTool::execute`],
    /// needing read access only and taking no queue. The result can be stale by the time the
    /// edit itself runs.
    pub async fn preview(&self, args: Value) -> Result<EditDiff, EditError> {
        let EditArgs { path, edits } = decode_args("edit", prepare_edit_arguments(args))
            .map_err(EditError::InvalidArguments)?;
        let edits = owned_edits(edits)?;
        let absolute = resolve_model_path(&path, self.files.root(), self.files.home());
        check_target(&*self.files, &absolute, &path, false).await?;
        let bytes = read_bounded(&*self.files, &absolute, &path, self.max_file_bytes).await?;
        let heavy = bytes.len() >= BLOCKING_THRESHOLD;
        let shown = path.clone();
        let compute = move || {
            compute_edit(bytes, &edits, &path)
                .map(|done| edit_diff(&path, &done.original, &done.edited))
        };
        run_cpu_bound(heavy, &shown, compute).await
    }
}

/// Run `work` (matching, diffing: proportional to the file size) inline when the file is
/// small, on a blocking thread when it is `heavy`, so large files do not stall the runtime.
async fn run_cpu_bound<T: Send + 'static>(
    heavy: bool,
    path: &str,
    work: impl FnOnce() -> Result<T, EditError> + Send + 'static,
) -> Result<T, EditError> {
    if !heavy {
        return work();
    }
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|_| {
        Err(EditError::Interrupted {
            path: path.to_owned(),
        })
    })
}

/// The whole file, unless it is larger than `max` bytes: one byte more than the limit is read
/// to tell, so memory stays bounded even if the file grows between a size check and the read.
async fn read_bounded(
    files: &dyn FileOperations,
    absolute: &Path,
    path: &str,
    max: Option<u64>,
) -> Result<Vec<u8>, EditError> {
    let access = |source: FsError| EditError::Access {
        path: path.to_owned(),
        source,
    };
    let Some(max) = max else {
        return files.read_file(absolute).await.map_err(access);
    };
    let wanted = usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX);
    let bytes = files
        .read_range(absolute, 0, wanted)
        .await
        .map_err(access)?;
    if bytes.len() as u64 > max {
        return Err(EditError::TooLarge {
            path: path.to_owned(),
            max,
        });
    }
    Ok(bytes)
}

/// Check that `absolute` is a regular file, and writable when `for_write`.
async fn check_target(
    files: &dyn FileOperations,
    absolute: &Path,
    path: &str,
    for_write: bool,
) -> Result<(), EditError> {
    let access = |source: FsError| EditError::Access {
        path: path.to_owned(),
        source,
    };
    let meta = files.metadata(absolute).await.map_err(access)?;
    match meta.kind {
        FileKind::File => {}
        FileKind::Dir => {
            return Err(access(FsError::IsADirectory {
                path: absolute.to_path_buf(),
            }));
        }
        FileKind::Symlink | FileKind::Other => {
            return Err(access(FsError::Io {
                op: "edit",
                path: absolute.to_path_buf(),
                source: std::io::Error::other("not a regular file"),
            }));
        }
    }
    if for_write && !meta.writable {
        return Err(access(FsError::PermissionDenied {
            path: absolute.to_path_buf(),
        }));
    }
    Ok(())
}

fn parameters() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        json!({
            "type": "object",
            "required": ["path", "edits"],
            "properties": {
                "path": {
                    "type": "string",
                    "maxLength": MAX_PATH_CHARS,
                    "description": "Path to the file to edit (relative or absolute)"
                },
                "edits": {
                    "type": "array",
                    "description": "One or more targeted replacements. Each edit is matched \
                        against the original file, not incrementally. Do not include overlapping \
                        or nested edits. If two changes touch the same block or nearby lines, \
                        merge them into one edit instead.",
                    "items": {
                        "type": "object",
                        "required": ["oldText", "newText"],
                        "properties": {
                            "oldText": {
                                "type": "string",
                                "description": "Exact text for one targeted replacement. It must \
                                    be unique in the original file and must not overlap with any \
                                    other edits[].oldText in the same call."
                            },
                            "newText": {
                                "type": "string",
                                "description": "Replacement text for this targeted edit."
                            }
                        }
                    }
                }
            }
        })
    })
}

#[async_trait]
impl AgentTool for EditTool {
    fn name(&self) -> &str {
        ToolKind::Edit.name()
    }

    fn label(&self) -> &str {
        "edit"
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn parameters(&self) -> &Value {
        parameters()
    }

    fn prompt_snippet(&self) -> Option<&str> {
        Some(
            "Make precise file edits with exact text replacement, including multiple disjoint \
             edits in one call",
        )
    }

    fn prompt_guidelines(&self) -> &[&str] {
        &GUIDELINES
    }

    fn prepare_arguments(&self, args: Value) -> Value {
        prepare_edit_arguments(args)
    }

    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError> {
        let ToolInvocation { args, cancel, .. } = invocation;
        let EditArgs { path, edits } =
            decode_args("edit", args).map_err(EditError::InvalidArguments)?;
        let edits = owned_edits(edits)?;
        if cancel.is_cancelled() {
            return Err(EditError::Aborted.into());
        }
        let absolute = resolve_model_path(&path, self.files.root(), self.files.home());
        let count = edits.len();
        let job = edit_in_queue(EditJob {
            files: self.files.clone(),
            max_file_bytes: self.max_file_bytes,
            absolute: absolute.clone(),
            edits,
            cancel,
            path: path.clone(),
        });
        // Finished in the background if the caller stops waiting, so that the queue stays held
        // until the write has settled; the queue place is taken here, in call order.
        let queued = with_mutation_queue_owned(self.files.clone(), absolute, job);
        let done = match finish_on_drop(queued).await {
            Ok(Ok(outcome)) => outcome?,
            Ok(Err(source)) => return Err(EditError::Access { path, source }.into()),
            Err(_) => return Err(EditError::Interrupted { path }.into()),
        };
        let heavy = done.original.len() >= BLOCKING_THRESHOLD;
        let shown = path.clone();
        let render = move || Ok(render_result(&shown, count, &done));
        Ok(run_cpu_bound(heavy, &path, render).await?)
    }
}

/// What one queued edit needs.
struct EditJob {
    files: Arc<dyn FileOperations>,
    max_file_bytes: Option<u64>,
    absolute: PathBuf,
    edits: Vec<(String, String)>,
    cancel: CancellationToken,
    path: String,
}

/// A completed edit: the file before and after (both with BOM, if any).
struct Done {
    original: String,
    edited: String,
    fuzzy_edits: Vec<usize>,
}

async fn edit_in_queue(job: EditJob) -> Result<Done, EditError> {
    let EditJob {
        files,
        max_file_bytes,
        absolute,
        edits,
        cancel,
        path,
    } = job;
    let aborted = || cancel.is_cancelled();
    let access = |source: FsError| EditError::Access {
        path: path.clone(),
        source,
    };
    if aborted() {
        return Err(EditError::Aborted);
    }
    check_target(&*files, &absolute, &path, true).await?;
    if aborted() {
        return Err(EditError::Aborted);
    }
    let bytes = read_bounded(&*files, &absolute, &path, max_file_bytes).await?;
    if aborted() {
        return Err(EditError::Aborted);
    }
    let heavy = bytes.len() >= BLOCKING_THRESHOLD;
    let compute = {
        let path = path.clone();
        move || compute_edit(bytes, &edits, &path)
    };
    let done = run_cpu_bound(heavy, &path, compute).await?;
    if aborted() {
        return Err(EditError::Aborted);
    }
    files
        .write_file(&absolute, done.edited.as_bytes())
        .await
        .map_err(access)?;
    if aborted() {
        // The write has landed; report the cancellation like every other settled step.
        return Err(EditError::Aborted);
    }
    Ok(done)
}

/// Decode, apply, re-encode: pure.
fn compute_edit(bytes: Vec<u8>, edits: &[(String, String)], path: &str) -> Result<Done, EditError> {
    let original = String::from_utf8(bytes).map_err(|error| EditError::NotUtf8 {
        path: path.to_owned(),
        offset: error.utf8_error().valid_up_to(),
    })?;
    let (bom, body) = match original.strip_prefix(UTF8_BOM) {
        Some(body) => (UTF8_BOM, body),
        None => ("", original.as_str()),
    };
    let replacements: Vec<Replacement<'_>> = edits
        .iter()
        .map(|(old_text, new_text)| Replacement { old_text, new_text })
        .collect();
    let applied = apply_edits(body, &replacements, path)?;
    let mut edited = String::with_capacity(bom.len() + applied.content.len());
    edited.push_str(bom);
    edited.push_str(&applied.content);
    Ok(Done {
        original,
        edited,
        fuzzy_edits: applied.fuzzy_edits,
    })
}

/// The success result: message, numbered diff, unified patch and first changed line.
fn render_result(path: &str, count: usize, done: &Done) -> AgentToolResult {
    let EditDiff {
        diff,
        first_changed_line,
        patch,
    } = edit_diff(path, &done.original, &done.edited);
    let mut text = format!("Successfully replaced {count} block(s) in {path}.");
    match done.fuzzy_edits.as_slice() {
        [] => {}
        _ if count == 1 => text.push_str(" (fuzzy match: whitespace/quotes/Unicode normalised)"),
        indices => {
            let which: Vec<String> = indices.iter().map(|i| format!("edits[{i}]")).collect();
            text.push_str(&format!(
                " (fuzzy match for {}: whitespace/quotes/Unicode normalised)",
                which.join(", ")
            ));
        }
    }
    let mut details = json!({
        "diff": diff,
        "patch": patch,
        "firstChangedLine": first_changed_line,
    });
    if !done.fuzzy_edits.is_empty() {
        details["fuzzyEdits"] = json!(done.fuzzy_edits);
    }
    AgentToolResult::text(text).with_details(details)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use serde_json::json;

    use super::*;
    use crate::file_tool::test_util::{call, call_with, error, text};
    use crate::queue::probe::{Op, ProbeFiles, wait_for};
    use crate::testing::StdFiles;
    use crate::write::WriteTool;

    fn tool(root: &Path) -> EditTool {
        EditTool::new(Arc::new(StdFiles::new(root)))
    }

    fn one(old_text: &str, new_text: &str) -> Value {
        json!([{"oldText": old_text, "newText": new_text}])
    }

    async fn edit_file(dir: &Path, file: &str, edits: Value) -> Result<AgentToolResult, ToolError> {
        call(&tool(dir), json!({"path": file, "edits": edits})).await
    }

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file)).unwrap()
    }

    #[test]
    fn definition_matches_reference() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(dir.path());
        assert_eq!(tool.name(), "edit");
        assert_eq!(tool.description(), DESCRIPTION);
        assert_eq!(tool.prompt_guidelines().len(), 4);
        let schema = tool.parameters();
        assert_eq!(schema["required"], json!(["path", "edits"]));
        let properties = schema["properties"].as_object().unwrap();
        assert!(!properties.contains_key("oldText") && !properties.contains_key("newText"));
        assert_eq!(
            schema["properties"]["edits"]["items"]["required"],
            json!(["oldText", "newText"])
        );
    }

    #[test]
    fn shim_folds_legacy_fields() {
        let prepared = prepare_edit_arguments(json!({
            "path": "a.txt", "oldText": "before", "newText": "after"
        }));
        assert_eq!(
            prepared,
            json!({"path": "a.txt", "edits": [{"oldText": "before", "newText": "after"}]})
        );
        let prepared = prepare_edit_arguments(json!({
            "path": "a.txt",
            "edits": [{"oldText": "one", "newText": "1"}],
            "oldText": "two", "newText": "2"
        }));
        assert_eq!(
            prepared["edits"],
            json!([{"oldText": "one", "newText": "1"}, {"oldText": "two", "newText": "2"}])
        );
    }

    #[test]
    fn shim_passes_valid_and_non_object_input_unchanged() {
        let valid = json!({"path": "a.txt", "edits": [{"oldText": "a", "newText": "b"}]});
        assert_eq!(prepare_edit_arguments(valid.clone()), valid);
        for value in [Value::Null, json!("garbage"), json!(5), json!([1, 2])] {
            assert_eq!(prepare_edit_arguments(value.clone()), value);
        }
        // Only one legacy field: not folded.
        let half = json!({"path": "a", "oldText": "x"});
        assert_eq!(prepare_edit_arguments(half.clone()), half);
    }

    #[test]
    fn shim_parses_stringified_edits() {
        let prepared = prepare_edit_arguments(json!({
            "path": "a.txt",
            "edits": "[{\"oldText\": \"a\", \"newText\": \"b\"}]"
        }));
        assert_eq!(prepared["edits"], json!([{"oldText": "a", "newText": "b"}]));
        // Not JSON at all: left for validation to reject.
        let prepared = prepare_edit_arguments(json!({"path": "a.txt", "edits": "not json"}));
        assert_eq!(prepared["edits"], json!("not json"));
    }

    #[test]
    fn shim_repairs_raw_control_characters() {
        let raw = "[{\"oldText\": \"line1\nline2\", \"newText\": \"a\tb\r\nc\"}]";
        assert!(serde_json::from_str::<Value>(raw).is_err());
        let prepared = prepare_edit_arguments(json!({"path": "a.txt", "edits": raw}));
        assert_eq!(
            prepared["edits"],
            json!([{"oldText": "line1\nline2", "newText": "a\tb\r\nc"}])
        );
        // Escaped quotes and backslashes inside strings do not confuse the repair.
        let raw = "[{\"oldText\": \"say \\\"hi\\\"\n\\\\\", \"newText\": \"x\u{1}\"}]";
        let prepared = prepare_edit_arguments(json!({"path": "a.txt", "edits": raw}));
        assert_eq!(
            prepared["edits"],
            json!([{"oldText": "say \"hi\"\n\\", "newText": "x\u{1}"}])
        );
    }

    #[test]
    fn shim_parses_arrays_of_strings_and_single_objects() {
        let prepared = prepare_edit_arguments(json!({
            "path": "a.txt",
            "edits": ["{\"oldText\": \"a\", \"newText\": \"b\"}", {"oldText": "c", "newText": "d"}]
        }));
        assert_eq!(
            prepared["edits"],
            json!([{"oldText": "a", "newText": "b"}, {"oldText": "c", "newText": "d"}])
        );
        let prepared = prepare_edit_arguments(json!({
            "path": "a.txt", "edits": {"oldText": "a", "newText": "b"}
        }));
        assert_eq!(prepared["edits"], json!([{"oldText": "a", "newText": "b"}]));
        let prepared = prepare_edit_arguments(json!({
            "path": "a.txt", "edits": "{\"oldText\": \"a\", \"newText\": \"b\"}"
        }));
        assert_eq!(prepared["edits"], json!([{"oldText": "a", "newText": "b"}]));
    }

    #[tokio::test]
    async fn prepared_legacy_arguments_execute() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("legacy.txt"), "before\n").unwrap();
        let tool = tool(dir.path());
        let args = tool.prepare_arguments(json!({
            "path": "legacy.txt", "oldText": "before", "newText": "after"
        }));
        let result = call(&tool, args).await.unwrap();
        assert_eq!(
            result.content,
            vec![cordon_core::protocol::Content::text(
                "Successfully replaced 1 block(s) in legacy.txt."
            )]
        );
        assert_eq!(read(dir.path(), "legacy.txt"), "after\n");
    }

    #[tokio::test]
    async fn replaces_text_and_returns_diff_and_patch() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "Hello, world!\n").unwrap();
        let result = edit_file(dir.path(), "a.txt", one("world", "testing"))
            .await
            .unwrap();
        assert_eq!(text(&result), "Successfully replaced 1 block(s) in a.txt.");
        let details = result.details.unwrap();
        assert_eq!(
            details["diff"],
            json!("-1 Hello, world!\n+1 Hello, testing!")
        );
        assert_eq!(
            details["patch"],
            json!("--- a.txt\n+++ a.txt\n@@ -1 +1 @@\n-Hello, world!\n+Hello, testing!\n")
        );
        assert_eq!(details["firstChangedLine"], json!(1));
        assert_eq!(read(dir.path(), "a.txt"), "Hello, testing!\n");
    }

    #[tokio::test]
    async fn multiple_disjoint_edits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("edit.txt"), "alpha\nbeta\ngamma\ndelta\n").unwrap();
        let edits = json!([
            {"oldText": "alpha", "newText": "ALPHA"},
            {"oldText": "gamma", "newText": "GAMMA"}
        ]);
        let result = edit_file(dir.path(), "edit.txt", edits).await.unwrap();
        assert_eq!(
            text(&result),
            "Successfully replaced 2 block(s) in edit.txt."
        );
        assert_eq!(read(dir.path(), "edit.txt"), "ALPHA\nbeta\nGAMMA\ndelta\n");
    }

    #[tokio::test]
    async fn multi_edit_diff_collapses_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let content: String = (1..=600).map(|i| format!("line {i}\n")).collect();
        std::fs::write(dir.path().join("big.txt"), content).unwrap();
        let edits = json!([
            {"oldText": "line 10\n", "newText": "LINE 10\n"},
            {"oldText": "line 300\n", "newText": "LINE 300\n"},
            {"oldText": "line 590\n", "newText": "LINE 590\n"}
        ]);
        let result = edit_file(dir.path(), "big.txt", edits).await.unwrap();
        let diff = result.details.unwrap()["diff"].as_str().unwrap().to_owned();
        assert!(diff.contains("..."));
        assert!(!diff.contains("line 250"));
        assert!(diff.lines().count() < 50);
    }

    #[tokio::test]
    async fn a_file_over_the_size_limit_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let content = "needle\n".repeat(200);
        std::fs::write(dir.path().join("big.txt"), &content).unwrap();
        let small = tool(dir.path()).with_max_file_bytes(Some(1000));
        let args = json!({"path": "big.txt", "edits": [{"oldText": "needle", "newText": "pin"}]});
        let message = error(call(&small, args.clone()).await);
        assert_eq!(
            message,
            "Could not edit file: big.txt. It is larger than 1000B, the most edit loads (policy \
             `[limits] edit_file_size`). Use bash (e.g. sed -i) to change a file this large."
        );
        assert!(matches!(
            small.preview(args.clone()).await,
            Err(EditError::TooLarge { max: 1000, .. })
        ));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("big.txt")).unwrap(),
            content
        );
        // At the limit exactly, the edit goes through (and fails only on the ambiguous match).
        let exact = tool(dir.path()).with_max_file_bytes(Some(content.len() as u64));
        let message = error(call(&exact, args).await);
        assert!(message.contains("occurrences"), "{message}");
    }

    /// A 1 TiB sparse file used to be loaded whole before any check.
    #[tokio::test]
    async fn a_huge_sparse_file_is_refused_by_the_default_limit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::File::create(dir.path().join("huge.txt"))
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let message = error(
            call(
                &tool(dir.path()),
                json!({"path": "huge.txt", "edits": [{"oldText": "a", "newText": "b"}]}),
            )
            .await,
        );
        assert!(
            message.starts_with("Could not edit file: huge.txt. It is larger than 64.0MB"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn every_input_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "a\nb\na b\n").unwrap();
        let cases: Vec<(Value, &str)> = vec![
            (
                json!([]),
                "Edit tool input is invalid. edits must contain at least one replacement.",
            ),
            (
                json!("not json"),
                "Edit tool input is invalid. edits must contain at least one replacement.",
            ),
            (
                json!([{"oldText": "a"}]),
                "Edit tool input is invalid. edits[0] must be an object with string oldText and newText.",
            ),
            (
                json!([{"oldText": "a", "newText": "b"}, 7]),
                "Edit tool input is invalid. edits[1] must be an object with string oldText and newText.",
            ),
        ];
        for (edits, expected) in cases {
            let message = error(edit_file(dir.path(), "f.txt", edits).await);
            assert_eq!(message, expected);
        }
        let message = error(call(&tool(dir.path()), json!({"path": "f.txt"})).await);
        assert_eq!(
            message,
            "Edit tool input is invalid. edits must contain at least one replacement."
        );
        assert_eq!(read(dir.path(), "f.txt"), "a\nb\na b\n");
    }

    #[tokio::test]
    async fn every_replacement_error_reaches_the_model() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "foo foo foo\nbar\n").unwrap();
        let cases: Vec<(Value, &str)> = vec![
            (one("", "x"), "oldText must not be empty in f.txt."),
            (
                json!([{"oldText": "bar", "newText": "x"}, {"oldText": "", "newText": "y"}]),
                "edits[1].oldText must not be empty in f.txt.",
            ),
            (
                one("zzz", "x"),
                "Could not find the exact text in f.txt. The old text must match exactly including all whitespace and newlines. Fuzzy matching",
            ),
            (
                json!([{"oldText": "bar", "newText": "x"}, {"oldText": "zzz", "newText": "y"}]),
                "Could not find edits[1] in f.txt. The oldText must match exactly including all whitespace and newlines. Fuzzy matching",
            ),
            (
                one("foo", "x"),
                "Found 3 occurrences of the text in f.txt. The text must be unique. Please provide more context to make it unique.",
            ),
            (
                json!([{"oldText": "bar", "newText": "x"}, {"oldText": "foo", "newText": "y"}]),
                "Found 3 occurrences of edits[1] in f.txt. Each oldText must be unique. Please provide more context to make it unique.",
            ),
            (
                json!([{"oldText": "foo foo foo\nb", "newText": "x"}, {"oldText": "bar", "newText": "y"}]),
                "edits[0] and edits[1] overlap in f.txt. Merge them into one edit or target disjoint regions.",
            ),
            (
                one("bar", "bar"),
                "No changes made to f.txt. The replacement produced identical content. This might indicate an issue with special characters or the text not existing as expected.",
            ),
            (
                json!([{"oldText": "bar", "newText": "bar"}, {"oldText": "foo foo foo", "newText": "foo foo foo"}]),
                "No changes made to f.txt. The replacements produced identical content.",
            ),
        ];
        for (edits, expected) in cases {
            let message = error(edit_file(dir.path(), "f.txt", edits.clone()).await);
            assert!(message.starts_with(expected), "{edits}: {message}");
        }
        assert_eq!(read(dir.path(), "f.txt"), "foo foo foo\nbar\n");
    }

    #[tokio::test]
    async fn failed_edit_applies_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "one\ntwo\nthree\n").unwrap();
        let edits = json!([
            {"oldText": "one", "newText": "ONE"},
            {"oldText": "missing", "newText": "x"}
        ]);
        let message = error(edit_file(dir.path(), "f.txt", edits).await);
        assert!(message.starts_with("Could not find edits[1]"));
        assert_eq!(read(dir.path(), "f.txt"), "one\ntwo\nthree\n");
    }

    #[tokio::test]
    async fn missing_file_is_enoent() {
        let dir = tempfile::tempdir().unwrap();
        let message = error(edit_file(dir.path(), "missing.txt", one("a", "b")).await);
        assert_eq!(
            message,
            "Could not edit file: missing.txt. Error code: ENOENT."
        );
    }

    #[tokio::test]
    async fn read_only_file_is_eacces() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ro.txt");
        std::fs::write(&file, "a\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).unwrap();
        let message = error(edit_file(dir.path(), "ro.txt", one("a", "b")).await);
        assert_eq!(message, "Could not edit file: ro.txt. Error code: EACCES.");
        assert_eq!(read(dir.path(), "ro.txt"), "a\n");
    }

    #[tokio::test]
    async fn paths_outside_the_roots_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("o.txt");
        std::fs::write(&target, "a\n").unwrap();
        let path = target.to_str().unwrap();
        let message = error(
            call(
                &tool(dir.path()),
                json!({"path": path, "edits": one("a", "b")}),
            )
            .await,
        );
        assert!(
            message.starts_with(&format!(
                "Could not edit file: {path}. The path {path} is outside"
            )),
            "{message}"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "a\n");
    }

    #[tokio::test]
    async fn directory_is_eisdir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let message = error(edit_file(dir.path(), "sub", one("a", "b")).await);
        assert_eq!(message, "Could not edit file: sub. Error code: EISDIR.");
    }

    #[tokio::test]
    async fn unreadable_and_broken_backends() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret.txt"), "a\n").unwrap();
        std::fs::write(dir.path().join("broken.txt"), "a\n").unwrap();
        let (probe, _events) = ProbeFiles::new(dir.path());
        probe.fail(Op::Read, "secret.txt", |path| FsError::PermissionDenied {
            path: path.to_path_buf(),
        });
        probe.fail(Op::Metadata, "broken.txt", |path| FsError::Backend {
            op: "stat",
            path: path.to_path_buf(),
            reason: "disk offline".to_owned(),
        });
        let tool = EditTool::new(Arc::new(probe));
        let root = tool.files.root().to_path_buf();
        let message =
            error(call(&tool, json!({"path": "secret.txt", "edits": one("a", "b")})).await);
        assert_eq!(
            message,
            "Could not edit file: secret.txt. Error code: EACCES."
        );
        let message =
            error(call(&tool, json!({"path": "broken.txt", "edits": one("a", "b")})).await);
        assert_eq!(
            message,
            format!(
                "Could not edit file: broken.txt. failed to stat {}: backend unavailable: disk \
                 offline.",
                root.join("broken.txt").display()
            )
        );
    }

    #[tokio::test]
    async fn preview_reports_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.txt"), "one\ntwo\n").unwrap();
        let tool = tool(dir.path());
        let preview = tool
            .preview(json!({"path": "p.txt", "oldText": "two", "newText": "TWO"}))
            .await
            .unwrap();
        assert_eq!(preview.diff, " 1 one\n-2 two\n+2 TWO");
        assert_eq!(preview.first_changed_line, Some(2));
        assert!(preview.patch.starts_with("--- p.txt\n+++ p.txt\n"));
        assert_eq!(read(dir.path(), "p.txt"), "one\ntwo\n");
        let missing = tool
            .preview(json!({"path": "missing.txt", "edits": one("a", "b")}))
            .await
            .unwrap_err();
        assert_eq!(
            missing.to_string(),
            "Could not edit file: missing.txt. Error code: ENOENT."
        );
        let not_found = tool
            .preview(json!({"path": "p.txt", "edits": one("zzz", "b")}))
            .await
            .unwrap_err();
        assert!(
            not_found
                .to_string()
                .starts_with("Could not find the exact text in p.txt.")
        );
    }

    #[tokio::test]
    async fn preview_of_unreadable_file_is_eacces() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ro.txt"), "a\n").unwrap();
        std::fs::write(dir.path().join("wo.txt"), "a\n").unwrap();
        std::fs::set_permissions(
            dir.path().join("ro.txt"),
            std::fs::Permissions::from_mode(0o444),
        )
        .unwrap();
        let (probe, _events) = ProbeFiles::new(dir.path());
        probe.fail(Op::Read, "wo.txt", |path| FsError::PermissionDenied {
            path: path.to_path_buf(),
        });
        let tool = EditTool::new(Arc::new(probe));
        // Read access is enough for a preview.
        let preview = tool
            .preview(json!({"path": "ro.txt", "edits": one("a", "b")}))
            .await
            .unwrap();
        assert_eq!(preview.first_changed_line, Some(1));
        let error = tool
            .preview(json!({"path": "wo.txt", "edits": one("a", "b")}))
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "Could not edit file: wo.txt. Error code: EACCES."
        );
    }

    #[tokio::test]
    async fn non_utf8_file_is_refused_and_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = b"caf\xe9 au lait\nsecond line\n";
        std::fs::write(dir.path().join("latin1.txt"), bytes).unwrap();
        let message = error(edit_file(dir.path(), "latin1.txt", one("second", "2nd")).await);
        assert_eq!(
            message,
            "Could not edit file: latin1.txt. It is not valid UTF-8 text (invalid byte at offset \
             3), so edit will not rewrite it. Use bash to change binary or non-UTF-8 files."
        );
        assert_eq!(std::fs::read(dir.path().join("latin1.txt")).unwrap(), bytes);
    }

    #[tokio::test]
    async fn preserves_bom_and_crlf() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("bom.txt"),
            "\u{FEFF}first\r\nsecond\r\nthird\r\n",
        )
        .unwrap();
        let result = edit_file(dir.path(), "bom.txt", one("second\n", "REPLACED\n"))
            .await
            .unwrap();
        assert_eq!(
            read(dir.path(), "bom.txt"),
            "\u{FEFF}first\r\nREPLACED\r\nthird\r\n"
        );
        let details = result.details.unwrap();
        assert_eq!(
            details["diff"],
            json!(" 1 first\n-2 second\n+2 REPLACED\n 3 third")
        );
        let edits = json!([
            {"oldText": "first", "newText": "FIRST"},
            {"oldText": "third", "newText": "THIRD\nfourth"}
        ]);
        edit_file(dir.path(), "bom.txt", edits).await.unwrap();
        assert_eq!(
            read(dir.path(), "bom.txt"),
            "\u{FEFF}FIRST\r\nREPLACED\r\nTHIRD\r\nfourth\r\n"
        );
    }

    #[tokio::test]
    async fn mixed_line_endings_survive() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.txt"), "a\r\nb\nc\r\nd\n").unwrap();
        edit_file(dir.path(), "m.txt", one("c", "C")).await.unwrap();
        assert_eq!(read(dir.path(), "m.txt"), "a\r\nb\nC\r\nd\n");
    }

    #[tokio::test]
    async fn fuzzy_match_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("q.txt"),
            "let s = \u{201C}hi\u{201D};   \nkeep   \n",
        )
        .unwrap();
        let result = edit_file(
            dir.path(),
            "q.txt",
            one("let s = \"hi\";", "let s = \"bye\";"),
        )
        .await
        .unwrap();
        assert_eq!(
            text(&result),
            "Successfully replaced 1 block(s) in q.txt. (fuzzy match: whitespace/quotes/Unicode \
             normalised)"
        );
        assert_eq!(result.details.unwrap()["fuzzyEdits"], json!([0]));
        assert_eq!(read(dir.path(), "q.txt"), "let s = \"bye\";\nkeep   \n");
        let edits = json!([
            {"oldText": "keep   ", "newText": "kept"},
            {"oldText": "let s = \u{201C}bye\u{201D};", "newText": "x"}
        ]);
        let result = edit_file(dir.path(), "q.txt", edits).await.unwrap();
        assert_eq!(
            text(&result),
            "Successfully replaced 2 block(s) in q.txt. (fuzzy match for edits[1]: \
             whitespace/quotes/Unicode normalised)"
        );
    }

    #[tokio::test]
    async fn edits_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("target.txt"), "old\n").unwrap();
        std::os::unix::fs::symlink("target.txt", dir.path().join("link.txt")).unwrap();
        edit_file(dir.path(), "link.txt", one("old", "new"))
            .await
            .unwrap();
        assert_eq!(read(dir.path(), "target.txt"), "new\n");
        assert!(
            std::fs::symlink_metadata(dir.path().join("link.txt"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    /// Run a command in `dir`, failing the test with its output when it fails.
    fn run(dir: &Path, program: &str, args: &[&str]) {
        let output = Command::new(program)
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("`{program}` is required for this test: {e}"));
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Apply `patch` to `original` in a scratch directory with `patch -p0` and with
    /// `git apply -p0`, and return both results.
    fn apply_with_real_tools(file: &str, original: &[u8], patch: &str) -> (Vec<u8>, Vec<u8>) {
        let scratch = tempfile::tempdir().unwrap();
        let mut results = Vec::new();
        for (tool, args) in [
            ("patch", vec!["-p0", "--quiet", "-i", "change.patch"]),
            ("git", vec!["apply", "-p0", "change.patch"]),
        ] {
            let work = scratch.path().join(tool);
            std::fs::create_dir_all(work.join(Path::new(file).parent().unwrap())).unwrap();
            std::fs::write(work.join(file), original).unwrap();
            std::fs::write(work.join("change.patch"), patch).unwrap();
            if tool == "git" {
                run(&work, "git", &["apply", "-p0", "--check", "change.patch"]);
            }
            run(&work, tool, &args);
            results.push(std::fs::read(work.join(file)).unwrap());
        }
        let git = results.pop().unwrap();
        let patch = results.pop().unwrap();
        (patch, git)
    }

    #[tokio::test]
    async fn patch_applies_with_patch_and_git_apply() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let mut original: String = (1..=40).map(|i| format!("line {i}\n")).collect();
        original.push_str("no newline at the end");
        let cases: Vec<(&str, String, Value)> = vec![
            (
                "src/lf.txt",
                original.clone(),
                json!([
                    {"oldText": "line 3\n", "newText": "LINE 3\nextra\n"},
                    {"oldText": "line 20\nline 21\n", "newText": ""},
                    {"oldText": "at the end", "newText": "at the end!\n"}
                ]),
            ),
            (
                "src/crlf.txt",
                format!("\u{FEFF}{}", original.replace('\n', "\r\n")),
                json!([{"oldText": "line 1\nline 2", "newText": "first\nsecond\nthird"}]),
            ),
            (
                "src/fuzzy.txt",
                "a \u{2018}q\u{2019}   \nb\nc   \n".to_owned(),
                json!([{"oldText": "a 'q'\nb", "newText": "A\nB"}]),
            ),
        ];
        for (file, content, edits) in cases {
            std::fs::write(dir.path().join(file), &content).unwrap();
            let result = edit_file(dir.path(), file, edits).await.unwrap();
            let patch = result.details.unwrap()["patch"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(
                patch.starts_with(&format!("--- {file}\n+++ {file}\n@@ ")),
                "{patch}"
            );
            let expected = std::fs::read(dir.path().join(file)).unwrap();
            let (by_patch, by_git) = apply_with_real_tools(file, content.as_bytes(), &patch);
            assert_eq!(by_patch, expected, "patch -p0 result for {file}");
            assert_eq!(by_git, expected, "git apply result for {file}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_edits_of_one_file_both_land() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "alpha\nbeta\ngamma\n").unwrap();
        let (probe, mut events) = ProbeFiles::new(dir.path());
        let release = probe.gate(Op::Read, "f.txt");
        let tool = Arc::new(EditTool::new(Arc::new(probe)));
        let first = {
            let tool = tool.clone();
            tokio::spawn(async move {
                call(
                    &*tool,
                    json!({"path": "f.txt", "edits": one("alpha", "ALPHA")}),
                )
                .await
            })
        };
        wait_for(&mut events, Op::Read, "f.txt", true).await;
        let second = {
            let tool = tool.clone();
            tokio::spawn(async move {
                call(
                    &*tool,
                    json!({"path": "f.txt", "edits": one("beta", "BETA")}),
                )
                .await
            })
        };
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert_eq!(read(dir.path(), "f.txt"), "ALPHA\nBETA\ngamma\n");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn edit_and_write_share_the_queue_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("real.txt"), "original\n").unwrap();
        std::os::unix::fs::symlink("real.txt", dir.path().join("alias.txt")).unwrap();
        let (probe, mut events) = ProbeFiles::new(dir.path());
        let release = probe.gate(Op::Read, "real.txt");
        let files: Arc<dyn FileOperations> = Arc::new(probe);
        let edit = Arc::new(EditTool::new(files.clone()));
        let write = Arc::new(WriteTool::new(files));
        let first = {
            let edit = edit.clone();
            tokio::spawn(async move {
                call(
                    &*edit,
                    json!({"path": "real.txt", "edits": one("original", "edited")}),
                )
                .await
            })
        };
        wait_for(&mut events, Op::Read, "real.txt", true).await;
        let second = {
            let write = write.clone();
            tokio::spawn(async move {
                call(
                    &*write,
                    json!({"path": "alias.txt", "content": "replacement\n"}),
                )
                .await
            })
        };
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        // The write queued behind the edit, so it lands last.
        assert_eq!(read(dir.path(), "real.txt"), "replacement\n");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancelled_edit_holds_the_queue_until_its_write_settles() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "alpha\nbeta\n").unwrap();
        let (probe, mut events) = ProbeFiles::new(dir.path());
        let release = probe.gate(Op::Write, "f.txt");
        let tool = Arc::new(EditTool::new(Arc::new(probe)));
        let cancel = CancellationToken::new();
        let first = {
            let tool = tool.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                let args = json!({"path": "f.txt", "edits": one("alpha", "ALPHA")});
                call_with(&*tool, args, cancel).await
            })
        };
        wait_for(&mut events, Op::Write, "f.txt", true).await;
        cancel.cancel();
        let second = {
            let tool = tool.clone();
            tokio::spawn(async move {
                call(
                    &*tool,
                    json!({"path": "f.txt", "edits": one("beta", "BETA")}),
                )
                .await
            })
        };
        // The second edit must not even read while the first write is in flight. A bounded
        // wait can only miss a bug on a slow machine, never fail a correct implementation.
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(150),
            wait_for(&mut events, Op::Read, "f.txt", true),
        )
        .await;
        assert!(
            early.is_err(),
            "second edit started while the first write was in flight"
        );
        release.send(()).unwrap();
        assert_eq!(error(first.await.unwrap()), "Operation aborted");
        second.await.unwrap().unwrap();
        // The aborted edit's write landed and the second edit read it.
        assert_eq!(read(dir.path(), "f.txt"), "ALPHA\nBETA\n");
    }

    #[tokio::test]
    async fn cancelled_before_start_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "a\n").unwrap();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let args = json!({"path": "f.txt", "edits": one("a", "b")});
        assert_eq!(
            error(call_with(&tool(dir.path()), args, cancel).await),
            "Operation aborted"
        );
        assert_eq!(read(dir.path(), "f.txt"), "a\n");
    }

    #[tokio::test]
    async fn edits_a_large_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut content = String::with_capacity(12 << 20);
        for i in 0..200_000 {
            content.push_str(&format!("{i:08} some text on this line\n"));
        }
        std::fs::write(dir.path().join("big.txt"), &content).unwrap();
        let result = edit_file(dir.path(), "big.txt", one("00150000 some", "00150000 SOME"))
            .await
            .unwrap();
        let details = result.details.unwrap();
        assert_eq!(details["firstChangedLine"], json!(150_001));
        let patch = details["patch"].as_str().unwrap();
        assert!(patch.contains("@@ -149997,9 +149997,9 @@"), "{patch}");
        let edited = read(dir.path(), "big.txt");
        assert_eq!(edited.len(), content.len());
        assert!(edited.contains("00150000 SOME text"));
    }
}
