//! [`FileOperations`] of the local backend: every path is opened beneath an allowed root by the
//! kernel ([`crate::roots`]), judged on its canonical path against the protected/denied globs,
//! and written atomically: a temp file created `O_EXCL` in the target's own directory fd, then
//! swapped in within that fd: `renameat2(RENAME_EXCHANGE)` and an unlink of the old file when
//! the target is an existing regular file, a plain `renameat` otherwise.
//!
//! Why the exchange: on ext4 a rename over an existing file makes the kernel start writeback
//! of the new file before the rename returns (`auto_da_alloc`, so that a power loss does not
//! leave a zero-length file). That costs ~0.13 ms of a 2 KB write's ~0.17 ms on this class of
//! disk. An exchange does not trigger it; Cordon starts the same writeback itself
//! (`sync_file_range(SYNC_FILE_RANGE_WRITE)`) on a background thread right after the swap, so
//! the protection is kept and the call does not wait for it. [`wait_for_writeback`] lets a
//! process that is about to exit make sure every queued writeback was started.
//!
//! Writes are atomic against concurrent readers and against Cordon crashing or being killed
//! (a reader sees the old or the new file, never a mix), but not against power loss: there is
//! no `fsync`, because agents write many small files and the journal of a modern filesystem
//! makes the rename durable soon after anyway.
//!
//! Hardlinks: a hardlink inside a root to a file outside is the same inode, so `read_file`
//! returns the outside file's content (the kernel cannot tell names of one inode apart);
//! `write_file` replaces the directory entry with a new inode, so the outside file is never
//! modified through it.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use cordon_ops::{BackendId, DirEntry, FileKind, FileMeta, FileOperations, FsError, SpillWriter};
use cordon_sandbox::RenameMode;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, ResolveFlag, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::backend::Shared;
use crate::roots::{
    Access, MAX_SYMLINK_HOPS, Opened, RootKind, Verdict, fd_path, file_type, fs_error, name_bytes,
    open_beneath,
};

/// Reads up to this size run inline on the async worker: a few syscalls on the page cache
/// cost less than the hand-off to the blocking pool. Larger reads go to `spawn_blocking`.
const INLINE_READ_LIMIT: u64 = 256 * 1024;
/// Writes up to this size run on the caller's thread (a page-cache write and a rename cost
/// less than the hop to a blocking thread); larger ones go to the blocking pool.
const INLINE_WRITE_LIMIT: usize = 256 * 1024;

/// [`FileOperations`] over the backend's confined roots.
#[derive(Debug)]
pub(crate) struct LocalFiles {
    shared: Arc<Shared>,
}

impl LocalFiles {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        LocalFiles { shared }
    }

    async fn blocking<T, F>(&self, op: &'static str, path: &Path, f: F) -> Result<T, FsError>
    where
        T: Send + 'static,
        F: FnOnce(&Shared) -> Result<T, FsError> + Send + 'static,
    {
        let shared = self.shared.clone();
        match tokio::task::spawn_blocking(move || f(&shared)).await {
            Ok(result) => result,
            // A panic is a bug, not an I/O error: the tool call's panic containment reports
            // it for that call only.
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => Err(FsError::Io {
                op,
                path: path.to_path_buf(),
                source: io::Error::other(join.to_string()),
            }),
        }
    }
}

fn kind_of(stat: &FileStat) -> FileKind {
    match file_type(stat) {
        SFlag::S_IFREG => FileKind::File,
        SFlag::S_IFDIR => FileKind::Dir,
        SFlag::S_IFLNK => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

fn kind_name(stat: &FileStat) -> &'static str {
    match file_type(stat) {
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        _ => "not a regular file",
    }
}

/// One file replacement: the target's directory and name, what exists there now, the new
/// content, and the path as requested (for errors).
struct Replacement<'a> {
    dir: &'a Opened,
    name: &'a OsStr,
    existing: Option<FileStat>,
    data: &'a [u8],
    path: &'a Path,
}

/// Where [`write_replace`] writes: `name` in `dir`, ending with `mode` (and `owner`, when
/// given). `replaces_file`: `name` was seen as an existing regular file, so the new file is
/// swapped in with an exchange (see the module docs).
pub(crate) struct ReplaceTarget<'a> {
    pub dir: BorrowedFd<'a>,
    pub name: &'a OsStr,
    pub mode: u32,
    pub owner: Option<(u32, u32)>,
    pub replaces_file: bool,
}

/// A file opened for reading, with its size.
struct ReadHandle {
    file: File,
    size: u64,
}

