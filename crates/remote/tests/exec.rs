//! Exec requests driven by `drive` over a local process, one request per process (argument
//! mode) with every shell here: merged output, exit codes and signals, timeout/cancel killing
//! the tree with setsid and nohup escapees, idle grace after exit, missing cwd, environment,
//! and a vanished client killing the tree.

use std::path::Path;
use std::time::Duration;

use cordon_ops::{ExecError, ExitStatus, Termination};
use cordon_remote::exec::{DriveOutcome, DriveRequest, ExecJob, KILL_GRACE, drive, new_tag};
use cordon_remote::worker::WorkerRequest;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::{shells, spawn, transport};

/// Processes still carrying `tag` in their environment.
pub fn tagged(tag: &str) -> usize {
    let needle = format!("CORDON_EXEC_ID={tag}");
    std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            let Ok(env) = std::fs::read(e.path().join("environ")) else {
                return false;
            };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'));
            !zombie && env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes())
        })
        .count()
}

/// The one-shot argv of an exec request.
pub fn job_argv(tag: &str, cwd: &Path, command: &str, env: &[(String, String)]) -> Vec<String> {
    WorkerRequest::Exec(ExecJob {
        tag: tag.to_owned(),
        cwd: cwd.to_path_buf(),
        command: command.to_owned(),
        env: env.to_vec(),
        kill_grace_ms: KILL_GRACE.as_millis() as u64,
    })
    .argv()
    .expect("argv")
}

struct Ran {
    output: String,
    result: Result<DriveOutcome, ExecError>,
    tag: String,
}

async fn run_in(
    shell: &[String],
    command: &str,
    cwd: &Path,
    timeout: Duration,
    cancel: CancellationToken,
    env: &[(String, String)],
) -> Ran {
    let tag = new_tag();
    let argv = job_argv(&tag, cwd, command, env);
    let mut child = spawn(shell, &argv, Path::new("/"));
    let (events, input) = transport(&mut child);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(8);
    let collector = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            out.extend(chunk);
        }
        out
    });
    let result = drive(
        events,
        input,
        DriveRequest {
            timeout,
            cancel,
            output: tx,
            kill_grace: KILL_GRACE,
            request_id: None,
        },
    )
    .await;
    let _ = child.wait().await;
    let output = String::from_utf8_lossy(&collector.await.expect("collector")).into_owned();
    Ran {
        output,
        result,
        tag,
    }
}

