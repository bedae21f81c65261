//! The helper over the local pipe transport: `cordon-helper serve` as a child process, driven
//! through the client, and through raw frames for what a well-behaved client never sends.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cordon_core::sandbox::SandboxSpec;
use cordon_helper::frame::{Frame, MAX_HEADER_BYTES, read_frame, write_frame};
use cordon_helper::protocol::{Envelope, Request, Response, WireError};
use cordon_helper::{
    Connection, Connector, HelperBackend, HelperConnection, HelperError, PipeConnector,
    ProbeReport, SessionStart,
};
use cordon_ops::{Backend, ExecError, ExecRequest, FindRequest, FsError, GrepRequest, Termination};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const HELPER: &str = env!("CARGO_BIN_EXE_cordon-helper");

/// A pipe connector that remembers the pid of every helper it started.
#[derive(Clone, Default)]
struct Recorder {
    pids: Arc<Mutex<Vec<u32>>>,
}

impl Recorder {
    fn last_pid(&self) -> u32 {
        *self
            .pids
            .lock()
            .expect("lock")
            .last()
            .expect("a helper started")
    }

    fn started(&self) -> usize {
        self.pids.lock().expect("lock").len()
    }
}

#[async_trait]
impl Connector for Recorder {
    async fn connect(&self) -> Result<Connection, HelperError> {
        let connection = PipeConnector::new(HELPER).connect().await?;
        let child = connection
            .keep
            .downcast_ref::<tokio::process::Child>()
            .expect("the pipe connector keeps the child");
        self.pids
            .lock()
            .expect("lock")
            .push(child.id().expect("running"));
        Ok(connection)
    }
}

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).expect("mkdir");
    let root = std::fs::canonicalize(root).expect("canonical");
    (dir, root)
}

fn start_of(root: &Path, state: &Path) -> SessionStart {
    SessionStart {
        state_base: Some(state.to_path_buf().into()),
        ..SessionStart::new(root, SandboxSpec::default())
    }
}

async fn backend(root: &Path, state: &Path) -> (HelperBackend, Recorder) {
    let recorder = Recorder::default();
    let backend = HelperBackend::start(Box::new(recorder.clone()), start_of(root, state))
        .await
        .expect("helper session");
    (backend, recorder)
}

fn exec_request(root: &Path, command: &str) -> ExecRequest {
    ExecRequest {
        call_id: None,
        command: command.to_owned(),
        cwd: root.to_path_buf(),
        timeout: Duration::from_secs(600),
        env: Vec::new(),
    }
}

/// A `sleep` argument no other process has.
fn sleep_marker() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("3600.{}{n:04}", std::process::id())
}

fn pids_with_arg(arg: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline
                    .split(|byte| *byte == 0)
                    .any(|word| word == arg.as_bytes())
            })
        })
        .collect()
}

