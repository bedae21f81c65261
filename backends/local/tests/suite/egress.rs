//! Filtered network mode end to end, what only the local backend shows: HTTPS checked end to
//! end and SOCKS5 through the proxy, cargo against a sparse registry, root and Unix sockets
//! around the proxy, each command's own attempts and ask entries (names mapped by a resolver
//! the test controls). The cases every backend shares (allowed, unlisted, port, wildcard,
//! deny, IP/CIDR, rebinding, direct TCP, UDP/DNS, pip, git) are the cross-backend egress suite
//! (`cargo test -p cordon-tests --test egress`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cordon_backend_local::{LocalBackend, LocalConfig, SandboxSpec};
use cordon_core::sandbox::NetworkMode;
use cordon_egress::proxy::StaticResolver;
use cordon_ops::{
    Backend, EgressOutcome, EgressProtocol, EgressRecord, ExecOutcome, ExecRequest, ExitStatus,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Generous bound for calls that must not hang (never a timing assertion on the result).
const HANG_GUARD: Duration = Duration::from_secs(300);
/// The policy file the spec's entries are labelled with.
const POLICY: &str = "policy.toml";

/// A static file server on 127.0.0.1 (plain HTTP/1.x, one request per connection).
struct Origin {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    async fn serve(root: PathBuf) -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the origin server");
        let port = listener.local_addr().expect("address").port();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let root = root.clone();
                tokio::spawn(async move {
                    let _ = answer(stream, &root).await;
                });
            }
        });
        Origin { port, task }
    }
}

async fn answer(mut stream: tokio::net::TcpStream, root: &Path) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..read]);
    }
    let head = String::from_utf8_lossy(&head);
    let target = head.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split(['?', '#']).next().unwrap_or("/");
    let mut file = root.join(path.trim_start_matches('/'));
    if file.is_dir() {
        file = file.join("index.html");
    }
    let inside = !path.split('/').any(|part| part == "..");
    let (status, body) = match std::fs::read(&file) {
        Ok(body) if inside => ("200 OK", body),
        _ => ("404 Not Found", b"not found\n".to_vec()),
    };
    let kind = match file.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html",
        Some("json") => "application/json",
        Some("txt") => "text/plain",
        _ => "application/octet-stream",
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await
}

/// A TLS server on 127.0.0.1 for `secure.test` (a host python process, killed on drop).
struct TlsOrigin {
    port: u16,
    child: Child,
}

impl Drop for TlsOrigin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TLS_SERVER: &str = r#"
import socket, ssl, sys
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(listener.getsockname()[1], flush=True)
while True:
    connection, _ = listener.accept()
    try:
        tls = context.wrap_socket(connection, server_side=True)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = tls.recv(4096)
            if not chunk:
                break
            data += chunk
        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nsecure-hello")
        tls.close()
    except Exception:
        connection.close()
"#;

