//! `edit`: replacements against the original, all-or-nothing, the exact error strings,
//! diff and patch details, line endings and BOM, the legacy argument shim, symlinks.

use std::sync::Arc;

use cordon_tests::{Harness, Workspace};
use serde_json::json;

/// The tail every "could not find" message carries after its first sentence.
const NOT_FOUND_TAIL: &str = " Fuzzy matching (ignoring trailing whitespace and treating smart \
quotes, Unicode dashes and spaces as ASCII) found no match either. Read the file again and copy \
the text exactly.";

pub async fn replaces_and_reports_diff(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("hello.txt", "Hello, world!\n");
    let edit = ws
        .call(
            "edit",
            json!({"path": "hello.txt", "edits": [{"oldText": "world", "newText": "testing"}]}),
        )
        .await;
    edit.assert_ok("Successfully replaced 1 block(s) in hello.txt.");
    assert_eq!(ws.get_text("hello.txt"), "Hello, testing!\n");
    assert_eq!(
        edit.details(),
        json!({
            "diff": "-1 Hello, world!\n+1 Hello, testing!",
            "firstChangedLine": 1,
            "patch": "--- hello.txt\n+++ hello.txt\n@@ -1 +1 @@\n-Hello, world!\n+Hello, testing!\n",
        })
    );
}

pub async fn multiple_disjoint_edits(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("multi.txt", "alpha\nbeta\ngamma\ndelta\n");
    ws.call(
        "edit",
        json!({"path": "multi.txt", "edits": [
            {"oldText": "alpha", "newText": "ALPHA"},
            {"oldText": "gamma", "newText": "GAMMA"},
        ]}),
    )
    .await
    .assert_ok("Successfully replaced 2 block(s) in multi.txt.");
    assert_eq!(ws.get_text("multi.txt"), "ALPHA\nbeta\nGAMMA\ndelta\n");
}

pub async fn edits_match_the_original(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("orig.txt", "foo\nbar\nbaz\n");
    ws.call(
        "edit",
        json!({"path": "orig.txt", "edits": [
            {"oldText": "foo\n", "newText": "foo bar\n"},
            {"oldText": "bar\n", "newText": "BAR\n"},
        ]}),
    )
    .await
    .assert_ok("Successfully replaced 2 block(s) in orig.txt.");
    assert_eq!(ws.get_text("orig.txt"), "foo bar\nBAR\nbaz\n");
    ws.call(
        "edit",
        json!({"path": "orig.txt", "edits": [
            {"oldText": "foo bar\nBAR", "newText": "x"},
            {"oldText": "BAR\nbaz", "newText": "y"},
        ]}),
    )
    .await
    .assert_error(
        "edits[0] and edits[1] overlap in orig.txt. Merge them into one edit or target disjoint \
         regions.",
    );
    assert_eq!(ws.get_text("orig.txt"), "foo bar\nBAR\nbaz\n");
}

pub async fn text_not_found(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("f.txt", "a\nb\nc\n");
    ws.call(
        "edit",
        json!({"path": "f.txt", "edits": [{"oldText": "zz", "newText": "c"}]}),
    )
    .await
    .assert_error(&format!(
        "Could not find the exact text in f.txt. The old text must match exactly including all \
         whitespace and newlines.{NOT_FOUND_TAIL}"
    ));
    ws.call(
        "edit",
        json!({"path": "f.txt", "edits": [{"oldText": "", "newText": "c"}]}),
    )
    .await
    .assert_error("oldText must not be empty in f.txt.");
    ws.call("edit", json!({"path": "f.txt", "edits": []}))
        .await
        .assert_error("Edit tool input is invalid. edits must contain at least one replacement.");
    assert_eq!(ws.get_text("f.txt"), "a\nb\nc\n");
}

pub async fn duplicate_text(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("dup.txt", "a\nb\na\n");
    ws.call(
        "edit",
        json!({"path": "dup.txt", "edits": [{"oldText": "a", "newText": "c"}]}),
    )
    .await
    .assert_error(
        "Found 2 occurrences of the text in dup.txt. The text must be unique. Please provide \
         more context to make it unique.",
    );
    assert_eq!(ws.get_text("dup.txt"), "a\nb\na\n");
}

