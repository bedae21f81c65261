//! Keeping git metadata made by sandboxed commands away from the host's `git`
//! ([`GitGuard`]).
//!
//! Host git runs programs named in a repository's own files: `core.fsmonitor`, `core.pager`,
//! `core.hooksPath`, hooks, filters. A command that creates a repository anywhere under a
//! writable root (`git init` in `src/`, `git init --bare .` in a workspace without `.git`)
//! would make the operator's next `git status` there run what the model chose. The guard
//! finds every git directory git's discovery would accept under the writable roots:
//!
//! - every entry named `.git` (directory, gitfile or symlink), except an empty placeholder
//!   the command sandbox pinned at a missing protected path (git skips an empty `.git`);
//! - every directory that is a git directory itself: `HEAD` plus either `objects` and `refs`,
//!   or `commondir` (git's `is_git_directory`), including a root itself. Each of those
//!   counts whatever its type (git only calls `access(X_OK)` on `objects` and `refs`, so an
//!   executable file or a symlink does).
//!
//! Those present when the guard starts are the operator's (their nested repositories and
//! submodules): they are recorded by identity (`st_dev`, `st_ino`) and reported by
//! [`GitGuard::protected_paths`] so both layers keep them read-only. Anything found later that
//! is not recorded is neutralised by [`GitGuard::sweep`]: renamed, through a directory fd
//! opened beneath the root without following symlinks, to a name git does not recognise
//! (`.git` → `.git.cordon-quarantine`, and a git directory's `HEAD` →
//! `HEAD.cordon-quarantine`). Nothing is deleted: the operator can look at it and rename it
//! back.
//!
//! The walk never follows symlinks, does not enter `.git` entries (recorded ones are
//! read-only; new ones are renamed and entered on the next pass) and caches each directory
//! by identity and change time like the pattern expansion does, so a sweep of an unchanged
//! tree costs one `lstat` per directory. A tree larger than [`MAX_ENTRIES`] makes the sweep
//! fail (commands then fail closed).
//!
//! A session that was killed cannot sweep after its last command: each guard with a state
//! directory leaves a baseline file there (`<pid>-<hex>.baseline`, the recorded identities) while
//! it runs. A guard starting on the same root treats what a dead session's baseline does not
//! list as made by that session and neutralises it before recording its own baseline.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cordon_sandbox::RenameMode;
use nix::errno::Errno;
use nix::fcntl::{OFlag, ResolveFlag};
use nix::sys::stat::{SFlag, fstat};

use crate::roots::{open_beneath, open_root_dir, strip_root};
use crate::stamp::{Stamp, settled, stamp_of};

/// Upper bound on directory entries one sweep may look at (fresh or cached).
pub const MAX_ENTRIES: usize = 2_000_000;

/// Upper bound on sweep passes: how deep repositories nested inside new `.git` directories
/// are followed (each pass enters what the previous one renamed).
pub const MAX_SWEEP_PASSES: usize = 64;

/// The suffix of a neutralised name.
pub const QUARANTINE_SUFFIX: &str = ".cordon-quarantine";

/// Largest baseline file of a dead session that is read.
const MAX_BASELINE_BYTES: u64 = 16 << 20;

/// Why the guard could not start or sweep.
#[derive(Debug, thiserror::Error)]
pub enum GitGuardError {
    /// A writable root could not be opened.
    #[error("failed to open writable root {path} to check for git metadata: {source}")]
    OpenRoot {
        /// The root.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The walk needed more entries than [`MAX_ENTRIES`].
    #[error(
        "failed to check the writable roots for git metadata: more than {limit} entries under {base}; narrow the writable roots"
    )]
    TooLarge {
        /// Where the walk was.
        base: PathBuf,
        /// The limit.
        limit: usize,
    },
    /// A new git directory could not be renamed.
    #[error(
        "failed to quarantine git metadata {path} made by a command: {source}; remove it before running git on the host"
    )]
    Quarantine {
        /// The entry.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A directory commands can reach could not be read.
    #[error(
        "failed to read directory {path} to check for git metadata: {source}; give its owner read and search permission (`chmod u+rx {path}`) or remove it before running git on the host"
    )]
    Unreadable {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// New git metadata was still found after [`MAX_SWEEP_PASSES`] passes.
    #[error(
        "failed to quarantine git metadata: repositories are nested inside new `.git` directories more than {limit} levels deep; remove {path} before running git on the host"
    )]
    TooDeep {
        /// An entry still found.
        path: PathBuf,
        /// The limit.
        limit: usize,
    },
    /// The baseline file could not be written.
    #[error("failed to write the git metadata baseline {path}: {source}")]
    Baseline {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// What kind of git metadata an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GitKind {
    /// An entry named `.git` (directory, gitfile or symlink).
    DotGit,
    /// A directory git accepts as a git directory (`HEAD` + `objects` + `refs`, or `HEAD` +
    /// `commondir`).
    GitDir,
}

