//! File operations and search through `cordon-helper serve` in the container: chosen where it
//! can run, the shell workers otherwise (turned off, an image that cannot run it), required
//! sessions refused without it, and a helper killed mid-call.

use std::path::Path;

use cordon_backend_docker::{DockerBackend, DockerError, FilesHelper, FilesPath, HelperTransport};
use cordon_ops::{Backend, FindRequest, FsError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::{self, BUSYBOX, helper, host_or_skip, run, workspace};

async fn helper_session(
    host: &str,
    root: &Path,
    image: &str,
    wanted: FilesHelper,
) -> DockerBackend {
    let mut config = support::config(host, root);
    config.helper = Some(helper());
    config.image = image.to_owned();
    config.files_helper = wanted;
    DockerBackend::start(config)
        .await
        .expect("a session starts")
}

/// The `cordon-helper serve` processes in the container, as its command sees them.
async fn serving(backend: &DockerBackend) -> Vec<String> {
    let ran = run(backend, "pgrep -f 'cordon-helper [s]erve' || true").await;
    ran.output.lines().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_operations_and_search_run_through_the_helper_when_it_can_run() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::create_dir(ws.path().join(".git")).expect("mkdir .git");
    let backend = helper_session(&host, ws.path(), support::DEBIAN, FilesHelper::Auto).await;
    assert_eq!(backend.files_path(), &FilesPath::Helper);
    assert_eq!(serving(&backend).await.len(), 1);

    let files = backend.files();
    files
        .write_file(Path::new("/workspace/src/a.txt"), b"needle here\n")
        .await
        .expect_err("the parent directory does not exist");
    files
        .create_dir_all(Path::new("/workspace/src"))
        .await
        .expect("mkdir");
    files
        .write_file(Path::new("/workspace/src/a.txt"), b"needle here\n")
        .await
        .expect("write");
    assert_eq!(
        files
            .read_file(Path::new("/workspace/src/a.txt"))
            .await
            .expect("read"),
        b"needle here\n"
    );
    // The host sees the bind-mounted file, written as the workspace owner.
    assert_eq!(
        std::fs::read(ws.path().join("src/a.txt")).expect("host read"),
        b"needle here\n"
    );
    let names: Vec<String> = files
        .read_dir(Path::new("/workspace"))
        .await
        .expect("ls")
        .into_iter()
        .map(|entry| entry.name)
        .collect();
    assert!(names.contains(&"src".to_owned()), "{names:?}");
    // The session's spec reached the helper: `.git/**` is protected by default.
    match files
        .write_file(Path::new("/workspace/.git/config"), b"x")
        .await
    {
        Err(FsError::Protected { .. }) => {}
        other => panic!("expected the protected path to be refused, got {other:?}"),
    }
    let found = backend
        .search()
        .find(
            FindRequest {
                pattern: "*.txt".to_owned(),
                path: "/workspace".into(),
                max_results: 10,
            },
            CancellationToken::new(),
        )
        .await
        .expect("find");
    assert_eq!(found.paths, [Path::new("/workspace/src/a.txt")]);
    backend.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_workers_serve_files_when_the_helper_is_off_or_cannot_run() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("a.txt"), "hello\n").expect("write");

    let off = helper_session(&host, ws.path(), support::DEBIAN, FilesHelper::Shell).await;
    assert_eq!(
        off.files_path(),
        &FilesPath::Shell {
            reason: "turned off in the configuration".to_owned()
        }
    );
    assert!(serving(&off).await.is_empty());
    assert_eq!(
        off.files()
            .read_file(Path::new("/workspace/a.txt"))
            .await
            .expect("read"),
        b"hello\n"
    );
    off.shutdown().await.expect("shutdown");

    // The busybox image has no C library: the glibc helper cannot run there.
    let busybox = helper_session(&host, ws.path(), BUSYBOX, FilesHelper::Auto).await;
    match busybox.files_path() {
        FilesPath::Shell { reason } => assert!(
            reason.starts_with("cordon-helper did not start in the container"),
            "{reason}"
        ),
        FilesPath::Helper => panic!("busybox cannot run the glibc helper"),
    }
    assert_eq!(
        busybox
            .files()
            .read_file(Path::new("/workspace/a.txt"))
            .await
            .expect("read"),
        b"hello\n"
    );
    busybox.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_helper_that_cannot_run_refuses_the_session() {
    let host = host_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.helper = Some(helper());
    config.image = BUSYBOX.to_owned();
    config.files_helper = FilesHelper::Required;
    let error = DockerBackend::start(config)
        .await
        .expect_err("busybox cannot run the helper");
    let text = error.to_string();
    assert!(matches!(error, DockerError::FilesHelper { .. }), "{text}");
    assert!(
        text.starts_with("failed to start the file helper in the container"),
        "{text}"
    );
}

/// `sh -c script` in the container through the docker CLI (the operator's hand, not Cordon's).
fn outside(host: &str, container: &str, script: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["exec", container, "sh", "-c", script])
        .env("DOCKER_HOST", host)
        .output()
        .expect("docker exec");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A call in flight when the helper dies fails and says so; the next call starts a new helper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_killed_mid_call_fails_the_call_and_the_next_call_starts_a_new_one() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("a.txt"), "hello\n").expect("write");
    let backend = helper_session(&host, ws.path(), support::DEBIAN, FilesHelper::Auto).await;
    let first = serving(&backend).await;
    assert_eq!(first.len(), 1, "{first:?}");
    // Connected through its socket, which is gone once the helper was accepted.
    assert_eq!(backend.helper_transport().as_deref(), Some("socket"));
    let sockets = backend.helper_socket_dir().expect("a socket directory");
    assert_eq!(listing(sockets), Vec::<String>::new());
    let client = backend
        .files_helper()
        .expect("the helper runs")
        .ops()
        .current()
        .await
        .expect("a live helper");
    // Stopped, the helper cannot answer: the read below is in flight until it is killed.
    // (From outside Cordon: a command, sandboxed by the helper, cannot signal it.)
    let refused = run(
        &backend,
        "pkill -STOP -f 'cordon-helper [s]erve' || echo refused",
    )
    .await;
    assert!(refused.output.ends_with("refused\n"), "{}", refused.output);
    let stopped = outside(
        &host,
        backend.container(),
        "pkill -STOP -f 'cordon-helper [s]erve' && echo stopped",
    );
    assert_eq!(stopped, "stopped\n");
    let reading = tokio::spawn(async move {
        cordon_ops::FileOperations::read_file(&*client, Path::new("/workspace/a.txt")).await
    });
    let killed = outside(
        &host,
        backend.container(),
        "pkill -KILL -f 'cordon-helper [s]erve' && echo killed",
    );
    assert_eq!(killed, "killed\n");
    match reading.await.expect("join") {
        Err(error) => {
            let text = error.to_string();
            assert!(text.contains("the next call starts a new helper"), "{text}");
        }
        Ok(bytes) => panic!("a stopped and killed helper answered {bytes:?}"),
    }
    assert_eq!(
        backend
            .files()
            .read_file(Path::new("/workspace/a.txt"))
            .await
            .expect("the next call works"),
        b"hello\n"
    );
    let second = serving(&backend).await;
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);
    // The new helper came in through a new socket of its own.
    assert_eq!(backend.helper_transport().as_deref(), Some("socket"));
    assert_eq!(listing(sockets), Vec::<String>::new());
    let line = outside(
        &host,
        backend.container(),
        "pgrep -af 'cordon-helper [s]erve'",
    );
    assert!(
        line.contains("--connect /cordon-helper-socket/helper-2.sock"),
        "{line}"
    );
    backend.shutdown().await.expect("shutdown");
}

