//! What an installed `cordon` shows outside the source tree: `--version` names the commit it was
//! built from, and errors name commands the operator has (`cordon doctor`, `docker build`)
//! instead of the repository's scripts.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_cordon");

/// The repository root (examples/, policies/ and scripts/ live there).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn version_names_the_commit_of_the_checkout() {
    let head = Command::new("git")
        .arg("-C")
        .arg(repo_root())
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .expect("run git");
    assert!(head.status.success(), "the tests run in a git checkout");
    // A packager's CORDON_COMMIT, when the build had one, wins over the checkout's HEAD.
    let commit = option_env!("CORDON_COMMIT")
        .map(str::to_owned)
        .unwrap_or_else(|| text(&head.stdout).trim().to_owned());
    let output = Command::new(BIN)
        .arg("--version")
        .output()
        .expect("run cordon");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        text(&output.stdout),
        format!("cordon {} (commit {commit})\n", env!("CARGO_PKG_VERSION"))
    );
}

/// `cordon exec ls` on the Docker backend with no engine at `DOCKER_HOST`, run from `cwd`.
fn exec_without_engine(cwd: &Path, root: &Path) -> Output {
    Command::new(BIN)
        .current_dir(cwd)
        .env("DOCKER_HOST", "unix:///nonexistent/cordon-test/docker.sock")
        .args(["exec", "ls", "{}", "--backend", "docker", "--root"])
        .arg(root)
        .output()
        .expect("run cordon")
}

#[test]
fn outside_the_source_tree_errors_name_installed_commands() {
    let root = tempfile::tempdir().expect("workspace");
    let elsewhere = tempfile::tempdir().expect("a directory outside the repository");
    let output = exec_without_engine(elsewhere.path(), root.path());
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "{output:?}");
    assert!(
        stderr.contains(
            "failed to reach the Docker daemon at unix:///nonexistent/cordon-test/docker.sock"
        ) && stderr.contains("`cordon doctor --backend docker`"),
        "{stderr}"
    );
    assert!(!stderr.contains("scripts/"), "{stderr}");

    // In a source checkout the same error points at the script that starts an engine.
    let output = exec_without_engine(&repo_root(), root.path());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("scripts/docker-start.sh"), "{stderr}");
}

