//! Opening Cordon's own files on the host: the audit log and its head file, the `--save`
//! transcript, the policy file. Such a path may lie where a sandboxed command (or another
//! user) can plant something, so every open here:
//!
//! - does not follow a symbolic link in the final component (`O_NOFOLLOW`): a link planted at
//!   the path is refused instead of being written through, and a dangling one is not created;
//! - never blocks (`O_NONBLOCK`): a FIFO at the path opens at once and is then refused.
//!   For regular files the flag has no effect on reads and writes, so it stays set;
//! - checks what was opened with `fstat` on the descriptor (not on the path, which can change
//!   in between): a regular file, or a directory where one is expected;
//! - for files Cordon trusts or appends to ([`Trust::Owned`]): the owner must be the current
//!   user or root, the file must not be writable by group or others, and it must have one
//!   link only: a second hard link (one an earlier session's command made inside its
//!   workspace, say) would let whoever can write there rewrite the file later. Shared
//!   configuration read with [`read_following_to_string`] is exempt from the link check.
//!
//! Parent directories are not checked here; callers that must keep a file out of a sandbox's
//! reach compare the canonical parent directory with the sandbox's writable roots.
//!
//! It does not decide *where* a file may be (that is the runtime's and the CLI's business).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

/// How much an opened file is trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    /// Only read, and its content is checked by the reader (e.g. an audit log to verify).
    Any,
    /// Trusted configuration or a file Cordon appends to: owned by the current user or root,
    /// not writable by group or others.
    Owned,
}

/// How to open a file for writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Read and append; created (mode 0600) when missing.
    Append,
    /// Write from the start, truncating; created (mode 0600) when missing.
    Truncate,
    /// Open an existing file for writing without changing it.
    Existing,
}

/// Why a host file could not be opened safely.
#[derive(Debug, thiserror::Error)]
pub enum HostFileError {
    /// The final component is a symbolic link.
    #[error(
        "failed to open {path}: it is a symbolic link, which Cordon does not follow; give the path of the file itself"
    )]
    Symlink {
        /// The path given.
        path: PathBuf,
    },
    /// `open(2)` failed.
    #[error("failed to open {path}: {source}")]
    Open {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `fstat(2)` on the opened descriptor failed.
    #[error("failed to inspect {path}: {source}")]
    Stat {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The opened object is not of the expected type.
    #[error("failed to open {path}: it is {found}, not {expected}")]
    WrongType {
        /// The path given.
        path: PathBuf,
        /// What was found (`a FIFO`, `a directory`, …).
        found: &'static str,
        /// What was expected.
        expected: &'static str,
    },
    /// The file belongs to another user.
    #[error(
        "failed to trust {path}: it is owned by uid {owner}, not by the current user (uid {current}) or root; use a file you own"
    )]
    Owner {
        /// The path given.
        path: PathBuf,
        /// The file's owner.
        owner: u32,
        /// The current effective uid.
        current: u32,
    },
    /// Group or others may write the file.
    #[error(
        "failed to trust {path}: it is writable by group or others (mode {mode:04o}); run `chmod go-w {path}`"
    )]
    Writable {
        /// The path given.
        path: PathBuf,
        /// The permission bits.
        mode: u32,
    },
    /// The file has more than one hard link.
    #[error(
        "failed to trust {path}: it has {links} hard links, so writing through another of them changes it; replace it with a copy (`cp {path} {path}.new && mv {path}.new {path}`)"
    )]
    HardLinked {
        /// The path given.
        path: PathBuf,
        /// `st_nlink`.
        links: u64,
    },
    /// Reading the file failed.
    #[error("failed to read {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than the reader accepts.
    #[error("failed to read {path}: it is larger than {limit} bytes")]
    TooLarge {
        /// The path given.
        path: PathBuf,
        /// The limit.
        limit: u64,
    },
    /// The file is not UTF-8 text.
    #[error("failed to read {path}: it is not UTF-8 text")]
    NotText {
        /// The path given.
        path: PathBuf,
    },
}

impl HostFileError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            HostFileError::Symlink { path }
            | HostFileError::Open { path, .. }
            | HostFileError::Stat { path, .. }
            | HostFileError::WrongType { path, .. }
            | HostFileError::Owner { path, .. }
            | HostFileError::Writable { path, .. }
            | HostFileError::HardLinked { path, .. }
            | HostFileError::Read { path, .. }
            | HostFileError::TooLarge { path, .. }
            | HostFileError::NotText { path } => path,
        }
    }
}

/// Flags every open here adds: no symlink in the final component, never block on a FIFO.
fn safe_flags() -> i32 {
    (OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits()
}

fn open_with(options: &mut OpenOptions, extra: i32, path: &Path) -> Result<File, HostFileError> {
    options.custom_flags(safe_flags() | extra);
    options.open(path).map_err(|source| {
        // O_NOFOLLOW on a symlink fails with ELOOP.
        if source.raw_os_error() == Some(nix::libc::ELOOP)
            && std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink())
        {
            HostFileError::Symlink {
                path: path.to_owned(),
            }
        } else {
            HostFileError::Open {
                path: path.to_owned(),
                source,
            }
        }
    })
}

