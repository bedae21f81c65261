//! [`SearchOperations`] of the local backend with ripgrep's libraries, in process: `ignore`
//! walks, `grep-regex` + `grep-searcher` search, `globset` filters.
//!
//! Walk rules (the same for grep and find, inside and outside git repositories):
//! hidden files included; `.gitignore` and `.ignore` respected whether or not a `.git` exists
//! (`require_git(false)`); the ignore files of the search path's ancestors apply, scoped to
//! their own directory, but only up to the workspace root (or the allowed root holding the
//! search path) — files above it are not the workspace's business and would make results
//! differ between backends; `.git/info/exclude` and the user's global excludes file are NOT
//! used, for the same reason; `.git` is never entered; denied paths are pruned; symlinks are
//! not followed (grep skips them like rg; find lists symlinks to files).
//!
//! Speed and determinism: one parallel pass walks and searches on all cores (as rg does).
//! Results are kept in a path-ordered map bounded by the limit: once the kept files hold
//! `max_matches` matches, the largest path is the cut-off and anything sorting after it —
//! files and whole directories — is skipped. The result is therefore exactly the first
//! `max_matches` matches in ascending path order (component by component), identical on
//! every run, without searching the whole tree when the limit is reached early.
//!
//! Every file is opened beneath its root with `RESOLVE_NO_SYMLINKS`, so a path swapped for a
//! symlink during the walk is refused rather than followed. Directory listings are done by
//! `ignore` by path; a racing swap there can at most reveal names, never contents.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use cordon_ops::bounds::REGEX_SIZE_LIMIT;
use cordon_ops::{
    FindOutput, FindRequest, FsError, GrepFile, GrepLine, GrepOutput, GrepRequest, SearchError,
    SearchOperations,
};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use ignore::{WalkBuilder, WalkState};
use nix::fcntl::OFlag;
use nix::sys::stat::{SFlag, fstat};
use tokio_util::sync::CancellationToken;

use crate::backend::Shared;
use crate::roots::{Verdict, file_type};

/// Longest line text returned (bytes, cut at a char boundary). Tools show at most 500
/// characters of a line; this bounds memory when a pattern matches huge minified lines.
pub(crate) const MAX_LINE_BYTES: usize = 64 * 1024;
/// Largest context honoured (lines before and after).
const MAX_CONTEXT: usize = 10_000;
/// At most this many unreadable-entry notes are returned; the rest are counted.
const MAX_ERRORS: usize = 200;

/// [`SearchOperations`] over the backend's confined roots.
#[derive(Debug)]
pub(crate) struct LocalSearch {
    shared: Arc<Shared>,
}

impl LocalSearch {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        LocalSearch { shared }
    }
}

/// Where a search starts, resolved and confined.
enum Start {
    /// A regular file (canonical path).
    File(PathBuf),
    /// A directory (canonical path).
    Dir(PathBuf),
    /// Exists but cannot be searched; the note goes to `errors`.
    Refused(String),
}

/// Why an entry could not be opened, without the path (the note adds it).
fn fs_reason(err: &FsError) -> String {
    match err {
        FsError::NotFound { .. } => "no such file or directory".into(),
        FsError::PermissionDenied { .. } => "permission denied".into(),
        FsError::OutsideRoot { .. } => "path is outside the allowed roots".into(),
        FsError::Denied { .. } => "access denied by policy".into(),
        FsError::NotADirectory { .. } => "not a directory".into(),
        FsError::IsADirectory { .. } => "is a directory".into(),
        FsError::Io { source, .. } => source.to_string(),
        FsError::Protected { .. }
        | FsError::GitMetadata { .. }
        | FsError::Backend { .. }
        | FsError::Cancelled => err.to_string(),
    }
}

