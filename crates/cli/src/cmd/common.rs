//! What every tool-running subcommand shares: the common options (backend, root, policy,
//! audit), opening a session from them, and Ctrl-C handling.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use cordon_core::CancellationToken;
use cordon_runtime::{BackendChoice, Session, SessionOptions};

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

impl CommonArgs {
    /// Session options for these arguments (no approver: `Ask` becomes a denial).
    pub fn session_options(&self) -> SessionOptions {
        let CommonArgs {
            backend,
            root,
            policy,
            audit,
            allow_degraded,
        } = self.clone();
        let backend = match backend {
            BackendKind::Local => BackendChoice::Local,
        };
        SessionOptions {
            backend,
            root,
            policy,
            audit,
            approver: None,
            allow_degraded,
        }
    }

    /// Open a session for these arguments.
    pub async fn open_session(&self) -> anyhow::Result<Session> {
        Ok(Session::open(self.session_options()).await?)
    }
}

/// A token cancelled by the first Ctrl-C (running tools are killed and report it); a second
/// Ctrl-C exits at once.
pub fn cancel_on_ctrl_c() -> CancellationToken {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            token.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    cancel
}
