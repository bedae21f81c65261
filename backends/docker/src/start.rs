//! The steps of [`DockerBackend::start`](crate::DockerBackend::start): check the host root and
//! the image, name the session, create the spill volume, work out the extra roots, the path
//! rules, the denied-path masks, the git metadata guard and the protected mounts, prepare the
//! workspace (bind mount, or volumes to copy into), then create and start the container. The
//! session state built from them ([`Inner`]) and the first worker are `start`'s own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, SystemInfo, VolumeCreateRequest};
use bollard::query_parameters::CreateContainerOptions;
use cordon_backend_local::git_guard::GitGuard;
use cordon_core::sandbox::{Limits, NestedGit, NetworkMode, RootAccess, SandboxSpec};
use cordon_remote::files::{PathRules, Root};

use crate::mask;
use crate::plan::{self, SPILL_DIR, WorkspaceSource};
use crate::{
    CopyState, DockerError, Owner, WorkspaceMode, client, copy, create_workspace_volumes,
    expand_root, spill_volume_name,
};
#[cfg(doc)]
use crate::{DockerBackend, Inner};

/// The sockets container engines listen on by default, never granted as `[network]
/// unix_sockets` (besides the session's own engine, when it is local).
const ENGINE_SOCKETS: [&str; 4] = [
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/podman/podman.sock",
    "/run/containerd/containerd.sock",
];

/// The host path of a `[network] unix_sockets` entry (absolute or `~/…`), when it can be
/// bound into the container as it is: a Unix socket itself (not a symbolic link, which the
/// engine would follow when it binds), reached through no symbolic link (its directory is
/// written canonically), and outside every root commands can write (where a command could put
/// something else in its place before the container is created again), and not the socket of
/// a container engine (`engine_sockets`: the session's own, if local, and the usual ones),
/// whichever path or hard link it is reached by: a command that can talk to the engine can
/// start a privileged container, which is root on the host. Otherwise what is wrong and what
/// to change.
pub(crate) fn checked_unix_socket(
    entry: &str,
    home: Option<&Path>,
    writable_roots: &[&Path],
    engine_sockets: &[&Path],
) -> Result<PathBuf, String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    let path = if let Some(rest) = entry.strip_prefix("~/") {
        home.ok_or("`~` cannot be expanded: HOME is not set; list an absolute path")?
            .join(rest)
    } else if Path::new(entry).is_absolute() {
        PathBuf::from(entry)
    } else {
        return Err("not an absolute path; list the socket's absolute path".to_owned());
    };
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err("not a path to a file; list the socket's path".to_owned());
    };
    let parent_canonical = std::fs::canonicalize(parent)
        .map_err(|error| format!("failed to resolve {}: {error}", parent.display()))?;
    let canonical = parent_canonical.join(name);
    if canonical != path {
        return Err(format!(
            "its path is not canonical (a directory on the way is a symbolic link, or the path \
             has `.`/`..`); list {} instead",
            canonical.display()
        ));
    }
    let meta = std::fs::symlink_metadata(&path)
        .map_err(|error| format!("failed to inspect {}: {error}", path.display()))?;
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(
            "it is a symbolic link, which would be followed when it is bound; list the socket \
             it points to"
                .to_owned(),
        );
    }
    if !kind.is_socket() {
        return Err("it is not a Unix socket; list a listening socket's path".to_owned());
    }
    // By inode: `/var/run/docker.sock` is `/run/docker.sock`, and a socket can be hard-linked.
    if let Some(engine) = engine_sockets.iter().find(|engine| {
        std::fs::metadata(engine)
            .is_ok_and(|engine| engine.dev() == meta.dev() && engine.ino() == meta.ino())
    }) {
        return Err(format!(
            "it is the container engine's socket {}, which lets commands start a privileged \
             container (root on the host); remove it from the list",
            engine.display()
        ));
    }
    if let Some(root) = writable_roots.iter().find(|root| path.starts_with(root)) {
        return Err(format!(
            "it is inside {}, which commands can write (a command could put another file in its \
             place); move the socket out of the writable roots",
            root.display()
        ));
    }
    Ok(path)
}