/// One piece of git metadata found under a writable root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitEntry {
    /// Its path (under a canonical root).
    pub path: PathBuf,
    /// What it is.
    pub kind: GitKind,
    /// Whether it is a directory (a `.git` may be a gitfile or a symlink).
    pub is_dir: bool,
}

/// A neutralised entry: what was renamed to what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    /// The entry as found (a `.git`, or the git directory whose `HEAD` was renamed).
    pub path: PathBuf,
    /// What it was.
    pub kind: GitKind,
    /// The renamed path.
    pub renamed_to: PathBuf,
}

/// `(st_dev, st_ino, birth time in ns or 0)`: the inode number alone may be reused at once
/// for an entry made after the recorded one was removed.
type Id = (u64, u64, u128);

fn id_of(meta: &std::fs::Metadata) -> Id {
    let born = meta
        .created()
        .ok()
        .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |age| age.as_nanos());
    (meta.dev(), meta.ino(), born)
}

/// What a directory held when it was last read.
#[derive(Debug)]
struct CachedDir {
    stamp: Stamp,
    /// Subdirectories to enter (not symlinks, not `.git`).
    subdirs: Vec<OsString>,
    /// Whether it has an entry named `.git`.
    dot_git: bool,
    /// The stamp of the `.git` here when it was last found to be an empty sandbox
    /// placeholder, kept only when settled (see `crate::stamp`): an unchanged settled stamp
    /// is the same empty placeholder, and it is not read again after every command.
    placeholder_git: Option<Stamp>,
    /// Whether this listing may be reused while the stamp stays the same (`crate::stamp`).
    settled: bool,
    /// Whether it has the signature of a git directory.
    git_dir: bool,
}

/// One writable root.
#[derive(Debug)]
struct GuardRoot {
    path: PathBuf,
    fd: OwnedFd,
}

/// Finds git metadata under the writable roots and neutralises what was not there at start.
#[derive(Debug)]
pub struct GitGuard {
    roots: Vec<GuardRoot>,
    /// Paths never recorded nor neutralised.
    exempt: Vec<PathBuf>,
    /// Identities of the entries recorded at start.
    baseline: HashSet<Id>,
    /// The entries recorded at start, for [`GitGuard::protected_paths`].
    recorded: Vec<GitEntry>,
    cache: HashMap<PathBuf, CachedDir>,
    /// This guard's baseline file, removed by [`GitGuard::finish`].
    baseline_file: Option<PathBuf>,
    /// Entries the last sweep looked at.
    last_entries: usize,
    /// Hooks directories of the roots' own repositories (`core.hooksPath`) inside a root.
    hooks: Vec<PathBuf>,
}

