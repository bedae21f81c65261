//! Unmodified clients (curl, Python's urllib and http.client) through the proxy to servers on
//! loopback. Test names resolve to 127.0.0.1 through the proxy's static resolver; every test
//! waits for the proxy's event of each attempt, never for time to pass.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::Arc;

use cordon_egress::proxy::{
    ConnectionEvent, EventSink, Limits, Outcome, Protocol, Proxy, ProxyConfig, StaticResolver,
};
use cordon_egress::rules::{EntrySpec, Matched, Rules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::sync::mpsc;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const NAMES: &[&str] = &["pkg.test", "sub.pkg.test", "bad.pkg.test", "other.test"];

/// A plain HTTP server that answers every request with the path it was asked for and reports
/// each request head it received.
struct Origin {
    port: u16,
    heads: mpsc::UnboundedReceiver<String>,
}

async fn origin() -> Origin {
    let listener = TcpListener::bind((LOOPBACK, 0))
        .await
        .expect("bind the origin");
    let port = listener.local_addr().expect("origin address").port();
    let (tx, heads) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split(' ').nth(1).unwrap_or_default().to_string();
                let body = format!("hello from origin: {path}");
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tx.send(head);
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Origin { port, heads }
}

struct Harness {
    proxy: SocketAddr,
    events: mpsc::Receiver<ConnectionEvent>,
}

/// Starts a proxy whose allow and deny entries come from `policy.toml` lines 1… and 101….
async fn proxy(allow: &[String], deny: &[String]) -> Harness {
    let spec = |offset: usize| {
        move |(i, text): (usize, &String)| {
            EntrySpec::new(text.clone(), format!("policy.toml:{}", offset + i))
        }
    };
    let allow: Vec<_> = allow.iter().enumerate().map(spec(1)).collect();
    let deny: Vec<_> = deny.iter().enumerate().map(spec(101)).collect();
    let rules = Rules::compile(&allow, &deny).expect("test rules compile");
    let resolver = StaticResolver::new(NAMES.iter().map(|name| (*name, vec![LOOPBACK])));
    let (events, rx) = EventSink::channel(64);
    let config = ProxyConfig {
        session: "session-1".into(),
        rules: Arc::new(rules),
        resolver: Arc::new(resolver),
        events,
        limits: Limits::default(),
    };
    let listener = TcpListener::bind((LOOPBACK, 0))
        .await
        .expect("bind the proxy");
    let address = listener.local_addr().expect("proxy address");
    let proxy = Proxy::new(config);
    tokio::spawn(async move { proxy.serve_tcp(listener).await });
    Harness {
        proxy: address,
        events: rx,
    }
}

impl Harness {
    async fn event(&mut self) -> ConnectionEvent {
        self.events
            .recv()
            .await
            .expect("the proxy reports every attempt")
    }
}

fn matched(entry: &str, source: &str) -> Option<Matched> {
    Some(Matched {
        entry: entry.into(),
        source: source.into(),
    })
}

const PROXY_VARS: &[&str] = &[
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
];

fn client(program: &str, install: &str) -> Command {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()));
    assert!(
        found,
        "{program} is missing: these tests need it ({install})"
    );
    let mut command = Command::new(program);
    for var in PROXY_VARS {
        command.env_remove(var);
    }
    command.stdin(Stdio::null()).kill_on_drop(true);
    command
}

fn curl() -> Command {
    let mut command = client("curl", "apt-get install -y curl");
    command.args(["-sS", "--max-time", "60"]);
    command
}

