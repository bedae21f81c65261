//! The remote helper's transport: choosing the `cordon-helper` binary for the remote
//! architecture, its content-addressed cache on the remote host, upload, and the hash-verified
//! start that hands its standard input and output to the helper client. What the helper does
//! once it runs (file operations, search, sandboxed commands) is not this module's business.
//!
//! Cache layout: `<cache>/<sha256>/cordon-helper`, `<cache>` being `~/.cache/cordon/helper`, or
//! `<state_dir>/helper` when a state directory is configured. Every directory of that chain
//! (from the home directory down) must be a real directory owned by the remote user and
//! writable by nobody else; the ones Cordon creates are 0700. Every directory above it (on the
//! canonical path) must be owned by root or the remote user and writable by nobody else
//! unless sticky (`/tmp`), so no other user can rename the chain away. A binary is uploaded to a
//! temporary name in its directory and renamed into place, mode 0700, once per host and
//! version. The same exec that starts the helper checks the chain, the file's owner and mode,
//! and its sha256 against the local binary's first, so a file another user could write, or one
//! that changed since the upload, never runs: a mismatch is uploaded again once, then refused.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use russh_sftp::protocol::{FileAttributes, OpenFlags, Packet, StatusCode};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use cordon_helper::binary::{ARCHITECTURES, check_elf};
use cordon_remote::exec::TransportEvent;

use crate::conn::Pool;
use crate::remote::RemoteExec;

/// The helper binary's file name, next to the `cordon` executable and in the remote cache.
pub const HELPER_NAME: &str = "cordon-helper";

/// Largest stderr tail kept for an error message.
const STDERR_TAIL: usize = 4096;

/// Largest status record the start script prints before the helper runs.
const MAX_STATUS: usize = 64 * 1024;

/// Bytes per SFTP write of an upload, and writes in flight.
const UPLOAD_CHUNK: usize = 32 * 1024;
const UPLOAD_PIPELINE: usize = 32;

/// Largest helper binary Cordon uploads.
const MAX_BINARY: u64 = 512 * 1024 * 1024;

/// Why the remote helper cannot run. The messages reach the operator (and the model, through a
/// refused command): each says what failed and what to change.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RemoteHelperError {
    /// `uname -m` named an architecture without a helper build.
    #[error(
        "failed to choose a {HELPER_NAME} binary: the remote architecture `{arch}` (uname -m) \
         is not one Cordon builds a helper for (x86_64, aarch64)"
    )]
    UnknownArchitecture {
        /// What `uname -m` printed.
        arch: String,
    },
    /// No binary for the remote architecture was found.
    #[error(
        "failed to find a {HELPER_NAME} binary for {arch}: looked for {looked}; install the \
         release's {HELPER_NAME}-{arch} next to cordon or name one with --ssh-helper PATH"
    )]
    NotFound {
        /// The remote architecture.
        arch: String,
        /// The paths tried.
        looked: String,
    },
    /// The local binary could not be read.
    #[error("failed to read the helper binary {path}: {reason}")]
    Read {
        /// The local file.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
    /// The local binary is not an executable for the remote architecture.
    #[error(
        "failed to use the helper binary {path} on a {remote} host: {reason}; name a \
         {HELPER_NAME} built for {remote} with --ssh-helper PATH"
    )]
    WrongBinary {
        /// The local file.
        path: PathBuf,
        /// The remote architecture (`uname -m`).
        remote: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A directory of the remote cache (or the cached file) is unsafe.
    #[error(
        "failed to use the remote helper cache on {host}: {reason}; remove it (or fix its owner \
         and mode: 0700, owned by the remote user), or point the state directory elsewhere"
    )]
    UnsafeCache {
        /// `user@host:port`.
        host: String,
        /// Which path and why.
        reason: String,
    },
    /// The cache is on a file system mounted `noexec`.
    #[error(
        "failed to run the helper from {dir} on {host}: the file system is mounted noexec; set \
         a state directory on a file system that allows execution (the helper is cached under \
         <state directory>/helper)"
    )]
    NoExec {
        /// `user@host:port`.
        host: String,
        /// The remote cache directory.
        dir: String,
    },
    /// The host's machine (`uname -m`) is not the one the binary was chosen for.
    #[error(
        "failed to start {HELPER_NAME} on {host}: the binary was chosen for another machine \
         than the host's ({machine})"
    )]
    OtherMachine {
        /// `user@host:port`.
        host: String,
        /// What `uname -m` printed on the host.
        machine: String,
    },
    /// The remote host has no `sha256sum`, so the cached binary cannot be verified.
    #[error(
        "failed to verify the cached helper on {host}: the host has no sha256sum (coreutils or \
         busybox), and an unverified binary is never run"
    )]
    NoChecksumTool {
        /// `user@host:port`.
        host: String,
    },
    /// The cached binary's hash differs even after a fresh upload.
    #[error(
        "failed to verify the cached helper {path} on {host}: its sha256 differs from the local \
         binary's ({sha256}) even after a fresh upload; something on the host changes the file"
    )]
    HashMismatch {
        /// `user@host:port`.
        host: String,
        /// The remote file.
        path: String,
        /// The expected digest.
        sha256: String,
    },
    /// Uploading the binary over SFTP failed.
    #[error("failed to upload the helper to {path} on {host}: {reason}")]
    Upload {
        /// `user@host:port`.
        host: String,
        /// The remote file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The exec channel that starts the helper failed, or its start script said something
    /// unexpected.
    #[error("failed to start the helper on {host}: {reason}")]
    Start {
        /// `user@host:port`.
        host: String,
        /// What went wrong.
        reason: String,
    },
}

