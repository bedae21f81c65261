//! Throughput and per-connection latency of the egress proxy against a direct connection, on
//! loopback: `cargo run --release -p cordon-egress --example bench [GIB] [CONNECTIONS] [ROUNDS]
//! [PLACE]` (defaults: 1 GiB, 500 connections, 5 rounds, `together`).
//!
//! - PLACE `together`: client, proxy and origin share one process and its runtime;
//!   `apart`: the proxies run in a child process of their own (this program, started again),
//!   as a session's proxy runs apart from the command using it and the server it reaches.
//!   CPU times then add the child's to this process's.
//! - throughput: an origin writes GIB GiB and closes; the client reads it directly, then
//!   through a `CONNECT` tunnel relayed by `splice(2)` (a TCP client, what `serve_tcp` gets),
//!   then through one relayed by copying (a client stream of another type), then through a
//!   reference relay (no proxy, no runtime: a blocking thread per direction splicing through a
//!   1 MiB pipe, what a relay costs at least on this machine); ROUNDS interleaved
//!   rounds, median and best wall time and least CPU time (the whole process) of each;
//! - latency: an origin writes one byte and closes; the client opens a connection and reads to
//!   the end, directly and through `CONNECT` (and SOCKS5), CONNECTIONS times each, one at a time.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_egress::proxy::{EventSink, Limits, Proxy, ProxyConfig, StaticResolver};
use cordon_egress::rules::{EntrySpec, Rules};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const CHUNK: usize = 64 * 1024;

/// An origin that writes `bytes` bytes to every connection and closes it.
async fn origin(bytes: u64) -> u16 {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.expect("bind origin");
    let port = listener.local_addr().expect("origin address").port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let chunk = vec![0x5a_u8; CHUNK];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(CHUNK as u64) as usize;
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    port
}

/// A client stream the proxy cannot splice (not a socket type it knows): the copying relay.
struct Copying(TcpStream);

impl AsyncRead for Copying {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Copying {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// A proxy on its own port; `copying` makes it relay through buffers instead of `splice`.
async fn proxy(ports: &[u16], copying: bool) -> SocketAddr {
    let allow: Vec<_> = ports
        .iter()
        .flat_map(|port| [format!("bulk.test:{port}"), format!("127.0.0.1/32:{port}")])
        .map(|text| EntrySpec::new(text, "bench:1"))
        .collect();
    let (events, mut rx) = EventSink::channel(1024);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let config = ProxyConfig {
        session: "bench".into(),
        rules: Arc::new(Rules::compile(&allow, &[]).expect("rules")),
        resolver: Arc::new(StaticResolver::new([("bulk.test", vec![LOOPBACK])])),
        events,
        limits: Limits::default(),
    };
    let listener = TcpListener::bind((LOOPBACK, 0)).await.expect("bind proxy");
    let address = listener.local_addr().expect("proxy address");
    let proxy = Proxy::new(config);
    if copying {
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                stream.set_nodelay(true).expect("nodelay");
                let proxy = proxy.clone();
                tokio::spawn(async move { proxy.handle(Copying(stream)).await });
            }
        });
    } else {
        tokio::spawn(async move { proxy.serve_tcp(listener).await });
    }
    address
}

