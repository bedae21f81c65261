//! Finding the denied and protected paths (`spec.denied`, `spec.protected` globs) in a
//! bind-mounted workspace, so that the denied ones are hidden from commands too (file
//! operations refuse them anyway) and the protected ones are read-only mounts: the host tree is
//! walked once at session start, without following symlinks and without entering `.git`; a
//! matching directory is covered as a whole. The walk is bounded; a larger tree is an error
//! when there are denied paths to hide, unless the operator accepted a degraded sandbox.

use std::path::{Path, PathBuf};

use cordon_remote::files::PathRules;

use crate::plan::Mask;

/// Most entries the walk looks at.
pub const MASK_WALK_LIMIT: usize = 200_000;

/// Most protected paths a wildcard glob matches that get a read-only mount of their own.
pub const MAX_PROTECTED_MOUNTS: usize = 256;

/// What one walk of a bind-mounted workspace found (see [`scan`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The denied paths, masked whole (a denied directory is not entered).
    pub masks: Vec<Mask>,
    /// The existing paths the protected globs match, for read-only mounts (a matching
    /// directory as a whole; at most `max_protected`).
    pub protected: Vec<PathBuf>,
    /// More paths matched the protected globs than `max_protected`: the rest are kept from
    /// writes by the helper's Landlock rules alone.
    pub protected_incomplete: bool,
}

/// Walk `host_root` once, without following symlinks and without entering `.git` (it has
/// mounts of its own): the denied paths (to mask them from commands too; file operations
/// refuse them anyway) and the protected paths that exist now (to mount them read-only:
/// Landlock keeps commands from writing a protected file but not from changing its mode,
/// times or extended attributes). `Err(limit)` when the tree is larger than `limit` entries.
pub fn scan(
    host_root: &Path,
    workspace: &Path,
    rules: &PathRules,
    limit: usize,
    max_protected: usize,
) -> Result<Scan, usize> {
    let mut found = Scan::default();
    let mut seen = 0usize;
    // A directory, and whether a protected directory above it is mounted already.
    let mut stack = vec![(PathBuf::new(), false)];
    while let Some((rel, under_protected)) = stack.pop() {
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
                // A mount on a symlink would land on its target; file operations still
                // refuse the path, and the link's target is what the rules judge.
                continue;
            }
            let in_container = workspace.join(&child);
            if rules.is_denied(&in_container) {
                found.masks.push(Mask {
                    rel: child,
                    is_dir: kind.is_dir(),
                });
                continue;
            }
            let mut mounted = under_protected;
            if !under_protected
                && (kind.is_dir() || kind.is_file())
                && rules.is_protected(&in_container)
            {
                if found.protected.len() < max_protected {
                    found.protected.push(child.clone());
                    mounted = true;
                } else {
                    found.protected_incomplete = true;
                }
            }
            // Denied paths below a protected directory still need their masks.
            if kind.is_dir() && name != ".git" {
                stack.push((child, mounted));
            }
        }
    }
    found.masks.sort_by(|a, b| a.rel.cmp(&b.rel));
    found.protected.sort();
    Ok(found)
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
        let found = scan(root, Path::new("/workspace"), &rules, 1000, 10).unwrap();
        let paths = |list: &[&str]| list.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(
            found.protected,
            paths(&[".vscode", "a/b/.envrc", "sub/.envrc"])
        );
        assert!(!found.protected_incomplete);
        // Bounded by matches (incomplete) and by entries walked (the walk's error).
        let capped = scan(root, Path::new("/workspace"), &rules, 1000, 1).unwrap();
        assert!(capped.protected_incomplete);
        assert_eq!(capped.protected.len(), 1);
        assert_eq!(scan(root, Path::new("/workspace"), &rules, 2, 10), Err(2));
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
            scan(root, Path::new("/workspace"), &rules, 100, 0).map(|s| s.masks),
            Ok(vec![
                mask(".env", false),
                mask("app/.env", false),
                mask("keys/a.pem", false),
                mask("secrets", true)
            ])
        );
        assert_eq!(
            scan(root, Path::new("/workspace"), &rules, 3, 0).map(|s| s.masks),
            Err(3)
        );
    }
}
