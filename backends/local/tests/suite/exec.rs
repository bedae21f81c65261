//! BashOperations: merged output, exit status, timeout and cancel killing the whole process
//! group, the drain grace, a scrubbed environment and a private TMPDIR.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_backend_local::{LocalBackend, LocalConfig};
use cordon_tools::ops::{
    Backend, BashOperations, ExecError, ExecOutcome, ExecRequest, ExitStatus, Termination,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::support::Fixture;

/// Generous bound for calls that must not hang (never a timing assertion on the result).
const HANG_GUARD: Duration = Duration::from_secs(60);

fn request(fx: &Fixture, command: &str, timeout: Duration) -> ExecRequest {
    ExecRequest {
        command: command.to_string(),
        cwd: fx.ws.clone(),
        timeout,
        env: Vec::new(),
    }
}

/// Run a command and collect its whole output.
async fn run(
    bash: &dyn BashOperations,
    request: ExecRequest,
    cancel: CancellationToken,
) -> (String, Result<ExecOutcome, ExecError>) {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(4);
    let collector = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(chunk) = rx.recv().await {
            all.extend_from_slice(&chunk);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let outcome = tokio::time::timeout(HANG_GUARD, bash.exec(request, cancel, tx))
        .await
        .expect("exec must not hang");
    (collector.await.unwrap(), outcome)
}

/// Whether a pid is gone (or a zombie waiting for its reaper).
fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Wait (bounded) until the kernel finished delivering SIGKILL to `pid`.
async fn assert_gone(pid: i32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !is_gone(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "process {pid} survived the call"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // `kill -0` agrees: no such process, or only a zombie entry.
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    assert!(!alive || is_gone(pid));
}

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn stdout_and_stderr_keep_their_order_on_one_stream() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let script = "echo out1; echo err1 >&2; echo out2; echo err2 >&2; printf 'no newline'";
    let (output, outcome) = run(
        bash.as_ref(),
        request(&fx, script, Duration::from_secs(30)),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(output, "out1\nerr1\nout2\nerr2\nno newline");
    assert_eq!(
        outcome.unwrap(),
        ExecOutcome {
            status: Some(ExitStatus::Code(0)),
            termination: Termination::Exited
        }
    );
}

#[tokio::test]
async fn exit_codes_and_signals() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let cases = [
        ("exit 3", ExitStatus::Code(3)),
        ("false", ExitStatus::Code(1)),
        ("kill -KILL $$", ExitStatus::Signal(9)),
        ("kill -TERM $$", ExitStatus::Signal(15)),
    ];
    for (script, expected) in cases {
        let (_, outcome) = run(
            bash.as_ref(),
            request(&fx, script, Duration::from_secs(30)),
            CancellationToken::new(),
        )
        .await;
        let outcome = outcome.unwrap();
        assert_eq!(outcome.status, Some(expected), "{script}");
        assert_eq!(outcome.termination, Termination::Exited);
    }
    assert_eq!(ExitStatus::Signal(9).code(), 137);
}

#[tokio::test]
async fn stdin_is_closed_and_cwd_is_honoured() {
    let fx = Fixture::new();
    std::fs::create_dir(fx.at("sub")).unwrap();
    let bash = fx.bash();
    let mut req = request(&fx, "pwd; cat; echo after-cat", Duration::from_secs(30));
    req.cwd = fx.at("sub");
    let (output, outcome) = run(bash.as_ref(), req, CancellationToken::new()).await;
    assert_eq!(output, format!("{}\nafter-cat\n", fx.at("sub").display()));
    assert_eq!(outcome.unwrap().status, Some(ExitStatus::Code(0)));

    let mut req = request(&fx, "true", Duration::from_secs(30));
    req.cwd = fx.at("missing");
    let (_, outcome) = run(bash.as_ref(), req, CancellationToken::new()).await;
    match outcome {
        Err(ExecError::MissingCwd { cwd }) => assert_eq!(cwd, fx.at("missing")),
        other => panic!("expected MissingCwd, got {other:?}"),
    }
    let mut req = request(&fx, "true", Duration::from_secs(30));
    req.cwd = fx.outside.clone();
    let (_, outcome) = run(bash.as_ref(), req, CancellationToken::new()).await;
    assert!(
        matches!(
            outcome,
            Err(ExecError::Sandbox {
                layer: "filesystem",
                ..
            })
        ),
        "{outcome:?}"
    );
    let denied = Fixture::with(|spec, _| spec.denied = vec!["private/**".into()]);
    std::fs::create_dir(denied.at("private")).unwrap();
    let mut req = request(&denied, "true", Duration::from_secs(30));
    req.cwd = denied.at("private");
    let (_, outcome) = run(denied.bash().as_ref(), req, CancellationToken::new()).await;
    match outcome {
        Err(err @ ExecError::Sandbox { .. }) => {
            assert!(err.to_string().contains("is denied by policy"), "{err}")
        }
        other => panic!("expected a sandbox error, got {other:?}"),
    }
}

/// On timeout the whole group dies, including a child the shell started, and the output
/// produced so far is delivered.
#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let pidfile = fx.at("sleep.pid");
    let script = format!(
        "sleep 600 & echo $! > {}; echo started; wait",
        pidfile.display()
    );
    let (output, outcome) = run(
        bash.as_ref(),
        request(&fx, &script, Duration::from_secs(3)),
        CancellationToken::new(),
    )
    .await;
    let outcome = outcome.unwrap();
    assert_eq!(outcome.termination, Termination::TimedOut);
    assert_eq!(outcome.status, Some(ExitStatus::Signal(15)));
    assert_eq!(output, "started\n");
    assert_gone(read_pid(&pidfile)).await;
}

/// A command ignoring SIGTERM is killed with SIGKILL after the grace.
#[tokio::test]
async fn sigterm_ignored_then_sigkill() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let pidfile = fx.at("stubborn.pid");
    let script = format!(
        "trap '' TERM; sh -c 'trap \"\" TERM; sleep 600' & echo $! > {}; echo ready; wait; wait",
        pidfile.display()
    );
    let (output, outcome) = run(
        bash.as_ref(),
        request(&fx, &script, Duration::from_secs(3)),
        CancellationToken::new(),
    )
    .await;
    let outcome = outcome.unwrap();
    assert_eq!(outcome.termination, Termination::TimedOut);
    assert_eq!(outcome.status, Some(ExitStatus::Signal(9)));
    assert_eq!(output, "ready\n");
    assert_gone(read_pid(&pidfile)).await;
}