impl Shared {
    fn resolve_start(&self, requested: &Path) -> Result<Start, SearchError> {
        let absolute = self.absolute(requested);
        let note = |reason: String| Start::Refused(format!("{}: {reason}", requested.display()));
        let (opened, canonical) = match self.roots.open_named(&absolute, OFlag::O_PATH, "open") {
            Ok(named) => named,
            Err(FsError::NotFound { .. } | FsError::NotADirectory { .. }) => {
                return Err(SearchError::PathNotFound {
                    path: requested.to_path_buf(),
                });
            }
            Err(FsError::OutsideRoot { .. }) => {
                return Err(SearchError::OutsideRoot {
                    path: requested.to_path_buf(),
                });
            }
            Err(other) => return Ok(note(fs_reason(&other))),
        };
        if self.verdict(&canonical) == Verdict::Denied {
            return Ok(note("access denied by policy".into()));
        }
        if canonical.components().any(|c| c.as_os_str() == ".git") {
            return Ok(note(
                "inside a .git directory, which is never searched (use read to open a file there)"
                    .into(),
            ));
        }
        let stat = match fstat(&opened.fd) {
            Ok(stat) => stat,
            Err(e) => return Ok(note(io::Error::from(e).to_string())),
        };
        Ok(match file_type(&stat) {
            SFlag::S_IFDIR => Start::Dir(canonical),
            SFlag::S_IFREG => Start::File(canonical),
            _ => note("not a regular file or directory".into()),
        })
    }

    /// The root whose ancestors' ignore files apply: the workspace when the start is inside
    /// it, else the most specific allowed root holding it.
    fn ignore_base(&self, start: &Path) -> PathBuf {
        if start.starts_with(&self.root) {
            return self.root.clone();
        }
        self.roots
            .select_canonical(start)
            .map(|(root, _)| root.path.clone())
            .unwrap_or_else(|| start.to_path_buf())
    }

    /// The walker shared by grep and find.
    fn walker(&self, start: &Path) -> (WalkBuilder, Vec<(PathBuf, String)>) {
        let mut builder = WalkBuilder::new(start);
        builder
            .hidden(false)
            .parents(false)
            .ignore(true)
            .git_ignore(true)
            .git_exclude(false)
            .git_global(false)
            .require_git(false)
            .follow_links(false)
            .threads(
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(2)
                    .min(16),
            );
        let mut errors = Vec::new();
        // Ancestors' ignore files, outermost first: later ones take precedence, and each is
        // interpreted relative to its own directory (`current_dir` at the time it is added).
        let base = self.ignore_base(start);
        let ancestors: Vec<&Path> = start
            .ancestors()
            .skip(1)
            .take_while(|dir| dir.starts_with(&base))
            .collect();
        for dir in ancestors.into_iter().rev() {
            builder.current_dir(dir);
            for name in [".gitignore", ".ignore"] {
                let file = dir.join(name);
                if file.is_file()
                    && let Some(err) = builder.add_ignore(&file)
                {
                    let (_, reason) = describe(&err);
                    errors.push((file, reason));
                }
            }
        }
        builder.current_dir(start);
        (builder, errors)
    }
}

/// The path and the reason of a walk error.
fn describe(err: &ignore::Error) -> (Option<PathBuf>, String) {
    match err {
        ignore::Error::WithPath { path, err } => (Some(path.clone()), describe(err).1),
        ignore::Error::WithDepth { err, .. } => describe(err),
        ignore::Error::WithLineNumber { line, err } => {
            let (path, reason) = describe(err);
            (path, format!("line {line}: {reason}"))
        }
        ignore::Error::Partial(errs) => {
            let described: Vec<(Option<PathBuf>, String)> = errs.iter().map(describe).collect();
            let path = described.iter().find_map(|(p, _)| p.clone());
            let reason = described
                .into_iter()
                .map(|(_, r)| r)
                .collect::<Vec<_>>()
                .join("; ");
            (path, reason)
        }
        ignore::Error::Io(source) => (None, source.to_string()),
        ignore::Error::Loop { .. }
        | ignore::Error::Glob { .. }
        | ignore::Error::UnrecognizedFileType(_)
        | ignore::Error::InvalidDefinition => (None, err.to_string()),
    }
}

/// A glob filter: with a `/` it matches the path relative to the search path (or the
/// absolute path, when the glob starts with `/`), otherwise the file name. `*` does not
/// cross `/`; `**` does.
struct PathGlob {
    /// A one-glob set: unlike `Glob::compile_matcher`, building it reports a glob whose regex
    /// exceeds the size limit as an error instead of panicking.
    matcher: GlobSet,
    mode: GlobMode,
}

#[derive(Clone, Copy)]
enum GlobMode {
    FileName,
    Relative,
    Absolute,
}

