//! Cordon's own files on the host, attacked the way a sandboxed model (or a co-tenant) would:
//! audit logs and `--save` transcripts replaced by symlinks, FIFOs or re-chained copies,
//! placed inside the workspace, a policy file inside the workspace that the session tries to
//! rewrite, and an audit log on a full disk. Each test runs the built binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cordon_policy::audit::{GENESIS, args_sha256, sha256_hex, verify_audit_log};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_cordon");

/// A watchdog, not a pass condition: a run that has not ended by then fails the test.
const WATCHDOG: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Run `cordon ARGS` in `dir` with extra environment; the process must end on its own.
fn cordon_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().expect("failed to start cordon");
    let pid = child.id();
    let (done, outcome) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match outcome.recv_timeout(WATCHDOG) {
        Ok(output) => {
            let output = output.expect("collect output");
            Run {
                code: output.status.code().expect("exited by itself"),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            }
        }
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("cordon {args:?} did not end within {WATCHDOG:?}: it blocked");
        }
    }
}

fn cordon(dir: &Path, args: &[&str]) -> Run {
    cordon_env(dir, args, &[])
}

impl Run {
    #[track_caller]
    fn assert_usage_error(&self, needle: &str) {
        assert_eq!(self.code, 2, "{self:#?}");
        assert_eq!(self.stdout, "", "{self:#?}");
        assert!(self.stderr.starts_with("cordon: "), "{self:#?}");
        assert!(self.stderr.contains(needle), "{needle:?} not in {self:#?}");
    }

    /// The head a session printed on stderr at its end.
    fn printed_head(&self) -> String {
        let line = self
            .stderr
            .lines()
            .find(|line| line.contains(": head "))
            .unwrap_or_else(|| panic!("no audit head on stderr: {self:#?}"));
        let after = line.split(": head ").nth(1).expect("head");
        after[..64].to_owned()
    }
}

/// A workspace and, beside it, a directory the sandbox cannot reach.
struct Setup {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = dir.path().canonicalize().expect("canonical");
        let ws = base.join("ws");
        let outside = base.join("outside");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(ws.join("a.txt"), "a\n").unwrap();
        Setup {
            _dir: dir,
            ws,
            outside,
        }
    }

    fn exec_audited(&self, tool: &str, args: &str, audit: &Path) -> Run {
        cordon(
            &self.ws,
            &[
                "exec",
                tool,
                args,
                "--root",
                self.ws.to_str().unwrap(),
                "--audit",
                audit.to_str().unwrap(),
            ],
        )
    }
}

