//! The `read` tool (docs/semantics.md#read): a text file with offset/limit and continuation
//! notices, or an image as an inline attachment.
//!
//! One [`FileOperations::read_file`] per call. Images are recognised by magic bytes (never by
//! extension) and prepared by [`crate::image`]: the header is checked against the decode bounds
//! before anything is decoded, and decodes share the process's decode memory budget
//! ([`crate::decode_gate`]), waiting for it cancellably. Binary files (NUL bytes or invalid UTF-8 in
//! the first 8 KiB) get a short note instead of mojibake. Text gets continuation notices and
//! head truncation (2000 lines / 50 KB, never half a line); a trailing newline never counts as
//! an extra line, the hint for an over-long first line shell-quotes the resolved path, and a
//! negative `offset`/`limit` is an error.
//! `read` does not take the mutation queue.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use cordon_core::protocol::Content;
use cordon_core::tool::{AgentTool, AgentToolResult, ToolError, ToolInvocation};
use cordon_ops::bounds::MAX_PATH_CHARS;
use cordon_ops::bounds::check_length;
use cordon_ops::paths::resolve_model_path;
use cordon_ops::{FileOperations, FsError, ToolKind};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::decode_gate::DecodeGate;
use crate::file_tool::{ABORTED, decode_args, fs_error_text, whole_number};
use crate::image::{ImageMime, ImagePlan, SNIFF_BYTES, detect_image_mime, plan_image};
use crate::paths::{read_path_variants, shell_quote};
use crate::truncate::{
    DEFAULT_MAX_BYTES, DEFAULT_MAX_LINES, Limits, TruncatedBy, Truncation, format_size,
    truncate_head,
};

/// How many leading bytes decide whether a file is binary.
const BINARY_SNIFF_BYTES: usize = 8192;

/// Bytes fetched per backend read; a file up to this size takes a single call.
const READ_CHUNK_BYTES: usize = 4 << 20;

/// Bytes one call scans at most, to skip to `offset` and to count the file's lines; past it
/// the notice says the lines were not all counted.
const SCAN_BUDGET_BYTES: u64 = 256 << 20;

/// Bytes of the selection kept in memory: twice the output limit, so the kept prefix always
/// decides truncation exactly as the whole selection would.
const KEEP_BYTES: usize = 2 * DEFAULT_MAX_BYTES;

/// Largest image file `read` loads to attach.
pub const MAX_IMAGE_FILE_BYTES: usize = 64 << 20;

const DESCRIPTION: &str = "Read the contents of a file. Supports text files and images (jpg, \
png, gif, webp, bmp). Images are sent as attachments. For text files, output is truncated to \
2000 lines or 50KB (whichever is hit first). Use offset/limit for large files. When you need \
the full file, continue with offset until complete.";

/// Options of the `read` tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// Scale and re-encode images over 2000×2000 or 4.5 MB of base64 (default `true`). BMP is
    /// converted to PNG either way.
    pub auto_resize_images: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            auto_resize_images: true,
        }
    }
}

/// Why a `read` call failed; the text is what the model reads.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The arguments do not match the schema, or `offset`/`limit` are out of range.
    #[error("{0}")]
    InvalidArguments(String),
    /// The call was cancelled.
    #[error("{ABORTED}")]
    Aborted,
    /// Neither the path nor any of its filename variants exists.
    #[error(
        "ENOENT: file not found: {path}. Check the path, or use ls or find to locate the file."
    )]
    NotFound {
        /// The path the model sent.
        path: String,
    },
    /// The path is a directory.
    #[error("EISDIR: {path} is a directory, not a file. Use ls to list its contents.")]
    IsADirectory {
        /// The path the model sent.
        path: String,
    },
    /// Any other failure to read the file.
    #[error("Could not read file: {path}. {}", fs_error_text(.source))]
    Unreadable {
        /// The path the model sent.
        path: String,
        /// The backend's error.
        #[source]
        source: FsError,
    },
    /// `offset` points past the last line.
    #[error("Offset {offset} is beyond end of file ({total} lines total)")]
    OffsetBeyondEnd {
        /// The offset the model sent.
        offset: u64,
        /// Lines in the file.
        total: usize,
    },
    /// `offset` lies beyond the part of the file one call scans.
    #[error(
        "Offset {offset} is beyond the first {lines} lines ({}) that one read scans. Use bash \
         (e.g. tail -n +{offset} FILE | head -n 2000) to reach it.",
        format_size(usize::try_from(*scanned).unwrap_or(usize::MAX))
    )]
    OffsetNotReached {
        /// The offset the model sent.
        offset: u64,
        /// Lines scanned.
        lines: usize,
        /// Bytes scanned.
        scanned: u64,
    },
    /// The image worker died (a panic in a decoder).
    #[error("Could not read file: {path}. Processing the image failed unexpectedly.")]
    ImageTask {
        /// The path the model sent.
        path: String,
    },
}

#[derive(Deserialize)]
struct ReadArgs {
    path: String,
    offset: Option<f64>,
    limit: Option<f64>,
}

/// The `read` tool over one backend's [`FileOperations`].
pub struct ReadTool {
    files: Arc<dyn FileOperations>,
    options: ReadOptions,
    chunk_bytes: usize,
    scan_budget: u64,
    decode_gate: DecodeGate,
}

impl ReadTool {
    /// A `read` tool reading through `files`.
    pub fn new(files: Arc<dyn FileOperations>, options: ReadOptions) -> Self {
        ReadTool {
            files,
            options,
            chunk_bytes: READ_CHUNK_BYTES,
            scan_budget: SCAN_BUDGET_BYTES,
            decode_gate: DecodeGate::process(),
        }
    }

    /// The first read covers at least what image and binary sniffing look at.
    fn first_chunk_bytes(&self) -> usize {
        self.chunk_bytes.max(BINARY_SNIFF_BYTES)
    }

    /// The same tool reading `chunk_bytes` per backend call and scanning at most
    /// `scan_budget` bytes per call (tests exercise the streaming with tiny values).
    #[cfg(test)]
    fn with_chunking(mut self, chunk_bytes: usize, scan_budget: u64) -> Self {
        self.chunk_bytes = chunk_bytes.max(1);
        self.scan_budget = scan_budget;
        self
    }

    /// The same tool decoding images under `gate` instead of the process's gate.
    #[cfg(test)]
    fn with_decode_gate(mut self, gate: DecodeGate) -> Self {
        self.decode_gate = gate;
        self
    }

