use super::*;
use crate::ask::{AskRequest, Asked};
use crate::rules::EntrySpec;

fn attempt() -> Attempt {
    Attempt::new()
}

fn head(text: &str) -> Result<(Host, u16, Option<String>), String> {
    parse_http_head(text, &Limits::default(), &mut attempt())
        .map(|(host, port, head)| {
            (
                host,
                port,
                head.map(|h| String::from_utf8(h).expect("utf-8 head")),
            )
        })
        .map_err(|refusal| refusal.reason)
}

fn name(text: &str) -> Host {
    Host::parse(text).expect("host parses")
}

#[test]
fn a_forwarded_request_is_rewritten_to_origin_form_without_hop_by_hop_headers() {
    let request = "GET http://Pkg.Test:8080/simple/?q=1#frag HTTP/1.1\r\nHost: wrong.example\r\n\
                   User-Agent: curl/8\r\nProxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\n\
                   Connection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\n\
                   Upgrade: h2c\r\nContent-Length: 3\r\nAccept: */*";
    let (host, port, rewritten) = head(request).expect("valid request");
    assert_eq!((host, port), (name("pkg.test"), 8080));
    assert_eq!(
        rewritten.expect("a forward head"),
        "GET /simple/?q=1 HTTP/1.1\r\nHost: Pkg.Test:8080\r\nUser-Agent: curl/8\r\nContent-Length: 3\r\n\
         Accept: */*\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn forwarded_defaults_and_connect_targets() {
    let (host, port, rewritten) = head("HEAD http://pkg.test HTTP/1.0").expect("valid");
    assert_eq!((host, port), (name("pkg.test"), 80));
    assert_eq!(
        rewritten.expect("head"),
        "HEAD / HTTP/1.0\r\nHost: pkg.test\r\nConnection: close\r\n\r\n"
    );
    let (host, port, rewritten) =
        head("CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443").expect("valid");
    assert_eq!((host, port, rewritten), (name("pkg.test"), 443, None));
    let (host, port, _) = head("CONNECT [fd00::1]:22 HTTP/1.1").expect("valid");
    assert_eq!((host, port), (Host::Ip("fd00::1".parse().expect("ip")), 22));
    let (host, _, _) = head("CONNECT 127.0.0.1:5 HTTP/1.1").expect("valid");
    assert_eq!(host, Host::Ip("127.0.0.1".parse().expect("ip")));
}

#[test]
fn malformed_heads_are_refused_with_the_reason() {
    let cases = [
        (
            "GET / HTTP/1.1",
            "this is a proxy: send `CONNECT host:port` or a request for an absolute http:// URL",
        ),
        (
            "GET https://a.test/ HTTP/1.1",
            "an https:// URL must go through CONNECT (set HTTPS_PROXY, not a plain http request)",
        ),
        ("CONNECT a.test HTTP/1.1", "`CONNECT` needs `host:port`"),
        (
            "CONNECT a.test:0 HTTP/1.1",
            "port \"0\" is not a number from 1 to 65535",
        ),
        (
            "CONNECT a.test:99999 HTTP/1.1",
            "port \"99999\" is not a number from 1 to 65535",
        ),
        ("CONNECT :443 HTTP/1.1", "the destination host is empty"),
        (
            "CONNECT [::1:443 HTTP/1.1",
            "an IPv6 host is missing its `]`",
        ),
        (
            "GET http://allowed.test@evil.test/ HTTP/1.1",
            "credentials in a proxied URL are not supported",
        ),
        (
            "GET http://a..test/ HTTP/1.1",
            "invalid destination host \"a..test\": the name has an empty label (two dots in a row, or a leading or trailing dot)",
        ),
        (
            "GET http://127.1/ HTTP/1.1",
            "invalid destination host \"127.1\": \"127.1\" looks like an IPv4 address but is not one (write four decimal octets)",
        ),
        (
            "GET  http://a.test/ HTTP/1.1",
            "the request line is not `METHOD TARGET HTTP/1.x`",
        ),
        (
            "GET http://a.test/ HTTP/2",
            "only HTTP/1.0 and HTTP/1.1 requests are proxied",
        ),
        (
            "G3T http://a.test/ HTTP/1.1",
            "the request method is not a word",
        ),
        (
            "GET http://a.test/ HTTP/1.1\r\nno colon",
            "a header line has no `:`",
        ),
        (
            "GET http://a.test/ HTTP/1.1\r\nBad Name: x",
            "a header name is empty or has characters a header name may not have",
        ),
        (
            "GET http://a.test/ HTTP/1.1\r\nX: a\nb",
            "a header value has control characters",
        ),
    ];
    for (request, reason) in cases {
        assert_eq!(
            head(request).map(|_| ()),
            Err(reason.to_string()),
            "{request:?}"
        );
    }
}

#[test]
fn header_count_is_bounded() {
    let limits = Limits {
        max_headers: 3,
        ..Limits::default()
    };
    let ok = "GET http://a.test/ HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3";
    assert!(parse_http_head(ok, &limits, &mut attempt()).is_ok());
    let refusal =
        parse_http_head(&format!("{ok}\r\nD: 4"), &limits, &mut attempt()).expect_err("refused");
    assert_eq!(
        (refusal.status, refusal.reason.as_str()),
        (431, "the request has more than 3 header lines")
    );
}

fn proxy(limits: Limits) -> (Proxy, mpsc::Receiver<ConnectionEvent>) {
    let rules = Rules::compile(&[EntrySpec::new("pkg.test", "p:1")], &[]).expect("rules");
    let (events, rx) = EventSink::channel(64);
    let config = ProxyConfig {
        session: "unit".into(),
        rules: Arc::new(rules),
        resolver: Arc::new(StaticResolver::default()),
        events,
        limits,
    };
    (Proxy::new(config), rx)
}

/// Feeds `input` to one proxy connection, closes the write side, and returns what the proxy
/// answered and its event.
async fn exchange(
    proxy: &Proxy,
    rx: &mut mpsc::Receiver<ConnectionEvent>,
    input: &[u8],
) -> (Vec<u8>, ConnectionEvent) {
    let (mut ours, theirs) = tokio::io::duplex(1 << 20);
    let serving = proxy.handle(theirs);
    let talking = async {
        // the proxy may answer and hang up before reading everything
        let _ = ours.write_all(input).await;
        let _ = ours.shutdown().await;
        let mut answer = Vec::new();
        ours.read_to_end(&mut answer)
            .await
            .expect("read the answer");
        answer
    };
    let ((), answer) = tokio::join!(serving, talking);
    (answer, rx.recv().await.expect("an event"))
}

#[tokio::test]
async fn garbage_gets_a_clear_refusal_and_one_event() {
    let (proxy, mut rx) = proxy(Limits::default());
    let (answer, event) = exchange(&proxy, &mut rx, b"\x16\x03\x01\x00garbage").await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with("not an HTTP or SOCKS5 request (first byte 0x16)\n"),
        "{answer}"
    );
    assert_eq!(
        (event.outcome, event.protocol, event.session.as_ref()),
        (Outcome::Failed, Protocol::Unknown, "unit")
    );
    assert_eq!(
        event.reason,
        "not an HTTP or SOCKS5 request (first byte 0x16)"
    );

    let (answer, event) = exchange(&proxy, &mut rx, b"").await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 400"));
    assert_eq!(event.reason, "the client closed before sending a request");

    let (_, event) = exchange(&proxy, &mut rx, b"\x04\x01\x00\x50").await;
    assert_eq!(
        event.reason,
        "SOCKS4 is not supported: use SOCKS5 (socks5h://)"
    );
}