/// The names in `dir`.
fn listing(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read the socket directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// With `HelperTransport::Attach` the helper is served over the engine's attach stream, and
/// no socket directory is made or mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_can_keep_the_engine_s_attach_stream() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("a.txt"), "attached\n").expect("write");
    let mut config = support::config(&host, ws.path());
    config.helper = Some(helper());
    config.files_helper = FilesHelper::Required;
    config.helper_transport = HelperTransport::Attach;
    let backend = DockerBackend::start(config)
        .await
        .expect("a session starts");
    assert_eq!(backend.helper_transport().as_deref(), Some("attach"));
    assert!(backend.helper_socket_dir().is_none());
    assert_eq!(
        backend
            .files()
            .read_file(Path::new("/workspace/a.txt"))
            .await
            .expect("read"),
        b"attached\n"
    );
    let ran = run(
        &backend,
        "test -e /cordon-helper-socket || echo no socket directory",
    )
    .await;
    assert_eq!(ran.output, "no socket directory\n");
    let line = outside(
        &host,
        backend.container(),
        "pgrep -af 'cordon-helper [s]erve'",
    );
    assert!(
        line.contains("serve") && !line.contains("--connect"),
        "{line}"
    );
    backend.shutdown().await.expect("shutdown");
}

/// A helper that cannot reach its socket from the container (here: the host directory was
/// replaced after the container mounted the old one, as when an engine's file sharing does
/// not carry sockets) exits, and the session goes on over the attach stream, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_the_container_cannot_reach_falls_back_to_the_attach_stream() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("a.txt"), "hello\n").expect("write");
    let backend = helper_session(&host, ws.path(), support::DEBIAN, FilesHelper::Required).await;
    assert_eq!(backend.helper_transport().as_deref(), Some("socket"));
    let sockets = backend
        .helper_socket_dir()
        .expect("a socket directory")
        .to_path_buf();
    std::fs::rename(&sockets, sockets.with_extension("moved")).expect("move the directory");
    std::fs::create_dir(&sockets).expect("a directory the container does not see");
    let killed = outside(
        &host,
        backend.container(),
        "pkill -KILL -f 'cordon-helper [s]erve' && echo killed",
    );
    assert_eq!(killed, "killed\n");
    // The first call may still find the killed helper (and fail, saying so); the one after
    // it starts a helper, which cannot connect, and then one over the attach stream.
    let mut read = backend
        .files()
        .read_file(Path::new("/workspace/a.txt"))
        .await;
    if read.is_err() {
        read = backend
            .files()
            .read_file(Path::new("/workspace/a.txt"))
            .await;
    }
    assert_eq!(read.expect("read over the attach stream"), b"hello\n");
    let transport = backend.helper_transport().expect("the helper");
    assert!(
        transport.starts_with("attach (the helper cannot reach its socket from the container"),
        "{transport}"
    );
    let ran = run(
        &backend,
        "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status",
    )
    .await;
    assert_eq!(
        ran.output, "NoNewPrivs:\t1\nSeccomp:\t2\n",
        "still sandboxed"
    );
    let line = outside(
        &host,
        backend.container(),
        "pgrep -af 'cordon-helper [s]erve'",
    );
    assert!(!line.contains("--connect"), "{line}");
    backend.shutdown().await.expect("shutdown");
}

