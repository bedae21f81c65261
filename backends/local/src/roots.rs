//! The allowed roots and kernel-confined path resolution.
//!
//! Each root (workspace, extra readable/writable roots, the spill directory) keeps an
//! `O_PATH | O_DIRECTORY` fd open. A path is opened by picking the most specific root that
//! lexically contains it and calling `openat2` relative to that root's fd with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`: `..` escapes, absolute symlinks and symlinks
//! pointing out of the root are refused by the kernel (`EXDEV`). When that happens the path is
//! resolved once more from its real path, and opened beneath the root that contains the real
//! path with `RESOLVE_NO_SYMLINKS` added — so a symlink into another allowed root works, and
//! nothing else does (never weaker than a single-root open).
//!
//! This module also owns the protected/denied glob rules ([`PathRules`]) and the
//! unprivileged-writability judgement ([`Identity`]). It does not do any file I/O beyond
//! opening and naming fds.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use cordon_ops::FsError;
use cordon_ops::denial::PathEntry;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{Gid, Uid};

use cordon_core::sandbox::SandboxSpec;

use crate::LocalError;

/// How often `openat2` is retried when the kernel reports a concurrent rename (`EAGAIN`).
const EAGAIN_RETRIES: usize = 16;

/// How often [`Roots::canonicalize`] resolves a path again when the file it opened was
/// replaced before its name could be read back.
const REPLACED_RETRIES: usize = 16;

/// Whether a root may be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read-only (extra readable roots, a read-only workspace, the spill directory).
    ReadOnly,
    /// Read and write (protected paths excepted).
    ReadWrite,
}

/// What a root is for; the spill directory is exempt from protected/denied globs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RootKind {
    /// The workspace root.
    Workspace,
    /// An extra root from the spec.
    Extra,
    /// Cordon's spill directory for full command output.
    Spill,
}

/// One allowed root with its open directory fd.
#[derive(Debug)]
pub(crate) struct Root {
    /// The canonical path.
    pub path: PathBuf,
    /// The absolute spelling it was configured with, when that differs from `path`.
    pub alias: Option<PathBuf>,
    /// `O_PATH | O_DIRECTORY` fd of the root.
    pub fd: OwnedFd,
    /// Read-only or read-write.
    pub access: Access,
    /// Workspace, extra root or spill directory.
    pub kind: RootKind,
    /// `None`: the whole tree is granted. `Some(files)`: the root is only an anchor for these
    /// canonical files (e.g. `/etc` for `/etc/passwd`); anything else opened beneath it is
    /// outside the allowed roots.
    pub grants: Option<Vec<PathBuf>>,
}

impl Root {
    /// Refuse an fd opened beneath an anchor root unless its real path is one of the granted
    /// files (or below one).
    fn admit(&self, fd: OwnedFd, path: &Path) -> Result<Opened, FsError> {
        if let Some(files) = &self.grants {
            let real = fd_path(fd.as_fd()).map_err(|e| FsError::from_io("resolve", path, e))?;
            if !files.iter().any(|file| real.starts_with(file)) {
                return Err(FsError::OutsideRoot {
                    path: path.to_path_buf(),
                });
            }
        }
        Ok(Opened { fd })
    }
}

/// A path opened beneath a root. Which root applies to it is decided from its canonical
/// path ([`Roots::select_canonical`]), not from the root it was reached through.
#[derive(Debug)]
pub(crate) struct Opened {
    /// The fd, opened with the caller's flags.
    pub fd: OwnedFd,
}

/// The set of allowed roots, most specific first.
#[derive(Debug)]
pub(crate) struct Roots {
    roots: Vec<Root>,
}

impl Roots {
    /// Build from roots; duplicates (same canonical path) are merged, read-write winning.
    pub fn new(mut roots: Vec<Root>) -> Self {
        // Deepest first; equal paths end up next to each other. (A few hundred roots: the
        // keys are computed once each, and merging only looks at the previous root.)
        roots.sort_by_cached_key(|root| {
            (
                std::cmp::Reverse(root.path.components().count()),
                root.path.clone(),
            )
        });
        let mut merged: Vec<Root> = Vec::with_capacity(roots.len());
        for root in roots {
            match merged.last_mut().filter(|r| r.path == root.path) {
                Some(existing) => {
                    if root.access == Access::ReadWrite {
                        existing.access = Access::ReadWrite;
                    }
                    if root.kind == RootKind::Workspace {
                        existing.kind = RootKind::Workspace;
                    }
                    if existing.alias.is_none() {
                        existing.alias = root.alias;
                    }
                    existing.grants = match (existing.grants.take(), root.grants) {
                        (Some(mut files), Some(more)) => {
                            files.extend(more);
                            Some(files)
                        }
                        // A whole-tree grant covers any file grant.
                        (None, _) | (_, None) => None,
                    };
                }
                None => merged.push(root),
            }
        }
        Roots { roots: merged }
    }

    /// All roots, most specific first.
    pub fn iter(&self) -> impl Iterator<Item = &Root> {
        self.roots.iter()
    }