impl GitGuard {
    /// Record the git metadata under `roots` (canonical writable roots) as the operator's.
    ///
    /// `exempt` entries are neither recorded nor neutralised: a workspace's own `.git` that
    /// both layers already keep read-only whether it exists or not.
    ///
    /// With `state_dir` (a private directory of this user for this workspace), baseline files
    /// of dead sessions found there are honoured first: what such a baseline does not list is
    /// neutralised (returned), then this guard's own baseline is written there.
    ///
    /// # Errors
    /// A root that cannot be opened, a tree larger than [`MAX_ENTRIES`], a rename or the
    /// baseline file failing.
    pub fn start(
        roots: &[PathBuf],
        exempt: &[PathBuf],
        state_dir: Option<&Path>,
    ) -> Result<(GitGuard, Vec<Quarantined>), GitGuardError> {
        let mut guard_roots = Vec::new();
        for path in roots {
            let fd = open_root_dir(path).map_err(|source| GitGuardError::OpenRoot {
                path: path.clone(),
                source,
            })?;
            guard_roots.push(GuardRoot {
                path: path.clone(),
                fd,
            });
        }
        let mut guard = GitGuard {
            roots: guard_roots,
            exempt: exempt.to_vec(),
            baseline: HashSet::new(),
            recorded: Vec::new(),
            cache: HashMap::new(),
            baseline_file: None,
            last_entries: 0,
            hooks: Vec::new(),
        };
        for root in roots {
            for hooks in hooks_paths_of(root) {
                if roots.iter().any(|writable| hooks.starts_with(writable)) {
                    tracing::info!(
                        path = %hooks.display(),
                        "git guard: the repository's hooks directory lies in a writable root; keeping it read-only"
                    );
                    guard.hooks.push(hooks);
                }
            }
        }
        let mut quarantined = Vec::new();
        let stale = state_dir.map(stale_baselines).unwrap_or_default();
        // Everything a dead session did not know about may be its work: fail closed (with
        // several, only what all of them knew stays).
        let dead = stale
            .iter()
            .map(|(_, ids)| ids.clone())
            .reduce(|known, ids| known.intersection(&ids).copied().collect());
        if let Some(dead) = dead {
            guard.baseline = dead;
            quarantined = guard.sweep()?;
            tracing::warn!(
                entries = quarantined.len(),
                "git guard: checked what a session that did not shut down left behind"
            );
        }
        for (file, _) in &stale {
            if let Err(error) = std::fs::remove_file(file) {
                tracing::warn!(file = %file.display(), %error, "git guard: failed to remove a stale baseline");
            }
        }
        let found = guard.scan()?;
        guard.baseline = found.iter().map(|(id, _)| *id).collect();
        guard.recorded = found.into_iter().map(|(_, entry)| entry).collect();
        guard.recorded.sort_by(|a, b| a.path.cmp(&b.path));
        if let Some(dir) = state_dir {
            guard.baseline_file = Some(write_baseline(dir, &guard.baseline)?);
        }
        Ok((guard, quarantined))
    }

    /// The git metadata recorded at start (the operator's).
    pub fn recorded(&self) -> &[GitEntry] {
        &self.recorded
    }

    /// The paths both layers keep read-only: the hooks directory a root's own repository
    /// names with `core.hooksPath` in `.git/config` when it lies in a writable root (husky's
    /// `.husky`: the operator's next commit would run what a command wrote there), each recorded `.git` that is a directory or a
    /// gitfile (a symlink is left alone: replacing it makes a new, unrecorded entry), each
    /// recorded git directory below a root, and in a root that is a git directory itself the
    /// entries git runs or trusts (`HEAD`, `config`, `hooks`, `commondir`, `objects`, `refs`,
    /// `info`, `worktrees`, `config.worktree`, `packed-refs`) that exist.
    pub fn protected_paths(&self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        for entry in &self.recorded {
            let is_root = self.roots.iter().any(|root| root.path == entry.path);
            match (entry.kind, is_root) {
                (GitKind::DotGit, _) => {
                    let is_symlink = std::fs::symlink_metadata(&entry.path)
                        .is_ok_and(|meta| meta.file_type().is_symlink());
                    if !is_symlink {
                        paths.push(entry.path.clone());
                    }
                }
                (GitKind::GitDir, false) => paths.push(entry.path.clone()),
                (GitKind::GitDir, true) => {
                    for name in GIT_DIR_ENTRIES {
                        let path = entry.path.join(name);
                        if std::fs::symlink_metadata(&path).is_ok() {
                            paths.push(path);
                        }
                    }
                }
            }
        }
        paths.extend(self.hooks.iter().cloned());
        paths.sort();
        paths.dedup();
        paths
    }

    /// Whether the last sweep looked at no more than `entries` entries.
    pub fn was_small(&self, entries: usize) -> bool {
        self.last_entries <= entries
    }

