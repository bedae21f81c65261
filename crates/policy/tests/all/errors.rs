//! Bad policy files produce errors that name the file, line and column.

use cordon_policy::{CompiledPolicy, EnvMap, PolicyError};

fn error(text: &str) -> PolicyError {
    match CompiledPolicy::from_toml("bad.toml", text, &EnvMap::new()) {
        Ok(_) => panic!("policy should not compile:\n{text}"),
        Err(error) => error,
    }
}

/// Assert the error's kind, position and that its text carries `FILE:LINE:COL:` and `needle`.
fn check(text: &str, kind: &str, line: usize, column: usize, needle: &str) {
    let error = error(text);
    let shown = error.to_string();
    let actual_kind = match &error {
        PolicyError::Read { .. } => "read",
        PolicyError::UnknownBuiltin(_) => "unknown builtin",
        PolicyError::Syntax { .. } => "syntax",
        PolicyError::UnknownKey { .. } => "unknown key",
        PolicyError::MissingKey { .. } => "missing key",
        PolicyError::WrongType { .. } => "wrong type",
        PolicyError::BadGlob { .. } => "bad glob",
        PolicyError::BadRegex { .. } => "bad regex",
        PolicyError::BadValue { .. } => "bad value",
    };
    assert_eq!(actual_kind, kind, "{shown}");
    assert_eq!(error.position(), Some((line, column)), "{shown}");
    let prefix = format!("bad.toml:{line}:{column}: ");
    assert!(
        shown.starts_with(&prefix),
        "{shown:?} should start with {prefix:?}"
    );
    assert!(
        shown.contains(needle),
        "{shown:?} should contain {needle:?}"
    );
}

#[test]
fn syntax_errors() {
    check(
        "version = 1\ndefault = \"allow\n",
        "syntax",
        2,
        17,
        "failed to parse TOML",
    );
    check(
        "version = 1\n[tools\n",
        "syntax",
        2,
        7,
        "failed to parse TOML",
    );
    check(
        "version = 1\nversion = 2\n",
        "syntax",
        2,
        1,
        "failed to parse TOML",
    );
}

#[test]
fn unknown_keys() {
    check(
        "version = 1\ndefualt = \"deny\"\n",
        "unknown key",
        2,
        1,
        "defualt",
    );
    check(
        "version = 1\n[filesystem]\nread = []\nwrites = []\n",
        "unknown key",
        4,
        1,
        "writes",
    );
    check(
        "version = 1\n\n[[rules]]\ncommand = \"git push\"\ndecision = \"deny\"\nreson = \"typo\"\n",
        "unknown key",
        6,
        1,
        "reson",
    );
    check(
        "version = 1\n[network]\nallowed = [\"crates.io:443\"]\n",
        "unknown key",
        3,
        1,
        "unknown field `allowed`, expected one of `enabled`, `allow`, `deny`, `ask`, `unix_sockets`",
    );
}

#[test]
fn missing_keys() {
    check("default = \"allow\"\n", "missing key", 1, 1, "version");
    check(
        "version = 1\n[[rules]]\ncommand = \"ls\"\n",
        "missing key",
        2,
        1,
        "decision",
    );
}

#[test]
fn wrong_types() {
    check(
        "version = 1\n[tools]\nenabled = \"read\"\n",
        "wrong type",
        3,
        11,
        "sequence",
    );
    check(
        "version = 1\n[network]\nenabled = \"no\"\n",
        "wrong type",
        3,
        11,
        "bool",
    );
    check(
        "version = 1\n[limits]\ntimeout = \"soon\"\n",
        "wrong type",
        3,
        11,
        "number",
    );
    check("version = \"1\"\n", "wrong type", 1, 11, "i64");
    check(
        "version = 1\n[filesystem]\nread = [\"**\", 3]\n",
        "wrong type",
        3,
        15,
        "string",
    );
}

