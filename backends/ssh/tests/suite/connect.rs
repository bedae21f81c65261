//! Connection-level behaviour: host key verification (unknown, changed, hashed), agent and
//! key-file authentication, encrypted keys, user certificates, ssh_config aliases, HostKeyAlias, ProxyJump and ProxyCommand, and recovery
//! from a killed session and a restarted server.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_backend_ssh::{AgentSource, SshBackend, SshError};
use cordon_ops::{Backend, ExecError, ExitStatus};
use tokio_util::sync::CancellationToken;

use super::exec::run;
use super::support::{fingerprint_of, server};

const LONG: Duration = Duration::from_secs(120);

async fn echo_ok(backend: &SshBackend, ws: &std::path::Path) {
    let (result, output) = run(backend, "echo ok", ws, LONG, CancellationToken::new()).await;
    assert_eq!(result.expect("exec").status, Some(ExitStatus::Code(0)));
    assert_eq!(output, "ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_host_is_refused_with_the_command_to_trust_it() {
    let Some(server) = server() else { return };
    let empty = server.dir.path().join("empty_known_hosts");
    std::fs::write(&empty, "").unwrap();
    let mut config = server.config();
    config.known_hosts = Some(empty.clone());
    let err = SshBackend::connect(config).await.unwrap_err();
    assert!(matches!(err, SshError::UnknownHostKey { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(&server.host_fingerprint()), "{text}");
    let command = format!(
        "ssh-keyscan -p {} 127.0.0.1 >> {}",
        server.port,
        empty.display()
    );
    assert!(text.contains(&command), "{text}");

    // Following the advice works.
    let out = Command::new("sh").arg("-c").arg(&command).output().unwrap();
    assert!(out.status.success());
    let mut config = server.config();
    config.known_hosts = Some(empty);
    let backend = SshBackend::connect(config).await.unwrap();
    echo_ok(&backend, &server.workspace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_host_key_is_refused_loudly() {
    let Some(server) = server() else { return };
    let other = server.dir.path().join("other_key");
    Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .status()
        .unwrap();
    let other_pub = server.dir.path().join("other_key.pub");
    let line = std::fs::read_to_string(&other_pub).unwrap();
    let mut parts = line.split_whitespace();
    let known = server.dir.path().join("changed_known_hosts");
    std::fs::write(
        &known,
        format!(
            "[127.0.0.1]:{} {} {}\n",
            server.port,
            parts.next().unwrap(),
            parts.next().unwrap()
        ),
    )
    .unwrap();
    let mut config = server.config();
    config.known_hosts = Some(known);
    let err = SshBackend::connect(config).await.unwrap_err();
    assert!(matches!(err, SshError::ChangedHostKey { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("HAS CHANGED"), "{text}");
    assert!(text.contains(&server.host_fingerprint()), "{text}");
    assert!(text.contains(&fingerprint_of(&other_pub)), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_known_hosts_entries_are_understood() {
    let Some(server) = server() else { return };
    let status = Command::new("ssh-keygen")
        .arg("-H")
        .arg("-f")
        .arg(&server.known_hosts)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&server.known_hosts).unwrap();
    assert!(text.starts_with("|1|"), "{text}");
    let backend = server.connect().await;
    echo_ok(&backend, &server.workspace).await;
}

/// A real ssh-agent holding the client key, stopped on drop.
struct Agent {
    child: std::process::Child,
    socket: std::path::PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_agent(dir: &std::path::Path, key: &std::path::Path) -> Agent {
    let socket = dir.join("agent.sock");
    let child = Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ssh-agent (openssh-client) must be installed");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "ssh-agent did not create its socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new("ssh-add")
        .arg(key)
        .env("SSH_AUTH_SOCK", &socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ssh-add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Agent { child, socket }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_authentication() {
    let Some(server) = server() else { return };
    let agent = start_agent(server.dir.path(), &server.client_key);
    let mut config = server.config();
    config.identity = None;
    config.agent = AgentSource::Socket(agent.socket.clone());
    let backend = SshBackend::connect(config).await.unwrap();
    echo_ok(&backend, &server.workspace).await;

    // Without agent and key, authentication fails clearly.
    let mut config = server.config();
    config.identity = None;
    let err = SshBackend::connect(config).await.unwrap_err();
    assert!(matches!(err, SshError::AuthFailed { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_key_needs_a_passphrase() {
    let Some(server) = server() else { return };
    let key = server.dir.path().join("enc_key");
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "s3cret", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(status.success());
    let mut authorized =
        std::fs::read_to_string(server.dir.path().join("authorized_keys")).unwrap();
    authorized.push_str(&std::fs::read_to_string(server.dir.path().join("enc_key.pub")).unwrap());
    std::fs::write(server.dir.path().join("authorized_keys"), authorized).unwrap();

    let mut config = server.config();
    config.identity = Some(key.clone());
    let err = SshBackend::connect(config.clone()).await.unwrap_err();
    assert!(matches!(err, SshError::KeyEncrypted { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(&key.display().to_string()), "{text}");
    assert!(text.contains("ssh-add"), "{text}");

    config.passphrase = Some(Arc::new(|_: &std::path::Path| Some("s3cret".to_owned())));
    let backend = SshBackend::connect(config.clone()).await.unwrap();
    echo_ok(&backend, &server.workspace).await;

    config.passphrase = Some(Arc::new(|_: &std::path::Path| Some("wrong".to_owned())));
    let err = SshBackend::connect(config).await.unwrap_err();
    assert!(matches!(err, SshError::LoadKey { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_config_alias_and_proxy_jump() {
    let Some(server) = server() else { return };
    let config_file = server.dir.path().join("ssh_config");
    std::fs::write(
        &config_file,
        format!(
            "Host devbox\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {key}\n  \
             IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n\
             Host via-jump\n  HostName 127.0.0.1\n  Port {port}\n  ProxyJump devbox\n\
             Host *\n  User nobody-by-default\n  IdentityFile {key}\n  UserKnownHostsFile {kh}\n",
            port = server.port,
            key = server.client_key.display(),
            kh = server.known_hosts.display(),
        ),
    )
    .unwrap();
    for alias in ["devbox", "root@via-jump"] {
        let mut config = server.config();
        config.host = alias.to_owned();
        config.identity = None;
        config.known_hosts = None;
        config.ssh_config = Some(config_file.clone());
        let backend = SshBackend::connect(config)
            .await
            .unwrap_or_else(|e| panic!("{alias}: {e}"));
        assert!(
            backend
                .id()
                .as_str()
                .starts_with(&format!("ssh:root@127.0.0.1:{}:", server.port)),
            "{}",
            backend.id()
        );
        echo_ok(&backend, &server.workspace).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_key_alias_is_looked_up_and_trusted_as_openssh_records_it() {
    let Some(server) = server() else { return };
    let known = server.dir.path().join("alias_known_hosts");
    std::fs::write(&known, "").unwrap();
    let config_file = server.dir.path().join("alias_ssh_config");
    std::fs::write(
        &config_file,
        format!(
            "Host devbox\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  \
             HostKeyAlias box.alias\n  UserKnownHostsFile {kh}\n",
            port = server.port,
            kh = known.display(),
        ),
    )
    .unwrap();
    let config = || {
        let mut config = server.config();
        config.host = "devbox".to_owned();
        config.known_hosts = None;
        config.ssh_config = Some(config_file.clone());
        config
    };
    // Unknown: the advice fetches the key from the host and records it under the alias, on
    // no port, as `ssh` would (not `[box.alias]:PORT`).
    let err = SshBackend::connect(config()).await.unwrap_err();
    assert!(matches!(err, SshError::UnknownHostKey { .. }), "{err}");
    let text = err.to_string();
    let command = format!(
        "ssh-keyscan -p {} 127.0.0.1 | sed 's/^[^ ]*/box.alias/' >> {}",
        server.port,
        known.display()
    );
    assert!(text.contains(&command), "{text}");
    let out = Command::new("sh").arg("-c").arg(&command).output().unwrap();
    assert!(out.status.success());
    let recorded = std::fs::read_to_string(&known).unwrap();
    assert!(
        recorded.lines().all(|line| line.starts_with("box.alias ")),
        "{recorded}"
    );
    let backend = SshBackend::connect(config()).await.unwrap();
    echo_ok(&backend, &server.workspace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_command_carries_the_connection_and_never_falls_back_to_a_direct_one() {
    let Some(server) = server() else { return };
    let dir = server.dir.path();
    let marker = dir.join("proxy-ran");
    // The config's port is closed: only the ProxyCommand's relay (to the real port) can reach
    // the server, so a session proves the command carried it. The key is recorded for the
    // port the config names, as OpenSSH looks it up.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let key_line = std::fs::read_to_string(&server.host_pub).unwrap();
    let mut parts = key_line.split_whitespace();
    let known = dir.join("proxy_known_hosts");
    std::fs::write(
        &known,
        format!(
            "[127.0.0.1]:{closed} {} {}\n",
            parts.next().unwrap(),
            parts.next().unwrap()
        ),
    )
    .unwrap();
    let config_file = dir.join("proxy_ssh_config");
    std::fs::write(
        &config_file,
        format!(
            "Host relayed\n  HostName 127.0.0.1\n  Port {closed}\n  User root\n  \
             ProxyCommand echo \"%h %p %r %n %%\" > {marker} && exec bash -c \
             'exec 3<>/dev/tcp/$0/$1; cat <&3 & exec cat >&3' 127.0.0.1 {port}\n\
             Host broken\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  \
             ProxyCommand echo proxy refused >&2; exit 3\n\
             Host missing\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  \
             ProxyCommand /nonexistent/relay %h %p\n",
            marker = marker.display(),
            port = server.port,
        ),
    )
    .unwrap();
    let config_for = |alias: &str| {
        let mut config = server.config();
        config.host = alias.to_owned();
        config.known_hosts = Some(known.clone());
        config.ssh_config = Some(config_file.clone());
        config
    };
    let backend = SshBackend::connect(config_for("relayed"))
        .await
        .unwrap_or_else(|e| panic!("relayed: {e}"));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        format!("127.0.0.1 {closed} root relayed %\n")
    );
    echo_ok(&backend, &server.workspace).await;
    backend.shutdown().await.expect("shut the session down");

    // A ProxyCommand that fails is the error: the real port is open, but no direct connection
    // is tried.
    for alias in ["broken", "missing"] {
        let mut config = config_for(alias);
        config.known_hosts = Some(server.known_hosts.clone());
        let err = SshBackend::connect(config).await.unwrap_err().to_string();
        assert!(err.contains("ProxyCommand"), "{alias}: {err}");
        if alias == "broken" {
            assert!(err.contains("exit status: 3"), "{alias}: {err}");
        }
    }
}

/// `ssh-keygen` with `args`, which must succeed.
fn ssh_keygen(args: &[&std::ffi::OsStr]) {
    let out = Command::new("ssh-keygen")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_certificate_logs_in_where_the_bare_key_is_not_authorized() {
    let Some(server) = server() else { return };
    let dir = server.dir.path();
    // A key the server does not list in authorized_keys, certified by the CA it trusts.
    let key = dir.join("certified_ed25519");
    let os = |s: &str| std::ffi::OsString::from(s);
    ssh_keygen(&[
        &os("-q"),
        &os("-t"),
        &os("ed25519"),
        &os("-N"),
        &os(""),
        &os("-f"),
        key.as_os_str(),
    ]);
    let public = dir.join("certified_ed25519.pub");
    ssh_keygen(&[
        &os("-q"),
        &os("-s"),
        server.user_ca.as_os_str(),
        &os("-I"),
        &os("cordon-test"),
        &os("-n"),
        &os("root"),
        public.as_os_str(),
    ]);
    let beside = dir.join("certified_ed25519-cert.pub");
    assert!(beside.exists());

    // `<key>-cert.pub` next to the identity is found as OpenSSH finds it.
    let mut config = server.config();
    config.identity = Some(key.clone());
    let backend = SshBackend::connect(config.clone())
        .await
        .unwrap_or_else(|e| panic!("certificate beside the key: {e}"));
    echo_ok(&backend, &server.workspace).await;
    backend.shutdown().await.expect("shut the session down");

    // A CertificateFile elsewhere, named in the ssh config.
    let moved = dir.join("elsewhere-cert.pub");
    std::fs::rename(&beside, &moved).unwrap();
    let config_file = dir.join("cert_ssh_config");
    std::fs::write(
        &config_file,
        format!("Host *\n  CertificateFile {}\n", moved.display()),
    )
    .unwrap();
    let mut named = config.clone();
    named.ssh_config = Some(config_file);
    let backend = SshBackend::connect(named)
        .await
        .unwrap_or_else(|e| panic!("CertificateFile: {e}"));
    echo_ok(&backend, &server.workspace).await;
    backend.shutdown().await.expect("shut the session down");

    // Without the certificate the bare key is refused: the certificate did the work above.
    let err = SshBackend::connect(config).await.unwrap_err();
    assert!(matches!(err, SshError::AuthFailed { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_session_fails_the_call_then_reconnects() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let ws = server.workspace.clone();
    let marker = ws.join("started");
    let pidfile = ws.join("pid");
    let script = format!(
        "echo $$ > {}; touch {}; sleep 300",
        pidfile.display(),
        marker.display()
    );
    let bash_backend = server.connect().await;
    let task = tokio::spawn(async move {
        run(&bash_backend, &script, &ws, LONG, CancellationToken::new()).await
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill_sessions();
    let (result, _) = task.await.unwrap();
    match result {
        Err(ExecError::Backend { reason }) => {
            assert!(reason.contains("connection"), "{reason}");
            assert!(reason.contains("lost"), "{reason}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    // The remote side killed the command when its session went away.
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while super::support::alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the command outlived its session"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Both backends reconnect for their next call (the other one's connection was killed too).
    echo_ok(&backend, &server.workspace).await;
    assert!(
        backend
            .files()
            .read_file(&server.workspace.join("started"))
            .await
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_server_is_reconnected() {
    let Some(mut server) = server() else { return };
    let backend = server.connect().await;
    echo_ok(&backend, &server.workspace).await;
    std::fs::write(server.workspace.join("f"), "x").unwrap();
    server.restart();
    // The first call may see the dead connection only now; the next one must work.
    let files = backend.files();
    let first = files.read_file(&server.workspace.join("f")).await;
    if let Err(err) = &first {
        assert!(err.to_string().contains("backend unavailable"), "{err}");
    }
    assert_eq!(
        files.read_file(&server.workspace.join("f")).await.unwrap(),
        b"x"
    );
    echo_ok(&backend, &server.workspace).await;
}
