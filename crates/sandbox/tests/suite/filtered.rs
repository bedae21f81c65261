//! The filtered network: each init has a private network namespace with only loopback, whose
//! one way off is the egress listener handed to this process. Commands reach nothing else
//! (no host address, not the host's loopback, no UDP out, no netlink), as root and through a
//! user namespace, while their own loopback servers work; and a pooled init's listener
//! carries only the current command's connections.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cordon_sandbox::{
    EGRESS_PORT, HostSupport, NetworkAccess, PreparedSandbox, SandboxedChild, SpawnRequest,
};

use crate::support::{Fixture, Output, TIMEOUT};

fn filtered(fx: &Fixture, support: HostSupport) -> PreparedSandbox {
    let mut config = fx.config();
    config.network = NetworkAccess::Filtered;
    PreparedSandbox::prepare_with_support(config, support).expect("prepare a filtered sandbox")
}

/// A host listener on 127.0.0.1 counting the connections it gets.
struct HostListener {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl HostListener {
    fn start() -> HostListener {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a host listener");
        let port = listener.local_addr().expect("address").port();
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                if connection.is_ok() {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        HostListener { port, hits }
    }
}

fn spawn(sandbox: &PreparedSandbox, cwd: &Path, script: &str) -> (SandboxedChild, Captured) {
    let (out_read, out_write) = std::io::pipe().unwrap();
    let (err_read, err_write) = std::io::pipe().unwrap();
    let child = sandbox
        .spawn(SpawnRequest {
            program: "python3".into(),
            args: vec!["-c".into(), script.into()],
            cwd: cwd.to_path_buf(),
            env: Vec::new(),
            stdin: None,
            stdout: Some(out_write.into()),
            stderr: Some(err_write.into()),
        })
        .unwrap_or_else(|error| panic!("spawn failed: {error}"));
    (child, Captured::start(out_read, err_read))
}

struct Captured {
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl Captured {
    fn start(out: std::io::PipeReader, err: std::io::PipeReader) -> Captured {
        let read = |mut pipe: std::io::PipeReader| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = pipe.read_to_string(&mut text);
                text
            })
        };
        Captured {
            stdout: read(out),
            stderr: read(err),
        }
    }

    async fn finish(self, child: &mut SandboxedChild) -> Output {
        let status = tokio::time::timeout(TIMEOUT, child.wait())
            .await
            .expect("the command ends")
            .expect("wait");
        Output {
            status,
            stdout: self.stdout.join().unwrap(),
            stderr: self.stderr.join().unwrap(),
        }
    }
}

/// Accept one connection on the egress listener, read a line, answer (a task).
fn answer_one(listener: TcpListener, reply: &'static str) -> tokio::task::JoinHandle<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::from_std(listener).expect("register the listener");
    tokio::spawn(async move {
        let (mut connection, _) = listener.accept().await.expect("accept");
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while connection.read(&mut byte).await.unwrap_or(0) == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        connection.write_all(reply.as_bytes()).await.expect("reply");
        String::from_utf8_lossy(&line).into_owned()
    })
}

/// The line the command sent, once its output shows it got `reply` (else the output).
async fn served_line(
    served: tokio::task::JoinHandle<String>,
    output: &Output,
    reply: &str,
) -> String {
    if !output.stdout.contains(reply) {
        served.abort();
        panic!(
            "the command did not get {reply:?} through the egress listener: {}",
            output.all()
        );
    }
    served.await.expect("the serving task")
}

const PROBE: &str = r#"
import errno, socket, sys
port, host_port = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port), timeout=60)
s.sendall(b"hello-from-sandbox\n")
print("egress:", s.recv(64).decode())
def attempt(label, action):
    try:
        action()
        print(label, "ok")
    except OSError as error:
        print(label, errno.errorcode.get(error.errno, error.errno))
