//! The Docker plumbing the backend needs: connecting (`DOCKER_HOST`, TLS, version negotiation),
//! attached execs turned into [`TransportEvent`] streams (the [`DockerTransport`] the shared
//! `cordon_remote::runner::Runner` starts its workers with), and the owner labels that let a later
//! session tell a crashed session's container (reap it) from a live one (leave it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::{
    ListContainersOptions, ListVolumesOptions, RemoveContainerOptions,
};
use cordon_backend_ssh::tunnel::TunnelConfig;
use cordon_remote::exec::TransportEvent;
use cordon_remote::pool::PooledWorker;
use cordon_remote::transport::{Control, Events, Process, Transport};
use futures::{FutureExt, Stream, StreamExt};
use tokio::io::AsyncWrite;

use crate::error::DockerError;

/// Label carrying the session id on everything a session creates.
pub const LABEL_SESSION: &str = "cordon.session";
/// Label: machine id of the owning runtime's host.
pub const LABEL_HOST: &str = "cordon.owner.host";
/// Label: boot id of the owning runtime's host.
pub const LABEL_BOOT: &str = "cordon.owner.boot";
/// Label: pid of the owning runtime.
pub const LABEL_PID: &str = "cordon.owner.pid";
/// Label: start time (clock ticks since boot) of the owning runtime.
pub const LABEL_START: &str = "cordon.owner.start";
/// Label on spill volumes: the host root they belong to.
pub const LABEL_SPILL_ROOT: &str = "cordon.spill.root";

/// The default socket when `DOCKER_HOST` is not set.
pub const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";

/// Where and how to reach the engine, from `DOCKER_HOST`, `DOCKER_TLS_VERIFY` and
/// `DOCKER_CERT_PATH` as the docker CLI reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Engine {
    /// The daemon URI.
    pub host: String,
    /// For a TCP engine verified with TLS: the directory holding `ca.pem`, `cert.pem` and
    /// `key.pem`.
    pub tls: Option<PathBuf>,
}

/// How the engine is reached, from the scheme of its URI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineTransport {
    /// A Unix socket on this machine (`unix://`).
    Unix,
    /// Plaintext TCP (`tcp://`, `http://` without `DOCKER_TLS_VERIFY`).
    Tcp,
    /// TCP verified with TLS (`DOCKER_TLS_VERIFY`, `https://`).
    TcpTls,
    /// `docker system dial-stdio` over SSH (`ssh://`).
    Ssh,
}

impl EngineTransport {
    /// Whether the engine may run on another machine, so host paths mean nothing to it and
    /// the workspace (and the helper) are copied in rather than bind-mounted.
    pub fn is_remote(self) -> bool {
        match self {
            EngineTransport::Unix => false,
            EngineTransport::Tcp | EngineTransport::TcpTls | EngineTransport::Ssh => true,
        }
    }
}

impl std::fmt::Display for EngineTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineTransport::Unix => "unix",
            EngineTransport::Tcp => "tcp",
            EngineTransport::TcpTls => "tcp+tls",
            EngineTransport::Ssh => "ssh",
        })
    }
}

/// Which engine serves the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// Docker Engine (dockerd).
    Docker,
    /// Podman's Docker-compatible API (`podman system service`).
    Podman,
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineKind::Docker => "docker",
            EngineKind::Podman => "podman",
        })
    }
}

/// Which engine `docker` talks to, from `GET /version` (Podman lists a "Podman Engine"
/// component).
pub async fn engine_kind(docker: &Docker) -> Result<EngineKind, DockerError> {
    let version = docker
        .version()
        .await
        .map_err(|e| DockerError::api("read the engine's version", e))?;
    let podman = version
        .components
        .unwrap_or_default()
        .iter()
        .any(|component| component.name.to_ascii_lowercase().contains("podman"));
    Ok(match podman {
        true => EngineKind::Podman,
        false => EngineKind::Docker,
    })
}

