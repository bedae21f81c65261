//! Spawn cost of `bash: true` through the WHOLE pipeline — a `cordon_runtime::Session` with
//! the built-in default policy (prepare, validate, policy analysis, the bash tool, the local
//! backend's full sandbox, after-hooks) — against a bare `bash -c true` spawned from Rust,
//! interleaved in one run. Wall-clock p50/p95 in microseconds, then CPU time per call (this
//! process plus reaped children, from /proc/self/stat), which the machine's other load
//! disturbs less.
//!
//! `cargo bench -p cordon-tests --bench spawn -- [RUNS]` (root, Linux).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::ToolCall;
use cordon_runtime::{Session, SessionOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

fn bare() -> f64 {
    let start = Instant::now();
    let status = std::process::Command::new("bash")
        .args(["-c", "true"])
        .status()
        .expect("spawn bash");
    assert!(status.success());
    start.elapsed().as_secs_f64() * 1e6
}

/// The local backend's `BashOperations::exec` of `true`, without tools or policy.
async fn backend_exec(session: &Session) -> f64 {
    let start = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let outcome = session
        .backend()
        .bash()
        .exec(
            cordon_ops::ExecRequest {
                call_id: None,
                command: "true".into(),
                cwd: session.backend().files().root().to_path_buf(),
                timeout: std::time::Duration::from_secs(60),
                env: Vec::new(),
            },
            CancellationToken::new(),
            tx,
        )
        .await
        .expect("exec");
    drain.await.unwrap();
    let elapsed = start.elapsed().as_secs_f64() * 1e6;
    assert_eq!(outcome.status, Some(cordon_ops::ExitStatus::Code(0)));
    elapsed
}

/// A `read` of a small file through the Session: the pipeline's own cost, no process.
async fn pipeline_read(session: &Session, control: &RunControl) -> f64 {
    let start = Instant::now();
    let result = session
        .call(
            ToolCall {
                id: "bench-read".into(),
                name: "read".into(),
                arguments: json!({"path": "main.rs"}),
            },
            control,
        )
        .await;
    let elapsed = start.elapsed().as_secs_f64() * 1e6;
    assert!(!result.is_error, "{}", result.text());
    elapsed
}

async fn pipeline(session: &Session, control: &RunControl) -> f64 {
    let start = Instant::now();
    let result = session
        .call(
            ToolCall {
                id: "bench".into(),
                name: "bash".into(),
                arguments: json!({"command": "true"}),
            },
            control,
        )
        .await;
    let elapsed = start.elapsed().as_secs_f64() * 1e6;
    assert!(!result.is_error, "{}", result.text());
    elapsed
}

/// utime + stime + cutime + cstime of this process, in clock ticks (USER_HZ = 100).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    (14..=17)
        .map(|field| fields[field - 3].parse::<u64>().expect("ticks"))
        .sum()
}

fn git_init(ws: &Path) {
    let status = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(ws)
        .status()
        .expect("git init (apt-get install -y git)");
    assert!(status.success());
}

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(300);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let dir = tempfile::tempdir().expect("temp dir");
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        git_init(&ws);
        std::fs::write(ws.join("main.rs"), "fn main() {}\n").unwrap();
        let session = Session::open(SessionOptions::local(&ws))
            .await
            .expect("session");
        assert!(session.backend().missing_layers().is_empty());
        let control = RunControl::new(CancellationToken::new(), Arc::new(|_: AgentEvent| {}));
        for _ in 0..20 {
            bare();
            pipeline(&session, &control).await;
        }
        let mut bare_samples = Vec::with_capacity(runs);
        let mut pipeline_samples = Vec::with_capacity(runs);
        let mut exec_samples = Vec::with_capacity(runs);
        let mut read_samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            bare_samples.push(bare());
            pipeline_samples.push(pipeline(&session, &control).await);
            exec_samples.push(backend_exec(&session).await);
            read_samples.push(pipeline_read(&session, &control).await);
        }
        let base = percentile(&mut bare_samples.clone(), 0.5);
        println!("{runs} runs each, interleaved; wall clock in microseconds");
        for (name, samples) in [
            ("bare `bash -c true` (std Command)", &mut bare_samples),
            ("`bash: true` through a Session", &mut pipeline_samples),
            ("  backend exec of `true` alone", &mut exec_samples),
            ("  `read` through a Session (no process)", &mut read_samples),
        ] {
            let p50 = percentile(samples, 0.5);
            let p95 = percentile(samples, 0.95);
            println!(
                "{name:<40} p50 {p50:>7.0}  p95 {p95:>7.0}  ({:.2}x bare p50)",
                p50 / base
            );
        }
        session.shutdown().await.expect("shut the session down");
        drop(session);
        // CPU time: the commands run under the sandbox's init, which reaps them, so their
        // time reaches this process only once the init itself is reaped: measure a fresh
        // session from opening to after it is gone (and let the first one's init go first).
        tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
        println!("CPU time per call (user + system, self + children), {runs} sequential runs:");
        let before = cpu_ticks();
        for _ in 0..runs {
            bare();
        }
        let bare_cpu = (cpu_ticks() - before) as f64 * 1e4 / runs as f64;
        let before = cpu_ticks();
        let session = Session::open(SessionOptions::local(&ws))
            .await
            .expect("session");
        for _ in 0..runs {
            pipeline(&session, &control).await;
        }
        session.shutdown().await.expect("shut the session down");
        drop(session);
        // Inits end when their session is dropped and are reaped in the background.
        tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
        let pipeline_cpu = (cpu_ticks() - before) as f64 * 1e4 / runs as f64;
        println!("bare `bash -c true` (std Command)        {bare_cpu:>7.0} us CPU  (1.00x)");
        println!(
            "`bash: true` through a Session           {pipeline_cpu:>7.0} us CPU  ({:.2}x)",
            pipeline_cpu / bare_cpu
        );
    });
}
