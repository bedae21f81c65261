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
//!   1 MiB pipe, what a relay in user space costs at least on this machine), then through a
//!   kernel relay (BPF socket redirection: no process touches the bytes; `kernel_relay.rs`,
//!   left out with a note on stderr where BPF is not allowed); ROUNDS interleaved
//!   rounds, median and best wall time and least CPU time (the whole process) of each;
//! - latency: an origin writes one byte and closes; the client opens a connection and reads to
//!   the end, directly and through `CONNECT` (and SOCKS5), CONNECTIONS times each, one at a time.
//!
//! With real clients: `bench CLIENT [GIB] [ROUNDS] [CORDON]`, CLIENT `curl`, `python` or
//! `curl-https`
//! (defaults: 1 GiB, 5 rounds, CORDON the `cordon` binary next to this example's directory,
//! i.e. `target/release/cordon`). An HTTP origin on 127.0.0.2 answers every request with a
//! `Content-Length` of GIB GiB and that body; the client, an unmodified `curl` (or a
//! `python3` urllib script reading 64 KiB at a time, as `shutil.copyfileobj` does), fetches it
//! to nothing, each time a new process, by these routes:
//!
//! - `direct`: no proxy;
//! - `CONNECT` (curl only): through the splicing proxy in a process of its own
//!   (`--proxytunnel -x`);
//! - `forward`: the same proxy as plain-HTTP forward proxy, by `http_proxy` in the client's
//!   environment (what a sandboxed command gets for an `http://` URL);
//! - `sandbox`: `cordon exec bash` on the local backend in filtered network mode, with a
//!   policy allowing only the origin's address and port: the command gets `HTTP_PROXY` from
//!   Cordon and reaches the origin through Cordon's own egress proxy, in the `cordon` process;
//! - `reference relay`: the client asks the reference relay (above, in the proxy's process)
//!   as if it were the origin: what a relay costs at least, no proxy protocol at all;
//! - `kernel relay`: the same with the kernel relay (where BPF is allowed).
//!
//! `curl-https` fetches `https://` from a TLS origin instead (rustls, a self-signed
//! certificate made by `openssl` for 127.0.0.2, which curl is told to trust): the TLS stream
//! runs end to end, through the proxies as a `CONNECT` tunnel (the sandbox's command gets
//! `HTTPS_PROXY`), so there is no `forward` route; the reference relay is reached with
//! `--connect-to`.
//!
//! Throughput is the client's own timing (curl's `time_total`; the script's clock around
//! opening and reading), so the sandbox's start-up is not in it; the wall time of the whole
//! client process (`cordon exec` included) is reported beside it. Rounds interleave the
//! routes, each round starting at the next route. CPU time adds this process (the origin),
//! the proxy's process, and every process waited for (the clients, `cordon exec` and what it
//! waited for).

mod kernel_relay;

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
                if write_body(&mut stream, bytes).await.is_ok() {
                    let _ = stream.shutdown().await;
                }
            });
        }
    });
    port
}

