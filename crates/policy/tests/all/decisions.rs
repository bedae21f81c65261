//! Table-driven decision tests: each row is a call, the expected decision, the line of the
//! rule that must have made it, and a fragment of the reason.

use cordon_ops::Op;
use cordon_policy::Decision;
use serde_json::{Value, json};

use crate::support::{access, bash, call, decide, policy};

const POLICY: &str = r#"version = 1
default = "allow"

[tools]
enabled = ["read", "edit", "write", "bash", "grep", "ls"]

[filesystem]
read = ["**", "~/.cargo/**", "/opt/tools/**"]
write = ["**", "/scratch/**"]
deny = ["**/.env", "secrets/**", "~/.ssh/**"]
protect = [".git/**"]

[[rules]]
command = ["git", "push"]
decision = "deny"
reason = "pushing is done by CI"

[[rules]]
command = ["cargo", "publish"]
decision = "ask"

[[rules]]
command = ["cargo", "test"]
decision = "allow"

[[rules]]
tool = ["edit", "write"]
path = "Cargo.lock"
decision = "deny"
reason = "Cargo.lock is updated by CI"

[[rules]]
tool = "grep"
decision = "ask"
reason = "searches are reviewed"

[[rules]]
tool = "write"
path = ["docs/**", "*.md"]
decision = "ask"
"#;

/// 1-based line of the first line containing `needle`.
pub fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in policy"))
        + 1
}

/// The line of the `[[rules]]` header above `needle`.
pub fn rule_line(text: &str, needle: &str) -> usize {
    let at = line_of(text, needle);
    text.lines()
        .take(at)
        .enumerate()
        .filter(|(_, line)| line.trim() == "[[rules]]")
        .map(|(index, _)| index + 1)
        .last()
        .expect("a [[rules]] header above")
}

struct Row {
    tool: &'static str,
    args: Value,
    decision: Decision,
    /// Line the decision must cite.
    line: usize,
    reason: &'static str,
}

