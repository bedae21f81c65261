//! The helper backend's [`Harness`]: the local backend in a `cordon-helper serve` child process,
//! every operation through the helper protocol over its stdin/stdout (the code path of the
//! remote helper, on a local pipe). Commands run under the full local sandbox, never degraded.
//!
//! The program is `CORDON_HELPER` when set, else this package's own build of it
//! (`cordon-test-helper`), which cargo rebuilds with the suites: never a stale helper.

use std::path::PathBuf;

use async_trait::async_trait;
use cordon_runtime::{BackendChoice, HelperOptions, SessionOptions};

use crate::harness::{Harness, SessionRequest};

/// The helper-over-a-pipe backend's factory.
#[derive(Clone, Copy, Debug, Default)]
pub struct HelperPipe;

#[async_trait]
impl Harness for HelperPipe {
    fn name(&self) -> &'static str {
        "helper_pipe"
    }

    async fn session_options(&self, request: SessionRequest) -> Result<SessionOptions, String> {
        let SessionRequest {
            host_root,
            policy,
            audit,
        } = request;
        let program = helper_program()?;
        Ok(SessionOptions {
            backend: BackendChoice::Helper(HelperOptions {
                program: Some(program),
            }),
            policy,
            audit,
            ..SessionOptions::local(host_root)
        })
    }
}

/// The helper program: `CORDON_HELPER` when set, else this package's `cordon-test-helper`
/// (built by cargo with the test binaries, next to their `deps/` directory).
pub fn helper_program() -> Result<PathBuf, String> {
    if let Some(program) = std::env::var_os(cordon_helper::HELPER_ENV) {
        return Ok(PathBuf::from(program));
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("failed to find the test binary: {e}"))?;
    let program = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("cordon-test-helper"))
        .ok_or_else(|| format!("failed to find the target directory of {}", exe.display()))?;
    if !program.is_file() {
        return Err(format!(
            "failed to find {}: run the suite with `cargo test -p cordon-tests` (which builds it) or set CORDON_HELPER",
            program.display()
        ));
    }
    Ok(program)
}
