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
//! left in the namespace. Without namespaces (an explicitly degraded host, or the container
//! profile) the command is the direct child in its own session, restricts itself before
//! `execve`, and tree operations use its process group; in the container profile the command
//! cannot leave that group, and a `warden` process kills the running commands' groups should
//! this process die.
//!
//! Where each part lives: `prepare` (building the sandbox once, swapping protected and denied
//! paths), `spawn` (starting a command: init or direct child), `pool` (idle inits and when
//! they may serve again), `handle` ([`SandboxedChild`]: wait, signal, what happens to the
//! init afterwards), `signaller` ([`TreeSignaller`]), `background` (the retiring and reaping
//! threads), `warden` (the container profile's guard against this process dying under its
//! commands); `child` is the code that runs in the cloned processes and `sys` the syscall
//! surface.

mod background;
mod carve;
mod child;
mod defaults;
mod handle;
mod landlock;
mod mounts;
mod newroot;
mod pool;
mod prepare;
mod probe;
mod seccomp;
mod signaller;
mod spawn;
mod sys;
mod warden;

use std::ffi::{CString, OsStr, OsString, c_int};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use defaults::{host_defaults, host_defaults_for_home};
pub use handle::SandboxedChild;
pub use mounts::{is_placeholder_dir, is_placeholder_mode};
pub use probe::probe;
pub use signaller::TreeSignaller;

use crate::config::Layer;
#[cfg(doc)]
use crate::config::SandboxConfig;
use crate::error::SandboxError;
use mounts::MountConfig;
use pool::InitProcess;
use prepare::{LandlockState, SessionDir};

/// Start writing the file's dirty pages back to disk, without waiting (`sync_file_range`
/// with `SYNC_FILE_RANGE_WRITE`). The local backend calls it, off the caller's path, for a file
/// it has just swapped in with `RENAME_EXCHANGE`: ext4 starts that writeback itself on a
/// rename over an existing file (`auto_da_alloc`), and this keeps the same protection against a
/// zero-length file after a power loss.
pub fn start_writeback(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsFd;
    sys::start_writeback(file.as_fd())
}

/// Raise this process's soft limit on open files to its hard limit and return the new soft
/// limit. The egress proxy in the local backend holds about six descriptors per relayed
/// connection (both sockets, a pipe per direction): under the common soft limit of 1024 a
/// command with 150 tunnels would leave this process (audit log, spills, other commands)
/// without descriptors.
pub fn raise_open_files_limit() -> io::Result<u64> {
    let (soft, hard) = sys::open_files_limit()?;
    if soft < hard {
        sys::set_open_files_limit(hard, hard)?;
    }
    Ok(sys::open_files_limit()?.0)
}

/// Rename `old` in `old_dir` to `new` in `new_dir` (`renameat2(2)`), for the local backend's
/// atomic writes and quarantines. A raw system call, so the static (musl) build has it too.
pub fn rename_at(
    old_dir: std::os::fd::BorrowedFd<'_>,
    old: &std::ffi::OsStr,
    new_dir: std::os::fd::BorrowedFd<'_>,
    new: &std::ffi::OsStr,
    mode: crate::RenameMode,
) -> io::Result<()> {
    let flags = match mode {
        crate::RenameMode::NoReplace => libc::RENAME_NOREPLACE,
        crate::RenameMode::Exchange => libc::RENAME_EXCHANGE,
    };
    sys::renameat2(old_dir, old, new_dir, new, flags)
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
    /// Without namespaces in the container profile: commands cannot leave their process
    /// group (seccomp), so the group is the whole tree and is killed when the command ends.
    keep_group: bool,
    /// With `keep_group`: kills the running commands' groups should this process die.
    warden: Option<Arc<warden::Warden>>,
    /// Filtered: each init gets a private network namespace and an egress listener.
    network: crate::config::NetworkAccess,
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
    /// Whether the retiring thread already has this sandbox on its list (changed only while
    /// `idle` is locked): a command giving its init back then does not wake that thread.
    retire_pending: std::sync::atomic::AtomicBool,
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

fn c_string(value: &OsStr, what: &'static str) -> Result<CString, SandboxError> {
    CString::new(value.as_bytes()).map_err(|_| SandboxError::NulByte { what })
}

impl PreparedSandbox {
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

    fn mount_config(&self) -> Arc<MountConfig> {
        Arc::clone(
            &self
                .inner
                .mounts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn release_placeholders(placeholders: Vec<mounts::Placeholder>) {
    for placeholder in placeholders {
        placeholder.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        let (_, hard) = sys::open_files_limit().expect("getrlimit");
        // One below the hard limit: lower enough to see the raise, harmless to other tests.
        sys::set_open_files_limit(hard - 1, hard).expect("lower the soft limit");
        assert_eq!(raise_open_files_limit().expect("raise"), hard);
        assert_eq!(sys::open_files_limit().expect("getrlimit"), (hard, hard));
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn rename_at_refuses_to_replace_and_exchanges() {
        use std::ffi::OsStr;
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("a"), "A").expect("write");
        std::fs::write(dir.path().join("b"), "B").expect("write");
        let fd = std::fs::File::open(dir.path()).expect("open dir");
        let fd = fd.as_fd();
        let error = rename_at(
            fd,
            OsStr::new("a"),
            fd,
            OsStr::new("b"),
            crate::RenameMode::NoReplace,
        )
        .expect_err("b exists");
        assert_eq!(error.raw_os_error(), Some(libc::EEXIST));
        rename_at(
            fd,
            OsStr::new("a"),
            fd,
            OsStr::new("b"),
            crate::RenameMode::Exchange,
        )
        .expect("exchange");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a")).expect("a"),
            "B"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("b")).expect("b"),
            "A"
        );
        rename_at(
            fd,
            OsStr::new("a"),
            fd,
            OsStr::new("c"),
            crate::RenameMode::NoReplace,
        )
        .expect("c is free");
        assert!(!dir.path().join("a").exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("c")).expect("c"),
            "B"
        );
        let error = rename_at(
            fd,
            OsStr::new("a\0"),
            fd,
            OsStr::new("d"),
            crate::RenameMode::NoReplace,
        )
        .expect_err("a NUL in a name");
        assert_eq!(error.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn handles_can_be_shared_across_tasks() {
        assert_send_sync::<PreparedSandbox>();
        assert_send_sync::<SandboxedChild>();
    }
}
