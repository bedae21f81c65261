//! Start-time removal of the temp files of atomic writes (`.NAME.cordon-<16 hex>.tmp`) that a
//! killed Cordon left in the writable roots.
//!
//! A writer holds an exclusive `flock` on its temp file until the rename, so a file whose lock
//! can be taken and that was not modified for [`WRITE_TEMP_MIN_AGE`] (a writer may be between
//! creating and locking it) is nobody's write in flight; a file of another naming is never
//! touched. The
//! walk opens every directory beneath the root with `O_NOFOLLOW` and works relative to its fd
//! (`fstatat`, `openat`, `unlinkat`), so a symlink swapped in mid-walk leads nowhere; it does not
//! enter `.git` (file tools never write there), reads directory entries' types from
//! `getdents` (one `fstatat` only for a candidate name or an unknown type), opens a candidate
//! with `O_NONBLOCK` after checking it is a regular file (never blocking on a FIFO), and is
//! bounded by [`MAX_DEPTH`] and [`MAX_ENTRIES`]: past them the rest of the tree is left for a
//! later session.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use std::time::{Duration, SystemTime};

use cordon_ops::leftovers::{WRITE_TEMP_MIN_AGE, age, is_write_temp_name};
use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag, fstat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::roots::file_type;

/// Directory levels below a root the walk enters.
pub(crate) const MAX_DEPTH: usize = 64;

/// Directory entries the walk looks at over all roots.
pub(crate) const MAX_ENTRIES: usize = 1_000_000;

/// Removed paths kept for the report: the files themselves are up to [`MAX_ENTRIES`], their
/// paths as deep as the tree (not bounded by `PATH_MAX`, they are reached through fds).
pub(crate) const MAX_REPORTED: usize = 16;

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TempSweep {
    /// Temp files removed (the first [`MAX_REPORTED`]; see `removed_total`).
    pub removed: Vec<PathBuf>,
    /// Temp files removed, all of them.
    pub removed_total: usize,
    /// Temp files left because their writer may still hold them (locked, or modified a
    /// moment ago).
    pub in_use: usize,
    /// Entries looked at.
    pub entries: usize,
    /// Whether a bound stopped the walk early.
    pub cut: bool,
}