/// The files of a TLS engine's directory, in the order they are checked.
const TLS_FILES: [&str; 3] = ["ca.pem", "cert.pem", "key.pem"];

impl Engine {
    /// Resolve `host` (or `DOCKER_HOST`, or the default socket) with the TLS variables read
    /// through `env` and the home directory `home`.
    ///
    /// - `unix://`: a socket; the TLS variables do not apply (as with the docker CLI).
    /// - `tcp://` with `DOCKER_TLS_VERIFY` non-empty, or `https://`: TLS, the engine's
    ///   certificate verified against `ca.pem` and the client certificate presented, from
    ///   `DOCKER_CERT_PATH` (default `~/.docker`). A missing file is an error: the connection
    ///   never goes out without TLS instead.
    /// - `tcp://` with `DOCKER_TLS` (TLS without verifying the engine) is refused.
    /// - `tcp://`/`http://` otherwise: plaintext, logged as a warning by [`connect`].
    /// - `ssh://[user@]host[:port]`: `docker system dial-stdio` on the host over SSH (module
    ///   `ssh_engine`); the TLS variables do not apply.
    /// - anything else: refused with what to do instead.
    pub fn resolve(
        host: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
        home: Option<&Path>,
    ) -> Result<Engine, DockerError> {
        let nonempty = |name: &str| env(name).filter(|v| !v.is_empty());
        let host = match host {
            Some(h) => h.to_owned(),
            None => nonempty("DOCKER_HOST").unwrap_or_else(|| DEFAULT_HOST.to_owned()),
        };
        let tls_error = |reason: String| DockerError::Tls {
            host: host.clone(),
            reason,
        };
        let scheme = host.split_once("://").map_or("", |(scheme, _)| scheme);
        let verify = match scheme {
            "unix" => return Ok(Engine { host, tls: None }),
            "https" => true,
            "tcp" | "http" => {
                if nonempty("DOCKER_TLS_VERIFY").is_some() {
                    if scheme == "http" {
                        return Err(tls_error(
                            "DOCKER_TLS_VERIFY is set but the host says http://; use tcp:// or \
                             https://"
                                .to_owned(),
                        ));
                    }
                    true
                } else if nonempty("DOCKER_TLS").is_some() {
                    return Err(tls_error(
                        "DOCKER_TLS asks for TLS without verifying the engine, which Cordon does \
                         not do; set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH to the directory \
                         with ca.pem, cert.pem and key.pem"
                            .to_owned(),
                    ));
                } else {
                    false
                }
            }
            "ssh" => {
                crate::ssh_engine::ssh_target(&host).map_err(|reason| DockerError::SshEngine {
                    host: crate::ssh_engine::without_password(&host),
                    reason,
                })?;
                return Ok(Engine { host, tls: None });
            }
            _ => {
                return Err(tls_error(
                    "unsupported scheme; use ssh://[user@]host[:port], use unix://PATH, tcp://HOST:PORT (with \
                     DOCKER_TLS_VERIFY=1 for TLS) or https://HOST:PORT"
                        .to_owned(),
                ));
            }
        };
        if !verify {
            return Ok(Engine { host, tls: None });
        }
        let dir = match (nonempty("DOCKER_CERT_PATH"), home) {
            (Some(dir), _) => PathBuf::from(dir),
            (None, Some(home)) => home.join(".docker"),
            (None, None) => {
                return Err(tls_error(
                    "DOCKER_CERT_PATH is not set and there is no home directory to find \
                     ~/.docker in"
                        .to_owned(),
                ));
            }
        };
        for name in TLS_FILES {
            let file = dir.join(name);
            if !file.is_file() {
                return Err(tls_error(format!(
                    "{} is missing; DOCKER_CERT_PATH must name a directory with ca.pem, \
                     cert.pem and key.pem",
                    file.display()
                )));
            }
        }
        Ok(Engine {
            host,
            tls: Some(dir),
        })
    }

