//! `cordon-backend-docker`: Cordon's Docker backend (bollard): one hardened container per
//! session, implementing the backend traits of `cordon_ops`.
//!
//! A session ([`DockerBackend::start`]) reaps containers of crashed sessions, checks that the
//! image exists (it never pulls), creates a container (no network unless the spec enables it,
//! all capabilities dropped, `no-new-privileges`, read-only root filesystem, tini as init,
//! memory/CPU/pids limits, private `/tmp` and home, the uid:gid owning the host workspace,
//! owner labels) with the workspace bind-mounted at `/workspace` (or copied into a volume, for
//! engines reached over tcp or ssh, which may run elsewhere) and protected paths mounted read-only on top, and a per-root spill volume at
//! `/cordon-spill` so bash's full-output files outlive the session. Every operation is a
//! plain request served by one of the session's workers (`cordon-remote` worker processes kept
//! running in the container between calls, so a call costs no `docker exec`);
//! [`Backend::shutdown`] (or dropping the backend) removes the container. A container that
//! dies (killed, OOM-killed init, removed, engine restart) is replaced by the call that
//! notices, which tells the model what happened (module `recovery`).
//!
//! It does not know any tool; it does not install signal handlers (a CLI that wants Ctrl-C
//! cleanup calls `shutdown`; a killed runtime's container is reaped by the next session).
#![warn(missing_docs)]

mod bash;
pub mod client;
mod commands;
mod copy;
mod egress;
mod error;
mod files;
mod files_helper;
mod helper_copy;
mod helper_socket;
mod mask;
pub mod plan;
mod recovery;
mod search;
mod ssh_engine;
mod start;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, VolumeCreateRequest};
use bollard::query_parameters::RemoveContainerOptions;
use cordon_backend_local::git_guard::{self, GitGuard};
use cordon_core::sandbox::{NetworkMode, SandboxSpec};
use cordon_ops::BackendId;
use cordon_ops::leftovers::{self, SpillBounds, SpillFile};
use cordon_remote::files::PathRules;
use cordon_remote::runner::Runner;
use cordon_remote::transport::{Collected, StdinEnd, collect};

use crate::client::DockerTransport;
pub use crate::client::{EngineKind, EngineTransport, Owner};
pub use crate::commands::CommandsPath;
pub use crate::egress::{
    EGRESS_PORT, EgressAsker, EgressMounts, EgressResolver, HELPER_IN_CONTAINER, SOCKET_DIR,
    choose_helper,
};
pub use crate::error::{DockerError, Hints};
pub use crate::files_helper::{FilesHelper, FilesPath};
pub use crate::plan::UnlistedBind;
use crate::plan::{ContainerPlan, HOME_DIR, HelperMount, SPILL_DIR, WorkspaceSource};
pub use cordon_backend_ssh::tunnel::TunnelConfig;

/// The default image.
pub const DEFAULT_IMAGE: &str = "cordon-sandbox:latest";
/// Where the workspace appears inside the container.
pub const CONTAINER_WORKSPACE: &str = "/workspace";
/// How the host workspace reaches the container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkspaceMode {
    /// Bind mount of the host directory (the daemon runs on this machine).
    #[default]
    Bind,
    /// Tar copy into a session volume at start and back out on [`DockerBackend::sync_out`] and
    /// at shutdown (for remote daemons, where host paths mean nothing).
    Copy,
}

/// What a Docker session needs.
#[derive(Clone, Debug)]
pub struct DockerConfig {
    /// The host workspace root.
    pub root: PathBuf,
    /// The sandbox spec.
    pub spec: SandboxSpec,
    /// The image (default [`DEFAULT_IMAGE`]).
    pub image: String,
    /// The daemon URI; `None` uses `DOCKER_HOST` or the default socket.
    pub docker_host: Option<String>,
    /// Bind or copy.
    pub mode: WorkspaceMode,
    /// uid:gid of commands; `None` uses the owner of `root`.
    pub user: Option<(u32, u32)>,
    /// Network to join when the spec enables the network; `None` uses the daemon's default.
    pub network: Option<String>,
    /// Filtered network mode: the `cordon-helper` binary the forwarder runs; `None` looks for
    /// it like `cordon_helper::locate_helper` (`CORDON_HELPER`, next to the executable).
    pub helper: Option<PathBuf>,
    /// Filtered network mode: resolves destination names for the proxy; `None` uses the
    /// system resolver.
    pub egress_resolver: Option<EgressResolver>,
    /// Filtered network mode: who is asked about destinations an `[network] ask` entry
    /// matches; `None`: nobody, they are refused.
    pub egress_asker: Option<EgressAsker>,
    /// Whether file operations and search run through `cordon-helper serve` in the container.
    pub files_helper: FilesHelper,
    /// How this process talks to that helper.
    pub helper_transport: HelperTransport,
    /// How an `ssh://` engine is reached (identity, known_hosts, ssh config, agent; the
    /// default reads them like `ssh` does). Its `host` is ignored: the engine URI names it.
    pub ssh: TunnelConfig,
    /// Host directories mounted into the container without any policy rule, for the escape
    /// suite's canaries (see [`UnlistedBind`]); empty unless a test sets it. Bind mode only.
    pub unlisted_binds: Vec<UnlistedBind>,
}