#[tokio::test]
async fn an_oversized_head_is_refused_with_431() {
    let (proxy, mut rx) = proxy(Limits {
        max_head_bytes: 1024,
        ..Limits::default()
    });
    let mut input = b"GET http://pkg.test/ HTTP/1.1\r\nX: ".to_vec();
    input.extend(std::iter::repeat_n(b'a', 100_000));
    let (answer, event) = exchange(&proxy, &mut rx, &input).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{answer}"
    );
    assert_eq!(event.reason, "the request head is larger than 1024 bytes");
    assert_eq!(event.outcome, Outcome::Failed);
    // just under the limit is read in full (and then denied: pkg.test on port 80 is allowed,
    // but it does not resolve in this table)
    let mut input = b"GET http://pkg.test/ HTTP/1.1\r\nX: ".to_vec();
    input.extend(std::iter::repeat_n(b'a', 1024 - input.len() - 4));
    input.extend_from_slice(b"\r\n\r\n");
    let (_, event) = exchange(&proxy, &mut rx, &input).await;
    assert_eq!(
        event.reason,
        "failed to resolve pkg.test: pkg.test is not in the static table"
    );
}

#[tokio::test]
async fn a_head_that_never_ends_times_out() {
    let (proxy, mut rx) = proxy(Limits {
        head_timeout: Duration::from_millis(50),
        ..Limits::default()
    });
    let (mut ours, theirs) = tokio::io::duplex(1024);
    ours.write_all(b"GET http://pkg.test/ HTTP/1.1\r\n")
        .await
        .expect("write");
    // our side stays open: only the proxy's own deadline can end this
    proxy.handle(theirs).await;
    let event = rx.recv().await.expect("an event");
    assert_eq!(event.reason, "the request was not complete within 50ms");
    let mut answer = Vec::new();
    ours.read_to_end(&mut answer).await.expect("read");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408 Request Timeout\r\n"));
}

