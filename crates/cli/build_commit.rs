//! Which commit a `cordon` binary was built from, for `cordon --version`. Shared by the build
//! script (which records it) and the crate's unit tests (which check the fallbacks). The value is
//! the `CORDON_COMMIT` environment variable when a packager sets one, else `git rev-parse` in the
//! source tree, else `unknown` (a source tarball outside any git checkout).

use std::path::Path;
use std::process::Command;

/// Printed when neither an override nor a git checkout names the commit.
pub const UNKNOWN_COMMIT: &str = "unknown";

/// Longest commit label accepted from `CORDON_COMMIT` (a full SHA-256 object name plus a suffix).
const MAX_COMMIT_LABEL: usize = 80;

/// The commit label for a build of the sources in `source_dir`: `override_label` when it is a
/// plausible label (letters, digits, `.`, `_`, `-`; at most 80 bytes), else the abbreviated
/// `HEAD` of the git checkout holding `source_dir`, else [`UNKNOWN_COMMIT`].
pub fn commit_label(source_dir: &Path, override_label: Option<&str>) -> String {
    if let Some(label) = override_label
        .map(str::trim)
        .filter(|label| is_plausible_label(label))
    {
        return label.to_owned();
    }
    git_head(source_dir).unwrap_or_else(|| UNKNOWN_COMMIT.to_owned())
}

fn is_plausible_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= MAX_COMMIT_LABEL
        && label
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
}

/// `git rev-parse --short=12 HEAD` in `dir`, or `None` without git or outside a checkout.
pub fn git_head(dir: &Path) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let head = String::from_utf8(output.stdout).ok()?;
    let head = head.trim();
    is_plausible_label(head).then(|| head.to_owned())
}

/// The files whose change means `HEAD` moved: `HEAD` itself, the branch it points to, and
/// `packed-refs` (where a branch may live after `git gc`), those of them that exist (cargo reruns
/// a build script on every build while one of its inputs is missing). Empty outside a checkout.
pub fn git_head_inputs(dir: &Path) -> Vec<String> {
    let git_path = |name: &str| -> Option<String> {
        let output = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["rev-parse", "--path-format=absolute", "--git-path", name])
            .output()
            .ok()?;
        let path = String::from_utf8(output.stdout).ok()?;
        let path = path.trim();
        (output.status.success() && Path::new(path).exists()).then(|| path.to_owned())
    };
    let mut inputs = Vec::new();
    inputs.extend(git_path("HEAD"));
    inputs.extend(git_path("packed-refs"));
    let branch = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["symbolic-ref", "-q", "HEAD"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok());
    if let Some(branch) = branch {
        inputs.extend(git_path(branch.trim()));
    }
    inputs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_wins_over_git() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(
            commit_label(dir.path(), Some("0123abcd-dirty")),
            "0123abcd-dirty"
        );
    }

    #[test]
    fn outside_a_checkout_the_label_is_unknown() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(commit_label(dir.path(), None), UNKNOWN_COMMIT);
        assert!(git_head_inputs(dir.path()).is_empty());
    }

    #[test]
    fn an_implausible_override_is_ignored() {
        let dir = tempfile::tempdir().expect("temp dir");
        for label in ["", "  ", "abc def", "abc\ndef", "$(id)", &"a".repeat(81)] {
            assert_eq!(
                commit_label(dir.path(), Some(label)),
                UNKNOWN_COMMIT,
                "{label:?}"
            );
        }
    }

    #[test]
    fn a_checkout_gives_its_head() {
        let dir = tempfile::tempdir().expect("temp dir");
        let git = |args: &[&str]| {
            let status = Command::new("git")
                .arg("-C")
                .arg(dir.path())
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "commit.gpgsign=false",
                ])
                .args(args)
                .status()
                .expect("run git");
            assert!(status.success(), "git {args:?}");
        };
        git(&["init", "-q"]);
        git(&["commit", "-q", "--allow-empty", "-m", "first"]);
        let head = git_head(dir.path()).expect("a commit");
        assert_eq!(head.len(), 12);
        assert!(head.bytes().all(|byte| byte.is_ascii_hexdigit()), "{head}");
        assert_eq!(commit_label(dir.path(), None), head);
        let inputs = git_head_inputs(dir.path());
        assert!(
            inputs.iter().any(|path| path.ends_with("/HEAD")),
            "{inputs:?}"
        );
        assert!(
            inputs.iter().any(|path| path.contains("/refs/heads/")),
            "{inputs:?}"
        );
    }
}
