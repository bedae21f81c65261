//! [`FileOperations`] over SFTP: canonical paths from the server's `realpath`, confinement to
//! the remote root, extra roots and the spill directory judged on that canonical path
//! (`OutsideRoot`, `Denied`, `Protected`, read-only roots), atomic writes (a temporary file in
//! the target's directory, permission bits restored, `posix-rename@openssh.com` over the
//! target), and spill files written through SFTP into the per-root spill directory.
//!
//! Limits of an SFTP client: there is no `openat2`, so the check and the open are two steps; a
//! process on the remote host that swaps a path component for a symlink between them could
//! redirect one operation. The remote host and its account are the boundary; these checks make
//! the file tools behave like the local ones.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use cordon_ops::{BackendId, DirEntry, FileKind, FileMeta, FileOperations, FsError, SpillWriter};
use cordon_remote::file_ops::PipedSpill;
use cordon_remote::files::spill_file_name;
use futures::{FutureExt, StreamExt, TryStreamExt};
use russh_sftp::client::error::Error as SftpError;
use russh_sftp::protocol::{FileAttributes, FileType, OpenFlags, Packet, StatusCode};
use tokio::io::{AsyncReadExt, DuplexStream};
use tokio::sync::oneshot;

use crate::Inner;
use crate::conn::Live;

/// Bytes per SFTP read or write request (OpenSSH accepts up to 255 KiB).
const CHUNK: usize = 64 * 1024;
/// SFTP requests in flight for one transfer.
const PIPELINE: usize = 16;

/// How an SFTP failure maps onto the trait's errors.
fn sftp_error(op: &'static str, path: &Path, err: SftpError) -> FsError {
    let path = path.to_path_buf();
    match err {
        SftpError::Status(status) => match status.status_code {
            StatusCode::NoSuchFile => FsError::NotFound { path },
            StatusCode::PermissionDenied => FsError::PermissionDenied { path },
            StatusCode::NoConnection | StatusCode::ConnectionLost => FsError::Backend {
                op,
                path,
                reason: "the SSH connection was lost".to_owned(),
            },
            StatusCode::Ok
            | StatusCode::Eof
            | StatusCode::Failure
            | StatusCode::BadMessage
            | StatusCode::OpUnsupported => FsError::Io {
                op,
                path,
                source: std::io::Error::other(format!(
                    "{}: {}",
                    status.status_code, status.error_message
                )),
            },
        },
        other => FsError::Backend {
            op,
            path,
            reason: other.to_string(),
        },
    }
}

fn is_transport(err: &FsError) -> bool {
    matches!(err, FsError::Backend { .. })
}

/// A path as SFTP text.
fn text(op: &'static str, path: &Path) -> Result<String, FsError> {
    path.to_str().map(str::to_owned).ok_or_else(|| FsError::Io {
        op,
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "SFTP paths must be valid UTF-8",
        ),
    })
}

fn kind_of(attrs: &FileAttributes) -> FileKind {
    match attrs.file_type() {
        FileType::Dir => FileKind::Dir,
        FileType::File => FileKind::File,
        FileType::Symlink => FileKind::Symlink,
        FileType::Other => FileKind::Other,
    }
}

/// `string` as the SSH wire format encodes it.
fn ssh_string(out: &mut Vec<u8>, value: &str) {
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value.as_bytes());
}

