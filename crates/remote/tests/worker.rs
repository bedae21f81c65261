//! The worker serving requests one after another, with every shell here, as the leader of its
//! own session (how sshd and docker exec start it: commands then run as job-control groups in
//! that session when the shell is bash) and not: output and records of each request end at its
//! marker, leftovers and timeouts are handled inside one request and the worker serves the
//! next, `kill 0` in a command spares the worker, a scrubbed escapee still holding the output
//! is found, and the fast leftover check examines the PIDs handed out since the command.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_ops::{ExecError, ExitStatus, Termination};
use cordon_remote::exec::{DriveOutcome, DriveRequest, KILL_GRACE, drive, new_tag};
use cordon_remote::files::{FileOp, FsRecord, files_record_parser, go_line, parse_fs_record};
use cordon_remote::worker::{EndMarker, ExecLine, PROCESS_HELPERS, WorkerRequest, new_request_id};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::exec::tagged;
use crate::support::{LocalWorker, start_worker, worker_setups};

const LONG: Duration = Duration::from_secs(120);

struct Ran {
    output: String,
    result: Result<DriveOutcome, ExecError>,
    tag: String,
}

/// `command` in `/tmp` with a long timeout and no cancellation.
async fn run(worker: &mut LocalWorker, command: &str) -> Ran {
    request(
        worker,
        command,
        Path::new("/tmp"),
        LONG,
        CancellationToken::new(),
    )
    .await
}

/// Send one exec request to `worker` and drive it.
async fn request(
    worker: &mut LocalWorker,
    command: &str,
    cwd: &Path,
    timeout: Duration,
    cancel: CancellationToken,
) -> Ran {
    let ExecLine { tag, id, line } = ExecLine::new(
        command.to_owned(),
        cwd.to_path_buf(),
        vec![("GREETING".to_owned(), "hi 'there'".to_owned())],
    )
    .expect("line");
    worker.stdin.write_all(&line).await.expect("send request");
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(8);
    let collector = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            out.extend(chunk);
        }
        out
    });
    let result = drive(
        &mut worker.events,
        &mut worker.stdin,
        DriveRequest {
            timeout,
            cancel,
            output: tx,
            kill_grace: KILL_GRACE,
            request_id: Some(id),
        },
    )
    .await;
    let output = String::from_utf8_lossy(&collector.await.expect("collector")).into_owned();
    Ran {
        output,
        result,
        tag,
    }
}

