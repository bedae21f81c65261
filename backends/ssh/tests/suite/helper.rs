//! The remote helper. Its cache: uploaded once per host and version, verified before every
//! start (a changed file is uploaded again), unsafe cache directories refused, a noexec cache
//! and a binary for another architecture refused with the reason; there the binary is a copy
//! of `/bin/true` (an ELF executable of this machine's architecture that ends at once). Then
//! the real helper (`cargo build -p cordon-helper`): commands confined on the host without
//! `allow_degraded`, a helper killed mid-call, a corrupted helper replaced, and failing closed
//! (or today's shell worker with `allow_degraded`) when no helper can run.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cordon_backend_ssh::SshBackend;
use cordon_backend_ssh::helper::RemoteHelperError;
use cordon_ops::{Backend, ExecError, ExecOutcome, ExitStatus};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::support::{Server, descendants, server};

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
    // Connecting starts the helper: the first start uploads it (this one then exits at once,
    // so the helper does not run and commands would be refused).
    let backend = connect_with(&server, &helper, &state).await;
    assert!(backend.helper_report().is_none());
    let sha = sha256_hex(&helper);
    let first = backend.check_helper().await.expect("first start");
    assert!(
        !first.uploaded,
        "the helper uploaded at connect was uploaded again"
    );
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

    std::fs::remove_file(&cached).unwrap();
    let second = backend.check_helper().await.expect("second start");
    assert!(second.uploaded, "a missing cached helper was not uploaded");
    assert_eq!(sha256_hex(&cached), sha);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_below_a_directory_another_user_controls_is_refused() {
    let Some(server) = server() else { return };
    let helper = fake_helper(&server, "above");
    let sha = sha256_hex(&helper);

    // A parent everybody may write (not sticky): another user could rename the state
    // directory away and put their own chain in its place. (Connecting refuses such a state
    // directory already; the start checks again, since it runs again after a helper died.)
    let shared = server.dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let state = shared.join("state");
    let backend = connect_with(&server, &helper, &state).await;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let error = backend.check_helper().await.unwrap_err();
    expect_unsafe(
        error,
        &format!(
            "{} is writable by its group or by others and not sticky",
            shared.display()
        ),
    );

    // Sticky, like /tmp: nobody else can rename what is ours in it.
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let report = backend
        .check_helper()
        .await
        .expect("a sticky parent is fine");
    assert_eq!(
        report.remote_path,
        state
            .join("helper")
            .join(&sha)
            .join("cordon-helper")
            .to_string_lossy()
    );

    // A parent owned by another user, reached through a symbolic link: the canonical path is
    // judged.
    let foreign = server.dir.path().join("foreign");
    std::fs::create_dir_all(foreign.join("state")).unwrap();
    let link = server.dir.path().join("via-link");
    std::os::unix::fs::symlink(&foreign, &link).unwrap();
    let backend = connect_with(&server, &helper, &link.join("state")).await;
    std::os::unix::fs::chown(&foreign, Some(4321), None).unwrap();
    let error = backend.check_helper().await.unwrap_err();
    expect_unsafe(
        error,
        &format!(
            "{} is owned by uid 4321, not by root or the remote user (0)",
            foreign.display()
        ),
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

/// A connect starts the helper beside its probe; a server allowing only two sessions per
/// connection (the SFTP channel and one more) refuses one of them, and the connect still ends
/// with the helper running and commands confined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_allowing_two_sessions_still_gets_the_helper() {
    let Some(server) = super::support::server_with_max_sessions(2) else {
        return;
    };
    let backend = SshBackend::connect(server.helper_config())
        .await
        .expect("connect");
    assert_eq!(backend.helper_refusal(), None);
    assert!(backend.helper_report().is_some(), "the helper runs");
    let ws = server.workspace.clone();
    let (result, output) = bash(&backend, "echo two > two.txt && cat two.txt", &ws).await;
    assert!(succeeded(&result), "{result:?} {output}");
    assert_eq!(output, "two\n");
    backend.shutdown().await.expect("shut down");
}

/// A connect is one SSH connection (one authentication: a hardware key is touched once, a
/// passphrase asked once), also where the server refuses a third channel beside the SFTP
/// channel and the probe: the refused early start must not make the connect open another
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_authenticates_once_even_when_a_channel_is_refused() {
    for max_sessions in [1000, 2] {
        let Some(server) = super::support::server_with_max_sessions(max_sessions) else {
            return;
        };
        let backend = SshBackend::connect(server.helper_config())
            .await
            .expect("connect");
        assert_eq!(backend.helper_refusal(), None);
        assert_eq!(
            server.authenticated_connections(),
            1,
            "MaxSessions {max_sessions}: connections authenticated by one connect"
        );
        backend.shutdown().await.expect("shut down");
    }
}

/// The same with the refusal made certain: the probe waits (bash's `BASH_ENV`, which sshd
/// passes every command) until sshd has refused a channel for lack of sessions, which only
/// the helper's start beside the probe can ask for. That refusal must not cost a second
/// connection: the helper is started again after the probe, on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_early_start_is_redone_on_the_same_connection() {
    let gate_dir = tempfile::tempdir().expect("temp dir");
    let gate = gate_dir.path().join("gate.sh");
    let Some(server) = super::support::server_with_env_and_max_sessions(
        &format!("SHLVL=1 BASH_ENV={}", gate.display()),
        2,
    ) else {
        return;
    };
    // Bounded (60 s): a start that never asks for its channel fails the count below rather
    // than hanging the test.
    std::fs::write(
        &gate,
        format!(
            "case $BASH_EXECUTION_STRING in\n\
             *cordon-probe*)\n\
             \x20   i=0\n\
             \x20   until grep -q 'no more sessions' '{log}'; do\n\
             \x20       i=$((i + 1)); [ $i -ge 1200 ] && break; sleep 0.05\n\
             \x20   done ;;\n\
             esac\n",
            log = server.log_path().display()
        ),
    )
    .expect("gate");
    let backend = SshBackend::connect(server.helper_config())
        .await
        .expect("connect");
    let log = std::fs::read_to_string(server.log_path()).expect("sshd log");
    assert!(
        log.contains("no more sessions"),
        "the early start was not refused:\n{log}"
    );
    assert_eq!(backend.helper_refusal(), None);
    assert!(backend.helper_report().is_some(), "the helper runs");
    assert_eq!(
        server.authenticated_connections(),
        1,
        "the refused channel made the connect authenticate again:\n{log}"
    );
    let ws = server.workspace.clone();
    let (result, output) = bash(&backend, "echo two > two.txt && cat two.txt", &ws).await;
    assert!(succeeded(&result), "{result:?} {output}");
    backend.shutdown().await.expect("shut down");
}

