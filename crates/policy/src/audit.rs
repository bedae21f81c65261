//! The audit log (docs/contract.md#audit-log) as pure functions: build the next JSON line of the
//! hash chain and verify a whole log, and the one error type of the audit log ([`AuditError`]).
//! The runtime does the file I/O (append + flush per line).
//!
//! Each line is one JSON object, keys in this order: `ts`, `backend`, `toolCallId`, `tool`,
//! `argsSha256`, `decision`, `rule`, `reason`, `isError`, `durationMs`, `prev`, and, only when
//! set, the extensions `unanalysable`, `egress` (a finished bash call's connection attempts
//! through the egress proxy) and `egressOmitted` (how many more it made than are listed). `prev` is the hex SHA-256 of the previous line's exact
//! bytes (without its `\n`); the first line's `prev` is [`GENESIS`] (64 zeros). Every line
//! ends with `\n`, so a file whose last line lacks it was truncated.
//!
//! A chain detects a removed, altered, inserted or reordered line and a truncated last line.
//! Removing whole lines from the END leaves a valid shorter chain: keep the head hash
//! ([`AuditReport::head`]) somewhere else and pass it to [`verify_audit_log_with_head`].

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use cordon_core::hostfile::HostFileError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::decision::Decision;

/// `prev` of the first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One audit record: a decision (`isError`/`durationMs` null) or a finished call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// RFC 3339 UTC timestamp ([`rfc3339_utc`]).
    pub ts: String,
    /// Backend id (`local:/path`, `docker:…`, `ssh:host`).
    pub backend: String,
    /// The model's call id.
    pub tool_call_id: String,
    /// Tool name.
    pub tool: String,
    /// [`args_sha256`] of the call's arguments (the arguments themselves are not logged).
    pub args_sha256: String,
    /// The policy decision.
    pub decision: Decision,
    /// The rule that decided (`FILE:LINE`).
    pub rule: String,
    /// The decision's reason.
    pub reason: String,
    /// For finished calls: whether the result was an error; `null` on decision lines.
    pub is_error: Option<bool>,
    /// For finished calls: wall time in milliseconds; `null` on decision lines.
    pub duration_ms: Option<u64>,
    /// For a finished bash call in filtered network mode: each connection attempt through the
    /// egress proxy (destination, outcome, deciding entry and `FILE:LINE`, bytes each way,
    /// duration). Written after `prev`, only when not empty.
    #[serde(default, skip_serializing)]
    pub egress: Vec<cordon_ops::EgressRecord>,
    /// Attempts the call made beyond those in `egress` (the result keeps a bounded number).
    /// Written after `prev`, only when not zero.
    #[serde(default, skip_serializing)]
    pub egress_omitted: u64,
}

/// The serialised line, with `prev` and the extension field.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Line<'a> {
    #[serde(flatten)]
    record: &'a AuditRecord,
    prev: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    unanalysable: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    egress: &'a [cordon_ops::EgressRecord],
    #[serde(skip_serializing_if = "is_zero")]
    egress_omitted: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// A built line and the hash the next line must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditLine {
    /// The JSON text, without the trailing newline (append it when writing).
    pub text: String,
    /// Hex SHA-256 of `text`.
    pub sha256: String,
}

/// Build the line that follows a line whose hash is `prev` ([`GENESIS`] for the first).
/// `unanalysable` is the decision's flag, written only when present.
pub fn audit_line(record: &AuditRecord, prev: &str, unanalysable: Option<&str>) -> AuditLine {
    let line = Line {
        record,
        prev,
        unanalysable,
        egress: &record.egress,
        egress_omitted: record.egress_omitted,
    };
    let text = serde_json::to_string(&line).expect("audit records always serialise");
    let sha256 = sha256_hex(text.as_bytes());
    AuditLine { text, sha256 }
}

