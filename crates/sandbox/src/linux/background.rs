//! The two background threads, each started on first use: one retires idle inits that
//! hold placeholders once they have lingered for [`PLACEHOLDER_LINGER`], one reaps inits that
//! are still tearing their namespaces down. Without a thread, the work is done in place or
//! not at all (an init holding placeholders is then not kept).

use std::os::fd::OwnedFd;
use std::sync::{Arc, mpsc};
use std::time::Instant;

use super::pool::{PLACEHOLDER_LINGER, retire_lingering};
use super::{Inner, sys};

/// Ask the retiring thread to look at `inner`'s idle inits once [`PLACEHOLDER_LINGER`] has
/// passed. `false` when that thread cannot be started.
pub(super) fn retire_later(inner: &Arc<Inner>) -> bool {
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
        pending.retain_mut(|(due, inner)| {
            if *due > now {
                return true;
            }
            // A sandbox stays on the list while an idle init of it holds placeholders.
            match inner.upgrade().and_then(|inner| retire_lingering(&inner)) {
                Some(next) => {
                    *due = next;
                    true
                }
                None => false,
            }
        });
    }
}

/// Reap an init that is still tearing its namespaces down, on one shared background thread.
pub(super) fn reap_later(pidfd: OwnedFd) {
    static REAPER: BackgroundQueue<OwnedFd> = std::sync::OnceLock::new();
    let unsent = match background_queue(&REAPER, "cordon-sandbox-reaper", reap_loop) {
        Some(sender) => sender.send(pidfd).err().map(|failed| failed.0),
        None => Some(pidfd),
    };
    // No thread: reap here.
    if let Some(pidfd) = unsent {
        // ECHILD means reaped already; nothing else can fail for a pidfd we own.
        let _ = sys::waitid_pidfd(&pidfd, true);
    }
}

/// The reaping thread: wait for each process handed over.
fn reap_loop(receiver: &mpsc::Receiver<OwnedFd>) {
    for pidfd in receiver {
        // ECHILD means reaped already; nothing else can fail for a pidfd we own.
        let _ = sys::waitid_pidfd(&pidfd, true);
    }
}
