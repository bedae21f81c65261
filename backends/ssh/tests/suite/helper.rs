//! The remote helper's cache: uploaded once per host and version, verified before every start
//! (a changed file is uploaded again), unsafe cache directories refused, a noexec cache and a
//! binary for another architecture refused with the reason. The binary here is a copy of
//! `/bin/true` (an ELF executable of this machine's architecture that ends at once): these
//! tests are about the cache, not about what runs from it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use cordon_backend_ssh::SshBackend;
use cordon_backend_ssh::helper::RemoteHelperError;
use sha2::{Digest, Sha256};

use super::support::{Server, server};

/// A copy of `/bin/true` with one appended byte per `variant` (so each test has its own hash).
fn fake_helper(server: &Server, variant: &str) -> PathBuf {
    let mut bytes = std::fs::read("/bin/true").expect("/bin/true");
    bytes.extend_from_slice(variant.as_bytes());
    let path = server.dir.path().join(format!("helper-{variant}"));
    std::fs::write(&path, bytes).expect("write helper");
    path
}

fn sha256_hex(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).expect("read"))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn connect_with(server: &Server, helper: &Path, state: &Path) -> SshBackend {
    let mut config = server.config();
    config.helper = Some(helper.to_path_buf());
    config.state_dir = Some(state.to_path_buf());
    SshBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helper_is_uploaded_once_then_verified_from_the_cache() {
    let Some(server) = server() else { return };
    let helper = fake_helper(&server, "once");
    let state = server.dir.path().join("state");
    let backend = connect_with(&server, &helper, &state).await;
    let sha = sha256_hex(&helper);
    let first = backend.check_helper().await.expect("first start");
    assert!(first.uploaded);
    assert_eq!(first.local.sha256, sha);
    let cached = state.join("helper").join(&sha).join("cordon-helper");
    assert_eq!(first.remote_path, cached.to_string_lossy());
    assert_eq!(sha256_hex(&cached), sha);
    for dir in [state.join("helper"), state.join("helper").join(&sha)] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
    let mode = std::fs::metadata(&cached).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(cached.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("cordon-helper")]);

    let second = backend.check_helper().await.expect("second start");
    assert!(!second.uploaded, "the cached helper was uploaded again");
    // A new connection (a new session) finds it too.
    let again = connect_with(&server, &helper, &state).await;
    assert!(!again.check_helper().await.expect("third start").uploaded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_cached_helper_is_uploaded_again() {
    let Some(server) = server() else { return };
    let helper = fake_helper(&server, "corrupt");
    let state = server.dir.path().join("state");
    let backend = connect_with(&server, &helper, &state).await;
    let report = backend.check_helper().await.expect("first start");
    let cached = PathBuf::from(&report.remote_path);
    let mut bytes = std::fs::read(&cached).unwrap();
    bytes[100] ^= 0xff;
    // Beside it and renamed over it: the helper of the first start may still be executing.
    let flipped = cached.with_file_name("flipped");
    std::fs::write(&flipped, &bytes).unwrap();
    std::fs::set_permissions(&flipped, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::rename(&flipped, &cached).unwrap();
    let report = backend
        .check_helper()
        .await
        .expect("start after the corruption");
    assert!(report.uploaded, "the corrupted helper was not replaced");
    assert_eq!(sha256_hex(&cached), sha256_hex(&helper));

    // A cached file another user could write is replaced the same way, never run.
    std::fs::set_permissions(&cached, std::fs::Permissions::from_mode(0o722)).unwrap();
    let report = backend.check_helper().await.expect("start after chmod");
    assert!(report.uploaded, "a group-writable cached helper was kept");
    let mode = std::fs::metadata(&cached).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

fn expect_unsafe(error: RemoteHelperError, needle: &str) {
    let text = error.to_string();
    assert!(
        matches!(error, RemoteHelperError::UnsafeCache { .. }),
        "{error:?}"
    );
    assert!(text.contains(needle), "{text}");
    assert!(
        text.starts_with("failed to use the remote helper cache on root@127.0.0.1:"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_cache_directories_are_refused() {
    let Some(server) = server() else { return };
    let helper = fake_helper(&server, "unsafe");
    let sha = sha256_hex(&helper);

    // A symbolic link in the chain.
    let state = server.dir.path().join("state-link");
    let elsewhere = server.dir.path().join("elsewhere");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, state.join("helper")).unwrap();
    let backend = connect_with(&server, &helper, &state).await;
    let error = backend.check_helper().await.unwrap_err();
    expect_unsafe(
        error,
        &format!("{}/helper is a symbolic link", state.display()),
    );
    assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());

    // A group-writable directory.
    let state = server.dir.path().join("state-group");
    std::fs::create_dir_all(state.join("helper")).unwrap();
    std::fs::set_permissions(state.join("helper"), std::fs::Permissions::from_mode(0o770)).unwrap();
    let backend = connect_with(&server, &helper, &state).await;
    let error = backend.check_helper().await.unwrap_err();
    expect_unsafe(error, "helper is writable by its group or by others");
    assert!(!state.join("helper").join(&sha).exists());

    // A directory owned by another user.
    let state = server.dir.path().join("state-owner");
    std::fs::create_dir_all(state.join("helper").join(&sha)).unwrap();
    std::os::unix::fs::chown(state.join("helper").join(&sha), Some(4321), None).unwrap();
    let backend = connect_with(&server, &helper, &state).await;
    let error = backend.check_helper().await.unwrap_err();
    expect_unsafe(error, "is owned by uid 4321, not by the remote user (0)");
    assert!(
        !state
            .join("helper")
            .join(&sha)
            .join("cordon-helper")
            .exists()
    );
}

/// A tmpfs mounted `noexec`, unmounted on drop.
struct NoExecMount(PathBuf);

impl Drop for NoExecMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noexec_cache_is_refused_with_the_reason() {
    let Some(server) = server() else { return };
    let helper = fake_helper(&server, "noexec");
    let state = server.dir.path().join("state-noexec");
    std::fs::create_dir_all(&state).unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "noexec,mode=0700,size=16m", "tmpfs"])
        .arg(&state)
        .status()
        .expect("run mount");
    assert!(
        status.success(),
        "this test mounts a noexec tmpfs and needs root with CAP_SYS_ADMIN"
    );
    let _mount = NoExecMount(state.clone());
    let backend = connect_with(&server, &helper, &state).await;
    let error = backend.check_helper().await.unwrap_err();
    assert!(
        matches!(error, RemoteHelperError::NoExec { .. }),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains("the file system is mounted noexec; set a state directory"),
        "{text}"
    );
    assert!(text.contains(&state.display().to_string()), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_for_another_architecture_is_refused_before_any_upload() {
    let Some(server) = server() else { return };
    let state = server.dir.path().join("state-arch");
    let script = server.dir.path().join("helper.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let backend = connect_with(&server, &script, &state).await;
    let error = backend.check_helper().await.unwrap_err();
    assert!(
        matches!(error, RemoteHelperError::WrongBinary { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("it is not an ELF executable"),
        "{error}"
    );

    // An aarch64 build offered to this (x86_64 or other) host.
    let mut arm = std::fs::read("/bin/true").unwrap();
    let machine: u16 = if std::env::consts::ARCH == "aarch64" {
        62
    } else {
        183
    };
    arm[18..20].copy_from_slice(&machine.to_le_bytes());
    let other = server.dir.path().join("helper-other-arch");
    std::fs::write(&other, arm).unwrap();
    let backend = connect_with(&server, &other, &state).await;
    let error = backend.check_helper().await.unwrap_err();
    assert!(error.to_string().contains("it is built for"), "{error}");
    assert!(!state.join("helper").exists(), "something was uploaded");
}