#[test]
fn table() {
    let p = policy(POLICY);
    let rule = |needle| rule_line(POLICY, needle);
    let line = |needle| line_of(POLICY, needle);
    let rows = [
        // File tools against [filesystem].
        Row {
            tool: "read",
            args: json!({"path": "src/main.rs"}),
            decision: Decision::Allow,
            line: line("read = "),
            reason: "is allowed",
        },
        Row {
            tool: "read",
            args: json!({"path": "~/.cargo/registry/x.rs"}),
            decision: Decision::Allow,
            line: line("read = "),
            reason: "~/.cargo/**",
        },
        Row {
            tool: "read",
            args: json!({"path": "/opt/tools/bin/x"}),
            decision: Decision::Allow,
            line: line("read = "),
            reason: "/opt/tools/**",
        },
        Row {
            tool: "read",
            args: json!({"path": "/etc/passwd"}),
            decision: Decision::Deny,
            line: line("read = "),
            reason: "outside the policy's readable paths",
        },
        Row {
            tool: "read",
            args: json!({"path": "/scratch/a"}),
            decision: Decision::Allow,
            line: line("write = "),
            reason: "/scratch/**",
        },
        Row {
            tool: "read",
            args: json!({"path": "app/.env"}),
            decision: Decision::Deny,
            line: line("deny = "),
            reason: "**/.env",
        },
        Row {
            tool: "read",
            args: json!({"path": ".env"}),
            decision: Decision::Deny,
            line: line("deny = "),
            reason: "denied by the policy",
        },
        Row {
            tool: "ls",
            args: json!({"path": "secrets"}),
            decision: Decision::Deny,
            line: line("deny = "),
            reason: "secrets/**",
        },
        Row {
            tool: "read",
            args: json!({"path": "~/.ssh/id_ed25519"}),
            decision: Decision::Deny,
            line: line("deny = "),
            reason: "~/.ssh/**",
        },
        Row {
            tool: "read",
            args: json!({"path": ".git/config"}),
            decision: Decision::Allow,
            line: line("read = "),
            reason: "is allowed",
        },
        Row {
            tool: "write",
            args: json!({"path": ".git/config", "content": ""}),
            decision: Decision::Deny,
            line: line("protect = "),
            reason: "protected (read-only)",
        },
        Row {
            tool: "edit",
            args: json!({"path": ".git/HEAD", "edits": []}),
            decision: Decision::Deny,
            line: line("protect = "),
            reason: "protected",
        },
        Row {
            tool: "write",
            args: json!({"path": "src/new.rs", "content": ""}),
            decision: Decision::Allow,
            line: line("write = "),
            reason: "is allowed",
        },
        Row {
            tool: "write",
            args: json!({"path": "/scratch/out.txt", "content": ""}),
            decision: Decision::Allow,
            line: line("write = "),
            reason: "/scratch/**",
        },
        Row {
            tool: "write",
            args: json!({"path": "/opt/tools/x", "content": ""}),
            decision: Decision::Deny,
            line: line("write = "),
            reason: "outside the policy's writable paths",
        },
        Row {
            tool: "write",
            args: json!({"path": "../outside", "content": ""}),
            decision: Decision::Deny,
            line: line("write = "),
            reason: "writable paths",
        },
        Row {
            tool: "ls",
            args: json!({}),
            decision: Decision::Allow,
            line: line("read = "),
            reason: "is allowed",
        },
        // Per-tool path rules.
        Row {
            tool: "edit",
            args: json!({"path": "Cargo.lock", "edits": []}),
            decision: Decision::Deny,
            line: rule("path = \"Cargo.lock\""),
            reason: "Cargo.lock is updated by CI",
        },
        Row {
            tool: "read",
            args: json!({"path": "Cargo.lock"}),
            decision: Decision::Allow,
            line: line("read = "),
            reason: "is allowed",
        },
        Row {
            tool: "write",
            args: json!({"path": "docs/a.txt", "content": ""}),
            decision: Decision::Ask,
            line: rule("docs/**"),
            reason: "needs a person's approval",
        },
        Row {
            tool: "write",
            args: json!({"path": "README.md", "content": ""}),
            decision: Decision::Ask,
            line: rule("docs/**"),
            reason: "*.md",
        },
        Row {
            tool: "edit",
            args: json!({"path": "README.md", "edits": []}),
            decision: Decision::Allow,
            line: line("read = "),
            reason: "is allowed",
        },
        // Plain tool rules and tool enablement.
        Row {
            tool: "grep",
            args: json!({"pattern": "x"}),
            decision: Decision::Ask,
            line: rule("tool = \"grep\""),
            reason: "searches are reviewed",
        },
        Row {
            tool: "find",
            args: json!({"pattern": "*.rs"}),
            decision: Decision::Deny,
            line: line("enabled = "),
            reason: "not enabled",
        },
        Row {
            tool: "teleport",
            args: json!({}),
            decision: Decision::Deny,
            line: line("enabled = "),
            reason: "not enabled",
        },
        // Bash command rules (default = allow).
        Row {
            tool: "bash",
            args: json!({"command": "git push origin main"}),
            decision: Decision::Deny,
            line: rule("\"git\", \"push\""),
            reason: "pushing is done by CI",
        },
        Row {
            tool: "bash",
            args: json!({"command": "git status && git push"}),
            decision: Decision::Deny,
            line: rule("\"git\", \"push\""),
            reason: "`git push`",
        },
        Row {
            tool: "bash",
            args: json!({"command": "cargo publish --dry-run"}),
            decision: Decision::Ask,
            line: rule("\"cargo\", \"publish\""),
            reason: "needs a person's approval",
        },
        Row {
            tool: "bash",
            args: json!({"command": "cargo publish; git push"}),
            decision: Decision::Deny,
            line: rule("\"git\", \"push\""),
            reason: "pushing",
        },
        Row {
            tool: "bash",
            args: json!({"command": "cargo test --all"}),
            decision: Decision::Allow,
            line: rule("\"cargo\", \"test\""),
            reason: "is allowed",
        },
        Row {
            tool: "bash",
            args: json!({"command": "ls -la"}),
            decision: Decision::Allow,
            line: line("default = "),
            reason: "policy default",
        },
        Row {
            tool: "bash",
            args: json!({}),
            decision: Decision::Deny,
            line: line("default = "),
            reason: "no `command`",
        },
    ];
    for (index, row) in rows.iter().enumerate() {
        let got = call(&p, row.tool, &row.args);
        assert_eq!(
            got.decision, row.decision,
            "row {index} ({} {}): {got:?}",
            row.tool, row.args
        );
        assert_eq!(
            got.rule.line, row.line,
            "row {index} ({} {}): {got:?}",
            row.tool, row.args
        );
        assert_eq!(&*got.rule.file, "test.toml");
        assert!(
            got.reason.contains(row.reason),
            "row {index} ({} {}): reason {:?} lacks {:?}",
            row.tool,
            row.args,
            got.reason,
            row.reason
        );
    }
}

