//! Explaining a failed command to the model: when a command ends badly and there is evidence
//! that the sandbox stopped it, a short note names what was blocked, the policy entry behind
//! it (`FILE:LINE`, from [`SpecSources`]) and what the operator could change.
//!
//! Evidence is either what the runtime or the kernel reported (the timeout fired, the command
//! died of `SIGXFSZ`, a backend's out-of-memory report) or an error message in the last lines
//! of the command's output, matched against the backend's layout ([`DenialLayout`]): an
//! `EROFS`/`EACCES`/`EPERM` message names a path, and only when that path resolves to a
//! protected, denied or read-only entry of the layout is the entry named. No evidence, no
//! note: a command that exited 0 gets none whatever it printed, an error on a path the layout
//! does not restrict gets none, and a limit that is not set is never blamed.
//!
//! The output is the command's own, so a command can print a message that looks like a
//! denial; the note then explains a failure the command staged itself, about a path that *is*
//! restricted. It never grants or reveals anything (the layout is the policy the model can
//! already read in every refusal), so the notes are hints, never security decisions.
//!
//! The matching is bounded: only the last [`TAIL_BYTES`] and [`TAIL_LINES`] of the output,
//! lines up to [`MAX_LINE_BYTES`], at most [`MAX_PATHS`] paths resolved, one note per cause
//! and at most [`MAX_NOTES`] notes.
//!
//! In filtered network mode the evidence of a refused connection is not guessed from the
//! output: the egress proxy recorded it ([`EgressRecord`]), and [`egress_note`] lists the
//! refused destinations whatever the command's exit status (a tool may retry, fall back or
//! swallow the error).
//!
//! This module owns the matching and the note texts; how a path resolves is the backend's.
//! The rules as the model and the operator see them: docs/semantics.md#explained-denials.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use cordon_core::sandbox::{NetworkMode, SandboxSpec, SpecSources};

use crate::EgressRecord;
use crate::backend::{ExitStatus, Termination};

/// Bytes of output looked at, from the end.
pub const TAIL_BYTES: usize = 8 * 1024;
/// Lines of output looked at, from the end.
pub const TAIL_LINES: usize = 40;
/// Longer lines are skipped.
pub const MAX_LINE_BYTES: usize = 1024;
/// Most candidate paths resolved against the layout per command.
pub const MAX_PATHS: usize = 16;
/// Most notes per command.
pub const MAX_NOTES: usize = 4;

/// Most refused destinations one [`egress_note`] lists; the rest are counted.
pub const MAX_EGRESS_LISTED: usize = 8;

/// `SIGXFSZ`: the kernel's signal for a write past `RLIMIT_FSIZE`.
const SIGXFSZ: i32 = 25;

/// What a path is in a backend's layout, when a denial there has an entry to name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathEntry {
    /// Read-only because of `spec.protected[index]`.
    Protected(usize),
    /// Hidden because of `spec.denied[index]`.
    Denied(usize),
    /// Visible but outside every writable root.
    ReadOnly,
}

/// A backend's layout as the explanations need it.
pub trait DenialLayout: Send + Sync {
    /// The spec the backend enforces, with its sources.
    fn spec(&self) -> &SandboxSpec;

    /// What `path` (absolute and lexically normal, in the command's namespace) is in the
    /// layout. Implementations stay inside what the backend may look at, follow no symlink
    /// out of it and never block on a file; `None` when the path is unrestricted, unknown or
    /// cannot be resolved.
    fn classify(&self, path: &Path) -> Option<PathEntry>;

    /// Whether the host's own permissions (the mode bits of the path, or of its nearest existing
    /// directory when it is missing) let a command write it; `true` when the backend cannot
    /// tell. An `EACCES`/`EPERM` on a protected or read-only path they would refuse anyway (a
    /// read of a file nobody may read, a write the owner may not make) is the host's doing,
    /// not the sandbox's: no note.
    fn mode_allows_write(&self, _path: &Path) -> bool {
        true
    }
}