/// Run `command` in `cwd`, collecting its output.
async fn bash(
    backend: &SshBackend,
    command: &str,
    cwd: &Path,
) -> (Result<ExecOutcome, ExecError>, String) {
    super::exec::run(
        backend,
        command,
        cwd,
        Duration::from_secs(120),
        CancellationToken::new(),
    )
    .await
}

fn succeeded(result: &Result<ExecOutcome, ExecError>) -> bool {
    matches!(
        result,
        Ok(ExecOutcome {
            status: Some(ExitStatus::Code(0)),
            ..
        })
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_confined_on_the_host_without_allow_degraded() {
    let Some(server) = server() else { return };
    let ws = server.workspace.clone();
    std::fs::create_dir_all(ws.join(".git")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    let canary = server.dir.path().join("canary.txt");
    std::fs::write(&canary, "canary\n").unwrap();
    let config = server.helper_config();
    assert!(!config.spec.allow_degraded);
    let backend = SshBackend::connect(config).await.expect("connect");
    assert_eq!(backend.helper_refusal(), None);
    let report = backend.helper_report().expect("the helper runs").clone();
    assert!(report.uploaded);
    assert!(
        backend.missing_layers().is_empty(),
        "{:?}",
        backend.missing_layers()
    );

    let (result, output) = bash(&backend, "echo inside > inside.txt && cat inside.txt", &ws).await;
    assert!(succeeded(&result), "{result:?} {output}");
    assert_eq!(output, "inside\n");
    assert_eq!(
        std::fs::read_to_string(ws.join("inside.txt")).unwrap(),
        "inside\n"
    );

    // Outside the remote root: refused, the canary untouched, nothing created.
    let outside = server.dir.path().join("outside.txt");
    let command = format!(
        "echo changed > {canary}; echo new > {outside}; rm -f {canary}",
        canary = canary.display(),
        outside = outside.display()
    );
    let (result, output) = bash(&backend, &command, &ws).await;
    assert!(!succeeded(&result), "{result:?} {output}");
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "canary\n");
    assert!(!outside.exists());

    // A protected path is read-only.
    let (result, output) = bash(&backend, "echo x >> .git/config", &ws).await;
    assert!(!succeeded(&result), "{result:?} {output}");
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/config")).unwrap(),
        "[core]\n"
    );

    // The network is off: not even the sshd on 127.0.0.1 can be reached.
    let command = format!(
        "if (exec 3<>/dev/tcp/127.0.0.1/{}) 2>/dev/null; then echo connected; else echo refused; fi",
        server.port
    );
    let (result, output) = bash(&backend, &command, &ws).await;
    assert!(succeeded(&result), "{result:?} {output}");
    assert_eq!(output, "refused\n");

    // The helper cache is denied: a command cannot replace the next session's helper.
    let command = format!(
        "{{ rm -f {path} && cp /bin/true {path}; }} || echo refused; \
         cat {path} > /dev/null || echo unreadable",
        path = report.remote_path
    );
    let (_, output) = bash(&backend, &command, &ws).await;
    assert!(output.contains("refused"), "{output}");
    assert_eq!(
        sha256_hex(Path::new(&report.remote_path)),
        report.local.sha256
    );
    backend.shutdown().await.expect("shutdown");

    // Even when the cache lies inside the workspace, it is denied to the session.
    let mut config = server.helper_config();
    config.remote_root = server.dir.path().to_path_buf();
    let wide = SshBackend::connect(config).await.expect("connect");
    assert!(
        wide.helper_report().is_some(),
        "{:?}",
        wide.helper_refusal()
    );
    let (_, output) = bash(&wide, &command, server.dir.path()).await;
    assert!(output.contains("refused"), "{output}");
    assert!(output.contains("unreadable"), "{output}");
    assert_eq!(
        sha256_hex(Path::new(&report.remote_path)),
        report.local.sha256
    );
    let (result, output) = bash(&wide, "echo x > ws/inside-wide.txt", server.dir.path()).await;
    assert!(succeeded(&result), "{result:?} {output}");
    wide.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_whose_path_has_glob_characters_is_denied_too() {
    let Some(server) = server() else { return };
    // Read as a pattern, `st[a]te` names `state`, not itself.
    let mut config = server.helper_config();
    config.state_dir = Some(server.dir.path().join("st[a]te"));
    config.remote_root = server.dir.path().to_path_buf();
    let backend = SshBackend::connect(config).await.expect("connect");
    let report = backend
        .helper_report()
        .unwrap_or_else(|| panic!("{:?}", backend.helper_refusal()))
        .clone();
    assert!(
        report.remote_path.contains("/st[a]te/helper/"),
        "{report:?}"
    );
    let command = format!(
        "cat '{path}' > /dev/null || echo unreadable; \
         {{ rm -f '{path}' && cp /bin/true '{path}'; }} || echo refused",
        path = report.remote_path
    );
    let (_, output) = bash(&backend, &command, server.dir.path()).await;
    assert!(output.contains("unreadable"), "{output}");
    assert!(output.contains("refused"), "{output}");
    assert_eq!(
        sha256_hex(Path::new(&report.remote_path)),
        report.local.sha256
    );
    backend.shutdown().await.expect("shutdown");
}

/// Pids of the processes running `./cordon-helper serve` (the helpers sshd started).
fn helper_pids(server: &Server) -> Vec<u32> {
    descendants(server.pid())
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline == b"./cordon-helper\0serve\0")
        })
        .collect()
}