/// Writes `bytes` bytes to `stream`, `CHUNK` at a time.
async fn write_body(stream: &mut TcpStream, bytes: u64) -> std::io::Result<()> {
    let chunk = vec![0x5a_u8; CHUNK];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        stream.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    Ok(())
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
        .flat_map(|port| [format!("bulk.test:{port}"), format!("127.0.0.0/8:{port}")])
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

/// The reference relay: every connection to the returned address is relayed to the origin at
/// `origin` by two blocking threads, each splicing one direction through a 1 MiB pipe (read a
/// pipe's worth, write it all, again). Nothing else: no requests, rules, events or runtime.
fn reference_relay(origin: SocketAddr) -> SocketAddr {
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
            let Ok(upstream) = std::net::TcpStream::connect(origin) else {
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
    stat_ticks(path, 11) + stat_ticks(path, 12)
}

/// CPU time (user + system) of this process's children it has waited for.
fn waited_children_cpu() -> Duration {
    stat_ticks("/proc/self/stat", 13) + stat_ticks("/proc/self/stat", 14)
}

/// A field of a `stat` file in /proc counting clock ticks (100 Hz), by its index after the
/// process's name (11 `utime`, 12 `stime`, 13 `cutime`, 14 `cstime`).
fn stat_ticks(path: &str, field: usize) -> Duration {
    let stat = std::fs::read_to_string(path).expect("read a stat file in /proc");
    let after_name = &stat[stat.rfind(')').expect("stat has a name") + 2..];
    let ticks: u64 = after_name
        .split(' ')
        .nth(field)
        .and_then(|text| text.parse().ok())
        .expect("a tick count");
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
/// the first on `origin`, their addresses on stdout, served until stdin closes (the parent
/// exits or drops it).
async fn serve_proxies(origin: IpAddr, ports: &[u16]) {
    let spliced = proxy(ports, false).await;
    let copying = proxy(ports, true).await;
    let reference = reference_relay(SocketAddr::new(origin, ports[0]));
    let kernel = kernel_relay_or_why(SocketAddr::new(origin, ports[0]))
        .map_or_else(|| "-".to_owned(), |address| address.to_string());
    println!("{spliced} {copying} {reference} {kernel}");
    let mut stdin = tokio::io::stdin();
    let mut sink = [0u8; 64];
    while !matches!(stdin.read(&mut sink).await, Ok(0) | Err(_)) {}
}

/// The kernel relay to `origin` (see `kernel_relay`), or `None` after saying on stderr why it
/// cannot run here (it needs BPF): its route is then left out of the results.
fn kernel_relay_or_why(origin: SocketAddr) -> Option<SocketAddr> {
    kernel_relay::start(origin)
        .inspect_err(|error| eprintln!("kernel relay unavailable, its route left out: {error}"))
        .ok()
}

/// The proxies and relays, and the process of their own serving them (`None`: this one).
struct Proxies {
    /// Held: the process is killed when this is dropped.
    _child: Option<tokio::process::Child>,
    spliced: SocketAddr,
    copying: SocketAddr,
    reference: SocketAddr,
    kernel: Option<SocketAddr>,
}

/// Starts the proxies in a child process (the reference and kernel relays to the first of
/// `ports` on `origin`); returns it (stdin held open) and their addresses.
async fn proxies_apart(origin: IpAddr, ports: &[u16]) -> Proxies {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("own path"))
        .arg("serve-proxies")
        .arg(origin.to_string())
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
    // Each address, or `-` for a relay that could not start there.
    let mut addresses = line
        .split_whitespace()
        .map(|a| (a != "-").then(|| a.parse().expect("an address")));
    let mut next = |what: &str| {
        addresses
            .next()
            .unwrap_or_else(|| panic!("{what}'s address"))
    };
    let spliced = next("the splicing proxy").expect("the splicing proxy's address");
    let copying = next("the copying proxy").expect("the copying proxy's address");
    let reference = next("the reference relay").expect("the reference relay's address");
    let kernel = next("the kernel relay");
    PROXY_PROCESS
        .set(child.id().expect("the child's id"))
        .expect("one proxies' process");
    Proxies {
        _child: Some(child),
        spliced,
        copying,
        reference,
        kernel,
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("serve-proxies") {
        let mut args = args.skip(1);
        let origin = args
            .next()
            .and_then(|a| a.parse().ok())
            .expect("the origin's address");
        let ports: Vec<u16> = args.map(|a| a.parse().expect("a port")).collect();
        serve_proxies(origin, &ports).await;
        return;
    }
    let client = match args.peek().map(String::as_str) {
        Some("curl") => Some(Client::Curl),
        Some("python") => Some(Client::Python),
        Some("curl-https") => Some(Client::CurlHttps),
        _ => None,
    };
    if let Some(client) = client {
        let rest: Vec<String> = args.skip(1).collect();
        return real_clients(client, &rest).await;
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
    let proxies = if apart {
        proxies_apart(LOOPBACK, &[bulk, tiny]).await
    } else {
        let origin = SocketAddr::new(LOOPBACK, bulk);
        Proxies {
            _child: None,
            spliced: proxy(&[bulk, tiny], false).await,
            copying: proxy(&[bulk, tiny], true).await,
            reference: reference_relay(origin),
            kernel: kernel_relay_or_why(origin),
        }
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
    let mut routes = vec![
        ("direct", Route::Direct),
        ("CONNECT, splice", Route::Connect(proxies.spliced)),
        ("CONNECT, copying", Route::Connect(proxies.copying)),
        ("reference relay", Route::Plain(proxies.reference)),
    ];
    if let Some(kernel) = proxies.kernel {
        routes.push(("kernel relay", Route::Plain(kernel)));
    }
    let mut walls: Vec<Vec<Duration>> = vec![Vec::new(); routes.len()];
    let mut cpus = vec![Duration::MAX; routes.len()];
    for _ in 0..rounds {
        for ((samples, least), &(_, route)) in walls.iter_mut().zip(cpus.iter_mut()).zip(&routes) {
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
    for ((name, _), (samples, cpu)) in routes.iter().zip(walls.iter().zip(cpus.iter())) {
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
    let proxy = proxies.spliced;

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

/// Where the HTTP origin for real clients listens: not 127.0.0.1, which a sandboxed command's
/// `NO_PROXY` names (the client would look for the origin in the sandbox's own network).
const HTTP_ORIGIN: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// Largest request head the HTTP origin reads before it gives up on a connection.
const MAX_HEAD: usize = 64 * 1024;
/// The proxy variables a client could inherit from the environment this runs in.
const PROXY_VARIABLES: [&str; 8] = [
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
];

#[derive(Clone, Copy, PartialEq)]
enum Client {
    Curl,
    Python,
    /// `curl` fetching `https://`: the origin speaks TLS, so every route carries it end to end
    /// (through the proxies as a `CONNECT` tunnel).
    CurlHttps,
}

#[derive(Clone, Copy)]
enum HttpRoute {
    Direct,
    /// A `CONNECT` tunnel through the proxy at this address.
    Connect(SocketAddr),
    /// Plain-HTTP forward proxying by the proxy at this address, named in `http_proxy`.
    Forward(SocketAddr),
    /// `cordon exec bash` in filtered network mode.
    Sandbox,
    /// The reference relay at this address, asked as if it were the origin.
    Relay(SocketAddr),
}

/// An HTTP origin on [`HTTP_ORIGIN`]: whatever a connection asks, it gets `200` with a
/// `Content-Length` of `bytes`, that many bytes, and the end of the connection.
async fn http_origin(bytes: u64) -> u16 {
    let listener = TcpListener::bind((HTTP_ORIGIN, 0))
        .await
        .expect("bind the HTTP origin on 127.0.0.2");
    let port = listener.local_addr().expect("origin address").port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                // The request head, to its blank line; what it asks for does not matter.
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                    if head.len() > MAX_HEAD {
                        return;
                    }
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                     Content-Length: {bytes}\r\nConnection: close\r\n\r\n"
                );
                if stream.write_all(reply.as_bytes()).await.is_ok()
                    && write_body(&mut stream, bytes).await.is_ok()
                {
                    let _ = stream.shutdown().await;
                }
            });
        }
    });
    port
}

/// A TLS origin on [`HTTP_ORIGIN`], otherwise as [`http_origin`]: the certificate and key
/// (PEM) are `cert` and `key`; one blocking thread per connection, the body written a
/// [`CHUNK`] at a time through rustls.
fn https_origin(bytes: u64, cert: &std::path::Path, key: &std::path::Path) -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read, Write};

    let certs = CertificateDer::pem_file_iter(cert)
        .expect("read the certificate")
        .collect::<Result<Vec<_>, _>>()
        .expect("parse the certificate");
    let key = PrivateKeyDer::from_pem_file(key).expect("read the key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("the certificate and key"),
    );
    let listener =
        std::net::TcpListener::bind((HTTP_ORIGIN, 0)).expect("bind the HTTPS origin on 127.0.0.2");
    let port = listener.local_addr().expect("origin address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let config = Arc::clone(&config);
            std::thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let connection = rustls::ServerConnection::new(config).expect("a TLS session");
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                    if head.len() > MAX_HEAD {
                        return;
                    }
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                     Content-Length: {bytes}\r\nConnection: close\r\n\r\n"
                );
                if tls.write_all(reply.as_bytes()).is_err() {
                    return;
                }
                let chunk = vec![0x5a_u8; CHUNK];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(CHUNK as u64) as usize;
                    if tls.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                    left -= n as u64;
                }
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    port
}

