//! The `edit` tool (SPEC §4, reference §1.3 and §3): targeted replacements in one file.
//!
//! Owns the argument shim ([`prepare_edit_arguments`]), input validation, and the
//! access-read-compute-write cycle run inside the file's mutation queue; the matching and diff
//! engine is [`crate::edit_diff`]. A UTF-8 BOM is kept, line endings are kept line by line,
//! and files that are not valid UTF-8 are refused rather than rewritten lossily. The write is
//! atomic ([`FileOperations::write_file`]); cancellation is checked between filesystem
//! operations only, so a write in flight completes (and keeps the queue) before the call
//! reports `Operation aborted`.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use cordon_core::tool::{AgentTool, AgentToolResult, ToolError, ToolInvocation};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::edit_diff::{
    DIFF_CONTEXT_LINES, EditFailure, Replacement, apply_edits, display_diff, to_lf, unified_patch,
};
use crate::file_tool::{ABORTED, decode_args, fs_error_text};
use crate::ops::{FileKind, FileOperations, FsError};
use crate::paths::resolve_to_cwd;
use crate::queue::with_mutation_queue_owned;

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

/// Normalise the shapes models send `edit` arguments in (reference `prepareEditArguments`,
/// extended): `edits` as a JSON string (raw control characters inside its strings repaired),
/// as an array of JSON strings, or as a single `{oldText, newText}` object; legacy top-level
/// `oldText`/`newText` appended to `edits` and removed. Anything else, including valid input,
/// is returned unchanged.
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
}

impl EditTool {
    /// An `edit` tool editing through `files`.
    pub fn new(files: Arc<dyn FileOperations>) -> Self {
        EditTool { files }
    }
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
        "edit"
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
        let absolute = resolve_to_cwd(&path, self.files.root(), self.files.home());
        let count = edits.len();
        let job = edit_in_queue(EditJob {
            files: self.files.clone(),
            absolute: absolute.clone(),
            edits,
            cancel,
            path: path.clone(),
        });
        // Spawned so that the queue stays held until the write has settled even if the caller
        // stops waiting; the queue place is taken here, in call order.
        let queued = with_mutation_queue_owned(self.files.clone(), absolute, job);
        let done = match tokio::spawn(queued).await {
            Ok(Ok(outcome)) => outcome?,
            Ok(Err(source)) => return Err(EditError::Access { path, source }.into()),
            Err(_) => return Err(EditError::Interrupted { path }.into()),
        };
        let result = if done.original.len() >= BLOCKING_THRESHOLD {
            let shown = path.clone();
            tokio::task::spawn_blocking(move || render_result(&shown, count, &done))
                .await
                .map_err(|_| EditError::Interrupted { path })?
        } else {
            render_result(&path, count, &done)
        };
        Ok(result)
    }
}

/// What one queued edit needs.
struct EditJob {
    files: Arc<dyn FileOperations>,
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
    let meta = files.metadata(&absolute).await.map_err(access)?;
    match meta.kind {
        FileKind::File => {}
        FileKind::Dir => {
            return Err(access(FsError::IsADirectory {
                path: absolute.clone(),
            }));
        }
        FileKind::Symlink | FileKind::Other => {
            return Err(access(FsError::Io {
                op: "edit",
                path: absolute.clone(),
                source: std::io::Error::other("not a regular file"),
            }));
        }
    }
    if !meta.writable {
        return Err(access(FsError::PermissionDenied {
            path: absolute.clone(),
        }));
    }
    if aborted() {
        return Err(EditError::Aborted);
    }
    let bytes = files.read_file(&absolute).await.map_err(access)?;
    if aborted() {
        return Err(EditError::Aborted);
    }
    let compute = {
        let path = path.clone();
        move || compute_edit(bytes, &edits, &path)
    };
    let done = if meta.size as usize >= BLOCKING_THRESHOLD {
        tokio::task::spawn_blocking(compute)
            .await
            .map_err(|_| EditError::Interrupted { path: path.clone() })??
    } else {
        compute()?
    };
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
    let strip =
        |text: &str| -> String { to_lf(text.strip_prefix(UTF8_BOM).unwrap_or(text)).into_owned() };
    let (diff, first_changed_line) = display_diff(
        &strip(&done.original),
        &strip(&done.edited),
        DIFF_CONTEXT_LINES,
    );
    let patch = unified_patch(path, &done.original, &done.edited);
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