#[tokio::test]
async fn socks5_without_no_auth_or_with_other_commands_is_refused() {
    let (proxy, mut rx) = proxy(Limits::default());
    let (answer, event) = exchange(&proxy, &mut rx, &[5, 1, 2]).await;
    assert_eq!(answer, [5, 0xff]);
    assert_eq!(
        event.reason,
        "the SOCKS5 client offered no method without authentication"
    );
    // BIND
    let (answer, event) =
        exchange(&proxy, &mut rx, &[5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80]).await;
    assert_eq!(answer, [5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        event.reason,
        "SOCKS5 command 2 is not supported (only CONNECT)"
    );
    let (answer, event) = exchange(&proxy, &mut rx, &[5, 1, 0, 5, 1, 0, 9]).await;
    assert_eq!(answer, [5, 0, 5, 8, 0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(event.reason, "SOCKS5 address type 9 is not supported");
    let (answer, event) = exchange(
        &proxy,
        &mut rx,
        &[5, 1, 0, 5, 1, 0, 3, 4, b'a', b'.', b'.', b'b', 1, 187],
    )
    .await;
    assert_eq!(answer, [5, 0, 5, 4, 0, 1, 0, 0, 0, 0, 0, 0]);
    assert!(
        event
            .reason
            .starts_with("invalid destination host \"a..b\""),
        "{}",
        event.reason
    );
    assert_eq!(event.port, 443);
}

#[tokio::test]
async fn too_many_connections_are_answered_503() {
    let (proxy, mut rx) = proxy(Limits {
        max_connections: 1,
        ..Limits::default()
    });
    let (mut held, theirs) = tokio::io::duplex(1024);
    let busy = proxy.clone();
    let holder = tokio::spawn(async move { busy.handle(theirs).await });
    // the held connection owns the only permit once its first byte is being waited for
    held.write_all(b"C").await.expect("write");
    while proxy.shared.permits.available_permits() != 0 {
        tokio::task::yield_now().await;
    }
    let (answer, event) = exchange(&proxy, &mut rx, b"CONNECT pkg.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
    assert_eq!(
        event.reason,
        "too many connections through the egress proxy at once (the limit is 1)"
    );
    drop(held);
    holder.await.expect("holder ends");
    assert!(rx.recv().await.is_some());
    assert_eq!(proxy.shared.permits.available_permits(), 1);
}

#[tokio::test]
async fn a_full_sink_drops_events_and_counts_them() {
    let rules = Rules::compile(&[], &[]).expect("rules");
    let (events, mut rx) = EventSink::channel(1);
    let config = ProxyConfig {
        session: "s".into(),
        rules: Arc::new(rules),
        resolver: Arc::new(StaticResolver::default()),
        events: events.clone(),
        limits: Limits::default(),
    };
    let proxy = Proxy::new(config);
    for _ in 0..3 {
        let (ours, theirs) = tokio::io::duplex(64);
        drop(ours);
        proxy.handle(theirs).await;
    }
    assert_eq!(events.dropped(), 2);
    assert!(rx.recv().await.is_some());
    assert!(rx.try_recv().is_err());
}

#[tokio::test]
async fn random_garbage_never_panics_or_hangs() {
    let (proxy, mut rx) = proxy(Limits {
        head_timeout: Duration::from_secs(5),
        ..Limits::default()
    });
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let prefixes: [&[u8]; 5] = [
        b"",
        b"\x05",
        b"CONNECT ",
        b"GET http://",
        b"\x05\x01\x00\x05\x01\x00",
    ];
    for round in 0..400 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut input = prefixes[round % prefixes.len()].to_vec();
        let len = (state % 64) as usize;
        input.extend((0..len).map(|i| (state >> (i % 8 * 8)) as u8 ^ i as u8));
        if round % 3 == 0 {
            input.extend_from_slice(b"\r\n\r\n");
        }
        let (_, event) = exchange(&proxy, &mut rx, &input).await;
        assert_ne!(event.outcome, Outcome::Allowed, "{input:?}");
    }
}

#[tokio::test]
async fn a_client_that_is_not_a_socket_is_relayed_by_copying() {
    let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let port = echo.local_addr().expect("echo address").port();
    tokio::spawn(async move {
        let (mut stream, _) = echo.accept().await.expect("accept");
        let (mut read, mut write) = stream.split();
        let _ = tokio::io::copy(&mut read, &mut write).await;
    });
    let allow = [EntrySpec::new(format!("127.0.0.1/32:{port}"), "p:7")];
    let (events, mut rx) = EventSink::channel(4);
    let config = ProxyConfig {
        session: "copy".into(),
        rules: Arc::new(Rules::compile(&allow, &[]).expect("rules")),
        resolver: Arc::new(StaticResolver::default()),
        events,
        limits: Limits::default(),
    };
    let proxy = Proxy::new(config);
    let input = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nping");
    let (answer, event) = exchange(&proxy, &mut rx, input.as_bytes()).await;
    assert_eq!(answer, b"HTTP/1.1 200 Connection established\r\n\r\nping");
    assert_eq!(
        (event.outcome, event.bytes_up, event.bytes_down),
        (Outcome::Allowed, 4, 4)
    );
    assert_eq!(event.reason, "relayed until both sides closed");
}

#[tokio::test]
async fn the_system_resolver_answer_is_checked_like_any_other() {
    let addresses = SystemResolver
        .resolve("localhost", 80)
        .await
        .expect("localhost resolves");
    assert!(
        !addresses.is_empty() && addresses.iter().all(IpAddr::is_loopback),
        "{addresses:?}"
    );
    let allow = [EntrySpec::new("localhost:8080", "p:3")];
    let (events, mut rx) = EventSink::channel(4);
    let config = ProxyConfig {
        session: "system".into(),
        rules: Arc::new(Rules::compile(&allow, &[]).expect("rules")),
        resolver: Arc::new(SystemResolver),
        events,
        limits: Limits::default(),
    };
    let proxy = Proxy::new(config);
    let (answer, event) =
        exchange(&proxy, &mut rx, b"CONNECT localhost:8080 HTTP/1.1\r\n\r\n").await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 403 Forbidden\r\n"));
    assert_eq!(event.outcome, Outcome::Denied);
    assert!(
        event
            .reason
            .contains(", a loopback address, which a name entry alone does not allow"),
        "{}",
        event.reason
    );
}

#[tokio::test]
async fn a_connection_cut_by_its_owner_goes_to_the_given_sink_with_the_reason() {
    // The destination accepts and then stays silent, holding the tunnel open.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = silent.local_addr().expect("address").port();
    let held = tokio::spawn(async move {
        let (stream, _) = silent.accept().await.expect("accept");
        let mut stream = stream;
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
    });
    let allow = [EntrySpec::new(format!("127.0.0.1/32:{port}"), "p:9")];
    let (config_events, mut config_rx) = EventSink::channel(4);
    let proxy = Proxy::new(ProxyConfig {
        session: "cut".into(),
        rules: Arc::new(Rules::compile(&allow, &[]).expect("rules")),
        resolver: Arc::new(StaticResolver::default()),
        events: config_events,
        limits: Limits::default(),
    });
    let (command_events, mut command_rx) = EventSink::channel(4);
    let (mut ours, theirs) = tokio::io::duplex(1 << 16);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let owner = ConnectionOwner {
        events: command_events,
        call: None,
    };
    let serving = proxy.serve_connection(theirs, &owner, async {
        let _ = stop_rx.await;
    });
    let talking = async {
        ours.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .expect("send the request");
        let mut answer = [0u8; 39];
        ours.read_exact(&mut answer).await.expect("read the answer");
        assert_eq!(&answer, b"HTTP/1.1 200 Connection established\r\n\r\n");
        // The tunnel is open and idle: the owner ends it.
        stop_tx.send(()).expect("stop");
    };
    tokio::join!(serving, talking);
    let event = command_rx.recv().await.expect("an event in the given sink");
    assert_eq!(event.outcome, Outcome::Allowed);
    assert_eq!(
        event.reason,
        "relayed until the command that opened it ended, then cut"
    );
    assert!(
        config_rx.try_recv().is_err(),
        "nothing in the proxy's own sink"
    );
    // The upstream side was closed with the client's.
    held.await.expect("the destination saw the connection end");
}

#[tokio::test]
async fn a_forwarded_request_head_counts_as_bytes_sent_up() {
    // The destination echoes what it gets: the rewritten head reached it and must be counted
    // (a URL can carry as much as a body).
    let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let port = echo.local_addr().expect("echo address").port();
    tokio::spawn(async move {
        let (mut stream, _) = echo.accept().await.expect("accept");
        let (mut read, mut write) = stream.split();
        let _ = tokio::io::copy(&mut read, &mut write).await;
    });
    let allow = [EntrySpec::new(format!("127.0.0.1/32:{port}"), "p:7")];
    let (events, mut rx) = EventSink::channel(4);
    let config = ProxyConfig {
        session: "head".into(),
        rules: Arc::new(Rules::compile(&allow, &[]).expect("rules")),
        resolver: Arc::new(StaticResolver::default()),
        events,
        limits: Limits::default(),
    };
    let proxy = Proxy::new(config);
    let secret = "s".repeat(4000);
    let input = format!("GET http://127.0.0.1:{port}/{secret} HTTP/1.1\r\n\r\nbody");
    let (answer, event) = exchange(&proxy, &mut rx, input.as_bytes()).await;
    let answer = String::from_utf8(answer).expect("utf-8");
    assert!(
        answer.starts_with(&format!("GET /{secret} HTTP/1.1\r\n")),
        "{answer}"
    );
    assert!(answer.ends_with("\r\n\r\nbody"), "{answer}");
    assert_eq!(event.outcome, Outcome::Allowed);
    assert_eq!(
        (event.bytes_up, event.bytes_down),
        (answer.len() as u64, answer.len() as u64)
    );
}

#[tokio::test]
async fn an_invalid_host_is_recorded_without_its_control_characters() {
    let (proxy, mut rx) = proxy(Limits::default());
    let input = b"CONNECT evil\x1b[2J\nSandbox:fine\x07:443 HTTP/1.1\r\n\r\n";
    let (answer, event) = exchange(&proxy, &mut rx, input).await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 400"));
    assert_eq!(event.outcome, Outcome::Failed);
    assert_eq!(event.host, "evil\\u{1b}[2J\\nSandbox:fine\\u{7}");
    assert!(
        event
            .reason
            .starts_with("invalid destination host \"evil\\u{1b}[2J\\nSandbox:fine\\u{7}\": "),
        "{}",
        event.reason
    );
    // A SOCKS5 name is any bytes: the same.
    let mut socks = b"\x05\x01\x00\x05\x01\x00\x03\x06a\rb\x00\xffc".to_vec();
    socks.extend_from_slice(&443u16.to_be_bytes());
    let (_, event) = exchange(&proxy, &mut rx, &socks).await;
    assert_eq!(event.outcome, Outcome::Failed);
    assert_eq!(event.host, "a\\rb\\u{0}\\u{fffd}c");
}

/// Answers every question with `answer`, counting them.
struct Answering {
    answer: crate::ask::AskAnswer,
    asked: std::sync::Mutex<Vec<AskRequest>>,
}

#[async_trait::async_trait]
impl EgressApprover for Answering {
    async fn ask(&self, request: AskRequest) -> crate::ask::AskAnswer {
        self.asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(request);
        self.answer
    }
}

fn ask_proxy(
    ask: &str,
    resolver: StaticResolver,
    approver: Option<Arc<Answering>>,
) -> (Proxy, mpsc::Receiver<ConnectionEvent>) {
    let rules = Rules::compile(&[EntrySpec::new("pkg.test", "p:1")], &[])
        .and_then(|rules| rules.with_ask(&[EntrySpec::new(ask, "p:4")]))
        .expect("rules");
    let (events, rx) = EventSink::channel(8);
    let config = ProxyConfig {
        session: "ask".into(),
        rules: Arc::new(rules),
        resolver: Arc::new(resolver),
        events,
        limits: Limits::default(),
    };
    let approver = approver.map(|a| -> Arc<dyn EgressApprover> { a });
    (Proxy::with_approver(config, approver), rx)
}

async fn echo_port() -> u16 {
    let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let port = echo.local_addr().expect("echo address").port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = echo.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn an_ask_destination_approved_for_the_session_is_relayed_and_not_asked_again() {
    let port = echo_port().await;
    let approver = Arc::new(Answering {
        answer: crate::ask::AskAnswer::Session,
        asked: std::sync::Mutex::new(Vec::new()),
    });
    let (proxy, mut rx) = ask_proxy(
        &format!("127.0.0.1/32:{port}"),
        StaticResolver::default(),
        Some(approver.clone()),
    );
    let input = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nping");
    let (answer, event) = exchange(&proxy, &mut rx, input.as_bytes()).await;
    assert_eq!(answer, b"HTTP/1.1 200 Connection established\r\n\r\nping");
    assert_eq!(
        (event.outcome, event.asked, event.source.map(|m| m.source)),
        (Outcome::Allowed, Some(Asked::Session), Some("p:4".into()))
    );
    let (answer, event) = exchange(&proxy, &mut rx, input.as_bytes()).await;
    assert_eq!(answer, b"HTTP/1.1 200 Connection established\r\n\r\nping");
    assert_eq!(
        (event.outcome, event.asked),
        (Outcome::Allowed, Some(Asked::Remembered))
    );
    let asked = approver.asked.lock().expect("asked").clone();
    assert_eq!(
        asked,
        vec![AskRequest {
            session: "ask".into(),
            call: None,
            host: Host::Ip("127.0.0.1".parse().expect("ip")),
            port,
            entry: Matched {
                entry: format!("127.0.0.1/32:{port}").into(),
                source: "p:4".into(),
            },
        }]
    );
}

#[tokio::test]
async fn a_question_names_the_call_that_owns_the_connection() {
    let port = echo_port().await;
    let approver = Arc::new(Answering {
        answer: crate::ask::AskAnswer::Once,
        asked: std::sync::Mutex::new(Vec::new()),
    });
    let (proxy, mut unused) = ask_proxy(
        &format!("127.0.0.1/32:{port}"),
        StaticResolver::default(),
        Some(approver.clone()),
    );
    let (events, mut rx) = EventSink::channel(8);
    let owner = ConnectionOwner {
        events,
        call: Some("mcp-7".into()),
    };
    let (mut ours, theirs) = tokio::io::duplex(1 << 16);
    let serving = proxy.serve_connection(theirs, &owner, std::future::pending());
    let talking = async {
        let input = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nping");
        ours.write_all(input.as_bytes()).await.expect("write");
        ours.shutdown().await.expect("shutdown");
        let mut answer = Vec::new();
        ours.read_to_end(&mut answer).await.expect("read");
        answer
    };
    let ((), answer) = tokio::join!(serving, talking);
    assert_eq!(answer, b"HTTP/1.1 200 Connection established\r\n\r\nping");
    let event = rx.recv().await.expect("the owner's sink has the event");
    assert_eq!(
        (event.outcome, event.asked),
        (Outcome::Allowed, Some(Asked::Once))
    );
    // The configuration's own sink got nothing.
    assert!(unused.try_recv().is_err());
    let calls: Vec<Option<Arc<str>>> = approver
        .asked
        .lock()
        .expect("asked")
        .iter()
        .map(|request| request.call.clone())
        .collect();
    assert_eq!(calls, vec![Some(Arc::from("mcp-7"))]);
}

#[tokio::test]
async fn an_ask_destination_without_an_approver_is_refused_saying_how_to_allow_it() {
    let (proxy, mut rx) = ask_proxy("*.ask.test", StaticResolver::default(), None);
    let (answer, event) =
        exchange(&proxy, &mut rx, b"CONNECT a.ask.test:443 HTTP/1.1\r\n\r\n").await;
    let answer = String::from_utf8(answer).expect("utf-8");
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.ends_with(
            "cordon: connection to a.ask.test:443 refused by the network policy\n\
             ask entry \"*.ask.test\" (p:4) matches a.ask.test:443, which needs approval, and \
             nobody can be asked about it here\n\
             to allow it without asking, add \"a.ask.test\" to [network] allow in the policy\n"
        ),
        "{answer}"
    );
    assert_eq!(
        (event.outcome, event.asked, event.suggestion.as_deref()),
        (Outcome::Denied, Some(Asked::NoApprover), Some("a.ask.test"))
    );
}

#[tokio::test]
async fn an_ask_destination_the_person_refuses_is_refused() {
    let approver = Arc::new(Answering {
        answer: crate::ask::AskAnswer::Deny,
        asked: std::sync::Mutex::new(Vec::new()),
    });
    let (proxy, mut rx) = ask_proxy("*.ask.test", StaticResolver::default(), Some(approver));
    let (answer, event) =
        exchange(&proxy, &mut rx, b"CONNECT a.ask.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 403 Forbidden\r\n"));
    assert_eq!(
        (event.outcome, event.asked),
        (Outcome::Denied, Some(Asked::Refused))
    );
    assert!(
        event
            .reason
            .ends_with("and the person asked did not approve it"),
        "{}",
        event.reason
    );
}

#[tokio::test]
async fn a_destination_refused_earlier_in_the_call_is_not_asked_about_again() {
    let approver = Arc::new(Answering {
        answer: crate::ask::AskAnswer::Deny,
        asked: std::sync::Mutex::new(Vec::new()),
    });
    let (proxy, _unused) = ask_proxy(
        "*.ask.test",
        StaticResolver::default(),
        Some(approver.clone()),
    );
    let (events, mut rx) = EventSink::channel(8);
    let owner = ConnectionOwner {
        events,
        call: Some("mcp-9".into()),
    };
    let mut replies = Vec::new();
    for _ in 0..2 {
        let (mut ours, theirs) = tokio::io::duplex(1 << 16);
        let serving = proxy.serve_connection(theirs, &owner, std::future::pending());
        let talking = async {
            ours.write_all(b"CONNECT a.ask.test:443 HTTP/1.1\r\n\r\n")
                .await
                .expect("write");
            ours.shutdown().await.expect("shutdown");
            let mut answer = Vec::new();
            ours.read_to_end(&mut answer).await.expect("read");
            answer
        };
        let ((), answer) = tokio::join!(serving, talking);
        replies.push(String::from_utf8_lossy(&answer).into_owned());
    }
    let first = rx.recv().await.expect("first event");
    let second = rx.recv().await.expect("second event");
    assert_eq!(
        (first.asked, second.asked, second.outcome),
        (Some(Asked::Refused), Some(Asked::Withheld), Outcome::Denied)
    );
    assert_eq!(approver.asked.lock().expect("asked").len(), 1);
    assert!(
        replies[1].starts_with("HTTP/1.1 403 Forbidden\r\n")
            && replies[1].contains(
                "which needs approval, and the person was not asked again: during this tool \
                 call they refused it, or 3 destinations, already\n"
            )
            && replies[1].contains("add \"a.ask.test\" to [network] allow"),
        "{}",
        replies[1]
    );
}

#[tokio::test]
async fn an_approval_does_not_let_a_name_resolve_to_a_loopback_address() {
    let approver = Arc::new(Answering {
        answer: crate::ask::AskAnswer::Session,
        asked: std::sync::Mutex::new(Vec::new()),
    });
    let resolver = StaticResolver::new([("a.ask.test", vec!["127.0.0.1".parse().expect("ip")])]);
    let (proxy, mut rx) = ask_proxy("*.ask.test", resolver, Some(approver));
    let (answer, event) =
        exchange(&proxy, &mut rx, b"CONNECT a.ask.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 403 Forbidden\r\n"));
    assert_eq!(
        (event.outcome, event.asked),
        (Outcome::Denied, Some(Asked::Session))
    );
    assert!(
        event
            .reason
            .contains("a.ask.test resolved to 127.0.0.1, a loopback address"),
        "{}",
        event.reason
    );
}

#[tokio::test]
async fn a_socks5_success_reply_does_not_disclose_the_hosts_address() {
    let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let port = echo.local_addr().expect("echo address").port();
    tokio::spawn(async move {
        let (mut stream, _) = echo.accept().await.expect("accept");
        let (mut read, mut write) = stream.split();
        let _ = tokio::io::copy(&mut read, &mut write).await;
    });
    let allow = [EntrySpec::new(format!("127.0.0.1/32:{port}"), "p:7")];
    let (events, mut rx) = EventSink::channel(4);
    let config = ProxyConfig {
        session: "socks".into(),
        rules: Arc::new(Rules::compile(&allow, &[]).expect("rules")),
        resolver: Arc::new(StaticResolver::default()),
        events,
        limits: Limits::default(),
    };
    let proxy = Proxy::new(config);
    let mut input = b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01".to_vec();
    input.extend_from_slice(&port.to_be_bytes());
    input.extend_from_slice(b"ping");
    let (answer, event) = exchange(&proxy, &mut rx, &input).await;
    // The bound address is the proxy's own outgoing socket on the host: all zeros instead.
    assert_eq!(
        answer,
        b"\x05\x00\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00ping"
    );
    assert_eq!(event.outcome, Outcome::Allowed);
}

#[tokio::test]
async fn a_large_spliced_transfer_each_way_is_counted_in_the_event() {
    // A TCP client (relayed by `splice`) sends several pipes' worth up while the destination
    // sends several down; the event counts exactly what crossed each way.
    let (up_len, down_len) = (3 * 1024 * 1024 + 17, 5 * 1024 * 1024 + 3);
    let byte = |i: usize| (i % 253) as u8;
    let origin = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
    let port = origin.local_addr().expect("origin address").port();
    let serving_origin = tokio::spawn(async move {
        let (mut stream, _) = origin.accept().await.expect("accept");
        let (mut read, mut write) = stream.split();
        let sending = async {
            let down: Vec<u8> = (0..down_len).map(byte).collect();
            write.write_all(&down).await.expect("send down");
            write.shutdown().await.expect("end down");
        };
        let receiving = async {
            let mut got = Vec::new();
            read.read_to_end(&mut got).await.expect("receive up");
            got
        };
        tokio::join!(sending, receiving).1
    });
    let allow = [EntrySpec::new(format!("127.0.0.1/32:{port}"), "p:9")];
    let (events, mut rx) = EventSink::channel(4);
    let config = ProxyConfig {
        session: "large".into(),
        rules: Arc::new(Rules::compile(&allow, &[]).expect("rules")),
        resolver: Arc::new(StaticResolver::default()),
        events,
        limits: Limits::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    let address = listener.local_addr().expect("proxy address");
    let proxy = Proxy::new(config);
    let serving = tokio::spawn(async move { proxy.serve_tcp(listener).await });

    let mut client = TcpStream::connect(address).await.expect("connect");
    client
        .write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .expect("send CONNECT");
    let mut reply = [0u8; 39];
    client.read_exact(&mut reply).await.expect("reply");
    assert_eq!(&reply, b"HTTP/1.1 200 Connection established\r\n\r\n");
    let (mut read, mut write) = client.split();
    let sending = async {
        let up: Vec<u8> = (0..up_len).map(byte).collect();
        write.write_all(&up).await.expect("send up");
        write.shutdown().await.expect("end up");
    };
    let receiving = async {
        let mut got = Vec::new();
        read.read_to_end(&mut got).await.expect("receive down");
        got
    };
    let ((), down) = tokio::join!(sending, receiving);
    let up = serving_origin.await.expect("origin");
    assert!(up.len() == up_len && up.iter().enumerate().all(|(i, &b)| b == byte(i)));
    assert!(down.len() == down_len && down.iter().enumerate().all(|(i, &b)| b == byte(i)));
    let event = rx.recv().await.expect("an event");
    assert_eq!(
        (event.outcome, event.bytes_up, event.bytes_down),
        (Outcome::Allowed, up_len as u64, down_len as u64)
    );
    assert_eq!(event.reason, "relayed until both sides closed");
    serving.abort();
}
