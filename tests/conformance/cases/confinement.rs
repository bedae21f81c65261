//! Confinement of the file and search tools to the workspace: `..`, absolute paths and
//! symlinks pointing out (created on the host, as a hostile repository would ship them) are
//! refused, and nothing outside changes. Symlinks that stay inside are followed.

use std::path::Path;
use std::sync::Arc;

use cordon_tests::{Called, Harness, Workspace};
use serde_json::json;

/// The refusal for a path outside every allowed root, up to the path the backend names
/// (the lexical path for `..`, the link or its target for symlinks).
#[track_caller]
fn assert_outside(called: &Called, requested: &str) {
    assert!(called.is_error(), "expected a refusal, got {called:#?}");
    let text = &called.text;
    assert!(
        text.starts_with("Refused: path is outside the allowed roots: "),
        "{called:#?}"
    );
    let tail = format!(
        " (requested as `{requested}`). Only paths inside the workspace root $ROOT and the \
         sandbox's other allowed roots can be used."
    );
    assert!(text.ends_with(&tail), "{called:#?}");
    assert!(
        !text.contains("outside-secret"),
        "the content leaked: {text}"
    );
}

/// The backend's name for `outside/REL`, the workspace's sibling.
fn outside_backend(ws: &Workspace, rel: &str) -> String {
    let parent = ws.backend_root().parent().unwrap_or(Path::new("/"));
    parent
        .join("outside")
        .join(rel)
        .to_string_lossy()
        .into_owned()
}

fn put_outside(ws: &Workspace, rel: &str, contents: &str) {
    std::fs::write(ws.outside(rel), contents).expect("write outside file");
}

pub async fn dotdot_escape(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    put_outside(&ws, "secret.txt", "outside-secret\n");
    let read = ws
        .call("read", json!({"path": "../outside/secret.txt"}))
        .await;
    assert_outside(&read, "../outside/secret.txt");
    assert!(read.text.contains(&outside_backend(&ws, "secret.txt")));
    for (tool, args, requested) in [
        (
            "write",
            json!({"path": "../outside/new.txt", "content": "x"}),
            "../outside/new.txt",
        ),
        (
            "write",
            json!({"path": "sub/../../outside/secret.txt", "content": "x"}),
            "sub/../../outside/secret.txt",
        ),
        (
            "edit",
            json!({"path": "../outside/secret.txt",
                   "edits": [{"oldText": "outside", "newText": "inside"}]}),
            "../outside/secret.txt",
        ),
        ("ls", json!({"path": ".."}), ".."),
        (
            "grep",
            json!({"pattern": "secret", "path": "../outside"}),
            "../outside",
        ),
        ("find", json!({"pattern": "*", "path": ".."}), ".."),
    ] {
        let refused = ws.call(tool, args).await;
        assert_outside(&refused, requested);
    }
    assert_eq!(
        std::fs::read_to_string(ws.outside("secret.txt")).expect("read"),
        "outside-secret\n"
    );
    assert!(!ws.outside("new.txt").exists());
}

pub async fn absolute_path_outside(h: Arc<dyn Harness>) {
    // The workspace's sibling is outside every backend's roots; system paths such as
    // `/etc/passwd` are not a portable choice (bash may read them locally, and the policy
    // then judges the file tools' reads).
    let ws = Workspace::open(&h).await;
    put_outside(&ws, "secret.txt", "outside-secret\n");
    let secret = outside_backend(&ws, "secret.txt");
    let read = ws.call("read", json!({ "path": secret })).await;
    assert_outside(&read, &secret);
    assert!(read.text.contains(&format!("allowed roots: {secret} ")));
    let target = outside_backend(&ws, "new.txt");
    let write = ws
        .call("write", json!({"path": target, "content": "x"}))
        .await;
    assert_outside(&write, &target);
    assert!(!ws.outside("new.txt").exists());
    let dir = outside_backend(&ws, "");
    let dir = dir.trim_end_matches('/');
    let ls = ws.call("ls", json!({ "path": dir })).await;
    assert_outside(&ls, dir);
    assert_eq!(
        std::fs::read_to_string(ws.outside("secret.txt")).expect("read"),
        "outside-secret\n"
    );
}

pub async fn symlink_file_out(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    put_outside(&ws, "secret.txt", "outside-secret\n");
    ws.symlink(ws.outside("secret.txt"), "absolute-link");
    ws.symlink("../outside/secret.txt", "secret-link");
    for link in ["absolute-link", "secret-link"] {
        let read = ws.call("read", json!({ "path": link })).await;
        assert_outside(&read, link);
        let write = ws
            .call("write", json!({"path": link, "content": "overwritten\n"}))
            .await;
        assert_outside(&write, link);
        let edit = ws
            .call(
                "edit",
                json!({"path": link, "edits": [{"oldText": "outside", "newText": "x"}]}),
            )
            .await;
        assert_outside(&edit, link);
    }
    assert_eq!(
        std::fs::read_to_string(ws.outside("secret.txt")).expect("read"),
        "outside-secret\n"
    );
    // The links themselves are left alone.
    assert!(
        std::fs::symlink_metadata(ws.host("secret-link"))
            .expect("lstat")
            .file_type()
            .is_symlink()
    );
}

pub async fn symlink_directory_out(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    put_outside(&ws, "secret.txt", "outside-secret\n");
    ws.symlink(ws.outside(""), "abs-out-link");
    ws.symlink("../outside", "out-link");
    for (tool, args, requested) in [
        (
            "read",
            json!({"path": "abs-out-link/secret.txt"}),
            "abs-out-link/secret.txt",
        ),
        (
            "read",
            json!({"path": "out-link/secret.txt"}),
            "out-link/secret.txt",
        ),
        (
            "write",
            json!({"path": "out-link/new.txt", "content": "x"}),
            "out-link/new.txt",
        ),
        (
            "write",
            json!({"path": "out-link/deeper/new.txt", "content": "x"}),
            "out-link/deeper/new.txt",
        ),
        ("ls", json!({"path": "abs-out-link"}), "abs-out-link"),
        ("ls", json!({"path": "out-link"}), "out-link"),
        (
            "grep",
            json!({"pattern": "secret", "path": "abs-out-link"}),
            "abs-out-link",
        ),
        (
            "find",
            json!({"pattern": "*", "path": "out-link"}),
            "out-link",
        ),
    ] {
        let refused = ws.call(tool, args).await;
        assert_outside(&refused, requested);
    }
    assert!(!ws.outside("new.txt").exists());
    assert!(!ws.outside("deeper").exists());
    // A search of the workspace does not follow the links out either.
    ws.put("inside.txt", "outside-secret is not here\n");
    ws.call("grep", json!({"pattern": "secret"}))
        .await
        .assert_ok("inside.txt:1: outside-secret is not here");
}

pub async fn symlink_inside_is_followed(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("real/target.txt", "inside\n");
    ws.symlink("real/target.txt", "relative-link");
    ws.symlink(ws.backend_path("real/target.txt"), "absolute-link");
    ws.symlink("real", "dir-link");
    for path in ["relative-link", "absolute-link", "dir-link/target.txt"] {
        ws.call("read", json!({ "path": path }))
            .await
            .assert_ok("inside\n");
    }
    ws.call(
        "write",
        json!({"path": "dir-link/new.txt", "content": "via link\n"}),
    )
    .await
    .assert_ok("Successfully wrote 9 bytes to dir-link/new.txt");
    assert_eq!(ws.get_text("real/new.txt"), "via link\n");
}
