//! The handle of a running command, [`SandboxedChild`]: waiting for it (the init's status
//! report on the control socket, or the pidfd without namespaces), signalling or killing its
//! tree, and what happens to the init afterwards (back to the pool, or reaped).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::background::reap_later;
use super::mounts;
use super::pool::{InitProcess, Reuse};
use super::prepare::SessionDir;
use super::signaller::{TreeSignaller, ignore_gone};
use super::warden::Warden;
use super::{PreparedSandbox, child, lock, release_placeholders, sys};
use crate::config::ExitStatus;

/// Longest wait for the killed processes a command left in its group to exit.
const GROUP_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
use crate::error::SandboxError;

/// A running sandboxed command. Dropping it kills the command's whole tree.
#[derive(Debug)]
pub struct SandboxedChild {
    pub(super) pid: i32,
    pub(super) pidfd: Option<OwnedFd>,
    pub(super) control: Option<OwnedFd>,
    /// With the network filtered: the init's egress listener (see
    /// [`SandboxedChild::egress_listener`]).
    pub(super) egress: Option<OwnedFd>,
    /// Connections still waiting on the egress listener when the command ended (closed).
    pub(super) unaccepted: usize,
    pub(super) namespaces: bool,
    /// Without namespaces: the command's process group is its whole tree (it cannot leave
    /// it), killed when the command exits, before it is reaped (so the group id is still
    /// its own).
    pub(super) group_is_tree: bool,
    pub(super) status: Option<ExitStatus>,
    pub(super) placeholders: Vec<mounts::Placeholder>,
    /// Where the init goes once the command has ended, when it may serve another one.
    pub(super) reuse: Option<Reuse>,
    /// Shared with signallers; see [`TreeSignaller`].
    pub(super) running: Arc<std::sync::Mutex<bool>>,
    /// The warden this command's group is listed with (the container profile), and whether
    /// it is still listed (until the group is gone or killed).
    pub(super) warden: Option<(Arc<Warden>, AtomicBool)>,
    pub(super) _session: Arc<SessionDir>,
}

impl SandboxedChild {
    /// A command running under `init`, which goes back to `sandbox`'s idle list afterwards
    /// (see [`Reuse::give_back`]).
    pub(super) fn under_init(mut init: InitProcess, sandbox: &PreparedSandbox) -> SandboxedChild {
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
            egress: init.egress.take(),
            unaccepted: 0,
            namespaces: true,
            group_is_tree: false,
            status: None,
            placeholders: std::mem::take(&mut init.placeholders),
            reuse,
            running: Arc::new(std::sync::Mutex::new(true)),
            warden: None,
            _session: Arc::clone(&sandbox.inner.session),
        }
    }

    /// With the network filtered ([`crate::NetworkAccess::Filtered`]): the listener on
    /// `127.0.0.1:`[`crate::EGRESS_PORT`] of this command's network namespace, the only
    /// destination its processes can connect to (a new handle to it, non-blocking). Serve it
    /// while the command runs and stop accepting as soon as [`SandboxedChild::wait`] has
    /// returned: the init may then serve another command on the same listener. Connections
    /// still waiting to be accepted when the command ends are closed before that. `None` with
    /// the network off or on.
    ///
    /// # Errors
    /// [`SandboxError::EgressListener`] when the listener cannot be duplicated.
    pub fn egress_listener(&self) -> Result<Option<std::net::TcpListener>, SandboxError> {
        let Some(listener) = self.egress.as_ref() else {
            return Ok(None);
        };
        let listener = sys::dup_cloexec_at_least(listener, 3)
            .map_err(|source| SandboxError::EgressListener { source })?;
        Ok(Some(std::net::TcpListener::from(listener)))
    }

    /// With the network filtered, once the command has ended: how many of its connections were
    /// still waiting on the egress listener (never accepted, so never decided or relayed) and
    /// were closed with it. 0 before the end and in the other network modes.
    pub fn unaccepted_connections(&self) -> usize {
        self.unaccepted
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
                if self.group_is_tree && self.control.is_none() {
                    sys::pidfd_exited(pidfd, true)
                        .map_err(|source| SandboxError::Wait { source })?;
                    self.kill_group_of_exited();
                }
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
        if self.group_is_tree && self.control.is_none() {
            if !sys::pidfd_exited(pidfd, false).map_err(|source| SandboxError::Wait { source })? {
                return Ok(None);
            }
            self.kill_group_of_exited();
        }
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

    /// The command (the group leader) exited and is not reaped yet, so its pid is still the
    /// group's id: kill what is left of the group (what it left in the background).
    /// Returns once they have exited, so that nothing of the command still holds a file (a
    /// FIFO, a lock) or is in a system call when its result is reported.
    fn kill_group_of_exited(&self) {
        // ESRCH: the group had no one left. Nothing else can fail for our own child's group.
        if sys::kill_process_group(self.pid, libc::SIGKILL).is_err() {
            self.leave_warden();
            return;
        }
        match sys::wait_group_exited(self.pid, GROUP_EXIT_WAIT) {
            Ok(true) => self.leave_warden(),
            Ok(false) => tracing::warn!(
                pgid = self.pid,
                "sandbox: processes the command left were killed but had not exited within {GROUP_EXIT_WAIT:?} (uninterruptible sleep?)"
            ),
            Err(error) => tracing::warn!(
                pgid = self.pid,
                %error,
                "sandbox: could not wait for the processes the command left to exit (they were killed)"
            ),
        }
    }

    /// The init reported the command's status after killing and reaping everything else; it
    /// may still be tearing its namespaces down, so it is reaped in the background.
    fn finish_reported(&mut self, status: ExitStatus) -> ExitStatus {
        self.status = Some(status);
        self.mark_ended();
        let control = self.control.take();
        let pidfd = self.pidfd.take();
        let egress = self.egress.take();
        // Every process of the command is gone: what still waits on the listener came from
        // it and must not reach the next command's proxy.
        if let Some(listener) = egress.as_ref() {
            self.unaccepted = sys::close_pending_connections(listener);
        }
        match (self.reuse.take(), control, pidfd) {
            (Some(reuse), Some(control), Some(pidfd)) => {
                let placeholders = std::mem::take(&mut self.placeholders);
                reuse.give_back(self.pid, pidfd, control, placeholders, egress);
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

    /// The command's group is gone or killed: the warden stops listing it (while the leader
    /// is not reaped, its group id cannot be another group's yet).
    fn leave_warden(&self) {
        if let Some((warden, listed)) = self.warden.as_ref()
            && listed.swap(false, Ordering::SeqCst)
        {
            warden.unregister(self.pid);
        }
    }

    /// The process Cordon created has been reaped.
    fn finish_reaped(&mut self, reaped: sys::Reaped) -> ExitStatus {
        self.leave_warden();
        let status = match reaped {
            sys::Reaped::Exited(code) => ExitStatus::Code(code),
            sys::Reaped::Signaled(signal) => ExitStatus::Signal(signal),
        };
        self.status = Some(status);
        self.mark_ended();
        self.pidfd = None;
        self.control = None;
        self.egress = None;
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

    pub(super) fn kill_and_reap(&mut self) {
        // A tree that is already gone is the goal.
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

impl Drop for SandboxedChild {
    fn drop(&mut self) {
        if self.status.is_some() || self.pidfd.is_none() {
            return;
        }
        // A tree that is already gone is the goal.
        let _ = self.kill_tree();
        // Killed: the warden need not (and, once the leader is reaped, must not) kill it.
        self.leave_warden();
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