impl Shared {
    /// Paths are absolute in the backend's namespace; a relative one is taken from the
    /// workspace root.
    pub(crate) fn absolute(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.root.join(path)
        }
    }

    /// The verdict for a canonical path; Cordon's own spill directory is exempt.
    pub(crate) fn verdict(&self, canonical: &Path) -> Verdict {
        if canonical.starts_with(&self.state.spill_path) {
            return Verdict::Free;
        }
        match self.rules.judge(canonical) {
            Verdict::Free
                if self
                    .git_protected
                    .iter()
                    .any(|path| canonical.starts_with(path)) =>
            {
                Verdict::Protected
            }
            verdict => verdict,
        }
    }

    /// Open `path` for reading, refused when its canonical path is denied.
    fn open_readable(&self, path: &Path, flags: OFlag) -> Result<Opened, FsError> {
        if !self.rules.has_denied() {
            return self.roots.open(path, flags, "open");
        }
        let (opened, canonical) = self.roots.open_named(path, flags, "open")?;
        match self.verdict(&canonical) {
            Verdict::Denied => Err(FsError::Denied { path: canonical }),
            Verdict::Protected | Verdict::Free => Ok(opened),
        }
    }

    /// Refuse mutating a canonical path that is denied, protected, in a read-only root or in
    /// the spill directory.
    fn check_mutation(&self, canonical: &Path, path: &Path) -> Result<(), FsError> {
        let (root, _) =
            self.roots
                .select_canonical(canonical)
                .ok_or_else(|| FsError::OutsideRoot {
                    path: path.to_path_buf(),
                })?;
        match self.verdict(canonical) {
            Verdict::Denied => {
                return Err(FsError::Denied {
                    path: canonical.to_path_buf(),
                });
            }
            Verdict::Protected => {
                return Err(FsError::Protected {
                    path: canonical.to_path_buf(),
                });
            }
            Verdict::Free => {}
        }
        match (root.kind, root.access) {
            (RootKind::Spill, _) | (_, Access::ReadOnly) => Err(FsError::PermissionDenied {
                path: path.to_path_buf(),
            }),
            (RootKind::Workspace | RootKind::Extra, Access::ReadWrite) => {
                if self.git.is_some() && crate::git_guard::makes_git_metadata(canonical, &root.path)
                {
                    tracing::info!(path = %canonical.display(), "refused a write of git metadata");
                    return Err(FsError::GitMetadata {
                        path: path.to_path_buf(),
                    });
                }
                Ok(())
            }
        }
    }

    fn open_for_read(&self, path: &Path) -> Result<ReadHandle, FsError> {
        let opened =
            self.open_readable(path, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)?;
        let stat = fstat(&opened.fd).map_err(|e| fs_error("inspect", path, e))?;
        match file_type(&stat) {
            SFlag::S_IFREG => {}
            SFlag::S_IFDIR => {
                return Err(FsError::IsADirectory {
                    path: path.to_path_buf(),
                });
            }
            _ => {
                return Err(FsError::Io {
                    op: "read",
                    path: path.to_path_buf(),
                    source: io::Error::new(io::ErrorKind::InvalidInput, kind_name(&stat)),
                });
            }
        }
        Ok(ReadHandle {
            file: File::from(opened.fd),
            size: u64::try_from(stat.st_size).unwrap_or(0),
        })
    }

    /// Read from `offset` to the end of the file, or at most `limit` bytes.
    fn read_all(
        handle: ReadHandle,
        offset: u64,
        limit: Option<usize>,
        path: &Path,
    ) -> Result<Vec<u8>, FsError> {
        let ReadHandle { file, size } = handle;
        if offset > 0 {
            (&file)
                .seek(io::SeekFrom::Start(offset))
                .map_err(|e| FsError::from_io("read", path, e))?;
        }
        let expected = usize::try_from(size.saturating_sub(offset)).unwrap_or(usize::MAX);
        let mut buf = Vec::with_capacity(match limit {
            Some(limit) => limit.min(expected),
            None => expected.saturating_add(1),
        });
        let result = match limit {
            Some(limit) => file.take(limit as u64).read_to_end(&mut buf),
            None => (&file).read_to_end(&mut buf),
        };
        result.map_err(|e| FsError::from_io("read", path, e))?;
        Ok(buf)
    }

    fn write_file_sync(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
        let mut target = path.to_path_buf();
        for _ in 0..=MAX_SYMLINK_HOPS {
            if self.roots.is_root_path(&target) {
                return Err(FsError::IsADirectory {
                    path: path.to_path_buf(),
                });
            }
            let name = match target.components().next_back() {
                Some(Component::Normal(name)) => name.to_os_string(),
                _ => {
                    return Err(FsError::IsADirectory {
                        path: path.to_path_buf(),
                    });
                }
            };
            let parent = target.parent().unwrap_or(Path::new("/")).to_path_buf();
            let dir = self
                .roots
                .open(&parent, OFlag::O_PATH | OFlag::O_DIRECTORY, "open")
                .map_err(|e| match e {
                    FsError::OutsideRoot { .. } => FsError::OutsideRoot {
                        path: path.to_path_buf(),
                    },
                    other => other,
                })?;
            match fstatat(&dir.fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) if file_type(&stat) == SFlag::S_IFLNK => {
                    // Replace the file the link points to (resolved and confined again), never
                    // the link itself.
                    let link = readlinkat(&dir.fd, name.as_os_str())
                        .map_err(|e| fs_error("read link", path, e))?;
                    let link = PathBuf::from(link);
                    target = if link.is_absolute() {
                        link
                    } else {
                        fd_path(dir.fd.as_fd())
                            .map_err(|e| FsError::from_io("resolve", path, e))?
                            .join(link)
                    };
                }
                Ok(stat) if file_type(&stat) == SFlag::S_IFDIR => {
                    return Err(FsError::IsADirectory {
                        path: path.to_path_buf(),
                    });
                }
                Ok(stat) => {
                    return self.replace_in_dir(Replacement {
                        dir: &dir,
                        name: &name,
                        existing: Some(stat),
                        data,
                        path,
                    });
                }
                Err(Errno::ENOENT) => {
                    return self.replace_in_dir(Replacement {
                        dir: &dir,
                        name: &name,
                        existing: None,
                        data,
                        path,
                    });
                }
                Err(e) => return Err(fs_error("inspect", path, e)),
            }
        }
        Err(fs_error("resolve", path, Errno::ELOOP))
    }

    fn replace_in_dir(&self, replacement: Replacement<'_>) -> Result<(), FsError> {
        let Replacement {
            dir,
            name,
            existing,
            data,
            path,
        } = replacement;
        let dir_real = fd_path(dir.fd.as_fd()).map_err(|e| FsError::from_io("resolve", path, e))?;
        let canonical = dir_real.join(name);
        self.check_mutation(&canonical, path)?;
        let mode = match &existing {
            Some(stat) => {
                if file_type(stat) != SFlag::S_IFREG {
                    return Err(FsError::Io {
                        op: "write",
                        path: path.to_path_buf(),
                        source: io::Error::new(io::ErrorKind::InvalidInput, kind_name(stat)),
                    });
                }
                if !self.ident.can_write(stat) {
                    return Err(FsError::PermissionDenied {
                        path: path.to_path_buf(),
                    });
                }
                // setuid/setgid/sticky are not carried over to content the agent wrote.
                stat.st_mode & 0o777
            }
            None => {
                let dir_stat = fstat(&dir.fd).map_err(|e| fs_error("inspect", &dir_real, e))?;
                if !self.ident.can_write(&dir_stat) {
                    return Err(FsError::PermissionDenied { path: dir_real });
                }
                0o644 & !self.umask
            }
        };
        let owner = existing.map(|stat| (stat.st_uid, stat.st_gid));
        let keep_owner = owner.filter(|_| self.ident.uid().is_root());
        let target = ReplaceTarget {
            dir: dir.fd.as_fd(),
            name,
            mode,
            owner: keep_owner,
            replaces_file: existing.is_some(),
        };
        write_replace(target, |file| file.write_all(data))
            .map_err(|(op, e)| FsError::from_io(op, path, e))
    }

    fn create_dir_all_sync(&self, path: &Path) -> Result<(), FsError> {
        let canonical = self.roots.canonicalize(path)?;
        self.check_mutation(&canonical, path)?;
        let (root, rel) =
            self.roots
                .select_canonical(&canonical)
                .ok_or_else(|| FsError::OutsideRoot {
                    path: path.to_path_buf(),
                })?;
        let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        let strict = ResolveFlag::RESOLVE_NO_SYMLINKS;
        // The common case: the directory exists already.
        if open_beneath(root.fd.as_fd(), rel, dir_flags, strict).is_ok() {
            return Ok(());
        }
        let mut parent = open_beneath(root.fd.as_fd(), Path::new(""), dir_flags, strict)
            .map_err(|e| fs_error("open", &root.path, e))?;
        let mut prefix = PathBuf::new();
        for component in rel.components() {
            let Component::Normal(name) = component else {
                return Err(FsError::NotFound {
                    path: path.to_path_buf(),
                });
            };
            prefix.push(name);
            let current = root.path.join(&prefix);
            match open_beneath(root.fd.as_fd(), &prefix, dir_flags, strict) {
                Ok(fd) => parent = fd,
                Err(Errno::ENOENT) => {
                    let parent_stat =
                        fstat(&parent).map_err(|e| fs_error("inspect", &current, e))?;
                    if !self.ident.can_write(&parent_stat) {
                        return Err(FsError::PermissionDenied {
                            path: current.parent().unwrap_or(&root.path).to_path_buf(),
                        });
                    }
                    match mkdirat(&parent, name, Mode::from_bits_truncate(0o777)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(fs_error("create directory", &current, e)),
                    }
                    parent = open_beneath(root.fd.as_fd(), &prefix, dir_flags, strict)
                        .map_err(|e| dir_step_error(&current, e))?;
                }
                Err(e) => return Err(dir_step_error(&current, e)),
            }
        }
        Ok(())
    }

    fn metadata_sync(&self, path: &Path) -> Result<FileMeta, FsError> {
        let (opened, canonical) = self.roots.open_named(path, OFlag::O_PATH, "inspect")?;
        let stat = fstat(&opened.fd).map_err(|e| fs_error("inspect", path, e))?;
        let verdict = self.verdict(&canonical);
        if verdict == Verdict::Denied {
            return Err(FsError::Denied { path: canonical });
        }
        let root_writable =
            self.roots
                .select_canonical(&canonical)
                .is_some_and(|(root, _)| match (root.kind, root.access) {
                    (RootKind::Spill, _) | (_, Access::ReadOnly) => false,
                    (RootKind::Workspace | RootKind::Extra, Access::ReadWrite) => true,
                });
        let writable = root_writable && verdict == Verdict::Free && self.ident.can_write(&stat);
        Ok(FileMeta {
            kind: kind_of(&stat),
            size: u64::try_from(stat.st_size).unwrap_or(0),
            mode: stat.st_mode & 0o7777,
            writable,
        })
    }

    fn read_dir_sync(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        let opened = self
            .roots
            .open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY, "list")?;
        let canonical =
            fd_path(opened.fd.as_fd()).map_err(|e| FsError::from_io("resolve", path, e))?;
        if self.verdict(&canonical) == Verdict::Denied {
            return Err(FsError::Denied { path: canonical });
        }
        let mut dir = nix::dir::Dir::from_fd(opened.fd).map_err(|e| fs_error("list", path, e))?;
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| fs_error("list", path, e))?;
            let raw = entry.file_name().to_bytes();
            if raw == b"." || raw == b".." {
                continue;
            }
            let name_os = OsStr::from_bytes(raw);
            let name = name_os.to_string_lossy().into_owned();
            let entry_canonical = canonical.join(name_os);
            let verdict = if self.rules.is_empty() {
                Verdict::Free
            } else {
                self.verdict(&entry_canonical)
            };
            if verdict == Verdict::Denied {
                out.push(DirEntry {
                    name,
                    kind: None,
                    error: Some("access denied by policy".into()),
                });
                continue;
            }
            let kind = match entry.file_type() {
                Some(nix::dir::Type::File) => Ok(FileKind::File),
                Some(nix::dir::Type::Directory) => Ok(FileKind::Dir),
                Some(
                    nix::dir::Type::Fifo
                    | nix::dir::Type::CharacterDevice
                    | nix::dir::Type::BlockDevice
                    | nix::dir::Type::Socket,
                ) => Ok(FileKind::Other),
                Some(nix::dir::Type::Symlink) | None => self.entry_kind(&entry_canonical),
            };
            // The empty placeholder a sandbox keeps at a missing protected path (`.git` of a
            // workspace without one) between commands stands for "does not exist".
            if verdict == Verdict::Protected
                && matches!(kind, Ok(FileKind::Dir))
                && cordon_sandbox::is_placeholder_dir(&entry_canonical)
            {
                continue;
            }
            out.push(match kind {
                Ok(kind) => DirEntry {
                    name,
                    kind: Some(kind),
                    error: None,
                },
                Err(reason) => DirEntry {
                    name,
                    kind: None,
                    error: Some(reason),
                },
            });
        }
        Ok(out)
    }

    /// The kind of a listed entry after following it (confined), or why it has none.
    fn entry_kind(&self, entry: &Path) -> Result<FileKind, String> {
        let is_link =
            || std::fs::symlink_metadata(entry).is_ok_and(|meta| meta.file_type().is_symlink());
        match self.roots.open_named(entry, OFlag::O_PATH, "inspect") {
            Ok((opened, real)) => {
                if self.verdict(&real) == Verdict::Denied {
                    return Err("symlink points to a path denied by policy".into());
                }
                fstat(&opened.fd)
                    .map(|stat| kind_of(&stat))
                    .map_err(|e| io::Error::from(e).to_string())
            }
            Err(FsError::NotFound { .. }) if is_link() => {
                Err("dangling symlink (its target does not exist)".into())
            }
            Err(FsError::OutsideRoot { .. }) => {
                Err("symlink points outside the allowed roots".into())
            }
            Err(FsError::Io { source, .. })
                if source.raw_os_error() == Some(Errno::ELOOP as i32) =>
            {
                Err("symlink loop".into())
            }
            Err(other) => Err(other.to_string()),
        }
    }

    fn canonicalize_sync(&self, path: &Path) -> Result<PathBuf, FsError> {
        let canonical = self.roots.canonicalize(path)?;
        match self.verdict(&canonical) {
            Verdict::Denied => Err(FsError::Denied { path: canonical }),
            Verdict::Protected | Verdict::Free => Ok(canonical),
        }
    }

    fn create_spill_file_sync(&self) -> Result<(PathBuf, File), FsError> {
        loop {
            let name = format!("cordon-bash-{:016x}.log", fastrand::u64(..));
            let path = self.state.spill_path.join(&name);
            match nix::fcntl::openat(
                &self.state.spill_fd,
                name.as_str(),
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            ) {
                Ok(fd) => {
                    // Held until the command's output is complete: a sweep of another
                    // backend never removes a spill file whose lock it cannot take.
                    let file = File::from(fd);
                    file.try_lock().map_err(|e| FsError::Io {
                        op: "lock spill file",
                        path: path.clone(),
                        source: io::Error::from(e),
                    })?;
                    return Ok((path, file));
                }
                Err(Errno::EEXIST) => continue,
                Err(e) => return Err(fs_error("create spill file", &path, e)),
            }
        }
    }
}