    /// Find git metadata that was not recorded at start and neutralise it.
    ///
    /// # Errors
    /// A tree larger than [`MAX_ENTRIES`], a rename that failed (the rest is still
    /// neutralised; the first failure is returned), or new metadata still found after
    /// [`MAX_SWEEP_PASSES`] passes.
    pub fn sweep(&mut self) -> Result<Vec<Quarantined>, GitGuardError> {
        let mut quarantined = Vec::new();
        // A neutralised `.git` directory is entered on the next pass (it may hold git
        // directories of its own, e.g. `modules/*`); each pass re-reads only what changed.
        // Passes go on until one finds nothing new; deeper nesting than the bound fails.
        let mut passes = 0;
        loop {
            let fresh: Vec<(Id, GitEntry)> = self
                .scan()?
                .into_iter()
                .filter(|(id, _)| !self.baseline.contains(id))
                .collect();
            let Some((_, first)) = fresh.first() else {
                return Ok(quarantined);
            };
            if passes == MAX_SWEEP_PASSES {
                tracing::error!(
                    path = %first.path.display(),
                    "git guard: git metadata nested deeper than the sweep follows"
                );
                return Err(GitGuardError::TooDeep {
                    path: first.path.clone(),
                    limit: MAX_SWEEP_PASSES,
                });
            }
            passes += 1;
            let mut first_error = None;
            for (_, entry) in fresh {
                match self.neutralise(&entry) {
                    Ok(done) => {
                        tracing::warn!(
                            path = %done.path.display(),
                            renamed_to = %done.renamed_to.display(),
                            "git guard: quarantined git metadata made by a command"
                        );
                        quarantined.push(done);
                    }
                    Err(error) => {
                        tracing::error!(%error, "git guard: could not quarantine git metadata");
                        first_error.get_or_insert(error);
                    }
                }
            }
            if let Some(error) = first_error {
                return Err(error);
            }
        }
    }

    /// Sweep a last time and remove this guard's baseline file (a clean shutdown).
    ///
    /// # Errors
    /// As [`GitGuard::sweep`]; the baseline file is kept then, so the next session on the
    /// same root checks again.
    pub fn finish(&mut self) -> Result<Vec<Quarantined>, GitGuardError> {
        let quarantined = self.sweep()?;
        if let Some(file) = self.baseline_file.take()
            && let Err(error) = std::fs::remove_file(&file)
        {
            // Left behind, it makes the next session on this root check again (harmless).
            tracing::warn!(file = %file.display(), %error, "git guard: failed to remove the baseline");
        }
        Ok(quarantined)
    }

    /// Every piece of git metadata under the roots now, with its identity.
    fn scan(&mut self) -> Result<Vec<(Id, GitEntry)>, GitGuardError> {
        let mut walk = Walk {
            started: std::time::SystemTime::now(),
            old: std::mem::take(&mut self.cache),
            new: HashMap::new(),
            found: Vec::new(),
            entries: 0,
        };
        let mut result = Ok(());
        for root in &self.roots {
            result = walk.visit(&root.path);
            if result.is_err() {
                break;
            }
        }
        let Walk {
            new,
            mut found,
            entries,
            ..
        } = walk;
        found.retain(|(_, entry)| !self.exempt.contains(&entry.path));
        self.cache = new;
        self.last_entries = if result.is_ok() { entries } else { usize::MAX };
        result?;
        Ok(found)
    }

    /// Rename `entry` (a `.git`) or its `HEAD` (a git directory) to a name git ignores.
    fn neutralise(&self, entry: &GitEntry) -> Result<Quarantined, GitGuardError> {
        let fail = |source: io::Error| GitGuardError::Quarantine {
            path: entry.path.clone(),
            source,
        };
        let (root, rel) = self
            .roots
            .iter()
            .find_map(|root| strip_root(&entry.path, &root.path, true).map(|rel| (root, rel)))
            .ok_or_else(|| fail(io::Error::from(io::ErrorKind::NotFound)))?;
        let (dir_rel, name) = match entry.kind {
            GitKind::DotGit => (
                rel.parent().unwrap_or(Path::new("")).to_path_buf(),
                OsString::from(".git"),
            ),
            GitKind::GitDir => (rel.to_path_buf(), OsString::from("HEAD")),
        };
        let dir = open_dir_beneath(&root.fd, &dir_rel).map_err(|e| fail(e.into()))?;
        let new_name = rename_aside(&dir, &name).map_err(|e| fail(e.into()))?;
        let renamed_to = root.path.join(&dir_rel).join(&new_name);
        if entry.kind == GitKind::DotGit && entry.is_dir {
            // The renamed directory is still a git directory for `git -C` inside it.
            if let Ok(inner) = open_dir_beneath(&dir, Path::new(&new_name)) {
                // Without a HEAD git does not take it for a repository.
                if let Err(error) = rename_aside(&inner, OsStr::new("HEAD")) {
                    tracing::warn!(
                        dir = %renamed_to.display(),
                        %error,
                        "git guard: failed to move HEAD aside in a quarantined git directory"
                    );
                }
            }
        }
        Ok(Quarantined {
            path: entry.path.clone(),
            kind: entry.kind,
            renamed_to,
        })
    }
}

