//! [`HelperBackend`]: a whole [`Backend`] over helpers a [`Connector`] starts, with a new
//! helper (and session) started for the next call after one died. A call in flight when its
//! helper dies fails with a "backend unavailable" error that says so; what it was doing on the
//! far side is gone with the helper (its commands' trees die with their sandbox init).
//!
//! A [`Connector`] is the one thing a transport brings: start a helper and hand over its two
//! streams. [`PipeConnector`] runs `cordon-helper serve` as a child process on this host (the
//! local pipe transport, used to test the protocol against the conformance suite); the SSH
//! backend brings one that starts it over an exec channel.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use async_trait::async_trait;
use cordon_ops::{
    Backend, BackendId, BashOperations, DirEntry, ExecError, ExecOutcome, ExecRequest, FileMeta,
    FileOperations, FindOutput, FindRequest, FsError, GrepOutput, GrepRequest, SearchError,
    SearchOperations, ShutdownError, SpillWriter,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::client::{HelperClient, HelperConnection, RemoteLayout};
use crate::error::HelperError;
use crate::protocol::SessionStart;

/// The environment variable naming the helper program.
pub const HELPER_ENV: &str = "CORDON_HELPER";

/// The helper program's file name.
pub const HELPER_NAME: &str = "cordon-helper";

/// A started helper's streams, and whatever keeps it alive (a child process, a channel):
/// dropped when the helper is no longer used.
pub struct Connection {
    /// The helper's output.
    pub reader: Box<dyn AsyncRead + Send + Unpin>,
    /// The helper's input.
    pub writer: Box<dyn AsyncWrite + Send + Unpin>,
    /// Held while the helper is in use.
    pub keep: Box<dyn Any + Send + Sync>,
}

/// Starts helpers: one per session, and again after one died.
#[async_trait]
pub trait Connector: Send + Sync {
    /// Start a helper and return its streams.
    async fn connect(&self) -> Result<Connection, HelperError>;
}

/// Runs `PROGRAM serve` as a child process on this host, talking over its stdin/stdout
/// (stderr is inherited: the helper's log lines). The child is killed when dropped.
#[derive(Clone, Debug)]
pub struct PipeConnector {
    program: PathBuf,
}

impl PipeConnector {
    /// A connector running `program`.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        PipeConnector {
            program: program.into(),
        }
    }

    /// The helper program.
    pub fn program(&self) -> &Path {
        &self.program
    }
}

#[async_trait]
impl Connector for PipeConnector {
    async fn connect(&self) -> Result<Connection, HelperError> {
        let spawn = |source| HelperError::Spawn {
            program: self.program.clone(),
            source,
        };
        let mut child = tokio::process::Command::new(&self.program)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn)?;
        let missing = || spawn(std::io::Error::other("its standard streams were not piped"));
        let writer = child.stdin.take().ok_or_else(missing)?;
        let reader = child.stdout.take().ok_or_else(missing)?;
        tracing::debug!(program = %self.program.display(), pid = ?child.id(), "helper started");
        Ok(Connection {
            reader: Box::new(reader),
            writer: Box::new(writer),
            keep: Box::new(child),
        })
    }
}

/// Where the helper program is: `explicit` when given, else `$CORDON_HELPER`, else
/// `cordon-helper` next to the running program. The first candidate that is a file wins;
/// none is an error listing the places looked at.
pub fn locate_helper(explicit: Option<&Path>) -> Result<PathBuf, HelperError> {
    let mut looked = Vec::new();
    let candidates = explicit
        .map(Path::to_path_buf)
        .into_iter()
        .chain(std::env::var_os(HELPER_ENV).map(PathBuf::from))
        .chain(
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(|dir| dir.join(HELPER_NAME))),
        );
    for candidate in candidates {
        if candidate.is_file() {
            return Ok(candidate);
        }
        looked.push(candidate);
    }
    Err(HelperError::NotFound { looked })
}

/// The live helper and what keeps it.
struct Live {
    client: Arc<HelperClient>,
    _keep: Box<dyn Any + Send + Sync>,
}

/// The operations of a [`HelperBackend`]: each call takes the live helper (starting a new one
/// when the last one died) and runs on it.
pub struct HelperOps {
    connector: Box<dyn Connector>,
    start: SessionStart,
    approver: Option<Arc<dyn cordon_egress::ask::EgressApprover>>,
    id: BackendId,
    root: PathBuf,
    home: Option<PathBuf>,
    spill_dir: PathBuf,
    missing_layers: Vec<String>,
    layout: Arc<RemoteLayout>,
    live: tokio::sync::Mutex<Option<Live>>,
    shut_down: std::sync::atomic::AtomicBool,
}