/// The architecture name of the helper build for `uname -m`, and its ELF machine number.
pub(crate) fn helper_arch(uname: &str) -> Result<(&'static str, u16), RemoteHelperError> {
    ARCHITECTURES
        .iter()
        .find(|(name, _, _)| *name == uname)
        .map(|(_, machine, suffix)| (*suffix, *machine))
        .ok_or_else(|| RemoteHelperError::UnknownArchitecture {
            arch: uname.to_owned(),
        })
}

/// A local helper binary chosen for a host: where it is and its sha256 (hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalHelper {
    /// The local file.
    pub path: PathBuf,
    /// Its sha256, lower-case hex.
    pub sha256: String,
}

/// [`choose`] off the async runtime (it may hash a large file).
pub(crate) async fn choose_blocking(
    configured: Option<PathBuf>,
    uname: String,
) -> Result<LocalHelper, RemoteHelperError> {
    let path = configured.clone();
    tokio::task::spawn_blocking(move || choose(configured.as_deref(), &uname))
        .await
        .unwrap_or_else(|e| {
            Err(RemoteHelperError::Read {
                path: path.unwrap_or_default(),
                reason: format!("the task choosing the binary failed: {e}"),
            })
        })
}

/// The helper a host uses, as `cordon doctor` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelperReport {
    /// The host's architecture (`uname -m`).
    pub arch: String,
    /// The local binary and its sha256.
    pub local: LocalHelper,
    /// The verified binary on the host.
    pub remote_path: String,
    /// Whether it was uploaded now (else it was in the cache).
    pub uploaded: bool,
}

/// The places a helper for `arch` is looked for when none is configured: next to the current
/// executable, `cordon-helper-<arch>` first, then `cordon-helper`.
fn candidates(arch: &str) -> Vec<PathBuf> {
    let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    else {
        return Vec::new();
    };
    vec![
        dir.join(format!("{HELPER_NAME}-{arch}")),
        dir.join(HELPER_NAME),
    ]
}

/// Digests of local binaries already hashed, keyed by path and file identity: hashing a large
/// binary once per process, not once per connect.
type DigestKey = (PathBuf, u64, u64, i64, i64);
static DIGESTS: Mutex<Vec<(DigestKey, String)>> = Mutex::new(Vec::new());

