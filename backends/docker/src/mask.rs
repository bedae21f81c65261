//! Finding the denied paths (`spec.denied` globs) in a bind-mounted workspace so that they can
//! be hidden from commands too (file operations refuse them anyway): the host tree is walked
//! once at session start, without following symlinks and without entering `.git`; a matching
//! directory is masked as a whole. The walk is bounded; a larger tree is an error unless the
//! operator accepted a degraded sandbox.

use std::path::{Path, PathBuf};

use cordon_remote::files::PathRules;

use crate::plan::Mask;

/// Most entries the walk looks at.
pub const MASK_WALK_LIMIT: usize = 200_000;

/// Most protected paths a wildcard glob matches that get a read-only mount of their own.
pub const MAX_PROTECTED_MOUNTS: usize = 256;

/// What [`protected_matches`] found: the paths (relative), and whether the walk stopped
/// before the end (more than `limit` entries, or more than `max` matches: the rest are then
/// protected by the helper's Landlock rules alone).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProtectedMatches {
    pub paths: Vec<PathBuf>,
    pub incomplete: bool,
}

/// The existing paths under `host_root` that the protected globs match (a matching directory
/// as a whole), for read-only mounts at session start: Landlock keeps commands from writing a
/// protected file but not from changing its mode, times or extended attributes, which a
/// read-only mount refuses. Walked like [`denied_masks`] (no symlinks followed, `.git` not
/// entered: it has mounts of its own); symlinks and denied paths are skipped.
pub fn protected_matches(
    host_root: &Path,
    workspace: &Path,
    rules: &PathRules,
    limit: usize,
    max: usize,
) -> ProtectedMatches {
    let mut found = ProtectedMatches::default();
    let mut seen = 0usize;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(host_root.join(&rel)) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > limit {
                found.incomplete = true;
                return found;
            }
            let name = entry.file_name();
            let child = rel.join(&name);
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let in_container = workspace.join(&child);
            if kind.is_symlink() || rules.is_denied(&in_container) {
                continue;
            }
            if rules.is_protected(&in_container) && (kind.is_dir() || kind.is_file()) {
                if found.paths.len() == max {
                    found.incomplete = true;
                    return found;
                }
                found.paths.push(child);
            } else if kind.is_dir() && name != ".git" {
                stack.push(child);
            }
        }
    }
    found.paths.sort();
    found
}

/// The denied paths under `host_root` (relative), or `Err(limit)` when the tree is larger
/// than `limit` entries.
pub fn denied_masks(
    host_root: &Path,
    workspace: &Path,
    rules: &PathRules,
    limit: usize,
) -> Result<Vec<Mask>, usize> {
    let mut masks = Vec::new();
    let mut seen = 0usize;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(host_root.join(&rel)) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > limit {
                return Err(limit);
            }
            let name = entry.file_name();
            let child = rel.join(&name);
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_symlink() {
                // A mask on a symlink would land on its target; file operations still refuse
                // the path, and the link's target is what the rules judge.
                continue;
            }
            if rules.is_denied(&workspace.join(&child)) {
                masks.push(Mask {
                    rel: child,
                    is_dir: kind.is_dir(),
                });
            } else if kind.is_dir() && name != ".git" {
                stack.push(child);
            }
        }
    }
    masks.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(masks)
}

#[cfg(test)]
mod tests {
    use cordon_core::sandbox::SandboxSpec;

    use super::*;

    #[test]
    fn finds_protected_paths_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for rel in [
            "sub/.envrc",
            "a/b/.envrc",
            ".vscode/tasks.json",
            ".git/hooks/.envrc",
            "secret/.envrc",
            "ok.txt",
        ] {
            std::fs::create_dir_all(root.join(rel).parent().expect("parent")).expect("mkdir");
            std::fs::write(root.join(rel), "x").expect("write");
        }
        std::os::unix::fs::symlink("sub/.envrc", root.join(".envrc")).expect("symlink");
        let spec = SandboxSpec {
            protected: vec!["**/.envrc".to_owned(), ".vscode/**".to_owned()],
            denied: vec!["secret/**".to_owned()],
            ..SandboxSpec::default()
        };
        let rules = PathRules::new(Path::new("/workspace"), &spec, vec![]).expect("rules");
        let found = protected_matches(root, Path::new("/workspace"), &rules, 1000, 10);
        let paths = |list: &[&str]| list.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(
            found,
            ProtectedMatches {
                paths: paths(&[".vscode", "a/b/.envrc", "sub/.envrc"]),
                incomplete: false,
            }
        );
        // Bounded by matches and by entries walked: incomplete, never an error.
        assert!(protected_matches(root, Path::new("/workspace"), &rules, 1000, 1).incomplete);
        let walked = protected_matches(root, Path::new("/workspace"), &rules, 2, 10);
        assert!(walked.incomplete);
    }

    #[test]
    fn finds_denied_files_and_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for (rel, body) in [
            (".env", "x"),
            ("app/.env", "x"),
            ("app/main.rs", "x"),
            ("keys/a.pem", "x"),
            ("ok.txt", "x"),
        ] {
            std::fs::create_dir_all(root.join(rel).parent().expect("parent")).expect("mkdir");
            std::fs::write(root.join(rel), body).expect("write");
        }
        std::fs::create_dir_all(root.join("secrets/deep")).expect("mkdir");
        std::os::unix::fs::symlink(".env", root.join("env-link")).expect("symlink");
        let spec = SandboxSpec {
            denied: vec![
                "**/.env".to_owned(),
                "secrets/**".to_owned(),
                "**/*.pem".to_owned(),
            ],
            ..SandboxSpec::default()
        };
        let rules = PathRules::new(Path::new("/workspace"), &spec, vec![]).expect("rules");
        let mask = |rel: &str, is_dir: bool| Mask {
            rel: PathBuf::from(rel),
            is_dir,
        };
        assert_eq!(
            denied_masks(root, Path::new("/workspace"), &rules, 100),
            Ok(vec![
                mask(".env", false),
                mask("app/.env", false),
                mask("keys/a.pem", false),
                mask("secrets", true)
            ])
        );
        assert_eq!(
            denied_masks(root, Path::new("/workspace"), &rules, 3),
            Err(3)
        );
    }
}