    /// The first chunk of `path`, falling back to other spellings of its name
    /// (docs/semantics.md#paths) when it does not exist. Returns the bytes and the path actually
    /// read.
    async fn read_first_chunk(
        &self,
        shown: &str,
        path: PathBuf,
    ) -> Result<(Vec<u8>, PathBuf), ReadError> {
        let chunk = self.first_chunk_bytes();
        let first = self.files.read_range(&path, 0, chunk).await;
        let error = match first {
            Ok(bytes) => return Ok((bytes, path)),
            Err(FsError::NotFound { .. }) => {
                let mut found = None;
                for variant in read_path_variants(&path) {
                    match self.files.read_range(&variant, 0, chunk).await {
                        Ok(bytes) => {
                            found = Some(Ok((bytes, variant)));
                            break;
                        }
                        Err(FsError::NotFound { .. } | FsError::NotADirectory { .. }) => {}
                        Err(other) => {
                            found = Some(Err(other));
                            break;
                        }
                    }
                }
                match found {
                    Some(Ok(read)) => return Ok(read),
                    Some(Err(other)) => other,
                    None => FsError::NotFound { path },
                }
            }
            Err(other) => other,
        };
        Err(unreadable(shown, error))
    }
}

fn parameters() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        json!({
            "type": "object",
            "required": ["path"],
            "properties": {
                "path": {
                    "type": "string",
                    "maxLength": MAX_PATH_CHARS,
                    "description": "Path to the file to read (relative or absolute)"
                },
                "offset": {
                    "type": "number",
                    "description": "Line number to start reading from (1-indexed)"
                },
                "limit": {
                    "type": "number",
                    "description": "Maximum number of lines to read"
                }
            }
        })
    })
}

#[async_trait]
impl AgentTool for ReadTool {
    fn name(&self) -> &str {
        ToolKind::Read.name()
    }

    fn label(&self) -> &str {
        "read"
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn parameters(&self) -> &Value {
        parameters()
    }

    fn prompt_snippet(&self) -> Option<&str> {
        Some("Read file contents")
    }

    fn prompt_guidelines(&self) -> &[&str] {
        &["Use read to examine files instead of cat or sed."]
    }

    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError> {
        let ToolInvocation { args, cancel, .. } = invocation;
        let ReadArgs {
            path,
            offset,
            limit,
        } = decode_args("read", args).map_err(ReadError::InvalidArguments)?;
        check_length("read", "path", &path, MAX_PATH_CHARS).map_err(ReadError::InvalidArguments)?;
        let offset = offset
            .map(|value| whole_number("offset", value, 0))
            .transpose()
            .map_err(ReadError::InvalidArguments)?;
        let limit = limit
            .map(|value| whole_number("limit", value, 1))
            .transpose()
            .map_err(ReadError::InvalidArguments)?;
        if cancel.is_cancelled() {
            return Err(ReadError::Aborted.into());
        }
        let absolute = resolve_model_path(&path, self.files.root(), self.files.home());
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(ReadError::Aborted.into()),
            result = self.read_resolved(&path, absolute, offset, limit, &cancel) => {
                result.map_err(Into::into)
            }
        }
    }
}

impl ReadTool {
    /// Everything after argument checks: the first chunk decides between image, binary note
    /// and text; text is streamed chunk by chunk.
    async fn read_resolved(
        &self,
        path: &str,
        absolute: PathBuf,
        offset: Option<u64>,
        limit: Option<u64>,
        cancel: &CancellationToken,
    ) -> Result<AgentToolResult, ReadError> {
        let (first, resolved) = self.read_first_chunk(path, absolute).await?;
        let whole = first.len() < self.first_chunk_bytes();
        let head = &first[..first.len().min(SNIFF_BYTES)];
        if let Some(mime) = detect_image_mime(head) {
            return self
                .read_image(path, &resolved, first, whole, mime, cancel)
                .await;
        }
        if let Some(reason) = binary_reason(&first) {
            let size = if whole {
                first.len() as u64
            } else {
                self.files
                    .metadata(&resolved)
                    .await
                    .map_or(first.len() as u64, |meta| meta.size)
            };
            return Ok(binary_note(path, size, reason));
        }
        let view = TextView {
            offset,
            limit,
            resolved: &resolved,
        };
        let window = self.scan_text(path, &resolved, first, &view).await?;
        render_window(window, &view, self.scan_budget)
    }

    async fn read_image(
        &self,
        path: &str,
        resolved: &Path,
        first: Vec<u8>,
        whole: bool,
        mime: ImageMime,
        cancel: &CancellationToken,
    ) -> Result<AgentToolResult, ReadError> {
        let bytes = if whole {
            first
        } else {
            drop(first);
            let bytes = self
                .files
                .read_range(resolved, 0, MAX_IMAGE_FILE_BYTES + 1)
                .await
                .map_err(|source| unreadable(path, source))?;
            if bytes.len() > MAX_IMAGE_FILE_BYTES {
                return Ok(AgentToolResult::text(format!(
                    "Read image file [{}]\n[Image omitted: the file is larger than {}, the most \
                     read loads for an image. Use bash to make a smaller copy first.]",
                    mime.as_str(),
                    format_size(MAX_IMAGE_FILE_BYTES)
                )));
            }
            bytes
        };
        let auto_resize = self.options.auto_resize_images;
        let task_failed = |_| ReadError::ImageTask {
            path: path.to_owned(),
        };
        // The header is read first; only an image within the decode bounds is decoded, and
        // only once its share of the process's decode memory is free.
        let plan = tokio::task::spawn_blocking(move || plan_image(bytes, mime, auto_resize));
        let plan = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(ReadError::Aborted),
            plan = plan => plan.map_err(task_failed)?,
        };
        let prepared = match plan {
            ImagePlan::Ready(prepared) => prepared,
            ImagePlan::Decode(job) => {
                let permit = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Err(ReadError::Aborted),
                    permit = self.decode_gate.admit(job.cost_bytes()) => permit,
                };
                let decoded = tokio::task::spawn_blocking(move || permit.run(|| job.run()));
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Err(ReadError::Aborted),
                    decoded = decoded => decoded.map_err(task_failed)?,
                }
            }
        };
        Ok(match prepared {
            Ok(image) => {
                let mut text = format!("Read image file [{}]", image.mime.as_str());
                for hint in &image.hints {
                    text.push('\n');
                    text.push_str(hint);
                }
                AgentToolResult {
                    content: vec![
                        Content::text(text),
                        Content::Image {
                            data: image.data_base64,
                            mime_type: image.mime.as_str().to_owned(),
                        },
                    ],
                    ..Default::default()
                }
            }
            Err(omitted) => AgentToolResult::text(format!(
                "Read image file [{}]\n{}",
                mime.as_str(),
                omitted.note()
            )),
        })
    }

    /// Stream the text file from its first chunk: skip to the selection, keep its first
    /// [`KEEP_BYTES`], and count lines to the end of the file or the scan budget. Memory stays
    /// at one chunk plus the kept bytes whatever the file's size.
    async fn scan_text(
        &self,
        path: &str,
        resolved: &Path,
        first: Vec<u8>,
        view: &TextView<'_>,
    ) -> Result<Window, ReadError> {
        let mut scanner = Scanner::new(view);
        let mut expected = self.first_chunk_bytes();
        let mut chunk = first;
        loop {
            let full = chunk.len() >= expected;
            expected = self.chunk_bytes;
            scanner.feed(&chunk);
            if !full {
                return scanner.finish(true, view);
            }
            if scanner.position >= self.scan_budget {
                return scanner.finish(false, view);
            }
            chunk = self
                .files
                .read_range(resolved, scanner.position, self.chunk_bytes)
                .await
                .map_err(|source| unreadable(path, source))?;
        }
    }
}

