//! Cordon's per-user state on this host: `<base>/cordon-<uid>/` (0700) holding
//!
//! - `spill/<16-hex hash of the canonical workspace root>/cordon-bash-<16 hex>.log`: full
//!   command output, kept across sessions so a later `read` (another `cordon exec`) can open
//!   it; every backend start sweeps the spill files of *all* roots by the bounds of
//!   [`cordon_ops::leftovers`] (older than a day, or the oldest beyond a total size, never
//!   one still locked by its writer) and removes root directories left empty;
//! - `tmp-<pid>-<16 hex>/`: the private `TMPDIR` of one backend's commands, removed when the
//!   backend is shut down or dropped, or by a later backend once `<pid>` no longer exists;
//! - `git/<16-hex hash of the root>/`: the git metadata baselines of running sessions on that
//!   root ([`crate::git_guard`]); removed by the start-up sweep once empty and unchanged for a
//!   day.
//!
//! Every directory level is created 0700 with `mkdirat`, reopened with `O_NOFOLLOW` and
//! checked to be owned by us: a symlink or a directory owned by someone else (another user
//! pre-creating it in a shared `/tmp`) is refused rather than used.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use cordon_ops::leftovers::{self, SpillBounds, SpillFile};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Pid, Uid, UnlinkatFlags, unlinkat};
use sha2::{Digest, Sha256};

use crate::LocalError;
use crate::roots::{fd_path, file_type};

/// The directories one backend uses.
#[derive(Debug)]
pub(crate) struct StateDirs {
    /// The spill directory (canonical).
    pub spill_path: PathBuf,
    /// An open fd of the spill directory (files are created relative to it), holding a shared
    /// lock on it for the backend's life so no other backend's sweep removes it.
    pub spill_fd: OwnedFd,
    /// The private temp directory for commands.
    pub tmp: PrivateTmp,
    /// Where this root's git metadata baselines live.
    pub git_path: PathBuf,
}

/// The private `TMPDIR` of one backend; removed on [`PrivateTmp::remove`] or drop.
#[derive(Debug)]
pub(crate) struct PrivateTmp {
    path: PathBuf,
}

