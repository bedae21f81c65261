//! `write`: parents created, the real UTF-8 byte count, atomic replacement keeping permissions.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use cordon_tests::{Harness, Workspace};
use serde_json::{Value, json};

pub async fn creates_parent_directories(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let write = ws
        .call(
            "write",
            json!({"path": "nested/dir/file.txt", "content": "hello"}),
        )
        .await;
    write.assert_ok("Successfully wrote 5 bytes to nested/dir/file.txt");
    assert_eq!(write.details(), Value::Null);
    assert_eq!(ws.get_text("nested/dir/file.txt"), "hello");
    // An absolute backend path works the same, and the message echoes what the model sent.
    let absolute = ws.backend_path("abs.txt").to_string_lossy().into_owned();
    ws.call("write", json!({"path": absolute, "content": "x\n"}))
        .await
        .assert_ok("Successfully wrote 2 bytes to $ROOT/abs.txt");
    assert_eq!(ws.get_text("abs.txt"), "x\n");
}

pub async fn reports_utf8_byte_count(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    // h(1) é(2) llo(3) 🙂(4): 10 bytes, although it is 7 UTF-16 code units.
    ws.call("write", json!({"path": "u.txt", "content": "héllo🙂"}))
        .await
        .assert_ok("Successfully wrote 10 bytes to u.txt");
    assert_eq!(ws.get("u.txt"), "héllo🙂".as_bytes());
    ws.call("write", json!({"path": "empty.txt", "content": ""}))
        .await
        .assert_ok("Successfully wrote 0 bytes to empty.txt");
    assert_eq!(ws.get("empty.txt"), b"");
}

pub async fn overwrite_keeps_permissions(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("run.sh", "#!/bin/sh\necho old\n");
    std::fs::set_permissions(ws.host("run.sh"), std::fs::Permissions::from_mode(0o750))
        .expect("chmod");
    ws.call(
        "write",
        json!({"path": "run.sh", "content": "#!/bin/sh\necho new\n"}),
    )
    .await
    .assert_ok("Successfully wrote 19 bytes to run.sh");
    assert_eq!(ws.get_text("run.sh"), "#!/bin/sh\necho new\n");
    let mode = std::fs::metadata(ws.host("run.sh"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o750, "the replaced file keeps its mode");
    // No temporary file is left next to it.
    let names: Vec<String> = std::fs::read_dir(ws.host_root())
        .expect("list")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(names, vec!["run.sh".to_owned()]);
}

pub async fn read_only_file_and_directory(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("ro.txt", "ro\n");
    std::fs::set_permissions(ws.host("ro.txt"), std::fs::Permissions::from_mode(0o444))
        .expect("chmod");
    // Judged as the unprivileged agent would be, whoever runs the backend.
    ws.call("write", json!({"path": "ro.txt", "content": "x"}))
        .await
        .assert_error("Could not write file: ro.txt. Error code: EACCES.");
    assert_eq!(ws.get_text("ro.txt"), "ro\n");
    ws.mkdir("sub");
    ws.call("write", json!({"path": "sub", "content": "x"}))
        .await
        .assert_error("Could not write file: sub. Error code: EISDIR.");
}
