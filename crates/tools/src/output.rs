//! The bash output accumulator (docs/semantics.md#bash): turns the raw byte stream of a command
//! into what the model sees, with memory bounded whatever the output size.
//!
//! It owns:
//! - streaming UTF-8 decoding (a character split across chunks decodes intact; invalid bytes
//!   become U+FFFD);
//! - counters over the whole stream (raw bytes, decoded bytes, lines, size of the last line);
//! - a rolling tail of decoded text (the last [`TAIL_KEEP_BYTES`], at most a little more),
//!   from which snapshots are sanitised ([`crate::sanitize`]) and tail-truncated;
//! - the spill file: once ANY limit is crossed (raw bytes, decoded bytes, lines) the raw bytes
//!   so far and every later chunk go to [`FileOperations::create_spill_file`] through big
//!   buffered writes. Awaiting those writes is the back-pressure on the command.
//!
//! The raw path does no per-line work: per chunk it validates UTF-8, counts newlines and
//! copies the bytes into the spill buffer. Sanitising only touches the tail that is kept.
//! It does not run commands or build tool results (see [`crate::bash`]).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cordon_ops::{FileOperations, FsError, SpillWriter};
use tokio::io::{AsyncWriteExt, BufWriter};

use crate::sanitize::sanitize;
use crate::truncate::{Limits, TruncatedBy, Truncation, format_size, truncate_tail};

/// How much decoded output the tail keeps: the cap of bash's structured `output` (1 MiB).
pub const TAIL_KEEP_BYTES: usize = 1024 * 1024;
/// Window of the tail sanitised for a streaming update (the final result uses the whole tail).
const UPDATE_WINDOW_BYTES: usize = 128 * 1024;
/// Small decoded pieces are coalesced into segments of about this size.
const SEGMENT_BYTES: usize = 64 * 1024;
/// Buffer of the spill writer: small chunks are gathered to this size, larger ones are written
/// as they come (measured faster than bigger buffers: the data is still in cache).
const SPILL_BUFFER_BYTES: usize = 64 * 1024;

/// Why the full output could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    /// The backend could not create a spill file.
    #[error("failed to create the full-output file: {source}")]
    Create {
        /// The backend's error.
        #[source]
        source: FsError,
    },
    /// Writing to the spill file failed part-way; the file is incomplete.
    #[error("failed to write the full-output file {path}: {source}")]
    Write {
        /// The spill file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Where the full raw output is, when a limit was crossed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FullOutput {
    /// No limit was crossed; nothing was spilled.
    NotNeeded,
    /// The whole raw output is in this file.
    Saved(PathBuf),
    /// The spill hit its cap: the file holds the first `saved` raw bytes only.
    Capped {
        /// The spill file.
        path: PathBuf,
        /// Raw bytes saved.
        saved: u64,
        /// Which cap stopped it.
        by: SpillCap,
    },
    /// Spilling failed; `path` (if any) holds an incomplete copy.
    Failed {
        /// The incomplete file, if it was created.
        path: Option<PathBuf>,
        /// What failed, for the model.
        error: String,
    },
}

impl FullOutput {
    /// The spill file path, complete or not.
    pub fn path(&self) -> Option<&PathBuf> {
        match self {
            FullOutput::NotNeeded => None,
            FullOutput::Saved(path) | FullOutput::Capped { path, .. } => Some(path),
            FullOutput::Failed { path, .. } => path.as_ref(),
        }
    }
}

/// Which bound stopped a spill file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpillCap {
    /// The per-command cap (policy `[limits] spill`).
    Command,
    /// The session's total spill space (policy `[limits] spill_session`) is used up.
    Session,
}

/// Spill space left for a whole session, shared by all its commands, so a session cannot fill
/// the disk with spill files however many commands it runs.
#[derive(Debug)]
pub struct SpillAccount {
    left: AtomicU64,
}

impl SpillAccount {
    /// An account of `total` bytes.
    pub fn new(total: u64) -> Self {
        SpillAccount {
            left: AtomicU64::new(total),
        }
    }

    /// Bytes still available.
    pub fn left(&self) -> u64 {
        self.left.load(Ordering::SeqCst)
    }

    /// Take up to `wanted` bytes; returns how many were granted.
    fn take(&self, wanted: u64) -> u64 {
        let mut granted = 0;
        // fetch_update's Err only says no bytes were left: `granted` stays 0.
        let _ = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                granted = left.min(wanted);
                Some(left - granted)
            });
        granted
    }
}

/// The bounds of one command's spill file.
#[derive(Clone, Debug, Default)]
pub struct SpillLimits {
    /// Most raw bytes one spill file keeps (`None`: no cap).
    pub per_command: Option<u64>,
    /// The session's account every spilled byte is taken from (`None`: unaccounted).
    pub session: Option<Arc<SpillAccount>>,
}

/// What the model sees of the output at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Sanitised, tail-truncated text (no footer).
    pub text: String,
    /// Truncation stats; totals are over the whole output.
    pub truncation: Truncation,
    /// Size in bytes of the last line (for the partial-line footer), even when the output
    /// ends with a newline.
    pub last_line_bytes: usize,
    /// Where the full output is.
    pub full_output: FullOutput,
    /// Secrets replaced in the held window before truncation (see [`Redact`]).
    pub redactions: usize,
}