fn unreadable(path: &str, source: FsError) -> ReadError {
    let path = path.to_owned();
    match source {
        FsError::NotFound { .. } | FsError::NotADirectory { .. } => ReadError::NotFound { path },
        FsError::IsADirectory { .. } => ReadError::IsADirectory { path },
        source => ReadError::Unreadable { path, source },
    }
}

/// Why the start of a file says it is not text, if it does.
fn binary_reason(bytes: &[u8]) -> Option<&'static str> {
    let head = &bytes[..bytes.len().min(BINARY_SNIFF_BYTES)];
    if memchr::memchr(0, head).is_some() {
        return Some("it contains NUL bytes");
    }
    match std::str::from_utf8(head) {
        Ok(_) => None,
        // A character cut by the sniff window is fine unless the file really ends there.
        Err(error) if error.error_len().is_none() && head.len() < bytes.len() => None,
        Err(_) => Some("it is not valid UTF-8 text"),
    }
}

fn binary_note(path: &str, size: u64, reason: &str) -> AgentToolResult {
    AgentToolResult::text(format!(
        "[Binary file not shown: {path} ({}, {size} bytes) is not text: {reason}. Use bash \
         (e.g. file, xxd or od) to inspect it.]",
        format_size(usize::try_from(size).unwrap_or(usize::MAX))
    ))
    .with_details(json!({"binary": true, "size": size}))
}

/// Which part of a text file to show.
struct TextView<'a> {
    /// 1-based first line (`0` and `None` mean line 1).
    offset: Option<u64>,
    /// Maximum lines.
    limit: Option<u64>,
    /// The path actually read (for the `sed` hint).
    resolved: &'a Path,
}

impl TextView<'_> {
    /// 0-based index of the first selected line.
    fn start_line(&self) -> usize {
        let start = self.offset.map_or(0, |offset| offset.saturating_sub(1));
        usize::try_from(start).unwrap_or(usize::MAX)
    }

    fn limit(&self) -> Option<usize> {
        self.limit
            .map(|limit| usize::try_from(limit).unwrap_or(usize::MAX))
    }
}

/// What a scan of a text file learnt: the selection (lines `offset..offset+limit`, ending at
/// the file's end, keeping a final newline, or before the line break that ends its last line)
/// and the file's line count.
#[derive(Debug)]
struct Window {
    /// The selection's first bytes, at most [`KEEP_BYTES`].
    kept: Vec<u8>,
    /// Bytes in the whole selection (what was scanned of it, when the scan stopped early).
    selection_bytes: u64,
    /// Lines in the selection (counted so far, when the scan stopped early).
    selection_lines: usize,
    /// Bytes of the selection's first line, without its line break.
    first_line_bytes: u64,
    /// Lines in the file, when it was scanned to its end.
    total: Option<usize>,
}

/// The streaming state of [`ReadTool::scan_text`]; fed chunk by chunk, in file order.
struct Scanner {
    start_line: usize,
    limit: Option<usize>,
    /// Bytes fed so far (the file offset of the next chunk).
    position: u64,
    newlines: usize,
    last_byte: Option<u8>,
    /// File offset where the selection starts, once reached.
    selection_start: Option<u64>,
    /// File offset of the line break ending the selection's last wanted line, once seen.
    selection_break: Option<u64>,
    /// File offset of the line break ending the selection's first line, once seen.
    first_break: Option<u64>,
    kept: Vec<u8>,
}

