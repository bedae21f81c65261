//! The container profile on the real kernel: no namespaces of the sandbox's own (the
//! container has them), protected and denied paths carved out of the Landlock rules (also
//! ones that appeared after the sandbox was prepared), and a process group the command cannot
//! leave, so the group kill reaches its whole tree.

use std::time::{Duration, Instant};

use cordon_sandbox::{
    ExitStatus, NetworkAccess, PreparedSandbox, Profile, SandboxConfig, SandboxError, SpawnRequest,
};

use crate::support::{Fixture, processes_matching, run_in, unique};

fn container_config(fx: &Fixture) -> SandboxConfig {
    let mut config = fx.config();
    config.profile = Profile::Container;
    config
}

#[tokio::test]
async fn the_container_profile_creates_no_namespace() {
    let fx = Fixture::new();
    let sandbox = PreparedSandbox::prepare(container_config(&fx)).unwrap();
    assert_eq!(sandbox.missing_layers(), &[]);
    let ours = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let output = run_in(&sandbox, &fx.ws, "readlink /proc/self/ns/pid").await;
    assert_eq!(output.status, ExitStatus::Code(0), "{}", output.all());
    assert_eq!(output.stdout.trim(), ours.to_string_lossy());
}

/// Paths that became protected or denied after the sandbox was prepared (the backend hands
/// the new expansion before a command): the protected one cannot be written, truncated,
/// removed or replaced, the denied one not read; the entries beside them keep their rights.
#[tokio::test]
async fn paths_protected_or_denied_after_prepare_are_enforced_by_landlock() {
    let fx = Fixture::without_git();
    let sandbox = PreparedSandbox::prepare(container_config(&fx)).unwrap();
    std::fs::create_dir(fx.ws.join("sub")).unwrap();
    std::fs::create_dir(fx.ws.join("lib")).unwrap();
    std::fs::write(fx.ws.join("settings.conf"), "operator\n").unwrap();
    std::fs::write(fx.ws.join("sub/key.pem"), "secret-key\n").unwrap();
    std::fs::write(fx.ws.join("sub/notes.txt"), "notes\n").unwrap();
    sandbox
        .set_protected_and_denied(&[fx.ws.join("settings.conf")], &[fx.ws.join("sub/key.pem")])
        .unwrap();
    for attack in [
        "echo evil >> settings.conf",
        "echo evil > settings.conf",
        "truncate -s 0 settings.conf",
        "rm -f settings.conf",
        "mv settings.conf moved.conf",
        "cat sub/key.pem",
        "cp sub/key.pem copy.pem",
        "ln sub/key.pem hard.pem",
    ] {
        let output = run_in(&sandbox, &fx.ws, attack).await;
        assert_ne!(
            output.status,
            ExitStatus::Code(0),
            "{attack}: {}",
            output.all()
        );
        assert!(
            !output.all().contains("secret-key"),
            "{attack}: {}",
            output.all()
        );
    }
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("settings.conf")).unwrap(),
        "operator\n"
    );
    assert!(!fx.ws.join("moved.conf").exists());
    // What is beside them is as usable as before: the existing files of a carved directory,
    // and everything in a directory beside them.
    let output = run_in(
        &sandbox,
        &fx.ws,
        "cat settings.conf && echo more >> file.txt && echo n >> sub/notes.txt && \
         mkdir -p lib/deep && echo made > lib/deep/new.txt && cat lib/deep/new.txt",
    )
    .await;
    assert_eq!(output.status, ExitStatus::Code(0), "{}", output.all());
    assert_eq!(output.stdout, "operator\nmade\n");
    // The cost: a carved directory gets no new entries (one could reach into or replace the
    // protected path).
    let output = run_in(&sandbox, &fx.ws, "touch new-in-root").await;
    assert_ne!(output.status, ExitStatus::Code(0), "{}", output.all());
    // Nothing protected or denied any more: the whole workspace is writable again.
    sandbox.set_protected_and_denied(&[], &[]).unwrap();
    let output = run_in(
        &sandbox,
        &fx.ws,
        "echo ok >> settings.conf && cat sub/key.pem",
    )
    .await;
    assert_eq!(output.status, ExitStatus::Code(0), "{}", output.all());
    assert_eq!(output.stdout, "secret-key\n");
}