fn python() -> Command {
    client("python3", "apt-get install -y python3")
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn run(command: &mut Command) -> Run {
    let output = command.output().await.expect("the client runs");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[tokio::test]
async fn curl_forward_proxy_reaches_an_allowed_name_with_an_origin_form_request() {
    let mut origin = origin().await;
    let o = origin.port;
    let mut h = proxy(&[format!("pkg.test:{o}"), format!("127.0.0.1/32:{o}")], &[]).await;
    let url = format!("http://pkg.test:{o}/simple/?x=1");
    let out = run(curl().args([
        "-x",
        &format!("http://{}", h.proxy),
        "-H",
        "Proxy-Authorization: Basic eA==",
        &url,
    ]))
    .await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "hello from origin: /simple/?x=1"),
        "{}",
        out.stderr
    );
    let head = origin
        .heads
        .recv()
        .await
        .expect("the origin saw the request");
    assert!(
        head.starts_with("GET /simple/?x=1 HTTP/1.1\r\nHost: pkg.test:"),
        "{head}"
    );
    assert!(head.ends_with("Connection: close\r\n\r\n"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("proxy-"), "{head}");
    let event = h.event().await;
    assert_eq!(
        (
            event.outcome,
            event.protocol,
            event.host.as_str(),
            event.port
        ),
        (Outcome::Allowed, Protocol::HttpForward, "pkg.test", o)
    );
    assert_eq!(
        event.source,
        matched(&format!("pkg.test:{o}"), "policy.toml:1")
    );
    assert_eq!(event.address, Some(SocketAddr::new(LOOPBACK, o)));
    assert_eq!(event.session.as_ref(), "session-1");
    let body = "hello from origin: /simple/?x=1";
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // the rewritten head is what reached the origin: a GET without a body sends just that
    assert_eq!(
        (event.bytes_up, event.bytes_down),
        (head.len() as u64, reply.len() as u64)
    );
}

#[tokio::test]
async fn curl_connect_tunnel_and_proxy_environment_variables() {
    let _origin = origin().await;
    let o = _origin.port;
    let mut h = proxy(&[format!("pkg.test:{o}"), format!("127.0.0.1/32:{o}")], &[]).await;
    let proxy_url = format!("http://{}", h.proxy);
    let url = format!("http://pkg.test:{o}/tunnel");
    let out = run(curl().args(["-p", "-x", &proxy_url, &url])).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "hello from origin: /tunnel"),
        "{}",
        out.stderr
    );
    let event = h.event().await;
    assert_eq!(
        (event.outcome, event.protocol),
        (Outcome::Allowed, Protocol::HttpConnect)
    );
    assert!(event.bytes_up > 0 && event.bytes_down > 0, "{event:?}");

    let out = run(curl().env("http_proxy", &proxy_url).arg(&url)).await;
    assert_eq!(out.stdout, "hello from origin: /tunnel", "{}", out.stderr);
    assert_eq!(h.event().await.protocol, Protocol::HttpForward);

    let out = run(curl()
        .env("ALL_PROXY", format!("socks5h://{}", h.proxy))
        .arg(&url))
    .await;
    assert_eq!(out.stdout, "hello from origin: /tunnel", "{}", out.stderr);
    assert_eq!(h.event().await.protocol, Protocol::Socks5);
}

#[tokio::test]
async fn curl_socks5h_lets_the_proxy_resolve_the_name() {
    let _origin = origin().await;
    let o = _origin.port;
    let mut h = proxy(
        &[format!("*.pkg.test:{o}"), format!("127.0.0.1/32:{o}")],
        &[],
    )
    .await;
    let socks = format!("socks5h://{}", h.proxy);
    let out = run(curl().args(["--proxy", &socks, &format!("http://sub.pkg.test:{o}/s")])).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "hello from origin: /s"),
        "{}",
        out.stderr
    );
    let event = h.event().await;
    assert_eq!(
        (event.outcome, event.protocol, event.host.as_str()),
        (Outcome::Allowed, Protocol::Socks5, "sub.pkg.test")
    );
    assert_eq!(
        event.source,
        matched(&format!("*.pkg.test:{o}"), "policy.toml:1")
    );

    // the wildcard does not cover the apex: refused with SOCKS reply 2
    let out = run(curl().args(["--proxy", &socks, &format!("http://pkg.test:{o}/s")])).await;
    assert_ne!(out.code, Some(0));
    // curl names the SOCKS5 reply code: 2, connection not allowed by ruleset
    let refused = "Can't complete SOCKS5 connection to pkg.test. (2)";
    assert!(out.stderr.contains(refused), "{}", out.stderr);
    let event = h.event().await;
    assert_eq!(
        (event.outcome, event.reason.as_str()),
        (Outcome::Denied, &*format!("no entry allows pkg.test:{o}"))
    );
}

