//! Resource bombs are contained by the default policy's limits (512 processes, 2 GiB of
//! address space per process) and the call's timeout; the host stays responsive, and the
//! next command runs normally.

use std::time::{Duration, Instant};

use crate::support::{Harness, require_tool};

/// The host can still start a process and get its answer.
fn assert_host_responsive(what: &str) {
    let output = std::process::Command::new("sh")
        .args(["-c", "echo alive"])
        .output()
        .unwrap_or_else(|error| panic!("{what}: the host cannot start a process: {error}"));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "alive\n", "{what}");
}

#[tokio::test]
async fn fork_bomb_is_contained() {
    require_tool("python3", "python3");
    let h = Harness::new().await;
    let started = Instant::now();
    let result = h
        .bash_with_timeout("bomb() { bomb | bomb; }; bomb", 5)
        .await;
    // Either the bomb fizzled against the process cap, or the timeout killed it; the call
    // came back in both cases.
    let text = result.text();
    assert!(
        text.contains("Resource temporarily unavailable") || text.contains("timed out"),
        "{text}"
    );
    // The host got its share while the bomb ran: a host process starts right after.
    assert_host_responsive("fork bomb");
    // The process cap is what stopped it, not only the timeout: forking stops with EAGAIN
    // (as root the cap is the PID namespace's pid_max, at most 300 above the policy's 512).
    let probe = h
        .bash_with_timeout(
            "python3 -c '
import os, time
n = 0
try:
    for i in range(3000):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as error:
    print(\"capped\", n, error.errno)
else:
    print(\"uncapped\", n)
'",
            60,
        )
        .await;
    let text = probe.text();
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"capped"), "{text}");
    let forked: u32 = fields[1].parse().unwrap();
    assert!(
        (400..=812).contains(&forked),
        "forked {forked} processes: {text}"
    );
    assert_eq!(fields[2], "11", "EAGAIN: {text}");
    let after = h.bash("echo next").await;
    assert_eq!(after.text().trim(), "next");
    assert!(started.elapsed() < Duration::from_secs(600));
}

#[tokio::test]
async fn memory_bomb_is_contained() {
    require_tool("python3", "python3");
    let h = Harness::new().await;
    let result = h
        .bash_with_timeout(
            "python3 -c 'blocks = []\nwhile True: blocks.append(bytearray(64 << 20))'",
            60,
        )
        .await;
    assert!(result.is_error, "{}", result.text());
    assert!(
        result.text().contains("MemoryError") || result.text().contains("Cannot allocate"),
        "the address-space limit stops it: {}",
        result.text()
    );
    let huge = h.bash("python3 -c 'x = bytearray(3 << 30)'").await;
    assert!(
        huge.is_error && huge.text().contains("MemoryError"),
        "{}",
        huge.text()
    );
    assert_host_responsive("memory bomb");
    let after = h.bash("echo next").await;
    assert_eq!(after.text().trim(), "next");
}

#[tokio::test]
async fn huge_output_is_bounded_for_the_model() {
    let h = Harness::new().await;
    let result = h
        .bash("head -c 20000000 /dev/zero | tr '\\0' 'x' | fold -w 100")
        .await;
    assert!(!result.is_error);
    assert!(
        result.text().len() < 60 * 1024,
        "tail truncation keeps the model's view small"
    );
}
