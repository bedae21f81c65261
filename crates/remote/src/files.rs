//! File operations over a remote shell: the file helper of the worker ([`crate::worker`]), the
//! argv running one operation alone ([`files_argv`]), the parsing of its records ([`parse_fs_record`]) into the same
//! [`FsError`]s the local backend returns ([`fs_error`]), and the spec's path rules judged on
//! canonical paths ([`PathRules`]).
//!
//! Confinement: the helper resolves every path component by component (symlinks followed,
//! `..` exact) and refuses anything outside the allowed roots before touching it; writes are
//! interactive: the helper reports the canonical target, the client checks protected/denied
//! rules on it and only then sends `go LENGTH` and the bytes; the helper writes a temporary file
//! in the target's directory, checks the length (a dropped connection never produces a torn
//! file), restores the mode and renames it over the target. Inside a container the container
//! itself is the hard boundary; these checks make the file tools behave like the local ones.

use std::path::{Path, PathBuf};

use cordon_core::sandbox::{NestedGit, RootAccess, SandboxSpec};
use cordon_ops::denial::PathEntry;
use cordon_ops::{DirEntry, FileKind, FsError};
use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::records::{Record, RecordParser};
use crate::worker::WorkerRequest;
use crate::{RemoteError, path_arg};

/// One file operation for the helper: a plain request (serialisable, so a resident agent can
/// later take the same requests over a wire instead of a shell script).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "op", content = "args")]
pub enum FileOp {
    /// Canonical path (`canon`, `ok`).
    Canon(PathBuf),
    /// Whole file, or its first `max` bytes, on stdout (`canon`, data, `ok`).
    Read {
        /// The file.
        path: PathBuf,
        /// Byte limit.
        max: Option<usize>,
    },
    /// At most `max` bytes starting `offset` bytes into the file, on stdout (`canon`, data,
    /// `ok`): one chunk of a file streamed by a tool, whatever the file's size.
    ReadRange {
        /// The file.
        path: PathBuf,
        /// Bytes to skip.
        offset: u64,
        /// Byte limit.
        max: usize,
    },
    /// Metadata following symlinks (`canon`, `stat`, `ok`).
    Stat(PathBuf),
    /// Directory entries (`canon`, `ent`…, `ok`).
    List(PathBuf),
    /// `mkdir -p`, interactive (`canon`, wait for [`GO_LINE`], `ok`).
    Mkdir(PathBuf),
    /// Atomic replace, interactive (`canon`, wait for [`go_line`] + bytes, `ok`).
    Write(PathBuf),
    /// Create `dir/name` exclusively (0600), report it, then append stdin to it.
    Spill {
        /// Spill directory.
        dir: PathBuf,
        /// File name.
        name: String,
    },
    /// Resolve and confine `path` (which must exist), report `canon PATH ok`, then run `argv`
    /// with the canonical path appended; after the prelude, stderr is the command's own.
    Run {
        /// The path.
        path: PathBuf,
        /// The command (the canonical path is appended).
        argv: Vec<String>,
    },
    /// Delete spill files older than `minutes` in `dir`.
    Cleanup {
        /// Spill directory.
        dir: PathBuf,
        /// Age limit in minutes.
        minutes: u64,
    },
}

/// The answer that lets an interactive `mkdir` proceed.
pub const GO_LINE: &[u8] = b"go\n";

/// The answer that lets an interactive `write` proceed; exactly `len` bytes must follow.
pub fn go_line(len: usize) -> Vec<u8> {
    format!("go {len}\n").into_bytes()
}

/// The answer that aborts an interactive operation before anything is touched.
pub const STOP_LINE: &[u8] = b"stop\n";

/// The argv running `op` alone (one exec per operation), confined to `roots` (canonical
/// paths). A waiting worker takes the same operation as [`WorkerRequest::Fs`].
pub fn files_argv(roots: &[PathBuf], op: &FileOp) -> Result<Vec<String>, RemoteError> {
    WorkerRequest::Fs {
        roots: roots.to_vec(),
        op: op.clone(),
    }
    .argv()
}