#[test]
fn allowlist_mode_requires_every_command_to_be_allowed() {
    let text = r#"version = 1
default = "deny"

[[rules]]
command = ["git", ["status", "diff"]]
decision = "allow"

[[rules]]
command = ["cargo", "test"]
decision = "allow"
"#;
    let p = policy(text);
    let allowed = [
        "git status",
        "git diff --stat",
        "cargo test -p x",
        "git status && cargo test",
        "(git status) | cargo test",
        "timeout 60 cargo test",
        "env -i cargo test",
        "/usr/bin/git status",
        "cargo test $FLAGS",
    ];
    for script in allowed {
        let got = bash(&p, script);
        assert_eq!(got.decision, Decision::Allow, "{script}: {got:?}");
        assert!(got.unanalysable.is_none(), "{script}: {got:?}");
    }
    let denied = [
        ("git status; ls", "`ls` is not allowed"),
        ("git log", "`git log` is not allowed"),
        ("cargo test && curl x | sh", "cannot be fully checked"),
        ("cargo test && curl x", "`curl x` is not allowed"),
        ("git $sub", "`git $sub` is not allowed"),
        ("./cargo test", "not by a path"),
        ("/tmp/x/cargo test", "not by a path"),
        ("cargo tes\\t", "`cargo test` is allowed"),
    ];
    for (script, reason) in denied {
        let got = bash(&p, script);
        if script == "cargo tes\\t" {
            // The escape resolves to the allowed command.
            assert_eq!(got.decision, Decision::Allow, "{script}: {got:?}");
            assert!(got.reason.contains(reason), "{script}: {got:?}");
            continue;
        }
        assert_eq!(got.decision, Decision::Deny, "{script}: {got:?}");
        assert!(
            got.reason.contains(reason),
            "{script}: {:?} lacks {reason:?}",
            got.reason
        );
        if !got.reason.contains("cannot be fully checked") {
            assert_eq!(got.rule.line, 2, "{script}: the allowlist default decides");
        }
    }
    // No command at all: the default (deny) applies.
    assert_eq!(bash(&p, "").decision, Decision::Deny);
    assert_eq!(bash(&p, "# just a comment").decision, Decision::Deny);
}

#[test]
fn allow_rules_trust_toolchain_paths_but_not_workspace_paths() {
    let text = r#"version = 1
default = "deny"
[filesystem]
read = ["**", "~/.cargo/**"]
write = ["**", "~/.cache/**"]
[[rules]]
command = ["cargo", "test"]
decision = "allow"
[[rules]]
command = ["tool"]
decision = "allow"
"#;
    let p = policy(text);
    assert_eq!(
        bash(&p, "~/.cargo/bin/cargo test").decision,
        Decision::Allow
    );
    assert_eq!(
        bash(&p, "/home/agent/.cargo/bin/cargo test").decision,
        Decision::Allow
    );
    assert_eq!(bash(&p, "/ws/bin/cargo test").decision, Decision::Deny);
    assert_eq!(bash(&p, "bin/cargo test").decision, Decision::Deny);
    assert_eq!(
        bash(&p, "~/.cache/tool").decision,
        Decision::Deny,
        "writable root"
    );
    assert_eq!(bash(&p, "/usr/local/bin/tool").decision, Decision::Allow);
}

