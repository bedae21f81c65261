//! Probing what the running kernel offers ([`probe`]): Landlock ABI, seccomp, user, PID and
//! mount namespaces (by actually creating them in a throwaway child), per-namespace
//! `pid_max`. The result is cached for the life of the process.

use std::sync::OnceLock;

use crate::config::HostSupport;
use crate::linux::sys;

/// What this host supports; probed once, then cached.
pub fn probe() -> HostSupport {
    static CACHE: OnceLock<HostSupport> = OnceLock::new();
    *CACHE.get_or_init(probe_uncached)
}

fn probe_uncached() -> HostSupport {
    let root = sys::geteuid() == 0;
    let user_namespaces = try_namespaces(libc::CLONE_NEWUSER as u64, false);
    let ns_flags = if root {
        (libc::CLONE_NEWPID | libc::CLONE_NEWNS) as u64
    } else {
        (libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS) as u64
    };
    let pid_and_mount = try_namespaces(ns_flags, true);
    HostSupport {
        landlock_abi: sys::landlock_abi(),
        seccomp: sys::seccomp_filter_available(),
        user_namespaces,
        pid_namespaces: pid_and_mount,
        mount_namespaces: pid_and_mount,
        pid_max_per_namespace: kernel_at_least(&sys::kernel_release(), (6, 14)),
        root,
    }
}

/// Create a child in new namespaces; with `mount_api`, the child also checks that the
/// fd-based mount API (open_tree + move_mount) works there. True when the child exits 0.
fn try_namespaces(flags: u64, mount_api: bool) -> bool {
    let saved = sys::block_all_signals();
    // SAFETY: the child branch below only calls async-signal-safe wrappers and `_exit`.
    let cloned = unsafe { sys::clone_process(flags) };
    match cloned {
        Ok(sys::Cloned::Child) => {
            let code = if mount_api { check_mount_api() } else { 0 };
            sys::exit_now(code)
        }
        Ok(sys::Cloned::Parent { pidfd, .. }) => {
            sys::restore_signals(&saved);
            matches!(
                sys::waitid_pidfd(&pidfd, true),
                Ok(Some(sys::Reaped::Exited(0)))
            )
        }
        Err(_) => {
            sys::restore_signals(&saved);
            false
        }
    }
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