/// How the command ended and what it printed last.
#[derive(Clone, Copy, Debug)]
pub struct Evidence<'a> {
    /// Exit status, if known.
    pub status: Option<ExitStatus>,
    /// Why it ended.
    pub termination: Termination,
    /// The end of its output as the model sees it (only the last [`TAIL_BYTES`] are read).
    pub output: &'a str,
    /// The working directory relative paths in messages are resolved against.
    pub cwd: &'a Path,
    /// The timeout the command had.
    pub timeout: Duration,
    /// Whether the model asked for that timeout (rather than getting the default).
    pub timeout_requested: bool,
}

/// What a line of output reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// `EROFS`.
    ReadOnly,
    /// `EACCES`.
    Access,
    /// `EPERM`.
    NotPermitted,
}

/// The error texts of the refusals (glibc's `strerror`, which shells, coreutils, Python and
/// most runtimes print).
const REFUSALS: [(&str, Refusal); 3] = [
    ("Read-only file system", Refusal::ReadOnly),
    ("Permission denied", Refusal::Access),
    ("Operation not permitted", Refusal::NotPermitted),
];

/// Messages of a network operation that cannot succeed without a network.
const NETWORK_FAILURES: [&str; 6] = [
    "Network is unreachable",
    "Could not resolve host",
    "Temporary failure in name resolution",
    "Address family not supported by protocol",
    "Failed to establish a new connection",
    "Couldn't connect to server",
];

/// Messages of a failed allocation.
const MEMORY_FAILURES: [&str; 6] = [
    "Cannot allocate memory",
    "memory exhausted",
    "memory allocation of",
    "MemoryError",
    "std::bad_alloc",
    "out of memory",
];

/// The notes for a command, in the order their causes were found.
pub fn explain(evidence: &Evidence<'_>, layout: &dyn DenialLayout) -> Vec<String> {
    let failed = match evidence.termination {
        Termination::TimedOut => true,
        Termination::Cancelled => return Vec::new(),
        Termination::Exited => !matches!(evidence.status, Some(ExitStatus::Code(0))),
    };
    if !failed {
        return Vec::new();
    }
    let spec = layout.spec();
    let sources = &spec.sources;
    let mut notes = Notes::default();
    if evidence.termination == Termination::TimedOut {
        notes.push(timeout_note(evidence, spec));
    }
    if evidence.status == Some(ExitStatus::Signal(SIGXFSZ))
        && let Some(limit) = spec.limits.file_size_bytes
    {
        notes.push(file_size_note(limit, sources));
    }
    let mut paths_left = MAX_PATHS;
    for line in tail_lines(evidence.output) {
        if notes.full() {
            break;
        }
        if let Some(limit) = spec.limits.file_size_bytes
            && (line.contains("File too large") || line.contains("File size limit exceeded"))
        {
            notes.push(file_size_note(limit, sources));
        }
        if let Some(limit) = spec.limits.memory_bytes
            && MEMORY_FAILURES.iter().any(|text| line.contains(text))
        {
            notes.push(memory_note(limit, sources));
        }
        if let Some(limit) = spec.limits.pids
            && line.contains("Resource temporarily unavailable")
            && (line.contains("fork") || line.contains("thread") || line.contains("clone"))
        {
            notes.push(pids_note(limit, sources));
        }
        if is_network_failure(line) {
            match spec.network {
                NetworkMode::Disabled => notes.push(network_note(sources)),
                NetworkMode::Filtered => notes.push(filtered_network_note(sources)),
                NetworkMode::Enabled => {}
            }
        }
        let Some(refusal) = refusal_of(line) else {
            continue;
        };
        for candidate in candidate_paths(line, refusal) {
            if paths_left == 0 {
                break;
            }
            paths_left -= 1;
            let Some(path) = absolute(evidence.cwd, candidate) else {
                continue;
            };
            let Some(entry) = layout.classify(&path) else {
                continue;
            };
            let host_refuses = match (entry, refusal) {
                // Only the sandbox's read-only mounts make a write fail with EROFS, and a
                // denied path is refused for reading too.
                (_, Refusal::ReadOnly) | (PathEntry::Denied(_), _) => false,
                (PathEntry::Protected(_) | PathEntry::ReadOnly, Refusal::Access)
                | (PathEntry::Protected(_) | PathEntry::ReadOnly, Refusal::NotPermitted) => {
                    !layout.mode_allows_write(&path)
                }
            };
            if !host_refuses {
                notes.push(path_note(&path, entry, refusal, spec));
            }
            break;
        }
    }
    notes.0
}