impl Snapshot {
    /// The footer for truncated output (`[Showing lines S-E of T. Full output: PATH]`, the
    /// `(50.0KB limit)` variant, or `[Showing last X of line E (line is Y). …]`), `None` when
    /// nothing was cut.
    pub fn footer(&self) -> Option<String> {
        let t = &self.truncation;
        if !t.truncated {
            return None;
        }
        let end = t.total_lines;
        let start = end.saturating_sub(t.output_lines) + 1;
        let shown = if t.last_line_partial {
            format!(
                "Showing last {} of line {end} (line is {})",
                format_size(t.output_bytes),
                format_size(self.last_line_bytes)
            )
        } else {
            match t.truncated_by {
                Some(TruncatedBy::Bytes) => format!(
                    "Showing lines {start}-{end} of {end} ({} limit)",
                    format_size(t.max_bytes)
                ),
                Some(TruncatedBy::Lines) | None => {
                    format!("Showing lines {start}-{end} of {end}")
                }
            }
        };
        let full = match &self.full_output {
            FullOutput::Saved(path) => format!("Full output: {}", path.display()),
            FullOutput::Capped { path, saved, by } => {
                let bound = match by {
                    SpillCap::Command => "the per-command cap, policy `[limits] spill`",
                    SpillCap::Session => {
                        "the session's spill space is used up, policy `[limits] spill_session`"
                    }
                };
                format!(
                    "Full output capped: only the first {} are saved in {} ({bound}); the tail \
                     above is the real end of the output",
                    format_size(usize::try_from(*saved).unwrap_or(usize::MAX)),
                    path.display()
                )
            }
            FullOutput::Failed {
                path: Some(path),
                error,
            } => format!("Incomplete full output: {} ({error})", path.display()),
            FullOutput::Failed { path: None, error } => {
                format!("Full output could not be saved: {error}")
            }
            FullOutput::NotNeeded => "Full output was not saved".to_owned(),
        };
        Some(format!("[{shown}. {full}]"))
    }
}

/// The accumulator's final state.
#[derive(Clone, Debug, PartialEq)]
pub struct FinalOutput {
    /// What the model sees (bash's structured `output` is this same truncated text, so a
    /// client that shows the structured copy gives the model no more and no less).
    pub snapshot: Snapshot,
    /// Whether any byte was received.
    pub had_output: bool,
}

/// Memory use of one accumulator, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccumulatorStats {
    /// Raw bytes received.
    pub raw_bytes: u64,
    /// Decoded bytes (UTF-8, after U+FFFD replacement).
    pub decoded_bytes: u64,
    /// Most capacity the tail segments ever held, in bytes.
    pub tail_capacity_high_water: usize,
    /// Most raw bytes ever buffered before the spill file existed.
    pub prespill_high_water: usize,
}

enum Spill {
    /// No limit crossed yet: raw bytes kept (bounded by the limits plus one chunk).
    Buffering(Vec<u8>),
    /// Streaming into the spill file.
    Writing {
        path: PathBuf,
        writer: BufWriter<SpillWriter>,
    },
    /// Finished (or failed); nothing more is written.
    Done(FullOutput),
}

/// A contiguous view of the end of the held tail.
struct TailView {
    text: String,
    /// The view starts at the very beginning of the output.
    complete: bool,
    /// The view starts right after a newline (or at the beginning of the output).
    at_line_start: bool,
}

/// Removes secrets from a text (the policy's redaction), applied to the held tail *before*
/// it is truncated, so a secret cut by the truncation point cannot show its remainder.
/// Returns the redacted text and the number of replacements.
pub type Redact = Arc<dyn Fn(&str) -> (String, usize) + Send + Sync>;

/// Accumulates one command's output; see the module docs.
pub struct OutputAccumulator {
    files: Arc<dyn FileOperations>,
    limits: Limits,
    redact: Option<Redact>,
    keep: usize,
    pending: Vec<u8>,
    raw_bytes: u64,
    decoded_bytes: u64,
    newlines: u64,
    current_line: u64,
    last_complete_line: u64,
    segments: VecDeque<String>,
    held: usize,
    dropped_any: bool,
    front_at_line_start: bool,
    spill: Spill,
    spill_limits: SpillLimits,
    spilled: u64,
    stats: AccumulatorStats,
}

impl OutputAccumulator {
    /// A new accumulator with the given truncation limits, spilling through `files`.
    pub fn new(files: Arc<dyn FileOperations>, limits: Limits) -> Self {
        Self::with_keep(files, limits, TAIL_KEEP_BYTES)
    }

    fn with_keep(files: Arc<dyn FileOperations>, limits: Limits, keep: usize) -> Self {
        OutputAccumulator {
            files,
            limits,
            redact: None,
            keep: keep.max(limits.max_bytes),
            pending: Vec::new(),
            raw_bytes: 0,
            decoded_bytes: 0,
            newlines: 0,
            current_line: 0,
            last_complete_line: 0,
            segments: VecDeque::new(),
            held: 0,
            dropped_any: false,
            front_at_line_start: true,
            spill: Spill::Buffering(Vec::new()),
            spill_limits: SpillLimits::default(),
            spilled: 0,
            stats: AccumulatorStats::default(),
        }
    }

    /// Bound the spill file by `limits` (by default it is unbounded).
    pub fn limit_spill(&mut self, limits: SpillLimits) {
        self.spill_limits = limits;
    }

    /// Redact every snapshot's text with `redact` before truncating it (the held window is
    /// much larger than what is shown, so a secret straddling the cut is whole when redacted).
    pub fn redact_with(&mut self, redact: Redact) {
        self.redact = Some(redact);
    }