#[tokio::test]
async fn a_socks5_refusal_is_reply_code_2() {
    let mut h = proxy(&["pkg.test".to_string()], &[]).await;
    let mut stream = TcpStream::connect(h.proxy)
        .await
        .expect("connect to the proxy");
    stream.write_all(&[5, 1, 0]).await.expect("greeting");
    let mut greeting = [0u8; 2];
    stream
        .read_exact(&mut greeting)
        .await
        .expect("method reply");
    assert_eq!(greeting, [5, 0]);
    let mut request = vec![5, 1, 0, 3, 10];
    request.extend_from_slice(b"other.test");
    request.extend_from_slice(&443u16.to_be_bytes());
    stream.write_all(&request).await.expect("request");
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.expect("reply");
    assert_eq!(reply, [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    let event = h.event().await;
    assert_eq!(
        (event.outcome, event.protocol, event.port),
        (Outcome::Denied, Protocol::Socks5, 443)
    );
    assert_eq!(event.reason, "no entry allows other.test:443");
}

#[tokio::test]
async fn denials_name_the_deciding_entry_and_what_to_add() {
    let _origin = origin().await;
    let o = _origin.port;
    let allow = [
        format!("pkg.test:{o}"),
        format!("*.pkg.test:{o}"),
        format!("127.0.0.1/32:{o}"),
    ];
    let mut h = proxy(&allow, &[format!("bad.pkg.test:{o}")]).await;
    let proxy_url = format!("http://{}", h.proxy);
    let fetch = |host: &str, port: u16| {
        let mut command = curl();
        command.args([
            "-x",
            &proxy_url,
            "-w",
            "\n%{http_code}",
            &format!("http://{host}:{port}/"),
        ]);
        command
    };

    // deny beats allow
    let out = run(&mut fetch("bad.pkg.test", o)).await;
    assert_eq!(
        out.stdout,
        format!(
            "cordon: connection to bad.pkg.test:{o} refused by the network policy\n\
             deny entry \"bad.pkg.test:{o}\" (policy.toml:101) matches bad.pkg.test:{o}\n\
             to allow it, remove or narrow that deny entry in [network] deny\n\n403"
        )
    );
    let event = h.event().await;
    assert_eq!(
        (event.outcome, event.source),
        (
            Outcome::Denied,
            matched(&format!("bad.pkg.test:{o}"), "policy.toml:101")
        )
    );
    assert_eq!(
        (event.bytes_up, event.bytes_down, event.address),
        (0, 0, None)
    );
    // a deny entry is removed or narrowed, not answered with an allow entry
    assert_eq!(event.suggestion, None);

    // no entry
    let out = run(&mut fetch("other.test", o)).await;
    assert_eq!(
        out.stdout,
        format!(
            "cordon: connection to other.test:{o} refused by the network policy\n\
             no entry allows other.test:{o}\n\
             to allow it, add \"other.test:{o}\" to [network] allow in the policy\n\n403"
        )
    );
    let event = h.event().await;
    assert_eq!((event.outcome, event.source), (Outcome::Denied, None));
    assert_eq!(event.suggestion, Some(format!("other.test:{o}")));

    // the wildcard and the apex both work on their port, not on another one
    for host in ["pkg.test", "sub.pkg.test"] {
        let out = run(&mut fetch(host, o)).await;
        assert_eq!(out.stdout, "hello from origin: /\n200", "{host}");
        assert_eq!(h.event().await.outcome, Outcome::Allowed);
        let out = run(&mut fetch(host, o.wrapping_add(1).max(1))).await;
        assert!(out.stdout.ends_with("\n403"), "{host}: {}", out.stdout);
        let event = h.event().await;
        assert_eq!(
            event.reason,
            format!("no entry allows {host}:{}", o.wrapping_add(1).max(1))
        );
    }
}

#[tokio::test]
async fn an_allowed_name_resolving_to_loopback_needs_an_ip_entry() {
    let _origin = origin().await;
    let o = _origin.port;
    let mut h = proxy(&[format!("pkg.test:{o}")], &[]).await;
    let proxy_url = format!("http://{}", h.proxy);
    let url = format!("http://pkg.test:{o}/");
    let out = run(curl().args(["-x", &proxy_url, "-w", "\n%{http_code}", &url])).await;
    assert_eq!(
        out.stdout,
        format!(
            "cordon: connection to pkg.test:{o} refused by the network policy\n\
             pkg.test resolved to 127.0.0.1, a loopback address, which a name entry alone does not \
             allow (the name is allowed by \"pkg.test:{o}\" (policy.toml:1))\n\
             to allow it, add \"127.0.0.1/32:{o}\" to [network] allow in the policy\n\n403"
        )
    );
    let event = h.event().await;
    assert_eq!(
        (event.outcome, event.address),
        (Outcome::Denied, Some(SocketAddr::new(LOOPBACK, o)))
    );
    assert_eq!(event.suggestion, Some(format!("127.0.0.1/32:{o}")));
    // the tunnel is refused the same way
    let out = run(curl().args(["-p", "-x", &proxy_url, &url])).await;
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("403"), "{}", out.stderr);
    assert_eq!(h.event().await.outcome, Outcome::Denied);

    let mut h = proxy(&[format!("pkg.test:{o}"), "127.0.0.0/8".to_string()], &[]).await;
    let out = run(curl().args(["-x", &format!("http://{}", h.proxy), &url])).await;
    assert_eq!(out.stdout, "hello from origin: /", "{}", out.stderr);
    let event = h.event().await;
    assert_eq!((event.outcome, event.suggestion), (Outcome::Allowed, None));
}

#[tokio::test]
async fn ip_literals_match_only_ip_entries() {
    let _origin = origin().await;
    let o = _origin.port;
    let mut h = proxy(&[format!("pkg.test:{o}")], &[]).await;
    let proxy_url = format!("http://{}", h.proxy);
    let out = run(curl().args(["-x", &proxy_url, &format!("http://127.0.0.1:{o}/")])).await;
    assert!(
        out.stdout
            .contains(&format!("no entry allows 127.0.0.1:{o}")),
        "{}",
        out.stdout
    );
    assert_eq!(h.event().await.outcome, Outcome::Denied);

    let mut h = proxy(&[format!("127.0.0.1/32:{o}")], &[]).await;
    let proxy_url = format!("http://{}", h.proxy);
    let out = run(curl().args(["-x", &proxy_url, &format!("http://pkg.test:{o}/")])).await;
    assert!(
        out.stdout
            .contains(&format!("no entry allows pkg.test:{o}")),
        "{}",
        out.stdout
    );
    assert_eq!(h.event().await.outcome, Outcome::Denied);
    let out = run(curl().args(["-x", &proxy_url, &format!("http://127.0.0.1:{o}/ip")])).await;
    assert_eq!(out.stdout, "hello from origin: /ip", "{}", out.stderr);
    let event = h.event().await;
    assert_eq!(
        (event.outcome, event.host.as_str()),
        (Outcome::Allowed, "127.0.0.1")
    );
    assert_eq!(
        event.source,
        matched(&format!("127.0.0.1/32:{o}"), "policy.toml:1")
    );
}

const PY_CLIENT: &str = r#"
import sys, urllib.request, urllib.error, http.client
proxy, url, host, port, path = sys.argv[1:]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
try:
    print("urllib", opener.open(url).read().decode())
except urllib.error.HTTPError as e:
    print("urllib", e.code, e.read().decode().splitlines()[1])
phost, pport = proxy.removeprefix("http://").rsplit(":", 1)
conn = http.client.HTTPConnection(phost, int(pport))
conn.set_tunnel(host, int(port))
try:
    conn.request("GET", path)
    print("tunnel", conn.getresponse().read().decode())
except OSError as e:
    print("tunnel", e)
"#;

#[tokio::test]
async fn python_urllib_and_http_client_tunnel() {
    let _origin = origin().await;
    let o = _origin.port;
    let mut h = proxy(&[format!("pkg.test:{o}"), format!("127.0.0.1/32:{o}")], &[]).await;
    let proxy_url = format!("http://{}", h.proxy);
    let args = |host: &str| {
        let url = format!("http://{host}:{o}/py");
        [
            PY_CLIENT.to_string(),
            proxy_url.clone(),
            url,
            host.to_string(),
            o.to_string(),
            "/py".to_string(),
        ]
    };
    let mut command = python();
    command.arg("-c").args(args("pkg.test"));
    let out = run(&mut command).await;
    assert_eq!(
        out.stdout, "urllib hello from origin: /py\ntunnel hello from origin: /py\n",
        "{}",
        out.stderr
    );
    assert_eq!(h.event().await.protocol, Protocol::HttpForward);
    assert_eq!(h.event().await.protocol, Protocol::HttpConnect);

    let mut command = python();
    command.arg("-c").args(args("other.test"));
    let out = run(&mut command).await;
    assert_eq!(
        out.stdout,
        format!(
            "urllib 403 no entry allows other.test:{o}\ntunnel Tunnel connection failed: 403 Forbidden\n"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(h.event().await.outcome, Outcome::Denied);
    assert_eq!(h.event().await.outcome, Outcome::Denied);
}
