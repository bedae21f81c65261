//! The Linux sandbox: [`PreparedSandbox`] builds everything once (Landlock ruleset fd,
//! seccomp program, session directory, environment baseline); [`PreparedSandbox::spawn`]
//! hands the command to an idle init whose mounts are still current, or clones a new init
//! into fresh PID + mount + IPC namespaces (it sets up the mounts and confines itself), and
//! the init starts the command; [`SandboxedChild`] awaits the command and signals or kills
//! its whole tree.
//!
//! Process shape with namespaces: parent → init (PID 1, never execs, no capabilities,
//! Landlock and seccomp in force) → command. When the command ends the init kills every
//! other process of the namespace, removes System V IPC objects, reports the status and goes
//! back to the parent's idle list (or exits, when it is stale; one holding placeholders is
//! retired after `PLACEHOLDER_LINGER`). When the parent's handle is dropped (or the parent
//! dies) the init sees EOF on its control socket and exits, and the kernel kills whatever is
//! left in the namespace. Without namespaces (an explicitly degraded host) the command is the direct child in its own
//! session, restricts itself before `execve`, and tree operations use its process group.

mod child;
mod defaults;
mod landlock;
mod mounts;
mod newroot;
mod probe;
mod seccomp;
mod sys;

use std::ffi::{CStr, CString, OsStr, OsString, c_int};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

pub use defaults::{host_defaults, host_defaults_for_home};
pub use mounts::is_placeholder_dir;
pub use probe::probe;

use crate::config::{ExitStatus, HostSupport, Layer, SandboxConfig, SpawnRequest};
use crate::error::{SandboxError, SetupStep};
use child::{ChildMount, CommandPlan, InitPlan};
use landlock::{Access, PathRule};
use mounts::{MountConfig, MountPlan};
use sys::CStringArray;

/// Start writing the file's dirty pages back to disk, without waiting (`sync_file_range`
/// with `SYNC_FILE_RANGE_WRITE`). The local backend calls it, off the caller's path, for a file
/// it has just swapped in with `RENAME_EXCHANGE`: ext4 starts that writeback itself on a
/// rename over an existing file (`auto_da_alloc`), and this keeps the same protection against a
/// zero-length file after a power loss.
pub fn start_writeback(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsFd;
    sys::start_writeback(file.as_fd())
}

/// A sandbox built once from a [`SandboxConfig`]; spawn any number of commands from it,
/// concurrently if needed.
#[derive(Debug)]
pub struct PreparedSandbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    missing: Vec<Layer>,
    namespaces: bool,
    landlock: Option<LandlockState>,
    seccomp: Option<Vec<sys::SockFilter>>,
    session: Arc<SessionDir>,
    env: Vec<(OsString, OsString)>,
    rlimits: Vec<(c_int, u64, u64)>,
    last_cap: u32,
    /// Swapped whole by [`PreparedSandbox::set_protected_and_denied`]; each spawn plans from
    /// the value current when it starts.
    mounts: std::sync::Mutex<Arc<MountConfig>>,
    user_maps: Option<(Vec<u8>, Vec<u8>)>,
    pid_max: Option<Vec<u8>>,
    argv_area: Option<(usize, usize)>,
    /// Inits whose command has ended, waiting for the next one.
    idle: std::sync::Mutex<Vec<InitProcess>>,
    /// With the network on: what the socket-free root shows (see `newroot`).
    new_root: Option<NewRootConfig>,
    /// The protected and denied paths last passed to `set_protected_and_denied`, as given
    /// (an unchanged set skips putting them in canonical form again).
    last_paths: std::sync::Mutex<(Vec<PathBuf>, Vec<PathBuf>)>,
}

/// Inputs of a networked init's new root.
#[derive(Debug)]
struct NewRootConfig {
    /// Trees and files shown.
    visible: Vec<PathBuf>,
    /// Host sockets the configuration allows.
    sockets: Vec<PathBuf>,
    /// Where the init builds it (an empty directory in the session directory).
    staging: PathBuf,
    /// `staging` for the child.
    staging_c: CString,
}

/// Symlinks of the new root's `/dev` (the host's point into the host's `/proc`).
const DEV_SYMLINKS: &[(&str, &str)] = &[
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];

/// The Landlock ruleset and what is needed to rebuild it.
///
/// Each spawn's init adds one rule (its fresh `/proc`) to the shared ruleset, so the ruleset
/// grows by one rule per spawn; after [`RULESET_REUSE`] spawns a fresh one is built from
/// `rules`, which keeps the per-spawn merge cost of `landlock_restrict_self` bounded.
#[derive(Debug)]
struct LandlockState {
    abi: u32,
    network: bool,
    rules: Vec<PathRule>,
    current: std::sync::Mutex<(Arc<OwnedFd>, u32)>,
}

/// Spawns served by one Landlock ruleset before it is rebuilt.
const RULESET_REUSE: u32 = 128;

impl LandlockState {
    /// The ruleset for the next spawn.
    fn ruleset(&self) -> Result<Arc<OwnedFd>, SandboxError> {
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
}

/// The per-session directory: TMPDIR, HOME, the private `/dev/shm` and the masks.
#[derive(Debug)]
struct SessionDir {
    root: PathBuf,
    tmp: PathBuf,
    home: PathBuf,
    /// Empty directory a networked init builds its new root on.
    staging: PathBuf,
    shm: CString,
    mask_dir: CString,
    mask_file: CString,
}

impl Drop for SessionDir {
    fn drop(&mut self) {
        // Masks are mode 000; make them removable first. Symlinks created by commands are
        // removed, never followed (std's remove_dir_all does not follow them).
        let mask = self.root.join("mask");
        for entry in [mask.join("dir"), mask.join("file")] {
            let _ = std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o700));
        }
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

fn c_string(value: &OsStr, what: &'static str) -> Result<CString, SandboxError> {
    CString::new(value.as_bytes()).map_err(|_| SandboxError::NulByte { what })
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
        } = config;

        let missing = SandboxConfig {
            network,
            limits,
            allow_degraded,
            ..SandboxConfig::default()
        }
        .missing_layers(&support)
        .map_err(|layers| SandboxError::MissingLayers { layers })?;

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

        let namespaces = support.namespaces();
        let private_shm = namespaces && Path::new("/dev/shm").is_dir();