impl DockerConfig {
    /// A configuration for `root` with the default image, bind mode and a spec whose protected
    /// paths default to `.git/**`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DockerConfig {
            root: root.into(),
            spec: SandboxSpec {
                protected: vec![".git/**".to_owned()],
                ..SandboxSpec::default()
            },
            image: DEFAULT_IMAGE.to_owned(),
            docker_host: None,
            mode: WorkspaceMode::Bind,
            user: None,
            network: None,
            helper: None,
            egress_resolver: None,
            egress_asker: None,
            files_helper: FilesHelper::Auto,
            helper_transport: HelperTransport::Auto,
            ssh: TunnelConfig::default(),
            unlisted_binds: Vec::new(),
        }
    }
}

/// How this process talks to the helper in the container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HelperTransport {
    /// A Unix socket the container reaches through a read-only mount, where the helper binary
    /// is bind-mounted (bind mode, an engine on this machine) and the socket works; else the
    /// engine's attach stream. The faster path: the engine is out of every call.
    #[default]
    Auto,
    /// Always the engine's attach stream (`docker exec`'s stdin and stdout).
    Attach,
}

/// Copy-mode bookkeeping (and what refilling the volumes after a fault needs).
#[derive(Debug)]
struct CopyState {
    volumes: Vec<String>,
    protected: Vec<PathBuf>,
    source: WorkspaceSource,
    mounts: Vec<(PathBuf, String)>,
    labels: HashMap<String, String>,
    image: String,
}

/// The shared state of a session; the three operation sets are implemented on it.
pub(crate) struct Inner {
    docker: Docker,
    host: String,
    /// How an `ssh://` engine is reached (the drop guard reconnects with it).
    ssh: TunnelConfig,
    /// How the engine is reached.
    transport: EngineTransport,
    /// Which engine it is.
    engine_kind: EngineKind,
    id: BackendId,
    container: String,
    host_root: PathBuf,
    workspace: PathBuf,
    home: PathBuf,
    spill_dir: PathBuf,
    rules: PathRules,
    roots: Vec<PathBuf>,
    /// The spec the container enforces (with the policy lines its entries come from).
    spec: SandboxSpec,
    uid: u32,
    gid: u32,
    has_rg: bool,
    memory_limit: Option<u64>,
    copy: Option<CopyState>,
    missing: Vec<String>,
    closed: tokio::sync::Mutex<bool>,
    closed_flag: std::sync::atomic::AtomicBool,
    /// The session's workers and the one-shot execs of its user.
    runner: Arc<Runner<DockerTransport>>,
    /// Bind mode without nested repositories allowed: the host-side git metadata guard of
    /// the workspace and the writable extra roots.
    git: Option<Arc<std::sync::Mutex<GitGuard>>>,
    /// Protected directories this session created on the host to mount them read-only
    /// (outermost first); removed at the end when still empty.
    pinned_on_host: Vec<PathBuf>,
    /// The same directories as the container sees them (left out of listings).
    pinned: Vec<PathBuf>,
    /// The container's creation body: a dead container is replaced by one made from it.
    body: ContainerCreateBody,
    recovery: recovery::Recovery,
    /// Filtered network mode: the session's egress proxy and forwarder.
    egress: Option<egress::Egress>,
    /// The file helper serving file operations and search, when it runs.
    /// The helper's socket directory, when it may connect through one (`helper_socket`).
    helper_sockets: Option<Arc<helper_socket::HelperSockets>>,
    files_helper: Option<cordon_helper::HelperBackend>,
    /// Which path file operations and search take, and why.
    files_path: FilesPath,
    /// Which path commands take, and why.
    commands_path: CommandsPath,
}

impl Inner {
    /// Sweep the bind-mounted writable roots for git metadata commands made (on a blocking
    /// thread): the note for the model, if anything was quarantined or the sweep failed.
    pub(crate) async fn sweep_git(&self) -> Option<String> {
        let guard = Arc::clone(self.git.as_ref()?);
        let swept = tokio::task::spawn_blocking(move || {
            guard
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .sweep()
        })
        .await;
        match swept {
            Ok(Ok(quarantined)) => git_guard::quarantine_note(&quarantined, |path| {
                match path.strip_prefix(&self.host_root) {
                    Ok(rel) if rel.as_os_str().is_empty() => self.workspace.clone(),
                    Ok(rel) => self.workspace.join(rel),
                    Err(_) => path.to_path_buf(),
                }
            }),
            Ok(Err(error)) => {
                tracing::error!(%error, "git guard: sweep failed");
                Some(format!(
                    "Cordon could not finish checking for git metadata: {error}"
                ))
            }
            Err(join) => Some(format!(
                "Cordon could not finish checking for git metadata: {join}"
            )),
        }
    }
}

/// One Docker session: a container and the operations running in it.
#[derive(Clone)]
pub struct DockerBackend {
    inner: Arc<Inner>,
    _guard: Arc<DropGuard>,
}

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("id", &self.inner.id)
            .field("container", &self.inner.container)
            .finish()
    }
}

/// Removes the container when the last handle goes away without [`Backend::shutdown`].
struct DropGuard {
    inner: Arc<Inner>,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if self
            .inner
            .closed_flag
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        // Async cleanup cannot run in Drop; a short-lived thread with its own runtime and
        // client does it, and we wait for it so a CLI exiting right after still cleans up.
        let host = self.inner.host.clone();
        let ssh = self.inner.ssh.clone();
        let container = self.inner.container.clone();
        let volumes = self
            .inner
            .copy
            .as_ref()
            .map(|c| c.volumes.clone())
            .unwrap_or_default();
        let handle = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok((docker, _)) = client::connect_with(Some(&host), &ssh).await {
                    remove_container_and_volumes(&docker, &container, &volumes).await;
                }
            });
        });
        // A panic in the cleanup thread was already reported by the panic hook; the drop
        // has nothing more to do with it.
        let _ = handle.join();
    }
}

