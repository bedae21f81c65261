//! The audit log file (CONTRACT §4): one JSON line per decision and per finished call, each
//! carrying the SHA-256 of the previous line. The chain itself is `cordon-policy`'s; this
//! module owns the file: appending (continuing the chain of an existing file) and flushing
//! each line before the call goes on.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cordon_policy::audit::{AuditRecord, GENESIS, audit_line, sha256_hex};

/// Why the audit log could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// Opening or reading the existing file failed.
    #[error("failed to open audit log {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Appending a line failed.
    #[error("failed to write audit log {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// An append-only, hash-chained audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    state: Mutex<Chain>,
}

#[derive(Debug)]
struct Chain {
    file: File,
    prev: String,
}

impl AuditLog {
    /// Open (or create) `path` for appending; an existing file's last line continues the chain.
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        let open_err = |source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        };
        let prev = match File::open(path) {
            Ok(file) => {
                let mut last = None;
                for line in BufReader::new(file).lines() {
                    let line = line.map_err(open_err)?;
                    if !line.is_empty() {
                        last = Some(line);
                    }
                }
                last.map_or_else(|| GENESIS.to_owned(), |line| sha256_hex(line.as_bytes()))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => GENESIS.to_owned(),
            Err(error) => return Err(open_err(error)),
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(open_err)?;
        Ok(AuditLog {
            path: path.to_path_buf(),
            state: Mutex::new(Chain { file, prev }),
        })
    }

    /// The file this log writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one record (and the decision's `unanalysable` flag, if any).
    pub fn append(
        &self,
        record: &AuditRecord,
        unanalysable: Option<&str>,
    ) -> Result<(), AuditError> {
        let mut chain = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let line = audit_line(record, &chain.prev, unanalysable);
        let mut bytes = line.text.into_bytes();
        bytes.push(b'\n');
        chain
            .file
            .write_all(&bytes)
            .and_then(|()| chain.file.flush())
            .map_err(|source| AuditError::Write {
                path: self.path.clone(),
                source,
            })?;
        chain.prev = line.sha256;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_policy::Decision;
    use cordon_policy::audit::verify_audit_log;

    fn record(id: &str) -> AuditRecord {
        AuditRecord {
            ts: "2026-01-01T00:00:00.000Z".into(),
            backend: "local:/ws".into(),
            tool_call_id: id.into(),
            tool: "read".into(),
            args_sha256: "0".repeat(64),
            decision: Decision::Allow,
            rule: "builtin:default.toml:1".into(),
            reason: "allowed".into(),
            is_error: None,
            duration_ms: None,
        }
    }

    #[test]
    fn reopening_continues_the_chain() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        AuditLog::open(&path)
            .unwrap()
            .append(&record("a"), None)
            .unwrap();
        let log = AuditLog::open(&path).unwrap();
        log.append(&record("b"), Some("eval")).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        verify_audit_log(&text).expect("chain continues across sessions");
    }
}