    /// The most specific root whose canonical path or configured alias lexically contains
    /// `path`, with the remaining relative part.
    pub fn select<'p>(&self, path: &'p Path) -> Option<(&Root, &'p Path)> {
        // Prefer canonical spellings over aliases: an alias may be a symlink into a
        // different, more specific root.
        let plain = is_plain(path);
        for root in &self.roots {
            if let Some(rel) = strip_root(path, &root.path, plain) {
                return Some((root, rel));
            }
        }
        for root in &self.roots {
            if let Some(alias) = &root.alias
                && let Some(rel) = strip_root(path, alias, plain)
            {
                return Some((root, rel));
            }
        }
        None
    }

    /// The most specific root containing a canonical path (aliases not considered).
    pub fn select_canonical<'p>(&self, path: &'p Path) -> Option<(&Root, &'p Path)> {
        let plain = is_plain(path);
        self.roots
            .iter()
            .find_map(|root| strip_root(path, &root.path, plain).map(|rel| (root, rel)))
    }

    /// Open `path` (absolute) beneath the root that contains it, following symlinks that stay
    /// inside allowed roots. `flags` get `O_CLOEXEC` added.
    pub fn open(&self, path: &Path, flags: OFlag, op: &'static str) -> Result<Opened, FsError> {
        let outside = || FsError::OutsideRoot {
            path: path.to_path_buf(),
        };
        let (root, rel) = self.select(path).ok_or_else(outside)?;
        match open_beneath(root.fd.as_fd(), rel, flags, ResolveFlag::empty()) {
            Ok(fd) => root.admit(fd, path),
            Err(Errno::EXDEV) => self.open_real(path, flags, op),
            Err(errno) => Err(fs_error(op, path, errno)),
        }
    }

    /// The slow path after `EXDEV`: resolve the real path (of the longest existing prefix,
    /// keeping a missing tail as is), then open it beneath the root that contains it,
    /// refusing any symlink on the way (the real path has none, so one appearing now is a
    /// race and is refused).
    fn open_real(&self, path: &Path, flags: OFlag, op: &'static str) -> Result<Opened, FsError> {
        let outside = || FsError::OutsideRoot {
            path: path.to_path_buf(),
        };
        let real = real_path_lenient(path).ok_or_else(outside)?;
        let (root, rel) = self.select_canonical(&real).ok_or_else(outside)?;
        match open_beneath(
            root.fd.as_fd(),
            rel,
            flags,
            ResolveFlag::RESOLVE_NO_SYMLINKS,
        ) {
            Ok(fd) => root.admit(fd, path),
            Err(Errno::EXDEV | Errno::ELOOP) => Err(outside()),
            Err(errno) => Err(fs_error(op, path, errno)),
        }
    }

    /// Whether `path` is the canonical path or configured spelling of a root.
    pub fn is_root_path(&self, path: &Path) -> bool {
        self.roots
            .iter()
            .any(|root| root.path == path || root.alias.as_deref() == Some(path))
    }

    /// Open a canonical path beneath its root refusing every symlink (for paths produced by
    /// a walk that did not follow links, or by [`Roots::canonicalize`]).
    pub fn open_canonical(
        &self,
        path: &Path,
        flags: OFlag,
        op: &'static str,
    ) -> Result<Opened, FsError> {
        let outside = || FsError::OutsideRoot {
            path: path.to_path_buf(),
        };
        let (root, rel) = self.select_canonical(path).ok_or_else(outside)?;
        match open_beneath(
            root.fd.as_fd(),
            rel,
            flags,
            ResolveFlag::RESOLVE_NO_SYMLINKS,
        ) {
            Ok(fd) => root.admit(fd, path),
            Err(Errno::EXDEV) => Err(outside()),
            Err(errno) => Err(fs_error(op, path, errno)),
        }
    }

    /// The canonical path of `path`: symlinks resolved (confined as in [`Roots::open`]); for
    /// a missing path, the canonical existing parent joined with the missing components. A
    /// dangling symlink resolves to its (missing) target. Components after a missing one must
    /// be plain names (`..` after a missing directory fails like the kernel would).
    pub fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        self.canonicalize_depth(path, 0)
    }

    fn canonicalize_depth(&self, path: &Path, depth: usize) -> Result<PathBuf, FsError> {
        if depth > MAX_SYMLINK_HOPS {
            return Err(fs_error("resolve", path, Errno::ELOOP));
        }
        let mut existing = path;
        let mut missing: Vec<&OsStr> = Vec::new();
        let mut replaced = 0;
        loop {
            match self.open(existing, OFlag::O_PATH, "resolve") {
                Ok(opened) => {
                    let Some(mut real) = self.name_of(opened.fd.as_fd(), existing, path)? else {
                        replaced += 1;
                        if replaced > REPLACED_RETRIES {
                            return Err(fs_error("resolve", path, Errno::EAGAIN));
                        }
                        continue;
                    };
                    let Some((first, rest)) = missing.split_last() else {
                        return Ok(real);
                    };
                    // A dangling symlink as the first missing component: follow it.
                    if let Ok(target) = nix::fcntl::readlinkat(opened.fd.as_fd(), *first) {
                        let target = PathBuf::from(target);
                        let mut next = if target.is_absolute() {
                            target
                        } else {
                            real.join(target)
                        };
                        for name in rest.iter().rev() {
                            next.push(name);
                        }
                        return self
                            .canonicalize_depth(&next, depth + 1)
                            .map_err(|e| match e {
                                FsError::OutsideRoot { .. } => FsError::OutsideRoot {
                                    path: path.to_path_buf(),
                                },
                                other => other,
                            });
                    }
                    for name in missing.iter().rev() {
                        real.push(name);
                    }
                    return Ok(real);
                }
                Err(FsError::NotFound { .. }) => {}
                Err(other) => {
                    return Err(match other {
                        FsError::OutsideRoot { .. } => FsError::OutsideRoot {
                            path: path.to_path_buf(),
                        },
                        other => other,
                    });
                }
            }
            let not_found = || FsError::NotFound {
                path: path.to_path_buf(),
            };
            match existing.components().next_back() {
                Some(Component::Normal(name)) => missing.push(name),
                Some(Component::CurDir) => {}
                _ => return Err(not_found()),
            }
            existing = existing.parent().ok_or_else(not_found)?;
        }
    }
}