fn digest_key(path: &Path, meta: &std::fs::Metadata) -> DigestKey {
    use std::os::unix::fs::MetadataExt;
    (
        path.to_path_buf(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
    )
}

/// Choose the binary for a host whose `uname -m` is `uname`: the configured one, else one
/// next to the current executable; it must be an ELF executable for that architecture.
pub(crate) fn choose(
    configured: Option<&Path>,
    uname: &str,
) -> Result<LocalHelper, RemoteHelperError> {
    let (arch, machine) = helper_arch(uname)?;
    let list = match configured {
        Some(path) => vec![path.to_path_buf()],
        None => candidates(arch),
    };
    let mut wrong = None;
    for path in &list {
        let head = match cordon_helper::binary::read_binary(path, 64) {
            Ok(head) => head,
            Err(e) if configured.is_none() && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(RemoteHelperError::Read {
                    path: path.clone(),
                    reason: e.to_string(),
                });
            }
        };
        match check_elf(&head, machine) {
            Ok(()) => {
                return Ok(LocalHelper {
                    path: path.clone(),
                    sha256: sha256_of(path)?,
                });
            }
            Err(reason) => {
                wrong.get_or_insert(RemoteHelperError::WrongBinary {
                    path: path.clone(),
                    remote: uname.to_owned(),
                    reason,
                });
            }
        }
    }
    Err(wrong.unwrap_or_else(|| RemoteHelperError::NotFound {
        arch: arch.to_owned(),
        looked: if list.is_empty() {
            "nothing (the current executable's directory is unknown)".to_owned()
        } else {
            list.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        },
    }))
}

