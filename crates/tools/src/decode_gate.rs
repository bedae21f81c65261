//! The memory budget that every image decode of the process shares.
//!
//! A `read` of an image holds a [`DecodePermit`] for its decode's estimated peak memory
//! ([`crate::image::DecodeJob::cost_bytes`]) while the decode runs, so a batch of parallel
//! image reads holds at most [`DECODE_BUDGET_BYTES`] of decode memory at once instead of one
//! decoded image per read. Decodes that do not fit wait, in arrival order; a decode costing
//! more than the whole budget takes the whole budget, so every decode eventually runs.
//! Waiting is cancellable (drop the future); a permit is released when the decode that holds
//! it returns, even if its caller stopped waiting for it. This module owns the accounting
//! only; what a decode costs is decided in [`crate::image`].

use std::fmt;
use std::sync::{Arc, LazyLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, watch};

/// Decode memory all concurrent image decodes of the process share: room for one image at
/// the decode bounds (about 600 MiB with its resizing) or many smaller ones.
pub const DECODE_BUDGET_BYTES: u64 = 1 << 30;

/// The budget is counted in units of this many bytes (a semaphore permit each).
const UNIT_BYTES: u64 = 1 << 20;

/// A shared decode memory budget. Clones share the same budget.
#[derive(Clone)]
pub struct DecodeGate {
    inner: Arc<Inner>,
}

struct Inner {
    semaphore: Arc<Semaphore>,
    budget_units: u32,
    counts: watch::Sender<GateCounts>,
    #[cfg(test)]
    on_decode: std::sync::Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

impl fmt::Debug for DecodeGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecodeGate")
            .field("budget_bytes", &self.budget_bytes())
            .field("counts", &self.counts())
            .finish()
    }
}

/// What a gate holds now, and the most it has held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateCounts {
    /// Decodes holding a permit.
    pub running: usize,
    /// Decodes waiting for one.
    pub waiting: usize,
    /// Bytes the running decodes hold.
    pub running_bytes: u64,
    /// Most decodes that held a permit at once.
    pub peak_running: usize,
    /// Most bytes held at once.
    pub peak_running_bytes: u64,
}

impl DecodeGate {
    /// A gate sharing `budget_bytes` (rounded down to whole MiB, at least one).
    pub fn new(budget_bytes: u64) -> Self {
        let budget_units = u32::try_from(budget_bytes / UNIT_BYTES)
            .unwrap_or(u32::MAX)
            .max(1);
        DecodeGate {
            inner: Arc::new(Inner {
                semaphore: Arc::new(Semaphore::new(budget_units as usize)),
                budget_units,
                counts: watch::Sender::new(GateCounts::default()),
                #[cfg(test)]
                on_decode: std::sync::Mutex::new(None),
            }),
        }
    }

    /// The gate of the process, with [`DECODE_BUDGET_BYTES`].
    pub fn process() -> Self {
        static PROCESS: LazyLock<DecodeGate> =
            LazyLock::new(|| DecodeGate::new(DECODE_BUDGET_BYTES));
        PROCESS.clone()
    }

    /// The budget in bytes.
    pub fn budget_bytes(&self) -> u64 {
        u64::from(self.inner.budget_units) * UNIT_BYTES
    }

    /// What the gate holds now.
    pub fn counts(&self) -> GateCounts {
        *self.inner.counts.borrow()
    }

    /// Wait until `cost_bytes` of the budget (at most all of it) is free and take it.
    /// Cancel by dropping the future.
    pub async fn admit(&self, cost_bytes: u64) -> DecodePermit {
        let units = u32::try_from(cost_bytes.div_ceil(UNIT_BYTES))
            .unwrap_or(u32::MAX)
            .clamp(1, self.inner.budget_units);
        let semaphore = Arc::clone(&self.inner.semaphore);
        let permit = match Arc::clone(&semaphore).try_acquire_many_owned(units) {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                tracing::debug!(
                    cost_bytes,
                    budget_bytes = self.budget_bytes(),
                    running_bytes = self.counts().running_bytes,
                    "image decode waits for decode memory"
                );
                self.update(|counts| counts.waiting += 1);
                let _waiting = Waiting(self);
                semaphore
                    .acquire_many_owned(units)
                    .await
                    .expect("the decode semaphore is never closed")
            }
        };
        let bytes = u64::from(units) * UNIT_BYTES;
        self.update(|counts| {
            counts.running += 1;
            counts.running_bytes += bytes;
            counts.peak_running = counts.peak_running.max(counts.running);
            counts.peak_running_bytes = counts.peak_running_bytes.max(counts.running_bytes);
        });
        DecodePermit {
            _permit: permit,
            gate: self.clone(),
            bytes,
        }
    }

    fn update(&self, change: impl FnOnce(&mut GateCounts)) {
        self.inner.counts.send_modify(change);
    }

    /// Changes of the counts, for tests that wait for a state of the gate.
    #[cfg(test)]
    pub(crate) fn watch(&self) -> watch::Receiver<GateCounts> {
        self.inner.counts.subscribe()
    }

    /// Run `hook` on the decoding thread at the start of every decode under this gate.
    #[cfg(test)]
    pub(crate) fn on_decode(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.inner.on_decode.lock().unwrap() = Some(Arc::new(hook));
    }
}