/// Hex SHA-256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Hex SHA-256 of the arguments' compact JSON (object keys sorted, as `serde_json` orders
/// them), so equal arguments hash equally.
pub fn args_sha256(args: &Value) -> String {
    sha256_hex(serde_json::to_string(args).unwrap_or_default().as_bytes())
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-05-01T12:00:00.123Z`.
pub fn rfc3339_utc(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let millis = since.subsec_millis();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60
    )
}

/// A verified log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditReport {
    /// Number of lines.
    pub lines: usize,
    /// Hash of the last line ([`GENESIS`] for an empty log): what the next line's `prev` is.
    pub head: String,
}

impl AuditReport {
    /// The text `cordon audit verify` prints on success.
    pub fn to_text(&self) -> String {
        format!("ok: {} lines, chain intact, head {}", self.lines, self.head)
    }
}

/// Why a log does not verify.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuditProblem {
    /// The line is not a JSON object.
    #[error("the line is not a JSON object: {0}")]
    NotJson(String),
    /// The line has no string `prev`.
    #[error("the line has no `prev` hash")]
    MissingPrev,
    /// `prev` does not match the previous line.
    #[error(
        "`prev` is {found} but the previous line hashes to {expected}: a line before it was removed, altered, inserted or moved"
    )]
    BrokenChain {
        /// Hash of the previous line (or the genesis).
        expected: String,
        /// What the line carries.
        found: String,
    },
    /// The file does not end with a newline.
    #[error("the last line is not terminated by a newline: the log was truncated")]
    Truncated,
    /// An empty line inside the log.
    #[error("empty line")]
    EmptyLine,
    /// The recorded head is not the hash of any line of the log.
    #[error(
        "the recorded head {expected} is not in this log: the log was truncated, replaced or re-chained since that head was recorded"
    )]
    HeadNotFound {
        /// The recorded head.
        expected: String,
    },
    /// The recorded head is in the log, but not after the number of lines recorded with it.
    #[error(
        "the recorded head {head} was recorded after {expected} lines but is line {found} of this log: lines before it were removed or inserted"
    )]
    HeadPosition {
        /// The recorded head.
        head: String,
        /// The line count recorded with it.
        expected: usize,
        /// Its position in this log.
        found: usize,
    },
    /// The chain is intact but ends before the expected head.
    #[error(
        "the log ends at head {found} but {expected} was expected: lines were removed from the end"
    )]
    HeadMismatch {
        /// The head the caller expected.
        expected: String,
        /// The head of the file.
        found: String,
    },
}

/// Why an audit log does not verify, or could not be opened or written. The chain is this
/// module's; the file is the runtime's (`AuditLog`), which reports its failures with the same
/// type.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The first bad line of a log.
    #[error("line {line}: {problem}")]
    Chain {
        /// 1-based line number (for `HeadMismatch`, the number of lines + 1).
        line: usize,
        /// What is wrong with it.
        problem: AuditProblem,
    },
    /// Opening the file safely failed (symlink, FIFO, owner, mode, …).
    #[error("failed to open the audit log: {0}")]
    Open(#[source] HostFileError),
    /// Reading the existing file (to continue its chain) failed.
    #[error("failed to read audit log {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The existing file ends in the middle of a line.
    #[error(
        "failed to continue audit log {path}: its last line is incomplete; check it with `cordon audit verify` and use a new file"
    )]
    Torn {
        /// The file.
        path: PathBuf,
    },
    /// Another session holds the file.
    #[error(
        "failed to lock audit log {path}: another cordon session is writing it; give each session its own file"
    )]
    Busy {
        /// The file.
        path: PathBuf,
    },
    /// Appending a line failed; the file was cut back to its length before the write.
    #[error("failed to write audit log {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The log was replaced, truncated or written by someone else during the session, or a
    /// failed write could not be undone: nothing more is recorded (and so nothing more runs).
    #[error(
        "failed to append to audit log {path}: {reason}; no further calls run in this session, restart it with a fresh audit log and check this one with `cordon audit verify`"
    )]
    Poisoned {
        /// The file.
        path: PathBuf,
        /// What happened.
        reason: String,
    },
    /// Writing the head file failed.
    #[error("failed to write the audit head file: {0}")]
    Head(#[source] HostFileError),
    /// Writing the head file's content failed.
    #[error("failed to write the audit head file {path}: {source}")]
    HeadWrite {
        /// The head file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Verify a whole log's text: every line's `prev` must be the hash of the line before it.
pub fn verify_audit_log(text: &str) -> Result<AuditReport, AuditError> {
    let mut expected = GENESIS.to_owned();
    let mut count = 0;
    if text.is_empty() {
        return Ok(AuditReport {
            lines: 0,
            head: expected,
        });
    }
    let terminated = text.ends_with('\n');
    let body = text.strip_suffix('\n').unwrap_or(text);
    let lines: Vec<&str> = body.split('\n').collect();
    let last = lines.len();
    for (index, line) in lines.iter().enumerate() {
        let number = index + 1;
        let fail = |problem| AuditError::Chain {
            line: number,
            problem,
        };
        if number == last && !terminated {
            return Err(fail(AuditProblem::Truncated));
        }
        if line.is_empty() {
            return Err(fail(AuditProblem::EmptyLine));
        }
        let value: Value = serde_json::from_str(line)
            .map_err(|error| fail(AuditProblem::NotJson(error.to_string())))?;
        let Value::Object(object) = value else {
            return Err(fail(AuditProblem::NotJson("not an object".to_owned())));
        };
        let Some(prev) = object.get("prev").and_then(Value::as_str) else {
            return Err(fail(AuditProblem::MissingPrev));
        };
        if prev != expected {
            return Err(fail(AuditProblem::BrokenChain {
                expected,
                found: prev.to_owned(),
            }));
        }
        expected = sha256_hex(line.as_bytes());
        count += 1;
    }
    Ok(AuditReport {
        lines: count,
        head: expected,
    })
}

/// [`verify_audit_log`], and the last line must hash to `head` (detects lines removed from
/// the end, given a head kept elsewhere).
pub fn verify_audit_log_with_head(text: &str, head: &str) -> Result<AuditReport, AuditError> {
    let report = verify_audit_log(text)?;
    if report.head != head {
        return Err(AuditError::Chain {
            line: report.lines + 1,
            problem: AuditProblem::HeadMismatch {
                expected: head.to_owned(),
                found: report.head,
            },
        });
    }
    Ok(report)
}

/// The head of a log as recorded outside the sandbox's reach at the end of a session: the
/// hash of the last line and the number of lines ([`GENESIS`] and 0 for an empty log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditHead {
    /// Hex SHA-256 of the last line.
    pub sha256: String,
    /// Number of lines up to and including it.
    pub lines: usize,
}

impl AuditHead {
    /// The head file's content: `SHA256 LINES` and a newline.
    pub fn to_line(&self) -> String {
        format!("{} {}\n", self.sha256, self.lines)
    }

    /// Parse a head file's content (see [`AuditHead::to_line`]).
    pub fn parse(text: &str) -> Option<AuditHead> {
        let mut words = text.split_ascii_whitespace();
        let sha256 = words.next()?;
        let lines = words.next()?.parse().ok()?;
        let hex = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit());
        (hex && words.next().is_none()).then(|| AuditHead {
            sha256: sha256.to_ascii_lowercase(),
            lines,
        })
    }
}

/// A verified log that contains a recorded head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadReport {
    /// The whole log.
    pub report: AuditReport,
    /// The line the recorded head hashes (0 for [`GENESIS`]).
    pub head_line: usize,
}

impl HeadReport {
    /// The text `cordon audit verify --expect-head` prints on success.
    pub fn to_text(&self) -> String {
        format!(
            "{}; the recorded head is line {}, {} lines follow it",
            self.report.to_text(),
            self.head_line,
            self.report.lines - self.head_line
        )
    }
}

/// [`verify_audit_log`], and `head` (a hash, with the line count recorded with it if known)
/// must be the hash of one of the log's lines — at that line count when one is given. Lines
/// appended after the head are reported, not refused: a later session continues the log.
/// Truncating the log before the head, replacing it, or re-chaining it (recomputing every
/// `prev` after removing lines) is caught: no line then hashes to the recorded head.
pub fn verify_audit_log_from_head(
    text: &str,
    head: &str,
    lines: Option<usize>,
) -> Result<HeadReport, AuditError> {
    let report = verify_audit_log(text)?;
    let head = head.to_ascii_lowercase();
    let found = if head == GENESIS {
        Some(0)
    } else {
        text.split_terminator('\n')
            .position(|line| sha256_hex(line.as_bytes()) == head)
            .map(|index| index + 1)
    };
    let Some(found) = found else {
        return Err(AuditError::Chain {
            line: report.lines + 1,
            problem: AuditProblem::HeadNotFound { expected: head },
        });
    };
    if let Some(expected) = lines
        && expected != found
    {
        return Err(AuditError::Chain {
            line: found,
            problem: AuditProblem::HeadPosition {
                head,
                expected,
                found,
            },
        });
    }
    Ok(HeadReport {
        report,
        head_line: found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain_problem(error: AuditError) -> AuditProblem {
        match error {
            AuditError::Chain { problem, .. } => problem,
            other => panic!("not a chain error: {other}"),
        }
    }
    use std::time::Duration;

    fn chain(records: usize) -> (String, Vec<String>) {
        let mut prev = GENESIS.to_owned();
        let mut text = String::new();
        let mut heads = Vec::new();
        for index in 0..records {
            let record = AuditRecord {
                ts: "2026-01-01T00:00:00.000Z".into(),
                backend: "local:/ws".into(),
                tool_call_id: format!("c{index}"),
                tool: "bash".into(),
                args_sha256: "0".repeat(64),
                decision: Decision::Allow,
                rule: "p:1".into(),
                reason: "ok".into(),
                is_error: None,
                duration_ms: None,
                egress: Vec::new(),
                egress_omitted: 0,
            };
            let line = audit_line(&record, &prev, None);
            text.push_str(&line.text);
            text.push('\n');
            prev = line.sha256.clone();
            heads.push(line.sha256);
        }
        (text, heads)
    }

    #[test]
    fn a_recorded_head_must_be_in_the_log_at_its_line() {
        let (text, heads) = chain(4);
        let report = verify_audit_log_from_head(&text, &heads[1], Some(2)).unwrap();
        assert_eq!(report.head_line, 2);
        assert!(
            report.to_text().ends_with("2 lines follow it"),
            "{}",
            report.to_text()
        );
        assert_eq!(
            verify_audit_log_from_head(&text, GENESIS, Some(0))
                .unwrap()
                .head_line,
            0
        );
        let wrong_place = verify_audit_log_from_head(&text, &heads[1], Some(3)).unwrap_err();
        assert!(matches!(
            chain_problem(wrong_place),
            AuditProblem::HeadPosition { .. }
        ));
        // Truncated before the head: a valid chain that no longer holds it.
        let (short, _) = chain(1);
        let truncated = verify_audit_log_from_head(&short, &heads[3], None).unwrap_err();
        assert!(matches!(
            chain_problem(truncated),
            AuditProblem::HeadNotFound { .. }
        ));
    }

    #[test]
    fn a_rechained_log_does_not_contain_the_recorded_head() {
        let (text, heads) = chain(3);
        // Drop the middle line and recompute every `prev` after it: the chain is intact.
        let mut lines: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        lines.remove(1);
        let mut prev = GENESIS.to_owned();
        let mut forged = String::new();
        for mut line in lines {
            line["prev"] = Value::String(prev.clone());
            let text = serde_json::to_string(&line).unwrap();
            prev = sha256_hex(text.as_bytes());
            forged.push_str(&text);
            forged.push('\n');
        }
        verify_audit_log(&forged).expect("a re-chained log has an intact chain");
        let error = verify_audit_log_from_head(&forged, &heads[2], Some(3)).unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(chain_problem(error), AuditProblem::HeadNotFound { .. }),
            "{text}"
        );
    }

    #[test]
    fn head_lines_round_trip() {
        let head = AuditHead {
            sha256: "ab".repeat(32),
            lines: 7,
        };
        assert_eq!(AuditHead::parse(&head.to_line()), Some(head));
        assert_eq!(AuditHead::parse("xyz 7\n"), None);
        assert_eq!(AuditHead::parse(&format!("{} 7 8", "ab".repeat(32))), None);
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_millis(951_782_400_123); // 2000-02-29
        assert_eq!(rfc3339_utc(leap), "2000-02-29T00:00:00.123Z");
        let later = UNIX_EPOCH + Duration::from_secs(1_777_636_800 + 3_661);
        assert_eq!(rfc3339_utc(later), "2026-05-01T13:01:01.000Z");
    }

    #[test]
    fn args_hash_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":2,"b":1}"#).unwrap();
        assert_eq!(args_sha256(&a), args_sha256(&b));
        assert_eq!(args_sha256(&a).len(), 64);
    }
}
