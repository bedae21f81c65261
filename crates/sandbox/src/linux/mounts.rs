//! The mount namespace plan of one spawn: which directories to pin, which protected paths
//! to bind read-only, which denied paths to mask, and the placeholders that stop a missing
//! protected path from being created. Planned in the parent (it allocates and looks at the
//! filesystem); executed by the child's init with fd-based mount calls that never follow a
//! symlink.
//!
//! Why each piece exists:
//! - A read-only bind of `.git` makes everything inside it `EROFS` and the directory itself a
//!   mount point, which cannot be renamed over, renamed away or removed (`EBUSY`); hard links
//!   out of it fail with `EXDEV`.
//! - Renaming a *parent* of `.git` would move the protected mount away and let the command
//!   create a fresh `.git` where the host's git will look. Every directory from the outermost
//!   writable root down to the protected path is therefore bind-mounted onto itself
//!   ("pinned"), which makes those renames fail with `EBUSY` too. Denied paths inside writable
//!   roots are pinned the same way, so they cannot be moved out from under their mask.
//! - A protected path that does not exist gets an empty placeholder directory at its first
//!   missing component, bound read-only: creating it fails with `EEXIST`/`EROFS`. Git skips
//!   an empty `.git` directory during discovery, so host git keeps working. Placeholders carry
//!   a marker mode ([`PLACEHOLDER_MODE`]) so a later or concurrent spawn recognises them, are
//!   shared between concurrent sandboxes through `flock` (shared while a command runs) and are
//!   removed by the last user (exclusive, non-blocking) once the init holding it is retired
//!   (an idle init keeps its placeholders for the next command, for a short while).
//! - A protected or denied path that is a symlink is refused (protected) or skipped (denied:
//!   the secret no longer lives there), never followed.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::SandboxError;
use crate::linux::sys;

/// Mode of a placeholder directory: sticky and owner read/search only, a combination no tool
/// creates by accident, so only placeholders are ever treated (and removed) as such.
pub(crate) const PLACEHOLDER_MODE: u32 = 0o1500;

/// Held while a placeholder is made (`mkdir`, then `fchmod` to [`PLACEHOLDER_MODE`]) or an
/// existing one is recognised and locked, and while one is released: concurrent spawns of
/// this process would otherwise see another spawn's placeholder between those steps (with its
/// first mode, taken for a real directory that appeared meanwhile; or removed under them).
static PLACEHOLDER_CREATION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether `path` is a placeholder a sandbox put at a missing protected path: an empty
/// directory with the marker mode. It stands for "does not exist": directory listings of
/// the file tools leave it out.
pub fn is_placeholder_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| is_placeholder(&meta))
        && std::fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_none())
}

fn is_placeholder(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.is_dir() && is_placeholder_mode(meta.permissions().mode())
}

/// Whether a directory with this `st_mode` carries the placeholder's marker mode (callers
/// that already hold the directory open check its emptiness on that descriptor).
pub fn is_placeholder_mode(mode: u32) -> bool {
    mode & 0o7777 == PLACEHOLDER_MODE
}

/// What one mount step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MountKind {
    /// Bind a writable root onto itself, writable (everything else is read-only).
    Writable,
    /// Bind a directory onto itself, writable (pinning it against rename and removal).
    Pin,
    /// Bind a path onto itself read-only; `expect` is the inode a placeholder must still be.
    Protect {
        /// `(st_dev, st_ino)` the opened path must have, for placeholders.
        expect: Option<(u64, u64)>,
    },
    /// Mount the empty, unreadable mask directory over a denied directory.
    MaskDir,
    /// Mount the empty, unreadable mask file over a denied non-directory.
    MaskFile,
    /// Mount the session's private shm directory over `/dev/shm`.
    Shm,
}

/// One step, with its target path prebuilt for the child.
#[derive(Debug)]
pub(crate) struct MountStep {
    /// The step.
    pub kind: MountKind,
    /// Target path.
    pub path: PathBuf,
    /// Target path as a C string (for the child).
    pub c_path: CString,
}