attempt("host-loopback", lambda: socket.create_connection(("127.0.0.1", host_port), timeout=5))
attempt("other-address", lambda: socket.create_connection(("10.1.2.3", 80), timeout=5))
attempt("ipv6", lambda: socket.create_connection(("::1", host_port), timeout=5))
attempt("udp-dns", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
def own_server():
    server = socket.socket()
    server.bind(("127.0.0.1", 8080))
    server.listen(1)
    client = socket.create_connection(("127.0.0.1", 8080), timeout=5)
    accepted, _ = server.accept()
    client.sendall(b"ping")
    if accepted.recv(4) != b"ping":
        raise OSError(errno.EIO, "the own server got something else")
attempt("own-server", own_server)
"#;

/// What the probe reports: the host's loopback and every other address are out of reach (the
/// host's ports are another namespace's, nothing routes off it), a command's own loopback
/// server works.
const CONFINED: [&str; 6] = [
    "host-loopback ECONNREFUSED",
    "other-address ENETUNREACH",
    "ipv6 ECONNREFUSED",
    "udp-dns ENETUNREACH",
    "netlink EPERM",
    "own-server ok",
];

async fn only_the_egress_listener_is_reachable(support: HostSupport, refusals: &[&str]) {
    let fx = Fixture::new();
    let host = HostListener::start();
    let sandbox = filtered(&fx, support);
    let script = format!("{PROBE}\nimport sys\n");
    let (mut child, captured) = spawn(
        &sandbox,
        &fx.ws,
        &format!(
            "import sys; sys.argv = ['p', '{EGRESS_PORT}', '{}']\n{script}",
            host.port
        ),
    );
    let listener = child
        .egress_listener()
        .expect("duplicate the listener")
        .expect("a filtered sandbox has an egress listener");
    assert_eq!(
        listener.local_addr().expect("address").to_string(),
        format!("127.0.0.1:{EGRESS_PORT}")
    );
    let served = answer_one(listener, "via-egress");
    let output = captured.finish(&mut child).await;
    assert_eq!(
        served_line(served, &output, "via-egress").await,
        "hello-from-sandbox"
    );
    let all = output.all();
    assert!(output.status.success(), "{all}");
    assert!(all.contains("egress: via-egress"), "{all}");
    // The host's own loopback is another namespace's: nothing listens on that port here.
    for refused in refusals {
        assert!(all.contains(refused), "expected {refused:?}: {all}");
    }
    assert_eq!(host.hits.load(Ordering::SeqCst), 0, "the host was reached");
}

#[tokio::test(flavor = "multi_thread")]
async fn filtered_commands_reach_only_the_egress_listener() {
    only_the_egress_listener_is_reachable(cordon_sandbox::probe(), &CONFINED).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn filtered_commands_are_confined_through_a_user_namespace_too() {
    only_the_egress_listener_is_reachable(
        HostSupport {
            root: false,
            ..cordon_sandbox::probe()
        },
        &CONFINED,
    )
    .await;
}

/// Landlock's TCP rules play no part: an older Landlock confines the same.
#[tokio::test(flavor = "multi_thread")]
async fn without_landlock_tcp_the_namespace_alone_confines() {
    only_the_egress_listener_is_reachable(
        HostSupport {
            landlock_abi: 3,
            ..cordon_sandbox::probe()
        },
        &CONFINED,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_init_hands_the_next_command_only_its_own_connections() {
    let fx = Fixture::new();
    let sandbox = filtered(&fx, cordon_sandbox::probe());
    // The first command connects and ends without its connection being accepted.
    let leave = format!(
        "import socket; s = socket.create_connection(('127.0.0.1', {EGRESS_PORT})); s.sendall(b'first\\n'); print('connected')"
    );
    let (mut first, captured) = spawn(&sandbox, &fx.ws, &leave);
    let first_pid = first.pid();
    let output = captured.finish(&mut first).await;
    assert!(output.stdout.contains("connected"), "{}", output.all());
    assert_eq!(first.unaccepted_connections(), 1, "closed with the command");
    drop(first);
    assert!(sandbox.has_idle_init(), "the init went back to the pool");
    let talk = format!(
        "import socket; s = socket.create_connection(('127.0.0.1', {EGRESS_PORT})); s.sendall(b'second\\n'); print(s.recv(16).decode())"
    );
    let (mut second, captured) = spawn(&sandbox, &fx.ws, &talk);
    assert_eq!(
        second.pid(),
        first_pid,
        "the same init serves the second command"
    );
    let listener = second.egress_listener().unwrap().unwrap();
    let served = answer_one(listener, "answer");
    let output = captured.finish(&mut second).await;
    assert_eq!(
        served_line(served, &output, "answer").await,
        "second",
        "{}",
        output.all()
    );
}

#[test]
fn other_network_modes_have_no_egress_listener() {
    let fx = Fixture::new();
    for network in [NetworkAccess::Off, NetworkAccess::On] {
        let mut config = fx.config();
        config.network = network;
        let sandbox = PreparedSandbox::prepare(config).expect("prepare");
        let mut child = sandbox
            .spawn(SpawnRequest {
                program: "true".into(),
                args: Vec::new(),
                cwd: fx.ws.clone(),
                env: Vec::new(),
                stdin: None,
                stdout: None,
                stderr: None,
            })
            .expect("spawn");
        assert!(child.egress_listener().expect("no error").is_none());
        child.wait_blocking().expect("wait");
    }
}

#[test]
fn a_filtered_network_without_its_namespace_is_refused_even_degraded() {
    let fx = Fixture::new();
    let mut config = fx.config();
    config.network = NetworkAccess::Filtered;
    config.allow_degraded = true;
    let result = PreparedSandbox::prepare_with_support(
        config,
        HostSupport {
            network_namespaces: false,
            ..cordon_sandbox::probe()
        },
    );
    match result {
        Err(cordon_sandbox::SandboxError::MissingLayers { layers }) => {
            assert_eq!(layers, vec![cordon_sandbox::Layer::NetworkNamespace]);
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("a filtered sandbox without a network namespace was prepared"),
    }
}