/// Spawn `script` in `sandbox`, its output discarded.
fn spawn(
    sandbox: &PreparedSandbox,
    fx: &Fixture,
    script: String,
) -> cordon_sandbox::SandboxedChild {
    sandbox
        .spawn(SpawnRequest {
            program: "bash".into(),
            args: vec!["-c".into(), script.into()],
            cwd: fx.ws.clone(),
            env: Vec::new(),
            stdin: None,
            stdout: None,
            stderr: None,
        })
        .unwrap()
}

/// `M=<marker>` in a script without the marker in the script's own text (its command line
/// would match it too).
fn set_marker(marker: &str) -> String {
    let (head, tail) = marker.split_at(marker.len() / 2);
    format!("M='{head}'; M=\"$M\"'{tail}'")
}

/// Wait until `count` processes carry `marker` (or none, for 0).
fn wait_for_processes(marker: &str, count: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while processes_matching(marker).len() != count {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command cannot leave its process group, so the group is its whole tree: what it left
/// in the background is killed when it exits, and its timeout or cancel kills every process.
#[tokio::test]
async fn a_command_cannot_leave_its_process_group_and_its_tree_is_killed() {
    let fx = Fixture::new();
    let sandbox = PreparedSandbox::prepare(container_config(&fx)).unwrap();
    let output = run_in(&sandbox, &fx.ws, "setsid -w true").await;
    assert_ne!(output.status, ExitStatus::Code(0), "{}", output.all());
    let output = run_in(
        &sandbox,
        &fx.ws,
        "perl -e 'setpgrp(0,0) or exit 3' 2>&1 || echo $?",
    )
    .await;
    assert_eq!(output.stdout, "3\n", "{}", output.all());

    // Left in the background: the command exits once both are running.
    let marker = unique("cordon-container-left");
    let mut child = spawn(
        &sandbox,
        &fx,
        format!(
            "{}; (exec -a \"$M\" sleep 300) & (exec -a \"$M\" sleep 300) & \
             until [ \"$(pgrep -fc \"$M\")\" = 2 ]; do sleep 0.01; done",
            set_marker(&marker)
        ),
    );
    assert_eq!(child.wait().await.unwrap(), ExitStatus::Code(0));
    wait_for_processes(&marker, 0, "background processes outlived their command");

    // Killed while running (a timeout, a cancel): the whole tree goes.
    let marker = unique("cordon-container-killed");
    let mut child = spawn(
        &sandbox,
        &fx,
        format!(
            "{}; (exec -a \"$M\" sleep 300) & (exec -a \"$M\" sleep 300) & wait",
            set_marker(&marker)
        ),
    );
    let signaller = child.signaller().unwrap();
    wait_for_processes(&marker, 2, "the sleepers never started");
    signaller.kill_tree().unwrap();
    assert_eq!(
        child.wait().await.unwrap(),
        ExitStatus::Signal(libc::SIGKILL)
    );
    wait_for_processes(&marker, 0, "the sleepers outlived the tree kill");
}

#[test]
fn a_filtered_network_is_refused_in_the_container_profile() {
    let fx = Fixture::new();
    let mut config = container_config(&fx);
    config.network = NetworkAccess::Filtered;
    match PreparedSandbox::prepare(config) {
        Err(SandboxError::MissingLayers { layers }) => {
            assert_eq!(layers, [cordon_sandbox::Layer::NetworkNamespace]);
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("a filtered network without its namespace was prepared"),
    }
}

/// The process holding the sandbox dies (SIGKILL, as an out-of-memory kill or a crash of the
/// helper would): without a PID namespace nothing else would end the command, so the warden
/// kills the groups of the commands that were running.
#[test]
fn commands_die_with_the_process_that_started_them() {
    let fx = Fixture::new();
    let marker = unique("cordon-container-orphan");
    let mut holder = std::process::Command::new(env!("CARGO_BIN_EXE_cordon-sandbox-run"))
        .arg("--container")
        .arg("--write")
        .arg(&fx.ws)
        .arg("--cwd")
        .arg(&fx.ws)
        .args(["--", "bash", "-c"])
        .arg(format!(
            "{}; (exec -a \"$M\" sleep 300) & (exec -a \"$M\" sleep 300) & wait",
            set_marker(&marker)
        ))
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_processes(&marker, 2, "the sleepers never started");
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_for_processes(
        &marker,
        0,
        "the command outlived the process that started it",
    );
}
