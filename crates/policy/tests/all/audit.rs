//! The audit log's hash chain: built line by line, verified as a whole; a removed, altered,
//! reordered, inserted or truncated line is reported with its line number.

use cordon_policy::Decision;
use cordon_policy::audit::{
    AuditError, AuditProblem, AuditRecord, GENESIS, args_sha256, audit_line, verify_audit_log,
    verify_audit_log_with_head,
};
use serde_json::{Value, json};

fn record(n: usize, finished: bool) -> AuditRecord {
    AuditRecord {
        ts: format!("2026-05-01T12:00:{n:02}.000Z"),
        backend: "local:/ws".into(),
        tool_call_id: format!("call-{n}"),
        tool: "bash".into(),
        args_sha256: args_sha256(&json!({"command": format!("echo {n}")})),
        decision: Decision::Allow,
        rule: "builtin:default.toml:13".into(),
        reason: "no rule matches".into(),
        is_error: finished.then_some(false),
        duration_ms: finished.then_some(12),
        egress: Vec::new(),
        egress_omitted: 0,
    }
}

/// A log of `n` lines, and its lines.
fn log(n: usize) -> (String, Vec<String>) {
    let mut prev = GENESIS.to_owned();
    let mut lines = Vec::new();
    for i in 0..n {
        let flag = (i == 1).then_some("the command name `$a` is computed at run time");
        let line = audit_line(&record(i, i % 2 == 1), &prev, flag);
        prev = line.sha256.clone();
        lines.push(line.text);
    }
    let mut text = lines.join("\n");
    text.push('\n');
    (text, lines)
}

