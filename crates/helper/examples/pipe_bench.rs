//! Latency of the helper protocol over a local pipe against the local backend called
//! directly, in one run: `read_file` of 2 KiB, `bash: true` (full sandbox), and a burst of 100
//! parallel reads against the same 100 one after another.
//!
//! `cargo build --release -p cordon-helper --bin cordon-helper --example pipe_bench` then
//! `target/release/examples/pipe_bench [ROUNDS]` (numbers from a debug build mean nothing).
//! The helper is `cordon-helper` next to the `examples/` directory, or `CORDON_HELPER`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_backend_local::{LocalBackend, LocalConfig};
use cordon_core::sandbox::SandboxSpec;
use cordon_helper::{HelperBackend, PipeConnector, SessionStart};
use cordon_ops::{Backend, ExecRequest, FileOperations};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(duration: Duration) -> String {
    format!("{:.3} ms", duration.as_secs_f64() * 1000.0)
}

async fn reads(files: &dyn FileOperations, path: &Path, rounds: usize) -> Duration {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let data = files.read_file(path).await.expect("read");
        samples.push(start.elapsed());
        assert_eq!(data.len(), 2048);
    }
    p50(samples)
}

async fn commands(backend: &dyn Backend, root: &Path, rounds: usize) -> Duration {
    let bash = backend.bash();
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let (sender, mut output) = mpsc::channel(16);
        let request = ExecRequest {
            call_id: None,
            command: "true".into(),
            cwd: root.to_path_buf(),
            timeout: Duration::from_secs(60),
            env: Vec::new(),
        };
        let start = Instant::now();
        let outcome = bash
            .exec(request, CancellationToken::new(), sender)
            .await
            .expect("exec");
        samples.push(start.elapsed());
        assert_eq!(outcome.status.map(|s| s.code()), Some(0));
        while output.recv().await.is_some() {}
    }
    p50(samples)
}

/// 100 reads one after another, then the same 100 at once: (sequential, burst), p50 of rounds.
async fn burst(
    files: Arc<dyn FileOperations>,
    paths: &[PathBuf],
    rounds: usize,
) -> (Duration, Duration) {
    let mut sequential = Vec::new();
    let mut parallel = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        for path in paths {
            files.read_file(path).await.expect("read");
        }
        sequential.push(start.elapsed());
        let start = Instant::now();
        let all = paths.iter().map(|path| {
            let files = Arc::clone(&files);
            async move { files.read_file(path).await.expect("read") }
        });
        futures::future::join_all(all).await;
        parallel.push(start.elapsed());
    }
    (p50(sequential), p50(parallel))
}

fn helper_program() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(|dir| dir.join("cordon-helper")));
    cordon_helper::locate_helper(beside.as_deref()).expect("build cordon-helper first")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(500);
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical");
    let file = root.join("two-kib.txt");
    std::fs::write(&file, vec![b'x'; 2048]).expect("write");
    let many: Vec<PathBuf> = (0..100)
        .map(|n| {
            let path = root.join(format!("f{n}.txt"));
            std::fs::write(&path, vec![b'y'; 2048]).expect("write");
            path
        })
        .collect();

    let local = LocalBackend::new(LocalConfig::new(&root)).expect("local backend");
    let helper = HelperBackend::start(
        Box::new(PipeConnector::new(helper_program())),
        SessionStart::new(&root, SandboxSpec::default()),
    )
    .await
    .expect("helper backend");
    // Warm up both (the first command builds the sandbox).
    reads(local.files().as_ref(), &file, 20).await;
    reads(helper.files().as_ref(), &file, 20).await;
    commands(&local, &root, 5).await;
    commands(&helper, &root, 5).await;

    let local_read = reads(local.files().as_ref(), &file, rounds).await;
    let helper_read = reads(helper.files().as_ref(), &file, rounds).await;
    let local_bash = commands(&local, &root, rounds / 5).await;
    let helper_bash = commands(&helper, &root, rounds / 5).await;
    let (local_seq, local_par) = burst(local.files(), &many, 20).await;
    let (helper_seq, helper_par) = burst(helper.files(), &many, 20).await;

    println!("rounds: {rounds} reads, {} commands (p50)", rounds / 5);
    println!(
        "read 2 KiB:        local {}  helper pipe {}  ({:.2}x)",
        ms(local_read),
        ms(helper_read),
        helper_read.as_secs_f64() / local_read.as_secs_f64()
    );
    println!(
        "bash: true:        local {}  helper pipe {}  ({:.2}x)",
        ms(local_bash),
        ms(helper_bash),
        helper_bash.as_secs_f64() / local_bash.as_secs_f64()
    );
    println!(
        "100 reads:         local sequential {} burst {}  helper pipe sequential {} burst {} ({:.1}x faster in a burst)",
        ms(local_seq),
        ms(local_par),
        ms(helper_seq),
        ms(helper_par),
        helper_seq.as_secs_f64() / helper_par.as_secs_f64()
    );
    helper.shutdown().await.expect("shutdown");
    local.shutdown().await.expect("shutdown");
}