#[test]
fn an_audit_log_symlinked_to_a_host_file_is_refused_and_the_target_untouched() {
    let setup = Setup::new();
    let bashrc = setup.outside.join(".bashrc");
    std::fs::write(&bashrc, "# operator's rc\n").unwrap();
    let link = setup.outside.join("audit.jsonl");
    std::os::unix::fs::symlink(&bashrc, &link).unwrap();
    let run = setup.exec_audited("read", r#"{"path":"a.txt"}"#, &link);
    run.assert_usage_error("symbolic link");
    assert_eq!(
        std::fs::read_to_string(&bashrc).unwrap(),
        "# operator's rc\n"
    );
}

#[test]
fn a_dangling_audit_symlink_does_not_create_its_target() {
    let setup = Setup::new();
    let target = setup.outside.join("created-by-cordon");
    let link = setup.outside.join("audit.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let run = setup.exec_audited("read", r#"{"path":"a.txt"}"#, &link);
    run.assert_usage_error("symbolic link");
    assert!(!target.exists(), "the symlink's target was created");
}

#[test]
fn an_audit_fifo_is_refused_without_blocking() {
    let setup = Setup::new();
    let fifo = setup.outside.join("audit.jsonl");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // Without a peer, a blocking open of the FIFO never returns: the watchdog fails the test.
    let run = setup.exec_audited("read", r#"{"path":"a.txt"}"#, &fifo);
    run.assert_usage_error("FIFO");
}

#[test]
fn an_audit_log_inside_the_workspace_is_a_usage_error() {
    let setup = Setup::new();
    let inside = setup.ws.join("audit.jsonl");
    let run = setup.exec_audited("bash", r#"{"command":"touch ran"}"#, &inside);
    run.assert_usage_error("which sandboxed commands can write");
    assert!(
        run.stderr.contains("put it outside the workspace"),
        "{run:#?}"
    );
    assert!(!inside.exists());
    assert!(!setup.ws.join("ran").exists(), "nothing ran");
    // Through a path that only reaches the workspace through a symlinked directory, too.
    let alias = setup.outside.join("alias");
    std::os::unix::fs::symlink(&setup.ws, &alias).unwrap();
    let run = setup.exec_audited("read", r#"{"path":"a.txt"}"#, &alias.join("audit.jsonl"));
    run.assert_usage_error("which sandboxed commands can write");
}

#[test]
fn docker_an_audit_log_inside_the_bind_mounted_workspace_is_a_usage_error() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_DOCKER=1: not testing the docker backend");
        return;
    }
    let host = cordon_tests::infra::docker_host().unwrap_or_else(|error| panic!("{error}"));
    let setup = Setup::new();
    let inside = setup.ws.join("audit.jsonl");
    let run = cordon_env(
        &setup.ws,
        &[
            "exec",
            "bash",
            r#"{"command":"touch ran"}"#,
            "--backend",
            "docker",
            "--root",
            setup.ws.to_str().unwrap(),
            "--audit",
            inside.to_str().unwrap(),
        ],
        &[("DOCKER_HOST", &host)],
    );
    run.assert_usage_error("which sandboxed commands can write");
    assert!(!inside.exists());
    assert!(!setup.ws.join("ran").exists(), "nothing ran");
}

#[test]
fn a_policy_symlink_or_fifo_is_refused_without_blocking() {
    let setup = Setup::new();
    let real = setup.outside.join("real.toml");
    std::fs::write(&real, POLICY).unwrap();
    let link = setup.outside.join("link.toml");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let fifo = setup.outside.join("fifo.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let shared = setup.outside.join("shared.toml");
    std::fs::write(&shared, POLICY).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    for (policy, why) in [
        (&link, "symbolic link"),
        (&fifo, "FIFO"),
        (&shared, "writable by group or others"),
    ] {
        let run = cordon(
            &setup.ws,
            &[
                "exec",
                "read",
                r#"{"path":"a.txt"}"#,
                "--root",
                setup.ws.to_str().unwrap(),
                "--policy",
                policy.to_str().unwrap(),
            ],
        );
        run.assert_usage_error(why);
    }
}

#[test]
fn a_hard_linked_policy_is_refused() {
    let setup = Setup::new();
    let policy = setup.outside.join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    std::fs::set_permissions(&policy, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    // A link an earlier session's command could have made inside its workspace.
    std::fs::hard_link(&policy, setup.ws.join("policy-link.toml")).unwrap();
    let run = cordon(
        &setup.ws,
        &[
            "exec",
            "read",
            r#"{"path":"a.txt"}"#,
            "--root",
            setup.ws.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    run.assert_usage_error("it has 2 hard links");
}

/// Drop line `drop` (0-based) and recompute every `prev` after it: an intact chain without it.
fn rechain_without(text: &str, drop: usize) -> String {
    let mut prev = GENESIS.to_owned();
    let mut forged = String::new();
    for (index, line) in text.lines().enumerate() {
        if index == drop {
            continue;
        }
        let mut value: Value = serde_json::from_str(line).unwrap();
        value["prev"] = Value::String(prev.clone());
        let line = serde_json::to_string(&value).unwrap();
        prev = sha256_hex(line.as_bytes());
        forged.push_str(&line);
        forged.push('\n');
    }
    forged
}

#[test]
fn a_rechained_or_truncated_log_fails_verification_against_the_recorded_head() {
    let setup = Setup::new();
    let audit = setup.outside.join("audit.jsonl");
    let first = setup.exec_audited("bash", r#"{"command":"echo one"}"#, &audit);
    assert_eq!(first.code, 0, "{first:#?}");
    let second = setup.exec_audited("bash", r#"{"command":"echo two"}"#, &audit);
    assert_eq!(second.code, 0, "{second:#?}");
    let head = second.printed_head();
    let head_file = setup.outside.join("audit.jsonl.head");
    assert_eq!(
        std::fs::read_to_string(&head_file).unwrap(),
        format!("{head} 4\n")
    );
    let verify = |args: &[&str]| {
        let mut all = vec!["audit", "verify", audit.to_str().unwrap()];
        all.extend(args);
        cordon(&setup.outside, &all)
    };
    let ok = verify(&["--expect-head", &head]);
    assert_eq!(ok.code, 0, "{ok:#?}");
    assert!(
        ok.stdout
            .contains("the recorded head is line 4, 0 lines follow it"),
        "{ok:#?}"
    );

    // A later session appends: the recorded head is still in the log, with lines after it.
    let third = setup.exec_audited("read", r#"{"path":"a.txt"}"#, &audit);
    assert_eq!(third.code, 0, "{third:#?}");
    let later = verify(&["--expect-head", &head]);
    assert_eq!(later.code, 0, "{later:#?}");
    assert!(later.stdout.contains("2 lines follow it"), "{later:#?}");

    // Re-chained without the first call's decision line: the chain alone looks intact …
    let text = std::fs::read_to_string(&audit).unwrap();
    std::fs::write(&audit, rechain_without(&text, 0)).unwrap();
    let plain = verify(&[]);
    assert_eq!(plain.code, 0, "{plain:#?}");
    // … but the recorded head is gone from it.
    let caught = verify(&["--expect-head", &head]);
    assert_eq!(caught.code, 1, "{caught:#?}");
    assert!(caught.stderr.contains("is not in this log"), "{caught:#?}");

    // Truncated to the first session's lines: also caught, through the head file.
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&audit, lines[..2].join("\n") + "\n").unwrap();
    assert_eq!(verify(&[]).code, 0);
    let truncated = verify(&["--head-file", head_file.to_str().unwrap()]);
    assert_eq!(truncated.code, 1, "{truncated:#?}");
    assert!(
        truncated.stderr.contains("is not in this log"),
        "{truncated:#?}"
    );
}

/// `cordon run` arguments that fail before any model request when the transcript is refused.
fn run_args<'a>(ws: &'a Path, save: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--model",
        "openai:gpt-4.1",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--root",
        ws.to_str().unwrap(),
        "--save",
        save,
        "hi",
    ]
}

#[test]
fn a_save_symlink_is_refused_and_its_target_untouched() {
    let setup = Setup::new();
    let victim = setup.outside.join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    let link = setup.outside.join("session.jsonl");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let run = cordon_env(
        &setup.ws,
        &run_args(&setup.ws, link.to_str().unwrap()),
        &[("OPENAI_API_KEY", "test")],
    );
    run.assert_usage_error("symbolic link");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
}

#[test]
fn a_save_file_inside_the_workspace_is_a_usage_error() {
    let setup = Setup::new();
    let inside = setup.ws.join("session.jsonl");
    std::fs::write(&inside, "previous\n").unwrap();
    let run = cordon_env(
        &setup.ws,
        &run_args(&setup.ws, inside.to_str().unwrap()),
        &[("OPENAI_API_KEY", "test")],
    );
    run.assert_usage_error("as the transcript (--save): it is inside");
    assert_eq!(std::fs::read_to_string(&inside).unwrap(), "previous\n");
}

const POLICY: &str = r#"version = 1
default = "allow"

[tools]
enabled = ["read", "write", "edit", "bash"]

[filesystem]
read = ["**"]
write = ["**"]
# No `protect`: the default list (`.git/**`, `.cordon/**`) applies.
"#;

/// Replay one assistant message with `calls` against `ws` under `policy`; the tool results.
fn replay(
    dir: &Path,
    ws: &Path,
    policy: &Path,
    calls: &[(&str, Value)],
    extra: &[&str],
    env: &[(&str, &str)],
) -> Vec<Value> {
    let content: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, (name, arguments))| {
            json!({"type": "toolCall", "id": format!("c{index}"), "name": name, "arguments": arguments})
        })
        .collect();
    let transcript = dir.join("replay.jsonl");
    std::fs::write(
        &transcript,
        json!({"role": "assistant", "content": content, "stopReason": "toolUse"}).to_string()
            + "\n",
    )
    .unwrap();
    let mut args = vec![
        "replay",
        transcript.to_str().unwrap(),
        "--sequential",
        "--root",
        ws.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
    ];
    args.extend(extra);
    let run = cordon_env(ws, &args, env);
    assert_eq!(run.code, 0, "{run:#?}");
    run.stdout
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|event| event["type"] == "tool_execution_end")
        .collect()
}

/// The session's own policy file, inside the workspace, cannot be changed by it: not by the
/// file tools, not by a command (read-only bind), not by replacing it.
fn policy_in_workspace_is_read_only(extra: &[&str], env: &[(&str, &str)], cordon_dir: bool) {
    let setup = Setup::new();
    if cordon_dir {
        std::fs::create_dir(setup.ws.join(".cordon")).unwrap();
    }
    std::fs::create_dir(setup.ws.join("conf")).unwrap();
    let policy = setup.ws.join("conf/policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let calls = [
        (
            "write",
            json!({"path": "conf/policy.toml", "content": "version = 1\n"}),
        ),
        (
            "edit",
            json!({"path": "conf/policy.toml", "edits": [{"oldText": "default = \"allow\"", "newText": "default = \"deny\""}]}),
        ),
        (
            "bash",
            json!({"command": "echo '[network]' >> conf/policy.toml"}),
        ),
        (
            "bash",
            json!({"command": "cp conf/policy.toml /tmp/p && mv -f /tmp/p conf/policy.toml"}),
        ),
        ("bash", json!({"command": "rm -f conf/policy.toml"})),
        (
            "bash",
            json!({"command": "mkdir -p .cordon && echo x > .cordon/policy.toml"}),
        ),
        (
            "bash",
            json!({"command": "echo still-writable > conf/other.txt"}),
        ),
    ];
    let ends = replay(&setup.outside, &setup.ws, &policy, &calls, extra, env);
    assert_eq!(ends.len(), calls.len(), "{ends:#?}");
    for (index, end) in ends.iter().enumerate().take(calls.len() - 1) {
        assert_eq!(
            end["isError"], true,
            "call {index} changed the policy: {end:#}"
        );
    }
    assert_eq!(
        ends[calls.len() - 1]["isError"],
        false,
        "{:#}",
        ends[calls.len() - 1]
    );
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), POLICY);
    assert!(!setup.ws.join(".cordon/policy.toml").exists());
    assert_eq!(
        std::fs::read_to_string(setup.ws.join("conf/other.txt")).unwrap(),
        "still-writable\n"
    );
    let blocked = ends[0]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        blocked.contains("the policy file this session runs with"),
        "{blocked}"
    );
}

#[test]
fn a_policy_file_inside_the_workspace_is_read_only_to_the_session() {
    // `.cordon` missing: the sandbox pins a placeholder there.
    policy_in_workspace_is_read_only(&[], &[], false);
}

#[test]
fn a_policy_file_in_an_extra_writable_root_is_read_only_to_the_session() {
    let setup = Setup::new();
    let extra = setup.outside.join("cache");
    std::fs::create_dir(&extra).unwrap();
    let policy = extra.join("policy.toml");
    let text = POLICY.replace(
        "write = [\"**\"]",
        &format!("write = [\"**\", \"{}/**\"]", extra.display()),
    );
    std::fs::write(&policy, &text).unwrap();
    let target = policy.to_str().unwrap();
    let calls = [
        ("write", json!({"path": target, "content": "version = 1\n"})),
        (
            "bash",
            json!({"command": format!("echo '[network]' >> {target}")}),
        ),
        (
            "bash",
            json!({"command": format!("echo ok > {}/other.txt", extra.display())}),
        ),
    ];
    let ends = replay(&setup.outside, &setup.ws, &policy, &calls, &[], &[]);
    assert_eq!(ends[0]["isError"], true, "{:#}", ends[0]);
    assert_eq!(ends[1]["isError"], true, "{:#}", ends[1]);
    assert_eq!(
        ends[2]["isError"], false,
        "the root stays writable: {:#}",
        ends[2]
    );
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), text);
    assert_eq!(
        std::fs::read_to_string(extra.join("other.txt")).unwrap(),
        "ok\n"
    );
}