fn dir_step_error(current: &Path, errno: Errno) -> FsError {
    match errno {
        // A symlink appeared on a path that had none a moment ago: refuse, do not follow.
        Errno::ELOOP | Errno::EXDEV => FsError::OutsideRoot {
            path: current.to_path_buf(),
        },
        other => fs_error("open", current, other),
    }
}

/// Removes a temp file unless disarmed (the rename succeeded).
struct TempGuard<'a> {
    dir: BorrowedFd<'a>,
    name: OsString,
    armed: bool,
}

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        // What stays is a temp file the next session's start-time temp sweep removes.
        if self.armed
            && let Err(error) =
                unlinkat(self.dir, self.name.as_os_str(), UnlinkatFlags::NoRemoveDir)
        {
            tracing::debug!(name = ?self.name, %error, "failed to remove an abandoned temp file");
        }
    }
}

/// The temp name for replacing `name`: hidden, recognisable, unique, short enough.
fn temp_name(name: &OsStr) -> OsString {
    let bytes = name_bytes(name);
    let mut prefix_len = bytes.len().min(64);
    // Keep UTF-8 names valid UTF-8 in the temp name (purely cosmetic for `ls`).
    while prefix_len > 0 && std::str::from_utf8(&bytes[..prefix_len]).is_err() {
        prefix_len -= 1;
    }
    let mut out = Vec::with_capacity(prefix_len + 32);
    out.push(b'.');
    out.extend_from_slice(&bytes[..prefix_len]);
    out.extend_from_slice(format!(".cordon-{:016x}.tmp", fastrand::u64(..)).as_bytes());
    OsString::from(OsStr::from_bytes(&out))
}

