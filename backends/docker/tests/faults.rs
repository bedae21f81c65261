//! Faults of the container and of the engine: a session notices a dead container, says what
//! happened in the result the model reads, and carries on in a fresh container; an engine that
//! is down gives a clear "engine unreachable" error (the test's watchdog fails a hang), and the
//! session recovers once the engine is back. The engine test runs its own private dockerd (the
//! shared one serves concurrent tests and must never be restarted).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cordon_backend_docker::{DockerBackend, DockerConfig};
use cordon_ops::{Backend, ExecError, ExecOutcome, ExecRequest, ExitStatus};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::{self, BUSYBOX, host_or_skip, run, session, workspace};

/// A call that does not finish within this time is a hang: the test fails.
const WATCHDOG: Duration = Duration::from_secs(120);

fn docker(host: &str, args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .env("DOCKER_HOST", host)
        .output()
        .expect("run the docker CLI");
    assert!(
        out.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Kill the container and wait (`docker wait`: an engine event, not a sleep) until it is dead.
/// By id: the session may already have replaced it by a new container of the same name (then
/// the old one is gone, which is dead enough).
fn kill_container(host: &str, name: &str) {
    let id = container_id(host, name);
    docker(host, &["kill", &id]);
    let out = Command::new("docker")
        .args(["wait", &id])
        .env("DOCKER_HOST", host)
        .output()
        .expect("run docker wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || stderr.contains("No such container"),
        "docker wait {id} failed: {stderr}"
    );
}

fn container_id(host: &str, name: &str) -> String {
    docker(host, &["inspect", "-f", "{{.Id}}", name])
}

/// Run `command` and return the outcome and the output; `started` (when given) is sent
/// once the output contains it.
async fn exec(
    backend: &DockerBackend,
    command: &str,
    started: Option<(&'static str, tokio::sync::oneshot::Sender<()>)>,
) -> (Result<ExecOutcome, ExecError>, String) {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    let request = ExecRequest {
        call_id: None,
        command: command.to_owned(),
        cwd: PathBuf::from("/workspace"),
        timeout: Duration::from_secs(600),
        env: vec![],
    };
    let bash = backend.bash();
    let collector = tokio::spawn(async move {
        let mut out = Vec::new();
        let mut started = started;
        while let Some(chunk) = rx.recv().await {
            out.extend_from_slice(&chunk);
            if let Some((marker, _)) = &started
                && String::from_utf8_lossy(&out).contains(marker)
                && let Some((_, signal)) = started.take()
            {
                let _ = signal.send(());
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    });
    let outcome = tokio::time::timeout(WATCHDOG, bash.exec(request, CancellationToken::new(), tx))
        .await
        .expect("the call must end (no hang)");
    (outcome, collector.await.expect("collector"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_killed_between_calls_is_replaced_for_the_next_call() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let name = backend.container().to_owned();
    let first = run(&backend, "echo one > /workspace/a; echo scratch > /tmp/t").await;
    assert_eq!(first.outcome.status, Some(ExitStatus::Code(0)));
    let old_id = container_id(&host, &name);

    kill_container(&host, &name);
    let (outcome, output) = exec(
        &backend,
        "cat /workspace/a; cat /tmp/t 2>/dev/null || echo no-tmp",
        None,
    )
    .await;
    let outcome = outcome.expect("the next call runs in a fresh container");
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{output}");
    assert_eq!(output, "one\nno-tmp\n");
    assert_eq!(
        outcome.notes,
        vec![format!(
            "[cordon: the sandbox container {name} was killed (exit code 137: SIGKILL, e.g. `docker kill`); a new container was started and ran this command. The workspace is the host directory, nothing in it was lost; files outside it (/tmp, the home directory) and background processes are gone.]"
        )]
    );
    let new_id = container_id(&host, &name);
    assert_ne!(old_id, new_id, "a new container, same name");

    // The call after that is an ordinary one.
    let again = run(&backend, "echo two").await;
    assert_eq!(again.output, "two\n");
    assert_eq!(again.outcome.notes, Vec::<String>::new());

    // A file operation that meets a dead container says so and was not done; its retry works.
    kill_container(&host, &name);
    let error = backend
        .files()
        .read_file(Path::new("/workspace/a"))
        .await
        .expect_err("the read met a dead container");
    let text = error.to_string();
    assert!(
        text.contains(&format!("the sandbox container {name} was killed"))
            && text.contains("a new container was started")
            && text.contains("This operation was not done: retry it"),
        "{text}"
    );
    let data = backend
        .files()
        .read_file(Path::new("/workspace/a"))
        .await
        .expect("the retry works");
    assert_eq!(data, b"one\n");
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_killed_during_a_command_is_named_in_its_result() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let name = backend.container().to_owned();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let running = {
        let backend = backend.clone();
        tokio::spawn(async move {
            exec(
                &backend,
                "echo started; sleep 600",
                Some(("started", started_tx)),
            )
            .await
        })
    };
    started_rx.await.expect("the command started");
    kill_container(&host, &name);
    let (outcome, output) = running.await.expect("the call's task");
    let outcome = outcome.expect("the call reports the container's death in its result");
    assert_eq!(output, "started\n");
    assert_eq!(
        outcome.notes,
        vec![format!(
            "[cordon: the sandbox container {name} was killed (exit code 137: SIGKILL, e.g. `docker kill`) while this command ran; a new container was started for the next call. The workspace is the host directory, nothing in it was lost; files outside it (/tmp, the home directory) and background processes are gone.]"
        )]
    );
    assert_ne!(outcome.status, Some(ExitStatus::Code(0)));

    let next = run(&backend, "echo next").await;
    assert_eq!(next.output, "next\n");
    assert_eq!(next.outcome.status, Some(ExitStatus::Code(0)));
    assert_eq!(next.outcome.notes, Vec::<String>::new());
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_container_in_copy_mode_keeps_its_workspace_volume() {
    let host = host_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.mode = cordon_backend_docker::WorkspaceMode::Copy;
    config.image = BUSYBOX.to_owned();
    let backend = DockerBackend::start(config)
        .await
        .expect("copy-mode session");
    let name = backend.container().to_owned();
    let first = run(&backend, "echo unsynced > /workspace/b").await;
    assert_eq!(first.outcome.status, Some(ExitStatus::Code(0)));

    docker(&host, &["rm", "-f", &name]);
    let (outcome, output) = exec(&backend, "cat /workspace/b", None).await;
    let outcome = outcome.expect("runs in a fresh container");
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)));
    assert_eq!(output, "unsynced\n");
    assert_eq!(
        outcome.notes,
        vec![format!(
            "[cordon: the sandbox container {name} was removed from the Docker engine; a new container was started and ran this command. The workspace volume survived, nothing in /workspace was lost; files outside it (/tmp, the home directory) and background processes are gone.]"
        )]
    );
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_copy_volume_is_refilled_from_the_host_and_the_loss_is_said() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("synced"), "from-host\n").expect("seed file");
    let mut config = support::config(&host, ws.path());
    config.mode = cordon_backend_docker::WorkspaceMode::Copy;
    config.image = BUSYBOX.to_owned();
    let backend = DockerBackend::start(config)
        .await
        .expect("copy-mode session");
    let name = backend.container().to_owned();
    let first = run(&backend, "echo unsynced > /workspace/c").await;
    assert_eq!(first.outcome.status, Some(ExitStatus::Code(0)));

    // The container and its workspace volume are gone (e.g. a prune on the engine).
    let volume = name.replacen("cordon-", "cordon-ws-", 1);
    docker(&host, &["rm", "-f", &name]);
    docker(&host, &["volume", "rm", &volume]);
    let (outcome, output) = exec(
        &backend,
        "cat /workspace/synced; cat /workspace/c 2>/dev/null || echo c-lost",
        None,
    )
    .await;
    let outcome = outcome.expect("runs in a fresh container");
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{output}");
    assert_eq!(output, "from-host\nc-lost\n");
    let root = std::fs::canonicalize(ws.path()).expect("canonical root");
    assert_eq!(
        outcome.notes,
        vec![format!(
            "[cordon: the sandbox container {name} was removed from the Docker engine; a new container was started and ran this command. The workspace volume was gone: /workspace was copied in again from {}, so changes made in the container since the session started or the last sync to the host are lost; files outside it (/tmp, the home directory) and background processes are gone.]",
            root.display()
        )]
    );
    backend.shutdown().await.expect("shut the session down");
}

/// A private dockerd with its own roots and socket; everything is removed on drop, even when
/// the test fails halfway (the daemon is started again if needed to stop its containers).
struct PrivateEngine {
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateEngine {
    fn start() -> PrivateEngine {
        let dir = PathBuf::from(format!(
            "/var/tmp/cordon-engine-test-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(dir.join("data")).expect("data root");
        std::fs::create_dir_all(dir.join("exec")).expect("exec root");
        let mut engine = PrivateEngine { dir, child: None };
        engine.spawn();
        engine
    }

    fn host(&self) -> String {
        format!("unix://{}", self.dir.join("docker.sock").display())
    }

    /// Start dockerd and wait until it answers (readiness, bounded: 60 s).
    fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("dockerd.log"))
            .map_err(|e| format!("failed to open the dockerd log: {e}"))?;
        let stderr = log
            .try_clone()
            .map_err(|e| format!("failed to clone the log fd: {e}"))?;
        let child = Command::new("dockerd")
            .arg("--data-root")
            .arg(self.dir.join("data"))
            .arg("--exec-root")
            .arg(self.dir.join("exec"))
            .arg("--pidfile")
            .arg(self.dir.join("dockerd.pid"))
            .arg("-H")
            .arg(self.host())
            .args(["--bridge=none", "--iptables=false", "--ip-masq=false"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("failed to start a private dockerd: {e}"))?;
        self.child = Some(child);
        for _ in 0..600 {
            let ok = Command::new("docker")
                .args(["version", "--format", "{{.Server.Version}}"])
                .env("DOCKER_HOST", self.host())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "the private dockerd did not answer within 60 s; log: {}",
            std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
        ))
    }

    /// SIGKILL the daemon, and wait until its containerd has followed it and was reaped (a
    /// daemon started while the old containerd's pid exists waits for it in vain); the
    /// container's shim stays.
    fn kill(&mut self) {
        if let Err(e) = self.try_kill() {
            panic!("{e}");
        }
    }

    fn try_kill(&mut self) -> Result<(), String> {
        let containerd = std::fs::read_to_string(self.dir.join("exec/containerd/containerd.pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok());
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let Some(pid) = containerd else {
            return Ok(());
        };
        for _ in 0..600 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "the private dockerd's containerd (pid {pid}) was not gone within 60 s"
        ))
    }

    /// Last resort: SIGKILL every process started for this engine (found by its directory in
    /// their command lines) and, for a container's shim, the container's processes.
    fn kill_leftovers(&self) {
        let marker = self.dir.to_string_lossy().into_owned();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if !args.iter().any(|a| a.contains(&marker)) {
                continue;
            }
            if let Some(id) = args
                .iter()
                .position(|a| a == "-id")
                .and_then(|i| args.get(i + 1))
            {
                let procs = std::fs::read_to_string(format!(
                    "/sys/fs/cgroup/pids/docker/{id}/cgroup.procs"
                ))
                .unwrap_or_default();
                for inner in procs.split_whitespace() {
                    let _ = Command::new("kill").args(["-KILL", inner]).status();
                }
            }
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

impl Drop for PrivateEngine {
    fn drop(&mut self) {
        // No panic here: this runs while a failed test unwinds.
        let mut up = self.child.is_some();
        if !up {
            // A killed daemon leaves its containers' shims; a restarted one stops them.
            up = self.try_kill().is_ok() && self.try_spawn().is_ok();
        }
        let host = self.host();
        if up {
            let ids = Command::new("docker")
                .args(["ps", "-aq"])
                .env("DOCKER_HOST", &host)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for id in ids.split_whitespace() {
                let _ = Command::new("docker")
                    .args(["rm", "-f", id])
                    .env("DOCKER_HOST", &host)
                    .output();
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
        self.kill_leftovers();
        // dockerd bind-mounts its data root onto itself.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.join("data"))
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_is_unreachable_while_down_and_recovered_after() {
    let shared = host_or_skip!();
    let mut engine = PrivateEngine::start();
    let host = engine.host();
    let mut save = Command::new("docker")
        .args(["save", BUSYBOX])
        .env("DOCKER_HOST", &shared)
        .stdout(Stdio::piped())
        .spawn()
        .expect("docker save");
    let load = Command::new("docker")
        .arg("load")
        .env("DOCKER_HOST", &host)
        .stdin(save.stdout.take().expect("save's stdout"))
        .output()
        .expect("docker load");
    assert!(save.wait().expect("docker save ends").success());
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );

    let ws = workspace();
    let mut config = DockerConfig::new(ws.path());
    config.docker_host = Some(host.clone());
    config.image = BUSYBOX.to_owned();
    let backend = DockerBackend::start(config).await.expect("session");
    let name = backend.container().to_owned();
    let first = run(&backend, "echo kept > /workspace/k").await;
    assert_eq!(first.outcome.status, Some(ExitStatus::Code(0)));

    engine.kill();
    let (outcome, _) = exec(&backend, "echo while-down", None).await;
    let reason = match outcome {
        Err(ExecError::Backend { reason }) => reason,
        other => panic!("expected an unreachable engine, got {other:?}"),
    };
    assert!(
        reason.starts_with(&format!("docker engine unreachable at {host}: "))
            && reason.ends_with("; is dockerd running? (`cordon doctor --backend docker`)"),
        "{reason}"
    );
    let read = tokio::time::timeout(
        WATCHDOG,
        backend.files().read_file(Path::new("/workspace/k")),
    )
    .await
    .expect("the read must end (no hang)");
    let text = read.expect_err("the engine is down").to_string();
    assert!(text.contains("docker engine unreachable at"), "{text}");

    engine.spawn();
    let (outcome, output) = exec(&backend, "cat /workspace/k", None).await;
    let outcome = outcome.expect("runs once the engine is back");
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{output}");
    assert_eq!(output, "kept\n");
    let [note] = outcome.notes.as_slice() else {
        panic!("one note expected: {:?}", outcome.notes);
    };
    assert!(
        note.starts_with(&format!(
            "[cordon: the sandbox container {name} stopped when the Docker engine restarted (exit code "
        )) && note.ends_with("a new container was started and ran this command. The workspace is the host directory, nothing in it was lost; files outside it (/tmp, the home directory) and background processes are gone.]"),
        "{note}"
    );
    backend.shutdown().await.expect("shut the session down");
    drop(engine);
}