/// Create the copy-mode workspace volumes; on failure the ones created are removed again.
async fn create_workspace_volumes(
    docker: &Docker,
    volumes: &[String],
    labels: &HashMap<String, String>,
) -> Result<(), DockerError> {
    for (i, name) in volumes.iter().enumerate() {
        let mut volume_labels = labels.clone();
        volume_labels.insert("cordon.volume".to_owned(), "workspace".to_owned());
        let created = docker
            .create_volume(VolumeCreateRequest {
                name: Some(name.clone()),
                labels: Some(volume_labels),
                ..Default::default()
            })
            .await;
        if let Err(e) = created {
            remove_container_and_volumes(docker, "", &volumes[..i]).await;
            return Err(DockerError::api(format!("create volume {name}"), e));
        }
    }
    Ok(())
}

async fn remove_container_and_volumes(docker: &Docker, container: &str, volumes: &[String]) {
    // A container or volume left behind is reaped by the next session on this machine
    // (labels name the owner), so a failure here is logged, not fatal.
    if !container.is_empty() {
        match docker
            .remove_container(
                container,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(()) => tracing::info!(container, "docker: container removed"),
            Err(error) => {
                tracing::warn!(container, %error, "docker: failed to remove the container")
            }
        }
    }
    for volume in volumes {
        if let Err(error) = docker
            .remove_volume(
                volume,
                None::<bollard::query_parameters::RemoveVolumeOptions>,
            )
            .await
        {
            tracing::warn!(volume, %error, "docker: failed to remove a workspace volume");
        }
    }
}

