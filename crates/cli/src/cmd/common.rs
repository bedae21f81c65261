//! What every tool-running subcommand shares: the common options (backend, root, policy,
//! audit), opening a session from them, and Ctrl-C handling.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use cordon_core::CancellationToken;
use cordon_policy::PolicySource;
use cordon_runtime::{BackendChoice, Session, SessionOptions};

use crate::config::{Config, ConfigError, Environment, PolicyChoice, Setting, discover_policy};

/// The docker image when nothing names one (built by `scripts/build-sandbox-image.sh`).
pub const DEFAULT_IMAGE: &str = "cordon-sandbox:latest";

/// A setting's value parsed as one of `T`'s names; an unknown one names where it came from.
fn parse_value<T: ValueEnum>(
    key: &'static str,
    setting: &Setting,
) -> Result<Option<T>, ConfigError> {
    let Some(value) = &setting.value else {
        return Ok(None);
    };
    T::from_str(value, false)
        .map(Some)
        .map_err(|_| ConfigError::BadValue {
            key,
            value: value.clone(),
            origin: setting.origin.clone(),
            expected: format!(
                "one of {}",
                T::value_variants()
                    .iter()
                    .filter_map(|v| v.to_possible_value())
                    .map(|v| v.get_name().to_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
}

/// Options shared by every subcommand that runs tools. `--policy`, `--backend`, `--image`,
/// `--workspace-mode`, `--host` and `--remote-root` fall back to the environment and the
/// config files ([`crate::config`]) when not given; [`CommonArgs::settings`] resolves them.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Where tools run [default: local, or CORDON_BACKEND, or `backend` in config.toml].
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// Workspace root (also where the project's .cordon/ is looked for).
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Policy file, or a built-in policy: builtin:default, builtin:readonly,
    /// builtin:ci-untrusted, builtin:build-host [default: CORDON_POLICY, else
    /// ROOT/.cordon/policy.toml, else ~/.config/cordon/policy.toml, else builtin:default].
    #[arg(long, value_name = "FILE|builtin:NAME")]
    pub policy: Option<PathBuf>,
    /// Append decisions and results to this audit log (JSON lines, hash-chained).
    #[arg(long)]
    pub audit: Option<PathBuf>,
    /// Accept a weaker sandbox when a layer is unavailable on this host; every result then
    /// says which layer is missing.
    #[arg(long)]
    pub allow_degraded: bool,
    /// docker: image to run [default: cordon-sandbox:latest, or CORDON_IMAGE, or `image` in
    /// config.toml].
    #[arg(long, help_heading = "Docker backend")]
    pub image: Option<String>,
    /// docker: bind-mount the workspace, or copy it in and out (for remote daemons)
    /// [default: bind].
    #[arg(long, value_enum, help_heading = "Docker backend")]
    pub workspace_mode: Option<WorkspaceModeArg>,
    /// ssh: `[USER@]HOST[:PORT]` or an alias from ~/.ssh/config.
    #[arg(long, help_heading = "SSH backend")]
    pub host: Option<String>,
    /// ssh: private key file to try first (ssh-agent is used too).
    #[arg(long, help_heading = "SSH backend")]
    pub identity: Option<PathBuf>,
    /// ssh: known_hosts file (default: ~/.ssh/known_hosts).
    #[arg(long, help_heading = "SSH backend")]
    pub known_hosts: Option<PathBuf>,
    /// ssh: ssh config file (default: ~/.ssh/config, then /etc/ssh/ssh_config).
    #[arg(long, help_heading = "SSH backend")]
    pub ssh_config: Option<PathBuf>,
    /// ssh: workspace root on the remote host.
    #[arg(long, help_heading = "SSH backend")]
    pub remote_root: Option<PathBuf>,
    /// ssh: the cordon-helper binary to run on the host, built for its architecture
    /// (default: cordon-helper-ARCH, then cordon-helper, next to cordon).
    #[arg(long, value_name = "PATH", help_heading = "SSH backend")]
    pub ssh_helper: Option<PathBuf>,
}

/// The common options with every default resolved ([`CommonArgs::settings`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The backend.
    pub backend: BackendKind,
    /// docker: the image.
    pub image: String,
    /// docker: how the workspace reaches the container (resolved in every build so that a
    /// bad value is reported the same way; read only where the docker backend is built in).
    #[cfg_attr(not(feature = "docker"), allow(dead_code))]
    pub workspace_mode: WorkspaceModeArg,
    /// ssh: the host (read only where the ssh backend is built in).
    #[cfg_attr(not(feature = "ssh"), allow(dead_code))]
    pub host: Option<String>,
    /// ssh: the remote workspace (read only where the ssh backend is built in).
    #[cfg_attr(not(feature = "ssh"), allow(dead_code))]
    pub remote_root: Option<PathBuf>,
    /// The policy discovery chose and why.
    pub policy: PolicyChoice,
    /// The config files looked at.
    pub config: Config,
    /// Each setting of [`crate::config::KEYS`] and where its value came from.
    pub origins: Vec<(&'static str, Setting)>,
}

/// How the workspace reaches a Docker container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkspaceModeArg {
    /// Bind mount of the host directory.
    Bind,
    /// Tar copy in at start and back out at the end.
    Copy,
}

impl WorkspaceModeArg {
    /// The mode's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            WorkspaceModeArg::Bind => "bind",
            WorkspaceModeArg::Copy => "copy",
        }
    }
}