impl PrivateTmp {
    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Remove it and everything commands left in it. Idempotent.
    pub fn remove(&self) {
        // std's remove_dir_all does not follow symlinks inside the tree.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Create (or reuse) the state directories for `canonical_root` under `base`, clean up stale
/// spill files and orphaned temp dirs, and create a fresh private temp dir.
pub(crate) fn prepare(
    base: &Path,
    canonical_root: &Path,
    uid: Uid,
) -> Result<StateDirs, LocalError> {
    let base_fd = nix::fcntl::open(
        base,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| LocalError::StateDir {
        op: "open",
        path: base.to_path_buf(),
        source: io::Error::from(e),
    })?;
    let user_name = format!("cordon-{}", uid.as_raw());
    let user_path = base.join(&user_name);
    let user_fd = secure_dir(base_fd.as_fd(), &user_path, uid)?;
    let spill_parent_path = user_path.join("spill");
    let spill_parent_fd = secure_dir(user_fd.as_fd(), &spill_parent_path, uid)?;
    let spill_path = spill_parent_path.join(root_hash(canonical_root));
    let spill_fd = locked_spill_dir(spill_parent_fd.as_fd(), &spill_path, uid)?;
    let git_parent_path = user_path.join("git");
    let git_parent_fd = secure_dir(user_fd.as_fd(), &git_parent_path, uid)?;
    let now = SystemTime::now();
    if spill_sweep_due(spill_parent_fd.as_fd(), now) {
        sweep_spill(spill_parent_fd.as_fd(), now, SpillBounds::default());
        remove_idle_git_dirs(git_parent_fd.as_fd(), now);
    }
    remove_orphaned_tmp_dirs(user_fd.as_fd(), &user_path);
    let tmp = create_private_tmp(user_fd.as_fd(), &user_path, uid)?;
    let git_path = git_parent_path.join(root_hash(canonical_root));
    secure_dir(git_parent_fd.as_fd(), &git_path, uid)?;
    // Canonical spelling, so the spill root matches paths the kernel reports for its fds.
    let spill_path = fd_path(spill_fd.as_fd()).map_err(|source| LocalError::StateDir {
        op: "resolve",
        path: spill_path.clone(),
        source,
    })?;
    Ok(StateDirs {
        spill_path,
        spill_fd,
        tmp,
        git_path,
    })
}

/// 16 hex digits identifying a workspace root (stable across runs and Cordon versions).
pub(crate) fn root_hash(canonical_root: &Path) -> String {
    let digest = Sha256::digest(canonical_root.as_os_str().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// `mkdirat` 0700 (existing is fine), reopen without following a symlink, check the owner,
/// tighten the mode to 0700.
fn secure_dir(parent: BorrowedFd<'_>, path: &Path, uid: Uid) -> Result<OwnedFd, LocalError> {
    let name = path.file_name().unwrap_or(OsStr::new("."));
    match mkdirat(parent, name, Mode::S_IRWXU) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => {
            return Err(LocalError::StateDir {
                op: "create",
                path: path.to_path_buf(),
                source: io::Error::from(e),
            });
        }
    }
    let unsafe_dir = |reason: String| LocalError::UnsafeStateDir {
        path: path.to_path_buf(),
        reason,
    };
    let fd = match nix::fcntl::openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return Err(unsafe_dir("it is a symlink".into())),
        Err(Errno::ENOTDIR) => {
            let is_link = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .map(|st| file_type(&st) == nix::sys::stat::SFlag::S_IFLNK)
                .unwrap_or(false);
            return Err(unsafe_dir(if is_link {
                "it is a symlink".into()
            } else {
                "it is not a directory".into()
            }));
        }
        Err(e) => {
            return Err(LocalError::StateDir {
                op: "open",
                path: path.to_path_buf(),
                source: io::Error::from(e),
            });
        }
    };
    let stat = fstat(&fd).map_err(|e| LocalError::StateDir {
        op: "inspect",
        path: path.to_path_buf(),
        source: io::Error::from(e),
    })?;
    if stat.st_uid != uid.as_raw() {
        return Err(unsafe_dir(format!(
            "it is owned by uid {}, not by this user (uid {})",
            stat.st_uid,
            uid.as_raw()
        )));
    }
    if stat.st_mode & 0o077 != 0 {
        fchmod(&fd, Mode::S_IRWXU).map_err(|e| LocalError::StateDir {
            op: "restrict permissions of",
            path: path.to_path_buf(),
            source: io::Error::from(e),
        })?;
    }
    Ok(fd)
}

/// Names of the entries of a directory fd (without `.` and `..`).
fn entry_names(dir: BorrowedFd<'_>) -> Vec<Vec<u8>> {
    let Ok(mut listing) = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return Vec::new();
    };
    listing
        .iter()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_bytes().to_vec())
        .filter(|name| name.as_slice() != b"." && name.as_slice() != b"..")
        .collect()
}