#[test]
fn docker_a_policy_file_inside_the_workspace_is_read_only_to_the_container() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_DOCKER=1: not testing the docker backend");
        return;
    }
    let host = cordon_tests::infra::docker_host().unwrap_or_else(|error| panic!("{error}"));
    // `.cordon` missing: the backend makes it (empty) so that it can be mounted read-only.
    policy_in_workspace_is_read_only(&["--backend", "docker"], &[("DOCKER_HOST", &host)], false);
}

/// Later sessions take their policy from the project's `.cordon/`: whatever the policy's own
/// `protect` list says, the session can never write there.
fn project_config_is_never_writable(extra: &[&str], env: &[(&str, &str)]) {
    let setup = Setup::new();
    let policy = setup.outside.join("policy.toml");
    let text = POLICY.replace(
        "# No `protect`: the default list (`.git/**`, `.cordon/**`) applies.",
        "protect = [\"secrets/**\"]",
    );
    assert_ne!(text, POLICY);
    std::fs::write(&policy, &text).unwrap();
    let calls = [
        (
            "write",
            json!({"path": ".cordon/policy.toml", "content": "version = 1\n"}),
        ),
        (
            "bash",
            json!({"command": "mkdir -p .cordon && echo 'version = 1' > .cordon/policy.toml"}),
        ),
        (
            "bash",
            json!({"command": "echo still-writable > other.txt"}),
        ),
    ];
    let ends = replay(&setup.outside, &setup.ws, &policy, &calls, extra, env);
    assert_eq!(ends[0]["isError"], true, "{:#}", ends[0]);
    assert_eq!(ends[1]["isError"], true, "{:#}", ends[1]);
    assert_eq!(ends[2]["isError"], false, "{:#}", ends[2]);
    assert!(!setup.ws.join(".cordon/policy.toml").exists());
    assert_eq!(
        std::fs::read_to_string(setup.ws.join("other.txt")).unwrap(),
        "still-writable\n"
    );
}

