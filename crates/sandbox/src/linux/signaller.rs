//! [`TreeSignaller`]: signals or kills a command's tree from another task while its
//! [`SandboxedChild`] waits, and never once the command has ended (the init may be serving
//! another command by then).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

#[cfg(doc)]
use super::handle::SandboxedChild;
use super::{child, lock, sys};
use crate::error::SandboxError;

/// Signals a sandboxed command's tree independently of its [`SandboxedChild`]; see
/// [`SandboxedChild::signaller`]. Once the command has ended, signalling is a no-op.
#[derive(Debug)]
pub struct TreeSignaller {
    pub(super) pid: i32,
    pub(super) pidfd: Option<OwnedFd>,
    pub(super) namespaces: bool,
    /// Whether the command still runs; held while a signal is sent, so a signal never
    /// lands on an init that has gone back to serve another command.
    pub(super) running: Arc<std::sync::Mutex<bool>>,
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

pub(super) fn ignore_gone(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        other => other,
    }
}
