//! `cordon policy explain` and `cordon policy check` output.

use std::path::Path;

use cordon_policy::explain::{
    ExplainCliRequest, ExplainError, Explanation, check_policy_file, check_summary, explain_cli,
};
use cordon_policy::{CompiledPolicy, EnvMap};
use serde_json::json;

use crate::support::{repo_root, shipped};

fn run(
    policy: &CompiledPolicy,
    tool: &str,
    args_json: &str,
    root: &str,
    home: Option<&str>,
) -> Result<Explanation, ExplainError> {
    explain_cli(
        policy,
        &ExplainCliRequest {
            tool,
            args_json,
            root: Path::new(root),
            home: home.map(Path::new),
        },
    )
}

#[test]
fn explain_bash_text_and_json() {
    let p = shipped("ci-untrusted.toml");
    let explanation = run(
        &p,
        "bash",
        r#"{"command":"cargo test && git push"}"#,
        "/ws",
        Some("/home/agent"),
    )
    .unwrap();
    let file = repo_root().join("policies/ci-untrusted.toml");
    let rule_line = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .position(|line| line.contains("never pushes"))
        .unwrap()
        - 2;
    let expected_rule = format!("{}:{rule_line}", file.display());
    assert_eq!(
        explanation.to_text(),
        format!(
            "decision: deny\nrule: {expected_rule}\nreason: the command `git push` is denied: untrusted output never pushes; the CI job decides what is published\ncommand: cargo test\ncommand: git push\n"
        )
    );
    assert_eq!(
        explanation.to_json(),
        json!({
            "tool": "bash",
            "decision": "deny",
            "rule": expected_rule,
            "reason": "the command `git push` is denied: untrusted output never pushes; the CI job decides what is published",
            "nonInteractive": "deny",
            "paths": [],
            "lexicalPaths": false,
            "script": {
                "commands": [
                    {"program": "cargo", "programPath": null, "args": [{"kind": "literal", "text": "test"}], "openTail": false},
                    {"program": "git", "programPath": null, "args": [{"kind": "literal", "text": "push"}], "openTail": false}
                ],
                "unanalysable": []
            }
        })
    );
}

#[test]
fn explain_file_tool_resolves_lexically() {
    let p = CompiledPolicy::builtin_default(&EnvMap::new()).unwrap();
    let explanation = run(
        &p,
        "write",
        r#"{"path":"src/../.git/config","content":""}"#,
        "/ws",
        None,
    )
    .unwrap();
    let text = explanation.to_text();
    assert!(
        text.starts_with("decision: deny\nrule: builtin:default.toml:"),
        "{text}"
    );
    assert!(text.contains("reason: writing /ws/.git/config is not allowed: the path is protected (read-only) by the policy (`.git/**`)\n"), "{text}");
    assert!(
        text.ends_with("path: write /ws/.git/config (resolved lexically; symlinks not followed)\n"),
        "{text}"
    );
    assert_eq!(explanation.to_json()["lexicalPaths"], json!(true));
}

#[test]
fn explain_ask_and_unanalysable() {
    let p = shipped("build-host.toml");
    let text = run(&p, "bash", r#"{"command":"cargo publish"}"#, "/ws", None)
        .unwrap()
        .to_text();
    assert!(text.starts_with("decision: ask\n"), "{text}");
    assert!(text.contains("\nnon-interactive: deny\n"), "{text}");
    let text = run(&p, "bash", r#"{"command":"$CMD --help"}"#, "/ws", None)
        .unwrap()
        .to_text();
    assert!(text.starts_with("decision: allow\n"), "{text}");
    assert!(
        text.contains("\nunanalysable: the command name `$CMD` is computed at run time"),
        "{text}"
    );
}

#[test]
fn explain_rejects_bad_input() {
    let p = CompiledPolicy::builtin_default(&EnvMap::new()).unwrap();
    assert!(matches!(
        run(&p, "read", "{not json", "/ws", None),
        Err(ExplainError::BadJson(_))
    ));
    assert!(matches!(
        run(&p, "read", "[1]", "/ws", None),
        Err(ExplainError::NotAnObject)
    ));
    let error = run(&p, "read", "{}", "ws", None).unwrap_err();
    assert_eq!(
        error.to_string(),
        "failed to resolve paths: the workspace root ws is not absolute"
    );
}

#[test]
fn check_summarises_a_valid_file_and_reports_a_bad_one() {
    let path = repo_root().join("policies/ci-untrusted.toml");
    let summary = check_policy_file(&path, &EnvMap::new()).unwrap();
    let first = summary.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "{}: ok (default deny, 11 rules, tools: read, edit, write, bash, grep, find, ls, network disabled, workspace read-write)",
            path.display()
        )
    );
    assert!(
        summary.contains("note: redact.env: GITHUB_TOKEN is not set"),
        "{summary}"
    );
    let readonly = check_summary(&shipped("readonly.toml"));
    assert!(readonly.contains("workspace read-only"), "{readonly}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "version = 1\n[filesystem]\nread = [\"[\"]\n").unwrap();
    let error = check_policy_file(&bad, &EnvMap::new()).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with(&format!("{}:3:9: bad glob `[`", bad.display())),
        "{error}"
    );
}