        let mut rules: Vec<PathRule> = Vec::new();
        let mut push = |paths: &[PathBuf], access: Access| {
            for path in paths {
                rules.push(PathRule {
                    path: path.clone(),
                    access,
                });
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
            })
        } else {
            None
        };
        let seccomp = if support.seccomp {
            let program = seccomp::compile(&seccomp::rules(network), seccomp::native_arch())
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
        limit(libc::RLIMIT_NPROC as c_int, limits.processes, 0);
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

        let new_root = if network && namespaces {
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

        Ok(PreparedSandbox {
            inner: Arc::new(Inner {
                missing,
                namespaces,
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
                new_root,
                last_paths: std::sync::Mutex::new((protected_input, denied_input)),
            }),
        })
    }

    /// Layers this sandbox does not apply because the host lacks them (empty on a fully
    /// capable host). Non-empty only for optional layers, or when `allow_degraded` was set;
    /// backends report it in every result's details.
    pub fn missing_layers(&self) -> &[Layer] {
        &self.inner.missing
    }

    /// The per-session temporary directory (the commands' `TMPDIR`).
    pub fn tmp_dir(&self) -> &Path {
        &self.inner.session.tmp
    }

    /// The per-session home directory (the commands' `HOME`).
    pub fn home_dir(&self) -> &Path {
        &self.inner.session.home
    }

    /// The environment every command starts from (before the request's own entries).
    pub fn base_env(&self) -> &[(OsString, OsString)] {
        &self.inner.env
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

    /// Whether an idle init is ready for the current protected and denied paths, so the next
    /// [`spawn`](PreparedSandbox::spawn) only hands the command over instead of building
    /// namespaces (callers may then spawn without moving to a blocking thread).
    pub fn has_idle_init(&self) -> bool {
        let config = self.mount_config();
        lock(&self.inner.idle)
            .iter()
            .any(|init| Arc::ptr_eq(&init.config, &config))
    }

    /// End every idle init now; the placeholders they held are removed by their last user.
    /// Running commands are not affected, and a later spawn starts a fresh init. Call it when
    /// a session ends, so that no placeholder outlives it.
    pub fn retire_idle(&self) {
        let retired = std::mem::take(&mut *lock(&self.inner.idle));
        drop(retired);
    }

    fn mount_config(&self) -> Arc<MountConfig> {
        Arc::clone(
            &self
                .inner
                .mounts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Run one command in the sandbox. Returns once the command is executing (or failed to
    /// start: then nothing ran).
    ///
    /// With namespaces the command runs under an init process (PID 1 of the sandbox). An
    /// init whose command has ended is kept, idle, and serves the next command when its
    /// mounts are still current (same protected and denied paths, same inodes, the same
    /// placeholders at missing protected paths; an init holding placeholders idles for at
    /// most `PLACEHOLDER_LINGER`), and it is younger than 60 s with fewer than 10 000
    /// commands served (`INIT_MAX_AGE`, `INIT_MAX_COMMANDS`): each command still starts with no process of
    /// an earlier command left and no System V IPC object either, but without building
    /// namespaces, mounts, the Landlock domain and the seccomp program again.
    ///
    /// # Errors
    /// A missing program, NUL bytes, a command too large, a protected path that cannot be
    /// pinned, or a failing setup step in the child ([`SandboxError::ChildSetup`], naming
    /// the step and path).
    pub fn spawn(&self, request: SpawnRequest) -> Result<SandboxedChild, SandboxError> {
        let SpawnRequest {
            program,
            args,
            cwd,
            env,
            stdin,
            stdout,
            stderr,
        } = request;
        let inner = &self.inner;
        if !cwd.is_absolute() {
            return Err(SandboxError::RelativePath { path: cwd });
        }
        let mut env_all = inner.env.clone();
        merge_env(&mut env_all, env);
        let path_value = env_all
            .iter()
            .find(|(key, _)| key == "PATH")
            .map(|(_, value)| value.clone())
            .unwrap_or_default();
        let program_path = resolve_program(&program, &path_value, &cwd)?;

        let c_program = c_string(program_path.as_os_str(), "program path")?;
        let mut argv = vec![c_string(&program, "program name")?];
        for arg in &args {
            argv.push(c_string(arg, "argument")?);
        }
        let mut envp = Vec::with_capacity(env_all.len());
        for (key, value) in &env_all {
            if key.is_empty() || key.as_bytes().contains(&b'=') {
                return Err(SandboxError::NulByte {
                    what: "environment name (empty or containing '=')",
                });
            }
            let mut entry = key.clone().into_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            envp.push(CString::new(entry).map_err(|_| SandboxError::NulByte {
                what: "environment entry",
            })?);
        }
        let c_cwd = c_string(cwd.as_os_str(), "working directory")?;
        let stdio = [
            stdio_fd(stdin, false)?,
            stdio_fd(stdout, true)?,
            stdio_fd(stderr, true)?,
        ];
        let paths = ErrorPaths {
            cwd,
            program: program_path,
        };
        if !inner.namespaces {
            let argv = CStringArray::new(argv);
            let envp = CStringArray::new(envp);
            return self.spawn_direct(DirectCommand {
                program: &c_program,
                cwd: &c_cwd,
                argv: &argv,
                envp: &envp,
                stdio,
                paths,
            });
        }
        let argv_refs: Vec<&CStr> = argv.iter().map(CString::as_c_str).collect();
        let envp_refs: Vec<&CStr> = envp.iter().map(CString::as_c_str).collect();
        let message = child::encode_command(&c_program, &c_cwd, &argv_refs, &envp_refs).ok_or(
            SandboxError::CommandTooLarge {
                limit: child::MAX_PAYLOAD,
                strings: child::MAX_STRINGS,
            },
        )?;
        let config = self.mount_config();
        loop {
            let (init, pooled) = match self.take_idle(&config) {
                Some(init) => (init, true),
                None => (self.start_init(&config)?, false),
            };
            match self.start_command(init, &message, &stdio, &paths) {
                Ok(child) => return Ok(child),
                // An idle init that died meanwhile: start a fresh one.
                Err(Started::InitGone) if pooled => continue,
                Err(Started::InitGone) => {
                    return Err(SandboxError::Clone {
                        source: io::Error::from(io::ErrorKind::BrokenPipe),
                    });
                }
                Err(Started::Failed(error)) => return Err(error),
            }
        }
    }

    /// An idle init that can serve a command under `config`; stale ones are retired.
    fn take_idle(&self, config: &Arc<MountConfig>) -> Option<InitProcess> {
        let mut idle = lock(&self.inner.idle);
        while let Some(init) = idle.pop() {
            if init.fits(config) {
                return Some(init);
            }
        }
        None
    }

    /// Clone a new init into fresh namespaces and wait until its mounts and restrictions are
    /// in place.
    fn start_init(&self, config: &Arc<MountConfig>) -> Result<InitProcess, SandboxError> {
        let inner = &self.inner;
        let plan = mounts::plan(config)?;
        let root_plan = match &inner.new_root {
            Some(new_root) => Some(newroot::plan(
                &new_root.staging,
                &newroot::RootInputs {
                    visible: &new_root.visible,
                    sockets: &new_root.sockets,
                    own_symlinks: DEV_SYMLINKS,
                },
            )?),
            None => None,
        };
        let child_mounts: Vec<ChildMount<'_>> = plan
            .steps
            .iter()
            .map(|step| ChildMount {
                kind: step.kind,
                path: step.c_path.as_c_str(),
            })
            .collect();
        let ruleset = inner
            .landlock
            .as_ref()
            .map(LandlockState::ruleset)
            .transpose()?;
        let (setup_read, setup_write) =
            sys::pipe_cloexec().map_err(|source| SandboxError::Pipe { source })?;
        let (control_parent, control_child) = control_pair()?;
        let mut keep: Vec<RawFd> = vec![setup_write.as_raw_fd(), control_child.as_raw_fd()];
        keep.extend(ruleset.as_ref().map(|fd| fd.as_raw_fd()));
        // The init keeps the placeholders' shared locks for as long as it lives (its mounts
        // depend on them), also when this process dies first.
        keep.extend(plan.lock_fds());
        keep.sort_unstable();
        keep.dedup();

        let stack = sys::ChildStack::new();
        let inbox_bytes = sys::AnonMemory::new(child::MAX_PAYLOAD)
            .map_err(|source| SandboxError::Clone { source })?;
        let inbox_pointers = sys::AnonMemory::new(
            (child::MAX_STRINGS + 2) * std::mem::size_of::<*const std::ffi::c_char>(),
        )
        .map_err(|source| SandboxError::Clone { source })?;
        debug_assert!(inbox_bytes.len() >= child::MAX_PAYLOAD);
        let init_plan = InitPlan {
            user_maps: inner
                .user_maps
                .as_ref()
                .map(|(uid, gid)| (uid.as_slice(), gid.as_slice())),
            pid_max: inner.pid_max.as_deref(),
            mounts: &child_mounts,
            mask_dir: &inner.session.mask_dir,
            mask_file: &inner.session.mask_file,
            shm_source: &inner.session.shm,
            new_root: match (&inner.new_root, &root_plan) {
                (Some(new_root), Some(root_plan)) => {
                    Some((new_root.staging_c.as_c_str(), root_plan.steps.as_slice()))
                }
                _ => None,
            },
            keep_fds: &keep,
            setup_fd: setup_write.as_raw_fd(),
            control_fd: control_child.as_raw_fd(),
            rlimits: &inner.rlimits,
            last_cap: inner.last_cap,
            landlock: ruleset.as_ref().map(|fd| fd.as_raw_fd()),
            proc_rights: inner
                .landlock
                .as_ref()
                .map_or(0, |state| landlock::proc_rights(state.abi)),
            seccomp: inner.seccomp.as_deref(),
            argv_area: inner.argv_area,
            stack: &stack,
            inbox: child::Inbox {
                bytes: inbox_bytes.base(),
                pointers: inbox_pointers.base().cast(),
            },
        };
        let mut flags = (libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC) as u64;
        if inner.user_maps.is_some() {
            flags |= libc::CLONE_NEWUSER as u64;
        }
        let saved = sys::block_all_signals();
        // SAFETY: the child branch runs only `child::run_init`, which is async-signal-safe
        // and ends in _exit; every signal is blocked across the clone.
        let cloned = match unsafe { sys::clone_process(flags) } {
            Ok(sys::Cloned::Child) => child::run_init(&init_plan),
            Ok(sys::Cloned::Parent { pid, pidfd }) => Ok((pid, pidfd)),
            Err(source) => Err(source),
        };
        sys::restore_signals(&saved);
        drop(child_mounts);
        drop(setup_write);
        drop(control_child);
        let MountPlan {
            steps,
            placeholders,
            mut identities,
        } = plan;
        // A socket replaced on the host (a restarted server) needs a fresh bind.
        for socket in root_plan.iter().flat_map(|plan| &plan.sockets) {
            if let Some(identity) = mounts::Identity::now(socket) {
                identities.push((socket.clone(), identity));
            }
        }
        let (pid, pidfd) = match cloned {
            Ok(started) => started,
            Err(source) => {
                release_placeholders(placeholders);
                return Err(SandboxError::Clone { source });
            }
        };
        let mut init = InitProcess {
            pid,
            pidfd: Some(pidfd),
            control: Some(control_parent),
            placeholders,
            identities,
            config: Arc::clone(config),
            born: Instant::now(),
            commands: 0,
            idle_since: Instant::now(),
        };
        match read_error_record(&setup_read) {
            Ok(None) => Ok(init),
            Ok(Some((step, errno, index))) => {
                init.kill_and_reap();
                let path = match step {
                    SetupStep::BindWritable
                    | SetupStep::PinPath
                    | SetupStep::ProtectPath
                    | SetupStep::MaskPath
                    | SetupStep::MountShm => {
                        steps.get(index as usize).map(|step| step.path.clone())
                    }
                    SetupStep::BuildRoot => root_plan
                        .as_ref()
                        .and_then(|plan| plan.steps.get(index as usize))
                        .map(|step| step.path.clone()),
                    SetupStep::ResetSignals
                    | SetupStep::HideInit
                    | SetupStep::MapUsers
                    | SetupStep::MakeMountsPrivate
                    | SetupStep::ReadOnlyRoot
                    | SetupStep::MountProc
                    | SetupStep::SetPidMax
                    | SetupStep::ForkCommand
                    | SetupStep::NewSession
                    | SetupStep::SetRlimit
                    | SetupStep::ChangeDirectory
                    | SetupStep::RedirectStdio
                    | SetupStep::CloseFds
                    | SetupStep::DropCapabilities
                    | SetupStep::VerifyCapabilities
                    | SetupStep::NoNewPrivs
                    | SetupStep::Landlock
                    | SetupStep::Seccomp
                    | SetupStep::Exec => None,
                };
                Err(SandboxError::ChildSetup {
                    step,
                    path,
                    source: io::Error::from_raw_os_error(errno),
                })
            }
            Err(source) => {
                init.kill_and_reap();
                Err(SandboxError::Wait { source })
            }
        }
    }

    /// Hand one command to `init` and wait until it runs (or failed to start).
    fn start_command(
        &self,
        mut init: InitProcess,
        message: &[u8],
        stdio: &[OwnedFd; 3],
        paths: &ErrorPaths,
    ) -> Result<SandboxedChild, Started> {
        let (exec_read, exec_write) =
            sys::pipe_cloexec().map_err(|source| Started::Failed(SandboxError::Pipe { source }))?;
        let fds = [
            stdio[0].as_raw_fd(),
            stdio[1].as_raw_fd(),
            stdio[2].as_raw_fd(),
            exec_write.as_raw_fd(),
        ];
        let Some(control) = init.control.as_ref() else {
            return Err(Started::InitGone);
        };
        if let Err(error) = sys::send_with_fds(control, message, &fds) {
            init.kill_and_reap();
            return Err(match error.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => Started::InitGone,
                _ => Started::Failed(SandboxError::Pipe { source: error }),
            });
        }
        drop(exec_write);
        let mut ack = [0u8; 1];
        match sys::read_retry(&exec_read, &mut ack) {
            Ok(1) if ack[0] == child::COMMAND_ACK => {}
            // EOF first: the init died before taking the command; nothing ran.
            Ok(_) => {
                init.kill_and_reap();
                return Err(Started::InitGone);
            }
            Err(source) => {
                init.kill_and_reap();
                return Err(Started::Failed(SandboxError::Wait { source }));
            }
        }
        init.commands += 1;
        match read_error_record(&exec_read) {
            Ok(None) => Ok(SandboxedChild::under_init(init, self)),
            Ok(Some((step, errno, _))) => {
                init.kill_and_reap();
                let path = match step {
                    SetupStep::ChangeDirectory => Some(paths.cwd.clone()),
                    SetupStep::Exec => Some(paths.program.clone()),
                    _ => None,
                };
                Err(Started::Failed(SandboxError::ChildSetup {
                    step,
                    path,
                    source: io::Error::from_raw_os_error(errno),
                }))
            }
            Err(source) => {
                init.kill_and_reap();
                Err(Started::Failed(SandboxError::Wait { source }))
            }
        }
    }

    /// Without namespaces (an explicitly degraded host): the command is this process's
    /// direct child, restricting itself before `execve`.
    fn spawn_direct(&self, command: DirectCommand<'_>) -> Result<SandboxedChild, SandboxError> {
        let DirectCommand {
            program,
            cwd,
            argv,
            envp,
            stdio,
            paths,
        } = command;
        let inner = &self.inner;
        let ruleset = inner
            .landlock
            .as_ref()
            .map(LandlockState::ruleset)
            .transpose()?;
        let (exec_read, exec_write) =
            sys::pipe_cloexec().map_err(|source| SandboxError::Pipe { source })?;
        let plan = CommandPlan {
            program: program.as_ptr(),
            cwd: cwd.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            stdio: [
                stdio[0].as_raw_fd(),
                stdio[1].as_raw_fd(),
                stdio[2].as_raw_fd(),
            ],
            exec_fd: exec_write.as_raw_fd(),
            rlimits: &inner.rlimits,
            last_cap: inner.last_cap,
            drop_capabilities: true,
            landlock: ruleset.as_ref().map(|fd| fd.as_raw_fd()),
            seccomp: inner.seccomp.as_deref(),
        };
        let stack = sys::ChildStack::new();
        let mut raw_pidfd: c_int = -1;
        let arg = &plan as *const CommandPlan<'_> as *mut std::ffi::c_void;
        let saved = sys::block_all_signals();
        // SAFETY: command_entry only runs async-signal-safe code reading the plan, which this
        // thread keeps alive while it is suspended until the child execs or exits; the stack
        // is reserved for this child; every signal is blocked across the clone.
        let started =
            unsafe { sys::vfork_child(&stack, child::command_entry, arg, Some(&mut raw_pidfd), 0) };
        sys::restore_signals(&saved);
        drop(exec_write);
        drop(stdio);
        let (pid, pidfd) = started
            .map_err(io::Error::from_raw_os_error)
            .and_then(|pid| sys::owned_pidfd(raw_pidfd).map(|pidfd| (pid, pidfd)))
            .map_err(|source| SandboxError::Clone { source })?;
        let mut child = SandboxedChild {
            pid,
            pidfd: Some(pidfd),
            control: None,
            namespaces: false,
            status: None,
            placeholders: Vec::new(),
            reuse: None,
            running: Arc::new(std::sync::Mutex::new(true)),
            _session: Arc::clone(&inner.session),
        };
        match read_error_record(&exec_read) {
            Ok(None) => Ok(child),
            Ok(Some((step, errno, _))) => {
                child.kill_and_reap();
                let path = match step {
                    SetupStep::ChangeDirectory => Some(paths.cwd),
                    SetupStep::Exec => Some(paths.program),
                    _ => None,
                };
                Err(SandboxError::ChildSetup {
                    step,
                    path,
                    source: io::Error::from_raw_os_error(errno),
                })
            }
            Err(source) => {
                child.kill_and_reap();
                Err(SandboxError::Wait { source })
            }
        }
    }
}

/// The paths an error while starting a command may name.
struct ErrorPaths {
    cwd: PathBuf,
    program: PathBuf,
}

/// One command for [`PreparedSandbox::spawn_direct`].
struct DirectCommand<'a> {
    program: &'a CStr,
    cwd: &'a CStr,
    argv: &'a CStringArray,
    envp: &'a CStringArray,
    stdio: [OwnedFd; 3],
    paths: ErrorPaths,
}

/// Why handing a command to an init did not work.
enum Started {
    /// The init is gone (an idle one may have died meanwhile).
    InitGone,
    /// The command could not be started.
    Failed(SandboxError),
}

/// Read a `(step, errno, index)` error record from a setup or exec pipe: `None` at EOF
/// without one (the step succeeded).
fn read_error_record(pipe: &OwnedFd) -> io::Result<Option<(SetupStep, i32, u32)>> {
    let mut record = [0u8; 12];
    let mut filled = 0;
    while filled < record.len() {
        match sys::read_retry(pipe, &mut record[filled..])? {
            0 => break,
            read => filled += read,
        }
    }
    if filled == 0 {
        return Ok(None);
    }
    let word = |index: usize| {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(&record[index * 4..index * 4 + 4]);
        bytes
    };
    let step = SetupStep::from_number(u32::from_ne_bytes(word(0))).unwrap_or(SetupStep::Exec);
    Ok(Some((
        step,
        i32::from_ne_bytes(word(1)),
        u32::from_ne_bytes(word(2)),
    )))
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long an idle init may wait for its next command before it is retired. It is a
/// copy-on-write snapshot of the parent's memory, so it should not outlive the parent's
/// working set by much.
pub(crate) const INIT_MAX_AGE: Duration = Duration::from_secs(60);
/// Commands one init serves before it is retired.
pub(crate) const INIT_MAX_COMMANDS: u32 = 10_000;
/// Idle inits kept per sandbox (enough for the parallel commands of one agent turn).
const MAX_IDLE_INITS: usize = 4;
/// How long an idle init that holds placeholders (empty directories at missing protected
/// paths, e.g. `.git` of a workspace without one) is kept for the next command. Back-to-back
/// commands (a replayed session, a script of tool calls, parallel calls) then reuse it; a
/// workspace shows the placeholder only while commands run and for this long after.
pub(crate) const PLACEHOLDER_LINGER: Duration = Duration::from_secs(2);

/// An init process (PID 1 of a sandbox's namespaces) and what it was set up with.
#[derive(Debug)]
struct InitProcess {
    pid: i32,
    pidfd: Option<OwnedFd>,
    control: Option<OwnedFd>,
    /// Placeholders its mounts depend on, locked shared; removed (by the last user) when the
    /// init is retired. An idle init holding any is retired after [`PLACEHOLDER_LINGER`].
    placeholders: Vec<mounts::Placeholder>,
    /// The identity of everything it protected or masked.
    identities: Vec<(PathBuf, mounts::Identity)>,
    /// The configuration its mounts were planned from.
    config: Arc<MountConfig>,
    born: Instant,
    commands: u32,
    /// When its last command ended.
    idle_since: Instant,
}

impl InitProcess {
    /// Whether this (idle) init may serve a command under `config`: same configuration, the
    /// same inodes still at the protected and masked paths and placeholders, not too old.
    fn fits(&self, config: &Arc<MountConfig>) -> bool {
        Arc::ptr_eq(&self.config, config)
            && self.pidfd.is_some()
            && self.control.is_some()
            && self.born.elapsed() < INIT_MAX_AGE
            && self.commands < INIT_MAX_COMMANDS
            && self
                .identities
                .iter()
                .all(|(path, id)| mounts::Identity::now(path) == Some(*id))
    }

    fn kill_and_reap(&mut self) {
        if let Some(pidfd) = self.pidfd.take() {
            let _ = sys::pidfd_send_signal(&pidfd, libc::SIGKILL);
            self.control = None;
            let _ = sys::waitid_pidfd(&pidfd, true);
        }
        release_placeholders(std::mem::take(&mut self.placeholders));
    }
}

impl Drop for InitProcess {
    fn drop(&mut self) {
        // Closing the control socket ends an idle init; it is reaped in the background.
        self.control = None;
        if let Some(pidfd) = self.pidfd.take() {
            match sys::waitid_pidfd(&pidfd, false) {
                Ok(Some(_)) | Err(_) => {}
                Ok(None) => reap_later(pidfd),
            }
        }
        release_placeholders(std::mem::take(&mut self.placeholders));
    }
}

/// Later entries replace earlier ones with the same name.
fn merge_env(base: &mut Vec<(OsString, OsString)>, extra: Vec<(OsString, OsString)>) {
    for (key, value) in extra {
        match base.iter_mut().find(|(existing, _)| *existing == key) {
            Some(entry) => entry.1 = value,
            None => base.push((key, value)),
        }
    }
}

/// Find the program: as given when it contains `/` (relative to `cwd`), else in `PATH`.
fn resolve_program(program: &OsStr, path: &OsStr, cwd: &Path) -> Result<PathBuf, SandboxError> {
    let not_found = || SandboxError::ProgramNotFound {
        program: PathBuf::from(program),
    };
    if program.is_empty() {
        return Err(not_found());
    }
    if program.as_bytes().contains(&b'/') {
        return Ok(cwd.join(program));
    }
    for dir in path.as_bytes().split(|&b| b == b':') {
        if dir.is_empty() {
            continue;
        }
        let candidate = Path::new(OsStr::from_bytes(dir)).join(program);
        if let Ok(meta) = std::fs::metadata(&candidate)
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return Ok(candidate);
        }
    }
    Err(not_found())
}

/// A standard stream's fd, numbered >= 3 so the child's dup2 onto 0..2 never clobbers
/// another stream.
fn stdio_fd(fd: Option<OwnedFd>, write: bool) -> Result<OwnedFd, SandboxError> {
    let fd = match fd {
        Some(fd) => fd,
        None => std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|source| SandboxError::DevNull { source })?,
    };
    if fd.as_raw_fd() >= 3 {
        return Ok(fd);
    }
    sys::dup_cloexec_at_least(&fd, 3).map_err(|source| SandboxError::Pipe { source })
}

fn control_pair() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    let (parent, child) =
        std::os::unix::net::UnixStream::pair().map_err(|source| SandboxError::Pipe { source })?;
    Ok((OwnedFd::from(parent), OwnedFd::from(child)))
}

