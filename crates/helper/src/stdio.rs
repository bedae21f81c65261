//! The stream `cordon-helper serve` answers on: its stdin and stdout. When they are pipes (an
//! SSH exec channel, a `docker exec`, a child of a local client) they are read and written
//! through the runtime's reactor, in non-blocking mode. Tokio's own stdin and stdout hand
//! every read and every write to a blocking thread, two thread hand-offs per round trip that
//! a loaded machine turns into tens of microseconds each. Anything else (a terminal, a file, a
//! socket) keeps tokio's stdio, and so does a pipe that is also stderr (`2>&1`): switching it
//! to non-blocking mode would make the log's writes fail when the pipe is full.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

/// The helper's input.
pub(crate) type Reader = Box<dyn AsyncRead + Unpin + Send>;
/// The helper's output.
pub(crate) type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// stdin and stdout as the helper's stream. Must run inside the runtime (the pipes register
/// with its reactor).
pub(crate) fn streams() -> (Reader, Writer) {
    let stderr = io::stderr();
    let reader = match reactor_pipe(io::stdin().as_fd(), stderr.as_fd()) {
        Ok(Some(fd)) => pipe::Receiver::from_file(fd).map(|r| Box::new(r) as Reader),
        Ok(None) => Ok(Box::new(tokio::io::stdin()) as Reader),
        Err(error) => Err(error),
    };
    let reader = reader.unwrap_or_else(|error| {
        tracing::debug!(%error, "helper: stdin is read through a thread");
        Box::new(tokio::io::stdin())
    });
    let writer = match reactor_pipe(io::stdout().as_fd(), stderr.as_fd()) {
        Ok(Some(fd)) => pipe::Sender::from_file(fd).map(|w| Box::new(w) as Writer),
        Ok(None) => Ok(Box::new(tokio::io::stdout()) as Writer),
        Err(error) => Err(error),
    };
    let writer = writer.unwrap_or_else(|error| {
        tracing::debug!(%error, "helper: stdout is written through a thread");
        Box::new(tokio::io::stdout())
    });
    (reader, writer)
}

/// A duplicate of `fd` when it is a pipe that is not also `stderr`; `None` for anything the
/// reactor should not drive.
pub(crate) fn reactor_pipe(fd: BorrowedFd<'_>, stderr: BorrowedFd<'_>) -> io::Result<Option<File>> {
    let file = File::from(fd.try_clone_to_owned()?);
    let meta = file.metadata()?;
    if !meta.file_type().is_fifo() {
        return Ok(None);
    }
    // A closed or unreadable stderr cannot be the same pipe.
    let shared = File::from(stderr.try_clone_to_owned()?)
        .metadata()
        .is_ok_and(|err| err.dev() == meta.dev() && err.ino() == meta.ino());
    Ok((!shared).then_some(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pipe_pair() -> (OwnedFd, OwnedFd) {
        let (reader, writer) = io::pipe().expect("pipe");
        (reader.into(), writer.into())
    }

    #[test]
    fn a_pipe_goes_to_the_reactor_but_not_one_shared_with_stderr() {
        let (read, write) = pipe_pair();
        let (_, other_write) = pipe_pair();
        assert!(
            reactor_pipe(read.as_fd(), other_write.as_fd())
                .expect("stat")
                .is_some()
        );
        assert!(
            reactor_pipe(write.as_fd(), other_write.as_fd())
                .expect("stat")
                .is_some()
        );
        // stdout and stderr on one pipe (`2>&1`), even through another descriptor.
        let dup = write.try_clone().expect("dup");
        assert!(
            reactor_pipe(write.as_fd(), dup.as_fd())
                .expect("stat")
                .is_none()
        );
    }

    #[test]
    fn a_file_or_a_socket_keeps_the_blocking_stdio() {
        let (_, stderr) = pipe_pair();
        let file = tempfile::tempfile().expect("temp file");
        assert!(
            reactor_pipe(file.as_fd(), stderr.as_fd())
                .expect("stat")
                .is_none()
        );
        let (socket, _peer) = std::os::unix::net::UnixStream::pair().expect("socket pair");
        assert!(
            reactor_pipe(socket.as_fd(), stderr.as_fd())
                .expect("stat")
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_reactor_pipe_carries_bytes_both_ways() {
        let (_, stderr) = pipe_pair();
        let (read, mut feed) = io::pipe().expect("pipe");
        let (mut drain, write) = io::pipe().expect("pipe");
        let read = reactor_pipe(read.as_fd(), stderr.as_fd())
            .expect("stat")
            .expect("a pipe");
        let write = reactor_pipe(write.as_fd(), stderr.as_fd())
            .expect("stat")
            .expect("a pipe");
        let mut reader = pipe::Receiver::from_file(read).expect("receiver");
        let mut writer = pipe::Sender::from_file(write).expect("sender");
        feed.write_all(b"ping").expect("feed");
        let mut got = [0u8; 4];
        reader.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"ping");
        writer.write_all(b"pong").await.expect("write");
        let mut back = [0u8; 4];
        drain.read_exact(&mut back).expect("drain");
        assert_eq!(&back, b"pong");
    }
}