/// Largest `.git/config` read for `core.hooksPath`.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The hooks directory `root/.git/config` sets with `core.hooksPath` (the last one wins, as
/// in git), resolved like git does (relative to the working tree, `~/` to the home
/// directory); also where it leads when it is a symlink. Empty when unset or unreadable.
/// Only that file is read (no `[include]`, no global configuration).
fn hooks_paths_of(root: &Path) -> Vec<PathBuf> {
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nofollow()
        .open(root.join(".git/config"))
    else {
        return Vec::new();
    };
    if !file.metadata().is_ok_and(|meta| meta.is_file()) {
        return Vec::new();
    }
    let mut text = String::new();
    if file
        .take(MAX_CONFIG_BYTES)
        .read_to_string(&mut text)
        .is_err()
    {
        return Vec::new();
    }
    let Some(value) = config_hooks_path(&text) else {
        return Vec::new();
    };
    let path = match value.strip_prefix("~/") {
        Some(rest) => match std::env::var_os("HOME") {
            Some(home) => Path::new(&home).join(rest),
            None => return Vec::new(),
        },
        None => root.join(&value),
    };
    let mut lexical = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                lexical.pop();
            }
            std::path::Component::CurDir => {}
            other => lexical.push(other),
        }
    }
    let mut paths = vec![lexical.clone()];
    if let Ok(real) = lexical.canonicalize()
        && real != lexical
    {
        paths.push(real);
    }
    paths
}

/// The last `hooksPath` value of the `[core]` section in git configuration text.
fn config_hooks_path(text: &str) -> Option<String> {
    let mut in_core = false;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(section) = line.strip_prefix('[') {
            let name = section.split(']').next().unwrap_or("").trim();
            in_core = name.eq_ignore_ascii_case("core");
            continue;
        }
        if !in_core {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !key.trim().eq_ignore_ascii_case("hookspath") {
            continue;
        }
        let mut out = String::new();
        let mut quoted = false;
        for ch in value.trim().chars() {
            match ch {
                '"' => quoted = !quoted,
                '#' | ';' if !quoted => break,
                _ => out.push(ch),
            }
        }
        let out = out.trim().to_owned();
        found = (!out.is_empty()).then_some(out);
    }
    found
}

/// Entries of a git directory that git runs or trusts; protected in a root that is a git
/// directory itself (the root cannot be made read-only as a whole).
const GIT_DIR_ENTRIES: [&str; 10] = [
    "HEAD",
    "config",
    "hooks",
    "commondir",
    "objects",
    "refs",
    "info",
    "worktrees",
    "config.worktree",
    "packed-refs",
];

/// Open `rel` beneath `dir` as a directory without following any symlink.
fn open_dir_beneath(dir: &OwnedFd, rel: &Path) -> Result<OwnedFd, Errno> {
    open_beneath(
        dir.as_fd(),
        rel,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        ResolveFlag::RESOLVE_NO_SYMLINKS,
    )
}

/// Rename `name` in `dir` to `name.cordon-quarantine` (or `…-2`, `…-3`, … when taken) without
/// replacing anything; the new name.
fn rename_aside(dir: &OwnedFd, name: &OsStr) -> Result<OsString, Errno> {
    for attempt in 1..=100u32 {
        let mut new_name = name.to_os_string();
        new_name.push(QUARANTINE_SUFFIX);
        if attempt > 1 {
            new_name.push(format!("-{attempt}"));
        }
        match crate::files::renameat2(
            dir.as_fd(),
            name,
            dir.as_fd(),
            new_name.as_os_str(),
            RenameMode::NoReplace,
        ) {
            Ok(()) => return Ok(new_name),
            Err(Errno::EEXIST) => continue,
            Err(errno) => return Err(errno),
        }
    }
    Err(Errno::EEXIST)
}