/// The user's Cordon config directory (where a later session may take its policy from) is
/// read-only when the workspace holds it, whether or not it exists yet: here the workspace is
/// the home directory, `~/.config/cordon` missing.
fn users_config_dir_is_read_only(extra: &[&str], env: &[(&str, &str)]) {
    let setup = Setup::new();
    let policy = setup.outside.join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let home = setup.ws.to_str().unwrap().to_owned();
    std::fs::create_dir(setup.ws.join(".config")).unwrap();
    let calls = [
        (
            "write",
            json!({"path": ".config/cordon/policy.toml", "content": "version = 1\n"}),
        ),
        (
            "bash",
            json!({"command": "mkdir -p .config/cordon && echo 'version = 1' > .config/cordon/policy.toml"}),
        ),
        (
            "bash",
            json!({"command": "mkdir -p .config/other && echo ok > .config/other/file"}),
        ),
    ];
    let ends = replay(
        &setup.outside,
        &setup.ws,
        &policy,
        &calls,
        extra,
        &[env, &[("HOME", &home), ("XDG_CONFIG_HOME", "")]].concat(),
    );
    assert_eq!(ends[0]["isError"], true, "{:#}", ends[0]);
    let text = ends[0]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("which later sessions read"), "{text}");
    assert_eq!(ends[1]["isError"], true, "{:#}", ends[1]);
    assert_eq!(ends[2]["isError"], false, "{:#}", ends[2]);
    assert!(!setup.ws.join(".config/cordon/policy.toml").exists());
    assert_eq!(
        std::fs::read_to_string(setup.ws.join(".config/other/file")).unwrap(),
        "ok\n"
    );
}