/// Wait until a process with the argument `marker` runs (the shell may print before its
/// background child has exec'd).
async fn wait_for_process(marker: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pids_with_arg(marker).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no process with argument {marker} started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Receive output until it contains `marker`.
async fn wait_for_output(output: &mut mpsc::Receiver<Vec<u8>>, marker: &str) -> String {
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains(marker) {
        let chunk = output.recv().await.expect("output before the marker");
        seen.extend_from_slice(&chunk);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_search_and_command_operations_round_trip() {
    let (dir, root) = workspace();
    let (backend, _) = backend(&root, dir.path()).await;
    let files = backend.files();
    assert_eq!(files.root(), root);
    let notes = root.join("notes.txt");
    let binary: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    files.write_file(&notes, &binary).await.expect("write");
    assert_eq!(files.read_file(&notes).await.expect("read"), binary);
    assert_eq!(files.read_head(&notes, 3).await.expect("head"), [0, 1, 2]);
    assert_eq!(
        files.read_range(&notes, 256, 2).await.expect("range"),
        [0, 1]
    );
    assert_eq!(files.metadata(&notes).await.expect("meta").size, 5000);
    files
        .create_dir_all(&root.join("a/b"))
        .await
        .expect("mkdir");
    let mut names: Vec<String> = files
        .read_dir(&root)
        .await
        .expect("list")
        .into_iter()
        .map(|entry| entry.name)
        .collect();
    names.sort();
    assert_eq!(names, ["a", "notes.txt"]);
    assert_eq!(
        files
            .canonicalize(&root.join("a/../notes.txt"))
            .await
            .expect("canonical"),
        notes
    );
    // Confinement is the local backend's, on the helper's side.
    let outside = root.join("../outside.txt");
    std::fs::write(dir.path().join("outside.txt"), "secret").expect("outside");
    assert!(matches!(
        files.read_file(&outside).await,
        Err(FsError::OutsideRoot { .. })
    ));
    std::os::unix::fs::symlink("../outside.txt", root.join("link")).expect("symlink");
    assert!(matches!(
        files.read_file(&root.join("link")).await,
        Err(FsError::OutsideRoot { .. })
    ));
    let missing = files
        .read_file(&root.join("nope"))
        .await
        .expect_err("missing");
    assert_eq!(missing.errno_name(), Some("ENOENT"));

    files
        .write_file(&root.join("a/b/code.rs"), b"fn main() {}\nlet x = 1;\n")
        .await
        .expect("write");
    let grep = backend
        .search()
        .grep(
            GrepRequest {
                pattern: "let".into(),
                path: root.clone(),
                glob: None,
                ignore_case: false,
                literal: true,
                context: 0,
                max_matches: 10,
            },
            CancellationToken::new(),
        )
        .await
        .expect("grep");
    assert_eq!(grep.files.len(), 1);
    assert_eq!(grep.files[0].path, root.join("a/b/code.rs"));
    assert_eq!(grep.files[0].lines[0].number, 2);
    let found = backend
        .search()
        .find(
            FindRequest {
                pattern: "*.rs".into(),
                path: root.clone(),
                max_results: 10,
            },
            CancellationToken::new(),
        )
        .await
        .expect("find");
    assert_eq!(found.paths, [root.join("a/b/code.rs")]);

    let (sender, mut output) = mpsc::channel(64);
    let outcome = backend
        .bash()
        .exec(
            exec_request(&root, "echo out; echo err >&2; exit 3"),
            CancellationToken::new(),
            sender,
        )
        .await
        .expect("exec");
    assert_eq!(outcome.status.map(|s| s.code()), Some(3));
    assert_eq!(outcome.termination, Termination::Exited);
    let mut text = Vec::new();
    while let Some(chunk) = output.recv().await {
        text.extend_from_slice(&chunk);
    }
    assert_eq!(String::from_utf8_lossy(&text), "out\nerr\n");

    let (path, mut spill) = files.create_spill_file().await.expect("spill");
    spill.write_all(b"full output").await.expect("spill write");
    spill.shutdown().await.expect("spill close");
    assert_eq!(
        files.read_file(&path).await.expect("read spill"),
        b"full output"
    );
    backend.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_reads_share_one_stream() {
    let (dir, root) = workspace();
    let (backend, recorder) = backend(&root, dir.path()).await;
    let files = backend.files();
    for n in 0..100 {
        std::fs::write(root.join(format!("f{n}")), format!("file {n}")).expect("write");
    }
    let reads = (0..100).map(|n| {
        let files = files.clone();
        let path = root.join(format!("f{n}"));
        async move { (n, files.read_file(&path).await) }
    });
    for (n, read) in futures::future::join_all(reads).await {
        assert_eq!(read.expect("read"), format!("file {n}").into_bytes());
    }
    assert_eq!(recorder.started(), 1, "one helper served every read");
    backend.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_output_copied_to_a_spill_file_on_the_same_stream_does_not_stall() {
    // What the bash tool does: every chunk of output is also written to a spill file, whose
    // writes travel on the same stream as the output.
    let (dir, root) = workspace();
    let (backend, _) = backend(&root, dir.path()).await;
    let files = backend.files();
    let (path, mut spill) = files.create_spill_file().await.expect("spill");
    let (sender, mut output) = mpsc::channel(4);
    let bash = backend.bash();
    let request = exec_request(&root, "head -c 20000000 /dev/zero");
    let run =
        tokio::spawn(async move { bash.exec(request, CancellationToken::new(), sender).await });
    let mut total = 0;
    while let Some(chunk) = output.recv().await {
        total += chunk.len();
        spill.write_all(&chunk).await.expect("spill write");
    }
    spill.shutdown().await.expect("spill close");
    let outcome = run.await.expect("join").expect("exec");
    assert_eq!(outcome.status.map(|s| s.code()), Some(0));
    assert_eq!(total, 20_000_000);
    assert_eq!(files.metadata(&path).await.expect("meta").size, 20_000_000);
    backend.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_command_tree() {
    let (dir, root) = workspace();
    let (backend, _) = backend(&root, dir.path()).await;
    let marker = sleep_marker();
    let cancel = CancellationToken::new();
    let (sender, mut output) = mpsc::channel(64);
    let bash = backend.bash();
    let request = exec_request(&root, &format!("sleep {marker} & echo started; wait"));
    let run = tokio::spawn({
        let cancel = cancel.clone();
        async move { bash.exec(request, cancel, sender).await }
    });
    wait_for_output(&mut output, "started").await;
    wait_for_process(&marker).await;
    cancel.cancel();
    let outcome = run.await.expect("join").expect("exec");
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert_eq!(pids_with_arg(&marker), Vec::<u32>::new(), "no survivor");
    backend.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_helper_fails_the_call_and_the_next_call_starts_a_new_one() {
    let (dir, root) = workspace();
    let (backend, recorder) = backend(&root, dir.path()).await;
    std::fs::write(root.join("a.txt"), "still here").expect("write");
    let (sender, mut output) = mpsc::channel(64);
    let bash = backend.bash();
    let marker = sleep_marker();
    let request = exec_request(&root, &format!("sleep {marker} & echo started; wait"));
    let run =
        tokio::spawn(async move { bash.exec(request, CancellationToken::new(), sender).await });
    wait_for_output(&mut output, "started").await;
    wait_for_process(&marker).await;
    let first = recorder.last_pid();
    nix_kill(first);
    let error = run.await.expect("join").expect_err("the helper died");
    let ExecError::Backend { reason } = &error else {
        panic!("expected a backend error, got {error:?}");
    };
    assert!(
        reason.contains("the helper connection closed")
            && reason.contains("next call starts a new helper"),
        "{reason}"
    );
    let read = backend
        .files()
        .read_file(&root.join("a.txt"))
        .await
        .expect("a new helper serves the next call");
    assert_eq!(read, b"still here");
    assert_eq!(recorder.started(), 2);
    assert_ne!(recorder.last_pid(), first);
    // The dead helper's command dies with its sandbox.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !pids_with_arg(&marker).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed helper's command survived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    backend.shutdown().await.expect("shutdown");
}

fn nix_kill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_of_input_kills_everything_the_helper_started() {
    let (dir, root) = workspace();
    let mut child = tokio::process::Command::new(HELPER)
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let client = cordon_helper::HelperClient::start(stdout, stdin, start_of(&root, dir.path()))
        .await
        .expect("start");
    let client = Arc::new(client);
    let marker = sleep_marker();
    let (sender, mut output) = mpsc::channel(64);
    let request = exec_request(&root, &format!("sleep {marker} & echo started; wait"));
    let running = tokio::spawn({
        let client = Arc::clone(&client);
        async move {
            use cordon_ops::BashOperations;
            client.exec(request, CancellationToken::new(), sender).await
        }
    });
    wait_for_output(&mut output, "started").await;
    wait_for_process(&marker).await;
    // Dropping every handle on the client closes the helper's input.
    running.abort();
    let _ = running.await;
    drop(client);
    let status = child.wait().await.expect("wait");
    assert!(
        status.success(),
        "the helper exits cleanly at the end of its input: {status}"
    );
    assert_eq!(pids_with_arg(&marker), Vec::<u32>::new(), "no survivor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_layer_fails_closed_and_allow_degraded_runs() {
    let (dir, root) = workspace();
    let no_landlock = ProbeReport {
        landlock_abi: 0,
        ..ProbeReport::from(cordon_backend_local::probe_host())
    };
    let strict = SessionStart {
        simulate_support: Some(no_landlock),
        ..start_of(&root, dir.path())
    };
    let backend = HelperBackend::start(Box::new(PipeConnector::new(HELPER)), strict)
        .await
        .expect("file operations still start");
    assert!(backend.missing_layers().is_empty());
    let (sender, _output) = mpsc::channel(64);
    let error = backend
        .bash()
        .exec(
            exec_request(&root, "true"),
            CancellationToken::new(),
            sender,
        )
        .await
        .expect_err("fails closed");
    assert!(
        matches!(
            error,
            ExecError::Sandbox {
                layer: "landlock-fs",
                ..
            }
        ),
        "{error:?}"
    );
    backend.shutdown().await.expect("shutdown");

    let degraded = SessionStart {
        spec: SandboxSpec {
            allow_degraded: true,
            ..SandboxSpec::default()
        },
        simulate_support: Some(no_landlock),
        ..start_of(&root, dir.path())
    };
    let backend = HelperBackend::start(Box::new(PipeConnector::new(HELPER)), degraded)
        .await
        .expect("start");
    assert!(
        backend
            .missing_layers()
            .iter()
            .any(|layer| layer == "landlock-fs"),
        "{:?}",
        backend.missing_layers()
    );
    let (sender, _output) = mpsc::channel(64);
    let outcome = backend
        .bash()
        .exec(
            exec_request(&root, "true"),
            CancellationToken::new(),
            sender,
        )
        .await
        .expect("runs degraded");
    assert_eq!(outcome.status.map(|s| s.code()), Some(0));
    backend.shutdown().await.expect("shutdown");
}

/// A raw helper: frames written and read by hand.
struct Raw {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
}

impl Raw {
    fn spawn() -> Raw {
        let mut child = tokio::process::Command::new(HELPER)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn");
        Raw {
            stdin: child.stdin.take().expect("stdin"),
            stdout: child.stdout.take().expect("stdout"),
            child,
        }
    }

    async fn send_header(&mut self, header: &[u8]) {
        write_frame(
            &mut self.stdin,
            &Frame {
                header: header.to_vec(),
                payload: Vec::new(),
            },
        )
        .await
        .expect("send");
        self.stdin.flush().await.expect("flush");
    }

    async fn answer(&mut self) -> Envelope<Response> {
        let frame = read_frame(&mut self.stdout).await.expect("answer");
        serde_json::from_slice(&frame.header).expect("json answer")
    }

    async fn protocol_error(&mut self, id: u64) -> String {
        let answer = self.answer().await;
        assert_eq!(answer.id, id);
        match answer.body {
            Response::Error {
                error: WireError::Protocol { message },
            } => message,
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_mismatch_is_refused_clearly() {
    let mut raw = Raw::spawn();
    raw.send_header(br#"{"id":1,"type":"hello","version":999}"#)
        .await;
    let answer = raw.answer().await;
    assert_eq!(answer.id, 1);
    let Response::Error { error } = answer.body else {
        panic!("expected an error, got {:?}", answer.body);
    };
    assert_eq!(
        error,
        WireError::Version {
            helper: cordon_helper::PROTOCOL_VERSION,
            client: 999
        }
    );
    // The client side turns a helper of another version into a clear error.
    let (client_end, helper_end) = tokio::io::duplex(1 << 16);
    let (helper_read, mut helper_write) = tokio::io::split(helper_end);
    let fake = tokio::spawn(async move {
        let mut helper_read = helper_read;
        let frame = read_frame(&mut helper_read).await.expect("hello");
        let hello: Envelope<Request> = serde_json::from_slice(&frame.header).expect("json");
        let header = serde_json::to_vec(&Envelope {
            id: hello.id,
            body: Response::Hello {
                version: cordon_helper::PROTOCOL_VERSION + 1,
                helper: "9.9.9".into(),
            },
        })
        .expect("json");
        write_frame(
            &mut helper_write,
            &Frame {
                header,
                payload: Vec::new(),
            },
        )
        .await
        .expect("answer");
        helper_write.flush().await.expect("flush");
        helper_read
    });
    let (client_read, client_write) = tokio::io::split(client_end);
    let error = HelperConnection::open(client_read, client_write)
        .await
        .expect_err("another version");
    assert_eq!(
        error.to_string(),
        format!(
            "failed to start the helper: it speaks protocol version {}, this Cordon speaks {}; install the same Cordon version on both sides",
            cordon_helper::PROTOCOL_VERSION + 1,
            cordon_helper::PROTOCOL_VERSION
        )
    );
    drop(fake.await);
    drop(raw.stdin);
    raw.child.wait().await.expect("exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_errors_and_the_session_goes_on() {
    let mut raw = Raw::spawn();
    raw.send_header(br#"{"id":1,"type":"read_file","path":"/etc/passwd"}"#)
        .await;
    assert_eq!(
        raw.protocol_error(1).await,
        "the first request must be hello"
    );
    raw.send_header(b"not json").await;
    assert!(
        raw.protocol_error(0)
            .await
            .starts_with("malformed request header (not JSON)")
    );
    raw.send_header(br#"{"id":2,"type":"launch_missiles"}"#)
        .await;
    assert!(
        raw.protocol_error(2)
            .await
            .starts_with("malformed request: unknown variant `launch_missiles`")
    );
    raw.send_header(
        format!(
            r#"{{"id":3,"type":"hello","version":{}}}"#,
            cordon_helper::PROTOCOL_VERSION
        )
        .as_bytes(),
    )
    .await;
    assert!(matches!(raw.answer().await.body, Response::Hello { .. }));
    raw.send_header(br#"{"id":4,"type":"read_file","path":"/etc/passwd"}"#)
        .await;
    assert_eq!(raw.protocol_error(4).await, "no session: send start first");
    raw.send_header(br#"{"id":0,"type":"probe"}"#).await;
    assert_eq!(
        raw.protocol_error(0).await,
        "request id 0 is reserved; number requests from 1"
    );
    raw.send_header(br#"{"id":5,"type":"probe"}"#).await;
    assert!(matches!(raw.answer().await.body, Response::Probe { .. }));
    // A frame over the bound ends the session with a notice; the helper exits.
    let mut prefix = (MAX_HEADER_BYTES as u32 + 1).to_be_bytes().to_vec();
    prefix.extend_from_slice(&0u32.to_be_bytes());
    raw.stdin.write_all(&prefix).await.expect("write");
    raw.stdin.flush().await.expect("flush");
    let message = raw.protocol_error(0).await;
    assert!(message.contains("more than the limit"), "{message}");
    let status = raw.child.wait().await.expect("exit");
    assert!(
        !status.success(),
        "a broken stream is a failure exit: {status}"
    );
}

/// The `flags:` field of one of `pid`'s descriptors (octal, as /proc prints it).
fn fd_flags(pid: u32, fd: u32) -> u32 {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).expect("fdinfo");
    let flags = info
        .lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .expect("flags line");
    u32::from_str_radix(flags.trim(), 8).expect("octal flags")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_stdin_and_stdout_are_served_by_the_reactor() {
    let mut raw = Raw::spawn();
    // Once the helper answers, it serves its stream.
    raw.send_header(br#"{"id":1,"type":"hello","version":999}"#)
        .await;
    assert_eq!(raw.answer().await.id, 1);
    let pid = raw.child.id().expect("running");
    // Non-blocking pipes are read and written through the reactor; tokio's stdio would have
    // left them blocking and used a thread per read and per write.
    for fd in [0, 1] {
        assert_ne!(
            fd_flags(pid, fd) & libc::O_NONBLOCK as u32,
            0,
            "fd {fd} is blocking"
        );
    }
    // stderr is left alone.
    assert_eq!(fd_flags(pid, 2) & libc::O_NONBLOCK as u32, 0);
    drop(raw.stdin);
    raw.child.wait().await.expect("exit");
}
