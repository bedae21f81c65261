//! Running a helper script locally as a remote exec would.

use std::path::Path;
use std::process::Stdio;

use cordon_remote::exec::TransportEvent;
use futures::{Stream, StreamExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio_util::io::ReaderStream;

/// The POSIX shells available here; dash and bash must exist, busybox is used when installed.
pub fn shells() -> Vec<Vec<String>> {
    let mut out = vec![vec!["dash".to_owned()], vec!["bash".to_owned()]];
    if Command::new("busybox")
        .arg("true")
        .stdout(Stdio::null())
        .status_blocking()
    {
        out.push(vec!["busybox".to_owned(), "sh".to_owned()]);
    }
    out
}

trait StatusBlocking {
    fn status_blocking(&mut self) -> bool;
}

impl StatusBlocking for Command {
    fn status_blocking(&mut self) -> bool {
        let std: &mut std::process::Command = self.as_std_mut();
        std.status().map(|s| s.success()).unwrap_or(false)
    }
}

/// Spawn `argv` (from the builders: `sh -c SCRIPT NAME ARGS…`) with `shell` instead of `sh`.
pub fn spawn(shell: &[String], argv: &[String], cwd: &Path) -> Child {
    assert_eq!(argv[0], "sh");
    let mut cmd = Command::new(&shell[0]);
    cmd.args(&shell[1..])
        .args(&argv[1..])
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd.spawn().expect("spawn shell")
}

/// The child's stdout/stderr as transport events, and its stdin.
pub fn transport(
    child: &mut Child,
) -> (
    impl Stream<Item = Result<TransportEvent, String>> + Unpin + use<>,
    ChildStdin,
) {
    let stdout = ReaderStream::new(child.stdout.take().expect("stdout"))
        .map(|r| r.map(TransportEvent::Stdout).map_err(|e| e.to_string()));
    let stderr = ReaderStream::new(child.stderr.take().expect("stderr"))
        .map(|r| r.map(TransportEvent::Stderr).map_err(|e| e.to_string()));
    (
        futures::stream::select(stdout, stderr),
        child.stdin.take().expect("stdin"),
    )
}

/// Run a non-interactive helper to the end: (stdout, stderr).
pub async fn run(shell: &[String], argv: &[String], stdin: &[u8]) -> (Vec<u8>, Vec<u8>) {
    use tokio::io::AsyncWriteExt;
    let mut child = spawn(shell, argv, Path::new("/"));
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).await.expect("write stdin");
    drop(input);
    let out = child.wait_with_output().await.expect("wait");
    (out.stdout, out.stderr)
}

/// Run a helper whose stdin is also its control input: write `stdin`, keep the pipe open
/// until stdout and stderr end, then close it.
pub async fn run_holding_stdin(
    shell: &[String],
    argv: &[String],
    stdin: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut child = spawn(shell, argv, Path::new("/"));
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).await.expect("write stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (a, b) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
    a.expect("stdout");
    b.expect("stderr");
    drop(input);
    child.wait().await.expect("wait");
    (out, err)
}

/// A worker process reading requests from stdin, as a transport would start it: optionally as
/// the leader of its own session (sshd and docker exec start commands that way).
pub struct LocalWorker {
    pub child: Child,
    pub events: std::pin::Pin<Box<dyn Stream<Item = Result<TransportEvent, String>> + Send>>,
    pub stdin: ChildStdin,
}

/// Start `shell` running the worker script; `leader`: in a session of its own (via setsid).
pub fn start_worker(shell: &[String], leader: bool) -> LocalWorker {
    let mut cmd = if leader {
        let mut cmd = Command::new("setsid");
        cmd.args(shell);
        cmd
    } else {
        let mut cmd = Command::new(&shell[0]);
        cmd.args(&shell[1..]);
        cmd
    };
    cmd.args(["-c", cordon_remote::worker::WORKER_SCRIPT, "cordon-worker"])
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn worker");
    let (events, stdin) = transport(&mut child);
    LocalWorker {
        child,
        events: Box::pin(events),
        stdin,
    }
}

/// Every shell with and without a session of its own.
pub fn worker_setups() -> Vec<(Vec<String>, bool)> {
    shells()
        .into_iter()
        .flat_map(|shell| [(shell.clone(), true), (shell, false)])
        .collect()
}