#[test]
fn bad_globs() {
    check(
        "version = 1\n[filesystem]\nread = [\"src/[\"]\n",
        "bad glob",
        3,
        9,
        "src/[",
    );
    check(
        "version = 1\n[filesystem]\ndeny = [\"../x\"]\n",
        "bad glob",
        3,
        9,
        "..",
    );
    check(
        "version = 1\n[filesystem]\nwrite = [\"~bob/x\"]\n",
        "bad glob",
        3,
        10,
        "~bob/x",
    );
    check(
        "version = 1\n[[rules]]\ntool = \"write\"\npath = \"a/{b\"\ndecision = \"deny\"\n",
        "bad glob",
        4,
        8,
        "a/{b",
    );
}

#[test]
fn bad_regexes() {
    check(
        "version = 1\n[redact]\npatterns = [\"ok\", \"(unclosed\"]\n",
        "bad regex",
        3,
        19,
        "(unclosed",
    );
    check(
        "version = 1\n[redact]\npatterns = [\"x*\"]\n",
        "bad regex",
        3,
        13,
        "empty string",
    );
}

#[test]
fn bad_unix_sockets() {
    let on = "version = 1\n[network]\nenabled = true\n";
    for (entry, column, needle) in [
        ("\"@dbus\"", 17, "abstract sockets cannot be allowed"),
        ("\"run/x.sock\"", 17, "absolute path or start with `~/`"),
        ("\"/run/../x.sock\"", 17, "`.` or `..`"),
        ("\"/run/*.sock\"", 17, "no glob characters"),
        ("\"/ok.sock\", \"/a\\u0000b\"", 29, "without NUL bytes"),
    ] {
        check(
            &format!("{on}unix_sockets = [{entry}]\n"),
            "bad value",
            4,
            column,
            needle,
        );
    }
    let many: Vec<String> = (0..65).map(|i| format!("\"/s{i}\"")).collect();
    check(
        &format!("{on}unix_sockets = [{}]\n", many.join(", ")),
        "bad value",
        4,
        16,
        "at most 64",
    );
    check(
        "version = 1\n[network]\nunix_sockets = [\"/run/x.sock\"]\n",
        "bad value",
        3,
        16,
        "needs `enabled = true` or an `allow` list",
    );
}

