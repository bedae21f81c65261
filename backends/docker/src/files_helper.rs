//! File operations and search through `cordon-helper serve` in the container (bind mode, a
//! helper for the engine's architecture that the image can run): the local backend's code on
//! the far side of one attached `docker exec`, confined with `openat2(RESOLVE_BENEATH)` and
//! searching with the in-process ripgrep libraries, instead of one shell worker request per
//! call. Commands run on the same helper (module `commands`), in its container profile.
//!
//! It does not decide whether the helper can run (that is [`crate::egress::choose_helper`]'s
//! check plus a start that answers), and it keeps spill files on the shell path (they live in
//! the per-root spill volume, not in the helper's state directory).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::container::LogOutput;
use cordon_core::sandbox::SandboxSpec;
use cordon_helper::backend::HelperOps;
use cordon_helper::{Connection, Connector, HelperBackend, HelperError, SessionStart};
use cordon_ops::{BackendId, DirEntry, FileMeta, FileOperations, FsError, SpillWriter};
use futures::StreamExt;

use crate::Inner;
use crate::client::{self, Exec};
use crate::egress::HELPER_IN_CONTAINER;
use crate::helper_socket::{self, HelperSockets};
use crate::plan::{HOME_DIR, SPILL_DIR};
use crate::recovery::ENGINE_TIMEOUT;

/// Whether a session runs file operations and search through the helper.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FilesHelper {
    /// The helper where it can run, else the POSIX shell workers (the reason is logged and
    /// reported by [`crate::DockerBackend::files_path`]).
    #[default]
    Auto,
    /// Always the POSIX shell workers.
    Shell,
    /// The helper, or the session does not start.
    Required,
}

/// Which path a session's file operations and search take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilesPath {
    /// `cordon-helper serve` in the container.
    Helper,
    /// The POSIX shell workers, and why not the helper.
    Shell {
        /// Why the helper is not used.
        reason: String,
    },
}

impl std::fmt::Display for FilesPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FilesPath::Helper => f.write_str("helper"),
            FilesPath::Shell { reason } => write!(f, "shell ({reason})"),
        }
    }
}

/// The argv of the file helper in the container.
pub(crate) fn serve_argv() -> Vec<String> {
    vec![HELPER_IN_CONTAINER.to_owned(), "serve".to_owned()]
}

/// Starts `cordon-helper serve` in the container as the session's user: connected to a Unix
/// socket of this process where it can be (module `helper_socket`), else with its stdin and
/// stdout attached through the engine; its stderr goes to this process's log either way. A
/// start the engine refuses is explained by the session (a dead container is replaced, and
/// the error says so).
pub(crate) struct DockerConnector {
    pub docker: Docker,
    pub container: String,
    pub user: String,
    /// What starts the helper: [`serve_argv`] for a bind-mounted binary, a hash-checking
    /// start for a copied one (`helper_copy`).
    pub argv: Vec<String>,
    /// The session's socket directory, when the helper may connect through one.
    pub sockets: Option<Arc<HelperSockets>>,
    /// The session, once it exists (it owns this connector, hence weak).
    pub session: Arc<OnceLock<Weak<Inner>>>,
}

/// Why a start through a socket did not give a connection.
enum SocketStart {
    /// The helper could not be started at all (the same failure the attached start has).
    Failed(HelperError),
    /// Sockets do not work for this session; the attached start is used instead.
    Unusable(String),
}