#[test]
fn the_users_cordon_config_dir_is_read_only_when_the_workspace_holds_it() {
    users_config_dir_is_read_only(&[], &[]);
}

#[test]
fn docker_the_users_cordon_config_dir_is_read_only_when_the_workspace_holds_it() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_DOCKER=1: not testing the docker backend");
        return;
    }
    let host = cordon_tests::infra::docker_host().unwrap_or_else(|error| panic!("{error}"));
    // The docker backend mounts only what exists: it creates the missing directory.
    users_config_dir_is_read_only(&["--backend", "docker"], &[("DOCKER_HOST", &host)]);
}

#[test]
fn the_project_cordon_dir_is_read_only_whatever_the_policy_protects() {
    project_config_is_never_writable(&[], &[]);
}

#[test]
fn docker_the_project_cordon_dir_is_read_only_whatever_the_policy_protects() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_DOCKER=1: not testing the docker backend");
        return;
    }
    let host = cordon_tests::infra::docker_host().unwrap_or_else(|error| panic!("{error}"));
    project_config_is_never_writable(&["--backend", "docker"], &[("DOCKER_HOST", &host)]);
}

#[test]
fn docker_copy_mode_never_copies_a_changed_policy_file_back() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_DOCKER=1: not testing the docker backend");
        return;
    }
    let host = cordon_tests::infra::docker_host().unwrap_or_else(|error| panic!("{error}"));
    let setup = Setup::new();
    let policy = setup.ws.join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    // The container works on a copy; what matters is that the host file is never replaced.
    let calls = [
        (
            "write",
            json!({"path": "policy.toml", "content": "version = 1\n"}),
        ),
        (
            "bash",
            json!({"command": "echo '[network]' >> policy.toml; echo changed > other.txt"}),
        ),
    ];
    let ends = replay(
        &setup.outside,
        &setup.ws,
        &policy,
        &calls,
        &["--backend", "docker", "--workspace-mode", "copy"],
        &[("DOCKER_HOST", &host)],
    );
    assert_eq!(ends[0]["isError"], true, "{:#}", ends[0]);
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), POLICY);
    assert_eq!(
        std::fs::read_to_string(setup.ws.join("other.txt")).unwrap(),
        "changed\n",
        "the copy-out ran"
    );
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted (and the directory removed) on
/// drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("temp dir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs needs root (mount failed: {status})"
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_disk_never_runs_an_unrecorded_call_nor_tears_the_log() {
    let setup = Setup::new();
    let disk = Tmpfs::mount("64k");
    let audit = disk.path().join("audit.jsonl");
    let args = |index: usize| json!({"path": format!("f{index}.txt"), "content": "x"});
    let first = setup.exec_audited("write", &args(0).to_string(), &audit);
    assert_eq!(first.code, 0, "{first:#?}");
    // Fill the disk: only the slack in the log's last page is left.
    let filler = disk.path().join("filler");
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = [0u8; 1024];
        while file.write_all(&block).is_ok() {}
    }
    let mut refused = 0;
    let mut ran = 1;
    let mut unusable = None;
    for index in 1..=40 {
        let run = setup.exec_audited("write", &args(index).to_string(), &audit);
        if run.code == 2 {
            // The log could not even be opened (e.g. a torn line left by the last session).
            unusable = Some(run);
            break;
        }
        if run.stdout.contains("the audit log cannot be written") {
            refused += 1;
        } else if run.code == 0 {
            ran += 1;
        }
        if refused >= 3 {
            break;
        }
    }
    let text = std::fs::read_to_string(&audit).unwrap();
    assert!(text.ends_with('\n'), "a torn line stayed in the log");
    assert!(unusable.is_none(), "the log became unusable: {unusable:#?}");
    assert!(refused >= 3, "the disk never filled: {ran} calls ran");
    verify_audit_log(&text).expect("the chain survives a full disk");
    // Every file that exists had its decision recorded before it was written, and no call
    // whose decision could not be recorded ran.
    let decided: Vec<String> = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|record| record["isError"].is_null())
        .map(|record| record["argsSha256"].as_str().unwrap().to_owned())
        .collect();
    for index in 0..=40 {
        let recorded = decided.contains(&args_sha256(&args(index)));
        let exists = setup.ws.join(format!("f{index}.txt")).exists();
        assert!(
            !exists || recorded,
            "f{index}.txt was written without a decision record"
        );
    }
    // Space freed: the log continues, intact.
    std::fs::remove_file(&filler).unwrap();
    let after = setup.exec_audited("read", r#"{"path":"a.txt"}"#, &audit);
    assert_eq!(after.code, 0, "{after:#?}");
    verify_audit_log(&std::fs::read_to_string(&audit).unwrap()).expect("chain continues");
}

