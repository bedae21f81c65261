//! Cordon's per-user state on this host: `<base>/cordon-<uid>/` (0700) holding
//!
//! - `spill/<16-hex hash of the canonical workspace root>/cordon-bash-<16 hex>.log`: full
//!   command output, kept across sessions with the same root so a later `read` can open it,
//!   deleted at backend start once older than [`SPILL_MAX_AGE`];
//! - `tmp-<pid>-<16 hex>/`: the private `TMPDIR` of one backend's commands, removed when the
//!   backend is shut down or dropped, or by a later backend once `<pid>` no longer exists;
//! - `git/<16-hex hash of the root>/`: the git metadata baselines of running sessions on that
//!   root ([`crate::git_guard`]).
//!
//! Every directory level is created 0700 with `mkdirat`, reopened with `O_NOFOLLOW` and
//! checked to be owned by us: a symlink or a directory owned by someone else (another user
//! pre-creating it in a shared `/tmp`) is refused rather than used.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Pid, Uid, UnlinkatFlags, unlinkat};
use sha2::{Digest, Sha256};

use crate::LocalError;
use crate::roots::{fd_path, file_type};

/// Spill files older than this are deleted when a backend starts.
pub(crate) const SPILL_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// The directories one backend uses.
#[derive(Debug)]
pub(crate) struct StateDirs {
    /// The spill directory (canonical).
    pub spill_path: PathBuf,
    /// An open fd of the spill directory (files are created relative to it).
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
    let spill_fd = secure_dir(spill_parent_fd.as_fd(), &spill_path, uid)?;
    remove_old_spill_files(spill_fd.as_fd(), SystemTime::now());
    remove_orphaned_tmp_dirs(user_fd.as_fd(), &user_path);
    let tmp = create_private_tmp(user_fd.as_fd(), &user_path, uid)?;
    let git_parent_path = user_path.join("git");
    let git_parent_fd = secure_dir(user_fd.as_fd(), &git_parent_path, uid)?;
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

/// Best effort: another backend may be cleaning the same directory concurrently.
fn remove_old_spill_files(spill: BorrowedFd<'_>, now: SystemTime) {
    for name in entry_names(spill) {
        if !(name.starts_with(b"cordon-bash-") && name.ends_with(b".log")) {
            continue;
        }
        let name = OsStr::from_bytes(&name);
        let Ok(stat) = fstatat(spill, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        let modified =
            SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(stat.st_mtime).unwrap_or(0));
        let old = now
            .duration_since(modified)
            .is_ok_and(|age| age > SPILL_MAX_AGE);
        if old {
            let _ = unlinkat(spill, name, UnlinkatFlags::NoRemoveDir);
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
            let _ = std::fs::remove_dir_all(user_path.join(OsStr::from_bytes(&name)));
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
}