/// Every backend Cordon has; `docker` and `ssh` are cargo features, and a binary built without
/// one still accepts its name so that asking for it says how to get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The host, under Landlock + seccomp.
    Local,
    /// One hardened container per session (needs a Docker engine and the sandbox image).
    #[cfg_attr(
        not(feature = "docker"),
        value(help = "not built into this cordon (rebuild with `--features docker`)")
    )]
    Docker,
    /// A remote host over SSH (needs --host and --remote-root).
    #[cfg_attr(
        not(feature = "ssh"),
        value(help = "not built into this cordon (rebuild with `--features ssh`)")
    )]
    Ssh,
}

impl BackendKind {
    /// The backend's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Docker => "docker",
            BackendKind::Ssh => "ssh",
        }
    }

    /// Whether this binary was built with the backend.
    pub fn is_built(self) -> bool {
        match self {
            BackendKind::Local => true,
            BackendKind::Docker => cfg!(feature = "docker"),
            BackendKind::Ssh => cfg!(feature = "ssh"),
        }
    }

    /// `Ok` when this binary has the backend; otherwise the usage error that says how to get it.
    pub fn require_built(self) -> Result<(), NotBuilt> {
        if self.is_built() {
            Ok(())
        } else {
            Err(NotBuilt { backend: self })
        }
    }
}

/// A backend was asked for that this binary was built without (a usage error, exit 2).
#[derive(Debug, thiserror::Error)]
#[error(
    "failed to use --backend {name}: this cordon was built without the {name} backend; rebuild with `--features {name}` or use --backend local",
    name = backend.name()
)]
pub struct NotBuilt {
    /// The backend asked for.
    pub backend: BackendKind,
}