pub async fn missing_file(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.call(
        "edit",
        json!({"path": "nofile.txt", "edits": [{"oldText": "a", "newText": "b"}]}),
    )
    .await
    .assert_error("Could not edit file: nofile.txt. Error code: ENOENT.");
    assert!(!ws.exists("nofile.txt"));
}

pub async fn all_or_nothing(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("f.txt", "a\nb\nc\n");
    ws.call(
        "edit",
        json!({"path": "f.txt", "edits": [
            {"oldText": "a", "newText": "A"},
            {"oldText": "zz", "newText": "c"},
        ]}),
    )
    .await
    .assert_error(&format!(
        "Could not find edits[1] in f.txt. The oldText must match exactly including all \
         whitespace and newlines.{NOT_FOUND_TAIL}"
    ));
    assert_eq!(ws.get_text("f.txt"), "a\nb\nc\n", "no edit was applied");
}

pub async fn preserves_crlf_and_bom(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("win.txt", "\u{feff}first\r\nsecond\r\nthird\r\n");
    ws.call(
        "edit",
        json!({"path": "win.txt", "edits": [{"oldText": "second\nthird", "newText": "REPLACED\nLAST"}]}),
    )
    .await
    .assert_ok("Successfully replaced 1 block(s) in win.txt.");
    assert_eq!(
        ws.get_text("win.txt"),
        "\u{feff}first\r\nREPLACED\r\nLAST\r\n"
    );
    // Mixed endings stay mixed: only the touched text changes.
    ws.put("mixed.txt", "one\r\ntwo\nthree\r\n");
    ws.call(
        "edit",
        json!({"path": "mixed.txt", "edits": [{"oldText": "two", "newText": "TWO"}]}),
    )
    .await
    .assert_ok("Successfully replaced 1 block(s) in mixed.txt.");
    assert_eq!(ws.get_text("mixed.txt"), "one\r\nTWO\nthree\r\n");
}

pub async fn legacy_arguments(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("legacy.txt", "before\n");
    // Top-level oldText/newText (older models) are folded into `edits`.
    ws.call(
        "edit",
        json!({"path": "legacy.txt", "oldText": "before", "newText": "after"}),
    )
    .await
    .assert_ok("Successfully replaced 1 block(s) in legacy.txt.");
    assert_eq!(ws.get_text("legacy.txt"), "after\n");
    // `edits` sent as a JSON string is parsed.
    ws.call(
        "edit",
        json!({"path": "legacy.txt", "edits": "[{\"oldText\":\"after\",\"newText\":\"again\"}]"}),
    )
    .await
    .assert_ok("Successfully replaced 1 block(s) in legacy.txt.");
    assert_eq!(ws.get_text("legacy.txt"), "again\n");
}

pub async fn through_symlink_inside_workspace(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("real/target.txt", "value = 1\n");
    ws.symlink("real/target.txt", "link.txt");
    ws.call(
        "edit",
        json!({"path": "link.txt", "edits": [{"oldText": "1", "newText": "2"}]}),
    )
    .await
    .assert_ok("Successfully replaced 1 block(s) in link.txt.");
    assert_eq!(ws.get_text("real/target.txt"), "value = 2\n");
    let link = std::fs::symlink_metadata(ws.host("link.txt")).expect("lstat");
    assert!(
        link.file_type().is_symlink(),
        "the link itself stays a link"
    );
}

pub async fn read_only_file(h: Arc<dyn Harness>) {
    use std::os::unix::fs::PermissionsExt;
    let ws = Workspace::open(&h).await;
    ws.put("ro.txt", "ro\n");
    std::fs::set_permissions(ws.host("ro.txt"), std::fs::Permissions::from_mode(0o444))
        .expect("chmod");
    ws.call(
        "edit",
        json!({"path": "ro.txt", "edits": [{"oldText": "ro", "newText": "rw"}]}),
    )
    .await
    .assert_error("Could not edit file: ro.txt. Error code: EACCES.");
    assert_eq!(ws.get_text("ro.txt"), "ro\n");
}
