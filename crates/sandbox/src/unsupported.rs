//! Stub for non-Linux targets: the types exist so the workspace builds, and every entry
//! point fails with [`SandboxError::Unsupported`].

use std::ffi::OsString;
use std::path::Path;

use crate::config::{ExitStatus, HostDefaults, HostSupport, Layer, SandboxConfig, SpawnRequest};
use crate::error::SandboxError;

/// Nothing is supported here.
pub fn probe() -> HostSupport {
    HostSupport {
        landlock_abi: 0,
        seccomp: false,
        user_namespaces: false,
        pid_namespaces: false,
        mount_namespaces: false,
        pid_max_per_namespace: false,
        root: false,
    }
}

/// No host defaults outside Linux.
pub fn host_defaults() -> HostDefaults {
    HostDefaults::default()
}

/// No host defaults outside Linux.
pub fn host_defaults_for_home(_home: &Path) -> HostDefaults {
    HostDefaults::default()
}

/// No sandbox creates placeholders outside Linux.
pub fn is_placeholder_dir(_path: &Path) -> bool {
    false
}

/// No sandbox creates placeholders outside Linux.
pub fn is_placeholder_mode(_mode: u32) -> bool {
    false
}

/// Nothing to do outside Linux: the local backend never swaps files in there.
pub fn start_writeback(_file: &std::fs::File) -> std::io::Result<()> {
    Ok(())
}

/// Limits are left as they are elsewhere.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

/// `renameat2(2)` is Linux's: unsupported elsewhere.
pub fn rename_at(
    _old_dir: std::os::fd::BorrowedFd<'_>,
    _old: &std::ffi::OsStr,
    _new_dir: std::os::fd::BorrowedFd<'_>,
    _new: &std::ffi::OsStr,
    _mode: crate::RenameMode,
) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Never constructed outside Linux.
#[derive(Debug)]
pub struct PreparedSandbox {
    _private: (),
}

impl PreparedSandbox {
    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn prepare(_config: SandboxConfig) -> Result<PreparedSandbox, SandboxError> {
        Err(SandboxError::Unsupported)
    }

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn prepare_with_support(
        _config: SandboxConfig,
        _support: HostSupport,
    ) -> Result<PreparedSandbox, SandboxError> {
        Err(SandboxError::Unsupported)
    }

    /// Every layer.
    pub fn missing_layers(&self) -> &[Layer] {
        &Layer::ALL
    }

    /// Unreachable: no instance exists.
    pub fn tmp_dir(&self) -> &Path {
        Path::new("/")
    }

    /// Unreachable: no instance exists.
    pub fn home_dir(&self) -> &Path {
        Path::new("/")
    }

    /// Unreachable: no instance exists.
    pub fn base_env(&self) -> &[(OsString, OsString)] {
        &[]
    }

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn set_protected_and_denied(
        &self,
        _protected: &[std::path::PathBuf],
        _denied: &[std::path::PathBuf],
    ) -> Result<bool, SandboxError> {
        Err(SandboxError::Unsupported)
    }

    /// Never: no instance exists.
    pub fn has_idle_init(&self) -> bool {
        false
    }

    /// Nothing to retire: no instance exists.
    pub fn retire_idle(&self) {}

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn spawn(&self, _request: SpawnRequest) -> Result<SandboxedChild, SandboxError> {
        Err(SandboxError::Unsupported)
    }
}

/// Never constructed outside Linux.
#[derive(Debug)]
pub struct SandboxedChild {
    _private: (),
}

impl SandboxedChild {
    /// Unreachable: no instance exists.
    pub fn pid(&self) -> u32 {
        0
    }

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn wait_blocking(&mut self) -> Result<ExitStatus, SandboxError> {
        Err(SandboxError::Unsupported)
    }

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, SandboxError> {
        Err(SandboxError::Unsupported)
    }

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub async fn wait(&mut self) -> Result<ExitStatus, SandboxError> {
        Err(SandboxError::Unsupported)
    }

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn signal_tree(&self, _signal: i32) -> Result<(), SandboxError> {
        Err(SandboxError::Unsupported)
    }

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn kill_tree(&self) -> Result<(), SandboxError> {
        Err(SandboxError::Unsupported)
    }
}

impl SandboxedChild {
    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn egress_listener(&self) -> Result<Option<std::net::TcpListener>, SandboxError> {
        Err(SandboxError::Unsupported)
    }

    /// Unreachable: no instance exists.
    pub fn unaccepted_connections(&self) -> usize {
        0
    }

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn signaller(&self) -> Result<TreeSignaller, SandboxError> {
        Err(SandboxError::Unsupported)
    }
}

/// Never constructed outside Linux.
#[derive(Debug)]
pub struct TreeSignaller {
    _private: (),
}

impl TreeSignaller {
    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn signal_tree(&self, _signal: i32) -> Result<(), SandboxError> {
        Err(SandboxError::Unsupported)
    }

    /// Always fails with [`SandboxError::Unsupported`].
    ///
    /// # Errors
    /// Always.
    pub fn kill_tree(&self) -> Result<(), SandboxError> {
        Err(SandboxError::Unsupported)
    }
}