impl CommonArgs {
    /// Resolve every default: flags > environment > the project's and the user's files >
    /// built-in defaults ([`crate::config`]).
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let env = Environment::from_process();
        let root = std::path::absolute(&self.root)
            .with_context(|| format!("failed to resolve the root {}", self.root.display()))?;
        let policy = discover_policy(self.policy.as_deref(), &root, &env)?;
        let config = Config::load(&root, &env)?;
        let resolve = |key, flag: Option<String>| config.resolve(key, flag, &env);
        let backend = resolve("backend", self.backend.map(|b| b.name().to_owned()));
        let image = resolve("image", self.image.clone());
        let mode = resolve(
            "workspace_mode",
            self.workspace_mode.map(|m| m.name().to_owned()),
        );
        let host = resolve("host", self.host.clone());
        let remote_root = resolve(
            "remote_root",
            self.remote_root
                .as_ref()
                .map(|path| path.display().to_string()),
        );
        let settings = Settings {
            backend: parse_value("backend", &backend)?.unwrap_or(BackendKind::Local),
            image: image
                .value
                .clone()
                .unwrap_or_else(|| DEFAULT_IMAGE.to_owned()),
            workspace_mode: parse_value("workspace_mode", &mode)?.unwrap_or(WorkspaceModeArg::Bind),
            host: host.value.clone(),
            remote_root: match (&self.remote_root, &remote_root.value) {
                (Some(flag), _) => Some(flag.clone()),
                (None, value) => value.as_ref().map(PathBuf::from),
            },
            policy,
            config: config.clone(),
            origins: vec![
                ("backend", backend),
                ("image", image),
                ("workspace_mode", mode),
                ("host", host),
                ("remote_root", remote_root),
            ],
        };
        Ok(settings)
    }

    /// Session options for these arguments (no approver: `Ask` becomes a denial).
    pub fn session_options(&self) -> anyhow::Result<SessionOptions> {
        let settings = self.settings()?;
        self.session_options_with(&settings)
    }

    /// [`CommonArgs::session_options`] for settings already resolved.
    pub fn session_options_with(&self, settings: &Settings) -> anyhow::Result<SessionOptions> {
        settings.backend.require_built()?;
        let backend = match settings.backend {
            BackendKind::Local => BackendChoice::Local,
            BackendKind::Docker => self.docker_choice(settings)?,
            BackendKind::Ssh => self.ssh_choice(settings)?,
        };
        let policy = match &settings.policy.source {
            PolicySource::Builtin(policy) => PathBuf::from(policy.file_name()),
            PolicySource::File(path) => path.clone(),
        };
        Ok(SessionOptions {
            backend,
            root: self.root.clone(),
            policy: Some(policy),
            audit: self.audit.clone(),
            approver: None,
            allow_degraded: self.allow_degraded,
            // A later session's policy may come from here: never writable by this one.
            config_dirs: crate::config::Environment::from_process()
                .user_dir()
                .into_iter()
                .collect(),
        })
    }

    #[cfg(feature = "docker")]
    fn docker_choice(&self, settings: &Settings) -> anyhow::Result<BackendChoice> {
        use cordon_runtime::{DockerOptions, WorkspaceMode};
        Ok(BackendChoice::Docker(DockerOptions {
            image: settings.image.clone(),
            mode: match settings.workspace_mode {
                WorkspaceModeArg::Bind => WorkspaceMode::Bind,
                WorkspaceModeArg::Copy => WorkspaceMode::Copy,
            },
            docker_host: None,
            ..DockerOptions::default()
        }))
    }

    #[cfg(not(feature = "docker"))]
    fn docker_choice(&self, _settings: &Settings) -> anyhow::Result<BackendChoice> {
        Err(NotBuilt {
            backend: BackendKind::Docker,
        }
        .into())
    }

    #[cfg(feature = "ssh")]
    fn ssh_choice(&self, settings: &Settings) -> anyhow::Result<BackendChoice> {
        let Some(host) = settings.host.clone() else {
            anyhow::bail!("--backend ssh needs --host [USER@]HOST[:PORT]")
        };
        let Some(remote_root) = settings.remote_root.clone() else {
            anyhow::bail!(
                "--backend ssh needs --remote-root DIR (the workspace on the remote host)"
            )
        };
        Ok(BackendChoice::Ssh(cordon_runtime::SshOptions {
            host,
            remote_root,
            identity: self.identity.clone(),
            known_hosts: self.known_hosts.clone(),
            ssh_config: self.ssh_config.clone(),
            helper: self.ssh_helper.clone(),
            state_dir: None,
        }))
    }

    #[cfg(not(feature = "ssh"))]
    fn ssh_choice(&self, _settings: &Settings) -> anyhow::Result<BackendChoice> {
        Err(NotBuilt {
            backend: BackendKind::Ssh,
        }
        .into())
    }

    /// Open a session for these arguments.
    /// Start, on another thread, the slow one-time work opening a session will need: the
    /// local backend's probe of the host's sandbox support (namespace children).
    pub fn warm_up(&self) {
        // Without the flag the backend comes from the environment or a config file; the
        // local backend is by far the most common, so warm up for it unless told otherwise.
        if matches!(self.backend, None | Some(BackendKind::Local)) {
            std::thread::spawn(cordon_backend_local::probe_host);
        }
    }

    pub async fn open_session(&self) -> anyhow::Result<Session> {
        Ok(Session::open(self.session_options()?).await?)
    }
}

