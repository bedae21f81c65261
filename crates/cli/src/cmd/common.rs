//! What every tool-running subcommand shares: the common options (backend, root, policy,
//! audit), opening a session from them, and Ctrl-C handling.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, ValueEnum};
use cordon_core::CancellationToken;
use cordon_runtime::{
    BackendChoice, DockerOptions, Session, SessionOptions, SshOptions, WorkspaceMode,
};

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
    /// docker: image to run.
    #[arg(
        long,
        default_value = "cordon-sandbox:latest",
        help_heading = "Docker backend"
    )]
    pub image: String,
    /// docker: bind-mount the workspace, or copy it in and out (for remote daemons).
    #[arg(long, value_enum, default_value_t = WorkspaceModeArg::Bind, help_heading = "Docker backend")]
    pub workspace_mode: WorkspaceModeArg,
    /// ssh: `[USER@]HOST[:PORT]` or an alias from ~/.ssh/config.
    #[arg(long, help_heading = "SSH backend")]
    pub host: Option<String>,
    /// ssh: private key file to try first (ssh-agent is used too).
    #[arg(long, help_heading = "SSH backend")]
    pub identity: Option<PathBuf>,
    /// ssh: known_hosts file (default: ~/.ssh/known_hosts).
    #[arg(long, help_heading = "SSH backend")]
    pub known_hosts: Option<PathBuf>,
    /// ssh: ssh config file (default: ~/.ssh/config).
    #[arg(long, help_heading = "SSH backend")]
    pub ssh_config: Option<PathBuf>,
    /// ssh: workspace root on the remote host.
    #[arg(long, help_heading = "SSH backend")]
    pub remote_root: Option<PathBuf>,
}

/// How the workspace reaches a Docker container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkspaceModeArg {
    /// Bind mount of the host directory.
    Bind,
    /// Tar copy in at start and back out at the end.
    Copy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The host, under Landlock + seccomp.
    Local,
    /// One hardened container per session (needs a Docker engine and the sandbox image).
    Docker,
    /// A remote host over SSH (needs --host and --remote-root).
    Ssh,
}

impl CommonArgs {
    /// Session options for these arguments (no approver: `Ask` becomes a denial).
    pub fn session_options(&self) -> anyhow::Result<SessionOptions> {
        let CommonArgs {
            backend,
            root,
            policy,
            audit,
            allow_degraded,
            image,
            workspace_mode,
            host,
            identity,
            known_hosts,
            ssh_config,
            remote_root,
        } = self.clone();
        let backend = match backend {
            BackendKind::Local => BackendChoice::Local,
            BackendKind::Docker => BackendChoice::Docker(DockerOptions {
                image,
                mode: match workspace_mode {
                    WorkspaceModeArg::Bind => WorkspaceMode::Bind,
                    WorkspaceModeArg::Copy => WorkspaceMode::Copy,
                },
                docker_host: None,
            }),
            BackendKind::Ssh => {
                let Some(host) = host else {
                    bail!("--backend ssh needs --host [USER@]HOST[:PORT]")
                };
                let Some(remote_root) = remote_root else {
                    bail!(
                        "--backend ssh needs --remote-root DIR (the workspace on the remote host)"
                    )
                };
                BackendChoice::Ssh(SshOptions {
                    host,
                    remote_root,
                    identity,
                    known_hosts,
                    ssh_config,
                })
            }
        };
        Ok(SessionOptions {
            backend,
            root,
            policy,
            audit,
            approver: None,
            allow_degraded,
        })
    }

    /// Open a session for these arguments.
    /// Start, on another thread, the slow one-time work opening a session will need: the
    /// local backend's probe of the host's sandbox support (namespace children).
    pub fn warm_up(&self) {
        if matches!(self.backend, BackendKind::Local) {
            std::thread::spawn(cordon_backend_local::probe_host);
        }
    }

    pub async fn open_session(&self) -> anyhow::Result<Session> {
        Ok(Session::open(self.session_options()?).await?)
    }
}

/// After [`Session::shutdown`]: state the audit head on stderr (the hash of the log's last
/// line and its line count, also written to `FILE.head`), so it is kept outside the
/// sandbox's reach; `cordon audit verify FILE --expect-head SHA` checks a log against it.
pub fn report_audit_head(session: &Session) {
    match session.audit_head() {
        None => {}
        Some((path, Ok(head))) => eprintln!(
            "cordon: audit log {}: head {} ({} lines), recorded in {}",
            path.display(),
            head.sha256,
            head.lines,
            cordon_runtime::head_file_path(path).display()
        ),
        Some((path, Err(error))) => eprintln!(
            "cordon: warning: audit log {}: no head recorded: {error}",
            path.display()
        ),
    }
}

/// A token cancelled by the first SIGINT (Ctrl-C) or SIGTERM (what CI timeouts, `timeout` and
/// `docker stop` send): running tools are killed and report it, and the caller then ends the
/// session as usual (its last quarantine sweep, the audit head). A second signal exits at once.
pub fn cancel_on_stop_signal() -> CancellationToken {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    tokio::spawn(async move {
        let mut signals = match StopSignals::install() {
            Ok(signals) => signals,
            Err(error) => {
                // Without the handlers the default actions stay: the process dies at once.
                eprintln!(
                    "cordon: warning: failed to install the SIGINT/SIGTERM handlers: {error}"
                );
                return;
            }
        };
        signals.next().await;
        token.cancel();
        let second = signals.next().await;
        std::process::exit(if second == "SIGTERM" { 143 } else { 130 });
    });
    cancel
}

/// SIGINT and SIGTERM, whichever comes next.
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}
