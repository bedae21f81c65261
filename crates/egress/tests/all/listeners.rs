//! The proxy on a Unix listener (how a sandbox's forwarder reaches it), and HTTPS through a
//! `CONNECT` tunnel that `https_proxy` sets up in curl.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Stdio;
use std::sync::Arc;

use cordon_egress::proxy::{
    EventSink, Limits, Outcome, Protocol, Proxy, ProxyConfig, StaticResolver,
};
use cordon_egress::rules::{EntrySpec, Rules};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::process::Command;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn config(
    allow: &[String],
) -> (
    ProxyConfig,
    tokio::sync::mpsc::Receiver<cordon_egress::proxy::ConnectionEvent>,
) {
    let allow: Vec<_> = allow
        .iter()
        .enumerate()
        .map(|(i, text)| EntrySpec::new(text.clone(), format!("policy.toml:{}", i + 1)))
        .collect();
    let (events, rx) = EventSink::channel(16);
    let config = ProxyConfig {
        session: "unix-session".into(),
        rules: Arc::new(Rules::compile(&allow, &[]).expect("rules")),
        resolver: Arc::new(StaticResolver::new([("pkg.test", vec![LOOPBACK])])),
        events,
        limits: Limits::default(),
    };
    (config, rx)
}

#[tokio::test]
async fn a_unix_listener_serves_connect() {
    let echo = TcpListener::bind((LOOPBACK, 0)).await.expect("bind echo");
    let o = echo.local_addr().expect("echo address").port();
    tokio::spawn(async move {
        let (mut stream, _) = echo.accept().await.expect("accept");
        let (mut read, mut write) = stream.split();
        let _ = tokio::io::copy(&mut read, &mut write).await;
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("egress.sock");
    let listener = UnixListener::bind(&path).expect("bind the unix socket");
    let (config, mut rx) = config(&[format!("pkg.test:{o}"), format!("127.0.0.1/32:{o}")]);
    let proxy = Proxy::new(config);
    let serving = tokio::spawn(async move { proxy.serve_unix(listener).await });

    let mut stream = UnixStream::connect(&path)
        .await
        .expect("connect to the proxy");
    stream
        .write_all(
            format!("CONNECT pkg.test:{o} HTTP/1.1\r\nHost: pkg.test:{o}\r\n\r\nearly").as_bytes(),
        )
        .await
        .expect("send CONNECT with bytes after the head");
    let mut reply = vec![0u8; "HTTP/1.1 200 Connection established\r\n\r\nearly".len()];
    stream.read_exact(&mut reply).await.expect("reply and echo");
    assert_eq!(reply, b"HTTP/1.1 200 Connection established\r\n\r\nearly");
    stream
        .write_all(b" and late")
        .await
        .expect("write through the tunnel");
    stream.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.expect("read the echo");
    assert_eq!(rest, b" and late");
    let event = rx.recv().await.expect("an event");
    assert_eq!(
        (
            event.outcome,
            event.protocol,
            event.session.as_ref(),
            event.bytes_up,
            event.bytes_down
        ),
        (
            Outcome::Allowed,
            Protocol::HttpConnect,
            "unix-session",
            14,
            14
        )
    );
    serving.abort();
}

const TLS_SERVER: &str = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello over tls"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), H)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.handle_request()
"#;

#[tokio::test]
async fn curl_https_through_https_proxy() {
    for tool in ["openssl", "python3", "curl"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        assert!(
            found,
            "{tool} is missing: this test needs it (apt-get install -y {tool})"
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=pkg.test",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .expect("run openssl");
    assert!(made.success(), "openssl could not make a certificate");
    let mut server = Command::new("python3")
        .arg("-c")
        .arg(TLS_SERVER)
        .arg(&cert)
        .arg(&key)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the TLS server");
    let mut line = String::new();
    let stdout = server.stdout.take().expect("server stdout");
    BufReader::new(stdout)
        .read_line(&mut line)
        .await
        .expect("server port");
    let o: u16 = line.trim().parse().expect("a port number");

    let (config, mut rx) = config(&[format!("pkg.test:{o}"), format!("127.0.0.1/32:{o}")]);
    let listener = TcpListener::bind((LOOPBACK, 0))
        .await
        .expect("bind the proxy");
    let address = listener.local_addr().expect("proxy address");
    let proxy = Proxy::new(config);
    tokio::spawn(async move { proxy.serve_tcp(listener).await });

    let mut curl = Command::new("curl");
    for var in [
        "http_proxy",
        "HTTP_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
        "HTTPS_PROXY",
    ] {
        curl.env_remove(var);
    }
    let output = curl
        .env("https_proxy", format!("http://{address}"))
        .args([
            "-sS",
            "-k",
            "--max-time",
            "60",
            &format!("https://pkg.test:{o}/"),
        ])
        .output()
        .await
        .expect("run curl");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "hello over tls",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let event = rx.recv().await.expect("an event");
    assert_eq!(
        (event.outcome, event.protocol, event.host.as_str()),
        (Outcome::Allowed, Protocol::HttpConnect, "pkg.test")
    );
    assert!(event.bytes_up > 0 && event.bytes_down > 0);
    let _ = server.wait().await;
}
