//! Command-line arguments (CONTRACT §2). Parsing only; no effects.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Run AI agents' tool calls inside a sandbox, under a declarative policy.
#[derive(Debug, Parser)]
#[command(name = "cordon", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one tool call through the full pipeline (prepare, validate, policy, execute).
    Exec(ExecArgs),
    /// Execute the tool calls of recorded assistant messages (JSONL), one batch per message,
    /// and print every event as JSONL.
    Replay(ReplayArgs),
    /// Validate or explain a policy file.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Work with audit logs.
    #[command(subcommand)]
    Audit(AuditCommand),
}

/// Options shared by every subcommand that runs tools.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Where tools run.
    #[arg(long, value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,
    /// Workspace root.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Policy file (default: the built-in policies/default.toml).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Append decisions and results to this audit log (JSON lines, hash-chained).
    #[arg(long)]
    pub audit: Option<PathBuf>,
    /// Accept a weaker sandbox when a layer is unavailable on this host; every result then
    /// says which layer is missing.
    #[arg(long)]
    pub allow_degraded: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The host, under Landlock + seccomp.
    Local,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Tool name (read, write, edit, bash, grep, find, ls).
    pub tool: String,
    /// Arguments as a JSON object.
    pub args_json: String,
    /// Print the ToolResult as JSON instead of its text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// JSONL file of assistant messages (`-` or absent: standard input).
    pub file: Option<PathBuf>,
    /// Run each message's calls one at a time instead of in parallel.
    #[arg(long)]
    pub sequential: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file (errors name line and column).
    Check {
        /// Policy file.
        file: PathBuf,
    },
    /// Show the decision a policy makes for a call, and the rule that makes it (no execution).
    Explain {
        /// Policy file.
        file: PathBuf,
        /// Tool name.
        tool: String,
        /// Arguments as a JSON object.
        args_json: String,
        /// Workspace root used to resolve relative paths.
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Verify an audit log's hash chain (detects removed, altered or reordered lines).
    Verify {
        /// Audit log file.
        file: PathBuf,
    },
}

/// Print a clap error: help and version normally, usage errors as one line (exit 2).
pub fn report_parse_error(error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = error.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = error.print();
            ExitCode::from(crate::EXIT_USAGE)
        }
        _ => {
            let rendered = error.render().to_string();
            let first = rendered
                .lines()
                .find(|line| !line.trim().is_empty())
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            eprintln!("cordon: {first} (see `cordon --help`)");
            ExitCode::from(crate::EXIT_USAGE)
        }
    }
}