/// One scan's state.
struct Walk {
    /// When this scan began: listings and verdicts are settled relative to it.
    started: std::time::SystemTime,
    old: HashMap<PathBuf, CachedDir>,
    new: HashMap<PathBuf, CachedDir>,
    found: Vec<(Id, GitEntry)>,
    entries: usize,
}

impl Walk {
    fn visit(&mut self, dir: &Path) -> Result<(), GitGuardError> {
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            return Ok(());
        };
        if !meta.is_dir() {
            return Ok(());
        }
        let stamp = stamp_of(&meta);
        let cached = match self.old.remove(dir) {
            Some(cached) if cached.stamp == stamp && cached.settled => cached,
            _ => match read_dir_restoring(dir, &meta, &mut self.entries)? {
                Some(mut fresh) => {
                    fresh.settled = settled(&fresh.stamp, self.started);
                    fresh
                }
                None => return Ok(()),
            },
        };
        self.entries += cached.subdirs.len() + 1;
        if self.entries > MAX_ENTRIES {
            return Err(GitGuardError::TooLarge {
                base: dir.to_path_buf(),
                limit: MAX_ENTRIES,
            });
        }
        if cached.git_dir {
            self.found.push((
                id_of(&meta),
                GitEntry {
                    path: dir.to_path_buf(),
                    kind: GitKind::GitDir,
                    is_dir: true,
                },
            ));
        }
        let mut cached = cached;
        let known_placeholder = cached.placeholder_git.take();
        if cached.dot_git {
            let path = dir.join(".git");
            match judge_dot_git(&path, known_placeholder) {
                DotGit::Gone => {}
                DotGit::Placeholder(stamp) => {
                    cached.placeholder_git = settled(&stamp, self.started).then_some(stamp);
                }
                DotGit::Real(meta) => self.found.push((
                    id_of(&meta),
                    GitEntry {
                        path,
                        kind: GitKind::DotGit,
                        is_dir: meta.is_dir(),
                    },
                )),
            }
        }
        let subdirs: Vec<PathBuf> = cached.subdirs.iter().map(|name| dir.join(name)).collect();
        self.new.insert(dir.to_path_buf(), cached);
        for sub in subdirs {
            self.visit(&sub)?;
        }
        Ok(())
    }
}

/// What a `.git` entry is, judged on one descriptor of it.
enum DotGit {
    /// Gone (or unreadable as anything at all) by the time it was looked at.
    Gone,
    /// An empty sandbox placeholder (it stands for "no `.git`"), with its stamp.
    Placeholder(Stamp),
    /// Anything else: git metadata for the sweep to judge.
    Real(std::fs::Metadata),
}

/// Judge the `.git` at `path`. `known` is the stamp it had when last found to be an empty
/// placeholder: the same stamp now (same inode; adding an entry or changing the mode changes
/// its ctime) is that placeholder still, without reading it again. Otherwise the mode and the
/// emptiness are checked on one descriptor (no symlink followed), so the verdict and the
/// stamp belong to the same object even if a concurrent command swaps the name.
fn judge_dot_git(path: &Path, known: Option<Stamp>) -> DotGit {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return DotGit::Gone;
    };
    if !meta.is_dir() || !cordon_sandbox::is_placeholder_mode(meta.mode()) {
        return DotGit::Real(meta);
    }
    if known == Some(stamp_of(&meta)) {
        return DotGit::Placeholder(stamp_of(&meta));
    }
    let Ok(fd) = nix::fcntl::open(
        path,
        OFlag::O_RDONLY
            | OFlag::O_DIRECTORY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) else {
        // Replaced by something that is not a directory meanwhile: judge that.
        return std::fs::symlink_metadata(path).map_or(DotGit::Gone, DotGit::Real);
    };
    let file = std::fs::File::from(fd);
    let Ok(opened) = file.metadata() else {
        return DotGit::Real(meta);
    };
    if !opened.is_dir() || !cordon_sandbox::is_placeholder_mode(opened.mode()) {
        return DotGit::Real(opened);
    }
    let Ok(mut listing) = nix::dir::Dir::from_fd(OwnedFd::from(file)) else {
        return DotGit::Real(opened);
    };
    let empty = listing.iter().filter_map(Result::ok).all(|entry| {
        let name = entry.file_name().to_bytes();
        name == b"." || name == b".."
    });
    if empty {
        DotGit::Placeholder(stamp_of(&opened))
    } else {
        DotGit::Real(opened)
    }
}