    /// How the engine is reached.
    pub fn transport(&self) -> EngineTransport {
        match (
            self.host.split_once("://").map(|(scheme, _)| scheme),
            &self.tls,
        ) {
            (Some("unix"), _) => EngineTransport::Unix,
            (Some("ssh"), _) => EngineTransport::Ssh,
            (_, Some(_)) => EngineTransport::TcpTls,
            (_, None) => EngineTransport::Tcp,
        }
    }
}

/// Connect to `host` (or `DOCKER_HOST`, or the default socket; TLS from the environment, see
/// [`Engine::resolve`]) and negotiate the API version. An `ssh://` engine is reached with the
/// ssh config, known_hosts and keys of this user.
pub async fn connect(host: Option<&str>) -> Result<(Docker, String), DockerError> {
    let (docker, engine) = connect_with(host, &TunnelConfig::default()).await?;
    Ok((docker, engine.host))
}

/// [`connect`], an `ssh://` engine reached with `ssh` (its `host` is ignored: the URI names
/// the target); the engine it resolved to.
pub async fn connect_with(
    host: Option<&str>,
    ssh: &TunnelConfig,
) -> Result<(Docker, Engine), DockerError> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let engine = Engine::resolve(host, &|name| std::env::var(name).ok(), home.as_deref())?;
    let (docker, _) = connect_engine_with(&engine, ssh).await?;
    Ok((docker, engine))
}

/// Connect to a resolved [`Engine`] and negotiate the API version.
pub async fn connect_engine(engine: &Engine) -> Result<(Docker, String), DockerError> {
    connect_engine_with(engine, &TunnelConfig::default()).await
}

/// [`connect_engine`], an `ssh://` engine reached with `ssh`.
pub async fn connect_engine_with(
    engine: &Engine,
    ssh: &TunnelConfig,
) -> Result<(Docker, String), DockerError> {
    let host = engine.host.clone();
    let next_step = || crate::error::Hints::for_current_dir().unreachable();
    let bollard_error = |source| match source {
        bollard::errors::Error::UnsupportedURISchemeError { .. } => DockerError::Host {
            host: host.clone(),
            source,
        },
        other => DockerError::Unreachable {
            host: host.clone(),
            reason: other.to_string(),
            next_step: next_step(),
        },
    };
    let connected = match &engine.tls {
        None if engine.transport() == EngineTransport::Ssh => {
            crate::ssh_engine::connect(&host, ssh.clone())
                .await
                .map_err(|reason| DockerError::SshEngine {
                    host: crate::ssh_engine::without_password(&host),
                    reason,
                })
        }
        Some(dir) => {
            // The process-wide rustls provider bollard signs the client key with; an error
            // only means one is installed already.
            if rustls::crypto::aws_lc_rs::default_provider()
                .install_default()
                .is_err()
            {
                tracing::trace!("a rustls crypto provider was installed already");
            }
            tracing::debug!(host, certs = %dir.display(), "docker: connecting with TLS");
            Docker::connect_with_ssl(
                &host,
                &dir.join("key.pem"),
                &dir.join("cert.pem"),
                &dir.join("ca.pem"),
                120,
                bollard::API_DEFAULT_VERSION,
            )
            .map_err(bollard_error)
        }
        None => {
            if !host.starts_with("unix://") {
                tracing::warn!(
                    host,
                    "docker: the engine is reached over plaintext TCP; set DOCKER_TLS_VERIFY=1 \
                     and DOCKER_CERT_PATH to verify it with TLS"
                );
            }
            Docker::connect_with_host(&host).map_err(bollard_error)
        }
    };
    let docker = connected?;
    let negotiated = tokio::time::timeout(Duration::from_secs(20), docker.negotiate_version())
        .await
        .map_err(|_| DockerError::Unreachable {
            host: host.clone(),
            reason: "no answer within 20 s".to_owned(),
            next_step: next_step(),
        })?
        .map_err(|e| DockerError::Unreachable {
            host: host.clone(),
            reason: with_causes(&e),
            next_step: next_step(),
        })?;
    Ok((negotiated, host))
}