#[test]
fn tool_rules_can_allow_bash_wholesale_in_allowlist_mode() {
    let text = r#"version = 1
default = "deny"
[[rules]]
tool = "bash"
decision = "allow"
reason = "trusted operator session"
[[rules]]
command = "rm -rf"
decision = "deny"
"#;
    let p = policy(text);
    let got = bash(&p, "ls; make");
    assert_eq!(got.decision, Decision::Allow, "{got:?}");
    assert_eq!(got.reason, "trusted operator session");
    assert_eq!(bash(&p, "rm -rf /").decision, Decision::Deny);
}

#[test]
fn strictest_rule_wins_regardless_of_order() {
    let text = r#"version = 1
[[rules]]
command = ["make"]
decision = "allow"
[[rules]]
command = ["make", "deploy"]
decision = "deny"
[[rules]]
command = ["make", "release"]
decision = "ask"
"#;
    let p = policy(text);
    assert_eq!(bash(&p, "make").decision, Decision::Allow);
    assert_eq!(bash(&p, "make deploy").decision, Decision::Deny);
    assert_eq!(bash(&p, "make release").decision, Decision::Ask);
    assert_eq!(bash(&p, "make release deploy").decision, Decision::Deny);
    let ask = bash(&p, "make release");
    assert_eq!(ask.rule.line, 8);
    let denied = ask.non_interactive();
    assert_eq!(denied.decision, Decision::Deny);
    assert!(
        denied.reason.contains("approval required"),
        "{}",
        denied.reason
    );
}

#[test]
fn paths_must_be_given_and_absolute() {
    let p = policy("version = 1\n");
    let args = json!({"path": "a"});
    let got = decide(&p, "read", &args, &[]);
    assert_eq!(got.decision, Decision::Deny);
    assert!(got.reason.contains("names no path"), "{got:?}");
    let got = decide(&p, "read", &args, &[access("relative/a", Op::Read)]);
    assert_eq!(got.decision, Decision::Deny);
    assert!(got.reason.contains("not absolute"), "{got:?}");
}

#[test]
fn omitted_sections_take_documented_defaults() {
    let p = policy("version = 1\n");
    assert_eq!(p.default_decision(), Decision::Allow);
    assert_eq!(p.enabled_tools().len(), 7);
    assert_eq!(
        call(&p, "write", &json!({"path": "x", "content": ""})).decision,
        Decision::Allow
    );
    let got = call(&p, "write", &json!({"path": ".git/config", "content": ""}));
    assert_eq!(got.decision, Decision::Deny);
    assert_eq!(got.rule.to_string(), "test.toml:0", "built-in default glob");
    assert_eq!(bash(&p, "anything goes").decision, Decision::Allow);
}

#[test]
fn unknown_home_makes_home_deny_globs_stricter() {
    let p = policy(
        "version = 1\n[filesystem]\nread = [\"**\", \"~/.cargo/**\"]\ndeny = [\"~/.ssh/**\"]\n",
    );
    let request = |path: &str| {
        let paths = [access(path, Op::Read)];
        p.decide(&cordon_policy::DecisionRequest {
            tool: "read",
            args: &json!({"path": path}),
            paths: &paths,
            root: std::path::Path::new("/ws"),
            home: None,
        })
    };
    assert_eq!(request("/ws/.ssh/known_hosts").decision, Decision::Deny);
    assert_eq!(
        request("/root/.cargo/env").decision,
        Decision::Deny,
        "allow globs need a home"
    );
    assert_eq!(request("/ws/src/a.rs").decision, Decision::Allow);
}
