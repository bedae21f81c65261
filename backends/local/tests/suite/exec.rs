//! BashOperations: merged output, exit status, timeout and cancel killing the whole process
//! group, the drain grace, a scrubbed environment and a private TMPDIR.

use std::path::PathBuf;
use std::time::Duration;

use cordon_backend_local::{HostSupport, LocalBackend, LocalConfig};
use cordon_ops::{
    Backend, BashOperations, ExecError, ExecOutcome, ExecRequest, ExitStatus, Termination,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::support::Fixture;

/// Generous bound for calls that must not hang (never a timing assertion on the result).
const HANG_GUARD: Duration = Duration::from_secs(60);

fn request(fx: &Fixture, command: &str, timeout: Duration) -> ExecRequest {
    ExecRequest {
        call_id: None,
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

/// A process name no other process on this host has. Background processes in the tests are
/// started as `exec -a TOKEN …`, so the host's `/proc` finds them by name (pids printed inside
/// the sandbox belong to its own PID namespace).
fn token(label: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("cordon-probe-{label}-{}-{n}", std::process::id())
}

/// Shell that starts `command` in the background with `argv[0]` set to `token` and waits
/// until it runs.
fn background(token: &str, prelude: &str, command: &str) -> String {
    format!(
        "({prelude} exec -a {token} {command}) & \
         until read -r -d '' arg0 2>/dev/null < /proc/$!/cmdline && [ \"$arg0\" = {token} ]; do :; done;"
    )
}

/// Shell that waits until a process with `argv[0]` = `token` runs in the sandbox.
fn wait_for(token: &str) -> String {
    format!(
        "found=; while [ -z \"$found\" ]; do for f in /proc/[0-9]*/cmdline; do \
         if read -r -d '' arg0 2>/dev/null < \"$f\" && [ \"$arg0\" = {token} ]; then found=1; fi; \
         done; done;"
    )
}

/// Host pids of live (non-zombie) processes whose `argv[0]` is `token`.
fn processes_named(token: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        // argv[0] only: the scripts themselves mention the token.
        if cmdline.split(|&b| b == 0).next() != Some(token.as_bytes()) {
            continue;
        }
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if !zombie {
            found.push(pid);
        }
    }
    found
}

/// Wait (bounded) until no process named `token` is left on the host.
async fn assert_no_process_named(token: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = processes_named(token);
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "processes {left:?} named {token} survived the call"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
            termination: Termination::Exited,
            notes: Vec::new(),
            egress: Vec::new(),
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
    let name = token("timeout");
    let script = format!("{} echo started; wait", background(&name, "", "sleep 600"));
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
    assert_no_process_named(&name).await;
}

/// A command ignoring SIGTERM is killed with SIGKILL after the grace.
#[tokio::test]
async fn sigterm_ignored_then_sigkill() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let name = token("stubborn");
    let script = format!(
        "trap '' TERM; {} echo ready; wait; wait",
        background(&name, "trap '' TERM;", "sleep 600")
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
    assert_no_process_named(&name).await;
}

/// Cancelling stops the command and its children; output so far is delivered.
#[tokio::test]
async fn cancel_kills_the_group() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let name = token("cancel");
    let script = format!("{} echo started; wait", background(&name, "", "sleep 600"));
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
    assert_eq!(processes_named(&name).len(), 1, "the background job runs");
    cancel.cancel();
    let outcome = tokio::time::timeout(HANG_GUARD, exec)
        .await
        .expect("cancel ends the call")
        .unwrap()
        .unwrap();
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert!(outcome.status.is_some());
    assert_no_process_named(&name).await;

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
    let name = token("bg");
    let script = format!(
        "{} echo main-done",
        background(&name, "sleep 0.02; echo late;", "sleep 600")
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
            termination: Termination::Exited,
            notes: Vec::new(),
            egress: Vec::new(),
        }
    );
    assert_eq!(output, "late\nmain-done\n");
    assert_no_process_named(&name).await;

    // A background job that closed its output is killed too: nothing outlives the call,
    // whatever session or process group it moved to.
    let quiet = token("quiet");
    let detached = token("setsid");
    let orphan = token("double-fork");
    let script = format!(
        "{} setsid -f bash -c 'exec -a {detached} sleep 600' </dev/null >/dev/null 2>&1; {} \
         ( (nohup bash -c 'exec -a {orphan} sleep 600' >/dev/null 2>&1 &) & ); {} echo spawned",
        background(&quiet, "", "sleep 600 >/dev/null 2>&1"),
        wait_for(&detached),
        wait_for(&orphan),
    );
    let (_, outcome) = run(
        bash.as_ref(),
        request(&fx, &script, Duration::from_secs(600)),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(outcome.unwrap().status, Some(ExitStatus::Code(0)));
    assert_no_process_named(&quiet).await;
    assert_no_process_named(&detached).await;
    assert_no_process_named(&orphan).await;
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

/// On a host lacking a required layer, commands fail closed with an error naming it and
/// nothing runs; with the operator's opt-in they run degraded and the missing layers are
/// reported.
#[tokio::test]
async fn commands_fail_closed_without_a_required_layer() {
    let fx = Fixture::new();
    let no_landlock = HostSupport {
        landlock_abi: 0,
        ..cordon_sandbox_probe()
    };
    let config = |allow_degraded: bool| LocalConfig {
        profile: cordon_backend_local::Profile::Host,
        workspace_is_copy: false,
        root: fx.ws.clone(),
        spec: cordon_backend_local::SandboxSpec {
            allow_degraded,
            ..cordon_backend_local::SandboxSpec::default()
        },
        home: None,
        state_base: Some(fx.state.clone()),
    };
    let strict = LocalBackend::with_host_support(config(false), no_landlock).unwrap();
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
        Err(err @ ExecError::Sandbox { layer, .. }) => {
            assert_eq!(layer, "landlock-fs");
            let message = err.to_string();
            assert!(message.contains("allow_degraded"), "{message}");
        }
        other => panic!("expected a sandbox error, got {other:?}"),
    }
    assert!(!marker.exists());
    // File operations do not depend on the command sandbox.
    strict
        .files()
        .write_file(&fx.at("still-works.txt"), b"ok")
        .await
        .unwrap();

    let degraded = LocalBackend::with_host_support(config(true), no_landlock).unwrap();
    assert_eq!(
        degraded.missing_layers(),
        vec![
            "landlock-fs",
            "landlock-ioctl",
            "landlock-net",
            "landlock-scopes"
        ]
    );
    let (_, outcome) = run(
        degraded.bash().as_ref(),
        request(
            &fx,
            &format!("touch {}", marker.display()),
            Duration::from_secs(30),
        ),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(outcome.unwrap().status, Some(ExitStatus::Code(0)));
    assert!(marker.exists());
    assert!(
        fx.backend.missing_layers().is_empty(),
        "this host has every layer"
    );
}

/// The real probe of this host, through the backend's re-export.
fn cordon_sandbox_probe() -> HostSupport {
    let probe = cordon_backend_local::probe_host();
    assert!(
        probe.landlock_abi >= 3 && probe.seccomp && probe.namespaces(),
        "these tests need Landlock >= 3, seccomp and namespaces: {probe:?}"
    );
    probe
}

/// The command sandbox is built by the first command, not with the backend: file tools work
/// (the commands' TMPDIR included) before it exists, and what they put in TMPDIR is what the
/// first command finds there.
#[tokio::test]
async fn the_command_sandbox_is_built_by_the_first_command() {
    let fx = Fixture::new();
    assert!(!fx.backend.command_sandbox_prepared());
    let tmp = fx.backend.command_tmp_dir().to_path_buf();
    let session = tmp.parent().unwrap().to_path_buf();
    assert!(tmp.is_dir() && session.join("home").is_dir());
    assert!(
        !session.join("mask").exists(),
        "nothing of the sandbox is built yet"
    );
    fx.files()
        .write_file(&tmp.join("note.txt"), b"from the write tool")
        .await
        .expect("TMPDIR is writable by file tools before any command");
    fx.put("a.txt", "alpha");
    assert_eq!(
        fx.files().read_file(&fx.at("a.txt")).await.unwrap(),
        b"alpha"
    );
    assert!(!fx.backend.command_sandbox_prepared());
    let (output, outcome) = run(
        &*fx.bash(),
        ExecRequest {
            call_id: None,
            command: "cat \"$TMPDIR/note.txt\"; echo; [ \"$TMPDIR\" = \"$EXPECTED\" ] && echo same"
                .into(),
            cwd: fx.ws.clone(),
            timeout: Duration::from_secs(30),
            env: vec![("EXPECTED".into(), tmp.display().to_string())],
        },
        CancellationToken::new(),
    )
    .await;
    assert_eq!(
        outcome.unwrap().status,
        Some(ExitStatus::Code(0)),
        "{output}"
    );
    assert_eq!(output, "from the write tool\nsame\n");
    assert!(fx.backend.command_sandbox_prepared());
    assert!(session.join("mask").exists());
}

#[tokio::test]
async fn the_git_placeholder_between_commands_is_not_listed_and_goes_at_shutdown() {
    // The workspace has no .git: commands run with an empty placeholder there (so they cannot
    // create one), which the idle sandbox keeps for the next command.
    let fx = Fixture::new();
    fx.put("a.txt", "a\n");
    let request = request(
        &fx,
        "mkdir .git/hooks 2>/dev/null || echo refused",
        HANG_GUARD,
    );
    let (output, outcome) = run(&*fx.bash(), request, CancellationToken::new()).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(output, "refused\n");
    assert!(
        fx.at(".git").is_dir(),
        "the placeholder is kept between commands"
    );
    // File tools see the workspace as it is: without a .git.
    let listed = listed_names(&fx).await;
    assert_eq!(listed, vec!["a.txt".to_string()]);
    fx.backend.shutdown().await.expect("shut the session down");
    assert!(!fx.at(".git").exists(), "shutdown removes the placeholder");
}

#[tokio::test]
async fn a_real_empty_git_directory_is_still_listed() {
    let fx = Fixture::new();
    std::fs::create_dir(fx.at(".git")).unwrap();
    let listed = listed_names(&fx).await;
    assert_eq!(listed, vec![".git".to_string()]);
}

/// The names the file operations list at the workspace root.
async fn listed_names(fx: &Fixture) -> Vec<String> {
    let entries = fx.files().read_dir(&fx.ws).await.unwrap();
    entries.into_iter().map(|entry| entry.name).collect()
}