/// Processes on this host whose argv[0] is `name`.
fn pids_with_argv0(name: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline.split(|byte| *byte == 0).next() == Some(name.as_bytes())
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_killed_mid_call_fails_the_call_and_the_next_call_starts_a_new_one() {
    let Some(server) = server() else { return };
    let ws = server.workspace.clone();
    let backend = std::sync::Arc::new(
        SshBackend::connect(server.helper_config())
            .await
            .expect("connect"),
    );
    let first = helper_pids(&server);
    assert_eq!(first.len(), 1, "{first:?}");
    // The sleeper's argv[0] is a marker unique to this run, so the host can tell whether the
    // command is still running once its helper is gone.
    let marker = format!("cordon-killed-helper-sleeper-{}", std::process::id());
    let running = {
        let backend = backend.clone();
        let ws = ws.clone();
        let command = format!("exec -a {marker} sleep 600");
        tokio::spawn(async move { bash(&backend, &command, &ws).await })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while pids_with_argv0(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for pid in &first {
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
    }
    let (result, _) = running.await.unwrap();
    match result {
        Err(ExecError::Backend { reason }) => {
            assert!(
                reason.contains("the next call starts a new helper"),
                "{reason}"
            )
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    // The dead helper's command dies with its sandbox: the sandbox's init exits when the
    // helper's end of its control socket closes, and the PID namespace goes with it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let survivors = pids_with_argv0(&marker);
        if survivors.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the killed helper's command survived it: {survivors:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (result, output) = bash(&backend, "echo again", &ws).await;
    assert!(succeeded(&result), "{result:?} {output}");
    assert_eq!(output, "again\n");
    let second = helper_pids(&server);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);
    backend.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_helper_from_another_cache_is_refused() {
    let Some(server) = server() else { return };
    let ws = server.workspace.clone();
    let (one, two) = (server.dir.path().join("one"), server.dir.path().join("two"));
    std::fs::create_dir_all(one.join("state")).unwrap();
    std::fs::create_dir_all(two.join("state")).unwrap();
    let now = server.dir.path().join("now");
    std::os::unix::fs::symlink(&one, &now).unwrap();
    let mut config = server.helper_config();
    config.state_dir = Some(now.join("state"));
    let backend = SshBackend::connect(config).await.expect("connect");
    let report = backend.helper_report().expect("the helper runs").clone();
    assert!(
        report.remote_path.starts_with(&*one.to_string_lossy()),
        "{report:?}"
    );

    // The state directory's path now leads elsewhere, whose cache the session does not deny;
    // then the helper dies.
    std::fs::remove_file(&now).unwrap();
    std::os::unix::fs::symlink(&two, &now).unwrap();
    for pid in helper_pids(&server) {
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while backend.helper_probe().await.is_ok() {
        assert!(Instant::now() < deadline, "the helper never died");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (result, output) = bash(&backend, "echo ran", &ws).await;
    match result {
        Err(ExecError::Backend { reason }) => assert!(
            reason.contains(&format!(
                "the new helper's cache {}/state/helper is not {}/state/helper, the one the \
                 session denies to commands",
                two.display(),
                one.display()
            )),
            "{reason}"
        ),
        other => panic!("a helper from another cache ran: {other:?} {output}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_helper_is_replaced_before_the_next_session_runs_it() {
    let Some(server) = server() else { return };
    let first = SshBackend::connect(server.helper_config())
        .await
        .expect("connect");
    let report = first.helper_report().expect("the helper runs").clone();
    assert!(report.uploaded);
    first.shutdown().await.expect("shutdown");
    // Once per host and version: the next session runs the cached one.
    let cached_run = SshBackend::connect(server.helper_config())
        .await
        .expect("connect");
    assert!(
        !cached_run
            .helper_report()
            .expect("the helper runs")
            .uploaded
    );
    cached_run.shutdown().await.expect("shutdown");
    let cached = PathBuf::from(&report.remote_path);
    let mut bytes = std::fs::read(&cached).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    let flipped = cached.with_file_name("flipped");
    std::fs::write(&flipped, &bytes).unwrap();
    std::fs::set_permissions(&flipped, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::rename(&flipped, &cached).unwrap();

    let second = SshBackend::connect(server.helper_config())
        .await
        .expect("connect");
    assert!(second.helper_report().expect("the helper runs").uploaded);
    assert_eq!(sha256_hex(&cached), report.local.sha256);
    let (result, output) = bash(&second, "echo fine", &server.workspace).await;
    assert!(succeeded(&result), "{result:?} {output}");
    second.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_usable_helper_commands_fail_closed_unless_degraded() {
    let Some(server) = server() else { return };
    let script = server.dir.path().join("helper.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let mut config = server.strict_config();
    config.helper = Some(script.clone());
    let backend = SshBackend::connect(config.clone()).await.expect("connect");
    let refusal = backend.helper_refusal().expect("refused").to_owned();
    assert!(refusal.contains("it is not an ELF executable"), "{refusal}");
    let (result, _) = bash(&backend, "touch refused.txt", &server.workspace).await;
    match result {
        Err(ExecError::Sandbox { layer, reason }) => {
            assert_eq!(layer, "remote-sandbox");
            assert!(reason.contains("it is not an ELF executable"), "{reason}");
            assert!(reason.contains("--allow-degraded"), "{reason}");
        }
        other => panic!("expected a sandbox refusal, got {other:?}"),
    }
    assert!(!server.workspace.join("refused.txt").exists());

    // With a degraded sandbox accepted: today's shell worker, and the reason among the layers.
    config.spec.allow_degraded = true;
    let backend = SshBackend::connect(config).await.expect("connect");
    let (result, output) = bash(&backend, "echo degraded", &server.workspace).await;
    assert!(succeeded(&result), "{result:?} {output}");
    assert_eq!(output, "degraded\n");
    let layers = backend.missing_layers();
    assert!(
        layers
            .iter()
            .any(|l| l.contains("the Cordon helper does not run")
                && l.contains("it is not an ELF executable")),
        "{layers:?}"
    );
}

/// Processes whose working directory is under `dir` (the helper runs in its cache directory).
fn processes_under(dir: &Path) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir)) {
            found.push(pid);
        }
    }
    found
}

/// A connect whose probe fails after the helper started beside it leaves no helper running on
/// the host: the probe (bash's `BASH_ENV`) waits until the helper runs in its cache, then
/// fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_connect_leaves_no_helper_running() {
    let gate_dir = tempfile::tempdir().expect("temp dir");
    let gate = gate_dir.path().join("gate.sh");
    let Some(server) = super::support::server_with_env_and_max_sessions(
        &format!("SHLVL=1 BASH_ENV={}", gate.display()),
        1000,
    ) else {
        return;
    };
    let config = server.helper_config();
    let cache = config.state_dir.clone().expect("state dir").join("helper");
    let seen = gate_dir.path().join("seen");
    std::fs::write(
        &gate,
        format!(
            "case $BASH_EXECUTION_STRING in\n\
             *cordon-probe*)\n\
             \x20   i=0\n\
             \x20   until ls -l /proc/[0-9]*/cwd 2>/dev/null | grep -q ' -> {cache}/'; do\n\
             \x20       i=$((i + 1)); [ $i -ge 1200 ] && break; sleep 0.05\n\
             \x20   done\n\
             \x20   [ $i -lt 1200 ] && : > '{seen}'\n\
             \x20   exit 1 ;;\n\
             esac\n",
            cache = cache.display(),
            seen = seen.display()
        ),
    )
    .expect("gate");
    let error = match SshBackend::connect(config).await {
        Ok(_) => panic!("the connect succeeded without its probe"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("failed to prepare the remote host"),
        "{error}"
    );
    assert!(seen.exists(), "the probe failed before the helper ran");
    // The helper sees its channel close and exits; wait for that (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut left = processes_under(&cache);
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = processes_under(&cache);
    }
    assert_eq!(left, Vec::<u32>::new(), "helper processes left running");
}
