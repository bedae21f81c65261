//! The pool of idle inits: an init whose command has ended goes back to its sandbox's idle
//! list ([`Reuse::give_back`]) and serves the next command while its mounts are still current
//! and it is young enough ([`INIT_MAX_AGE`], [`INIT_MAX_COMMANDS`], [`PLACEHOLDER_LINGER`]).
//! Starting an init is `spawn`'s; the thread that retires lingering ones is `background`'s.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::background::{reap_later, retire_later};
use super::mounts::{self, MountConfig};
use super::{Inner, PreparedSandbox, lock, release_placeholders, sys};

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
pub(super) struct InitProcess {
    pub(super) pid: i32,
    pub(super) pidfd: Option<OwnedFd>,
    pub(super) control: Option<OwnedFd>,
    /// Placeholders its mounts depend on, locked shared; removed (by the last user) when the
    /// init is retired. An idle init holding any is retired after [`PLACEHOLDER_LINGER`].
    pub(super) placeholders: Vec<mounts::Placeholder>,
    /// The identity of everything it protected or masked.
    pub(super) identities: Vec<(PathBuf, mounts::Identity)>,
    /// The configuration its mounts were planned from.
    pub(super) config: Arc<MountConfig>,
    pub(super) born: Instant,
    pub(super) commands: u32,
    /// When its last command ended.
    pub(super) idle_since: Instant,
    /// With the network filtered: the listener of its network namespace's egress port
    /// (non-blocking). It stays with the init, which serves one command at a time, so each
    /// command's connections arrive on its own init's listener.
    pub(super) egress: Option<OwnedFd>,
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

    pub(super) fn kill_and_reap(&mut self) {
        if let Some(pidfd) = self.pidfd.take() {
            // The process may have exited already (ESRCH); the reap below waits either way.
            let _ = sys::pidfd_send_signal(&pidfd, libc::SIGKILL);
            self.control = None;
            // Nothing to report: the process is gone once this returns or fails (ECHILD).
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

impl PreparedSandbox {
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

    /// An idle init that can serve a command under `config`; stale ones are retired.
    pub(super) fn take_idle(&self, config: &Arc<MountConfig>) -> Option<InitProcess> {
        let mut idle = lock(&self.inner.idle);
        while let Some(init) = idle.pop() {
            if init.fits(config) {
                return Some(init);
            }
        }
        None
    }
}

/// An init that may serve another command, with what it was set up with.
#[derive(Debug)]
pub(super) struct Reuse {
    pub(super) inner: Arc<Inner>,
    pub(super) identities: Vec<(PathBuf, mounts::Identity)>,
    pub(super) config: Arc<MountConfig>,
    pub(super) born: Instant,
    pub(super) commands: u32,
}

impl Reuse {
    /// Put the init back into the idle list when its configuration is still current and
    /// there is room; otherwise it ends (its control socket closes) and its placeholders are
    /// released.
    pub(super) fn give_back(
        self,
        pid: i32,
        pidfd: OwnedFd,
        control: OwnedFd,
        placeholders: Vec<mounts::Placeholder>,
        egress: Option<OwnedFd>,
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
            egress,
        };
        if !Arc::ptr_eq(&init.config, &current)
            || init.born.elapsed() >= INIT_MAX_AGE
            || init.commands >= INIT_MAX_COMMANDS
        {
            return;
        }
        // Without the thread that retires it, an init holding placeholders is not kept. The
        // thread is told only when it does not already have this sandbox on its list; it
        // looks again for as long as an idle init holds placeholders (see
        // `retire_lingering`), so back-to-back commands do not wake it each time. The flag
        // changes only under the `idle` lock, in step with the list it describes.
        let rejected = {
            let mut idle = lock(&inner.idle);
            if idle.len() >= MAX_IDLE_INITS {
                Some(init)
            } else if lingers
                && !inner.retire_pending.swap(true, Ordering::SeqCst)
                && !retire_later(&inner)
            {
                inner.retire_pending.store(false, Ordering::SeqCst);
                Some(init)
            } else {
                idle.push(init);
                None
            }
        };
        // Ending an init (and releasing its placeholders) happens outside the lock.
        drop(rejected);
    }
}

/// Retire the idle inits of `inner` that hold placeholders and have been idle for
/// [`PLACEHOLDER_LINGER`]; their placeholders are removed by the last user. Returns when to
/// look again: the moment the next idle init still holding placeholders will have lingered
/// long enough, or `None` (and the sandbox leaves the retiring thread's list) when none is
/// left.
pub(super) fn retire_lingering(inner: &Inner) -> Option<Instant> {
    let (retired, next): (Vec<InitProcess>, Option<Instant>) = {
        let mut idle = lock(&inner.idle);
        let (retired, kept): (Vec<InitProcess>, Vec<InitProcess>) =
            std::mem::take(&mut *idle).into_iter().partition(|init| {
                !init.placeholders.is_empty() && init.idle_since.elapsed() >= PLACEHOLDER_LINGER
            });
        *idle = kept;
        let next = idle
            .iter()
            .filter(|init| !init.placeholders.is_empty())
            .map(|init| init.idle_since + PLACEHOLDER_LINGER)
            .min();
        if next.is_none() {
            inner.retire_pending.store(false, Ordering::SeqCst);
        }
        (retired, next)
    };
    drop(retired);
    next
}
