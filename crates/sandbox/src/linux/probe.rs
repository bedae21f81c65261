//! Probing what the running kernel offers ([`probe`]): Landlock ABI, seccomp, user, PID and
//! mount namespaces (by actually creating them in a throwaway child), per-namespace
//! `pid_max`. The result is cached for the life of the process.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::config::HostSupport;
use crate::linux::sys;

/// What this host supports; probed once, then cached.
pub fn probe() -> HostSupport {
    static CACHE: OnceLock<HostSupport> = OnceLock::new();
    *CACHE.get_or_init(probe_uncached)
}

fn probe_uncached() -> HostSupport {
    let root = sys::geteuid() == 0;
    let user_namespaces = try_namespaces_with(libc::CLONE_NEWUSER, Check::Nothing);
    let ns_flags = if root {
        libc::CLONE_NEWPID | libc::CLONE_NEWNS
    } else {
        libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS
    };
    let pid_and_mount = try_namespaces_with(ns_flags, Check::MountApi);
    let network_namespaces = if root {
        try_namespaces_with(libc::CLONE_NEWNET, Check::Loopback)
    } else {
        try_namespaces_with(libc::CLONE_NEWUSER | libc::CLONE_NEWNET, Check::Loopback)
    };
    HostSupport {
        landlock_abi: sys::landlock_abi(),
        seccomp: sys::seccomp_filter_available(),
        user_namespaces,
        pid_namespaces: pid_and_mount,
        mount_namespaces: pid_and_mount,
        pid_max_per_namespace: kernel_at_least(&sys::kernel_release(), (6, 14)),
        root,
        network_namespaces,
    }
}

/// What a probe child checks in its new namespaces.
#[derive(Clone, Copy)]
enum Check {
    /// Only that they could be created.
    Nothing,
    /// The fd-based mount API (open_tree + move_mount) works there.
    MountApi,
    /// The new network namespace's loopback can be brought up.
    Loopback,
}

/// Create a child in new namespaces (`flags`) that runs `check` there. True when it all
/// worked.
///
/// The child is `vfork`-style (shared memory, own stack, this thread suspended meanwhile):
/// a fork would copy the page tables of this (large, multi-threaded) process. It stores its
/// result in this process's memory before exiting; this thread resumes as soon as the child
/// has let go of that memory, before the kernel has torn its namespaces down (which can take
/// milliseconds), and the child is reaped in the background.
fn try_namespaces_with(flags: c_int, check: Check) -> bool {
    let stack = sys::ChildStack::new();
    let probe = Probe {
        check,
        result: AtomicI32::new(NOT_REPORTED),
    };
    let mut raw_pidfd: c_int = -1;
    let saved = sys::block_all_signals();
    // SAFETY: probe_entry only calls async-signal-safe wrappers, stores into `probe` (alive
    // until this call returns, which is after the child has exited) and ends in `_exit`; the
    // stack is used by this child only; signals are blocked.
    let started = unsafe {
        sys::vfork_child(
            &stack,
            probe_entry,
            &probe as *const Probe as *mut c_void,
            Some(&mut raw_pidfd),
            flags,
        )
    };
    sys::restore_signals(&saved);
    if let Ok(pidfd) = sys::owned_pidfd(raw_pidfd) {
        super::background::reap_later(pidfd);
    }
    started.is_ok() && probe.result.load(Ordering::SeqCst) == 0
}

/// What a probe child is asked, and where it answers (its exit code, 0 for success).
struct Probe {
    check: Check,
    result: AtomicI32,
}

/// `Probe::result` until the child has answered.
const NOT_REPORTED: i32 = -1;

/// The probe child: it exists in the new namespaces; check the mount API when asked, answer.
extern "C" fn probe_entry(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Probe`, alive until the child has exited (the parent is
    // suspended meanwhile).
    let probe = unsafe { &*(arg as *const Probe) };
    let code = match probe.check {
        Check::Nothing => 0,
        Check::MountApi => check_mount_api(),
        Check::Loopback => match sys::loopback_up() {
            Ok(()) => 0,
            Err(_) => 4,
        },
    };
    probe.result.store(code, Ordering::SeqCst);
    sys::exit_now(0)
}

/// In the probe child: make mounts private, then bind `/` onto itself read-only the way
/// the sandbox protects paths. Returns the exit code.
fn check_mount_api() -> i32 {
    if sys::make_mounts_private().is_err() {
        return 1;
    }
    let Ok(fd) = sys::openat2_raw(libc::AT_FDCWD, c"/", libc::O_PATH) else {
        return 2;
    };
    match sys::bind_fd_onto_fd(fd, fd, sys::BindMode::ReadOnly) {
        Ok(()) => 0,
        Err(_) => 3,
    }
}

/// Whether a release string such as `6.18.44-fc` is at least `(major, minor)`.
pub(crate) fn kernel_at_least(release: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_compare_numerically() {
        assert!(kernel_at_least("6.18.44-fc-v595", (6, 14)));
        assert!(kernel_at_least("6.14.0", (6, 14)));
        assert!(!kernel_at_least("6.9.12", (6, 14)));
        assert!(!kernel_at_least("5.15.0-91-generic", (6, 14)));
        assert!(kernel_at_least("7.0", (6, 14)));
        assert!(!kernel_at_least("", (6, 14)));
    }
}