/// Every path [`explain`] could ask the layout about for a command that printed `output` in
/// `cwd` (absolute, lexically normal, at most [`MAX_PATHS`]): a backend whose layout lives
/// elsewhere (across a stream) classifies these ahead and answers [`DenialLayout::classify`]
/// from what it learnt.
pub fn paths_to_classify(output: &str, cwd: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for line in tail_lines(output) {
        let Some(refusal) = refusal_of(line) else {
            continue;
        };
        for candidate in candidate_paths(line, refusal) {
            if paths.len() == MAX_PATHS {
                return paths;
            }
            if let Some(path) = absolute(cwd, candidate)
                && !paths.contains(&path)
            {
                paths.push(path);
            }
        }
    }
    paths
}

/// Notes without duplicates, at most [`MAX_NOTES`].
#[derive(Default)]
struct Notes(Vec<String>);

impl Notes {
    fn push(&mut self, note: Option<String>) {
        if let Some(note) = note
            && !self.full()
            && !self.0.contains(&note)
        {
            self.0.push(note);
        }
    }

    fn full(&self) -> bool {
        self.0.len() >= MAX_NOTES
    }
}

/// The last [`TAIL_LINES`] lines of the last [`TAIL_BYTES`] of `output`, in output order,
/// without over-long ones.
fn tail_lines(output: &str) -> impl Iterator<Item = &str> {
    let mut start = output.len().saturating_sub(TAIL_BYTES);
    while !output.is_char_boundary(start) {
        start += 1;
    }
    let tail = &output[start..];
    let lines: Vec<&str> = tail.lines().collect();
    let skip = lines.len().saturating_sub(TAIL_LINES);
    lines
        .into_iter()
        .skip(skip)
        .filter(|line| line.len() <= MAX_LINE_BYTES)
}

fn refusal_of(line: &str) -> Option<Refusal> {
    REFUSALS
        .iter()
        .find(|(text, _)| line.contains(text))
        .map(|(_, refusal)| *refusal)
}

fn is_network_failure(line: &str) -> bool {
    NETWORK_FAILURES.iter().any(|text| line.contains(text))
        || (line.contains("Operation not permitted")
            && (line.contains("socket") || line.contains("connect")))
}

/// The paths a refusal message names: every quoted string on the line, else the word right
/// before the error text (`bash: .git/x: Read-only file system`) and the text right after it
/// (`Read-only file system: .git/x`).
fn candidate_paths(line: &str, refusal: Refusal) -> Vec<&str> {
    let quoted = quoted_strings(line);
    if !quoted.is_empty() {
        return quoted;
    }
    let Some((text, _)) = REFUSALS.iter().find(|(_, r)| *r == refusal) else {
        return Vec::new();
    };
    let Some(at) = line.find(text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let before = line[..at].trim_end().trim_end_matches(':');
    if let Some(word) = before.rsplit([' ', '\t']).next()
        && !word.is_empty()
    {
        out.push(word);
    }
    let after = line[at + text.len()..].trim_start_matches(':').trim();
    if !after.is_empty() && !after.contains(' ') {
        out.push(after);
    }
    out
}

/// Strings between matching quotes: `'…'`, `"…"`, `‘…’`, and coreutils' older `` `…' ``.
fn quoted_strings(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(open) = rest.find(['\'', '"', '`', '‘']) {
        let opener = rest[open..].chars().next().unwrap_or('\'');
        let closer = match opener {
            '`' => '\'',
            '‘' => '’',
            other => other,
        };
        let inner_start = open + opener.len_utf8();
        let Some(len) = rest[inner_start..].find(closer) else {
            break;
        };
        let inner = &rest[inner_start..inner_start + len];
        if !inner.is_empty() {
            out.push(inner);
        }
        rest = &rest[inner_start + len + closer.len_utf8()..];
    }
    out
}

/// `candidate` made absolute against `cwd` and normalised lexically (`..` is taken as
/// written: the layout resolves symlinks); `None` for something that cannot be a path.
fn absolute(cwd: &Path, candidate: &str) -> Option<PathBuf> {
    if candidate.is_empty() || candidate.len() > 4096 || candidate.contains('\0') {
        return None;
    }
    let joined = cwd.join(candidate);
    let mut out = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
        }
    }
    Some(out)
}