/// A placeholder directory for a missing protected path, locked shared while in use.
#[derive(Debug)]
pub(crate) struct Placeholder {
    /// Path of the placeholder.
    pub path: PathBuf,
    /// Its parent directory (opened without following symlinks).
    parent: OwnedFd,
    /// Its name in the parent.
    name: CString,
    /// The placeholder opened and locked with `LOCK_SH`; inherited by the init.
    pub lock: OwnedFd,
    /// `(st_dev, st_ino)` of the placeholder.
    pub id: (u64, u64),
}

impl Placeholder {
    /// Remove the placeholder if no other sandbox uses it (exclusive lock available) and it
    /// is still the same, empty directory. Errors are ignored: a left-over empty directory is
    /// harmless and reused by the next spawn.
    pub(crate) fn release(self) {
        let _creating = PLACEHOLDER_CREATION
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sys::flock(&self.lock, libc::LOCK_EX | libc::LOCK_NB).is_err() {
            return;
        }
        let still_placeholder =
            std::fs::symlink_metadata(&self.path).is_ok_and(|meta| is_placeholder(&meta));
        if still_placeholder && sys::fstatat_id(&self.parent, &self.name).ok() == Some(self.id) {
            // Only a still-empty placeholder goes; a failure leaves an empty directory, which git ignores.
            let _ = sys::rmdirat(&self.parent, &self.name);
        }
    }
}

/// The static inputs of planning: canonical paths from the configuration.
#[derive(Clone, Debug, Default)]
pub(crate) struct MountConfig {
    /// Writable roots (workspace and session directories).
    pub write: Vec<PathBuf>,
    /// Every root the sandbox may read (read_exec, read, write).
    pub readable: Vec<PathBuf>,
    /// Protected paths.
    pub protected: Vec<PathBuf>,
    /// Denied paths.
    pub denied: Vec<PathBuf>,
    /// Whether to mount a private `/dev/shm`.
    pub private_shm: bool,
}

/// The plan of one spawn.
#[derive(Debug, Default)]
pub(crate) struct MountPlan {
    /// Steps in execution order.
    pub steps: Vec<MountStep>,
    /// Placeholders created or reused for this spawn.
    pub placeholders: Vec<Placeholder>,
    /// The identity of every existing path bound read-only or masked, as planned: an init
    /// may serve later commands only while these are unchanged.
    pub identities: Vec<(PathBuf, Identity)>,
}

/// What tells one inode at a path from the next: device, inode number and birth time (or,
/// where the filesystem records none, change time). The number alone is not enough: a
/// replaced directory often gets the freed number back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
    born: (i64, u32),
}

impl Identity {
    /// The identity of what `meta` (from `symlink_metadata`) describes.
    pub(crate) fn of(meta: &std::fs::Metadata) -> Identity {
        let born = match meta.created() {
            Ok(time) => match time.duration_since(std::time::UNIX_EPOCH) {
                Ok(since) => (since.as_secs() as i64, since.subsec_nanos()),
                Err(_) => (meta.ctime(), meta.ctime_nsec() as u32),
            },
            Err(_) => (meta.ctime(), meta.ctime_nsec() as u32),
        };
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            born,
        }
    }

    /// The identity of the file `fd` is open on.
    pub(crate) fn of_fd(fd: &OwnedFd) -> io::Result<Identity> {
        Ok(Identity::of(
            &std::fs::File::from(fd.try_clone()?).metadata()?,
        ))
    }

    /// The identity of the path now (`None` when it is gone).
    pub(crate) fn now(path: &Path) -> Option<Identity> {
        std::fs::symlink_metadata(path)
            .ok()
            .map(|meta| Identity::of(&meta))
    }
}

impl MountPlan {
    /// Lock fds the init must keep open.
    pub(crate) fn lock_fds(&self) -> Vec<RawFd> {
        self.placeholders
            .iter()
            .map(|placeholder| placeholder.lock.as_raw_fd())
            .collect()
    }
}

fn c_path(path: &Path) -> Result<CString, SandboxError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| SandboxError::NulByte {
        what: "sandbox path",
    })
}

/// The outermost root in `roots` that contains `path` (or is it).
fn outermost_root<'a>(roots: &'a [PathBuf], path: &Path) -> Option<&'a PathBuf> {
    roots
        .iter()
        .filter(|root| path.starts_with(root))
        .min_by_key(|root| root.components().count())
}