fn hash16(text: &str) -> String {
    // FNV-1a, 64 bit: a stable short name for a root (not a security boundary).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The spill volume of a host root: the same name for every session on that root.
pub fn spill_volume_name(host_root: &Path) -> String {
    format!("cordon-spill-{}", hash16(&host_root.to_string_lossy()))
}

fn expand_root(root: &Path, spec_path: &str) -> Option<PathBuf> {
    let path = if let Some(rest) = spec_path.strip_prefix("~/") {
        PathBuf::from(std::env::var_os("HOME")?).join(rest)
    } else if Path::new(spec_path).is_absolute() {
        PathBuf::from(spec_path)
    } else {
        root.join(spec_path)
    };
    std::fs::canonicalize(path).ok()
}

impl DockerBackend {
    /// Start a session; see the crate docs.
    pub async fn start(config: DockerConfig) -> Result<DockerBackend, DockerError> {
        let DockerConfig {
            root,
            spec,
            image,
            docker_host,
            mode,
            user,
            network,
            helper,
            egress_resolver,
            egress_asker,
            files_helper,
            helper_transport,
            ssh,
            unlisted_binds,
        } = config;
        let (host_root, meta) = start::open_root(&root)?;
        let user = match user {
            Some(ids) => ids,
            None => {
                use std::os::unix::fs::MetadataExt;
                (meta.uid(), meta.gid())
            }
        };
        let (docker, engine) = client::connect_with(docker_host.as_deref(), &ssh).await?;
        let host = engine.host.clone();
        let mode = match (mode, engine.transport().is_remote()) {
            (WorkspaceMode::Bind, true) => {
                // Host paths name nothing on an engine that may run elsewhere: a bind mount
                // would mount whatever that machine has at the same path.
                tracing::info!(
                    host,
                    transport = %engine.transport(),
                    "docker: the engine may be on another machine: copy mode"
                );
                WorkspaceMode::Copy
            }
            (mode, _) => mode,
        };
        if mode == WorkspaceMode::Copy && !unlisted_binds.is_empty() {
            return Err(DockerError::UnlistedBindsInCopyMode { host });
        }
        let engine_kind = client::engine_kind(&docker).await?;
        tracing::debug!(host, engine = %engine_kind, "docker: engine");
        match (engine_kind, mode) {
            (EngineKind::Podman, WorkspaceMode::Copy) => {
                tracing::warn!(host, "docker: copy mode refused on podman");
                return Err(DockerError::PodmanCopyMode { host });
            }
            (EngineKind::Podman, WorkspaceMode::Bind)
            | (EngineKind::Docker, WorkspaceMode::Bind | WorkspaceMode::Copy) => {}
        }
        start::check_engine_layers(&docker, &host, &spec.limits).await?;
        let spec = start::fit_cpus_to_host(&docker, spec).await;
        let owner = Owner::current();
        client::reap_stale(&docker, &owner).await;
        start::check_image(&docker, &image).await?;
        let (session, labels) = start::session_labels(&owner, &host_root);
        let egress = match spec.network {
            NetworkMode::Disabled | NetworkMode::Enabled => None,
            NetworkMode::Filtered => Some(
                start::egress(
                    &docker,
                    &spec,
                    mode,
                    helper.as_deref(),
                    egress::ProxyHooks {
                        resolver: egress_resolver,
                        asker: egress_asker,
                    },
                    &format!("cordon-{session}"),
                    user.0,
                    &host_root,
                )
                .await?,
            ),
        };
        let files_helper_binary =
            start::files_helper(&docker, files_helper, helper.as_deref()).await;
        let spill_volume = start::create_spill_volume(&docker, &host_root, &owner).await?;
        let launch = start::Launch {
            container: format!("cordon-{session}"),
            docker,
            host,
            host_root,
            spec,
            image,
            mode,
            network,
            user,
            session,
            labels,
            workspace: PathBuf::from(CONTAINER_WORKSPACE),
        };

        // Bind mode mounts this machine's binary; copy mode copies it into a volume.
        let helper_mount = match (files_helper_binary, mode) {
            (Ok(path), WorkspaceMode::Bind) => Ok((HelperMount::Bind(path), None)),
            (Ok(path), WorkspaceMode::Copy) => {
                helper_copy::prepare(&launch.docker, &path, &launch.image, &launch.labels)
                    .await
                    .map(|copied| (HelperMount::Volume(copied.0.volume.clone()), Some(copied)))
            }
            (Err(reason), _) => Err(reason),
        };
        let extra_roots = launch.extra_roots()?;
        // The helper's socket directory: only beside a bind-mounted binary (an engine here),
        // and never inside a directory the container writes.
        let helper_sockets = match (&helper_mount, helper_transport) {
            (Ok((HelperMount::Bind(_), _)), HelperTransport::Auto) => {
                let writable: Vec<&Path> = std::iter::once(launch.host_root.as_path())
                    .chain(
                        extra_roots
                            .iter()
                            .filter(|(_, w)| *w)
                            .map(|(p, _)| p.as_path()),
                    )
                    .collect();
                match helper_socket::HelperSockets::create(&writable) {
                    Ok(sockets) => Some(Arc::new(sockets)),
                    Err(error) => {
                        tracing::warn!(%error, "docker: no socket directory for the helper; it uses the engine's attach stream");
                        None
                    }
                }
            }
            _ => None,
        };
        let unix_sockets = launch.unix_sockets(&extra_roots)?;
        let rules = launch.path_rules(&extra_roots)?;
        let mut missing = Vec::new();
        let mask::Scan {
            masks,
            protected: globbed,
            ..
        } = launch.scan_workspace(&rules, &mut missing)?;
        let git = launch.git_guard(&extra_roots, &rules)?;
        let pinned = launch.pin_project_config()?;
        let protected_rel = launch.protected_paths(git.as_ref(), globbed);
        let (source, protected, copy_state) = launch.workspace(&protected_rel).await?;
        let passed_env = launch.passed_env();
        let body = plan::container_body(&ContainerPlan {
            image: &launch.image,
            user: launch.user,
            spec: &launch.spec,
            passed_env: &passed_env,
            workspace: &launch.workspace,
            source: &source,
            protected: &protected,
            masks: &masks,
            extra_roots: &extra_roots,
            unix_sockets: &unix_sockets,
            unlisted_binds: &unlisted_binds,
            spill_volume: &spill_volume,
            network: launch.network.as_deref(),
            egress: egress.as_ref().map(egress::Egress::mounts),
            files_helper: helper_mount.as_ref().ok().map(|(mount, _)| mount),
            helper_socket_dir: helper_sockets
                .as_deref()
                .map(helper_socket::HelperSockets::dir),
            labels: launch.labels.clone(),
        });

        let mut body = body;
        if engine_kind == EngineKind::Podman {
            plan::for_podman(&mut body);
        }
        let cleanup_volumes = copy_state
            .as_ref()
            .map(|c| c.volumes.clone())
            .unwrap_or_default();
        let result = async {
            if copy_state.is_some() {
                launch.copy_in(&source, &protected, &rules).await?;
            }
            launch.create_and_start(&body).await
        }
        .await;
        if let Err(e) = result {
            remove_container_and_volumes(&launch.docker, &launch.container, &cleanup_volumes).await;
            return Err(e);
        }

        let (image, labels) = (launch.image.clone(), launch.labels.clone());
        let start::Launch {
            docker,
            host,
            host_root,
            spec,
            user: (uid, gid),
            container,
            workspace,
            ..
        } = launch;
        let roots = rules.root_paths();
        let pinned_in_container: Vec<PathBuf> = pinned
            .iter()
            .filter_map(|dir| dir.strip_prefix(&host_root).ok())
            .map(|rel| workspace.join(rel))
            .collect();
        let transport = DockerTransport {
            docker: docker.clone(),
            container: container.clone(),
        };
        let mut inner = Inner {
            docker,
            host,
            ssh,
            transport: engine.transport(),
            engine_kind,
            id: BackendId::new(format!("docker:{container}")),
            container: container.clone(),
            host_root,
            workspace,
            home: PathBuf::from(HOME_DIR),
            spill_dir: PathBuf::from(SPILL_DIR),
            rules,
            roots,
            memory_limit: spec.limits.memory_bytes,
            spec,
            uid,
            gid,
            has_rg: false,
            copy: copy_state,
            missing,
            closed: tokio::sync::Mutex::new(false),
            closed_flag: std::sync::atomic::AtomicBool::new(false),
            runner: Arc::new(Runner::new(transport, client::MAX_IDLE)),
            git: git.map(|guard| Arc::new(std::sync::Mutex::new(guard))),
            pinned: pinned_in_container,
            pinned_on_host: pinned,
            body,
            recovery: recovery::Recovery::default(),
            egress,
            files_helper: None,
            helper_sockets: helper_sockets.clone(),
            files_path: FilesPath::Helper,
            commands_path: CommandsPath::Helper,
        };
        let probed = async {
            inner.has_rg = inner.probe().await?;
            if let Some(egress) = &inner.egress {
                egress
                    .ensure_forwarder(&inner.docker, &container, inner.recovery.generation())
                    .await?;
            }
            Ok::<(), DockerError>(())
        }
        .await;
        if let Err(e) = probed {
            remove_container_and_volumes(&inner.docker, &container, &cleanup_volumes).await;
            return Err(e);
        }
        let session = Arc::new(std::sync::OnceLock::new());
        let user = format!("{uid}:{gid}");
        let argv = match helper_mount {
            Ok((_, None)) => Ok(files_helper::serve_argv()),
            Ok((_, Some(copied))) => {
                helper_copy::serve_argv_after_check(
                    &inner.docker,
                    &container,
                    &user,
                    &copied,
                    &image,
                    &labels,
                )
                .await
            }
            Err(reason) => Err(reason),
        };
        let started = match argv {
            Ok(argv) => {
                let connector = files_helper::DockerConnector {
                    docker: inner.docker.clone(),
                    container: container.clone(),
                    user,
                    argv,
                    sockets: helper_sockets.clone(),
                    session: Arc::clone(&session),
                };
                let session = files_helper::session_start(
                    &inner.workspace,
                    &inner.spec,
                    &extra_roots,
                    inner.copy.is_some(),
                );
                files_helper::start(connector, session).await
            }
            Err(reason) => Err(reason),
        };
        match started {
            Ok(backend) => {
                tracing::info!(container = %container, "docker: file operations: helper");
                let missing = cordon_ops::Backend::missing_layers(&backend);
                inner.commands_path = commands::choose(&inner.spec, &missing);
                match &inner.commands_path {
                    CommandsPath::Helper => {
                        tracing::info!(container = %container, ?missing, "docker: commands: helper");
                    }
                    CommandsPath::Shell { reason } => {
                        tracing::warn!(container = %container, %reason, ?missing, "docker: commands: shell workers, without the helper's sandbox");
                        inner.missing.push(format!(
                            "commands run through docker exec without Cordon's sandbox (only the container's confinement): the container cannot apply {}",
                            missing.join(", ")
                        ));
                    }
                }
                inner.files_helper = Some(backend);
            }
            Err(reason) if files_helper == FilesHelper::Required => {
                tracing::warn!(container = %container, %reason, "docker: the required file helper cannot run");
                remove_container_and_volumes(&inner.docker, &container, &cleanup_volumes).await;
                return Err(DockerError::FilesHelper { reason });
            }
            Err(reason) => {
                tracing::info!(container = %container, %reason, "docker: file operations and commands: shell");
                inner.commands_path = CommandsPath::Shell {
                    reason: "the file helper does not run".to_owned(),
                };
                inner.files_path = FilesPath::Shell { reason };
            }
        }
        // The first call then finds a worker ready.
        inner.runner.keep_a_spare();
        let inner = Arc::new(inner);
        // Only this function holds the cell: it is empty.
        let _ = session.set(Arc::downgrade(&inner));
        Ok(DockerBackend {
            _guard: Arc::new(DropGuard {
                inner: inner.clone(),
            }),
            inner,
        })
    }

    /// The container's name (`cordon-<session>`).
    pub fn container(&self) -> &str {
        &self.inner.container
    }

    /// The Docker client of this session (tests, diagnostics).
    pub fn docker(&self) -> &Docker {
        &self.inner.docker
    }

    /// Which engine serves the session (Docker or Podman).
    pub fn engine_kind(&self) -> EngineKind {
        self.inner.engine_kind
    }

    /// How the engine is reached.
    pub fn engine_transport(&self) -> EngineTransport {
        self.inner.transport
    }

    /// How the workspace reaches the container: copy mode for engines that may run on another
    /// machine (tcp, ssh) even when bind mode was asked for.
    pub fn workspace_mode(&self) -> WorkspaceMode {
        match self.inner.copy {
            Some(_) => WorkspaceMode::Copy,
            None => WorkspaceMode::Bind,
        }
    }

    /// Which path file operations and search take in this session.
    pub fn files_path(&self) -> &FilesPath {
        &self.inner.files_path
    }

    /// How this process talks to the file helper: `socket`, or `attach` and why not through
    /// a socket; `None` when the session does not use the helper.
    pub fn helper_transport(&self) -> Option<String> {
        self.inner.files_helper.as_ref()?;
        Some(match &self.inner.helper_sockets {
            Some(sockets) => match sockets.given_up() {
                None => "socket".to_owned(),
                Some(reason) => format!("attach ({reason})"),
            },
            None => "attach".to_owned(),
        })
    }

    /// The host directory the helper's sockets are made in (mounted read-only in the
    /// container), when the session may use one (tests, diagnostics).
    pub fn helper_socket_dir(&self) -> Option<&Path> {
        self.inner
            .helper_sockets
            .as_deref()
            .map(helper_socket::HelperSockets::dir)
    }

    /// Which path commands take in this session.
    pub fn commands_path(&self) -> &CommandsPath {
        &self.inner.commands_path
    }

    /// The file helper, when file operations run through it (tests, diagnostics).
    pub fn files_helper(&self) -> Option<&cordon_helper::HelperBackend> {
        self.inner.files_helper.as_ref()
    }

    /// Whether the image has ripgrep (otherwise grep uses the POSIX fallback).
    pub fn has_ripgrep(&self) -> bool {
        self.inner.has_rg
    }

    /// Copy mode: copy the container's workspace back over the host root now (new and changed
    /// files; deletions are not propagated and protected paths are never written). A no-op in
    /// bind mode.
    pub async fn sync_out(&self) -> Result<(), DockerError> {
        match &self.inner.copy {
            Some(state) => {
                copy::copy_out(
                    &self.inner.docker,
                    &self.inner.container,
                    &self.inner.workspace,
                    &self.inner.host_root,
                    &state.protected,
                    &self.inner.rules,
                )
                .await
            }
            None => Ok(()),
        }
    }

    /// File operations through the file helper, or the session's workers.
    fn file_operations(&self) -> Arc<dyn cordon_ops::FileOperations> {
        let shell: Arc<dyn cordon_ops::FileOperations> =
            Arc::new(cordon_remote::file_ops::RemoteFiles(self.inner.clone()));
        match &self.inner.files_helper {
            Some(helper) => Arc::new(files_helper::HelperFiles {
                helper: helper.ops().clone(),
                shell,
                pinned: self.inner.pinned.clone(),
            }),
            None => shell,
        }
    }

    /// Search through the file helper, or the session's workers.
    fn search_operations(&self) -> Arc<dyn cordon_ops::SearchOperations> {
        match &self.inner.files_helper {
            Some(helper) => helper.ops().clone(),
            None => Arc::new(cordon_remote::search::host::RemoteSearch(
                self.inner.clone(),
            )),
        }
    }

    /// The layers the operator's spec left out.
    fn layers_missing(&self) -> Vec<String> {
        self.inner.missing.clone()
    }

    async fn close_session(&self) -> Result<(), cordon_ops::ShutdownError> {
        self.close()
            .await
            .map_err(|error| cordon_ops::ShutdownError::CopyBack {
                backend: cordon_remote::runner::CommandHost::backend_id(&*self.inner).clone(),
                source: Box::new(error),
            })
    }

    async fn close(&self) -> Result<(), DockerError> {
        let mut closed = self.inner.closed.lock().await;
        if *closed {
            return Ok(());
        }
        let synced = self.sync_out().await;
        if let Some(helper) = &self.inner.files_helper
            && let Err(error) = cordon_ops::Backend::shutdown(helper).await
        {
            tracing::warn!(%error, "docker: failed to stop the file helper");
        }
        self.inner.runner.clear();
        let volumes = self
            .inner
            .copy
            .as_ref()
            .map(|c| c.volumes.clone())
            .unwrap_or_default();
        remove_container_and_volumes(&self.inner.docker, &self.inner.container, &volumes).await;
        // The container and every process in it are gone: this sweep is the last word.
        if let Some(note) = self.inner.sweep_git().await {
            tracing::warn!(note, "git guard: sweep at shutdown");
        }
        // The directories made only to be mounted read-only go again, innermost first; one
        // that is not empty (the operator put something there meanwhile) stays.
        for dir in self.inner.pinned_on_host.iter().rev() {
            if let Err(error) = std::fs::remove_dir(dir) {
                tracing::debug!(dir = %dir.display(), %error, "docker: a pinned directory stays");
            }
        }
        *closed = true;
        self.inner
            .closed_flag
            .store(true, std::sync::atomic::Ordering::SeqCst);
        synced
    }

    /// Opt-in Ctrl-C handling for programs that own the process (a CLI): on the first SIGINT
    /// the session is stopped (copy mode syncs out, the container is removed) and the process
    /// exits with status 130. A library never installs this by itself; without it a Ctrl-C'd
    /// runtime's container is reaped by the next session on this machine.
    pub fn stop_on_ctrl_c(&self) -> tokio::task::JoinHandle<()> {
        let backend = self.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                if let Err(error) = backend.stop().await {
                    eprintln!("cordon: error: {error}");
                }
                std::process::exit(130);
            }
        })
    }

    /// End the session: copy mode syncs the workspace out, then the container (and its
    /// workspace volumes) are removed. Idempotent. The spill volume stays for later sessions.
    pub async fn stop(&self) -> Result<(), DockerError> {
        self.close().await
    }
}