/// `error` and its sources, `: `-separated (hyper's "client error (Connect)" alone hides a
/// refused connection or an untrusted certificate).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Stream of an attached exec's output.
pub type ExecOutput = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;
/// The attached exec's stdin.
pub type ExecInput = Pin<Box<dyn AsyncWrite + Send>>;

/// An attached exec: its id, its output and its stdin.
pub struct Exec {
    /// Exec id (for `inspect_exec`).
    pub id: String,
    /// stdout/stderr frames.
    pub output: ExecOutput,
    /// stdin.
    pub input: ExecInput,
}

/// Why an exec could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ExecStartError {
    /// The API refused.
    #[error("{0}")]
    Api(#[from] bollard::errors::Error),
    /// The daemon did not attach.
    #[error("the daemon did not attach to the exec")]
    Detached,
}

/// Create and start an attached exec (stdin, stdout, stderr, no TTY) of `argv`, as `user`
/// (the container's user when `None`).
pub async fn start_exec(
    docker: &Docker,
    container: &str,
    argv: Vec<String>,
    user: Option<&str>,
) -> Result<Exec, ExecStartError> {
    let created = docker
        .create_exec(
            container,
            CreateExecOptions::<String> {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                cmd: Some(argv),
                user: user.map(str::to_owned),
                ..Default::default()
            },
        )
        .await?;
    match docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: None,
            }),
        )
        .await?
    {
        StartExecResults::Attached { output, input } => Ok(Exec {
            id: created.id,
            output,
            input,
        }),
        StartExecResults::Detached => Err(ExecStartError::Detached),
    }
}

/// One frame of an exec as a transport event (stdout = output, stderr = records).
fn event(
    frame: Result<LogOutput, bollard::errors::Error>,
) -> futures::future::Ready<Option<Result<TransportEvent, String>>> {
    futures::future::ready(match frame {
        Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
            Some(Ok(TransportEvent::Stdout(message)))
        }
        Ok(LogOutput::StdErr { message }) => Some(Ok(TransportEvent::Stderr(message))),
        Ok(LogOutput::StdIn { .. }) => None,
        Err(e) => Some(Err(e.to_string())),
    })
}

/// The exec's frames as transport events.
pub fn events(output: ExecOutput) -> impl Stream<Item = Result<TransportEvent, String>> + Unpin {
    output.filter_map(event)
}

/// The exec's frames as transport events, borrowed (a worker's streams outlive one request).
pub fn events_mut(
    output: &mut ExecOutput,
) -> impl Stream<Item = Result<TransportEvent, String>> + Unpin + '_ {
    output.filter_map(event)
}

/// Idle workers kept per session.
pub(crate) const MAX_IDLE: usize = 4;

/// Attached execs in the session's container, as the session's user: what the shared runner
/// starts its workers and one-shot commands with. A worker costs one `docker exec` (create,
/// attach, runc: ≈ 50 ms) once; the calls after it write a line to it.
pub(crate) struct DockerTransport {
    /// The engine.
    pub docker: Docker,
    /// The container's name (a replacement keeps it).
    pub container: String,
}

impl Transport for DockerTransport {
    type Process = Exec;

    async fn start(&self, argv: Vec<String>) -> Result<Exec, String> {
        start_exec(&self.docker, &self.container, argv, None)
            .await
            .map_err(|e| {
                format!(
                    "failed to start a process in container {}: {e}",
                    self.container
                )
            })
    }
}

impl PooledWorker for Exec {
    /// Still attached and quiet: anything it sent while idle (output, the end of its
    /// streams) means it no longer waits for a request.
    fn idle_alive(&mut self) -> bool {
        self.output.next().now_or_never().is_none()
    }
}