/// The file helper's arguments for `op`: `OP NROOTS ROOT... ARG...`.
pub(crate) fn op_words(roots: &[PathBuf], op: &FileOp) -> Result<Vec<String>, RemoteError> {
    let (name, mut rest): (&str, Vec<String>) = match op {
        FileOp::Canon(path) => ("canon", vec![path_arg(path)?]),
        FileOp::Read { path, max } => (
            "read",
            vec![
                path_arg(path)?,
                max.map(|m| m.to_string()).unwrap_or_default(),
            ],
        ),
        FileOp::ReadRange { path, offset, max } => (
            "read",
            vec![path_arg(path)?, max.to_string(), offset.to_string()],
        ),
        FileOp::Stat(path) => ("stat", vec![path_arg(path)?]),
        FileOp::List(path) => ("list", vec![path_arg(path)?]),
        FileOp::Mkdir(path) => ("mkdir", vec![path_arg(path)?]),
        FileOp::Write(path) => ("write", vec![path_arg(path)?]),
        FileOp::Spill { dir, name } => ("spill", vec![path_arg(dir)?, name.clone()]),
        FileOp::Cleanup { dir, minutes } => ("cleanup", vec![path_arg(dir)?, minutes.to_string()]),
        FileOp::Run { path, argv } => {
            let mut rest = vec![path_arg(path)?];
            for arg in argv {
                rest.push(crate::checked_arg("argument", arg)?);
            }
            ("run", rest)
        }
    };
    let mut words = vec![name.to_owned(), roots.len().to_string()];
    for root in roots {
        words.push(path_arg(root)?);
    }
    words.append(&mut rest);
    Ok(words)
}

/// The prelude of a [`FileOp::Run`] exec's stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunPrelude {
    /// The path resolved; the command runs with it.
    Resolved(PathBuf),
    /// The helper refused (`code`, `message`, as in an `err` record).
    Failed {
        /// Error code.
        code: String,
        /// Detail.
        message: String,
    },
}

/// Split a [`FileOp::Run`] exec's stderr into its prelude and the offset where the command's
/// own stderr starts; `None` while the prelude is incomplete.
pub fn split_run_prelude(stderr: &[u8]) -> Option<(RunPrelude, usize)> {
    let mut tokens = Vec::new();
    let mut start = 0;
    for (i, &b) in stderr.iter().enumerate() {
        if b != 0 {
            continue;
        }
        tokens.push(&stderr[start..i]);
        start = i + 1;
        match tokens.as_slice() {
            [b"canon", path, b"ok"] => {
                use std::os::unix::ffi::OsStrExt;
                let path = PathBuf::from(std::ffi::OsStr::from_bytes(path));
                return Some((RunPrelude::Resolved(path), start));
            }
            [b"err", code, _path, message] => {
                return Some((
                    RunPrelude::Failed {
                        code: String::from_utf8_lossy(code).into_owned(),
                        message: String::from_utf8_lossy(message).into_owned(),
                    },
                    start,
                ));
            }
            _ if tokens.len() >= 4 => {
                return Some((
                    RunPrelude::Failed {
                        code: "io".to_owned(),
                        message: "unexpected answer from the file helper".to_owned(),
                    },
                    start,
                ));
            }
            _ => {}
        }
    }
    None
}

/// A spill file name like the local backend's: `cordon-bash-<16 hex>.log`.
pub fn spill_file_name() -> String {
    format!("cordon-bash-{:016x}.log", fastrand::u64(..))
}

/// The `find` name pattern of a write temp file, exactly
/// [`cordon_ops::leftovers::is_write_temp_name`]: `.<NAME>.cordon-<16 lowercase hex>.tmp`.
fn write_temp_glob() -> String {
    format!(".?*.cordon-{}.tmp", "[0-9a-f]".repeat(16))
}