/// Most path components [`Roots::resolve_outside_of`] looks at (the path's and every symlink
/// target's together).
const MAX_RESOLVE_COMPONENTS: usize = 4096;

impl Roots {
    /// The canonical path of `path` for explaining a message that names it, resolved one
    /// component at a time (confined like [`Roots::open_canonical`], `O_PATH`, a symlink read
    /// but never opened through) and never looking inside a directory `rules` deny: from
    /// there on the rest of the path is taken as written, so the answer is the same whatever
    /// is in there (a file, a directory, a symlink out of it, nothing). `None` outside the
    /// roots, past [`MAX_SYMLINK_HOPS`] or [`MAX_RESOLVE_COMPONENTS`].
    pub fn resolve_outside_denied(&self, path: &Path, rules: &PathRules) -> Option<PathBuf> {
        let (root, rel) = self.select(path)?;
        let mut real = root.path.clone();
        // The components still to resolve, the next one last.
        let mut pending: Vec<OsString> = Vec::new();
        push_components(&mut pending, rel);
        let mut seen = 0usize;
        let mut hops = 0usize;
        // Whether `real` and its ancestors are known not to be denied (reached one entry at a
        // time), so a child needs judging only as an entry; after a jump (the start, a
        // symlink) a child is judged whole, at most `MAX_SYMLINK_HOPS + 1` times.
        let mut judged_ancestors = false;
        while let Some(name) = pending.pop() {
            seen += 1;
            if seen > MAX_RESOLVE_COMPONENTS {
                return None;
            }
            if name == ".." {
                // The parent of a judged path is judged too.
                real.pop();
                continue;
            }
            if name == "." || name.is_empty() {
                continue;
            }
            let candidate = real.join(&name);
            let hidden = if judged_ancestors {
                rules.is_denied_entry(&candidate)
            } else {
                rules.judge(&candidate) == Verdict::Denied
            };
            if hidden {
                // A denied entry is not even opened: the rest as written.
                return Some(rest_as_written(candidate, pending));
            }
            let opened =
                match self.open_canonical(&candidate, OFlag::O_PATH | OFlag::O_NOFOLLOW, "resolve")
                {
                    Ok(opened) => opened,
                    Err(FsError::OutsideRoot { .. }) => return None,
                    Err(_) => {
                        // Missing (or not a directory): the rest as written.
                        return Some(rest_as_written(candidate, pending));
                    }
                };
            let stat = nix::sys::stat::fstat(opened.fd.as_fd()).ok()?;
            if file_type(&stat) != SFlag::S_IFLNK {
                real = candidate;
                judged_ancestors = true;
                continue;
            }
            hops += 1;
            if hops > MAX_SYMLINK_HOPS {
                return None;
            }
            let target = PathBuf::from(nix::fcntl::readlinkat(opened.fd.as_fd(), "").ok()?);
            judged_ancestors = false;
            if target.is_absolute() {
                let (root, rel) = self.select(&target)?;
                real = root.path.clone();
                push_components(&mut pending, rel);
            } else {
                push_components(&mut pending, &target);
            }
        }
        Some(real)
    }
}

/// `real` joined with the components still `pending`, taken as written (`..` lexically).
fn rest_as_written(mut real: PathBuf, mut pending: Vec<OsString>) -> PathBuf {
    while let Some(name) = pending.pop() {
        if name == ".." {
            real.pop();
        } else if name != "." && !name.is_empty() {
            real.push(name);
        }
    }
    real
}

/// Push `rel`'s components onto `pending` so that its first component is popped first.
fn push_components(pending: &mut Vec<OsString>, rel: &Path) {
    let start = pending.len();
    for component in rel.components() {
        match component {
            Component::Normal(name) => pending.push(name.to_os_string()),
            Component::ParentDir => pending.push("..".into()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    pending[start..].reverse();
}

impl Roots {
    /// [`Roots::open`] plus the canonical path of what was opened, read back from the fd and
    /// checked to still be `path`'s file ([`Roots::name_of`]); opened again when the file was
    /// replaced in between. Policy verdicts are taken on this path: a name read back from the
    /// fd of a file replaced meanwhile is the writer's temp name, which no rule names.
    pub fn open_named(
        &self,
        path: &Path,
        flags: OFlag,
        op: &'static str,
    ) -> Result<(Opened, PathBuf), FsError> {
        for _ in 0..=REPLACED_RETRIES {
            let opened = self.open(path, flags, op)?;
            if let Some(name) = self.name_of(opened.fd.as_fd(), path, path)? {
                return Ok((opened, name));
            }
        }
        Err(fs_error(op, path, Errno::EAGAIN))
    }

    /// The path of `fd` (opened from `existing`), read back from `/proc`, or `None` when the
    /// file at `existing` was replaced meanwhile: an atomic write (a rename or an exchange
    /// over the name) leaves the fd on the old inode, whose name is then the writer's temp
    /// name or `… (deleted)`, never the path asked for. So the name only counts if it is the
    /// path asked for (the fd's inode is linked there as the name is read: whatever replaced
    /// what before, the verdict on that name is the right one), or if `existing` still leads
    /// to the same inode after it was read.
    fn name_of(
        &self,
        fd: BorrowedFd<'_>,
        existing: &Path,
        path: &Path,
    ) -> Result<Option<PathBuf>, FsError> {
        let real = fd_path(fd).map_err(|e| FsError::from_io("resolve", path, e))?;
        if real.as_os_str() == existing.as_os_str() {
            return Ok(Some(real));
        }
        let stat = nix::sys::stat::fstat(fd).map_err(|e| fs_error("resolve", path, e))?;
        if file_type(&stat) == SFlag::S_IFDIR {
            // Writes never swap a directory in.
            return Ok(Some(real));
        }
        let again = match self.open(existing, OFlag::O_PATH, "resolve") {
            Ok(again) => again,
            Err(FsError::NotFound { .. }) => return Ok(None),
            Err(other) => return Err(other),
        };
        let same = nix::sys::stat::fstat(again.fd.as_fd())
            .is_ok_and(|now| now.st_dev == stat.st_dev && now.st_ino == stat.st_ino);
        Ok(same.then_some(real))
    }
}

/// `realpath` of the longest existing prefix of `path`, joined with the rest. Only used to
/// pick the root for a second, kernel-confined open; never trusted on its own.
fn real_path_lenient(path: &Path) -> Option<PathBuf> {
    let mut existing = path;
    let mut rest: Vec<&OsStr> = Vec::new();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(mut real) => {
                for part in rest.iter().rev() {
                    real.push(part);
                }
                return Some(real);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                rest.push(existing.file_name()?);
                existing = existing.parent()?;
            }
            Err(_) => return None,
        }
    }
}

/// Symlink hops followed by hand (dangling links on write/canonicalize), as the kernel's
/// own limit.
pub(crate) const MAX_SYMLINK_HOPS: usize = 40;

/// `openat2` beneath `dir` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | extra`.
pub(crate) fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlag,
    extra: ResolveFlag,
) -> Result<OwnedFd, Errno> {
    let rel: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS | extra);
    let mut attempt = 0;
    loop {
        match openat2(dir, rel, how) {
            Err(Errno::EAGAIN) if attempt < EAGAIN_RETRIES => attempt += 1,
            Err(Errno::EINTR) => {}
            result => return result,
        }
    }
}

