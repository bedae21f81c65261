//! Commands: refused without `allow_degraded` (fail closed), merged output, exit codes and
//! signals, environment, missing cwd, timeout and cancel killing the whole remote tree (setsid
//! escapees included), concurrency, one worker serving command after command (also after
//! leftovers and timeouts), and an idle worker that died being replaced transparently.

use std::path::Path;
use std::time::{Duration, Instant};

use cordon_backend_ssh::SshBackend;
use cordon_ops::{Backend, ExecError, ExecOutcome, ExecRequest, ExitStatus, Termination};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::support::{alive, server};

pub async fn run(
    backend: &dyn Backend,
    command: &str,
    cwd: &Path,
    timeout: Duration,
    cancel: CancellationToken,
) -> (Result<ExecOutcome, ExecError>, String) {
    let (tx, mut rx) = mpsc::channel(16);
    let request = ExecRequest {
        call_id: None,
        command: command.to_owned(),
        cwd: cwd.to_path_buf(),
        timeout,
        env: vec![("CORDON_TEST_VAR".into(), "from request".into())],
    };
    let bash = backend.bash();
    let task = tokio::spawn(async move { bash.exec(request, cancel, tx).await });
    let mut output = Vec::new();
    while let Some(chunk) = rx.recv().await {
        output.extend_from_slice(&chunk);
    }
    let result = task.await.expect("exec task");
    (result, String::from_utf8_lossy(&output).into_owned())
}

const LONG: Duration = Duration::from_secs(120);

fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pids_in(text: &str) -> Vec<u32> {
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn assert_all_dead(pids: &[u32]) {
    assert!(!pids.is_empty());
    for pid in pids {
        assert!(!alive(*pid), "process {pid} survived the call");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_output_exit_codes_and_signals() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let ws = server.workspace.clone();
    let (result, output) = run(
        &backend,
        "echo out; echo err >&2; echo out2; exit 3",
        &ws,
        LONG,
        CancellationToken::new(),
    )
    .await;
    let outcome = result.expect("exec");
    assert_eq!(output, "out\nerr\nout2\n");
    assert_eq!(outcome.status, Some(ExitStatus::Code(3)));
    assert_eq!(outcome.termination, Termination::Exited);

    let (result, _) = run(&backend, "kill -9 $$", &ws, LONG, CancellationToken::new()).await;
    assert_eq!(result.expect("exec").status, Some(ExitStatus::Signal(9)));

    let (result, output) = run(&backend, "pwd", &ws, LONG, CancellationToken::new()).await;
    assert_eq!(result.expect("exec").status, Some(ExitStatus::Code(0)));
    assert_eq!(
        output.trim_end(),
        ws.canonicalize().unwrap().to_str().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_environment_without_login_leaks() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let (result, output) = run(
        &backend,
        "echo \"var=$CORDON_TEST_VAR leak=${CORDON_LEAK:-none} bash_env=${BASH_ENV:-none}\"",
        &server.workspace,
        LONG,
        CancellationToken::new(),
    )
    .await;
    result.expect("exec");
    // The rc file's noise (BASH_ENV in the login shell) never shows, nor sshd's SetEnv.
    assert_eq!(output, "var=from request leak=none bash_env=none\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_cwd_is_reported() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let missing = server.workspace.join("nope");
    let (result, _) = run(&backend, "true", &missing, LONG, CancellationToken::new()).await;
    match result {
        Err(ExecError::MissingCwd { cwd }) => assert_eq!(cwd, missing),
        other => panic!("expected MissingCwd, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_tree_including_setsid_escapees() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let pids = server.workspace.join("pids");
    let script = format!(
        "sleep 300 & a=$!; setsid sleep 301 & b=$!; nohup sh -c 'sleep 302' >/dev/null 2>&1 & c=$!; \
         echo \"$$ $a $b $c\" > {}; echo started; wait",
        pids.display()
    );
    let (result, output) = run(
        &backend,
        &script,
        &server.workspace,
        Duration::from_secs(2),
        CancellationToken::new(),
    )
    .await;
    let outcome = result.expect("exec");
    assert_eq!(outcome.termination, Termination::TimedOut);
    assert!(output.contains("started"), "{output}");
    assert_all_dead(&pids_in(&wait_for_file(&pids)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setsid_survivor_after_exit_is_killed() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let pids = server.workspace.join("pids");
    let script = format!(
        "setsid sh -c 'sleep 303' >/dev/null 2>&1 < /dev/null & echo $! > {}; echo done",
        pids.display()
    );
    let (result, output) = run(
        &backend,
        &script,
        &server.workspace,
        LONG,
        CancellationToken::new(),
    )
    .await;
    assert_eq!(result.expect("exec").status, Some(ExitStatus::Code(0)));
    assert_eq!(output, "done\n");
    assert_all_dead(&pids_in(&wait_for_file(&pids)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_tree() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let pids = server.workspace.join("pids");
    let cancel = CancellationToken::new();
    let script = format!("sleep 304 & echo \"$$ $!\" > {}; wait", pids.display());
    let trigger = {
        let cancel = cancel.clone();
        let pids = pids.clone();
        tokio::task::spawn_blocking(move || {
            wait_for_file(&pids);
            cancel.cancel();
        })
    };
    let (result, _) = run(&backend, &script, &server.workspace, LONG, cancel).await;
    trigger.await.expect("trigger");
    assert_eq!(result.expect("exec").termination, Termination::Cancelled);
    assert_all_dead(&pids_in(&wait_for_file(&pids)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_commands_share_one_connection() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let mut tasks = Vec::new();
    for i in 0..24 {
        let bash = backend.bash();
        let ws = server.workspace.clone();
        tasks.push(tokio::spawn(async move {
            let (tx, mut rx) = mpsc::channel(4);
            let request = ExecRequest {
                call_id: None,
                command: format!("echo {i}"),
                cwd: ws,
                timeout: LONG,
                env: Vec::new(),
            };
            let run =
                tokio::spawn(async move { bash.exec(request, CancellationToken::new(), tx).await });
            let mut out = Vec::new();
            while let Some(c) = rx.recv().await {
                out.extend(c);
            }
            (
                run.await.expect("task").expect("exec"),
                String::from_utf8(out).unwrap(),
            )
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let (outcome, out) = task.await.expect("task");
        assert_eq!(outcome.status, Some(ExitStatus::Code(0)));
        assert_eq!(out, format!("{i}\n"));
    }
    // Connection setup happened once: sshd logged a single authentication.
    let log = std::fs::read_to_string(server.dir.path().join("sshd.log")).unwrap();
    assert_eq!(
        log.matches("Accepted publickey for root").count(),
        1,
        "one connection expected, sshd log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_are_refused_without_allow_degraded() {
    let Some(server) = server() else { return };
    let backend = SshBackend::connect(server.strict_config())
        .await
        .expect("connect");
    let (result, output) = run(
        &backend,
        "touch should-not-exist",
        &server.workspace,
        LONG,
        CancellationToken::new(),
    )
    .await;
    match result {
        Err(ExecError::Sandbox { layer, reason }) => {
            assert_eq!(layer, "remote-sandbox");
            assert!(reason.contains("--allow-degraded"), "{reason}");
            assert!(reason.contains("root@127.0.0.1"), "{reason}");
        }
        other => panic!("expected a sandbox refusal, got {other:?}"),
    }
    assert_eq!(output, "");
    assert!(!server.workspace.join("should-not-exist").exists());
    assert!(
        backend.missing_layers().is_empty(),
        "nothing runs degraded: {:?}",
        backend.missing_layers()
    );
    // File tools stay available (and confined).
    let file = server.workspace.join("f.txt");
    backend
        .files()
        .write_file(&file, b"x")
        .await
        .expect("write");
    assert_eq!(backend.files().read_file(&file).await.expect("read"), b"x");
    assert!(matches!(
        backend
            .files()
            .read_file(std::path::Path::new("/etc/hostname"))
            .await,
        Err(cordon_ops::FsError::OutsideRoot { .. })
    ));

    // With the operator's consent every result names what is missing.
    let degraded = server.connect().await;
    let layers = degraded.missing_layers();
    assert!(
        layers
            .iter()
            .any(|l| l.contains("remote account's full rights")),
        "{layers:?}"
    );
    assert!(layers.iter().any(|l| l.contains("network")), "{layers:?}");
}

/// The pid of the process that started the command's shell: the worker serving it.
async fn worker_pid(backend: &dyn Backend, ws: &Path) -> u32 {
    let (result, output) = run(backend, "echo $PPID", ws, LONG, CancellationToken::new()).await;
    assert_eq!(result.expect("exec").status, Some(ExitStatus::Code(0)));
    output.trim().parse().expect("a pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_serves_command_after_command() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let ws = server.workspace.clone();
    let first = worker_pid(&backend, &ws).await;
    assert_eq!(worker_pid(&backend, &ws).await, first);

    // Leftovers killed after the idle grace, a timeout and a failing command: all cleanly
    // handled inside the worker, which serves the next command.
    let pids = ws.join("pids");
    let script = format!(
        "setsid sleep 311 & echo $! > {}; (while :; do echo tick; sleep 0.05; done) & echo done",
        pids.display()
    );
    let (result, output) = run(&backend, &script, &ws, LONG, CancellationToken::new()).await;
    assert_eq!(result.expect("exec").status, Some(ExitStatus::Code(0)));
    assert!(
        output.starts_with("done\n") || output.contains("done\n"),
        "{output}"
    );
    assert_all_dead(&pids_in(&wait_for_file(&pids)));
    let (result, _) = run(
        &backend,
        "sleep 312",
        &ws,
        Duration::from_millis(500),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(result.expect("exec").termination, Termination::TimedOut);
    let (result, _) = run(&backend, "exit 4", &ws, LONG, CancellationToken::new()).await;
    assert_eq!(result.expect("exec").status, Some(ExitStatus::Code(4)));
    assert_eq!(worker_pid(&backend, &ws).await, first);

    // A worker killed while idle is replaced without the caller noticing.
    assert!(alive(first));
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive(first) {
        assert!(Instant::now() < deadline, "the worker did not die");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = worker_pid(&backend, &ws).await;
    assert_ne!(second, first);
    assert_eq!(worker_pid(&backend, &ws).await, second);
}
