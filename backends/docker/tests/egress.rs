//! Filtered network mode: the container has no network; commands reach allowed destinations
//! through the session's egress proxy (in this process, behind a Unix socket mounted into the
//! container and `cordon-helper forward` inside), and nothing else. The destinations are
//! servers of this test on the host's loopback, named through a resolver the test controls.
//! What this backend does of its own (the forwarder, refused configurations, overlapping
//! commands, SOCKS5, ask entries) is here; the cases every backend shares are the cross-backend
//! egress suite (`cargo test -p cordon-tests --test egress docker_helper::`).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use cordon_backend_docker::{DockerBackend, DockerError, EgressResolver, WorkspaceMode};
use cordon_core::sandbox::NetworkMode;
use cordon_egress::proxy::StaticResolver;
use cordon_ops::{EgressOutcome, EgressProtocol, EgressRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::{self, BUSYBOX, helper, host_or_skip, run, workspace};

/// A host server answering every HTTP request with a body naming the request line.
async fn http_server(listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let text = String::from_utf8_lossy(&head);
            let line = text.lines().next().unwrap_or_default().to_owned();
            let body = format!("host server saw: {line}");
            let reply = format!(
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// A filtered session allowing `allowed.test` on `port` and the loopback address it resolves
/// to (an allowed name resolving to a loopback address is refused without that entry).
async fn filtered_session(
    host: &str,
    root: &std::path::Path,
    port: u16,
    image: &str,
) -> Result<DockerBackend, DockerError> {
    let mut config = support::config(host, root);
    config.image = image.to_owned();
    config.spec.network = NetworkMode::Filtered;
    config.spec.egress.allow = vec![
        format!("allowed.test:{port}"),
        format!("127.0.0.1:{port}"),
        format!("rebound.test:{port}"),
    ];
    config.spec.sources.file = "policy.toml".to_owned();
    config.spec.sources.egress_allow = vec![4, 5, 6];
    config.helper = Some(helper());
    let loopback = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    config.egress_resolver = Some(EgressResolver(Arc::new(StaticResolver::new([
        ("allowed.test", loopback.clone()),
        ("denied.test", loopback),
        // Allowed by name, resolving to a loopback address no IP entry allows.
        (
            "rebound.test",
            vec![IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))],
        ),
    ]))));
    DockerBackend::start(config).await
}

fn only(records: &[EgressRecord]) -> &EgressRecord {
    assert_eq!(records.len(), 1, "{records:#?}");
    &records[0]
}

/// Commands cannot stop the forwarder (another uid, no capabilities); one that ended anyway
/// (killed from the host here) is replaced before the next command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarder_survives_commands_and_is_restarted_when_it_ended() {
    let host = host_or_skip!();
    let ws = workspace();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(http_server(listener));
    let backend = filtered_session(&host, ws.path(), port, support::DEBIAN)
        .await
        .expect("a filtered session starts");
    let fetch = format!(
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://allowed.test:{port}/again').read().decode())\""
    );

    // The pattern does not match its own command line.
    let ran = run(
        &backend,
        "pkill -9 -f 'cordon-helper [f]orward' 2>&1; echo done",
    )
    .await;
    assert!(
        ran.output.contains("Operation not permitted"),
        "{}",
        ran.output
    );
    assert!(ran.output.contains("done"), "{}", ran.output);
    let ran = run(&backend, &fetch).await;
    assert!(
        ran.output.contains("host server saw: GET /again"),
        "{}",
        ran.output
    );

    let pid = forwarder_host_pid(&backend)
        .await
        .expect("the forwarder runs");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    // Wait for the engine to see it gone (its state, not a delay).
    while forwarder_host_pid(&backend).await.as_deref() == Some(pid.as_str()) {
        tokio::task::yield_now().await;
    }
    let ran = run(&backend, &fetch).await;
    assert!(
        ran.output.contains("host server saw: GET /again"),
        "{}",
        ran.output
    );
    assert_eq!(ran.outcome.egress.len(), 1, "{:?}", ran.outcome.egress);
    let again = forwarder_host_pid(&backend)
        .await
        .expect("a new forwarder runs");
    assert_ne!(again, pid);
    backend.stop().await.expect("stop");
}