/// Map an errno of step `op` on `path` to the matching [`FsError`].
pub(crate) fn fs_error(op: &'static str, path: &Path, errno: Errno) -> FsError {
    FsError::from_io(op, path, io::Error::from(errno))
}

/// The real path of an open fd (`/proc/self/fd/N`).
pub(crate) fn fd_path(fd: BorrowedFd<'_>) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Open a root directory as `O_PATH | O_DIRECTORY`.
pub(crate) fn open_root_dir(path: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Fail closed when the kernel lacks `openat2` + `RESOLVE_BENEATH`.
pub(crate) fn probe_openat2(root: BorrowedFd<'_>) -> Result<(), LocalError> {
    match open_beneath(root, Path::new("."), OFlag::O_PATH, ResolveFlag::empty()) {
        Ok(_) => Ok(()),
        Err(errno) => Err(LocalError::Openat2Unavailable {
            source: io::Error::from(errno),
        }),
    }
}

/// A path's verdict under the protected/denied globs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Neither readable nor writable.
    Denied,
    /// Readable, never writable.
    Protected,
    /// No glob applies.
    Free,
}

/// Compiled protected and denied globs, plus the concrete secrets the host defaults carved
/// out. Patterns are relative to the workspace root (and then match only inside it, as in the
/// policy), or absolute (`~/` expanded); `*` does not cross `/`, `**` does; `dir/**` also
/// matches `dir`. A path is judged with all its ancestors, so a protected or denied directory
/// covers everything below it.
#[derive(Debug)]
pub(crate) struct PathRules {
    workspace: PathBuf,
    protected: GlobPair,
    denied: GlobPair,
    /// Concrete denied paths (canonical), e.g. `/etc/shadow`, `~/.cargo/credentials.toml`.
    denied_paths: Vec<PathBuf>,
    /// The patterns after `~/` expansion, for the command sandbox's expansion.
    patterns: Vec<Pattern>,
}

/// One protected or denied pattern as the glob expansion needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pattern {
    /// Relative to the workspace (`false`) or absolute (`true`).
    pub absolute: bool,
    /// The pattern text (`./` removed, `~/` expanded).
    pub text: String,
    /// Protected (`false`) or denied (`true`).
    pub denied: bool,
}

#[derive(Debug)]
struct GlobPair {
    relative: GlobSet,
    absolute: GlobSet,
    /// For each glob of `relative`, the index of the spec entry it was compiled from.
    relative_entries: Vec<usize>,
    /// Same for `absolute`.
    absolute_entries: Vec<usize>,
}

impl GlobPair {
    /// The first spec entry (the earliest in the policy) with a glob matching, if any: the
    /// same entry every backend names.
    fn first_entry(&self, rel: Option<&Path>, abs: &Path) -> Option<usize> {
        let relative = rel.into_iter().flat_map(|rel| {
            self.relative
                .matches(rel)
                .into_iter()
                .filter_map(|i| self.relative_entries.get(i).copied())
        });
        let absolute = self
            .absolute
            .matches(abs)
            .into_iter()
            .filter_map(|i| self.absolute_entries.get(i).copied());
        relative.chain(absolute).min()
    }

    fn is_empty(&self) -> bool {
        self.relative.is_empty() && self.absolute.is_empty()
    }

    /// `rel` is the path relative to the workspace, `None` outside it.
    fn is_match(&self, rel: Option<&Path>, abs: &Path) -> bool {
        rel.is_some_and(|rel| self.relative.is_match(rel)) || self.absolute.is_match(abs)
    }
}

impl PathRules {
    /// Compile the spec's `protected` and `denied` globs. `workspace` is the canonical
    /// workspace root, `home` expands `~/`; `denied_paths` are concrete canonical paths that
    /// are denied too.
    pub fn new(
        workspace: &Path,
        home: Option<&Path>,
        spec: &SandboxSpec,
        denied_paths: Vec<PathBuf>,
    ) -> Result<Self, LocalError> {
        let mut patterns = Vec::new();
        let protected = compile_globs(&spec.protected, home, false, &mut patterns)?;
        let denied = compile_globs(&spec.denied, home, true, &mut patterns)?;
        Ok(PathRules {
            workspace: workspace.to_path_buf(),
            protected,
            denied,
            denied_paths,
            patterns,
        })
    }

