//! File operations: the local backend's cases (confinement, protected `.git`, atomic write
//! keeping the mode, read_dir with a dangling symlink, canonical paths, spill files).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cordon_ops::{Backend, DirEntry, FileKind, FsError};
use tokio::io::AsyncWriteExt;

use crate::support::{host_or_skip, run, session, workspace};

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confinement_refuses_escapes_and_changes_nothing_outside() {
    let host = host_or_skip!();
    let ws = workspace();
    let outside = tempfile::tempdir().expect("outside dir");
    std::fs::write(outside.path().join("secret"), "host secret").expect("write");
    std::fs::write(ws.path().join("a.txt"), "inside").expect("write");
    std::os::unix::fs::symlink("/etc/passwd", ws.path().join("to-etc")).expect("symlink");
    std::os::unix::fs::symlink("/etc", ws.path().join("etc-dir")).expect("symlink");
    std::os::unix::fs::symlink("a.txt", ws.path().join("to-a")).expect("symlink");
    let backend = session(&host, ws.path()).await;
    let files = backend.files();

    assert_eq!(
        files
            .read_file(&p("/workspace/to-a"))
            .await
            .expect("inner link"),
        b"inside"
    );
    for path in [
        "/workspace/../etc/passwd",
        "/etc/passwd",
        "/workspace/to-etc",
        "/workspace/etc-dir/hostname",
    ] {
        let err = files.read_file(&p(path)).await.expect_err(path);
        assert!(
            matches!(err, FsError::OutsideRoot { .. }),
            "{path}: {err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("path is outside the allowed roots: {path}")
        );
    }
    for path in [
        "/workspace/to-etc",
        "/workspace/etc-dir/new",
        "/tmp/x",
        "/workspace/../tmp/y",
    ] {
        let err = files.write_file(&p(path), b"x").await.expect_err(path);
        assert!(
            matches!(err, FsError::OutsideRoot { .. }),
            "{path}: {err:?}"
        );
    }
    let err = files
        .create_dir_all(&p("/workspace/etc-dir/sub"))
        .await
        .expect_err("mkdir out");
    assert!(matches!(err, FsError::OutsideRoot { .. }), "{err:?}");
    let err = files
        .canonicalize(&p("/workspace/to-etc"))
        .await
        .expect_err("canon out");
    assert!(matches!(err, FsError::OutsideRoot { .. }), "{err:?}");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).expect("read"),
        "host secret"
    );
    backend.shutdown().await.expect("shut the session down");
    // After the session: no temp file, and the empty `.cordon` made to mount it read-only
    // is gone again.
    let names: Vec<_> = std::fs::read_dir(ws.path())
        .expect("ls")
        .map(|e| e.expect("e").file_name())
        .collect();
    assert_eq!(names.len(), 4, "nothing left behind: {names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_git_is_readable_but_never_writable() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::create_dir_all(ws.path().join(".git/refs")).expect("mkdir");
    std::fs::write(ws.path().join(".git/config"), "[core]\n").expect("write");
    std::os::unix::fs::symlink(".git/config", ws.path().join("gitcfg")).expect("symlink");
    let backend = session(&host, ws.path()).await;
    let files = backend.files();
    assert_eq!(
        files
            .read_file(&p("/workspace/.git/config"))
            .await
            .expect("read"),
        b"[core]\n"
    );
    for path in [
        "/workspace/.git/config",
        "/workspace/gitcfg",
        "/workspace/.git/new",
        "/workspace/.git",
    ] {
        let err = files.write_file(&p(path), b"x").await.expect_err(path);
        assert!(
            matches!(
                err,
                FsError::Protected { .. } | FsError::IsADirectory { .. }
            ),
            "{path}: {err:?}"
        );
    }
    let err = files
        .create_dir_all(&p("/workspace/.git/refs/x"))
        .await
        .expect_err("mkdir");
    assert!(matches!(err, FsError::Protected { .. }), "{err:?}");
    let meta = files
        .metadata(&p("/workspace/.git/config"))
        .await
        .expect("stat");
    assert!(!meta.writable);
    // Commands cannot change it either: it is mounted read-only.
    let ran = run(
        &backend,
        "echo x >> .git/config 2>&1; mv .git .git-old 2>&1; rm -rf .git 2>&1; cat .git/config",
    )
    .await;
    assert!(
        ran.output.contains("Read-only file system"),
        "{}",
        ran.output
    );
    assert!(ran.output.ends_with("[core]\n"), "{}", ran.output);
    assert_eq!(
        std::fs::read_to_string(ws.path().join(".git/config")).expect("read"),
        "[core]\n"
    );
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_write_keeps_mode_and_follows_inner_symlinks() {
    let host = host_or_skip!();
    let ws = workspace();
    let target = ws.path().join("script.sh");
    std::fs::write(&target, "old").expect("write");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    std::os::unix::fs::symlink("script.sh", ws.path().join("alias.sh")).expect("symlink");
    let backend = session(&host, ws.path()).await;
    let files = backend.files();
    files
        .write_file(&p("/workspace/alias.sh"), b"new\ncontent\0bytes")
        .await
        .expect("write");
    assert_eq!(
        std::fs::read(&target).expect("read"),
        b"new\ncontent\0bytes"
    );
    assert_eq!(
        std::fs::metadata(&target)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777,
        0o750
    );
    assert!(
        std::fs::symlink_metadata(ws.path().join("alias.sh"))
            .expect("lstat")
            .file_type()
            .is_symlink()
    );
    files
        .write_file(&p("/workspace/fresh.txt"), b"")
        .await
        .expect("write new");
    assert_eq!(
        std::fs::metadata(ws.path().join("fresh.txt"))
            .expect("stat")
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    files
        .write_file(&p("/workspace/big.bin"), &big)
        .await
        .expect("write big");
    assert_eq!(
        files
            .read_file(&p("/workspace/big.bin"))
            .await
            .expect("read big"),
        big
    );
    assert_eq!(
        files
            .read_head(&p("/workspace/big.bin"), 10)
            .await
            .expect("head"),
        &big[..10]
    );
    for (offset, len) in [(0, 10), (1_000, 300_000), (2_999_990, 100), (3_000_000, 5)] {
        let end = (offset + len).min(big.len());
        assert_eq!(
            files
                .read_range(&p("/workspace/big.bin"), offset as u64, len)
                .await
                .expect("range"),
            &big[offset..end],
            "{offset}+{len}"
        );
    }

    let err = files
        .write_file(&p("/workspace/missing-dir/x"), b"x")
        .await
        .expect_err("no parent");
    assert!(matches!(err, FsError::NotFound { .. }), "{err:?}");
    let err = files
        .write_file(&p("/workspace"), b"x")
        .await
        .expect_err("dir");
    assert!(matches!(err, FsError::IsADirectory { .. }), "{err:?}");
    let err = files
        .read_file(&p("/workspace/nope"))
        .await
        .expect_err("missing");
    assert!(matches!(err, FsError::NotFound { .. }), "{err:?}");
    let err = files.read_file(&p("/workspace")).await.expect_err("dir");
    assert!(matches!(err, FsError::IsADirectory { .. }), "{err:?}");
    let names: Vec<String> = std::fs::read_dir(ws.path())
        .expect("ls")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .filter(|n| {
            cordon_ops::leftovers::is_write_temp_name(n.as_bytes()) || n.contains("cordon-tmp")
        })
        .collect();
    assert_eq!(names, Vec::<String>::new());
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_dir_metadata_mkdir_and_canonical_paths() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::create_dir(ws.path().join("dir")).expect("mkdir");
    std::fs::write(ws.path().join("file"), "12345").expect("write");
    std::os::unix::fs::symlink("nowhere", ws.path().join("dangling")).expect("symlink");
    std::os::unix::fs::symlink("dir", ws.path().join("dirlink")).expect("symlink");
    std::fs::write(ws.path().join(".hidden"), "").expect("write");
    let backend = session(&host, ws.path()).await;
    let files = backend.files();
    let mut entries = files.read_dir(&p("/workspace")).await.expect("list");
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(
        entries,
        vec![
            DirEntry {
                name: ".hidden".into(),
                kind: Some(FileKind::File),
                error: None
            },
            DirEntry {
                name: "dangling".into(),
                kind: None,
                error: Some("No such file or directory (os error 2)".into()),
            },
            DirEntry {
                name: "dir".into(),
                kind: Some(FileKind::Dir),
                error: None
            },
            DirEntry {
                name: "dirlink".into(),
                kind: Some(FileKind::Dir),
                error: None
            },
            DirEntry {
                name: "file".into(),
                kind: Some(FileKind::File),
                error: None
            },
        ]
    );
    let meta = files.metadata(&p("/workspace/file")).await.expect("stat");
    assert_eq!(
        (meta.kind, meta.size, meta.writable),
        (FileKind::File, 5, true)
    );
    let err = files
        .read_dir(&p("/workspace/file"))
        .await
        .expect_err("not a dir");
    assert!(matches!(err, FsError::NotADirectory { .. }), "{err:?}");
    assert_eq!(
        files
            .canonicalize(&p("/workspace/dirlink/new/deeper"))
            .await
            .expect("canon"),
        p("/workspace/dir/new/deeper")
    );
    assert_eq!(
        files
            .canonicalize(&p("/workspace/./dir/../file"))
            .await
            .expect("canon"),
        p("/workspace/file")
    );
    files
        .create_dir_all(&p("/workspace/dirlink/a/b"))
        .await
        .expect("mkdir");
    assert!(ws.path().join("dir/a/b").is_dir());
    assert_eq!(files.root(), Path::new("/workspace"));
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spill_files_outlive_the_session() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = session(&host, ws.path()).await;
    let (path, mut writer) = backend.files().create_spill_file().await.expect("spill");
    assert!(path.starts_with("/cordon-spill"), "{path:?}");
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name")
        .to_owned();
    assert!(
        name.starts_with("cordon-bash-") && name.ends_with(".log"),
        "{name}"
    );
    writer.write_all(b"line 1\n").await.expect("write");
    writer.write_all(b"line 2\n").await.expect("write");
    writer.shutdown().await.expect("close");
    assert_eq!(
        backend.files().read_file(&path).await.expect("read"),
        b"line 1\nline 2\n"
    );
    let err = backend
        .files()
        .write_file(&path, b"x")
        .await
        .expect_err("spill is read-only to file ops");
    assert!(matches!(err, FsError::PermissionDenied { .. }), "{err:?}");
    backend.shutdown().await.expect("shut the session down");

    let later = session(&host, ws.path()).await;
    assert_eq!(
        later.files().read_file(&path).await.expect("read later"),
        b"line 1\nline 2\n"
    );
    later.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_workspace_refuses_writes_from_files_and_commands() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("a.txt"), "keep").expect("write");
    let mut config = crate::support::config(&host, ws.path());
    config.spec.workspace = cordon_core::sandbox::RootAccess::ReadOnly;
    config.spec.limits.cpus = Some(64.0);
    let backend = cordon_backend_docker::DockerBackend::start(config)
        .await
        .expect("start");
    let files = backend.files();
    assert_eq!(
        files.read_file(&p("/workspace/a.txt")).await.expect("read"),
        b"keep"
    );
    let err = files
        .write_file(&p("/workspace/a.txt"), b"x")
        .await
        .expect_err("read-only");
    assert!(matches!(err, FsError::PermissionDenied { .. }), "{err:?}");
    let err = files
        .create_dir_all(&p("/workspace/d"))
        .await
        .expect_err("read-only");
    assert!(matches!(err, FsError::PermissionDenied { .. }), "{err:?}");
    assert!(
        !files
            .metadata(&p("/workspace/a.txt"))
            .await
            .expect("stat")
            .writable
    );
    let ran = run(&backend, "echo x > a.txt; touch b.txt; cat a.txt").await;
    assert_eq!(
        ran.output,
        "bash: line 1: a.txt: Read-only file system\ntouch: cannot touch 'b.txt': Read-only file system\nkeep"
    );
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_paths_are_hidden_from_commands_too() {
    for mode in [
        cordon_backend_docker::WorkspaceMode::Bind,
        cordon_backend_docker::WorkspaceMode::Copy,
    ] {
        let host = host_or_skip!();
        let ws = workspace();
        std::fs::write(ws.path().join(".env"), "TOKEN=hunter2\n").expect("write");
        std::fs::create_dir_all(ws.path().join("app")).expect("mkdir");
        std::fs::write(ws.path().join("app/.env"), "TOKEN=hunter3\n").expect("write");
        std::fs::create_dir_all(ws.path().join("secrets")).expect("mkdir");
        std::fs::write(ws.path().join("secrets/key"), "hunter4\n").expect("write");
        std::fs::write(ws.path().join("visible.txt"), "fine\n").expect("write");
        let mut config = crate::support::config(&host, ws.path());
        config.mode = mode;
        config.spec.denied = vec!["**/.env".to_owned(), "secrets/**".to_owned()];
        let backend = cordon_backend_docker::DockerBackend::start(config)
            .await
            .expect("start");
        let ran = run(
            &backend,
            "cat .env app/.env secrets/key visible.txt 2>/dev/null; grep -rs hunter . | wc -l",
        )
        .await;
        assert_eq!(ran.output, "fine\n0\n", "{mode:?}");
        let err = backend
            .files()
            .read_file(&p("/workspace/.env"))
            .await
            .expect_err("denied");
        assert!(matches!(err, FsError::Denied { .. }), "{mode:?}: {err:?}");
        let err = backend
            .files()
            .read_file(&p("/workspace/secrets/key"))
            .await
            .expect_err("denied");
        assert!(matches!(err, FsError::Denied { .. }), "{mode:?}: {err:?}");
        let err = backend
            .files()
            .write_file(&p("/workspace/app/.env"), b"x")
            .await
            .expect_err("denied");
        assert!(matches!(err, FsError::Denied { .. }), "{mode:?}: {err:?}");
        assert!(backend.missing_layers().is_empty());
        backend.shutdown().await.expect("shut the session down");
        assert_eq!(
            std::fs::read_to_string(ws.path().join(".env")).expect("read"),
            "TOKEN=hunter2\n"
        );
        assert_eq!(
            std::fs::read_to_string(ws.path().join("secrets/key")).expect("read"),
            "hunter4\n"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_after_a_refused_write_are_unaffected() {
    // A write the helper refuses before reading its data (missing parent, a directory)
    // must not leave that data in front of the next request to the same worker.
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("a.txt"), "alpha").expect("write");
    let backend = session(&host, ws.path()).await;
    let files = backend.files();
    let in_time = std::time::Duration::from_secs(30);
    for (target, payload) in [
        ("/workspace/missing/x", b"x".repeat(3)),
        ("/workspace", b"y".repeat(200_000)),
    ] {
        let refused = tokio::time::timeout(in_time, files.write_file(&p(target), &payload))
            .await
            .expect("the refused write returns");
        assert!(refused.is_err(), "{target}");
        let read = tokio::time::timeout(in_time, files.read_file(&p("/workspace/a.txt")))
            .await
            .expect("the next operation is served");
        assert_eq!(read.expect("read"), b"alpha");
        tokio::time::timeout(in_time, files.write_file(&p("/workspace/b.txt"), b"beta"))
            .await
            .expect("the next write is served")
            .expect("write");
        assert_eq!(std::fs::read(ws.path().join("b.txt")).expect("b"), b"beta");
    }
    backend.shutdown().await.expect("shut the session down");
}
