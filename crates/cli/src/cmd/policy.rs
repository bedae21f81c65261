//! `cordon policy check FILE` and `cordon policy explain FILE TOOL ARGS_JSON`: validate a
//! policy, or show the decision and rule for a call without executing it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use cordon_policy::{EnvMap, PolicyError, PolicySource};

use crate::output::print_json_line;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file (errors name line and column).
    Check {
        /// Policy file, or builtin:NAME.
        file: PathBuf,
    },
    /// Show the decision a policy makes for a call, and the rule that makes it (no execution).
    Explain {
        /// Policy file, or builtin:NAME.
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

/// Run `cordon policy …`.
pub fn policy(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    let env: EnvMap = std::env::vars().collect();
    match command {
        PolicyCommand::Check { file } => {
            let summary = cordon_policy::explain::check_policy_file(&file, &env)?;
            println!("{summary}");
        }
        PolicyCommand::Explain {
            file,
            tool,
            args_json,
            root,
            json,
        } => {
            let source = PolicySource::parse(&file).map_err(PolicyError::from)?;
            let policy = cordon_policy::CompiledPolicy::load_source(&source, &env)?;
            let root = std::path::absolute(&root)
                .with_context(|| format!("failed to resolve root {}", root.display()))?;
            let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
            let request = cordon_policy::explain::ExplainCliRequest {
                tool: &tool,
                args_json: &args_json,
                root: &root,
                home: home.as_deref(),
            };
            let explanation = cordon_policy::explain::explain_cli(&policy, &request)?;
            if json {
                print_json_line(&explanation.to_json());
            } else {
                println!("{}", explanation.to_text());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