    /// Whether anything is denied (callers skip the canonical-path lookup otherwise).
    pub fn has_denied(&self) -> bool {
        !self.denied.is_empty() || !self.denied_paths.is_empty()
    }

    /// Whether no rule exists at all.
    pub fn is_empty(&self) -> bool {
        !self.has_denied() && self.protected.is_empty()
    }

    /// The patterns, for expanding them into concrete paths.
    pub fn patterns(&self) -> &[Pattern] {
        &self.patterns
    }

    /// The concrete denied paths.
    pub fn denied_paths(&self) -> &[PathBuf] {
        &self.denied_paths
    }

    /// The workspace the relative patterns are anchored at.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// Judge a canonical path and all its ancestors.
    pub fn judge(&self, canonical: &Path) -> Verdict {
        if self.is_empty() {
            return Verdict::Free;
        }
        if self.denied_paths.iter().any(|d| canonical.starts_with(d)) {
            return Verdict::Denied;
        }
        let mut protected = false;
        for candidate in canonical.ancestors() {
            if candidate.parent().is_none() {
                break;
            }
            let rel = candidate.strip_prefix(&self.workspace).ok();
            if self.denied.is_match(rel, candidate) {
                return Verdict::Denied;
            }
            protected = protected || self.protected.is_match(rel, candidate);
        }
        if protected {
            Verdict::Protected
        } else {
            Verdict::Free
        }
    }

    /// The spec entry that restricts a canonical path (judged with its ancestors, like
    /// [`PathRules::judge`]): a denied entry before a protected one. `None` when no pattern
    /// applies, and for the concrete denied paths of the host defaults, which no policy
    /// entry names.
    pub fn entry_of(&self, canonical: &Path) -> Option<PathEntry> {
        if self.denied_paths.iter().any(|d| canonical.starts_with(d)) {
            return None;
        }
        let mut protected = None;
        for candidate in canonical.ancestors() {
            if candidate.parent().is_none() {
                break;
            }
            let rel = candidate.strip_prefix(&self.workspace).ok();
            if let Some(index) = self.denied.first_entry(rel, candidate) {
                return Some(PathEntry::Denied(index));
            }
            if protected.is_none() {
                protected = self.protected.first_entry(rel, candidate);
            }
        }
        protected.map(PathEntry::Protected)
    }

    /// How an entry itself (not its ancestors, which a walk already judged) is matched:
    /// `(protected, denied)`.
    pub fn judge_entry(&self, canonical: &Path) -> (bool, bool) {
        let rel = canonical.strip_prefix(&self.workspace).ok();
        let denied = self.denied.is_match(rel, canonical)
            || self.denied_paths.iter().any(|d| d == canonical);
        (self.protected.is_match(rel, canonical), denied)
    }

    /// Whether a walked entry itself (not its ancestors, which the walk already judged) is
    /// denied.
    pub fn is_denied_entry(&self, canonical: &Path) -> bool {
        if !self.has_denied() {
            return false;
        }
        self.judge_entry(canonical).1
    }
}

fn compile_globs(
    patterns: &[String],
    home: Option<&Path>,
    denied: bool,
    out: &mut Vec<Pattern>,
) -> Result<GlobPair, LocalError> {
    let mut relative = GlobSetBuilder::new();
    let mut absolute = GlobSetBuilder::new();
    let mut relative_entries = Vec::new();
    let mut absolute_entries = Vec::new();
    for (entry, pattern) in patterns.iter().enumerate() {
        let expanded = match (pattern.strip_prefix("~/"), home) {
            (Some(rest), Some(home)) => format!("{}/{rest}", home.display()),
            _ => pattern.clone(),
        };
        let mut trimmed = expanded.as_str();
        while let Some(rest) = trimmed.strip_prefix("./") {
            trimmed = rest;
        }
        out.push(Pattern {
            absolute: trimmed.starts_with('/'),
            text: trimmed.to_string(),
            denied,
        });
        let mut variants = vec![trimmed.to_string()];
        // `dir/**` also covers `dir` itself: no replacing a protected directory as a whole.
        if let Some(dir) = trimmed.strip_suffix("/**")
            && !dir.is_empty()
        {
            variants.push(dir.to_string());
        }
        for variant in variants {
            let glob = GlobBuilder::new(&variant)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|source| LocalError::Glob {
                    pattern: pattern.clone(),
                    source,
                })?;
            if variant.starts_with('/') {
                absolute.add(glob);
                absolute_entries.push(entry);
            } else {
                relative.add(glob);
                relative_entries.push(entry);
            }
        }
    }
    let build = |builder: GlobSetBuilder| {
        builder.build().map_err(|source| LocalError::Glob {
            pattern: patterns.join(", "),
            source,
        })
    };
    Ok(GlobPair {
        relative: build(relative)?,
        absolute: build(absolute)?,
        relative_entries,
        absolute_entries,
    })
}

/// Who this process is, for judging writability as an unprivileged process would.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
}

impl Identity {
    /// The effective uid, gid and supplementary groups of this process.
    pub fn current() -> Result<Self, LocalError> {
        let groups = nix::unistd::getgroups().map_err(|e| LocalError::ProcessInfo {
            what: "supplementary groups",
            source: io::Error::from(e),
        })?;
        Ok(Identity {
            uid: nix::unistd::geteuid(),
            gid: nix::unistd::getegid(),
            groups,
        })
    }

