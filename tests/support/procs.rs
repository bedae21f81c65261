//! Is a command's process tree gone? Processes are found from the host's `/proc` by a unique
//! argument (every backend the suites run here shares this machine's kernel: the host, a
//! container, sshd on localhost), so the check does not depend on the backend under test.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a condition the suites wait for may take on a loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A `sleep` argument no other process has: `3600.<pid><counter>` (an hour, never reached).
/// Use it as `sleep MARKER` to find the process later with [`pids_with_arg`].
pub fn sleep_marker() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("3600.{}{n:04}", std::process::id())
}

/// Live processes (not zombies) with `arg` among their arguments.
pub fn pids_with_arg(arg: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // A zombie or exiting process has an empty cmdline: it no longer runs.
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline
                    .split(|byte| *byte == 0)
                    .any(|word| word == arg.as_bytes())
            })
        })
        .collect()
}

/// Wait until `check` holds, polling; panic naming `what` after [`PATIENCE`].
pub async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until a file exists on the host.
pub async fn wait_for_file(path: &Path) {
    wait_until(&format!("{} exists", path.display()), || path.exists()).await;
}

/// Wait until at least `count` processes carry `marker`.
pub async fn wait_for_processes(marker: &str, count: usize) {
    wait_until(&format!("{count} processes run `sleep {marker}`"), || {
        pids_with_arg(marker).len() >= count
    })
    .await;
}

/// Assert that no process carries `marker` any more. A killed process may take a moment to
/// leave `/proc` after its kill was sent, so this waits up to [`GONE_GRACE`]; survivors are
/// killed (so a failing test leaves nothing behind) and reported.
pub async fn assert_gone(marker: &str) {
    let start = Instant::now();
    loop {
        let alive = pids_with_arg(marker);
        if alive.is_empty() {
            return;
        }
        if start.elapsed() >= GONE_GRACE {
            for pid in &alive {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            panic!("processes {alive:?} (`sleep {marker}`) outlived their call");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a killed process may linger in `/proc` after its call returned.
pub const GONE_GRACE: Duration = Duration::from_secs(10);
