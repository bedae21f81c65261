//! `cordon-helper forward`: the built program relaying a loopback port to a Unix socket.

use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixListener};
use tokio::process::{Child, ChildStdout, Command};

const HELPER: &str = env!("CARGO_BIN_EXE_cordon-helper");

/// The forwarder started on a free port for `socket`, once it said it is ready.
async fn start_forwarder(socket: &Path) -> (Child, BufReader<ChildStdout>, String) {
    let mut child = Command::new(HELPER)
        .args(["forward", "0"])
        .arg(socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start the forwarder");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .await
        .expect("read the ready line");
    let address = line
        .trim_end()
        .strip_prefix(cordon_helper::forward::READY)
        .and_then(|rest| rest.strip_prefix(' '))
        .unwrap_or_else(|| panic!("not a ready line: {line:?}"))
        .to_owned();
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    (child, stdout, address)
}

/// Bytes go both ways through the relay, a half-close is passed on (the far side's answer to
/// it still arrives), and the forwarder ends when its stdin does.
#[tokio::test]
async fn a_connection_is_relayed_both_ways_until_both_sides_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("proxy.sock");
    let listener = UnixListener::bind(&socket).expect("bind");
    let (mut child, _stdout, address) = start_forwarder(&socket).await;

    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut got = Vec::new();
        stream
            .read_to_end(&mut got)
            .await
            .expect("read to the half-close");
        stream
            .write_all(
                format!("got {} bytes: {}", got.len(), String::from_utf8_lossy(&got)).as_bytes(),
            )
            .await
            .expect("answer");
        stream.shutdown().await.expect("shutdown");
    });
    let mut client = TcpStream::connect(&address)
        .await
        .expect("connect the forwarder");
    client.write_all(b"CONNECT x:443").await.expect("send");
    client.shutdown().await.expect("half-close");
    let mut answer = String::new();
    client.read_to_string(&mut answer).await.expect("answer");
    assert_eq!(answer, "got 13 bytes: CONNECT x:443");
    server.await.expect("server");

    drop(child.stdin.take());
    let status = child.wait().await.expect("wait");
    assert!(status.success(), "{status}");
}

/// Without the socket (the proxy is gone) a connection is closed at once: nothing leads out.
#[tokio::test]
async fn without_the_socket_a_connection_is_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("absent.sock");
    let (_child, _stdout, address) = start_forwarder(&socket).await;
    let mut client = TcpStream::connect(&address)
        .await
        .expect("connect the forwarder");
    // The write may race the close; the read is the proof.
    let _ = client.write_all(b"GET http://x/ HTTP/1.1\r\n\r\n").await;
    let mut answer = Vec::new();
    let read = client.read_to_end(&mut answer).await;
    assert!(
        matches!(read, Ok(0)) || read.is_err(),
        "the forwarder answered without a proxy: {read:?} {answer:?}"
    );
}

/// Bad arguments are refused with the usage (status 2), before anything listens.
#[tokio::test]
async fn bad_arguments_are_refused() {
    for args in [
        vec!["forward", "x", "/s"],
        vec!["forward", "3128", "relative.sock"],
        vec!["forward", "3128"],
    ] {
        let out = Command::new(HELPER)
            .args(&args)
            .output()
            .await
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("forward PORT SOCKET"), "{args:?}: {stderr}");
    }
}