fn release_placeholders(placeholders: Vec<mounts::Placeholder>) {
    for placeholder in placeholders {
        placeholder.release();
    }
}

/// A running sandboxed command. Dropping it kills the command's whole tree.
#[derive(Debug)]
pub struct SandboxedChild {
    pid: i32,
    pidfd: Option<OwnedFd>,
    control: Option<OwnedFd>,
    namespaces: bool,
    status: Option<ExitStatus>,
    placeholders: Vec<mounts::Placeholder>,
    /// Where the init goes once the command has ended, when it may serve another one.
    reuse: Option<Reuse>,
    /// Shared with signallers; see [`TreeSignaller`].
    running: Arc<std::sync::Mutex<bool>>,
    _session: Arc<SessionDir>,
}

/// An init that may serve another command, with what it was set up with.
#[derive(Debug)]
struct Reuse {
    inner: Arc<Inner>,
    identities: Vec<(PathBuf, mounts::Identity)>,
    config: Arc<MountConfig>,
    born: Instant,
    commands: u32,
}

impl Reuse {
    /// Put the init back into the idle list when its configuration is still current and
    /// there is room; otherwise it ends (its control socket closes) and its placeholders are
    /// released.
    fn give_back(
        self,
        pid: i32,
        pidfd: OwnedFd,
        control: OwnedFd,
        placeholders: Vec<mounts::Placeholder>,
    ) {
        let Reuse {
            inner,
            identities,
            config,
            born,
            commands,
        } = self;
        let current = Arc::clone(&lock(&inner.mounts));
        let lingers = !placeholders.is_empty();
        let init = InitProcess {
            pid,
            pidfd: Some(pidfd),
            control: Some(control),
            placeholders,
            identities,
            config,
            born,
            commands,
            idle_since: Instant::now(),
        };
        if !Arc::ptr_eq(&init.config, &current)
            || init.born.elapsed() >= INIT_MAX_AGE
            || init.commands >= INIT_MAX_COMMANDS
        {
            return;
        }
        // Without the thread that retires it, an init holding placeholders is not kept.
        if lingers && !retire_later(&inner) {
            return;
        }
        let mut idle = lock(&inner.idle);
        if idle.len() < MAX_IDLE_INITS {
            idle.push(init);
        }
    }
}

