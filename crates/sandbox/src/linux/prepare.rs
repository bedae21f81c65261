//! Preparing a sandbox: the session directory, the canonical forms of the configured paths,
//! the Landlock ruleset (rebuilt every [`RULESET_REUSE`] spawns), the seccomp program, the
//! rlimits and the environment baseline, all built once in [`PreparedSandbox::prepare`]; and
//! swapping the protected and denied paths later. It does not start any process.

use std::ffi::{CString, OsStr, OsString, c_int};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::carve;
use super::landlock::{self, Access, PathRule};
use super::mounts::MountConfig;
use super::probe::probe;
use super::{
    Inner, NewRootConfig, PreparedSandbox, c_string, defaults, lock, seccomp, sys, warden,
};
use crate::config::{HostSupport, Layer, NetworkAccess, Profile, SandboxConfig};
use crate::error::SandboxError;

/// The Landlock ruleset and what is needed to rebuild it.
///
/// Each spawn's init adds one rule (its fresh `/proc`) to the shared ruleset, so the ruleset
/// grows by one rule per spawn; after [`RULESET_REUSE`] spawns a fresh one is built from
/// `rules`, which keeps the per-spawn merge cost of `landlock_restrict_self` bounded.
#[derive(Debug)]
pub(super) struct LandlockState {
    pub(super) abi: u32,
    network: NetworkAccess,
    rules: Vec<PathRule>,
    current: std::sync::Mutex<(Arc<OwnedFd>, u32)>,
    /// Without a mount namespace in the container profile: protected and denied paths are
    /// carved out of the rules for each command (module `carve`).
    carve: bool,
}

/// Spawns served by one Landlock ruleset before it is rebuilt.
const RULESET_REUSE: u32 = 128;

impl LandlockState {
    /// The ruleset for the next spawn.
    pub(super) fn ruleset(&self) -> Result<Arc<OwnedFd>, SandboxError> {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.1 >= RULESET_REUSE {
            let fresh = landlock::build_ruleset(self.abi, self.network, &self.rules)?;
            *current = (Arc::new(fresh), 0);
        }
        current.1 += 1;
        Ok(Arc::clone(&current.0))
    }

    /// The ruleset for the next command spawned directly (no namespaces): in the container
    /// profile with `protected` and `denied` carved out of the rules, built afresh for each
    /// command while anything needs carving (rules attach to inodes, and the entries of a
    /// carved directory change between commands); else [`LandlockState::ruleset`].
    pub(super) fn ruleset_for_direct(
        &self,
        protected: &[PathBuf],
        denied: &[PathBuf],
    ) -> Result<Arc<OwnedFd>, SandboxError> {
        if !self.carve {
            return self.ruleset();
        }
        let excluded = carve::needing_carve(protected, denied);
        if excluded.is_empty() {
            return self.ruleset();
        }
        let rules = carve::carve(&self.rules, &excluded, &mut carve::list_dir)?;
        Ok(Arc::new(landlock::build_ruleset(
            self.abi,
            self.network,
            &rules,
        )?))
    }
}

/// The per-session directory: TMPDIR, HOME, the private `/dev/shm` and the masks.
#[derive(Debug)]
pub(super) struct SessionDir {
    root: PathBuf,
    pub(super) tmp: PathBuf,
    pub(super) home: PathBuf,
    /// Empty directory a networked init builds its new root on.
    staging: PathBuf,
    pub(super) shm: CString,
    pub(super) mask_dir: CString,
    pub(super) mask_file: CString,
}

impl Drop for SessionDir {
    fn drop(&mut self) {
        // Masks are mode 000; make them removable first. Symlinks created by commands are
        // removed, never followed (std's remove_dir_all does not follow them).
        let mask = self.root.join("mask");
        for entry in [mask.join("dir"), mask.join("file")] {
            // Best effort: a mask a command removed needs no chmod; remove_dir_all below reports nothing either.
            let _ = std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o700));
        }
        // Cleanup in a drop: what stays is under the runtime's state directory, swept at the next start.
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

static SESSION_COUNTER: AtomicU64 = AtomicU64::new(0);

/// `mkdir` with `mode` (it must not exist), as a session-directory error.
fn make_session_dir(path: &Path, mode: u32) -> Result<(), SandboxError> {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(|source| SandboxError::SessionDir {
            path: path.to_owned(),
            source,
        })
}

