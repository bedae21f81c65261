//! End-to-end tests of `cordon exec`, `cordon replay`, `cordon policy` and `cordon audit`, run from
//! the built binary: output shapes (docs/contract.md#json-shapes), exit codes
//! (docs/contract.md#exit-codes: 0 success, 1 error result, 2 usage/configuration error with one
//! line on stderr), event order, Ctrl-C, and the example session the README uses as its main
//! command.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cordon_tests::fixtures::{ImageFormat, base64, image_bytes};
use cordon_tests::procs::{assert_gone, sleep_marker, wait_for_processes};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_cordon");

/// The repository root (examples/ and policies/ live there).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// What a finished `cordon` run printed.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// stdout as JSON lines.
    fn json_lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
            })
            .collect()
    }

    /// Panics unless this is a usage/configuration error: exit 2, nothing on stdout, exactly
    /// one line on stderr, starting `cordon: ` and containing `needle`.
    #[track_caller]
    fn assert_usage_error(&self, needle: &str) {
        assert_eq!(self.code, 2, "{self:#?}");
        assert_eq!(self.stdout, "", "{self:#?}");
        assert_eq!(
            self.stderr.lines().count(),
            1,
            "one line on stderr: {self:#?}"
        );
        assert!(self.stderr.starts_with("cordon: "), "{self:#?}");
        assert!(self.stderr.contains(needle), "{needle:?} not in {self:#?}");
    }
}

/// Run `cordon ARGS` in `dir` with `stdin` (empty when `None`) and wait for it.
fn cordon_in(dir: &Path, args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("failed to start cordon");
    {
        let mut input = child.stdin.take().expect("stdin");
        input
            .write_all(stdin.unwrap_or("").as_bytes())
            .expect("write stdin");
    }
    finish(child)
}

