//! The audit log file: one JSON line per decision and per finished call, each carrying the
//! SHA-256 of the previous line. The chain itself, and the error type both use
//! (`cordon_policy::audit::AuditError`), are `cordon-policy`'s; this module owns the file:
//!
//! - it is opened once per session without following a symlink and without blocking on a
//!   FIFO, must be a regular file of the current user (or root) that group and others cannot
//!   write, and is locked (`flock`) so two sessions cannot interleave their chains;
//! - before each append it checks the file is still the one it opened and has the length it
//!   left it at (one `lstat` of the path, one `fstat` of the descriptor): a replaced,
//!   truncated or appended-to log refuses this and every later record;
//! - a failed append (a full disk) is cut back to the length before it, so no torn line ever
//!   stays in the chain; if even that fails the log is poisoned and refuses every later
//!   record;
//! - at the end of the session ([`AuditLog::finish`]) the head (hash of the last line and the
//!   line count) is written to `FILE.head`, for `cordon audit verify --head-file`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cordon_core::hostfile::{self, WriteMode};
use cordon_policy::audit::{AuditError, AuditHead, AuditRecord, GENESIS, audit_line, sha256_hex};

/// An append-only, hash-chained audit log, held open for the session.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    state: Mutex<Chain>,
}

#[derive(Debug)]
struct Chain {
    file: File,
    /// `(st_dev, st_ino)` of the opened file.
    id: (u64, u64),
    /// The length the file must have: everything this session wrote, nothing else.
    len: u64,
    /// Lines in the file.
    lines: usize,
    /// Hash of the last line.
    prev: String,
    /// Set once the log can no longer be trusted; every later append fails with it.
    poisoned: Option<String>,
}

/// The head file next to an audit log: `FILE.head`.
pub fn head_file_path(log: &Path) -> PathBuf {
    let mut name = log.file_name().unwrap_or_default().to_os_string();
    name.push(".head");
    log.with_file_name(name)
}

impl AuditLog {
    /// Open (or create, mode 0600) `path` for appending; an existing file's last line
    /// continues the chain.
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        let mut file = hostfile::open_write(path, WriteMode::Append).map_err(AuditError::Open)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(AuditError::Busy {
                    path: path.to_owned(),
                });
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(AuditError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        }
        let read_err = |source| AuditError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = file.metadata().map_err(read_err)?;
        let (lines, last) = scan(&mut file).map_err(read_err)?;
        let prev = match last {
            Scanned::Empty => GENESIS.to_owned(),
            Scanned::Last(line) => sha256_hex(&line),
            Scanned::Torn => {
                return Err(AuditError::Torn {
                    path: path.to_owned(),
                });
            }
        };
        Ok(AuditLog {
            path: path.to_path_buf(),
            state: Mutex::new(Chain {
                file,
                id: (meta.dev(), meta.ino()),
                len: meta.len(),
                lines,
                prev,
                poisoned: None,
            }),
        })
    }

    /// The file this log writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Chain> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current head: the hash of the last line and the number of lines.
    pub fn head(&self) -> AuditHead {
        let chain = self.lock();
        AuditHead {
            sha256: chain.prev.clone(),
            lines: chain.lines,
        }
    }

    /// Append one record (and the decision's `unanalysable` flag, if any). Returns only once
    /// the whole line is in the file; otherwise the file is as it was before the call.
    pub fn append(
        &self,
        record: &AuditRecord,
        unanalysable: Option<&str>,
    ) -> Result<(), AuditError> {
        let mut chain = self.lock();
        if let Some(reason) = &chain.poisoned {
            return Err(self.poisoned(reason.clone()));
        }
        if let Some(reason) = self.tampered(&chain) {
            chain.poisoned = Some(reason.clone());
            return Err(self.poisoned(reason));
        }
        let line = audit_line(record, &chain.prev, unanalysable);
        let mut bytes = line.text.into_bytes();
        bytes.push(b'\n');
        if let Err(source) = chain.file.write_all(&bytes) {
            // A partial line (a full disk) must not stay: later lines would be glued to it.
            let before = chain.len;
            if let Err(cut) = chain.file.set_len(before) {
                chain.poisoned = Some(format!(
                    "a write failed ({source}) and the partial line could not be removed ({cut})"
                ));
            }
            return Err(AuditError::Write {
                path: self.path.clone(),
                source,
            });
        }
        chain.len += u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        chain.lines += 1;
        chain.prev = line.sha256;
        Ok(())
    }

    /// Why the file at the path is no longer the log this session writes, if it is not.
    fn tampered(&self, chain: &Chain) -> Option<String> {
        let at_path = match std::fs::symlink_metadata(&self.path) {
            Ok(meta) => meta,
            Err(error) => return Some(format!("the file at its path is gone ({error})")),
        };
        if (at_path.dev(), at_path.ino()) != chain.id {
            return Some("the file at its path was replaced".to_owned());
        }
        match chain.file.metadata() {
            Ok(held) if held.len() == chain.len => None,
            Ok(held) => Some(format!(
                "its length changed behind this session's back ({} bytes expected, {} found)",
                chain.len,
                held.len()
            )),
            Err(error) => Some(format!("it cannot be inspected ({error})")),
        }
    }

    fn poisoned(&self, reason: String) -> AuditError {
        AuditError::Poisoned {
            path: self.path.clone(),
            reason,
        }
    }

    /// End of the session: write the head to [`head_file_path`] (replacing its content) and
    /// return it. A log that was poisoned gets no head file: its last good head is not the
    /// file's.
    pub fn finish(&self) -> Result<AuditHead, AuditError> {
        let chain = self.lock();
        if let Some(reason) = &chain.poisoned {
            return Err(self.poisoned(reason.clone()));
        }
        chain.file.sync_data().map_err(|source| AuditError::Write {
            path: self.path.clone(),
            source,
        })?;
        let head = AuditHead {
            sha256: chain.prev.clone(),
            lines: chain.lines,
        };
        let path = head_file_path(&self.path);
        let mut file =
            hostfile::open_write(&path, WriteMode::Truncate).map_err(AuditError::Head)?;
        file.write_all(head.to_line().as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|source| AuditError::HeadWrite {
                path: path.clone(),
                source,
            })?;
        Ok(head)
    }
}

enum Scanned {
    Empty,
    Last(Vec<u8>),
    Torn,
}

/// Count the lines of the open log and find its last one, reading through the descriptor
/// (never the path again).
fn scan(file: &mut File) -> std::io::Result<(usize, Scanned)> {
    file.seek(SeekFrom::Start(0))?;
    let mut lines = 0;
    let mut current = Vec::new();
    let mut last = None;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        for chunk in buffer[..read].split_inclusive(|&b| b == b'\n') {
            match chunk.split_last() {
                Some((b'\n', body)) => {
                    current.extend_from_slice(body);
                    lines += 1;
                    last = Some(std::mem::take(&mut current));
                }
                _ => current.extend_from_slice(chunk),
            }
        }
    }
    let scanned = match (current.is_empty(), last) {
        (false, _) => Scanned::Torn,
        (true, None) => Scanned::Empty,
        (true, Some(line)) => Scanned::Last(line),
    };
    Ok((lines, scanned))
}

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;
