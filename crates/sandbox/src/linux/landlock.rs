//! Landlock: which rights each kind of sandbox path gets (a reviewed table), which rights
//! the ruleset handles on a given ABI, and building the ruleset fd once in the parent.
//!
//! The ruleset is applied in the command child with `landlock_restrict_self`; this module
//! only builds it. Landlock cannot carve read-only holes out of a writable tree: protected
//! and denied paths are handled by the mount namespace (`mounts.rs`).

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::config::NetworkAccess;
use crate::error::SandboxError;
use crate::linux::sys;

// Filesystem rights (include/uapi/linux/landlock.h), with the ABI that introduced them.
/// Execute a file.
pub(crate) const EXECUTE: u64 = 1 << 0;
/// Open a file for writing.
pub(crate) const WRITE_FILE: u64 = 1 << 1;
/// Open a file for reading.
pub(crate) const READ_FILE: u64 = 1 << 2;
/// List a directory.
pub(crate) const READ_DIR: u64 = 1 << 3;
/// Remove a directory.
pub(crate) const REMOVE_DIR: u64 = 1 << 4;
/// Remove a file.
pub(crate) const REMOVE_FILE: u64 = 1 << 5;
/// Create a character device.
pub(crate) const MAKE_CHAR: u64 = 1 << 6;
/// Create a directory.
pub(crate) const MAKE_DIR: u64 = 1 << 7;
/// Create a regular file.
pub(crate) const MAKE_REG: u64 = 1 << 8;
/// Create a Unix socket.
pub(crate) const MAKE_SOCK: u64 = 1 << 9;
/// Create a FIFO.
pub(crate) const MAKE_FIFO: u64 = 1 << 10;
/// Create a block device.
pub(crate) const MAKE_BLOCK: u64 = 1 << 11;
/// Create a symlink.
pub(crate) const MAKE_SYM: u64 = 1 << 12;
/// Link or rename a file into another directory (ABI 2).
pub(crate) const REFER: u64 = 1 << 13;
/// Truncate a file (ABI 3).
pub(crate) const TRUNCATE: u64 = 1 << 14;
/// ioctl on device files (ABI 5).
pub(crate) const IOCTL_DEV: u64 = 1 << 15;

/// Rights that apply to regular files (the kernel rejects directory-only rights on a file).
const FILE_RIGHTS: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;

// Network rights (ABI 4).
/// Bind a TCP socket.
const NET_BIND_TCP: u64 = 1 << 0;
/// Connect a TCP socket.
const NET_CONNECT_TCP: u64 = 1 << 1;

// Scopes (ABI 6).
/// Connecting to abstract Unix sockets created outside the sandbox.
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
/// Signalling processes outside the sandbox.
const SCOPE_SIGNAL: u64 = 1 << 1;

/// What a sandbox path is for; each kind maps to one set of rights in [`ACCESS_TABLE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Access {
    /// System directories and toolchains.
    ReadExec,
    /// Data that may be read only.
    Read,
    /// The workspace, the session's TMPDIR and HOME.
    Write,
    /// Harmless device nodes such as `/dev/null`.
    Device,
}

/// The reviewed rights table: one entry per [`Access`] kind.
pub(crate) const ACCESS_TABLE: [(Access, u64); 4] = [
    // Read files, list directories, run binaries; nothing that changes the tree.
    (Access::ReadExec, READ_FILE | READ_DIR | EXECUTE),
    // Read files and list directories; executing from data trees is not needed.
    (Access::Read, READ_FILE | READ_DIR),
    // Everything a build needs: create, remove, rename across directories (REFER),
    // truncate, run what it built. Device creation (MAKE_CHAR, MAKE_BLOCK) is left out:
    // there is no legitimate use and it needs CAP_MKNOD anyway.
    (
        Access::Write,
        READ_FILE
            | READ_DIR
            | EXECUTE
            | WRITE_FILE
            | REMOVE_DIR
            | REMOVE_FILE
            | MAKE_DIR
            | MAKE_REG
            | MAKE_SOCK
            | MAKE_FIFO
            | MAKE_SYM
            | REFER
            | TRUNCATE,
    ),
    // Read and write the node and issue its ioctls (isatty checks on /dev/null and friends).
    (
        Access::Device,
        READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV,
    ),
];