/// Wait (at most a generous minute) for a started `cordon` and collect its output.
fn finish(mut child: Child) -> Run {
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("cordon did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("collect output");
    Run {
        code: output
            .status
            .code()
            .expect("cordon exited by itself, not by a signal"),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
}

/// A temporary workspace and the `--root` arguments for it.
struct Ws {
    dir: tempfile::TempDir,
    root: String,
}

impl Ws {
    fn new() -> Ws {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir
            .path()
            .canonicalize()
            .expect("canonical")
            .to_string_lossy()
            .into_owned();
        Ws { dir, root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn put(&self, rel: &str, contents: impl AsRef<[u8]>) {
        std::fs::write(self.path(rel), contents).expect("write file");
    }

    /// `cordon ARGS --root ROOT` (plus the sandbox flags when `bash` needs them).
    fn run(&self, args: &[&str]) -> Run {
        self.run_stdin(args, None)
    }

    fn run_stdin(&self, args: &[&str], stdin: Option<&str>) -> Run {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--root", &self.root]);
        cordon_in(self.dir.path(), &all, stdin)
    }

    /// [`Ws::run_stdin`], creating the file `release` in the workspace as soon as a JSON line
    /// on stdout satisfies `trigger`: a command can wait for an event of the run itself
    /// instead of for some time.
    fn run_releasing(
        &self,
        args: &[&str],
        stdin: &str,
        trigger: impl Fn(&Value) -> bool,
        release: &str,
    ) -> Run {
        let mut child = Command::new(BIN)
            .args(args)
            .args(["--root", &self.root])
            .current_dir(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("failed to start cordon");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        let mut stderr = child.stderr.take().expect("stderr");
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut stderr, &mut text).expect("stderr is UTF-8");
            text
        });
        let mut stdout = String::new();
        let reader = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        for line in std::io::BufRead::lines(reader) {
            let line = line.expect("stdout is UTF-8");
            if serde_json::from_str::<Value>(&line).is_ok_and(|event| trigger(&event)) {
                self.put(release, "");
            }
            stdout.push_str(&line);
            stdout.push('\n');
        }
        let status = child.wait().expect("wait");
        Run {
            code: status
                .code()
                .expect("cordon exited by itself, not by a signal"),
            stdout,
            stderr: errors.join().expect("stderr reader"),
        }
    }
}

/// A degraded sandbox adds `details.sandbox`; remove it (and an emptied `details`) so the
/// contract shape can be compared exactly in both modes.
fn strip_degraded(mut result: Value) -> Value {
    if let Some(details) = result.get_mut("details").and_then(Value::as_object_mut) {
        if let Some(note) = details.remove("sandbox") {
            panic!("a complete sandbox was reported as degraded: {note}");
        }
        if details.is_empty() {
            result["details"] = Value::Null;
        }
    }
    result
}

/// `type:toolCallId` / `type:role` labels of replay events, without streaming updates.
fn trace(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|event| event["type"] != "tool_execution_update")
        .map(|event| {
            let kind = event["type"].as_str().expect("type");
            if let Some(id) = event["toolCallId"].as_str() {
                format!("{kind}:{id}")
            } else if let (true, Some(role)) = (
                kind.starts_with("message_"),
                event["message"]["role"].as_str(),
            ) {
                match event["message"]["toolCallId"].as_str() {
                    Some(id) => format!("{kind}:{role}:{id}"),
                    None => format!("{kind}:{role}"),
                }
            } else {
                kind.to_owned()
            }
        })
        .collect()
}

/// `(toolCallId, isError, text)` of every `tool_execution_end`, in emission order.
fn ends(events: &[Value]) -> Vec<(String, bool, String)> {
    events
        .iter()
        .filter(|event| event["type"] == "tool_execution_end")
        .map(|event| {
            (
                event["toolCallId"].as_str().expect("id").to_owned(),
                event["isError"].as_bool().expect("isError"),
                event["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

fn assistant_line(calls: &[(&str, &str, Value)], stop_reason: &str) -> String {
    let content: Vec<Value> = calls
        .iter()
        .map(|(id, name, arguments)| {
            json!({"type": "toolCall", "id": id, "name": name, "arguments": arguments})
        })
        .collect();
    json!({"role": "assistant", "content": content, "stopReason": stop_reason}).to_string()
}

// ---------------------------------------------------------------------------------------
// exec

#[test]
fn exec_prints_the_result_text_and_exits_0() {
    let ws = Ws::new();
    let write = ws.run(&[
        "exec",
        "write",
        r#"{"path":"a.txt","content":"hello\nworld\n"}"#,
    ]);
    assert_eq!(
        (write.code, write.stdout.as_str(), write.stderr.as_str()),
        (0, "Successfully wrote 12 bytes to a.txt\n", "")
    );
    let read = ws.run(&["exec", "read", r#"{"path":"a.txt"}"#]);
    assert_eq!((read.code, read.stdout.as_str()), (0, "hello\nworld\n"));
    let bash = ws.run(&["exec", "bash", r#"{"command":"cat a.txt | wc -l"}"#]);
    assert_eq!((bash.code, bash.stdout.as_str()), (0, "2\n"));
    // Without --root the workspace is the current directory.
    let ls = cordon_in(ws.dir.path(), &["exec", "ls", "{}"], None);
    assert_eq!((ls.code, ls.stdout.as_str()), (0, "a.txt\n"));
}

#[test]
fn exec_and_replay_leave_no_git_placeholder_behind() {
    // In a directory without .git, commands run with an empty placeholder at .git (so that
    // none can create one); it lingers for the next command but must go when cordon exits.
    let ws = Ws::new();
    let bash = ws.run(&[
        "exec",
        "bash",
        r#"{"command":"mkdir .git/hooks || echo refused"}"#,
    ]);
    assert!(bash.stdout.contains("refused"), "{bash:#?}");
    let entries: Vec<_> = std::fs::read_dir(ws.dir.path()).unwrap().collect();
    assert!(entries.is_empty(), "exec left {entries:?}");
    let call = |id: &str| {
        format!(
            r#"{{"role":"assistant","content":[{{"type":"toolCall","id":"{id}","name":"bash","arguments":{{"command":"true"}}}}],"stopReason":"toolUse"}}"#
        )
    };
    let session = format!("{}\n{}\n", call("a"), call("b"));
    let replay = ws.run_stdin(&["replay", "-"], Some(&session));
    assert_eq!(replay.code, 0, "{replay:#?}");
    let entries: Vec<_> = std::fs::read_dir(ws.dir.path()).unwrap().collect();
    assert!(entries.is_empty(), "replay left {entries:?}");
}

#[test]
fn exec_json_prints_the_contract_tool_result() {
    let ws = Ws::new();
    ws.put("a.txt", "hello\n");
    // A result without the degraded-sandbox note is compared byte for byte.
    let mut args = vec!["exec", "read", r#"{"path":"a.txt"}"#, "--json", "--root"];
    args.push(&ws.root);
    let read = cordon_in(ws.dir.path(), &args, None);
    assert_eq!(read.code, 0, "{read:#?}");
    assert_eq!(
        read.stdout,
        "{\"toolCallId\":\"call-1\",\"toolName\":\"read\",\"content\":[{\"type\":\"text\",\
         \"text\":\"hello\\n\"}],\"details\":null,\"structuredContent\":null,\"isError\":false}\n"
    );
    let bash = ws.run(&["exec", "bash", r#"{"command":"echo hi; exit 4"}"#, "--json"]);
    assert_eq!(bash.code, 1, "an error result exits 1: {bash:#?}");
    let lines = bash.json_lines();
    assert_eq!(lines.len(), 1, "exactly one JSON line");
    assert_eq!(
        strip_degraded(lines[0].clone()),
        json!({"toolCallId": "call-1", "toolName": "bash",
               "content": [{"type": "text", "text": "hi\n\n\nCommand exited with code 4"}],
               "details": null,
               "structuredContent": {"output": "hi\n", "exitCode": 4, "truncated": false,
                                     "fullOutputPath": null, "notes": []},
               "isError": true})
    );
    // Images: base64 data and MIME type in JSON, a one-line note as text.
    let png = image_bytes(2, 2, ImageFormat::Png);
    ws.put("pic.dat", &png);
    let json = ws.run(&["exec", "read", r#"{"path":"pic.dat"}"#, "--json"]);
    assert_eq!(
        strip_degraded(json.json_lines()[0].clone())["content"],
        json!([{"type": "text", "text": "Read image file [image/png]"},
               {"type": "image", "data": base64(&png), "mimeType": "image/png"}])
    );
    let text = ws.run(&["exec", "read", r#"{"path":"pic.dat"}"#]);
    assert_eq!(
        text.stdout,
        format!(
            "Read image file [image/png]\n[image: image/png, {} bytes of base64]\n",
            base64(&png).len()
        )
    );
}

#[test]
fn exec_error_result_exits_1() {
    let ws = Ws::new();
    let missing = ws.run(&["exec", "read", r#"{"path":"nope.txt"}"#]);
    assert_eq!(missing.code, 1, "{missing:#?}");
    assert_eq!(
        missing.stdout,
        "ENOENT: file not found: nope.txt. Check the path, or use ls or find to locate the \
         file.\n"
    );
    assert_eq!(missing.stderr, "");
    let unknown = ws.run(&["exec", "nope", "{}", "--json"]);
    assert_eq!(unknown.code, 1);
    assert_eq!(
        unknown.json_lines(),
        [json!({"toolCallId": "call-1", "toolName": "nope",
                "content": [{"type": "text", "text": "Tool nope not found"}],
                "details": null, "structuredContent": null, "isError": true})]
    );
    let refused = ws.run(&["exec", "read", r#"{"path":"../x"}"#]);
    assert_eq!(refused.code, 1);
    assert!(
        refused
            .stdout
            .starts_with("Refused: path is outside the allowed roots")
    );
}

#[test]
fn exec_usage_errors_exit_2_with_one_line() {
    let ws = Ws::new();
    ws.run(&["exec", "read", "nojson"])
        .assert_usage_error("invalid ARGS_JSON \"nojson\"");
    ws.run(&["exec", "read", "[1]"])
        .assert_usage_error("invalid ARGS_JSON \"[1]\": expected a JSON object");
    ws.run(&["exec", "read", "{}", "--bogus"])
        .assert_usage_error("unexpected argument '--bogus'");
    ws.run(&["exec", "read", "{}", "--backend", "nowhere"])
        .assert_usage_error("nowhere");
    let none = cordon_in(ws.dir.path(), &["frobnicate"], None);
    none.assert_usage_error("frobnicate");
}

#[test]
fn missing_argument_is_named_on_the_one_line() {
    // clap spreads this error over several lines; the one line must still say what is missing.
    Ws::new()
        .run(&["exec", "read"])
        .assert_usage_error("<ARGS_JSON>");
}

#[test]
fn exec_missing_root_exits_2() {
    let ws = Ws::new();
    let missing = ws.path("does-not-exist");
    let missing = missing.to_string_lossy();
    let run = cordon_in(
        ws.dir.path(),
        &["exec", "read", r#"{"path":"a"}"#, "--root", &missing],
        None,
    );
    run.assert_usage_error(&format!(
        "failed to open workspace root {missing}: No such file or directory"
    ));
}

#[test]
fn invalid_policy_file_exits_2_naming_file_line_and_column() {
    let ws = Ws::new();
    let policy = ws.path("bad.toml");
    std::fs::write(&policy, "version = 1\ndefault = \"allow\"\nbogus = 3\n").expect("write");
    let policy = policy.to_string_lossy().into_owned();
    let prefix = format!("{policy}:3:1: unknown key");
    ws.run(&["exec", "read", r#"{"path":"a"}"#, "--policy", &policy])
        .assert_usage_error(&prefix);
    ws.run_stdin(&["replay", "-", "--policy", &policy], Some(""))
        .assert_usage_error(&prefix);
    cordon_in(ws.dir.path(), &["policy", "check", &policy], None).assert_usage_error(&prefix);
    // A bad glob, deeper in the file: its own line and column.
    let glob = ws.path("glob.toml");
    std::fs::write(&glob, "version = 1\n\n[filesystem]\nread = [\"src/[\"]\n").expect("write");
    let glob = glob.to_string_lossy().into_owned();
    cordon_in(ws.dir.path(), &["policy", "check", &glob], None)
        .assert_usage_error(&format!("{glob}:4:"));
    // A missing file is named.
    let absent = ws.path("absent.toml");
    let absent = absent.to_string_lossy().into_owned();
    ws.run(&["exec", "read", r#"{"path":"a"}"#, "--policy", &absent])
        .assert_usage_error(&absent);
}

// ---------------------------------------------------------------------------------------
// policy and audit

const POLICY: &str = r#"version = 1
default = "allow"

[[rules]]
command = ["git", "push"]
decision = "deny"
reason = "pushing is done by CI"
"#;

#[test]
fn policy_check_and_explain() {
    let ws = Ws::new();
    let policy = ws.path("policy.toml");
    std::fs::write(&policy, POLICY).expect("write");
    let policy = policy.to_string_lossy().into_owned();
    let check = cordon_in(ws.dir.path(), &["policy", "check", &policy], None);
    assert_eq!(check.code, 0, "{check:#?}");
    assert_eq!(
        check.stdout.trim_end(),
        format!(
            "{policy}: ok (default allow, 1 rules, tools: read, edit, write, bash, grep, find, \
             ls, network disabled, workspace read-write)"
        )
    );
    let explain = cordon_in(
        ws.dir.path(),
        &[
            "policy",
            "explain",
            &policy,
            "bash",
            r#"{"command":"cargo test && git push origin"}"#,
        ],
        None,
    );
    assert_eq!(explain.code, 0, "{explain:#?}");
    assert_eq!(
        explain.stdout.trim_end(),
        format!(
            "decision: deny\nrule: {policy}:4\nreason: the command `git push origin` is denied: \
             pushing is done by CI\ncommand: cargo test\ncommand: git push origin"
        )
    );
    let json = cordon_in(
        ws.dir.path(),
        &[
            "policy",
            "explain",
            &policy,
            "bash",
            r#"{"command":"ls"}"#,
            "--json",
        ],
        None,
    );
    assert_eq!(json.code, 0, "{json:#?}");
    let value = &json.json_lines()[0];
    assert_eq!(value["decision"], json!("allow"));
    assert_eq!(value["rule"], json!(format!("{policy}:2")));
    assert_eq!(value["tool"], json!("bash"));
    // explain never executes anything.
    let touch = cordon_in(
        ws.dir.path(),
        &[
            "policy",
            "explain",
            &policy,
            "bash",
            r#"{"command":"touch ran"}"#,
        ],
        None,
    );
    assert_eq!(touch.code, 0);
    assert!(!ws.path("ran").exists());
}

#[test]
fn policy_explain_net_and_check_show_filtered_mode() {
    let ws = Ws::new();
    let policy = ws.path("policy.toml");
    std::fs::write(
        &policy,
        "version = 1\n[network]\nallow = [\"*.crates.io\"]\ndeny = [\"evil.crates.io\"]\n\
         ask = [\"*.github.com\"]\n",
    )
    .expect("write");
    let policy = policy.to_string_lossy().into_owned();
    let explain = cordon_in(
        ws.dir.path(),
        &["policy", "explain", &policy, "net", "github.com:22"],
        None,
    );
    assert_eq!(explain.code, 0, "{explain:#?}");
    assert_eq!(
        explain.stdout.trim_end(),
        format!(
            "decision: deny\nrule: no entry allows it\nreason: no entry allows github.com:22\n\
             destination: github.com:22\nnetwork: filtered\nfix: add \"github.com:22\" to \
             [network] allow in {policy}"
        )
    );
    let json = cordon_in(
        ws.dir.path(),
        &[
            "policy",
            "explain",
            &policy,
            "net",
            "evil.crates.io",
            "--json",
        ],
        None,
    );
    assert_eq!(json.code, 0, "{json:#?}");
    let value = &json.json_lines()[0];
    assert_eq!(value["decision"], json!("deny"));
    assert_eq!(value["source"], json!(format!("{policy}:4")));
    let asked = cordon_in(
        ws.dir.path(),
        &[
            "policy",
            "explain",
            &policy,
            "net",
            "api.github.com",
            "--json",
        ],
        None,
    );
    assert_eq!(asked.code, 0, "{asked:#?}");
    let value = &asked.json_lines()[0];
    assert_eq!(
        (&value["decision"], &value["source"]),
        (&json!("ask"), &json!(format!("{policy}:5")))
    );
    let bad = cordon_in(
        ws.dir.path(),
        &["policy", "explain", &policy, "net", "crates.io:99999"],
        None,
    );
    assert_eq!(bad.code, 2, "{bad:#?}");
    assert!(
        bad.stderr
            .contains("failed to parse destination \"crates.io:99999\": port \"99999\""),
        "{bad:#?}"
    );
    let check = cordon_in(ws.dir.path(), &["policy", "check", &policy, "--json"], None);
    assert_eq!(check.code, 0, "{check:#?}");
    let value = &check.json_lines()[0];
    assert_eq!(
        (
            &value["network"],
            &value["networkAllow"],
            &value["networkDeny"],
            &value["networkAsk"]
        ),
        (
            &json!("filtered"),
            &json!(["*.crates.io"]),
            &json!(["evil.crates.io"]),
            &json!(["*.github.com"])
        )
    );
}

#[test]
fn policy_explain_shows_what_runs_each_command() {
    let ws = Ws::new();
    let policy = ws.path("policy.toml");
    std::fs::write(&policy, POLICY).expect("write");
    let policy = policy.to_string_lossy().into_owned();
    let explain = |script: &str| {
        let args = json!({ "command": script }).to_string();
        let out = cordon_in(
            ws.dir.path(),
            &["policy", "explain", &policy, "bash", &args],
            None,
        );
        assert_eq!(out.code, 0, "{out:#?}");
        out.stdout
    };
    let text = explain("prlimit --nofile=64 git push");
    assert!(text.starts_with("decision: deny\n"), "{text}");
    assert!(text.contains("\ncommand: prlimit → git push\n"), "{text}");
    let text = explain("GIT_EXTERNAL_DIFF='sh -c \"git push\"' git diff");
    assert!(text.starts_with("decision: deny\n"), "{text}");
    assert!(
        text.contains("\ncommand: env var GIT_EXTERNAL_DIFF → sh -c → git push\n"),
        "{text}"
    );
    assert!(text.contains("\ncommand: git diff\n"), "{text}");
    let text = explain("git -c core.pager='less -R' log");
    assert!(
        text.contains("\ncommand: git → git setting core.pager → less -R\n"),
        "{text}"
    );
    let json = cordon_in(
        ws.dir.path(),
        &[
            "policy",
            "explain",
            &policy,
            "bash",
            r#"{"command":"chrt -o 0 git push"}"#,
            "--json",
        ],
        None,
    );
    let value = &json.json_lines()[0];
    assert_eq!(value["script"]["commands"][0]["via"], json!(["chrt"]));
}

#[test]
fn audit_verify_detects_tampering() {
    let ws = Ws::new();
    ws.put("a.txt", "a\n");
    // Outside the workspace: an audit log the sandbox can write is refused.
    let logs = tempfile::tempdir().expect("temp dir");
    let audit = logs.path().join("audit.jsonl");
    let audit = audit.to_string_lossy().into_owned();
    let read = ws.run(&["exec", "read", r#"{"path":"a.txt"}"#, "--audit", &audit]);
    assert_eq!(read.code, 0);
    let denied = ws.run(&[
        "exec",
        "write",
        r#"{"path":".git/config","content":"x"}"#,
        "--audit",
        &audit,
    ]);
    assert_eq!(denied.code, 1);
    let verify = cordon_in(ws.dir.path(), &["audit", "verify", &audit], None);
    assert_eq!(verify.code, 0, "{verify:#?}");
    let head = verify
        .stdout
        .strip_prefix("ok: 3 lines, chain intact, head ")
        .unwrap_or_else(|| panic!("{verify:#?}"))
        .trim_end();
    assert_eq!(head.len(), 64, "{verify:#?}");
    assert!(head.bytes().all(|b| b.is_ascii_hexdigit()));

    // Flip the recorded outcome of the read (line 2): the chain breaks at line 3.
    let text = std::fs::read_to_string(&audit).expect("read audit");
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    assert!(lines[1].contains("\"isError\":false"), "{}", lines[1]);
    lines[1] = lines[1].replace("\"isError\":false", "\"isError\":true");
    std::fs::write(&audit, lines.join("\n") + "\n").expect("tamper");
    let tampered = cordon_in(ws.dir.path(), &["audit", "verify", &audit], None);
    assert_eq!(tampered.code, 1, "{tampered:#?}");
    assert_eq!(tampered.stdout, "");
    assert!(tampered.stderr.contains("line 3"), "{tampered:#?}");

    // A removed line is detected too.
    lines.remove(1);
    std::fs::write(&audit, lines.join("\n") + "\n").expect("remove a line");
    let removed = cordon_in(ws.dir.path(), &["audit", "verify", &audit], None);
    assert_eq!(removed.code, 1, "{removed:#?}");
    assert!(removed.stderr.contains("line 2"), "{removed:#?}");
}

// ---------------------------------------------------------------------------------------
// replay

#[test]
fn replay_emits_events_in_order_and_skips_context_lines() {
    let ws = Ws::new();
    let transcript = [
        json!({"role": "user", "content": "write a note, then read it"}).to_string(),
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Writing it."},
            {"type": "toolCall", "id": "c1", "name": "write",
             "arguments": {"path": "note.txt", "content": "remember\n"}}],
            "stopReason": "toolUse"})
        .to_string(),
        json!({"role": "toolResult", "toolCallId": "c1", "toolName": "write",
               "content": [{"type": "text", "text": "recorded earlier, not replayed"}],
               "isError": false})
        .to_string(),
        assistant_line(&[("c2", "read", json!({"path": "note.txt"}))], "toolUse"),
    ]
    .join("\n");
    ws.put("session.jsonl", &transcript);
    let run = ws.run(&["replay", "session.jsonl"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{run:#?}");
    let events = run.json_lines();
    assert_eq!(
        trace(&events),
        [
            "agent_start",
            "turn_start",
            "message_start:assistant",
            "message_end:assistant",
            "tool_execution_start:c1",
            "tool_execution_end:c1",
            "message_start:toolResult:c1",
            "message_end:toolResult:c1",
            "turn_end",
            "turn_start",
            "message_start:assistant",
            "message_end:assistant",
            "tool_execution_start:c2",
            "tool_execution_end:c2",
            "message_start:toolResult:c2",
            "message_end:toolResult:c2",
            "turn_end",
            "agent_end",
        ]
    );
    assert_eq!(
        ends(&events),
        [
            (
                "c1".into(),
                false,
                "Successfully wrote 9 bytes to note.txt".into()
            ),
            ("c2".into(), false, "remember\n".into()),
        ]
    );
    let end = events.last().expect("agent_end");
    assert_eq!(end["messages"].as_array().map(Vec::len), Some(4));

    // The same transcript from standard input, as `-` and without a file argument.
    for args in [&["replay", "-"][..], &["replay"][..]] {
        let piped = ws.run_stdin(args, Some(&transcript));
        assert_eq!(piped.code, 0, "{piped:#?}");
        assert_eq!(trace(&piped.json_lines()), trace(&events));
    }
}

#[test]
fn replay_parallel_and_sequential() {
    let ws = Ws::new();
    // c1 waits for a file the test creates once it has read c2's end event: in parallel c2
    // ends first whatever the machine's load; sequentially c1 would time out, so the
    // sequential batch uses independent calls.
    let parallel = assistant_line(
        &[
            (
                "c1",
                "bash",
                json!({"command": "while [ ! -e released ]; do sleep 0.02; done; echo went",
                       "timeout": 120}),
            ),
            ("c2", "write", json!({"path": "go", "content": ""})),
        ],
        "toolUse",
    );
    let run = ws.run_releasing(
        &["replay", "-"],
        &parallel,
        |event| event["type"] == "tool_execution_end" && event["toolCallId"] == "c2",
        "released",
    );
    assert_eq!(run.code, 0, "{run:#?}");
    let tools: Vec<String> = trace(&run.json_lines())
        .into_iter()
        .filter(|label| label.contains(":c"))
        .collect();
    assert_eq!(
        tools,
        [
            "tool_execution_start:c1",
            "tool_execution_start:c2",
            "tool_execution_end:c2",
            "tool_execution_end:c1",
            "message_start:toolResult:c1",
            "message_end:toolResult:c1",
            "message_start:toolResult:c2",
            "message_end:toolResult:c2",
        ]
    );

    let sequential = assistant_line(
        &[
            ("s1", "write", json!({"path": "s.txt", "content": "one\n"})),
            ("s2", "read", json!({"path": "s.txt"})),
        ],
        "toolUse",
    );
    let run = ws.run_stdin(&["replay", "--sequential", "-"], Some(&sequential));
    assert_eq!(run.code, 0, "{run:#?}");
    let events = run.json_lines();
    let tools: Vec<String> = trace(&events)
        .into_iter()
        .filter(|label| label.contains(":s"))
        .collect();
    assert_eq!(
        tools,
        [
            "tool_execution_start:s1",
            "tool_execution_end:s1",
            "tool_execution_start:s2",
            "tool_execution_end:s2",
            "message_start:toolResult:s1",
            "message_end:toolResult:s1",
            "message_start:toolResult:s2",
            "message_end:toolResult:s2",
        ]
    );
    assert_eq!(ends(&events)[1].2, "one\n");
}

#[test]
fn replay_length_stopped_message_executes_nothing() {
    let ws = Ws::new();
    let transcript = assistant_line(
        &[(
            "c1",
            "write",
            json!({"path": "cut.txt", "content": "partial"}),
        )],
        "length",
    );
    let run = ws.run_stdin(&["replay"], Some(&transcript));
    assert_eq!(run.code, 0, "{run:#?}");
    let events = run.json_lines();
    assert_eq!(
        ends(&events),
        [(
            "c1".into(),
            true,
            "Tool call \"write\" was not executed: the response hit the output token limit, so \
             its arguments may be truncated. Re-issue the tool call with complete arguments."
                .into()
        )]
    );
    assert!(trace(&events).contains(&"message_end:toolResult:c1".to_owned()));
    assert!(!ws.path("cut.txt").exists());
}

#[test]
fn replay_bad_line_exits_2_and_executes_nothing() {
    let ws = Ws::new();
    let good = assistant_line(
        &[("c1", "write", json!({"path": "first.txt", "content": "x"}))],
        "toolUse",
    );
    ws.run_stdin(&["replay", "-"], Some(&format!("{good}\nnot json\n")))
        .assert_usage_error("line 2: not valid JSON");
    ws.run_stdin(
        &["replay", "-"],
        Some(&format!(
            "{good}\n{}\n",
            json!({"role": "system", "content": "x"})
        )),
    )
    .assert_usage_error("line 2: unknown message role \"system\"");
    ws.run_stdin(
        &["replay", "-"],
        Some(&format!("\n{}\n{good}\n", json!({"content": []}))),
    )
    .assert_usage_error("line 2: missing \"role\"");
    ws.run_stdin(
        &["replay", "-"],
        Some(&json!({"role": "assistant", "content": 5}).to_string()),
    )
    .assert_usage_error("line 1: not a valid assistant message");
    assert!(
        !ws.path("first.txt").exists(),
        "the whole input is checked before anything runs"
    );
    ws.run(&["replay", "missing.jsonl"])
        .assert_usage_error("failed to read missing.jsonl");
}

// ---------------------------------------------------------------------------------------
// Ctrl-C

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_exec_bash_gives_an_error_result_and_kills_the_tree() {
    let ws = Ws::new();
    let marker = sleep_marker();
    let command =
        json!({"command": format!("echo started; sleep {marker} & sleep {marker}")}).to_string();
    let args = ["exec", "bash", &command, "--json", "--root", &ws.root];
    let child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cordon");
    let pid = child.id().to_string();
    wait_for_processes(&marker, 2).await;
    let sent = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("run kill");
    assert!(sent.success());
    let run = tokio::task::spawn_blocking(move || finish(child))
        .await
        .expect("wait task");
    assert_eq!(run.code, 1, "an aborted call is an error result: {run:#?}");
    let result = strip_degraded(run.json_lines()[0].clone());
    assert_eq!(result["isError"], json!(true));
    assert_eq!(
        result["content"],
        json!([{"type": "text", "text": "started\n\n\nCommand aborted"}])
    );
    assert_gone(&marker).await;
}

// ---------------------------------------------------------------------------------------
// The example session (the README's main command)

#[test]
fn example_session_replays_cleanly() {
    // Exactly the README's command line, run by a shell from the repository root; its
    // `mktemp -d` lands in a directory this test removes.
    let tmp = tempfile::tempdir().expect("temp dir");
    let bin_dir = Path::new(BIN).parent().expect("binary directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let command_line = r#"cordon replay examples/session.jsonl --root "$(mktemp -d)""#;
    let output = Command::new("sh")
        .args(["-c", command_line])
        .current_dir(repo_root())
        .env("PATH", path)
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .output()
        .expect("run the example session");
    let run = Run {
        code: output.status.code().expect("exit code"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8"),
    };
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{run:#?}");
    let events = run.json_lines();
    let results = ends(&events);
    let by_id = |id: &str| {
        results
            .iter()
            .find(|(call, _, _)| call == id)
            .unwrap_or_else(|| panic!("no result for {id}: {results:#?}"))
            .clone()
    };
    let ok = |id: &str, text: &str| {
        assert_eq!(by_id(id), (id.to_owned(), false, text.to_owned()));
    };
    ok(
        "call_write_script",
        "Successfully wrote 119 bytes to greet.sh",
    );
    assert!(
        by_id("call_read_script")
            .2
            .contains("echo \"Hello, $name!\"")
    );
    ok(
        "call_edit_script",
        "Successfully replaced 1 block(s) in greet.sh.",
    );
    ok(
        "call_run_script",
        "Hello, Ada!\nHello, Linus!\nHello, world!\n",
    );
    ok(
        "call_write_readme",
        "Successfully wrote 126 bytes to README.md",
    );
    ok(
        "call_write_test",
        "Successfully wrote 191 bytes to test_greet.sh",
    );
    ok("call_list", "greet.sh\nREADME.md\ntest_greet.sh");
    ok(
        "call_grep",
        "greet.sh:5:   echo \"Hello, $name!\"\ntest_greet.sh:4: [ \"$(sh greet.sh Ada)\" = \
         \"Hello, Ada!\" ]\ntest_greet.sh:5: [ \"$(sh greet.sh)\" = \"Hello, world!\" ]",
    );
    ok("call_run_tests", "ok: 2 checks passed\n");
    let (_, is_error, refused) = by_id("call_install_hook");
    assert!(is_error);
    assert!(
        refused.starts_with("Blocked by policy (builtin:default.toml:64): writing ")
            && refused.ends_with(
                "/.git/hooks/pre-commit is not allowed: the path is protected (read-only) by \
                 the policy (`.git/**`)"
            ),
        "{refused}"
    );
    assert_eq!(results.len(), 10, "every call ran exactly once");
    // Nine assistant messages, nine turns; the last is text only.
    let turns = events.iter().filter(|e| e["type"] == "turn_end").count();
    assert_eq!(turns, 9);
    let last = events.last().expect("events");
    assert_eq!(last["type"], json!("agent_end"));
    let final_message = &events[events.len() - 2]["message"];
    assert_eq!(final_message["stopReason"], json!("stop"));
}

#[test]
fn sigterm_ends_the_session_with_its_last_sweep() {
    // SIGTERM (CI timeouts, `timeout`, `docker stop`) cancels the running command and the
    // session still ends as usual: the repository the command made is quarantined.
    let ws = Ws::new();
    let child = Command::new(BIN)
        .args([
            "exec",
            "bash",
            r#"{"command":"git init -q r && sleep 600"}"#,
            "--root",
            &ws.root,
        ])
        .current_dir(ws.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("failed to start cordon");
    let start = Instant::now();
    while !ws.path("r/.git/HEAD").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the command did not create its repository"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("send SIGTERM");
    let run = finish(child);
    assert_eq!(run.code, 1, "{run:#?}");
    assert!(!ws.path("r/.git").exists(), "{run:#?}");
    assert!(ws.path("r/.git.cordon-quarantine").is_dir(), "{run:#?}");
}

/// Arguments too large for one command-line argument (E2BIG past 128 KiB) come from stdin
/// (`-`) or a file (`@FILE`).
#[test]
fn exec_takes_large_arguments_from_stdin_or_a_file() {
    let ws = tempfile::tempdir().unwrap();
    let root = ws.path().to_str().unwrap().to_owned();
    let content = "x".repeat(1 << 20);
    let args = serde_json::json!({"path": "big.txt", "content": content}).to_string();
    let run = cordon_in(
        ws.path(),
        &["exec", "write", "-", "--root", &root],
        Some(&args),
    );
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("big.txt")).unwrap(),
        content
    );

    let file = ws.path().join("args.json");
    let args = serde_json::json!({"path": "copy.txt", "content": content}).to_string();
    std::fs::write(&file, args).unwrap();
    let at = format!("@{}", file.display());
    let run = cordon_in(ws.path(), &["exec", "write", &at, "--root", &root], None);
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("copy.txt")).unwrap(),
        content
    );

    let run = cordon_in(
        ws.path(),
        &["exec", "write", "-", "--root", &root],
        Some("[1, 2"),
    );
    run.assert_usage_error("invalid ARGS_JSON");
    let missing = format!("@{}", ws.path().join("nope.json").display());
    let run = cordon_in(
        ws.path(),
        &["exec", "write", &missing, "--root", &root],
        None,
    );
    run.assert_usage_error("failed to open ARGS_JSON file");
}

/// The temp files of writes directly in `dir`.
fn write_temps(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("list")
        .flatten()
        .filter(|entry| {
            cordon_ops::leftovers::is_write_temp_name(entry.file_name().as_encoded_bytes())
        })
        .map(|entry| entry.path())
        .collect()
}

fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, signal).expect("send signal");
}

/// Whether the process is stopped (`T` in `/proc/PID/stat`).
fn stopped(child: &Child) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('T'))
        })
        .unwrap_or(false)
}

/// Whether process `pid` holds a `flock` on inode `ino` (`/proc/locks`: `N: FLOCK ADVISORY
/// WRITE PID MAJ:MIN:INODE 0 EOF`).
fn holds_flock(pid: u32, ino: u64) -> bool {
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&"FLOCK")
                && fields.get(4) == Some(&pid.to_string().as_str())
                && fields
                    .get(5)
                    .and_then(|id| id.rsplit(':').next())
                    .is_some_and(|i| i == ino.to_string())
        })
}

/// Start `cordon exec write` of a large `name` in the workspace and stop it (SIGSTOP) once its
/// temp file exists and is locked: the write is then in flight, its temp file half written. A
/// write that finished before that was seen is retried with twice the content.
fn writer_stopped_mid_write(ws: &Ws, name: &str) -> (Child, PathBuf) {
    writer_stopped_mid_write_on(ws, name, &["--root", &ws.root], &[], true)
}

/// [`writer_stopped_mid_write`] with the backend flags `backend`; `locked`: wait until the
/// writer holds its temp file's lock (the local backend's writer does).
fn writer_stopped_mid_write_on(
    ws: &Ws,
    name: &str,
    backend: &[&str],
    env: &[(&str, &str)],
    locked: bool,
) -> (Child, PathBuf) {
    let args_dir = tempfile::tempdir().expect("temp dir");
    let mut size = 64 << 20;
    for _ in 0..6 {
        let args = json!({"path": name, "content": "x".repeat(size)}).to_string();
        let file = args_dir.path().join("args.json");
        std::fs::write(&file, args).expect("write args");
        let mut child = Command::new(BIN)
            .args(["exec", "write", &format!("@{}", file.display())])
            .args(backend)
            .envs(env.iter().copied())
            .current_dir(ws.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("failed to start cordon");
        let start = Instant::now();
        loop {
            let locked = write_temps(ws.dir.path()).pop().filter(|temp| {
                use std::os::unix::fs::MetadataExt as _;
                std::fs::metadata(temp)
                    .is_ok_and(|meta| !locked || holds_flock(child.id(), meta.ino()))
            });
            if let Some(temp) = locked {
                signal(&child, nix::sys::signal::Signal::SIGSTOP);
                while !stopped(&child) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if temp.exists() {
                    return (child, temp);
                }
                signal(&child, nix::sys::signal::Signal::SIGCONT);
                break;
            }
            if child.try_wait().expect("wait").is_some() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the write never started"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(child.wait().expect("wait").success());
        std::fs::remove_file(ws.path(name)).expect("remove the written file");
        size *= 2;
    }
    panic!("every write finished before its temp file was seen");
}

#[test]
fn a_write_killed_mid_way_leaves_a_temp_file_the_next_session_removes() {
    let ws = Ws::new();
    let (mut killed, temp) = writer_stopped_mid_write(&ws, "big.txt");
    signal(&killed, nix::sys::signal::Signal::SIGKILL);
    killed.wait().expect("wait");
    assert!(temp.exists(), "kill -9 leaves the temp file");
    assert!(!ws.path("big.txt").exists(), "and no torn target");
    // A temp file modified in the last minute may be a writer's that has not locked it yet:
    // this one is older (as at any later session but an immediate one).
    std::fs::File::options()
        .append(true)
        .open(&temp)
        .expect("open temp")
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(120))
        .expect("age temp");
    ws.put("small.txt", "x");
    let run = cordon_in(
        ws.dir.path(),
        &["exec", "ls", "{}", "--root", &ws.root],
        None,
    );
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(run.stdout.trim(), "small.txt", "{run:#?}");
    assert!(!temp.exists(), "the next session removes it");
}

#[test]
fn a_live_writers_temp_file_is_not_removed_by_another_session() {
    let ws = Ws::new();
    let (mut live, temp) = writer_stopped_mid_write(&ws, "big.txt");
    // Old enough to go by its age: only its writer's lock keeps it.
    std::fs::File::options()
        .append(true)
        .open(&temp)
        .expect("open temp")
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(120))
        .expect("age temp");
    let run = cordon_in(
        ws.dir.path(),
        &["exec", "ls", "{}", "--root", &ws.root],
        None,
    );
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(temp.exists(), "a write in flight keeps its temp file");
    signal(&live, nix::sys::signal::Signal::SIGCONT);
    assert!(live.wait().expect("wait").success());
    assert!(!temp.exists());
    assert!(
        std::fs::metadata(ws.path("big.txt"))
            .expect("written")
            .len()
            >= 64 << 20
    );
}

#[test]
fn a_write_over_ssh_killed_mid_way_leaves_no_temp_file_and_no_torn_target() {
    if std::env::var("CORDON_SKIP_SSH").as_deref() == Ok("1") {
        eprintln!("skipped: CORDON_SKIP_SSH=1");
        return;
    }
    let sshd = cordon_tests::infra::sshd()
        .unwrap_or_else(|reason| panic!("no test sshd for the ssh backend: {reason}"));
    let ws = Ws::new();
    let host = format!("root@127.0.0.1:{}", sshd.port);
    let backend = [
        "--backend",
        "ssh",
        "--host",
        &host,
        "--identity",
        sshd.key.to_str().unwrap(),
        "--known-hosts",
        sshd.known_hosts.to_str().unwrap(),
        "--ssh-config",
        sshd.ssh_config.to_str().unwrap(),
        "--remote-root",
        &ws.root,
    ];
    let (mut killed, temp) = writer_stopped_mid_write_on(&ws, "big.txt", &backend, &[], false);
    signal(&killed, nix::sys::signal::Signal::SIGKILL);
    killed.wait().expect("wait");
    // Files go through cordon-helper on the host, which had the whole content before the
    // client stopped: it finishes the write on its own or drops it, atomically either way.
    helper_write_settles(&ws, &temp, "big.txt");
    ws.put("small.txt", "x");
    let mut args = vec!["exec", "ls", "{}"];
    args.extend(backend.iter().copied());
    let run = cordon_in(ws.dir.path(), &args, None);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(
        ["small.txt", "big.txt\nsmall.txt"].contains(&run.stdout.trim()),
        "only the written file, never a temp file: {run:#?}"
    );
}

/// After a client died with a write in flight through cordon-helper: the helper's temp file
/// goes away, and the target is either absent or whole (one of the sizes the writer tried,
/// every byte written), never torn.
fn helper_write_settles(ws: &Ws, temp: &Path, name: &str) {
    let start = Instant::now();
    while temp.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the helper kept the temp file of a write whose client was killed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let Ok(content) = std::fs::read(ws.path(name)) else {
        return;
    };
    let chunks = content.len() / (64 << 20);
    assert!(
        content.len() % (64 << 20) == 0 && chunks.is_power_of_two(),
        "a torn target of {} bytes",
        content.len()
    );
    assert!(content.iter().all(|byte| *byte == b'x'), "a torn target");
}

#[test]
fn a_write_in_a_docker_container_killed_mid_way_leaves_neither_temp_file_nor_torn_target() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("skipped: CORDON_SKIP_DOCKER=1");
        return;
    }
    let docker_host = cordon_tests::infra::docker_host()
        .unwrap_or_else(|reason| panic!("no Docker engine for the docker backend: {reason}"));
    let ws = Ws::new();
    let backend = ["--backend", "docker", "--root", &ws.root];
    let env = [("DOCKER_HOST", docker_host.as_str())];
    let (mut killed, temp) = writer_stopped_mid_write_on(&ws, "big.txt", &backend, &env, false);
    signal(&killed, nix::sys::signal::Signal::SIGKILL);
    killed.wait().expect("wait");
    // File operations go through cordon-helper in the container, which had the whole content
    // before the client stopped: it finishes the write on its own or drops it, atomically.
    helper_write_settles(&ws, &temp, "big.txt");
    let written = ws.path("big.txt").exists();
    ws.put("small.txt", "x");
    let mut args = vec!["exec", "ls", "{}"];
    args.extend(backend);
    let child = Command::new(BIN)
        .args(&args)
        .envs(env)
        .current_dir(ws.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("failed to start cordon");
    let run = finish(child);
    assert_eq!(run.code, 0, "{run:#?}");
    // The killed session could not remove the empty `.cordon` it made to mount it read-only;
    // nothing else is left.
    let expected = if written {
        ".cordon/\nbig.txt\nsmall.txt"
    } else {
        ".cordon/\nsmall.txt"
    };
    assert_eq!(run.stdout.trim(), expected, "{run:#?}");
    assert_eq!(
        std::fs::read_dir(ws.path(".cordon")).unwrap().count(),
        0,
        "the pinned directory stays empty"
    );
}

#[test]
fn a_failed_copy_back_in_docker_copy_mode_exits_1_with_the_reason_on_stderr_and_logs_it() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("skipped: CORDON_SKIP_DOCKER=1");
        return;
    }
    let docker_host = cordon_tests::infra::docker_host()
        .unwrap_or_else(|reason| panic!("no Docker engine for the docker backend: {reason}"));
    let ws = Ws::new();
    ws.put("out", "a file on the host\n");
    // Deletions are not copied back, so the host keeps the file `out` where the container now
    // has a directory, which cannot be unpacked over it: the call succeeds, its work is lost.
    let args = [
        "exec",
        "bash",
        r#"{"command":"rm out && mkdir out && echo lost > out/f && echo done"}"#,
        "--json",
        "--backend",
        "docker",
        "--workspace-mode",
        "copy",
        "--root",
        &ws.root,
        "-v",
    ];
    let output = Command::new(BIN)
        .args(args)
        .env("DOCKER_HOST", &docker_host)
        .stdin(Stdio::null())
        .output()
        .expect("run cordon");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    let result: Value = serde_json::from_str(stdout.trim()).expect("the call's result on stdout");
    assert_eq!(result["isError"], false, "the call itself worked: {result}");
    assert!(
        stderr.contains("cordon: error: failed to copy the workspace back to the host"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path("out")).expect("still a file"),
        "a file on the host\n"
    );
    // -v shows the container's lifecycle and which path failed.
    for needle in [
        "docker: container started",
        "copy-back: path not written",
        "docker: container removed",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
}

/// A loopback origin answering every HTTP request with `hello` (a thread, for the test's life).
fn hello_origin() -> u16 {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind origin");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = (&stream).write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            );
        }
    });
    port
}

/// The same on the docker backend: the container has no network; the proxy in the `cordon`
/// process is reached through `cordon-helper forward` (found beside `cordon`), and the host's
/// loopback servers are the destinations.
#[test]
fn docker_exec_in_filtered_mode_goes_through_the_proxy_and_names_what_it_refused() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("skipped: CORDON_SKIP_DOCKER=1");
        return;
    }
    let docker_host = cordon_tests::infra::docker_host()
        .unwrap_or_else(|reason| panic!("no Docker engine for the docker backend: {reason}"));
    let helper = Path::new(BIN).with_file_name("cordon-helper");
    assert!(
        helper.is_file(),
        "{} is missing: build it with `cargo build -p cordon-helper`",
        helper.display()
    );
    let ws = Ws::new();
    let allowed = hello_origin();
    let refused = hello_origin();
    let policy = ws.path("policy.toml");
    std::fs::write(
        &policy,
        format!("version = 1\n[network]\nallow = [\"127.0.0.1/32:{allowed}\"]\n"),
    )
    .expect("write policy");
    let policy = policy.to_string_lossy().into_owned();
    // Loopback is in NO_PROXY, so it is emptied here.
    let fetch = |port: u16| {
        format!(
            "NO_PROXY= no_proxy= python3 -c \"import urllib.request, urllib.error\ntry:\n    \
             print(urllib.request.urlopen('http://127.0.0.1:{port}/').read().decode())\nexcept \
             urllib.error.HTTPError as e:\n    print(e.code)\""
        )
    };
    let command = format!("{}; {}", fetch(allowed), fetch(refused));
    let args = serde_json::to_string(&json!({ "command": command })).expect("json");
    let child = Command::new(BIN)
        .args(["exec", "bash", &args, "--json", "--policy", &policy])
        .args(["--backend", "docker", "--root", &ws.root])
        .env("DOCKER_HOST", &docker_host)
        .current_dir(ws.path(""))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("failed to start cordon");
    let bash = finish(child);
    let lines = bash.json_lines();
    let result = &lines[0];
    let text = result["content"][0]["text"].as_str().expect("text");
    assert!(text.starts_with("hello\n403\n"), "{bash:#?}");
    assert!(
        text.contains(&format!(
            "- 127.0.0.1:{refused}: no entry allows 127.0.0.1:{refused}; to allow it, the \
             operator can add \"127.0.0.1:{refused}\" to `[network] allow` in {policy}"
        )),
        "{bash:#?}"
    );
    let egress = result["details"]["egress"]
        .as_array()
        .expect("details.egress");
    assert_eq!(egress.len(), 2, "{bash:#?}");
    assert_eq!(egress[0]["outcome"], "allowed");
    assert_eq!(egress[0]["source"], format!("{policy}:3"));
    assert_eq!(egress[1]["outcome"], "denied");
}

#[test]
fn exec_in_filtered_mode_goes_through_the_proxy_and_names_what_it_refused() {
    let ws = Ws::new();
    let allowed = hello_origin();
    let refused = hello_origin();
    let policy = ws.path("policy.toml");
    std::fs::write(
        &policy,
        format!("version = 1\n[network]\nallow = [\"127.0.0.1/32:{allowed}\"]\n"),
    )
    .expect("write policy");
    let policy = policy.to_string_lossy().into_owned();
    // Loopback is in NO_PROXY, so curl is told to use the proxy for these addresses.
    let command = format!(
        "curl -sS --noproxy '' http://127.0.0.1:{allowed}/; echo; \
         curl -sS --noproxy '' -w ' %{{http_code}}' http://127.0.0.1:{refused}/"
    );
    let args = serde_json::to_string(&json!({ "command": command })).expect("json");
    let bash = ws.run(&["exec", "bash", &args, "--json", "--policy", &policy]);
    let lines = bash.json_lines();
    let result = &lines[0];
    let text = result["content"][0]["text"].as_str().expect("text");
    assert!(text.starts_with("hello\n"), "{bash:#?}");
    assert!(text.contains(" 403"), "{bash:#?}");
    assert!(
        text.contains("Sandbox: the network policy refused 1 destination during this command"),
        "{bash:#?}"
    );
    assert!(
        text.contains(&format!(
            "- 127.0.0.1:{refused}: no entry allows 127.0.0.1:{refused}; to allow it, the \
             operator can add \"127.0.0.1:{refused}\" to `[network] allow` in {policy}"
        )),
        "{bash:#?}"
    );
    let egress = result["details"]["egress"]
        .as_array()
        .expect("details.egress");
    assert_eq!(egress.len(), 2, "{bash:#?}");
    assert_eq!(egress[0]["outcome"], "allowed");
    assert_eq!(egress[0]["source"], format!("{policy}:3"));
    assert_eq!(egress[1]["outcome"], "denied");
}
