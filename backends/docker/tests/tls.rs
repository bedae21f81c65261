//! A TCP engine verified with TLS (`DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH`): a real `dockerd
//! --tlsverify` on 127.0.0.1 with certificates made by `openssl` for this test. The connection
//! works with the right certificates (an exec is attached over it), and fails, never falling
//! back to plaintext, with a wrong CA or without TLS.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptions, RemoveContainerOptions};
use cordon_backend_docker::client::{Engine, connect_engine};
use futures::StreamExt;

use crate::support::{BUSYBOX, docker_host};

/// `openssl` lines making a CA, a server certificate for 127.0.0.1 and a client certificate,
/// in the current directory.
const MAKE_CERTS: &str = r#"
set -e
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca-key.pem
openssl req -x509 -new -key ca-key.pem -out ca.pem -days 2 -subj /CN=cordon-test-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
key server-key.pem
openssl req -new -key server-key.pem -out server.csr -subj /CN=127.0.0.1
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
    -out server-cert.pem -days 2 -extfile server.ext 2>/dev/null
key key.pem
openssl req -new -key key.pem -out client.csr -subj /CN=cordon-test-client
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
    -out cert.pem -days 2 -extfile client.ext 2>/dev/null
"#;

fn make_certs(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let out = Command::new("sh")
        .args(["-c", MAKE_CERTS])
        .current_dir(dir)
        .output()
        .expect("run openssl (install it: apt-get install -y openssl)");
    assert!(
        out.status.success(),
        "failed to make test certificates: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private `dockerd --tlsverify` on a free loopback port, stopped on drop.
struct TlsDaemon {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for TlsDaemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn start_daemon(state: &Path, certs: &Path) -> TlsDaemon {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    for dir in ["data", "exec"] {
        std::fs::create_dir_all(state.join(dir)).unwrap();
    }
    let config = state.join("daemon.json");
    std::fs::write(&config, "{}").unwrap();
    let log = state.join("dockerd.log");
    let child = Command::new("dockerd")
        .arg("--config-file")
        .arg(&config)
        .arg("--data-root")
        .arg(state.join("data"))
        .arg("--exec-root")
        .arg(state.join("exec"))
        .arg("--pidfile")
        .arg(state.join("dockerd.pid"))
        .args(["--bridge=none", "--iptables=false", "--ip-masq=false"])
        .arg("--tlsverify")
        .arg("--tlscacert")
        .arg(certs.join("ca.pem"))
        .arg("--tlscert")
        .arg(certs.join("server-cert.pem"))
        .arg("--tlskey")
        .arg(certs.join("server-key.pem"))
        .arg("-H")
        .arg(format!("tcp://127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::from(
            std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
        ))
        .spawn()
        .expect("start dockerd");
    TlsDaemon { child, port, log }
}

fn tls_engine(port: u16, certs: &Path) -> Engine {
    let certs = certs.to_string_lossy().into_owned();
    Engine::resolve(
        Some(&format!("tcp://127.0.0.1:{port}")),
        &|name| match name {
            "DOCKER_TLS_VERIFY" => Some("1".to_owned()),
            "DOCKER_CERT_PATH" => Some(certs.clone()),
            _ => None,
        },
        None,
    )
    .expect("resolve the TLS engine")
}

/// Connect over TLS, waiting (bounded) for the daemon to come up.
async fn connect_when_up(daemon: &mut TlsDaemon, certs: &Path) -> Docker {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            panic!(
                "dockerd --tlsverify exited at start ({status}): {}",
                std::fs::read_to_string(&daemon.log).unwrap_or_default()
            );
        }
        match connect_engine(&tls_engine(daemon.port, certs)).await {
            Ok((docker, _)) => return docker,
            Err(error) => assert!(
                Instant::now() < deadline,
                "dockerd --tlsverify did not answer within 90 s ({error}): {}",
                std::fs::read_to_string(&daemon.log).unwrap_or_default()
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Copy the busybox image from the main engine into the TLS one with the docker CLI.
fn load_busybox(main_host: &str, port: u16, certs: &Path) {
    let script = format!(
        "docker save {BUSYBOX} | docker --tlsverify --tlscacert {ca} --tlscert {cert} \
         --tlskey {key} -H tcp://127.0.0.1:{port} load",
        ca = certs.join("ca.pem").display(),
        cert = certs.join("cert.pem").display(),
        key = certs.join("key.pem").display(),
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .env("DOCKER_HOST", main_host)
        .output()
        .expect("docker save | docker load");
    assert!(
        out.status.success(),
        "failed to copy {BUSYBOX} into the TLS engine: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_engine_is_verified_and_never_reached_in_plaintext() {
    let Some(main_host) = docker_host() else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let certs = scratch.path().join("certs");
    make_certs(&certs);
    let mut daemon = start_daemon(&scratch.path().join("state"), &certs);
    let docker = connect_when_up(&mut daemon, &certs).await;

    // An exec attached over the TLS connection (the upgrade the backend's workers use).
    load_busybox(&main_host, daemon.port, &certs);
    let name = format!("cordon-tls-test-{}", std::process::id());
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(BUSYBOX.to_owned()),
                cmd: Some(vec!["sleep".into(), "600".into()]),
                network_disabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("create a container over TLS");
    docker
        .start_container(&name, None)
        .await
        .expect("start it over TLS");
    let exec = docker
        .create_exec(
            &name,
            CreateExecOptions {
                cmd: Some(vec!["echo", "over tls"]),
                attach_stdout: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("create an exec");
    let mut text = Vec::new();
    match docker
        .start_exec(&exec.id, None)
        .await
        .expect("start the exec")
    {
        StartExecResults::Attached { mut output, .. } => {
            while let Some(frame) = output.next().await {
                text.extend_from_slice(&frame.expect("exec output").into_bytes());
            }
        }
        StartExecResults::Detached => panic!("the exec was not attached"),
    }
    assert_eq!(String::from_utf8_lossy(&text), "over tls\n");
    docker
        .remove_container(
            &name,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .expect("remove the container");

    // Without TLS variables the same port is plaintext: the engine refuses it.
    let plain = Engine::resolve(
        Some(&format!("tcp://127.0.0.1:{}", daemon.port)),
        &|_| None,
        None,
    )
    .unwrap();
    assert_eq!(plain.tls, None);
    assert!(connect_engine(&plain).await.is_err());

    // Another CA: the engine's certificate is not trusted, so nothing is sent.
    let other = scratch.path().join("other");
    make_certs(&other);
    let mut mixed = tls_engine(daemon.port, &other);
    std::fs::copy(certs.join("cert.pem"), other.join("cert.pem")).unwrap();
    std::fs::copy(certs.join("key.pem"), other.join("key.pem")).unwrap();
    mixed.tls = Some(other.clone());
    let error = connect_engine(&mixed).await.unwrap_err().to_string();
    assert!(error.contains("invalid peer certificate"), "{error}");

    // A client certificate from another CA: the engine refuses the client.
    let stranger = scratch.path().join("stranger");
    make_certs(&stranger);
    std::fs::copy(certs.join("ca.pem"), stranger.join("ca.pem")).unwrap();
    let error = connect_engine(&tls_engine(daemon.port, &stranger))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("failed to reach the Docker daemon"),
        "{error}"
    );
}