impl SessionDir {
    /// The session directory at `root`, which may exist already with `tmp` and `home` (real
    /// directories, not symlinks, accessible to us only); everything else is created new.
    fn create_at(root: PathBuf) -> Result<SessionDir, SandboxError> {
        let reuse = |path: &Path| -> Result<bool, SandboxError> {
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.is_dir() && meta.permissions().mode() & 0o077 == 0 => Ok(true),
                Ok(_) => Err(SandboxError::SessionDir {
                    path: path.to_owned(),
                    source: io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "exists and is not a private directory",
                    ),
                }),
                Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(source) => Err(SandboxError::SessionDir {
                    path: path.to_owned(),
                    source,
                }),
            }
        };
        let make = |path: &Path| -> Result<(), SandboxError> {
            if reuse(path)? {
                return Ok(());
            }
            make_session_dir(path, 0o700)
        };
        make(&root)?;
        make(&root.join("tmp"))?;
        make(&root.join("home"))?;
        SessionDir::fill(root)
    }

    fn create(parent: &Path) -> Result<SessionDir, SandboxError> {
        let pid = std::process::id();
        let mut attempt = 0;
        let root = loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let count = SESSION_COUNTER.fetch_add(1, Ordering::Relaxed);
            let candidate = parent.join(format!("cordon-sandbox-{pid}-{count}-{nanos:08x}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
                Ok(()) => break candidate,
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => {
                    attempt += 1;
                }
                Err(source) => {
                    return Err(SandboxError::SessionDir {
                        path: candidate,
                        source,
                    });
                }
            }
        };
        make_session_dir(&root.join("tmp"), 0o700)?;
        make_session_dir(&root.join("home"), 0o700)?;
        SessionDir::fill(root)
    }

    /// Create the parts after `tmp` and `home` (private `/dev/shm`, masks) in `root`.
    fn fill(root: PathBuf) -> Result<SessionDir, SandboxError> {
        let make = make_session_dir;
        let tmp = root.join("tmp");
        let home = root.join("home");
        let shm = root.join("shm");
        let mask = root.join("mask");
        let staging = root.join("newroot");
        make(&staging, 0o700)?;
        make(&shm, 0o700)?;
        make(&mask, 0o700)?;
        make(&mask.join("dir"), 0o000)?;
        let mask_file = mask.join("file");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&mask_file)
            .and_then(|_| {
                std::fs::set_permissions(&mask_file, std::fs::Permissions::from_mode(0o000))
            })
            .map_err(|source| SandboxError::SessionDir {
                path: mask_file.clone(),
                source,
            })?;
        Ok(SessionDir {
            shm: c_string(shm.as_os_str(), "sandbox path")?,
            mask_dir: c_string(mask.join("dir").as_os_str(), "sandbox path")?,
            mask_file: c_string(mask_file.as_os_str(), "sandbox path")?,
            root,
            tmp,
            home,
            staging,
        })
    }
}

/// Canonical absolute form of an existing path.
fn canonical_existing(path: &Path) -> Result<PathBuf, SandboxError> {
    if !path.is_absolute() {
        return Err(SandboxError::RelativePath {
            path: path.to_owned(),
        });
    }
    path.canonicalize()
        .map_err(|source| SandboxError::OpenPath {
            path: path.to_owned(),
            source,
        })
}

