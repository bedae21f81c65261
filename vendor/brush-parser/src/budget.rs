//! A step budget for this crate's parsers (a local patch; not part of upstream brush-parser).
//!
//! The PEG grammars backtrack: on unclosed constructs (`((((…`, `{a,{a,…`, `$(echo $(echo …`)
//! the work grows exponentially with their number. Each grammar step (a token looked at by the
//! program grammar; a word, brace or here-document piece tried by the word grammars) takes one
//! step from the budget in force on the current thread. Once it is spent every step fails, so
//! the parse ends quickly with an error, and [`exhausted`] tells the caller why. Without a
//! budget in force the parsers behave exactly as upstream.

use std::cell::Cell;

thread_local! {
    static REMAINING: Cell<u64> = const { Cell::new(u64::MAX) };
    static EXHAUSTED: Cell<bool> = const { Cell::new(false) };
}

/// A budget in force on this thread until it is dropped; the one in force before is then
/// restored.
#[derive(Debug)]
pub struct Budget {
    previous: u64,
    previously_exhausted: bool,
}

impl Budget {
    /// Put a budget of `steps` in force on this thread.
    pub fn start(steps: u64) -> Self {
        let previous = REMAINING.with(|remaining| remaining.replace(steps));
        let previously_exhausted = EXHAUSTED.with(|exhausted| exhausted.replace(false));
        Self {
            previous,
            previously_exhausted,
        }
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        REMAINING.with(|remaining| remaining.set(self.previous));
        EXHAUSTED.with(|exhausted| exhausted.set(self.previously_exhausted));
    }
}

/// Take `steps` from the budget in force. Returns `false`, and marks the budget exhausted, if
/// it does not hold that many.
pub fn charge(steps: u64) -> bool {
    REMAINING.with(|remaining| {
        let left = remaining.get();
        if left >= steps {
            remaining.set(left - steps);
            true
        } else {
            remaining.set(0);
            EXHAUSTED.with(|exhausted| exhausted.set(true));
            false
        }
    })
}

/// Steps left in the budget in force.
pub fn remaining() -> u64 {
    REMAINING.with(Cell::get)
}

/// Whether the budget in force ran out.
pub fn exhausted() -> bool {
    EXHAUSTED.with(Cell::get)
}
