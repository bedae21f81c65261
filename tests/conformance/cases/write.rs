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
        // An empty `.cordon` the docker backend made to mount it read-only is no temp file.
        .filter(|name| name != ".cordon")
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

/// A small tmpfs mounted at a directory of the workspace, unmounted (lazily) on drop.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    /// Mount a `size`-byte tmpfs at `dir` (created; the suites run as root).
    fn mount(dir: std::path::PathBuf, size: &str) -> SmallDisk {
        std::fs::create_dir_all(&dir).expect("create the mount point");
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0777"),
                "tmpfs",
            ])
            .arg(&dir)
            .status()
            .expect("failed to run mount (the suites need root for a small tmpfs)");
        assert!(
            status.success(),
            "failed to mount a tmpfs at {}",
            dir.display()
        );
        SmallDisk(dir)
    }

    /// Fill what is left of the disk with `filler` until the kernel says it is full.
    fn fill(&self) {
        use std::io::Write;
        let mut file = std::fs::File::create(self.0.join("filler")).expect("create filler");
        let block = vec![b'f'; 4096];
        loop {
            match file.write_all(&block) {
                Ok(()) => {}
                Err(error) if error.raw_os_error() == Some(28) => break,
                Err(error) => panic!("failed to fill the small disk: {error}"),
            }
        }
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .expect("list the small disk")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// On a full disk `write` and `edit` fail with a clear error, the old file stays as it was and
/// no temporary file is left; once there is room again the same write works.
pub async fn full_disk_keeps_the_old_file(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open(&h).await;
    let disk = SmallDisk::mount(ws.host("full"), "256k");
    // A session sees mounts that exist when it starts (a container's bind mount is taken then).
    ws.restart().await;
    ws.put("full/keep.txt", "old contents\n");
    disk.fill();
    let big = "n".repeat(64 * 1024);

    let write = ws
        .call("write", json!({"path": "full/keep.txt", "content": big}))
        .await;
    assert!(write.is_error(), "{}", write.text);
    assert!(write.text.contains("full/keep.txt"), "{}", write.text);
    assert!(write.text.contains("ENOSPC"), "{}", write.text);
    let edit = ws
        .call(
            "edit",
            json!({"path": "full/keep.txt", "edits": [{"oldText": "old", "newText": big}]}),
        )
        .await;
    assert!(edit.is_error(), "{}", edit.text);
    assert!(edit.text.contains("ENOSPC"), "{}", edit.text);
    assert_eq!(ws.get_text("full/keep.txt"), "old contents\n");
    assert_eq!(
        disk.names(),
        ["filler", "keep.txt"],
        "no temporary file is left"
    );

    std::fs::remove_file(ws.host("full/filler")).expect("free the disk");
    ws.call("write", json!({"path": "full/keep.txt", "content": big}))
        .await
        .assert_ok("Successfully wrote 65536 bytes to full/keep.txt");
    assert_eq!(ws.get_text("full/keep.txt"), big);
}