/// The script removing stale write temp files: in each root given (`$2`…), regular files of
/// Cordon's exact temp naming not modified for `$1` minutes, without entering `.git` or
/// another filesystem and without following symlinks (`find`'s default); prints each path.
const STALE_TEMPS_SCRIPT: &str = r#"
age=$1
pattern=$2
shift 2
for root do
    find "$root" -xdev \( -name .git -prune \) -o \( -type f -name "$pattern" -mmin +"$age" -print -exec rm -f -- {} + \) 2>/dev/null
done
exit 0
"#;

/// The argv that removes write temp files older than `min_age` under `roots` (remote
/// writable roots) — those of a killed writer: a live writer streams its bytes, so its file's
/// modification time keeps moving. Prints the removed paths, one per line.
pub fn remove_stale_write_temps_argv(
    roots: &[String],
    min_age: std::time::Duration,
) -> Vec<String> {
    let minutes = min_age.as_secs().div_ceil(60).max(1);
    crate::sh_argv(
        STALE_TEMPS_SCRIPT,
        "cordon-temps",
        [minutes.to_string(), write_temp_glob()]
            .into_iter()
            .chain(roots.iter().cloned()),
    )
}

/// Metadata reported by `stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatRecord {
    /// Kind after following symlinks.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`0o7777` mask).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

impl StatRecord {
    /// Whether an unprivileged process with `uid` and `gids` may write the file by its mode
    /// bits (owner class first, then group, then others; no root override).
    pub fn unprivileged_writable(&self, uid: u32, gids: &[u32]) -> bool {
        if self.uid == uid {
            self.mode & 0o200 != 0
        } else if gids.contains(&self.gid) {
            self.mode & 0o020 != 0
        } else {
            self.mode & 0o002 != 0
        }
    }
}

/// One record of the file helper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsRecord {
    /// The canonical path of the operand.
    Canon(PathBuf),
    /// The operation failed.
    Err {
        /// `outside`, `notfound`, `notdir`, `isdir`, `access`, `loop` or `io`.
        code: String,
        /// The path as given.
        path: PathBuf,
        /// Detail.
        message: String,
    },
    /// The operation finished.
    Ok,
    /// Metadata.
    Stat(StatRecord),
    /// A directory entry.
    Ent(DirEntry),
    /// The worker is up and reads requests.
    Ready,
    /// The worker finished the request with this id.
    Done(String),
}

fn fs_arity(tag: &str) -> Option<usize> {
    Some(match tag {
        "ok" | "ready" => 0,
        "canon" | "done" => 1,
        "err" | "ent" => 3,
        "stat" => 5,
        _ => return None,
    })
}

/// A parser for the file helper's record stream.
pub fn files_record_parser() -> RecordParser {
    RecordParser::new(fs_arity)
}

fn kind_code(code: &str) -> Option<FileKind> {
    match code {
        "f" => Some(FileKind::File),
        "d" => Some(FileKind::Dir),
        "o" => Some(FileKind::Other),
        _ => None,
    }
}

/// Interpret a parsed record.
pub fn parse_fs_record(record: &Record) -> Result<FsRecord, RemoteError> {
    let bad = |what: &str| RemoteError::Protocol {
        detail: format!("bad {what} in `{}` record", record.tag),
    };
    Ok(match record.tag.as_str() {
        "ok" => FsRecord::Ok,
        "ready" => FsRecord::Ready,
        "done" => FsRecord::Done(record.text(0)),
        "canon" => FsRecord::Canon(record.path(0)),
        "err" => FsRecord::Err {
            code: record.text(0),
            path: record.path(1),
            message: record.text(2),
        },
        "stat" => {
            let raw_mode = u32::from_str_radix(&record.text(2), 16).map_err(|_| bad("mode"))?;
            let kind = match kind_code(&record.text(0)) {
                Some(kind) => kind,
                None => return Err(bad("kind")),
            };
            FsRecord::Stat(StatRecord {
                kind,
                size: record.text(1).parse().map_err(|_| bad("size"))?,
                mode: raw_mode & 0o7777,
                uid: record.text(3).parse().map_err(|_| bad("uid"))?,
                gid: record.text(4).parse().map_err(|_| bad("gid"))?,
            })
        }
        "ent" => {
            let error = record.text(2);
            FsRecord::Ent(DirEntry {
                name: record.text(0),
                kind: kind_code(&record.text(1)),
                error: if error.is_empty() { None } else { Some(error) },
            })
        }
        other => {
            return Err(RemoteError::Protocol {
                detail: format!("unexpected record `{other}`"),
            });
        }
    })
}

