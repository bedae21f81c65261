//! Copy mode: the workspace is tarred into a volume, protected paths stay read-only, changes
//! come back on `sync_out` and at shutdown.

use std::path::PathBuf;

use cordon_backend_docker::{DockerBackend, WorkspaceMode};
use cordon_ops::{Backend, FsError, ShutdownError};

use crate::support::{self, container_exists, host_or_skip, run, workspace};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_mode_round_trip() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("in.txt"), "from host\n").expect("write");
    std::fs::create_dir_all(ws.path().join(".git")).expect("mkdir");
    std::fs::write(ws.path().join(".git/HEAD"), "ref\n").expect("write");
    let mut config = support::config(&host, ws.path());
    config.mode = WorkspaceMode::Copy;
    let backend = DockerBackend::start(config).await.expect("start copy mode");
    let ran = run(
        &backend,
        "cat in.txt .git/HEAD; echo made > out.txt; echo x >> .git/HEAD",
    )
    .await;
    assert_eq!(
        ran.output,
        "from host\nref\nbash: line 1: .git/HEAD: Read-only file system\n"
    );
    assert!(
        !ws.path().join("out.txt").exists(),
        "nothing reaches the host before a sync"
    );
    let err = backend
        .files()
        .write_file(&PathBuf::from("/workspace/.git/HEAD"), b"x")
        .await
        .expect_err("protected");
    assert!(matches!(err, FsError::Protected { .. }), "{err:?}");
    backend.sync_out().await.expect("sync out");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("out.txt")).expect("synced"),
        "made\n"
    );
    backend
        .files()
        .write_file(&PathBuf::from("/workspace/late.txt"), b"late\n")
        .await
        .expect("write");
    backend.shutdown().await.expect("shut the session down");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("late.txt")).expect("synced at shutdown"),
        "late\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join(".git/HEAD")).expect("untouched"),
        "ref\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_back_that_fails_at_shutdown_is_an_error_and_the_rest_still_comes_back() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("out"), "a file on the host\n").expect("write");
    let mut config = support::config(&host, ws.path());
    config.mode = WorkspaceMode::Copy;
    let backend = DockerBackend::start(config).await.expect("start copy mode");
    // Deletions are not copied back, so the host keeps the file `out` where the container
    // now has a directory: that directory cannot be unpacked over it.
    let ran = run(
        &backend,
        "rm out && mkdir out && echo lost > out/f && echo kept > zz-kept.txt && echo done",
    )
    .await;
    assert_eq!(ran.output, "done\n");
    let error = backend.shutdown().await.expect_err("the copy-back fails");
    assert!(matches!(error, ShutdownError::CopyBack { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.starts_with("failed to copy the workspace back to the host"),
        "{message}"
    );
    assert!(message.contains("out"), "names the path: {message}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("zz-kept.txt")).expect("the rest came back"),
        "kept\n"
    );
    // The container is gone all the same, and a second shutdown has nothing left to report.
    assert!(
        !container_exists(&host, backend.container()).await,
        "container removed"
    );
    backend.shutdown().await.expect("idempotent");
}

/// Unlisted binds name paths of this machine: a copy-mode session (whose engine may be on
/// another one) refuses them before it creates anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlisted_binds_are_refused_in_copy_mode() {
    let host = host_or_skip!();
    let ws = workspace();
    let outside = workspace();
    let mut config = support::config(&host, ws.path());
    config.mode = WorkspaceMode::Copy;
    config.unlisted_binds = vec![cordon_backend_docker::UnlistedBind {
        source: outside.path().to_path_buf(),
        target: outside.path().to_path_buf(),
    }];
    let err = match DockerBackend::start(config).await {
        Ok(_) => panic!("a copy-mode session started with unlisted binds"),
        Err(err) => err,
    };
    assert!(
        matches!(
            err,
            cordon_backend_docker::DockerError::UnlistedBindsInCopyMode { .. }
        ),
        "{err:?}"
    );
}

