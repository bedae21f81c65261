//! The helper's stream over a Unix socket instead of the engine's attach stream (bind mode,
//! an engine on this machine). Every frame through `docker exec`'s attach stream crosses the
//! engine's HTTP connection, its stream copier and the exec's pipes, each way: most of a short
//! call's time. A socket the container reaches directly leaves the engine out of every call.
//!
//! How one helper connects:
//! - this process binds a new socket, named for this one start, in a private directory that
//!   the container mounts read-only at [`SOCKET_DIR`] (the container can connect to it, never
//!   create, replace or remove anything there);
//! - it starts `cordon-helper serve --connect SOCKET` through the engine, attached as before
//!   (its stderr is the helper's log);
//! - it accepts only the helper it started: the connecting process must still run and its
//!   pid (as this machine sees it, through a pidfd of the peer) be the exec's pid the engine
//!   reports ([`live_peer`]: a kernel before Linux 6.5 cannot tell). Anything else in the
//!   container (a process a command left behind) that connects first is dropped, and so is
//!   any connection from this machine;
//! - the socket is removed once the helper is accepted, so nothing else can connect later.
//!
//! When that cannot work (an engine in a virtual machine whose file sharing does not carry
//! sockets, an engine in another pid namespace so the pids never match), the helper exits or
//! is not accepted: the session logs why and keeps the attach stream for the rest of its
//! life. Both paths run the same helper with the same sandbox; only the transport differs.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

/// The container directory holding the helper's socket (a read-only bind mount).
pub(crate) const SOCKET_DIR: &str = "/cordon-helper-socket";

/// How long a started helper has to connect.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Connections dropped while waiting for one helper (not it) before the socket is given up.
pub(crate) const MAX_STRANGERS: usize = 16;

/// The private host directory of one session's helper sockets.
#[derive(Debug)]
pub(crate) struct HelperSockets {
    /// Mode 0700: only this user reaches anything below it on this machine.
    _private: tempfile::TempDir,
    /// The mounted directory (mode 0755 so the container's user can reach the socket).
    dir: PathBuf,
    next: AtomicU64,
    /// Why the session stopped using sockets, once it did.
    given_up: Mutex<Option<String>>,
}

/// A socket waiting for one helper.
#[derive(Debug)]
pub(crate) struct Pending {
    pub listener: UnixListener,
    /// Its path on this machine (removed when this is dropped).
    pub host_path: PathBuf,
    /// Its path in the container.
    pub container_path: String,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_file(&self.host_path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.host_path.display(), %error, "docker: failed to remove the helper's socket");
        }
    }
}

impl HelperSockets {
    /// A new private directory for this session's helper sockets.
    ///
    /// Refused when it would lie inside one of `writable` (host directories the container
    /// writes, such as a workspace holding `TMPDIR`): the container could then reach it
    /// through that mount and replace what this process binds, removes or changes there.
    pub(crate) fn create(writable: &[&Path]) -> std::io::Result<HelperSockets> {
        let (private, dir) = socket_dir("cordon-helper-", writable)?;
        Ok(HelperSockets {
            _private: private,
            dir,
            next: AtomicU64::new(1),
            given_up: Mutex::new(None),
        })
    }