const ELOOP: i32 = 40;
const EROFS: i32 = 30;
const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;
const EFBIG: i32 = 27;

/// The [`FsError`] for a helper `err` record, for the path the caller asked about.
pub fn fs_error(op: &'static str, path: &Path, code: &str, message: &str) -> FsError {
    let path = path.to_path_buf();
    match code {
        "outside" => FsError::OutsideRoot { path },
        "notfound" => FsError::NotFound { path },
        "notdir" => FsError::NotADirectory { path },
        "isdir" => FsError::IsADirectory { path },
        "access" => FsError::PermissionDenied { path },
        "loop" => FsError::Io {
            op,
            path,
            source: std::io::Error::from_raw_os_error(ELOOP),
        },
        _ => {
            let errno = if message.contains("Read-only file system") {
                Some(EROFS)
            } else if message.contains("No space left") {
                Some(ENOSPC)
            } else if message.contains("quota exceeded") {
                Some(EDQUOT)
            } else if message.contains("File too large") {
                Some(EFBIG)
            } else {
                None
            };
            let source = match errno {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::other(message.to_owned()),
            };
            FsError::Io { op, path, source }
        }
    }
}

/// Whether `err` is the helper's way of saying the filesystem is read-only.
pub fn is_read_only_fs(err: &FsError) -> bool {
    matches!(err, FsError::Io { source, .. } if source.raw_os_error() == Some(EROFS))
}

/// A root the file operations may touch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root {
    /// Canonical path in the backend's namespace.
    pub path: PathBuf,
    /// Whether file operations may write there.
    pub writable: bool,
}

/// The spec's path rules, judged on canonical paths in the backend's namespace: roots
/// (read-only or writable), protected globs (readable, never writable) and denied globs
/// (neither). Globs are relative to the workspace root unless absolute; `dir/**` also covers
/// `dir` itself.
#[derive(Clone, Debug)]
pub struct PathRules {
    workspace: PathBuf,
    roots: Vec<Root>,
    protected: GlobSet,
    denied: GlobSet,
    /// For each glob of `protected`, the index of its `spec.protected` entry.
    protected_entries: Vec<usize>,
    /// For each glob of `denied`, the index of its `spec.denied` entry.
    denied_entries: Vec<usize>,
    nested_git: NestedGit,
}

/// A protected or denied glob that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("failed to parse {what} glob `{glob}`: {source}")]
pub struct RuleError {
    /// "protected" or "denied".
    pub what: &'static str,
    /// The glob.
    pub glob: String,
    /// The parser's error.
    #[source]
    pub source: globset::Error,
}

/// Globs compiled from spec entries, with the entry each glob came from.
type EntryGlobs = (GlobSet, Vec<usize>);

fn build_globs(what: &'static str, globs: &[String]) -> Result<EntryGlobs, RuleError> {
    let mut builder = GlobSetBuilder::new();
    let mut entries = Vec::new();
    for (entry, glob) in globs.iter().enumerate() {
        let mut add = |pattern: &str| -> Result<(), RuleError> {
            let compiled = Glob::new(pattern).map_err(|source| RuleError {
                what,
                glob: glob.clone(),
                source,
            })?;
            builder.add(compiled);
            entries.push(entry);
            Ok(())
        };
        add(glob)?;
        if let Some(dir) = glob.strip_suffix("/**")
            && !dir.is_empty()
        {
            add(dir)?;
        }
    }
    let set = builder.build().map_err(|source| RuleError {
        what,
        glob: globs.join(", "),
        source,
    })?;
    Ok((set, entries))
}