#[test]
fn network_allow_and_deny_errors_name_the_line_and_the_fix() {
    // allow with the whole network on: both lines named
    check(
        "version = 1\n[network]\nenabled = true\nallow = [\"crates.io\"]\n",
        "bad value",
        4,
        9,
        "but `enabled = true` (line 3) turns the whole network on; remove `enabled = true` for \
         filtered access through the egress proxy, or remove `allow` for unfiltered access",
    );
    // deny alone narrows nothing, whatever `enabled` says
    for enabled in ["", "enabled = true\n", "enabled = false\n"] {
        check(
            &format!("version = 1\n[network]\n{enabled}deny = [\"evil.test\"]\n"),
            "bad value",
            if enabled.is_empty() { 3 } else { 4 },
            8,
            "`deny` only narrows an `allow` list",
        );
    }
    check(
        "version = 1\n[network]\nallow = []\ndeny = [\"evil.test\"]\n",
        "bad value",
        4,
        8,
        "`deny` only narrows an `allow` list",
    );
    // ask alone adds to nothing, whatever `enabled` says
    for enabled in ["", "enabled = true\n", "enabled = false\n"] {
        check(
            &format!("version = 1\n[network]\n{enabled}ask = [\"*.github.com\"]\n"),
            "bad value",
            if enabled.is_empty() { 3 } else { 4 },
            7,
            "`ask` adds destinations a person may approve to an `allow` list",
        );
    }
    check(
        "version = 1\n[network]\nallow = [\"a.test\"]\nask = [\"B.test\"]\n",
        "bad value",
        4,
        8,
        "network ask entry \"B.test\": names are written in lowercase",
    );
    // every entry is parsed as the proxy parses it; the error names the entry and the problem
    for (entry, column, needle) in [
        ("\"\"", 10, "network allow entry \"\": the entry is empty"),
        (
            "\"Crates.io\"",
            10,
            "names are written in lowercase: write \"crates.io\"",
        ),
        ("\"*\"", 10, "a bare `*` would match every name"),
        (
            "\"a.*.io\"",
            10,
            "a `*` is only allowed as the whole leftmost label",
        ),
        (
            "\"pypi.org:0\"",
            10,
            "port \"0\" is not a number from 1 to 65535",
        ),
        (
            "\"10.1.2.5/24\"",
            10,
            "the address has bits set beyond its prefix: write \"10.1.2.0/24\"",
        ),
        (
            "\"ok.test\", \"b@d.test\"",
            21,
            "character '@' is not allowed in a name",
        ),
    ] {
        check(
            &format!("version = 1\n[network]\nallow = [\n  {entry}]\n"),
            "bad value",
            4,
            column - 7,
            needle,
        );
    }
    check(
        "version = 1\n[network]\nallow = [\"ok.test\"]\ndeny = [\"x..test\"]\n",
        "bad value",
        4,
        9,
        "network deny entry \"x..test\": the name has an empty label",
    );
    let long = format!("\"{}.test\"", "a".repeat(400));
    check(
        &format!("version = 1\n[network]\nallow = [{long}]\n"),
        "bad value",
        3,
        10,
        "the entry is 405 bytes long, the limit is 300",
    );
    let many: Vec<String> = (0..4097).map(|i| format!("\"h{i}.test\"")).collect();
    check(
        &format!("version = 1\n[network]\nallow = [{}]\n", many.join(", ")),
        "bad value",
        3,
        9,
        "`allow` has 4097 entries, the limit is 4096",
    );
    // unix_sockets are accepted with an allow list
    crate::support::policy(
        "version = 1\n[network]\nallow = [\"crates.io\"]\nunix_sockets = [\"/run/x.sock\"]\n",
    );
}

#[test]
fn bad_values() {
    check(
        "version = 2\n",
        "bad value",
        1,
        11,
        "unsupported policy version 2",
    );
    check(
        "version = 1\ndefault = \"maybe\"\n",
        "bad value",
        2,
        11,
        "\"allow\" or \"deny\"",
    );
    check(
        "version = 1\n[tools]\nenabled = [\"read\", \"rea\"]\n",
        "bad value",
        3,
        20,
        "unknown tool `rea`",
    );
    check(
        "version = 1\n[limits]\ntimeout = 100\nmax_timeout = 10\n",
        "bad value",
        4,
        15,
        "below `timeout`",
    );
    check(
        "version = 1\n[limits]\ntimeout = 0\n",
        "bad value",
        3,
        11,
        "positive",
    );
    check(
        "version = 1\n[limits]\nmemory = \"2 parsecs\"\n",
        "bad value",
        3,
        10,
        "2GiB",
    );
    check(
        "version = 1\n[limits]\npids = -1\n",
        "bad value",
        3,
        8,
        "non-negative",
    );
    check(
        "version = 1\n[limits]\npids = 0\n",
        "bad value",
        3,
        8,
        "above zero",
    );
    check(
        "version = 1\n[[rules]]\ncommand = \"ls\"\ndecision = \"block\"\n",
        "bad value",
        4,
        12,
        "\"allow\", \"ask\" or \"deny\"",
    );
    check(
        "version = 1\n[[rules]]\ntool = \"read\"\ncommand = \"ls\"\ndecision = \"deny\"\n",
        "bad value",
        3,
        8,
        "bash tool only",
    );
    check(
        "version = 1\n[[rules]]\ntool = \"bash\"\npath = \"x\"\ndecision = \"deny\"\n",
        "bad value",
        3,
        8,
        "file tools",
    );
    check(
        "version = 1\n[[rules]]\ndecision = \"deny\"\n",
        "bad value",
        2,
        1,
        "needs `tool`, `command` or `path`",
    );
    check(
        "version = 1\n[[rules]]\ncommand = \"/usr/bin/git push\"\ndecision = \"deny\"\n",
        "bad value",
        3,
        11,
        "matched by name",
    );
    check(
        "version = 1\n[[rules]]\ncommand = \"git push\"\ndecision = \"deny\"\nmatch = [\"git status\"]\n",
        "bad value",
        5,
        10,
        "does not match",
    );
    check(
        "version = 1\n[[rules]]\ncommand = \"git push\"\ndecision = \"deny\"\nnot_match = [\"sudo git push\"]\n",
        "bad value",
        5,
        14,
        "matches",
    );
    check(
        "version = 1\n[bash]\nunanalysable = \"flag\"\n",
        "bad value",
        3,
        16,
        "unanalysable",
    );
    check(
        "version = 1\n[redact]\nenv = [\"NOT-A-NAME\"]\n",
        "bad value",
        3,
        8,
        "NOT-A-NAME",
    );
}

