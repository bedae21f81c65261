//! `cordon-helper serve --connect SOCKET`: the helper connects to a Unix socket its starter
//! listens on and serves the session there, not on stdin/stdout (the Docker backend's
//! transport when the engine runs on this machine).

use std::process::Stdio;

use async_trait::async_trait;
use cordon_core::sandbox::SandboxSpec;
use cordon_helper::{Connection, Connector, HelperBackend, HelperError, SessionStart};
use cordon_ops::{Backend, ExecRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const HELPER: &str = env!("CARGO_BIN_EXE_cordon-helper");

/// Starts the helper with `--connect` to a socket in `dir`, with stdin and stdout closed (so
/// nothing can be served there), and hands over the accepted connection.
struct SocketConnector {
    dir: std::path::PathBuf,
}

#[async_trait]
impl Connector for SocketConnector {
    async fn connect(&self) -> Result<Connection, HelperError> {
        let socket = self.dir.join("helper.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        let child = tokio::process::Command::new(HELPER)
            .args(["serve", "--connect"])
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the helper");
        let (stream, _) = listener.accept().await.expect("the helper connects");
        let peer = stream.peer_cred().expect("peer").pid();
        assert_eq!(
            peer,
            child.id().map(|id| id as i32),
            "the helper itself connected"
        );
        let (reader, writer) = stream.into_split();
        Ok(Connection {
            reader: Box::new(reader),
            writer: Box::new(writer),
            keep: Box::new(child),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_serves_a_whole_session_over_the_socket_it_connects_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("root");
    std::fs::write(root.join("a.txt"), "over the socket\n").expect("write");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).expect("state");
    let start = SessionStart {
        state_base: Some(state.clone().into()),
        ..SessionStart::new(&root, SandboxSpec::default())
    };
    let backend = HelperBackend::start(
        Box::new(SocketConnector {
            dir: dir.path().to_path_buf(),
        }),
        start,
    )
    .await
    .expect("a session over the socket");
    let files = backend.files();
    assert_eq!(
        files.read_file(&root.join("a.txt")).await.expect("read"),
        b"over the socket\n"
    );
    let (sender, mut output) = mpsc::channel(64);
    let outcome = backend
        .bash()
        .exec(
            ExecRequest {
                call_id: None,
                command: "echo ran > b.txt && cat b.txt".to_owned(),
                cwd: root.clone(),
                timeout: std::time::Duration::from_secs(60),
                env: Vec::new(),
            },
            CancellationToken::new(),
            sender,
        )
        .await
        .expect("exec");
    let mut text = Vec::new();
    while let Some(chunk) = output.recv().await {
        text.extend(chunk);
    }
    assert_eq!(outcome.status.map(|s| s.code()), Some(0));
    assert_eq!(String::from_utf8_lossy(&text), "ran\n");
    assert_eq!(
        std::fs::read_to_string(root.join("b.txt")).expect("b"),
        "ran\n"
    );
    backend.shutdown().await.expect("shutdown");
}

#[test]
fn a_socket_that_cannot_be_reached_exits_with_status_3_before_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nobody-listens.sock");
    let out = std::process::Command::new(HELPER)
        .args(["serve", "--connect"])
        .arg(&missing)
        .stdin(Stdio::null())
        .output()
        .expect("run the helper");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("failed to connect to") && stderr.contains("nobody-listens.sock"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing is served on stdout: {out:?}"
    );
}

#[test]
fn serve_takes_no_other_arguments() {
    let out = std::process::Command::new(HELPER)
        .args(["serve", "--connect"])
        .stdin(Stdio::null())
        .output()
        .expect("run the helper");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("serve [--connect SOCKET]"),
        "{out:?}"
    );
}