impl TlsOrigin {
    /// A certificate for `secure.test` (`cert.pem`, `key.pem` in `dir`) and a server using it;
    /// returns once the server listens (it prints its port).
    fn start(dir: &Path) -> TlsOrigin {
        let status = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=secure.test"])
            .args(["-addext", "subjectAltName=DNS:secure.test"])
            .arg("-keyout")
            .arg(dir.join("key.pem"))
            .arg("-out")
            .arg(dir.join("cert.pem"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl must be installed");
        assert!(status.success(), "openssl failed to make a certificate");
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(TLS_SERVER)
            .arg(dir.join("cert.pem"))
            .arg(dir.join("key.pem"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 must be installed");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("read the TLS server's port");
        let port = line
            .trim()
            .parse()
            .expect("the TLS server printed its port");
        TlsOrigin { port, child }
    }
}

/// A filtered-mode backend over `ws` with these entries (labelled `policy.toml:10…` and
/// `policy.toml:20…`), test names resolved to 127.0.0.1.
fn backend(
    ws: &Path,
    state: &Path,
    home: Option<PathBuf>,
    allow: &[String],
    deny: &[String],
) -> LocalBackend {
    let mut spec = SandboxSpec {
        network: NetworkMode::Filtered,
        ..SandboxSpec::default()
    };
    spec.egress.allow = allow.to_vec();
    spec.egress.deny = deny.to_vec();
    spec.sources.file = POLICY.to_owned();
    spec.sources.egress_allow = (10..10 + allow.len()).collect();
    spec.sources.egress_deny = (20..20 + deny.len()).collect();
    let loopback: Vec<IpAddr> = vec!["127.0.0.1".parse().expect("ip")];
    let resolver = StaticResolver::new(
        [
            "pkg.test",
            "secure.test",
            "a.wild.test",
            "blocked.wild.test",
            "other.test",
        ]
        .map(|name| (name, loopback.clone())),
    );
    LocalBackend::with_egress_resolver(
        LocalConfig {
            profile: cordon_backend_local::Profile::Host,
            workspace_is_copy: false,
            root: ws.to_path_buf(),
            spec,
            home,
            state_base: Some(state.to_path_buf()),
        },
        Arc::new(resolver),
    )
    .expect("create a filtered backend")
}

struct Dirs {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    www: PathBuf,
    state: PathBuf,
}

fn dirs() -> Dirs {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().canonicalize().expect("canonical");
    let (ws, www, state) = (base.join("ws"), base.join("www"), base.join("state"));
    for path in [&ws, &www, &state] {
        std::fs::create_dir(path).expect("create dir");
    }
    std::fs::write(www.join("hello.txt"), "hello through the proxy\n").expect("write");
    Dirs {
        _dir: dir,
        ws,
        www,
        state,
    }
}

/// Run `command` in the backend; its output and outcome.
async fn run(backend: &LocalBackend, cwd: &Path, command: &str) -> (String, ExecOutcome) {
    run_for(backend, cwd, command, None).await
}

/// Run `command` for tool call `call_id` (when given); its output and outcome.
async fn run_for(
    backend: &LocalBackend,
    cwd: &Path,
    command: &str,
    call_id: Option<&str>,
) -> (String, ExecOutcome) {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(4);
    let collector = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(chunk) = rx.recv().await {
            all.extend_from_slice(&chunk);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let request = ExecRequest {
        call_id: call_id.map(str::to_owned),
        command: command.to_owned(),
        cwd: cwd.to_path_buf(),
        timeout: HANG_GUARD,
        env: Vec::new(),
    };
    let outcome = tokio::time::timeout(
        HANG_GUARD,
        backend.bash().exec(request, CancellationToken::new(), tx),
    )
    .await
    .expect("exec must not hang")
    .expect("exec runs");
    (collector.await.expect("collector"), outcome)
}

fn only(records: &[EgressRecord]) -> &EgressRecord {
    assert_eq!(records.len(), 1, "one attempt expected: {records:#?}");
    &records[0]
}

#[tokio::test(flavor = "multi_thread")]
async fn curl_and_python_reach_allowed_names_and_are_refused_the_rest() {
    let d = dirs();
    let origin = Origin::serve(d.www.clone()).await;
    let tls = TlsOrigin::start(&d.ws);
    let p = origin.port;
    let allow = vec![
        format!("pkg.test:{p}"),
        format!("secure.test:{}", tls.port),
        format!("*.wild.test:{p}"),
        "127.0.0.1".to_owned(),
    ];
    let deny = vec![format!("blocked.wild.test:{p}")];
    let backend = backend(&d.ws, &d.state, None, &allow, &deny);

    // Plain HTTP, forwarded.
    let (out, outcome) = run(
        &backend,
        &d.ws,
        &format!("curl -sS http://pkg.test:{p}/hello.txt"),
    )
    .await;
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{out}");
    assert_eq!(out, "hello through the proxy\n");
    let record = only(&outcome.egress);
    assert_eq!(
        (
            record.protocol,
            record.outcome,
            record.host.as_str(),
            record.port
        ),
        (
            EgressProtocol::HttpForward,
            EgressOutcome::Allowed,
            "pkg.test",
            p
        )
    );
    assert_eq!(record.entry.as_deref(), Some(allow[0].as_str()));
    assert_eq!(record.source.as_deref(), Some("policy.toml:10"));
    assert!(record.bytes_down > 0, "{record:?}");

    // HTTPS through CONNECT, the certificate checked end to end.
    let (out, outcome) = run(
        &backend,
        &d.ws,
        &format!(
            "curl -sS --cacert cert.pem https://secure.test:{}/",
            tls.port
        ),
    )
    .await;
    assert_eq!(out, "secure-hello", "{out}");
    let record = only(&outcome.egress);
    assert_eq!(
        (record.protocol, record.outcome),
        (EgressProtocol::HttpConnect, EgressOutcome::Allowed)
    );
    assert_eq!(record.source.as_deref(), Some("policy.toml:11"));

    // python's urllib, unmodified, over both.
    let script = format!(
        "import ssl, urllib.request as r\n\
         print(r.urlopen('http://pkg.test:{p}/hello.txt').read().decode().strip())\n\
         print(r.urlopen('https://secure.test:{}/', context=ssl.create_default_context(cafile='cert.pem')).read().decode())",
        tls.port
    );
    let (out, outcome) = run(&backend, &d.ws, &format!("python3 -c \"{script}\"")).await;
    assert_eq!(out, "hello through the proxy\nsecure-hello\n", "{out}");
    assert_eq!(outcome.egress.len(), 2, "{:#?}", outcome.egress);
    assert!(
        outcome
            .egress
            .iter()
            .all(|r| r.outcome == EgressOutcome::Allowed)
    );

    // SOCKS5 with the name resolved by the proxy (what ALL_PROXY offers non-HTTP tools).
    let (out, outcome) = run(
        &backend,
        &d.ws,
        &format!("curl -sS -x socks5h://127.0.0.1:3128 http://pkg.test:{p}/hello.txt"),
    )
    .await;
    assert_eq!(out, "hello through the proxy\n");
    let record = only(&outcome.egress);
    assert_eq!(
        (record.protocol, record.outcome, record.host.as_str()),
        (EgressProtocol::Socks5, EgressOutcome::Allowed, "pkg.test")
    );

    // A wildcard entry, and a deny entry that beats it; the 403 names the entry and its line.
    let (out, _) = run(
        &backend,
        &d.ws,
        &format!("curl -sS http://a.wild.test:{p}/hello.txt"),
    )
    .await;
    assert_eq!(out, "hello through the proxy\n");
    let (out, outcome) = run(
        &backend,
        &d.ws,
        &format!("curl -sS -w '%{{http_code}}' http://blocked.wild.test:{p}/hello.txt"),
    )
    .await;
    assert!(out.ends_with("403"), "{out}");
    assert!(out.contains("blocked.wild.test"), "{out}");
    assert!(out.contains("policy.toml:20"), "{out}");
    let record = only(&outcome.egress);
    assert_eq!(record.outcome, EgressOutcome::Denied);
    assert_eq!(record.entry.as_deref(), Some(deny[0].as_str()));
    assert_eq!(record.source.as_deref(), Some("policy.toml:20"));

    // A port entry allows that port only; HTTPS to an unlisted name fails at CONNECT.
    let (out, outcome) = run(
        &backend,
        &d.ws,
        &format!(
            "curl -sS -w '%{{http_code}}' http://pkg.test:{}/hello.txt",
            p.wrapping_add(1).max(1)
        ),
    )
    .await;
    assert!(out.ends_with("403"), "{out}");
    assert!(out.contains("no entry allows"), "{out}");
    let record = only(&outcome.egress);
    assert_eq!(record.outcome, EgressOutcome::Denied);
    assert_eq!(record.source, None);
    assert_eq!(
        record.suggestion.as_deref(),
        Some(format!("pkg.test:{}", p.wrapping_add(1).max(1)).as_str())
    );
    let (out, outcome) = run(&backend, &d.ws, "curl -sS https://other.test/").await;
    assert_ne!(outcome.status, Some(ExitStatus::Code(0)), "{out}");
    assert!(out.contains("403"), "{out}");
    assert_eq!(only(&outcome.egress).outcome, EgressOutcome::Denied);

    // An IP entry allows the address itself (IP literals match IP entries only). Loopback is
    // in NO_PROXY, so curl is told to use the proxy for it.
    let (out, outcome) = run(
        &backend,
        &d.ws,
        &format!("curl -sS --noproxy '' http://127.0.0.1:{p}/hello.txt"),
    )
    .await;
    assert_eq!(out, "hello through the proxy\n");
    assert_eq!(
        only(&outcome.egress).source.as_deref(),
        Some("policy.toml:13")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_goes_around_the_proxy_even_for_root() {
    let d = dirs();
    let origin = Origin::serve(d.www.clone()).await;
    let allow = vec!["127.0.0.1".to_owned()];
    // A host Unix socket listed in the spec, and one that is not.
    let listed = d.state.join("listed.sock");
    let unlisted = d.state.join("unlisted.sock");
    let listeners: Vec<std::os::unix::net::UnixListener> = [&listed, &unlisted]
        .iter()
        .map(|path| std::os::unix::net::UnixListener::bind(path).expect("bind"))
        .collect();
    let spec_backend = {
        let mut spec = SandboxSpec {
            network: NetworkMode::Filtered,
            unix_sockets: vec![listed.display().to_string()],
            ..SandboxSpec::default()
        };
        spec.egress.allow = allow.clone();
        spec.sources.file = POLICY.to_owned();
        spec.sources.egress_allow = vec![10];
        LocalBackend::new(LocalConfig {
            profile: cordon_backend_local::Profile::Host,
            workspace_is_copy: false,
            root: d.ws.clone(),
            spec,
            home: None,
            state_base: Some(d.state.clone()),
        })
        .expect("create a filtered backend")
    };
    let p = origin.port;
    let script = format!(
        r#"
import errno, os, socket
def attempt(label, action):
    try:
        action()
        print(label, "ok")
    except OSError as error:
        print(label, errno.errorcode.get(error.errno, error.errno))
print("uid", os.getuid())
attempt("direct-tcp", lambda: socket.create_connection(("127.0.0.1", {p}), timeout=5))
attempt("direct-other", lambda: socket.create_connection(("10.20.30.40", 80), timeout=5))
attempt("udp-dns", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("10.20.30.40", 53)))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
for label, path in (("listed", "{listed}"), ("unlisted", "{unlisted}")):
    attempt(label, lambda: socket.socket(socket.AF_UNIX).connect(path))
print("interfaces", sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]))
"#,
        listed = listed.display(),
        unlisted = unlisted.display(),
    );
    let (out, outcome) = run(&spec_backend, &d.ws, &format!("python3 -c '{script}'")).await;
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{out}");
    for expected in [
        "uid 0",
        "direct-tcp ECONNREFUSED",
        "direct-other ENETUNREACH",
        "udp-dns ENETUNREACH",
        "netlink EPERM",
        "listed ok",
        "unlisted ENOENT",
        "interfaces ['lo']",
    ] {
        assert!(out.contains(expected), "expected {expected:?} in: {out}");
    }
    assert!(outcome.egress.is_empty(), "{:#?}", outcome.egress);
    // Through the proxy the same address works (the IP entry allows it); loopback is in
    // NO_PROXY, so curl is told to use the proxy for it.
    let (out, outcome) = run(
        &spec_backend,
        &d.ws,
        &format!("curl -sS --noproxy '' http://127.0.0.1:{p}/hello.txt"),
    )
    .await;
    assert_eq!(out, "hello through the proxy\n");
    assert_eq!(only(&outcome.egress).outcome, EgressOutcome::Allowed);
    drop(listeners);
}

/// Builds, under `www`, a PyPI-style simple index with one pure wheel (`cordon-demo` 0.1)
/// and a sparse cargo registry with one crate (`cordondemo` 0.1.0) whose downloads point at
/// `http://pkg.test:PORT`; offline, with the host's python.
const PACKAGES: &str = r#"
import base64, hashlib, io, json, os, sys, tarfile, zipfile
www, port = sys.argv[1], sys.argv[2]
def put(path, data):
    path = os.path.join(www, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
        out.write(data)
    return hashlib.sha256(data).hexdigest()
files = {
    "cordon_demo/__init__.py": b"VALUE = 42\n",
    "cordon_demo-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: cordon-demo\nVersion: 0.1\n",
    "cordon_demo-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: cordon-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += f"{name},sha256={digest},{len(data)}\n"
record += "cordon_demo-0.1.dist-info/RECORD,,\n"
wheel = io.BytesIO()
with zipfile.ZipFile(wheel, "w") as archive:
    for name, data in files.items():
        archive.writestr(name, data)
    archive.writestr("cordon_demo-0.1.dist-info/RECORD", record)
name = "cordon_demo-0.1-py3-none-any.whl"
digest = put(f"packages/{name}", wheel.getvalue())
put("simple/cordon-demo/index.html", f'<html><body><a href="../../packages/{name}#sha256={digest}">{name}</a></body></html>'.encode())
crate = io.BytesIO()
with tarfile.open(fileobj=crate, mode="w:gz") as archive:
    for path, data in {
        "cordondemo-0.1.0/Cargo.toml": b'[package]\nname = "cordondemo"\nversion = "0.1.0"\nedition = "2021"\n',
        "cordondemo-0.1.0/src/lib.rs": b"pub const VALUE: u32 = 42;\n",
    }.items():
        info = tarfile.TarInfo(path)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
cksum = put("dl/cordondemo-0.1.0.crate", crate.getvalue())
put("index/config.json", json.dumps({"dl": f"http://pkg.test:{port}/dl/{{crate}}-{{version}}.crate"}).encode())
line = {"name": "cordondemo", "vers": "0.1.0", "deps": [], "cksum": cksum, "features": {}, "yanked": False}
put("index/co/rd/cordondemo", (json.dumps(line) + "\n").encode())
"#;

fn publish_packages(www: &Path, port: u16) {
    let status = Command::new("python3")
        .arg("-c")
        .arg(PACKAGES)
        .arg(www)
        .arg(port.to_string())
        .status()
        .expect("python3 must be installed");
    assert!(status.success(), "building the test packages failed");
}

/// A crate depending on `cordondemo` from the sparse registry at `pkg.test:PORT`.
fn cargo_project(ws: &Path, port: u16) -> PathBuf {
    let project = ws.join("proj");
    std::fs::create_dir_all(project.join("src")).expect("create project");
    std::fs::create_dir_all(project.join(".cargo")).expect("create .cargo");
    std::fs::write(
        project.join("Cargo.toml"),
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\ncordondemo = { version = \"0.1.0\", registry = \"local\" }\n",
    )
    .expect("write Cargo.toml");
    std::fs::write(project.join("src/lib.rs"), "").expect("write lib.rs");
    std::fs::write(
        project.join(".cargo/config.toml"),
        format!("[registries.local]\nindex = \"sparse+http://pkg.test:{port}/index/\"\n"),
    )
    .expect("write config.toml");
    project
}

/// `cargo fetch` with a private `CARGO_HOME` (the real one is read-only in the sandbox).
const CARGO_FETCH: &str = "CARGO_HOME=$HOME/cargo-home CARGO_TERM_COLOR=never cargo fetch 2>&1 && \
     ls $HOME/cargo-home/registry/cache/*/";

#[tokio::test(flavor = "multi_thread")]
async fn cargo_fetches_from_an_allowed_sparse_registry_only() {
    let d = dirs();
    let origin = Origin::serve(d.www.clone()).await;
    publish_packages(&d.www, origin.port);
    let project = cargo_project(&d.ws, origin.port);
    // The real home: rustup's toolchains live there (read-only to commands).
    let allowed = backend(
        &d.ws,
        &d.state,
        None,
        &[format!("pkg.test:{}", origin.port), "127.0.0.1".to_owned()],
        &[],
    );
    let (out, outcome) = run(&allowed, &project, CARGO_FETCH).await;
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{out}");
    assert!(out.contains("cordondemo-0.1.0.crate"), "{out}");
    assert!(project.join("Cargo.lock").is_file(), "{out}");
    let fetched: Vec<&EgressRecord> = outcome
        .egress
        .iter()
        .filter(|r| r.outcome == EgressOutcome::Allowed)
        .collect();
    assert!(
        fetched.len() >= 3,
        "config, index and crate: {:#?}",
        outcome.egress
    );
    assert!(outcome.egress.iter().all(|r| r.host == "pkg.test"));
    drop(allowed);

    let other = dirs();
    let project = cargo_project(&other.ws, origin.port);
    let refused = backend(
        &other.ws,
        &other.state,
        None,
        &["other.test".to_owned()],
        &[],
    );
    let (out, outcome) = run(&refused, &project, CARGO_FETCH).await;
    assert_ne!(outcome.status, Some(ExitStatus::Code(0)), "{out}");
    // cargo shows the proxy's answer: what was refused and the entry to add.
    assert!(
        out.contains(&format!("no entry allows pkg.test:{}", origin.port)),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "add \"pkg.test:{}\" to [network] allow",
            origin.port
        )),
        "{out}"
    );
    assert!(outcome.egress.iter().any(EgressRecord::is_denied));
}

#[tokio::test(flavor = "multi_thread")]
async fn each_command_gets_its_own_attempts_and_none_outlives_it() {
    let d = dirs();
    let origin = Origin::serve(d.www.clone()).await;
    // A destination that takes a tunnel and never closes it.
    let holder = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hold_port = holder.local_addr().expect("address").port();
    let (held_tx, mut held_rx) = mpsc::channel::<()>(1);
    let holding = tokio::spawn(async move {
        let (mut stream, _) = holder.accept().await.expect("accept");
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
        let _ = held_tx.send(()).await;
        std::future::pending::<()>().await;
    });
    let p = origin.port;
    let allow = vec![format!("pkg.test:{p}"), "127.0.0.1".to_owned()];
    let backend = backend(&d.ws, &d.state, None, &allow, &[]);

    // Two commands at once: each result holds its own attempts only.
    let allowed = format!("curl -sS http://pkg.test:{p}/hello.txt");
    let refused = format!("curl -sS http://other.test:{p}/hello.txt");
    let ((_, first), (_, second)) = tokio::join!(
        run(&backend, &d.ws, &allowed),
        run(&backend, &d.ws, &refused)
    );
    let first = only(&first.egress);
    assert_eq!(
        (first.host.as_str(), first.outcome),
        ("pkg.test", EgressOutcome::Allowed)
    );
    let second = only(&second.egress);
    assert_eq!(
        (second.host.as_str(), second.outcome),
        ("other.test", EgressOutcome::Denied)
    );

    // A connection made and dropped at once is recorded whether the proxy accepted it in
    // time (nothing to read) or the sandbox closed it with the command (never accepted).
    let (out, outcome) = run(
        &backend,
        &d.ws,
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 3128))\"",
    )
    .await;
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{out}");
    let record = only(&outcome.egress);
    assert_eq!(
        (record.protocol, record.outcome),
        (EgressProtocol::Unknown, EgressOutcome::Failed),
        "{record:?}"
    );

    // A tunnel the command leaves open ends with the command: cut, and still recorded.
    let script = format!(
        "import socket\n\
         s = socket.create_connection(('127.0.0.1', 3128))\n\
         s.sendall(b'CONNECT 127.0.0.1:{hold_port} HTTP/1.1\\r\\n\\r\\n')\n\
         print(s.recv(64).decode().strip())"
    );
    let (out, outcome) = run(&backend, &d.ws, &format!("python3 -c \"{script}\"")).await;
    assert!(out.contains("200 Connection established"), "{out}");
    let record = only(&outcome.egress);
    assert_eq!(record.outcome, EgressOutcome::Allowed);
    assert_eq!(
        record.reason,
        "relayed until the command that opened it ended, then cut"
    );
    // The command's side of the tunnel ended before the cut (half-closes are passed on).
    held_rx.recv().await.expect("the holder saw the end");
    holding.abort();
}

/// Answers every question about a destination with "for the session", recording them.
#[derive(Default)]
struct ApproveForSession {
    asked: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl cordon_egress::ask::EgressApprover for ApproveForSession {
    async fn ask(&self, request: cordon_egress::ask::AskRequest) -> cordon_egress::ask::AskAnswer {
        self.asked.lock().expect("asked").push(format!(
            "{}:{} by {} ({}) for {:?}",
            request.host, request.port, request.entry.entry, request.entry.source, request.call
        ));
        cordon_egress::ask::AskAnswer::Session
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_destination_approved_for_the_session_is_reached_and_not_asked_again() {
    let d = dirs();
    let origin = Origin::serve(d.www.clone()).await;
    let p = origin.port;
    let mut spec = SandboxSpec {
        network: NetworkMode::Filtered,
        ..SandboxSpec::default()
    };
    // The IP entry lets the test name's loopback address pass the address check.
    spec.egress.allow = vec![format!("127.0.0.1/32:{p}")];
    spec.egress.ask = vec![format!("*.ask.test:{p}")];
    spec.sources.file = POLICY.to_owned();
    spec.sources.egress_allow = vec![10];
    spec.sources.egress_ask = vec![30];
    let loopback: Vec<IpAddr> = vec!["127.0.0.1".parse().expect("ip")];
    let resolver = StaticResolver::new([("pkg.ask.test", loopback)]);
    let approver = Arc::new(ApproveForSession::default());
    let backend = LocalBackend::with_egress(
        LocalConfig {
            profile: cordon_backend_local::Profile::Host,
            workspace_is_copy: false,
            root: d.ws.clone(),
            spec,
            home: None,
            state_base: Some(d.state.clone()),
        },
        Some(Arc::new(resolver)),
        Some(approver.clone()),
    )
    .expect("create a filtered backend");
    let command = format!("curl -sS http://pkg.ask.test:{p}/hello.txt");
    // The question names the call whose command connected.
    let (out, outcome) = run_for(&backend, &d.ws, &command, Some("call-7")).await;
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{out}");
    assert_eq!(out, "hello through the proxy\n");
    let record = only(&outcome.egress);
    assert_eq!(
        (
            record.outcome,
            record.asked,
            record.source.as_deref(),
            record.entry.as_deref()
        ),
        (
            EgressOutcome::Allowed,
            Some(cordon_ops::EgressAsked::Session),
            Some("policy.toml:30"),
            Some(format!("*.ask.test:{p}").as_str())
        )
    );
    // The next command reaches it without a question.
    let (out, outcome) = run(&backend, &d.ws, &command).await;
    assert_eq!(out, "hello through the proxy\n");
    assert_eq!(
        only(&outcome.egress).asked,
        Some(cordon_ops::EgressAsked::Remembered)
    );
    assert_eq!(
        *approver.asked.lock().expect("asked"),
        vec![format!(
            "pkg.ask.test:{p} by *.ask.test:{p} (policy.toml:30) for Some(\"call-7\")"
        )]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_destination_without_an_approver_is_refused_naming_the_ask_entry() {
    let d = dirs();
    let origin = Origin::serve(d.www.clone()).await;
    let p = origin.port;
    let mut spec = SandboxSpec {
        network: NetworkMode::Filtered,
        ..SandboxSpec::default()
    };
    spec.egress.allow = vec![format!("127.0.0.1/32:{p}")];
    spec.egress.ask = vec![format!("*.ask.test:{p}")];
    spec.sources.file = POLICY.to_owned();
    spec.sources.egress_allow = vec![10];
    spec.sources.egress_ask = vec![30];
    let loopback: Vec<IpAddr> = vec!["127.0.0.1".parse().expect("ip")];
    let resolver = StaticResolver::new([("pkg.ask.test", loopback)]);
    let backend = LocalBackend::with_egress_resolver(
        LocalConfig {
            profile: cordon_backend_local::Profile::Host,
            workspace_is_copy: false,
            root: d.ws.clone(),
            spec,
            home: None,
            state_base: Some(d.state.clone()),
        },
        Arc::new(resolver),
    )
    .expect("create a filtered backend");
    let (out, outcome) = run(
        &backend,
        &d.ws,
        &format!("curl -sS http://pkg.ask.test:{p}/hello.txt"),
    )
    .await;
    assert!(
        out.contains(&format!(
            "ask entry \"*.ask.test:{p}\" (policy.toml:30) matches pkg.ask.test:{p}, which needs \
             approval, and nobody can be asked about it here"
        )),
        "{out}"
    );
    let record = only(&outcome.egress);
    assert_eq!(
        (record.outcome, record.asked),
        (
            EgressOutcome::Denied,
            Some(cordon_ops::EgressAsked::NoApprover)
        )
    );
}