/// Canonical forms of the read roots that exist; other errors (and relative paths) fail.
fn existing_read_roots(paths: &[PathBuf]) -> Result<Vec<PathBuf>, SandboxError> {
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        match canonical_existing(path) {
            Ok(path) => out.push(path),
            Err(SandboxError::OpenPath { source, .. })
                if source.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    Ok(out)
}

/// Canonical form of a path that may not exist: the canonical longest existing prefix joined
/// with the rest. The final component itself is never resolved (it may be a symlink the mount
/// plan must see as such).
fn canonical_lenient(path: &Path) -> Result<PathBuf, SandboxError> {
    if !path.is_absolute() {
        return Err(SandboxError::RelativePath {
            path: path.to_owned(),
        });
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(path.to_owned());
    };
    match parent.canonicalize() {
        Ok(parent) => Ok(parent.join(name)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            Ok(canonical_lenient(parent)?.join(name))
        }
        Err(source) => Err(SandboxError::OpenPath {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Device nodes commands may read and write.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

fn last_capability() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(40)
}

impl PreparedSandbox {
    /// Build the sandbox for this host (see [`probe`]).
    ///
    /// # Errors
    /// [`SandboxError::MissingLayers`] when the host lacks a required layer and
    /// `allow_degraded` is off; path, Landlock and session-directory errors otherwise.
    pub fn prepare(config: SandboxConfig) -> Result<PreparedSandbox, SandboxError> {
        PreparedSandbox::prepare_with_support(config, probe())
    }

    /// Build the sandbox as if the host supported exactly `support` (a subset of what it
    /// really supports). Useful to test the fail-closed and degraded paths, or to force a
    /// weaker mode deliberately.
    ///
    /// # Errors
    /// As [`PreparedSandbox::prepare`].
    pub fn prepare_with_support(
        config: SandboxConfig,
        support: HostSupport,
    ) -> Result<PreparedSandbox, SandboxError> {
        let SandboxConfig {
            read_exec,
            read,
            write,
            protected,
            denied,
            network,
            unix_sockets,
            limits,
            env,
            session_parent,
            session_dir,
            allow_degraded,
            profile,
        } = config;

        let missing = SandboxConfig {
            network,
            limits,
            allow_degraded,
            profile,
            ..SandboxConfig::default()
        }
        .missing_layers(&support)
        .map_err(|layers| SandboxError::MissingLayers { layers })?;
        // A filtered network without its namespace would be the host's whole network: no
        // degraded form of it exists.
        if network == NetworkAccess::Filtered && missing.contains(&Layer::NetworkNamespace) {
            return Err(SandboxError::MissingLayers {
                layers: vec![Layer::NetworkNamespace],
            });
        }
        // In a container the sandbox creates no namespace; a filtered network is the
        // container's own network namespace, set up by whoever made the container.
        let own_namespaces = match profile {
            Profile::Host => true,
            Profile::Container if network == NetworkAccess::Filtered => {
                return Err(SandboxError::MissingLayers {
                    layers: vec![Layer::NetworkNamespace],
                });
            }
            Profile::Container => false,
        };

        // A read root that does not exist (any more) grants nothing: skipping it is safe, and
        // host defaults list files that come and go (e.g. SQLite journals under ~/.cargo).
        let read_exec = existing_read_roots(&read_exec)?;
        let read = existing_read_roots(&read)?;
        let write: Vec<PathBuf> = write
            .iter()
            .map(|p| canonical_existing(p))
            .collect::<Result<_, _>>()?;
        let (protected_input, denied_input) = (protected.clone(), denied.clone());
        let protected: Vec<PathBuf> = protected
            .iter()
            .map(|p| canonical_lenient(p))
            .collect::<Result<_, _>>()?;
        let denied: Vec<PathBuf> = denied
            .iter()
            .map(|p| canonical_lenient(p))
            .collect::<Result<_, _>>()?;

        let session_parent = match session_parent {
            Some(parent) => canonical_existing(&parent)?,
            None => canonical_existing(&std::env::temp_dir())?,
        };
        let session = match session_dir {
            Some(dir) => SessionDir::create_at(canonical_lenient(&dir)?)?,
            None => SessionDir::create(&session_parent)?,
        };
        let shm_path = PathBuf::from(OsStr::from_bytes(session.shm.as_bytes()));

        let namespaces = own_namespaces && support.namespaces();
        let keep_group = match profile {
            Profile::Host => false,
            Profile::Container => true,
        };
        let private_shm = namespaces && Path::new("/dev/shm").is_dir();

        let mut rules: Vec<PathRule> = Vec::new();
        let mut push = |paths: &[PathBuf], access: Access| {
            for path in paths {
                rules.push(PathRule::whole(path.clone(), access));
            }
        };
        push(&read_exec, Access::ReadExec);
        push(&read, Access::Read);
        push(&write, Access::Write);
        push(&[session.tmp.clone(), session.home.clone()], Access::Write);
        if private_shm {
            push(&[shm_path], Access::Write);
        }
        let devices: Vec<PathBuf> = DEVICES
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.exists())
            .collect();
        push(&devices, Access::Device);
        // Safe to read: a fresh /proc shows only the sandbox's processes. Without a PID
        // namespace it is the host's, which is part of what the missing layer costs.
        push(&[PathBuf::from("/proc")], Access::Read);

        let landlock = if support.landlock_abi >= 1 {
            let ruleset = landlock::build_ruleset(support.landlock_abi, network, &rules)?;
            Some(LandlockState {
                abi: support.landlock_abi,
                network,
                rules,
                current: std::sync::Mutex::new((Arc::new(ruleset), 0)),
                carve: match profile {
                    Profile::Host => false,
                    Profile::Container => true,
                },
            })
        } else {
            None
        };
        let seccomp = if support.seccomp {
            let program =
                seccomp::compile(&seccomp::rules(network, keep_group), seccomp::native_arch())
                    .map_err(|reason| SandboxError::SeccompBuild { reason })?;
            Some(program)
        } else {
            None
        };

        let mut rlimits = vec![(libc::RLIMIT_CORE as c_int, 0, 0)];
        let mut limit = |resource: c_int, value: Option<u64>, extra_hard: u64| {
            if let Some(value) = value {
                // A hard limit can only go down without CAP_SYS_RESOURCE: clamp.
                let hard_now = sys::get_rlimit(resource).map_or(u64::MAX, |(_, hard)| hard);
                let soft = value.min(hard_now);
                let hard = value.saturating_add(extra_hard).min(hard_now);
                rlimits.push((resource, soft, hard));
            }
        };
        match profile {
            Profile::Host => limit(libc::RLIMIT_NPROC as c_int, limits.processes, 0),
            // The container's pids limit; RLIMIT_NPROC counts the uid machine-wide.
            Profile::Container => {}
        }
        limit(libc::RLIMIT_AS as c_int, limits.memory_bytes, 0);
        limit(libc::RLIMIT_FSIZE as c_int, limits.file_size_bytes, 0);
        limit(libc::RLIMIT_NOFILE as c_int, limits.open_files, 0);
        limit(libc::RLIMIT_CPU as c_int, limits.cpu_time_secs, 1);

        let user_maps = (namespaces && !support.root).then(|| {
            (
                format!("{0} {0} 1\n", sys::geteuid()).into_bytes(),
                format!("{0} {0} 1\n", sys::getegid()).into_bytes(),
            )
        });
        let pid_max = match limits.processes {
            Some(processes) if namespaces && support.root && support.pid_max_per_namespace => {
                // Once 300 pids have been handed out in a namespace the kernel allocates
                // from 300 up (RESERVED_PIDS), so `pid_max - 300` is the cap that holds for
                // the namespace's whole life; until then up to 300 more fit.
                Some(processes.saturating_add(300).to_string().into_bytes())
            }
            _ => None,
        };

        let new_root = if network.connects() && namespaces {
            let mut visible: Vec<PathBuf> = defaults::SYSTEM_READ_EXEC
                .iter()
                .map(PathBuf::from)
                .collect();
            visible.extend(read_exec.iter().cloned());
            visible.extend(read.iter().cloned());
            visible.extend(write.iter().cloned());
            visible.push(session.root.clone());
            visible.push(PathBuf::from("/proc"));
            visible.extend(devices.iter().cloned());
            if private_shm {
                visible.push(PathBuf::from("/dev/shm"));
            }
            let staging_c = c_string(session.staging.as_os_str(), "sandbox path")?;
            Some(NewRootConfig {
                visible,
                sockets: unix_sockets,
                staging: session.staging.clone(),
                staging_c,
            })
        } else {
            None
        };

        let mut readable = read_exec.clone();
        readable.extend(read.iter().cloned());
        readable.extend(write.iter().cloned());
        // One bind makes the session's TMPDIR, HOME and shm writable (Landlock still grants
        // only those three; the masks inside are mode 000 and mounted read-only when used).
        let mut writable = write.clone();
        writable.push(session.root.clone());

        let mut base_env: Vec<(OsString, OsString)> = vec![
            ("PATH".into(), defaults::SYSTEM_PATH.into()),
            ("HOME".into(), session.home.clone().into_os_string()),
            ("TMPDIR".into(), session.tmp.clone().into_os_string()),
            (
                "LANG".into(),
                std::env::var_os("LANG").unwrap_or_else(|| "C.UTF-8".into()),
            ),
            (
                "TERM".into(),
                std::env::var_os("TERM").unwrap_or_else(|| "dumb".into()),
            ),
        ];
        merge_env(&mut base_env, env);

        let warden = if keep_group {
            Some(Arc::new(
                warden::Warden::start().map_err(|source| SandboxError::Warden { source })?,
            ))
        } else {
            None
        };
        Ok(PreparedSandbox {
            inner: Arc::new(Inner {
                missing,
                namespaces,
                keep_group,
                warden,
                network,
                landlock,
                seccomp,
                session: Arc::new(session),
                env: base_env,
                rlimits,
                last_cap: last_capability(),
                mounts: std::sync::Mutex::new(Arc::new(MountConfig {
                    write: writable,
                    readable,
                    protected,
                    denied,
                    private_shm,
                })),
                user_maps,
                pid_max,
                argv_area: sys::argv_area(),
                idle: std::sync::Mutex::new(Vec::new()),
                retire_pending: std::sync::atomic::AtomicBool::new(false),
                new_root,
                last_paths: std::sync::Mutex::new((protected_input, denied_input)),
            }),
        })
    }

    /// Replace the protected and denied paths (see [`SandboxConfig`]) for commands spawned
    /// from now on; running commands keep the set they started with. Backends call this when
    /// the files matching their protected/denied patterns change. Returns whether the set
    /// differs from the current one.
    ///
    /// # Errors
    /// [`SandboxError::RelativePath`] or [`SandboxError::OpenPath`] for a path that cannot be
    /// put in canonical form; the current set is then kept.
    pub fn set_protected_and_denied(
        &self,
        protected: &[PathBuf],
        denied: &[PathBuf],
    ) -> Result<bool, SandboxError> {
        {
            let last = lock(&self.inner.last_paths);
            if last.0 == protected && last.1 == denied {
                return Ok(false);
            }
        }
        let requested = (protected.to_vec(), denied.to_vec());
        let protected: Vec<PathBuf> = protected
            .iter()
            .map(|p| canonical_lenient(p))
            .collect::<Result<_, _>>()?;
        let denied: Vec<PathBuf> = denied
            .iter()
            .map(|p| canonical_lenient(p))
            .collect::<Result<_, _>>()?;
        let mut current = lock(&self.inner.mounts);
        *lock(&self.inner.last_paths) = requested;
        if current.protected == protected && current.denied == denied {
            return Ok(false);
        }
        let MountConfig {
            write,
            readable,
            protected: _,
            denied: _,
            private_shm,
        } = current.as_ref();
        *current = Arc::new(MountConfig {
            write: write.clone(),
            readable: readable.clone(),
            protected,
            denied,
            private_shm: *private_shm,
        });
        Ok(true)
    }
}

/// Later entries replace earlier ones with the same name.
pub(super) fn merge_env(base: &mut Vec<(OsString, OsString)>, extra: Vec<(OsString, OsString)>) {
    for (key, value) in extra {
        match base.iter_mut().find(|(existing, _)| *existing == key) {
            Some(entry) => entry.1 = value,
            None => base.push((key, value)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_canonical_form_keeps_a_missing_or_symlinked_last_component() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink("/tmp", root.join("link")).unwrap();
        assert_eq!(
            canonical_lenient(&root.join("link")).unwrap(),
            root.join("link")
        );
        assert_eq!(
            canonical_lenient(&root.join("a/b/.git")).unwrap(),
            root.join("a/b/.git")
        );
        assert!(matches!(
            canonical_lenient(Path::new("relative")),
            Err(SandboxError::RelativePath { .. })
        ));
    }

    #[test]
    fn later_environment_entries_win() {
        let mut base: Vec<(OsString, OsString)> =
            vec![("PATH".into(), "/bin".into()), ("HOME".into(), "/h".into())];
        merge_env(
            &mut base,
            vec![("PATH".into(), "/usr/bin".into()), ("X".into(), "1".into())],
        );
        assert_eq!(
            base,
            vec![
                ("PATH".into(), "/usr/bin".into()),
                ("HOME".into(), "/h".into()),
                ("X".into(), "1".into())
            ]
        );
    }
}
