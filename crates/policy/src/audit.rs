//! The audit log (CONTRACT §4) as pure functions: build the next JSON line of the hash chain
//! and verify a whole log. The runtime does the file I/O (append + flush per line).
//!
//! Each line is one JSON object, keys in this order: `ts`, `backend`, `toolCallId`, `tool`,
//! `argsSha256`, `decision`, `rule`, `reason`, `isError`, `durationMs`, `prev`, and, only when
//! set, the extension `unanalysable`. `prev` is the hex SHA-256 of the previous line's exact
//! bytes (without its `\n`); the first line's `prev` is [`GENESIS`] (64 zeros). Every line
//! ends with `\n`, so a file whose last line lacks it was truncated.
//!
//! A chain detects a removed, altered, inserted or reordered line and a truncated last line.
//! Removing whole lines from the END leaves a valid shorter chain: keep the head hash
//! ([`AuditReport::head`]) somewhere else and pass it to [`verify_audit_log_with_head`].

use std::time::{SystemTime, UNIX_EPOCH};

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

/// The first bad line of a log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct AuditError {
    /// 1-based line number (for `HeadMismatch`, the number of lines + 1).
    pub line: usize,
    /// What is wrong with it.
    pub problem: AuditProblem,
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
        let fail = |problem| AuditError {
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
        return Err(AuditError {
            line: report.lines + 1,
            problem: AuditProblem::HeadMismatch {
                expected: head.to_owned(),
                found: report.head,
            },
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