/// Cancelling stops the command and its children; output so far is delivered.
#[tokio::test]
async fn cancel_kills_the_group() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let pidfile = fx.at("cancel.pid");
    let script = format!(
        "sleep 600 & echo $! > {}; echo started; wait",
        pidfile.display()
    );
    let cancel = CancellationToken::new();
    let (tx, mut rx) = mpsc::channel(4);
    let exec = {
        let bash = bash.clone();
        let cancel = cancel.clone();
        let req = request(&fx, &script, Duration::from_secs(600));
        tokio::spawn(async move { bash.exec(req, cancel, tx).await })
    };
    let first = tokio::time::timeout(HANG_GUARD, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, b"started\n");
    cancel.cancel();
    let outcome = tokio::time::timeout(HANG_GUARD, exec)
        .await
        .expect("cancel ends the call")
        .unwrap()
        .unwrap();
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert!(outcome.status.is_some());
    assert_gone(read_pid(&pidfile)).await;

    // Cancelled before it started: nothing runs.
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let marker = fx.at("never");
    let (_, outcome) = run(
        bash.as_ref(),
        request(
            &fx,
            &format!("touch {}", marker.display()),
            Duration::from_secs(30),
        ),
        cancelled,
    )
    .await;
    assert_eq!(outcome.unwrap().termination, Termination::Cancelled);
    assert!(!marker.exists());
}

/// A background child that keeps the output pipe open cannot hang the call past the drain
/// grace, and is killed afterwards; output it wrote shortly after exit is still captured.
#[tokio::test]
async fn background_child_holding_the_pipe_does_not_hang() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let pidfile = fx.at("bg.pid");
    let script = format!(
        "(sleep 0.02; echo late; sleep 600) & echo $! > {}; echo main-done",
        pidfile.display()
    );
    let (output, outcome) = run(
        bash.as_ref(),
        request(&fx, &script, Duration::from_secs(600)),
        CancellationToken::new(),
    )
    .await;
    let outcome = outcome.unwrap();
    assert_eq!(
        outcome,
        ExecOutcome {
            status: Some(ExitStatus::Code(0)),
            termination: Termination::Exited
        }
    );
    assert!(output.starts_with("main-done\n"), "{output:?}");
    assert_gone(read_pid(&pidfile)).await;

    // A background job that closed its output is killed too: nothing outlives the call.
    let pidfile = fx.at("quiet.pid");
    let script = format!(
        "sleep 600 >/dev/null 2>&1 & echo $! > {}",
        pidfile.display()
    );
    let (_, outcome) = run(
        bash.as_ref(),
        request(&fx, &script, Duration::from_secs(600)),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(outcome.unwrap().status, Some(ExitStatus::Code(0)));
    assert_gone(read_pid(&pidfile)).await;
}

