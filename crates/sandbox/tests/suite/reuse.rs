//! An init serves the next command when it may: same mounts (same paths and inodes), alive,
//! not killed. Each command still starts clean — no process and no System V IPC object of an
//! earlier command — and the init itself is as confined as its commands.

use std::io::Read;

use cordon_sandbox::{ExitStatus, PreparedSandbox, SpawnRequest};

use crate::support::{Fixture, Output, TIMEOUT, processes_matching, unique};

/// Run `bash -c script`; the host pid of the init that ran it, and the output.
async fn run(sandbox: &PreparedSandbox, fx: &Fixture, script: &str) -> (u32, Output) {
    let (out_read, out_write) = std::io::pipe().unwrap();
    let (err_read, err_write) = std::io::pipe().unwrap();
    let mut child = sandbox
        .spawn(SpawnRequest {
            program: "bash".into(),
            args: vec!["-c".into(), script.into()],
            cwd: fx.ws.clone(),
            env: Vec::new(),
            stdin: None,
            stdout: Some(out_write.into()),
            stderr: Some(err_write.into()),
        })
        .unwrap_or_else(|error| panic!("spawn of {script:?} failed: {error}"));
    let pid = child.pid();
    let read_all = |mut pipe: std::io::PipeReader| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let (stdout, stderr) = (read_all(out_read), read_all(err_read));
    let status = tokio::time::timeout(TIMEOUT, child.wait())
        .await
        .expect("the command ends")
        .expect("wait");
    let output = Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (pid, output)
}

#[tokio::test]
async fn an_idle_init_serves_the_next_command_and_nothing_is_left_over() {
    for tool in ["ipcmk", "ipcs"] {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|out| out.status.success());
        assert!(
            found,
            "this test needs `{tool}`: apt-get install -y util-linux"
        );
    }
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    let marker = unique("leftover");
    let (first, output) = run(
        &sandbox,
        &fx,
        &format!(
            "(exec -a {marker} sleep 600) & ipcmk -M 65536 >/dev/null && ipcmk -Q >/dev/null && ipcmk -S 2 >/dev/null && ipcs -m -q -s | grep -c '^0x'"
        ),
    )
    .await;
    assert_eq!(output.stdout.trim(), "3", "{}", output.all());
    assert!(
        processes_matching(&marker).is_empty(),
        "the background job died"
    );
    let (second, output) = run(
        &sandbox,
        &fx,
        "ipcs -m -q -s | grep -c '^0x'; ls /proc | grep -c '^[0-9]'",
    )
    .await;
    assert_eq!(second, first, "the same init served both commands");
    let counts: Vec<&str> = output.stdout.lines().collect();
    assert_eq!(counts[0], "0", "no IPC object survived: {}", output.all());
    // The init, bash, and the ls and grep of the pipeline.
    let processes: u32 = counts[1].parse().unwrap();
    assert!(
        processes <= 4,
        "processes of the first command survived: {}",
        output.all()
    );
}

#[tokio::test]
async fn the_init_itself_is_confined_like_its_commands() {
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    let (_, output) = run(
        &sandbox,
        &fx,
        "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/1/status",
    )
    .await;
    let status: Vec<&str> = output.stdout.lines().collect();
    assert_eq!(
        status,
        vec![
            "CapPrm:\t0000000000000000",
            "CapEff:\t0000000000000000",
            "CapBnd:\t0000000000000000",
            "NoNewPrivs:\t1",
            "Seccomp:\t2",
        ],
        "{}",
        output.all()
    );
}

/// A protected directory replaced on the host (`rm -rf .git; git init`) keeps its path but
/// not its inode: the idle init's mount covers the old one, so a fresh init must serve.
#[tokio::test]
async fn a_replaced_protected_path_gets_a_fresh_init_that_protects_it() {
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    let (first, output) = run(&sandbox, &fx, "echo x >> .git/config").await;
    assert!(!output.status.success(), "{}", output.all());
    std::fs::remove_dir_all(fx.ws.join(".git")).unwrap();
    let status = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&fx.ws)
        .status()
        .unwrap();
    assert!(status.success());
    let config = std::fs::read(fx.ws.join(".git/config")).unwrap();
    let (second, output) = run(&sandbox, &fx, "echo hijacked >> .git/config").await;
    assert_ne!(second, first, "the stale init was retired");
    assert!(!output.status.success(), "{}", output.all());
    assert_eq!(std::fs::read(fx.ws.join(".git/config")).unwrap(), config);
}

/// New protected or denied paths retire the idle inits; the next command has the new mounts.
#[tokio::test]
async fn changed_paths_apply_to_the_next_command() {
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    std::fs::write(fx.ws.join("secret.env"), "TOKEN=1\n").unwrap();
    let (first, output) = run(&sandbox, &fx, "cat secret.env").await;
    assert_eq!(output.stdout, "TOKEN=1\n");
    let changed = sandbox
        .set_protected_and_denied(&[fx.ws.join(".git")], &[fx.ws.join("secret.env")])
        .unwrap();
    assert!(changed);
    assert!(
        !sandbox
            .set_protected_and_denied(&[fx.ws.join(".git")], &[fx.ws.join("secret.env")])
            .unwrap(),
        "the same set again changes nothing"
    );
    let (second, output) = run(&sandbox, &fx, "cat secret.env").await;
    assert_ne!(second, first);
    assert!(!output.status.success(), "{}", output.all());
    assert!(!output.stdout.contains("TOKEN"));
}

#[tokio::test]
async fn a_killed_or_dead_init_is_never_reused() {
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    // Killed during its command.
    let (read, write) = std::io::pipe().unwrap();
    let mut child = sandbox
        .spawn(SpawnRequest {
            program: "bash".into(),
            args: vec!["-c".into(), "echo ready; sleep 600".into()],
            cwd: fx.ws.clone(),
            env: Vec::new(),
            stdin: None,
            stdout: Some(write.into()),
            stderr: None,
        })
        .unwrap();
    let killed = child.pid();
    let mut line = [0u8; 6];
    let mut read = read;
    read.read_exact(&mut line).unwrap();
    child.kill_tree().unwrap();
    let status = tokio::time::timeout(TIMEOUT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, ExitStatus::Signal(9));
    let (next, output) = run(&sandbox, &fx, "echo fine").await;
    assert_eq!(output.stdout, "fine\n");
    assert_ne!(next, killed);
    // Died while idle (killed from outside): the next command gets a fresh init.
    let status = std::process::Command::new("kill")
        .args(["-9", &next.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (after, output) = run(&sandbox, &fx, "echo still fine").await;
    assert_eq!(output.stdout, "still fine\n", "{}", output.all());
    assert_ne!(after, next);
}

#[tokio::test]
async fn concurrent_commands_get_their_own_inits() {
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    let (a, b) = tokio::join!(
        run(&sandbox, &fx, "sleep 1; echo a"),
        run(&sandbox, &fx, "sleep 1; echo b")
    );
    assert_ne!(a.0, b.0);
    assert_eq!(a.1.stdout, "a\n");
    assert_eq!(b.1.stdout, "b\n");
}