#[test]
fn unreadable_file() {
    let error = CompiledPolicy::load(std::path::Path::new("/nonexistent/p.toml"), &EnvMap::new())
        .unwrap_err();
    assert!(matches!(error, PolicyError::Read { .. }));
    assert_eq!(error.position(), None);
    assert!(
        error
            .to_string()
            .starts_with("/nonexistent/p.toml: failed to read policy file:"),
        "{error}"
    );
}

#[test]
fn load_errors_name_the_path_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.toml");
    std::fs::write(&path, "version = 1\n\n[limits]\ncpus = -2\n").unwrap();
    let error = CompiledPolicy::load(&path, &EnvMap::new()).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}:4:8: bad value: `cpus` must be a positive number, found -2",
            path.display()
        )
    );
}

#[test]
fn nested_git_accepts_only_quarantine_or_allow() {
    check(
        "version = 1\n[filesystem]\nnested_git = \"sometimes\"\n",
        "bad value",
        3,
        14,
        "`filesystem.nested_git` must be \"quarantine\" or \"allow\", found \"sometimes\"",
    );
}

#[test]
fn oversized_globs_and_patterns_are_refused_when_the_policy_loads() {
    let glob = "a".repeat(5000);
    check(
        &format!("version = 1\n[filesystem]\nread = [\"{glob}\"]\n"),
        "bad glob",
        3,
        9,
        "longer than 4096 bytes",
    );
    let pattern = "a".repeat(5000);
    check(
        &format!("version = 1\n[redact]\npatterns = [\"{pattern}\"]\n"),
        "bad regex",
        3,
        13,
        "longer than 4096 bytes",
    );
    // Short to write, huge to compile.
    check(
        "version = 1\n[redact]\npatterns = [\"\\\\w{1000}{1000}\"]\n",
        "bad regex",
        3,
        13,
        "size limit",
    );
}

#[test]
fn pathological_match_examples_are_judged_within_the_budget() {
    // Exponential for the parser without a budget (minutes); bounded here.
    let example = format!("git push {}", "{a,".repeat(16));
    let text = format!(
        "version = 1\n[[rules]]\ncommand = [\"git\", \"push\"]\ndecision = \"deny\"\nmatch = [\"{example}\"]\n"
    );
    let policy = cordon_policy::CompiledPolicy::from_toml("p.toml", &text, &Default::default())
        .expect("the example's `git push` is found before the budget runs out");
    let decision = crate::support::bash(&policy, &example);
    assert_eq!(decision.decision, cordon_policy::Decision::Deny);
    assert!(
        decision
            .unanalysable
            .as_deref()
            .is_some_and(|flag| flag.contains("too complex")),
        "{decision:?}"
    );
}