impl HelperOps {
    /// The live helper; a dead one is replaced by a new helper with a new session first.
    async fn client(&self) -> Result<Arc<HelperClient>, HelperError> {
        let mut live = self.live.lock().await;
        if let Some(current) = live.as_ref()
            && !current.client.is_dead()
        {
            return Ok(Arc::clone(&current.client));
        }
        if self.shut_down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(HelperError::Closed {
                reason: "the session was shut down".to_owned(),
            });
        }
        tracing::warn!(backend = %self.id, "helper: the last helper died; starting a new one");
        *live = None;
        let fresh = start_live(
            self.connector.as_ref(),
            self.start.clone(),
            Some(Arc::clone(&self.layout)),
            self.approver.clone(),
        )
        .await?;
        if fresh.client.root() != self.root {
            return Err(HelperError::RootChanged {
                expected: self.root.clone(),
                found: fresh.client.root().to_path_buf(),
            });
        }
        let weaker: Vec<&str> = fresh
            .client
            .missing_layers()
            .iter()
            .filter(|layer| !self.missing_layers.contains(layer))
            .map(String::as_str)
            .collect();
        if !weaker.is_empty() {
            tracing::warn!(backend = %self.id, missing = ?weaker, "helper: refused a new helper with a weaker sandbox");
            return Err(HelperError::SandboxWeakened {
                missing: weaker.join("; "),
            });
        }
        let client = Arc::clone(&fresh.client);
        *live = Some(fresh);
        Ok(client)
    }

    /// The live helper, if there is one and it is alive (no restart).
    pub async fn current(&self) -> Option<Arc<HelperClient>> {
        let live = self.live.lock().await;
        live.as_ref()
            .filter(|live| !live.client.is_dead())
            .map(|live| Arc::clone(&live.client))
    }

    fn fs_error(&self, op: &'static str, path: &Path, error: HelperError) -> FsError {
        FsError::Backend {
            op,
            path: path.to_path_buf(),
            reason: error.to_string(),
        }
    }
}

async fn start_live(
    connector: &dyn Connector,
    start: SessionStart,
    layout: Option<Arc<RemoteLayout>>,
    approver: Option<Arc<dyn cordon_egress::ask::EgressApprover>>,
) -> Result<Live, HelperError> {
    let Connection {
        reader,
        writer,
        keep,
    } = connector.connect().await?;
    let mut client = HelperConnection::open(reader, writer)
        .await?
        .start_asking(start, approver)
        .await?;
    if let Some(layout) = layout {
        client.share_layout(layout);
    }
    Ok(Live {
        client: Arc::new(client),
        _keep: keep,
    })
}

/// A backend whose every operation runs in a helper: the local backend on the far side of
/// the connector's stream.
pub struct HelperBackend {
    ops: Arc<HelperOps>,
}

impl std::fmt::Debug for HelperBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperBackend")
            .field("id", &self.ops.id)
            .finish()
    }
}

impl HelperBackend {
    /// Start a helper with `connector` and open the session `start` in it.
    pub async fn start(
        connector: Box<dyn Connector>,
        start: SessionStart,
    ) -> Result<HelperBackend, HelperError> {
        HelperBackend::start_asking(connector, start, None).await
    }

    /// As [`HelperBackend::start`], with the helper's egress proxy asking `approver` about
    /// destinations an ask entry (`[network] ask`) matches (through the client; see
    /// [`HelperConnection::start_asking`]).
    pub async fn start_asking(
        connector: Box<dyn Connector>,
        start: SessionStart,
        approver: Option<Arc<dyn cordon_egress::ask::EgressApprover>>,
    ) -> Result<HelperBackend, HelperError> {
        let live = start_live(connector.as_ref(), start.clone(), None, approver.clone()).await?;
        let client = &live.client;
        let files: &dyn FileOperations = client.as_ref();
        let ops = HelperOps {
            id: files.backend_id().clone(),
            root: client.root().to_path_buf(),
            home: files.home().map(Path::to_path_buf),
            spill_dir: files.spill_dir().map(Path::to_path_buf).unwrap_or_default(),
            missing_layers: client.missing_layers().to_vec(),
            layout: Arc::clone(client.layout()),
            connector,
            start,
            approver,
            live: tokio::sync::Mutex::new(Some(live)),
            shut_down: std::sync::atomic::AtomicBool::new(false),
        };
        Ok(HelperBackend { ops: Arc::new(ops) })
    }

    /// The canonical workspace root on the helper's host.
    pub fn root(&self) -> &Path {
        &self.ops.root
    }

