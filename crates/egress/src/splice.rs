//! Zero-copy relay for sockets: `splice(2)` through a pipe per direction, so relayed bytes
//! never enter user space. On loopback a proxy that copies through buffers moves every byte
//! twice more than a direct connection; splicing keeps the proxy near the direct rate. Used
//! for TCP and Unix clients to a TCP destination; other streams take the copying relay.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, SpliceFFlags, splice};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
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

/// What one move from the source into the pipe did.
enum Filled {
    /// This many bytes entered the pipe; 0 is the source's end.
    Moved(usize),
    /// The pipe has no room left: nothing was read (the source may well hold data).
    PipeFull,
}

/// Moves what the source holds into the pipe. `WouldBlock` means the source has nothing to
/// read, and only that (it clears the source's readiness): a full pipe also makes `splice`
/// answer `EAGAIN`, so that case is told apart by asking the pipe whether it has room.
fn fill(from: BorrowedFd<'_>, pipe_in: BorrowedFd<'_>) -> io::Result<Filled> {
    match splice(from, None, pipe_in, None, CHUNK, FLAGS) {
        Ok(n) => Ok(Filled::Moved(n)),
        Err(Errno::EAGAIN) => {
            let mut fds = [PollFd::new(pipe_in, PollFlags::POLLOUT)];
            poll(&mut fds, PollTimeout::ZERO).map_err(io::Error::from)?;
            let room = fds[0]
                .revents()
                .is_some_and(|events| events.contains(PollFlags::POLLOUT));
            if room {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(Filled::PipeFull)
            }
        }
        Err(errno) => Err(errno.into()),
    }
}

const FLAGS: SpliceFFlags = SpliceFFlags::SPLICE_F_MOVE.union(SpliceFFlags::SPLICE_F_NONBLOCK);

/// One direction. Both halves run whenever they can: the source is read into the pipe while
/// the pipe has room (also while the destination is blocked), and the pipe is written to the
/// destination while it holds bytes (also while the source is idle), so a slow side never
/// stops the other one. When the source ends and the pipe is empty, the destination's write
/// side is shut down (a half-close). `moved` counts the bytes written to the destination.
async fn pump<F: SpliceSocket, T: SpliceSocket>(
    from: &F,
    to: &T,
    moved: &AtomicU64,
) -> io::Result<()> {
    let (pipe_out, pipe_in) = pipe()?;
    // Bytes read into the pipe and not yet written out: the pipe is never written to or read
    // from by anyone else, so this is exact.
    let mut held = 0usize;
    // The source has ended (read 0).
    let mut ended = false;
    // The last read found the pipe without room; cleared by the next write out of it.
    let mut full = false;
    loop {
        let reading = !ended && !full;
        if !reading && held == 0 {
            // Ended and all passed on: pass the end on, as a half-close.
            return match to.shutdown_write() {
                Ok(()) => Ok(()),
                Err(error) if error.kind() == io::ErrorKind::NotConnected => Ok(()),
                Err(error) => Err(error),
            };
        }
        // Returns at once when a side's readiness is already known; otherwise waits for the
        // first of the two (awaiting here also lets tokio's budget make a busy relay yield).
        tokio::select! {
            ready = from.ready_for(Interest::READABLE), if reading => ready?,
            ready = to.ready_for(Interest::WRITABLE), if held > 0 => ready?,
        }
        if reading {
            match from.try_io_with(Interest::READABLE, || fill(from.as_fd(), pipe_in.as_fd())) {
                Ok(Filled::Moved(0)) => ended = true,
                Ok(Filled::Moved(n)) => held += n,
                Ok(Filled::PipeFull) => full = true,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
        if held > 0 {
            match to.try_io_with(Interest::WRITABLE, || {
                splice(pipe_out.as_fd(), None, to.as_fd(), None, held, FLAGS)
                    .map_err(io::Error::from)
            }) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "splice moved nothing out of a pipe holding bytes",
                    ));
                }
                Ok(n) => {
                    held -= n;
                    full = false;
                    moved.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
    }
}

#[cfg(test)]
#[path = "splice_tests.rs"]
mod tests;