/// Ask the retiring thread to look at `inner`'s idle inits once [`PLACEHOLDER_LINGER`] has
/// passed. `false` when that thread cannot be started.
fn retire_later(inner: &Arc<Inner>) -> bool {
    static RETIRER: BackgroundQueue<Due> = std::sync::OnceLock::new();
    let Some(sender) = background_queue(&RETIRER, "cordon-retire", retire_loop) else {
        return false;
    };
    let due = Instant::now() + PLACEHOLDER_LINGER;
    sender.send((due, Arc::downgrade(inner))).is_ok()
}

/// The queue of a background thread, started on first use (`None`: it could not be).
type BackgroundQueue<T> = std::sync::OnceLock<Option<mpsc::Sender<T>>>;

/// The queue in `cell`, starting the thread `name` that runs `work` on its receiving end the
/// first time.
fn background_queue<T: Send + 'static>(
    cell: &'static BackgroundQueue<T>,
    name: &str,
    work: fn(&mpsc::Receiver<T>),
) -> Option<&'static mpsc::Sender<T>> {
    cell.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<T>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || work(&receiver))
            .ok()?;
        Some(sender)
    })
    .as_ref()
}

/// When to look at a sandbox's idle inits again.
type Due = (Instant, std::sync::Weak<Inner>);