/// The reference relay: every connection to the returned address is relayed to the origin on
/// `port` by two blocking threads, each splicing one direction through a 1 MiB pipe (read a
/// pipe's worth, write it all, again). Nothing else: no requests, rules, events or runtime.
fn reference_relay(port: u16) -> SocketAddr {
    use nix::fcntl::{SpliceFFlags, splice};
    use std::os::fd::AsFd;
    fn pump(from: std::net::TcpStream, to: std::net::TcpStream) {
        let (out, into) = nix::unistd::pipe().expect("pipe");
        let _ = nix::fcntl::fcntl(&into, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
        let flags = SpliceFFlags::SPLICE_F_MOVE;
        loop {
            let Ok(n) = splice(from.as_fd(), None, into.as_fd(), None, 1 << 20, flags) else {
                return;
            };
            if n == 0 {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
            let mut left = n;
            while left > 0 {
                let Ok(n) = splice(out.as_fd(), None, to.as_fd(), None, left, flags) else {
                    return;
                };
                left -= n;
            }
        }
    }
    let listener = std::net::TcpListener::bind((LOOPBACK, 0)).expect("bind reference relay");
    let address = listener.local_addr().expect("reference relay address");
    std::thread::spawn(move || {
        while let Ok((client, _)) = listener.accept() {
            let Ok(upstream) = std::net::TcpStream::connect((LOOPBACK, port)) else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || pump(client, upstream));
            std::thread::spawn(move || pump(upstream2, client2));
        }
    });
    address
}

#[derive(Clone, Copy)]
enum Route {
    Direct,
    /// A plain relay to the bulk origin: connect and read, no request.
    Plain(SocketAddr),
    Connect(SocketAddr),
    Socks5(SocketAddr),
}

/// Opens a connection to the origin on `port` by `route`; returns the stream ready for data.
async fn open(route: Route, port: u16) -> TcpStream {
    match route {
        Route::Direct => {
            let stream = TcpStream::connect((LOOPBACK, port))
                .await
                .expect("connect origin");
            stream.set_nodelay(true).expect("nodelay");
            stream
        }
        Route::Plain(relay) => {
            let stream = TcpStream::connect(relay).await.expect("connect relay");
            stream.set_nodelay(true).expect("nodelay");
            stream
        }
        Route::Connect(proxy) => {
            let mut stream = TcpStream::connect(proxy).await.expect("connect proxy");
            stream.set_nodelay(true).expect("nodelay");
            let request =
                format!("CONNECT bulk.test:{port} HTTP/1.1\r\nHost: bulk.test:{port}\r\n\r\n");
            stream
                .write_all(request.as_bytes())
                .await
                .expect("send CONNECT");
            let mut reply = [0u8; 39];
            stream
                .read_exact(&mut reply)
                .await
                .expect("read CONNECT reply");
            assert_eq!(&reply, b"HTTP/1.1 200 Connection established\r\n\r\n");
            stream
        }
        Route::Socks5(proxy) => {
            let mut stream = TcpStream::connect(proxy).await.expect("connect proxy");
            stream.set_nodelay(true).expect("nodelay");
            let mut request = vec![5, 1, 0, 5, 1, 0, 3, 9];
            request.extend_from_slice(b"bulk.test");
            request.extend_from_slice(&port.to_be_bytes());
            stream.write_all(&request).await.expect("send SOCKS5");
            let mut reply = [0u8; 12];
            stream
                .read_exact(&mut reply)
                .await
                .expect("read SOCKS5 replies");
            assert_eq!(reply[..4], [5, 0, 5, 0]);
            stream
        }
    }
}

async fn drain(mut stream: TcpStream) -> u64 {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0;
    loop {
        match stream.read(&mut buf).await.expect("read") {
            0 => return total,
            n => total += n as u64,
        }
    }
}

/// The process running the proxies when they are apart, for its CPU time.
static PROXY_PROCESS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// CPU time (user + system) this process, and the proxies' process if apart, have used.
fn cpu_time() -> Duration {
    let child = PROXY_PROCESS.get().map_or(Duration::ZERO, |pid| {
        cpu_time_of(&format!("/proc/{pid}/stat"))
    });
    cpu_time_of("/proc/self/stat") + child
}

/// CPU time (user + system) from a `stat` file in /proc (clock ticks, 100 Hz).
fn cpu_time_of(path: &str) -> Duration {
    let stat = std::fs::read_to_string(path).expect("read a stat file in /proc");
    let after_name = &stat[stat.rfind(')').expect("stat has a name") + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// One transfer: wall time and the process's CPU time for it (client, proxy and origin).
async fn transfer(route: Route, port: u16, bytes: u64) -> (Duration, Duration) {
    let (started, cpu) = (Instant::now(), cpu_time());
    let got = drain(open(route, port).await).await;
    assert_eq!(got, bytes);
    (started.elapsed(), cpu_time() - cpu)
}

async fn latencies(route: Route, port: u16, count: usize) -> Vec<Duration> {
    let mut all = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        assert_eq!(drain(open(route, port).await).await, 1);
        all.push(started.elapsed());
    }
    all.sort();
    all
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The child's side of `apart`: the two proxies allowing `ports` and the reference relay to
/// the first, their addresses on stdout, served until stdin closes (the parent exits or drops
/// it).
async fn serve_proxies(ports: &[u16]) {
    let spliced = proxy(ports, false).await;
    let copying = proxy(ports, true).await;
    let reference = reference_relay(ports[0]);
    println!("{spliced} {copying} {reference}");
    let mut stdin = tokio::io::stdin();
    let mut sink = [0u8; 64];
    while !matches!(stdin.read(&mut sink).await, Ok(0) | Err(_)) {}
}

/// Starts the proxies in a child process; returns it (stdin held open) and the addresses of
/// the splicing and copying proxies and the reference relay.
async fn proxies_apart(
    ports: &[u16],
) -> (tokio::process::Child, SocketAddr, SocketAddr, SocketAddr) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("own path"))
        .arg("serve-proxies")
        .args(ports.iter().map(u16::to_string))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the proxies' process");
    let stdout = child.stdout.take().expect("its stdout");
    let mut line = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut line)
        .await
        .expect("read the proxies' addresses");
    let mut addresses = line
        .split_whitespace()
        .map(|a| a.parse().expect("an address"));
    let spliced = addresses.next().expect("the splicing proxy's address");
    let copying = addresses.next().expect("the copying proxy's address");
    let reference = addresses.next().expect("the reference relay's address");
    PROXY_PROCESS
        .set(child.id().expect("the child's id"))
        .expect("one proxies' process");
    (child, spliced, copying, reference)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("serve-proxies") {
        let ports: Vec<u16> = args.skip(1).map(|a| a.parse().expect("a port")).collect();
        serve_proxies(&ports).await;
        return;
    }
    let gib: u64 = args
        .next()
        .map_or(1, |a| a.parse().expect("GIB is a number"));
    let count: usize = args
        .next()
        .map_or(500, |a| a.parse().expect("CONNECTIONS is a number"));
    let rounds: usize = args
        .next()
        .map_or(5, |a| a.parse().expect("ROUNDS is a number"))
        .max(1);
    let apart = match args.next().as_deref() {
        None | Some("together") => false,
        Some("apart") => true,
        Some(other) => panic!("PLACE is `together` or `apart`, not {other:?}"),
    };
    let bytes = gib << 30;
    let bulk = origin(bytes).await;
    let tiny = origin(1).await;
    let (_child, proxy_addr, copying, reference) = if apart {
        let (child, spliced, copying, reference) = proxies_apart(&[bulk, tiny]).await;
        (Some(child), spliced, copying, reference)
    } else {
        let spliced = proxy(&[bulk, tiny], false).await;
        let copying = proxy(&[bulk, tiny], true).await;
        (None, spliced, copying, reference_relay(bulk))
    };
    println!(
        "proxies {}",
        if apart {
            "in a process of their own"
        } else {
            "in this process"
        }
    );

    // Rounds interleave the routes so that a change in the machine's load hits all of them;
    // each route reports its median and best wall time and its least CPU time.
    let routes = [
        ("direct", Route::Direct),
        ("CONNECT, splice", Route::Connect(proxy_addr)),
        ("CONNECT, copying", Route::Connect(copying)),
        ("reference relay", Route::Plain(reference)),
    ];
    let mut walls: [Vec<Duration>; 4] = Default::default();
    let mut cpus = [Duration::MAX; 4];
    for _ in 0..rounds {
        for ((samples, least), (_, route)) in walls.iter_mut().zip(cpus.iter_mut()).zip(routes) {
            let (wall, cpu) = transfer(route, bulk, bytes).await;
            samples.push(wall);
            *least = (*least).min(cpu);
        }
    }
    for samples in &mut walls {
        samples.sort();
    }
    let mib = |wall: Duration| bytes as f64 / wall.as_secs_f64() / (1 << 20) as f64;
    let median = |samples: &[Duration]| percentile(samples, 0.5);
    for ((name, _), (samples, cpu)) in routes.iter().zip(walls.iter().zip(cpus)) {
        println!(
            "throughput, {gib} GiB, {name}, {rounds} rounds: median {:.0} MiB/s ({:.2}x direct's \
             median), best {:.0} MiB/s ({:.2}x direct's best), least CPU {:.2} s per GiB",
            mib(median(samples)),
            mib(median(samples)) / mib(median(&walls[0])),
            mib(samples[0]),
            mib(samples[0]) / mib(walls[0][0]),
            cpu.as_secs_f64() / gib.max(1) as f64,
        );
    }
    let proxy = proxy_addr;

    // warm up both paths before timing connections
    latencies(Route::Direct, tiny, 50).await;
    latencies(Route::Connect(proxy), tiny, 50).await;
    let direct = latencies(Route::Direct, tiny, count).await;
    for (name, route) in [
        ("CONNECT", Route::Connect(proxy)),
        ("SOCKS5", Route::Socks5(proxy)),
    ] {
        let proxied = latencies(route, tiny, count).await;
        println!(
            "new connection ({count}x): direct p50 {:.0} µs p90 {:.0} µs p99 {:.0} µs; through \
             {name} p50 {:.0} µs p90 {:.0} µs p99 {:.0} µs; added p50 {:.0} µs",
            micros(percentile(&direct, 0.5)),
            micros(percentile(&direct, 0.9)),
            micros(percentile(&direct, 0.99)),
            micros(percentile(&proxied, 0.5)),
            micros(percentile(&proxied, 0.9)),
            micros(percentile(&proxied, 0.99)),
            micros(percentile(&proxied, 0.5)) - micros(percentile(&direct, 0.5)),
        );
    }
}