impl Inner {
    /// One root exec at start: the spill volume's root must be writable by any session uid
    /// (root owns a fresh volume; with no capabilities root can still chmod what it owns),
    /// its spill files are listed for the sweep, and we learn whether `rg` is there.
    async fn probe(&self) -> Result<bool, DockerError> {
        let argv = vec!["sh".to_owned(), "-c".to_owned(), probe_script(SPILL_DIR)];
        let fail = |reason: String| DockerError::Container {
            step: "probe the sandbox",
            container: self.container.clone(),
            reason,
        };
        let mut exec = client::start_exec(&self.docker, &self.container, argv, Some("0:0"))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let Collected { stdout, .. } = collect(&mut exec, None, StdinEnd::AfterOutput)
            .await
            .map_err(fail)?;
        let text = String::from_utf8_lossy(&stdout);
        let has_rg = if text.contains("rg=1") {
            true
        } else if text.contains("rg=0") {
            false
        } else {
            return Err(fail(format!(
                "unexpected answer `{}` (does the image have /bin/sh?)",
                text.trim()
            )));
        };
        self.sweep_spill(&text).await;
        self.remove_stale_write_temps().await;
        self.private_home_on_podman().await?;
        Ok(has_rg)
    }

    /// Podman gives the home tmpfs the image directory's mode, not the `mode=0700` asked for
    /// (1777 in cordon-sandbox): its owner, the session's user, makes it private again.
    async fn private_home_on_podman(&self) -> Result<(), DockerError> {
        match self.engine_kind {
            EngineKind::Docker => return Ok(()),
            EngineKind::Podman => {}
        }
        let fail = |reason: String| DockerError::Container {
            step: "make the home directory private",
            container: self.container.clone(),
            reason,
        };
        let argv = vec!["chmod".to_owned(), "0700".to_owned(), HOME_DIR.to_owned()];
        let user = format!("{}:{}", self.uid, self.gid);
        let mut exec = client::start_exec(&self.docker, &self.container, argv, Some(&user))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let Collected { stderr, .. } = collect(&mut exec, None, StdinEnd::AfterOutput)
            .await
            .map_err(fail)?;
        let status = self
            .docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| fail(e.to_string()))?
            .exit_code;
        if status != Some(0) {
            return Err(fail(format!(
                "chmod exited with {status:?}: {}",
                String::from_utf8_lossy(&stderr).trim()
            )));
        }
        Ok(())
    }

    /// Remove the temp files of writes a killed session left in the writable roots (not
    /// modified for [`leftovers::REMOTE_TEMP_MIN_AGE`]: the helper streams a write's bytes, so
    /// a live one's time keeps moving). Best effort.
    async fn remove_stale_write_temps(&self) {
        let writable: Vec<String> = self
            .roots
            .iter()
            .filter(|root| self.rules.allows_write(root))
            .filter_map(|root| root.to_str().map(str::to_owned))
            .collect();
        if writable.is_empty() {
            return;
        }
        let argv = cordon_remote::files::remove_stale_write_temps_argv(
            &writable,
            leftovers::REMOTE_TEMP_MIN_AGE,
        );
        let removed = self.runner.collect(argv, None, StdinEnd::AfterOutput).await;
        match removed {
            Ok(Collected { stdout, .. }) => {
                let files = stdout
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .count();
                if files > 0 {
                    tracing::info!(
                        container = %self.container,
                        files,
                        "removed temp files of writes a killed session left"
                    );
                }
            }
            Err(error) => tracing::warn!(
                container = %self.container,
                %error,
                "failed to look for stale temp files"
            ),
        }
    }

    /// Remove this root's spill files past their lifetime ([`cordon_ops::leftovers`]; the
    /// spill volume is per root, so the size bound is per root here). Best effort: a failure
    /// leaves the files for a later session.
    async fn sweep_spill(&self, probe: &str) {
        let (now, listed) = parse_spill_listing(probe);
        let Some(now) = now else { return };
        let files: Vec<SpillFile> = listed.iter().map(|(_, f)| *f).collect();
        let mut chosen = Vec::new();
        let kept = leftovers::sweep_spill_files(&files, now, SpillBounds::default(), |i| {
            chosen.push(listed[i].0.clone());
            true
        });
        if chosen.is_empty() {
            return;
        }
        let count = chosen.len();
        let argv = spill_removal_argv(chosen);
        let removed =
            match client::start_exec(&self.docker, &self.container, argv, Some("0:0")).await {
                Ok(mut exec) => collect(&mut exec, None, StdinEnd::AfterOutput)
                    .await
                    .map(|_| ()),
                Err(e) => Err(e.to_string()),
            };
        match removed {
            Ok(()) => tracing::info!(
                container = %self.container,
                files = count,
                kept_bytes = kept,
                "removed spill files past their lifetime"
            ),
            Err(error) => tracing::warn!(
                container = %self.container,
                %error,
                "failed to remove spill files past their lifetime"
            ),
        }
    }
}