/// Aborts the task when dropped (the drain of a socket-connected helper's output).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl DockerConnector {
    /// Start `argv` as an attached exec; a refusal is explained by the session.
    async fn start_exec(&self, argv: Vec<String>) -> Result<Exec, HelperError> {
        let session = self.session.get().and_then(Weak::upgrade);
        let seen = session.as_ref().map(|inner| inner.recovery.generation());
        match client::start_exec(&self.docker, &self.container, argv, Some(&self.user)).await {
            Ok(exec) => Ok(exec),
            Err(error) => {
                let reason = match (session, seen) {
                    (Some(inner), Some(seen)) => {
                        inner.explain_failure(seen, error.to_string()).await
                    }
                    _ => error.to_string(),
                };
                Err(HelperError::Spawn {
                    program: PathBuf::from(HELPER_IN_CONTAINER),
                    source: std::io::Error::other(reason),
                })
            }
        }
    }

    /// The helper over its attached stdin and stdout.
    async fn connect_attached(&self) -> Result<Connection, HelperError> {
        let Exec { id, output, input } = self.start_exec(self.argv.clone()).await?;
        let container = self.container.clone();
        let stdout = output.filter_map(move |item| {
            let container = container.clone();
            async move {
                match item {
                    Ok(LogOutput::StdOut { message }) => Some(Ok(message)),
                    Ok(LogOutput::StdErr { message }) => {
                        log_stderr(&container, &message);
                        None
                    }
                    Ok(LogOutput::StdIn { .. } | LogOutput::Console { .. }) => None,
                    Err(error) => Some(Err(std::io::Error::other(error))),
                }
            }
        });
        tracing::debug!(container = %self.container, exec = %id, "docker: file helper started (attached)");
        Ok(Connection {
            reader: Box::new(tokio_util::io::StreamReader::new(Box::pin(stdout))),
            writer: Box::new(input),
            keep: Box::new(()),
        })
    }

    /// The helper over a socket of `sockets` (module `helper_socket`).
    async fn connect_socket(&self, sockets: &HelperSockets) -> Result<Connection, SocketStart> {
        let pending = sockets.listen().map_err(|error| {
            SocketStart::Unusable(format!("failed to bind the helper's socket: {error}"))
        })?;
        let mut argv = self.argv.clone();
        argv.extend(["--connect".to_owned(), pending.container_path.clone()]);
        let Exec { id, output, input } =
            self.start_exec(argv).await.map_err(SocketStart::Failed)?;
        let (ended_tx, ended_rx) = tokio::sync::oneshot::channel::<()>();
        let container = self.container.clone();
        let drain = AbortOnDrop(tokio::spawn(async move {
            // Held open while the helper runs; it does not read it.
            let _input = input;
            let mut output = output;
            while let Some(item) = output.next().await {
                match item {
                    Ok(LogOutput::StdErr { message }) => log_stderr(&container, &message),
                    Ok(LogOutput::StdOut { message }) => tracing::debug!(
                        %container,
                        bytes = message.len(),
                        "docker: output of the socket-connected helper on stdout (ignored)"
                    ),
                    Ok(LogOutput::StdIn { .. } | LogOutput::Console { .. }) => {}
                    Err(error) => {
                        tracing::debug!(%container, %error, "docker: the helper's attach stream ended");
                        break;
                    }
                }
            }
            let _ = ended_tx.send(());
        }));
        let docker = self.docker.clone();
        let exec = id.clone();
        // The engine records the exec's pid once the runtime reports the start, which can be
        // after the helper already connected: a pid not known yet is asked again (the wait
        // is bounded by the connect timeout around it).
        let expected_pid = move || {
            let (docker, exec) = (docker.clone(), exec.clone());
            async move {
                let mut pause = Duration::from_millis(1);
                loop {
                    match tokio::time::timeout(ENGINE_TIMEOUT, docker.inspect_exec(&exec)).await {
                        Ok(Ok(inspect)) => match inspect.pid {
                            Some(pid) if pid > 0 => return Ok(pid),
                            _ if inspect.running == Some(false) && inspect.exit_code.is_some() => {
                                return Err("the helper ended before the engine reported its pid"
                                    .to_owned());
                            }
                            _ => {}
                        },
                        Ok(Err(error)) => {
                            return Err(format!("failed to inspect the helper's exec: {error}"));
                        }
                        Err(_) => {
                            return Err(
                                "the engine did not report the helper's pid in time".to_owned()
                            );
                        }
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        };
        let accepted = tokio::select! {
            accepted = helper_socket::accept_helper(pending, expected_pid) => {
                accepted.map_err(SocketStart::Unusable)
            }
            _ = ended_rx => Err(self.ended_before_connecting(&id).await),
            () = tokio::time::sleep(helper_socket::CONNECT_TIMEOUT) => Err(SocketStart::Unusable(format!(
                "the helper did not connect to its socket within {:?}",
                helper_socket::CONNECT_TIMEOUT
            ))),
        };
        let stream = accepted?;
        tracing::debug!(container = %self.container, exec = %id, "docker: file helper started (socket)");
        let (reader, writer) = stream.into_split();
        Ok(Connection {
            reader: Box::new(reader),
            writer: Box::new(writer),
            keep: Box::new(drain),
        })
    }

    /// Why a helper started with `--connect` ended without being accepted: status 3, it could
    /// not reach the socket from the container; status 0, it connected but was dropped (its
    /// pid is not the one the engine reports); anything else is a failed start.
    async fn ended_before_connecting(&self, exec: &str) -> SocketStart {
        let status =
            match tokio::time::timeout(ENGINE_TIMEOUT, self.docker.inspect_exec(exec)).await {
                Ok(Ok(inspect)) => inspect.exit_code,
                _ => None,
            };
        ended_before_connecting(status)
    }
}

/// What a `--connect` helper's exit `status` says about the socket (see
/// [`DockerConnector::ended_before_connecting`]).
fn ended_before_connecting(status: Option<i64>) -> SocketStart {
    match status {
        Some(3) => SocketStart::Unusable(
            "the helper cannot reach its socket from the container (its message is logged)"
                .to_owned(),
        ),
        // It connected, was dropped as not the exec's process, and ended with its input.
        Some(0) => SocketStart::Unusable(
            "the helper's connection did not come from the pid the engine reports for it \
             (an engine in another pid namespace?)"
                .to_owned(),
        ),
        status => SocketStart::Failed(HelperError::Spawn {
            program: PathBuf::from(HELPER_IN_CONTAINER),
            source: std::io::Error::other(format!(
                "the helper ended before it connected to its socket (exit status {status:?}; its message is logged)"
            )),
        }),
    }
}

/// One stderr frame of a helper, to this process's log.
fn log_stderr(container: &str, message: &[u8]) {
    tracing::warn!(
        %container,
        line = %String::from_utf8_lossy(message).trim_end(),
        "docker: file helper"
    );
}

#[async_trait]
impl Connector for DockerConnector {
    async fn connect(&self) -> Result<Connection, HelperError> {
        if let Some(sockets) = self.sockets.as_ref().filter(|s| s.in_use()) {
            match self.connect_socket(sockets).await {
                Ok(connection) => return Ok(connection),
                Err(SocketStart::Failed(error)) => return Err(error),
                Err(SocketStart::Unusable(reason)) => sockets.give_up(&reason),
            }
        }
        self.connect_attached().await
    }
}

/// The session the helper opens: the container's workspace, home, and the extra roots at the
/// paths they are mounted at (the same as on the host), the spill directory readable; its
/// commands sandboxed in the container profile (module `commands`). A copied workspace
/// (`copied`) is copied back without its protected and denied paths, so commands are not
/// confined around them there (module `copy`).
pub(crate) fn session_start(
    workspace: &Path,
    spec: &SandboxSpec,
    extra_roots: &[(PathBuf, bool)],
    copied: bool,
) -> SessionStart {
    let mut spec = crate::commands::commands_spec(spec);
    let as_string = |path: &Path| path.to_string_lossy().into_owned();
    spec.readable_roots = std::iter::once(SPILL_DIR.to_owned())
        .chain(
            extra_roots
                .iter()
                .filter(|(_, writable)| !writable)
                .map(|(p, _)| as_string(p)),
        )
        .collect();
    spec.writable_roots = extra_roots
        .iter()
        .filter(|(_, writable)| *writable)
        .map(|(p, _)| as_string(p))
        .collect();
    SessionStart {
        home: Some(cordon_helper::protocol::WirePath(PathBuf::from(HOME_DIR))),
        profile: cordon_helper::protocol::SandboxProfile::Container,
        workspace_is_copy: copied,
        ..SessionStart::new(workspace, spec)
    }
}

/// Start the file helper; `Err` is why the session keeps the shell workers.
pub(crate) async fn start(
    connector: DockerConnector,
    session: SessionStart,
) -> Result<HelperBackend, String> {
    HelperBackend::start(Box::new(connector), session)
        .await
        .map_err(|error| format!("cordon-helper did not start in the container: {error}"))
}

/// File operations through the helper; spill files on the shell workers (`shell`), and the
/// Docker backend's id.
pub(crate) struct HelperFiles {
    pub helper: Arc<HelperOps>,
    pub shell: Arc<dyn FileOperations>,
    /// Empty directories made only to mount them read-only, left out of listings (as on the
    /// shell path: the file tools show the workspace as the operator left it).
    pub pinned: Vec<PathBuf>,
}

#[async_trait]
impl FileOperations for HelperFiles {
    fn backend_id(&self) -> &BackendId {
        self.shell.backend_id()
    }

    fn root(&self) -> &Path {
        self.shell.root()
    }

    fn home(&self) -> Option<&Path> {
        self.shell.home()
    }

    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        self.helper.read_file(path).await
    }

    async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
        self.helper.read_head(path, max_bytes).await
    }

    async fn read_range(
        &self,
        path: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        self.helper.read_range(path, offset, max_bytes).await
    }

    async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
        self.helper.write_file(path, data).await
    }

    async fn create_dir_all(&self, path: &Path) -> Result<(), FsError> {
        self.helper.create_dir_all(path).await
    }

    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
        self.helper.metadata(path).await
    }

    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        let mut entries = self.helper.read_dir(path).await?;
        if !self.pinned.is_empty() {
            let canon = self.helper.canonicalize(path).await?;
            entries.retain(|entry| !self.pinned.contains(&canon.join(&entry.name)));
        }
        Ok(entries)
    }

    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        self.helper.canonicalize(path).await
    }

    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        self.shell.create_spill_file().await
    }

    fn spill_dir(&self) -> Option<&Path> {
        self.shell.spill_dir()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_that_ended_unaccepted_falls_back_only_for_socket_reasons() {
        let unusable = |status| match ended_before_connecting(status) {
            SocketStart::Unusable(reason) => reason,
            SocketStart::Failed(error) => panic!("{status:?} failed the start: {error}"),
        };
        assert!(unusable(Some(3)).contains("cannot reach its socket"));
        assert!(unusable(Some(0)).contains("pid"));
        for status in [Some(1), Some(137), None] {
            match ended_before_connecting(status) {
                SocketStart::Failed(error) => {
                    assert!(
                        error.to_string().contains("ended before it connected"),
                        "{error}"
                    );
                }
                SocketStart::Unusable(reason) => panic!("{status:?} gave up the socket: {reason}"),
            }
        }
    }

    #[test]
    fn the_helper_serves_from_the_mounted_binary() {
        assert_eq!(
            serve_argv(),
            ["/cordon-egress-helper/cordon-helper", "serve"]
        );
    }

    #[test]
    fn the_session_names_container_paths() {
        let spec = SandboxSpec {
            readable_roots: vec!["~/docs".to_owned()],
            writable_roots: vec!["../out".to_owned()],
            ..SandboxSpec::default()
        };
        let start = session_start(
            Path::new("/workspace"),
            &spec,
            &[
                (PathBuf::from("/home/u/docs"), false),
                (PathBuf::from("/srv/out"), true),
            ],
            false,
        );
        assert_eq!(start.root.0, PathBuf::from("/workspace"));
        assert_eq!(start.home.map(|h| h.0), Some(PathBuf::from("/home/cordon")));
        assert_eq!(start.spec.readable_roots, ["/cordon-spill", "/home/u/docs"]);
        assert_eq!(start.spec.writable_roots, ["/srv/out"]);
        assert_eq!(
            start.profile,
            cordon_helper::protocol::SandboxProfile::Container
        );
        assert!(!start.workspace_is_copy);
        assert!(session_start(Path::new("/workspace"), &spec, &[], true).workspace_is_copy);
    }
}
