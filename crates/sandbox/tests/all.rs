//! Integration tests of the local sandbox against the real kernel (run as root on Linux):
//! what commands can do (positive), what they cannot (the escape suite), process lifecycle,
//! resource limits, environment scrubbing and the fail-closed / degraded paths.
//! One test binary; the modules live in `tests/suite/`.

#![cfg(target_os = "linux")]

#[path = "suite/container.rs"]
mod container;
#[path = "suite/degraded.rs"]
mod degraded;
#[path = "suite/escapes.rs"]
mod escapes;
#[path = "suite/filtered.rs"]
mod filtered;
#[path = "suite/lifecycle.rs"]
mod lifecycle;
#[path = "suite/limits.rs"]
mod limits;
#[path = "suite/positive.rs"]
mod positive;
#[path = "suite/reuse.rs"]
mod reuse;
#[path = "suite/support.rs"]
mod support;
#[path = "suite/unix_sockets.rs"]
mod unix_sockets;