/// The start-up probe run as root in the container: make `spill` writable by every session
/// uid, print `now=SECONDS`, one `spill=MTIME SIZE BLOCKS BLOCK_SIZE PATH` line per spill file
/// and `rg=0|1`. Commands can write in `spill`, so the listing matches only Cordon's exact
/// naming (a name holding a newline cannot forge a line for another file) and reports the
/// allocated size too (a sparse file cannot claim the size bound for itself).
fn probe_script(spill: &str) -> String {
    format!(
        "export LC_ALL=C; chmod 1777 {spill} 2>/dev/null; echo \"now=$(date +%s)\"; \
         for f in {spill}/cordon-bash-{hex}.log; do \
           if [ -f \"$f\" ] && [ ! -L \"$f\" ]; then stat -c 'spill=%Y %s %b %B %n' \"$f\" 2>/dev/null; fi; \
         done; \
         if command -v rg >/dev/null 2>&1; then echo rg=1; else echo rg=0; fi",
        hex = "[0-9a-f]".repeat(16),
    )
}

/// The probe's `now=SECONDS` and `spill=MTIME SIZE BLOCKS BLOCK_SIZE PATH` lines; only paths
/// directly in the spill directory with Cordon's exact spill naming are kept, each counted at
/// the smaller of its length and its allocated size.
fn parse_spill_listing(text: &str) -> (Option<SystemTime>, Vec<(String, SpillFile)>) {
    let secs = |s: &str| s.parse::<u64>().ok();
    let now = text
        .lines()
        .find_map(|l| l.strip_prefix("now="))
        .and_then(secs)
        .map(|s| UNIX_EPOCH + Duration::from_secs(s));
    let files = text
        .lines()
        .filter_map(|l| l.strip_prefix("spill="))
        .filter_map(|rest| {
            let mut parts = rest.splitn(5, ' ');
            let mtime = secs(parts.next()?)?;
            let length = secs(parts.next()?)?;
            let blocks = secs(parts.next()?)?;
            let block_size = secs(parts.next()?)?;
            let size = length.min(blocks.saturating_mul(block_size));
            let path = parts.next()?;
            let name = path.strip_prefix(SPILL_DIR)?.strip_prefix('/')?;
            leftovers::is_spill_file_name(name.as_bytes()).then(|| {
                (
                    path.to_owned(),
                    SpillFile {
                        size,
                        modified: UNIX_EPOCH + Duration::from_secs(mtime),
                    },
                )
            })
        })
        .collect();
    (now, files)
}