impl Inner {
    async fn live_for(&self, op: &'static str, path: &Path) -> Result<Arc<Live>, FsError> {
        self.pool.live().await.map_err(|e| FsError::Backend {
            op,
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// Run an SFTP step; a transport failure forgets the connection so the next call
    /// reconnects.
    async fn step<T>(
        &self,
        live: &Live,
        result: Result<T, SftpError>,
        op: &'static str,
        path: &Path,
    ) -> Result<T, FsError> {
        match result {
            Ok(value) => Ok(value),
            Err(err) => {
                let err = sftp_error(op, path, err);
                if is_transport(&err) {
                    self.pool.invalidate(live).await;
                }
                Err(err)
            }
        }
    }

    /// The server's canonical path of `path`; a missing path is its canonical parent joined
    /// with the remaining components.
    async fn real_path(&self, live: &Live, path: &Path) -> Result<PathBuf, FsError> {
        if !path.is_absolute() {
            return Err(FsError::OutsideRoot {
                path: path.to_path_buf(),
            });
        }
        let mut missing: Vec<std::ffi::OsString> = Vec::new();
        let mut current = path.to_path_buf();
        loop {
            let name = text("resolve", &current)?;
            match live.sftp.realpath(name).await {
                Ok(reply) => {
                    let Some(first) = reply.files.first() else {
                        return Err(FsError::Backend {
                            op: "resolve",
                            path: path.to_path_buf(),
                            reason: "the SFTP server returned no path".to_owned(),
                        });
                    };
                    let mut resolved = PathBuf::from(&first.filename);
                    for part in missing.iter().rev() {
                        resolved.push(part);
                    }
                    return Ok(normalize(&resolved));
                }
                Err(err) => {
                    let err = sftp_error("resolve", path, err);
                    match err {
                        FsError::NotFound { .. } => {
                            let (Some(parent), Some(name)) =
                                (current.parent(), current.file_name())
                            else {
                                return Err(FsError::NotFound {
                                    path: path.to_path_buf(),
                                });
                            };
                            missing.push(name.to_owned());
                            current = parent.to_path_buf();
                        }
                        other => {
                            if is_transport(&other) {
                                self.pool.invalidate(live).await;
                            }
                            return Err(other);
                        }
                    }
                }
            }
        }
    }

    /// Canonical path, checked for reading.
    async fn readable(&self, live: &Live, path: &Path) -> Result<PathBuf, FsError> {
        let canonical = self.real_path(live, path).await?;
        self.rules
            .check_read(path, &canonical)
            .map_err(|e| match e {
                FsError::Denied { .. } => FsError::Denied {
                    path: canonical.clone(),
                },
                other => other,
            })?;
        Ok(canonical)
    }

    /// Canonical path, checked for writing.
    async fn writable(&self, live: &Live, path: &Path) -> Result<PathBuf, FsError> {
        let canonical = self.real_path(live, path).await?;
        self.rules.check_write(path, &canonical)?;
        Ok(canonical)
    }

    async fn read_impl(
        &self,
        path: &Path,
        start: u64,
        max: Option<usize>,
    ) -> Result<Vec<u8>, FsError> {
        let live = self.live_for("read", path).await?;
        let canonical = self.readable(&live, path).await?;
        let name = text("read", &canonical)?;
        let handle = self
            .step(
                &live,
                live.sftp
                    .open(name, OpenFlags::READ, FileAttributes::empty())
                    .await,
                "open",
                path,
            )
            .await?
            .handle;
        let result = self.read_open(&live, &handle, path, start, max).await;
        let closer = live.clone();
        tokio::spawn(async move {
            if let Err(error) = closer.sftp.close(handle).await {
                tracing::debug!(%error, "ssh: failed to close a file handle after a read");
            }
        });
        result
    }

    async fn read_open(
        &self,
        live: &Live,
        handle: &str,
        path: &Path,
        start: u64,
        max: Option<usize>,
    ) -> Result<Vec<u8>, FsError> {
        let attrs = self
            .step(live, live.sftp.fstat(handle).await, "stat", path)
            .await?
            .attrs;
        if attrs.is_dir() {
            return Err(FsError::IsADirectory {
                path: path.to_path_buf(),
            });
        }
        let limit = max.unwrap_or(usize::MAX);
        let size = usize::try_from(attrs.len().saturating_sub(start))
            .unwrap_or(usize::MAX)
            .min(limit);
        let mut data = Vec::with_capacity(size.min(64 << 20));
        // Pipelined reads of the size fstat reported, then sequential reads until EOF (the
        // file may have grown) or the limit.
        let offsets: Vec<u64> = (0..size.div_ceil(CHUNK))
            .map(|i| start + (i * CHUNK) as u64)
            .collect();
        let chunks: Vec<Vec<u8>> = futures::stream::iter(offsets.into_iter().map(|offset| {
            let len = CHUNK.min(size - (offset - start) as usize) as u32;
            async move { read_chunk(live, handle, offset, len).await }
        }))
        .buffered(PIPELINE)
        .try_collect()
        .await
        .map_err(|e| sftp_error("read", path, e))?;
        let mut short = false;
        for chunk in chunks {
            let expected = CHUNK.min(size - data.len());
            short |= chunk.len() < expected;
            data.extend_from_slice(&chunk);
            if short {
                break;
            }
        }
        while !short && data.len() < limit {
            let want = CHUNK.min(limit - data.len()) as u32;
            let chunk = read_chunk(live, handle, start + data.len() as u64, want)
                .await
                .map_err(|e| sftp_error("read", path, e))?;
            if chunk.is_empty() {
                break;
            }
            data.extend_from_slice(&chunk);
        }
        data.truncate(limit);
        Ok(data)
    }

    async fn write_impl(&self, path: PathBuf, data: Vec<u8>) -> Result<(), FsError> {
        let live = self.live_for("write", &path).await?;
        let canonical = self.writable(&live, &path).await?;
        let name = text("write", &canonical)?;
        let existing = match live.sftp.stat(name.clone()).await {
            Ok(attrs) => {
                if attrs.attrs.is_dir() {
                    return Err(FsError::IsADirectory { path });
                }
                // Judged as the unprivileged agent would be, whoever the SFTP server runs as
                // (the same rule as the local backend: a 0444 file is read-only even for root).
                let record = cordon_remote::files::StatRecord {
                    kind: kind_of(&attrs.attrs),
                    size: attrs.attrs.len(),
                    mode: attrs.attrs.permissions.unwrap_or(0) & 0o7777,
                    uid: attrs.attrs.uid.unwrap_or(u32::MAX),
                    gid: attrs.attrs.gid.unwrap_or(u32::MAX),
                };
                if !record.unprivileged_writable(self.identity.uid, &self.identity.gids) {
                    return Err(FsError::PermissionDenied { path });
                }
                attrs.attrs.permissions.map(|p| p & 0o7777)
            }
            Err(err) => match sftp_error("stat", &path, err) {
                FsError::NotFound { .. } => None,
                other => return Err(other),
            },
        };
        let (Some(parent), Some(file_name)) = (canonical.parent(), canonical.file_name()) else {
            return Err(FsError::IsADirectory { path });
        };
        let temp = parent.join(format!(
            ".{}.cordon-{:016x}.tmp",
            file_name.to_string_lossy(),
            fastrand::u64(..)
        ));
        let temp_name = text("write", &temp)?;
        let attrs = FileAttributes {
            permissions: Some(existing.unwrap_or(0o644)),
            ..FileAttributes::empty()
        };
        let opened = live
            .sftp
            .open(
                temp_name.clone(),
                OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUDE,
                attrs,
            )
            .await;
        let handle = match opened {
            Ok(handle) => handle.handle,
            Err(err) => {
                // A missing parent directory is reported for the target.
                let err = sftp_error("create", &path, err);
                if is_transport(&err) {
                    self.pool.invalidate(&live).await;
                }
                return Err(match err {
                    FsError::NotFound { .. } => self.missing_parent(&live, &path, parent).await,
                    other => self.explain_failure(&live, parent, other).await,
                });
            }
        };
        let result = self
            .fill_and_replace(&live, &handle, &temp_name, &name, existing, &data, &path)
            .await;
        match result {
            Ok(()) => Ok(()),
            Err(err) => {
                let err = self.explain_failure(&live, parent, err).await;
                if let Err(removal) = live.sftp.remove(temp_name.clone()).await {
                    tracing::warn!(temp = %temp_name, error = %removal, "failed to remove the temporary file of a failed write");
                }
                Err(err)
            }
        }
    }

    /// SFTP version 3 has no status for a full disk: OpenSSH's server answers a write that hit
    /// `ENOSPC` (or `EDQUOT`) with the generic `Failure`. When the file system of `dir` has no
    /// free block or inode left (`statvfs@openssh.com`), say `ENOSPC` instead; any other
    /// failure is returned as it is.
    async fn explain_failure(&self, live: &Live, dir: &Path, err: FsError) -> FsError {
        let FsError::Io { op, path, source } = err else {
            return err;
        };
        let generic = source.raw_os_error().is_none()
            && source
                .to_string()
                .starts_with(&StatusCode::Failure.to_string());
        if !generic || !live.extensions.statvfs {
            return FsError::Io { op, path, source };
        }
        let Ok(dir) = text("statvfs", dir) else {
            return FsError::Io { op, path, source };
        };
        match live.sftp.statvfs(dir).await {
            Ok(fs) if fs.blocks_avail == 0 || fs.inodes_avail == 0 => FsError::Io {
                op,
                path,
                source: std::io::Error::from_raw_os_error(28),
            },
            Ok(_) => FsError::Io { op, path, source },
            Err(error) => {
                tracing::debug!(%error, "statvfs after a failed write failed");
                FsError::Io { op, path, source }
            }
        }
    }

    async fn missing_parent(&self, live: &Live, path: &Path, parent: &Path) -> FsError {
        let Ok(parent_name) = text("stat", parent) else {
            return FsError::NotFound {
                path: path.to_path_buf(),
            };
        };
        match live.sftp.stat(parent_name).await {
            Ok(attrs) if !attrs.attrs.is_dir() => FsError::NotADirectory {
                path: parent.to_path_buf(),
            },
            _ => FsError::NotFound {
                path: path.to_path_buf(),
            },
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn fill_and_replace(
        &self,
        live: &Live,
        handle: &str,
        temp: &str,
        target: &str,
        existing_mode: Option<u32>,
        data: &[u8],
        path: &Path,
    ) -> Result<(), FsError> {
        let pieces: Vec<(u64, Vec<u8>)> = data
            .chunks(CHUNK)
            .enumerate()
            .map(|(i, chunk)| ((i * CHUNK) as u64, chunk.to_vec()))
            .collect();
        let writes = pieces
            .into_iter()
            .map(|(offset, chunk)| live.sftp.write(handle, offset, chunk));
        let written: Result<Vec<_>, SftpError> = futures::stream::iter(writes)
            .buffer_unordered(PIPELINE)
            .try_collect()
            .await;
        let written = written.map(|_| ());
        self.step(live, written, "write", path).await?;
        if let Some(mode) = existing_mode {
            // The server's umask applied at create; restore the exact bits.
            let attrs = FileAttributes {
                permissions: Some(mode),
                ..FileAttributes::empty()
            };
            self.step(live, live.sftp.fsetstat(handle, attrs).await, "chmod", path)
                .await?;
        }
        self.step(live, live.sftp.close(handle).await, "close", path)
            .await?;
        if live.extensions.posix_rename {
            let mut payload = Vec::new();
            ssh_string(&mut payload, temp);
            ssh_string(&mut payload, target);
            let reply = live
                .sftp
                .extended("posix-rename@openssh.com", payload)
                .await;
            let status = match reply {
                Ok(Packet::Status(status)) if status.status_code == StatusCode::Ok => Ok(()),
                Ok(Packet::Status(status)) => Err(SftpError::Status(status)),
                Ok(_) => Err(SftpError::UnexpectedPacket),
                Err(e) => Err(e),
            };
            self.step(live, status, "rename", path).await
        } else {
            // Plain SFTP rename refuses to replace an existing file: never fall back to a
            // non-atomic delete + rename.
            let renamed = live.sftp.rename(temp, target).await.map(|_| ());
            match self.step(live, renamed, "rename", path).await {
                Err(FsError::Io { .. }) if existing_mode.is_some() => Err(FsError::Io {
                    op: "rename",
                    path: path.to_path_buf(),
                    source: std::io::Error::other(
                        "the SFTP server lacks posix-rename@openssh.com, so the file cannot \
                         be replaced atomically",
                    ),
                }),
                other => other,
            }
        }
    }

    async fn list_impl(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        let live = self.live_for("list", path).await?;
        let canonical = self.readable(&live, path).await?;
        let name = text("list", &canonical)?;
        let handle = match live.sftp.opendir(name.clone()).await {
            Ok(handle) => handle.handle,
            Err(err) => {
                let err = sftp_error("list", path, err);
                return Err(match err {
                    // OpenSSH reports ENOTDIR as "no such file".
                    FsError::NotFound { .. } => match live.sftp.stat(name).await {
                        Ok(attrs) if !attrs.attrs.is_dir() => FsError::NotADirectory {
                            path: path.to_path_buf(),
                        },
                        _ => FsError::NotFound {
                            path: path.to_path_buf(),
                        },
                    },
                    other => {
                        if is_transport(&other) {
                            self.pool.invalidate(&live).await;
                        }
                        other
                    }
                });
            }
        };
        let mut raw = Vec::new();
        let listed = loop {
            match live.sftp.readdir(handle.as_str()).await {
                Ok(name) => raw.extend(name.files),
                Err(SftpError::Status(status)) if status.status_code == StatusCode::Eof => {
                    break Ok(());
                }
                Err(err) => break Err(err),
            }
        };
        if let Err(error) = live.sftp.close(handle).await {
            tracing::debug!(%error, path = %path.display(), "ssh: failed to close a directory handle");
        }
        self.step(&live, listed, "list", path).await?;
        let entries = raw
            .into_iter()
            .filter(|f| f.filename != "." && f.filename != "..")
            .map(|file| {
                let entry_path = canonical.join(&file.filename);
                let live = live.clone();
                async move {
                    let name = file.filename.clone();
                    if self.rules.is_denied(&entry_path) {
                        return DirEntry {
                            name,
                            kind: None,
                            error: Some("access denied by policy".into()),
                        };
                    }
                    let kind = match kind_of(&file.attrs) {
                        FileKind::Symlink => self.link_kind(&live, &entry_path).await,
                        other => Ok(other),
                    };
                    match kind {
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
                    }
                }
            });
        Ok(futures::stream::iter(entries)
            .buffered(PIPELINE)
            .collect()
            .await)
    }

    /// The kind of a listed symlink after following it (confined), or why it has none.
    async fn link_kind(&self, live: &Live, entry: &Path) -> Result<FileKind, String> {
        let target = match self.real_path(live, entry).await {
            Ok(target) => target,
            Err(FsError::NotFound { .. }) => {
                return Err("dangling symlink (its target does not exist)".into());
            }
            Err(other) => return Err(other.to_string()),
        };
        if self.rules.check_read(entry, &target).is_err() {
            if self.rules.is_denied(&target) {
                return Err("symlink points to a path denied by policy".into());
            }
            return Err("symlink points outside the allowed roots".into());
        }
        let name = text("stat", &target).map_err(|e| e.to_string())?;
        match live.sftp.stat(name).await {
            Ok(attrs) => Ok(kind_of(&attrs.attrs)),
            Err(err) => match sftp_error("stat", entry, err) {
                FsError::NotFound { .. } => {
                    Err("dangling symlink (its target does not exist)".into())
                }
                other => Err(other.to_string()),
            },
        }
    }

    async fn mkdir_impl(&self, path: &Path) -> Result<(), FsError> {
        let live = self.live_for("mkdir", path).await?;
        let canonical = self.writable(&live, path).await?;
        // Walk up to the first existing ancestor, then create downwards.
        let mut missing = Vec::new();
        let mut current = canonical.clone();
        loop {
            let name = text("mkdir", &current)?;
            match live.sftp.stat(name).await {
                Ok(attrs) if attrs.attrs.is_dir() => break,
                Ok(_) => {
                    return Err(if current == canonical {
                        FsError::Io {
                            op: "mkdir",
                            path: path.to_path_buf(),
                            source: std::io::Error::from_raw_os_error(17),
                        }
                    } else {
                        FsError::NotADirectory { path: current }
                    });
                }
                Err(err) => match sftp_error("mkdir", &current, err) {
                    FsError::NotFound { .. } => {
                        missing.push(current.clone());
                        match current.parent() {
                            Some(parent) => current = parent.to_path_buf(),
                            None => break,
                        }
                    }
                    other => {
                        if is_transport(&other) {
                            self.pool.invalidate(&live).await;
                        }
                        return Err(other);
                    }
                },
            }
        }
        for dir in missing.into_iter().rev() {
            let name = text("mkdir", &dir)?;
            if let Err(err) = live.sftp.mkdir(name.clone(), FileAttributes::empty()).await {
                // Lost a race with another creator: fine if it is a directory now.
                match live.sftp.stat(name).await {
                    Ok(attrs) if attrs.attrs.is_dir() => {}
                    _ => return self.step(&live, Err(err), "mkdir", &dir).await,
                }
            }
        }
        Ok(())
    }

    async fn metadata_impl(&self, path: &Path) -> Result<FileMeta, FsError> {
        let live = self.live_for("stat", path).await?;
        let canonical = self.readable(&live, path).await?;
        let name = text("stat", &canonical)?;
        let attrs = self
            .step(&live, live.sftp.stat(name).await, "stat", path)
            .await?
            .attrs;
        let mode = attrs.permissions.unwrap_or(0) & 0o7777;
        let record = cordon_remote::files::StatRecord {
            kind: kind_of(&attrs),
            size: attrs.len(),
            mode,
            uid: attrs.uid.unwrap_or(u32::MAX),
            gid: attrs.gid.unwrap_or(u32::MAX),
        };
        Ok(FileMeta {
            kind: record.kind,
            size: record.size,
            mode,
            writable: self.rules.allows_write(&canonical)
                && record.unprivileged_writable(self.identity.uid, &self.identity.gids),
        })
    }

    async fn spill_impl(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        let path = self.spill_dir.join(spill_file_name());
        let live = self.live_for("create", &path).await?;
        let name = text("create", &path)?;
        let attrs = FileAttributes {
            permissions: Some(0o600),
            ..FileAttributes::empty()
        };
        let flags = OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUDE;
        let mut opened = live.sftp.open(name.clone(), flags, attrs.clone()).await;
        if let Err(SftpError::Status(status)) = &opened
            && status.status_code == StatusCode::NoSuchFile
        {
            // Another session's sweep removed this root's directory after a day without a
            // spill: make it again (0700, inside our own 0700 spill directory).
            let dir = text("create", &self.spill_dir)?;
            let mode = FileAttributes {
                permissions: Some(0o700),
                ..FileAttributes::empty()
            };
            if live.sftp.mkdir(dir, mode).await.is_ok() {
                tracing::info!(dir = %self.spill_dir.display(), "recreated the remote spill directory");
            }
            opened = live.sftp.open(name, flags, attrs).await;
        }
        let handle = self.step(&live, opened, "create", &path).await?.handle;
        let (writer, reader) = tokio::io::duplex(4 * CHUNK);
        let (done_tx, done_rx) = oneshot::channel();
        tokio::spawn(async move {
            let result = pump_spill(&live, &handle, reader).await;
            let closed = live.sftp.close(handle).await.map(|_| ());
            // The writer's owner stopped waiting (the call ended): nobody is left to tell.
            let _ = done_tx.send(result.and(closed.map_err(|e| e.to_string())));
        });
        Ok((
            path,
            // Shutdown waits until everything is on the remote disk and the file is closed.
            Box::new(PipedSpill::new(
                writer,
                done_rx.map(|result| match result {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(reason)) => Err(std::io::Error::other(format!(
                        "failed to write the spill file: {reason}"
                    ))),
                    Err(_) => Err(std::io::Error::other(
                        "failed to write the spill file: the writer task ended",
                    )),
                }),
            )),
        ))
    }
}

async fn read_chunk(
    live: &Live,
    handle: &str,
    offset: u64,
    len: u32,
) -> Result<Vec<u8>, SftpError> {
    match live.sftp.read(handle, offset, len).await {
        Ok(data) => Ok(data.data),
        Err(SftpError::Status(status)) if status.status_code == StatusCode::Eof => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Copy what the spill writer receives into the remote file, in order.
async fn pump_spill(live: &Live, handle: &str, mut reader: DuplexStream) -> Result<(), String> {
    let mut offset = 0u64;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = reader.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        live.sftp
            .write(handle, offset, buf[..n].to_vec())
            .await
            .map_err(|e| e.to_string())?;
        offset += n as u64;
    }
}

/// Collapse `.` and `..` lexically (the server already resolved symlinks).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[async_trait]
impl FileOperations for Inner {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn home(&self) -> Option<&Path> {
        self.identity.home.as_deref()
    }

    fn spill_dir(&self) -> Option<&Path> {
        Some(&self.spill_dir)
    }

    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        self.read_impl(path, 0, None).await
    }

    async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
        self.read_impl(path, 0, Some(max_bytes)).await
    }

    async fn read_range(
        &self,
        path: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        self.read_impl(path, offset, Some(max_bytes)).await
    }

    async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
        // A task of its own: a caller that stops waiting never leaves a temporary file behind.
        let this = self.this();
        let path = path.to_path_buf();
        let data = data.to_vec();
        let task = tokio::spawn(async move { this.write_impl(path, data).await });
        match task.await {
            Ok(result) => result,
            Err(e) => Err(FsError::Io {
                op: "write",
                path: PathBuf::new(),
                source: std::io::Error::other(e.to_string()),
            }),
        }
    }

    async fn create_dir_all(&self, path: &Path) -> Result<(), FsError> {
        self.mkdir_impl(path).await
    }

    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
        self.metadata_impl(path).await
    }

    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        self.list_impl(path).await
    }

    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        let live = self.live_for("resolve", path).await?;
        let canonical = self.real_path(&live, path).await?;
        if self.rules.is_denied(&canonical) {
            return Err(FsError::Denied { path: canonical });
        }
        if !self
            .rules
            .roots()
            .iter()
            .any(|root| canonical.starts_with(&root.path))
        {
            return Err(FsError::OutsideRoot {
                path: path.to_path_buf(),
            });
        }
        Ok(canonical)
    }

    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        self.spill_impl().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_string_encoding() {
        let mut out = Vec::new();
        ssh_string(&mut out, "ab");
        assert_eq!(out, vec![0, 0, 0, 2, b'a', b'b']);
    }

    #[test]
    fn normalize_collapses_dots() {
        assert_eq!(normalize(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
    }
}