/// Read a directory afresh ([`read_dir`]); `None` when it is gone or cannot be reached by a
/// command either.
///
/// The sweep runs once the command's processes are dead, so a directory a command made
/// unreadable (`chmod 311`, even on a root) can be given back: its owner's read and search
/// permission is restored (`fchmodat` relative to its parent without following a symlink)
/// and it is read again. One Cordon still cannot read but can search (another user's) may
/// hold what a command made: the walk fails closed. One Cordon cannot even search cannot be
/// entered by a command of the same user either and is skipped.
fn read_dir_restoring(
    dir: &Path,
    meta: &std::fs::Metadata,
    entries: &mut usize,
) -> Result<Option<CachedDir>, GitGuardError> {
    let unreadable = |source: io::Error| GitGuardError::Unreadable {
        path: dir.to_path_buf(),
        source,
    };
    match read_dir(dir, stamp_of(meta), entries) {
        Ok(fresh) => return Ok(Some(fresh)),
        Err(error) => match Errno::from_raw(error.raw_os_error().unwrap_or(0)) {
            Errno::ENOENT | Errno::ENOTDIR => return Ok(None),
            Errno::EACCES | Errno::EPERM => {}
            _ => return Err(unreadable(error)),
        },
    }
    if restore_owner_rx(dir, meta).is_ok() {
        tracing::warn!(
            path = %dir.display(),
            "git guard: gave a directory a command made unreadable back its owner's read and search permission"
        );
        let meta = std::fs::symlink_metadata(dir).map_err(unreadable)?;
        return read_dir(dir, stamp_of(&meta), entries)
            .map(Some)
            .map_err(unreadable);
    }
    if nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK).is_err() {
        tracing::debug!(path = %dir.display(), "git guard: skipped a directory no command can enter");
        return Ok(None);
    }
    tracing::error!(path = %dir.display(), "git guard: cannot read a directory commands can reach");
    Err(unreadable(io::Error::from_raw_os_error(
        Errno::EACCES as i32,
    )))
}

/// Add the owner's read and search bits to `dir` (a directory `meta` describes), through
/// its parent without following a symlink at `dir`.
fn restore_owner_rx(dir: &Path, meta: &std::fs::Metadata) -> Result<(), Errno> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(Errno::EINVAL);
    };
    let parent = nix::fcntl::open(
        parent,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let mode = nix::sys::stat::Mode::from_bits_truncate((meta.mode() & 0o7777) | 0o500);
    nix::sys::stat::fchmodat(
        &parent,
        name,
        mode,
        nix::sys::stat::FchmodatFlags::NoFollowSymlink,
    )
}

/// Read a directory afresh: its subdirectories, whether it has a `.git` and whether it is a
/// git directory.
fn read_dir(dir: &Path, stamp: Stamp, entries: &mut usize) -> io::Result<CachedDir> {
    let mut subdirs = Vec::new();
    let mut dot_git = false;
    let (mut head, mut objects, mut refs, mut commondir) = (false, false, false, false);
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else {
            continue;
        };
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        *entries += 1;
        let name = entry.file_name();
        match name.as_bytes() {
            b".git" => dot_git = true,
            b"HEAD" => head = true,
            // Git only checks these with access(X_OK), which follows symlinks and accepts an
            // executable file: any entry of any type counts, as `HEAD` does.
            b"objects" => objects = true,
            b"refs" => refs = true,
            b"commondir" => commondir = true,
            _ => {}
        }
        if file_type.is_dir() && name.as_bytes() != b".git" {
            subdirs.push(name);
        }
    }
    subdirs.sort();
    Ok(CachedDir {
        stamp,
        subdirs,
        dot_git,
        placeholder_git: None,
        settled: false,
        git_dir: head && ((objects && refs) || commondir),
    })
}