fn join(lines: &[String]) -> String {
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

#[test]
fn lines_have_the_contract_shape() {
    let (_, lines) = log(2);
    let first: Value = serde_json::from_str(&lines[0]).unwrap();
    let keys: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    // serde_json sorts keys when parsing; check the set, then the exact text order.
    let mut expected = vec![
        "ts",
        "backend",
        "toolCallId",
        "tool",
        "argsSha256",
        "decision",
        "rule",
        "reason",
        "isError",
        "durationMs",
        "prev",
    ];
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert!(lines[0].starts_with(r#"{"ts":"2026-05-01T12:00:00.000Z","backend":"local:/ws","toolCallId":"call-0","tool":"bash","argsSha256":""#));
    assert!(lines[0].ends_with(&format!(r#""decision":"allow","rule":"builtin:default.toml:13","reason":"no rule matches","isError":null,"durationMs":null,"prev":"{GENESIS}"}}"#)));
    let second: Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(second["isError"], json!(false));
    assert_eq!(second["durationMs"], json!(12));
    assert_eq!(
        second["unanalysable"],
        json!("the command name `$a` is computed at run time")
    );
    assert_eq!(
        second["prev"],
        json!(cordon_policy::audit::sha256_hex(lines[0].as_bytes()))
    );
}

#[test]
fn egress_attempts_follow_prev_and_keep_the_chain_verifiable() {
    let attempt = |host: &str, outcome, source: Option<&str>| cordon_ops::EgressRecord {
        protocol: cordon_ops::EgressProtocol::HttpConnect,
        host: host.to_owned(),
        port: 443,
        address: None,
        outcome,
        entry: source.map(|_| "*.crates.io".to_owned()),
        source: source.map(str::to_owned),
        suggestion: None,
        asked: None,
        reason: "r".to_owned(),
        bytes_up: 10,
        bytes_down: 2000,
        duration_ms: 7,
    };
    let mut finished = record(1, true);
    finished.egress = vec![
        attempt(
            "static.crates.io",
            cordon_ops::EgressOutcome::Allowed,
            Some("p.toml:6"),
        ),
        attempt("evil.test", cordon_ops::EgressOutcome::Denied, None),
    ];
    finished.egress_omitted = 3;
    let first = audit_line(&record(0, false), GENESIS, None);
    let second = audit_line(&finished, &first.sha256, None);
    assert!(
        second.text.ends_with(&format!(
            r#""durationMs":12,"prev":"{}","egress":[{{"protocol":"httpConnect","host":"static.crates.io","port":443,"outcome":"allowed","entry":"*.crates.io","source":"p.toml:6","reason":"r","bytesUp":10,"bytesDown":2000,"durationMs":7}},{{"protocol":"httpConnect","host":"evil.test","port":443,"outcome":"denied","reason":"r","bytesUp":10,"bytesDown":2000,"durationMs":7}}],"egressOmitted":3}}"#,
            first.sha256
        )),
        "{}",
        second.text
    );
    // The line reads back as the record it was built from.
    let back: AuditRecord = serde_json::from_str(&second.text).unwrap();
    assert_eq!(back, finished);
    let text = format!("{}\n{}\n", first.text, second.text);
    assert_eq!(verify_audit_log(&text).unwrap().lines, 2);
    // Altering an attempt breaks nothing before it and is caught by the next line only if one
    // follows: the chain covers the whole line's bytes.
    let third = audit_line(&record(2, false), &second.sha256, None);
    let altered = format!(
        "{}\n{}\n{}\n",
        first.text,
        second.text.replace("evil.test", "good.test"),
        third.text
    );
    assert!(matches!(
        verify_audit_log(&altered),
        Err(AuditError::Chain { line: 3, .. })
    ));
}

#[test]
fn an_intact_log_verifies() {
    let (text, lines) = log(5);
    let report = verify_audit_log(&text).unwrap();
    assert_eq!(report.lines, 5);
    assert_eq!(
        report.head,
        cordon_policy::audit::sha256_hex(lines[4].as_bytes())
    );
    assert!(report.to_text().starts_with("ok: 5 lines"));
    assert_eq!(verify_audit_log("").unwrap().head, GENESIS);
    assert!(verify_audit_log_with_head(&text, &report.head).is_ok());
}

#[test]
fn a_removed_line_is_detected() {
    let (_, mut lines) = log(5);
    lines.remove(2);
    let error = bad(verify_audit_log(&join(&lines)).unwrap_err());
    assert_eq!(error.line, 3);
    assert!(
        matches!(error.problem, AuditProblem::BrokenChain { .. }),
        "{error}"
    );
    assert!(error.to_string().starts_with("line 3: "), "{error}");
    // Removing the first line breaks the genesis link.
    let (_, mut lines) = log(3);
    lines.remove(0);
    assert_eq!(bad(verify_audit_log(&join(&lines)).unwrap_err()).line, 1);
}

#[test]
fn an_altered_line_is_detected() {
    let (_, mut lines) = log(5);
    lines[1] = lines[1].replace("\"allow\"", "\"deny\"");
    let error = bad(verify_audit_log(&join(&lines)).unwrap_err());
    assert_eq!(
        error.line, 3,
        "the line after the altered one no longer links"
    );
    // Altering the last line's own `prev` is caught on that line.
    let (_, mut lines) = log(3);
    lines[2] = lines[2].replace("\"prev\":\"", "\"prev\":\"f");
    let error = bad(verify_audit_log(&join(&lines)).unwrap_err());
    assert_eq!(error.line, 3);
}

#[test]
fn a_reordered_line_is_detected() {
    let (_, mut lines) = log(5);
    lines.swap(1, 2);
    let error = bad(verify_audit_log(&join(&lines)).unwrap_err());
    assert_eq!(error.line, 2);
}

#[test]
fn an_inserted_line_is_detected() {
    let (_, mut lines) = log(4);
    let forged = audit_line(&record(9, false), GENESIS, None).text;
    lines.insert(2, forged);
    assert_eq!(bad(verify_audit_log(&join(&lines)).unwrap_err()).line, 3);
}

#[test]
fn a_truncated_last_line_is_detected() {
    let (text, _) = log(4);
    let truncated = &text[..text.len() - 20];
    let error = bad(verify_audit_log(truncated).unwrap_err());
    assert_eq!(error.line, 4);
    assert_eq!(error.problem, AuditProblem::Truncated);
    // Only the newline missing is still a truncation.
    let error = bad(verify_audit_log(&text[..text.len() - 1]).unwrap_err());
    assert_eq!(error.problem, AuditProblem::Truncated);
}

#[test]
fn garbage_and_missing_prev_are_reported() {
    let (_, mut lines) = log(3);
    lines[1] = "not json".into();
    let error = bad(verify_audit_log(&join(&lines)).unwrap_err());
    assert_eq!(error.line, 2);
    assert!(matches!(error.problem, AuditProblem::NotJson(_)));
    let error = bad(verify_audit_log("{\"ts\":\"x\"}\n").unwrap_err());
    assert_eq!(error.problem, AuditProblem::MissingPrev);
    let (text, _) = log(2);
    let error = bad(verify_audit_log(&format!("{text}\n")).unwrap_err());
    assert_eq!((error.line, error.problem), (3, AuditProblem::EmptyLine));
}

#[test]
fn lines_removed_from_the_end_are_caught_against_a_kept_head() {
    let (text, lines) = log(5);
    let head = verify_audit_log(&text).unwrap().head;
    let shorter = join(&lines[..3]);
    assert!(
        verify_audit_log(&shorter).is_ok(),
        "a shorter chain is still a chain"
    );
    let error = bad(verify_audit_log_with_head(&shorter, &head).unwrap_err());
    assert_eq!(error.line, 4);
    assert!(matches!(error.problem, AuditProblem::HeadMismatch { .. }));
}

/// The first bad line a verification reports (which must be a chain error), and the error's
/// text.
struct Bad {
    line: usize,
    problem: AuditProblem,
    text: String,
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn bad(error: AuditError) -> Bad {
    let text = error.to_string();
    match error {
        AuditError::Chain { line, problem } => Bad {
            line,
            problem,
            text,
        },
        other => panic!("not a chain error: {other}"),
    }
}
