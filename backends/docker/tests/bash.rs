//! bash semantics: merged output, exit codes and signals, timeout and cancel killing the whole
//! tree (setsid and nohup escapees included), idle grace, missing cwd, environment.

use std::path::PathBuf;
use std::time::Duration;

use cordon_ops::{Backend, ExecError, ExecRequest, ExitStatus, Termination};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::{host_or_skip, run, run_with, session, workspace};

const LEFTOVERS: &str = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done | grep -c '^sleep 30[0-9]' || true";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_merged_in_order_and_exit_codes_are_reported() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let ran = run(
        &backend,
        "echo one; echo two >&2; printf three; echo >&2; exit 3",
    )
    .await;
    assert_eq!(ran.output, "one\ntwo\nthree\n");
    assert_eq!(ran.outcome.status, Some(ExitStatus::Code(3)));
    assert_eq!(ran.outcome.termination, Termination::Exited);
    let ran = run(&backend, "kill -TERM $$").await;
    assert_eq!(ran.outcome.status, Some(ExitStatus::Signal(15)));
    let ran = run(
        &backend,
        "read x; echo \"[$x]\"; pwd; echo $HOME; [ -w \"$HOME\" ] && echo home-writable",
    )
    .await;
    assert_eq!(ran.output, "[]\n/workspace\n/home/cordon\nhome-writable\n");
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_tree_including_escapees() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let ran = run_with(
        &backend,
        "setsid sleep 301 & nohup sleep 302 >/dev/null 2>&1 & (trap '' TERM; sleep 303) & echo started; sleep 304",
        Duration::from_secs(2),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(ran.output, "started\n");
    assert_eq!(ran.outcome.termination, Termination::TimedOut);
    assert!(
        matches!(ran.outcome.status, Some(ExitStatus::Signal(_))),
        "{:?}",
        ran.outcome
    );
    assert_eq!(run(&backend, LEFTOVERS).await.output, "0\n");
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_tree() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let cancel = CancellationToken::new();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    let bash = backend.bash();
    let token = cancel.clone();
    let task = tokio::spawn(async move {
        bash.exec(
            ExecRequest {
                call_id: None,
                command: "echo ready; setsid sleep 305 & sleep 306".to_owned(),
                cwd: PathBuf::from("/workspace"),
                timeout: Duration::from_secs(120),
                env: vec![],
            },
            token,
            tx,
        )
        .await
    });
    // Cancel once the command is demonstrably running.
    let first = rx.recv().await.expect("output");
    assert_eq!(first, b"ready\n");
    cancel.cancel();
    let outcome = task.await.expect("join").expect("exec");
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert_eq!(run(&backend, LEFTOVERS).await.output, "0\n");
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_children_do_not_hold_the_call_and_do_not_survive() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let ran = run_with(
        &backend,
        "(sleep 307; echo late) & echo early",
        Duration::from_secs(60),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(ran.output, "early\n");
    assert_eq!(ran.outcome.termination, Termination::Exited);
    assert_eq!(ran.outcome.status, Some(ExitStatus::Code(0)));
    assert_eq!(run(&backend, LEFTOVERS).await.output, "0\n");
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_cwd_and_environment() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let (tx, _rx) = mpsc::channel::<Vec<u8>>(16);
    let err = backend
        .bash()
        .exec(
            ExecRequest {
                call_id: None,
                command: "true".to_owned(),
                cwd: PathBuf::from("/workspace/nope"),
                timeout: Duration::from_secs(30),
                env: vec![],
            },
            CancellationToken::new(),
            tx,
        )
        .await
        .expect_err("missing cwd");
    assert!(matches!(err, ExecError::MissingCwd { .. }), "{err:?}");

    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    let outcome = backend
        .bash()
        .exec(
            ExecRequest {
                call_id: None,
                command: "echo \"$GREETING|${CARGO_HOME:-unset}|$TMPDIR\"".to_owned(),
                cwd: PathBuf::from("/workspace"),
                timeout: Duration::from_secs(30),
                env: vec![("GREETING".to_owned(), "hello 'world'".to_owned())],
            },
            CancellationToken::new(),
            tx,
        )
        .await
        .expect("exec");
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)));
    let mut out = Vec::new();
    while let Some(chunk) = rx.recv().await {
        out.extend(chunk);
    }
    assert_eq!(String::from_utf8_lossy(&out), "hello 'world'|unset|/tmp\n");
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commands_are_killed_independently() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let long = run_with(
        &backend,
        "sleep 3; echo survived",
        Duration::from_secs(120),
        CancellationToken::new(),
    );
    let doomed = run_with(
        &backend,
        "setsid sleep 308 & nohup sleep 309 >/dev/null 2>&1 & sleep 310",
        Duration::from_secs(1),
        CancellationToken::new(),
    );
    let background = run_with(
        &backend,
        "(sleep 2; echo from-background) & wait",
        Duration::from_secs(120),
        CancellationToken::new(),
    );
    let (long, doomed, background) = tokio::join!(long, doomed, background);
    assert_eq!(doomed.outcome.termination, Termination::TimedOut);
    assert_eq!(long.output, "survived\n");
    assert_eq!(long.outcome.status, Some(ExitStatus::Code(0)));
    assert_eq!(background.output, "from-background\n");
    assert_eq!(background.outcome.termination, Termination::Exited);
    assert_eq!(run(&backend, LEFTOVERS).await.output, "0\n");
    backend.shutdown().await.expect("shut the session down");
}