impl Scanner {
    fn new(view: &TextView<'_>) -> Self {
        let start_line = view.start_line();
        Scanner {
            start_line,
            limit: view.limit(),
            position: 0,
            newlines: 0,
            last_byte: None,
            selection_start: (start_line == 0).then_some(0),
            selection_break: None,
            first_break: None,
            kept: Vec::new(),
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        let base = self.position;
        for index in memchr::memchr_iter(b'\n', chunk) {
            let at = base + index as u64;
            self.newlines += 1;
            match self.selection_start {
                None => {
                    if self.newlines == self.start_line {
                        self.selection_start = Some(at + 1);
                    }
                }
                Some(_) => {
                    self.first_break.get_or_insert(at);
                    if self.selection_break.is_none()
                        && self.limit.is_some_and(|limit| {
                            self.newlines == self.start_line.saturating_add(limit)
                        })
                    {
                        self.selection_break = Some(at);
                    }
                }
            }
        }
        if let Some(start) = self.selection_start {
            let end = base + chunk.len() as u64;
            let from = start.max(base);
            let to = self.selection_break.unwrap_or(u64::MAX).min(end);
            if from < to {
                let room = KEEP_BYTES - self.kept.len();
                let from = (from - base) as usize;
                let to = (to - base) as usize;
                self.kept
                    .extend_from_slice(&chunk[from..to.min(from + room)]);
            }
        }
        self.position = base + chunk.len() as u64;
        if let Some(&last) = chunk.last() {
            self.last_byte = Some(last);
        }
    }

    /// The window, or why the offset cannot be shown. `complete`: the file's end was reached.
    fn finish(mut self, complete: bool, view: &TextView<'_>) -> Result<Window, ReadError> {
        let total = complete
            .then(|| self.newlines + usize::from(self.last_byte.is_some_and(|byte| byte != b'\n')));
        let offset = view.offset.unwrap_or(0);
        if let Some(total) = total
            && self.start_line >= total
            && !(total == 0 && self.start_line == 0)
        {
            return Err(ReadError::OffsetBeyondEnd { offset, total });
        }
        let Some(start) = self.selection_start else {
            return Err(ReadError::OffsetNotReached {
                offset,
                lines: self.newlines,
                scanned: self.position,
            });
        };
        let file_end = self.position;
        let (end, selection_lines) = match (self.selection_break, total) {
            // The last wanted line ends the file: keep its line break, as the file's end.
            (Some(at), Some(_)) if at + 1 == file_end => {
                if self.kept.len() < KEEP_BYTES {
                    self.kept.push(b'\n');
                }
                (file_end, self.limit.unwrap_or(0))
            }
            (Some(at), _) => (at, self.limit.unwrap_or(0)),
            (None, Some(total)) => (file_end, total - self.start_line),
            (None, None) => (file_end, self.newlines.saturating_sub(self.start_line) + 1),
        };
        let first_line_end = self.first_break.map_or(end, |at| at.min(end));
        Ok(Window {
            kept: self.kept,
            selection_bytes: end - start,
            selection_lines,
            first_line_bytes: first_line_end.saturating_sub(start),
            total,
        })
    }
}

/// Byte index of the `\n` ending the `count`-th line from `from` (exclusive end of `count`
/// lines), or `None` when there are not that many line breaks.
fn end_of_lines(text: &str, from: usize, count: usize) -> Option<usize> {
    if count == 0 {
        return Some(from);
    }
    memchr::memchr_iter(b'\n', &text.as_bytes()[from..])
        .nth(count - 1)
        .map(|newline| from + newline)
}

fn render_window(
    window: Window,
    view: &TextView<'_>,
    scan_budget: u64,
) -> Result<AgentToolResult, ReadError> {
    let Window {
        kept,
        selection_bytes,
        selection_lines,
        first_line_bytes,
        total,
    } = window;
    let start_line = view.start_line();
    let end_line = start_line + selection_lines;
    let kept_whole = kept.len() as u64 == selection_bytes;
    let text = match String::from_utf8(kept) {
        Ok(text) => text,
        // Valid at the start, broken later: show it, with replacement characters.
        Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
    };
    let selection_bytes = usize::try_from(selection_bytes).unwrap_or(usize::MAX);
    // Truncation only needs one line more than it may keep; the totals are patched after.
    let probe_end = end_of_lines(&text, 0, DEFAULT_MAX_LINES + 1).unwrap_or(text.len());
    let mut truncation = truncate_head(&text[..probe_end], Limits::default());
    if truncation.truncated || probe_end < text.len() || !kept_whole {
        truncation.total_lines = selection_lines;
        truncation.total_bytes = selection_bytes;
        if !truncation.truncated {
            // Only reachable if line counting disagreed; keep the notice honest.
            truncation.truncated = true;
            truncation.truncated_by = Some(TruncatedBy::Lines);
        }
    }
    let first_shown = start_line + 1;
    if truncation.first_line_exceeds_limit {
        let hint = format!(
            "[Line {first_shown} is {}, exceeds {} limit. Use bash: sed -n '{first_shown}p' {} | \
             head -c {DEFAULT_MAX_BYTES}]",
            format_size(usize::try_from(first_line_bytes).unwrap_or(usize::MAX)),
            format_size(DEFAULT_MAX_BYTES),
            shell_quote(&view.resolved.to_string_lossy()),
        );
        return Ok(with_truncation(hint, truncation));
    }
    let uncounted = || {
        format!(
            "the file was not read past its first {}, so its lines were not all counted",
            format_size(usize::try_from(scan_budget).unwrap_or(usize::MAX))
        )
    };
    if truncation.truncated {
        let last_shown = start_line + truncation.output_lines;
        let limit_note = match truncation.truncated_by {
            Some(TruncatedBy::Bytes) => format!(" ({} limit)", format_size(DEFAULT_MAX_BYTES)),
            Some(TruncatedBy::Lines) | None => String::new(),
        };
        let of_total = match total {
            Some(total) => format!(" of {total}"),
            None => format!("; {}", uncounted()),
        };
        let output = format!(
            "{}\n\n[Showing lines {first_shown}-{last_shown}{of_total}{limit_note}. Use offset={} \
             to continue.]",
            truncation.content,
            last_shown + 1
        );
        return Ok(with_truncation(output, truncation));
    }
    match total {
        Some(total) if end_line < total => Ok(AgentToolResult::text(format!(
            "{text}\n\n[{} more lines in file. Use offset={} to continue.]",
            total - end_line,
            end_line + 1
        ))),
        None => Ok(AgentToolResult::text(format!(
            "{text}\n\n[More lines in file ({}). Use offset={} to continue.]",
            uncounted(),
            end_line + 1
        ))),
        // The whole rest of the file fits.
        Some(_) => Ok(AgentToolResult::text(text)),
    }
}

fn with_truncation(text: String, mut truncation: Truncation) -> AgentToolResult {
    // The kept text is already in the content; do not ship it twice.
    truncation.content = String::new();
    AgentToolResult::text(text).with_details(json!({ "truncation": truncation }))
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::path::Path;

    use base64::Engine as _;
    use image::ImageFormat;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::decode_gate::DECODE_BUDGET_BYTES;
    use crate::file_tool::test_util::{call, call_with, error, text};
    use crate::image::samples::encoded;
    use crate::testing::StdFiles;

    fn tool(root: &Path) -> ReadTool {
        ReadTool::new(Arc::new(StdFiles::new(root)), ReadOptions::default())
    }

    fn numbered(lines: usize) -> String {
        let mut out = String::new();
        for i in 1..=lines {
            writeln!(out, "Line {i}").unwrap();
        }
        out
    }

    async fn read(dir: &Path, args: Value) -> AgentToolResult {
        call(&tool(dir), args).await.unwrap()
    }

    async fn read_with(tool: &ReadTool, args: Value) -> AgentToolResult {
        call(tool, args).await.unwrap()
    }

    #[test]
    fn definition_matches_reference() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(dir.path());
        assert_eq!(tool.name(), "read");
        assert_eq!(tool.description(), DESCRIPTION);
        assert_eq!(tool.prompt_snippet(), Some("Read file contents"));
        assert_eq!(
            tool.prompt_guidelines(),
            ["Use read to examine files instead of cat or sed."]
        );
        let schema = tool.parameters();
        assert_eq!(schema["required"], json!(["path"]));
        assert_eq!(schema["properties"]["offset"]["type"], "number");
    }