/// A YAML file as JSON (PyYAML's safe loader: the CI examples are plain YAML).
fn yaml(path: &Path) -> serde_json::Value {
    let output = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(path)
        .output()
        .expect("python3 is needed to parse the CI examples");
    assert!(
        output.status.success(),
        "failed to parse {} (python3 with PyYAML is needed): {}",
        path.display(),
        text(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON from python3")
}

/// A checkout with the examples' transcript at `transcript` (relative), to replay in CI.
fn checkout_with_transcript(transcript: &str) -> tempfile::TempDir {
    let checkout = tempfile::tempdir().expect("checkout");
    let path = checkout.path().join(transcript);
    std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
    std::fs::copy(repo_root().join("examples/session.jsonl"), &path).expect("copy transcript");
    std::fs::write(checkout.path().join("Cargo.toml"), "[package]\n").expect("write");
    checkout
}

/// Run a CI script the way both CI systems run bash (`-e`, `-o pipefail`), with the built
/// `cordon` first on PATH.
fn run_ci_script(script: &str, cwd: &Path, env: &[(&str, &Path)], vars: &[(&str, &str)]) {
    let bin_dir = Path::new(BIN).parent().expect("binary directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("bash");
    command
        .args(["--noprofile", "--norc", "-eo", "pipefail", "-c", script])
        .current_dir(cwd)
        .env("PATH", path);
    for (name, value) in env {
        command.env(name, value);
    }
    for (name, value) in vars {
        command.env(name, value);
    }
    let output = command.output().expect("run bash");
    assert!(
        output.status.success(),
        "the CI script failed:\n{script}\nstdout:\n{}\nstderr:\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// What a replay of `examples/session.jsonl` leaves: the transcript's edits in `workspace`,
/// none in `checkout`, and a verified audit log plus the events in `audit_dir`.
fn assert_replayed(checkout: &Path, audit_dir: &Path) {
    assert!(
        !checkout.join("greet.sh").exists(),
        "the replay must not touch the checkout"
    );
    let events = std::fs::read_to_string(audit_dir.join("events.jsonl")).expect("events");
    assert!(
        events
            .lines()
            .any(|line| line.contains(r#""type":"agent_end""#)),
        "{events}"
    );
    let audit = std::fs::read_to_string(audit_dir.join("audit.jsonl")).expect("audit log");
    assert!(audit.lines().count() > 1, "{audit}");
    // The transcript's write of .git/hooks/pre-commit is refused by the protect rule.
    assert!(audit.contains("pre-commit"), "{audit}");
    assert!(audit_dir.join("audit.jsonl.head").is_file());
}

#[test]
fn github_actions_example_replays_under_ci_untrusted_and_keeps_the_audit_log() {
    let workflow = yaml(&repo_root().join("examples/ci/github-actions.yml"));
    let job = &workflow["jobs"]["replay"];
    let steps = job["steps"].as_array().expect("steps");
    let step = |name: &str| {
        steps
            .iter()
            .find(|step| step["name"] == name)
            .unwrap_or_else(|| panic!("no step {name:?} in {steps:#?}"))
    };
    let install = step("Install cordon")["run"].as_str().expect("run");
    assert!(install.contains("sha256sum -c"), "{install}");
    let replay = step("Replay the transcript")["run"].as_str().expect("run");
    assert!(replay.contains("--policy builtin:ci-untrusted"), "{replay}");
    let keep = step("Keep the audit log");
    assert_eq!(keep["if"], "always()");
    assert_eq!(keep["with"]["path"], "${{ runner.temp }}/cordon-audit/");
    let transcript = job["env"]["TRANSCRIPT"].as_str().expect("TRANSCRIPT");

    let checkout = checkout_with_transcript(transcript);
    let runner_temp = tempfile::tempdir().expect("runner temp");
    run_ci_script(
        replay,
        checkout.path(),
        &[
            ("RUNNER_TEMP", runner_temp.path()),
            ("GITHUB_WORKSPACE", checkout.path()),
        ],
        &[("TRANSCRIPT", transcript)],
    );
    assert!(runner_temp.path().join("workspace/greet.sh").is_file());
    assert_replayed(checkout.path(), &runner_temp.path().join("cordon-audit"));
}

#[test]
fn gitlab_ci_example_replays_under_ci_untrusted_and_keeps_the_audit_log() {
    let config = yaml(&repo_root().join("examples/ci/gitlab-ci.yml"));
    let job = &config["cordon-replay"];
    let script: Vec<&str> = job["script"]
        .as_array()
        .expect("script")
        .iter()
        .map(|line| line.as_str().expect("a script line"))
        .collect();
    assert!(
        script
            .iter()
            .any(|line| line.contains("--policy builtin:ci-untrusted")),
        "{script:#?}"
    );
    assert_eq!(job["artifacts"]["when"], "always");
    assert_eq!(
        job["artifacts"]["paths"],
        serde_json::json!(["cordon-audit/"])
    );
    let transcript = job["variables"]["TRANSCRIPT"].as_str().expect("TRANSCRIPT");

    let checkout = checkout_with_transcript(transcript);
    // GitLab runs the lines in one shell, stopping at the first failure.
    run_ci_script(
        &script.join("\n"),
        checkout.path(),
        &[("CI_PROJECT_DIR", checkout.path())],
        &[("TRANSCRIPT", transcript)],
    );
    assert_replayed(checkout.path(), &checkout.path().join("cordon-audit"));
}

/// Removes a test image when the test ends, passed or not.
struct RemoveImage<'a> {
    host: &'a str,
    tag: String,
}

impl Drop for RemoveImage<'_> {
    fn drop(&mut self) {
        let removed = Command::new("docker")
            .args(["image", "rm", "--force", &self.tag])
            .env("DOCKER_HOST", self.host)
            .output();
        if !removed.is_ok_and(|output| output.status.success()) {
            eprintln!("failed to remove test image {}", self.tag);
        }
    }
}

/// `scripts/build-sandbox-image.sh --cordon` puts this `cordon` (stripped, so the layer stays
/// small) on the sandbox image; the image runs `cordon --version` and replays the example
/// session with its full sandbox (the options the README gives for running it).
#[test]
fn cordon_image_runs_version_and_a_replay() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_DOCKER=1: not testing Cordon's image");
        return;
    }
    let host = cordon_tests::infra::docker_host().unwrap_or_else(|error| panic!("{error}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = dir.path().join("cordon");
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(&binary)
        .arg(BIN)
        .status()
        .expect("run strip");
    assert!(stripped.success());
    let tag = format!("cordon-image-test:{}", std::process::id());
    let _remove = RemoveImage {
        host: &host,
        tag: tag.clone(),
    };
    let built = Command::new(repo_root().join("scripts/build-sandbox-image.sh"))
        .arg("--cordon-binary")
        .arg(&binary)
        .args(["--cordon-tag", &tag])
        .env("DOCKER_HOST", &host)
        .output()
        .expect("run build-sandbox-image.sh");
    assert!(built.status.success(), "{}", text(&built.stderr));
    assert_eq!(
        text(&built.stdout),
        format!("cordon-sandbox:latest\n{tag}\n")
    );

    let docker_run = |args: &[&str], stdin: Option<&Path>| {
        let mut command = Command::new("docker");
        command
            .env("DOCKER_HOST", &host)
            .args(["run", "--rm", "-i", "--network", "none"])
            .args(["--security-opt", "seccomp=unconfined"])
            .args(["--security-opt", "systempaths=unconfined"])
            .arg(&tag)
            .args(args);
        if let Some(path) = stdin {
            command.stdin(std::fs::File::open(path).expect("open stdin file"));
        }
        command.output().expect("run docker")
    };
    let version = docker_run(&["cordon", "--version"], None);
    let host_version = Command::new(BIN)
        .arg("--version")
        .output()
        .expect("run cordon");
    assert!(version.status.success(), "{}", text(&version.stderr));
    assert_eq!(text(&version.stdout), text(&host_version.stdout));

    let replay = docker_run(
        &[
            "sh",
            "-c",
            "root=$(mktemp -d) && cordon replay - --root \"$root\"",
        ],
        Some(&repo_root().join("examples/session.jsonl")),
    );
    let events = text(&replay.stdout);
    assert!(replay.status.success(), "{}", text(&replay.stderr));
    assert!(
        events
            .lines()
            .any(|line| line.contains(r#""type":"agent_end""#)),
        "{events}"
    );
    // The script ran inside Cordon's sandbox in the container (not refused for want of a layer).
    assert!(
        events.contains(r"Hello, Ada!\nHello, Linus!\nHello, world!"),
        "{events}"
    );
}