    /// The host directory to mount at [`SOCKET_DIR`].
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the next helper should connect through a socket.
    pub(crate) fn in_use(&self) -> bool {
        self.given_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// Stop using sockets for this session (the first reason is kept).
    pub(crate) fn give_up(&self, reason: &str) {
        let mut given_up = self.given_up.lock().unwrap_or_else(PoisonError::into_inner);
        if given_up.is_none() {
            tracing::warn!(%reason, "docker: the helper cannot use a socket; it keeps the engine's attach stream");
            *given_up = Some(reason.to_owned());
        }
    }

    /// Why the session does not use sockets, if it stopped.
    pub(crate) fn given_up(&self) -> Option<String> {
        self.given_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A new socket for one helper. Its mode lets the container's user (any uid) connect;
    /// who may stay connected is decided by [`accept_helper`].
    pub(crate) fn listen(&self) -> std::io::Result<Pending> {
        let name = format!("helper-{}.sock", self.next.fetch_add(1, Ordering::Relaxed));
        let host_path = self.dir.join(&name);
        let listener = bind_for_anyone(&host_path)?;
        Ok(Pending {
            listener,
            host_path,
            container_path: format!("{SOCKET_DIR}/{name}"),
        })
    }
}

/// A new private directory (0700, random name under the temporary directory) holding a
/// `socket` directory (0755: the root of a read-only mount, reachable by the container's
/// users), for the sockets a container connects to (the helper's, the egress proxy's).
///
/// Refused when it would lie inside one of `writable` (host directories the container
/// writes, such as a workspace holding `TMPDIR`): the container could then reach it through
/// that mount and replace what this process binds, removes or changes there.
pub(crate) fn socket_dir(
    prefix: &str,
    writable: &[&Path],
) -> std::io::Result<(tempfile::TempDir, PathBuf)> {
    let private = tempfile::Builder::new()
        .prefix(prefix)
        // Created with this mode (no window where other users could enter it).
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()?;
    let real = std::fs::canonicalize(private.path())?;
    if let Some(root) = writable
        .iter()
        .filter_map(|root| std::fs::canonicalize(root).ok())
        .find(|root| real.starts_with(root))
    {
        return Err(std::io::Error::other(format!(
            "the temporary directory {} is inside {}, which the container can write (set TMPDIR elsewhere)",
            real.display(),
            root.display()
        )));
    }
    let dir = private.path().join("socket");
    std::fs::create_dir(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    Ok((private, dir))
}

/// A socket bound at `path` that any uid can connect to (mode 0666), the mode set on the
/// socket itself, never on what a symbolic link there names: where this machine's temporary
/// directory is in a directory the container may write, a process in the container could
/// put a link to one of this user's files in the socket's place between the bind and the
/// mode change. Who may stay connected is the caller's to decide.
pub(crate) fn bind_for_anyone(path: &Path) -> std::io::Result<UnixListener> {
    let listener = UnixListener::bind(path)?;
    let_anyone_connect(path)?;
    Ok(listener)
}

/// Mode 0666 on the socket at `path`, not following a link there.
fn let_anyone_connect(path: &Path) -> std::io::Result<()> {
    use nix::sys::stat::{FchmodatFlags, Mode, fchmodat};
    fchmodat(
        nix::fcntl::AT_FDCWD,
        path,
        Mode::from_bits_truncate(0o666),
        FchmodatFlags::NoFollowSymlink,
    )
    .map_err(std::io::Error::from)
}

/// Accept connections on `pending` until one comes from the process `expected_pid` returns
/// (asked once something connected: the exec's pid on this machine), dropping the others.
/// Gives up after [`MAX_STRANGERS`] others. The socket is removed before this returns.
pub(crate) async fn accept_helper<F, Fut>(
    pending: Pending,
    expected_pid: F,
) -> Result<UnixStream, String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<i64, String>>,
{
    let mut strangers = 0;
    let accepted = loop {
        let (stream, _) = pending
            .listener
            .accept()
            .await
            .map_err(|error| format!("failed to accept on the helper's socket: {error}"))?;
        let expected = expected_pid().await?;
        // Asked after the engine named the helper's pid: a peer still running with that pid
        // is the helper (a live process's pid is its own).
        let peer = live_peer(&stream)?;
        match peer {
            Some(pid) if pid == expected => break stream,
            peer => {
                strangers += 1;
                tracing::warn!(
                    ?peer,
                    expected,
                    "docker: dropped a connection to the helper's socket from a process that is not the helper"
                );
                if strangers >= MAX_STRANGERS {
                    return Err(format!(
                        "{strangers} connections to the helper's socket came from other processes than the helper (pid {expected} as the engine reports it; the last was {peer:?}): the engine may run in another pid namespace"
                    ));
                }
            }
        }
    };
    drop(pending);
    Ok(accepted)
}

/// The pid (as this machine sees it) of the process at the other end of `stream` while that
/// process still runs; `None` once it ended. The pid `SO_PEERCRED` reports is the one the
/// process had when it connected: a process can connect, hand its end to a child and exit,
/// and once the kernel gives its pid to a later process (a pid space of 32768 wraps in
/// seconds) that number would pass for the later one's. A pidfd of the peer tells whether
/// that same process still runs. A kernel without `SO_PEERPIDFD` (before Linux 6.5) cannot
/// tell, and the socket is given up.
fn live_peer(stream: &UnixStream) -> Result<Option<i64>, String> {
    use nix::sys::socket::{getsockopt, sockopt::PeerPidfd};
    use std::os::fd::AsRawFd;
    let pidfd = match getsockopt(stream, PeerPidfd) {
        Ok(pidfd) => pidfd,
        Err(nix::errno::Errno::ESRCH) => return Ok(None),
        Err(nix::errno::Errno::ENOPROTOOPT) => {
            return Err(
                "this kernel cannot tell whether the process that connected to the \
                 helper's socket still runs (SO_PEERPIDFD, Linux 6.5): a pid reused by another \
                 process could pass for the helper's"
                    .to_owned(),
            );
        }
        Err(error) => return Err(format!("failed to read the helper socket's peer: {error}")),
    };
    let path = format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd());
    let info = std::fs::read_to_string(&path)
        .map_err(|error| format!("failed to read {path}: {error}"))?;
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|value| value.trim().parse::<i64>().ok())
        .ok_or_else(|| format!("{path} names no pid"))?;
    // -1: the process ended (0: it runs in a pid namespace this machine's /proc cannot name).
    Ok((pid > 0).then_some(pid))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_directory_inside_a_root_the_container_writes_is_refused() {
        let temp = std::env::temp_dir();
        let error = HelperSockets::create(&[temp.as_path()]).expect_err("inside");
        assert!(
            error.to_string().contains("which the container can write"),
            "{error}"
        );
        let elsewhere = tempfile::tempdir().expect("a root elsewhere");
        let inside = elsewhere.path().join("ws");
        std::fs::create_dir(&inside).expect("mkdir");
        // A root the temporary directory is not in is no reason to refuse.
        HelperSockets::create(&[inside.as_path()]).expect("outside");
    }

    #[test]
    fn the_directory_is_private_and_the_mounted_one_reachable() {
        let sockets = HelperSockets::create(&[]).expect("create");
        let parent = sockets.dir().parent().expect("parent");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").mode() & 0o7777;
        assert_eq!(mode(parent), 0o700);
        assert_eq!(mode(sockets.dir()), 0o755);
    }

    #[tokio::test]
    async fn only_the_expected_process_is_accepted_and_the_socket_is_removed() {
        let sockets = HelperSockets::create(&[]).expect("create");
        let pending = sockets.listen().expect("listen");
        let path = pending.host_path.clone();
        assert!(pending.container_path.starts_with(SOCKET_DIR));
        assert_eq!(
            std::fs::metadata(&path).expect("socket").mode() & 0o777,
            0o666
        );
        // A stranger connects first: this process, while the expected pid is another one
        // for the first connection and this one for the second.
        let calls = std::sync::Arc::new(AtomicU64::new(0));
        let me = i64::from(std::process::id());
        let stranger = UnixStream::connect(&path).await.expect("stranger");
        let helper = UnixStream::connect(&path).await.expect("helper");
        let counted = std::sync::Arc::clone(&calls);
        let accepted = accept_helper(pending, move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move { Ok(if n == 0 { me + 1 } else { me }) }
        })
        .await
        .expect("accepted");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(
            !path.exists(),
            "the socket is removed once the helper is in"
        );
        // The stranger was dropped: it reads the end; the accepted one is the helper's.
        let mut buf = [0u8; 1];
        stranger.readable().await.expect("readable");
        assert_eq!(stranger.try_read(&mut buf).expect("read"), 0);
        accepted.try_write(b"x").expect("write");
        helper.readable().await.expect("readable");
        assert_eq!(helper.try_read(&mut buf).expect("read"), 1);
    }