/// The host pid of the forwarder in the session's container, from the engine's process list.
async fn forwarder_host_pid(backend: &DockerBackend) -> Option<String> {
    let top = backend
        .docker()
        .top_processes(
            backend.container(),
            None::<bollard::query_parameters::TopOptions>,
        )
        .await
        .expect("list the container's processes");
    let titles = top.titles.unwrap_or_default();
    let pid_at = titles.iter().position(|t| t == "PID")?;
    let cmd_at = titles.iter().position(|t| t == "CMD" || t == "COMMAND")?;
    top.processes
        .unwrap_or_default()
        .into_iter()
        .find(|row| {
            row.get(cmd_at)
                .is_some_and(|cmd| cmd.contains("cordon-helper forward"))
        })
        .and_then(|row| row.get(pid_at).cloned())
}

/// The busybox image (`FROM scratch`, no C library) cannot run a glibc helper: the session
/// is refused with the reason, and no container is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_run_the_helper_is_refused() {
    let host = host_or_skip!();
    let ws = workspace();
    let err = filtered_session(&host, ws.path(), 8080, BUSYBOX)
        .await
        .expect_err("busybox cannot run the glibc helper");
    let text = err.to_string();
    assert!(matches!(err, DockerError::Forwarder { .. }), "{text}");
    assert!(
        text.contains("failed to start the egress forwarder"),
        "{text}"
    );
    assert!(
        text.contains("the image cannot run the helper binary"),
        "{text}"
    );
    assert!(text.contains("commands cannot reach the network"), "{text}");
    let container = text
        .split("in container ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .expect("the error names the container");
    assert!(
        !support::container_exists(&host, container).await,
        "{container} was left behind"
    );
}

/// Copy mode (an engine elsewhere) cannot reach a host socket, and a helper that is not an
/// executable for the engine is refused by name, before any container exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configurations_that_cannot_run_filtered_mode_are_refused_with_the_reason() {
    let host = host_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.spec.network = NetworkMode::Filtered;
    config.spec.egress.allow = vec!["crates.io".to_owned()];
    config.spec.sources.file = "policy.toml".to_owned();
    config.spec.sources.egress_allow = vec![7];
    config.helper = Some(helper());
    config.mode = WorkspaceMode::Copy;
    let err = DockerBackend::start(config.clone())
        .await
        .expect_err("copy mode cannot reach the socket");
    assert_eq!(
        err.to_string(),
        "failed to start the container: filtered network mode (policy.toml:7) cannot run here: \
         copy mode (an engine on another machine) cannot reach the egress proxy's socket on \
         this host; use a local engine with bind mode; fix that, remove `[network] allow` or \
         use --backend local"
    );

    let script = ws.path().join("not-a-helper");
    std::fs::write(&script, "#!/bin/sh\n").expect("write");
    config.mode = WorkspaceMode::Bind;
    config.helper = Some(script.clone());
    let err = DockerBackend::start(config)
        .await
        .expect_err("not an executable");
    assert_eq!(
        err.to_string(),
        format!(
            "failed to start the container: filtered network mode (policy.toml:7) cannot run \
             here: {} cannot run in the container: it is not an ELF executable; fix that, \
             remove `[network] allow` or use --backend local",
            script.display()
        )
    );
}

/// A tunnel whose destination never closes outlives its command only for the grace: it is then
/// cut and reported with that command, the reason saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_left_open_is_cut_when_its_command_ends_and_still_recorded() {
    let host = host_or_skip!();
    let ws = workspace();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // Accepts, reads to the end, and holds the connection open for ever.
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut sink = Vec::new();
            let _ = stream.read_to_end(&mut sink).await;
            held.push(stream);
        }
    });
    let backend = filtered_session(&host, ws.path(), port, support::DEBIAN)
        .await
        .expect("a filtered session starts");
    let ran = run(
        &backend,
        &format!(
            "python3 -c \"\nimport socket\ns = socket.create_connection(('127.0.0.1', 3128))\ns.sendall(b'CONNECT allowed.test:{port} HTTP/1.1\\r\\nHost: allowed.test:{port}\\r\\n\\r\\n')\nprint(s.recv(100).decode().splitlines()[0])\ns.sendall(b'bytes for the far side')\n\""
        ),
    )
    .await;
    assert!(ran.output.contains(" 200 "), "{}", ran.output);
    let record = only(&ran.outcome.egress);
    assert_eq!(record.outcome, EgressOutcome::Allowed, "{record:?}");
    assert!(record.reason.contains("then cut"), "{record:?}");
    backend.stop().await.expect("stop");
}