/// The canonical host root and its metadata; it must be a directory.
pub(crate) fn open_root(root: &Path) -> Result<(PathBuf, std::fs::Metadata), DockerError> {
    let host_root = std::fs::canonicalize(root).map_err(|source| DockerError::Root {
        path: root.to_path_buf(),
        source,
    })?;
    let meta = std::fs::metadata(&host_root).map_err(|source| DockerError::Root {
        path: host_root.clone(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(DockerError::Root {
            path: host_root,
            source: std::io::Error::from_raw_os_error(20),
        });
    }
    Ok((host_root, meta))
}

/// Why the engine would run the session's container without a layer the sandbox relies on
/// (`None`: it reports them all), from `GET /info`: an engine without seccomp (or whose
/// default profile is `unconfined`) runs every container unfiltered, and one without the
/// memory or pids cgroup controller discards those limits with only a warning on create.
/// Docker and Podman alike report these.
pub(crate) fn missing_engine_layer(info: &SystemInfo, limits: &Limits) -> Option<String> {
    let seccomp = info
        .security_options
        .iter()
        .flatten()
        .find(|option| option.split(',').any(|part| part == "name=seccomp"));
    match seccomp {
        None => {
            return Some(
                "it runs containers without seccomp (its security options list none); enable                  seccomp in the engine"
                    .to_owned(),
            );
        }
        Some(option) if option.split(',').any(|part| part == "profile=unconfined") => {
            return Some(format!(
                "its default seccomp profile is unconfined (`{option}`); give the engine a                  seccomp profile"
            ));
        }
        Some(_) => {}
    }
    let discarded = [
        ("memory", limits.memory_bytes.is_some(), info.memory_limit),
        ("pids", limits.pids.is_some(), info.pids_limit),
    ];
    discarded
        .into_iter()
        .find(|(_, wanted, supported)| *wanted && *supported == Some(false))
        .map(|(name, _, _)| {
            format!(
                "it cannot apply the {name} limit (no {name} cgroup controller for its                  containers), which it would discard; enable the controller for the engine                  (rootless Podman needs cgroup v2 with it delegated)"
            )
        })
}

/// Refused unless the engine reports every layer [`missing_engine_layer`] checks.
pub(crate) async fn check_engine_layers(
    docker: &Docker,
    host: &str,
    limits: &Limits,
) -> Result<(), DockerError> {
    let info = docker
        .info()
        .await
        .map_err(|e| DockerError::api("read the engine's security options", e))?;
    match missing_engine_layer(&info, limits) {
        None => Ok(()),
        Some(reason) => {
            tracing::warn!(host, %reason, "docker: engine refused, a sandbox layer is missing");
            Err(DockerError::EngineLayers {
                host: host.to_owned(),
                reason,
            })
        }
    }
}

/// Docker refuses a CPU limit above the host's count; a spec asking for more than the host has
/// gets all of it.
pub(crate) async fn fit_cpus_to_host(docker: &Docker, mut spec: SandboxSpec) -> SandboxSpec {
    if let (Some(cpus), Ok(info)) = (spec.limits.cpus, docker.info().await)
        && let Some(ncpu) = info.ncpu.filter(|n| *n > 0)
    {
        spec.limits.cpus = Some(cpus.min(ncpu as f64));
    }
    spec
}

/// The image must exist: Cordon never pulls.
pub(crate) async fn check_image(docker: &Docker, image: &str) -> Result<(), DockerError> {
    match docker.inspect_image(image).await {
        Ok(_) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Err(DockerError::ImageMissing {
            image: image.to_owned(),
            next_step: crate::error::Hints::for_current_dir().image_missing(image),
        }),
        Err(e) => Err(DockerError::api(format!("inspect image {image}"), e)),
    }
}

/// A fresh session id and the labels of everything the session creates.
pub(crate) fn session_labels(owner: &Owner, host_root: &Path) -> (String, HashMap<String, String>) {
    let session = format!("{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff);
    let mut labels = owner.labels();
    labels.insert(client::LABEL_SESSION.to_owned(), session.clone());
    labels.insert(
        "cordon.root".to_owned(),
        host_root.to_string_lossy().into_owned(),
    );
    (session, labels)
}

/// Create (or reuse) the root's spill volume; its name.
pub(crate) async fn create_spill_volume(
    docker: &Docker,
    host_root: &Path,
    owner: &Owner,
) -> Result<String, DockerError> {
    let spill_volume = spill_volume_name(host_root);
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(spill_volume.clone()),
            labels: Some(HashMap::from([
                (
                    client::LABEL_SPILL_ROOT.to_owned(),
                    host_root.to_string_lossy().into_owned(),
                ),
                (client::LABEL_HOST.to_owned(), owner.host.clone()),
            ])),
            ..Default::default()
        })
        .await
        .map_err(|e| DockerError::api(format!("create volume {spill_volume}"), e))?;
    Ok(spill_volume)
}

/// What the steps after the engine checks share: the session being started.
pub(crate) struct Launch {
    pub(crate) docker: Docker,
    pub(crate) host: String,
    pub(crate) host_root: PathBuf,
    pub(crate) spec: SandboxSpec,
    pub(crate) image: String,
    pub(crate) mode: WorkspaceMode,
    pub(crate) network: Option<String>,
    pub(crate) user: (u32, u32),
    pub(crate) session: String,
    pub(crate) container: String,
    pub(crate) labels: HashMap<String, String>,
    pub(crate) workspace: PathBuf,
}

/// The project's Cordon directory (relative to the root), which the policy always protects.
const PROJECT_CONFIG_DIR: &str = ".cordon";

/// Where the workspace comes from, its protected mounts and (copy mode) the volumes.
pub(crate) type Workspace = (WorkspaceSource, Vec<(PathBuf, String)>, Option<CopyState>);

impl Launch {
    /// The host roots outside the workspace the spec grants (bind mode only), with whether
    /// each is writable; refused when one would let the container reach a host Unix socket.
    pub(crate) fn extra_roots(&self) -> Result<Vec<(PathBuf, bool)>, DockerError> {
        let Launch {
            host_root, spec, ..
        } = self;
        let extra_roots: Vec<(PathBuf, bool)> = match self.mode {
            WorkspaceMode::Bind => spec
                .readable_roots
                .iter()
                .filter_map(|r| expand_root(host_root, r).map(|p| (p, false)))
                .chain(
                    spec.writable_roots
                        .iter()
                        .filter_map(|r| expand_root(host_root, r).map(|p| (p, true))),
                )
                .filter(|(p, _)| !p.starts_with(host_root))
                .collect(),
            WorkspaceMode::Copy => Vec::new(),
        };
        let daemon_socket = self.host.strip_prefix("unix://").map(Path::new);
        if let Some(reason) =
            plan::host_socket_exposure(spec, self.network.as_deref(), &extra_roots, daemon_socket)
        {
            return Err(DockerError::HostSocket { reason });
        }
        Ok(extra_roots)
    }

    /// The host Unix sockets `[network] unix_sockets` lists, each checked to be bound at the
    /// same path (bind mode only: an engine in copy mode may be on another machine). With the
    /// network off none is bound (no socket can be connected then, as on the local backend).
    pub(crate) fn unix_sockets(
        &self,
        extra_roots: &[(PathBuf, bool)],
    ) -> Result<Vec<PathBuf>, DockerError> {
        let listed = &self.spec.unix_sockets;
        match self.spec.network {
            NetworkMode::Disabled => {
                if !listed.is_empty() {
                    tracing::debug!(
                        count = listed.len(),
                        "docker: [network] unix_sockets ignored, the network is off"
                    );
                }
                return Ok(Vec::new());
            }
            NetworkMode::Enabled | NetworkMode::Filtered => {}
        }
        let Some(first) = listed.first() else {
            return Ok(Vec::new());
        };
        match self.mode {
            WorkspaceMode::Bind => {}
            WorkspaceMode::Copy => {
                return Err(DockerError::UnixSocket {
                    entry: first.clone(),
                    reason: "host sockets are bound into the container in bind mode only (the \
                             engine of copy mode may run on another machine); use bind mode or \
                             remove `[network] unix_sockets`"
                        .to_owned(),
                });
            }
        }
        let writable: Vec<&Path> = std::iter::once(self.host_root.as_path())
            .chain(
                extra_roots
                    .iter()
                    .filter(|(_, writable)| *writable)
                    .map(|(root, _)| root.as_path()),
            )
            .collect();
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let engines: Vec<&Path> = self
            .host
            .strip_prefix("unix://")
            .map(Path::new)
            .into_iter()
            .chain(ENGINE_SOCKETS.iter().map(Path::new))
            .collect();
        let mut sockets = Vec::new();
        for entry in listed {
            let path = checked_unix_socket(entry, home.as_deref(), &writable, &engines).map_err(
                |reason| {
                    tracing::warn!(%entry, %reason, "docker: host Unix socket refused");
                    DockerError::UnixSocket {
                        entry: entry.clone(),
                        reason,
                    }
                },
            )?;
            tracing::info!(socket = %path.display(), "docker: host Unix socket bound into the container");
            if !sockets.contains(&path) {
                sockets.push(path);
            }
        }
        Ok(sockets)
    }

    /// The file rules: the workspace, the (read-only) spill directory and the extra roots.
    pub(crate) fn path_rules(
        &self,
        extra_roots: &[(PathBuf, bool)],
    ) -> Result<PathRules, DockerError> {
        let mut extra = vec![Root {
            path: PathBuf::from(SPILL_DIR),
            writable: false,
        }];
        extra.extend(extra_roots.iter().map(|(p, w)| Root {
            path: p.clone(),
            writable: *w,
        }));
        Ok(PathRules::new(&self.workspace, &self.spec, extra)?)
    }

    /// Bind mode: one walk of the workspace for the masks mounted over the denied paths and
    /// the protected paths the wildcard globs match now (read-only mounts, at most
    /// [`mask::MAX_PROTECTED_MOUNTS`]). A workspace too large to scan is an error when there
    /// are denied paths to hide, or with a degraded sandbox allowed a note in `missing`.
    pub(crate) fn scan_workspace(
        &self,
        rules: &PathRules,
        missing: &mut Vec<String>,
    ) -> Result<mask::Scan, DockerError> {
        let needed = !self.spec.denied.is_empty() || !self.spec.protected.is_empty();
        if self.mode != WorkspaceMode::Bind || !needed {
            return Ok(mask::Scan::default());
        }
        let limit = mask::MASK_WALK_LIMIT;
        match mask::scan(
            &self.host_root,
            &self.workspace,
            rules,
            limit,
            mask::MAX_PROTECTED_MOUNTS,
        ) {
            Ok(found) => {
                if found.protected_incomplete {
                    tracing::warn!(
                        root = %self.host_root.display(),
                        mounted = found.protected.len(),
                        "docker: more protected paths than get read-only mounts; the rest are kept from writes by the helper's Landlock rules only (their mode and times stay changeable)"
                    );
                }
                Ok(found)
            }
            Err(limit) if self.spec.denied.is_empty() => {
                tracing::warn!(
                    root = %self.host_root.display(),
                    limit,
                    "docker: the workspace is too large to find its protected paths; they are kept from writes by the helper's Landlock rules only (their mode and times stay changeable)"
                );
                Ok(mask::Scan::default())
            }
            Err(limit) if self.spec.allow_degraded => {
                missing.push(format!(
                    "denied paths are hidden from file operations only: the workspace has more than {limit} entries"
                ));
                Ok(mask::Scan::default())
            }
            Err(limit) => Err(DockerError::DeniedScan {
                path: self.host_root.clone(),
                limit,
            }),
        }
    }

    /// In bind mode the workspace is this host's: git metadata present now is the operator's
    /// (kept read-only), anything a command adds is quarantined by the guard started here.
    pub(crate) fn git_guard(
        &self,
        extra_roots: &[(PathBuf, bool)],
        rules: &PathRules,
    ) -> Result<Option<GitGuard>, DockerError> {
        let host_root = &self.host_root;
        Ok(match (self.mode, self.spec.nested_git) {
            (WorkspaceMode::Bind, NestedGit::Quarantine) => {
                let mut writable = Vec::new();
                if self.spec.workspace == RootAccess::ReadWrite {
                    writable.push(host_root.clone());
                }
                writable.extend(
                    extra_roots
                        .iter()
                        .filter(|(_, w)| *w)
                        .map(|(p, _)| p.clone()),
                );
                // The workspace's own `.git`, when protected and present, is mounted read-only
                // below; a missing one is not pinned here, so one a command makes counts.
                let top = host_root.join(".git");
                let exempt: Vec<PathBuf> = (rules.is_protected(&self.workspace.join(".git"))
                    && std::fs::symlink_metadata(&top).is_ok_and(|m| !m.file_type().is_symlink()))
                .then_some(top)
                .into_iter()
                .collect();
                Some(GitGuard::start(&writable, &exempt, None)?.0)
            }
            (WorkspaceMode::Bind, NestedGit::Allow) | (WorkspaceMode::Copy, _) => None,
        })
    }

    /// Bind mode: make every protected directory of the root (a literal `DIR/**` pattern:
    /// the project's `.cordon`, the user's Cordon directory when the workspace holds it, a
    /// policy's `.github/**`) exist so it can be mounted read-only like every protected path.
    /// This backend mounts only what exists: without this a command could create
    /// `.cordon/policy.toml` and choose the next session's policy. Repositories (`.git`) are
    /// the git guard's. Each missing level is created empty; the created ones are returned
    /// (outermost first) so the session removes them again at its end when still empty. A
    /// symlink on the way is refused rather than followed.
    pub(crate) fn pin_project_config(&self) -> Result<Vec<PathBuf>, DockerError> {
        let mut created = Vec::new();
        if !matches!(self.mode, WorkspaceMode::Bind) {
            return Ok(created);
        }
        let dirs: Vec<String> = self
            .spec
            .protected
            .iter()
            .filter(|glob| glob.ends_with("/**"))
            .cloned()
            .collect();
        let mut pinned = vec![PathBuf::from(PROJECT_CONFIG_DIR)];
        for rel in plan::mountable_protected(&dirs) {
            if !pinned.contains(&rel) {
                pinned.push(rel);
            }
        }
        for rel in pinned {
            if rel.components().any(|c| c.as_os_str() == ".git") {
                continue;
            }
            let mut path = self.host_root.clone();
            for component in rel.components() {
                path.push(component);
                match std::fs::symlink_metadata(&path) {
                    Ok(meta) if meta.is_dir() => continue,
                    Ok(_) => {
                        // A file or a symlink where a protected directory belongs: nothing
                        // to create; the file rules still protect the path.
                        tracing::warn!(
                            path = %path.display(),
                            "docker: a protected directory's path is not a directory; not pinned"
                        );
                        break;
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(DockerError::PinProtected { path, source }),
                }
                // `create_dir` does not follow a symlink planted at the last moment (EEXIST),
                // and every level above was just seen to be a real directory.
                match std::fs::create_dir(&path) {
                    Ok(()) => {
                        tracing::info!(
                            path = %path.display(),
                            "docker: created an empty protected directory so that it can be kept read-only"
                        );
                        created.push(path.clone());
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(source) => return Err(DockerError::PinProtected { path, source }),
                }
            }
        }
        Ok(created)
    }

    /// The protected paths (relative to the root) that exist and can be mounted read-only:
    /// the literal ones, `globbed` (what the wildcard globs match now, [`Self::scan_workspace`])
    /// and the repositories the git guard keeps read-only.
    pub(crate) fn protected_paths(
        &self,
        git: Option<&GitGuard>,
        globbed: Vec<PathBuf>,
    ) -> Vec<PathBuf> {
        let host_root = &self.host_root;
        let mut protected_rel: Vec<PathBuf> = plan::mountable_protected(&self.spec.protected)
            .into_iter()
            .filter(|rel| std::fs::symlink_metadata(host_root.join(rel)).is_ok())
            .collect();
        protected_rel.extend(globbed);
        protected_rel.sort();
        protected_rel.dedup();
        if let Some(guard) = git {
            protected_rel.extend(
                guard
                    .protected_paths()
                    .iter()
                    .filter_map(|path| path.strip_prefix(host_root).ok())
                    .filter(|rel| !rel.as_os_str().is_empty())
                    .map(Path::to_path_buf),
            );
            protected_rel.sort();
            protected_rel.dedup();
        }
        protected_rel
    }

    /// Bind mode: the host root and its protected paths, mounted from the host. Copy mode:
    /// a session volume for the workspace and one per protected directory, created here.
    pub(crate) async fn workspace(
        &self,
        protected_rel: &[PathBuf],
    ) -> Result<Workspace, DockerError> {
        let Launch {
            host_root, session, ..
        } = self;
        Ok(match self.mode {
            WorkspaceMode::Bind => {
                let protected: Vec<(PathBuf, String)> = protected_rel
                    .iter()
                    .filter(|rel| {
                        // A symlinked protected path would mount its target; skip it (the file
                        // rules still protect it) rather than follow it out of the root.
                        std::fs::symlink_metadata(host_root.join(rel))
                            .map(|m| !m.file_type().is_symlink())
                            .unwrap_or(false)
                    })
                    .map(|rel| {
                        (
                            rel.clone(),
                            host_root.join(rel).to_string_lossy().into_owned(),
                        )
                    })
                    .collect();
                (WorkspaceSource::Bind(host_root.clone()), protected, None)
            }
            WorkspaceMode::Copy => {
                let ws_volume = format!("cordon-ws-{session}");
                let dirs: Vec<PathBuf> = protected_rel
                    .iter()
                    .filter(|rel| host_root.join(rel).is_dir())
                    .cloned()
                    .collect();
                let mut volumes = vec![ws_volume.clone()];
                let mut protected = Vec::new();
                for (i, rel) in dirs.iter().enumerate() {
                    let name = format!("cordon-ws-{session}-p{i}");
                    volumes.push(name.clone());
                    protected.push((rel.clone(), name));
                }
                create_workspace_volumes(&self.docker, &volumes, &self.labels).await?;
                let source = WorkspaceSource::Volume(ws_volume);
                (
                    source.clone(),
                    protected.clone(),
                    Some(CopyState {
                        volumes,
                        protected: dirs,
                        source,
                        mounts: protected,
                        labels: self.labels.clone(),
                        image: self.image.clone(),
                    }),
                )
            }
        })
    }

    /// The host environment variables the spec passes through, with their values now.
    pub(crate) fn passed_env(&self) -> Vec<(String, String)> {
        self.spec
            .env
            .pass
            .iter()
            .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
            .collect()
    }

    /// Copy mode: fill the workspace volumes from the host root.
    pub(crate) async fn copy_in(
        &self,
        source: &WorkspaceSource,
        protected: &[(PathBuf, String)],
        rules: &PathRules,
    ) -> Result<(), DockerError> {
        copy::copy_in(
            &self.docker,
            &copy::CopyIn {
                host_root: &self.host_root,
                image: &self.image,
                labels: &self.labels,
                workspace: &self.workspace,
                source,
                protected,
                rules,
                user: self.user,
            },
        )
        .await
    }

    /// Create the container from `body` and start it.
    pub(crate) async fn create_and_start(
        &self,
        body: &ContainerCreateBody,
    ) -> Result<(), DockerError> {
        let Launch {
            docker,
            image,
            container,
            ..
        } = self;
        docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(container.clone()),
                    ..Default::default()
                }),
                body.clone(),
            )
            .await
            .map_err(|e| DockerError::api(format!("create container from {image}"), e))?;
        docker
            .start_container(
                container,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .map_err(|e| DockerError::api(format!("start container {container}"), e))?;
        tracing::info!(%container, %image, "docker: container started");
        Ok(())
    }
}

/// Filtered network mode's egress proxy for a session, once the configuration can run it: a
/// bind-mounted workspace (the proxy's socket is a host path; copy mode is for engines
/// elsewhere) and a `cordon-helper` binary for the engine's architecture. Whether the image
/// can run that binary is learnt when the forwarder starts.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn egress(
    docker: &Docker,
    spec: &SandboxSpec,
    mode: WorkspaceMode,
    helper: Option<&Path>,
    hooks: crate::egress::ProxyHooks,
    container: &str,
    command_uid: u32,
    host_root: &Path,
) -> Result<crate::egress::Egress, DockerError> {
    let at = spec.sources.egress_allow_at();
    let refuse = |reason: String| {
        tracing::warn!(%at, %reason, "docker: filtered network mode refused");
        DockerError::FilteredNetwork {
            at: at.clone(),
            reason,
        }
    };
    match mode {
        WorkspaceMode::Bind => {}
        WorkspaceMode::Copy => {
            return Err(refuse(
                "copy mode (an engine on another machine) cannot reach the egress proxy's \
                 socket on this host; use a local engine with bind mode"
                    .to_owned(),
            ));
        }
    }
    let arch = docker
        .info()
        .await
        .map_err(|e| DockerError::api("read the engine's architecture", e))?
        .architecture
        .unwrap_or_default();
    let helper = crate::egress::choose_helper(helper, &arch).map_err(refuse)?;
    let writable: Vec<&Path> = std::iter::once(host_root)
        .chain(spec.writable_roots.iter().map(Path::new))
        .collect();
    crate::egress::Egress::start(spec, container, helper, hooks, command_uid, &writable)
}

