//! `cordon policy check FILE` and `cordon policy explain FILE TOOL ARGS_JSON`: validate a
//! policy, or show the decision and rule for a call without executing it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use cordon_core::sandbox::{NetworkMode, RootAccess};
use cordon_policy::{CompiledPolicy, EnvMap, PolicyError, PolicySource};
use serde_json::{Value, json};

use crate::output::print_json_line;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file (errors name line and column).
    Check {
        /// Policy file, or builtin:NAME.
        file: PathBuf,
        /// Print one JSON object (docs/contract.md#policy-check): the summary, or for an
        /// invalid policy the error with its line and column (exit 2 as without it).
        #[arg(long)]
        json: bool,
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
        PolicyCommand::Check { file, json: false } => {
            let summary = cordon_policy::explain::check_policy_file(&file, &env)?;
            println!("{summary}");
        }
        PolicyCommand::Check { file, json: true } => {
            let loaded = PolicySource::parse(&file)
                .map_err(PolicyError::from)
                .and_then(|source| CompiledPolicy::load_source(&source, &env));
            match loaded {
                Ok(policy) => print_json_line(&check_json(&policy)),
                Err(error) => {
                    print_json_line(&check_error_json(&file, &error));
                    return Err(error.into());
                }
            }
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

/// `policy check --json` for a valid policy.
fn check_json(policy: &CompiledPolicy) -> Value {
    let spec = policy.sandbox_spec();
    json!({
        "ok": true,
        "file": policy.file(),
        "default": policy.default_decision().to_string(),
        "rules": policy.rule_count(),
        "tools": policy.enabled_tools(),
        "network": match spec.network {
            NetworkMode::Disabled => "disabled",
            NetworkMode::Enabled => "enabled",
        },
        "workspace": match spec.workspace {
            RootAccess::ReadOnly => "read-only",
            RootAccess::ReadWrite => "read-write",
        },
        "notes": policy.notes(),
    })
}

/// `policy check --json` for a policy that does not load: where and why.
fn check_error_json(file: &std::path::Path, error: &PolicyError) -> Value {
    let (line, column) = match error.position() {
        Some((line, column)) => (json!(line), json!(column)),
        None => (Value::Null, Value::Null),
    };
    json!({
        "ok": false,
        "file": file.display().to_string(),
        "line": line,
        "column": column,
        "error": error.to_string(),
    })
}