impl PathGlob {
    fn new(pattern: &str) -> Result<Self, SearchError> {
        let trimmed = pattern.strip_prefix("./").unwrap_or(pattern);
        let mode = if trimmed.starts_with('/') {
            GlobMode::Absolute
        } else if trimmed.contains('/') {
            GlobMode::Relative
        } else {
            GlobMode::FileName
        };
        let glob = GlobBuilder::new(trimmed)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| SearchError::InvalidPattern {
                what: "glob",
                pattern: pattern.to_string(),
                reason: e.kind().to_string(),
            })?;
        let matcher =
            GlobSetBuilder::new()
                .add(glob)
                .build()
                .map_err(|e| SearchError::InvalidPattern {
                    what: "glob",
                    pattern: pattern.to_string(),
                    reason: e.kind().to_string(),
                })?;
        Ok(PathGlob { matcher, mode })
    }

    /// `rel`: relative to the search path; `shown`: the absolute path as reported.
    fn is_match(&self, rel: &Path, shown: &Path) -> bool {
        match self.mode {
            GlobMode::FileName => rel
                .file_name()
                .is_some_and(|name| self.matcher.is_match(name)),
            GlobMode::Relative => self.matcher.is_match(rel),
            GlobMode::Absolute => self.matcher.is_match(shown),
        }
    }
}

/// A `path: reason` note before rendering.
type Note = (PathBuf, String);

/// Results kept in path order, bounded by a total weight (matches for grep, files for find).
struct Bounded<V> {
    max: usize,
    limited: AtomicBool,
    state: Mutex<BoundedState<V>>,
}

struct BoundedState<V> {
    items: BTreeMap<PathBuf, (usize, V)>,
    total: usize,
    threshold: Option<PathBuf>,
    errors: Vec<(PathBuf, String)>,
}

impl<V> Bounded<V> {
    fn new(max: usize) -> Self {
        Bounded {
            max,
            limited: AtomicBool::new(false),
            state: Mutex::new(BoundedState {
                items: BTreeMap::new(),
                total: 0,
                threshold: None,
                errors: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BoundedState<V>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `path` (and, for a directory, everything below it) sorts after the cut-off.
    fn beyond(&self, path: &Path) -> bool {
        if !self.limited.load(Ordering::Relaxed) {
            return false;
        }
        self.lock()
            .threshold
            .as_deref()
            .is_some_and(|threshold| path > threshold)
    }

    fn insert(&self, path: PathBuf, weight: usize, value: V) {
        let mut state = self.lock();
        if state
            .threshold
            .as_deref()
            .is_some_and(|threshold| path.as_path() > threshold)
        {
            return;
        }
        state.total += weight;
        state.items.insert(path, (weight, value));
        // Drop the largest paths while the rest still reach the limit.
        while let Some((_, (last, _))) = state.items.last_key_value() {
            let last = *last;
            if state.total - last >= self.max {
                state.items.pop_last();
                state.total -= last;
            } else {
                break;
            }
        }
        if state.total >= self.max {
            state.threshold = state.items.last_key_value().map(|(path, _)| path.clone());
            self.limited.store(true, Ordering::Relaxed);
        }
    }

    fn error(&self, path: PathBuf, reason: String) {
        self.lock().errors.push((path, reason));
    }

    /// The kept items in path order, and the error notes up to the cut-off, sorted.
    fn finish(self) -> (Vec<(PathBuf, usize, V)>, Vec<Note>) {
        let state = self
            .state
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let threshold = state.threshold;
        let mut errors: Vec<Note> = state
            .errors
            .into_iter()
            .filter(|(path, _)| threshold.as_deref().is_none_or(|t| path.as_path() <= t))
            .collect();
        errors.sort();
        errors.dedup();
        let items = state
            .items
            .into_iter()
            .map(|(path, (weight, value))| (path, weight, value))
            .collect();
        (items, errors)
    }
}

/// Render error notes as `path: reason` in the requested spelling, capped.
fn render_errors(errors: Vec<(PathBuf, String)>, view: &PathView<'_>) -> Vec<String> {
    let total = errors.len();
    let mut out: Vec<String> = errors
        .into_iter()
        .take(MAX_ERRORS)
        .map(|(path, reason)| format!("{}: {reason}", view.shown(&path).display()))
        .collect();
    if total > MAX_ERRORS {
        out.push(format!(
            "{} more unreadable entries not listed",
            total - MAX_ERRORS
        ));
    }
    out
}

/// Maps canonical paths under the search start back to the spelling the caller used.
struct PathView<'a> {
    canonical: &'a Path,
    requested: &'a Path,
}

impl PathView<'_> {
    fn shown(&self, canonical: &Path) -> PathBuf {
        match canonical.strip_prefix(self.canonical) {
            Ok(rel) if rel.as_os_str().is_empty() => self.requested.to_path_buf(),
            Ok(rel) => self.requested.join(rel),
            Err(_) => canonical.to_path_buf(),
        }
    }

    fn relative<'p>(&self, canonical: &'p Path) -> &'p Path {
        canonical.strip_prefix(self.canonical).unwrap_or(canonical)
    }
}