    /// Take one raw chunk. Awaits the spill file's writes (back-pressure).
    pub async fn push(&mut self, chunk: Vec<u8>) {
        if chunk.is_empty() {
            return;
        }
        self.raw_bytes += chunk.len() as u64;
        match &mut self.spill {
            Spill::Buffering(buffer) => {
                buffer.extend_from_slice(&chunk);
                self.stats.prespill_high_water = self.stats.prespill_high_water.max(buffer.len());
            }
            Spill::Writing { .. } => self.write_spill(&chunk).await,
            Spill::Done(_) => {}
        }
        self.decode(chunk);
        if matches!(self.spill, Spill::Buffering(_)) && self.limit_crossed() {
            self.start_spill().await;
        }
    }

    /// Whether any byte was received.
    pub fn has_output(&self) -> bool {
        self.raw_bytes > 0
    }

    /// Memory and volume counters.
    pub fn stats(&self) -> AccumulatorStats {
        AccumulatorStats {
            raw_bytes: self.raw_bytes,
            decoded_bytes: self.decoded_bytes,
            ..self.stats
        }
    }

    /// What the model would see now (cheap: sanitises a bounded window of the tail).
    pub fn snapshot(&self) -> Snapshot {
        let view = self.view(UPDATE_WINDOW_BYTES);
        self.snapshot_of(&view)
    }

    /// Finish: decode any incomplete trailing character as U+FFFD, flush and close the spill
    /// file, and build the final snapshot.
    pub async fn finish(mut self) -> (FinalOutput, AccumulatorStats) {
        if !self.pending.is_empty() {
            self.pending.clear();
            self.take_text("\u{FFFD}".to_owned());
        }
        let spill = std::mem::replace(&mut self.spill, Spill::Done(FullOutput::NotNeeded));
        self.spill = Spill::Done(match spill {
            Spill::Buffering(_) => FullOutput::NotNeeded,
            Spill::Writing { path, mut writer } => match close_spill(&mut writer).await {
                Ok(()) => FullOutput::Saved(path),
                Err(source) => FullOutput::Failed {
                    error: SpillError::Write {
                        path: path.clone(),
                        source,
                    }
                    .to_string(),
                    path: Some(path),
                },
            },
            Spill::Done(full) => full,
        });
        let view = self.view(self.keep);
        let snapshot = self.snapshot_of(&view);
        let stats = self.stats();
        (
            FinalOutput {
                snapshot,
                had_output: self.raw_bytes > 0,
            },
            stats,
        )
    }

    fn total_lines(&self) -> usize {
        let open = usize::from(self.current_line > 0 || !self.pending.is_empty());
        self.newlines as usize + open
    }

    fn limit_crossed(&self) -> bool {
        let max_bytes = self.limits.max_bytes as u64;
        self.raw_bytes > max_bytes
            || self.decoded_bytes > max_bytes
            || self.total_lines() > self.limits.max_lines
    }

    async fn start_spill(&mut self) {
        let Spill::Buffering(buffer) =
            std::mem::replace(&mut self.spill, Spill::Buffering(Vec::new()))
        else {
            return;
        };
        self.spill = match self.files.create_spill_file().await {
            Ok((path, file)) => Spill::Writing {
                path,
                writer: BufWriter::with_capacity(SPILL_BUFFER_BYTES, file),
            },
            Err(source) => Spill::Done(FullOutput::Failed {
                path: None,
                error: SpillError::Create { source }.to_string(),
            }),
        };
        if matches!(self.spill, Spill::Writing { .. }) {
            self.write_spill(&buffer).await;
        }
    }

    /// How much of `wanted` more bytes the spill may take, and which cap cut it.
    fn grant_spill(&self, wanted: u64) -> (u64, Option<SpillCap>) {
        let mut granted = wanted;
        let mut cut = None;
        if let Some(cap) = self.spill_limits.per_command {
            let room = cap.saturating_sub(self.spilled);
            if room < granted {
                granted = room;
                cut = Some(SpillCap::Command);
            }
        }
        if let Some(account) = &self.spill_limits.session {
            let taken = account.take(granted);
            if taken < granted {
                granted = taken;
                cut = Some(SpillCap::Session);
            }
        }
        (granted, cut)
    }

    /// Append raw bytes to the open spill file, up to its caps; the first refused byte closes
    /// it as [`FullOutput::Capped`].
    async fn write_spill(&mut self, data: &[u8]) {
        let (granted, cut) = self.grant_spill(data.len() as u64);
        let Spill::Writing { path, writer } = &mut self.spill else {
            return;
        };
        let granted_len = usize::try_from(granted).unwrap_or(data.len());
        if let Err(source) = writer.write_all(&data[..granted_len]).await {
            let path = path.clone();
            self.spill = Spill::Done(FullOutput::Failed {
                error: SpillError::Write {
                    path: path.clone(),
                    source,
                }
                .to_string(),
                path: Some(path),
            });
            return;
        }
        self.spilled += granted;
        let Some(by) = cut else {
            return;
        };
        let Spill::Writing { path, mut writer } =
            std::mem::replace(&mut self.spill, Spill::Done(FullOutput::NotNeeded))
        else {
            return;
        };
        self.spill = Spill::Done(match close_spill(&mut writer).await {
            Ok(()) => FullOutput::Capped {
                path,
                saved: self.spilled,
                by,
            },
            Err(source) => FullOutput::Failed {
                error: SpillError::Write {
                    path: path.clone(),
                    source,
                }
                .to_string(),
                path: Some(path),
            },
        });
    }

