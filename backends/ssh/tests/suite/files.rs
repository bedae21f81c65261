//! File operations over SFTP: confinement (symlinks out, `..`, absolute paths), protected and
//! denied paths, atomic writes keeping the mode, listings with dangling symlinks, spill files.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::PathBuf;

use cordon_backend_ssh::{SshBackend, SshConfig};
use cordon_core::sandbox::SandboxSpec;
use cordon_ops::leftovers::{SPILL_SWEEP_INTERVAL, SPILL_SWEEP_STAMP};
use cordon_ops::{Backend, FileKind, FsError};
use tokio::io::AsyncWriteExt;

use super::support::{Server, server};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_roundtrip_keeps_mode_and_leaves_no_temp_files() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let files = backend.files();
    let ws = server.workspace.canonicalize().unwrap();
    assert_eq!(files.root(), ws.as_path());
    assert!(backend.id().as_str().starts_with("ssh:root@127.0.0.1:"));
    assert!(
        backend
            .id()
            .as_str()
            .ends_with(&format!(":{}", ws.display()))
    );

    let script = ws.join("run.sh");
    std::fs::write(&script, "old").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o751)).unwrap();
    files
        .write_file(&script, b"#!/bin/sh\necho new\n")
        .await
        .unwrap();
    assert_eq!(std::fs::read(&script).unwrap(), b"#!/bin/sh\necho new\n");
    assert_eq!(mode(&script), 0o751);

    // A big file crosses many pipelined SFTP requests.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let path = ws.join("big.bin");
    files.write_file(&path, &big).await.unwrap();
    assert_eq!(files.read_file(&path).await.unwrap(), big);
    assert_eq!(
        files.read_head(&path, 1000).await.unwrap(),
        big[..1000].to_vec()
    );
    for (offset, len) in [(0, 10), (1_000, 300_000), (2_999_990, 100), (3_000_000, 5)] {
        let end = (offset + len).min(big.len());
        assert_eq!(
            files.read_range(&path, offset as u64, len).await.unwrap(),
            big[offset..end].to_vec(),
            "{offset}+{len}"
        );
    }
    assert_eq!(mode(&path), 0o644);

    let leftovers: Vec<String> = std::fs::read_dir(&ws)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("cordon-"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");

    // Writing through a symlink replaces the file it points to.
    let target = ws.join("target.txt");
    std::fs::write(&target, "t").unwrap();
    symlink("target.txt", ws.join("link.txt")).unwrap();
    files
        .write_file(&ws.join("link.txt"), b"via link")
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "via link");
    assert!(
        std::fs::symlink_metadata(ws.join("link.txt"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_match_the_local_backend() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let files = backend.files();
    let ws = server.workspace.canonicalize().unwrap();
    std::fs::create_dir(ws.join("dir")).unwrap();
    std::fs::write(ws.join("file"), "x").unwrap();
    assert!(matches!(
        files.read_file(&ws.join("missing")).await,
        Err(FsError::NotFound { .. })
    ));
    assert!(matches!(
        files.read_file(&ws.join("dir")).await,
        Err(FsError::IsADirectory { .. })
    ));
    assert!(matches!(
        files.write_file(&ws.join("dir"), b"x").await,
        Err(FsError::IsADirectory { .. })
    ));
    assert!(matches!(
        files.write_file(&ws.join("nodir/new.txt"), b"x").await,
        Err(FsError::NotFound { .. })
    ));
    assert!(matches!(
        files.read_dir(&ws.join("file")).await,
        Err(FsError::NotADirectory { .. })
    ));
    files.create_dir_all(&ws.join("a/b/c")).await.unwrap();
    assert!(ws.join("a/b/c").is_dir());
    files.create_dir_all(&ws.join("a/b/c")).await.unwrap();
    let meta = files.metadata(&ws.join("file")).await.unwrap();
    assert_eq!(
        (meta.kind, meta.size, meta.mode),
        (FileKind::File, 1, 0o644)
    );
    assert!(meta.writable);
    assert_eq!(
        files.metadata(&ws.join("dir")).await.unwrap().kind,
        FileKind::Dir
    );
    // Canonical paths: symlinks resolved, a missing tail joined to the canonical parent.
    symlink("dir", ws.join("dlink")).unwrap();
    assert_eq!(
        files.canonicalize(&ws.join("dlink/new/x")).await.unwrap(),
        ws.join("dir/new/x")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confinement_protected_and_denied() {
    let Some(server) = server() else { return };
    let mut config = server.config();
    config.spec = SandboxSpec {
        protected: vec![".git/**".into()],
        denied: vec!["**/.env".into()],
        ..SandboxSpec::default()
    };
    let backend = SshBackend::connect(config).await.unwrap();
    let files = backend.files();
    let ws = server.workspace.canonicalize().unwrap();
    let outside = server.dir.path().join("outside.txt");
    std::fs::write(&outside, "secret").unwrap();
    symlink(&outside, ws.join("escape")).unwrap();
    symlink("/etc", ws.join("etc")).unwrap();

    for path in [
        ws.join("escape"),
        ws.join("etc/hostname"),
        outside.clone(),
        PathBuf::from("/etc/passwd"),
        ws.join("../outside.txt"),
    ] {
        match files.read_file(&path).await {
            Err(FsError::OutsideRoot { .. }) => {}
            other => panic!(
                "read {} should be OutsideRoot, got {other:?}",
                path.display()
            ),
        }
    }
    assert!(matches!(
        files.write_file(&ws.join("escape"), b"x").await,
        Err(FsError::OutsideRoot { .. })
    ));
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "secret");
    assert!(matches!(
        files.write_file(&ws.join("etc/new"), b"x").await,
        Err(FsError::OutsideRoot { .. })
    ));

    std::fs::create_dir(ws.join(".git")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]").unwrap();
    assert_eq!(
        files.read_file(&ws.join(".git/config")).await.unwrap(),
        b"[core]"
    );
    assert!(matches!(
        files.write_file(&ws.join(".git/config"), b"x").await,
        Err(FsError::Protected { .. })
    ));
    assert!(matches!(
        files.create_dir_all(&ws.join(".git/hooks")).await,
        Err(FsError::Protected { .. })
    ));
    assert!(
        !files
            .metadata(&ws.join(".git/config"))
            .await
            .unwrap()
            .writable
    );

    std::fs::write(ws.join(".env"), "TOKEN=1").unwrap();
    assert!(matches!(
        files.read_file(&ws.join(".env")).await,
        Err(FsError::Denied { .. })
    ));
    assert!(matches!(
        files.write_file(&ws.join(".env"), b"x").await,
        Err(FsError::Denied { .. })
    ));
    assert!(matches!(
        files.canonicalize(&ws.join(".env")).await,
        Err(FsError::Denied { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_dir_reports_dangling_and_escaping_links() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let files = backend.files();
    let ws = server.workspace.canonicalize().unwrap();
    std::fs::write(ws.join("f"), "").unwrap();
    std::fs::create_dir(ws.join("d")).unwrap();
    symlink("nowhere", ws.join("dangling")).unwrap();
    symlink("/etc", ws.join("out")).unwrap();
    symlink("f", ws.join("good")).unwrap();
    let mut entries = files.read_dir(&ws).await.unwrap();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let summary: Vec<(String, Option<FileKind>, Option<String>)> = entries
        .into_iter()
        .map(|e| (e.name, e.kind, e.error))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("d".into(), Some(FileKind::Dir), None),
            (
                "dangling".into(),
                None,
                Some("dangling symlink (its target does not exist)".into())
            ),
            ("f".into(), Some(FileKind::File), None),
            ("good".into(), Some(FileKind::File), None),
            (
                "out".into(),
                None,
                Some("symlink points outside the allowed roots".into())
            ),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spill_files_live_on_the_remote_and_are_readable_later() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let files = backend.files();
    let (path, mut writer) = files.create_spill_file().await.unwrap();
    assert!(path.starts_with(backend.spill_dir()));
    let body: Vec<u8> = (0..200_000u32)
        .flat_map(|i| format!("line {i}\n").into_bytes())
        .collect();
    writer.write_all(&body).await.unwrap();
    writer.shutdown().await.unwrap();
    assert_eq!(files.read_file(&path).await.unwrap(), body);
    assert_eq!(mode(&path), 0o600);
    assert!(matches!(
        files.write_file(&path, b"x").await,
        Err(FsError::PermissionDenied { .. })
    ));
    // A later backend on the same root still reads it.
    backend.shutdown().await.expect("shut the session down");
    let again = server.connect().await;
    assert_eq!(again.spill_dir(), backend.spill_dir());
    assert_eq!(again.files().read_file(&path).await.unwrap(), body);
}

fn aged(path: &std::path::Path, age: std::time::Duration) {
    let file = std::fs::File::open(path).unwrap();
    file.set_modified(std::time::SystemTime::now() - age)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_sweeps_expired_spill_files_of_every_root_and_only_cordon_names() {
    let Some(server) = server() else { return };
    let config = private_state(&server);
    let backend = connect(config.clone()).await;
    let parent = backend.spill_dir().parent().unwrap().to_path_buf();
    let day = std::time::Duration::from_secs(24 * 60 * 60);
    let hex = || format!("{:016x}", fastrand::u64(..));
    // A root with an expired and a young spill file, a foreign file and a symlink.
    let mixed = parent.join(hex());
    std::fs::create_dir(&mixed).unwrap();
    let expired = mixed.join(format!("cordon-bash-{}.log", hex()));
    let young = mixed.join(format!("cordon-bash-{}.log", hex()));
    let foreign = mixed.join("notes.log");
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join(format!("cordon-bash-{}.log", hex()));
    let link = mixed.join(format!("cordon-bash-{}.log", hex()));
    for file in [&expired, &young, &foreign, &target] {
        std::fs::write(file, b"spill").unwrap();
    }
    symlink(&target, &link).unwrap();
    for file in [&expired, &foreign, &target] {
        aged(file, day * 2);
    }
    // A root whose only file expired and that nobody touched for two days.
    let idle = parent.join(hex());
    std::fs::create_dir(&idle).unwrap();
    let idle_file = idle.join(format!("cordon-bash-{}.log", hex()));
    std::fs::write(&idle_file, b"spill").unwrap();
    aged(&idle_file, day * 3);
    aged(&idle, day * 2);
    // The first connect swept and stamped; the stamp is made older than the interval.
    aged(&parent.join(SPILL_SWEEP_STAMP), SPILL_SWEEP_INTERVAL * 2);

    let again = connect(config).await;
    assert!(!expired.exists() && !idle_file.exists());
    assert!(!idle.exists(), "an idle emptied root directory goes");
    assert!(young.exists() && foreign.exists() && target.exists());
    assert!(std::fs::symlink_metadata(&link).is_ok());
    assert!(
        again.spill_dir().exists(),
        "the session's own directory stays"
    );
    std::fs::remove_dir_all(&mixed).unwrap();
    backend.shutdown().await.expect("shut the session down");
    again.shutdown().await.expect("shut the session down");
}

/// The server's config with a state directory of this test's own, so that no other test's
/// connect renews the sweep stamp this test relies on.
fn private_state(server: &Server) -> SshConfig {
    let mut config = server.config();
    config.state_dir = Some(server.dir.path().join("state"));
    config
}

async fn connect(config: SshConfig) -> SshBackend {
    SshBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// Connect and shut down again (the sweep runs within the connect).
async fn connect_once(config: SshConfig) {
    connect(config)
        .await
        .shutdown()
        .await
        .expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spill_sweep_runs_once_per_interval_and_never_follows_a_planted_stamp() {
    let Some(server) = server() else { return };
    let config = private_state(&server);
    let first = connect(config.clone()).await;
    let parent = first.spill_dir().parent().unwrap().to_path_buf();
    assert!(parent.starts_with(server.dir.path().join("state")));
    let stamp = parent.join(SPILL_SWEEP_STAMP);
    assert!(
        stamp.symlink_metadata().unwrap().is_file(),
        "the sweep left its stamp"
    );
    let expired = first
        .spill_dir()
        .join(format!("cordon-bash-{:016x}.log", fastrand::u64(..)));
    std::fs::write(&expired, b"spill").unwrap();
    aged(&expired, std::time::Duration::from_secs(3 * 24 * 60 * 60));

    // Within the interval another connect does not list the spill directories.
    connect_once(config.clone()).await;
    assert!(
        expired.exists(),
        "a connect within the interval does not sweep"
    );

    // A stamp replaced by a symlink is not followed: its target keeps its time, and the
    // doubt means a sweep.
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("victim");
    std::fs::write(&target, b"keep").unwrap();
    aged(&target, std::time::Duration::from_secs(5 * 24 * 60 * 60));
    let target_time = std::fs::metadata(&target).unwrap().modified().unwrap();
    std::fs::remove_file(&stamp).unwrap();
    symlink(&target, &stamp).unwrap();
    connect_once(config.clone()).await;
    assert!(!expired.exists(), "a planted stamp means a sweep");
    assert_eq!(
        std::fs::metadata(&target).unwrap().modified().unwrap(),
        target_time
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    assert!(
        stamp.symlink_metadata().unwrap().is_file(),
        "the symlink was replaced by a new stamp"
    );

    // Once the stamp is older than the interval, the next connect sweeps again.
    let second = first
        .spill_dir()
        .join(format!("cordon-bash-{:016x}.log", fastrand::u64(..)));
    std::fs::write(&second, b"spill").unwrap();
    aged(&second, std::time::Duration::from_secs(3 * 24 * 60 * 60));
    connect_once(config.clone()).await;
    assert!(
        second.exists(),
        "the renewed stamp holds the next sweep back"
    );
    aged(
        &stamp,
        SPILL_SWEEP_INTERVAL + std::time::Duration::from_secs(1),
    );
    connect_once(config).await;
    assert!(!second.exists(), "an old stamp lets the next connect sweep");
    first.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spill_directory_removed_by_another_sweep_is_made_again() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    std::fs::remove_dir(backend.spill_dir()).unwrap();
    let (path, mut writer) = backend.files().create_spill_file().await.unwrap();
    writer.write_all(b"output").await.unwrap();
    writer.shutdown().await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"output");
    assert_eq!(mode(backend.spill_dir()), 0o700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_helper_connect_keeps_a_write_temp_whose_writer_holds_its_lock() {
    let Some(server) = server() else { return };
    let ws = server.workspace.canonicalize().unwrap();
    let held = ws.join(".a.txt.cordon-0123456789abcdef.tmp");
    let stale = ws.join(".b.txt.cordon-fedcba9876543210.tmp");
    for file in [&held, &stale] {
        std::fs::write(file, b"half").unwrap();
        aged(file, std::time::Duration::from_secs(20 * 60));
    }
    // A writer in another session's helper holds its temp file's lock until the rename.
    let writer = std::fs::File::open(&held).unwrap();
    writer.try_lock().unwrap();
    let backend = SshBackend::connect(server.helper_config()).await.unwrap();
    assert!(backend.helper_report().is_some(), "the helper does not run");
    assert!(
        held.exists(),
        "a locked write temp file was removed at connect (by the remote find, which cannot see locks)"
    );
    assert!(
        !stale.exists(),
        "the helper's start removes an unlocked stale temp file"
    );
    drop(writer);
    std::fs::remove_file(&held).unwrap();
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_removes_stale_write_temp_files_and_keeps_live_ones() {
    let Some(server) = server() else { return };
    let ws = server.workspace.canonicalize().unwrap();
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    let stale = ws.join("sub/.a.txt.cordon-0123456789abcdef.tmp");
    let live = ws.join(".b.txt.cordon-fedcba9876543210.tmp");
    let foreign = ws.join(".a.txt.cordon-draft.tmp");
    for file in [&stale, &live, &foreign] {
        std::fs::write(file, b"half").unwrap();
    }
    // A killed writer's file stops changing; one older than ten minutes is nobody's.
    let twenty_minutes = std::time::Duration::from_secs(20 * 60);
    aged(&stale, twenty_minutes);
    aged(&foreign, twenty_minutes);
    let backend = server.connect().await;
    assert!(!stale.exists(), "a stale temp file is removed at connect");
    assert!(
        live.exists(),
        "a temp file modified a moment ago may be a write in flight"
    );
    assert!(foreign.exists(), "only Cordon's exact naming is removed");
    std::fs::remove_file(&live).unwrap();
    std::fs::remove_file(&foreign).unwrap();
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_directory_below_a_directory_others_can_write_is_refused() {
    let Some(server) = server() else { return };
    let shared = server.dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut config = server.config();
    config.state_dir = Some(shared.join("state"));
    let error = SshBackend::connect(config).await.unwrap_err().to_string();
    assert!(
        error.contains(&format!(
            "the state directory is unsafe: {} is writable by its group or by others and not \
             sticky",
            shared.display()
        )),
        "{error}"
    );
    assert!(!shared.join("state").join("spill").exists());
    // Sticky, like /tmp: fine.
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let mut config = server.config();
    config.state_dir = Some(shared.join("state"));
    let backend = SshBackend::connect(config).await.expect("connect");
    assert!(
        backend
            .spill_dir()
            .starts_with(shared.join("state").join("spill"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_or_symlinked_state_directory_is_refused() {
    let Some(server) = server() else { return };
    let mut config = server.config();
    config.state_dir = Some(PathBuf::from("relative/state"));
    let error = SshBackend::connect(config).await.unwrap_err().to_string();
    assert!(error.contains("not an absolute"), "{error}");

    let outside = tempfile::tempdir().unwrap();
    let link = server.dir.path().join("linked-state");
    symlink(outside.path(), &link).unwrap();
    let mut config = server.config();
    config.state_dir = Some(link);
    let error = SshBackend::connect(config).await.unwrap_err().to_string();
    assert!(error.contains("is a symlink"), "{error}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}
