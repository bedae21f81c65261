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