/// Collects one file's lines: at most `cap` matching lines, context merged by the searcher,
/// binary files flagged.
struct HitSink<'a> {
    lines: Vec<GrepLine>,
    matches: usize,
    cap: usize,
    binary: bool,
    cancel: &'a CancellationToken,
}

impl<'a> HitSink<'a> {
    fn new(cap: usize, cancel: &'a CancellationToken) -> Self {
        HitSink {
            lines: Vec::new(),
            matches: 0,
            cap,
            binary: false,
            cancel,
        }
    }
}

fn line_text(raw: &[u8]) -> String {
    let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
    let raw = &raw[..raw.len().min(MAX_LINE_BYTES + 4)];
    let mut text = String::from_utf8_lossy(raw).into_owned();
    if text.len() > MAX_LINE_BYTES {
        let mut cut = MAX_LINE_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

impl Sink for HitSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _searcher: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        let first = mat.line_number().unwrap_or(0);
        for (offset, line) in mat.lines().enumerate() {
            if self.matches >= self.cap {
                return Ok(false);
            }
            self.lines.push(GrepLine {
                number: first + offset as u64,
                text: line_text(line),
                is_match: true,
            });
            self.matches += 1;
        }
        Ok(!self.cancel.is_cancelled())
    }

    fn context(
        &mut self,
        _searcher: &Searcher,
        context: &SinkContext<'_>,
    ) -> Result<bool, io::Error> {
        self.lines.push(GrepLine {
            number: context.line_number().unwrap_or(0),
            text: line_text(context.bytes()),
            is_match: false,
        });
        Ok(true)
    }

    fn binary_data(&mut self, _searcher: &Searcher, _offset: u64) -> Result<bool, io::Error> {
        self.binary = true;
        Ok(false)
    }
}

/// Keep the first `keep` matching lines and the context that belongs to them: lines after the
/// last kept match survive only within `context` lines of it and before the next match.
fn cut_lines(mut lines: Vec<GrepLine>, keep: usize, context: usize) -> Vec<GrepLine> {
    let mut seen = 0;
    let mut end = lines.len();
    let mut last_match: Option<u64> = None;
    for (index, line) in lines.iter().enumerate() {
        if line.is_match {
            if seen == keep {
                end = index;
                break;
            }
            seen += 1;
            last_match = Some(line.number);
        }
    }
    lines.truncate(end);
    let limit = last_match.map_or(0, |n| n.saturating_add(context as u64));
    while lines
        .last()
        .is_some_and(|line| !line.is_match && line.number > limit)
    {
        lines.pop();
    }
    lines
}

/// Everything one grep needs, shared by the walker threads.
struct GrepJob<'a> {
    shared: &'a Shared,
    matcher: RegexMatcher,
    glob: Option<PathGlob>,
    context: usize,
    max_matches: usize,
    view: PathView<'a>,
    cancel: &'a CancellationToken,
}

impl GrepJob<'_> {
    fn searcher(&self) -> Searcher {
        SearcherBuilder::new()
            .line_number(true)
            .binary_detection(BinaryDetection::quit(b'\x00'))
            .before_context(self.context)
            .after_context(self.context)
            .build()
    }

    /// Search one file (opened beneath its root without following symlinks).
    fn search_file(
        &self,
        searcher: &mut Searcher,
        canonical: &Path,
    ) -> Result<Option<(Vec<GrepLine>, usize)>, String> {
        let opened = self
            .shared
            .roots
            .open_canonical(
                canonical,
                OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
                "open",
            )
            .map_err(|e| fs_reason(&e))?;
        let file = File::from(opened.fd);
        let mut sink = HitSink::new(self.max_matches, self.cancel);
        searcher
            .search_file(&self.matcher, &file, &mut sink)
            .map_err(|e| e.to_string())?;
        if sink.binary {
            return Ok(None);
        }
        let HitSink { lines, matches, .. } = sink;
        if matches == 0 {
            return Ok(None);
        }
        Ok(Some((cut_lines(lines, matches, self.context), matches)))
    }
}

