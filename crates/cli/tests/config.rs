//! End-to-end tests of configuration: built-in policies (`builtin:NAME`), policy and config
//! discovery, `policy init/show`, `--json` on `doctor`/`policy check`/`audit verify`,
//! completions and `--color`. Each run gets its own HOME and XDG_CONFIG_HOME (and no
//! CORDON_POLICY/NO_COLOR from the caller), so the user-level files it sees are the test's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_cordon");

/// What a finished `cordon` run printed.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    #[track_caller]
    fn assert_ok(&self) -> &Run {
        assert_eq!(self.code, 0, "{self:#?}");
        self
    }

    /// Exit 2, nothing on stdout, one line on stderr containing `needle`.
    #[track_caller]
    fn assert_usage_error(&self, needle: &str) {
        assert_eq!(self.code, 2, "{self:#?}");
        assert_eq!(self.stdout, "", "{self:#?}");
        assert_eq!(self.stderr.lines().count(), 1, "{self:#?}");
        assert!(self.stderr.starts_with("cordon: "), "{self:#?}");
        assert!(self.stderr.contains(needle), "{needle:?} not in {self:#?}");
    }
}

/// A workspace (the project) and a home directory of its own.
struct Env {
    base: tempfile::TempDir,
    /// Extra environment variables for every run.
    vars: Vec<(String, String)>,
}

impl Env {
    fn new() -> Env {
        let base = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(base.path().join("ws")).unwrap();
        std::fs::create_dir_all(base.path().join("home")).unwrap();
        Env {
            base,
            vars: Vec::new(),
        }
    }

    /// The workspace (canonical).
    fn ws(&self) -> PathBuf {
        self.base.path().join("ws").canonicalize().unwrap()
    }

    fn home(&self) -> PathBuf {
        self.base.path().join("home").canonicalize().unwrap()
    }

    /// `cordon ARGS` in the workspace.
    fn run(&self, args: &[&str]) -> Run {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .current_dir(self.ws())
            .env("HOME", self.home())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CORDON_POLICY")
            .env_remove("NO_COLOR")
            .env_remove("CLICOLOR_FORCE")
            .stdin(Stdio::null());
        for (name, value) in &self.vars {
            command.env(name, value);
        }
        let output = command.output().expect("failed to run cordon");
        Run {
            code: output.status.code().expect("exited by itself"),
            stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
            stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
        }
    }
}

/// The shipped policy files' names (without `.toml`).
fn shipped_policies() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".toml").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_shipped_policy_is_built_in_with_and_without_the_toml_suffix() {
    let env = Env::new();
    let names = shipped_policies();
    assert!(names.len() >= 4, "{names:?}");
    for name in &names {
        for spelled in [format!("builtin:{name}"), format!("builtin:{name}.toml")] {
            let check = env.run(&["policy", "check", &spelled]);
            check.assert_ok();
            assert!(
                check
                    .stdout
                    .starts_with(&format!("builtin:{name}.toml: ok (")),
                "{check:#?}"
            );
        }
    }
}

#[test]
fn policy_explain_accepts_a_builtin_and_cites_its_line() {
    let env = Env::new();
    let args = r#"{"path":".git/config","content":"x"}"#;
    for spelled in ["builtin:default.toml", "builtin:default"] {
        let explain = env.run(&["policy", "explain", spelled, "write", args]);
        explain.assert_ok();
        assert!(
            explain
                .stdout
                .starts_with("decision: deny\nrule: builtin:default.toml:"),
            "{explain:#?}"
        );
    }
}

#[test]
fn an_unknown_builtin_is_a_usage_error_listing_the_known_ones() {
    let env = Env::new();
    let known = shipped_policies()
        .iter()
        .map(|name| format!("builtin:{name}"))
        .collect::<Vec<_>>()
        .join(", ");
    let needle = format!(
        "failed to find the built-in policy builtin:nope: the built-in policies are {known}"
    );
    env.run(&["policy", "check", "builtin:nope"])
        .assert_usage_error(&needle);
    env.run(&["policy", "explain", "builtin:nope", "ls", "{}"])
        .assert_usage_error(&needle);
    let ws = env.ws();
    let ws = ws.to_str().unwrap();
    env.run(&["exec", "ls", "{}", "--policy", "builtin:nope", "--root", ws])
        .assert_usage_error(&needle);
}

#[test]
fn exec_under_a_builtin_policy_cites_it_in_the_denial() {
    let env = Env::new();
    let ws = env.ws();
    let ws = ws.to_str().unwrap();
    let denied = env.run(&[
        "exec",
        "bash",
        r#"{"command":"curl https://example.com"}"#,
        "--policy",
        "builtin:ci-untrusted",
        "--root",
        ws,
    ]);
    assert_eq!(denied.code, 1, "{denied:#?}");
    assert!(
        denied
            .stdout
            .starts_with("Blocked by policy (builtin:ci-untrusted.toml:"),
        "{denied:#?}"
    );
    // The same call under the default policy is not refused by a rule.
    let allowed = env.run(&[
        "policy",
        "explain",
        "builtin:default",
        "bash",
        r#"{"command":"curl https://example.com"}"#,
    ]);
    allowed.assert_ok();
    assert!(
        !allowed.stdout.starts_with("decision: deny"),
        "{allowed:#?}"
    );
}
