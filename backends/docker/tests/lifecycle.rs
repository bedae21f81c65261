//! Session lifecycle and the container's hardening: removal, crash reaping, clear errors,
//! uid:gid, read-only root, no capabilities, network none, memory and pids limits.

use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use cordon_backend_docker::{DockerBackend, DockerError};
use cordon_core::sandbox::Limits;
use cordon_ops::{Backend, ExitStatus, Termination};

use crate::support::{self, container_exists, host_or_skip, run, session, workspace};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_is_hardened_and_removed_at_shutdown() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let name = backend.container().to_owned();
    assert!(container_exists(&host, &name).await);

    let ran = run(
        &backend,
        "grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status; \
         touch /etc/cordon-probe 2>/dev/null && echo root-writable || echo root-read-only; \
         touch /tmp/t && echo tmp-writable; touch /workspace/w && echo workspace-writable; \
         ls /sys/class/net; cat /proc/1/comm",
    )
    .await;
    // The init process: Docker's tini, Podman's catatonit.
    let init = match backend.engine_kind() {
        cordon_backend_docker::EngineKind::Docker => "docker-init",
        cordon_backend_docker::EngineKind::Podman => "podman-init",
    };
    assert_eq!(
        ran.output,
        format!(
            "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\n\
             root-read-only\ntmp-writable\nworkspace-writable\nlo\n{init}\n"
        )
    );
    assert_eq!(ran.outcome.status, Some(ExitStatus::Code(0)));

    backend.shutdown().await.expect("shut the session down");
    assert!(
        !container_exists(&host, &name).await,
        "container {name} must be removed"
    );
    // Idempotent.
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_backend_removes_the_container() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let name = backend.container().to_owned();
    drop(backend);
    assert!(
        !container_exists(&host, &name).await,
        "container {name} must be removed on drop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_down_is_a_clear_error() {
    let _ = host_or_skip!();
    let ws = workspace();
    let config = support::config("unix:///nonexistent/cordon/docker.sock", ws.path());
    let err = DockerBackend::start(config)
        .await
        .expect_err("no daemon there");
    assert!(matches!(err, DockerError::Unreachable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(
            "failed to reach the Docker daemon at unix:///nonexistent/cordon/docker.sock"
        ) && text.contains("scripts/docker-start.sh"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_image_is_a_clear_error() {
    let host = host_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.image = "cordon-no-such-image:latest".to_owned();
    let err = DockerBackend::start(config)
        .await
        .expect_err("no such image");
    assert_eq!(
        err.to_string(),
        "failed to find image `cordon-no-such-image:latest` on the Docker host: build it with scripts/build-sandbox-image.sh (Cordon never pulls images)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_and_files_belong_to_the_workspace_owner() {
    let host = host_or_skip!();
    let ws = workspace();
    std::os::unix::fs::chown(ws.path(), Some(1234), Some(2345)).expect("chown");
    let backend = session(&host, ws.path()).await;
    let ran = run(&backend, "id -u; id -g; touch made-by-bash").await;
    assert_eq!(ran.output, "1234\n2345\n");
    backend
        .files()
        .write_file(std::path::Path::new("/workspace/made-by-write"), b"x")
        .await
        .expect("write");
    for name in ["made-by-bash", "made-by-write"] {
        let meta = std::fs::metadata(ws.path().join(name)).expect("created on the host");
        assert_eq!((meta.uid(), meta.gid()), (1234, 2345), "{name}");
    }
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb_is_oom_killed_with_a_clear_error() {
    let host = host_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.spec.limits = Limits {
        memory_bytes: Some(64 << 20),
        ..Limits::default()
    };
    let backend = DockerBackend::start(config).await.expect("start");
    let ran = run(
        &backend,
        "python3 -c 'a = []\nwhile True: a.append(bytearray(1 << 20))'",
    )
    .await;
    assert_eq!(
        ran.outcome.status,
        Some(ExitStatus::Signal(9)),
        "{}",
        ran.output
    );
    assert!(
        ran.output.contains(
            "[cordon: the command was killed by the out-of-memory killer: the sandbox memory limit of 64 MiB was exceeded]"
        ),
        "{}",
        ran.output
    );
    // The session survives the OOM kill.
    assert_eq!(run(&backend, "echo alive").await.output, "alive\n");
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pids_limit_is_enforced() {
    let host = host_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.spec.limits = Limits {
        pids: Some(24),
        ..Limits::default()
    };
    let backend = DockerBackend::start(config).await.expect("start");
    let ran = run(
        &backend,
        "python3 -c 'import os, time\nn = 0\ntry:\n    while n < 60:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(\"fork failed: errno\", e.errno)\nprint(\"started\", n)'",
    )
    .await;
    let mut lines = ran.output.lines();
    assert_eq!(
        lines.next(),
        Some("fork failed: errno 11"),
        "{}",
        ran.output
    );
    let started: usize = lines
        .next()
        .and_then(|l| l.strip_prefix("started "))
        .and_then(|n| n.parse().ok())
        .expect("count");
    assert!(started < 24, "pids limit not enforced: {}", ran.output);
    // The background sleeps did not survive the call.
    let left = run(
        &backend,
        "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'import o[s]' || true",
    )
    .await;
    assert_eq!(left.output.trim(), "0");
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_none_has_no_interface_but_loopback() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let ran = run(
        &backend,
        "ls /sys/class/net; python3 -c 'import socket; s=socket.socket(); s.settimeout(5); s.connect((\"127.0.0.1\", 9))' 2>&1 | tail -n1",
    )
    .await;
    assert_eq!(
        ran.output,
        "lo\nConnectionRefusedError: [Errno 111] Connection refused\n"
    );
    backend.shutdown().await.expect("shut the session down");
}

/// Runs only as the child of the crash and Ctrl-C tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper: run by the crash test as a child process"]
async fn crash_child_session() {
    let root = std::env::var("CORDON_CRASH_CHILD_ROOT")
        .expect("this helper only runs as the crash test's child (CORDON_CRASH_CHILD_ROOT)");
    let host = std::env::var("CORDON_CRASH_CHILD_HOST").expect("CORDON_CRASH_CHILD_HOST");
    let backend = session(&host, std::path::Path::new(&root)).await;
    if std::env::var("CORDON_CRASH_CHILD_CTRL_C").is_ok() {
        let _handler = backend.stop_on_ctrl_c();
    }
    println!("CONTAINER={}", backend.container());
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// Start the helper child session; returns it and its container's name.
fn spawn_child_session(
    host: &str,
    root: &std::path::Path,
    ctrl_c: bool,
) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args([
            "--exact",
            "lifecycle::crash_child_session",
            "--ignored",
            "--nocapture",
        ])
        .env("CORDON_CRASH_CHILD_ROOT", root)
        .env("CORDON_CRASH_CHILD_HOST", host)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if ctrl_c {
        command.env("CORDON_CRASH_CHILD_CTRL_C", "1");
    }
    let mut child = command.spawn().expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut name = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.expect("read child");
        if let Some(n) = line.strip_prefix("CONTAINER=") {
            name = Some(n.to_owned());
            break;
        }
    }
    (child, name.expect("child reported its container"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_with_the_opt_in_handler_removes_the_container() {
    let host = host_or_skip!();
    let ws = workspace();
    let (mut child, name) = spawn_child_session(&host, ws.path(), true);
    assert!(container_exists(&host, &name).await);
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let exit = child.wait().expect("wait child");
    assert_eq!(exit.code(), Some(130));
    assert!(
        !container_exists(&host, &name).await,
        "Ctrl-C must remove {name}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_sessions_container_is_reaped_by_the_next_start() {
    let host = host_or_skip!();
    let ws = workspace();
    let (mut child, name) = spawn_child_session(&host, ws.path(), false);
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap child");
    assert!(
        container_exists(&host, &name).await,
        "a crash leaves the container behind"
    );

    // A live session of this process must not be reaped by the next start.
    let live = session(&host, ws.path()).await;
    let next = session(&host, ws.path()).await;
    assert!(
        !container_exists(&host, &name).await,
        "stale container {name} must be reaped"
    );
    assert!(
        container_exists(&host, live.container()).await,
        "a live session is never reaped"
    );
    let ran = run(&live, "echo still-here").await;
    assert_eq!(ran.outcome.termination, Termination::Exited);
    assert_eq!(ran.output, "still-here\n");
    live.shutdown().await.expect("shut the session down");
    next.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spill_volumes_of_deleted_roots_are_removed() {
    let host = host_or_skip!();
    let gone = workspace();
    let root = std::fs::canonicalize(gone.path()).expect("canon");
    let volume = cordon_backend_docker::spill_volume_name(&root);
    session(&host, &root)
        .await
        .shutdown()
        .await
        .expect("shut the session down");
    let exists = |name: &str| {
        Command::new("docker")
            .args(["volume", "inspect", name])
            .env("DOCKER_HOST", &host)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("docker volume inspect")
            .success()
    };
    assert!(exists(&volume), "the spill volume outlives its session");
    drop(gone);
    let other = workspace();
    let next = session(&host, other.path()).await;
    assert!(
        !exists(&volume),
        "spill volume {volume} of a deleted root must be removed"
    );
    next.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_removes_expired_spill_files_of_its_root_and_only_those() {
    let host = host_or_skip!();
    let ws = workspace();
    let first = session(&host, ws.path()).await;
    let ran = run(
        &first,
        "cd /cordon-spill && printf x > cordon-bash-00000000000000e1.log && \
         printf x > cordon-bash-00000000000000e2.log && printf x > notes.log && \
         ln -s notes.log cordon-bash-00000000000000e3.log && \
         touch -h -d @1000 cordon-bash-00000000000000e1.log notes.log cordon-bash-00000000000000e3.log && \
         echo made",
    )
    .await;
    assert!(ran.output.contains("made"), "{}", ran.output);
    first.shutdown().await.expect("shut the session down");
    let next = session(&host, ws.path()).await;
    let listed = run(&next, "ls -a /cordon-spill").await.output;
    assert!(
        !listed.contains("e1.log"),
        "expired spill file stays: {listed}"
    );
    for kept in ["e2.log", "notes.log", "e3.log"] {
        assert!(listed.contains(kept), "{kept} removed: {listed}");
    }
    run(
        &next,
        "rm -f /cordon-spill/notes.log /cordon-spill/cordon-bash-00000000000000e*",
    )
    .await;
    next.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_removes_stale_write_temp_files_and_keeps_live_ones() {
    let host = host_or_skip!();
    let ws = workspace();
    let root = ws.path();
    std::fs::create_dir_all(root.join("sub")).expect("mkdir");
    let stale = root.join("sub/.a.txt.cordon-0123456789abcdef.tmp");
    let live = root.join(".b.txt.cordon-fedcba9876543210.tmp");
    let foreign = root.join(".a.txt.cordon-draft.tmp");
    for file in [&stale, &live, &foreign] {
        std::fs::write(file, b"half").expect("write");
    }
    for file in [&stale, &foreign] {
        std::fs::File::options()
            .append(true)
            .open(file)
            .expect("open")
            .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(20 * 60))
            .expect("age");
    }
    let backend = session(&host, root).await;
    assert!(!stale.exists(), "a stale temp file is removed at start");
    assert!(
        live.exists(),
        "a temp file modified a moment ago may be a write in flight"
    );
    assert!(foreign.exists(), "only Cordon's exact naming is removed");
    // The helper's own writes leave nothing behind.
    backend
        .files()
        .write_file(&backend.files().root().join("c.txt"), b"new")
        .await
        .expect("write");
    let names: Vec<String> = std::fs::read_dir(root)
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let temps: Vec<&String> = names
        .iter()
        .filter(|n| {
            cordon_ops::leftovers::is_write_temp_name(n.as_bytes()) || n.contains("cordon-tmp")
        })
        .collect();
    assert_eq!(
        temps,
        vec![".b.txt.cordon-fedcba9876543210.tmp"],
        "{names:?}"
    );
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_networked_container_reaches_no_host_unix_socket() {
    let host = host_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.spec.network = cordon_core::sandbox::NetworkMode::Enabled;
    let backend = DockerBackend::start(config).await.expect("start");
    let daemon_socket = host
        .strip_prefix("unix://")
        .unwrap_or("/var/run/docker.sock");
    let ran = run(
        &backend,
        &format!(
            "for s in {daemon_socket} /var/run/docker.sock /run/docker.sock; do \
               [ -e \"$s\" ] && echo \"visible $s\"; done; \
             find / -xdev -type s 2>/dev/null | sed 's/^/socket /'; echo done"
        ),
    )
    .await;
    assert!(ran.output.contains("done"), "{}", ran.output);
    assert!(!ran.output.contains("visible"), "{}", ran.output);
    assert!(!ran.output.contains("socket "), "{}", ran.output);
    drop(backend);

    // A configuration that would bind the daemon's socket in is refused before any container
    // exists.
    let mut config = support::config(&host, ws.path());
    config.spec.network = cordon_core::sandbox::NetworkMode::Enabled;
    let parent = std::path::Path::new(daemon_socket)
        .parent()
        .unwrap()
        .display()
        .to_string();
    config.spec.readable_roots = vec![parent];
    let err = DockerBackend::start(config)
        .await
        .expect_err("the daemon socket must not be mountable");
    assert!(matches!(err, DockerError::HostSocket { .. }), "{err:?}");
}