fn grep_blocking(
    shared: &Shared,
    request: GrepRequest,
    cancel: &CancellationToken,
) -> Result<GrepOutput, SearchError> {
    let GrepRequest {
        pattern,
        path,
        glob,
        ignore_case,
        literal,
        context,
        max_matches,
    } = request;
    let path = shared.absolute(&path);
    let matcher = RegexMatcherBuilder::new()
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .case_insensitive(ignore_case)
        .fixed_strings(literal)
        .line_terminator(Some(b'\n'))
        .build(&pattern)
        .map_err(|e| SearchError::InvalidPattern {
            what: "regex",
            pattern: pattern.clone(),
            reason: e.to_string(),
        })?;
    let glob = glob.as_deref().map(PathGlob::new).transpose()?;
    if cancel.is_cancelled() {
        return Err(SearchError::Cancelled);
    }
    let start = shared.resolve_start(&path)?;
    if max_matches == 0 {
        return Ok(GrepOutput::default());
    }
    let (canonical, is_dir) = match start {
        Start::Refused(note) => {
            return Ok(GrepOutput {
                files: Vec::new(),
                errors: vec![note],
            });
        }
        Start::File(canonical) => (canonical, false),
        Start::Dir(canonical) => (canonical, true),
    };
    let job = GrepJob {
        shared,
        matcher,
        glob,
        context: context.min(MAX_CONTEXT),
        max_matches,
        view: PathView {
            canonical: &canonical,
            requested: &path,
        },
        cancel,
    };
    if !is_dir {
        // An explicitly named file is searched even if ignored or not matching the glob.
        let mut searcher = job.searcher();
        return Ok(match job.search_file(&mut searcher, &canonical) {
            Ok(Some((lines, _))) => GrepOutput {
                files: vec![GrepFile {
                    path: path.clone(),
                    lines,
                }],
                errors: Vec::new(),
            },
            Ok(None) => GrepOutput {
                files: Vec::new(),
                errors: if is_binary_file(&job, &canonical) {
                    vec![format!("{}: binary file, not searched", path.display())]
                } else {
                    Vec::new()
                },
            },
            Err(reason) => GrepOutput {
                files: Vec::new(),
                errors: vec![format!("{}: {reason}", path.display())],
            },
        });
    }

    let collected: Bounded<Vec<GrepLine>> = Bounded::new(max_matches);
    let (mut walker, ignore_errors) = shared.walker(&canonical);
    for (file, reason) in ignore_errors {
        collected.error(file, reason);
    }
    install_filter(&mut walker, shared);
    walker.build_parallel().run(|| {
        let job = &job;
        let collected = &collected;
        let mut searcher = job.searcher();
        let visit: Box<dyn FnMut(Result<ignore::DirEntry, ignore::Error>) -> WalkState + Send> =
            Box::new(move |entry| {
                if job.cancel.is_cancelled() {
                    return WalkState::Quit;
                }
                let entry = match entry {
                    Ok(entry) => entry,
                    Err(err) => {
                        let (path, reason) = describe(&err);
                        collected.error(path.unwrap_or_else(|| job.view.canonical.into()), reason);
                        return WalkState::Continue;
                    }
                };
                let Some(kind) = entry.file_type() else {
                    return WalkState::Continue;
                };
                let entry_path = entry.path();
                if kind.is_dir() {
                    return if collected.beyond(entry_path) {
                        WalkState::Skip
                    } else {
                        WalkState::Continue
                    };
                }
                if !kind.is_file() || collected.beyond(entry_path) {
                    return WalkState::Continue;
                }
                if let Some(glob) = &job.glob {
                    let rel = job.view.relative(entry_path);
                    if !glob.is_match(rel, &job.view.shown(entry_path)) {
                        return WalkState::Continue;
                    }
                }
                match job.search_file(&mut searcher, entry_path) {
                    Ok(Some((lines, matches))) => {
                        collected.insert(entry.into_path(), matches, lines);
                    }
                    Ok(None) => {}
                    Err(reason) => collected.error(entry.into_path(), reason),
                }
                WalkState::Continue
            });
        visit
    });
    if cancel.is_cancelled() {
        return Err(SearchError::Cancelled);
    }
    let (items, errors) = collected.finish();
    let mut remaining = max_matches;
    let mut files = Vec::with_capacity(items.len());
    for (canonical_file, matches, lines) in items {
        if remaining == 0 {
            break;
        }
        let lines = if matches > remaining {
            cut_lines(lines, remaining, job.context)
        } else {
            lines
        };
        remaining -= matches.min(remaining);
        files.push(GrepFile {
            path: job.view.shown(&canonical_file),
            lines,
        });
    }
    Ok(GrepOutput {
        files,
        errors: render_errors(errors, &job.view),
    })
}