    /// Streaming UTF-8 decode of one chunk into the tail and counters. Valid chunks move into
    /// the tail without a copy.
    fn decode(&mut self, chunk: Vec<u8>) {
        let mut bytes = chunk;
        let mut out = String::new();
        let mut start = 0;
        let had_pending = !self.pending.is_empty();
        if had_pending {
            start = self.complete_pending(&bytes, &mut out);
            if start == usize::MAX {
                return; // still incomplete; everything went into `pending`
            }
            self.take_text(std::mem::take(&mut out));
        }
        if !had_pending {
            match String::from_utf8(bytes) {
                Ok(text) => {
                    self.take_text(text);
                    return;
                }
                Err(error) => {
                    let utf8 = error.utf8_error();
                    bytes = error.into_bytes();
                    if utf8.error_len().is_none() {
                        // Only an incomplete character at the end: keep it, move the rest.
                        let valid = utf8.valid_up_to();
                        self.pending = bytes[valid..].to_vec();
                        bytes.truncate(valid);
                        if let Ok(text) = String::from_utf8(bytes) {
                            self.take_text(text);
                        }
                        return;
                    }
                }
            }
        }
        let mut input = &bytes[start..];
        loop {
            match std::str::from_utf8(input) {
                Ok(text) => {
                    out.push_str(text);
                    break;
                }
                Err(error) => {
                    let valid = error.valid_up_to();
                    out.push_str(std::str::from_utf8(&input[..valid]).unwrap_or_default());
                    match error.error_len() {
                        None => {
                            self.pending = input[valid..].to_vec();
                            break;
                        }
                        Some(len) => {
                            out.push('\u{FFFD}');
                            input = &input[valid + len..];
                        }
                    }
                }
            }
        }
        if !out.is_empty() {
            self.take_text(out);
        }
    }

    /// Complete the character held in `pending` with the first bytes of `bytes`. Returns how
    /// many bytes of `bytes` were used, or `usize::MAX` if the character is still incomplete
    /// (then all of `bytes` joined `pending`).
    fn complete_pending(&mut self, bytes: &[u8], out: &mut String) -> usize {
        let held = self.pending.len();
        let width = utf8_width(self.pending[0]);
        let take = width.saturating_sub(held).min(bytes.len());
        let mut joined = std::mem::take(&mut self.pending);
        joined.extend_from_slice(&bytes[..take]);
        match std::str::from_utf8(&joined) {
            Ok(text) => {
                out.push_str(text);
                take
            }
            Err(error) => match error.error_len() {
                None => {
                    self.pending = joined;
                    usize::MAX
                }
                Some(len) => {
                    // The invalid prefix always covers the held bytes (they were a valid
                    // prefix); the rest of the chunk is decoded afresh after it.
                    out.push('\u{FFFD}');
                    len.saturating_sub(held)
                }
            },
        }
    }

    /// Count a piece of decoded text and add it to the tail.
    fn take_text(&mut self, text: String) {
        let bytes = text.as_bytes();
        self.decoded_bytes += bytes.len() as u64;
        match memchr::memrchr(b'\n', bytes) {
            Some(last) => {
                self.newlines += memchr::memchr_iter(b'\n', bytes).count() as u64;
                self.last_complete_line = match memchr::memrchr(b'\n', &bytes[..last]) {
                    Some(previous) => (last - previous - 1) as u64,
                    None => self.current_line + last as u64,
                };
                self.current_line = (bytes.len() - last - 1) as u64;
            }
            None => self.current_line += bytes.len() as u64,
        }
        self.push_segment(text);
    }

    fn push_segment(&mut self, text: String) {
        if text.len() >= self.keep {
            // Everything held is superseded; keep only the end of this piece.
            let mut cut = text.len() - self.keep;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            let last_dropped = if cut > 0 {
                Some(text.as_bytes()[cut - 1])
            } else {
                self.segments
                    .back()
                    .and_then(|s| s.as_bytes().last().copied())
            };
            if let Some(byte) = last_dropped {
                self.front_at_line_start = byte == b'\n';
                self.dropped_any = true;
            }
            self.segments.clear();
            self.held = text.len() - cut;
            self.segments.push_back(if cut == 0 {
                text
            } else {
                text[cut..].to_owned()
            });
        } else {
            self.held += text.len();
            if text.len() >= SEGMENT_BYTES {
                // Big pieces are kept as they came (no copy).
                let mut text = text;
                if text.capacity() > text.len() + text.len() / 2 {
                    text.shrink_to_fit();
                }
                self.segments.push_back(text);
            } else {
                // Small pieces are gathered into segments of at most SEGMENT_BYTES that grow by
                // doubling, so capacity stays close to what is held.
                match self.segments.back_mut() {
                    Some(last) if last.len() + text.len() <= SEGMENT_BYTES => last.push_str(&text),
                    _ => {
                        let capacity = text.len().next_power_of_two().clamp(4096, SEGMENT_BYTES);
                        let mut segment = String::with_capacity(capacity);
                        segment.push_str(&text);
                        self.segments.push_back(segment);
                    }
                }
            }
            while let Some(front) = self.segments.front() {
                if self.held - front.len() < self.keep {
                    break;
                }
                self.front_at_line_start = front.as_bytes().last() == Some(&b'\n');
                self.dropped_any = true;
                self.held -= front.len();
                self.segments.pop_front();
            }
        }
        let capacity: usize = self.segments.iter().map(String::capacity).sum();
        self.stats.tail_capacity_high_water = self.stats.tail_capacity_high_water.max(capacity);
    }

