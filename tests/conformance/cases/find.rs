//! `find`: glob over paths, hidden files included, `.gitignore` applied outside repositories,
//! `.git/` excluded, the limit notice only for real cuts.

use std::sync::Arc;

use cordon_tests::{Harness, Workspace};
use serde_json::{Value, json};

pub async fn hidden_files_gitignore_and_git_excluded(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put(".gitignore", "ignored.txt\nnode_modules/\n");
    ws.put("ignored.txt", "");
    ws.put("node_modules/dep/index.txt", "");
    ws.put(".git/notes.txt", "");
    ws.put(".secret/hidden.txt", "");
    ws.put("visible.txt", "");
    ws.put("src/deep/nested.txt", "");
    ws.put("src/main.rs", "");
    let found = ws.call("find", json!({"pattern": "**/*.txt"})).await;
    found.assert_ok(".secret/hidden.txt\nsrc/deep/nested.txt\nvisible.txt");
    assert_eq!(found.details(), Value::Null);
    ws.call("find", json!({"pattern": "*.txt", "path": "src"}))
        .await
        .assert_ok("deep/nested.txt");
    ws.call("find", json!({"pattern": "src/**/*.rs"}))
        .await
        .assert_ok("src/main.rs");
}

pub async fn limit_notice(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    for name in ["a.txt", "b.txt", "c.txt"] {
        ws.put(name, "");
    }
    let limited = ws
        .call("find", json!({"pattern": "*.txt", "limit": 2}))
        .await;
    limited.assert_ok(
        "a.txt\nb.txt\n\n[2 results limit reached. Use limit=4 for more, or refine pattern]",
    );
    assert_eq!(limited.details(), json!({"resultLimitReached": 2}));
    ws.call("find", json!({"pattern": "*.txt", "limit": 3}))
        .await
        .assert_ok("a.txt\nb.txt\nc.txt");
}

pub async fn no_files_and_invalid_glob(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("a.txt", "");
    ws.call("find", json!({"pattern": "*.zz"}))
        .await
        .assert_ok("No files found matching pattern");
    ws.call("find", json!({"pattern": "--help"}))
        .await
        .assert_ok("No files found matching pattern");
    ws.call("find", json!({"pattern": "["})).await.assert_error(
        "Invalid glob `[`: unclosed character class; missing ']'. Fix the glob pattern (e.g. \
             '*.rs', '**/*.json', 'src/**/*.ts').",
    );
    ws.call("find", json!({"pattern": "*", "path": "nope"}))
        .await
        .assert_error("Path not found: $ROOT/nope");
}

/// A file name holding a newline or an escape sequence cannot pose as extra entries: `find`,
/// `grep` and `ls` print it escaped, on every backend.
pub async fn control_characters_in_names_are_escaped(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("dir/evil\nfake-entry.txt", "needle\n");
    ws.put("dir/esc\u{1b}[2J.txt", "needle\n");
    ws.put("dir/plain.txt", "needle\n");
    ws.call("find", json!({"pattern": "**/*.txt"}))
        .await
        .assert_ok("dir/esc\\x1b[2J.txt\ndir/evil\\nfake-entry.txt\ndir/plain.txt");
    ws.call("grep", json!({"pattern": "needle", "path": "dir"}))
        .await
        .assert_ok(
            "esc\\x1b[2J.txt:1: needle\nevil\\nfake-entry.txt:1: needle\nplain.txt:1: needle",
        );
    ws.call("ls", json!({"path": "dir"}))
        .await
        .assert_ok("esc\\x1b[2J.txt\nevil\\nfake-entry.txt\nplain.txt");
}

/// The temp file of a write is not found.
pub async fn write_temp_files_are_not_found(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("a.txt", "");
    ws.put(".a.txt.cordon-0123456789abcdef.tmp", "");
    ws.put("sub/.b.txt.cordon-fedcba9876543210.tmp", "");
    ws.call("find", json!({"pattern": "*"}))
        .await
        .assert_ok("a.txt");
}