/// A self-signed certificate for [`HTTP_ORIGIN`] and its key, made by the `openssl` command in
/// `dir`: (certificate, key).
fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("origin.pem"), dir.join("origin.key"));
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=127.0.0.2"])
        .args(["-addext", "subjectAltName=IP:127.0.0.2"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run openssl (needed for `curl-https`: a certificate for the origin)");
    assert!(
        status.success(),
        "openssl could not make a certificate: {status}"
    );
    (cert, key)
}

/// The shell command fetching `url` to nothing and printing the bytes read and the seconds the
/// client took (its own clock, from before connecting to the end of the body).
fn fetch_command(client: Client, url: &str, route: HttpRoute, tls: &Tls) -> String {
    match client {
        Client::Curl | Client::CurlHttps => {
            let mut options = match route {
                HttpRoute::Connect(proxy) => format!(" --proxytunnel -x http://{proxy}"),
                _ => String::new(),
            };
            if let Some(ca) = &tls.ca {
                options.push_str(&format!(" --cacert {}", ca.display()));
                if let HttpRoute::Relay(relay) = route {
                    // The URL keeps the origin's name (the certificate's); the connection
                    // goes to the relay.
                    let origin = url.trim_start_matches("https://").trim_end_matches('/');
                    options.push_str(&format!(" --connect-to {origin}:{relay}"));
                }
            }
            format!(
                "curl -sS -o /dev/null -w '%{{size_download}} %{{time_total}}\\n'{options} {url}"
            )
        }
        // What `shutil.copyfileobj` does (64 KiB reads), counting instead of writing.
        Client::Python => format!(
            "python3 -c 'import time, urllib.request\n\
             started = time.perf_counter()\n\
             total = 0\n\
             with urllib.request.urlopen(\"{url}\") as response:\n\
             \x20   while chunk := response.read(1 << 16):\n\
             \x20       total += len(chunk)\n\
             print(total, time.perf_counter() - started)'"
        ),
    }
}

/// `text` as a JSON string.
fn json_string(text: &str) -> String {
    let mut json = String::from('"');
    for c in text.chars() {
        match c {
            '"' => json.push_str("\\\""),
            '\\' => json.push_str("\\\\"),
            c if u32::from(c) < 0x20 => json.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => json.push(c),
        }
    }
    json.push('"');
    json
}

/// What one fetch took: the client's own time, the wall time of the process it ran in
/// (`cordon exec` included for the sandbox) and the CPU time of every process involved.
struct Fetch {
    client: Duration,
    wall: Duration,
    cpu: Duration,
}

/// What the clients need for `https://`: the certificate authority to trust (the origin's own
/// certificate, in the sandbox's workspace so that the sandboxed client can read it too).
struct Tls {
    ca: Option<std::path::PathBuf>,
}

/// The place of the sandbox route: the `cordon` binary, a workspace and a policy allowing only
/// the origin.
struct Sandbox {
    cordon: std::path::PathBuf,
    workspace: std::path::PathBuf,
    policy: std::path::PathBuf,
}

async fn fetch(
    client: Client,
    url: &str,
    route: HttpRoute,
    sandbox: &Sandbox,
    tls: &Tls,
    bytes: u64,
) -> Fetch {
    let script = match route {
        HttpRoute::Relay(relay) if tls.ca.is_none() => {
            fetch_command(client, &format!("http://{relay}/"), route, tls)
        }
        _ => fetch_command(client, url, route, tls),
    };
    let mut command = match route {
        HttpRoute::Sandbox => {
            let mut command = tokio::process::Command::new(&sandbox.cordon);
            command
                .arg("exec")
                .arg("bash")
                .arg(format!("{{\"command\": {}}}", json_string(&script)))
                .arg("--policy")
                .arg(&sandbox.policy)
                .arg("--root")
                .arg(&sandbox.workspace);
            command
        }
        _ => {
            let mut command = tokio::process::Command::new("sh");
            command.arg("-c").arg(&script);
            command
        }
    };
    for name in PROXY_VARIABLES {
        command.env_remove(name);
    }
    if let HttpRoute::Forward(proxy) = route {
        let proxy = format!("http://{proxy}");
        command.env("http_proxy", &proxy).env("HTTP_PROXY", &proxy);
    }
    command.stdin(std::process::Stdio::null());
    let cpu = cpu_time() + waited_children_cpu();
    let started = Instant::now();
    let output = command.output().await.expect("run the client");
    let wall = started.elapsed();
    let cpu = cpu_time() + waited_children_cpu() - cpu;
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The line with the bytes read and the client's seconds (the sandbox's result may add
    // lines of its own).
    let seconds = stdout.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (Some(got), Some(seconds), None) = (fields.next(), fields.next(), fields.next()) else {
            return None;
        };
        (got.parse::<u64>().ok()? == bytes)
            .then(|| seconds.parse::<f64>().ok())
            .flatten()
    });
    let Some(seconds) = seconds.filter(|_| output.status.success()) else {
        panic!(
            "the fetch failed ({}): {script}\nstdout: {stdout}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    };
    Fetch {
        client: Duration::from_secs_f64(seconds),
        wall,
        cpu,
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|error| format!("unknown ({error})"))
}

/// `bench CLIENT [GIB] [ROUNDS] [CORDON]`: the routes of the module's documentation.
async fn real_clients(client: Client, args: &[String]) {
    let gib: u64 = args
        .first()
        .map_or(1, |a| a.parse().expect("GIB is a number"));
    let rounds: usize = args
        .get(1)
        .map_or(5, |a| a.parse().expect("ROUNDS is a number"))
        .max(1);
    let cordon = args.get(2).map_or_else(
        || {
            let exe = std::env::current_exe().expect("own path");
            let release = exe
                .parent()
                .and_then(std::path::Path::parent)
                .expect("this example lives in TARGET/PROFILE/examples");
            release.join("cordon")
        },
        std::path::PathBuf::from,
    );
    assert!(
        cordon.is_file(),
        "{} is missing: build it with `cargo build --release -p cordon`, or name it as CORDON",
        cordon.display()
    );
    let bytes = gib << 30;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sandbox = Sandbox {
        cordon,
        workspace: dir.path().join("workspace"),
        policy: dir.path().join("policy.toml"),
    };
    std::fs::create_dir(&sandbox.workspace).expect("create the workspace");
    let (port, url, tls) = if client == Client::CurlHttps {
        let (cert, key) = self_signed(&sandbox.workspace);
        let port = https_origin(bytes, &cert, &key);
        let url = format!("https://{HTTP_ORIGIN}:{port}/");
        (port, url, Tls { ca: Some(cert) })
    } else {
        let port = http_origin(bytes).await;
        let url = format!("http://{HTTP_ORIGIN}:{port}/");
        (port, url, Tls { ca: None })
    };
    let apart = proxies_apart(HTTP_ORIGIN, &[port]).await;
    let (proxy, reference) = (apart.spliced, apart.reference);
    std::fs::write(
        &sandbox.policy,
        format!("version = 1\n[network]\nallow = [\"{HTTP_ORIGIN}/32:{port}\"]\n"),
    )
    .expect("write the policy");

    let mut routes = vec![("direct", HttpRoute::Direct)];
    if client != Client::Python {
        routes.push(("CONNECT", HttpRoute::Connect(proxy)));
    }
    // Forward proxying is for `http://` URLs only (`https://` goes by `CONNECT`).
    if client != Client::CurlHttps {
        routes.push(("forward", HttpRoute::Forward(proxy)));
    }
    routes.push(("sandbox", HttpRoute::Sandbox));
    routes.push(("reference relay", HttpRoute::Relay(reference)));
    if let Some(kernel) = apart.kernel {
        routes.push(("kernel relay", HttpRoute::Relay(kernel)));
    }
    println!(
        "{url}, proxy {proxy} in a process of its own, sandbox: {} exec; load average {}",
        sandbox.cordon.display(),
        load_average()
    );
    let mut fetches: Vec<Vec<Fetch>> = routes.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for i in 0..routes.len() {
            let at = (round + i) % routes.len();
            let done = fetch(client, &url, routes[at].1, &sandbox, &tls, bytes).await;
            fetches[at].push(done);
        }
    }
    let mib = |time: Duration| bytes as f64 / time.as_secs_f64() / (1 << 20) as f64;
    let summary = |fetches: &[Fetch]| {
        let mut client: Vec<Duration> = fetches.iter().map(|f| f.client).collect();
        let mut wall: Vec<Duration> = fetches.iter().map(|f| f.wall).collect();
        client.sort();
        wall.sort();
        let cpu = fetches.iter().map(|f| f.cpu).min().expect("a round");
        (
            percentile(&client, 0.5),
            client[0],
            percentile(&wall, 0.5),
            cpu,
        )
    };
    let (direct_median, direct_best, _, _) = summary(&fetches[0]);
    let client_name = match client {
        Client::Curl => "curl",
        Client::Python => "python",
        Client::CurlHttps => "curl, https",
    };
    for ((name, _), fetches) in routes.iter().zip(&fetches) {
        let (median, best, wall, cpu) = summary(fetches);
        println!(
            "{client_name}, {gib} GiB, {name}, {rounds} rounds: median {:.0} MiB/s ({:.2}x \
             direct's median), best {:.0} MiB/s ({:.2}x direct's best), median wall of the \
             process {:.2} s, least CPU {:.2} s per GiB (all processes)",
            mib(median),
            mib(median) / mib(direct_median),
            mib(best),
            mib(best) / mib(direct_best),
            wall.as_secs_f64(),
            cpu.as_secs_f64() / gib.max(1) as f64,
        );
    }
    println!("load average at the end {}", load_average());
}