/// The rights of one access kind.
pub(crate) fn rights(access: Access) -> u64 {
    ACCESS_TABLE
        .iter()
        .find(|(kind, _)| *kind == access)
        .map_or(0, |(_, rights)| *rights)
}

/// Filesystem rights the kernel knows at `abi` (all of them are handled, i.e. denied unless
/// a rule grants them).
pub(crate) fn handled_fs(abi: u32) -> u64 {
    let mut handled = EXECUTE
        | WRITE_FILE
        | READ_FILE
        | READ_DIR
        | REMOVE_DIR
        | REMOVE_FILE
        | MAKE_CHAR
        | MAKE_DIR
        | MAKE_REG
        | MAKE_SOCK
        | MAKE_FIFO
        | MAKE_BLOCK
        | MAKE_SYM;
    if abi >= 2 {
        handled |= REFER;
    }
    if abi >= 3 {
        handled |= TRUNCATE;
    }
    if abi >= 5 {
        handled |= IOCTL_DEV;
    }
    handled
}

/// Network rights handled at `abi`: all TCP bind/connect when the network is off (no rule
/// grants any port), nothing when it is on or filtered. A filtered sandbox's private network
/// namespace holds only loopback, so it is the boundary: commands may run their own loopback
/// servers (a test suite's HTTP server, a database) and connect to them, and the only way
/// off the namespace is the egress listener.
pub(crate) fn handled_net(abi: u32, network: NetworkAccess) -> u64 {
    match network {
        NetworkAccess::Off if abi >= 4 => NET_BIND_TCP | NET_CONNECT_TCP,
        NetworkAccess::Off | NetworkAccess::Filtered | NetworkAccess::On => 0,
    }
}

/// Scopes applied at `abi`: signals and abstract Unix sockets stay inside the sandbox.
pub(crate) fn scopes(abi: u32) -> u64 {
    if abi >= 6 {
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    } else {
        0
    }
}

/// Size of `struct landlock_ruleset_attr` the kernel expects at `abi`.
fn attr_size(abi: u32) -> usize {
    match abi {
        0..=3 => 8,
        4 | 5 => 16,
        _ => 24,
    }
}

/// Rights granted on the sandbox's fresh `/proc` at `abi`.
pub(crate) fn proc_rights(abi: u32) -> u64 {
    rights(Access::Read) & handled_fs(abi)
}

/// Every filesystem right: a rule keeping all of its access kind's rights.
pub(crate) const ALL_RIGHTS: u64 = u64::MAX;

/// One rule to add: a path and its access kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PathRule {
    /// Absolute path; its inode at build time carries the rule.
    pub path: PathBuf,
    /// What it is for.
    pub access: Access,
    /// The rights of `access` this rule keeps ([`ALL_RIGHTS`]: all; fewer where a protected
    /// or denied path is carved out below it, module `carve`).
    pub keep: u64,
    /// Found by carving (an entry or directory a command may remove or swap for a symlink
    /// at any time): opened without following any symlink, and skipped when gone.
    pub listed: bool,
}

impl PathRule {
    /// A rule granting all of `access`'s rights on `path`.
    pub(crate) fn whole(path: PathBuf, access: Access) -> PathRule {
        PathRule {
            path,
            access,
            keep: ALL_RIGHTS,
            listed: false,
        }
    }
}