/// The retiring thread: wait for the earliest due time (or a new one), then retire what
/// lingered long enough in the sandboxes still alive.
fn retire_loop(receiver: &mpsc::Receiver<Due>) {
    let mut pending: Vec<Due> = Vec::new();
    loop {
        let received = match pending.iter().map(|(due, _)| *due).min() {
            Some(due) => receiver.recv_timeout(due.saturating_duration_since(Instant::now())),
            None => receiver
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match received {
            // One entry per sandbox, at its latest due time: by then every init it gave back
            // earlier has lingered long enough too.
            Ok((due, inner)) => match pending.iter_mut().find(|(_, known)| known.ptr_eq(&inner)) {
                Some(entry) => entry.0 = entry.0.max(due),
                None => pending.push((due, inner)),
            },
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        pending.retain(|(due, inner)| {
            if *due > now {
                return true;
            }
            if let Some(inner) = inner.upgrade() {
                retire_lingering(&inner);
            }
            false
        });
    }
}

/// Retire the idle inits of `inner` that hold placeholders and have been idle for
/// [`PLACEHOLDER_LINGER`]; their placeholders are removed by the last user.
fn retire_lingering(inner: &Inner) {
    let retired: Vec<InitProcess> = {
        let mut idle = lock(&inner.idle);
        let (retired, kept) = std::mem::take(&mut *idle).into_iter().partition(|init| {
            !init.placeholders.is_empty() && init.idle_since.elapsed() >= PLACEHOLDER_LINGER
        });
        *idle = kept;
        retired
    };
    drop(retired);
}

impl SandboxedChild {
    /// A command running under `init`, which goes back to `sandbox`'s idle list afterwards
    /// (see [`Reuse::give_back`]).
    fn under_init(mut init: InitProcess, sandbox: &PreparedSandbox) -> SandboxedChild {
        let reuse = Some(Reuse {
            inner: Arc::clone(&sandbox.inner),
            identities: std::mem::take(&mut init.identities),
            config: Arc::clone(&init.config),
            born: init.born,
            commands: init.commands,
        });
        SandboxedChild {
            pid: init.pid,
            pidfd: init.pidfd.take(),
            control: init.control.take(),
            namespaces: true,
            status: None,
            placeholders: std::mem::take(&mut init.placeholders),
            reuse,
            running: Arc::new(std::sync::Mutex::new(true)),
            _session: Arc::clone(&sandbox.inner.session),
        }
    }

    /// Host pid of the process Cordon created (the init with namespaces, else the command).
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Wait for the command to end. With namespaces every other process of the sandbox is
    /// gone by the time this returns.
    ///
    /// # Errors
    /// [`SandboxError::Wait`] when waiting fails (e.g. called outside a tokio runtime).
    pub async fn wait(&mut self) -> Result<ExitStatus, SandboxError> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        // The init reports on the control socket; without namespaces the command's exit
        // makes its pidfd readable.
        let watched = match (self.control.as_ref(), self.pidfd.as_ref()) {
            (Some(control), _) => control,
            (None, Some(pidfd)) => pidfd,
            (None, None) => {
                return Err(SandboxError::Wait {
                    source: io::Error::from(io::ErrorKind::NotFound),
                });
            }
        };
        let watch = sys::dup_cloexec_at_least(watched, 3)
            .map_err(|source| SandboxError::Wait { source })?;
        let watch = sys::async_readable(watch).map_err(|source| SandboxError::Wait { source })?;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            let mut guard = watch
                .readable()
                .await
                .map_err(|source| SandboxError::Wait { source })?;
            guard.clear_ready();
        }
    }

    /// Wait for the command to end, blocking the calling thread.
    ///
    /// # Errors
    /// [`SandboxError::Wait`] when waiting fails.
    pub fn wait_blocking(&mut self) -> Result<ExitStatus, SandboxError> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        if let Some(control) = self.control.as_ref() {
            let report =
                read_status(control, true).map_err(|source| SandboxError::Wait { source })?;
            if let Some(status) = report {
                return Ok(self.finish_reported(status));
            }
        }
        let reaped = match self.pidfd.as_ref() {
            Some(pidfd) => {
                sys::waitid_pidfd(pidfd, true).map_err(|source| SandboxError::Wait { source })?
            }
            None => None,
        };
        match reaped {
            Some(reaped) => Ok(self.finish_reaped(reaped)),
            None => Err(SandboxError::Wait {
                source: io::Error::from(io::ErrorKind::NotFound),
            }),
        }
    }

    /// The status if the command has ended, without blocking.
    ///
    /// # Errors
    /// [`SandboxError::Wait`] when waiting fails.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, SandboxError> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        if let Some(control) = self.control.as_ref() {
            match read_status(control, false).map_err(|source| SandboxError::Wait { source })? {
                Some(status) => return Ok(Some(self.finish_reported(status))),
                // Still running: nothing to read yet and the init is alive.
                None if !control_closed(control) => return Ok(None),
                // EOF without a report: the init died (killed); its own status is the answer.
                None => {}
            }
        }
        let Some(pidfd) = self.pidfd.as_ref() else {
            return Ok(None);
        };
        match sys::waitid_pidfd(pidfd, false).map_err(|source| SandboxError::Wait { source })? {
            Some(reaped) => Ok(Some(self.finish_reaped(reaped))),
            None if self.control.is_some() => {
                // The init is going away; wait for it (it has nothing left to run).
                let reaped = sys::waitid_pidfd(pidfd, true)
                    .map_err(|source| SandboxError::Wait { source })?;
                Ok(reaped.map(|reaped| self.finish_reaped(reaped)))
            }
            None => Ok(None),
        }
    }

    /// The init reported the command's status after killing and reaping everything else; it
    /// may still be tearing its namespaces down, so it is reaped in the background.
    fn finish_reported(&mut self, status: ExitStatus) -> ExitStatus {
        self.status = Some(status);
        self.mark_ended();
        let control = self.control.take();
        let pidfd = self.pidfd.take();
        match (self.reuse.take(), control, pidfd) {
            (Some(reuse), Some(control), Some(pidfd)) => {
                let placeholders = std::mem::take(&mut self.placeholders);
                reuse.give_back(self.pid, pidfd, control, placeholders);
            }
            (_, control, pidfd) => {
                // An init that is not reused exits once its socket closes; it is reaped in
                // the background.
                drop(control);
                if let Some(pidfd) = pidfd {
                    match sys::waitid_pidfd(&pidfd, false) {
                        Ok(Some(_)) | Err(_) => {}
                        Ok(None) => reap_later(pidfd),
                    }
                }
            }
        }
        release_placeholders(std::mem::take(&mut self.placeholders));
        status
    }

    /// The process Cordon created has been reaped.
    fn finish_reaped(&mut self, reaped: sys::Reaped) -> ExitStatus {
        let status = match reaped {
            sys::Reaped::Exited(code) => ExitStatus::Code(code),
            sys::Reaped::Signaled(signal) => ExitStatus::Signal(signal),
        };
        self.status = Some(status);
        self.mark_ended();
        self.pidfd = None;
        self.control = None;
        self.reuse = None;
        release_placeholders(std::mem::take(&mut self.placeholders));
        status
    }

    /// Send `signal` to every process of the sandbox (HUP, INT, QUIT, USR1, USR2, ALRM,
    /// TERM, CONT or WINCH; KILL is [`SandboxedChild::kill_tree`]). No-op once the command
    /// has ended.
    ///
    /// # Errors
    /// [`SandboxError::UnsupportedSignal`] for other signals; [`SandboxError::Signal`] when
    /// sending fails.
    pub fn signal_tree(&self, signal: i32) -> Result<(), SandboxError> {
        if signal == libc::SIGKILL {
            return self.kill_tree();
        }
        if !child::FORWARDED_SIGNALS.contains(&signal) {
            return Err(SandboxError::UnsupportedSignal { signal });
        }
        let Some(pidfd) = self.pidfd.as_ref() else {
            return Ok(());
        };
        let result = if self.namespaces {
            // The init forwards it to every process of the namespace.
            sys::pidfd_send_signal(pidfd, signal)
        } else {
            sys::kill_process_group(self.pid, signal)
        };
        ignore_gone(result).map_err(|source| SandboxError::Signal { source })
    }

    /// Kill every process of the sandbox with SIGKILL. No-op once the command has ended.
    ///
    /// # Errors
    /// [`SandboxError::Signal`] when sending fails.
    pub fn kill_tree(&self) -> Result<(), SandboxError> {
        let Some(pidfd) = self.pidfd.as_ref() else {
            return Ok(());
        };
        if !self.namespaces {
            ignore_gone(sys::kill_process_group(self.pid, libc::SIGKILL))
                .map_err(|source| SandboxError::Signal { source })?;
        }
        // Killing the init kills its whole PID namespace.
        ignore_gone(sys::pidfd_send_signal(pidfd, libc::SIGKILL))
            .map_err(|source| SandboxError::Signal { source })
    }

    /// A handle that signals or kills this command's tree while another task waits for it
    /// (e.g. a timeout racing [`SandboxedChild::wait`]). It acts on the process Cordon
    /// created through its own pidfd, so it never reaches an unrelated process.
    ///
    /// # Errors
    /// [`SandboxError::Signal`] when the pidfd cannot be duplicated.
    pub fn signaller(&self) -> Result<TreeSignaller, SandboxError> {
        let pidfd = match self.pidfd.as_ref() {
            Some(pidfd) => Some(
                sys::dup_cloexec_at_least(pidfd, 3)
                    .map_err(|source| SandboxError::Signal { source })?,
            ),
            None => None,
        };
        Ok(TreeSignaller {
            pid: self.pid,
            pidfd,
            namespaces: self.namespaces,
            running: Arc::clone(&self.running),
        })
    }

    /// The command has ended: from now on signallers leave the init alone (it may serve
    /// another command). Without namespaces signallers may still reach the process group.
    fn mark_ended(&self) {
        if self.namespaces {
            *lock(&self.running) = false;
        }
    }

    fn kill_and_reap(&mut self) {
        let _ = self.kill_tree();
        // Ignore any report: the caller turns the setup failure into the error.
        self.control = None;
        let reaped = self
            .pidfd
            .as_ref()
            .and_then(|pidfd| sys::waitid_pidfd(pidfd, true).ok().flatten());
        if let Some(reaped) = reaped {
            self.finish_reaped(reaped);
        }
    }
}

