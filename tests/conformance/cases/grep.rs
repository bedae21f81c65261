//! `grep`: `path:N: text` lines, merged context windows, limits that only report real cuts,
//! `.gitignore` applied outside git repositories too, `.git/` never searched.

use std::sync::Arc;

use cordon_tests::{Harness, Workspace};
use serde_json::{Value, json};

pub async fn matches_across_files(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("a.txt", "x\nneedle one\n");
    ws.put("sub/b.txt", "needle two\nNEEDLE three\n");
    ws.put("c.txt", "a.c\nabc\n");
    let found = ws.call("grep", json!({"pattern": "needle"})).await;
    found.assert_ok("a.txt:2: needle one\nsub/b.txt:1: needle two");
    assert_eq!(found.details(), Value::Null);
    ws.call("grep", json!({"pattern": "needle", "ignoreCase": true}))
        .await
        .assert_ok("a.txt:2: needle one\nsub/b.txt:1: needle two\nsub/b.txt:2: NEEDLE three");
    ws.call("grep", json!({"pattern": "a.c", "literal": true}))
        .await
        .assert_ok("c.txt:1: a.c");
    ws.call("grep", json!({"pattern": "a.c"}))
        .await
        .assert_ok("c.txt:1: a.c\nc.txt:2: abc");
    ws.call(
        "grep",
        json!({"pattern": "needle", "glob": "*.txt", "path": "sub"}),
    )
    .await
    .assert_ok("b.txt:1: needle two");
}

pub async fn context_and_limit(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("context.txt", "before\nmatch one\nafter\nmatch two\nend\n");
    let limited = ws
        .call(
            "grep",
            json!({"pattern": "match", "context": 1, "limit": 1}),
        )
        .await;
    limited.assert_ok(
        "context.txt-1- before\ncontext.txt:2: match one\ncontext.txt-3- after\n\n[1 matches \
         limit reached. Use limit=2 for more, or refine pattern]",
    );
    assert_eq!(limited.details(), json!({"matchLimitReached": 1}));
    // Overlapping windows are merged: every line once.
    ws.call("grep", json!({"pattern": "match", "context": 1}))
        .await
        .assert_ok(
            "context.txt-1- before\ncontext.txt:2: match one\ncontext.txt-3- after\n\
             context.txt:4: match two\ncontext.txt-5- end",
        );
    // Exactly `limit` matches: nothing was cut, so no notice.
    ws.call("grep", json!({"pattern": "match", "limit": 2}))
        .await
        .assert_ok("context.txt:2: match one\ncontext.txt:4: match two");
}

pub async fn single_file_uses_basename(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("sub/example.txt", "first line\nmatch line\n");
    ws.call(
        "grep",
        json!({"pattern": "match", "path": "sub/example.txt"}),
    )
    .await
    .assert_ok("example.txt:2: match line");
}

pub async fn gitignore_and_git_excluded(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    // No repository is needed for .gitignore to apply; .git/ is never searched.
    ws.put(".gitignore", "ignored.txt\nbuild/\n");
    ws.put("ignored.txt", "needle\n");
    ws.put("build/out.txt", "needle\n");
    ws.put(".git/HEAD", "needle\n");
    ws.put("visible.txt", "needle\n");
    ws.put(".hidden/h.txt", "needle\n");
    ws.put("a/.gitignore", "local.txt\n");
    ws.put("a/local.txt", "needle\n");
    ws.put("b/local.txt", "needle\n");
    ws.call("grep", json!({"pattern": "needle"}))
        .await
        .assert_ok(".hidden/h.txt:1: needle\nb/local.txt:1: needle\nvisible.txt:1: needle");
}

pub async fn no_matches_and_flag_like_pattern(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("a.txt", "text\n");
    ws.call("grep", json!({"pattern": "zzz"}))
        .await
        .assert_ok("No matches found");
    // A pattern that looks like a flag is search text, never an option.
    ws.call("grep", json!({"pattern": "--pre=touch pwned"}))
        .await
        .assert_ok("No matches found");
    assert!(!ws.exists("pwned"));
    ws.call("grep", json!({"pattern": "x", "path": "nope"}))
        .await
        .assert_error("Path not found: $ROOT/nope");
}

pub async fn invalid_regex(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("a.txt", "text\n");
    ws.call("grep", json!({"pattern": "("})).await.assert_error(
        "Invalid regex `(`: regex parse error:\n    (\n    ^\nerror: unclosed group. Fix \
             the pattern, or set literal=true to search for the text as is.",
    );
}

/// The temp file of a write is not searched.
pub async fn write_temp_files_are_not_searched(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("a.txt", "needle\n");
    ws.put(".a.txt.cordon-0123456789abcdef.tmp", "needle\n");
    ws.put("sub/.b.txt.cordon-fedcba9876543210.tmp", "needle\n");
    ws.call("grep", json!({"pattern": "needle"}))
        .await
        .assert_ok("a.txt:1: needle");
}
