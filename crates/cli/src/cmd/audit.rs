//! `cordon audit verify FILE [--expect-head SHA | --head-file F]`: check an audit log's hash
//! chain and, given a head recorded at the end of a session, that the log still contains it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;
use cordon_core::hostfile::{self, Trust};
use cordon_policy::audit::{AuditError, AuditHead, verify_audit_log, verify_audit_log_from_head};
use serde_json::{Value, json};

use crate::output::print_json_line;

/// The largest head file read (one line).
const MAX_HEAD_FILE_BYTES: u64 = 4096;
/// Largest audit log `verify` reads (it holds the whole log in memory): about three million
/// lines, far more than a session writes, and a bound on what a huge or sparse file can cost.
const MAX_AUDIT_LOG_BYTES: u64 = 1 << 30;

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Verify an audit log's hash chain (detects removed, altered or reordered lines). With a
    /// recorded head it also detects a log truncated, replaced or re-chained since then.
    Verify {
        /// Audit log file.
        file: PathBuf,
        /// The head a session printed at its end (`head SHA`): the log must contain the line
        /// with this hash.
        #[arg(long, value_name = "SHA", conflicts_with = "head_file")]
        expect_head: Option<String>,
        /// The head file a session wrote next to the log (`FILE.head`): the log must contain
        /// its head at the line count it records.
        #[arg(long, value_name = "FILE")]
        head_file: Option<PathBuf>,
        /// Print one JSON object (docs/contract.md#audit-verify) instead of text; the exit
        /// code is the same.
        #[arg(long)]
        json: bool,
    },
}

/// Run `cordon audit …`.
pub fn audit(command: AuditCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuditCommand::Verify {
            file,
            expect_head,
            head_file,
            json,
        } => {
            let expected = match (expect_head, head_file) {
                (Some(sha), _) => {
                    let sha = sha.trim().to_ascii_lowercase();
                    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                        bail!("--expect-head {sha:?}: expected a SHA-256 as 64 hex digits");
                    }
                    Some((sha, None))
                }
                (None, Some(path)) => {
                    let text = hostfile::read_to_string(&path, Trust::Any, MAX_HEAD_FILE_BYTES)?;
                    let Some(AuditHead { sha256, lines }) = AuditHead::parse(&text) else {
                        bail!(
                            "--head-file {}: not a head file (expected `SHA256 LINES`)",
                            path.display()
                        );
                    };
                    Some((sha256, Some(lines)))
                }
                (None, None) => None,
            };
            // Read whole, as verifying needs every line; bounded so a huge file is an error.
            let text = hostfile::read_to_string(&file, Trust::Any, MAX_AUDIT_LOG_BYTES)
                .with_context(|| format!("failed to read {}", file.display()))?;
            let verified = match &expected {
                None => verify_audit_log(&text).map(|report| Verified {
                    text: report.to_text(),
                    json: json!({
                        "ok": true,
                        "file": file.display().to_string(),
                        "lines": report.lines,
                        "head": report.head,
                        "recordedHead": null,
                    }),
                }),
                Some((sha, lines)) => {
                    verify_audit_log_from_head(&text, sha, *lines).map(|head| Verified {
                        text: head.to_text(),
                        json: json!({
                            "ok": true,
                            "file": file.display().to_string(),
                            "lines": head.report.lines,
                            "head": head.report.head,
                            "recordedHead": {
                                "sha256": sha,
                                "line": head.head_line,
                                "linesAfter": head.report.lines - head.head_line,
                            },
                        }),
                    })
                }
            };
            match verified {
                Ok(verified) if json => {
                    print_json_line(&verified.json);
                    Ok(ExitCode::SUCCESS)
                }
                Ok(verified) => {
                    println!("{}", verified.text);
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    if json {
                        let line = match &error {
                            AuditError::Chain { line, .. } => json!(line),
                            _ => Value::Null,
                        };
                        print_json_line(&json!({
                            "ok": false,
                            "file": file.display().to_string(),
                            "line": line,
                            "error": error.to_string(),
                        }));
                    }
                    eprintln!("cordon: {}: {error}", file.display());
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

/// A verified log, as text and as JSON.
struct Verified {
    text: String,
    json: Value,
}