/// Signals a sandboxed command's tree independently of its [`SandboxedChild`]; see
/// [`SandboxedChild::signaller`]. Once the command has ended, signalling is a no-op.
#[derive(Debug)]
pub struct TreeSignaller {
    pid: i32,
    pidfd: Option<OwnedFd>,
    namespaces: bool,
    /// Whether the command still runs; held while a signal is sent, so a signal never
    /// lands on an init that has gone back to serve another command.
    running: Arc<std::sync::Mutex<bool>>,
}

impl TreeSignaller {
    /// As [`SandboxedChild::signal_tree`].
    ///
    /// # Errors
    /// As [`SandboxedChild::signal_tree`].
    pub fn signal_tree(&self, signal: i32) -> Result<(), SandboxError> {
        if signal == libc::SIGKILL {
            return self.kill_tree();
        }
        if !child::FORWARDED_SIGNALS.contains(&signal) {
            return Err(SandboxError::UnsupportedSignal { signal });
        }
        let Some(pidfd) = self.pidfd.as_ref() else {
            return Ok(());
        };
        let running = lock(&self.running);
        if !*running {
            return Ok(());
        }
        let result = if self.namespaces {
            sys::pidfd_send_signal(pidfd, signal)
        } else if process_alive(pidfd) {
            sys::kill_process_group(self.pid, signal)
        } else {
            Ok(())
        };
        ignore_gone(result).map_err(|source| SandboxError::Signal { source })
    }

