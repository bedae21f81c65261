//! `ls`: sorted entries, `/` on directories, dotfiles, the limit notice, errors.

use std::sync::Arc;

use cordon_tests::{Harness, Workspace};
use serde_json::{Value, json};

pub async fn sorted_with_directory_slashes(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("Zeta.txt", "");
    ws.put("alpha.txt", "");
    ws.put(".hidden-file", "");
    ws.mkdir(".hidden-dir");
    ws.put("sub/inner.txt", "");
    ws.symlink("alpha.txt", "to-alpha");
    ws.symlink("sub", "to-sub");
    let listing = ws.call("ls", json!({})).await;
    // Case-insensitive order; symlinks show what they point to.
    listing.assert_ok(".hidden-dir/\n.hidden-file\nalpha.txt\nsub/\nto-alpha\nto-sub/\nZeta.txt");
    assert_eq!(listing.details(), Value::Null);
    ws.call("ls", json!({"path": "sub"}))
        .await
        .assert_ok("inner.txt");
    ws.mkdir("void");
    ws.call("ls", json!({"path": "void"}))
        .await
        .assert_ok("(empty directory)");
}

pub async fn limit_notice(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    for name in ["a", "b", "c"] {
        ws.put(name, "");
    }
    let limited = ws.call("ls", json!({"limit": 2})).await;
    limited.assert_ok("a\nb\n\n[2 entries limit reached. Use limit=4 for more]");
    // Exactly at the limit nothing was cut, so there is no notice.
    ws.call("ls", json!({"limit": 3}))
        .await
        .assert_ok("a\nb\nc");
}

pub async fn missing_and_not_a_directory(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("file.txt", "x\n");
    ws.call("ls", json!({"path": "nope"}))
        .await
        .assert_error("Path not found: nope");
    ws.call("ls", json!({"path": "file.txt"}))
        .await
        .assert_error("Not a directory: file.txt");
}

/// The temp file of a write (one a killed Cordon left, until the next session removes it) is
/// not listed; a name that only looks similar is.
pub async fn write_temp_files_are_hidden(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("a.txt", "");
    ws.put("sub/.a.txt.cordon-0123456789abcdef.tmp", "");
    ws.put("sub/.a.txt.cordon-draft.tmp", "");
    ws.call("ls", json!({"path": "sub"}))
        .await
        .assert_ok(".a.txt.cordon-draft.tmp");
}