    /// The last at most `max_bytes` bytes of the held tail (starting on a char boundary).
    fn view(&self, max_bytes: usize) -> TailView {
        let wanted = max_bytes.min(self.held);
        let mut pieces: Vec<&str> = Vec::new();
        let mut taken = 0;
        let mut before: Option<u8> = None;
        for segment in self.segments.iter().rev() {
            if taken + segment.len() <= wanted {
                pieces.push(segment);
                taken += segment.len();
                continue;
            }
            let mut cut = segment.len() - (wanted - taken);
            while !segment.is_char_boundary(cut) {
                cut += 1;
            }
            if cut < segment.len() {
                pieces.push(&segment[cut..]);
                taken += segment.len() - cut;
            }
            before = segment.as_bytes()[..cut].last().copied();
            break;
        }
        let reached_front = taken == self.held;
        let before = if reached_front {
            None
        } else {
            before.or_else(|| {
                // The cut fell exactly between two segments.
                let index = self.segments.len() - pieces.len() - 1;
                self.segments[index].as_bytes().last().copied()
            })
        };
        let mut text = String::with_capacity(taken);
        for piece in pieces.iter().rev() {
            text.push_str(piece);
        }
        TailView {
            text,
            complete: reached_front && !self.dropped_any,
            at_line_start: match before {
                Some(byte) => byte == b'\n',
                None => self.front_at_line_start,
            },
        }
    }

    /// Sanitise and truncate a view. Returns the snapshot and the whole sanitised view.
    fn snapshot_of(&self, view: &TailView) -> Snapshot {
        let text = view.text.as_str();
        // A view that starts mid-line drops that partial first line, unless the view is all
        // one line (then it is the end of the last line).
        let body_end = text.strip_suffix('\n').map_or(text.len(), str::len);
        let (visible, fragment) = if view.complete || view.at_line_start {
            (text, false)
        } else {
            match memchr::memchr(b'\n', &text.as_bytes()[..body_end]) {
                Some(index) => (&text[index + 1..], false),
                None => (text, true),
            }
        };
        let clean = sanitize(visible).into_owned();
        let (clean, redactions) = match &self.redact {
            Some(redact) => redact(&clean),
            None => (clean, 0),
        };
        let mut truncation = truncate_tail(&clean, self.limits);
        if !view.complete {
            truncation.truncated = true;
            truncation.total_lines = self.total_lines();
            truncation.total_bytes = self.decoded_bytes as usize;
            if fragment {
                truncation.last_line_partial = true;
                truncation.output_lines = 1;
            }
            if truncation.truncated_by.is_none() {
                truncation.truncated_by = Some(if truncation.total_lines > self.limits.max_lines {
                    TruncatedBy::Lines
                } else {
                    TruncatedBy::Bytes
                });
            }
        }
        let last_line_bytes = if fragment {
            let ends_with_newline = self.current_line == 0 && self.newlines > 0;
            if ends_with_newline {
                self.last_complete_line as usize
            } else {
                self.current_line as usize
            }
        } else {
            let body = clean.strip_suffix('\n').unwrap_or(&clean);
            body.rfind('\n')
                .map_or(body.len(), |index| body.len() - index - 1)
        };
        let full_output = match &self.spill {
            Spill::Buffering(_) => FullOutput::NotNeeded,
            Spill::Writing { path, .. } => FullOutput::Saved(path.clone()),
            Spill::Done(full) => full.clone(),
        };
        Snapshot {
            text: std::mem::take(&mut truncation.content),
            truncation,
            last_line_bytes,
            full_output,
            redactions,
        }
    }
}

async fn close_spill(writer: &mut BufWriter<SpillWriter>) -> std::io::Result<()> {
    writer.flush().await?;
    writer.shutdown().await
}

