//! Spill files and the per-user state directory.

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::time::{Duration, SystemTime};

use cordon_backend_local::{LocalBackend, LocalConfig, LocalError};
use cordon_ops::{Backend, FsError};
use tokio::io::AsyncWriteExt;

use super::support::{Fixture, names, require_root, test_spec};

fn uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// A spill file is created 0600 in a 0700 directory, can be read back through read_file,
/// also by a later backend over the same root, but not written through write_file.
#[tokio::test]
async fn spill_files_are_private_and_readable_later() {
    let fx = Fixture::new();
    let files = fx.files();
    let (path, mut writer) = files.create_spill_file().await.unwrap();
    writer.write_all(b"full output\nline 2\n").await.unwrap();
    writer.shutdown().await.unwrap();
    drop(writer);

    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("cordon-bash-") && name.ends_with(".log"),
        "{name}"
    );
    assert_eq!(name.len(), "cordon-bash-".len() + 16 + ".log".len());
    let spill_dir = path.parent().unwrap();
    assert_eq!(spill_dir, fx.backend.spill_dir());
    let user_dir = fx.state.join(format!("cordon-{}", uid()));
    assert_eq!(spill_dir.parent().unwrap(), user_dir.join("spill"));
    for dir in [&user_dir, &user_dir.join("spill"), &spill_dir.to_path_buf()] {
        let meta = std::fs::metadata(dir).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o777,
            0o700,
            "{}",
            dir.display()
        );
        assert_eq!(meta.uid(), uid());
    }
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        files.read_file(&path).await.unwrap(),
        b"full output\nline 2\n"
    );
    assert!(matches!(
        files.write_file(&path, b"tampered").await,
        Err(FsError::PermissionDenied { .. })
    ));

    let (second, _) = files.create_spill_file().await.unwrap();
    assert_ne!(second, path);

    // A later backend (a one-shot `cordon exec`, a new session) over the same root.
    let later = LocalBackend::new(LocalConfig {
        profile: cordon_backend_local::Profile::Host,
        workspace_is_copy: false,
        root: fx.ws.clone(),
        spec: test_spec(),
        home: None,
        state_base: Some(fx.state.clone()),
    })
    .unwrap();
    assert_eq!(later.spill_dir(), fx.backend.spill_dir());
    assert_eq!(
        later.files().read_file(&path).await.unwrap(),
        b"full output\nline 2\n"
    );
}

/// Spill files older than 24 h are deleted when a backend starts (at most once a minute);
/// fresh ones and unrelated files stay.
#[test]
fn old_spill_files_are_cleaned_at_start() {
    let fx = Fixture::new();
    let spill = fx.backend.spill_dir().to_path_buf();
    let old = spill.join("cordon-bash-00000000000000aa.log");
    let fresh = spill.join("cordon-bash-00000000000000bb.log");
    let other = spill.join("notes.txt");
    for path in [&old, &fresh, &other] {
        std::fs::write(path, "x").unwrap();
    }
    let day_and_more = SystemTime::now() - Duration::from_secs(25 * 3600);
    // The first backend swept a moment ago; the next start sweeps once that is a minute old.
    let stamp = spill.parent().unwrap().join(".swept");
    for path in [&old, &other, &stamp] {
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(day_and_more)
            .unwrap();
    }
    let _again = LocalBackend::new(LocalConfig {
        profile: cordon_backend_local::Profile::Host,
        workspace_is_copy: false,
        root: fx.ws.clone(),
        spec: test_spec(),
        home: None,
        state_base: Some(fx.state.clone()),
    })
    .unwrap();
    assert_eq!(
        names(&spill),
        vec!["cordon-bash-00000000000000bb.log", "notes.txt"]
    );
}

/// A state directory that is a symlink, or owned by someone else, is refused.
#[test]
fn unsafe_state_directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let base = dir.path().join("state");
    std::fs::create_dir(&base).unwrap();
    let elsewhere = dir.path().join("attacker");
    std::fs::create_dir(&elsewhere).unwrap();
    let user_dir = base.join(format!("cordon-{}", uid()));
    symlink(&elsewhere, &user_dir).unwrap();
    let config = LocalConfig {
        profile: cordon_backend_local::Profile::Host,
        workspace_is_copy: false,
        root: ws.clone(),
        spec: test_spec(),
        home: None,
        state_base: Some(base.clone()),
    };
    let err = LocalBackend::new(config.clone()).unwrap_err();
    assert!(matches!(err, LocalError::UnsafeStateDir { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "refusing to use state directory {}: it is a symlink",
            user_dir.display()
        )
    );
    assert!(
        names(&elsewhere).is_empty(),
        "nothing created through the link"
    );

    if !require_root("owned-by-someone-else state dir") {
        return;
    }
    std::fs::remove_file(&user_dir).unwrap();
    std::fs::create_dir(&user_dir).unwrap();
    nix::unistd::chown(&user_dir, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    let err = LocalBackend::new(config.clone()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "refusing to use state directory {}: it is owned by uid 65534, not by this user (uid {})",
            user_dir.display(),
            uid()
        )
    );

    // Our own directory with loose permissions is tightened, not refused.
    nix::unistd::chown(&user_dir, Some(nix::unistd::geteuid()), None).unwrap();
    std::fs::set_permissions(&user_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let _backend = LocalBackend::new(config).unwrap();
    assert_eq!(
        std::fs::metadata(&user_dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
}

/// The private TMPDIR exists 0700 while the backend lives and is removed on shutdown;
/// temp dirs of dead processes are removed by the next backend.
#[tokio::test]
async fn private_tmp_lifecycle() {
    let fx = Fixture::new();
    let command_tmp = fx.backend.command_tmp_dir().to_path_buf();
    assert_eq!(
        std::fs::metadata(&command_tmp)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    // The command sandbox's session directory lives in the backend's private directory.
    let tmp = private_dir_of(&command_tmp);
    let user_dir = tmp.parent().unwrap().to_path_buf();
    // A leftover of a process that no longer exists (pid beyond pid_max).
    let orphan = user_dir.join("tmp-2147483646-00000000000000cc");
    std::fs::create_dir_all(orphan.join("junk")).unwrap();
    let second = LocalBackend::new(LocalConfig {
        profile: cordon_backend_local::Profile::Host,
        workspace_is_copy: false,
        root: fx.ws.clone(),
        spec: test_spec(),
        home: None,
        state_base: Some(fx.state.clone()),
    })
    .unwrap();
    assert!(!orphan.exists(), "orphaned temp dir removed");
    assert!(tmp.exists(), "a live backend's temp dir is kept");
    assert_ne!(private_dir_of(second.command_tmp_dir()), tmp);
    std::fs::write(tmp.join("scratch"), "x").unwrap();
    fx.backend.shutdown().await.expect("shut the session down");
    fx.backend.shutdown().await.expect("shut the session down");
    assert!(!tmp.exists());
    let second_tmp = private_dir_of(second.command_tmp_dir());
    drop(second);
    assert!(
        !second_tmp.exists(),
        "dropping the backend removes its temp dir"
    );
}

/// The `tmp-<pid>-<hex>` directory a command `TMPDIR` lives in.
fn private_dir_of(command_tmp: &std::path::Path) -> std::path::PathBuf {
    command_tmp
        .ancestors()
        .find(|dir| {
            dir.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("tmp-"))
        })
        .unwrap_or_else(|| panic!("no tmp-<pid> directory above {}", command_tmp.display()))
        .to_path_buf()
}
