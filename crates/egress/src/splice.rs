//! Zero-copy relay for sockets: `splice(2)` through a pipe per direction, so relayed bytes
//! never enter user space. On loopback a proxy that copies through buffers moves every byte
//! twice more than a direct connection; splicing keeps the proxy near the direct rate. Used
//! for TCP and Unix clients to a TCP destination; other streams take the copying relay.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{OFlag, SpliceFFlags, splice};
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// Bytes moved per `splice` call, and the pipe size asked for: fewer, larger moves. A pipe
/// holds 64 KiB by default; 1 MiB is the default system maximum (`fs.pipe-max-size`).
const CHUNK: usize = 1024 * 1024;

/// A socket tokio drives that can be spliced from and to.
pub(crate) trait SpliceSocket: AsFd {
    async fn ready_for(&self, interest: Interest) -> io::Result<()>;
    fn try_io_with<R>(
        &self,
        interest: Interest,
        f: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R>;

    /// End the write side (the peer reads EOF), the same for every socket.
    fn shutdown_write(&self) -> io::Result<()> {
        nix::sys::socket::shutdown(self.as_fd().as_raw_fd(), nix::sys::socket::Shutdown::Write)
            .map_err(io::Error::from)
    }
}

impl SpliceSocket for TcpStream {
    async fn ready_for(&self, interest: Interest) -> io::Result<()> {
        self.ready(interest).await.map(|_| ())
    }

    fn try_io_with<R>(
        &self,
        interest: Interest,
        f: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        self.try_io(interest, f)
    }
}

impl SpliceSocket for UnixStream {
    async fn ready_for(&self, interest: Interest) -> io::Result<()> {
        self.ready(interest).await.map(|_| ())
    }

    fn try_io_with<R>(
        &self,
        interest: Interest,
        f: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        self.try_io(interest, f)
    }
}

/// Relays both directions until both have ended or one fails. `up` and `down` count the bytes
/// client → upstream and upstream → client as they move, so they are right after an error too.
pub(crate) async fn relay<C: SpliceSocket>(
    client: &C,
    upstream: &TcpStream,
    up: &AtomicU64,
    down: &AtomicU64,
) -> io::Result<()> {
    tokio::try_join!(pump(client, upstream, up), pump(upstream, client, down)).map(|_| ())
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (out, into) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(io::Error::from)?;
    // A smaller pipe (a lower system maximum) only means smaller moves.
    let size = i32::try_from(CHUNK).unwrap_or(i32::MAX);
    if let Err(error) = nix::fcntl::fcntl(&into, nix::fcntl::FcntlArg::F_SETPIPE_SZ(size)) {
        tracing::debug!(%error, "egress proxy: pipe keeps its default size");
    }
    Ok((out, into))
}

async fn pump<F: SpliceSocket, T: SpliceSocket>(
    from: &F,
    to: &T,
    moved: &AtomicU64,
) -> io::Result<()> {
    let (pipe_out, pipe_in) = pipe()?;
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    loop {
        from.ready_for(Interest::READABLE).await?;
        let filled = match from.try_io_with(Interest::READABLE, || {
            splice(from.as_fd(), None, pipe_in.as_fd(), None, CHUNK, flags).map_err(io::Error::from)
        }) {
            Ok(0) => {
                // The sender is done: pass the end on, as a half-close.
                return match to.shutdown_write() {
                    Ok(()) => Ok(()),
                    Err(error) if error.kind() == io::ErrorKind::NotConnected => Ok(()),
                    Err(error) => Err(error),
                };
            }
            Ok(n) => n,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        };
        let mut left = filled;
        while left > 0 {
            to.ready_for(Interest::WRITABLE).await?;
            match to.try_io_with(Interest::WRITABLE, || {
                splice(pipe_out.as_fd(), None, to.as_fd(), None, left, flags)
                    .map_err(io::Error::from)
            }) {
                Ok(n) => {
                    left -= n;
                    moved.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Err(error),
            }
        }
    }
}

#[cfg(test)]
#[path = "splice_tests.rs"]
mod tests;
