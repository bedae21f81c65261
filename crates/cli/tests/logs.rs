//! Logs: `-v`/`-vv`/`-vvv`, `CORDON_LOG`/`RUST_LOG`, `--log-file`, and that logs stay off
//! stdout (which carries `--json` results) — run from the built binary.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cordon");

/// What a finished `cordon` run printed.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// A workspace with `a.txt`.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("a.txt"), "hello\n").expect("write a.txt");
    dir
}

/// `cordon exec read a.txt --json --root WS EXTRA…` with exactly `env` as the log variables
/// (whatever the test runner has set is removed).
fn exec_read(ws: &Path, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let root = ws.to_str().expect("UTF-8 path");
    let output = Command::new(BIN)
        .args([
            "exec",
            "read",
            r#"{"path":"a.txt"}"#,
            "--json",
            "--root",
            root,
        ])
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("CORDON_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run cordon");
    Run {
        code: output.status.code().expect("exited by itself"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// stdout is exactly one JSON tool result reading `hello`.
#[track_caller]
fn assert_clean_result(run: &Run) {
    assert_eq!(run.code, 0, "{run:#?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line on stdout: {run:#?}");
    let result: Value = serde_json::from_str(lines[0]).expect("stdout is JSON");
    assert_eq!(result["content"][0]["text"], "hello\n", "{run:#?}");
}

#[test]
fn vv_logs_go_to_stderr_and_json_stdout_stays_clean() {
    let ws = workspace();
    let run = exec_read(ws.path(), &["-vv"], &[]);
    assert_clean_result(&run);
    assert!(run.stderr.contains(" INFO "), "{run:#?}");
    assert!(run.stderr.contains(" DEBUG "), "{run:#?}");
    assert!(run.stderr.contains("policy loaded"), "{run:#?}");
    assert!(run.stderr.contains("session started"), "{run:#?}");
    assert!(run.stderr.contains("session stopped"), "{run:#?}");
    // A dependency's own `log` records are bridged in at debug (globset logs the globs it
    // compiles for the policy).
    assert!(run.stderr.contains("globset"), "{run:#?}");
}

#[test]
fn default_level_is_warn_and_each_v_raises_it() {
    let ws = workspace();
    let quiet = exec_read(ws.path(), &[], &[]);
    assert_clean_result(&quiet);
    assert_eq!(quiet.stderr, "", "nothing below warn by default");
    let info = exec_read(ws.path(), &["-v"], &[]);
    assert_clean_result(&info);
    assert!(info.stderr.contains("session started"), "{info:#?}");
    assert!(!info.stderr.contains(" DEBUG "), "{info:#?}");
    let trace = exec_read(ws.path(), &["-vvv"], &[]);
    assert_clean_result(&trace);
    assert!(trace.stderr.contains(" TRACE "), "{trace:#?}");
}

#[test]
fn cordon_log_wins_over_rust_log() {
    let ws = workspace();
    let rust_log = exec_read(ws.path(), &[], &[("RUST_LOG", "cordon_runtime=info")]);
    assert_clean_result(&rust_log);
    assert!(rust_log.stderr.contains("session started"), "{rust_log:#?}");
    let both = exec_read(
        ws.path(),
        &["-vv"],
        &[("RUST_LOG", "trace"), ("CORDON_LOG", "off")],
    );
    assert_clean_result(&both);
    assert_eq!(both.stderr, "", "CORDON_LOG=off silences even -vv");
}

#[test]
fn a_bad_log_filter_is_a_usage_error() {
    let ws = workspace();
    let run = exec_read(ws.path(), &[], &[("CORDON_LOG", "cordon=loud")]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert_eq!(run.stdout, "", "{run:#?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:#?}");
    assert!(
        run.stderr.starts_with("cordon: failed to parse CORDON_LOG"),
        "{run:#?}"
    );
}

#[test]
fn log_file_is_appended_created_0600_and_keeps_stderr_quiet() {
    let ws = workspace();
    let logs = tempfile::tempdir().expect("temp dir");
    let file = logs.path().join("cordon.log");
    let path = file.to_str().expect("UTF-8 path");
    for _ in 0..2 {
        let run = exec_read(ws.path(), &["-v", "--log-file", path], &[]);
        assert_clean_result(&run);
        assert_eq!(run.stderr, "", "logs went to the file: {run:#?}");
    }
    let text = std::fs::read_to_string(&file).expect("read the log file");
    assert_eq!(
        text.matches("session started").count(),
        2,
        "appended, not truncated:\n{text}"
    );
    let mode = std::fs::metadata(&file).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "created private");
}

#[test]
fn log_file_refuses_a_symlink_and_a_fifo_without_blocking() {
    let ws = workspace();
    let logs = tempfile::tempdir().expect("temp dir");
    let target = logs.path().join("target.txt");
    std::fs::write(&target, "untouched\n").expect("write target");
    let link = logs.path().join("link.log");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let run = exec_read(
        ws.path(),
        &["-v", "--log-file", link.to_str().unwrap()],
        &[],
    );
    assert_eq!(run.code, 2, "{run:#?}");
    assert_eq!(run.stdout, "", "nothing ran: {run:#?}");
    assert!(run.stderr.contains("symbolic link"), "{run:#?}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched\n");

    let fifo = logs.path().join("fifo.log");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    // No reader on the FIFO: a blocking open would hang here.
    let run = exec_read(
        ws.path(),
        &["-v", "--log-file", fifo.to_str().unwrap()],
        &[],
    );
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        run.stderr
            .starts_with("cordon: failed to open the log file"),
        "{run:#?}"
    );
}

#[test]
fn vv_over_ssh_logs_the_connection_and_russh_s_own_records() {
    if std::env::var("CORDON_SKIP_SSH").as_deref() == Ok("1") {
        eprintln!("skipped: CORDON_SKIP_SSH=1");
        return;
    }
    let sshd = cordon_tests::infra::sshd()
        .unwrap_or_else(|reason| panic!("no test sshd for the ssh backend: {reason}"));
    let ws = workspace();
    let root = ws.path().to_str().expect("UTF-8 path");
    let host = format!("root@127.0.0.1:{}", sshd.port);
    let output = Command::new(BIN)
        .args([
            "exec",
            "ls",
            "{}",
            "--json",
            "--backend",
            "ssh",
            "--host",
            &host,
        ])
        .args(["--identity", sshd.key.to_str().unwrap()])
        .args(["--known-hosts", sshd.known_hosts.to_str().unwrap()])
        .args(["--ssh-config", sshd.ssh_config.to_str().unwrap()])
        .args(["--remote-root", root, "-vv"])
        .env_remove("RUST_LOG")
        .env_remove("CORDON_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run cordon");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    let result: Value = serde_json::from_str(stdout.trim()).expect("stdout is one JSON result");
    assert_eq!(result["content"][0]["text"], "a.txt", "{result}");
    for needle in ["ssh: connected", "ssh: disconnecting", "session stopped"] {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    // russh logs through `log`; its records are bridged into the same output.
    assert!(
        stderr.lines().any(|line| line.contains(" DEBUG russh")),
        "no russh record in {stderr}"
    );
}
