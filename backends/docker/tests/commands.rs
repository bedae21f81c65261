//! Commands through `cordon-helper serve` in the container (the file helper's stream), under
//! the helper's sandbox in its container profile: protected and denied paths are Landlock's
//! for commands too, also ones that appeared after the session started, and a command's
//! whole tree dies at its timeout.

use std::path::Path;
use std::time::Duration;

use cordon_backend_docker::{CommandsPath, DockerBackend, FilesHelper, FilesPath};
use cordon_ops::{Backend, Termination};
use tokio_util::sync::CancellationToken;

use crate::support::{self, helper, host_or_skip, run, run_with, workspace};

async fn helper_session(host: &str, root: &Path, protect: &[&str], deny: &[&str]) -> DockerBackend {
    let mut config = support::config(host, root);
    config.helper = Some(helper());
    config.files_helper = FilesHelper::Required;
    config.spec.protected = protect.iter().map(|s| (*s).to_owned()).collect();
    config.spec.denied = deny.iter().map(|s| (*s).to_owned()).collect();
    DockerBackend::start(config)
        .await
        .expect("a session starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_under_the_helper_s_sandbox_in_the_container() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = helper_session(&host, ws.path(), &[".git/**"], &[]).await;
    assert_eq!(backend.files_path(), &FilesPath::Helper);
    assert_eq!(backend.commands_path(), &CommandsPath::Helper);
    assert_eq!(backend.missing_layers(), Vec::<String>::new());
    // Landlock and seccomp are in force in the command (the helper runs it), no namespace of
    // its own: its parent is the helper.
    let ran = run(
        &backend,
        "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; \
         cat /proc/$PPID/cmdline | tr '\\0' ' '; echo; \
         echo made > here.txt && cat here.txt; touch /etc/x 2>&1 || true",
    )
    .await;
    assert!(ran.output.contains("Seccomp:\t2"), "{}", ran.output);
    assert!(ran.output.contains("NoNewPrivs:\t1"), "{}", ran.output);
    assert!(ran.output.contains("cordon-helper serve"), "{}", ran.output);
    assert!(ran.output.contains("made\n"), "{}", ran.output);
    assert!(ran.output.contains("/etc/x"), "{}", ran.output);
    backend.stop().await.expect("stop");
}

/// The operator adds a protected file and a secret on the host after the session started
/// (nothing mounted them read-only or masked them at the start): commands cannot change the
/// one nor read the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_protected_or_denied_after_the_start_are_enforced_for_commands() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::create_dir(ws.path().join("lib")).expect("mkdir");
    let backend = helper_session(
        &host,
        ws.path(),
        &[".git/**", "**/settings.conf"],
        &["**/*.pem"],
    )
    .await;
    assert_eq!(backend.commands_path(), &CommandsPath::Helper);
    std::fs::write(ws.path().join("settings.conf"), "operator\n").expect("write");
    std::fs::create_dir(ws.path().join("keys")).expect("mkdir");
    std::fs::write(ws.path().join("keys/host.pem"), "private-key-material\n").expect("write");
    for attack in [
        "echo evil >> settings.conf",
        "rm -f settings.conf",
        "mv settings.conf elsewhere.conf",
        "cat keys/host.pem",
        "cp keys/host.pem /tmp/stolen",
    ] {
        let ran = run(&backend, attack).await;
        assert_ne!(
            ran.outcome.status.map(|s| s.code()),
            Some(0),
            "{attack}: {}",
            ran.output
        );
        assert!(
            !ran.output.contains("private-key-material"),
            "{attack}: {}",
            ran.output
        );
    }
    assert_eq!(
        std::fs::read_to_string(ws.path().join("settings.conf")).expect("read"),
        "operator\n"
    );
    // What is beside them stays usable.
    let ran = run(
        &backend,
        "mkdir -p lib/x && echo ok > lib/x/y && cat lib/x/y settings.conf",
    )
    .await;
    assert_eq!(
        ran.outcome.status.map(|s| s.code()),
        Some(0),
        "{}",
        ran.output
    );
    assert_eq!(ran.output, "ok\noperator\n");
    backend.stop().await.expect("stop");
}

/// Protected paths a wildcard glob matches when the session starts are mounted read-only:
/// commands can change neither their content nor their mode, times or extended attributes
/// (which Landlock does not cover), and the directories holding them keep every right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_paths_present_at_the_start_are_read_only_mounts() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::create_dir_all(ws.path().join("sub/.vscode")).expect("mkdir");
    std::fs::write(ws.path().join("sub/.envrc"), "operator\n").expect("write");
    std::fs::write(ws.path().join("sub/.vscode/tasks.json"), "{}\n").expect("write");
    let mode = |rel: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(ws.path().join(rel))
            .expect("stat")
            .permissions()
            .mode()
    };
    let mtime = |rel: &str| {
        std::fs::metadata(ws.path().join(rel))
            .expect("stat")
            .modified()
            .expect("mtime")
    };
    let before = (mode("sub/.envrc"), mtime("sub/.envrc"));
    let backend = helper_session(
        &host,
        ws.path(),
        &[".git/**", "**/.envrc", "**/.vscode/**"],
        &[],
    )
    .await;
    assert_eq!(backend.commands_path(), &CommandsPath::Helper);
    for attack in [
        "chmod 777 sub/.envrc",
        "touch -d 2001-01-01 sub/.envrc",
        "python3 -c 'import os; os.setxattr(\"sub/.envrc\", \"user.x\", b\"1\")'",
        "echo evil >> sub/.envrc",
        "rm -f sub/.envrc",
        "chmod 777 sub/.vscode/tasks.json",
        "echo evil > sub/.vscode/new.json",
    ] {
        let ran = run(&backend, attack).await;
        assert_ne!(
            ran.outcome.status.map(|s| s.code()),
            Some(0),
            "{attack}: {}",
            ran.output
        );
    }
    assert_eq!((mode("sub/.envrc"), mtime("sub/.envrc")), before);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("sub/.envrc")).expect("read"),
        "operator\n"
    );
    assert!(!ws.path().join("sub/.vscode/new.json").exists());
    // The directory beside them is not carved: new files can be made there.
    let ran = run(&backend, "echo ok > sub/new.txt && cat sub/new.txt").await;
    assert_eq!(ran.output, "ok\n");
    backend.stop().await.expect("stop");
}

/// A timeout kills the command's whole tree in the container (it cannot leave its process
/// group), and what a command leaves in the background dies when it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_kills_the_whole_tree_in_the_container() {
    let host = host_or_skip!();
    let ws = workspace();
    let backend = helper_session(&host, ws.path(), &[".git/**"], &[]).await;
    let ran = run_with(
        &backend,
        "(exec -a cordon-tree-a sleep 300) & (exec -a cordon-tree-b sleep 300) & \
         setsid -w sleep 300 || echo setsid refused; wait",
        Duration::from_secs(2),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(
        ran.outcome.termination,
        Termination::TimedOut,
        "{}",
        ran.output
    );
    assert!(ran.output.contains("setsid refused"), "{}", ran.output);
    let left = run(&backend, "ps -eo args | grep -c '^cordon-tree-[a]' || true").await;
    assert_eq!(left.output.trim(), "0", "{}", left.output);
    let ran = run(&backend, "(exec -a cordon-tree-c sleep 300) & echo started").await;
    assert_eq!(ran.output, "started\n");
    let left = run(&backend, "ps -eo args | grep -c '^cordon-tree-[c]' || true").await;
    assert_eq!(left.output.trim(), "0", "{}", left.output);
    backend.stop().await.expect("stop");
}
