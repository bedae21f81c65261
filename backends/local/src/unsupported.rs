//! The local backend on systems other than Linux: it cannot be created (its confinement needs
//! `openat2`, Landlock and seccomp), so [`LocalBackend::new`] returns
//! [`LocalError::Unsupported`] and the type is uninhabited.

use std::convert::Infallible;
use std::sync::Arc;

use async_trait::async_trait;
use cordon_ops::{Backend, BackendId, BashOperations, FileOperations, SearchOperations};

use crate::{LocalConfig, LocalError};

/// Cordon's local backend (unavailable on this system).
#[derive(Debug)]
pub struct LocalBackend {
    never: Infallible,
}

impl LocalBackend {
    /// Always fails with [`LocalError::Unsupported`].
    pub fn new(_config: LocalConfig) -> Result<Self, LocalError> {
        Err(LocalError::Unsupported)
    }

    /// Always fails with [`LocalError::Unsupported`].
    pub fn with_host_support(
        _config: LocalConfig,
        _support: cordon_sandbox::HostSupport,
    ) -> Result<Self, LocalError> {
        Err(LocalError::Unsupported)
    }
}

#[async_trait]
impl Backend for LocalBackend {
    fn id(&self) -> &BackendId {
        match self.never {}
    }

    fn files(&self) -> Arc<dyn FileOperations> {
        match self.never {}
    }

    fn bash(&self) -> Arc<dyn BashOperations> {
        match self.never {}
    }

    fn search(&self) -> Arc<dyn SearchOperations> {
        match self.never {}
    }

    fn missing_layers(&self) -> Vec<String> {
        match self.never {}
    }

    async fn shutdown(&self) -> Result<(), cordon_ops::ShutdownError> {
        match self.never {}
    }
}

/// Nothing is ever queued outside Linux.
pub fn wait_for_writeback() {}