/// Remove the unlocked write temp files under each of `roots` (canonical writable roots).
pub(crate) fn remove_write_temps(roots: &[PathBuf]) -> TempSweep {
    let mut sweep = TempSweep::default();
    for root in roots {
        let Ok(fd) = nix::fcntl::open(
            root.as_path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        walk(fd, root, 0, &mut sweep);
    }
    if sweep.cut {
        tracing::warn!(
            entries = sweep.entries,
            max_entries = MAX_ENTRIES,
            max_depth = MAX_DEPTH,
            "temp file cleanup stopped at its bound; the rest is left for a later session"
        );
    }
    if !sweep.removed.is_empty() {
        tracing::info!(
            files = sweep.removed_total,
            first = %sweep.removed[0].display(),
            "removed temp files of writes a killed session left"
        );
    }
    sweep
}

fn walk(dir: OwnedFd, path: &Path, depth: usize, sweep: &mut TempSweep) {
    let Ok(mut listing) = Dir::from_fd(dir) else {
        return;
    };
    let mut subdirs = Vec::new();
    let mut candidates = Vec::new();
    let mut untyped = Vec::new();
    for entry in listing.iter() {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        sweep.entries += 1;
        if sweep.entries > MAX_ENTRIES {
            sweep.cut = true;
            break;
        }
        let temp = is_write_temp_name(name);
        match entry.file_type() {
            Some(Type::Directory) if name != b".git" => subdirs.push(name.to_vec()),
            Some(Type::File) if temp => candidates.push(name.to_vec()),
            None if name != b".git" => untyped.push(name.to_vec()),
            _ => {}
        }
    }
    // No type from getdents (some filesystems): ask, without following.
    for name in untyped {
        let Ok(stat) = fstatat(
            listing.as_fd(),
            OsStr::from_bytes(&name),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) else {
            continue;
        };
        match file_type(&stat) {
            SFlag::S_IFDIR => subdirs.push(name),
            SFlag::S_IFREG if is_write_temp_name(&name) => candidates.push(name),
            _ => {}
        }
    }
    for name in candidates {
        let name = OsStr::from_bytes(&name);
        match remove_unlocked(listing.as_fd(), name) {
            Removal::Removed => {
                sweep.removed_total += 1;
                if sweep.removed.len() < MAX_REPORTED {
                    sweep.removed.push(path.join(name));
                }
            }
            Removal::InUse => sweep.in_use += 1,
            Removal::Skipped => {}
        }
    }
    if sweep.cut {
        return;
    }
    if depth >= MAX_DEPTH {
        if !subdirs.is_empty() {
            sweep.cut = true;
        }
        return;
    }
    for name in subdirs {
        let name = OsStr::from_bytes(&name);
        let Ok(fd) = nix::fcntl::openat(
            listing.as_fd(),
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        walk(fd, &path.join(name), depth + 1, sweep);
        if sweep.cut {
            return;
        }
    }
}

enum Removal {
    Removed,
    InUse,
    Skipped,
}

/// Unlink `name` in `dir` if it is a regular file nobody holds the lock of.
fn remove_unlocked(dir: BorrowedFd<'_>, name: &OsStr) -> Removal {
    let Ok(before) = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
        return Removal::Skipped;
    };
    if file_type(&before) != SFlag::S_IFREG {
        return Removal::Skipped;
    }
    let modified =
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(before.st_mtime).unwrap_or(0));
    if age(SystemTime::now(), modified) < WRITE_TEMP_MIN_AGE {
        return Removal::InUse;
    }
    let Ok(fd) = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return Removal::Skipped;
    };
    let file = File::from(fd);
    let same = fstat(&file).is_ok_and(|st| {
        st.st_dev == before.st_dev && st.st_ino == before.st_ino && file_type(&st) == SFlag::S_IFREG
    });
    if !same {
        return Removal::Skipped;
    }
    if file.try_lock().is_err() {
        return Removal::InUse;
    }
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Removal::Removed,
        Err(_) => Removal::Skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMP: &str = ".a.txt.cordon-0123456789abcdef.tmp";

    fn aged(path: &Path) {
        let file = File::open(path).unwrap();
        file.set_modified(SystemTime::now() - WRITE_TEMP_MIN_AGE - Duration::from_secs(5))
            .unwrap();
    }

    #[test]
    fn unlocked_temp_files_go_and_everything_else_stays() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("deep/er")).unwrap();
        std::fs::create_dir_all(r.join(".git")).unwrap();
        for path in [
            r.join(TEMP),
            r.join("deep/er").join(TEMP),
            r.join(".git").join(TEMP),
            r.join("a.txt"),
            r.join(".a.txt.cordon-draft.tmp"),
            outside.path().join(TEMP),
        ] {
            std::fs::write(&path, b"x").unwrap();
            aged(&path);
        }
        // A symlink with the naming and a link to a directory holding one: neither followed.
        std::os::unix::fs::symlink(
            outside.path().join(TEMP),
            r.join(".b.cordon-0000000000000000.tmp"),
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("linked")).unwrap();
        // A FIFO with the naming: not opened (the walk would block), not removed.
        let fifo = r.join(".c.cordon-0000000000000001.tmp");
        nix::unistd::mkfifo(&fifo, Mode::S_IRWXU).unwrap();
        // A writer in flight holds its lock.
        let busy = r.join(".d.cordon-0000000000000002.tmp");
        let writer = File::create(&busy).unwrap();
        writer.try_lock().unwrap();
        aged(&busy);
        // A temp file created a moment ago: its writer may not hold the lock yet.
        let young = r.join(".e.cordon-0000000000000003.tmp");
        std::fs::write(&young, b"x").unwrap();

        let canonical = r.canonicalize().unwrap();
        let sweep = remove_write_temps(std::slice::from_ref(&canonical));
        let mut removed = sweep.removed.clone();
        removed.sort();
        assert_eq!(
            removed,
            vec![canonical.join(TEMP), canonical.join("deep/er").join(TEMP)]
        );
        assert_eq!(sweep.in_use, 2);
        assert_eq!(sweep.removed_total, 2);
        assert!(!sweep.cut);
        for kept in [
            r.join(".git").join(TEMP),
            r.join("a.txt"),
            r.join(".a.txt.cordon-draft.tmp"),
            outside.path().join(TEMP),
            busy.clone(),
            young,
        ] {
            assert!(kept.exists(), "{} removed", kept.display());
        }
        for kept in [r.join(".b.cordon-0000000000000000.tmp"), fifo] {
            assert!(
                std::fs::symlink_metadata(&kept).is_ok(),
                "{} removed",
                kept.display()
            );
        }
        drop(writer);
        let again = remove_write_temps(std::slice::from_ref(&canonical));
        assert_eq!(
            again.removed,
            vec![canonical.join(".d.cordon-0000000000000002.tmp")]
        );
    }

    #[test]
    fn the_depth_bound_stops_the_walk() {
        let root = tempfile::tempdir().unwrap();
        let mut deep = root.path().to_path_buf();
        for _ in 0..=MAX_DEPTH + 1 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join(TEMP), b"x").unwrap();
        aged(&deep.join(TEMP));
        let sweep = remove_write_temps(&[root.path().to_path_buf()]);
        assert!(sweep.cut);
        assert!(sweep.removed.is_empty());
        assert!(deep.join(TEMP).exists());
    }

    #[test]
    fn removals_are_counted_but_only_a_few_paths_kept() {
        let root = tempfile::tempdir().unwrap();
        for n in 0..MAX_REPORTED + 10 {
            let file = root.path().join(format!(".f.cordon-{n:016x}.tmp"));
            std::fs::write(&file, b"x").unwrap();
            aged(&file);
        }
        let sweep = remove_write_temps(&[root.path().to_path_buf()]);
        assert_eq!(sweep.removed_total, MAX_REPORTED + 10);
        assert_eq!(sweep.removed.len(), MAX_REPORTED);
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    }
}
