//! The obfuscation set against a deny rule on `git push`: in allowlist mode every variant is
//! denied (by the rule or as unanalysable); in default-allow mode every variant is denied by
//! the rule or flagged.

use cordon_policy::Decision;

use crate::support::{bash, policy};

/// Scripts that all try to run `git push`.
const OBFUSCATIONS: &[&str] = &[
    r"g\it push",
    r#""git" push"#,
    "$(echo git) push",
    "`which git` push",
    "bash -c 'git push'",
    r#"sh -c "cd x && git push""#,
    "eval git push",
    "env git push",
    "command git push",
    "/usr/bin/git push",
    "echo | xargs git push",
    "sudo git push",
    "git push;",
    "true && git push",
    "(git push)",
    "a=git; $a push",
    // A few more of the same family.
    "$'\\x67it' push",
    "git -C . push",
    "exec git push",
    "timeout 5 nice -n 1 git push",
    "echo push | xargs git",
    "find . -maxdepth 0 -exec git push \\;",
    "bash -c \"bash -c 'git push'\"",
    "eval \"$(printf 'git push')\"",
    "g{i,}t push",
    "gi? push",
    "x() { git push; }; x",
    "if true; then git push; fi",
    "cat <<EOF | bash\ngit push\nEOF\n",
    "PATH=/tmp/evil git status",
];

const ALLOWLIST: &str = r#"version = 1
default = "deny"

[[rules]]
command = ["git", "status"]
decision = "allow"

[[rules]]
command = ["cargo", "test"]
decision = "allow"

[[rules]]
command = ["git", "push"]
decision = "deny"
reason = "pushing is done by CI"
"#;

const BLOCKLIST: &str = r#"version = 1
default = "allow"

[[rules]]
command = ["git", "push"]
decision = "deny"
reason = "pushing is done by CI"
"#;

#[test]
fn allowlist_mode_denies_every_variant() {
    let p = policy(ALLOWLIST);
    for script in OBFUSCATIONS {
        let got = bash(&p, script);
        assert_eq!(
            got.decision,
            Decision::Deny,
            "{script:?} was not denied: {got:?}"
        );
    }
    // And the allowed commands still pass.
    assert_eq!(
        bash(&p, "git status && cargo test").decision,
        Decision::Allow
    );
}

#[test]
fn blocklist_mode_denies_by_rule_or_flags_every_variant() {
    let p = policy(BLOCKLIST);
    let mut by_rule = 0;
    for script in OBFUSCATIONS {
        let got = bash(&p, script);
        match got.decision {
            Decision::Deny => {
                assert_eq!(got.rule.line, 4, "{script:?}: denied by the git push rule");
                assert!(
                    got.reason.contains("pushing is done by CI"),
                    "{script:?}: {got:?}"
                );
                by_rule += 1;
            }
            Decision::Allow => assert!(
                got.unanalysable.is_some(),
                "{script:?} was allowed without a flag: {got:?}"
            ),
            Decision::Ask => panic!("{script:?}: unexpected ask {got:?}"),
        }
    }
    // Only the variants whose command name is computed at run time (or that run code the
    // analyser cannot see) get away with a flag; the rest hit the rule.
    assert!(
        by_rule >= 20,
        "only {by_rule} variants were denied by the rule"
    );
}

#[test]
fn the_variants_with_literal_commands_are_denied_by_the_rule_in_both_modes() {
    let literal = [
        r"g\it push",
        r#""git" push"#,
        "bash -c 'git push'",
        r#"sh -c "cd x && git push""#,
        "eval git push",
        "env git push",
        "command git push",
        "/usr/bin/git push",
        "echo | xargs git push",
        "sudo git push",
        "git push;",
        "true && git push",
        "(git push)",
    ];
    for text in [ALLOWLIST, BLOCKLIST] {
        let p = policy(text);
        for script in literal {
            let got = bash(&p, script);
            assert_eq!(got.decision, Decision::Deny, "{script:?}: {got:?}");
            assert!(
                got.reason.contains("pushing is done by CI"),
                "{script:?}: {got:?}"
            );
        }
    }
}

#[test]
fn unanalysable_scripts_are_flagged_with_a_reason() {
    let p = policy(BLOCKLIST);
    let got = bash(&p, "a=git; $a push");
    assert_eq!(got.decision, Decision::Allow);
    let flag = got.unanalysable.expect("flagged");
    assert!(flag.contains("`$a`"), "{flag}");
    let got = bash(&p, "echo push | xargs git");
    assert!(
        got.unanalysable
            .expect("flagged")
            .contains("may match the deny rule `git push`")
    );
    // Operators can make unanalysable scripts fail closed in default-allow mode.
    let strict = policy(&format!("{BLOCKLIST}\n[bash]\nunanalysable = \"deny\"\n"));
    let got = bash(&strict, "a=git; $a push");
    assert_eq!(got.decision, Decision::Deny);
    assert!(got.reason.contains("cannot be fully checked"), "{got:?}");
    assert_eq!(got.rule.line, 10);
}
