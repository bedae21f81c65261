//! Host Unix sockets with the network on: none is reachable unless the configuration names
//! it; sockets made inside the sandbox keep working.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cordon_sandbox::PreparedSandbox;

use crate::support::{Fixture, run_in, unique};

/// Listeners outside every sandbox root, counting who reaches them.
struct HostSockets {
    stream: PathBuf,
    datagram: PathBuf,
    abstract_name: String,
    hits: Arc<AtomicUsize>,
}

impl HostSockets {
    fn start(dir: &Path) -> HostSockets {
        let hits = Arc::new(AtomicUsize::new(0));
        let stream = dir.join("host.sock");
        let abstract_name = unique("cordon-net-abstract");
        let listeners = [
            UnixListener::bind(&stream).unwrap(),
            UnixListener::bind_addr(
                &SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap(),
            )
            .unwrap(),
        ];
        for listener in listeners {
            let hits = Arc::clone(&hits);
            std::thread::spawn(move || {
                for mut connection in listener.incoming().flatten() {
                    hits.fetch_add(1, Ordering::SeqCst);
                    let _ = std::io::Write::write_all(&mut connection, b"host-reply\n");
                }
            });
        }
        let datagram = dir.join("host.dgram");
        let socket = UnixDatagram::bind(&datagram).unwrap();
        let counter = Arc::clone(&hits);
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while socket.recv(&mut buf).is_ok() {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        HostSockets {
            stream,
            datagram,
            abstract_name,
            hits,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn networked(fx: &Fixture, allowed: &[PathBuf]) -> PreparedSandbox {
    let mut config = fx.config();
    config.network = cordon_sandbox::NetworkAccess::On;
    config.unix_sockets = allowed.to_vec();
    PreparedSandbox::prepare(config).expect("prepare a networked sandbox")
}

const CONNECT: &str = r#"import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1].replace("@", "\0", 1))
print("reply:", s.recv(64).decode().strip())"#;

/// Host sockets that exist on this machine outside the test (daemons' sockets under `/run`),
/// a few levels deep.
fn host_daemon_sockets() -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let mut found = Vec::new();
    let mut dirs = vec![(PathBuf::from("/run"), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_socket() {
                found.push(entry.path());
            } else if kind.is_dir() && depth < 3 {
                dirs.push((entry.path(), depth + 1));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn networked_commands_reach_no_host_unix_socket() {
    let fx = Fixture::new();
    let host = HostSockets::start(&fx.out);
    let sandbox = networked(&fx, &[]);
    let mut targets = vec![
        host.stream.display().to_string(),
        format!("@{}", host.abstract_name),
    ];
    targets.extend(
        host_daemon_sockets()
            .iter()
            .map(|path| path.display().to_string()),
    );
    for target in &targets {
        let output = run_in(
            &sandbox,
            &fx.ws,
            &format!("python3 -c '{CONNECT}' '{target}'"),
        )
        .await;
        assert!(
            !output.status.success() && !output.stdout.contains("reply:"),
            "connected to the host socket {target}: {}",
            output.all()
        );
    }
    let output = run_in(
        &sandbox,
        &fx.ws,
        &format!(
            "python3 -c 'import socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b\"x\", \"{}\")'",
            host.datagram.display()
        ),
    )
    .await;
    assert!(!output.status.success(), "datagram sent: {}", output.all());
    assert_eq!(host.hits(), 0, "a host listener was reached");
    // The network itself is on.
    let output = run_in(&sandbox, &fx.ws, "getent hosts localhost").await;
    assert!(output.status.success(), "{}", output.all());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listed_host_socket_is_reachable_and_nothing_else() {
    let fx = Fixture::new();
    let host = HostSockets::start(&fx.out);
    let sandbox = networked(
        &fx,
        &[
            host.stream.clone(),
            fx.out.join("missing.sock"),
            fx.out.join(".."),
        ],
    );
    let output = run_in(
        &sandbox,
        &fx.ws,
        &format!("python3 -c '{CONNECT}' '{}'", host.stream.display()),
    )
    .await;
    assert!(output.status.success(), "{}", output.all());
    assert!(
        output.stdout.contains("reply: host-reply"),
        "{}",
        output.all()
    );
    assert_eq!(host.hits(), 1);
    // Its neighbours stay out of sight: the datagram socket and the directory's files.
    let output = run_in(
        &sandbox,
        &fx.ws,
        &format!(
            "python3 -c 'import socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b\"x\", \"{}\")'; ls {}",
            host.datagram.display(),
            fx.out.display()
        ),
    )
    .await;
    assert!(!output.status.success(), "{}", output.all());
    assert!(!output.stdout.contains("target.txt"), "{}", output.all());
    assert_eq!(host.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn sockets_made_inside_a_networked_sandbox_work() {
    let fx = Fixture::new();
    let sandbox = networked(&fx, &[]);
    let script = r#"python3 -c '
import socket, threading
def serve(listener):
    connection, _ = listener.accept()
    connection.sendall(b"inside-ok")
for address in ["srv.sock", "\0cordon-inside-test"]:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen(1)
    threading.Thread(target=serve, args=(listener,)).start()
    client = socket.socket(socket.AF_UNIX)
    client.connect(address)
    print(repr(address), client.recv(16).decode())
'"#;
    let output = run_in(&sandbox, &fx.ws, script).await;
    assert!(output.status.success(), "{}", output.all());
    assert_eq!(
        output.stdout,
        "'srv.sock' inside-ok\n'\\x00cordon-inside-test' inside-ok\n"
    );
}