/// Create (or reuse) this root's spill directory and take a shared lock on it. A sweep of
/// another backend may have removed the directory between our open and our lock: then the
/// name no longer leads to what we locked and we start again.
fn locked_spill_dir(parent: BorrowedFd<'_>, path: &Path, uid: Uid) -> Result<OwnedFd, LocalError> {
    let name = path.file_name().unwrap_or(OsStr::new("."));
    let mut attempts = 0;
    loop {
        attempts += 1;
        let dir = match secure_dir(parent, path, uid) {
            Ok(fd) => File::from(fd),
            // Removed between our mkdir and our open.
            Err(LocalError::StateDir { source, .. })
                if source.kind() == io::ErrorKind::NotFound && attempts < 8 =>
            {
                continue;
            }
            Err(other) => return Err(other),
        };
        dir.lock_shared().map_err(|source| LocalError::StateDir {
            op: "lock",
            path: path.to_path_buf(),
            source,
        })?;
        let held = fstat(&dir).map_err(|e| LocalError::StateDir {
            op: "inspect",
            path: path.to_path_buf(),
            source: io::Error::from(e),
        })?;
        match fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(now) if now.st_dev == held.st_dev && now.st_ino == held.st_ino => {
                return Ok(OwnedFd::from(dir));
            }
            Ok(_) | Err(Errno::ENOENT) if attempts < 8 => continue,
            Ok(_) | Err(Errno::ENOENT) => {
                return Err(LocalError::StateDir {
                    op: "keep",
                    path: path.to_path_buf(),
                    source: io::Error::other("another process keeps removing it"),
                });
            }
            Err(e) => {
                return Err(LocalError::StateDir {
                    op: "inspect",
                    path: path.to_path_buf(),
                    source: io::Error::from(e),
                });
            }
        }
    }
}

/// Whether no backend swept the spill directories within [`leftovers::SPILL_SWEEP_INTERVAL`];
/// if so, the stamp file is touched (this backend sweeps now). Any doubt means a sweep.
fn spill_sweep_due(parent: BorrowedFd<'_>, now: SystemTime) -> bool {
    let name = OsStr::new(leftovers::SPILL_SWEEP_STAMP);
    if let Ok(stat) = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        && file_type(&stat) == nix::sys::stat::SFlag::S_IFREG
        && leftovers::age(now, modified(&stat)) < leftovers::SPILL_SWEEP_INTERVAL
        && modified(&stat) <= now
    {
        return false;
    }
    if let Ok(fd) = nix::fcntl::openat(
        parent,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    ) {
        // A missed touch only makes the file look older to the next sweep.
        let _ = File::from(fd).set_modified(now);
    }
    true
}

fn modified(stat: &nix::sys::stat::FileStat) -> SystemTime {
    let secs = Duration::from_secs(u64::try_from(stat.st_mtime).unwrap_or(0));
    let nanos = Duration::from_nanos(u64::try_from(stat.st_mtime_nsec).unwrap_or(0));
    SystemTime::UNIX_EPOCH + secs + nanos
}

/// A spill file found by the sweep: where it is and which inode it was.
struct Found {
    dir: usize,
    name: Vec<u8>,
    ino: u64,
    file: SpillFile,
}

/// One per-root spill directory seen by the sweep.
struct RootDir {
    name: Vec<u8>,
    fd: OwnedFd,
    entries: usize,
    removed: usize,
}