/// End the session: [`Session::shutdown`], then the audit head ([`report_audit_head`]). A
/// shutdown error (copy mode's workspace not copied back: lost work) is stated on stderr;
/// returns whether the session ended cleanly, for the caller's exit code.
pub async fn finish_session(session: &Session) -> bool {
    let clean = shutdown_reporting(session).await;
    report_audit_head(session);
    clean
}

/// [`Session::shutdown`], stating an error on stderr; whether it ended cleanly.
pub async fn shutdown_reporting(session: &Session) -> bool {
    match session.shutdown().await {
        Ok(()) => true,
        Err(error) => {
            eprintln!("cordon: error: {error}");
            false
        }
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// What `cordon ARGS…` returns; an `Err` is printed on one line with exit code 2.
    #[cfg(not(all(feature = "docker", feature = "ssh")))]
    async fn cordon(args: &[&str]) -> anyhow::Result<std::process::ExitCode> {
        let cli =
            crate::args::Cli::try_parse_from(std::iter::once("cordon").chain(args.iter().copied()))
                .expect("the arguments parse");
        crate::cmd::run(cli).await
    }

    #[cfg(not(feature = "docker"))]
    #[tokio::test]
    async fn a_local_only_build_refuses_the_docker_backend_and_says_how_to_get_it() {
        let workspace = tempfile::tempdir().unwrap();
        let root = workspace.path().to_str().unwrap();
        let expected = "failed to use --backend docker: this cordon was built without the docker \
                        backend; rebuild with `--features docker` or use --backend local";
        let exec = ["exec", "--backend", "docker", "--root", root, "ls", "{}"];
        assert_eq!(cordon(&exec).await.unwrap_err().to_string(), expected);
        let transcript = workspace.path().join("transcript.jsonl");
        std::fs::write(&transcript, "").unwrap();
        let transcript = transcript.to_str().unwrap();
        let replay = ["replay", transcript, "--backend", "docker", "--root", root];
        assert_eq!(cordon(&replay).await.unwrap_err().to_string(), expected);
        let doctor = ["doctor", "--backend", "docker", "--root", root];
        assert_eq!(cordon(&doctor).await.unwrap_err().to_string(), expected);
    }

    #[cfg(not(feature = "ssh"))]
    #[tokio::test]
    async fn a_local_only_build_refuses_the_ssh_backend_and_says_how_to_get_it() {
        let workspace = tempfile::tempdir().unwrap();
        let root = workspace.path().to_str().unwrap();
        let expected = "failed to use --backend ssh: this cordon was built without the ssh \
                        backend; rebuild with `--features ssh` or use --backend local";
        let exec = [
            "exec",
            "--backend",
            "ssh",
            "--host",
            "example.invalid",
            "--remote-root",
            "/srv",
            "--root",
            root,
            "ls",
            "{}",
        ];
        assert_eq!(cordon(&exec).await.unwrap_err().to_string(), expected);
        let doctor = ["doctor", "--backend", "ssh", "--root", root];
        assert_eq!(cordon(&doctor).await.unwrap_err().to_string(), expected);
    }

    #[test]
    fn every_backend_this_binary_has_gives_session_options_and_the_others_say_not_built() {
        use clap::ValueEnum as _;

        use super::{BackendKind, CommonArgs};

        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            common: CommonArgs,
        }
        for &kind in BackendKind::value_variants() {
            let name = kind.name();
            let args = [
                "cordon",
                "--backend",
                name,
                "--host",
                "h",
                "--remote-root",
                "/r",
            ];
            let common = Wrapper::try_parse_from(args).unwrap().common;
            match common.session_options() {
                Ok(_) => assert!(kind.is_built(), "{name} is not built but gave options"),
                Err(error) => {
                    assert!(!kind.is_built(), "{name} is built but failed: {error}");
                    assert!(
                        error
                            .to_string()
                            .contains(&format!("rebuild with `--features {name}`")),
                        "{error}"
                    );
                }
            }
        }
        assert!(BackendKind::Local.is_built());
        assert_eq!(BackendKind::Docker.is_built(), cfg!(feature = "docker"));
        assert_eq!(BackendKind::Ssh.is_built(), cfg!(feature = "ssh"));
    }
}