/// The pid (inside the container) of the worker serving a command: its shell's parent.
async fn worker_pid(backend: &cordon_backend_docker::DockerBackend) -> u32 {
    let ran = run(backend, "echo $PPID").await;
    assert_eq!(
        ran.outcome.status,
        Some(ExitStatus::Code(0)),
        "{}",
        ran.output
    );
    ran.output.trim().parse().expect("a pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_serves_command_after_command_and_a_dead_one_is_replaced() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let first = worker_pid(&backend).await;
    assert_eq!(worker_pid(&backend).await, first, "the worker is reused");

    // Leftovers, a timeout and a failing command are all handled inside the worker, which
    // then serves the next command.
    let ran = run(&backend, "(sleep 308; echo late) & echo done").await;
    assert_eq!(ran.output, "done\n");
    let ran = run_with(
        &backend,
        "sleep 309",
        Duration::from_millis(500),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(ran.outcome.termination, Termination::TimedOut);
    assert_eq!(
        run(&backend, "exit 4").await.outcome.status,
        Some(ExitStatus::Code(4))
    );
    assert_eq!(worker_pid(&backend).await, first);
    assert_eq!(run(&backend, LEFTOVERS).await.output, "0\n");

    // An idle worker killed from outside is replaced without the caller noticing.
    let killed = std::process::Command::new("docker")
        .args([
            "exec",
            backend.container(),
            "kill",
            "-KILL",
            &first.to_string(),
        ])
        .env("DOCKER_HOST", &host)
        .status()
        .expect("docker exec kill");
    assert!(killed.success());
    let second = worker_pid(&backend).await;
    assert_ne!(second, first);
    assert_eq!(worker_pid(&backend).await, second);
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_killing_its_own_worker_is_an_error_and_the_next_command_runs() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let first = worker_pid(&backend).await;
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    let result = backend
        .bash()
        .exec(
            ExecRequest {
                call_id: None,
                command: "echo before; kill -KILL $PPID; sleep 1; echo after".to_owned(),
                cwd: PathBuf::from("/workspace"),
                timeout: Duration::from_secs(60),
                env: vec![],
            },
            CancellationToken::new(),
            tx,
        )
        .await;
    let mut output = Vec::new();
    while let Some(chunk) = rx.recv().await {
        output.extend_from_slice(&chunk);
    }
    // The command cannot finish normally without its worker: either a clear backend error or
    // the worker's own death status, never a success.
    match &result {
        Err(ExecError::Backend { reason }) => assert!(!reason.is_empty()),
        Ok(outcome) => assert_ne!(outcome.status, Some(ExitStatus::Code(0)), "{outcome:?}"),
        Err(other) => panic!("unexpected error {other:?}"),
    }
    assert!(String::from_utf8_lossy(&output).starts_with("before\n"));
    let second = worker_pid(&backend).await;
    assert_ne!(second, first);
    assert_eq!(run(&backend, LEFTOVERS).await.output, "0\n");
    backend.shutdown().await.expect("shut the session down");
}