    /// The effective uid.
    pub fn uid(&self) -> Uid {
        self.uid
    }

    /// Whether the mode bits of `stat` let this identity write, ignoring root's override
    /// (sandboxed commands run without capabilities). For a directory, writing means
    /// creating entries, which also needs search (`x`) permission.
    pub fn can_write(&self, stat: &FileStat) -> bool {
        let mode = stat.st_mode;
        let (write, exec) = if Uid::from_raw(stat.st_uid) == self.uid {
            (0o200, 0o100)
        } else if Gid::from_raw(stat.st_gid) == self.gid
            || self.groups.contains(&Gid::from_raw(stat.st_gid))
        {
            (0o020, 0o010)
        } else {
            (0o002, 0o001)
        };
        let is_dir = SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR;
        mode & write != 0 && (!is_dir || mode & exec != 0)
    }
}

/// The file type bits of a stat.
pub(crate) fn file_type(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits())
}

/// The process umask, read without changing it (`/proc/self/status`, Linux 4.7+). Falls
/// back to the conventional 0o022 only if the kernel does not report it.
pub(crate) fn current_umask() -> Result<u32, LocalError> {
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(|source| LocalError::ProcessInfo {
            what: "umask",
            source,
        })?;
    Ok(status
        .lines()
        .find_map(|line| line.strip_prefix("Umask:"))
        .and_then(|value| u32::from_str_radix(value.trim(), 8).ok())
        .unwrap_or(0o022))
}

/// A file name as bytes-safe `OsStr` (for building temp names).
pub(crate) fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

/// Whether `path` is absolute and spelled without `//`, `.` components or a trailing `/`:
/// then a root (always a plain, canonical spelling) contains it exactly when its bytes start
/// with the root's followed by `/` or the end, and [`strip_root`] may compare bytes.
fn is_plain(path: &Path) -> bool {
    let bytes = path.as_os_str().as_bytes();
    bytes.first() == Some(&b'/')
        && !bytes.windows(2).any(|w| w == b"//")
        && !bytes.windows(3).any(|w| w == b"/./")
        && !bytes.ends_with(b"/.")
        && (bytes.len() == 1 || !bytes.ends_with(b"/"))
}