    /// The operations (to reach the live helper, e.g. in tests).
    pub fn ops(&self) -> &Arc<HelperOps> {
        &self.ops
    }
}

#[async_trait]
impl Backend for HelperBackend {
    fn id(&self) -> &BackendId {
        &self.ops.id
    }

    fn files(&self) -> Arc<dyn FileOperations> {
        self.ops.clone()
    }

    fn bash(&self) -> Arc<dyn BashOperations> {
        self.ops.clone()
    }

    fn search(&self) -> Arc<dyn SearchOperations> {
        self.ops.clone()
    }

    fn missing_layers(&self) -> Vec<String> {
        self.ops.missing_layers.clone()
    }

    async fn shutdown(&self) -> Result<(), ShutdownError> {
        self.ops
            .shut_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let live = self.ops.live.lock().await.take();
        if let Some(live) = live {
            if let Err(error) = live.client.shutdown().await {
                // The helper's own cleanup runs at the end of its input all the same.
                tracing::warn!(%error, backend = %self.ops.id, "helper: shutdown request failed");
            }
            tracing::debug!(backend = %self.ops.id, "helper: session ended");
        }
        Ok(())
    }
}

#[async_trait]
impl FileOperations for HelperOps {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn home(&self) -> Option<&Path> {
        self.home.as_deref()
    }

    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        let client = self
            .client()
            .await
            .map_err(|e| self.fs_error("read", path, e))?;
        client.read_file(path).await
    }

    async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
        let client = self
            .client()
            .await
            .map_err(|e| self.fs_error("read", path, e))?;
        client.read_head(path, max_bytes).await
    }

    async fn read_range(
        &self,
        path: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        let client = self
            .client()
            .await
            .map_err(|e| self.fs_error("read", path, e))?;
        client.read_range(path, offset, max_bytes).await
    }

    async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
        let client = self
            .client()
            .await
            .map_err(|e| self.fs_error("write", path, e))?;
        client.write_file(path, data).await
    }

    async fn create_dir_all(&self, path: &Path) -> Result<(), FsError> {
        let client = self
            .client()
            .await
            .map_err(|e| self.fs_error("create directory", path, e))?;
        client.create_dir_all(path).await
    }

    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
        let client = self
            .client()
            .await
            .map_err(|e| self.fs_error("inspect", path, e))?;
        client.metadata(path).await
    }

    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        let client = self
            .client()
            .await
            .map_err(|e| self.fs_error("list", path, e))?;
        client.read_dir(path).await
    }

    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        let client = self
            .client()
            .await
            .map_err(|e| self.fs_error("resolve", path, e))?;
        client.canonicalize(path).await
    }

    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        let client = self
            .client()
            .await
            .map_err(|e| self.fs_error("create spill file", &self.spill_dir, e))?;
        client.create_spill_file().await
    }

    fn spill_dir(&self) -> Option<&Path> {
        Some(&self.spill_dir)
    }
}

#[async_trait]
impl BashOperations for HelperOps {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    async fn exec(
        &self,
        request: ExecRequest,
        cancel: CancellationToken,
        output: mpsc::Sender<Vec<u8>>,
    ) -> Result<ExecOutcome, ExecError> {
        let client = self.client().await.map_err(|error| ExecError::Backend {
            reason: error.to_string(),
        })?;
        client.exec(request, cancel, output).await
    }

    fn denial_layout(&self) -> Option<&dyn cordon_ops::denial::DenialLayout> {
        Some(&*self.layout)
    }
}

#[async_trait]
impl SearchOperations for HelperOps {
    async fn grep(
        &self,
        request: GrepRequest,
        cancel: CancellationToken,
    ) -> Result<GrepOutput, SearchError> {
        let client = self.client().await.map_err(|error| SearchError::Backend {
            reason: error.to_string(),
        })?;
        client.grep(request, cancel).await
    }

    async fn find(
        &self,
        request: FindRequest,
        cancel: CancellationToken,
    ) -> Result<FindOutput, SearchError> {
        let client = self.client().await.map_err(|error| SearchError::Backend {
            reason: error.to_string(),
        })?;
        client.find(request, cancel).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_helper_path_wins_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let program = dir.path().join(HELPER_NAME);
        std::fs::write(&program, b"").expect("write");
        assert_eq!(locate_helper(Some(&program)).expect("found"), program);
        let missing = dir.path().join("nowhere");
        match locate_helper(Some(&missing)) {
            Err(HelperError::NotFound { looked }) => assert_eq!(looked.first(), Some(&missing)),
            // CORDON_HELPER or a helper beside the test binary may exist; the explicit path
            // was still looked at first and skipped.
            Ok(found) => assert_ne!(found, missing),
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
}
