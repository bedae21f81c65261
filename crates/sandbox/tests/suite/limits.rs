//! Resource limits contain fork bombs, memory bombs, huge files, fd exhaustion and busy loops
//! while the host stays responsive.

use std::time::Duration;

use cordon_sandbox::{ExitStatus, PreparedSandbox, Rlimits, SpawnRequest};

use crate::support::{Fixture, TIMEOUT, processes_in_namespace, run_in};

fn limited(fx: &Fixture, limits: Rlimits) -> PreparedSandbox {
    let mut config = fx.config();
    config.limits = limits;
    PreparedSandbox::prepare(config).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_bomb_is_contained_and_cleaned_up() {
    let fx = Fixture::new();
    let sandbox = limited(
        &fx,
        Rlimits {
            processes: Some(64),
            ..Rlimits::default()
        },
    );
    let (read, write) = std::io::pipe().unwrap();
    let mut child = sandbox
        .spawn(SpawnRequest {
            program: "bash".into(),
            args: vec![
                "-c".into(),
                "echo start; bomb() { bomb | bomb & }; bomb; sleep 600".into(),
            ],
            cwd: fx.ws.clone(),
            env: vec![],
            stdin: None,
            stdout: Some(write.into()),
            stderr: None,
        })
        .unwrap();
    let mut first = [0u8; 6];
    std::io::Read::read_exact(&mut { read }, &mut first).unwrap();
    let ns = std::fs::read_link(format!("/proc/{}/ns/pid", child.pid())).unwrap();
    let ns = ns.to_string_lossy().into_owned();
    // Sample the namespace while the bomb runs: never more than the cap (as root the PID
    // namespace's pid_max, at least 301), and the host can still start processes.
    let mut peak = 0;
    for _ in 0..20 {
        peak = peak.max(processes_in_namespace(&ns).len());
        let host_ok = std::process::Command::new("true")
            .status()
            .unwrap()
            .success();
        assert!(
            host_ok,
            "the host could not start a process during the bomb"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(peak > 1, "the bomb did start processes");
    assert!(peak <= 302, "the sandbox held {peak} processes");
    child.kill_tree().unwrap();
    let status = tokio::time::timeout(TIMEOUT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, ExitStatus::Signal(9));
    assert!(
        processes_in_namespace(&ns).is_empty(),
        "bomb processes survived"
    );
}

#[tokio::test]
async fn memory_bomb_hits_the_address_space_limit() {
    let fx = Fixture::new();
    let sandbox = limited(
        &fx,
        Rlimits {
            memory_bytes: Some(256 << 20),
            ..Rlimits::default()
        },
    );
    let output = run_in(
        &sandbox,
        &fx.ws,
        "python3 -c 'x = bytearray(1 << 30); print(\"allocated\")'",
    )
    .await;
    assert!(!output.status.success(), "{}", output.all());
    assert!(output.stderr.contains("MemoryError"), "{}", output.all());
    assert!(!output.stdout.contains("allocated"));
}

#[tokio::test]
async fn file_size_limit_stops_huge_files() {
    let fx = Fixture::new();
    let sandbox = limited(
        &fx,
        Rlimits {
            file_size_bytes: Some(1 << 20),
            ..Rlimits::default()
        },
    );
    let output = run_in(&sandbox, &fx.ws, "head -c 5000000 /dev/zero > big").await;
    // head dies of SIGXFSZ (25); bash reports it as 128 + 25.
    assert_eq!(output.status, ExitStatus::Code(153), "{}", output.all());
    assert!(std::fs::metadata(fx.ws.join("big")).unwrap().len() <= 1 << 20);
}

#[tokio::test]
async fn open_file_limit_applies() {
    let fx = Fixture::new();
    let sandbox = limited(
        &fx,
        Rlimits {
            open_files: Some(32),
            ..Rlimits::default()
        },
    );
    let output = run_in(
        &sandbox,
        &fx.ws,
        "ulimit -n; python3 -c 'fs = [open(\"/dev/null\") for _ in range(100)]'",
    )
    .await;
    assert!(output.stdout.starts_with("32\n"), "{}", output.all());
    assert!(
        output.stderr.contains("Too many open files"),
        "{}",
        output.all()
    );
}

#[tokio::test]
async fn cpu_time_limit_stops_a_busy_loop() {
    let fx = Fixture::new();
    let sandbox = limited(
        &fx,
        Rlimits {
            cpu_time_secs: Some(1),
            ..Rlimits::default()
        },
    );
    let output = run_in(&sandbox, &fx.ws, "exec python3 -c 'while True: pass'").await;
    assert_eq!(
        output.status,
        ExitStatus::Signal(24),
        "SIGXCPU: {}",
        output.all()
    );
}

#[tokio::test]
async fn core_dumps_are_disabled() {
    let fx = Fixture::new();
    let output = run_in(&fx.sandbox(), &fx.ws, "ulimit -c").await;
    assert_eq!(output.stdout, "0\n");
}
