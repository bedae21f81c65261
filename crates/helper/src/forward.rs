//! `cordon-helper forward`: the plumbing that brings an egress proxy on the other side of a
//! Unix socket into a sandbox without a network (a container started with `--network none`).
//!
//! It listens on `127.0.0.1:PORT` (the address the proxy environment variables of commands
//! name), and relays each accepted connection to a new connection to the Unix socket, both
//! ways, until both sides are done. It makes no decision: the proxy behind the socket reads
//! the request and allows or refuses it, so the forwarder is untrusted plumbing (a command
//! that kills it only loses its way out). It does not own the proxy, the socket or the policy.
//!
//! Once the listener is bound it prints [`READY`] and the bound address on stdout (one line),
//! so the starter knows the port is served (or, when the line never comes, that this binary
//! cannot run there). It exits when its standard input ends (the starter went away) or the
//! listener fails.
//!
//! Standard input (which only the starter holds) also carries the flush barrier that lets the
//! starter tell which command a connection belongs to: on a line `flush N` the forwarder
//! accepts every connection already waiting on its listener, connects each to the socket (so
//! each is queued there, in order, before anything the starter does next), and answers
//! `flushed N` on stdout; `flushed N unsure` when a connection made before the line may still
//! come later: a handshake to its port was under way when the line came (the client's
//! `connect` may have returned while the listener still waits for its last acknowledgement,
//! lost or not yet processed on the loopback device, and the connection is queued only once
//! a retransmission gets through), the network namespace's listen-drop or syncookie counters
//! moved since it started (a connection the kernel dropped for a full queue, or answered with
//! a cookie and kept no trace of), or either could not be read.
//! Every connection is connected to the socket before the next one is accepted, so one
//! accepted before the line is already there. Lines are at most [`MAX_LINE`] bytes; others
//! are ignored.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UnixStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

/// The start of the line printed on stdout once the listener is bound (the address follows
/// after a space).
pub const READY: &str = "cordon-forward ready";

/// The barrier request on stdin: `flush N` (N a decimal `u64`).
pub const FLUSH: &str = "flush";
/// The barrier answer on stdout: `flushed N`, or `flushed N unsure` (see the module docs).
pub const FLUSHED: &str = "flushed";
/// The word after `flushed N` when a connection may have been dropped by the kernel.
pub const UNSURE: &str = "unsure";
/// Longest line read on stdin (longer ones are ignored).
pub const MAX_LINE: usize = 64;

/// Connections relayed at once by default; more are closed as soon as they are accepted.
pub const MAX_CONNECTIONS: usize = 256;

/// The listener's queue length asked of the kernel (it may cap it lower): a flush accepts at
/// most this many (and one more) connections, which is more than can be waiting.
pub const BACKLOG: u32 = 1024;

/// What [`run`] needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardConfig {
    /// The loopback port to listen on (0: any free port, named in the ready line).
    pub port: u16,
    /// The Unix socket each connection is relayed to.
    pub socket: PathBuf,
    /// Connections relayed at once.
    pub max_connections: usize,
}