    /// As [`SandboxedChild::kill_tree`].
    ///
    /// # Errors
    /// As [`SandboxedChild::kill_tree`].
    pub fn kill_tree(&self) -> Result<(), SandboxError> {
        let Some(pidfd) = self.pidfd.as_ref() else {
            return Ok(());
        };
        let running = lock(&self.running);
        if !*running {
            return Ok(());
        }
        if !self.namespaces && process_alive(pidfd) {
            ignore_gone(sys::kill_process_group(self.pid, libc::SIGKILL))
                .map_err(|source| SandboxError::Signal { source })?;
        }
        ignore_gone(sys::pidfd_send_signal(pidfd, libc::SIGKILL))
            .map_err(|source| SandboxError::Signal { source })
    }
}

/// Whether the process behind `pidfd` has not been reaped yet (its pid, and so its process
/// group id, cannot have been reused).
fn process_alive(pidfd: &OwnedFd) -> bool {
    // Signal 0 checks existence; a zombie still counts, which is what keeps the pid taken.
    sys::pidfd_send_signal(pidfd, 0).is_ok()
}

fn ignore_gone(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        other => other,
    }
}

/// The command's status as written by the init: `Ok(None)` when nothing (complete) is there
/// yet or the init closed the socket without a report.
fn read_status(control: &OwnedFd, block: bool) -> io::Result<Option<ExitStatus>> {
    let mut record = [0u8; 8];
    let read = sys::recv_peek_or_read(control, &mut record, block)?;
    if read != record.len() {
        return Ok(None);
    }
    let mut tag = [0u8; 4];
    let mut value = [0u8; 4];
    tag.copy_from_slice(&record[..4]);
    value.copy_from_slice(&record[4..]);
    let value = i32::from_ne_bytes(value);
    Ok(match u32::from_ne_bytes(tag) {
        child::STATUS_EXITED => Some(ExitStatus::Code(value)),
        child::STATUS_SIGNALED => Some(ExitStatus::Signal(value)),
        _ => None,
    })
}