/// Whether a file holds a NUL byte in its first block (why a named file had no result).
fn is_binary_file(job: &GrepJob<'_>, canonical: &Path) -> bool {
    use std::io::Read;
    let Ok(opened) = job.shared.roots.open_canonical(
        canonical,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
        "open",
    ) else {
        return false;
    };
    let mut head = Vec::with_capacity(64 * 1024);
    // A read error leaves what was read: judged on that, like a short file.
    let _ = File::from(opened.fd).take(64 * 1024).read_to_end(&mut head);
    head.contains(&0)
}

/// Never enter `.git`; prune denied entries.
fn install_filter(walker: &mut WalkBuilder, shared: &Shared) {
    let denied = shared.rules.has_denied().then(|| shared.rules.clone());
    walker.filter_entry(move |entry| {
        if entry.file_name() == ".git" {
            return false;
        }
        match &denied {
            Some(rules) => !rules.is_denied_entry(entry.path()),
            None => true,
        }
    });
}

fn find_blocking(
    shared: &Shared,
    request: FindRequest,
    cancel: &CancellationToken,
) -> Result<FindOutput, SearchError> {
    let FindRequest {
        pattern,
        path,
        max_results,
    } = request;
    let path = shared.absolute(&path);
    let glob = PathGlob::new(&pattern)?;
    if cancel.is_cancelled() {
        return Err(SearchError::Cancelled);
    }
    let canonical = match shared.resolve_start(&path)? {
        Start::Dir(canonical) => canonical,
        Start::File(_) => {
            return Ok(FindOutput {
                paths: Vec::new(),
                errors: vec![format!("{}: not a directory", path.display())],
            });
        }
        Start::Refused(note) => {
            return Ok(FindOutput {
                paths: Vec::new(),
                errors: vec![note],
            });
        }
    };
    if max_results == 0 {
        return Ok(FindOutput::default());
    }
    let view = PathView {
        canonical: &canonical,
        requested: &path,
    };
    let collected: Bounded<()> = Bounded::new(max_results);
    let (mut walker, ignore_errors) = shared.walker(&canonical);
    for (file, reason) in ignore_errors {
        collected.error(file, reason);
    }
    install_filter(&mut walker, shared);
    walker.build_parallel().run(|| {
        let view = &view;
        let glob = &glob;
        let collected = &collected;
        let visit: Box<dyn FnMut(Result<ignore::DirEntry, ignore::Error>) -> WalkState + Send> =
            Box::new(move |entry| {
                if cancel.is_cancelled() {
                    return WalkState::Quit;
                }
                let entry = match entry {
                    Ok(entry) => entry,
                    Err(err) => {
                        let (path, reason) = describe(&err);
                        collected.error(path.unwrap_or_else(|| view.canonical.into()), reason);
                        return WalkState::Continue;
                    }
                };
                let Some(kind) = entry.file_type() else {
                    return WalkState::Continue;
                };
                let entry_path = entry.path();
                if kind.is_dir() {
                    return if collected.beyond(entry_path) {
                        WalkState::Skip
                    } else {
                        WalkState::Continue
                    };
                }
                if !(kind.is_file() || kind.is_symlink()) || collected.beyond(entry_path) {
                    return WalkState::Continue;
                }
                if !glob.is_match(view.relative(entry_path), &view.shown(entry_path)) {
                    return WalkState::Continue;
                }
                if kind.is_symlink() {
                    match symlink_to_file(shared, entry_path) {
                        Ok(true) => {}
                        Ok(false) => return WalkState::Continue,
                        Err(reason) => {
                            collected.error(entry.into_path(), reason);
                            return WalkState::Continue;
                        }
                    }
                }
                collected.insert(entry.into_path(), 1, ());
                WalkState::Continue
            });
        visit
    });
    if cancel.is_cancelled() {
        return Err(SearchError::Cancelled);
    }
    let (items, errors) = collected.finish();
    Ok(FindOutput {
        paths: items
            .into_iter()
            .take(max_results)
            .map(|(canonical_file, _, ())| view.shown(&canonical_file))
            .collect(),
        errors: render_errors(errors, &view),
    })
}