impl PathRules {
    /// Rules for a workspace at `workspace` (canonical, backend namespace) under `spec`, with
    /// further roots (extra readable/writable roots, the spill directory).
    pub fn new(workspace: &Path, spec: &SandboxSpec, extra: Vec<Root>) -> Result<Self, RuleError> {
        let mut roots = vec![Root {
            path: workspace.to_path_buf(),
            writable: match spec.workspace {
                RootAccess::ReadOnly => false,
                RootAccess::ReadWrite => true,
            },
        }];
        roots.extend(extra);
        let (protected, protected_entries) = build_globs("protected", &spec.protected)?;
        let (denied, denied_entries) = build_globs("denied", &spec.denied)?;
        Ok(PathRules {
            workspace: workspace.to_path_buf(),
            roots,
            protected,
            denied,
            protected_entries,
            denied_entries,
            nested_git: spec.nested_git,
        })
    }

    /// The first spec entry (the earliest in the policy) with a glob of `set` matching
    /// `canonical`, absolute or relative to the workspace: the same entry every backend names.
    fn first_entry(&self, set: &GlobSet, entries: &[usize], canonical: &Path) -> Option<usize> {
        let mut matched = set.matches(canonical);
        if let Ok(rel) = canonical.strip_prefix(&self.workspace)
            && !rel.as_os_str().is_empty()
        {
            matched.extend(set.matches(rel));
        }
        matched
            .into_iter()
            .filter_map(|glob| entries.get(glob).copied())
            .min()
    }

    /// The spec entry restricting `canonical`, judged with its ancestors: a denied entry
    /// before a protected one; `None` when no glob applies.
    pub fn entry_of(&self, canonical: &Path) -> Option<PathEntry> {
        let mut protected = None;
        for candidate in canonical.ancestors() {
            if candidate.parent().is_none() {
                break;
            }
            if let Some(index) = self.first_entry(&self.denied, &self.denied_entries, candidate) {
                return Some(PathEntry::Denied(index));
            }
            if protected.is_none() {
                protected = self.first_entry(&self.protected, &self.protected_entries, candidate);
            }
        }
        protected.map(PathEntry::Protected)
    }

    /// Whether `canonical` lies in a root file operations may write (the deepest root
    /// containing it decides); `None` outside every root.
    pub fn in_writable_root(&self, canonical: &Path) -> Option<bool> {
        self.root_of(canonical).map(|root| root.writable)
    }

    /// The roots, workspace first.
    pub fn roots(&self) -> &[Root] {
        &self.roots
    }

    /// The canonical root paths (what the helper confines to).
    pub fn root_paths(&self) -> Vec<PathBuf> {
        self.roots.iter().map(|r| r.path.clone()).collect()
    }

    fn matches(&self, set: &GlobSet, canonical: &Path) -> bool {
        if set.is_match(canonical) {
            return true;
        }
        match canonical.strip_prefix(&self.workspace) {
            Ok(rel) if !rel.as_os_str().is_empty() => set.is_match(rel),
            _ => false,
        }
    }

    /// Whether `canonical` is denied.
    pub fn is_denied(&self, canonical: &Path) -> bool {
        self.matches(&self.denied, canonical)
    }

    /// Whether `canonical` is protected.
    pub fn is_protected(&self, canonical: &Path) -> bool {
        self.matches(&self.protected, canonical)
    }

    fn root_of(&self, canonical: &Path) -> Option<&Root> {
        // The deepest root containing the path decides (a writable root inside a read-only one).
        self.roots
            .iter()
            .filter(|r| canonical.starts_with(&r.path))
            .max_by_key(|r| r.path.components().count())
    }

    /// Check a read of `canonical` (asked for as `path`).
    pub fn check_read(&self, path: &Path, canonical: &Path) -> Result<(), FsError> {
        if self.root_of(canonical).is_none() {
            return Err(FsError::OutsideRoot {
                path: path.to_path_buf(),
            });
        }
        if self.is_denied(canonical) {
            return Err(FsError::Denied {
                path: path.to_path_buf(),
            });
        }
        Ok(())
    }