/// Replace `target.name` in `target.dir` atomically: create a temp file `O_EXCL` next to it, let `fill`
/// write it, set `mode` (and `owner` when given), rename it over `name`. On any failure the
/// temp file is removed and the target is untouched. Errors carry the failing step.
pub(crate) fn write_replace(
    target: ReplaceTarget<'_>,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), (&'static str, io::Error)> {
    let ReplaceTarget {
        dir,
        name,
        mode,
        owner,
        replaces_file,
    } = target;
    let (tmp, fd) = loop {
        let tmp = temp_name(name);
        match nix::fcntl::openat(
            dir,
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(fd) => break (tmp, fd),
            Err(Errno::EEXIST) => continue,
            Err(e) => return Err(("create temp file for", io::Error::from(e))),
        }
    };
    let mut guard = TempGuard {
        dir,
        name: tmp,
        armed: true,
    };
    let mut file = File::from(fd);
    // Held until the rename: the next session's cleanup removes only temp files whose lock it
    // can take (those of a killed writer).
    file.try_lock()
        .map_err(|e| ("lock temp file for", io::Error::from(e)))?;
    fill(&mut file).map_err(|e| ("write", e))?;
    if let Some((uid, gid)) = owner {
        // Keep the owner when we can (running as root); a failure only changes ownership.
        let _ = nix::unistd::fchown(
            &file,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        );
    }
    fchmod(&file, Mode::from_bits_truncate(mode)).map_err(|e| ("set permissions of", e.into()))?;
    if replaces_file && let Some(swapped) = swap_in(&mut guard, name)? {
        after_swap(file, swapped.old);
        return Ok(());
    }
    drop(file);
    renameat(dir, guard.name.as_os_str(), dir, name).map_err(|e| ("rename", e.into()))?;
    guard.armed = false;
    Ok(())
}