/// The `cordon-helper` binary file operations and search can run through in the container, or
/// why they keep the shell workers: turned off, or no helper for the engine's architecture.
/// Bind mode mounts it, copy mode copies it in (module `helper_copy`). Whether the image can
/// run it is learnt when it starts.
pub(crate) async fn files_helper(
    docker: &Docker,
    wanted: crate::FilesHelper,
    helper: Option<&Path>,
) -> Result<PathBuf, String> {
    match wanted {
        crate::FilesHelper::Shell => return Err("turned off in the configuration".to_owned()),
        crate::FilesHelper::Auto | crate::FilesHelper::Required => {}
    }
    let arch = docker
        .info()
        .await
        .map_err(|e| format!("failed to read the engine's architecture: {e}"))?
        .architecture
        .unwrap_or_default();
    crate::egress::choose_helper(helper, &arch)
}

#[cfg(test)]
mod unix_socket_tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn only_a_canonical_socket_outside_the_writable_roots_is_granted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = std::fs::canonicalize(dir.path()).expect("canonical");
        let socket = base.join("app.sock");
        let _listener = UnixListener::bind(&socket).expect("bind");
        let file = base.join("plain");
        std::fs::write(&file, "x").expect("write");
        let link = base.join("link.sock");
        std::os::unix::fs::symlink(&socket, &link).expect("symlink");
        let linked_dir = base.join("linked");
        std::os::unix::fs::symlink(&base, &linked_dir).expect("symlink");
        let entry = |path: &Path| path.to_str().expect("utf-8").to_owned();
        let check =
            |entry: &str, roots: &[&Path]| checked_unix_socket(entry, Some(&base), roots, &[]);

        assert_eq!(check(&entry(&socket), &[]), Ok(socket.clone()));
        assert_eq!(check("~/app.sock", &[]), Ok(socket.clone()));
        let refused = |entry: String, roots: &[&Path], says: &str| {
            let reason = check(&entry, roots).expect_err(&entry);
            assert!(reason.contains(says), "{entry}: {reason}");
        };
        refused(entry(&file), &[], "is not a Unix socket");
        refused(entry(&link), &[], "is a symbolic link");
        refused(
            entry(&linked_dir.join("app.sock")),
            &[],
            &format!("list {} instead", socket.display()),
        );
        refused(entry(&base.join("missing.sock")), &[], "failed to inspect");
        refused("app.sock".to_owned(), &[], "not an absolute path");
        refused(entry(&socket), &[&base], "which commands can write");
        assert_eq!(
            checked_unix_socket("~/app.sock", None, &[], &[]),
            Err("`~` cannot be expanded: HOME is not set; list an absolute path".to_owned())
        );
    }

    #[test]
    fn the_engines_socket_is_refused_by_any_path_or_hard_link() {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = std::fs::canonicalize(dir.path()).expect("canonical");
        let engine = base.join("docker.sock");
        let _engine = UnixListener::bind(&engine).expect("bind");
        let other = base.join("app.sock");
        let _other = UnixListener::bind(&other).expect("bind");
        let hard = base.join("hard.sock");
        std::fs::hard_link(&engine, &hard).expect("hard link");
        // The engine as configured may be named through a symbolic link (`/var/run`).
        let alias = base.join("run");
        std::os::unix::fs::symlink(&base, &alias).expect("symlink");
        let configured = alias.join("docker.sock");
        let entry = |path: &Path| path.to_str().expect("utf-8").to_owned();
        let check = |path: &Path| checked_unix_socket(&entry(path), None, &[], &[&configured]);

        for listed in [&engine, &hard] {
            let reason = check(listed).expect_err("the engine's socket");
            assert!(
                reason.contains(&format!(
                    "it is the container engine's socket {}",
                    configured.display()
                )) && reason.contains("remove it from the list"),
                "{reason}"
            );
        }
        assert_eq!(check(&other), Ok(other.clone()));
        // An engine socket that does not exist refuses nothing.
        let missing = base.join("missing.sock");
        assert_eq!(
            checked_unix_socket(&entry(&other), None, &[], &[&missing]),
            Ok(other.clone())
        );
    }
}

