//! The top-level command line (docs/contract.md#cli): parsing only, no effects. Each subcommand's
//! arguments live in its module under `cmd/`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cmd;
use crate::colour::ColorChoice;

/// `cordon --version`: the package version and the commit it was built from (see `build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CORDON_BUILD_COMMIT"),
    ")"
);

/// Run AI agents' tool calls inside a sandbox, under a declarative policy.
#[derive(Debug, Parser)]
#[command(name = "cordon", version = VERSION, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log more: -v info, -vv debug (also the dependencies' own logs), -vvv trace. Logs go to
    /// stderr (or --log-file), never to stdout. CORDON_LOG or RUST_LOG add filter directives.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Append logs to this file instead of stderr (created mode 0600; a symlink is refused).
    #[arg(long, value_name = "PATH", global = true)]
    pub log_file: Option<PathBuf>,
    /// Colour the output: auto (a terminal, unless NO_COLOR is set or TERM=dumb), always,
    /// never.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ColorChoice::Auto, global = true)]
    pub color: ColorChoice,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one tool call through the full pipeline (prepare, validate, policy, execute).
    Exec(cmd::exec::ExecArgs),
    /// Execute the tool calls of recorded assistant messages (JSONL), one batch per message,
    /// and print every event as JSONL.
    Replay(cmd::replay::ReplayArgs),
    /// Serve the enabled tools over the Model Context Protocol on stdio (for Claude Code,
    /// Claude Desktop, Codex and other MCP clients).
    Mcp(cmd::mcp::McpArgs),
    /// Run the agent: a model drives the sandboxed tools until it finishes.
    Run(cmd::run::RunArgs),
    /// Validate or explain a policy file.
    #[command(subcommand)]
    Policy(cmd::policy::PolicyCommand),
    /// Work with audit logs.
    #[command(subcommand)]
    Audit(cmd::audit::AuditCommand),
    /// Show what this host supports for each backend; exit 1 if the selected one cannot run.
    Doctor(cmd::doctor::DoctorArgs),
    /// Print a shell completion script (bash, zsh or fish) to stdout.
    Completions(cmd::completions::CompletionsArgs),
}

/// Print a clap error: help and version normally, usage errors as one line (exit 2).
pub fn report_parse_error(error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // Help or version to a closed stdout: nothing useful to report.
            let _ = error.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // Help to a closed stdout: the exit code still says usage error.
            let _ = error.print();
            ExitCode::from(crate::EXIT_USAGE)
        }
        _ => {
            // The first paragraph of clap's message, as one line (a missing-argument error
            // names the arguments on the lines after its first).
            let rendered = error.render().to_string();
            let paragraph: Vec<&str> = rendered
                .lines()
                .skip_while(|line| line.trim().is_empty())
                .take_while(|line| !line.trim().is_empty())
                .map(str::trim)
                .collect();
            let joined = paragraph.join(" ");
            let first = match joined.trim_start_matches("error: ") {
                "" => "invalid arguments",
                text => text,
            };
            eprintln!("cordon: {first} (see `cordon --help`)");
            ExitCode::from(crate::EXIT_USAGE)
        }
    }
}