    #[tokio::test]
    async fn reads_a_file_that_fits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "Hello, world!\nLine 2\nLine 3").unwrap();
        let result = read(dir.path(), json!({"path": "a.txt"})).await;
        assert_eq!(text(&result), "Hello, world!\nLine 2\nLine 3");
        assert_eq!(result.details, None);
        assert!(!result.is_error);
    }

    #[tokio::test]
    async fn keeps_the_trailing_newline_of_a_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\ntwo\n").unwrap();
        let result = read(dir.path(), json!({"path": "a.txt"})).await;
        assert_eq!(text(&result), "one\ntwo\n");
    }

    #[tokio::test]
    async fn missing_file_is_enoent() {
        let dir = tempfile::tempdir().unwrap();
        let message = error(call(&tool(dir.path()), json!({"path": "nope.txt"})).await);
        assert_eq!(
            message,
            "ENOENT: file not found: nope.txt. Check the path, or use ls or find to locate the \
             file."
        );
    }

    #[tokio::test]
    async fn paths_outside_the_roots_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("secret.txt");
        std::fs::write(&target, "secret\n").unwrap();
        let path = target.to_str().unwrap();
        let message = error(call(&tool(dir.path()), json!({"path": path})).await);
        assert!(
            message.starts_with(&format!(
                "Could not read file: {path}. The path {path} is outside"
            )),
            "{message}"
        );
    }

    #[tokio::test]
    async fn directory_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let message = error(call(&tool(dir.path()), json!({"path": "sub"})).await);
        assert!(
            message.starts_with("EISDIR: sub is a directory"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn truncates_by_line_count() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.txt"), numbered(2500)).unwrap();
        let result = read(dir.path(), json!({"path": "big.txt"})).await;
        let output = text(&result);
        assert!(output.starts_with("Line 1\nLine 2\n"));
        assert!(output.contains("Line 2000\n"));
        assert!(!output.contains("Line 2001"));
        assert!(
            output.ends_with("\n\n[Showing lines 1-2000 of 2500. Use offset=2001 to continue.]")
        );
        let truncation = &result.details.unwrap()["truncation"];
        assert_eq!(truncation["truncated"], json!(true));
        assert_eq!(truncation["truncatedBy"], json!("lines"));
        assert_eq!(truncation["totalLines"], json!(2500));
        assert_eq!(truncation["outputLines"], json!(2000));
    }

    #[tokio::test]
    async fn truncates_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut content = String::new();
        for i in 1..=500 {
            writeln!(content, "Line {i}: {}", "x".repeat(200)).unwrap();
        }
        std::fs::write(dir.path().join("wide.txt"), content).unwrap();
        let result = read(dir.path(), json!({"path": "wide.txt"})).await;
        let output = text(&result);
        // Lines 1-243 take 51164 bytes with their joining newlines; line 244 would pass 51200.
        assert!(
            output.ends_with(
                "\n\n[Showing lines 1-243 of 500 (50.0KB limit). Use offset=244 to continue.]"
            ),
            "{}",
            &output[output.len() - 100..]
        );
        assert!(output.contains("Line 243: "));
        assert!(!output.contains("Line 244: "));
        assert_eq!(
            result.details.unwrap()["truncation"]["truncatedBy"],
            json!("bytes")
        );
    }

    #[tokio::test]
    async fn offset_shows_the_rest_without_notice() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), numbered(100)).unwrap();
        let result = read(dir.path(), json!({"path": "f.txt", "offset": 51})).await;
        let output = text(&result);
        assert!(output.starts_with("Line 51\n"));
        assert!(output.ends_with("Line 100\n"));
        assert!(!output.contains("Line 50\n"));
        assert!(!output.contains("offset="));
        assert_eq!(result.details, None);
    }

    #[tokio::test]
    async fn limit_adds_a_more_lines_notice() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), numbered(100)).unwrap();
        let result = read(dir.path(), json!({"path": "f.txt", "limit": 10})).await;
        let expected: Vec<String> = (1..=10).map(|i| format!("Line {i}")).collect();
        assert_eq!(
            text(&result),
            format!(
                "{}\n\n[90 more lines in file. Use offset=11 to continue.]",
                expected.join("\n")
            )
        );
        assert_eq!(result.details, None);
    }

    #[tokio::test]
    async fn offset_and_limit_together() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), numbered(100)).unwrap();
        let result = read(
            dir.path(),
            json!({"path": "f.txt", "offset": 41, "limit": 20}),
        )
        .await;
        let output = text(&result);
        assert!(output.starts_with("Line 41\n"));
        assert!(output.contains("Line 60\n\n[40 more lines in file. Use offset=61 to continue.]"));
        assert!(!output.contains("Line 61\n"));
    }

    #[tokio::test]
    async fn limit_reaching_the_end_has_no_notice() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), numbered(10)).unwrap();
        // The trailing newline is not an 11th line, so nothing "more" remains.
        let result = read(
            dir.path(),
            json!({"path": "f.txt", "offset": 6, "limit": 5}),
        )
        .await;
        assert_eq!(text(&result), "Line 6\nLine 7\nLine 8\nLine 9\nLine 10\n");
        let result = read(
            dir.path(),
            json!({"path": "f.txt", "offset": 6, "limit": 50}),
        )
        .await;
        assert_eq!(text(&result), "Line 6\nLine 7\nLine 8\nLine 9\nLine 10\n");
    }

    #[tokio::test]
    async fn offset_beyond_the_end() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "a\nb\nc\n").unwrap();
        let tool = tool(dir.path());
        let message = error(call(&tool, json!({"path": "f.txt", "offset": 100})).await);
        assert_eq!(message, "Offset 100 is beyond end of file (3 lines total)");
        // Line 4 would be the phantom line after the final newline.
        let message = error(call(&tool, json!({"path": "f.txt", "offset": 4})).await);
        assert_eq!(message, "Offset 4 is beyond end of file (3 lines total)");
        let last = call(&tool, json!({"path": "f.txt", "offset": 3}))
            .await
            .unwrap();
        assert_eq!(text(&last), "c\n");
    }

    #[tokio::test]
    async fn offset_zero_means_line_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "a\nb\n").unwrap();
        let result = read(
            dir.path(),
            json!({"path": "f.txt", "offset": 0, "limit": 1}),
        )
        .await;
        assert_eq!(
            text(&result),
            "a\n\n[1 more lines in file. Use offset=2 to continue.]"
        );
    }

    #[tokio::test]
    async fn negative_or_fractional_numbers_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "a\n").unwrap();
        let tool = tool(dir.path());
        let message = error(call(&tool, json!({"path": "f.txt", "offset": -5})).await);
        assert_eq!(message, "offset must not be negative, got -5.");
        let message = error(call(&tool, json!({"path": "f.txt", "limit": -1})).await);
        assert_eq!(message, "limit must be at least 1, got -1.");
        let message = error(call(&tool, json!({"path": "f.txt", "limit": 0})).await);
        assert_eq!(message, "limit must be at least 1, got 0.");
        let message = error(call(&tool, json!({"path": "f.txt", "offset": 1.5})).await);
        assert_eq!(message, "offset must be a whole number, got 1.5.");
    }

    #[tokio::test]
    async fn trailing_newline_is_not_counted_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let content = numbered(2000);
        std::fs::write(dir.path().join("f.txt"), &content).unwrap();
        let result = read(dir.path(), json!({"path": "f.txt"})).await;
        assert_eq!(text(&result), content);
        assert_eq!(result.details, None);
        let result = read(dir.path(), json!({"path": "f.txt", "limit": 1999})).await;
        assert!(
            text(&result)
                .ends_with("Line 1999\n\n[1 more lines in file. Use offset=2000 to continue.]")
        );
    }

    #[tokio::test]
    async fn truncation_counts_lines_without_the_phantom_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), numbered(2001)).unwrap();
        let result = read(dir.path(), json!({"path": "f.txt"})).await;
        assert!(
            text(&result).ends_with("[Showing lines 1-2000 of 2001. Use offset=2001 to continue.]")
        );
    }

    #[tokio::test]
    async fn continuation_from_an_offset_reports_file_lines() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), numbered(5000)).unwrap();
        let result = read(dir.path(), json!({"path": "f.txt", "offset": 2001})).await;
        let output = text(&result);
        assert!(output.starts_with("Line 2001\n"));
        assert!(
            output.ends_with("[Showing lines 2001-4000 of 5000. Use offset=4001 to continue.]")
        );
        let truncation = &result.details.unwrap()["truncation"];
        assert_eq!(truncation["totalLines"], json!(3000));
        assert_eq!(truncation["outputLines"], json!(2000));
    }

    #[tokio::test]
    async fn first_line_over_the_byte_limit_gives_a_quoted_hint() {
        let dir = tempfile::tempdir().unwrap();
        let content = format!("short\n{}\nafter\n", "x".repeat(60_000));
        std::fs::write(dir.path().join("my file.txt"), content).unwrap();
        let tool = tool(dir.path());
        let result = call(&tool, json!({"path": "my file.txt", "offset": 2}))
            .await
            .unwrap();
        let resolved = tool.files.root().join("my file.txt");
        assert_eq!(
            text(&result),
            format!(
                "[Line 2 is 58.6KB, exceeds 50.0KB limit. Use bash: sed -n '2p' '{}' | head -c 51200]",
                resolved.display()
            )
        );
        let truncation = &result.details.unwrap()["truncation"];
        assert_eq!(truncation["firstLineExceedsLimit"], json!(true));
    }

    #[tokio::test]
    async fn crlf_lines_keep_their_carriage_returns() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "a\r\nb\r\nc\r\n").unwrap();
        let result = read(dir.path(), json!({"path": "f.txt", "limit": 2})).await;
        assert_eq!(
            text(&result),
            "a\r\nb\r\n\n[1 more lines in file. Use offset=3 to continue.]"
        );
    }

    #[tokio::test]
    async fn empty_file_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("e.txt"), "").unwrap();
        let result = read(dir.path(), json!({"path": "e.txt"})).await;
        assert_eq!(text(&result), "");
        let message = error(call(&tool(dir.path()), json!({"path": "e.txt", "offset": 2})).await);
        assert_eq!(message, "Offset 2 is beyond end of file (0 lines total)");
    }

    #[tokio::test]
    async fn png_bytes_in_a_txt_file_are_an_image() {
        let dir = tempfile::tempdir().unwrap();
        let png = encoded(3, 2, ImageFormat::Png);
        std::fs::write(dir.path().join("image.txt"), &png).unwrap();
        let result = read(dir.path(), json!({"path": "image.txt"})).await;
        assert_eq!(text(&result), "Read image file [image/png]");
        match &result.content[1] {
            Content::Image { data, mime_type } => {
                assert_eq!(mime_type, "image/png");
                assert_eq!(
                    base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .unwrap(),
                    png
                );
            }
            other => panic!("expected an image block, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn text_in_a_png_file_is_text() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fake.png"), "definitely not a png\n").unwrap();
        let result = read(dir.path(), json!({"path": "fake.png"})).await;
        assert_eq!(result.content.len(), 1);
        assert_eq!(text(&result), "definitely not a png\n");
    }

    #[tokio::test]
    async fn bmp_is_sent_as_png() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pic.bmp"), encoded(4, 4, ImageFormat::Bmp)).unwrap();
        let result = read(dir.path(), json!({"path": "pic.bmp"})).await;
        assert_eq!(
            text(&result),
            "Read image file [image/png]\n[Image converted from image/bmp to image/png.]"
        );
        match &result.content[1] {
            Content::Image { data, mime_type } => {
                assert_eq!(mime_type, "image/png");
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap();
                assert_eq!(bytes[0], 0x89);
            }
            other => panic!("expected an image block, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn large_png_is_resized() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("wide.png"),
            encoded(2100, 42, ImageFormat::Png),
        )
        .unwrap();
        let result = read(dir.path(), json!({"path": "wide.png"})).await;
        assert_eq!(
            text(&result),
            "Read image file [image/png]\n[Image: original 2100x42, displayed at 2000x40. \
             Multiply coordinates by 1.05 to map to original image.]"
        );
        let Content::Image { data, .. } = &result.content[1] else {
            panic!("expected an image block");
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        let decoded = image::load_from_memory(&bytes).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (2000, 40));
    }

    #[tokio::test]
    async fn undecodable_image_is_omitted_with_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let mut png = encoded(30, 30, ImageFormat::Png);
        png.truncate(40); // signature and IHDR intact, the rest gone
        std::fs::write(dir.path().join("broken.png"), &png).unwrap();
        let mut bmp = encoded(30, 30, ImageFormat::Bmp);
        bmp.truncate(60); // headers intact, pixels gone
        std::fs::write(dir.path().join("broken.bmp"), &bmp).unwrap();
        for (file, mime) in [("broken.png", "image/png"), ("broken.bmp", "image/bmp")] {
            let result = read(dir.path(), json!({"path": file})).await;
            assert_eq!(
                text(&result),
                format!(
                    "Read image file [{mime}]\n[Image omitted: could not be converted to a \
                     supported inline image format.]"
                )
            );
            assert_eq!(result.content.len(), 1);
        }
    }

    #[tokio::test]
    async fn png_bomb_is_omitted_without_decoding() {
        let dir = tempfile::tempdir().unwrap();
        let bomb = crate::testing::png_zero_bomb(11_500, 11_500);
        std::fs::write(dir.path().join("bomb.png"), bomb).unwrap();
        let gate = DecodeGate::new(DECODE_BUDGET_BYTES);
        let tool = tool(dir.path()).with_decode_gate(gate.clone());
        let result = read_with(&tool, json!({"path": "bomb.png"})).await;
        assert_eq!(
            text(&result),
            "Read image file [image/png]\n[Image omitted: it is 11500x11500, 132250000 pixels; \
             read decodes at most 67108864 pixels per image. Make a smaller copy with an image \
             tool first (for example ImageMagick: convert FILE -resize 4000x4000 small.png) and \
             read that.]"
        );
        assert_eq!(result.content.len(), 1);
        assert_eq!(gate.counts().peak_running, 0, "nothing was decoded");
    }

    /// A gate with room for `decodes` decodes of `png`, whose decodes each wait for a token
    /// from the returned sender before they start.
    fn held_gate(png: &[u8], decodes: u64) -> (DecodeGate, std::sync::mpsc::Sender<()>) {
        let ImagePlan::Decode(job) = plan_image(png.to_vec(), ImageMime::Png, true) else {
            panic!("the image needs decoding");
        };
        let gate = DecodeGate::new(decodes * job.cost_bytes().next_multiple_of(1 << 20));
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = std::sync::Mutex::new(released);
        gate.on_decode(move || released.lock().unwrap().recv().unwrap());
        (gate, release)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parallel_image_reads_share_the_decode_budget() {
        let dir = tempfile::tempdir().unwrap();
        let png = encoded(2100, 42, ImageFormat::Png);
        std::fs::write(dir.path().join("wide.png"), &png).unwrap();
        let (gate, release) = held_gate(&png, 2);
        let tool = Arc::new(tool(dir.path()).with_decode_gate(gate.clone()));
        let reads: Vec<_> = (0..6)
            .map(|_| {
                let tool = Arc::clone(&tool);
                tokio::spawn(async move { read_with(&tool, json!({"path": "wide.png"})).await })
            })
            .collect();
        // Every read has reached the gate: two decode (held in the hook), four wait.
        let state = *gate
            .watch()
            .wait_for(|counts| counts.running + counts.waiting == 6)
            .await
            .unwrap();
        assert_eq!((state.running, state.waiting), (2, 4));
        for _ in 0..6 {
            release.send(()).unwrap();
        }
        for read in reads {
            let result = read.await.unwrap();
            assert!(text(&result).contains("displayed at 2000x40"), "{result:?}");
        }
        let counts = gate.counts();
        assert_eq!(counts.peak_running, 2);
        assert!(counts.peak_running_bytes <= gate.budget_bytes());
        assert_eq!(
            (counts.running, counts.waiting, counts.running_bytes),
            (0, 0, 0)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_waiting_for_decode_memory_can_be_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let png = encoded(2100, 42, ImageFormat::Png);
        std::fs::write(dir.path().join("wide.png"), &png).unwrap();
        let (gate, release) = held_gate(&png, 1);
        let tool = Arc::new(tool(dir.path()).with_decode_gate(gate.clone()));
        let args = json!({"path": "wide.png"});
        let first = tokio::spawn({
            let (tool, args) = (Arc::clone(&tool), args.clone());
            async move { read_with(&tool, args).await }
        });
        let mut counts = gate.watch();
        counts.wait_for(|counts| counts.running == 1).await.unwrap();
        let cancel = CancellationToken::new();
        let second = tokio::spawn({
            let (tool, args, cancel) = (Arc::clone(&tool), args.clone(), cancel.clone());
            async move { call_with(tool.as_ref(), args, cancel).await }
        });
        counts.wait_for(|counts| counts.waiting == 1).await.unwrap();
        cancel.cancel();
        assert_eq!(error(second.await.unwrap()), ReadError::Aborted.to_string());
        assert_eq!(gate.counts().waiting, 0);
        release.send(()).unwrap();
        assert!(text(&first.await.unwrap()).contains("displayed at 2000x40"));
        // The cancelled wait left the budget whole: the next read decodes.
        release.send(()).unwrap();
        let third = read_with(&tool, args).await;
        assert!(text(&third).contains("displayed at 2000x40"));
        assert_eq!(gate.counts().peak_running, 1);
    }

    #[tokio::test]
    async fn binary_files_get_a_note() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("blob.bin"),
            [0x7f, b'E', b'L', b'F', 0, 1, 2, 3],
        )
        .unwrap();
        std::fs::write(dir.path().join("latin1.txt"), b"caf\xe9 au lait\n").unwrap();
        let result = read(dir.path(), json!({"path": "blob.bin"})).await;
        assert_eq!(
            text(&result),
            "[Binary file not shown: blob.bin (8B, 8 bytes) is not text: it contains NUL bytes. \
             Use bash (e.g. file, xxd or od) to inspect it.]"
        );
        let result = read(dir.path(), json!({"path": "latin1.txt"})).await;
        assert!(text(&result).contains("is not text: it is not valid UTF-8 text"));
    }

    #[test]
    fn binary_sniff_tolerates_a_character_cut_by_the_window() {
        let mut bytes = vec![b'a'; BINARY_SNIFF_BYTES - 1];
        bytes.extend_from_slice("é and more".as_bytes());
        assert_eq!(binary_reason(&bytes), None);
        let cut = &bytes[..BINARY_SNIFF_BYTES];
        assert_eq!(binary_reason(cut), Some("it is not valid UTF-8 text"));
    }

    #[tokio::test]
    async fn reads_macos_screenshot_name_variants() {
        let dir = tempfile::tempdir().unwrap();
        let real = "Screenshot 2024-01-01 at 10.00.00\u{202F}AM.txt";
        std::fs::write(dir.path().join(real), "shot\n").unwrap();
        let result = read(
            dir.path(),
            json!({"path": "Screenshot 2024-01-01 at 10.00.00 AM.txt"}),
        )
        .await;
        assert_eq!(text(&result), "shot\n");
        let curly = "it\u{2019}s.txt";
        std::fs::write(dir.path().join(curly), "quote\n").unwrap();
        assert_eq!(
            text(&read(dir.path(), json!({"path": "it's.txt"})).await),
            "quote\n"
        );
    }

    #[tokio::test]
    async fn reads_nfd_and_curly_quote_variants() {
        let dir = tempfile::tempdir().unwrap();
        // macOS stores accents decomposed; models send them composed.
        std::fs::write(dir.path().join("cafe\u{301}.txt"), "nfd\n").unwrap();
        assert_eq!(
            text(&read(dir.path(), json!({"path": "café.txt"})).await),
            "nfd\n"
        );
        // French screenshots: decomposed accent plus a curly apostrophe.
        let name = "Capture d\u{2019}e\u{301}cran.txt";
        std::fs::write(dir.path().join(name), "both\n").unwrap();
        let result = read(dir.path(), json!({"path": "Capture d'écran.txt"})).await;
        assert_eq!(text(&result), "both\n");
        // Lower-case am/pm with a narrow no-break space (en_AU).
        std::fs::write(dir.path().join("Shot 1.02.03\u{202F}pm.txt"), "pm\n").unwrap();
        let result = read(dir.path(), json!({"path": "Shot 1.02.03 pm.txt"})).await;
        assert_eq!(text(&result), "pm\n");
        // The plain name wins when it exists.
        std::fs::write(dir.path().join("plain's.txt"), "plain\n").unwrap();
        std::fs::write(dir.path().join("plain\u{2019}s.txt"), "curly\n").unwrap();
        assert_eq!(
            text(&read(dir.path(), json!({"path": "plain's.txt"})).await),
            "plain\n"
        );
    }

    #[tokio::test]
    async fn resolves_at_prefix_and_home() {
        let dir = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir_in(dir.path()).unwrap();
        std::fs::write(home.path().join("notes.txt"), "home\n").unwrap();
        std::fs::write(dir.path().join("a.txt"), "at\n").unwrap();
        let files = StdFiles::new(dir.path()).with_home(home.path());
        let tool = ReadTool::new(Arc::new(files), ReadOptions::default());
        let result = call(&tool, json!({"path": "@a.txt"})).await.unwrap();
        assert_eq!(text(&result), "at\n");
        let result = call(&tool, json!({"path": "~/notes.txt"})).await.unwrap();
        assert_eq!(text(&result), "home\n");
    }

    #[tokio::test]
    async fn cancelled_call_is_aborted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "a\n").unwrap();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let outcome = call_with(&tool(dir.path()), json!({"path": "f.txt"}), cancel).await;
        assert_eq!(error(outcome), "Operation aborted");
    }

    #[test]
    fn line_helpers() {
        let text = "a\nbb\nccc";
        assert_eq!(end_of_lines(text, 0, 1), Some(1));
        assert_eq!(end_of_lines(text, 2, 1), Some(4));
        assert_eq!(end_of_lines(text, 2, 2), None);
        assert_eq!(end_of_lines(text, 5, 0), Some(5));
    }

    /// Every text scenario must render the same whether the file arrives in one chunk or in
    /// many tiny ones (the streaming path against the single-read path).
    #[tokio::test]
    async fn streaming_in_small_chunks_renders_like_one_read() {
        let dir = tempfile::tempdir().unwrap();
        let long_line = format!("{}\nshort\n", "x".repeat(60_000));
        let mut wide = String::new();
        for i in 1..=500 {
            writeln!(wide, "Line {i}: {}", "y".repeat(200)).unwrap();
        }
        let files: [(&str, String); 8] = [
            ("empty.txt", String::new()),
            ("one.txt", "just one line".to_owned()),
            ("nl.txt", "a\nb\n".to_owned()),
            ("crlf.txt", "a\r\nb\r\nc".to_owned()),
            ("many.txt", numbered(2500)),
            ("wide.txt", wide),
            ("long.txt", long_line),
            ("utf8.txt", "é\n".repeat(3000)),
        ];
        for (name, content) in &files {
            std::fs::write(dir.path().join(name), content).unwrap();
        }
        let views = [
            json!({}),
            json!({"offset": 1}),
            json!({"offset": 2}),
            json!({"offset": 3}),
            json!({"limit": 1}),
            json!({"limit": 2}),
            json!({"offset": 2, "limit": 1}),
            json!({"offset": 2, "limit": 5}),
            json!({"offset": 1990, "limit": 20}),
            json!({"offset": 2400}),
            json!({"offset": 2501}),
            json!({"offset": 9999}),
        ];
        let whole = tool(dir.path());
        for chunk in [31, 1000, 4096] {
            let streamed = tool(dir.path()).with_chunking(chunk, u64::MAX);
            for (name, _) in &files {
                for view in &views {
                    let mut args = view.clone();
                    args["path"] = json!(name);
                    let expected = call(&whole, args.clone()).await;
                    let got = call(&streamed, args.clone()).await;
                    match (expected, got) {
                        (Ok(expected), Ok(got)) => {
                            assert_eq!(got, expected, "chunk {chunk}, {args}")
                        }
                        (Err(expected), Err(got)) => {
                            assert_eq!(
                                got.to_string(),
                                expected.to_string(),
                                "chunk {chunk}, {args}"
                            )
                        }
                        (expected, got) => panic!("chunk {chunk}, {args}: {expected:?} vs {got:?}"),
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn a_file_past_the_scan_budget_is_shown_without_a_total() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.txt"), numbered(5000)).unwrap();
        let streamed = tool(dir.path()).with_chunking(1000, 20_000);
        let result = read_with(&streamed, json!({"path": "big.txt"})).await;
        let output = text(&result);
        assert!(output.starts_with("Line 1\n"), "{output}");
        assert!(
            output.ends_with(
                "\n\n[Showing lines 1-2000; the file was not read past its first 19.5KB, so its \
                 lines were not all counted. Use offset=2001 to continue.]"
            ),
            "{}",
            &output[output.len() - 200..]
        );
        let limited = read_with(&streamed, json!({"path": "big.txt", "limit": 3})).await;
        assert_eq!(
            text(&limited),
            "Line 1\nLine 2\nLine 3\n\n[More lines in file (the file was not read past its \
             first 19.5KB, so its lines were not all counted). Use offset=4 to continue.]"
        );
        let far = error(call(&streamed, json!({"path": "big.txt", "offset": 4900})).await);
        assert!(
            far.starts_with("Offset 4900 is beyond the first 2"),
            "{far}"
        );
        assert!(far.contains("tail -n +4900"), "{far}");
    }

    /// A 1 TiB sparse file used to be loaded whole (the process aborted on the allocation).
    #[tokio::test]
    async fn a_huge_sparse_file_is_a_binary_note_from_its_first_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("big.bin")).unwrap();
        file.set_len(1 << 40).unwrap();
        let result = read(dir.path(), json!({"path": "big.bin"})).await;
        assert_eq!(
            text(&result),
            "[Binary file not shown: big.bin (1048576.0MB, 1099511627776 bytes) is not text: it \
             contains NUL bytes. Use bash (e.g. file, xxd or od) to inspect it.]"
        );
        assert_eq!(
            result.details,
            Some(json!({"binary": true, "size": 1u64 << 40}))
        );
    }

    /// Text that goes on for far longer than any read shows: streamed, not loaded.
    #[tokio::test]
    async fn a_huge_sparse_text_file_streams_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.txt");
        {
            use std::io::Write as _;
            let mut file = std::fs::File::create(&path).unwrap();
            // More text than binary sniffing looks at, then a sparse tail of NULs that read
            // scans (without a line break) up to its budget and never loads.
            file.write_all(numbered(2000).as_bytes()).unwrap();
            file.set_len(1 << 40).unwrap();
        }
        let result = read(dir.path(), json!({"path": "log.txt", "limit": 2})).await;
        assert_eq!(
            text(&result),
            "Line 1\nLine 2\n\n[More lines in file (the file was not read past its first \
             256.0MB, so its lines were not all counted). Use offset=3 to continue.]"
        );
    }
}