fn sha256_of(path: &Path) -> Result<String, RemoteHelperError> {
    let read_error = |e: std::io::Error| RemoteHelperError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(read_error)?;
    if meta.len() > MAX_BINARY {
        return Err(RemoteHelperError::Read {
            path: path.to_path_buf(),
            reason: format!(
                "it has {} bytes, more than the {MAX_BINARY} a helper may have",
                meta.len()
            ),
        });
    }
    let key = digest_key(path, &meta);
    if let Some((_, digest)) = DIGESTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .find(|(k, _)| *k == key)
    {
        return Ok(digest.clone());
    }
    let bytes = cordon_helper::binary::read_binary(path, usize::MAX).map_err(read_error)?;
    let digest = hex(&Sha256::digest(&bytes));
    DIGESTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push((key, digest.clone()));
    Ok(digest)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates and checks the cache chain, verifies the cached binary and, only if it is the
/// expected one, execs it. `$1` is the sha256, `$2` the state directory (empty: the home
/// cache), `$3` the machine (`uname -m`) the binary was chosen for (empty: not checked; a
/// connect starts the helper before its probe has reported the machine). Prints
/// NUL-terminated fields: `cordon-helper-ok`, the cache directory, then the helper owns
/// stdout; or `cordon-helper-fail`, a code and a detail.
const START_SCRIPT: &str = r#"
fail() { printf 'cordon-helper-fail\0%s\0%s\0' "$1" "$2"; exit 0; }
umask 077
want=$1
if [ -n "$3" ]; then
    machine=$(uname -m) || fail start "uname -m failed"
    [ "$machine" = "$3" ] || fail machine "$machine"
fi
uid=$(id -u) || fail start "id -u failed"
# A directory Cordon may use: a real directory, owned by us, writable by nobody else.
check() {
    [ -L "$1" ] && fail unsafe "$1 is a symbolic link"
    [ -d "$1" ] || fail unsafe "$1 is not a directory"
    set -- "$1" $(ls -ldn -- "$1")
    [ "$4" = "$uid" ] || fail unsafe "$1 is owned by uid $4, not by the remote user ($uid)"
    case $2 in
        ?????w*|????????w*) fail unsafe "$1 is writable by its group or by others (mode $2)" ;;
    esac
}
make() {
    if [ ! -e "$1" ] && [ ! -L "$1" ]; then mkdir "$1" 2>/dev/null && chmod 700 "$1"; fi
    check "$1"
}
# Every directory above the chain (its canonical path): owned by root or by us, and writable
# by nobody else unless sticky (then only an entry's owner may rename it, and the entry below
# is checked in turn). Else another user could rename the chain away and put their own.
above() {
    p=$1
    while [ "$p" != / ]; do
        p=${p%/*}
        [ -n "$p" ] || p=/
        set -- $(ls -ldn -- "$p")
        case $3 in
            0|"$uid") ;;
            *) fail unsafe "$p is owned by uid $3, not by root or the remote user ($uid)" ;;
        esac
        case $1 in
            ?????????[tT]*) ;;
            ?????w*|????????w*) fail unsafe "$p is writable by its group or by others and not sticky (mode $1)" ;;
        esac
    done
}
if [ -n "$2" ]; then
    case $2 in /*) ;; *) fail unsafe "the state directory $2 is not absolute" ;; esac
    mkdir -p "$2" 2>/dev/null
    [ -L "$2" ] && fail unsafe "$2 is a symbolic link"
    state=$(cd "$2" && pwd -P) || fail unsafe "the state directory $2 cannot be entered"
    above "$state"
    check "$state"
    cache=$state/helper
else
    case $HOME in /*) ;; *) fail unsafe "the remote account has no absolute HOME" ;; esac
    home=$(cd "$HOME" && pwd -P) || fail unsafe "the home directory $HOME cannot be entered"
    above "$home"
    check "$home"
    make "$home/.cache"
    make "$home/.cache/cordon"
    cache=$home/.cache/cordon/helper
fi
make "$cache"
dir=$cache/$want
make "$dir"
f=$dir/cordon-helper
if [ ! -e "$f" ] && [ ! -L "$f" ]; then fail missing "$dir"; fi
command -v sha256sum >/dev/null 2>&1 || fail nosha ""
[ -L "$f" ] && fail corrupt "$dir"
[ -f "$f" ] || fail corrupt "$dir"
set -- $(ls -ln -- "$f")
[ "$3" = "$uid" ] || fail corrupt "$dir"
case $1 in ?????w*|????????w*) fail corrupt "$dir" ;; esac
set -- $(sha256sum < "$f")
[ "$1" = "$want" ] || fail corrupt "$dir"
[ -x "$f" ] || fail noexec "$dir"
cd "$dir" || fail start "cannot enter $dir"
printf 'cordon-helper-ok\0%s\0' "$cache"
exec ./cordon-helper serve
"#;

/// What the start script reported.
#[derive(Debug, PartialEq, Eq)]
enum StartStatus {
    /// The helper runs; the cache directory (to deny inside the sandbox).
    Running { cache: String },
    /// `code`, `detail` of a refusal.
    Failed { code: String, detail: String },
}

/// A started helper: its channel as a byte stream, and what the start found.
pub(crate) struct HelperChannel {
    /// The helper's stdout (after the start script's status record).
    pub reader: Pin<Box<dyn AsyncRead + Send>>,
    /// The helper's stdin.
    pub writer: Pin<Box<dyn AsyncWrite + Send>>,
    /// The remote cache directory of every helper version.
    pub cache_dir: String,
    /// The remote binary.
    pub remote_path: String,
    /// Whether this start uploaded the binary.
    pub uploaded: bool,
    /// The last bytes the helper wrote on stderr.
    pub stderr: Arc<Mutex<Vec<u8>>>,
    /// Closes the channel (the helper then kills what it started and exits) when dropped.
    pub pump: PumpGuard,
}

/// Aborts the task pumping the helper's channel when dropped.
pub(crate) struct PumpGuard(tokio::task::JoinHandle<()>);

impl Drop for PumpGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The last bytes the helper wrote on stderr, for an error message.
pub(crate) fn stderr_text(stderr: &Mutex<Vec<u8>>) -> String {
    let tail = stderr.lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(&tail).trim().to_owned()
}

/// Start the helper `local` on the host of `pool`, uploading it first when the cache lacks it
/// or holds a different file (once; a second mismatch is an error). Without `reconnect` its
/// channel is opened on the pool's connection or not at all (see [`Pool::open_channel`]).
pub(crate) async fn start(
    pool: &Pool,
    local: &LocalHelper,
    state_dir: Option<&str>,
    machine: Option<&str>,
    reconnect: bool,
) -> Result<HelperChannel, RemoteHelperError> {
    let host = pool.label();
    let mut uploaded = false;
    loop {
        let (status, channel) = start_once(pool, local, state_dir, machine, reconnect).await?;
        let (code, detail) = match status {
            StartStatus::Running { cache } => {
                let (reader, writer, stderr, pump) = channel;
                tracing::info!(
                    %host,
                    sha256 = %local.sha256,
                    uploaded,
                    "ssh: helper started"
                );
                return Ok(HelperChannel {
                    reader,
                    writer,
                    remote_path: format!("{cache}/{}/{HELPER_NAME}", local.sha256),
                    cache_dir: cache,
                    uploaded,
                    stderr,
                    pump,
                });
            }
            StartStatus::Failed { code, detail } => (code, detail),
        };
        drop(channel);
        match code.as_str() {
            "missing" | "corrupt" if !uploaded => {
                if code == "corrupt" {
                    tracing::warn!(%host, dir = %detail, "ssh: the cached helper failed its check; uploading it again");
                }
                upload(pool, local, &detail).await?;
                uploaded = true;
            }
            "missing" | "corrupt" => {
                return Err(RemoteHelperError::HashMismatch {
                    host,
                    path: format!("{detail}/{HELPER_NAME}"),
                    sha256: local.sha256.clone(),
                });
            }
            "unsafe" => {
                tracing::warn!(%host, reason = %detail, "ssh: refused an unsafe helper cache");
                return Err(RemoteHelperError::UnsafeCache {
                    host,
                    reason: detail,
                });
            }
            "noexec" => return Err(RemoteHelperError::NoExec { host, dir: detail }),
            "machine" => {
                return Err(RemoteHelperError::OtherMachine {
                    host,
                    machine: detail,
                });
            }
            "nosha" => return Err(RemoteHelperError::NoChecksumTool { host }),
            _ => {
                return Err(RemoteHelperError::Start {
                    host,
                    reason: format!("the start script refused: {code}: {detail}"),
                });
            }
        }
    }
}

type Channel = (
    Pin<Box<dyn AsyncRead + Send>>,
    Pin<Box<dyn AsyncWrite + Send>>,
    Arc<Mutex<Vec<u8>>>,
    PumpGuard,
);

/// Run the start script once: its status, and the channel (the helper's, when it runs).
async fn start_once(
    pool: &Pool,
    local: &LocalHelper,
    state_dir: Option<&str>,
    machine: Option<&str>,
    reconnect: bool,
) -> Result<(StartStatus, Channel), RemoteHelperError> {
    let host = pool.label();
    let start_error = |reason: String| RemoteHelperError::Start {
        host: host.clone(),
        reason,
    };
    let argv = cordon_remote::sh_argv(
        START_SCRIPT,
        "cordon-helper-start",
        [
            local.sha256.clone(),
            state_dir.unwrap_or("").to_owned(),
            machine.unwrap_or("").to_owned(),
        ],
    );
    let mut exec = RemoteExec::start_with(pool, &argv, reconnect)
        .await
        .map_err(start_error)?;
    let writer = exec.stdin();
    let stderr = Arc::new(Mutex::new(Vec::new()));
    // The pump moves the helper's stdout into a pipe the client reads, keeps the tail of its
    // stderr, and closes the pipe when the channel ends (the client then sees EOF).
    let (mut pipe_in, pipe_out) = tokio::io::duplex(256 * 1024);
    let tail = stderr.clone();
    let pump = tokio::spawn(async move {
        while let Some(event) = exec.next().await {
            match event {
                Ok(TransportEvent::Stdout(bytes)) => {
                    if pipe_in.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                Ok(TransportEvent::Stderr(bytes)) => {
                    let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                    tail.extend_from_slice(&bytes);
                    let excess = tail.len().saturating_sub(STDERR_TAIL);
                    tail.drain(..excess);
                }
                Err(error) => {
                    let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                    tail.extend_from_slice(format!("\n{error}").as_bytes());
                    break;
                }
            }
        }
        if !exec.started() {
            let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
            tail.extend_from_slice(exec.not_started_reason().as_bytes());
        }
        tracing::debug!(exit_status = ?exec.exit_status, "ssh: helper channel closed");
    });
    let pump = PumpGuard(pump);
    let mut reader = BufReader::new(pipe_out);
    let first = read_field(&mut reader, &stderr)
        .await
        .map_err(start_error)?;
    let status = match first.as_str() {
        "cordon-helper-ok" => StartStatus::Running {
            cache: read_field(&mut reader, &stderr)
                .await
                .map_err(start_error)?,
        },
        "cordon-helper-fail" => StartStatus::Failed {
            code: read_field(&mut reader, &stderr)
                .await
                .map_err(start_error)?,
            detail: read_field(&mut reader, &stderr)
                .await
                .map_err(start_error)?,
        },
        other => {
            return Err(start_error(format!(
                "the start script printed `{}` instead of a status",
                other.chars().take(200).collect::<String>()
            )));
        }
    };
    Ok((status, (Box::pin(reader), writer, stderr, pump)))
}

/// One NUL-terminated field of the start script's status record.
async fn read_field(
    reader: &mut BufReader<tokio::io::DuplexStream>,
    stderr: &Mutex<Vec<u8>>,
) -> Result<String, String> {
    let mut bytes = Vec::new();
    let n = reader
        .take(MAX_STATUS as u64)
        .read_until(0, &mut bytes)
        .await
        .map_err(|e| e.to_string())?;
    if n == 0 || bytes.last() != Some(&0) {
        let said = stderr_text(stderr);
        return Err(format!(
            "the start script ended without a status{}",
            if said.is_empty() {
                String::new()
            } else {
                format!(" (stderr: {said})")
            }
        ));
    }
    bytes.pop();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn ssh_string(out: &mut Vec<u8>, value: &str) {
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value.as_bytes());
}

/// Upload `local` into the cache directory `dir` (which the start script made and checked):
/// a temporary name, mode 0700, then renamed over `cordon-helper`.
async fn upload(pool: &Pool, local: &LocalHelper, dir: &str) -> Result<(), RemoteHelperError> {
    let host = pool.label();
    let target = format!("{dir}/{HELPER_NAME}");
    let upload_error = |reason: String| RemoteHelperError::Upload {
        host: host.clone(),
        path: target.clone(),
        reason,
    };
    let bytes = cordon_helper::binary::read_binary(&local.path, usize::MAX).map_err(|e| {
        RemoteHelperError::Read {
            path: local.path.clone(),
            reason: e.to_string(),
        }
    })?;
    if hex(&Sha256::digest(&bytes)) != local.sha256 {
        return Err(RemoteHelperError::Read {
            path: local.path.clone(),
            reason: "the file changed while Cordon used it".to_owned(),
        });
    }
    let live = pool.live().await.map_err(|e| upload_error(e.to_string()))?;
    let temp = format!("{dir}/.{HELPER_NAME}.{:016x}.tmp", fastrand::u64(..));
    let started = std::time::Instant::now();
    let attrs = FileAttributes {
        permissions: Some(0o700),
        ..FileAttributes::empty()
    };
    let handle = live
        .sftp
        .open(
            temp.clone(),
            OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUDE,
            attrs.clone(),
        )
        .await
        .map_err(|e| upload_error(format!("open {temp}: {e}")))?
        .handle;
    let written = async {
        let pieces: Vec<(u64, Vec<u8>)> = bytes
            .chunks(UPLOAD_CHUNK)
            .enumerate()
            .map(|(i, chunk)| ((i * UPLOAD_CHUNK) as u64, chunk.to_vec()))
            .collect();
        let writes = pieces
            .into_iter()
            .map(|(offset, chunk)| live.sftp.write(handle.as_str(), offset, chunk));
        futures::stream::iter(writes)
            .buffer_unordered(UPLOAD_PIPELINE)
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| format!("write: {e}"))?;
        live.sftp
            .fsetstat(handle.as_str(), attrs)
            .await
            .map_err(|e| format!("chmod: {e}"))?;
        live.sftp
            .close(handle.as_str())
            .await
            .map_err(|e| format!("close: {e}"))?;
        let renamed = if live.extensions.posix_rename {
            let mut payload = Vec::new();
            ssh_string(&mut payload, &temp);
            ssh_string(&mut payload, &target);
            match live
                .sftp
                .extended("posix-rename@openssh.com", payload)
                .await
            {
                Ok(Packet::Status(status)) if status.status_code == StatusCode::Ok => Ok(()),
                Ok(Packet::Status(status)) => Err(status.error_message),
                Ok(_) => Err("unexpected reply".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        } else {
            // Without posix-rename a plain rename cannot replace a corrupted file: remove it
            // first (the directory is ours alone).
            let _ = live.sftp.remove(target.clone()).await;
            live.sftp
                .rename(temp.clone(), target.clone())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        renamed.map_err(|e| format!("rename: {e}"))
    }
    .await;
    if let Err(reason) = written {
        // A temp file left behind would only waste space in our own directory.
        let _ = live.sftp.remove(temp.clone()).await;
        tracing::warn!(%host, path = %target, %reason, "ssh: helper upload failed");
        return Err(upload_error(reason));
    }
    tracing::info!(
        %host,
        path = %target,
        bytes = bytes.len(),
        millis = started.elapsed().as_millis() as u64,
        "ssh: helper uploaded"
    );
    Ok(())
}

/// Starts helpers on the SSH host for [`cordon_helper::HelperBackend`]: the first connect hands
/// over the helper started while connecting, later ones (after a helper died) start a new one,
/// verified (and uploaded again if the cached file changed) like the first.
pub(crate) struct SshConnector {
    pub pool: Arc<Pool>,
    pub local: LocalHelper,
    pub state_dir: Option<String>,
    /// The cache the session's spec denies: a later helper must run from the same one.
    pub cache_dir: String,
    pub first: Mutex<Option<HelperChannel>>,
}

#[async_trait::async_trait]
impl cordon_helper::Connector for SshConnector {
    async fn connect(&self) -> Result<cordon_helper::Connection, cordon_helper::HelperError> {
        let ready = self.first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let channel = match ready {
            Some(channel) => channel,
            None => start(
                &self.pool,
                &self.local,
                self.state_dir.as_deref(),
                None,
                true,
            )
            .await
            .map_err(|error| cordon_helper::HelperError::Spawn {
                program: PathBuf::from(HELPER_NAME),
                source: std::io::Error::other(error.to_string()),
            })?,
        };
        if channel.cache_dir != self.cache_dir {
            tracing::warn!(
                expected = %self.cache_dir,
                found = %channel.cache_dir,
                "ssh: refused a new helper started from another cache"
            );
            return Err(cordon_helper::HelperError::Spawn {
                program: PathBuf::from(HELPER_NAME),
                source: std::io::Error::other(format!(
                    "the new helper's cache {} is not {}, the one the session denies to \
                     commands (a path to the state directory changed); start a new session",
                    channel.cache_dir, self.cache_dir
                )),
            });
        }
        let HelperChannel {
            reader,
            writer,
            cache_dir: _,
            remote_path: _,
            uploaded: _,
            stderr,
            pump,
        } = channel;
        Ok(cordon_helper::Connection {
            reader: Box::new(reader),
            writer: Box::new(writer),
            keep: Box::new((pump, stderr)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(class: u8, kind: u16, machine: u16) -> Vec<u8> {
        let mut head = vec![0u8; 64];
        head[..4].copy_from_slice(b"\x7fELF");
        head[4] = class;
        head[5] = 1;
        head[16..18].copy_from_slice(&kind.to_le_bytes());
        head[18..20].copy_from_slice(&machine.to_le_bytes());
        head
    }

    /// The start script run locally: what it prints before it would exec the helper.
    fn start_script(args: [&str; 3]) -> Vec<String> {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(START_SCRIPT)
            .arg("cordon-helper-start")
            .args(args)
            .output()
            .expect("run sh");
        String::from_utf8(out.stdout)
            .unwrap()
            .split('\0')
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_start_script_checks_the_machine_it_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().canonicalize().unwrap().join("state");
        let state = state.to_str().unwrap();
        let want = "0".repeat(64);
        let machine = String::from_utf8(
            std::process::Command::new("uname")
                .arg("-m")
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap()
        .trim()
        .to_owned();
        // Another machine: refused before anything is created.
        let other = start_script([&want, state, "no-such-machine"]);
        assert_eq!(
            other[..3],
            ["cordon-helper-fail", "machine", machine.as_str()]
        );
        assert!(!Path::new(state).exists(), "the cache was created");
        // This machine, or none given: on to the cache (empty here).
        for given in [machine.as_str(), ""] {
            let out = start_script([&want, state, given]);
            assert_eq!(out[..2], ["cordon-helper-fail", "missing"], "{out:?}");
        }
    }

    #[test]
    fn uname_names_map_to_helper_builds() {
        assert_eq!(helper_arch("x86_64").unwrap(), ("x86_64", 62));
        assert_eq!(helper_arch("arm64").unwrap(), ("aarch64", 183));
        assert_eq!(helper_arch("aarch64").unwrap(), ("aarch64", 183));
        let error = helper_arch("riscv64").unwrap_err().to_string();
        assert!(error.contains("`riscv64`"), "{error}");
    }

    #[test]
    fn elf_headers_are_checked() {
        assert_eq!(check_elf(&elf(2, 2, 62), 62), Ok(()));
        assert_eq!(check_elf(&elf(2, 3, 183), 183), Ok(()));
        assert_eq!(
            check_elf(&elf(2, 3, 183), 62),
            Err("it is built for aarch64".to_owned())
        );
        assert_eq!(
            check_elf(&elf(2, 3, 243), 62),
            Err("it is built for ELF machine 243".to_owned())
        );
        assert_eq!(
            check_elf(&elf(1, 2, 62), 62),
            Err("it is not a 64-bit little-endian ELF file".to_owned())
        );
        assert_eq!(
            check_elf(&elf(2, 1, 62), 62),
            Err("its ELF type 1 is not an executable".to_owned())
        );
        assert_eq!(
            check_elf(b"#!/bin/sh\necho hi\n", 62),
            Err("it is not an ELF executable".to_owned())
        );
    }

    #[test]
    fn the_configured_binary_must_fit_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("helper.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let error = choose(Some(&script), "x86_64").unwrap_err().to_string();
        assert!(error.contains("it is not an ELF executable"), "{error}");
        let arm = dir.path().join("arm");
        std::fs::write(&arm, elf(2, 3, 183)).unwrap();
        let error = choose(Some(&arm), "x86_64").unwrap_err().to_string();
        assert!(error.contains("built for aarch64"), "{error}");
        let chosen = choose(Some(&arm), "aarch64").unwrap();
        assert_eq!(chosen.path, arm);
        assert_eq!(chosen.sha256, hex(&Sha256::digest(elf(2, 3, 183))));
        let missing = dir.path().join("missing");
        let error = choose(Some(&missing), "x86_64").unwrap_err().to_string();
        assert!(
            error.starts_with("failed to read the helper binary"),
            "{error}"
        );
    }
}