/// `renameat2(2)` with nix's error type (through the sandbox crate's raw system call, which
/// the static musl build has too).
pub(crate) fn renameat2(
    old_dir: impl AsFd,
    old: &OsStr,
    new_dir: impl AsFd,
    new: &OsStr,
    mode: RenameMode,
) -> Result<(), Errno> {
    cordon_sandbox::rename_at(old_dir.as_fd(), old, new_dir.as_fd(), new, mode)
        .map_err(|error| Errno::from_raw(error.raw_os_error().unwrap_or(nix::libc::EIO)))
}

/// Exchange the temp file with the existing `name`, then unlink the old file (now under the
/// temp name), keeping an `O_PATH` descriptor of it: the inode is released when that is
/// closed, off the caller's path (releasing an inode whose writeback is in flight waits for
/// the I/O). `Ok(None)`: the exchange failed (unsupported, `name` gone, …) and changed
/// nothing; the caller falls back to a rename. If `name` turned into a directory meanwhile,
/// the exchange is undone and the write fails as a rename over a directory would.
fn swap_in(
    guard: &mut TempGuard<'_>,
    name: &OsStr,
) -> Result<Option<Swapped>, (&'static str, io::Error)> {
    let dir = guard.dir;
    let tmp = guard.name.as_os_str();
    // A failed exchange changed nothing: whatever the reason (no support on this filesystem,
    // `name` gone, a cross-layer overlayfs file, …) the plain rename runs and reports its own
    // error, if any.
    if renameat2(dir, tmp, dir, name, RenameMode::Exchange).is_err() {
        return Ok(None);
    }
    let old = nix::fcntl::openat(
        dir,
        tmp,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    );
    let is_dir = old
        .as_ref()
        .ok()
        .and_then(|fd| fstat(fd).ok())
        .is_some_and(|stat| file_type(&stat) == SFlag::S_IFDIR);
    if is_dir {
        // Put the directory back; the guard then removes our file.
        renameat2(dir, tmp, dir, name, RenameMode::Exchange).map_err(|e| ("rename", e.into()))?;
        return Err(("rename", Errno::EISDIR.into()));
    }
    // From here on the new content is in place.
    guard.armed = false;
    match unlinkat(dir, tmp, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(Some(Swapped { old: old.ok() })),
        // Another Cordon's start-up cleanup took the (unlocked) old copy for a killed write's
        // leftover: it is gone either way, and the new content is in place.
        Err(Errno::ENOENT) => Ok(Some(Swapped { old: old.ok() })),
        Err(e) => Err(("remove the replaced copy of", e.into())),
    }
}

