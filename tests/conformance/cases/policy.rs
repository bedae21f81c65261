//! Policy decisions in front of every call (docs/contract.md#policy-file): disabled tools, tool and
//! path rules, filesystem globs, bash command rules, `ask` without an approver, protected paths,
//! redaction, the audit log. Policies are written per case so rule lines are known.

use std::sync::Arc;

use cordon_tests::{Harness, Workspace, WorkspaceOptions};
use serde_json::{Value, json};

/// The built-in default policy, as shipped.
const DEFAULT_POLICY: &str = include_str!("../../../policies/default.toml");

/// `builtin:default.toml:LINE` of the first line of the default policy starting with `prefix`.
fn default_rule(prefix: &str) -> String {
    let line = DEFAULT_POLICY
        .lines()
        .position(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("the default policy has no line starting with {prefix:?}"));
    format!("builtin:default.toml:{}", line + 1)
}

const RULES_POLICY: &str = r#"version = 1
default = "allow"

[tools]
enabled = ["read", "write", "edit", "bash", "ls", "find"]

[filesystem]
deny = ["secret/**"]

[[rules]]
tool = "find"
decision = "deny"
reason = "use ls instead"

[[rules]]
tool = ["edit", "write"]
path = "locked.txt"
decision = "deny"

[[rules]]
command = ["git", "push"]
decision = "deny"
reason = "pushing is done by CI"

[[rules]]
tool = "read"
path = "ask.txt"
decision = "ask"
"#;

pub async fn disabled_tool_is_not_found(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(RULES_POLICY)).await;
    ws.call("grep", json!({"pattern": "x"}))
        .await
        .assert_error("Tool grep not found");
    let offered: Vec<String> = ws
        .session()
        .definitions()
        .into_iter()
        .map(|definition| definition.name)
        .collect();
    assert_eq!(offered, ["read", "bash", "edit", "write", "find", "ls"]);
}

pub async fn denied_tool_rule(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(RULES_POLICY)).await;
    ws.call("find", json!({"pattern": "*"}))
        .await
        .assert_error("Blocked by policy ($POLICY:10): use ls instead");
}

pub async fn denied_path_rule(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(RULES_POLICY)).await;
    ws.put("locked.txt", "keep\n");
    ws.call("write", json!({"path": "locked.txt", "content": "x"}))
        .await
        .assert_error(
            "Blocked by policy ($POLICY:15): writing $ROOT/locked.txt with `write` is denied by \
             the policy (`locked.txt`)",
        );
    // Judged on the canonical path: a symlink alias does not get around the rule.
    ws.symlink("locked.txt", "alias.txt");
    ws.call(
        "edit",
        json!({"path": "alias.txt", "edits": [{"oldText": "keep", "newText": "lost"}]}),
    )
    .await
    .assert_error(
        "Blocked by policy ($POLICY:15): reading $ROOT/locked.txt with `edit` is denied by the \
         policy (`locked.txt`)",
    );
    assert_eq!(ws.get_text("locked.txt"), "keep\n");
    // Reading it is fine.
    ws.call("read", json!({"path": "locked.txt"}))
        .await
        .assert_ok("keep\n");
}

pub async fn denied_filesystem_glob(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(RULES_POLICY)).await;
    ws.put("secret/key.txt", "hunter2-secret\n");
    for (tool, args) in [
        ("read", json!({"path": "secret/key.txt"})),
        ("write", json!({"path": "secret/key.txt", "content": "x"})),
        ("write", json!({"path": "secret/new.txt", "content": "x"})),
    ] {
        let refused = ws.call(tool, args).await;
        assert!(refused.is_error(), "{refused:#?}");
        assert!(
            refused
                .text
                .starts_with("Refused: access to path is denied by policy: $ROOT/secret/"),
            "{refused:#?}"
        );
        assert!(!refused.text.contains("hunter2"));
    }
    assert_eq!(ws.get_text("secret/key.txt"), "hunter2-secret\n");
    assert!(!ws.exists("secret/new.txt"));
    // The default policy denies secrets such as `.env` the same way.
    let ws = Workspace::open(&h).await;
    ws.put(".env", "TOKEN=hunter2-secret\n");
    let refused = ws.call("read", json!({"path": ".env"})).await;
    assert!(
        refused
            .text
            .starts_with("Refused: access to path is denied by policy: $ROOT/.env"),
        "{refused:#?}"
    );
}

pub async fn bash_command_rule(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(RULES_POLICY)).await;
    ws.call(
        "bash",
        json!({"command": "touch ran && git push origin main"}),
    )
    .await
    .assert_error(
        "Blocked by policy ($POLICY:20): the command `git push origin main` is denied: pushing \
         is done by CI",
    );
    assert!(!ws.exists("ran"), "a denied script does not run at all");
    // Hidden behind a wrapper and `bash -c`: still found.
    let nested = ws
        .call(
            "bash",
            json!({"command": "bash -c 'env FOO=1 git -C . push --force'"}),
        )
        .await;
    assert!(nested.is_error(), "{nested:#?}");
    assert!(nested.text.starts_with("Blocked by policy ($POLICY:20): "));
    // The words as data are fine.
    ws.call("bash", json!({"command": "echo git push"}))
        .await
        .assert_ok("git push\n");
}

