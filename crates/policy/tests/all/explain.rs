//! `cordon policy explain` and `cordon policy check` output.

use std::path::Path;

use cordon_policy::explain::{
    ExplainCliRequest, ExplainError, Explanation, NetExplanation, check_policy_file, check_summary,
    explain_cli, explain_net,
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

const FILTERED: &str = "version = 1\n[network]\nallow = [\n  \"crates.io\",\n  \"*.crates.io\",\n  \
                        \"pypi.org:443\",\n  \"10.1.2.0/24:5432\",\n]\n\
                        deny = [\"evil.crates.io\"]\n";

fn net(text: &str, destination: &str) -> NetExplanation {
    let policy = CompiledPolicy::from_toml("p.toml", text, &EnvMap::new()).unwrap();
    explain_net(&policy, destination).unwrap()
}

#[test]
fn explain_net_names_the_deciding_entry() {
    let allowed = net(FILTERED, "static.crates.io");
    assert_eq!(
        allowed.to_text(),
        "decision: allow\nrule: \"*.crates.io\" (p.toml:5)\nreason: allow entry \"*.crates.io\" \
         (p.toml:5) matches static.crates.io:443\ndestination: static.crates.io:443\nnetwork: \
         filtered\nnote: the proxy resolves static.crates.io when a command connects; an address \
         in a loopback, private, link-local (cloud metadata) or other special range is refused \
         unless an IP/CIDR allow entry covers it (DNS-rebinding defence)\n"
    );
    // deny beats allow, and the fix names the deny line
    let denied = net(FILTERED, "Evil.Crates.IO.:443");
    assert_eq!(
        denied.to_json(),
        json!({
            "decision": "deny",
            "destination": "evil.crates.io:443",
            "network": "filtered",
            "entry": "evil.crates.io",
            "source": "p.toml:9",
            "reason": "deny entry \"evil.crates.io\" (p.toml:9) matches evil.crates.io:443, \
                       whatever the allow list says",
            "fix": "remove or narrow that deny entry in [network] deny (p.toml:9)",
            "note": null,
        })
    );
    // a port entry covers only its port; no entry: the entry to add
    let other_port = net(FILTERED, "pypi.org:80");
    assert_eq!(
        (
            other_port.decision.as_str(),
            other_port.entry,
            other_port.reason.as_str(),
            other_port.fix.as_deref()
        ),
        (
            "deny",
            None,
            "no entry allows pypi.org:80",
            Some("add \"pypi.org\" to [network] allow in p.toml")
        )
    );
    assert_eq!(
        net(FILTERED, "db.internal:5432").fix.as_deref(),
        Some("add \"db.internal:5432\" to [network] allow in p.toml")
    );
    assert!(
        net(FILTERED, "db.internal:5432")
            .to_text()
            .starts_with("decision: deny\nrule: no entry allows it\n")
    );
    // IP literals match IP/CIDR entries only; no name note for them
    let ip = net(FILTERED, "10.1.2.9:5432");
    assert_eq!(
        (ip.decision.as_str(), ip.entry.as_deref(), ip.note),
        ("allow", Some("10.1.2.0/24:5432"), None)
    );
    let v6 = net(FILTERED, "[2001:db8::1]:443");
    assert_eq!(
        (v6.destination.as_str(), v6.fix.as_deref()),
        (
            "[2001:db8::1]:443",
            Some("add \"[2001:db8::1]:443\" to [network] allow in p.toml")
        )
    );
    assert_eq!(
        net(FILTERED, "2001:db8::1").destination,
        "[2001:db8::1]:443"
    );
}

#[test]
fn explain_net_outside_filtered_mode_names_the_enabled_setting() {
    let off = net("version = 1\n[network]\nenabled = false\n", "crates.io");
    assert_eq!(
        (off.decision.as_str(), off.network, off.source.as_deref()),
        ("deny", "disabled", Some("p.toml:3"))
    );
    assert_eq!(
        off.fix.as_deref(),
        Some(
            "add \"crates.io\" to [network] allow in p.toml (filtered mode: commands then reach \
             only the listed destinations, through the egress proxy)"
        )
    );
    assert!(
        off.to_text()
            .starts_with("decision: deny\nrule: [network] enabled (p.toml:3)\n")
    );
    let on = net(
        "version = 1\n[network]\nenabled = true\n",
        "anything.test:22",
    );
    assert_eq!(
        (on.decision.as_str(), on.network, on.fix),
        ("allow", "enabled", None)
    );
    let default = net("version = 1\n", "crates.io");
    assert_eq!(
        default.source.as_deref(),
        Some("p.toml, not set there: the built-in default")
    );
}

#[test]
fn explain_net_rejects_bad_destinations_with_a_bounded_message() {
    let policy = CompiledPolicy::from_toml("p.toml", FILTERED, &EnvMap::new()).unwrap();
    for (destination, needle) in [
        ("", "nothing was given"),
        ("crates.io:0", "port \"0\" is not a number from 1 to 65535"),
        ("crates.io:http", "port \"http\" is not a number"),
        ("[2001:db8::1", "`[` without `]`"),
        ("[2001:db8::1]x", "unexpected \"x\" after `]`"),
        ("b@d.test", "character '@' is not allowed"),
    ] {
        let error = explain_net(&policy, destination).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("failed to parse destination {destination:?}: ")),
            "{error}"
        );
        assert!(error.contains(needle), "{error}");
    }
    let long = "a".repeat(100_000);
    let error = explain_net(&policy, &long).unwrap_err().to_string();
    assert!(
        error.contains("100000 bytes long, the limit is 300"),
        "{error}"
    );
    assert!(error.len() < 1000, "{}", error.len());
}

#[test]
fn explain_net_names_an_ask_entry_after_allow_and_deny() {
    let with_ask = format!("{FILTERED}ask = [\"*.github.com\", \"crates.io:8080\"]\n");
    let asked = net(&with_ask, "api.github.com");
    assert_eq!(
        asked.to_json(),
        json!({
            "decision": "ask",
            "destination": "api.github.com:443",
            "network": "filtered",
            "entry": "*.github.com",
            "source": "p.toml:10",
            "reason": "ask entry \"*.github.com\" (p.toml:10) matches api.github.com:443 and no \
                       allow or deny entry does: `cordon run` and the MCP server ask a person \
                       (once or for the rest of the session); everywhere else it is refused",
            "fix": "add \"api.github.com\" to [network] allow in p.toml to reach it without asking",
            "note": "the proxy resolves api.github.com when a command connects; an address in a \
                     loopback, private, link-local (cloud metadata) or other special range is \
                     refused unless an IP/CIDR allow entry covers it (DNS-rebinding defence)",
        })
    );
    // allow beats ask, deny beats both
    assert_eq!(net(&with_ask, "crates.io").decision.as_str(), "allow");
    assert_eq!(
        net(&with_ask, "crates.io:8080").entry.as_deref(),
        Some("crates.io:8080")
    );
    assert_eq!(net(&with_ask, "github.com").decision.as_str(), "deny");
    let policy = CompiledPolicy::from_toml("p.toml", &with_ask, &EnvMap::new()).unwrap();
    assert!(
        check_summary(&policy)
            .contains("network filtered: 4 allow, 1 deny and 2 ask entries, workspace"),
        "{}",
        check_summary(&policy)
    );
}

#[test]
fn check_summary_shows_filtered_mode() {
    let policy = CompiledPolicy::from_toml("p.toml", FILTERED, &EnvMap::new()).unwrap();
    let summary = check_summary(&policy);
    assert!(
        summary.contains("network filtered: 4 allow and 1 deny entries, workspace"),
        "{summary}"
    );
}