/// A completed exchange: the replaced file's descriptor, when it could be opened.
struct Swapped {
    old: Option<OwnedFd>,
}

/// A request to the writeback thread.
enum WritebackJob {
    /// Start writeback of the swapped-in `file`, then release the replaced one.
    Swapped { file: File, old: Option<OwnedFd> },
    /// Answer once every earlier job is done.
    Flush(mpsc::SyncSender<()>),
}

impl WritebackJob {
    fn run(self) {
        match self {
            WritebackJob::Swapped { file, old } => {
                // Only a head start for the disk: the data is written back in any case.
                let _ = cordon_sandbox::start_writeback(&file);
                drop(old);
            }
            WritebackJob::Flush(reply) => {
                // The waiter gave up (the process is exiting): nothing to tell.
                let _ = reply.send(());
            }
        }
    }
}

/// Swaps the writeback thread may have pending: each holds two fds until the thread gets to
/// it, so a burst of writes waits for the thread rather than piling up open files.
const WRITEBACK_BACKLOG: usize = 64;

/// The queue of the background thread that finishes swaps (`None` if the thread could not
/// be created).
static WRITEBACK: OnceLock<Option<SyncSender<WritebackJob>>> = OnceLock::new();

/// The writeback queue, its thread started on first use.
fn writeback_queue() -> Option<&'static SyncSender<WritebackJob>> {
    WRITEBACK
        .get_or_init(|| {
            let (sender, receiver) = mpsc::sync_channel::<WritebackJob>(WRITEBACK_BACKLOG);
            std::thread::Builder::new()
                .name("cordon-writeback".into())
                .spawn(move || receiver.into_iter().for_each(WritebackJob::run))
                .ok()
                .map(|_| sender)
        })
        .as_ref()
}