/// Baseline files of sessions on this root whose process is gone, with their identities.
fn stale_baselines(dir: &Path) -> Vec<(PathBuf, HashSet<Id>)> {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut stale = Vec::new();
    for entry in listing.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".baseline"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) != Err(Errno::ESRCH) {
            continue;
        }
        let path = entry.path();
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags_nofollow()
            .open(&path)
        else {
            continue;
        };
        let mut text = String::new();
        if file
            .take(MAX_BASELINE_BYTES)
            .read_to_string(&mut text)
            .is_err()
        {
            continue;
        }
        let ids = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(' ').map(str::parse::<u128>);
                let dev = u64::try_from(fields.next()?.ok()?).ok()?;
                let ino = u64::try_from(fields.next()?.ok()?).ok()?;
                Some((dev, ino, fields.next()?.ok()?))
            })
            .collect();
        stale.push((path, ids));
    }
    stale
}

/// `O_NOFOLLOW | O_NONBLOCK` on an [`std::fs::OpenOptions`].
trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl NoFollow for std::fs::OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
    }
}

/// Write `<pid>-<16 hex>.baseline` in `dir`.
fn write_baseline(dir: &Path, ids: &HashSet<Id>) -> Result<PathBuf, GitGuardError> {
    let path = dir.join(format!(
        "{}-{:016x}.baseline",
        std::process::id(),
        fastrand::u64(..)
    ));
    let fail = |source: io::Error| GitGuardError::Baseline {
        path: path.clone(),
        source,
    };
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags_nofollow()
            .open(&path)
    };
    let mut file = match open() {
        // Another Cordon's start-up sweep removed the (empty, idle) directory meanwhile.
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(fail)?;
            open()
        }
        other => other,
    }
    .map_err(fail)?;
    let stat = fstat(&file).map_err(|e| fail(e.into()))?;
    if crate::roots::file_type(&stat) != SFlag::S_IFREG {
        return Err(fail(io::Error::from(io::ErrorKind::InvalidInput)));
    }
    let mut text = String::new();
    for (dev, ino, born) in ids {
        text.push_str(&format!("{dev} {ino} {born}\n"));
    }
    file.write_all(text.as_bytes()).map_err(fail)?;
    Ok(path)
}

/// Whether creating or changing `path` (canonical, below `root`) makes or changes git
/// metadata: a component below `root` named `.git`, or an entry that would give a directory
/// from `root` down the signature of a git directory (`HEAD` + `objects` + `refs`, or `HEAD`
/// + `commondir`) with the entries it already has. Looks at each ancestor once (O(depth)).
pub fn makes_git_metadata(path: &Path, root: &Path) -> bool {
    let Some(rel) = strip_root(path, root, false) else {
        return false;
    };
    if rel.components().any(|c| c.as_os_str() == ".git") {
        return true;
    }
    let mut dir = path;
    while let Some(parent) = dir.parent() {
        if strip_root(parent, root, false).is_none() {
            break;
        }
        let added = dir.file_name().map(OsStr::as_bytes);
        let has = |name: &str| {
            added == Some(name.as_bytes()) || std::fs::symlink_metadata(parent.join(name)).is_ok()
        };
        if has("HEAD") && ((has("objects") && has("refs")) || has("commondir")) {
            return true;
        }
        dir = parent;
    }
    false
}

/// The text appended to a command's result when the guard neutralised something, with paths
/// shown as `shown` maps them (a container names the workspace differently from the host).
pub fn quarantine_note(
    quarantined: &[Quarantined],
    shown: impl Fn(&Path) -> PathBuf,
) -> Option<String> {
    if quarantined.is_empty() {
        return None;
    }
    let mut note = String::from(
        "Cordon quarantined git metadata this session created (host git would run hooks and \
         programs named in its config):",
    );
    for entry in quarantined {
        note.push_str(&format!(
            "\n  {} -> {}",
            shown(&entry.path).display(),
            shown(&entry.renamed_to).display()
        ));
    }
    note.push_str(
        "\nDo not create git repositories inside the workspace; the operator can allow nested \
         repositories with `nested_git = \"allow\"` in the policy's [filesystem] section.",
    );
    Some(note)
}

#[cfg(test)]
#[path = "git_guard_tests.rs"]
mod tests;