#[test]
fn verifying_a_huge_sparse_audit_log_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let file = std::fs::File::create(&log).unwrap();
    file.set_len(1 << 40).unwrap();
    drop(file);
    let run = cordon(dir.path(), &["audit", "verify", log.to_str().unwrap()]);
    assert_ne!(run.code, 0, "{run:#?}");
    assert!(run.stderr.contains("larger than"), "{run:#?}");
}

/// A subdirectory's `.cordon/` is the configuration of a later session rooted there: the
/// shipped policies protect it like the other files host programs trust later (the file tools
/// at once, commands from the command after the one that created the directory on).
#[test]
fn a_subdirectory_cordon_dir_is_protected_by_the_default_policy() {
    let setup = Setup::new();
    let calls = [
        (
            "write",
            json!({"path": "pkg/.cordon/policy.toml", "content": "version = 1\n"}),
        ),
        ("bash", json!({"command": "mkdir -p pkg/.cordon"})),
        (
            "bash",
            json!({"command": "echo 'version = 1' > pkg/.cordon/policy.toml"}),
        ),
    ];
    let ends = replay(
        &setup.outside,
        &setup.ws,
        Path::new("builtin:default"),
        &calls,
        &[],
        &[],
    );
    assert_eq!(ends[0]["isError"], true, "{:#}", ends[0]);
    assert_eq!(ends[1]["isError"], false, "{:#}", ends[1]);
    assert_eq!(ends[2]["isError"], true, "{:#}", ends[2]);
    assert!(!setup.ws.join("pkg/.cordon/policy.toml").exists());
}
