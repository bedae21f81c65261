//! No descendant outlives its command; the tree can be signalled and killed; the environment
//! of the parent never reaches the command.

use std::time::Duration;

use cordon_sandbox::{ExitStatus, SpawnRequest};

use crate::support::{Fixture, TIMEOUT, processes_matching, run_in, unique};

#[tokio::test]
async fn background_processes_die_with_the_command() {
    let fx = Fixture::new();
    let marker = unique("bg");
    // Distinct sleep durations identify each escapee in the host's process list.
    let script = format!(
        "nohup sleep 3001 >/dev/null 2>&1 & setsid sleep 3002 & (sleep 3003 &) ; (setsid bash -c 'sleep 3004 & disown' &); sh -c 'sleep 3005 &'; echo {marker}"
    );
    let output = run_in(&fx.sandbox(), &fx.ws, &script).await;
    assert_eq!(output.stdout.trim(), marker, "{}", output.all());
    for duration in 3001..=3005 {
        let survivors = processes_matching(&format!("sleep {duration}"));
        assert!(
            survivors.is_empty(),
            "sleep {duration} survived as {survivors:?}"
        );
    }
}

fn sleeper(
    fx: &Fixture,
    script: &str,
) -> (
    cordon_sandbox::PreparedSandbox,
    cordon_sandbox::SandboxedChild,
    std::io::PipeReader,
) {
    let sandbox = fx.sandbox();
    let (read, write) = std::io::pipe().unwrap();
    let child = sandbox
        .spawn(SpawnRequest {
            program: "bash".into(),
            args: vec!["-c".into(), script.into()],
            cwd: fx.ws.clone(),
            env: vec![],
            stdin: None,
            stdout: Some(write.into()),
            stderr: None,
        })
        .unwrap();
    (sandbox, child, read)
}