/// Directories from `root` (inclusive) down to `path`'s parent (inclusive).
fn ancestors_within(root: &Path, path: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = path
        .ancestors()
        .skip(1)
        .take_while(|ancestor| ancestor.starts_with(root))
        .map(Path::to_path_buf)
        .collect();
    out.reverse();
    out
}

/// Plan the mounts for one spawn.
pub(crate) fn plan(config: &MountConfig) -> Result<MountPlan, SandboxError> {
    let mut pins: Vec<PathBuf> = Vec::new();
    // (path, expect) of read-only binds.
    let mut protects: Vec<(PathBuf, Option<(u64, u64)>)> = Vec::new();
    let mut masks: Vec<(PathBuf, bool)> = Vec::new();
    let mut placeholders = Vec::new();
    let mut identities = Vec::new();

    for path in &config.protected {
        let Some(root) = outermost_root(&config.write, path) else {
            // Outside every writable root Landlock already makes it read-only.
            continue;
        };
        let missing = match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(SandboxError::ProtectedPath {
                    path: path.clone(),
                    reason: "it is a symlink; protect its target instead",
                });
            }
            Ok(meta) if !is_placeholder(&meta) => {
                pins.extend(ancestors_within(root, path));
                identities.push((path.clone(), Identity::of(&meta)));
                protects.push((path.clone(), None));
                false
            }
            // A placeholder left by a concurrent (or crashed) spawn: share it, lock included,
            // so its owner's cleanup cannot remove it from under this command.
            Ok(_) => true,
            Err(error) if error.kind() == io::ErrorKind::NotFound => true,
            Err(source) => {
                return Err(SandboxError::OpenPath {
                    path: path.clone(),
                    source,
                });
            }
        };
        if missing {
            let placeholder = make_placeholder(root, path)?;
            pins.extend(ancestors_within(root, &placeholder.path));
            protects.push((placeholder.path.clone(), Some(placeholder.id)));
            // An init serving later commands must find this very placeholder there: removing
            // it (from the host) takes the read-only mount away with it.
            let identity =
                Identity::of_fd(&placeholder.lock).map_err(|source| SandboxError::Placeholder {
                    path: placeholder.path.clone(),
                    source,
                })?;
            identities.push((placeholder.path.clone(), identity));
            placeholders.push(placeholder);
        }
    }

    for path in &config.denied {
        if outermost_root(&config.readable, path).is_none() {
            // Not reachable through any rule: Landlock already denies it.
            continue;
        }
        let meta = match std::fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(SandboxError::OpenPath {
                    path: path.clone(),
                    source,
                });
            }
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        if let Some(root) = outermost_root(&config.write, path) {
            pins.extend(ancestors_within(root, path));
        }
        identities.push((path.clone(), Identity::of(&meta)));
        masks.push((path.clone(), meta.is_dir()));
    }

    // Nothing below a read-only or masked path needs (or may get) a writable pin, and
    // nothing below a mask is reachable at all.
    let covered = |path: &Path, include_self: bool| {
        protects
            .iter()
            .map(|(p, _)| p)
            .chain(masks.iter().map(|(p, _)| p))
            .any(|outer| path.starts_with(outer) && (include_self || path != outer))
    };
    pins.sort();
    pins.dedup();
    pins.retain(|pin| !covered(pin, true));
    // A writable root is already a mount point of its own (see below).
    pins.retain(|pin| !config.write.contains(pin));
    let masked_dirs: Vec<PathBuf> = masks
        .iter()
        .filter(|(_, dir)| *dir)
        .map(|(path, _)| path.clone())
        .collect();
    let under_mask = |path: &Path| {
        masked_dirs
            .iter()
            .any(|dir| path != dir && path.starts_with(dir))
    };
    protects.retain(|(path, _)| !under_mask(path));
    masks.retain(|(path, _)| !under_mask(path));

    let mut steps = Vec::new();
    let mut writable: Vec<&PathBuf> = config.write.iter().collect();
    writable.sort_by_key(|path| (depth(path), path.as_path()));
    writable.dedup();
    for path in writable {
        steps.push(MountStep {
            kind: MountKind::Writable,
            path: path.clone(),
            c_path: c_path(path)?,
        });
    }
    if config.private_shm {
        steps.push(MountStep {
            kind: MountKind::Shm,
            path: PathBuf::from("/dev/shm"),
            c_path: c"/dev/shm".to_owned(),
        });
    }
    // Depth order: a parent's bind must exist before anything is mounted inside it; at equal
    // depth pins go first so a protect or mask of the same path lands on top.
    let mut ordered: Vec<(usize, u8, MountKind, PathBuf)> = Vec::new();
    for pin in pins {
        ordered.push((depth(&pin), 0, MountKind::Pin, pin));
    }
    for (path, expect) in protects {
        ordered.push((depth(&path), 1, MountKind::Protect { expect }, path));
    }
    for (path, dir) in masks {
        let kind = if dir {
            MountKind::MaskDir
        } else {
            MountKind::MaskFile
        };
        ordered.push((depth(&path), 2, kind, path));
    }
    ordered.sort_by(|a, b| (a.0, a.1, &a.3).cmp(&(b.0, b.1, &b.3)));
    for (_, _, kind, path) in ordered {
        let c_path = c_path(&path)?;
        steps.push(MountStep { kind, path, c_path });
    }
    Ok(MountPlan {
        steps,
        placeholders,
        identities,
    })
}

