//! `cordon policy check FILE` and `cordon policy explain FILE TOOL ARGS_JSON`: validate a
//! policy, or show the decision and rule for a call without executing it. `cordon policy
//! init` writes a starting file; `cordon policy show` prints the policy discovery chooses with
//! where each value comes from.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use cordon_core::sandbox::{NetworkMode, RootAccess};
use cordon_policy::show::ShownSetting;
use cordon_policy::{BuiltinPolicy, CompiledPolicy, EnvMap, PolicyError, PolicySource};
use serde_json::{Value, json};

use crate::config::{Environment, discover_policy};
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
    /// Write a commented starting policy (a copy of a built-in one) to PATH, creating its
    /// directory; an existing file is kept unless --force.
    Init {
        /// Where to write it.
        #[arg(default_value = ".cordon/policy.toml")]
        path: PathBuf,
        /// The built-in policy to start from.
        #[arg(long, value_name = "builtin:NAME", default_value = "builtin:default")]
        from: PathBuf,
        /// Replace an existing file (atomically).
        #[arg(long)]
        force: bool,
    },
    /// Print the effective policy — POLICY, or the one discovery picks for --root (see
    /// `cordon doctor`) — with where each value comes from (FILE:LINE, or default).
    Show {
        /// Policy file or builtin:NAME [default: discovered as for a session on --root].
        policy: Option<PathBuf>,
        /// Workspace root whose .cordon/policy.toml is looked for.
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
    /// Show the decision a policy makes for a call, and the rule that makes it (no execution);
    /// `explain FILE net HOST[:PORT]` shows whether commands may reach a network destination
    /// (port 443 when absent) and which `[network]` entry decides.
    Explain {
        /// Policy file, or builtin:NAME.
        file: PathBuf,
        /// Tool name, or `net` for a network destination.
        tool: String,
        /// Arguments as a JSON object (for `net`: HOST[:PORT]).
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
        PolicyCommand::Init { path, from, force } => {
            let source = PolicySource::parse(&from).map_err(PolicyError::from)?;
            let PolicySource::Builtin(builtin) = source else {
                anyhow::bail!(
                    "failed to use --from {}: it takes a built-in policy (builtin:NAME); to start from a file, copy it",
                    from.display()
                );
            };
            let text = starting_text(builtin);
            // What is written must load: a check here keeps a broken template from shipping.
            CompiledPolicy::from_toml(&path.display().to_string(), &text, &env)?;
            write_new_file(&path, &text, force)?;
            tracing::info!(path = %path.display(), from = %builtin.file_name(), "policy written");
            println!(
                "wrote {} (from {}); check it with `cordon policy check {}`",
                path.display(),
                builtin.file_name(),
                path.display()
            );
        }
        PolicyCommand::Show { policy, root } => {
            let root = std::path::absolute(&root)
                .with_context(|| format!("failed to resolve the root {}", root.display()))?;
            let choice = discover_policy(policy.as_deref(), &root, &Environment::from_process())?;
            let (name, text) = match &choice.source {
                PolicySource::Builtin(builtin) => (builtin.file_name(), builtin.text.to_owned()),
                PolicySource::File(path) => (
                    path.display().to_string(),
                    cordon_policy::read_policy_file(path)?,
                ),
            };
            let shown = cordon_policy::show::show_policy(&name, &text, &env)?;
            println!(
                "# {name} (chosen from {}; `cordon doctor` lists every candidate)",
                choice.origin
            );
            for ShownSetting { key, value, line } in shown {
                match line {
                    Some(line) => println!("{key} = {value}  # {name}:{line}"),
                    None => println!("{key} = {value}  # default"),
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
            if tool == "net" {
                let explanation = cordon_policy::explain::explain_net(&policy, &args_json)?;
                if json {
                    print_json_line(&explanation.to_json());
                } else {
                    println!("{}", explanation.to_text());
                }
                return Ok(ExitCode::SUCCESS);
            }
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
            NetworkMode::Filtered => "filtered",
        },
        // The destinations of filtered mode (all empty otherwise).
        "networkAllow": spec.egress.allow,
        "networkDeny": spec.egress.deny,
        "networkAsk": spec.egress.ask,
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

/// The file `policy init` writes: a header saying where it came from and how it is used, then
/// the built-in policy's own (commented) text.
fn starting_text(builtin: &BuiltinPolicy) -> String {
    format!(
        "# Started from {} by `cordon policy init`. In a project's .cordon/policy.toml it is\n\
         # the policy of every session whose workspace root is the project (unless --policy or\n\
         # CORDON_POLICY says otherwise; `cordon doctor` shows which policy is chosen and why).\n\
         # Validate it with `cordon policy check FILE`; `cordon policy show FILE` prints every\n\
         # setting with its line or default.\n\
         #\n{}",
        builtin.file_name(),
        builtin.text
    )
}

/// Why `policy init` could not write its file.
#[derive(Debug, thiserror::Error)]
enum InitError {
    /// The file exists and `--force` was not given.
    #[error("failed to write {}: it already exists; pass --force to replace it", .0.display())]
    Exists(PathBuf),
    /// The directory is a symlink or not a directory.
    #[error("failed to write into {}: it is not a directory (a symbolic link is not followed)", .0.display())]
    NotADirectory(PathBuf),
    /// A step of the write failed.
    #[error("failed to {step} {}: {source}", path.display())]
    Io {
        /// What was being done.
        step: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Write `text` to `path` atomically: a temporary file in the same directory (created
/// exclusively, mode 0644, synced) is linked to `path` — which fails if anything, even a
/// dangling symlink, is there — or, with `force`, renamed over it (replacing a symlink, never
/// writing through it). The directory is created when missing.
fn write_new_file(path: &Path, text: &str, force: bool) -> Result<(), InitError> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;

    let io = |step: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| InitError::Io { step, path, source }
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(io("create the directory", &dir))?;
    let meta = std::fs::symlink_metadata(&dir).map_err(io("inspect", &dir))?;
    if !meta.is_dir() {
        return Err(InitError::NotADirectory(dir));
    }
    if !force && std::fs::symlink_metadata(path).is_ok() {
        return Err(InitError::Exists(path.to_path_buf()));
    }
    let mut temp = tempfile::Builder::new()
        .prefix(".policy-init-")
        .suffix(".tmp")
        .tempfile_in(&dir)
        .map_err(io("create a temporary file in", &dir))?;
    temp.write_all(text.as_bytes())
        .and_then(|()| temp.as_file().sync_all())
        .map_err(io("write", temp.path()))?;
    std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o644))
        .map_err(io("set the mode of", temp.path()))?;
    if force {
        temp.persist(path)
            .map_err(|error| io("rename the temporary file to", path)(error.error))?;
    } else {
        // `persist_noclobber` links then unlinks the temporary name: no window in which an
        // existing file could be replaced.
        temp.persist_noclobber(path).map_err(|error| {
            if error.error.kind() == std::io::ErrorKind::AlreadyExists {
                InitError::Exists(path.to_path_buf())
            } else {
                io("link the temporary file to", path)(error.error)
            }
        })?;
    }
    Ok(())
}