impl ForwardConfig {
    /// `forward PORT SOCKET` as the program's words (without `forward`).
    pub fn from_args(port: &str, socket: &str) -> Result<ForwardConfig, String> {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{port}` is not a port (0-65535)"))?;
        let socket = PathBuf::from(socket);
        if !socket.is_absolute() {
            return Err(format!(
                "the socket `{}` is not an absolute path",
                socket.display()
            ));
        }
        Ok(ForwardConfig {
            port,
            socket,
            max_connections: MAX_CONNECTIONS,
        })
    }
}

/// Bind `127.0.0.1:PORT` ([`bind`]), then [`serve`] it until `control` ends (or the listener
/// fails). `ready` is called once the listener is bound.
pub async fn run(
    config: &ForwardConfig,
    ready: impl FnOnce(SocketAddr),
    control: impl AsyncRead + Unpin + Send + 'static,
    answers: impl AsyncWrite + Unpin,
) -> io::Result<()> {
    let listener = bind(config.port)?;
    ready(listener.local_addr()?);
    serve(
        listener,
        &config.socket,
        config.max_connections,
        control,
        answers,
    )
    .await
}

/// A listener on `127.0.0.1:port` with a queue of [`BACKLOG`].
pub fn bind(port: u16) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
    socket.listen(BACKLOG)
}

/// A line read on the control input.
#[derive(Debug, PartialEq, Eq)]
enum Control {
    Flush(u64),
    Other,
}

/// What a control line asks for.
fn parse_control(line: &[u8]) -> Control {
    let Ok(line) = std::str::from_utf8(line) else {
        return Control::Other;
    };
    match line.trim_end_matches('\r').split_once(' ') {
        Some((FLUSH, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            n.parse().map_or(Control::Other, Control::Flush)
        }
        _ => Control::Other,
    }
}

/// Read `control` line by line (each at most [`MAX_LINE`] bytes), sending what each asks for;
/// returns at its end (or a read error), which drops the sender.
async fn read_control(mut control: impl AsyncRead + Unpin, lines: mpsc::Sender<Control>) {
    let mut line = Vec::with_capacity(MAX_LINE);
    let mut overlong = false;
    let mut buf = [0u8; 256];
    loop {
        let n = match control.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        for &byte in &buf[..n] {
            if byte == b'\n' {
                let parsed = if overlong {
                    Control::Other
                } else {
                    parse_control(&line)
                };
                if lines.send(parsed).await.is_err() {
                    return;
                }
                line.clear();
                overlong = false;
            } else if line.len() < MAX_LINE {
                line.push(byte);
            } else {
                overlong = true;
            }
        }
    }
}

/// Relays connections to the socket, at most `permits` at once.
struct Relays {
    socket: Arc<Path>,
    permits: Arc<Semaphore>,
    max_connections: usize,
    running: JoinSet<()>,
}

impl Relays {
    /// Connect `stream` to the socket (before returning: it is then queued there) and relay it
    /// in the background; over the bound, or when the socket cannot be reached, it is closed.
    async fn take(&mut self, stream: TcpStream, peer: SocketAddr) {
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            tracing::warn!(%peer, max_connections = self.max_connections, "forward: too many connections, one closed");
            return;
        };
        let upstream = match UnixStream::connect(&*self.socket).await {
            Ok(upstream) => upstream,
            Err(error) => {
                tracing::warn!(socket = %self.socket.display(), %error, "forward: failed to connect the proxy socket");
                return;
            }
        };
        self.running.spawn(async move {
            if let Err(error) = relay(stream, upstream).await {
                tracing::debug!(%peer, %error, "forward: a relay ended with an error");
            }
            drop(permit);
        });
    }
}

/// Relay every connection accepted on `listener` to a new connection to `socket`, at most
/// `max_connections` at once (the ones over the bound are closed at once), and answer the
/// flush lines of `control` on `answers` (module docs). Returns when `control` ends, or when
/// accepting (or answering) fails for a reason that is not about one connection.
pub async fn serve(
    listener: TcpListener,
    socket: &Path,
    max_connections: usize,
    control: impl AsyncRead + Unpin + Send + 'static,
    mut answers: impl AsyncWrite + Unpin,
) -> io::Result<()> {
    // The same listening socket, accepted from without waiting: what a flush takes is what
    // the kernel holds at that moment, not what the runtime last heard of.
    let queue = std::net::TcpListener::from(listener.as_fd().try_clone_to_owned()?);
    queue.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let drops_at_start = listen_drops();
    let mut relays = Relays {
        socket: Arc::from(socket),
        permits: Arc::new(Semaphore::new(max_connections.max(1))),
        max_connections,
        running: JoinSet::new(),
    };
    let (lines_tx, mut lines) = mpsc::channel(4);
    let mut reader = JoinSet::new();
    reader.spawn(read_control(control, lines_tx));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => relays.take(stream, peer).await,
                Err(error) if per_connection(&error) => {
                    tracing::debug!(%error, "forward: one connection failed during accept");
                }
                Err(error) => {
                    tracing::warn!(%error, "forward: accept failed, stopping");
                    return Err(error);
                }
            },
            line = lines.recv() => match line {
                Some(Control::Flush(n)) => {
                    // Before the queue is taken: a handshake half-done now may be finished
                    // (and queued) while it is taken, or after.
                    let settled = handshakes_pending(port) == Some(false);
                    let complete = flush(&queue, &mut relays).await?;
                    let sure = settled
                        && complete
                        && drops_at_start.is_some()
                        && listen_drops() == drops_at_start;
                    let answer = if sure {
                        format!("{FLUSHED} {n}\n")
                    } else {
                        tracing::warn!(settled, complete, "forward: a connection may be left behind (a handshake not finished, out of descriptors, or the listen-drop or syncookie counters moved or cannot be read): flush answered unsure");
                        format!("{FLUSHED} {n} {UNSURE}\n")
                    };
                    answers.write_all(answer.as_bytes()).await?;
                    answers.flush().await?;
                }
                Some(Control::Other) => {
                    tracing::warn!("forward: an unknown control line, ignored");
                }
                None => {
                    tracing::debug!("forward: stopped by its starter");
                    return Ok(());
                }
            },
            Some(_) = relays.running.join_next(), if !relays.running.is_empty() => {}
        }
    }
}

/// Accept (without waiting) every connection waiting on `queue`, each connected to the socket
/// before the next is accepted. At most one more than [`BACKLOG`] (more than the queue held
/// when it started: later ones are not needed). `false` when one could not be accepted for
/// want of a descriptor (it is still waiting).
async fn flush(queue: &std::net::TcpListener, relays: &mut Relays) -> io::Result<bool> {
    for _ in 0..=BACKLOG {
        match queue.accept() {
            Ok((stream, peer)) => {
                stream.set_nonblocking(true)?;
                relays.take(TcpStream::from_std(stream)?, peer).await;
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(error) if error.raw_os_error() == Some(24) => return Ok(false),
            Err(error) if per_connection(&error) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(true)
}

/// The network namespace's `TcpExt` `ListenOverflows` and `ListenDrops` counters (connections
/// the kernel dropped because a listener's queue was full) and `SyncookiesSent` (handshakes
/// answered with a cookie and no waiting request, for a full queue: one whose last
/// acknowledgement is lost is not seen as under way), when `/proc/net/netstat` can be read.
fn listen_drops() -> Option<(u64, u64, u64)> {
    parse_listen_drops(&read_proc_net("/proc/net/netstat")?)
}

/// Most bytes of a `/proc/net` file read for a flush: `/proc/net/tcp` has a line (150 bytes)
/// per socket of the network namespace, and commands choose how many sockets there are.
const MAX_PROC_NET_BYTES: u64 = 16 << 20;

/// A kernel-written `/proc/net` file (the symlink `/proc/net` is the kernel's own), at most
/// [`MAX_PROC_NET_BYTES`]: `None` when it cannot be read or is longer, so the flush answers
/// `unsure` rather than reading without end.
fn read_proc_net(path: &str) -> Option<String> {
    read_at_most(Path::new(path), MAX_PROC_NET_BYTES)
}

/// The text of `path` when it has at most `limit` bytes.
fn read_at_most(path: &Path, limit: u64) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(limit + 1)
        .read_to_string(&mut text)
        .ok()?;
    (text.len() as u64 <= limit).then_some(text)
}

/// [`listen_drops`] from the text of `/proc/net/netstat` (pairs of lines: names, values).
fn parse_listen_drops(text: &str) -> Option<(u64, u64, u64)> {
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines.next()?;
        let (Some(names), Some(values)) = (
            names.strip_prefix("TcpExt:"),
            values.strip_prefix("TcpExt:"),
        ) else {
            continue;
        };
        let pairs: Vec<(&str, &str)> = names
            .split_whitespace()
            .zip(values.split_whitespace())
            .collect();
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .and_then(|(_, v)| v.parse().ok())
        };
        return Some((
            get("ListenOverflows")?,
            get("ListenDrops")?,
            get("SyncookiesSent")?,
        ));
    }
    None
}

/// Whether a TCP handshake to local port `port` is under way in this network namespace: a
/// request the listener has not turned into a connection in its accept queue yet (state
/// `SYN_RECV` in `/proc/net/tcp`), while the client may already count it as made (its last
/// acknowledgement lost, or not yet processed). `None` when the file cannot be read.
fn handshakes_pending(port: u16) -> Option<bool> {
    parse_handshakes_pending(&read_proc_net("/proc/net/tcp")?, port)
}

/// [`handshakes_pending`] from the text of `/proc/net/tcp` (a heading, then one socket a line:
/// number, `ADDRESS:PORT` local and remote in hexadecimal, state); `None` when a line cannot
/// be read.
fn parse_handshakes_pending(text: &str, port: u16) -> Option<bool> {
    /// The kernel's `TCP_SYN_RECV`.
    const SYN_RECV: &str = "03";
    let mut pending = false;
    for line in text.lines().skip(1) {
        let mut fields = line.split_whitespace();
        let (Some(_), Some(local), Some(_), Some(state)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        let (_, local_port) = local.rsplit_once(':')?;
        let local_port = u16::from_str_radix(local_port, 16).ok()?;
        pending |= local_port == port && state == SYN_RECV;
    }
    Some(pending)
}

/// Errors of `accept` that concern one connection (the listener still works).
fn per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || error.raw_os_error() == Some(24) // EMFILE: wait for a relay to end
}

/// One connection: copy both ways; each side's end is passed on as a half-close, and the relay
/// ends when both directions did or either failed (then both are closed).
async fn relay(mut client: TcpStream, mut upstream: UnixStream) -> io::Result<()> {
    client.set_nodelay(true)?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_a_port_and_an_absolute_socket_path() {
        assert_eq!(
            ForwardConfig::from_args("3128", "/run/e/proxy.sock"),
            Ok(ForwardConfig {
                port: 3128,
                socket: PathBuf::from("/run/e/proxy.sock"),
                max_connections: MAX_CONNECTIONS,
            })
        );
        assert_eq!(ForwardConfig::from_args("0", "/s").map(|c| c.port), Ok(0));
        assert!(ForwardConfig::from_args("70000", "/s").is_err());
        assert!(ForwardConfig::from_args("x", "/s").is_err());
        assert!(ForwardConfig::from_args("3128", "rel/s").is_err());
    }

    #[test]
    fn control_lines_are_flushes_with_a_number_or_nothing() {
        assert_eq!(parse_control(b"flush 7"), Control::Flush(7));
        assert_eq!(parse_control(b"flush 7\r"), Control::Flush(7));
        assert_eq!(
            parse_control(b"flush 18446744073709551615"),
            Control::Flush(u64::MAX)
        );
        for other in [
            &b"flush"[..],
            b"flush ",
            b"flush -1",
            b"flush 1 2",
            b"flush 18446744073709551616",
            b"flushed 1",
            b"\xff",
        ] {
            assert_eq!(parse_control(other), Control::Other, "{other:?}");
        }
    }

    #[test]
    fn listen_drops_are_read_from_the_tcp_extension_lines() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPHPHits\n\
                    TcpExt: 0 3 5 9\n\
                    IpExt: InNoRoutes\n\
                    IpExt: 0\n";
        assert_eq!(parse_listen_drops(text), Some((3, 5, 0)));
        assert_eq!(parse_listen_drops("IpExt: A\nIpExt: 1\n"), None);
        assert_eq!(
            parse_listen_drops("TcpExt: ListenOverflows ListenDrops\nTcpExt: 1 2\n"),
            None,
            "every counter is needed"
        );
        // Where this test runs, the file is there.
        assert!(listen_drops().is_some());
    }

    #[test]
    fn a_proc_net_file_longer_than_its_bound_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tcp");
        std::fs::write(&path, "x".repeat(101)).unwrap();
        assert_eq!(read_at_most(&path, 101).map(|t| t.len()), Some(101));
        assert_eq!(read_at_most(&path, 100), None);
        assert!(read_proc_net("/proc/net/tcp").is_some());
    }

    #[test]
    fn half_done_handshakes_are_requests_in_syn_recv_on_the_port() {
        let heading = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";
        let listening = "   0: 0100007F:0C38 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534 0 1 1 0 100 0 0 10 0\n";
        let request = "   1: 0100007F:0C38 0100007F:D2F0 03 00000000:00000000 02:000000C8 00000000 0 0 0 1 0\n";
        let elsewhere = "   2: 0100007F:1F90 0100007F:D2F2 03 00000000:00000000 02:000000C8 00000000 0 0 0 1 0\n";
        let made = "   3: 0100007F:0C38 0100007F:D2F4 01 00000000:00000000 00:00000000 00000000 65534 0 9 1 0 20 4 30 10 -1\n";
        let text = |lines: &[&str]| format!("{heading}{}", lines.concat());
        assert_eq!(
            parse_handshakes_pending(&text(&[listening, made, elsewhere]), 3128),
            Some(false)
        );
        assert_eq!(
            parse_handshakes_pending(&text(&[listening, request]), 3128),
            Some(true)
        );
        assert_eq!(
            parse_handshakes_pending(&text(&["   0: junk\n"]), 3128),
            None
        );
        assert_eq!(parse_handshakes_pending(heading, 3128), Some(false));
        // Where this test runs, the file is there.
        assert!(handshakes_pending(1).is_some());
    }

    /// A forwarder on a free port relaying to a socket nobody accepts on (what it connects
    /// stays queued there), driven through `control`, answering on `answers`.
    async fn forwarder() -> (
        SocketAddr,
        std::os::unix::net::UnixListener,
        tokio::io::DuplexStream,
        tokio::io::BufReader<tokio::io::DuplexStream>,
        tokio::task::JoinHandle<io::Result<()>>,
        tempfile::TempDir,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("proxy.sock");
        let upstream = std::os::unix::net::UnixListener::bind(&path).expect("bind socket");
        upstream.set_nonblocking(true).expect("nonblocking");
        let listener = bind(0).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (control, control_far) = tokio::io::duplex(1024);
        let (answers_far, answers) = tokio::io::duplex(1024);
        let served = tokio::spawn(async move {
            serve(listener, &path, MAX_CONNECTIONS, control_far, answers_far).await
        });
        (
            addr,
            upstream,
            control,
            tokio::io::BufReader::new(answers),
            served,
            dir,
        )
    }

    async fn answer(answers: &mut tokio::io::BufReader<tokio::io::DuplexStream>) -> String {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        answers.read_line(&mut line).await.expect("answer");
        line
    }

    /// Once `flushed N` is out, every connection made before `flush N` was sent is waiting on
    /// the socket, in the order made: what the starter accepts after its own marker behind
    /// them is nobody's.
    #[tokio::test]
    async fn a_flush_answers_once_every_waiting_connection_is_queued_at_the_socket() {
        let (addr, upstream, mut control, mut answers, served, _dir) = forwarder().await;
        let mut clients = Vec::new();
        for i in 0..20u8 {
            let mut client = TcpStream::connect(addr).await.expect("connect");
            client.write_all(&[i]).await.expect("write");
            clients.push(client);
        }
        control.write_all(b"flush 41\n").await.expect("flush");
        let line = answer(&mut answers).await;
        assert!(
            line == "flushed 41\n" || line == "flushed 41 unsure\n",
            "{line:?}"
        );
        for i in 0..20u8 {
            let (stream, _) = upstream.accept().expect("queued at the socket");
            stream.set_nonblocking(false).expect("blocking");
            let mut byte = [0u8; 1];
            std::io::Read::read_exact(&mut &stream, &mut byte).expect("relayed");
            assert_eq!(byte[0], i, "in the order made");
        }
        assert_eq!(
            upstream.accept().map_err(|e| e.kind()).err(),
            Some(io::ErrorKind::WouldBlock),
            "nothing else"
        );
        // Its end stops the forwarder.
        drop(control);
        served.await.expect("joined").expect("served");
    }

    /// A connection whose `connect` returned but whose handshake the listener has not finished
    /// (its request still waiting, not in the accept queue) cannot be flushed: it may be
    /// accepted after the answer, so the answer is unsure. The listener here defers accepting
    /// until data comes (`TCP_DEFER_ACCEPT`), which holds a handshake half-done on demand, as
    /// an acknowledgement lost on the loopback device does without moving any listen counter.
    #[tokio::test]
    #[allow(unsafe_code)]
    async fn a_handshake_the_listener_has_not_finished_makes_the_flush_unsure() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("proxy.sock");
        let upstream = std::os::unix::net::UnixListener::bind(&path).expect("bind socket");
        upstream.set_nonblocking(true).expect("nonblocking");
        let listener = bind(0).expect("bind");
        let seconds: libc::c_int = 30;
        // SAFETY: a valid descriptor and an int option of the right size.
        let set = unsafe {
            libc::setsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                std::ptr::from_ref(&seconds).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "TCP_DEFER_ACCEPT");
        let addr = listener.local_addr().expect("addr");
        let (mut control, control_far) = tokio::io::duplex(1024);
        let (answers_far, answers) = tokio::io::duplex(1024);
        let mut answers = tokio::io::BufReader::new(answers);
        let served = tokio::spawn(async move {
            serve(listener, &path, MAX_CONNECTIONS, control_far, answers_far).await
        });
        // Its connect returns: for the client the connection is made.
        let mut client = TcpStream::connect(addr).await.expect("connect");
        control.write_all(b"flush 1\n").await.expect("flush");
        assert_eq!(answer(&mut answers).await, "flushed 1 unsure\n");
        assert_eq!(
            upstream.accept().map_err(|e| e.kind()).err(),
            Some(io::ErrorKind::WouldBlock),
            "nothing was passed on"
        );
        // It comes after the answer.
        client.write_all(b"x").await.expect("write");
        upstream.set_nonblocking(false).expect("blocking");
        let byte = tokio::task::spawn_blocking(move || {
            let (stream, _) = upstream.accept().expect("passed on after the flush");
            let mut byte = [0u8; 1];
            std::io::Read::read_exact(&mut &stream, &mut byte).expect("relayed");
            byte
        })
        .await
        .expect("joined");
        assert_eq!(&byte, b"x");
        drop(control);
        served.await.expect("joined").expect("served");
    }

    #[tokio::test]
    async fn unknown_and_overlong_control_lines_are_ignored() {
        let (_addr, _upstream, mut control, mut answers, served, _dir) = forwarder().await;
        control
            .write_all(format!("hello\nflush {}\nflush 2\n", "9".repeat(MAX_LINE)).as_bytes())
            .await
            .expect("write");
        let line = answer(&mut answers).await;
        assert!(line.starts_with("flushed 2"), "{line:?}");
        drop(control);
        served.await.expect("joined").expect("served");
    }
}
