//! `cordon audit verify FILE`: check an audit log's hash chain.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Verify an audit log's hash chain (detects removed, altered or reordered lines).
    Verify {
        /// Audit log file.
        file: PathBuf,
    },
}

/// Run `cordon audit …`.
pub fn audit(command: AuditCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuditCommand::Verify { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("failed to read {}", file.display()))?;
            match cordon_policy::audit::verify_audit_log(&text) {
                Ok(report) => {
                    println!("{}", report.to_text());
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("cordon: {}: {error}", file.display());
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}