/// SOCKS5 (`ALL_PROXY=socks5h://…`, the name resolved by the proxy) leads to an allowed
/// destination through the same forwarder, and is refused (reply 2) for another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_from_all_proxy_reaches_allowed_hosts_only() {
    let host = host_or_skip!();
    let ws = workspace();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(http_server(listener));
    let backend = filtered_session(&host, ws.path(), port, support::DEBIAN)
        .await
        .expect("a filtered session starts");
    // A minimal SOCKS5 client: no authentication, CONNECT by name (the proxy resolves it).
    let socks = |name: &str| {
        format!(
            "python3 -c \"\nimport os, socket, struct, urllib.parse\nproxy = urllib.parse.urlsplit(os.environ['ALL_PROXY'])\nassert proxy.scheme == 'socks5h', proxy\ns = socket.create_connection((proxy.hostname, proxy.port))\ns.sendall(b'\\x05\\x01\\x00')\nassert s.recv(2) == b'\\x05\\x00'\nname = b'{name}'\ns.sendall(b'\\x05\\x01\\x00\\x03' + bytes([len(name)]) + name + struct.pack('>H', {port}))\nreply = s.recv(10)\nprint('reply', reply[1])\nif reply[1] == 0:\n    s.sendall(b'GET /socks HTTP/1.0\\r\\n\\r\\n')\n    print(s.recv(200).decode().splitlines()[-1])\n\""
        )
    };
    let ran = run(&backend, &socks("allowed.test")).await;
    assert!(ran.output.contains("reply 0"), "{}", ran.output);
    assert!(
        ran.output.contains("host server saw: GET /socks"),
        "{}",
        ran.output
    );
    let record = only(&ran.outcome.egress);
    assert_eq!(record.protocol, EgressProtocol::Socks5);
    assert_eq!(record.outcome, EgressOutcome::Allowed);

    let ran = run(&backend, &socks("denied.test")).await;
    assert!(ran.output.contains("reply 2"), "{}", ran.output);
    let record = only(&ran.outcome.egress);
    assert_eq!(record.protocol, EgressProtocol::Socks5);
    assert_eq!(record.outcome, EgressOutcome::Denied);
    backend.stop().await.expect("stop");
}

