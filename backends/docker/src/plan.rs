//! Pure builders of what the backend asks Docker for: the container body (hardening, limits,
//! mounts, labels, environment) and the list of protected paths that can be mounted read-only.
//! No I/O here, so every field is unit-tested as a whole value.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountType, MountVolumeOptions, ResourcesUlimits,
};
use cordon_core::sandbox::{Limits, NetworkMode, RootAccess, SandboxSpec};

use crate::egress::{EgressMounts, HELPER_IN_CONTAINER, SOCKET_DIR};

/// Mount point of the per-root spill volume inside the container.
pub const SPILL_DIR: &str = "/cordon-spill";
/// Memory the container gets beyond the policy's limit when `cordon-helper` runs in it.
pub const HELPER_MEMORY_HEADROOM: u64 = 64 << 20;
/// Home directory of commands (a private tmpfs owned by the session's uid).
pub const HOME_DIR: &str = "/home/cordon";
/// The command `PATH`.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// What the container's main process runs: nothing but waiting (tini is PID 1 and reaps).
pub const IDLE_COMMAND: &[&str] = &["/bin/sh", "-c", "while :; do sleep 86400; done"];

/// Where the workspace comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkspaceSource {
    /// Bind mount of this host directory.
    Bind(PathBuf),
    /// A named volume (copy mode), filled before start and copied out on request/at the end.
    Volume(String),
}

/// A denied path to hide inside the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mask {
    /// Path relative to the workspace.
    pub rel: PathBuf,
    /// Whether it is a directory.
    pub is_dir: bool,
}

/// Everything [`container_body`] needs.
#[derive(Clone, Debug)]
pub struct ContainerPlan<'a> {
    /// Image reference.
    pub image: &'a str,
    /// uid and gid commands run as.
    pub user: (u32, u32),
    /// The sandbox spec (workspace access, network, limits, environment).
    pub spec: &'a SandboxSpec,
    /// Host values of the variables `spec.env.pass` names.
    pub passed_env: &'a [(String, String)],
    /// Workspace mount point inside the container.
    pub workspace: &'a Path,
    /// Workspace source.
    pub source: &'a WorkspaceSource,
    /// Protected paths relative to the workspace, mounted read-only: for bind mode host
    /// directories, for copy mode `(relative path, volume name)`.
    pub protected: &'a [(PathBuf, String)],
    /// Denied paths relative to the workspace, hidden from commands: files under an empty
    /// read-only `/dev/null`, directories under an empty read-only tmpfs.
    pub masks: &'a [Mask],
    /// Extra host roots mounted at the same path: `(path, writable)`.
    pub extra_roots: &'a [(PathBuf, bool)],
    /// Host Unix sockets (`[network] unix_sockets`, checked) bound at the same path.
    pub unix_sockets: &'a [PathBuf],
    /// Host directories mounted without any policy rule ([`UnlistedBind`]; tests only).
    pub unlisted_binds: &'a [UnlistedBind],
    /// Name of the spill volume.
    pub spill_volume: &'a str,
    /// Network to join when the spec enables the network (`None`: the daemon's default).
    pub network: Option<&'a str>,
    /// Filtered network mode: the egress proxy's socket directory and the forwarder binary.
    pub egress: Option<&'a EgressMounts>,
    /// The host `cordon-helper` file operations and search run in (mounted read-only at
    /// `HELPER_IN_CONTAINER`, where filtered network mode mounts it too).
    pub files_helper: Option<&'a HelperMount>,
    /// The host directory the helper's Unix socket is made in (mounted read-only at
    /// `helper_socket::SOCKET_DIR`), when the helper talks over a socket instead of the
    /// engine's attach stream.
    pub helper_socket_dir: Option<&'a Path>,
    /// Labels.
    pub labels: HashMap<String, String>,
}