/// `rm -f -- PATH…`: unlinks (a symlink itself, never its target).
fn spill_removal_argv(paths: Vec<String>) -> Vec<String> {
    ["rm", "-f", "--"]
        .into_iter()
        .map(str::to_owned)
        .chain(paths)
        .collect()
}

#[async_trait::async_trait]
impl cordon_ops::Backend for DockerBackend {
    fn id(&self) -> &BackendId {
        cordon_remote::runner::CommandHost::backend_id(&*self.inner)
    }

    fn files(&self) -> Arc<dyn cordon_ops::FileOperations> {
        self.file_operations()
    }

    fn bash(&self) -> Arc<dyn cordon_ops::BashOperations> {
        match (&self.inner.commands_path, &self.inner.files_helper) {
            (CommandsPath::Helper, Some(helper)) => Arc::new(commands::HelperBash {
                inner: self.inner.clone(),
                helper: helper.ops().clone(),
            }),
            (CommandsPath::Helper | CommandsPath::Shell { .. }, _) => {
                Arc::new(cordon_remote::runner::RemoteBash(self.inner.clone()))
            }
        }
    }

    fn search(&self) -> Arc<dyn cordon_ops::SearchOperations> {
        self.search_operations()
    }

    fn missing_layers(&self) -> Vec<String> {
        self.layers_missing()
    }

