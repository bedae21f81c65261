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