#[cfg(test)]
mod engine_layer_tests {
    use super::*;

    fn info(security: &[&str], memory: bool, pids: bool) -> SystemInfo {
        SystemInfo {
            security_options: Some(security.iter().map(|s| (*s).to_owned()).collect()),
            memory_limit: Some(memory),
            pids_limit: Some(pids),
            ..Default::default()
        }
    }

    #[test]
    fn an_engine_without_seccomp_or_a_limit_it_would_discard_is_refused() {
        let limits = Limits {
            memory_bytes: Some(1 << 30),
            pids: Some(256),
            ..Limits::default()
        };
        let seccomp = "name=seccomp,profile=default";
        assert_eq!(
            missing_engine_layer(&info(&[seccomp], true, true), &limits),
            None
        );
        assert_eq!(
            missing_engine_layer(&info(&["name=rootless", seccomp], true, true), &limits),
            None
        );
        let refused = |info: SystemInfo, limits: &Limits, says: &str| {
            let reason = missing_engine_layer(&info, limits).expect(says);
            assert!(reason.contains(says), "{reason}");
        };
        refused(info(&[], true, true), &limits, "without seccomp");
        refused(
            info(&["name=apparmor"], true, true),
            &limits,
            "without seccomp",
        );
        refused(
            info(&["name=seccomp,profile=unconfined"], true, true),
            &limits,
            "profile is unconfined",
        );
        refused(info(&[seccomp], false, true), &limits, "the memory limit");
        refused(info(&[seccomp], true, false), &limits, "the pids limit");
        // A limit the spec does not set cannot be discarded.
        let unlimited = Limits {
            memory_bytes: None,
            pids: None,
            ..Limits::default()
        };
        assert_eq!(
            missing_engine_layer(&info(&[seccomp], false, false), &unlimited),
            None
        );
    }
}