    /// A connection made by a process that has ended, `child`: its end is held by this
    /// process (the way a model's process hands it to one that outlives it).
    #[allow(unsafe_code)]
    pub(crate) fn connect_from_an_ended_process(path: &Path) -> (std::os::fd::OwnedFd, i64) {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
        use nix::sys::wait::{WaitStatus, waitpid};
        use nix::unistd::{ForkResult, fork};
        use std::os::fd::AsRawFd;
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        let address = UnixAddr::new(path).expect("address");
        // SAFETY: the child only calls connect(2) and _exit(2), both async-signal-safe, on
        // values made before the fork.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let status = i32::from(connect(fd.as_raw_fd(), &address).is_err());
                // SAFETY: ends the child at once, running nothing of the parent's.
                unsafe { libc::_exit(status) }
            }
            ForkResult::Parent { child } => {
                assert_eq!(
                    waitpid(child, None).expect("wait"),
                    WaitStatus::Exited(child, 0),
                    "the child connects"
                );
                (fd, i64::from(child.as_raw()))
            }
        }
    }

    #[tokio::test]
    async fn a_process_that_ended_is_not_the_helper_even_when_its_pid_is_the_helpers_now() {
        let sockets = HelperSockets::create(&[]).expect("create");
        let pending = sockets.listen().expect("listen");
        let path = pending.host_path.clone();
        // The kernel may hand the ended child's pid to the next process, the helper: the
        // engine then reports that number for the helper.
        let (_held, ended) = connect_from_an_ended_process(&path);
        let mut live = Vec::new();
        for _ in 1..MAX_STRANGERS {
            live.push(UnixStream::connect(&path).await.expect("connect"));
        }
        let error = accept_helper(pending, move || async move { Ok(ended) })
            .await
            .expect_err("the ended process's connection is not the helper's");
        assert!(error.contains("other processes than the helper"), "{error}");
    }

    #[tokio::test]
    async fn the_peer_is_named_only_while_it_runs() {
        let sockets = HelperSockets::create(&[]).expect("create");
        let pending = sockets.listen().expect("listen");
        let (held, _) = connect_from_an_ended_process(&pending.host_path);
        let mine = UnixStream::connect(&pending.host_path).await.expect("mine");
        let (first, _) = pending.listener.accept().await.expect("accept");
        let (second, _) = pending.listener.accept().await.expect("accept");
        assert_eq!(live_peer(&first).expect("peer"), None);
        assert_eq!(
            live_peer(&second).expect("peer"),
            Some(i64::from(std::process::id()))
        );
        drop((held, mine));
    }

    #[test]
    fn the_socket_mode_is_never_set_through_a_link() {
        let dir = tempfile::tempdir().expect("dir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "key").expect("write");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("mode");
        let link = dir.path().join("helper-1.sock");
        std::os::unix::fs::symlink(&secret, &link).expect("link");
        let_anyone_connect(&link).expect_err("a link is not a socket to open up");
        let mode = std::fs::metadata(&secret).expect("stat").mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[tokio::test]
    async fn too_many_strangers_give_the_socket_up() {
        let sockets = HelperSockets::create(&[]).expect("create");
        let pending = sockets.listen().expect("listen");
        let path = pending.host_path.clone();
        let mut held = Vec::new();
        for _ in 0..MAX_STRANGERS {
            held.push(UnixStream::connect(&path).await.expect("connect"));
        }
        let error = accept_helper(pending, || async { Ok(-1) })
            .await
            .expect_err("nobody is the helper");
        assert!(error.contains("other processes than the helper"), "{error}");
        assert!(!path.exists());
        sockets.give_up(&error);
        sockets.give_up("a later reason");
        assert!(!sockets.in_use());
        assert_eq!(sockets.given_up().as_deref(), Some(error.as_str()));
    }
}