fn kind_of(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_file() {
        "a regular file"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Whether [`check`] refuses a regular file with more than one hard link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Links {
    One,
    Any,
}

/// `fstat` the opened descriptor and check its type and, for [`Trust::Owned`], its owner,
/// mode and (with [`Links::One`]) link count.
fn check(
    file: &File,
    path: &Path,
    want_dir: bool,
    trust: Trust,
    links: Links,
) -> Result<std::fs::Metadata, HostFileError> {
    let meta = file.metadata().map_err(|source| HostFileError::Stat {
        path: path.to_owned(),
        source,
    })?;
    let (ok, expected) = if want_dir {
        (meta.is_dir(), "a directory")
    } else {
        (meta.is_file(), "a regular file")
    };
    if !ok {
        return Err(HostFileError::WrongType {
            path: path.to_owned(),
            found: kind_of(meta.file_type()),
            expected,
        });
    }
    match trust {
        Trust::Any => {}
        Trust::Owned => {
            let current = nix::unistd::geteuid().as_raw();
            if meta.uid() != current && meta.uid() != 0 {
                return Err(HostFileError::Owner {
                    path: path.to_owned(),
                    owner: meta.uid(),
                    current,
                });
            }
            if meta.mode() & 0o022 != 0 {
                return Err(HostFileError::Writable {
                    path: path.to_owned(),
                    mode: meta.mode() & 0o7777,
                });
            }
            if !want_dir && links == Links::One && meta.nlink() > 1 {
                return Err(HostFileError::HardLinked {
                    path: path.to_owned(),
                    links: meta.nlink(),
                });
            }
        }
    }
    Ok(meta)
}

/// Open a regular file for reading.
pub fn open_read(path: &Path, trust: Trust) -> Result<File, HostFileError> {
    let file = open_with(OpenOptions::new().read(true), 0, path)?;
    check(&file, path, false, trust, Links::One)?;
    Ok(file)
}

/// Open (or create, mode 0600) a regular file for writing as `mode` says. A file that exists
/// must pass the [`Trust::Owned`] checks; one this call created is the caller's own.
/// [`WriteMode::Truncate`] truncates only after the checks passed.
pub fn open_write(path: &Path, mode: WriteMode) -> Result<File, HostFileError> {
    let mut options = OpenOptions::new();
    match mode {
        WriteMode::Append => options.read(true).append(true).create(true).mode(0o600),
        WriteMode::Truncate => options.write(true).create(true).mode(0o600),
        WriteMode::Existing => options.write(true),
    };
    let file = open_with(&mut options, 0, path)?;
    check(&file, path, false, Trust::Owned, Links::One)?;
    if mode == WriteMode::Truncate {
        file.set_len(0).map_err(|source| HostFileError::Open {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(file)
}

/// Open a directory (read-only) without following a symlink in its final component.
pub fn open_dir(path: &Path, trust: Trust) -> Result<File, HostFileError> {
    let file = open_with(
        OpenOptions::new().read(true),
        OFlag::O_DIRECTORY.bits(),
        path,
    )?;
    check(&file, path, true, trust, Links::One)?;
    Ok(file)
}

/// Read a whole regular file as UTF-8 text, at most `limit` bytes.
pub fn read_to_string(path: &Path, trust: Trust, limit: u64) -> Result<String, HostFileError> {
    read_file(open_read(path, trust)?, path, limit)
}

/// [`read_to_string`] for configuration Cordon shares with other programs that follow
/// symlinks (the OpenSSH client's `~/.ssh/config` and `known_hosts`, often links into a
/// dotfiles checkout): a symlink is followed, everything else is checked the same way — no
/// blocking on a FIFO, a regular file, and `trust` on what the link leads to.
pub fn read_following_to_string(
    path: &Path,
    trust: Trust,
    limit: u64,
) -> Result<String, HostFileError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|source| HostFileError::Open {
            path: path.to_owned(),
            source,
        })?;
    check(&file, path, false, trust, Links::Any)?;
    read_file(file, path, limit)
}

fn read_file(file: File, path: &Path, limit: u64) -> Result<String, HostFileError> {
    // The file is regular (checked): its size says at once whether it fits, so a huge or
    // sparse file is refused without reading `limit` bytes first. `take` still guards a file
    // that grows while it is read.
    let size = file
        .metadata()
        .map_err(|source| HostFileError::Read {
            path: path.to_owned(),
            source,
        })?
        .len();
    if size > limit {
        return Err(HostFileError::TooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| HostFileError::Read {
            path: path.to_owned(),
            source,
        })?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > limit {
        return Err(HostFileError::TooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    String::from_utf8(bytes).map_err(|_| HostFileError::NotText {
        path: path.to_owned(),
    })
}

#[cfg(test)]
#[path = "hostfile_tests.rs"]
mod tests;
