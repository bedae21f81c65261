//! One module per subcommand. Each owns its arguments and its run function; `run` dispatches.

pub mod audit;
pub mod common;
pub mod completions;
pub mod doctor;
pub mod exec;
pub mod mcp;
pub mod policy;
pub mod replay;
pub mod run;

use std::process::ExitCode;

use crate::args::{Cli, Command};

/// Run the parsed command. `Err` is a usage or configuration error (exit 2).
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    crate::colour::init(cli.color);
    match cli.command {
        Command::Exec(args) => exec::exec(args).await,
        Command::Replay(args) => replay::replay(args).await,
        Command::Mcp(args) => mcp::mcp(args).await,
        Command::Run(args) => run::run(args).await,
        Command::Policy(command) => policy::policy(command),
        Command::Audit(command) => audit::audit(command),
        Command::Doctor(args) => doctor::doctor(args).await,
        Command::Completions(args) => completions::completions(args),
    }
}