pub async fn ask_without_approver_is_denied(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(RULES_POLICY)).await;
    ws.put("ask.txt", "asked\n");
    ws.call("read", json!({"path": "ask.txt"}))
        .await
        .assert_error(
            "Blocked by policy ($POLICY:25): approval required, but this session cannot ask a \
             person, so the call was denied (reading $ROOT/ask.txt with `read` needs a person's \
             approval by the policy (`ask.txt`)). Do not retry it; ask the user to run it or to \
             change the policy.",
        );
}

pub async fn protected_git_config(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put(".git/config", "[core]\n\tbare = false\n");
    let rule = default_rule("    \".git/**\",");
    let blocked = |path: &str| {
        format!(
            "Blocked by policy ({rule}): writing $ROOT/{path} is not allowed: the path is \
             protected (read-only) by the policy (`.git/**`)"
        )
    };
    ws.call(
        "write",
        json!({"path": ".git/config", "content": "[core]\n"}),
    )
    .await
    .assert_error(&blocked(".git/config"));
    ws.call(
        "edit",
        json!({"path": ".git/config", "edits": [{"oldText": "false", "newText": "true"}]}),
    )
    .await
    .assert_error(&blocked(".git/config"));
    ws.call(
        "write",
        json!({"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\n"}),
    )
    .await
    .assert_error(&blocked(".git/hooks/pre-commit"));
    // A symlink into .git is judged on where it points.
    ws.symlink(".git/config", "innocent.txt");
    ws.call(
        "edit",
        json!({"path": "innocent.txt", "edits": [{"oldText": "false", "newText": "true"}]}),
    )
    .await
    .assert_error(&blocked(".git/config"));
    assert_eq!(ws.get_text(".git/config"), "[core]\n\tbare = false\n");
    assert!(!ws.exists(".git/hooks/pre-commit"));
    // Protected means read-only, not hidden.
    ws.call("read", json!({"path": ".git/config"}))
        .await
        .assert_ok("[core]\n\tbare = false\n");
}

pub async fn redacts_secret_in_bash_output(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let secret = format!("ghp_{}", "a1B2".repeat(9));
    // The token is assembled at run time, so only the output carries it (not the arguments).
    let run = ws
        .call(
            "bash",
            json!({"command": "printf 'token=ghp_%s\\n' \"$(printf 'a1B2%.0s' 1 2 3 4 5 6 7 8 9)\""}),
        )
        .await;
    run.assert_ok("token=[REDACTED]\n");
    assert_eq!(run.structured()["output"], json!("token=[REDACTED]\n"));
    assert!(
        run.details()["redactions"].as_u64().unwrap_or(0) >= 1,
        "{run:#?}"
    );
    // Nothing the host sees carries it either: partial updates are redacted too.
    let events = serde_json::to_string(&run.events).expect("events serialise");
    assert!(
        !events.contains(&secret),
        "a partial result leaked the secret"
    );
    assert!(events.contains("tool_execution_update"));
    // A secret written to a file is redacted when read back.
    ws.put("leak.txt", format!("key: {secret}\n"));
    ws.call("read", json!({"path": "leak.txt"}))
        .await
        .assert_ok("key: [REDACTED]\n");
}

pub async fn audit_log_records_decisions(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(
        &h,
        WorkspaceOptions {
            policy: None,
            audit: true,
            approver: None,
        },
    )
    .await;
    ws.put("a.txt", "a\n");
    ws.call("read", json!({"path": "a.txt"}))
        .await
        .assert_ok("a\n");
    let denied = ws
        .call("write", json!({"path": ".git/x", "content": ""}))
        .await;
    assert!(denied.is_error());
    let path = ws.audit_path().expect("audit enabled");
    let text = std::fs::read_to_string(path).expect("audit log written");
    let report = cordon_policy::audit::verify_audit_log(&text).expect("the chain verifies");
    assert!(
        report.to_text().starts_with("ok: 3 lines"),
        "{}",
        report.to_text()
    );
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect();
    let summary: Vec<(Value, Value, Value, Value)> = lines
        .iter()
        .map(|line| {
            (
                line["tool"].clone(),
                line["decision"].clone(),
                line["rule"].clone(),
                line["isError"].clone(),
            )
        })
        .collect();
    let read_rule = json!(default_rule("    \"**\","));
    let protect_rule = json!(default_rule("    \".git/**\","));
    assert_eq!(
        summary,
        [
            (
                json!("read"),
                json!("allow"),
                read_rule.clone(),
                Value::Null
            ),
            (json!("read"), json!("allow"), read_rule, json!(false)),
            (json!("write"), json!("deny"), protect_rule, Value::Null),
        ]
    );
    for line in &lines {
        assert!(line["backend"].as_str().is_some_and(|b| !b.is_empty()));
        assert_eq!(line["argsSha256"].as_str().map(str::len), Some(64));
    }
}