/// Hand the rest of a swap to the background thread; without it, finish here.
fn after_swap(file: File, old: Option<OwnedFd>) {
    let job = WritebackJob::Swapped { file, old };
    let unsent = match writeback_queue() {
        Some(sender) => sender.send(job).err().map(|e| e.0),
        None => Some(job),
    };
    if let Some(job) = unsent {
        job.run();
    }
}

/// Block until writeback of every file swapped in so far has been started. A process about
/// to exit calls it so that no queued writeback is dropped.
pub fn wait_for_writeback() {
    // Nothing was ever queued when the thread does not exist: do not start it now.
    let Some(Some(queue)) = WRITEBACK.get() else {
        return;
    };
    let (reply, done) = mpsc::sync_channel(1);
    if queue.send(WritebackJob::Flush(reply)).is_ok() {
        // A closed channel means the writeback thread is gone: nothing left to wait for.
        let _ = done.recv();
    }
}

#[async_trait]
impl FileOperations for LocalFiles {
    fn backend_id(&self) -> &BackendId {
        &self.shared.id
    }

    fn root(&self) -> &Path {
        &self.shared.root
    }

    fn home(&self) -> Option<&Path> {
        self.shared.home.as_deref()
    }

    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        let path = self.shared.absolute(path);
        let handle = self.shared.open_for_read(&path)?;
        if handle.size <= INLINE_READ_LIMIT {
            return Shared::read_all(handle, 0, None, &path);
        }
        let for_task = path.clone();
        self.blocking("read", &path, move |_| {
            Shared::read_all(handle, 0, None, &for_task)
        })
        .await
    }

    async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
        let path = self.shared.absolute(path);
        let handle = self.shared.open_for_read(&path)?;
        if handle.size.min(max_bytes as u64) <= INLINE_READ_LIMIT {
            return Shared::read_all(handle, 0, Some(max_bytes), &path);
        }
        let for_task = path.clone();
        self.blocking("read", &path, move |_| {
            Shared::read_all(handle, 0, Some(max_bytes), &for_task)
        })
        .await
    }

    async fn read_range(
        &self,
        path: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        let path = self.shared.absolute(path);
        let handle = self.shared.open_for_read(&path)?;
        let wanted = handle.size.saturating_sub(offset).min(max_bytes as u64);
        if wanted <= INLINE_READ_LIMIT {
            return Shared::read_all(handle, offset, Some(max_bytes), &path);
        }
        let for_task = path.clone();
        self.blocking("read", &path, move |_| {
            Shared::read_all(handle, offset, Some(max_bytes), &for_task)
        })
        .await
    }

    async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
        let path = self.shared.absolute(path);
        if data.len() <= INLINE_WRITE_LIMIT {
            return self.shared.write_file_sync(&path, data);
        }
        let data = data.to_vec();
        let for_task = path.clone();
        self.blocking("write", &path, move |shared| {
            shared.write_file_sync(&for_task, &data)
        })
        .await
    }

    async fn create_dir_all(&self, path: &Path) -> Result<(), FsError> {
        // A handful of metadata syscalls (none at all when the directory exists): inline.
        self.shared.create_dir_all_sync(&self.shared.absolute(path))
    }

    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
        self.shared.metadata_sync(&self.shared.absolute(path))
    }

    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        let path = self.shared.absolute(path);
        let for_task = path.clone();
        self.blocking("list", &path, move |shared| shared.read_dir_sync(&for_task))
            .await
    }

    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        self.shared.canonicalize_sync(&self.shared.absolute(path))
    }

    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        let (path, file) = self.shared.create_spill_file_sync()?;
        Ok((path, Box::new(tokio::fs::File::from_std(file))))
    }

    fn spill_dir(&self) -> Option<&Path> {
        Some(&self.shared.state.spill_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roots::open_root_dir;

    /// `name` in the directory `fd` is open on, replaced with `mode` and no owner change.
    fn target<'a>(
        fd: &'a OwnedFd,
        name: &'a str,
        mode: u32,
        replaces_file: bool,
    ) -> ReplaceTarget<'a> {
        ReplaceTarget {
            dir: fd.as_fd(),
            name: OsStr::new(name),
            mode,
            owner: None,
            replaces_file,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn failed_fill_removes_the_temp_file_and_keeps_the_target() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("target.txt"), b"original").unwrap();
        let fd = open_root_dir(dir.path()).unwrap();
        let target = target(&fd, "target.txt", 0o644, true);
        let err = write_replace(target, |file| {
            file.write_all(b"half of the new cont")?;
            Err(io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert_eq!(err.0, "write");
        assert_eq!(names(dir.path()), vec!["target.txt".to_string()]);
        assert_eq!(
            std::fs::read(dir.path().join("target.txt")).unwrap(),
            b"original"
        );
    }

    #[test]
    fn successful_replace_sets_mode_and_leaves_no_temp() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fd = open_root_dir(dir.path()).unwrap();
        let target = target(&fd, "new.txt", 0o640, false);
        write_replace(target, |file| file.write_all(b"hello")).unwrap();
        assert_eq!(names(dir.path()), vec!["new.txt".to_string()]);
        let meta = std::fs::metadata(dir.path().join("new.txt")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    }

    #[test]
    fn replacing_an_existing_file_swaps_in_a_new_inode_and_leaves_no_temp() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("target.txt"), b"old").unwrap();
        // A second name for the old inode: it must keep the old content.
        std::fs::hard_link(dir.path().join("target.txt"), dir.path().join("link.txt")).unwrap();
        let old_ino = std::fs::metadata(dir.path().join("target.txt"))
            .unwrap()
            .ino();
        let fd = open_root_dir(dir.path()).unwrap();
        let target = target(&fd, "target.txt", 0o644, true);
        write_replace(target, |file| file.write_all(b"new")).unwrap();
        assert_eq!(names(dir.path()), vec!["link.txt", "target.txt"]);
        assert_eq!(
            std::fs::read(dir.path().join("target.txt")).unwrap(),
            b"new"
        );
        assert_eq!(std::fs::read(dir.path().join("link.txt")).unwrap(), b"old");
        let meta = std::fs::metadata(dir.path().join("target.txt")).unwrap();
        assert_ne!(meta.ino(), old_ino);
        assert_eq!(meta.nlink(), 1);
        wait_for_writeback();
    }

    #[test]
    fn a_target_that_became_a_directory_is_put_back() {
        // Checked as a file, then replaced by a directory before the swap: the exchange must
        // not leave the directory under the temp name.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("target")).unwrap();
        std::fs::write(dir.path().join("target/inside.txt"), b"keep").unwrap();
        let fd = open_root_dir(dir.path()).unwrap();
        let target = target(&fd, "target", 0o644, true);
        let err = write_replace(target, |file| file.write_all(b"new")).unwrap_err();
        assert_eq!(err.0, "rename");
        assert_eq!(err.1.raw_os_error(), Some(Errno::EISDIR as i32));
        assert_eq!(names(dir.path()), vec!["target"]);
        assert_eq!(
            std::fs::read(dir.path().join("target/inside.txt")).unwrap(),
            b"keep"
        );
    }

    #[test]
    fn a_target_that_vanished_is_created_by_rename() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_root_dir(dir.path()).unwrap();
        let target = target(&fd, "gone.txt", 0o644, true);
        write_replace(target, |file| file.write_all(b"new")).unwrap();
        assert_eq!(names(dir.path()), vec!["gone.txt"]);
        assert_eq!(std::fs::read(dir.path().join("gone.txt")).unwrap(), b"new");
    }

    #[test]
    fn temp_names_are_hidden_unique_and_bounded() {
        let long = "é".repeat(100);
        let a = temp_name(OsStr::new(&long));
        let b = temp_name(OsStr::new(&long));
        assert_ne!(a, b);
        assert!(a.len() < 120, "{}", a.len());
        let text = a.to_str().expect("utf-8 kept");
        assert!(text.starts_with('.') && text.ends_with(".tmp"));
    }
}