/// The socket directory is read-only in the container, for commands and for root alike:
/// nothing there can be created, replaced by a link, renamed or removed, so the only socket a
/// process in the container finds there is one this process made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_directory_cannot_be_changed_from_the_container() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = helper_session(&host, ws.path(), support::DEBIAN, FilesHelper::Auto).await;
    assert_eq!(backend.helper_transport().as_deref(), Some("socket"));
    let attempts = "cd /cordon-helper-socket || exit 9; \
        for try in 'touch helper-2.sock' 'ln -s /tmp helper-2.sock' 'mkfifo helper-2.sock' \
                   'mkdir d' 'chmod 777 .'; do \
          sh -c \"$try\" 2>/dev/null && echo \"$try: done\"; \
        done; echo end";
    let ran = run(&backend, attempts).await;
    assert_eq!(ran.output, "end\n", "as a command");
    let as_root = std::process::Command::new("docker")
        .args(["exec", "-u", "0", backend.container(), "sh", "-c", attempts])
        .env("DOCKER_HOST", &host)
        .output()
        .expect("docker exec");
    assert_eq!(String::from_utf8_lossy(&as_root.stdout), "end\n", "as root");
    let sockets = backend.helper_socket_dir().expect("a socket directory");
    assert_eq!(listing(sockets), Vec::<String>::new());
    backend.shutdown().await.expect("shutdown");
}

/// A command running when its helper dies (killed from outside: a command cannot signal it)
/// goes with it: in the container there is no PID namespace per command, so the sandbox's
/// warden, a process the helper started, kills the groups of the commands still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_running_when_its_helper_dies_dies_with_it() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = helper_session(&host, ws.path(), support::DEBIAN, FilesHelper::Required).await;
    let marker = format!("cordon-orphan-{}", std::process::id());
    // The marker split in two, so that the script's own command line does not carry it.
    let (head, tail) = marker.split_at(marker.len() / 2);
    let script = format!(
        "M='{head}'; M=\"$M\"'{tail}'; (exec -a \"$M\" sleep 300) & (exec -a \"$M\" sleep 300) & wait"
    );
    let count = format!("pgrep -fc '^{marker}' || true");
    let (tx, mut rx) = mpsc::channel(16);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let bash = backend.bash();
    let command = bash.exec(
        cordon_ops::ExecRequest {
            call_id: None,
            command: script,
            cwd: "/workspace".into(),
            timeout: std::time::Duration::from_secs(600),
            env: vec![],
        },
        CancellationToken::new(),
        tx,
    );
    let killer = async {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while outside(&host, backend.container(), &count) != "2\n" {
            assert!(
                std::time::Instant::now() < deadline,
                "the sleepers never started"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let killed = outside(
            &host,
            backend.container(),
            "pkill -KILL -f 'cordon-helper [s]erve' && echo killed",
        );
        assert_eq!(killed, "killed\n");
    };
    let (outcome, ()) = tokio::join!(command, killer);
    drain.await.expect("drain");
    let error = outcome.expect_err("the command's helper died under it");
    assert!(
        error
            .to_string()
            .contains("the next call starts a new helper"),
        "{error}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while outside(&host, backend.container(), &count) != "0\n" {
        assert!(
            std::time::Instant::now() < deadline,
            "the command's processes outlived its helper"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // And the session goes on with a new helper.
    let ran = run(&backend, "echo again").await;
    assert_eq!(ran.output, "again\n");
}
