//! `ask` decisions answered through MCP elicitation by the official Python SDK client: allow
//! once, allow for the session (scoped to the rule, as `cordon run`'s "always"), deny,
//! decline, dismiss, a malformed answer, no answer within `--approval-timeout`, and a client
//! that cannot answer (today's denial). Over stdio and streamable HTTP; the audit log records
//! every answer.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{
    HttpServer, PATIENCE, cordon, mcp_args, python_http_scenario, python_scenario, workspace,
};

/// Writes under `once/` and under `session/` each need a person's approval (two rules, so a
/// session approval of one can be seen not to cover the other).
const ASK_POLICY: &str = r#"version = 1
default = "allow"

[tools]
enabled = ["read", "write", "ls"]

[filesystem]
read = ["**"]
write = ["**"]

[[rules]]
tool = "write"
path = "once/**"
decision = "ask"
reason = "writes under once/ need a person's approval"

[[rules]]
tool = "write"
path = "session/**"
decision = "ask"
reason = "writes under session/ need a person's approval"
"#;

/// The policy, outside the workspace; `FILE:LINE` of its two rules (their `decision` lines).
struct AskPolicy {
    _dir: tempfile::TempDir,
    path: PathBuf,
    once_rule: String,
    session_rule: String,
}

fn ask_policy() -> AskPolicy {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ask.toml");
    std::fs::write(&path, ASK_POLICY).unwrap();
    let rule = |glob: &str| {
        let start = ASK_POLICY
            .lines()
            .position(|line| line == format!("path = \"{glob}\""))
            .unwrap();
        // The rule is named by its `[[rules]]` line.
        let header = ASK_POLICY
            .lines()
            .take(start)
            .collect::<Vec<_>>()
            .iter()
            .rposition(|line| *line == "[[rules]]")
            .unwrap();
        (header + 1).to_string()
    };
    let file = path.display().to_string();
    AskPolicy {
        once_rule: format!("{file}:{}", rule("once/**")),
        session_rule: format!("{file}:{}", rule("session/**")),
        path,
        _dir: dir,
    }
}

fn result<'a>(report: &'a Value, name: &str) -> (bool, &'a str) {
    let result = &report["results"][name];
    (
        result["error"].as_bool().unwrap(),
        result["text"].as_str().unwrap(),
    )
}