    async fn shutdown(&self) -> Result<(), cordon_ops::ShutdownError> {
        self.close_session().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spill_listing_keeps_only_cordon_names_directly_in_the_spill_dir() {
        let text = "now=5000\n\
                    spill=1000 42 8 512 /cordon-spill/cordon-bash-0123456789abcdef.log\n\
                    spill=1000 42 8 512 /cordon-spill/cordon-bash-x\n\
                    spill=1000 42 8 512 /cordon-spill/sub/cordon-bash-0123456789abcdef.log\n\
                    spill=1000 42 8 512 /elsewhere/cordon-bash-0123456789abcdef.log\n\
                    spill=x 42 8 512 /cordon-spill/cordon-bash-0123456789abcdee.log\n\
                    spill=1000 4398046511104 0 512 /cordon-spill/cordon-bash-00000000000000aa.log\n\
                    rg=1\n";
        let (now, files) = parse_spill_listing(text);
        assert_eq!(now, Some(UNIX_EPOCH + Duration::from_secs(5000)));
        assert_eq!(
            files,
            vec![
                (
                    "/cordon-spill/cordon-bash-0123456789abcdef.log".to_owned(),
                    SpillFile {
                        size: 42,
                        modified: UNIX_EPOCH + Duration::from_secs(1000),
                    }
                ),
                // A sparse 4 TiB file counts at what it occupies.
                (
                    "/cordon-spill/cordon-bash-00000000000000aa.log".to_owned(),
                    SpillFile {
                        size: 0,
                        modified: UNIX_EPOCH + Duration::from_secs(1000),
                    }
                ),
            ]
        );
        assert_eq!(parse_spill_listing("rg=0\n"), (None, vec![]));
    }

    /// The probe script itself, run here over a directory a command could have filled: a
    /// name with a newline forging a line for another spill file is not listed.
    #[test]
    fn the_probe_lists_exact_names_only_and_cannot_be_forged_by_a_newline() {
        let dir = tempfile::tempdir().unwrap();
        let spill = dir.path().to_str().unwrap();
        let victim = format!("cordon-bash-{}.log", "0".repeat(15) + "f");
        std::fs::write(dir.path().join(&victim), "output").unwrap();
        let forged = format!("{victim}\nx.log");
        std::fs::write(dir.path().join(&forged), "").unwrap();
        std::fs::write(dir.path().join("cordon-bash-zz.log"), "").unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", &probe_script(spill)])
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let (_, files) = parse_spill_listing(&text.replace(spill, SPILL_DIR));
        let names: Vec<&str> = files.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(names, [format!("{SPILL_DIR}/{victim}")], "{text}");
        let modified = std::fs::metadata(dir.path().join(&victim))
            .unwrap()
            .modified()
            .unwrap();
        let secs = modified.duration_since(UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(files[0].1.modified, UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(files[0].1.size, 6);
    }

    #[test]
    fn spill_files_are_removed_with_rm_after_the_end_of_options() {
        assert_eq!(
            spill_removal_argv(vec![
                "/cordon-spill/a".to_owned(),
                "/cordon-spill/b".to_owned()
            ]),
            ["rm", "-f", "--", "/cordon-spill/a", "/cordon-spill/b"]
        );
    }
}