/// Commands that overlap share the forwarder, so each is given every connection accepted
/// while it ran: here both see both fetches (each command waits for the other's marker file,
/// so the two fetches happen while both run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_commands_each_get_the_connections_made_while_they_ran() {
    let host = host_or_skip!();
    let ws = workspace();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(http_server(listener));
    let backend = filtered_session(&host, ws.path(), port, support::DEBIAN)
        .await
        .expect("a filtered session starts");
    let fetch = |path: &str| {
        format!(
            "python3 -c \"import urllib.request; urllib.request.urlopen('http://allowed.test:{port}/{path}').read()\""
        )
    };
    // The markers live in the workspace, which both commands share (each command gets a
    // private temporary directory of its own).
    let wait = |file: &str| format!("while [ ! -e {file} ]; do sleep 0.05; done");
    let first = format!(
        "touch a-started; {}; {}; touch a-done; {}; echo a",
        wait("b-started"),
        fetch("a"),
        wait("b-done")
    );
    let second = format!(
        "touch b-started; {}; {}; touch b-done; echo b",
        wait("a-done"),
        fetch("b")
    );
    let (a, b) = tokio::join!(run(&backend, &first), run(&backend, &second));
    // The last line, not any letter: a timeout's message would contain both.
    assert_eq!(a.output.lines().last(), Some("a"), "{}", a.output);
    assert_eq!(b.output.lines().last(), Some("b"), "{}", b.output);
    for ran in [&a, &b] {
        assert_eq!(ran.outcome.egress.len(), 2, "{:?}", ran.outcome.egress);
        assert!(
            ran.outcome
                .egress
                .iter()
                .all(|r| r.outcome == EgressOutcome::Allowed),
            "{:?}",
            ran.outcome.egress
        );
    }
    backend.stop().await.expect("stop");
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
            "{}:{} ({})",
            request.host, request.port, request.entry.source
        ));
        cordon_egress::ask::AskAnswer::Session
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_destination_approved_for_the_session_is_reached_and_not_asked_again() {
    let host = host_or_skip!();
    let ws = workspace();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(http_server(listener));
    let mut config = support::config(&host, ws.path());
    config.image = support::DEBIAN.to_owned();
    config.spec.network = NetworkMode::Filtered;
    // The IP entry lets the test name's loopback address pass the address check.
    config.spec.egress.allow = vec![format!("127.0.0.1:{port}")];
    config.spec.egress.ask = vec![format!("*.ask.test:{port}")];
    config.spec.sources.file = "policy.toml".to_owned();
    config.spec.sources.egress_allow = vec![4];
    config.spec.sources.egress_ask = vec![7];
    config.helper = Some(helper());
    config.egress_resolver = Some(EgressResolver(Arc::new(StaticResolver::new([(
        "pkg.ask.test",
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    )]))));
    let approver = Arc::new(ApproveForSession::default());
    config.egress_asker = Some(cordon_backend_docker::EgressAsker(approver.clone()));
    let backend = DockerBackend::start(config)
        .await
        .expect("a filtered session starts");
    let fetch = format!(
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://pkg.ask.test:{port}/asked').read().decode())\""
    );
    let ran = run(&backend, &fetch).await;
    assert!(
        ran.output.contains("host server saw: GET /asked"),
        "{}",
        ran.output
    );
    let record = only(&ran.outcome.egress);
    assert_eq!(
        (record.outcome, record.asked, record.source.as_deref()),
        (
            EgressOutcome::Allowed,
            Some(cordon_ops::EgressAsked::Session),
            Some("policy.toml:7")
        )
    );
    let ran = run(&backend, &fetch).await;
    assert!(
        ran.output.contains("host server saw: GET /asked"),
        "{}",
        ran.output
    );
    assert_eq!(
        only(&ran.outcome.egress).asked,
        Some(cordon_ops::EgressAsked::Remembered)
    );
    assert_eq!(
        *approver.asked.lock().expect("asked"),
        vec![format!("pkg.ask.test:{port} (policy.toml:7)")]
    );
    backend.stop().await.expect("stop");
}

/// Records the call each question names (and refuses), telling the test when it asked.
struct CallsAsked {
    calls: std::sync::Mutex<Vec<Option<String>>>,
    asked: tokio::sync::mpsc::UnboundedSender<()>,
}

#[async_trait::async_trait]
impl cordon_egress::ask::EgressApprover for CallsAsked {
    async fn ask(&self, request: cordon_egress::ask::AskRequest) -> cordon_egress::ask::AskAnswer {
        self.calls
            .lock()
            .expect("calls")
            .push(request.call.as_deref().map(str::to_owned));
        let _ = self.asked.send(());
        cordon_egress::ask::AskAnswer::Deny
    }
}

/// Starts `command` as tool call `call`: its output as it comes, and its outcome.
fn start_call(
    backend: &DockerBackend,
    command: &str,
    call: &str,
) -> (
    tokio::sync::mpsc::Receiver<Vec<u8>>,
    tokio::task::JoinHandle<cordon_ops::ExecOutcome>,
) {
    let bash = cordon_ops::Backend::bash(backend);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let request = cordon_ops::ExecRequest {
        call_id: Some(call.to_owned()),
        command: command.to_owned(),
        cwd: std::path::PathBuf::from("/workspace"),
        timeout: std::time::Duration::from_secs(120),
        env: vec![],
    };
    let outcome = tokio::spawn(async move {
        bash.exec(request, tokio_util::sync::CancellationToken::new(), tx)
            .await
            .expect("exec runs")
    });
    (rx, outcome)
}

/// Until the output read from `rx` holds `text`.
async fn output_until(rx: &mut tokio::sync::mpsc::Receiver<Vec<u8>>, text: &str) {
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains(text) {
        let chunk = rx.recv().await.expect("the command's output");
        seen.extend_from_slice(&chunk);
    }
}

