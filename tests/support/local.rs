//! The local backend's [`Harness`]: the workspace directory itself, under the full local
//! sandbox (never degraded: a missing layer fails the tests).

use async_trait::async_trait;
use cordon_runtime::SessionOptions;

use crate::harness::{Harness, SessionRequest};

/// The local backend's factory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Local;

#[async_trait]
impl Harness for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn session_options(&self, request: SessionRequest) -> Result<SessionOptions, String> {
        let SessionRequest {
            host_root,
            policy,
            audit,
        } = request;
        Ok(SessionOptions {
            policy,
            audit,
            ..SessionOptions::local(host_root)
        })
    }
}