fn depth(path: &Path) -> usize {
    path.components().count()
}

/// Create (or reuse) the placeholder for the missing protected `path` inside `root`: an
/// empty directory at the first missing component, locked shared.
fn make_placeholder(root: &Path, path: &Path) -> Result<Placeholder, SandboxError> {
    // First missing component, refusing symlinks on the way.
    let mut first_missing = None;
    for ancestor in ancestors_within(root, path)
        .into_iter()
        .chain([path.to_path_buf()])
    {
        match std::fs::symlink_metadata(&ancestor) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(SandboxError::ProtectedPath {
                    path: path.to_owned(),
                    reason: "a parent directory is a symlink",
                });
            }
            Ok(meta) if is_placeholder(&meta) => {
                first_missing = Some(ancestor);
                break;
            }
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                first_missing = Some(ancestor);
                break;
            }
            Err(source) => {
                return Err(SandboxError::OpenPath {
                    path: ancestor,
                    source,
                });
            }
        }
    }
    let target = first_missing.unwrap_or_else(|| path.to_path_buf());
    let placeholder_error = |source: io::Error| SandboxError::Placeholder {
        path: target.clone(),
        source,
    };
    let (Some(parent_path), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(placeholder_error(io::Error::from(
            io::ErrorKind::InvalidInput,
        )));
    };
    let parent_c = c_path(parent_path)?;
    let name = CString::new(name.as_bytes()).map_err(|_| SandboxError::NulByte {
        what: "sandbox path",
    })?;
    let parent = sys::open_no_symlinks(None, &parent_c, libc::O_PATH | libc::O_DIRECTORY)
        .map_err(placeholder_error)?;
    // A concurrent cleanup may remove the directory between mkdir and lock: retry.
    for _ in 0..8 {
        let creating = PLACEHOLDER_CREATION
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let created = match sys::mkdirat(&parent, &name, 0o700) {
            Ok(()) => true,
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => false,
            Err(error) => return Err(placeholder_error(error)),
        };
        let lock =
            match sys::open_no_symlinks(Some(&parent), &name, libc::O_RDONLY | libc::O_DIRECTORY) {
                Ok(lock) => lock,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(placeholder_error(error)),
            };
        if created {
            sys::fchmod(&lock, PLACEHOLDER_MODE).map_err(placeholder_error)?;
        } else {
            let meta = std::fs::symlink_metadata(&target).map_err(placeholder_error)?;
            if !is_placeholder(&meta) {
                // Someone created the real thing meanwhile: protect it as such next time.
                return Err(SandboxError::ProtectedPath {
                    path: target.clone(),
                    reason: "it appeared while the sandbox was starting; retry",
                });
            }
        }
        // Someone holding an exclusive lock (another process releasing it, or a command that
        // locked the placeholder it can open) makes this spawn wait, but not the others: the
        // wait happens without the process-wide lock.
        match sys::flock(&lock, libc::LOCK_SH | libc::LOCK_NB) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                drop(creating);
                sys::flock(&lock, libc::LOCK_SH).map_err(placeholder_error)?;
            }
            Err(error) => return Err(placeholder_error(error)),
        }
        let id = sys::fstat_id(&lock).map_err(placeholder_error)?;
        match sys::fstatat_id(&parent, &name) {
            Ok(current) if current == id => {
                return Ok(Placeholder {
                    path: target.clone(),
                    parent,
                    name,
                    lock,
                    id,
                });
            }
            Ok(_) => continue,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(placeholder_error(error)),
        }
    }
    Err(placeholder_error(io::Error::from(
        io::ErrorKind::WouldBlock,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(plan: &MountPlan) -> Vec<(MountKind, PathBuf)> {
        plan.steps
            .iter()
            .map(|step| (step.kind, step.path.clone()))
            .collect()
    }

    #[test]
    fn ancestors_run_from_root_to_parent() {
        assert_eq!(
            ancestors_within(Path::new("/w"), Path::new("/w/a/b/.git")),
            vec![
                PathBuf::from("/w"),
                PathBuf::from("/w/a"),
                PathBuf::from("/w/a/b")
            ]
        );
        assert_eq!(
            ancestors_within(Path::new("/w"), Path::new("/w/.git")),
            vec![PathBuf::from("/w")]
        );
    }

    #[test]
    fn existing_protected_path_is_pinned_then_bound_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("sub/.git")).unwrap();
        let config = MountConfig {
            write: vec![root.clone()],
            readable: vec![root.clone()],
            protected: vec![root.join("sub/.git")],
            denied: vec![],
            private_shm: false,
        };
        let plan = plan(&config).unwrap();
        assert_eq!(
            kinds(&plan),
            vec![
                (MountKind::Writable, root.clone()),
                (MountKind::Pin, root.join("sub")),
                (MountKind::Protect { expect: None }, root.join("sub/.git")),
            ]
        );
        assert!(plan.placeholders.is_empty());
    }

    #[test]
    fn missing_protected_path_gets_a_locked_placeholder_that_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let config = MountConfig {
            write: vec![root.clone()],
            readable: vec![root.clone()],
            protected: vec![root.join(".git")],
            denied: vec![],
            private_shm: true,
        };
        let plan = plan(&config).unwrap();
        assert_eq!(plan.placeholders.len(), 1);
        let id = plan.placeholders[0].id;
        assert_eq!(
            kinds(&plan),
            vec![
                (MountKind::Writable, root.clone()),
                (MountKind::Shm, PathBuf::from("/dev/shm")),
                (MountKind::Protect { expect: Some(id) }, root.join(".git")),
            ]
        );
        assert!(root.join(".git").is_dir());
        for placeholder in plan.placeholders {
            placeholder.release();
        }
        assert!(!root.join(".git").exists());
    }

    /// Spawns of one process making the placeholder of the same missing path at once all get
    /// it: none takes another's half-made placeholder (its first mode) for a real directory.
    #[test]
    fn concurrent_placeholders_for_one_path_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let path = root.join(".cordon");
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (root, path) = (root.clone(), path.clone());
                std::thread::spawn(move || {
                    for _ in 0..300 {
                        let placeholder = make_placeholder(&root, &path)
                            .unwrap_or_else(|error| panic!("{error}"));
                        placeholder.release();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(!path.exists(), "the last user removes the placeholder");
    }

    /// A placeholder someone holds exclusively (a command can open and lock the one it sees)
    /// makes only the spawn that needs it wait: another path's placeholder is made meanwhile.
    #[test]
    fn a_locked_placeholder_blocks_only_its_own_spawn() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let held = root.join(".git");
        std::fs::create_dir(&held).unwrap();
        std::fs::set_permissions(&held, std::fs::Permissions::from_mode(PLACEHOLDER_MODE)).unwrap();
        let holder = std::fs::File::open(&held).unwrap();
        holder.lock().unwrap();
        let ino = std::fs::metadata(&held).unwrap().ino();
        let waiter = {
            let (root, held) = (root.clone(), held.clone());
            std::thread::spawn(move || make_placeholder(&root, &held).map(Placeholder::release))
        };
        // Wait until the spawn is blocked on the lock (a `->` waiter line in /proc/locks).
        let waiting = (0..30_000).any(|_| {
            let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
            let blocked = locks
                .lines()
                .any(|line| line.contains("->") && line.contains(&format!(":{ino} ")));
            if !blocked {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            blocked
        });
        assert!(waiting, "the spawn never waited for the held placeholder");
        let (done, finished) = std::sync::mpsc::channel();
        let other = root.join(".cordon");
        let other_root = root.clone();
        std::thread::spawn(move || {
            let made = make_placeholder(&other_root, &other).map(Placeholder::release);
            let _ = done.send(made.is_ok());
        });
        let other_made = finished.recv_timeout(std::time::Duration::from_secs(60));
        drop(holder);
        waiter.join().unwrap().unwrap();
        assert_eq!(
            other_made,
            Ok(true),
            "another path's placeholder was held up"
        );
    }

    #[test]
    fn placeholder_in_use_by_another_sandbox_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let config = MountConfig {
            write: vec![root.clone()],
            readable: vec![root.clone()],
            protected: vec![root.join(".git")],
            denied: vec![],
            private_shm: false,
        };
        let first = plan(&config).unwrap();
        let second = plan(&config).unwrap();
        assert_eq!(first.placeholders[0].id, second.placeholders[0].id);
        for placeholder in first.placeholders {
            placeholder.release();
        }
        assert!(
            root.join(".git").is_dir(),
            "still locked by the second plan"
        );
        for placeholder in second.placeholders {
            placeholder.release();
        }
        assert!(!root.join(".git").exists());
    }

    #[test]
    fn symlinked_protected_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink("/tmp", root.join(".git")).unwrap();
        let config = MountConfig {
            write: vec![root.clone()],
            readable: vec![root.clone()],
            protected: vec![root.join(".git")],
            denied: vec![],
            private_shm: false,
        };
        let error = plan(&config).unwrap_err();
        assert!(
            matches!(error, SandboxError::ProtectedPath { .. }),
            "{error}"
        );
    }

    #[test]
    fn denied_paths_are_masked_by_kind_and_missing_ones_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("secrets")).unwrap();
        std::fs::write(root.join("secrets/key"), "k").unwrap();
        std::fs::write(root.join(".env"), "e").unwrap();
        let config = MountConfig {
            write: vec![root.clone()],
            readable: vec![root.clone()],
            protected: vec![],
            denied: vec![
                root.join(".env"),
                root.join("secrets"),
                root.join("secrets/key"),
                root.join("absent"),
            ],
            private_shm: false,
        };
        let plan = plan(&config).unwrap();
        assert_eq!(
            kinds(&plan),
            vec![
                (MountKind::Writable, root.clone()),
                (MountKind::MaskFile, root.join(".env")),
                (MountKind::MaskDir, root.join("secrets")),
            ]
        );
    }

    #[test]
    fn paths_outside_every_root_need_no_mount() {
        let config = MountConfig {
            write: vec![PathBuf::from("/w")],
            readable: vec![PathBuf::from("/w")],
            protected: vec![PathBuf::from("/elsewhere/.git")],
            denied: vec![PathBuf::from("/root/.ssh")],
            private_shm: false,
        };
        assert_eq!(
            kinds(&plan(&config).unwrap()),
            vec![(MountKind::Writable, PathBuf::from("/w"))]
        );
    }

    #[test]
    fn nothing_writable_is_pinned_inside_a_protected_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("a/b/.git")).unwrap();
        let config = MountConfig {
            write: vec![root.clone()],
            readable: vec![root.clone()],
            protected: vec![root.join("a"), root.join("a/b/.git")],
            denied: vec![],
            private_shm: false,
        };
        let plan = plan(&config).unwrap();
        assert_eq!(
            kinds(&plan),
            vec![
                (MountKind::Writable, root.clone()),
                (MountKind::Protect { expect: None }, root.join("a")),
                (MountKind::Protect { expect: None }, root.join("a/b/.git")),
            ]
        );
    }
}