/// Whether a symlink found by the walk points to a regular file reachable within the roots.
fn symlink_to_file(shared: &Shared, link: &Path) -> Result<bool, String> {
    match shared.roots.open_named(link, OFlag::O_PATH, "inspect") {
        Ok((opened, real)) => {
            if shared.verdict(&real) == Verdict::Denied {
                return Ok(false);
            }
            fstat(&opened.fd)
                .map(|stat| file_type(&stat) == SFlag::S_IFREG)
                .map_err(|e| io::Error::from(e).to_string())
        }
        Err(FsError::NotFound { .. }) => Err("dangling symlink (its target does not exist)".into()),
        Err(FsError::OutsideRoot { .. }) => Err("symlink points outside the allowed roots".into()),
        Err(other) => Err(fs_reason(&other)),
    }
}

async fn run_blocking<T, F>(f: F, cancel: CancellationToken) -> Result<T, SearchError>
where
    T: Send + 'static,
    F: FnOnce(&CancellationToken) -> Result<T, SearchError> + Send + 'static,
{
    // Cancelling the caller's future also stops the walk (the guard fires the token).
    let inner = cancel.child_token();
    let guard = inner.clone().drop_guard();
    let result = match tokio::task::spawn_blocking(move || f(&inner)).await {
        Ok(result) => result,
        // A panic is a bug in the search, not a transport failure: hand it on to the tool
        // call's own panic containment, which reports it for this call only.
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(join) => {
            return Err(SearchError::Backend {
                reason: format!("search task failed: {join}"),
            });
        }
    };
    drop(guard);
    result
}

#[async_trait]
impl SearchOperations for LocalSearch {
    async fn grep(
        &self,
        request: GrepRequest,
        cancel: CancellationToken,
    ) -> Result<GrepOutput, SearchError> {
        let shared = self.shared.clone();
        run_blocking(
            move |cancel| grep_blocking(&shared, request, cancel),
            cancel,
        )
        .await
    }