/// Wait until the command printed a line (it is set up), without timing assumptions.
fn wait_for_line(read: &mut std::io::PipeReader) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while std::io::Read::read(read, &mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

#[tokio::test]
async fn signal_tree_reaches_setsid_escapees_and_reports_the_signal() {
    let fx = Fixture::new();
    let marker = unique("sig");
    let script = format!(
        "setsid sleep 4001 & trap 'exit 7' TERM; echo ready-{marker}; while :; do sleep 0.1; done"
    );
    let (_sandbox, mut child, mut read) = sleeper(&fx, &script);
    assert_eq!(wait_for_line(&mut read), format!("ready-{marker}"));
    child.signal_tree(libc_sigterm()).unwrap();
    let status = tokio::time::timeout(TIMEOUT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status,
        ExitStatus::Code(7),
        "the trap ran and its exit code is reported"
    );
    assert!(processes_matching("sleep 4001").is_empty());
    // Signalling a finished command is a no-op.
    child.signal_tree(libc_sigterm()).unwrap();
    child.kill_tree().unwrap();
}

#[tokio::test]
async fn kill_tree_kills_everything_and_reports_sigkill() {
    let fx = Fixture::new();
    let script = "nohup sleep 4002 >/dev/null 2>&1 & trap '' TERM; echo ready; sleep 4003";
    let (_sandbox, mut child, mut read) = sleeper(&fx, script);
    assert_eq!(wait_for_line(&mut read), "ready");
    child.kill_tree().unwrap();
    let status = tokio::time::timeout(TIMEOUT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, ExitStatus::Signal(9));
    assert!(processes_matching("sleep 4002").is_empty());
    assert!(processes_matching("sleep 4003").is_empty());
}

#[tokio::test]
async fn unsupported_signals_are_refused() {
    let fx = Fixture::new();
    let (_sandbox, mut child, mut read) = sleeper(&fx, "echo ready; sleep 4004");
    assert_eq!(wait_for_line(&mut read), "ready");
    let error = child.signal_tree(19).unwrap_err();
    assert!(matches!(
        error,
        cordon_sandbox::SandboxError::UnsupportedSignal { signal: 19 }
    ));
    child.kill_tree().unwrap();
    child.wait().await.unwrap();
}

#[tokio::test]
async fn dropping_the_handle_kills_the_tree() {
    let fx = Fixture::new();
    let (sandbox, child, mut read) = sleeper(&fx, "setsid sleep 4005 & echo ready; sleep 4006");
    assert_eq!(wait_for_line(&mut read), "ready");
    drop(child);
    // The reaper thread finishes in the background; the processes are gone once the pipe
    // closes (every writer is dead).
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut read, &mut rest).unwrap();
    for _ in 0..600 {
        if processes_matching("sleep 4005").is_empty()
            && processes_matching("sleep 4006").is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(processes_matching("sleep 4005").is_empty());
    assert!(processes_matching("sleep 4006").is_empty());
    drop(sandbox);
}

#[test]
fn wait_blocking_works_without_a_runtime() {
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    let mut child = sandbox
        .spawn(SpawnRequest {
            program: "sh".into(),
            args: vec!["-c".into(), "exit 5".into()],
            cwd: fx.ws.clone(),
            env: vec![],
            stdin: None,
            stdout: None,
            stderr: None,
        })
        .unwrap();
    assert_eq!(child.wait_blocking().unwrap(), ExitStatus::Code(5));
    assert_eq!(child.try_wait().unwrap(), Some(ExitStatus::Code(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_commands_from_one_sandbox_are_independent() {
    let fx = Fixture::without_git();
    let sandbox = std::sync::Arc::new(fx.sandbox());
    let mut tasks = Vec::new();
    for i in 0..8 {
        let sandbox = std::sync::Arc::clone(&sandbox);
        let ws = fx.ws.clone();
        tasks.push(tokio::spawn(async move {
            run_in(
                &sandbox,
                &ws,
                &format!("echo {i} > out-{i}; cat out-{i}; test ! -e .git/HEAD"),
            )
            .await
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let output = task.await.unwrap();
        assert_eq!(output.stdout, format!("{i}\n"), "{}", output.all());
        assert!(output.status.success(), "{}", output.all());
    }
    // The placeholder is kept while an idle init holds it; retiring the inits removes it.
    sandbox.retire_idle();
    assert!(
        !fx.ws.join(".git").exists(),
        "placeholders are removed by the last user"
    );
}

fn libc_sigterm() -> i32 {
    15
}

#[test]
fn environment_secrets_of_the_parent_never_reach_the_command() {
    let fx = Fixture::new();
    let secret = unique("AKIA-SECRET");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cordon-sandbox-run"))
        .args(["--write"])
        .arg(&fx.ws)
        .args(["--cwd"])
        .arg(&fx.ws)
        .args(["--", "bash", "-c", "env; cat /proc/1/environ; cat /proc/self/environ; tr '\\0' '\\n' < /proc/1/cmdline | head -1"])
        .env("AWS_SECRET_ACCESS_KEY", &secret)
        .env("GITHUB_TOKEN", &secret)
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!all.contains(&secret), "secret leaked: {all}");
    assert!(!all.contains("AWS_SECRET_ACCESS_KEY"), "{all}");
    assert!(all.contains("PATH="), "the command did run: {all}");
    // The init is a copy of the parent: its command line is replaced, not inherited.
    assert!(all.contains("cordon-sandbox-init"), "{all}");
    assert!(
        !all.contains("--write"),
        "the parent's arguments are visible: {all}"
    );
}

#[tokio::test]
async fn a_given_session_directory_is_used_and_only_private_directories_are_reused() {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let fx = Fixture::new();
    let session = fx.out.join("session");
    for dir in [session.clone(), session.join("tmp"), session.join("home")] {
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    }
    std::fs::write(session.join("tmp/early.txt"), "placed before prepare\n").unwrap();
    let mut config = fx.config();
    config.session_dir = Some(session.clone());
    let sandbox = cordon_sandbox::PreparedSandbox::prepare(config).expect("prepare");
    assert_eq!(sandbox.tmp_dir(), session.join("tmp"));
    assert_eq!(sandbox.home_dir(), session.join("home"));
    let output = run_in(&sandbox, &fx.ws, "cat \"$TMPDIR/early.txt\"").await;
    assert_eq!(output.stdout, "placed before prepare\n", "{}", output.all());
    drop(sandbox);
    assert!(!session.exists(), "removed with the sandbox");

    // An existing TMPDIR others can enter, or a symlink, is refused.
    for bad in ["shared", "link"] {
        let session = fx.out.join(format!("session-{bad}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&session)
            .unwrap();
        if bad == "shared" {
            std::fs::create_dir(session.join("tmp")).unwrap();
            std::fs::set_permissions(session.join("tmp"), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        } else {
            std::os::unix::fs::symlink(&fx.out, session.join("tmp")).unwrap();
        }
        let mut config = fx.config();
        config.session_dir = Some(session.clone());
        match cordon_sandbox::PreparedSandbox::prepare(config) {
            Err(cordon_sandbox::SandboxError::SessionDir { path, .. }) => {
                assert_eq!(path, session.join("tmp"), "{bad}")
            }
            Err(other) => panic!("{bad}: unexpected error {other}"),
            Ok(_) => panic!("{bad}: a non-private TMPDIR was accepted"),
        }
    }
}