/// Whether the process `pid` (a host pid) has bytes waiting on its standard input (a pipe).
#[allow(unsafe_code)]
fn stdin_waiting(pid: &str) -> bool {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(stdin) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/0"))
    else {
        return false;
    };
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD stores one int at the pointer given.
    let done = unsafe { libc::ioctl(stdin.as_raw_fd(), libc::FIONREAD, &mut waiting) };
    done == 0 && waiting > 0
}

/// Sends `signal` to the host process `pid`.
fn signal(pid: &str, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .expect("kill");
    assert!(sent.success());
}

/// A connection call A's command made can wait in the forwarder's queue (here: the forwarder
/// is stopped from the host) after the command ended. It is still A's: its question names A
/// and its record is in A's result, never B's, whose command runs next. Without the end
/// barrier A's result came back at once, B's command ran when the forwarder went on, and the
/// connection was taken for B's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_waiting_in_the_forwarder_when_its_command_ends_stays_that_call_s() {
    let host = host_or_skip!();
    let ws = workspace();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(http_server(listener));
    let mut config = support::config(&host, ws.path());
    config.image = support::DEBIAN.to_owned();
    config.spec.network = NetworkMode::Filtered;
    config.spec.egress.ask = vec![format!("pkg.ask.test:{port}")];
    config.spec.sources.file = "policy.toml".to_owned();
    config.spec.sources.egress_ask = vec![7];
    config.helper = Some(helper());
    config.files_helper = cordon_backend_docker::FilesHelper::Required;
    let (asked_tx, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let approver = Arc::new(CallsAsked {
        calls: std::sync::Mutex::default(),
        asked: asked_tx,
    });
    config.egress_asker = Some(cordon_backend_docker::EgressAsker(approver.clone()));
    let backend = DockerBackend::start(config)
        .await
        .expect("a filtered session starts");
    // The first command starts the forwarder.
    let ran = run(&backend, "true").await;
    assert!(ran.outcome.egress.is_empty());
    let forwarder = forwarder_host_pid(&backend)
        .await
        .expect("the forwarder runs");
    signal(&forwarder, "-STOP");

    // A's connection is made (into the stopped forwarder's queue) and A's command ends.
    let request = format!(
        "GET http://pkg.ask.test:{port}/held HTTP/1.1\\r\\nHost: pkg.ask.test:{port}\\r\\n\\r\\n"
    );
    let (mut a_output, a) = start_call(
        &backend,
        &format!(
            "python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', 3128)); \
             s.sendall(b'{request}'); print('sent', flush=True)\""
        ),
        "call-A",
    );
    output_until(&mut a_output, "sent").await;
    let b_command = "echo b-running; while [ ! -e release ]; do sleep 0.05; done";
    // A's end now waits for the forwarder (its flush line is waiting on its stdin), or, had it
    // not, A's result is back: B starts before the forwarder goes on.
    loop {
        if a.is_finished() {
            break;
        }
        if stdin_waiting(&forwarder) {
            break;
        }
        tokio::task::yield_now().await;
    }
    let (a_outcome, (mut b_output, b)) = if a.is_finished() {
        let b = start_call(&backend, b_command, "call-B");
        let mut b_output = b.0;
        output_until(&mut b_output, "b-running").await;
        signal(&forwarder, "-CONT");
        (a.await.expect("A"), (b_output, b.1))
    } else {
        signal(&forwarder, "-CONT");
        let a_outcome = a.await.expect("A");
        let (mut b_output, b) = start_call(&backend, b_command, "call-B");
        output_until(&mut b_output, "b-running").await;
        (a_outcome, (b_output, b))
    };
    asked.recv().await.expect("the question was asked");
    std::fs::write(ws.path().join("release"), b"").expect("release B");
    while b_output.recv().await.is_some() {}
    let b_outcome = b.await.expect("B");
    assert_eq!(
        *approver.calls.lock().expect("calls"),
        vec![Some("call-A".to_owned())],
        "the question names A"
    );
    let record = only(&a_outcome.egress);
    assert_eq!(
        (record.host.as_str(), record.port),
        ("pkg.ask.test", port),
        "{record:?}"
    );
    assert!(b_outcome.egress.is_empty(), "{:?}", b_outcome.egress);
    backend.stop().await.expect("stop");
}