/// Build the ruleset fd for `abi` (>= 1) with `rules`. Rights the ABI does not know are
/// dropped from each rule; directory-only rights are dropped on non-directories.
pub(crate) fn build_ruleset(
    abi: u32,
    network: NetworkAccess,
    rules: &[PathRule],
) -> Result<OwnedFd, SandboxError> {
    let handled = handled_fs(abi);
    let attr = sys::LandlockRulesetAttr {
        handled_access_fs: handled,
        handled_access_net: handled_net(abi, network),
        scoped: scopes(abi),
    };
    let ruleset = sys::landlock_create_ruleset(&attr, attr_size(abi))
        .map_err(|source| SandboxError::LandlockRuleset { source })?;
    for rule in rules {
        let opened = if rule.listed {
            super::carve::open_exact(&rule.path).map_err(|source| SandboxError::OpenPath {
                path: rule.path.clone(),
                source,
            })
        } else {
            open_rule_target(&rule.path)
        };
        let fd = match opened {
            Ok(fd) => fd,
            // A listed entry that went away or became a symlink gets no rule.
            Err(SandboxError::OpenPath { source, .. })
                if rule.listed
                    && (source.kind() == std::io::ErrorKind::NotFound
                        || source.raw_os_error() == Some(libc::ELOOP)) =>
            {
                continue;
            }
            // A read root that vanished grants nothing; writable roots must exist.
            Err(SandboxError::OpenPath { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound
                    && rule.access != Access::Write =>
            {
                continue;
            }
            Err(error) => return Err(error),
        };
        let is_dir = sys::fstat_is_dir(&fd).map_err(|source| SandboxError::OpenPath {
            path: rule.path.clone(),
            source,
        })?;
        let (kind, _) = sys::fstat_kind(&fd).map_err(|source| SandboxError::OpenPath {
            path: rule.path.clone(),
            source,
        })?;
        // A listed entry is a directory or a regular file (a symlink opened itself is not).
        if rule.listed && kind != libc::S_IFDIR && kind != libc::S_IFREG {
            continue;
        }
        let mut granted = rights(rule.access) & rule.keep & handled;
        if !is_dir {
            granted &= FILE_RIGHTS;
        }
        if granted == 0 {
            continue;
        }
        sys::landlock_add_path_rule(&ruleset, &fd, granted).map_err(|source| {
            SandboxError::LandlockRule {
                path: rule.path.clone(),
                source,
            }
        })?;
    }
    Ok(ruleset)
}

fn open_rule_target(path: &Path) -> Result<OwnedFd, SandboxError> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| SandboxError::NulByte {
        what: "sandbox path",
    })?;
    sys::open_path(&c_path).map_err(|source| SandboxError::OpenPath {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_exec_entry_reads_and_executes_only() {
        assert_eq!(rights(Access::ReadExec), READ_FILE | READ_DIR | EXECUTE);
    }

    #[test]
    fn read_entry_cannot_execute() {
        assert_eq!(rights(Access::Read), READ_FILE | READ_DIR);
        assert_eq!(rights(Access::Read) & EXECUTE, 0);
    }

    #[test]
    fn write_entry_grants_builds_but_no_device_nodes() {
        let write = rights(Access::Write);
        for needed in [
            WRITE_FILE,
            MAKE_REG,
            MAKE_DIR,
            REMOVE_FILE,
            REMOVE_DIR,
            REFER,
            TRUNCATE,
        ] {
            assert_ne!(write & needed, 0, "write roots need right {needed:#x}");
        }
        assert_eq!(write & (MAKE_CHAR | MAKE_BLOCK), 0);
        assert_eq!(write & IOCTL_DEV, 0);
    }

    #[test]
    fn device_entry_is_file_rights_only() {
        assert_eq!(
            rights(Access::Device),
            READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV
        );
        assert_eq!(rights(Access::Device) & !FILE_RIGHTS, 0);
    }

    #[test]
    fn handled_rights_grow_with_the_abi() {
        assert_eq!(handled_fs(1) & (REFER | TRUNCATE | IOCTL_DEV), 0);
        assert_ne!(handled_fs(2) & REFER, 0);
        assert_ne!(handled_fs(3) & TRUNCATE, 0);
        assert_eq!(handled_fs(4) & IOCTL_DEV, 0);
        assert_ne!(handled_fs(5) & IOCTL_DEV, 0);
        assert_eq!(handled_fs(7), (1 << 16) - 1);
    }

    #[test]
    fn tcp_is_handled_only_with_the_network_off() {
        assert_eq!(
            handled_net(7, NetworkAccess::Off),
            NET_BIND_TCP | NET_CONNECT_TCP
        );
        assert_eq!(handled_net(7, NetworkAccess::Filtered), 0);
        assert_eq!(handled_net(7, NetworkAccess::On), 0);
        assert_eq!(handled_net(3, NetworkAccess::Off), 0);
    }

    #[test]
    fn scopes_need_abi_six() {
        assert_eq!(scopes(5), 0);
        assert_eq!(scopes(6), SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL);
    }

    #[test]
    fn attr_size_matches_the_abi_layout() {
        assert_eq!(attr_size(1), 8);
        assert_eq!(attr_size(4), 16);
        assert_eq!(attr_size(7), 24);
    }
}