/// The environment of commands: a small baseline, the proxy variables in filtered network
/// mode, then passed host variables, then fixed values (later entries win).
pub fn environment(spec: &SandboxSpec, passed: &[(String, String)]) -> Vec<String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in [
        ("PATH", PATH),
        ("HOME", HOME_DIR),
        ("LANG", "C.UTF-8"),
        ("TERM", "dumb"),
        ("TMPDIR", "/tmp"),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    match spec.network {
        // The egress proxy is the only way out; the spec's own entries may still change
        // NO_PROXY and the like (as on the local backend).
        NetworkMode::Filtered => env.extend(crate::egress::proxy_env()),
        NetworkMode::Disabled | NetworkMode::Enabled => {}
    }
    for (k, v) in passed.iter().chain(spec.env.set.iter()) {
        env.insert(k.clone(), v.clone());
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// A host directory bind-mounted read-write into the container at `target` although no policy
/// rule grants it: nothing but the sandbox inside the container (the helper's Landlock rules)
/// stands between a command and it, and with commands on the shell workers nothing at all.
/// It exists for the escape suite, which needs real canaries next to the workspace inside the
/// container to prove that sandbox; the policy file and the CLI cannot set it, and a session
/// in copy mode refuses it (the engine's machine may not have the path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnlistedBind {
    /// The host directory.
    pub source: PathBuf,
    /// Where it appears in the container.
    pub target: PathBuf,
}

/// Where the file helper's binary comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelperMount {
    /// This machine's binary, bind-mounted read-only (bind mode: the engine runs here).
    Bind(PathBuf),
    /// A volume holding it (copy mode), mounted read-only at its directory.
    Volume(String),
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_string_lossy().into_owned()),
        source: Some(source.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn volume(name: &str, target: &Path, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_string_lossy().into_owned()),
        source: Some(name.to_owned()),
        typ: Some(MountType::VOLUME),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// The mounts: workspace, protected paths read-only on top, extra roots, spill volume, and in
/// filtered network mode the egress socket's directory and the forwarder binary (read-only).
pub fn mounts(plan: &ContainerPlan<'_>) -> Vec<Mount> {
    let read_only_root = match plan.spec.workspace {
        RootAccess::ReadOnly => true,
        RootAccess::ReadWrite => false,
    };
    let mut out = vec![match plan.source {
        WorkspaceSource::Bind(host) => bind(host, plan.workspace, read_only_root),
        // Never filled from the image: an empty workspace's volume would otherwise get the
        // image's `/workspace` (its owner included) when the session container mounts it.
        WorkspaceSource::Volume(name) => Mount {
            volume_options: Some(MountVolumeOptions {
                no_copy: Some(true),
                ..Default::default()
            }),
            ..volume(name, plan.workspace, read_only_root)
        },
    }];
    for (rel, source) in plan.protected {
        let target = plan.workspace.join(rel);
        out.push(match plan.source {
            WorkspaceSource::Bind(_) => bind(Path::new(source), &target, true),
            WorkspaceSource::Volume(_) => volume(source, &target, true),
        });
    }
    for (path, writable) in plan.extra_roots {
        out.push(bind(path, path, !writable));
    }
    for unlisted in plan.unlisted_binds {
        out.push(bind(&unlisted.source, &unlisted.target, false));
    }
    for mask in plan.masks.iter().filter(|m| !m.is_dir) {
        out.push(bind(
            Path::new("/dev/null"),
            &plan.workspace.join(&mask.rel),
            true,
        ));
    }
    // Read-only: connecting to a socket needs no write access to its mount, and nothing in
    // the container can replace or remove it.
    for socket in plan.unix_sockets {
        out.push(bind(socket, socket, true));
    }
    out.push(volume(plan.spill_volume, Path::new(SPILL_DIR), false));
    // Read-only like the egress socket's: the container can connect, not create or remove.
    if let Some(dir) = plan.helper_socket_dir {
        out.push(bind(dir, Path::new(crate::helper_socket::SOCKET_DIR), true));
    }
    if let Some(egress) = plan.egress {
        out.push(bind(&egress.socket_dir, Path::new(SOCKET_DIR), true));
        out.push(bind(&egress.helper, Path::new(HELPER_IN_CONTAINER), true));
    } else if let Some(helper) = plan.files_helper {
        out.push(match helper {
            HelperMount::Bind(path) => bind(path, Path::new(HELPER_IN_CONTAINER), true),
            HelperMount::Volume(name) => {
                volume(name, Path::new(crate::helper_copy::mount_dir()), true)
            }
        });
    }
    out
}

/// Fit a container body made for Docker to Podman's API. Podman fills a tmpfs with what lies
/// under it by default (`tmpcopyup`): a tmpfs masking a denied directory would show its
/// files, so every tmpfs gets `notmpcopyup`. Podman's tmpfs options have no `uid=`/`gid=`;
/// `U` makes the tmpfs the container user's, which is the same owner.
pub fn for_podman(body: &mut ContainerCreateBody) {
    let Some(tmpfs) = body.host_config.as_mut().and_then(|h| h.tmpfs.as_mut()) else {
        return;
    };
    for options in tmpfs.values_mut() {
        let mut owned = false;
        let mut kept: Vec<&str> = Vec::new();
        for option in options.split(',') {
            if option.starts_with("uid=") || option.starts_with("gid=") {
                owned = true;
            } else {
                kept.push(option);
            }
        }
        kept.push("notmpcopyup");
        if owned {
            kept.push("U");
        }
        *options = kept.join(",");
    }
}

fn ulimits(limits: &Limits) -> Option<Vec<ResourcesUlimits>> {
    let mut out = Vec::new();
    let mut push = |name: &str, value: Option<u64>| {
        if let Some(v) = value {
            let v = i64::try_from(v).unwrap_or(i64::MAX);
            out.push(ResourcesUlimits {
                name: Some(name.to_owned()),
                soft: Some(v),
                hard: Some(v),
            });
        }
    };
    push("nofile", limits.open_files);
    push("fsize", limits.file_size_bytes);
    push("cpu", limits.cpu_time_secs);
    if out.is_empty() { None } else { Some(out) }
}

/// The container: hardened (no capabilities, `no-new-privileges`, read-only root, init),
/// limited (memory without swap, CPUs, pids, ulimits), private writable `/tmp` and home,
/// network off unless the spec enables it, running as the workspace owner.
pub fn container_body(plan: &ContainerPlan<'_>) -> ContainerCreateBody {
    let (uid, gid) = plan.user;
    let limits = &plan.spec.limits;
    // With the file helper (commands run under it, each limited by RLIMIT_AS like locally)
    // the container also holds the helper: it gets room for it on top, so the command's own
    // limit is what a command meets (the kernel's OOM killer could pick the helper instead).
    let headroom = if plan.files_helper.is_some() {
        HELPER_MEMORY_HEADROOM
    } else {
        0
    };
    let memory = limits
        .memory_bytes
        .map(|m| i64::try_from(m.saturating_add(headroom)).unwrap_or(i64::MAX));
    let network_mode = match plan.spec.network {
        // Filtered mode's only way out is the egress proxy's socket, mounted in.
        NetworkMode::Disabled | NetworkMode::Filtered => Some("none".to_owned()),
        NetworkMode::Enabled => plan.network.map(str::to_owned),
    };
    let mut tmpfs = HashMap::from([
        ("/tmp".to_owned(), "rw,nosuid,nodev,mode=1777".to_owned()),
        (
            HOME_DIR.to_owned(),
            format!("rw,nosuid,nodev,mode=0700,uid={uid},gid={gid}"),
        ),
    ]);
    for mask in plan.masks.iter().filter(|m| m.is_dir) {
        tmpfs.insert(
            plan.workspace
                .join(&mask.rel)
                .to_string_lossy()
                .into_owned(),
            "ro,nosuid,nodev,noexec,size=4k,mode=0555".to_owned(),
        );
    }
    ContainerCreateBody {
        image: Some(plan.image.to_owned()),
        user: Some(format!("{uid}:{gid}")),
        env: Some(environment(plan.spec, plan.passed_env)),
        entrypoint: Some(IDLE_COMMAND.iter().map(|s| s.to_string()).collect()),
        cmd: Some(Vec::new()),
        working_dir: Some(plan.workspace.to_string_lossy().into_owned()),
        labels: Some(plan.labels.clone()),
        network_disabled: Some(match plan.spec.network {
            NetworkMode::Disabled | NetworkMode::Filtered => true,
            NetworkMode::Enabled => false,
        }),
        host_config: Some(HostConfig {
            init: Some(true),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            network_mode,
            memory,
            memory_swap: memory,
            nano_cpus: limits.cpus.map(|c| (c * 1e9) as i64),
            pids_limit: limits.pids.map(|p| i64::try_from(p).unwrap_or(i64::MAX)),
            ulimits: ulimits(limits),
            tmpfs: Some(tmpfs),
            mounts: Some(mounts(plan)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Why a container of this configuration could reach a host Unix socket it was not granted
/// (`None`: it cannot). The container has its own mount and network namespaces, so only what
/// is bound in or shared can reach the host: an extra root holding the daemon's socket (root
/// on the host) or the host's socket directories, or a network namespace shared with the host
/// (its abstract sockets). The sockets `[network] unix_sockets` lists are bound one by one
/// ([`ContainerPlan::unix_sockets`]), nothing around them.
pub fn host_socket_exposure(
    spec: &SandboxSpec,
    network: Option<&str>,
    extra_roots: &[(PathBuf, bool)],
    daemon_socket: Option<&Path>,
) -> Option<String> {
    match spec.network {
        NetworkMode::Disabled | NetworkMode::Filtered => {}
        NetworkMode::Enabled => {
            if let Some(mode) =
                network.filter(|mode| *mode == "host" || mode.starts_with("container:"))
            {
                return Some(format!(
                    "network `{mode}` shares a network namespace and with it abstract Unix \
                     sockets; use a bridge network"
                ));
            }
        }
    }
    for (root, _) in extra_roots {
        if let Some(socket) = daemon_socket.filter(|socket| socket.starts_with(root)) {
            return Some(format!(
                "the extra root {} contains the Docker daemon's socket {}, which is root on \
                 the host; grant a narrower directory",
                root.display(),
                socket.display()
            ));
        }
        let socket_dir = ["/run", "/var/run", "/tmp", "/var/tmp"]
            .iter()
            .map(Path::new)
            .find(|dir| dir.starts_with(root) || (root.starts_with(dir) && !dir.ends_with("tmp")));
        if let Some(dir) = socket_dir {
            return Some(format!(
                "the extra root {} exposes {}, where host services keep their Unix sockets; \
                 grant a narrower directory",
                root.display(),
                dir.display()
            ));
        }
    }
    None
}

/// The protected globs that name a fixed path (`dir/**` or a literal path relative to the
/// workspace); these can be mounted read-only so that commands cannot change them either.
/// Globs with wildcards elsewhere are enforced for file operations only.
pub fn mountable_protected(globs: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for glob in globs {
        let base = glob.strip_suffix("/**").unwrap_or(glob);
        let wild = base.contains(['*', '?', '[', ']', '{', '}']);
        if wild || base.is_empty() || base.starts_with('/') || base.split('/').any(|c| c == "..") {
            continue;
        }
        let path = PathBuf::from(base.trim_start_matches("./"));
        if !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountable_protected_paths() {
        let globs: Vec<String> = [
            ".git/**",
            "secrets/key.pem",
            "**/*.pem",
            "a*/**",
            "/abs/**",
            "../up/**",
            "./docs/**",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            mountable_protected(&globs),
            vec![
                PathBuf::from(".git"),
                PathBuf::from("secrets/key.pem"),
                PathBuf::from("docs")
            ]
        );
    }

    #[test]
    fn denied_paths_are_masked() {
        let spec = SandboxSpec::default();
        let source = WorkspaceSource::Bind(PathBuf::from("/p"));
        let masks = vec![
            Mask {
                rel: PathBuf::from(".env"),
                is_dir: false,
            },
            Mask {
                rel: PathBuf::from("secrets"),
                is_dir: true,
            },
        ];
        let plan = ContainerPlan {
            image: "i",
            user: (1, 1),
            spec: &spec,
            passed_env: &[],
            workspace: Path::new("/workspace"),
            source: &source,
            protected: &[],
            masks: &masks,
            extra_roots: &[],
            unix_sockets: &[],
            unlisted_binds: &[],
            spill_volume: "s",
            network: None,
            egress: None,
            files_helper: None,
            helper_socket_dir: None,
            labels: HashMap::new(),
        };
        let body = container_body(&plan);
        let host = body.host_config.expect("host config");
        assert_eq!(
            host.mounts.expect("mounts")[1],
            Mount {
                target: Some("/workspace/.env".to_owned()),
                source: Some("/dev/null".to_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(true),
                ..Default::default()
            }
        );
        assert_eq!(
            host.tmpfs
                .expect("tmpfs")
                .get("/workspace/secrets")
                .map(String::as_str),
            Some("ro,nosuid,nodev,noexec,size=4k,mode=0555")
        );
    }

    #[test]
    fn the_helper_gets_memory_headroom_on_top_of_the_limit() {
        let mut spec = SandboxSpec::default();
        spec.limits.memory_bytes = Some(64 << 20);
        let source = WorkspaceSource::Bind(PathBuf::from("/p"));
        let memory = |helper: Option<&HelperMount>| {
            let plan = ContainerPlan {
                image: "i",
                user: (1, 1),
                spec: &spec,
                passed_env: &[],
                workspace: Path::new("/workspace"),
                source: &source,
                protected: &[],
                masks: &[],
                extra_roots: &[],
                unix_sockets: &[],
                unlisted_binds: &[],
                spill_volume: "s",
                network: None,
                egress: None,
                files_helper: helper,
                helper_socket_dir: None,
                labels: HashMap::new(),
            };
            let host = container_body(&plan).host_config.expect("host config");
            (host.memory, host.memory_swap)
        };
        assert_eq!(memory(None), (Some(64 << 20), Some(64 << 20)));
        assert_eq!(
            memory(Some(&HelperMount::Bind(PathBuf::from("/h")))),
            (Some(128 << 20), Some(128 << 20))
        );
    }

    #[test]
    fn environment_baseline_then_passed_then_set() {
        let mut spec = SandboxSpec::default();
        spec.env.set = vec![
            ("TERM".to_owned(), "xterm".to_owned()),
            ("A".to_owned(), "1".to_owned()),
        ];
        let passed = vec![("CARGO_HOME".to_owned(), "/c".to_owned())];
        assert_eq!(
            environment(&spec, &passed),
            vec![
                "A=1".to_owned(),
                "CARGO_HOME=/c".to_owned(),
                format!("HOME={HOME_DIR}"),
                "LANG=C.UTF-8".to_owned(),
                format!("PATH={PATH}"),
                "TERM=xterm".to_owned(),
                "TMPDIR=/tmp".to_owned(),
            ]
        );
    }

    #[test]
    fn container_body_is_hardened_and_limited() {
        let spec = SandboxSpec {
            limits: Limits {
                memory_bytes: Some(256 << 20),
                pids: Some(64),
                cpus: Some(1.5),
                open_files: Some(1024),
                ..Limits::default()
            },
            ..SandboxSpec::default()
        };
        let source = WorkspaceSource::Bind(PathBuf::from("/home/me/proj"));
        let protected = vec![(PathBuf::from(".git"), "/home/me/proj/.git".to_owned())];
        let labels = HashMap::from([("cordon.session".to_owned(), "s1".to_owned())]);
        let plan = ContainerPlan {
            image: "cordon-sandbox:latest",
            user: (1000, 1001),
            spec: &spec,
            passed_env: &[],
            workspace: Path::new("/workspace"),
            source: &source,
            protected: &protected,
            masks: &[],
            extra_roots: &[(PathBuf::from("/opt/tools"), false)],
            unix_sockets: &[PathBuf::from("/run/app/app.sock")],
            unlisted_binds: &[],
            spill_volume: "cordon-spill-abc",
            network: None,
            egress: None,
            files_helper: None,
            helper_socket_dir: None,
            labels: labels.clone(),
        };
        let expected = ContainerCreateBody {
            image: Some("cordon-sandbox:latest".to_owned()),
            user: Some("1000:1001".to_owned()),
            env: Some(environment(&spec, &[])),
            entrypoint: Some(vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                "while :; do sleep 86400; done".to_owned(),
            ]),
            cmd: Some(vec![]),
            working_dir: Some("/workspace".to_owned()),
            labels: Some(labels),
            network_disabled: Some(true),
            host_config: Some(HostConfig {
                init: Some(true),
                readonly_rootfs: Some(true),
                cap_drop: Some(vec!["ALL".to_owned()]),
                security_opt: Some(vec!["no-new-privileges".to_owned()]),
                network_mode: Some("none".to_owned()),
                memory: Some(256 << 20),
                memory_swap: Some(256 << 20),
                nano_cpus: Some(1_500_000_000),
                pids_limit: Some(64),
                ulimits: Some(vec![ResourcesUlimits {
                    name: Some("nofile".to_owned()),
                    soft: Some(1024),
                    hard: Some(1024),
                }]),
                tmpfs: Some(HashMap::from([
                    ("/tmp".to_owned(), "rw,nosuid,nodev,mode=1777".to_owned()),
                    (
                        "/home/cordon".to_owned(),
                        "rw,nosuid,nodev,mode=0700,uid=1000,gid=1001".to_owned(),
                    ),
                ])),
                mounts: Some(vec![
                    Mount {
                        target: Some("/workspace".to_owned()),
                        source: Some("/home/me/proj".to_owned()),
                        typ: Some(MountType::BIND),
                        read_only: Some(false),
                        ..Default::default()
                    },
                    Mount {
                        target: Some("/workspace/.git".to_owned()),
                        source: Some("/home/me/proj/.git".to_owned()),
                        typ: Some(MountType::BIND),
                        read_only: Some(true),
                        ..Default::default()
                    },
                    Mount {
                        target: Some("/opt/tools".to_owned()),
                        source: Some("/opt/tools".to_owned()),
                        typ: Some(MountType::BIND),
                        read_only: Some(true),
                        ..Default::default()
                    },
                    Mount {
                        target: Some("/run/app/app.sock".to_owned()),
                        source: Some("/run/app/app.sock".to_owned()),
                        typ: Some(MountType::BIND),
                        read_only: Some(true),
                        ..Default::default()
                    },
                    Mount {
                        target: Some("/cordon-spill".to_owned()),
                        source: Some("cordon-spill-abc".to_owned()),
                        typ: Some(MountType::VOLUME),
                        read_only: Some(false),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(container_body(&plan), expected);
    }

    #[test]
    fn configurations_that_would_expose_a_host_socket_are_named() {
        let on = SandboxSpec {
            network: NetworkMode::Enabled,
            ..SandboxSpec::default()
        };
        let daemon = Some(Path::new("/var/tmp/cordon-docker/docker.sock"));
        let roots = |paths: &[&str]| -> Vec<(PathBuf, bool)> {
            paths.iter().map(|p| (PathBuf::from(p), false)).collect()
        };
        // Fine: a bridge network, roots away from sockets.
        assert_eq!(
            host_socket_exposure(&on, None, &roots(&["/opt/sdk", "/tmp/build"]), daemon),
            None
        );
        assert_eq!(
            host_socket_exposure(&on, Some("cordon-net"), &[], daemon),
            None
        );
        let exposure = |spec: &SandboxSpec, network: Option<&str>, paths: &[&str]| {
            host_socket_exposure(spec, network, &roots(paths), daemon).unwrap_or_default()
        };
        assert!(exposure(&on, Some("host"), &[]).contains("network `host`"));
        assert!(exposure(&on, Some("container:other"), &[]).contains("container:other"));
        // Without the network the mode is `none` whatever was configured.
        assert_eq!(
            host_socket_exposure(&SandboxSpec::default(), Some("host"), &[], daemon),
            None
        );
        assert!(
            exposure(&on, None, &["/var/tmp/cordon-docker"]).contains("Docker daemon's socket")
        );
        assert!(exposure(&on, None, &["/"]).contains("Docker daemon's socket"));
        for root in ["/run", "/run/user/1000", "/var/run/postgresql", "/tmp"] {
            assert!(
                exposure(&on, None, &[root]).contains("where host services keep"),
                "{root}"
            );
        }
        // Listed sockets are bound one by one, not refused.
        let listed = SandboxSpec {
            unix_sockets: vec!["/run/app.sock".to_owned()],
            ..on.clone()
        };
        assert_eq!(host_socket_exposure(&listed, None, &[], daemon), None);
    }
}

#[cfg(test)]
mod egress_tests {
    use super::*;

    /// Filtered mode: no network, the socket's directory and the forwarder binary mounted
    /// read-only after the spill volume.
    #[test]
    fn filtered_mode_mounts_the_proxy_socket_and_the_forwarder_read_only() {
        let spec = SandboxSpec {
            network: NetworkMode::Filtered,
            ..SandboxSpec::default()
        };
        let source = WorkspaceSource::Bind(PathBuf::from("/p"));
        let egress = EgressMounts {
            socket_dir: PathBuf::from("/tmp/cordon-egress-x/socket"),
            helper: PathBuf::from("/opt/cordon/cordon-helper"),
        };
        let plan = ContainerPlan {
            image: "i",
            user: (1, 1),
            spec: &spec,
            passed_env: &[],
            workspace: Path::new("/workspace"),
            source: &source,
            protected: &[],
            masks: &[],
            extra_roots: &[],
            unix_sockets: &[],
            unlisted_binds: &[],
            spill_volume: "s",
            network: Some("bridge"),
            egress: Some(&egress),
            files_helper: None,
            helper_socket_dir: None,
            labels: HashMap::new(),
        };
        let all = mounts(&plan);
        assert_eq!(
            all[all.len() - 2..],
            [
                bind(
                    Path::new("/tmp/cordon-egress-x/socket"),
                    Path::new("/cordon-egress"),
                    true
                ),
                bind(
                    Path::new("/opt/cordon/cordon-helper"),
                    Path::new("/cordon-egress-helper/cordon-helper"),
                    true
                ),
            ]
        );
        let body = container_body(&plan);
        let host = body.host_config.expect("host config");
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(body.network_disabled, Some(true));
    }

    /// An unlisted bind is mounted read-write where it was asked to appear, after the
    /// policy's own mounts (nothing read-only lies over it: only the sandbox in the container
    /// keeps commands away from it).
    #[test]
    fn unlisted_binds_are_mounted_read_write_at_their_target() {
        let spec = SandboxSpec::default();
        let source = WorkspaceSource::Bind(PathBuf::from("/p/ws"));
        let unlisted = [
            UnlistedBind {
                source: PathBuf::from("/p/outside"),
                target: PathBuf::from("/p/outside"),
            },
            UnlistedBind {
                source: PathBuf::from("/p/outside"),
                target: PathBuf::from("/outside"),
            },
        ];
        let plan = ContainerPlan {
            image: "i",
            user: (1, 1),
            spec: &spec,
            passed_env: &[],
            workspace: Path::new("/workspace"),
            source: &source,
            protected: &[],
            masks: &[],
            extra_roots: &[],
            unix_sockets: &[],
            unlisted_binds: &unlisted,
            spill_volume: "s",
            network: None,
            egress: None,
            files_helper: None,
            helper_socket_dir: None,
            labels: HashMap::new(),
        };
        assert_eq!(
            mounts(&plan),
            [
                bind(Path::new("/p/ws"), Path::new("/workspace"), false),
                bind(Path::new("/p/outside"), Path::new("/p/outside"), false),
                bind(Path::new("/p/outside"), Path::new("/outside"), false),
                volume("s", Path::new(SPILL_DIR), false),
            ]
        );
    }

    /// The file helper is the same binary at the same place: mounted once, read-only.
    #[test]
    fn the_file_helper_is_mounted_read_only_once() {
        let spec = SandboxSpec::default();
        let bound = HelperMount::Bind(PathBuf::from("/opt/cordon/cordon-helper"));
        let source = WorkspaceSource::Bind(PathBuf::from("/p"));
        let egress = EgressMounts {
            socket_dir: PathBuf::from("/tmp/cordon-egress-x/socket"),
            helper: PathBuf::from("/opt/cordon/cordon-helper"),
        };
        let mut plan = ContainerPlan {
            image: "i",
            user: (1, 1),
            spec: &spec,
            passed_env: &[],
            workspace: Path::new("/workspace"),
            source: &source,
            protected: &[],
            masks: &[],
            extra_roots: &[],
            unix_sockets: &[],
            unlisted_binds: &[],
            spill_volume: "s",
            network: None,
            egress: None,
            files_helper: Some(&bound),
            helper_socket_dir: None,
            labels: HashMap::new(),
        };
        let helper = bind(
            Path::new("/opt/cordon/cordon-helper"),
            Path::new("/cordon-egress-helper/cordon-helper"),
            true,
        );
        let all = mounts(&plan);
        assert_eq!(all.last(), Some(&helper));
        plan.egress = Some(&egress);
        let all = mounts(&plan);
        assert_eq!(all.iter().filter(|m| **m == helper).count(), 1);
        plan.egress = None;
        plan.files_helper = None;
        assert!(!mounts(&plan).contains(&helper));
        // Copy mode: the volume holding the binary, read-only, at the binary's directory.
        let copied = HelperMount::Volume("cordon-helper-0123".to_owned());
        plan.files_helper = Some(&copied);
        assert_eq!(
            mounts(&plan).last(),
            Some(&volume(
                "cordon-helper-0123",
                Path::new("/cordon-egress-helper"),
                true
            ))
        );
    }

    /// The proxy variables come before the spec's own entries, which win.
    #[test]
    fn filtered_mode_sets_the_proxy_environment_under_the_specs_own_entries() {
        let mut spec = SandboxSpec {
            network: NetworkMode::Filtered,
            ..SandboxSpec::default()
        };
        spec.env.set = vec![("NO_PROXY".to_owned(), "localhost,internal.test".to_owned())];
        let env = environment(&spec, &[]);
        assert!(
            env.contains(&"HTTPS_PROXY=http://127.0.0.1:3128".to_owned()),
            "{env:?}"
        );
        assert!(
            env.contains(&"all_proxy=socks5h://127.0.0.1:3128".to_owned()),
            "{env:?}"
        );
        assert!(
            env.contains(&"NO_PROXY=localhost,internal.test".to_owned()),
            "{env:?}"
        );
        assert!(
            env.contains(&"no_proxy=localhost,127.0.0.1,::1".to_owned()),
            "{env:?}"
        );
        spec.network = NetworkMode::Enabled;
        let unfiltered = environment(&spec, &[]);
        assert!(
            !unfiltered
                .iter()
                .any(|v| v.to_ascii_uppercase().contains("_PROXY=http")),
            "{unfiltered:?}"
        );
    }
}

#[cfg(test)]
mod podman_tests {
    use super::*;

    #[test]
    fn podman_tmpfs_copy_nothing_up_and_get_their_owner_as_u() {
        let mut body = ContainerCreateBody {
            host_config: Some(HostConfig {
                tmpfs: Some(HashMap::from([
                    ("/tmp".to_owned(), "rw,nosuid,nodev,mode=1777".to_owned()),
                    (
                        "/home/cordon".to_owned(),
                        "rw,nosuid,nodev,mode=0700,uid=1000,gid=1001".to_owned(),
                    ),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        };
        for_podman(&mut body);
        assert_eq!(
            body.host_config.and_then(|h| h.tmpfs),
            Some(HashMap::from([
                (
                    "/tmp".to_owned(),
                    "rw,nosuid,nodev,mode=1777,notmpcopyup".to_owned()
                ),
                (
                    "/home/cordon".to_owned(),
                    "rw,nosuid,nodev,mode=0700,notmpcopyup,U".to_owned()
                ),
            ]))
        );
    }
}