    /// Check a mutation of `canonical` (asked for as `path`).
    pub fn check_write(&self, path: &Path, canonical: &Path) -> Result<(), FsError> {
        let Some(root) = self.root_of(canonical) else {
            return Err(FsError::OutsideRoot {
                path: path.to_path_buf(),
            });
        };
        if self.is_denied(canonical) {
            return Err(FsError::Denied {
                path: path.to_path_buf(),
            });
        }
        if self.is_protected(canonical) {
            return Err(FsError::Protected {
                path: path.to_path_buf(),
            });
        }
        if !root.writable {
            return Err(FsError::PermissionDenied {
                path: path.to_path_buf(),
            });
        }
        let git_component = canonical
            .strip_prefix(&root.path)
            .is_ok_and(|rel| rel.components().any(|c| c.as_os_str() == ".git"));
        match self.nested_git {
            NestedGit::Quarantine if git_component => Err(FsError::GitMetadata {
                path: path.to_path_buf(),
            }),
            NestedGit::Quarantine | NestedGit::Allow => Ok(()),
        }
    }

    /// Whether the rules allow writing `canonical` (mode bits are judged separately).
    pub fn allows_write(&self, canonical: &Path) -> bool {
        self.check_write(canonical, canonical).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_behind_a_restriction_is_the_spec_entry_that_matched() {
        let spec = SandboxSpec {
            protected: vec!["docs/**".into(), ".git/**".into()],
            denied: vec!["**/.env".into(), "/etc/secret".into()],
            ..SandboxSpec::default()
        };
        let extra = vec![Root {
            path: PathBuf::from("/opt/sdk"),
            writable: false,
        }];
        let rules = PathRules::new(Path::new("/ws"), &spec, extra).unwrap();
        let entry = |path: &str| rules.entry_of(Path::new(path));
        assert_eq!(entry("/ws/.git/config"), Some(PathEntry::Protected(1)));
        assert_eq!(entry("/ws/docs"), Some(PathEntry::Protected(0)));
        assert_eq!(entry("/ws/docs/.env"), Some(PathEntry::Denied(0)));
        assert_eq!(entry("/etc/secret"), Some(PathEntry::Denied(1)));
        assert_eq!(entry("/ws/src/a.rs"), None);
        assert_eq!(
            rules.in_writable_root(Path::new("/ws/src/a.rs")),
            Some(true)
        );
        assert_eq!(
            rules.in_writable_root(Path::new("/opt/sdk/bin")),
            Some(false)
        );
        assert_eq!(rules.in_writable_root(Path::new("/usr/bin")), None);
    }

    #[test]
    fn argv_for_read_with_roots() {
        let roots = vec![PathBuf::from("/workspace"), PathBuf::from("/cordon-spill")];
        let argv = files_argv(
            &roots,
            &FileOp::Read {
                path: PathBuf::from("/workspace/a.txt"),
                max: Some(512),
            },
        )
        .expect("valid");
        assert_eq!(
            argv,
            vec![
                "sh".to_owned(),
                "-c".to_owned(),
                crate::worker::WORKER_SCRIPT.to_owned(),
                "cordon-worker".to_owned(),
                "fs".to_owned(),
                "read".to_owned(),
                "2".to_owned(),
                "/workspace".to_owned(),
                "/cordon-spill".to_owned(),
                "/workspace/a.txt".to_owned(),
                "512".to_owned(),
            ]
        );
    }

    #[test]
    fn argv_for_a_read_range_ends_with_the_limit_and_the_offset() {
        let argv = files_argv(
            &[PathBuf::from("/workspace")],
            &FileOp::ReadRange {
                path: PathBuf::from("/workspace/a.txt"),
                offset: 4_194_304,
                max: 512,
            },
        )
        .expect("valid");
        assert_eq!(
            argv[5..],
            [
                "read",
                "1",
                "/workspace",
                "/workspace/a.txt",
                "512",
                "4194304"
            ]
        );
    }

    #[test]
    fn file_ops_are_plain_serialisable_requests() {
        let op = FileOp::Read {
            path: PathBuf::from("/w/a"),
            max: Some(4),
        };
        let json = serde_json::to_string(&op).expect("serialise");
        assert_eq!(json, r#"{"op":"read","args":{"path":"/w/a","max":4}}"#);
        assert_eq!(serde_json::from_str::<FileOp>(&json).expect("parse"), op);
        assert_eq!(
            serde_json::to_string(&FileOp::Canon(PathBuf::from("/w"))).expect("serialise"),
            r#"{"op":"canon","args":"/w"}"#
        );
    }

    #[test]
    fn splits_the_run_prelude() {
        assert_eq!(split_run_prelude(b"canon\0/w\0o"), None);
        assert_eq!(
            split_run_prelude(b"canon\0/w/x\0ok\0rg: oops\n"),
            Some((RunPrelude::Resolved(PathBuf::from("/w/x")), 14))
        );
        assert_eq!(
            split_run_prelude(b"err\0notfound\0/w/y\0no such file or directory\0"),
            Some((
                RunPrelude::Failed {
                    code: "notfound".to_owned(),
                    message: "no such file or directory".to_owned()
                },
                44
            ))
        );
    }

    #[test]
    fn parses_stat_and_entries() {
        let mut parser = files_record_parser();
        let records = parser
            .feed(b"canon\x00/w/a\x00stat\x00f\x0012\x0081a4\x001000\x001000\x00ent\x00x\x00\x00No such file or directory (os error 2)\x00ok\x00")
            .expect("valid");
        let parsed: Vec<FsRecord> = records
            .iter()
            .map(|r| parse_fs_record(r).expect("known"))
            .collect();
        assert_eq!(
            parsed,
            vec![
                FsRecord::Canon(PathBuf::from("/w/a")),
                FsRecord::Stat(StatRecord {
                    kind: FileKind::File,
                    size: 12,
                    mode: 0o644,
                    uid: 1000,
                    gid: 1000,
                }),
                FsRecord::Ent(DirEntry {
                    name: "x".to_owned(),
                    kind: None,
                    error: Some("No such file or directory (os error 2)".to_owned()),
                }),
                FsRecord::Ok,
            ]
        );
    }

    #[test]
    fn maps_error_codes_like_the_local_backend() {
        let p = Path::new("/w/x");
        assert_eq!(
            fs_error("read", p, "notfound", "").errno_name(),
            Some("ENOENT")
        );
        assert_eq!(
            fs_error("read", p, "outside", "").errno_name(),
            Some("EXDEV")
        );
        assert_eq!(
            fs_error("read", p, "isdir", "").errno_name(),
            Some("EISDIR")
        );
        assert_eq!(
            fs_error("read", p, "notdir", "").errno_name(),
            Some("ENOTDIR")
        );
        assert_eq!(
            fs_error("read", p, "access", "").errno_name(),
            Some("EACCES")
        );
        assert_eq!(fs_error("read", p, "loop", "").errno_name(), Some("ELOOP"));
        let rofs = fs_error("write", p, "io", "cannot create x: Read-only file system");
        assert_eq!(rofs.errno_name(), Some("EROFS"));
        assert!(is_read_only_fs(&rofs));
        assert_eq!(
            fs_error("write", p, "io", "disk on fire").to_string(),
            "failed to write /w/x: disk on fire"
        );
    }

    #[test]
    fn unprivileged_write_permission_uses_the_first_matching_class() {
        let stat = StatRecord {
            kind: FileKind::File,
            size: 0,
            mode: 0o466,
            uid: 1000,
            gid: 1000,
        };
        // The owner class decides for the owner even though others may write.
        assert!(!stat.unprivileged_writable(1000, &[1000]));
        assert!(stat.unprivileged_writable(1001, &[1000]));
        assert!(stat.unprivileged_writable(1001, &[2000]));
    }

    fn rules(access: RootAccess) -> PathRules {
        let spec = SandboxSpec {
            workspace: access,
            protected: vec![".git/**".to_owned()],
            denied: vec!["**/.env".to_owned()],
            ..SandboxSpec::default()
        };
        PathRules::new(
            Path::new("/workspace"),
            &spec,
            vec![Root {
                path: PathBuf::from("/cordon-spill"),
                writable: false,
            }],
        )
        .expect("valid globs")
    }

    #[test]
    fn path_rules_decide_like_the_local_backend() {
        let rules = rules(RootAccess::ReadWrite);
        let p = |s: &str| PathBuf::from(s);
        assert!(
            rules
                .check_write(&p("x"), &p("/workspace/src/a.rs"))
                .is_ok()
        );
        assert_eq!(
            rules
                .check_write(&p("x"), &p("/workspace/.git/config"))
                .map_err(|e| e.to_string()),
            Err("path is protected (read-only): x".to_owned())
        );
        // `dir/**` covers the directory itself.
        assert!(matches!(
            rules.check_write(&p("x"), &p("/workspace/.git")),
            Err(FsError::Protected { .. })
        ));
        assert!(
            rules
                .check_read(&p("x"), &p("/workspace/.git/config"))
                .is_ok()
        );
        assert!(matches!(
            rules.check_read(&p("x"), &p("/workspace/sub/.env")),
            Err(FsError::Denied { .. })
        ));
        assert!(matches!(
            rules.check_read(&p("x"), &p("/etc/passwd")),
            Err(FsError::OutsideRoot { .. })
        ));
        assert!(rules.check_read(&p("x"), &p("/cordon-spill/a.log")).is_ok());
        assert!(matches!(
            rules.check_write(&p("x"), &p("/cordon-spill/a.log")),
            Err(FsError::PermissionDenied { .. })
        ));
        let read_only = self::tests::rules(RootAccess::ReadOnly);
        assert!(matches!(
            read_only.check_write(&p("x"), &p("/workspace/a")),
            Err(FsError::PermissionDenied { .. })
        ));
    }

    #[test]
    fn the_stale_temp_script_removes_only_old_regular_files_of_the_exact_naming() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(20 * 60);
        let temp = ".a.txt.cordon-0123456789abcdef.tmp";
        std::fs::create_dir_all(r.join("sub/.git")).unwrap();
        let made = |rel: &str, aged: bool| {
            let path = r.join(rel);
            std::fs::write(&path, b"x").unwrap();
            if aged {
                std::fs::File::options()
                    .append(true)
                    .open(&path)
                    .unwrap()
                    .set_modified(old)
                    .unwrap();
            }
            path
        };
        let stale = made(temp, true);
        let stale_deep = made(&format!("sub/{temp}"), true);
        let young = made(".b.cordon-0123456789abcdef.tmp", false);
        let in_git = made(&format!("sub/.git/{temp}"), true);
        let foreign = made(".a.txt.cordon-0123456789ABCDEF.tmp", true);
        let pid_named = made(".a.txt.cordon-tmp-123", true);
        std::os::unix::fs::symlink(&foreign, r.join(".c.cordon-0000000000000000.tmp")).unwrap();
        let argv = remove_stale_write_temps_argv(
            &[r.to_str().unwrap().to_owned()],
            std::time::Duration::from_secs(10 * 60),
        );
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .unwrap();
        assert!(out.status.success());
        let mut printed: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        printed.sort();
        assert_eq!(
            printed,
            vec![
                stale.to_str().unwrap().to_owned(),
                stale_deep.to_str().unwrap().to_owned()
            ]
        );
        assert!(!stale.exists() && !stale_deep.exists());
        for kept in [young, in_git, foreign, pid_named] {
            assert!(kept.exists(), "{} removed", kept.display());
        }
        assert!(std::fs::symlink_metadata(r.join(".c.cordon-0000000000000000.tmp")).is_ok());
    }
}