/// Output keeps flowing with back-pressure: a slow consumer gets every byte.
#[tokio::test]
async fn large_output_with_back_pressure() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let (tx, mut rx) = mpsc::channel(1);
    let req = request(
        &fx,
        "head -c 5000000 /dev/zero | tr '\\0' 'x'",
        Duration::from_secs(120),
    );
    let exec = {
        let bash = bash.clone();
        tokio::spawn(async move { bash.exec(req, CancellationToken::new(), tx).await })
    };
    let mut total = 0usize;
    while let Some(chunk) = rx.recv().await {
        assert!(chunk.iter().all(|&b| b == b'x'));
        total += chunk.len();
        tokio::task::yield_now().await;
    }
    let outcome = exec.await.unwrap().unwrap();
    assert_eq!(outcome.status, Some(ExitStatus::Code(0)));
    assert_eq!(total, 5_000_000);
}

/// The environment is built from scratch: host variables are invisible unless passed.
#[tokio::test]
async fn environment_is_scrubbed() {
    let host_only = "CARGO_MANIFEST_DIR";
    assert!(
        std::env::var_os(host_only).is_some(),
        "cargo sets {host_only} for the test process"
    );
    let fx = Fixture::with(|spec, _| {
        spec.env.set = vec![("FIXED".into(), "from-spec".into())];
    });
    let bash = fx.bash();
    let mut req = request(&fx, "env | sort", Duration::from_secs(30));
    req.env = vec![("FROM_REQUEST".into(), "yes".into())];
    let (output, outcome) = run(bash.as_ref(), req, CancellationToken::new()).await;
    assert_eq!(outcome.unwrap().status, Some(ExitStatus::Code(0)));
    let names: Vec<&str> = output
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    assert!(!names.contains(&host_only), "{output}");
    assert!(output.contains("FIXED=from-spec\n"));
    assert!(output.contains("FROM_REQUEST=yes\n"));
    assert!(output.contains("TERM=dumb\n"));
    for baseline in ["PATH", "HOME", "LANG", "TERM", "TMPDIR"] {
        assert!(names.contains(&baseline), "{baseline} missing in {output}");
    }
    // bash adds only its own bookkeeping variables on top.
    let unexpected: Vec<&&str> = names
        .iter()
        .filter(|n| {
            !matches!(
                **n,
                "PATH"
                    | "HOME"
                    | "LANG"
                    | "TERM"
                    | "TMPDIR"
                    | "FIXED"
                    | "FROM_REQUEST"
                    | "PWD"
                    | "SHLVL"
                    | "_"
                    | "OLDPWD"
            )
        })
        .collect();
    assert!(unexpected.is_empty(), "unexpected variables {unexpected:?}");

    let fx = Fixture::with(|spec, _| spec.env.pass = vec![host_only.into()]);
    let (output, _) = run(
        fx.bash().as_ref(),
        request(&fx, &format!("echo ${host_only}"), Duration::from_secs(30)),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(output.trim_end(), std::env::var(host_only).unwrap());
}

/// TMPDIR is the backend's private 0700 directory, not the shared /tmp.
#[tokio::test]
async fn tmpdir_is_private() {
    let fx = Fixture::new();
    let (output, _) = run(
        fx.bash().as_ref(),
        request(
            &fx,
            "echo \"$TMPDIR\"; stat -c %a \"$TMPDIR\"; mktemp",
            Duration::from_secs(30),
        ),
        CancellationToken::new(),
    )
    .await;
    let lines: Vec<&str> = output.lines().collect();
    let tmp = fx.backend.command_tmp_dir();
    assert_eq!(lines[0], tmp.display().to_string());
    assert_eq!(lines[1], "700");
    assert!(
        PathBuf::from(lines[2]).starts_with(tmp),
        "mktemp honours TMPDIR: {output}"
    );
}

/// Without an explicit opt-in to a degraded sandbox, commands are refused (fail closed) and
/// nothing runs; with it, the missing layers are reported.
#[tokio::test]
async fn commands_fail_closed_without_the_sandbox() {
    let fx = Fixture::new();
    let strict = LocalBackend::new(LocalConfig {
        root: fx.ws.clone(),
        spec: cordon_backend_local::SandboxSpec::default(),
        home: None,
        state_base: Some(fx.state.clone()),
    })
    .unwrap();
    assert!(strict.missing_layers().is_empty());
    let marker = fx.at("ran");
    let (_, outcome) = run(
        strict.bash().as_ref(),
        request(
            &fx,
            &format!("touch {}", marker.display()),
            Duration::from_secs(30),
        ),
        CancellationToken::new(),
    )
    .await;
    match outcome {
        Err(err @ ExecError::Sandbox { .. }) => {
            assert!(err.to_string().contains("allow_degraded"), "{err}")
        }
        other => panic!("expected a sandbox error, got {other:?}"),
    }
    assert!(!marker.exists());
    assert_eq!(
        fx.backend.missing_layers(),
        vec!["landlock", "seccomp", "no_new_privs", "rlimits"]
    );
}