/// `path.strip_prefix(root)`, by bytes when `path` is plain (see [`is_plain`]); the root
/// list is walked on every file operation and component-wise comparison dominated it.
pub(crate) fn strip_root<'p>(path: &'p Path, root: &Path, plain: bool) -> Option<&'p Path> {
    if !plain {
        return path.strip_prefix(root).ok();
    }
    let bytes = path.as_os_str().as_bytes();
    let prefix = root.as_os_str().as_bytes();
    if prefix == b"/" {
        return Some(Path::new(OsStr::from_bytes(&bytes[1..])));
    }
    let rest = bytes.strip_prefix(prefix)?;
    match rest.split_first() {
        None => Some(Path::new("")),
        Some((b'/', tail)) => Some(Path::new(OsStr::from_bytes(tail))),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn byte_wise_root_stripping_agrees_with_path_strip_prefix() {
        let roots = ["/", "/ws", "/ws/sub", "/usr/lib", "/w"];
        let paths = [
            "/",
            "/ws",
            "/ws/",
            "/ws/a",
            "/ws/a/b",
            "/wsx",
            "/wsx/a",
            "/ws//a",
            "/ws/./a",
            "/ws/a/.",
            "/ws/..",
            "/ws/../etc",
            "/ws/sub/x",
            "/usr/lib64/x",
            "/usr/lib/x",
            "/w",
            "/w/",
            "relative/ws",
            "",
        ];
        for root in roots {
            for path in paths {
                let path = Path::new(path);
                let expected = path.strip_prefix(root).ok();
                let got = strip_root(path, Path::new(root), is_plain(path));
                assert_eq!(
                    got.map(|p| p.components().collect::<Vec<_>>()),
                    expected.map(|p| p.components().collect::<Vec<_>>()),
                    "root {root} path {}",
                    path.display()
                );
            }
        }
        assert!(is_plain(Path::new("/ws/a")));
        assert!(!is_plain(Path::new("/ws//a")));
        assert!(!is_plain(Path::new("ws/a")));
    }

    use super::*;

    #[test]
    fn roots_are_merged_by_path_and_ordered_deepest_first() {
        let dir = tempfile::tempdir().unwrap();
        let root = |rel: &str, access: Access, grants: Option<Vec<PathBuf>>| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(&path).unwrap();
            Root {
                fd: open_root_dir(&path).unwrap(),
                path,
                alias: None,
                access,
                kind: RootKind::Extra,
                grants,
            }
        };
        let roots = Roots::new(vec![
            root("a", Access::ReadOnly, Some(vec![dir.path().join("a/f")])),
            root("a/b/c", Access::ReadOnly, None),
            root("z", Access::ReadOnly, None),
            root("a", Access::ReadWrite, Some(vec![dir.path().join("a/g")])),
            root("a/b", Access::ReadOnly, None),
            root("z", Access::ReadOnly, Some(vec![dir.path().join("z/f")])),
        ]);
        let seen: Vec<(PathBuf, Access, Option<Vec<PathBuf>>)> = roots
            .iter()
            .map(|r| {
                (
                    r.path.strip_prefix(dir.path()).unwrap().to_path_buf(),
                    r.access,
                    r.grants.clone(),
                )
            })
            .collect();
        let files = |names: &[&str]| Some(names.iter().map(|n| dir.path().join(n)).collect());
        assert_eq!(
            seen,
            vec![
                (PathBuf::from("a/b/c"), Access::ReadOnly, None),
                (PathBuf::from("a/b"), Access::ReadOnly, None),
                (
                    PathBuf::from("a"),
                    Access::ReadWrite,
                    files(&["a/f", "a/g"])
                ),
                // A whole-tree grant covers the file grant.
                (PathBuf::from("z"), Access::ReadOnly, None),
            ]
        );
    }

    /// The name of an opened file counts when it is the path asked for; a file replaced by a
    /// rename over its name (the fd's inode is then `… (deleted)`) is opened again, so the
    /// verdict is taken on the file now at the name, never on a stale or temp name.
    #[test]
    fn resolving_for_a_note_stops_at_denied_entries_and_bounds_symlink_loops() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap();
        let roots = Roots::new(vec![Root {
            fd: open_root_dir(&path).unwrap(),
            path: path.clone(),
            alias: None,
            access: Access::ReadWrite,
            kind: RootKind::Workspace,
            grants: None,
        }]);
        let spec = SandboxSpec {
            denied: vec!["secret/**".into()],
            ..SandboxSpec::default()
        };
        let rules = PathRules::new(&path, None, &spec, Vec::new()).unwrap();
        std::fs::create_dir_all(path.join("secret")).unwrap();
        std::fs::create_dir_all(path.join("public")).unwrap();
        std::fs::write(path.join("secret/file"), "k").unwrap();
        std::os::unix::fs::symlink("../public", path.join("secret/out")).unwrap();
        std::os::unix::fs::symlink("secret", path.join("via")).unwrap();
        std::os::unix::fs::symlink("loop-b", path.join("loop-a")).unwrap();
        std::os::unix::fs::symlink("loop-a", path.join("loop-b")).unwrap();
        // Inside the denied directory the path is taken as written, whatever is there.
        for name in ["file", "out", "missing"] {
            for prefix in ["secret", "via"] {
                assert_eq!(
                    roots.resolve_outside_denied(&path.join(prefix).join(name).join("x"), &rules),
                    Some(path.join("secret").join(name).join("x")),
                    "{prefix}/{name}/x"
                );
            }
        }
        // Outside it, symlinks are resolved and a missing tail is kept.
        assert_eq!(
            roots.resolve_outside_denied(&path.join("public/new"), &rules),
            Some(path.join("public/new"))
        );
        assert_eq!(
            roots.resolve_outside_denied(&path.join("loop-a/x"), &rules),
            None
        );
        assert_eq!(
            roots.resolve_outside_denied(Path::new("/elsewhere/x"), &rules),
            None
        );
    }

    #[test]
    fn open_named_trusts_the_asked_name_and_reopens_a_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap();
        let roots = Roots::new(vec![Root {
            fd: open_root_dir(&path).unwrap(),
            path: path.clone(),
            alias: None,
            access: Access::ReadWrite,
            kind: RootKind::Workspace,
            grants: None,
        }]);
        let file = path.join("f.txt");
        std::fs::write(&file, "old").unwrap();
        let (opened, name) = roots.open_named(&file, OFlag::O_RDONLY, "open").unwrap();
        assert_eq!(name, file);
        assert_eq!(
            std::fs::read_to_string(format!("/proc/self/fd/{}", opened.fd.as_raw_fd())).unwrap(),
            "old"
        );

        // Replaced after the open: the old inode's name is no longer the path asked for.
        let stale = roots.open(&file, OFlag::O_RDONLY, "open").unwrap();
        std::fs::write(path.join(".f.txt.tmp"), "new").unwrap();
        std::fs::rename(path.join(".f.txt.tmp"), &file).unwrap();
        assert!(
            fd_path(stale.fd.as_fd())
                .unwrap()
                .to_string_lossy()
                .ends_with("(deleted)")
        );
        assert_eq!(roots.name_of(stale.fd.as_fd(), &file, &file).unwrap(), None);

        // A symlink inside the root: the name read back differs from the path asked for and
        // is trusted only because the path still leads to the same inode.
        std::os::unix::fs::symlink("f.txt", path.join("link")).unwrap();
        let (_, name) = roots
            .open_named(&path.join("link"), OFlag::O_RDONLY, "open")
            .unwrap();
        assert_eq!(name, file);
    }

    #[test]
    fn the_entry_behind_a_verdict_is_the_spec_entry_that_matched() {
        let rules = rules(
            &["docs/**", ".git/**", "~/.bashrc"],
            &["**/.env", "~/.ssh/**"],
        );
        let entry = |path: &str| rules.entry_of(Path::new(path));
        assert_eq!(entry("/ws/.git"), Some(PathEntry::Protected(1)));
        assert_eq!(
            entry("/ws/.git/hooks/pre-commit"),
            Some(PathEntry::Protected(1))
        );
        assert_eq!(entry("/ws/docs/a/b.md"), Some(PathEntry::Protected(0)));
        assert_eq!(entry("/home/me/.bashrc"), Some(PathEntry::Protected(2)));
        assert_eq!(entry("/ws/sub/.env"), Some(PathEntry::Denied(0)));
        assert_eq!(entry("/home/me/.ssh/id"), Some(PathEntry::Denied(1)));
        // Denied beats protected, as in `judge`.
        assert_eq!(entry("/ws/docs/.env"), Some(PathEntry::Denied(0)));
        assert_eq!(entry("/ws/src/main.rs"), None);
        // Relative patterns match only inside the workspace.
        assert_eq!(entry("/elsewhere/docs/x"), None);
        // The host's secrets are denied by no policy entry.
        assert_eq!(entry("/home/me/.cargo/credentials.toml"), None);
        // Two entries match: the earlier in the policy is named, whether it is relative or
        // absolute.
        let both = super::tests::rules(&["**/.cordon/**", ".cordon/**"], &[]);
        assert_eq!(
            both.entry_of(Path::new("/ws/.cordon/policy.toml")),
            Some(PathEntry::Protected(0))
        );
        assert_eq!(
            rules.judge(Path::new("/home/me/.cargo/credentials.toml")),
            Verdict::Denied
        );
    }

    fn rules(protected: &[&str], denied: &[&str]) -> PathRules {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let spec = SandboxSpec {
            protected: strings(protected),
            denied: strings(denied),
            ..SandboxSpec::default()
        };
        PathRules::new(
            Path::new("/ws"),
            Some(Path::new("/home/me")),
            &spec,
            vec![PathBuf::from("/home/me/.cargo/credentials.toml")],
        )
        .unwrap()
    }

    #[test]
    fn protected_dir_glob_covers_the_dir_and_everything_below() {
        let rules = rules(&[".git/**"], &[]);
        assert_eq!(rules.judge(Path::new("/ws/.git")), Verdict::Protected);
        assert_eq!(
            rules.judge(Path::new("/ws/.git/config")),
            Verdict::Protected
        );
        assert_eq!(
            rules.judge(Path::new("/ws/.git/hooks/pre-commit")),
            Verdict::Protected
        );
        assert_eq!(rules.judge(Path::new("/ws/.gitignore")), Verdict::Free);
        assert_eq!(rules.judge(Path::new("/ws/sub/.git/config")), Verdict::Free);
    }

    #[test]
    fn denied_beats_protected_and_covers_descendants() {
        let rules = rules(&["secrets/**"], &["secrets", "**/.env", "~/.ssh/**"]);
        assert_eq!(rules.judge(Path::new("/ws/secrets/key")), Verdict::Denied);
        assert_eq!(rules.judge(Path::new("/ws/a/b/.env")), Verdict::Denied);
        assert_eq!(rules.judge(Path::new("/ws/.env")), Verdict::Denied);
        assert_eq!(
            rules.judge(Path::new("/home/me/.ssh/id_ed25519")),
            Verdict::Denied
        );
        assert_eq!(rules.judge(Path::new("/ws/.envrc")), Verdict::Free);
        assert!(rules.is_denied_entry(Path::new("/ws/x/.env")));
        assert!(!rules.is_denied_entry(Path::new("/ws/x/env")));
    }

    #[test]
    fn relative_globs_match_inside_the_workspace_only() {
        let rules = rules(&[], &["**/.env"]);
        assert_eq!(rules.judge(Path::new("/ws/deep/.env")), Verdict::Denied);
        assert_eq!(rules.judge(Path::new("/elsewhere/.env")), Verdict::Free);
        assert!(!rules.is_denied_entry(Path::new("/elsewhere/.env")));
    }

    #[test]
    fn host_secrets_are_denied_with_everything_below() {
        let rules = rules(&[], &[]);
        assert!(rules.has_denied());
        assert_eq!(
            rules.judge(Path::new("/home/me/.cargo/credentials.toml")),
            Verdict::Denied
        );
        assert_eq!(
            rules.judge(Path::new("/home/me/.cargo/config.toml")),
            Verdict::Free
        );
        assert_eq!(
            rules.judge_entry(Path::new("/home/me/.cargo/credentials.toml")),
            (false, true)
        );
    }

    #[test]
    fn patterns_are_kept_expanded_for_the_command_sandbox() {
        let rules = rules(&["./.git/**"], &["~/.ssh/**", "**/.env"]);
        assert_eq!(
            rules.patterns(),
            &[
                Pattern {
                    absolute: false,
                    text: ".git/**".into(),
                    denied: false
                },
                Pattern {
                    absolute: true,
                    text: "/home/me/.ssh/**".into(),
                    denied: true
                },
                Pattern {
                    absolute: false,
                    text: "**/.env".into(),
                    denied: true
                },
            ]
        );
    }

    #[test]
    fn single_star_does_not_cross_directories() {
        let rules = rules(&[], &["*.pem"]);
        assert_eq!(rules.judge(Path::new("/ws/key.pem")), Verdict::Denied);
        assert_eq!(rules.judge(Path::new("/ws/sub/key.pem")), Verdict::Free);
    }

    #[test]
    fn invalid_glob_names_the_pattern() {
        let spec = SandboxSpec {
            protected: vec!["a[".to_string()],
            ..SandboxSpec::default()
        };
        let err = PathRules::new(Path::new("/ws"), None, &spec, Vec::new()).unwrap_err();
        assert!(err.to_string().contains("`a[`"), "{err}");
    }

    #[test]
    fn writability_ignores_root_override() {
        let ident = Identity {
            uid: Uid::from_raw(1000),
            gid: Gid::from_raw(1000),
            groups: vec![Gid::from_raw(27)],
        };
        let stat = |uid: u32, gid: u32, mode: u32| {
            let mut st = some_stat();
            st.st_uid = uid;
            st.st_gid = gid;
            st.st_mode = mode;
            st
        };
        assert!(ident.can_write(&stat(1000, 0, 0o100644)));
        assert!(!ident.can_write(&stat(1000, 0, 0o100444)));
        assert!(ident.can_write(&stat(0, 27, 0o100664)));
        assert!(!ident.can_write(&stat(0, 0, 0o100644)));
        assert!(ident.can_write(&stat(0, 0, 0o100666)));
        assert!(
            !ident.can_write(&stat(1000, 0, 0o040600)),
            "dir needs x to create entries"
        );
        assert!(ident.can_write(&stat(1000, 0, 0o040700)));
    }

    /// A real `FileStat` (of `/`) whose fields the test then overwrites.
    fn some_stat() -> FileStat {
        let fd = open_root_dir(Path::new("/")).unwrap();
        nix::sys::stat::fstat(fd).unwrap()
    }
}