/// Length of the UTF-8 sequence a lead byte starts (1 for anything else, so an invalid lead
/// byte is replaced on its own).
fn utf8_width(lead: u8) -> usize {
    match lead {
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => 1,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testing::StdFiles;
    use crate::truncate::{DEFAULT_MAX_BYTES, DEFAULT_MAX_LINES};

    fn files() -> (tempfile::TempDir, Arc<dyn FileOperations>) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        let files: Arc<dyn FileOperations> = Arc::new(StdFiles::new(&root));
        (dir, files)
    }

    /// Feed `chunks`; the spill directory lives as long as the returned guard.
    async fn run_keep(chunks: Vec<Vec<u8>>) -> (tempfile::TempDir, FinalOutput, AccumulatorStats) {
        let (dir, files) = files();
        let mut acc = OutputAccumulator::new(files, Limits::default());
        for chunk in chunks {
            acc.push(chunk).await;
        }
        let (out, stats) = acc.finish().await;
        (dir, out, stats)
    }

    async fn run(chunks: Vec<Vec<u8>>) -> (FinalOutput, AccumulatorStats) {
        let (_dir, out, stats) = run_keep(chunks).await;
        (out, stats)
    }

    #[tokio::test]
    async fn small_output_is_untouched_and_not_spilled() {
        let (out, _) = run(vec![b"hello\n".to_vec(), b"world\n".to_vec()]).await;
        assert_eq!(out.snapshot.text, "hello\nworld\n");
        assert!(!out.snapshot.truncation.truncated);
        assert_eq!(out.snapshot.full_output, FullOutput::NotNeeded);
        assert!(out.had_output);
    }

    #[tokio::test]
    async fn utf8_split_across_chunks_decodes() {
        let euro = "€".as_bytes();
        let (out, _) = run(vec![
            [b"a".as_slice(), &euro[..1]].concat(),
            euro[1..2].to_vec(),
            [&euro[2..], b"b".as_slice()].concat(),
        ])
        .await;
        assert_eq!(out.snapshot.text, "a€b");
        let emoji = "🙂".as_bytes();
        let chunks: Vec<Vec<u8>> = emoji.iter().map(|b| vec![*b]).collect();
        let (out, _) = run(chunks).await;
        assert_eq!(out.snapshot.text, "🙂");
    }

    #[tokio::test]
    async fn invalid_bytes_become_replacement_characters() {
        let (out, _) = run(vec![b"a\xffb".to_vec(), vec![0xe2, 0x82], b"x".to_vec()]).await;
        assert_eq!(out.snapshot.text, "a\u{FFFD}b\u{FFFD}x");
        // An incomplete character at the very end is flushed as U+FFFD.
        let (out, _) = run(vec![b"end".to_vec(), vec![0xf0, 0x9f]]).await;
        assert_eq!(out.snapshot.text, "end\u{FFFD}");
        assert_eq!(out.snapshot.truncation.total_lines, 1);
    }

    async fn spill_with(
        files: &Arc<dyn FileOperations>,
        limits: SpillLimits,
        lines: std::ops::RangeInclusive<u32>,
    ) -> (FinalOutput, Vec<u8>) {
        let mut acc = OutputAccumulator::new(files.clone(), Limits::default());
        acc.limit_spill(limits);
        let mut raw = Vec::new();
        for i in lines {
            let line = format!("line {i:06} {}\n", "z".repeat(40)).into_bytes();
            raw.extend_from_slice(&line);
            acc.push(line).await;
        }
        (acc.finish().await.0, raw)
    }

    #[tokio::test]
    async fn the_spill_stops_at_its_cap_and_the_tail_stays_the_real_end() {
        let (_dir, files) = files();
        let (capped, raw) = spill_with(
            &files,
            SpillLimits {
                per_command: Some(100_000),
                session: None,
            },
            1..=20_000,
        )
        .await;
        let (uncapped, _) = spill_with(&files, SpillLimits::default(), 1..=20_000).await;
        let FullOutput::Capped { path, saved, by } = &capped.snapshot.full_output else {
            panic!(
                "expected a capped spill, got {:?}",
                capped.snapshot.full_output
            )
        };
        assert_eq!((*saved, *by), (100_000, SpillCap::Command));
        assert_eq!(std::fs::read(path).unwrap(), raw[..100_000]);
        // What the model sees is the end of the output, not of the capped file.
        assert_eq!(capped.snapshot.text, uncapped.snapshot.text);
        assert!(
            capped
                .snapshot
                .text
                .ends_with(&format!("line 020000 {}", "z".repeat(40)))
        );
        assert_eq!(
            capped.snapshot.footer().unwrap(),
            format!(
                "[Showing lines 19035-20000 of 20000 (50.0KB limit). Full output capped: only \
                 the first 97.7KB are saved in {} (the per-command cap, policy `[limits] \
                 spill`); the tail above is the real end of the output]",
                path.display()
            )
        );
    }

    #[tokio::test]
    async fn commands_of_one_session_share_its_spill_space() {
        let (_dir, files) = files();
        let account = Arc::new(SpillAccount::new(1_500_000));
        let limits = SpillLimits {
            per_command: None,
            session: Some(account.clone()),
        };
        let (first, raw) = spill_with(&files, limits.clone(), 1..=20_000).await;
        assert!(matches!(first.snapshot.full_output, FullOutput::Saved(_)));
        assert_eq!(account.left(), 1_500_000 - raw.len() as u64);
        let (second, raw) = spill_with(&files, limits.clone(), 1..=20_000).await;
        let FullOutput::Capped { path, saved, by } = &second.snapshot.full_output else {
            panic!(
                "expected a capped spill, got {:?}",
                second.snapshot.full_output
            )
        };
        assert_eq!(by, &SpillCap::Session);
        assert_eq!(*saved, 1_500_000 - raw.len() as u64);
        assert_eq!(std::fs::read(path).unwrap(), raw[..*saved as usize]);
        assert_eq!(account.left(), 0);
        // Spent: the next spill keeps nothing but still exists, empty, and says so.
        let (third, _) = spill_with(&files, limits, 1..=3_000).await;
        assert!(
            third
                .snapshot
                .footer()
                .unwrap()
                .contains("spill space is used up"),
            "{:?}",
            third.snapshot.footer()
        );
    }

    #[tokio::test]
    async fn line_limit_spills_raw_bytes() {
        let (_dir, files) = files();
        let mut acc = OutputAccumulator::new(files, Limits::default());
        let mut raw = Vec::new();
        for i in 1..=3000 {
            let line = format!("\x1b[32m{i}\x1b[0m\n").into_bytes();
            raw.extend_from_slice(&line);
            acc.push(line).await;
        }
        let (out, _) = acc.finish().await;
        let t = &out.snapshot.truncation;
        assert!(t.truncated);
        assert_eq!(t.truncated_by, Some(TruncatedBy::Lines));
        assert_eq!((t.total_lines, t.output_lines), (3000, DEFAULT_MAX_LINES));
        assert!(out.snapshot.text.starts_with("1001\n"));
        assert!(out.snapshot.text.ends_with("3000"));
        let FullOutput::Saved(path) = &out.snapshot.full_output else {
            panic!("expected a spill file, got {:?}", out.snapshot.full_output)
        };
        assert_eq!(
            std::fs::read(path).unwrap(),
            raw,
            "spill keeps the raw bytes"
        );
        assert_eq!(
            out.snapshot.footer().unwrap(),
            format!(
                "[Showing lines 1001-3000 of 3000. Full output: {}]",
                path.display()
            )
        );
    }

    #[tokio::test]
    async fn oversized_last_line_reports_its_real_size() {
        for suffix in ["", "\n"] {
            let line = format!("{}{suffix}", "0".repeat(60_000));
            let (out, _) = run(vec![line.into_bytes()]).await;
            let t = &out.snapshot.truncation;
            assert!(t.last_line_partial, "suffix {suffix:?}");
            assert_eq!(t.output_bytes, DEFAULT_MAX_BYTES);
            assert_eq!(out.snapshot.last_line_bytes, 60_000, "suffix {suffix:?}");
            let footer = out.snapshot.footer().unwrap();
            assert!(
                footer
                    .starts_with("[Showing last 50.0KB of line 1 (line is 58.6KB). Full output: "),
                "{footer}"
            );
        }
    }

    #[tokio::test]
    async fn huge_single_line_keeps_partial_tail_and_size() {
        let (_dir, files) = files();
        let mut acc = OutputAccumulator::with_keep(files, Limits::default(), 256 * 1024);
        for _ in 0..64 {
            acc.push(vec![b'x'; 64 * 1024]).await;
        }
        acc.push(b"END\n".to_vec()).await;
        let (out, stats) = acc.finish().await;
        let t = &out.snapshot.truncation;
        assert!(t.truncated && t.last_line_partial);
        assert_eq!(t.total_lines, 1);
        assert!(out.snapshot.text.ends_with("xEND"));
        assert_eq!(out.snapshot.last_line_bytes, 64 * 64 * 1024 + 3);
        assert!(out.snapshot.footer().unwrap().contains("(line is 4.0MB)"));
        assert!(stats.tail_capacity_high_water <= 256 * 1024 + 2 * SEGMENT_BYTES);
    }

    #[tokio::test]
    async fn a_secret_cut_by_the_tail_is_redacted_whole() {
        // One long line; the shown tail starts inside the token, so only its body is shown
        // unless redaction sees the held window before the cut.
        let token = format!("ghp_{}", "A".repeat(36));
        let filler = 50 * 1024 - 20;
        let mut line = "x".repeat(1000);
        line.push_str(&token);
        line.push_str(&"y".repeat(filler));
        let redact: Redact = Arc::new(|text: &str| {
            let mut out = String::new();
            let mut rest = text;
            let mut count = 0;
            while let Some(start) = rest.find("ghp_") {
                count += 1;
                out.push_str(&rest[..start]);
                let end = rest[start + 4..]
                    .find(|c: char| !c.is_ascii_alphanumeric())
                    .map_or(rest.len(), |i| start + 4 + i);
                out.push_str("[REDACTED]");
                rest = &rest[end..];
            }
            out.push_str(rest);
            (out, count)
        });
        for with_redaction in [false, true] {
            let (_dir, files) = files();
            let mut acc = OutputAccumulator::new(files, Limits::default());
            if with_redaction {
                acc.redact_with(redact.clone());
            }
            acc.push(line.clone().into_bytes()).await;
            let snapshot = acc.snapshot();
            let (out, _) = acc.finish().await;
            for text in [&snapshot.text, &out.snapshot.text] {
                assert_eq!(
                    text.contains("AAAAAAAAAAAAAAAAAAAA"),
                    !with_redaction,
                    "redaction {with_redaction}: {}",
                    &text[..80]
                );
            }
            assert_eq!(out.snapshot.redactions, usize::from(with_redaction));
        }
    }

    #[tokio::test]
    async fn trimmed_tail_drops_partial_first_line_and_counts_all_lines() {
        let (_dir, files) = files();
        let mut acc = OutputAccumulator::with_keep(files, Limits::default(), 64 * 1024);
        let mut expected_last = String::new();
        for i in 1..=20_000 {
            let line = format!("line-{i}\n");
            expected_last = format!("line-{i}");
            acc.push(line.into_bytes()).await;
        }
        let snapshot = acc.snapshot();
        assert_eq!(snapshot.truncation.total_lines, 20_000);
        assert!(snapshot.text.ends_with(&expected_last));
        let (out, _) = acc.finish().await;
        let t = &out.snapshot.truncation;
        assert_eq!((t.total_lines, t.output_lines), (20_000, 2000));
        assert!(out.snapshot.text.starts_with("line-18001\n"));
        assert!(out.snapshot.text.ends_with("line-20000"));
    }

    #[tokio::test]
    async fn bytes_limit_footer() {
        let line = format!("{}\n", "y".repeat(199));
        let chunks = vec![line.repeat(500).into_bytes()];
        let (out, _) = run(chunks).await;
        let t = &out.snapshot.truncation;
        assert_eq!(t.truncated_by, Some(TruncatedBy::Bytes));
        let footer = out.snapshot.footer().unwrap();
        assert!(
            footer.starts_with(&format!(
                "[Showing lines {}-500 of 500 (50.0KB limit). Full output: ",
                500 - t.output_lines + 1
            )),
            "{footer}"
        );
    }

    #[tokio::test]
    async fn spill_starts_on_raw_bytes_even_when_sanitised_output_is_small() {
        // 60 KB of colour codes around little text: not truncated, but spilled raw.
        let noisy = "\x1b[31mx\x1b[0m".repeat(6000);
        let (_dir, out, _) = run_keep(vec![noisy.clone().into_bytes()]).await;
        assert!(!out.snapshot.truncation.truncated);
        assert_eq!(out.snapshot.text, "x".repeat(6000));
        let path = out.snapshot.full_output.path().expect("spilled");
        assert_eq!(std::fs::read(path).unwrap(), noisy.as_bytes());
    }

    /// A spill-file factory for [`SpillOverride`].
    pub(crate) type SpillFactory =
        Box<dyn Fn() -> Result<(PathBuf, SpillWriter), FsError> + Send + Sync>;

    /// [`StdFiles`] with `create_spill_file` replaced (failures, sinks).
    pub(crate) struct SpillOverride {
        pub(crate) inner: StdFiles,
        pub(crate) spill: SpillFactory,
    }

    #[async_trait::async_trait]
    impl FileOperations for SpillOverride {
        fn backend_id(&self) -> &cordon_ops::BackendId {
            self.inner.backend_id()
        }
        fn root(&self) -> &std::path::Path {
            self.inner.root()
        }
        fn home(&self) -> Option<&std::path::Path> {
            self.inner.home()
        }
        async fn read_file(&self, p: &std::path::Path) -> Result<Vec<u8>, FsError> {
            self.inner.read_file(p).await
        }
        async fn read_head(&self, p: &std::path::Path, n: usize) -> Result<Vec<u8>, FsError> {
            self.inner.read_head(p, n).await
        }
        async fn read_range(
            &self,
            p: &std::path::Path,
            offset: u64,
            n: usize,
        ) -> Result<Vec<u8>, FsError> {
            self.inner.read_range(p, offset, n).await
        }
        async fn write_file(&self, p: &std::path::Path, d: &[u8]) -> Result<(), FsError> {
            self.inner.write_file(p, d).await
        }
        async fn create_dir_all(&self, p: &std::path::Path) -> Result<(), FsError> {
            self.inner.create_dir_all(p).await
        }
        async fn metadata(&self, p: &std::path::Path) -> Result<cordon_ops::FileMeta, FsError> {
            self.inner.metadata(p).await
        }
        async fn read_dir(
            &self,
            p: &std::path::Path,
        ) -> Result<Vec<cordon_ops::DirEntry>, FsError> {
            self.inner.read_dir(p).await
        }
        async fn canonicalize(&self, p: &std::path::Path) -> Result<PathBuf, FsError> {
            self.inner.canonicalize(p).await
        }
        async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
            (self.spill)()
        }
    }

    /// A writer that accepts `limit` bytes, then fails.
    struct FailingWriter {
        left: usize,
    }

    impl tokio::io::AsyncWrite for FailingWriter {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            if self.left == 0 {
                return std::task::Poll::Ready(Err(std::io::Error::other("no space left")));
            }
            let n = buf.len().min(self.left);
            self.left -= n;
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn spill_create_failure_is_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let files = Arc::new(SpillOverride {
            inner: StdFiles::new(dir.path()),
            spill: Box::new(|| {
                Err(FsError::Backend {
                    op: "create",
                    path: PathBuf::from("/spill"),
                    reason: "disk full".into(),
                })
            }),
        });
        let mut acc = OutputAccumulator::new(files, Limits::default());
        for i in 0..3000 {
            acc.push(format!("{i}\n").into_bytes()).await;
        }
        let (out, _) = acc.finish().await;
        assert!(out.snapshot.truncation.truncated);
        assert_eq!(out.snapshot.truncation.total_lines, 3000);
        let footer = out.snapshot.footer().unwrap();
        assert!(
            footer
                .contains("Full output could not be saved: failed to create the full-output file")
                && footer.contains("disk full"),
            "{footer}"
        );
    }

    #[tokio::test]
    async fn spill_write_failure_marks_file_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let files = Arc::new(SpillOverride {
            inner: StdFiles::new(dir.path()),
            spill: Box::new(|| {
                let writer: SpillWriter = Box::new(FailingWriter { left: 100_000 });
                Ok((PathBuf::from("/spill/x.log"), writer))
            }),
        });
        let mut acc = OutputAccumulator::new(files, Limits::default());
        for _ in 0..100 {
            acc.push(vec![b'q'; 64 * 1024]).await;
        }
        let (out, _) = acc.finish().await;
        assert_eq!(out.snapshot.truncation.total_bytes, 100 * 64 * 1024);
        let footer = out.snapshot.footer().unwrap();
        assert!(
            footer.contains("Incomplete full output: /spill/x.log (failed to write the full-output file /spill/x.log: no space left)"),
            "{footer}"
        );
        assert_eq!(
            out.snapshot.full_output.path(),
            Some(&PathBuf::from("/spill/x.log"))
        );
    }

    #[tokio::test]
    async fn tail_capacity_stays_close_to_what_is_held() {
        // Small pieces, and small pieces interleaved with large ones (the worst case for
        // segment reuse), over many times the kept size.
        let (_dir, files) = files();
        let mut acc = OutputAccumulator::new(files, Limits::default());
        for i in 0..16_000 {
            acc.push(format!("{i:>99}\n").into_bytes()).await;
            if i % 8 == 0 {
                acc.push(vec![b'L'; SEGMENT_BYTES]).await;
            }
        }
        let (out, stats) = acc.finish().await;
        assert!(
            stats.tail_capacity_high_water <= TAIL_KEEP_BYTES + TAIL_KEEP_BYTES / 4,
            "high-water {}",
            stats.tail_capacity_high_water
        );
        assert!(out.snapshot.text.ends_with("15999"));
    }

    #[tokio::test]
    async fn prespill_buffer_is_bounded() {
        let (out, stats) = run((0..100).map(|_| vec![b'z'; 4096]).collect()).await;
        assert!(out.snapshot.full_output.path().is_some());
        assert!(stats.prespill_high_water <= DEFAULT_MAX_BYTES + 4096);
    }
}
