//! `cordon-helper`: serves the helper protocol on stdin/stdout (docs/helper.md).
//!
//! - `cordon-helper serve`: one session over stdin/stdout; exits when stdin ends, after
//!   killing every command it started;
//! - `cordon-helper probe`: the sandbox layers this kernel provides, as one JSON line;
//! - `cordon-helper forward PORT SOCKET`: relays `127.0.0.1:PORT` to a Unix socket (an egress
//!   proxy outside a container without a network);
//! - `cordon-helper --version`: the package and protocol versions.
//!
//! Logs go to stderr, filtered by `CORDON_LOG` (default `warn`).

use std::process::ExitCode;

#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cordon_helper::program::run(std::env::args().skip(1).collect())
}
