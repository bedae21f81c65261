//! End-to-end tests of configuration: built-in policies (`builtin:NAME`), policy and config
//! discovery, `policy init/show`, `--json` on `doctor`/`policy check`/`audit verify`,
//! completions and `--color`. Each run gets its own HOME and XDG_CONFIG_HOME (and no
//! CORDON_POLICY/NO_COLOR from the caller), so the user-level files it sees are the test's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

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

impl Run {
    /// stdout as one JSON line (and nothing else).
    #[track_caller]
    fn json(&self) -> Value {
        assert_eq!(self.stdout.lines().count(), 1, "one line: {self:#?}");
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("stdout is not JSON ({error}): {self:#?}"))
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

    /// Write `rel` (relative to the base directory: `ws/…`, `home/…`), creating parents.
    fn put(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.base.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path.canonicalize().unwrap()
    }

    fn set(&mut self, name: &str, value: impl AsRef<str>) {
        self.vars.retain(|(existing, _)| existing != name);
        self.vars.push((name.to_owned(), value.as_ref().to_owned()));
    }

    /// `cordon exec ls {} --root WS` plus `extra`.
    fn exec_ls(&self, extra: &[&str]) -> Run {
        let ws = self.ws();
        let mut args = vec!["exec", "ls", "{}", "--root", ws.to_str().unwrap()];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// `cordon doctor --root WS` plus `extra`, lines starting `config: `.
    fn doctor_config(&self, extra: &[&str]) -> (Run, Vec<String>) {
        let ws = self.ws();
        let mut args = vec!["doctor", "--root", ws.to_str().unwrap()];
        args.extend_from_slice(extra);
        let run = self.run(&args);
        let lines = run
            .stdout
            .lines()
            .filter(|line| line.starts_with("config: "))
            .map(str::to_owned)
            .collect();
        (run, lines)
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

/// A policy whose only rule (at line 4) denies `ls`, with `who` as the reason.
fn deny_ls(who: &str) -> String {
    format!(
        "version = 1\n\n# the rule\n[[rules]]\ntool = \"ls\"\ndecision = \"deny\"\nreason = \"{who}\"\n"
    )
}

/// `exec ls` was refused by the `deny_ls` policy at `file`.
#[track_caller]
fn assert_denied_by(run: &Run, file: &Path) {
    assert_eq!(run.code, 1, "{run:#?}");
    let expected = format!("Blocked by policy ({}:4)", file.display());
    assert!(
        run.stdout.starts_with(&expected),
        "{expected:?} in {run:#?}"
    );
}

#[test]
fn policy_discovery_order_is_flag_env_project_user_builtin() {
    let mut env = Env::new();
    env.put("ws/a.txt", "a");
    // Nothing anywhere: the built-in default, which lets `ls` run.
    let run = env.exec_ls(&[]);
    run.assert_ok();
    assert_eq!(run.stdout, "a.txt\n");
    let home_user = env.put("home/.config/cordon/policy.toml", &deny_ls("home"));
    assert_denied_by(&env.exec_ls(&[]), &home_user);
    // XDG_CONFIG_HOME, when set, is where the user's file is.
    let xdg_user = env.put("xdg/cordon/policy.toml", &deny_ls("xdg"));
    env.set(
        "XDG_CONFIG_HOME",
        env.base.path().join("xdg").to_str().unwrap(),
    );
    assert_denied_by(&env.exec_ls(&[]), &xdg_user);
    let project = env.put("ws/.cordon/policy.toml", &deny_ls("project"));
    assert_denied_by(&env.exec_ls(&[]), &project);
    let from_env = env.put("env.toml", &deny_ls("env"));
    env.set("CORDON_POLICY", from_env.to_str().unwrap());
    assert_denied_by(&env.exec_ls(&[]), &from_env);
    let flag = env.put("flag.toml", &deny_ls("flag"));
    assert_denied_by(&env.exec_ls(&["--policy", flag.to_str().unwrap()]), &flag);
    // A built-in named by the flag or the variable beats every file.
    let run = env.exec_ls(&["--policy", "builtin:default"]);
    run.assert_ok();
    env.set("CORDON_POLICY", "builtin:readonly.toml");
    env.exec_ls(&[]).assert_ok();

    let (run, lines) = env.doctor_config(&[]);
    assert_eq!(run.code, 0, "{run:#?}");
    let expected = [
        "config: policy candidate --policy: info (not set)".to_owned(),
        "config: policy candidate CORDON_POLICY: info (builtin:readonly.toml: chosen)".to_owned(),
        format!(
            "config: policy candidate project: info ({}: present, overridden by an earlier candidate)",
            project.display()
        ),
        format!(
            "config: policy candidate user: info ({}: present, overridden by an earlier candidate)",
            xdg_user.display()
        ),
        "config: policy candidate builtin: info (builtin:default.toml: present, overridden by an \
         earlier candidate)"
            .to_owned(),
    ];
    assert_eq!(lines[..5], expected, "{run:#?}");
    assert!(
        lines[5].starts_with("config: policy: ok (builtin:readonly.toml, from CORDON_POLICY ("),
        "{run:#?}"
    );
}

#[test]
fn doctor_names_each_absent_candidate_and_the_builtin_default() {
    let env = Env::new();
    let (run, lines) = env.doctor_config(&[]);
    assert_eq!(run.code, 0, "{run:#?}");
    let ws = env.ws();
    let home = env.home();
    let expected = [
        "config: policy candidate --policy: info (not set)".to_owned(),
        "config: policy candidate CORDON_POLICY: info (not set)".to_owned(),
        format!(
            "config: policy candidate project: info ({}/.cordon/policy.toml: absent)",
            ws.display()
        ),
        format!(
            "config: policy candidate user: info ({}/.config/cordon/policy.toml: absent)",
            home.display()
        ),
        "config: policy candidate builtin: info (builtin:default.toml: chosen)".to_owned(),
    ];
    assert_eq!(lines[..5], expected, "{run:#?}");
    assert!(
        lines[5].starts_with("config: policy: ok (builtin:default.toml, from builtin ("),
        "{run:#?}"
    );
    assert_eq!(
        lines[6..],
        [
            format!(
                "config: config file project: info ({}/.cordon/config.toml: absent)",
                ws.display()
            ),
            format!(
                "config: config file user: info ({}/.config/cordon/config.toml: absent)",
                home.display()
            ),
            "config: backend: info (not set)".to_owned(),
            "config: image: info (not set)".to_owned(),
            "config: workspace_mode: info (not set)".to_owned(),
            "config: host: info (not set)".to_owned(),
            "config: remote_root: info (not set)".to_owned(),
        ],
        "{run:#?}"
    );
}

#[test]
fn a_broken_discovered_policy_fails_doctor_with_its_line() {
    let env = Env::new();
    let project = env.put("ws/.cordon/policy.toml", "version = 1\nbogus = 1\n");
    let (run, lines) = env.doctor_config(&[]);
    assert_eq!(run.code, 1, "{run:#?}");
    let line = lines
        .iter()
        .find(|line| line.starts_with("config: policy: "))
        .unwrap();
    assert!(
        line.starts_with(&format!(
            "config: policy: missing ({}:2:1: unknown key",
            project.display()
        )),
        "{line}"
    );
    let run = env.exec_ls(&[]);
    run.assert_usage_error(&format!("{}:2:1: unknown key", project.display()));
}

#[test]
fn project_files_that_are_symlinks_or_fifos_are_refused_not_skipped() {
    for name in ["policy.toml", "config.toml"] {
        let env = Env::new();
        let target = env.put("elsewhere.toml", "version = 1\n");
        std::fs::create_dir_all(env.ws().join(".cordon")).unwrap();
        let path = env.ws().join(".cordon").join(name);
        std::os::unix::fs::symlink(&target, &path).unwrap();
        env.exec_ls(&[]).assert_usage_error(&format!(
            "failed to open {}: it is a symbolic link, which Cordon does not follow",
            path.display()
        ));
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Opening does not block on the FIFO (nobody writes it): the run ends with the error.
        env.exec_ls(&[]).assert_usage_error(&format!(
            "failed to open {}: it is a FIFO, not a regular file",
            path.display()
        ));
    }
}

/// A linked `.cordon` is refused as a whole: what it points at is an ordinary directory a
/// session could write, so a policy found through it could be the model's.
#[test]
fn a_project_cordon_dir_that_is_a_symlink_is_refused() {
    let env = Env::new();
    env.put("ws/x/policy.toml", "version = 1\ndefault = \"allow\"\n");
    let link = env.ws().join(".cordon");
    std::os::unix::fs::symlink("x", &link).unwrap();
    env.exec_ls(&[]).assert_usage_error(&format!(
        "failed to use {}: it is a symlink, and Cordon reads a project's policy and defaults only from a real .cordon directory",
        link.display()
    ));
}

#[test]
fn an_oversized_config_file_is_an_error() {
    let env = Env::new();
    let path = env.put("ws/.cordon/config.toml", &"# x\n".repeat(20_000));
    env.exec_ls(&[]).assert_usage_error(&format!(
        "failed to read {}: it is larger than 65536 bytes",
        path.display()
    ));
}

#[test]
fn config_files_set_defaults_and_flags_env_and_the_project_beat_them() {
    let mut env = Env::new();
    let user = env.put(
        "home/.config/cordon/config.toml",
        "# mine\nbackend = \"ssh\"\nimage = \"user:1\"\n",
    );
    // The user's file selects ssh, which needs a host: the run says so.
    env.exec_ls(&[])
        .assert_usage_error("--backend ssh needs --host");
    let (_, lines) = env.doctor_config(&["--backend", "local"]);
    assert!(
        lines.contains(&"config: backend: info (local, from --backend)".to_owned()),
        "{lines:#?}"
    );
    assert!(
        lines.contains(&format!(
            "config: image: info (user:1, from {}:3)",
            user.display()
        )),
        "{lines:#?}"
    );
    // The flag beats the file.
    env.exec_ls(&["--backend", "local"]).assert_ok();
    // So does the environment.
    env.set("CORDON_BACKEND", "local");
    env.exec_ls(&[]).assert_ok();
    env.vars.clear();
    // The project's file beats the user's.
    let project = env.put("ws/.cordon/config.toml", "\nbackend = \"local\"\n");
    env.exec_ls(&[]).assert_ok();
    let (run, lines) = env.doctor_config(&[]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(
        lines.contains(&format!(
            "config: backend: info (local, from {}:2)",
            project.display()
        )),
        "{lines:#?}"
    );
    assert!(
        run.stdout
            .lines()
            .any(|line| line == "docker: image: info (user:1)"),
        "{run:#?}"
    );
}

#[test]
fn unknown_keys_and_bad_values_in_config_files_name_file_and_line() {
    let mut env = Env::new();
    let path = env.put(
        "ws/.cordon/config.toml",
        "image = \"x\"\nbakend = \"ssh\"\n",
    );
    env.exec_ls(&[]).assert_usage_error(&format!(
        "{}:2: failed to parse the config file: unknown field `bakend`",
        path.display()
    ));
    let path = env.put("ws/.cordon/config.toml", "\nbackend = \"dockr\"\n");
    env.exec_ls(&[]).assert_usage_error(&format!(
        "failed to use backend = \"dockr\" from {}:2: expected one of local, docker, ssh",
        path.display()
    ));
    std::fs::remove_file(&path).unwrap();
    env.set("CORDON_WORKSPACE_MODE", "mount");
    env.exec_ls(&[]).assert_usage_error(
        "failed to use workspace_mode = \"mount\" from CORDON_WORKSPACE_MODE: expected one of bind, copy",
    );
}

#[test]
fn policy_check_json_gives_the_summary_or_the_error_position() {
    let env = Env::new();
    let run = env.run(&["policy", "check", "builtin:ci-untrusted", "--json"]);
    run.assert_ok();
    let value = run.json();
    assert_eq!(value["ok"], true);
    assert_eq!(value["file"], "builtin:ci-untrusted.toml");
    assert_eq!(value["default"], "deny");
    assert_eq!(value["network"], "disabled");
    assert_eq!(value["workspace"], "read-write");
    assert!(value["rules"].as_u64().unwrap() > 0, "{value}");
    assert_eq!(
        value["tools"],
        json!(["read", "edit", "write", "bash", "grep", "find", "ls"])
    );
    assert!(value["notes"].is_array());
    let bad = env.put("bad.toml", "version = 1\n\n  bogus = 1\n");
    let run = env.run(&["policy", "check", bad.to_str().unwrap(), "--json"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:#?}");
    let value = run.json();
    assert_eq!(value["ok"], false);
    assert_eq!(value["file"], bad.to_str().unwrap());
    assert_eq!(
        (value["line"].clone(), value["column"].clone()),
        (json!(3), json!(3))
    );
    let error = value["error"].as_str().unwrap();
    assert!(error.contains(":3:3: unknown key"), "{error}");
    let missing = env.base.path().join("missing.toml");
    let run = env.run(&["policy", "check", missing.to_str().unwrap(), "--json"]);
    assert_eq!(run.code, 2, "{run:#?}");
    let value = run.json();
    assert_eq!(
        (value["ok"].clone(), value["line"].clone()),
        (json!(false), Value::Null)
    );
}

#[test]
fn audit_verify_json_reports_the_chain_the_head_and_the_first_bad_line() {
    let env = Env::new();
    env.put("ws/a.txt", "a\n");
    let audit = env.base.path().join("audit.jsonl");
    let audit = audit.to_str().unwrap();
    let ws = env.ws();
    let ws = ws.to_str().unwrap();
    for _ in 0..2 {
        let args = [
            "exec",
            "read",
            r#"{"path":"a.txt"}"#,
            "--audit",
            audit,
            "--root",
            ws,
        ];
        env.run(&args).assert_ok();
    }
    let run = env.run(&["audit", "verify", audit, "--json"]);
    run.assert_ok();
    let value = run.json();
    assert_eq!(value["ok"], true);
    assert_eq!(value["file"], audit);
    assert_eq!(value["lines"], 4);
    assert_eq!(value["recordedHead"], Value::Null);
    let head = value["head"].as_str().unwrap().to_owned();
    assert_eq!(head.len(), 64);
    let head_file = format!("{audit}.head");
    let run = env.run(&[
        "audit",
        "verify",
        audit,
        "--head-file",
        &head_file,
        "--json",
    ]);
    run.assert_ok();
    assert_eq!(
        run.json()["recordedHead"],
        json!({"sha256": head, "line": 4, "linesAfter": 0})
    );
    // Flip line 2: the chain breaks at line 3; exit 1 as without --json.
    let text = std::fs::read_to_string(audit).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines[1] = lines[1].replace("\"isError\":false", "\"isError\":true");
    std::fs::write(audit, lines.join("\n") + "\n").unwrap();
    let run = env.run(&["audit", "verify", audit, "--json"]);
    assert_eq!(run.code, 1, "{run:#?}");
    let value = run.json();
    assert_eq!(
        (value["ok"].clone(), value["line"].clone()),
        (json!(false), json!(3))
    );
    assert!(
        value["error"].as_str().unwrap().starts_with("line 3: "),
        "{value}"
    );
}

#[test]
fn doctor_json_is_one_object_with_the_config_and_every_backend() {
    let env = Env::new();
    let project = env.put("ws/.cordon/config.toml", "image = \"mine:2\"\n");
    let ws = env.ws();
    let run = env.run(&["doctor", "--json", "--root", ws.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{run:#?}");
    let value = run.json();
    assert_eq!(value["selected"], "local");
    assert_eq!(value["ready"], true);
    let config = &value["config"];
    assert_eq!(config["policy"]["source"], "builtin:default.toml");
    assert_eq!(config["policy"]["origin"], "builtin");
    assert_eq!(
        config["policy"]["candidates"][0],
        json!({"origin": "--policy", "path": null, "state": "not_set"})
    );
    assert_eq!(
        config["policy"]["candidates"][4],
        json!({"origin": "builtin", "path": "builtin:default.toml", "state": "chosen"})
    );
    assert_eq!(
        config["files"][0],
        json!({"origin": "project", "path": project.to_str().unwrap(), "present": true})
    );
    assert_eq!(
        config["settings"]["image"],
        json!({"value": "mine:2", "origin": format!("{}:1", project.display())})
    );
    assert_eq!(
        config["settings"]["backend"],
        json!({"value": null, "origin": "default"})
    );
    assert_eq!(config["blockers"], json!([]));
    let backends = value["backends"].as_array().unwrap();
    let names: Vec<&str> = backends
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["local", "docker", "ssh"]);
    let local = &backends[0];
    assert_eq!(
        (
            local["selected"].clone(),
            local["probed"].clone(),
            local["ready"].clone()
        ),
        (json!(true), json!(true), json!(true))
    );
    let items = local["items"].as_array().unwrap();
    assert!(
        items.contains(&json!({"item": "pid namespaces", "status": "ok", "detail": "a PID namespace per command: nothing outlives it"})),
        "{local}"
    );
    // The user-namespace restriction check is an item of its own (this host has none).
    assert!(
        items
            .iter()
            .any(|item| item["item"] == "user namespace restriction"
                && item["status"] == "ok"
                && item["detail"]
                    .as_str()
                    .unwrap()
                    .starts_with("not restricted")),
        "{local}"
    );
    let docker = &backends[1];
    assert_eq!(docker["ready"], false);
    assert!(
        docker["items"]
            .as_array()
            .unwrap()
            .contains(&json!({"item": "image", "status": "info", "detail": "mine:2"})),
        "{docker}"
    );
}

/// 1-based line of the first line of `text` starting with `prefix`.
fn line_of(text: &str, prefix: &str) -> usize {
    text.lines()
        .position(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?}"))
        + 1
}

#[test]
fn policy_init_writes_a_commented_copy_that_discovery_then_uses() {
    let env = Env::new();
    let run = env.run(&["policy", "init"]);
    run.assert_ok();
    assert_eq!(
        run.stdout,
        "wrote .cordon/policy.toml (from builtin:default.toml); check it with `cordon policy \
         check .cordon/policy.toml`\n"
    );
    let path = env.ws().join(".cordon/policy.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.starts_with("# Started from builtin:default.toml by `cordon policy init`."),
        "{text}"
    );
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/default.toml"),
    )
    .unwrap();
    assert!(text.ends_with(&shipped));
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    // No temporary file is left next to it.
    let names: Vec<_> = std::fs::read_dir(env.ws().join(".cordon"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, ["policy.toml"]);

    // An existing file is kept without --force.
    env.run(&["policy", "init", "--from", "builtin:readonly"])
        .assert_usage_error(
            "failed to write .cordon/policy.toml: it already exists; pass --force to replace it",
        );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    env.run(&["policy", "init", "--from", "builtin:readonly", "--force"])
        .assert_ok();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.starts_with("# Started from builtin:readonly.toml"),
        "{text}"
    );

    // Discovery picks it up: `policy show` in the project names it and its lines.
    let run = env.run(&["policy", "show"]);
    run.assert_ok();
    let name = path.display().to_string();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("# {name} (chosen from project; `cordon doctor` lists every candidate)")
    );
    let enabled = format!(
        "tools.enabled = [\"read\", \"grep\", \"find\", \"ls\", \"bash\"]  # {name}:{}",
        line_of(&text, "enabled = [")
    );
    assert!(lines.contains(&enabled.as_str()), "{enabled:?} in {run:#?}");
    assert!(
        lines.contains(&"limits.spill = \"256MiB\"  # default"),
        "{run:#?}"
    );
}

#[test]
fn policy_init_never_writes_through_a_symlink() {
    let env = Env::new();
    let target = env.put("target.toml", "version = 1\n");
    std::fs::create_dir_all(env.ws().join("conf")).unwrap();
    let link = env.ws().join("conf/policy.toml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    env.run(&["policy", "init", "conf/policy.toml"])
        .assert_usage_error("failed to write conf/policy.toml: it already exists");
    // --force replaces the link itself; its target is untouched.
    env.run(&["policy", "init", "conf/policy.toml", "--force"])
        .assert_ok();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "version = 1\n");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
    // A .cordon that is a symlink is not written into.
    let elsewhere = env.base.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, env.ws().join(".cordon")).unwrap();
    env.run(&["policy", "init"]).assert_usage_error(
        "failed to write into .cordon: it is not a directory (a symbolic link is not followed)",
    );
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    env.run(&["policy", "init", "x.toml", "--from", "other.toml"])
        .assert_usage_error("failed to use --from other.toml: it takes a built-in policy");
}

#[test]
fn policy_show_of_a_builtin_cites_its_lines_and_defaults() {
    let env = Env::new();
    let run = env.run(&["policy", "show", "builtin:ci-untrusted"]);
    run.assert_ok();
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/ci-untrusted.toml"),
    )
    .unwrap();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "# builtin:ci-untrusted.toml (chosen from --policy; `cordon doctor` lists every candidate)"
    );
    let default = format!(
        "default = \"deny\"  # builtin:ci-untrusted.toml:{}",
        line_of(&shipped, "default = ")
    );
    assert_eq!(lines[2], default);
    assert!(
        lines.contains(&"filesystem.nested_git = \"quarantine\"  # default"),
        "{run:#?}"
    );
    let rule = format!(
        "  # builtin:ci-untrusted.toml:{}",
        line_of(&shipped, "[[rules]]")
    );
    let first_rule = lines
        .iter()
        .find(|line| line.starts_with("rules[1] = {"))
        .unwrap();
    assert!(first_rule.ends_with(&rule), "{first_rule} vs {rule}");
    // Without an argument it is what discovery picks: here the built-in default.
    let run = env.run(&["policy", "show"]);
    run.assert_ok();
    assert!(
        run.stdout
            .starts_with("# builtin:default.toml (chosen from builtin;"),
        "{run:#?}"
    );
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    let env = Env::new();
    let bash = env.run(&["completions", "bash"]);
    bash.assert_ok();
    assert!(bash.stdout.contains("_cordon()"), "{bash:#?}");
    for word in ["doctor", "completions", "--policy", "--color"] {
        assert!(bash.stdout.contains(word), "{word} in the bash script");
    }
    // bash accepts the script and registers it for `cordon`.
    let script = env.put("cordon.bash", &bash.stdout);
    let output = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p cordon", script.display()))
        .output()
        .expect("bash runs");
    assert!(output.status.success(), "{output:?}");
    let registered = String::from_utf8(output.stdout).unwrap();
    assert!(
        registered.contains("_cordon") && registered.trim_end().ends_with(" cordon"),
        "{registered}"
    );
    let zsh = env.run(&["completions", "zsh"]);
    zsh.assert_ok();
    assert!(zsh.stdout.starts_with("#compdef cordon"), "{zsh:#?}");
    let fish = env.run(&["completions", "fish"]);
    fish.assert_ok();
    assert!(fish.stdout.contains("complete -c cordon"), "{fish:#?}");
    assert!(fish.stdout.contains("policy"), "{fish:#?}");
    env.run(&["completions", "tcsh"])
        .assert_usage_error("invalid value 'tcsh'");
}

/// `cordon ARGS` with stdout on a terminal (`script` gives it a pseudo-terminal); what it
/// printed there.
fn on_a_terminal(env: &Env, args: &[&str], no_color: bool) -> String {
    let command = std::iter::once(BIN)
        .chain(args.iter().copied())
        .map(|word| format!("'{word}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut script = Command::new("script");
    script
        .args(["-qec", &command, "/dev/null"])
        .current_dir(env.ws())
        .env("HOME", env.home())
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    if no_color {
        script.env("NO_COLOR", "1");
    }
    let output = script.output().expect("`script` (util-linux) runs");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn doctor_colours_its_marks_as_color_and_no_color_say() {
    const GREEN_OK: &str = "\x1b[32mok\x1b[0m";
    let mut env = Env::new();
    let ws = env.ws();
    let ws = ws.to_str().unwrap();
    let doctor = |env: &Env, extra: &[&str]| {
        let mut args = vec!["doctor", "--root", ws];
        args.extend_from_slice(extra);
        let run = env.run(&args);
        assert_eq!(run.code, 0, "{run:#?}");
        run.stdout
    };
    // Piped (not a terminal): plain unless forced.
    let plain = doctor(&env, &[]);
    assert!(!plain.contains('\x1b'), "{plain}");
    assert!(plain.contains("local: seccomp: ok ("), "{plain}");
    let forced = doctor(&env, &["--color", "always"]);
    assert!(
        forced.contains(&format!("local: seccomp: {GREEN_OK} (")),
        "{forced}"
    );
    assert!(forced.contains("local: \x1b[32mready\x1b[0m"), "{forced}");
    // --color always beats NO_COLOR; --color never is plain.
    env.set("NO_COLOR", "1");
    assert!(doctor(&env, &["--color", "always"]).contains(GREEN_OK));
    env.vars.clear();
    assert!(!doctor(&env, &["--color", "never"]).contains('\x1b'));
    // On a terminal: coloured by default, plain with NO_COLOR or --color never.
    let tty = on_a_terminal(&env, &["doctor", "--root", ws], false);
    assert!(tty.contains(GREEN_OK), "{tty}");
    let tty = on_a_terminal(&env, &["doctor", "--root", ws], true);
    assert!(
        tty.contains("seccomp: ok (") && !tty.contains('\x1b'),
        "{tty}"
    );
    let tty = on_a_terminal(&env, &["doctor", "--root", ws, "--color", "never"], false);
    assert!(
        tty.contains("seccomp: ok (") && !tty.contains('\x1b'),
        "{tty}"
    );
}

#[test]
fn replay_under_a_builtin_or_a_discovered_policy_cites_it() {
    let env = Env::new();
    let line = json!({
        "role": "assistant",
        "content": [{"type": "toolCall", "id": "c1", "name": "bash",
                     "arguments": {"command": "curl https://example.com"}}],
        "stopReason": "toolUse",
    });
    let transcript = env.put("transcript.jsonl", &format!("{line}\n"));
    let ws = env.ws();
    let replay = |extra: &[&str]| {
        let mut args = vec![
            "replay",
            transcript.to_str().unwrap(),
            "--root",
            ws.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let run = env.run(&args);
        run.assert_ok();
        let end: Value = run
            .stdout
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .find(|event| event["type"] == "tool_execution_end")
            .unwrap_or_else(|| panic!("no tool_execution_end in {run:#?}"));
        end["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let text = replay(&["--policy", "builtin:ci-untrusted.toml"]);
    assert!(
        text.starts_with("Blocked by policy (builtin:ci-untrusted.toml:"),
        "{text}"
    );
    // The same policy found as the project's file is cited by its path.
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/ci-untrusted.toml"),
    )
    .unwrap();
    let project = env.put("ws/.cordon/policy.toml", &shipped);
    let text = replay(&[]);
    assert!(
        text.starts_with(&format!("Blocked by policy ({}:", project.display())),
        "{text}"
    );
}