impl Process for Exec {
    fn io(&mut self) -> (Events<'_>, Control<'_>) {
        (
            Box::pin(events_mut(&mut self.output)),
            Box::pin(&mut self.input),
        )
    }
}

/// Who owns a session: enough to tell later whether that process is still alive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Machine id (`/etc/machine-id`), or the hostname.
    pub host: String,
    /// Boot id.
    pub boot: String,
    /// Process id.
    pub pid: u32,
    /// Process start time in clock ticks since boot.
    pub start: String,
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Field 22 (start time) of `/proc/PID/stat`.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19).map(str::to_owned)
}

impl Owner {
    /// This process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            host: read_trimmed("/etc/machine-id")
                .or_else(|| read_trimmed("/var/lib/dbus/machine-id"))
                .or_else(|| read_trimmed("/proc/sys/kernel/hostname"))
                .unwrap_or_else(|| "unknown".to_owned()),
            boot: read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
            pid,
            start: start_time(pid).unwrap_or_default(),
        }
    }

    /// The labels recording this owner.
    pub fn labels(&self) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_HOST.to_owned(), self.host.clone()),
            (LABEL_BOOT.to_owned(), self.boot.clone()),
            (LABEL_PID.to_owned(), self.pid.to_string()),
            (LABEL_START.to_owned(), self.start.clone()),
        ])
    }

    /// Whether an object with `labels` belongs to a dead owner on this machine. Objects of
    /// other machines (a shared remote daemon) are never judged stale.
    pub fn is_stale(&self, labels: &HashMap<String, String>) -> bool {
        let label = |k: &str| labels.get(k).map(String::as_str).unwrap_or_default();
        if label(LABEL_HOST) != self.host {
            return false;
        }
        if label(LABEL_BOOT) != self.boot {
            return true;
        }
        let Ok(pid) = label(LABEL_PID).parse::<u32>() else {
            return true;
        };
        match start_time(pid) {
            Some(start) => start != label(LABEL_START),
            None => true,
        }
    }
}