fn human_bytes(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

fn seconds(duration: Duration) -> String {
    format!("{}", duration.as_secs_f64())
}

fn timeout_note(evidence: &Evidence<'_>, spec: &SandboxSpec) -> Option<String> {
    let sources = &spec.sources;
    let max = spec.limits.max_timeout;
    let max_at = sources.at(sources.max_timeout);
    let text = if !evidence.timeout_requested {
        format!(
            "Sandbox: the command was stopped at the default timeout of {} s, set by \
             `[limits] timeout` ({}). Pass a larger `timeout` (at most {} s, `[limits] \
             max_timeout` ({max_at})) or run less at once; the operator can raise the limits.",
            seconds(evidence.timeout),
            sources.at(sources.timeout),
            seconds(max),
        )
    } else if evidence.timeout >= max {
        format!(
            "Sandbox: the command was stopped at the maximum timeout of {} s, set by \
             `[limits] max_timeout` ({max_at}). Run less at once; the operator can raise \
             that limit.",
            seconds(max),
        )
    } else {
        format!(
            "Sandbox: the command was stopped at the timeout of {} s it was given. Pass a \
             larger `timeout` (at most {} s, `[limits] max_timeout` ({max_at})).",
            seconds(evidence.timeout),
            seconds(max),
        )
    };
    Some(text)
}

fn file_size_note(limit: u64, sources: &SpecSources) -> Option<String> {
    Some(format!(
        "Sandbox: the command hit the file size limit of {}, set by `[limits] file_size` ({}). \
         Write smaller files; the operator can raise that limit.",
        human_bytes(limit),
        sources.at(sources.file_size),
    ))
}

/// The note for a command that ran out of memory (also for backends that learn it from the
/// kernel rather than from the output).
pub fn memory_note(limit: u64, sources: &SpecSources) -> Option<String> {
    Some(format!(
        "Sandbox: the command ran out of memory under the limit of {} per command, set by \
         `[limits] memory` ({}). Use less memory at once; the operator can raise that limit.",
        human_bytes(limit),
        sources.at(sources.memory),
    ))
}

fn pids_note(limit: u64, sources: &SpecSources) -> Option<String> {
    Some(format!(
        "Sandbox: the command could not start another process: the limit is {limit} \
         processes, set by `[limits] pids` ({}). Run fewer processes at once; the operator \
         can raise that limit.",
        sources.at(sources.pids),
    ))
}

fn network_note(sources: &SpecSources) -> Option<String> {
    Some(format!(
        "Sandbox: commands have no network, set by `[network] enabled` ({}). Nothing can be \
         downloaded or reached; the operator can set `enabled = true`.",
        sources.at(sources.network),
    ))
}

/// The note listing the destinations the egress proxy refused during a command: each once (with
/// its number of attempts), why, and the `[network]` entry to add or the deny entry to change;
/// at most [`MAX_EGRESS_LISTED`] listed, the others counted. `None` when nothing was refused
/// (allowed attempts and failures that were not the policy's doing are not listed).
pub fn egress_note(records: &[EgressRecord], sources: &SpecSources) -> Option<String> {
    let mut listed: Vec<(String, &EgressRecord, usize)> = Vec::new();
    let mut others = std::collections::HashSet::new();
    for record in records.iter().filter(|record| record.is_denied()) {
        let destination = record.destination();
        if let Some((_, _, attempts)) = listed.iter_mut().find(|(d, _, _)| *d == destination) {
            *attempts += 1;
        } else if listed.len() < MAX_EGRESS_LISTED {
            listed.push((destination, record, 1));
        } else {
            others.insert(destination);
        }
    }
    if listed.is_empty() {
        return None;
    }
    let file = match sources.file.as_str() {
        "" => "the policy",
        file => file,
    };
    let count = listed.len() + others.len();
    let mut note = format!(
        "Sandbox: the network policy refused {count} destination{} during this command \
         (commands reach only what `[network] allow` lists, through Cordon's proxy):",
        if count == 1 { "" } else { "s" }
    );
    for (destination, record, attempts) in &listed {
        note.push_str(&format!("\n- {destination}"));
        if *attempts > 1 {
            note.push_str(&format!(" ({attempts} attempts)"));
        }
        note.push_str(&format!(": {}", record.reason));
        match (&record.suggestion, &record.source) {
            (Some(entry), _) => note.push_str(&format!(
                "; to allow it, the operator can add {entry:?} to `[network] allow` in {file}"
            )),
            (None, Some(source)) => note.push_str(&format!(
                "; to allow it, the operator can remove or narrow the deny entry at {source}"
            )),
            (None, None) => {}
        }
    }
    if !others.is_empty() {
        note.push_str(&format!(
            "\n- and {} more destination{}",
            others.len(),
            if others.len() == 1 { "" } else { "s" }
        ));
    }
    Some(note)
}

/// A direct connection or DNS lookup failed in filtered mode: only the proxy leads out.
fn filtered_network_note(sources: &SpecSources) -> Option<String> {
    Some(format!(
        "Sandbox: commands reach the network only through Cordon's egress proxy, set by \
         `[network] allow` ({}): a direct connection or DNS lookup fails. Use a tool or option \
         that goes through the proxy (HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are set; curl, pip, \
         cargo and git over https use them); the operator can add destinations to \
         `[network] allow`.",
        sources.egress_allow_at(),
    ))
}

fn path_note(
    path: &Path,
    entry: PathEntry,
    refusal: Refusal,
    spec: &SandboxSpec,
) -> Option<String> {
    let sources = &spec.sources;
    let path = path.display();
    match entry {
        PathEntry::Protected(index) => {
            let glob = spec.protected.get(index)?;
            let line = sources.protected.get(index).copied().unwrap_or(0);
            let at = if line == 0 && !sources.file.is_empty() {
                format!(
                    "{}, not written there: Cordon protects it on its own (a built-in default, \
                     the project's `.cordon/`, or the policy file itself)",
                    sources.file
                )
            } else {
                sources.at(line)
            };
            Some(format!(
                "Sandbox: {path} is protected (read-only) by `{glob}` in `[filesystem] \
                 protect` ({at}), so writing it was refused. Leave it unchanged; the operator \
                 can remove or narrow that entry."
            ))
        }
        PathEntry::Denied(index) => {
            let glob = spec.denied.get(index)?;
            let line = sources.denied.get(index).copied().unwrap_or(0);
            Some(format!(
                "Sandbox: {path} is denied (neither readable nor writable) by `{glob}` in \
                 `[filesystem] deny` ({}). Do without it; the operator can remove or narrow \
                 that entry.",
                sources.at(line)
            ))
        }
        PathEntry::ReadOnly => match refusal {
            Refusal::ReadOnly | Refusal::Access => Some(format!(
                "Sandbox: {path} is outside the writable paths, which `[filesystem] write` \
                 ({}) grants, so writing it was refused. Write inside the workspace instead; \
                 the operator can add a glob covering it there.",
                sources.at(sources.write)
            )),
            Refusal::NotPermitted => None,
        },
    }
}

#[cfg(test)]
#[path = "denial_tests.rs"]
mod tests;