/// Check the answers' effects: which calls ran, what the model was told, what was asked.
fn assert_approvals(report: &Value, root: &Path, policy: &AskPolicy) {
    let ok = |name: &str| {
        let (error, text) = result(report, name);
        assert!(!error, "{name} was refused: {text}");
    };
    let denied = |name: &str, says: &str| {
        let (error, text) = result(report, name);
        assert!(error, "{name} ran: {text}");
        assert!(
            text.contains(says) && text.contains(&policy.once_rule),
            "{name}: {text}"
        );
    };
    ok("once");
    ok("onceAgain");
    denied("deny", "the user declined this call");
    denied("decline", "the user declined this call");
    denied(
        "cancel",
        "no answer was obtained (the user dismissed the question without answering)",
    );
    denied(
        "malformed",
        "no answer was obtained (the client's answer was malformed",
    );
    ok("session");
    ok("sessionAgain");
    denied("otherRule", "the user declined this call");

    assert_eq!(
        std::fs::read_to_string(root.join("once/a.txt")).unwrap(),
        "once/a.txt\n"
    );
    for refused in ["b", "c", "d", "e", "f"] {
        assert!(
            !root.join(format!("once/{refused}.txt")).exists(),
            "once/{refused}.txt was written"
        );
    }
    assert!(root.join("session/x.txt").exists());
    assert!(root.join("session/y.txt").exists());

    let asked = report["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 8, "{asked:#?}");
    let first = asked[0]["message"].as_str().unwrap();
    assert!(
        first.contains("Tool: write")
            && first.contains(r#"Arguments: {"path": "once/a.txt", "content": "once/a.txt\n"}"#)
            && first.contains(&format!("Rule: {}", policy.once_rule))
            && first.contains("Reason: writes under once/ need a person's approval"),
        "{first}"
    );
    let session = asked[6]["message"].as_str().unwrap();
    assert!(
        session.contains(&format!("Rule: {}", policy.session_rule)),
        "{session}"
    );
    assert_eq!(asked[0]["mode"], "form");
    assert_eq!(asked[0]["schema"]["required"][0], "decision");
}

/// The audit log's before-call records of `write`, as (decision, reason).
fn audited_writes(audit: &Path) -> Vec<(String, String)> {
    let log = std::fs::read_to_string(audit).expect("the audit log was written");
    cordon_policy::audit::verify_audit_log(&log).expect("the audit log's hash chain is intact");
    log.lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|record| record["tool"] == "write" && record["isError"].is_null())
        .map(|record| {
            (
                record["decision"].as_str().unwrap().to_owned(),
                record["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn python_client_answers_ask_decisions_through_elicitation() {
    let dir = workspace();
    let policy = ask_policy();
    let logs = tempfile::tempdir().expect("temp dir");
    let audit = logs.path().join("audit.jsonl");
    let report = python_scenario(
        "approvals",
        dir.path(),
        &[
            "--policy",
            policy.path.to_str().unwrap(),
            "--audit",
            audit.to_str().unwrap(),
        ],
    );
    assert_approvals(&report, dir.path(), &policy);

    // Recorded the way `cordon run` records its approvals.
    let writes = audited_writes(&audit);
    let decisions: Vec<&str> = writes
        .iter()
        .map(|(decision, _)| decision.as_str())
        .collect();
    assert_eq!(
        decisions,
        [
            "allow", "allow", "deny", "deny", "deny", "deny", "allow", "allow", "deny"
        ],
        "{writes:#?}"
    );
    let reasons: Vec<&str> = writes.iter().map(|(_, reason)| reason.as_str()).collect();
    assert!(
        reasons[0].starts_with("approved by the user: "),
        "{reasons:#?}"
    );
    assert!(
        reasons[6].starts_with("approved by the user for this session: "),
        "{reasons:#?}"
    );
    assert!(
        reasons[7].starts_with("approved for this session: "),
        "{reasons:#?}"
    );
    assert!(
        reasons[4].contains("dismissed the question"),
        "{reasons:#?}"
    );
}

#[test]
fn http_python_client_answers_ask_decisions_through_elicitation() {
    let dir = workspace();
    let policy = ask_policy();
    let mut server = HttpServer::start_with(
        dir.path(),
        &["--policy", policy.path.to_str().unwrap(), "-v"],
    );
    let report = python_http_scenario("approvals", dir.path(), &server.url);
    assert_approvals(&report, dir.path(), &policy);
    // Every question and answer is logged (stderr's reader may still be draining the pipe).
    let start = Instant::now();
    while server.stderr().matches("approval answered").count() < 8 {
        assert!(start.elapsed() < PATIENCE, "stderr:\n{}", server.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
    let stderr = server.stderr();
    assert_eq!(
        stderr
            .matches("asking the user through mcp elicitation")
            .count(),
        8,
        "{stderr}"
    );
    assert!(stderr.contains("answer=Always"), "{stderr}");
    let status = server.terminate();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        server.stderr()
    );
}

#[test]
fn python_client_without_an_answer_in_time_is_denied() {
    let dir = workspace();
    let policy = ask_policy();
    let report = python_scenario(
        "approval-timeout",
        dir.path(),
        &[
            "--policy",
            policy.path.to_str().unwrap(),
            "--approval-timeout",
            "1",
        ],
    );
    assert_eq!(report["error"], true, "{report}");
    let text = report["text"].as_str().unwrap();
    assert!(
        text.contains(
            "no answer was obtained (no answer within 1 s, the bound --approval-timeout sets)"
        ) && text.contains(&policy.once_rule),
        "{text}"
    );
    assert!(!dir.path().join("once/late.txt").exists());
}

#[test]
fn python_client_without_elicitation_keeps_ask_a_denial() {
    let dir = workspace();
    let policy = ask_policy();
    let report = python_scenario(
        "approval-unsupported",
        dir.path(),
        &["--policy", policy.path.to_str().unwrap()],
    );
    assert_eq!(report["error"], true, "{report}");
    let text = report["text"].as_str().unwrap();
    assert!(
        text.contains(&format!(
            "Blocked by policy ({}): approval required, but this session cannot ask a person",
            policy.once_rule
        )),
        "{text}"
    );
    assert!(!dir.path().join("once/a.txt").exists());
}

#[test]
fn approval_timeout_is_between_one_second_and_a_day() {
    let dir = workspace();
    for bad in ["0", "86401", "soon"] {
        let output = Command::new(cordon())
            .args(mcp_args(dir.path(), &["--approval-timeout", bad]))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{bad}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--approval-timeout"), "{bad}: {stderr}");
    }
}

/// Bash with filtered network: 127.0.0.2 (any port) needs a person's approval; the allow
/// entry only turns filtered mode on.
const EGRESS_ASK_POLICY: &str = r#"version = 1
default = "allow"

[tools]
enabled = ["bash"]

[filesystem]
read = ["**"]
write = ["**"]

[network]
allow = ["allowed.invalid"]
ask = ["127.0.0.2"]
"#;

/// The egress policy, outside the workspace, and the `FILE:LINE` of its ask entry.
fn egress_policy() -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("egress.toml");
    std::fs::write(&path, EGRESS_ASK_POLICY).unwrap();
    let line = EGRESS_ASK_POLICY
        .lines()
        .position(|line| line.starts_with("ask = "))
        .unwrap()
        + 1;
    let rule = format!("{}:{line}", path.display());
    (dir, path, rule)
}

#[test]
fn python_client_answers_questions_about_a_commands_connections() {
    let dir = workspace();
    let (_policy_dir, policy, rule) = egress_policy();
    let report = python_scenario(
        "egress-approvals",
        dir.path(),
        &["--policy", policy.to_str().unwrap()],
    );
    let port = report["port"].as_u64().unwrap();
    let destination = format!("127.0.0.2:{port}");
    let fetched = |name: &str| {
        let (_, text) = result(&report, name);
        assert!(text.contains("hello from the host"), "{name}: {text}");
    };
    fetched("once");
    fetched("session");
    fetched("sessionAgain");
    let (_, declined) = result(&report, "declined");
    assert!(
        !declined.contains("hello from the host")
            && declined.contains(&format!(
                "cordon: connection to {destination} refused by the network policy"
            ))
            && declined.contains("the person asked did not approve it")
            && declined.contains(&rule)
            && declined.contains(&format!(
                "to allow it without asking, add \"{destination}\" to [network] allow"
            )),
        "{declined}"
    );

    // Three questions (the session approval covered the fourth connection), each naming the
    // destination and the ask entry, offering the destination for the session.
    let asked = report["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 3, "{asked:#?}");
    for question in asked {
        let message = question["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("Destination: {destination}\n"))
                && message.contains(&format!("Rule: {rule}\n")),
            "{message}"
        );
        assert_eq!(
            question["schema"]["properties"]["decision"]["oneOf"][1]["title"],
            format!("Allow {destination} for this session")
        );
    }
}

#[test]
fn python_client_without_elicitation_keeps_a_network_ask_a_denial() {
    let dir = workspace();
    let (_policy_dir, policy, rule) = egress_policy();
    let report = python_scenario(
        "egress-unsupported",
        dir.path(),
        &["--policy", policy.to_str().unwrap()],
    );
    let port = report["port"].as_u64().unwrap();
    let destination = format!("127.0.0.2:{port}");
    let text = report["result"]["text"].as_str().unwrap();
    assert!(
        !text.contains("hello from the host")
            && text.contains("nobody can be asked about it here")
            && text.contains(&rule)
            && text.contains(&format!(
                "to allow it without asking, add \"{destination}\" to [network] allow"
            )),
        "{text}"
    );
}