/// Remove containers and workspace volumes left by sessions whose runtime died (crash,
/// SIGKILL, Ctrl-C without cleanup), and spill volumes of this machine's roots that no longer
/// exist. Returns the names of the removed containers.
pub async fn reap_stale(docker: &Docker, owner: &Owner) -> Vec<String> {
    let mut removed = Vec::new();
    let filters = HashMap::from([("label".to_owned(), vec![LABEL_SESSION.to_owned()])]);
    let containers = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters.clone()),
            ..Default::default()
        }))
        .await
        .unwrap_or_default();
    for container in containers {
        let labels = container.labels.clone().unwrap_or_default();
        if !owner.is_stale(&labels) {
            continue;
        }
        let Some(id) = container.id.clone() else {
            continue;
        };
        let name = container
            .names
            .as_ref()
            .and_then(|n| n.first())
            .map(|n| n.trim_start_matches('/').to_owned())
            .unwrap_or(id.clone());
        match docker
            .remove_container(
                &id,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(()) => {
                tracing::info!(container = name, "docker: reaped a stale container");
                removed.push(name);
            }
            Err(error) => {
                tracing::warn!(container = name, %error, "docker: failed to reap a stale container")
            }
        }
    }
    if let Ok(volumes) = docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(filters),
        }))
        .await
    {
        for volume in volumes.volumes.unwrap_or_default() {
            if owner.is_stale(&volume.labels) {
                match docker
                    .remove_volume(
                        &volume.name,
                        None::<bollard::query_parameters::RemoveVolumeOptions>,
                    )
                    .await
                {
                    Ok(()) => tracing::info!(volume = volume.name, "docker: reaped a stale volume"),
                    // Still in use or already gone: the next session's reap tries again.
                    Err(error) => tracing::debug!(
                        volume = volume.name,
                        %error,
                        "docker: stale volume not reaped"
                    ),
                }
            }
        }
    }
    // Spill volumes of roots that no longer exist on this machine (Docker refuses to remove
    // one that a container still mounts).
    let spill_filter = HashMap::from([("label".to_owned(), vec![LABEL_SPILL_ROOT.to_owned()])]);
    if let Ok(volumes) = docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(spill_filter),
        }))
        .await
    {
        for volume in volumes.volumes.unwrap_or_default() {
            let ours = volume.labels.get(LABEL_HOST) == Some(&owner.host);
            let gone = volume
                .labels
                .get(LABEL_SPILL_ROOT)
                .is_some_and(|root| !std::path::Path::new(root).exists());
            if ours && gone {
                match docker
                    .remove_volume(
                        &volume.name,
                        None::<bollard::query_parameters::RemoveVolumeOptions>,
                    )
                    .await
                {
                    Ok(()) => tracing::info!(
                        volume = volume.name,
                        "docker: reaped the spill volume of a root that is gone"
                    ),
                    // Docker refuses while a container still mounts it: retried next time.
                    Err(error) => tracing::debug!(
                        volume = volume.name,
                        %error,
                        "docker: spill volume not reaped"
                    ),
                }
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_process_is_live_and_a_dead_pid_is_stale() {
        let owner = Owner::current();
        assert!(!owner.is_stale(&owner.labels()));
        let mut dead = owner.labels();
        dead.insert(LABEL_START.to_owned(), "1".to_owned());
        assert!(owner.is_stale(&dead));
        let mut other_boot = owner.labels();
        other_boot.insert(LABEL_BOOT.to_owned(), "another-boot".to_owned());
        assert!(owner.is_stale(&other_boot));
        let mut other_host = dead.clone();
        other_host.insert(LABEL_HOST.to_owned(), "another-machine".to_owned());
        assert!(!owner.is_stale(&other_host));
    }
}

#[cfg(test)]
mod engine_tests {
    use super::*;

    fn resolve(
        host: Option<&str>,
        vars: &[(&str, &str)],
        home: Option<&Path>,
    ) -> Result<Engine, DockerError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Engine::resolve(
            host,
            &|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
            home,
        )
    }

    fn cert_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for name in TLS_FILES {
            std::fs::write(dir.path().join(name), "pem").unwrap();
        }
        dir
    }

    #[test]
    fn the_host_comes_from_the_argument_then_docker_host_then_the_default_socket() {
        let engine = resolve(None, &[], None).unwrap();
        assert_eq!(engine.host, DEFAULT_HOST);
        let engine = resolve(None, &[("DOCKER_HOST", "unix:///x.sock")], None).unwrap();
        assert_eq!(engine.host, "unix:///x.sock");
        let engine = resolve(Some("unix:///y"), &[("DOCKER_HOST", "unix:///x")], None).unwrap();
        assert_eq!(engine.host, "unix:///y");
        // An empty DOCKER_HOST is unset, as for the docker CLI.
        assert_eq!(
            resolve(None, &[("DOCKER_HOST", "")], None).unwrap().host,
            DEFAULT_HOST
        );
    }

    #[test]
    fn tls_verify_takes_the_cert_path_or_home_and_a_missing_file_is_an_error() {
        let certs = cert_dir();
        let path = certs.path().to_str().unwrap();
        let tcp = Some("tcp://10.0.0.5:2376");
        let engine = resolve(
            tcp,
            &[("DOCKER_TLS_VERIFY", "1"), ("DOCKER_CERT_PATH", path)],
            None,
        )
        .unwrap();
        assert_eq!(engine.tls.as_deref(), Some(certs.path()));
        // https:// is TLS without the variable; ~/.docker is the default directory.
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".docker")).unwrap();
        for name in TLS_FILES {
            std::fs::write(home.path().join(".docker").join(name), "pem").unwrap();
        }
        let engine = resolve(Some("https://h:2376"), &[], Some(home.path())).unwrap();
        assert_eq!(engine.tls, Some(home.path().join(".docker")));
        // A missing key never turns into a plaintext connection.
        std::fs::remove_file(certs.path().join("key.pem")).unwrap();
        let error = resolve(
            tcp,
            &[("DOCKER_TLS_VERIFY", "1"), ("DOCKER_CERT_PATH", path)],
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("key.pem is missing"), "{error}");
        // No directory at all.
        let error = resolve(tcp, &[("DOCKER_TLS_VERIFY", "1")], None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("DOCKER_CERT_PATH"), "{error}");
    }

    #[test]
    fn an_ssh_engine_with_a_password_is_refused_without_repeating_it() {
        let error = resolve(Some("ssh://me:s3cret@h"), &[], None).unwrap_err();
        assert!(matches!(error, DockerError::SshEngine { .. }), "{error}");
        let text = error.to_string();
        assert!(
            text.contains("ssh://me:***@h")
                && text.contains("password")
                && !text.contains("s3cret"),
            "{text}"
        );
    }

    #[test]
    fn ssh_engines_take_a_target_and_no_path() {
        let engine = resolve(Some("ssh://me@h:2222"), &[("DOCKER_TLS_VERIFY", "1")], None).unwrap();
        assert_eq!(engine.tls, None);
        assert_eq!(engine.transport(), EngineTransport::Ssh);
        let error = resolve(Some("ssh://h/var/run/docker.sock"), &[], None).unwrap_err();
        assert!(matches!(error, DockerError::SshEngine { .. }), "{error}");
        assert!(error.to_string().contains("no path"), "{error}");
    }

    #[test]
    fn the_transport_follows_the_scheme_and_tls() {
        let certs = cert_dir();
        let path = certs.path().to_str().unwrap();
        let tls = [("DOCKER_TLS_VERIFY", "1"), ("DOCKER_CERT_PATH", path)];
        for (host, vars, transport, remote) in [
            ("unix:///s", &[][..], EngineTransport::Unix, false),
            ("tcp://h:2375", &[][..], EngineTransport::Tcp, true),
            ("tcp://h:2376", &tls[..], EngineTransport::TcpTls, true),
            ("https://h:2376", &tls[..], EngineTransport::TcpTls, true),
            ("ssh://h", &[][..], EngineTransport::Ssh, true),
        ] {
            let engine = resolve(Some(host), vars, None).unwrap();
            assert_eq!(engine.transport(), transport, "{host}");
            assert_eq!(transport.is_remote(), remote, "{host}");
        }
    }

    #[test]
    fn sockets_ignore_tls_and_unverified_tls_and_unknown_schemes_are_refused() {
        let engine = resolve(Some("unix:///s"), &[("DOCKER_TLS_VERIFY", "1")], None).unwrap();
        assert_eq!(engine.tls, None);
        let plain = resolve(
            Some("tcp://127.0.0.1:2375"),
            &[("DOCKER_TLS_VERIFY", "")],
            None,
        )
        .unwrap();
        assert_eq!(plain.tls, None, "an empty DOCKER_TLS_VERIFY is unset");
        for (host, vars, needle) in [
            (
                "tcp://h:2376",
                &[("DOCKER_TLS", "1")][..],
                "DOCKER_TLS_VERIFY=1",
            ),
            ("http://h:2376", &[("DOCKER_TLS_VERIFY", "1")][..], "tcp://"),
            ("npipe:////./pipe/docker", &[][..], "unsupported scheme"),
        ] {
            let error = resolve(Some(host), vars, None).unwrap_err();
            assert!(matches!(error, DockerError::Tls { .. }), "{host}: {error}");
            assert!(error.to_string().contains(needle), "{host}: {error}");
        }
    }
}