fn reusable(ran: &Ran, what: &str) -> DriveOutcome {
    let outcome = match &ran.result {
        Ok(outcome) => outcome.clone(),
        Err(e) => panic!("{what}: {e}"),
    };
    assert!(outcome.clean && outcome.reusable, "{what}: {outcome:?}");
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_serves_many_requests() {
    for (shell, leader) in worker_setups() {
        let setup = format!("{shell:?} leader={leader}");
        let mut worker = start_worker(&shell, leader);
        let tmp = Path::new("/tmp");
        for round in 0..3 {
            let ran = request(
                &mut worker,
                "echo one; echo two >&2; printf three; exit 7",
                tmp,
                LONG,
                CancellationToken::new(),
            )
            .await;
            assert_eq!(ran.output, "one\ntwo\nthree", "{setup} round {round}");
            let outcome = reusable(&ran, &setup);
            assert_eq!(
                (outcome.status, outcome.termination),
                (Some(ExitStatus::Code(7)), Termination::Exited),
                "{setup}"
            );
            assert!(!outcome.kill_sent, "{setup}");
        }
        let ran = request(
            &mut worker,
            "kill -KILL $$",
            tmp,
            LONG,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(reusable(&ran, &setup).status, Some(ExitStatus::Signal(9)));
        let ran = request(
            &mut worker,
            "cat; echo \"[$0] $GREETING\"; pwd; printf '\\000\\033cordon-end-x\\000'",
            tmp,
            LONG,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(
            ran.output, "[bash] hi 'there'\n/tmp\n\u{0}\u{1b}cordon-end-x\u{0}",
            "{setup}: stdin is /dev/null, output that looks like a marker is output"
        );
        reusable(&ran, &setup);
        // Large command text travels in the request line (the kernel caps one argument of
        // `bash -c` at 128 KiB).
        let big = format!("echo {}", "y".repeat(100_000));
        let ran = request(&mut worker, &big, tmp, LONG, CancellationToken::new()).await;
        assert_eq!(ran.output.len(), 100_001, "{setup}");
        reusable(&ran, &setup);
        let ran = request(
            &mut worker,
            "true",
            Path::new("/nonexistent/dir"),
            LONG,
            CancellationToken::new(),
        )
        .await;
        assert!(
            ran.result
                .as_ref()
                .is_ok_and(|o| o.missing_cwd && o.clean && o.reusable && o.status.is_none()),
            "{setup}: {:?}",
            ran.result
        );
        let ran = request(
            &mut worker,
            "echo last",
            tmp,
            LONG,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(ran.output, "last\n", "{setup}");
        reusable(&ran, &setup);
        drop(worker.stdin);
        let status = tokio::time::timeout(Duration::from_secs(60), worker.child.wait())
            .await
            .expect("the worker ends at EOF")
            .expect("wait");
        assert!(status.success(), "{setup}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_zero_in_a_command_spares_the_worker() {
    for (shell, leader) in worker_setups() {
        let setup = format!("{shell:?} leader={leader}");
        let mut worker = start_worker(&shell, leader);
        let ran = run(&mut worker, "trap 'echo term' TERM; kill 0; kill -KILL 0").await;
        assert_eq!(ran.output, "term\n", "{setup}");
        assert_eq!(
            reusable(&ran, &setup).status,
            Some(ExitStatus::Signal(9)),
            "{setup}"
        );
        let ran = run(&mut worker, "echo alive").await;
        assert_eq!(ran.output, "alive\n", "{setup}");
        reusable(&ran, &setup);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_and_timeouts_are_handled_within_a_request() {
    for (shell, leader) in worker_setups() {
        let setup = format!("{shell:?} leader={leader}");
        let mut worker = start_worker(&shell, leader);
        let ran = run(&mut worker, "(sleep 306; echo late) & (while :; do echo tick; sleep 0.05; done) & setsid sleep 307 & echo early")
        .await;
        assert!(ran.output.contains("early\n"), "{setup}: {}", ran.output);
        assert!(!ran.output.contains("late"), "{setup}");
        let outcome = reusable(&ran, &setup);
        assert_eq!(outcome.status, Some(ExitStatus::Code(0)), "{setup}");
        assert!(outcome.kill_sent, "{setup}: leftovers are killed");
        assert_eq!(tagged(&ran.tag), 0, "{setup}");

        let ran = request(
            &mut worker,
            "setsid sleep 300 & nohup sleep 301 >/dev/null 2>&1 & (trap '' TERM; exec sleep 302) & echo up; sleep 303",
            Path::new("/tmp"),
            Duration::from_millis(1500),
            CancellationToken::new(),
        )
        .await;
        assert_eq!(ran.output, "up\n", "{setup}");
        let outcome = reusable(&ran, &setup);
        assert_eq!(outcome.termination, Termination::TimedOut, "{setup}");
        assert_eq!(tagged(&ran.tag), 0, "{setup}: survivors after a timeout");

        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            trigger.cancel();
        });
        let ran = request(
            &mut worker,
            "setsid sleep 304 & sleep 305",
            Path::new("/tmp"),
            LONG,
            cancel,
        )
        .await;
        let outcome = reusable(&ran, &setup);
        assert_eq!(outcome.termination, Termination::Cancelled, "{setup}");
        assert_eq!(tagged(&ran.tag), 0, "{setup}");

        let ran = run(&mut worker, "echo next").await;
        assert_eq!(ran.output, "next\n", "{setup}");
        reusable(&ran, &setup);
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

fn read_pid(path: &Path) -> u32 {
    for _ in 0..1200 {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{} never got a pid", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrubbed_escapee_is_found_while_it_holds_the_output() {
    for (shell, leader) in worker_setups() {
        let setup = format!("{shell:?} leader={leader}");
        let dir = tempfile::tempdir().expect("tempdir");
        let holder = dir.path().join("holder");
        let quiet = dir.path().join("quiet");
        let mut worker = start_worker(&shell, leader);
        // No tag, not in the session; it keeps the output open, so it is the command's.
        let command = format!(
            "env -i setsid sh -c 'echo $$ > {}; exec sleep 308' & echo started",
            holder.display()
        );
        let ran = run(&mut worker, &command).await;
        assert_eq!(ran.output, "started\n", "{setup}");
        let outcome = reusable(&ran, &setup);
        assert!(outcome.kill_sent, "{setup}: the holder was reported");
        let pid = read_pid(&holder);
        assert!(!alive(pid), "{setup}: the output holder {pid} survived");

        // One that also lets go of the output cannot be told from any other process (a known
        // limit): it does not disturb the worker, whose next request ends at its own marker.
        let command = format!(
            "env -i setsid sh -c 'echo $$ > {}; exec sleep 309' >/dev/null 2>&1 & echo started",
            quiet.display()
        );
        let ran = run(&mut worker, &command).await;
        assert_eq!(ran.output, "started\n", "{setup}");
        reusable(&ran, &setup);
        let pid = read_pid(&quiet);
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        let ran = run(&mut worker, "echo next").await;
        assert_eq!(ran.output, "next\n", "{setup}");
        reusable(&ran, &setup);
    }
}

/// Runs `body` after the process helpers in `shell`; returns its stdout.
fn helpers(shell: &str, body: &str) -> String {
    let script = format!("{PROCESS_HELPERS}\n{body}");
    let out = std::process::Command::new(shell)
        .args(["-c", &script])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("shell");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_quick_check_examines_the_pids_handed_out_since_the_command() {
    for shell in ["dash", "bash"] {
        let tag = new_tag();
        // The "command" leaves a tagged escapee in its own session and exits; the quick check
        // must find it (with a window wide enough to trust it on a loaded machine), and refuse
        // to answer when the window is too small or unknown.
        let body = format!(
            r#"tag={tag}; sess=; own=0; out=; watcher=; start=0; ticks=1
now_us; t0=$NOW
( CORDON_EXEC_ID={tag}; export CORDON_EXEC_ID; setsid sleep 310 </dev/null >/dev/null 2>&1 & echo $! >&9 ) 9>/tmp/cordon-quick-{tag} &
main=$!
wait $main
read -r escapee </tmp/cordon-quick-{tag}; rm -f /tmp/cordon-quick-{tag}
# The tag is exported inside the subshell, so the escapee shows it once it has exec'd: wait
# for that (a loaded machine can take seconds; the bound only keeps a broken run finite).
i=0; while ! tagged "$escapee" && [ $i -lt 12000 ]; do sleep 0.01; i=$((i + 1)); done
window=999999999
if quick; then echo "trusted:$PIDS"; else echo untrusted; fi
window=0
if quick; then echo "trusted-small:$PIDS"; else echo untrusted-small; fi
window=
if quick; then echo "trusted-none"; else echo untrusted-none; fi
kill -KILL $escapee
echo "escapee:$escapee"
"#
        );
        let out = helpers(shell, &body);
        let escapee = out
            .lines()
            .find_map(|l| l.strip_prefix("escapee:"))
            .unwrap_or_else(|| panic!("{shell}: {out}"))
            .to_owned();
        let trusted = out
            .lines()
            .find_map(|l| l.strip_prefix("trusted:"))
            .unwrap_or_else(|| panic!("{shell}: the quick check did not answer: {out}"));
        assert!(
            trusted.split_whitespace().any(|p| p == escapee),
            "{shell}: {out}"
        );
        assert!(out.contains("untrusted-small\n"), "{shell}: {out}");
        assert!(out.contains("untrusted-none\n"), "{shell}: {out}");
    }
}

#[test]
fn an_escapee_caught_in_the_middle_of_exec_is_still_found_by_its_tag() {
    // While a process runs execve, /proc/PID/environ reads as empty until the new image's
    // environment is set up, and a read spanning the exec ends early: a tagged escapee caught
    // then looked untagged, and the command's end could leave it running (seen over SSH: a
    // `setsid sh -c 'sleep …' &` survived its call). The escapee here exec's itself over and
    // over, orphaned (as after `setsid … &` once the shell has exited), while the
    // per-process check and the full scan look for it many times; before the fix, a quarter
    // of the per-process looks and one scan in eight missed it.
    for shell in ["dash", "bash"] {
        let tag = new_tag();
        let body = format!(
            r#"tag={tag}; sess=; own=0; out=; watcher=; start=0; ticks=1; main=
f=/tmp/cordon-reexec-{tag}.sh
echo 'exec /bin/sh "$0"' >"$f"
( CORDON_EXEC_ID={tag}; export CORDON_EXEC_ID; /bin/sh "$f" </dev/null >/dev/null 2>&1 & echo $! >&9 ) 9>/tmp/cordon-reexec-{tag}.pid
read -r escapee </tmp/cordon-reexec-{tag}.pid; rm -f /tmp/cordon-reexec-{tag}.pid
i=0; while ! tagged "$escapee" && [ $i -lt 12000 ]; do sleep 0.01; i=$((i + 1)); done
looks=0; missed=0
while [ $looks -lt 500 ]; do
    # Each look is a check of its own, with its own bound on re-reads (`quick` resets it).
    _retries=0
    member "$escapee" || missed=$((missed + 1))
    looks=$((looks + 1))
done
scans=0; unscanned=0
while [ $scans -lt 50 ]; do
    scan
    case " $PIDS " in *" $escapee "*) ;; *) unscanned=$((unscanned + 1)) ;; esac
    scans=$((scans + 1))
done
kill -KILL "$escapee"; rm -f "$f"
echo "missed:$missed/$looks unscanned:$unscanned/$scans"
"#
        );
        let out = helpers(shell, &body);
        assert!(
            out.contains("missed:0/500 unscanned:0/50\n"),
            "{shell}: {out}"
        );
    }
}

#[test]
fn only_an_exact_tag_record_marks_a_process() {
    // The tag must be a record of its own: a value holding it, a longer name, or a record
    // merely starting with it is not the command's mark (the per-process check once joined
    // the records and matched a substring, the scan matched whole records).
    for shell in ["dash", "bash"] {
        let tag = new_tag();
        let body = format!(
            r#"tag={tag}; sess=; own=0; out=; watcher=; start=0; ticks=1; main=
spawn() {{ ( "$@" </dev/null >/dev/null 2>&1 & echo $! >&9 ) 9>/tmp/cordon-exact-{tag}.pid; read -r P </tmp/cordon-exact-{tag}.pid; rm -f /tmp/cordon-exact-{tag}.pid; }}
spawn env -i "Y=CORDON_EXEC_ID={tag}" sleep 311; value=$P
spawn env -i "CORDON_EXEC_ID={tag}x" sleep 312; longer=$P
spawn env -i "A=1" "CORDON_EXEC_ID={tag}" sleep 313; exact=$P
for p in $value $longer $exact; do
    i=0; while [ "$(cat /proc/$p/comm 2>/dev/null)" != sleep ] && [ $i -lt 12000 ]; do sleep 0.01; i=$((i + 1)); done
done
for p in $value $longer $exact; do tagged $p && printf 'T' || printf '-'; done; echo
scan; for p in $value $longer $exact; do case " $PIDS " in *" $p "*) printf 'T' ;; *) printf '-' ;; esac; done; echo
kill -KILL $value $longer $exact
"#
        );
        let out = helpers(shell, &body);
        assert_eq!(out, "--T\n--T\n", "{shell}");
    }
}

#[test]
fn processes_without_an_environment_cannot_stretch_a_scan() {
    // An empty environment is read again (an escapee in the middle of exec shows one), but the
    // re-reads share one bound per check: a command leaving many `env -i` processes behind
    // must not make every scan wait 200 ms for each of them. `sleep` is counted by a function
    // of the same name, which the helpers call instead of the program.
    for shell in ["dash", "bash"] {
        let tag = new_tag();
        let body = format!(
            r#"tag={tag}; sess=; own=0; out=; watcher=; start=0; ticks=1; main=
slept=0
sleep() {{ slept=$((slept + 1)); command sleep "$@"; }}
pids=
i=0
while [ $i -lt 10 ]; do
    ( env -i sleep 314 </dev/null >/dev/null 2>&1 & echo $! >&9 ) 9>/tmp/cordon-empty-{tag}.pid
    read -r p </tmp/cordon-empty-{tag}.pid; pids="$pids $p"; i=$((i + 1))
done
rm -f /tmp/cordon-empty-{tag}.pid
for p in $pids; do
    i=0; while [ "$(cat /proc/$p/comm 2>/dev/null)" != sleep ] && [ $i -lt 12000 ]; do command sleep 0.01; i=$((i + 1)); done
done
slept=0
scan
echo "slept:$slept"
case " $PIDS " in *" ${{pids# }} "*) echo found ;; esac
kill -KILL $pids
"#
        );
        let out = helpers(shell, &body);
        let slept: u32 = out
            .lines()
            .find_map(|l| l.strip_prefix("slept:"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{shell}: {out}"));
        assert!(slept <= 20, "{shell}: {slept} re-reads in one scan: {out}");
        assert!(!out.contains("found"), "{shell}: {out}");
    }
}

/// Send one file request (and what it reads on stdin) and collect its output and records.
async fn fs_request(
    worker: &mut LocalWorker,
    roots: &[PathBuf],
    op: FileOp,
    input: &[u8],
) -> (Vec<u8>, Vec<FsRecord>) {
    let id = new_request_id();
    let mut line = WorkerRequest::Fs {
        roots: roots.to_vec(),
        op,
    }
    .line(&id)
    .expect("line");
    line.extend_from_slice(input);
    worker.stdin.write_all(&line).await.expect("send");
    let mut marker = EndMarker::new(&id);
    let mut parser = files_record_parser();
    let (mut stdout, mut records, mut done) = (Vec::new(), Vec::new(), false);
    while !(done && marker.found()) {
        let event = tokio::time::timeout(LONG, worker.events.next())
            .await
            .expect("an answer in time")
            .expect("the worker is alive")
            .expect("transport");
        match event {
            cordon_remote::exec::TransportEvent::Stdout(bytes) => {
                stdout.extend(marker.feed(&bytes).data);
            }
            cordon_remote::exec::TransportEvent::Stderr(bytes) => {
                for record in parser.feed(&bytes).expect("records") {
                    match parse_fs_record(&record).expect("known") {
                        FsRecord::Ready => {}
                        FsRecord::Done(got) => {
                            assert_eq!(got, id);
                            done = true;
                        }
                        other => records.push(other),
                    }
                }
            }
        }
    }
    assert!(!marker.trailing());
    (stdout, records)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_requests_on_one_worker() {
    for (shell, leader) in worker_setups() {
        let setup = format!("{shell:?} leader={leader}");
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canon");
        std::fs::write(root.join("a.txt"), b"hello\x00\x1bcordon-end-\n").expect("write");
        let roots = vec![root.clone()];
        let mut worker = start_worker(&shell, leader);
        let file = root.join("a.txt");
        let (data, records) = fs_request(
            &mut worker,
            &roots,
            FileOp::Read {
                path: file.clone(),
                max: None,
            },
            b"",
        )
        .await;
        assert_eq!(data, b"hello\x00\x1bcordon-end-\n", "{setup}");
        assert_eq!(
            records,
            vec![FsRecord::Canon(file.clone()), FsRecord::Ok],
            "{setup}"
        );

        let (_, records) =
            fs_request(&mut worker, &roots, FileOp::Stat(root.join("missing")), b"").await;
        assert!(
            matches!(records.last(), Some(FsRecord::Err { code, .. }) if code == "notfound"),
            "{setup}: {records:?}"
        );

        let mut input = go_line(5);
        input.extend_from_slice(b"new\n!");
        let (_, records) =
            fs_request(&mut worker, &roots, FileOp::Write(file.clone()), &input).await;
        assert_eq!(
            records,
            vec![FsRecord::Canon(file.clone()), FsRecord::Ok],
            "{setup}"
        );
        assert_eq!(std::fs::read(&file).expect("read"), b"new\n!", "{setup}");

        let (_, records) = fs_request(&mut worker, &roots, FileOp::List(root.clone()), b"").await;
        assert_eq!(records.len(), 3, "{setup}: {records:?}");

        let ran = request(
            &mut worker,
            "echo after",
            &root,
            LONG,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(ran.output, "after\n", "{setup}");
        reusable(&ran, &setup);
    }
}