/// Whether the init's end of the control socket is closed (EOF, nothing to read).
fn control_closed(control: &OwnedFd) -> bool {
    sys::peer_closed(control)
}

/// Reap an init that is still tearing its namespaces down, on one shared background thread.
pub(crate) fn reap_later(pidfd: OwnedFd) {
    static REAPER: BackgroundQueue<OwnedFd> = std::sync::OnceLock::new();
    let unsent = match background_queue(&REAPER, "cordon-sandbox-reaper", reap_loop) {
        Some(sender) => sender.send(pidfd).err().map(|failed| failed.0),
        None => Some(pidfd),
    };
    // No thread: reap here.
    if let Some(pidfd) = unsent {
        let _ = sys::waitid_pidfd(&pidfd, true);
    }
}

/// The reaping thread: wait for each process handed over.
fn reap_loop(receiver: &mpsc::Receiver<OwnedFd>) {
    for pidfd in receiver {
        let _ = sys::waitid_pidfd(&pidfd, true);
    }
}

impl Drop for SandboxedChild {
    fn drop(&mut self) {
        if self.status.is_some() || self.pidfd.is_none() {
            return;
        }
        let _ = self.kill_tree();
        self.control = None;
        let placeholders = std::mem::take(&mut self.placeholders);
        if let Some(pidfd) = self.pidfd.take() {
            match sys::waitid_pidfd(&pidfd, false) {
                Ok(Some(_)) | Err(_) => {}
                Ok(None) => reap_later(pidfd),
            }
        }
        // The tree is being killed; a placeholder still locked by the dying init is kept and
        // reused (or removed) by the next spawn.
        release_placeholders(placeholders);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_can_be_shared_across_tasks() {
        assert_send_sync::<PreparedSandbox>();
        assert_send_sync::<SandboxedChild>();
    }

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