/// A hard link the container makes to a protected or denied file comes back as a hard link
/// to the HOST's file of that name (the container's own copy is left out, the link is not):
/// the host would get a second, unprotected name for the policy file, and one for a secret
/// whose contents the next session would copy in. The copy back refuses such links, also when
/// commands run under the helper's sandbox (which leaves a copied workspace unconfined).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_links_to_protected_or_denied_files_do_not_come_back() {
    hard_links_come_back_refused(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_links_to_protected_or_denied_files_do_not_come_back_with_the_helper() {
    hard_links_come_back_refused(true).await;
}

async fn hard_links_come_back_refused(helper: bool) {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("cordon.toml"), "policy\n").expect("write");
    std::fs::write(ws.path().join(".env"), "SECRET\n").expect("write");
    let mut config = support::config(&host, ws.path());
    config.mode = WorkspaceMode::Copy;
    config.spec.protected.push("cordon.toml".into());
    config.spec.denied.push("**/.env".into());
    if helper {
        config.image = support::DEBIAN.to_owned();
        config.helper = Some(support::helper());
        config.files_helper = cordon_backend_docker::FilesHelper::Required;
    }
    let backend = DockerBackend::start(config).await.expect("start copy mode");
    assert_eq!(
        backend.commands_path().to_string().starts_with("helper"),
        helper,
        "{}",
        backend.commands_path()
    );
    let ran = run(
        &backend,
        "echo fake > .env && ln .env zz-secret && ln cordon.toml zz-policy \
         && echo kept > zz-kept && echo done",
    )
    .await;
    assert_eq!(ran.output, "done\n");
    let shut = backend.shutdown().await;
    for name in ["zz-secret", "zz-policy"] {
        assert!(
            std::fs::symlink_metadata(ws.path().join(name)).is_err(),
            "{name} reached the host, reading {:?}",
            std::fs::read_to_string(ws.path().join(name))
        );
    }
    assert_eq!(
        std::fs::read_to_string(ws.path().join("zz-kept")).expect("the rest came back"),
        "kept\n"
    );
    let message = shut.expect_err("the links are refused").to_string();
    assert!(
        message.contains("2 path(s) could not be written"),
        "{message}"
    );
    assert!(
        message
            .contains("zz-policy (a hard link to cordon.toml, which the copy back did not write)"),
        "{message}"
    );
}

/// A directory the container puts where the host has a symlink (one a previous copy back
/// left, or one the repository holds) is not unpacked through that symlink: a symlink to the
/// protected `.git` would otherwise let the container write `.git/hooks` on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_copy_back_never_writes_through_a_host_symlink() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::create_dir_all(ws.path().join(".git/hooks")).expect("mkdir");
    std::os::unix::fs::symlink(".git", ws.path().join("g")).expect("symlink");
    let mut config = support::config(&host, ws.path());
    config.mode = WorkspaceMode::Copy;
    let backend = DockerBackend::start(config).await.expect("start copy mode");
    let ran = run(
        &backend,
        "rm g && mkdir -p g/hooks && echo evil > g/hooks/pre-commit \
         && echo kept > zz-kept && echo done",
    )
    .await;
    assert_eq!(ran.output, "done\n");
    let shut = backend.shutdown().await;
    assert!(
        !ws.path().join(".git/hooks/pre-commit").exists(),
        "the container wrote the host's .git/hooks"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("zz-kept")).expect("the rest came back"),
        "kept\n"
    );
    let message = shut.expect_err("g is refused").to_string();
    // `g` itself (a directory over the host's symlink), then what is under it.
    assert!(
        message.contains("3 path(s) could not be written: g ("),
        "{message}"
    );
}

/// The copy back writes its files as the user Cordon runs as (often root, or the operator):
/// a set-user-ID or set-group-ID bit a command set on its own file in the container must not
/// come back with it, or the host would get a set-user-ID program of that user that the
/// session wrote. Nor does a world-writable bit: another account on the host could then
/// change (or, in a directory, plant) what the operator later builds and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_id_and_world_writable_bits_do_not_come_back() {
    use std::os::unix::fs::PermissionsExt;
    let host = host_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.mode = WorkspaceMode::Copy;
    let backend = DockerBackend::start(config).await.expect("start copy mode");
    let ran = run(
        &backend,
        "cp /bin/true suid && chmod 4755 suid && mkdir sgid && chmod 2775 sgid \
         && mkdir open && chmod 777 open && echo x > open/shared && chmod 666 open/shared \
         && stat -c %a suid sgid open open/shared",
    )
    .await;
    assert_eq!(ran.output, "4755\n2775\n777\n666\n", "set in the container");
    backend.shutdown().await.expect("copied back");
    let mode = |name: &str| {
        std::fs::metadata(ws.path().join(name))
            .expect("came back")
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("suid"), 0o755);
    assert_eq!(mode("sgid"), 0o775);
    assert_eq!(mode("open"), 0o775);
    assert_eq!(mode("open/shared"), 0o664);
}

/// An empty host workspace gives an empty volume, which the engine would fill from the image's
/// `/workspace` when the session container mounts it, top directory's owner included: the
/// session's user could then not create anything in its own workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_workspace_is_writable_in_copy_mode() {
    let host = host_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.mode = WorkspaceMode::Copy;
    let backend = DockerBackend::start(config).await.expect("start copy mode");
    let ran = run(&backend, "echo made > made.txt && cat made.txt").await;
    assert_eq!(ran.output, "made\n");
    backend.shutdown().await.expect("copied back");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("made.txt")).expect("came back"),
        "made\n"
    );
}