/// Takes a decode out of the waiting count however its wait ends (admitted or cancelled).
struct Waiting<'a>(&'a DecodeGate);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.update(|counts| counts.waiting -= 1);
    }
}

/// A share of the decode budget, held while a decode runs.
#[must_use = "the budget share is released when the permit is dropped"]
pub struct DecodePermit {
    _permit: OwnedSemaphorePermit,
    gate: DecodeGate,
    bytes: u64,
}

impl fmt::Debug for DecodePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecodePermit")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl DecodePermit {
    /// Run `decode` holding the permit; the permit is released when it returns.
    pub fn run<T>(self, decode: impl FnOnce() -> T) -> T {
        #[cfg(test)]
        {
            let hook = self.gate.inner.on_decode.lock().unwrap().clone();
            if let Some(hook) = hook {
                hook();
            }
        }
        let result = decode();
        drop(self);
        result
    }
}

impl Drop for DecodePermit {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.gate.update(|counts| {
            counts.running -= 1;
            counts.running_bytes -= bytes;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use super::*;

    #[tokio::test]
    async fn decodes_wait_until_their_share_is_free() {
        let gate = DecodeGate::new(4 << 20);
        let first = gate.admit(3 << 20).await;
        let mut second = pin!(gate.admit((1 << 20) + 1));
        assert!(futures::poll!(second.as_mut()).is_pending());
        assert_eq!(gate.counts().waiting, 1);
        drop(first);
        let second = second.await;
        let counts = gate.counts();
        assert_eq!((counts.running, counts.waiting), (1, 0));
        assert_eq!(counts.running_bytes, 2 << 20, "rounded up to whole MiB");
        assert_eq!(counts.peak_running_bytes, 3 << 20);
        drop(second);
        assert_eq!(gate.counts().running_bytes, 0);
    }

    #[tokio::test]
    async fn a_decode_over_the_whole_budget_takes_all_of_it() {
        let gate = DecodeGate::new(4 << 20);
        let huge = gate.admit(100 << 20).await;
        assert_eq!(gate.counts().running_bytes, 4 << 20);
        let mut small = pin!(gate.admit(1));
        assert!(futures::poll!(small.as_mut()).is_pending());
        drop(huge);
        let small = small.await;
        assert_eq!(gate.counts().running_bytes, 1 << 20);
        assert_eq!(small.run(|| 7), 7);
        assert_eq!(gate.counts().running, 0);
    }

    #[tokio::test]
    async fn a_dropped_wait_leaves_no_trace() {
        let gate = DecodeGate::new(1 << 20);
        let held = gate.admit(1).await;
        {
            let mut waiting = pin!(gate.admit(1));
            assert!(futures::poll!(waiting.as_mut()).is_pending());
            assert_eq!(gate.counts().waiting, 1);
        }
        assert_eq!(gate.counts().waiting, 0);
        drop(held);
        drop(gate.admit(1).await);
        assert_eq!(
            gate.counts(),
            GateCounts {
                peak_running: 1,
                peak_running_bytes: 1 << 20,
                ..GateCounts::default()
            }
        );
    }

    #[test]
    fn the_budget_is_counted_in_whole_mib() {
        assert_eq!(DecodeGate::new(0).budget_bytes(), 1 << 20);
        assert_eq!(DecodeGate::new((3 << 20) + 5).budget_bytes(), 3 << 20);
        assert_eq!(DecodeGate::process().budget_bytes(), DECODE_BUDGET_BYTES);
    }
}
