//! Symlink smuggling: the policy judges the backend's canonical path, so a link created by
//! bash cannot carry a write into `.git/` or read out of a denied file. The canonical paths
//! here come from the real filesystem (`std::fs::canonicalize`), as a backend would give them.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use cordon_ops::{Op, paths_of};
use cordon_policy::{Decision, DecisionRequest, PathAccess};
use serde_json::json;

use crate::support::policy;

const POLICY: &str = r#"version = 1
[filesystem]
read = ["**"]
write = ["**"]
deny = ["**/.env"]
protect = [".git/**"]
"#;

/// What a backend does: canonicalise the target, or its parent for a file not yet created.
fn canonical(root: &Path, path: &str) -> PathBuf {
    let joined = root.join(path);
    match std::fs::canonicalize(&joined) {
        Ok(path) => path,
        Err(_) => {
            let parent = std::fs::canonicalize(joined.parent().unwrap()).unwrap();
            parent.join(joined.file_name().unwrap())
        }
    }
}

#[test]
fn links_into_protected_and_denied_paths_are_judged_by_their_target() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(root.join(".env"), "TOKEN=x\n").unwrap();
    // What `bash -c 'ln -s .git/config notes.txt; ln -s .git/hooks tools; ln -s .env readme'`
    // would leave behind.
    symlink(".git/config", root.join("notes.txt")).unwrap();
    symlink(".git/hooks", root.join("tools")).unwrap();
    symlink(".env", root.join("readme")).unwrap();

    let p = policy(POLICY);
    let judge = |tool: &str, args: serde_json::Value| {
        let paths: Vec<PathAccess> = paths_of(tool, &args)
            .into_iter()
            .map(|(path, op)| PathAccess {
                canonical: canonical(&root, &path),
                op,
            })
            .collect();
        p.decide(&DecisionRequest {
            tool,
            args: &args,
            paths: &paths,
            root: &root,
            home: None,
        })
    };

    let got = judge("write", json!({"path": "notes.txt", "content": "x"}));
    assert_eq!(got.decision, Decision::Deny, "{got:?}");
    assert!(
        got.reason.contains(".git/config") && got.reason.contains("protected"),
        "{got:?}"
    );

    let got = judge("edit", json!({"path": "notes.txt", "edits": []}));
    assert_eq!(got.decision, Decision::Deny, "{got:?}");

    let got = judge(
        "write",
        json!({"path": "tools/pre-commit", "content": "#!/bin/sh"}),
    );
    assert_eq!(
        got.decision,
        Decision::Deny,
        "a new file under a linked .git/hooks: {got:?}"
    );

    let got = judge("read", json!({"path": "readme"}));
    assert_eq!(got.decision, Decision::Deny, "{got:?}");
    assert!(got.reason.contains("**/.env"), "{got:?}");

    // Reading through the link into .git is fine (protect is write-only), as is writing a
    // plain file.
    assert_eq!(
        judge("read", json!({"path": "notes.txt"})).decision,
        Decision::Allow
    );
    assert_eq!(
        judge("write", json!({"path": "src.rs", "content": ""})).decision,
        Decision::Allow
    );
    // The same request judged on the string the model sent would have been allowed: the
    // canonical path is what makes the difference.
    let lexical = [PathAccess {
        canonical: root.join("notes.txt"),
        op: Op::Write,
    }];
    let args = json!({"path": "notes.txt", "content": "x"});
    let naive = p.decide(&DecisionRequest {
        tool: "write",
        args: &args,
        paths: &lexical,
        root: &root,
        home: None,
    });
    assert_eq!(naive.decision, Decision::Allow);
}