    async fn find(
        &self,
        request: FindRequest,
        cancel: CancellationToken,
    ) -> Result<FindOutput, SearchError> {
        let shared = self.shared.clone();
        run_blocking(
            move |cancel| find_blocking(&shared, request, cancel),
            cancel,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(number: u64, is_match: bool) -> GrepLine {
        GrepLine {
            number,
            text: format!("line {number}"),
            is_match,
        }
    }

    #[test]
    fn cut_keeps_after_context_of_the_last_kept_match_only() {
        // matches at 3 and 7, context 2: 1 2 [3] 4 5 6 [7] 8 9
        let lines = vec![
            line(1, false),
            line(2, false),
            line(3, true),
            line(4, false),
            line(5, false),
            line(6, false),
            line(7, true),
            line(8, false),
            line(9, false),
        ];
        let cut = cut_lines(lines.clone(), 1, 2);
        let numbers: Vec<u64> = cut.iter().map(|l| l.number).collect();
        assert_eq!(numbers, vec![1, 2, 3, 4, 5]);
        assert_eq!(cut_lines(lines.clone(), 2, 2), lines);
        assert_eq!(cut_lines(lines, 0, 2), Vec::<GrepLine>::new());
    }

    #[test]
    fn bounded_keeps_the_smallest_paths_up_to_the_limit() {
        let bounded: Bounded<&str> = Bounded::new(3);
        bounded.insert(PathBuf::from("/s/d"), 2, "d");
        bounded.insert(PathBuf::from("/s/c"), 2, "c");
        assert!(bounded.beyond(Path::new("/s/e")));
        assert!(!bounded.beyond(Path::new("/s/a")));
        bounded.insert(PathBuf::from("/s/a"), 1, "a");
        bounded.insert(PathBuf::from("/s/z"), 5, "z");
        bounded.error(PathBuf::from("/s/b"), "denied".into());
        bounded.error(PathBuf::from("/s/y"), "denied".into());
        let (items, errors) = bounded.finish();
        let kept: Vec<&str> = items.iter().map(|(_, _, v)| *v).collect();
        assert_eq!(kept, vec!["a", "c"]);
        assert_eq!(errors, vec![(PathBuf::from("/s/b"), "denied".to_string())]);
    }

    #[test]
    fn directories_sort_before_their_siblings_with_longer_names() {
        // Component order: `a/z` < `a.txt`, as rg --sort path prints them.
        assert!(Path::new("/s/a/z") < Path::new("/s/a.txt"));
    }

    #[test]
    fn long_lines_are_cut_at_a_char_boundary() {
        let raw = "é".repeat(MAX_LINE_BYTES);
        let text = line_text(raw.as_bytes());
        assert!(text.len() <= MAX_LINE_BYTES);
        assert!(text.chars().all(|c| c == 'é'));
        assert_eq!(line_text(b"abc\r\n"), "abc");
    }

    #[test]
    fn walk_errors_become_path_and_reason() {
        let denied = std::io::Error::from_raw_os_error(13);
        let err = ignore::Error::WithDepth {
            depth: 2,
            err: Box::new(ignore::Error::WithPath {
                path: PathBuf::from("/ws/closed"),
                err: Box::new(ignore::Error::Io(denied)),
            }),
        };
        assert_eq!(
            describe(&err),
            (
                Some(PathBuf::from("/ws/closed")),
                "Permission denied (os error 13)".to_string()
            )
        );
        let partial = ignore::Error::Partial(vec![ignore::Error::WithPath {
            path: PathBuf::from("/ws/.gitignore"),
            err: Box::new(ignore::Error::WithLineNumber {
                line: 3,
                err: Box::new(ignore::Error::Glob {
                    glob: Some("a[".into()),
                    err: "unclosed character class".into(),
                }),
            }),
        }]);
        let (path, reason) = describe(&partial);
        assert_eq!(path, Some(PathBuf::from("/ws/.gitignore")));
        assert!(reason.starts_with("line 3: "), "{reason}");
        let view = PathView {
            canonical: Path::new("/real/ws"),
            requested: Path::new("/link/ws"),
        };
        let notes: Vec<Note> = (0..MAX_ERRORS + 3)
            .map(|i| {
                (
                    PathBuf::from(format!("/real/ws/f{i:04}")),
                    "denied".to_string(),
                )
            })
            .collect();
        let rendered = render_errors(notes, &view);
        assert_eq!(rendered.len(), MAX_ERRORS + 1);
        assert_eq!(rendered[0], "/link/ws/f0000: denied");
        assert_eq!(rendered[MAX_ERRORS], "3 more unreadable entries not listed");
    }

    #[test]
    fn globs_with_and_without_slash() {
        let name = PathGlob::new("*.rs").unwrap();
        assert!(name.is_match(Path::new("a/b/c.rs"), Path::new("/ws/a/b/c.rs")));
        let rel = PathGlob::new("src/**/*.rs").unwrap();
        assert!(rel.is_match(Path::new("src/x/y.rs"), Path::new("/ws/src/x/y.rs")));
        assert!(!rel.is_match(Path::new("lib/src/y.rs"), Path::new("/ws/lib/src/y.rs")));
        let one_level = PathGlob::new("src/*.rs").unwrap();
        assert!(!one_level.is_match(Path::new("src/x/y.rs"), Path::new("/ws/src/x/y.rs")));
        let abs = PathGlob::new("/ws/src/*.rs").unwrap();
        assert!(abs.is_match(Path::new("src/y.rs"), Path::new("/ws/src/y.rs")));
        assert!(matches!(
            PathGlob::new("a[").map(|_| ()),
            Err(SearchError::InvalidPattern { what: "glob", .. })
        ));
    }

    #[test]
    fn a_glob_too_complex_to_compile_is_an_error_not_a_panic() {
        // `Glob::compile_matcher` panics on this one ("regex compilation shouldn't fail").
        let huge = "*/".repeat(100_000);
        let error = PathGlob::new(&huge).map(|_| ()).unwrap_err();
        assert!(
            matches!(&error, SearchError::InvalidPattern { what: "glob", .. }),
            "{error}"
        );
        assert!(
            error.to_string().len() < 1_000,
            "{}",
            error.to_string().len()
        );
    }

    #[tokio::test]
    async fn a_panic_in_a_search_stays_a_panic_for_the_caller_to_contain() {
        let outcome = tokio::spawn(run_blocking(
            |_: &CancellationToken| -> Result<(), SearchError> { panic!("search bug") },
            CancellationToken::new(),
        ))
        .await;
        // Before, the panic came back as `SearchError::Backend` ("backend unavailable").
        let join = outcome.expect_err("the panic reaches the caller");
        assert!(join.is_panic());
        assert_eq!(
            join.into_panic().downcast_ref::<&str>(),
            Some(&"search bug")
        );
    }
}