async fn run(shell: &[String], command: &str, timeout: Duration) -> Ran {
    run_in(
        shell,
        command,
        Path::new("/tmp"),
        timeout,
        CancellationToken::new(),
        &[],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_order_exit_codes_and_signals() {
    for shell in shells() {
        let ran = run(
            &shell,
            "echo one; echo two >&2; printf three; exit 7",
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(ran.output, "one\ntwo\nthree", "{shell:?}");
        let outcome = ran.result.expect("ran");
        assert_eq!(
            (outcome.status, outcome.termination),
            (Some(ExitStatus::Code(7)), Termination::Exited)
        );
        assert!(outcome.clean && !outcome.kill_sent);

        let ran = run(&shell, "kill -KILL $$", Duration::from_secs(60)).await;
        assert_eq!(
            ran.result.expect("ran").status,
            Some(ExitStatus::Signal(9)),
            "{shell:?}"
        );
        let ran = run(
            &shell,
            "cat; echo \"[$0]\" | head -c 3",
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(
            ran.output, "[ba",
            "stdin is /dev/null and the shell is bash: {shell:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_tree_with_escapees() {
    for shell in shells() {
        let ran = run(
            &shell,
            "setsid sleep 300 & nohup sleep 301 >/dev/null 2>&1 & (trap '' TERM; exec sleep 302) & echo up; sleep 303",
            Duration::from_millis(1500),
        )
        .await;
        assert_eq!(ran.output, "up\n", "{shell:?}");
        let outcome = ran.result.expect("ran");
        assert_eq!(outcome.termination, Termination::TimedOut);
        assert!(outcome.kill_sent && outcome.clean, "{outcome:?}");
        assert_eq!(tagged(&ran.tag), 0, "{shell:?}: survivors after a timeout");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_tree() {
    let shell = &shells()[0];
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        trigger.cancel();
    });
    let ran = run_in(
        shell,
        "setsid sleep 304 & sleep 305",
        Path::new("/tmp"),
        Duration::from_secs(120),
        cancel,
        &[],
    )
    .await;
    let outcome = ran.result.expect("ran");
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert_eq!(tagged(&ran.tag), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_are_killed_after_the_idle_grace() {
    for shell in shells() {
        let ran = run(
            &shell,
            "(sleep 306; echo late) & (while :; do echo tick; sleep 0.05; done) & echo early",
            Duration::from_secs(120),
        )
        .await;
        assert!(ran.output.contains("early\n"), "{shell:?}: {}", ran.output);
        assert!(!ran.output.contains("late"));
        let outcome = ran.result.expect("ran");
        assert_eq!(
            (outcome.status, outcome.termination),
            (Some(ExitStatus::Code(0)), Termination::Exited)
        );
        assert!(outcome.kill_sent && outcome.clean, "{outcome:?}");
        assert_eq!(tagged(&ran.tag), 0, "{shell:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_cwd_and_environment() {
    for shell in shells() {
        let ran = run_in(
            &shell,
            "true",
            Path::new("/nonexistent/dir"),
            Duration::from_secs(30),
            CancellationToken::new(),
            &[],
        )
        .await;
        assert!(
            ran.result.as_ref().is_ok_and(|o| o.missing_cwd && o.clean),
            "{shell:?}"
        );
        let env = vec![("GREETING".to_owned(), "hi 'there' $x".to_owned())];
        let ran = run_in(
            &shell,
            "echo \"$GREETING\"; pwd",
            Path::new("/tmp"),
            Duration::from_secs(30),
            CancellationToken::new(),
            &env,
        )
        .await;
        assert_eq!(ran.output, "hi 'there' $x\n/tmp\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_client_kills_the_tree() {
    use tokio::io::AsyncReadExt;
    let shell = &shells()[0];
    let tag = new_tag();
    let argv = job_argv(
        &tag,
        Path::new("/tmp"),
        "setsid sleep 307 & echo up; sleep 308",
        &[],
    );
    let mut child = spawn(shell, &argv, Path::new("/"));
    let mut stdout = child.stdout.take().expect("stdout");
    let mut buf = [0u8; 3];
    stdout.read_exact(&mut buf).await.expect("output");
    assert_eq!(&buf, b"up\n");
    // A process in the middle of `execve` briefly shows an empty environ: poll.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tagged(&tag) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the command's processes never showed their tag"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(child.stdin.take());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("wrapper ends")
        .expect("wait");
    assert!(status.success());
    assert_eq!(tagged(&tag), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_script_sweeps_a_tree_by_tag_and_session() {
    use cordon_remote::exec::kill_argv;
    for shell in shells() {
        let tag = new_tag();
        // A tree without the wrapper: its own session, a tagged escapee in yet another one.
        let mut root = std::process::Command::new("setsid")
            .args(["sh", "-c", "setsid sleep 309 & sleep 310 & wait"])
            .env("CORDON_EXEC_ID", &tag)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("spawn tree");
        // setsid may fork when the caller leads its group; the tree is what matters.
        for _ in 0..600 {
            if tagged(&tag) >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(tagged(&tag) >= 3, "{shell:?}: tree did not start");
        let (_, stderr) = crate::support::run(
            &shell,
            &kill_argv(&tag, Some(root.id()), Some(root.id()), KILL_GRACE),
            b"",
        )
        .await;
        assert_eq!(stderr, b"killed\0", "{shell:?}");
        let _ = root.wait();
        assert_eq!(tagged(&tag), 0, "{shell:?}");
    }
}