/// Sweep the spill files of every root under `spill/` (`parent`) by `bounds`, then remove the
/// root directories left empty. Best effort and concurrent-safe: a file whose writer still
/// holds its lock, and a directory a live backend holds locked, stay; only names of Cordon's
/// exact spill naming that are regular files (directories for roots) are touched, no symlink is
/// followed, nothing is opened that could block. Returns (files removed, bytes removed, root
/// directories removed).
fn sweep_spill(
    parent: BorrowedFd<'_>,
    now: SystemTime,
    bounds: SpillBounds,
) -> (usize, u64, usize) {
    let mut dirs: Vec<RootDir> = Vec::new();
    let mut found: Vec<Found> = Vec::new();
    for name in entry_names(parent) {
        if !leftovers::is_spill_root_dir_name(&name) {
            continue;
        }
        let Ok(fd) = nix::fcntl::openat(
            parent,
            OsStr::from_bytes(&name),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let entries = entry_names(fd.as_fd());
        let dir = dirs.len();
        for file_name in &entries {
            if !leftovers::is_spill_file_name(file_name) {
                continue;
            }
            let Ok(stat) = fstatat(
                fd.as_fd(),
                OsStr::from_bytes(file_name),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) else {
                continue;
            };
            if file_type(&stat) != nix::sys::stat::SFlag::S_IFREG {
                continue;
            }
            found.push(Found {
                dir,
                name: file_name.clone(),
                ino: stat.st_ino,
                file: SpillFile {
                    size: u64::try_from(stat.st_size).unwrap_or(0),
                    modified: modified(&stat),
                },
            });
        }
        dirs.push(RootDir {
            name,
            fd,
            entries: entries.len(),
            removed: 0,
        });
    }
    let files: Vec<SpillFile> = found.iter().map(|f| f.file).collect();
    let mut removed_files = 0;
    let mut removed_bytes = 0;
    leftovers::sweep_spill_files(&files, now, bounds, |i| {
        let Found {
            dir,
            name,
            ino,
            file,
        } = &found[i];
        let root = &mut dirs[*dir];
        if remove_unlocked_file(root.fd.as_fd(), OsStr::from_bytes(name), *ino) {
            root.removed += 1;
            removed_files += 1;
            removed_bytes += file.size;
            true
        } else {
            false
        }
    });
    let mut removed_dirs = 0;
    for root in &dirs {
        if root.removed == root.entries && remove_unlocked_dir(parent, root, now, bounds) {
            removed_dirs += 1;
        }
    }
    if removed_files > 0 || removed_dirs > 0 {
        tracing::info!(
            files = removed_files,
            bytes = removed_bytes,
            root_dirs = removed_dirs,
            "removed spill files past their lifetime"
        );
    }
    (removed_files, removed_bytes, removed_dirs)
}

/// Unlink `name` in `dir` if it is still the regular file `ino` and nobody holds its lock (a
/// spill writer holds one until the command ends).
fn remove_unlocked_file(dir: BorrowedFd<'_>, name: &OsStr, ino: u64) -> bool {
    let Ok(fd) = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC
            | OFlag::O_NOCTTY,
        Mode::empty(),
    ) else {
        return false;
    };
    let file = File::from(fd);
    let same = fstat(&file)
        .is_ok_and(|st| st.st_ino == ino && file_type(&st) == nix::sys::stat::SFlag::S_IFREG);
    if !same || file.try_lock().is_err() {
        return false;
    }
    unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).is_ok()
}

/// Remove an emptied root directory unless a live backend holds it (shared lock) or it
/// changed within `bounds.min_age`. `rmdir` itself refuses a directory that is not empty.
fn remove_unlocked_dir(
    parent: BorrowedFd<'_>,
    root: &RootDir,
    now: SystemTime,
    bounds: SpillBounds,
) -> bool {
    let Ok(fd) = root.fd.try_clone() else {
        return false;
    };
    let dir = File::from(fd);
    // A directory created a moment ago may be about to be locked by its backend.
    let settled = root.removed > 0
        || fstat(&dir).is_ok_and(|st| leftovers::age(now, modified(&st)) >= bounds.min_age);
    if !settled || dir.try_lock().is_err() {
        return false;
    }
    unlinkat(
        parent,
        OsStr::from_bytes(&root.name),
        UnlinkatFlags::RemoveDir,
    )
    .is_ok()
}

/// Remove the per-root directories under `git/` (16 hex digits) that are empty and were
/// last changed more than [`leftovers::SPILL_MAX_AGE`] ago: one is made for every workspace
/// root ever used, and a runner working in fresh directories would otherwise collect them
/// forever. A directory holding a baseline file (a running session's, or a killed one's that
/// the next session on that root must still honour) is not empty and stays; a session starting
/// on a root whose directory was just removed makes it again ([`crate::git_guard`]).
fn remove_idle_git_dirs(git: BorrowedFd<'_>, now: SystemTime) {
    for name in entry_names(git) {
        if !leftovers::is_spill_root_dir_name(&name) {
            continue;
        }
        let name = OsStr::from_bytes(&name);
        let Ok(stat) = fstatat(git, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        if file_type(&stat) != nix::sys::stat::SFlag::S_IFDIR
            || leftovers::age(now, modified(&stat)) <= leftovers::SPILL_MAX_AGE
        {
            continue;
        }
        match unlinkat(git, name, UnlinkatFlags::RemoveDir) {
            Ok(()) => tracing::debug!(dir = ?name, "removed an idle git baseline directory"),
            Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOENT) => {}
            Err(error) => {
                tracing::warn!(dir = ?name, %error, "failed to remove an idle git baseline directory");
            }
        }
    }
}

/// Remove `tmp-<pid>-*` directories whose process is gone (a crashed or killed Cordon).
fn remove_orphaned_tmp_dirs(user: BorrowedFd<'_>, user_path: &Path) {
    for name in entry_names(user) {
        let Some(pid) = std::str::from_utf8(&name)
            .ok()
            .and_then(|n| n.strip_prefix("tmp-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if nix::sys::signal::kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH) {
            let dir = user_path.join(OsStr::from_bytes(&name));
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::debug!(dir = %dir.display(), "reaped the state of a dead runtime")
                }
                // Retried by the next session's start.
                Err(error) => tracing::debug!(
                    dir = %dir.display(),
                    %error,
                    "failed to reap the state of a dead runtime"
                ),
            }
        }
    }
}

fn create_private_tmp(
    user: BorrowedFd<'_>,
    user_path: &Path,
    uid: Uid,
) -> Result<PrivateTmp, LocalError> {
    loop {
        let name = format!("tmp-{}-{:016x}", std::process::id(), fastrand::u64(..));
        let path = user_path.join(&name);
        match mkdirat(user, name.as_str(), Mode::S_IRWXU) {
            Ok(()) => {
                let tmp = PrivateTmp { path };
                secure_dir(user, &tmp.path, uid)?;
                return Ok(tmp);
            }
            Err(Errno::EEXIST) => continue,
            Err(e) => {
                return Err(LocalError::StateDir {
                    op: "create",
                    path,
                    source: io::Error::from(e),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_hash_is_sixteen_hex_digits_and_stable() {
        let hash = root_hash(Path::new("/home/me/project"));
        assert_eq!(hash.len(), 16);
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(hash, root_hash(Path::new("/home/me/project")));
        assert_ne!(hash, root_hash(Path::new("/home/me/project2")));
    }

    const DAY: Duration = Duration::from_secs(24 * 60 * 60);

    fn bounds(max_total: u64) -> SpillBounds {
        SpillBounds {
            max_age: DAY,
            max_total,
            min_age: Duration::from_secs(600),
        }
    }

    fn aged(path: &Path, age: Duration) {
        let file = File::open(path).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
    }

    fn spill(dir: &Path, n: u64, size: usize, age: Duration) -> PathBuf {
        let path = dir.join(format!("cordon-bash-{n:016x}.log"));
        std::fs::write(&path, vec![b'x'; size]).unwrap();
        aged(&path, age);
        path
    }

    fn sweep(parent: &Path, max_total: u64) -> (usize, u64, usize) {
        let fd = File::open(parent).unwrap();
        sweep_spill(fd.as_fd(), SystemTime::now(), bounds(max_total))
    }

    #[test]
    fn the_sweep_removes_expired_files_of_every_root_and_emptied_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (
            tmp.path().join("00000000000000aa"),
            tmp.path().join("00000000000000bb"),
        );
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let a_old = spill(&a, 1, 10, DAY * 2);
        let a_young = spill(&a, 2, 10, Duration::from_secs(60));
        let b_old = spill(&b, 3, 10, DAY * 3);
        assert_eq!(sweep(tmp.path(), 1 << 30), (2, 20, 1));
        assert!(!a_old.exists() && !b_old.exists());
        assert!(a_young.exists());
        assert!(!b.exists(), "the emptied root directory goes");
        assert!(a.exists());
    }

    #[test]
    fn the_size_bound_removes_the_oldest_files_first_but_never_young_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (
            tmp.path().join("00000000000000aa"),
            tmp.path().join("00000000000000bb"),
        );
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let oldest = spill(&a, 1, 100, Duration::from_secs(5000));
        let older = spill(&b, 2, 100, Duration::from_secs(4000));
        let old = spill(&a, 3, 100, Duration::from_secs(3000));
        let young = spill(&b, 4, 500, Duration::from_secs(10));
        // 800 bytes over a 250-byte bound: the three old files go, the young one stays; the
        // emptied root directory goes too.
        assert_eq!(sweep(tmp.path(), 250), (3, 300, 1));
        assert!(!oldest.exists() && !older.exists() && !old.exists() && !a.exists());
        assert!(young.exists());
        // Under the bound nothing more goes.
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("00000000000000aa");
        std::fs::create_dir(&a).unwrap();
        let first = spill(&a, 1, 100, Duration::from_secs(5000));
        let second = spill(&a, 2, 100, Duration::from_secs(4000));
        assert_eq!(sweep(tmp.path(), 150), (1, 100, 0));
        assert!(!first.exists() && second.exists());
    }

    #[test]
    fn the_sweep_touches_only_cordon_names_and_follows_no_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let a = tmp.path().join("00000000000000aa");
        std::fs::create_dir(&a).unwrap();
        let foreign = a.join("notes.log");
        std::fs::write(&foreign, b"x").unwrap();
        aged(&foreign, DAY * 2);
        let target = spill(outside.path(), 7, 10, DAY * 2);
        let link = a.join("cordon-bash-0000000000000009.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let fifo = a.join("cordon-bash-000000000000000a.log");
        nix::unistd::mkfifo(&fifo, Mode::S_IRWXU).unwrap();
        // A directory with the root naming elsewhere: a symlink to a directory of spill files.
        let linked_root = tmp.path().join("00000000000000cc");
        std::os::unix::fs::symlink(outside.path(), &linked_root).unwrap();
        // A directory without the root naming.
        let other = tmp.path().join("not-a-root");
        std::fs::create_dir(&other).unwrap();
        let other_file = spill(&other, 8, 10, DAY * 2);
        let removed = sweep(tmp.path(), 0);
        assert_eq!(removed, (0, 0, 0));
        assert!(foreign.exists() && target.exists() && other_file.exists());
        assert!(std::fs::symlink_metadata(&link).is_ok());
        assert!(std::fs::symlink_metadata(&fifo).is_ok());
        assert!(std::fs::symlink_metadata(&linked_root).is_ok());
        assert!(a.exists(), "a directory holding foreign files stays");
    }

    #[test]
    fn a_locked_spill_file_and_a_locked_root_dir_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (
            tmp.path().join("00000000000000aa"),
            tmp.path().join("00000000000000bb"),
        );
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let written = spill(&a, 1, 10, DAY * 2);
        let writer = File::options().append(true).open(&written).unwrap();
        writer.try_lock().unwrap();
        aged(&b, DAY);
        let holder = File::open(&b).unwrap();
        holder.lock_shared().unwrap();
        assert_eq!(sweep(tmp.path(), 0), (0, 0, 0));
        assert!(written.exists() && b.exists());
        drop(writer);
        drop(holder);
        assert_eq!(sweep(tmp.path(), 1 << 30), (1, 10, 2));
        assert!(!a.exists() && !b.exists());
    }

    #[test]
    fn an_empty_root_dir_changed_a_moment_ago_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (
            tmp.path().join("00000000000000aa"),
            tmp.path().join("00000000000000bb"),
        );
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        aged(&b, Duration::from_secs(601));
        assert_eq!(sweep(tmp.path(), 1 << 30), (0, 0, 1));
        assert!(a.exists() && !b.exists());
    }

    #[test]
    fn prepare_sweeps_other_roots_and_keeps_its_own_dir_locked() {
        let base = tempfile::tempdir().unwrap();
        let uid = nix::unistd::getuid();
        let first = prepare(base.path(), Path::new("/work/one"), uid).unwrap();
        let spill_parent = first.spill_path.parent().unwrap().to_path_buf();
        let stale_root = spill_parent.join("00000000000000aa");
        std::fs::create_dir(&stale_root).unwrap();
        let stale = spill(&stale_root, 1, 10, DAY * 2);
        aged(&first.spill_path, DAY * 2);
        // Within the sweep interval of the first backend's sweep, the second does not sweep.
        drop(prepare(base.path(), Path::new("/work/two"), uid).unwrap());
        assert!(stale.exists());
        let stamp = spill_parent.join(leftovers::SPILL_SWEEP_STAMP);
        aged(
            &stamp,
            leftovers::SPILL_SWEEP_INTERVAL + Duration::from_secs(1),
        );
        let second = prepare(base.path(), Path::new("/work/two"), uid).unwrap();
        assert!(!stale.exists() && !stale_root.exists());
        assert!(
            first.spill_path.exists(),
            "a live backend's empty spill dir stays"
        );
        assert!(second.spill_path.exists());
        // A backend's own spill files are locked while written.
        let held = spill(&first.spill_path, 2, 10, DAY * 2);
        let writer = File::options().append(true).open(&held).unwrap();
        writer.try_lock().unwrap();
        aged(
            &stamp,
            leftovers::SPILL_SWEEP_INTERVAL + Duration::from_secs(1),
        );
        drop(prepare(base.path(), Path::new("/work/three"), uid).unwrap());
        assert!(held.exists());
        drop(writer);
        aged(
            &stamp,
            leftovers::SPILL_SWEEP_INTERVAL + Duration::from_secs(1),
        );
        drop(prepare(base.path(), Path::new("/work/three"), uid).unwrap());
        assert!(!held.exists());
    }

    #[test]
    fn idle_empty_git_baseline_dirs_are_removed_and_others_kept() {
        let base = tempfile::tempdir().unwrap();
        let uid = nix::unistd::getuid();
        let first = prepare(base.path(), Path::new("/work/one"), uid).unwrap();
        let git = first.git_path.parent().unwrap().to_path_buf();
        let dir = |name: &str, age: Duration, baseline: bool| {
            let path = git.join(name);
            std::fs::create_dir(&path).unwrap();
            if baseline {
                std::fs::write(path.join("1-00000000000000aa.baseline"), "1 2 3\n").unwrap();
            }
            aged(&path, age);
            path
        };
        let idle = dir("00000000000000a1", DAY * 2, false);
        let dead_session = dir("00000000000000a2", DAY * 2, true);
        let young = dir("00000000000000a3", DAY / 2, false);
        let foreign = dir("not-a-root-hash", DAY * 2, false);
        let outside = base.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        aged(&outside, DAY * 2);
        std::os::unix::fs::symlink(&outside, git.join("00000000000000a4")).unwrap();
        aged(
            &first
                .spill_path
                .parent()
                .unwrap()
                .join(leftovers::SPILL_SWEEP_STAMP),
            leftovers::SPILL_SWEEP_INTERVAL + Duration::from_secs(1),
        );
        aged(&first.git_path, DAY * 2);
        let second = prepare(base.path(), Path::new("/work/two"), uid).unwrap();
        assert!(!idle.exists(), "an empty directory idle for two days goes");
        assert!(
            dead_session.exists(),
            "a killed session's baseline is kept for the next session"
        );
        assert!(young.exists() && foreign.exists() && outside.exists());
        assert!(
            git.join("00000000000000a4")
                .symlink_metadata()
                .unwrap()
                .is_symlink()
        );
        assert!(second.git_path.exists());
        // The first backend's own directory was idle and empty: removed, and made again when a
        // guard on that root writes its baseline.
        assert!(!first.git_path.exists());
        let (guard, _) = crate::git_guard::GitGuard::start(
            &[base.path().to_path_buf()],
            &[],
            Some(&first.git_path),
        )
        .unwrap();
        assert!(first.git_path.is_dir());
        drop(guard);
    }
}
