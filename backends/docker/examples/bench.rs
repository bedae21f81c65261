//! Latency of the Docker backend against its baselines, in one run:
//!
//! ```sh
//! cargo build --release -p cordon-helper --bin cordon-helper
//! cargo build --release -p cordon-backend-docker --example bench
//! DOCKER_HOST="$(scripts/docker-start.sh)" target/release/examples/bench
//! ```
//!
//! Prints p50 / p90 / mean over `BENCH_N` iterations (default 40) for: session start (create +
//! start + probe + file helper) and stop, `true` through `BashOperations::exec`, a raw bollard
//! exec of `true` (create, attached start, drain, inspect), the `docker exec` CLI, and a 2 KB
//! `read_file` through the file helper and, in a second session without it, through the
//! session's shell workers. The helper's rows come in pairs: over its Unix socket (the
//! default where the engine runs on this machine) and, in a third session, over the
//! engine's attach stream (`HelperTransport::Attach`). Series run in alternating blocks, not
//! call by call (see the comment in `main`). The helper is `CORDON_HELPER`, else `cordon-helper` of the same
//! build (the profile directory above `examples/`).

mod support;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{helper_binary, stats};

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use cordon_backend_docker::{DockerBackend, DockerConfig, FilesHelper, HelperTransport};
use cordon_ops::{Backend, ExecRequest};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

async fn raw_exec(docker: &bollard::Docker, container: &str) {
    raw_exec_argv(docker, container, vec!["true".to_owned()], false).await
}

async fn raw_exec_argv(docker: &bollard::Docker, container: &str, cmd: Vec<String>, stdin: bool) {
    let created = docker
        .create_exec(
            container,
            CreateExecOptions::<String> {
                attach_stdin: Some(stdin),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(cmd),
                ..Default::default()
            },
        )
        .await
        .expect("create exec");
    if let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(&created.id, None::<StartExecOptions>)
        .await
        .expect("start exec")
    {
        while output.next().await.is_some() {}
    }
    docker.inspect_exec(&created.id).await.expect("inspect");
}

/// One `true` through `BashOperations::exec`, timed.
async fn bash_true(bash: &std::sync::Arc<dyn cordon_ops::BashOperations>) -> Duration {
    let t = Instant::now();
    let (tx, mut rx) = mpsc::channel(16);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let outcome = bash
        .exec(
            ExecRequest {
                call_id: None,
                command: "true".to_owned(),
                cwd: PathBuf::from("/workspace"),
                timeout: Duration::from_secs(30),
                env: vec![],
            },
            CancellationToken::new(),
            tx,
        )
        .await
        .expect("exec");
    drain.await.expect("drain");
    let elapsed = t.elapsed();
    assert_eq!(outcome.status.map(|s| s.code()), Some(0));
    elapsed
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("small.txt"), "x".repeat(2048)).expect("write");
    let mut config = DockerConfig::new(dir.path());
    config.helper = Some(helper_binary());
    config.files_helper = FilesHelper::Required;
    let mut shell_config = config.clone();
    shell_config.files_helper = FilesHelper::Shell;
    let mut attach_config = config.clone();
    attach_config.helper_transport = HelperTransport::Attach;

    let mut starts = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let backend = DockerBackend::start(config.clone()).await.expect("start");
        starts.push(t.elapsed());
        let t = Instant::now();
        backend.shutdown().await.expect("shut the session down");
        stops.push(t.elapsed());
    }

    let backend = DockerBackend::start(config).await.expect("start");
    assert!(
        backend.files_helper().is_some(),
        "the file helper does not run"
    );
    let shell_backend = DockerBackend::start(shell_config).await.expect("start");
    assert!(shell_backend.files_helper().is_none());
    let shell_files = shell_backend.files();
    let attach_backend = DockerBackend::start(attach_config).await.expect("start");
    println!(
        "helper transport: {:?}; the third session's: {:?}",
        backend.helper_transport(),
        attach_backend.helper_transport()
    );
    let (attach_bash, attach_files) = (attach_backend.bash(), attach_backend.files());
    let (mut attach_ours, mut attach_reads) = (Vec::new(), Vec::new());
    let docker = backend.docker().clone();
    let container = backend.container().to_owned();
    let bash = backend.bash();
    let files = backend.files();
    let host = std::env::var("DOCKER_HOST").unwrap_or_default();

    // Warm-up.
    for _ in 0..3 {
        raw_exec(&docker, &container).await;
    }

    let (mut ours, mut raw, mut cli) = (Vec::new(), Vec::new(), Vec::new());
    let (mut reads, mut shell_reads) = (Vec::new(), Vec::new());
    let (mut raw_stdin, mut raw_sh, mut raw_bash) = (Vec::new(), Vec::new(), Vec::new());
    let diag = std::env::var("BENCH_DIAG").is_ok();
    // Each series runs in blocks, the blocks of all series alternating over `rounds` rounds
    // (so load drifts still hit every series alike), and the first `settle` calls of a block
    // are not kept. An engine exec is not over when its answer comes: the engine and the
    // container's shim tear it down for milliseconds afterwards, on the same two CPUs. Calls
    // interleaved one by one with engine execs measured that aftermath (1–1.5 ms more per
    // `bash: true` here), not the call.
    // `BENCH_ONE_BY_ONE=1` runs the old order instead (blocks of one call, none left out), to
    // show the difference.
    let one_by_one = std::env::var("BENCH_ONE_BY_ONE").is_ok_and(|v| v == "1");
    let (rounds, settle) = if one_by_one { (n, 0) } else { (4, 3) };
    let per_block = n.div_ceil(rounds);
    macro_rules! block {
        ($samples:expr, $call:expr) => {
            for i in 0..settle + per_block {
                let t = Instant::now();
                $call;
                let elapsed = t.elapsed();
                if i >= settle {
                    $samples.push(elapsed);
                }
            }
        };
    }
    for _ in 0..rounds {
        block!(ours, bash_true(&bash).await);
        block!(attach_ours, bash_true(&attach_bash).await);
        block!(raw, raw_exec(&docker, &container).await);
        if diag {
            block!(
                raw_stdin,
                raw_exec_argv(&docker, &container, vec!["true".to_owned()], true).await
            );
            block!(
                raw_sh,
                raw_exec_argv(
                    &docker,
                    &container,
                    vec!["sh".to_owned(), "-c".to_owned(), "true".to_owned()],
                    false,
                )
                .await
            );
            block!(
                raw_bash,
                raw_exec_argv(
                    &docker,
                    &container,
                    vec!["bash".to_owned(), "-c".to_owned(), "true".to_owned()],
                    false,
                )
                .await
            );
        }
        block!(cli, {
            let status = tokio::process::Command::new("docker")
                .args(["exec", &container, "true"])
                .env("DOCKER_HOST", &host)
                .status()
                .await
                .expect("docker exec");
            assert!(status.success());
        });
        for (samples, files) in [
            (&mut reads, &files),
            (&mut attach_reads, &attach_files),
            (&mut shell_reads, &shell_files),
        ] {
            block!(samples, {
                let data = files
                    .read_file(Path::new("/workspace/small.txt"))
                    .await
                    .expect("read");
                assert_eq!(data.len(), 2048);
            });
        }
    }
    // What `bash` itself costs in this container now: 200 bare `bash -c true` in a loop,
    // timed inside it (no engine, no Cordon), the floor under the `bash: true` rows.
    let out = tokio::process::Command::new("docker")
        .args([
            "exec",
            &container,
            "bash",
            "-c",
            "s=$(date +%s%N); for i in $(seq 200); do bash -c true; done; e=$(date +%s%N); echo $(( (e - s) / 200 ))",
        ])
        .env("DOCKER_HOST", &host)
        .output()
        .await
        .expect("docker exec");
    let bare_ns: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the loop's time");
    backend.shutdown().await.expect("shut the session down");
    attach_backend
        .shutdown()
        .await
        .expect("shut the session down");
    shell_backend
        .shutdown()
        .await
        .expect("shut the session down");

    stats("session start (create+start+probe)", starts);
    stats("session stop (remove)", stops);
    stats("bash `true` via BashOperations", ours);
    stats("bash `true`, helper over attach", attach_ours);
    println!(
        "{:<40} mean {:>7.2} ms   (n=200, a loop in the container)",
        "bare `bash -c true` in the container",
        bare_ns as f64 / 1e6
    );
    stats("raw bollard exec `true`", raw);
    stats("`docker exec` CLI `true`", cli);
    stats("read_file 2 KB (file helper)", reads);
    stats("read_file 2 KB (helper over attach)", attach_reads);
    stats("read_file 2 KB (shell workers)", shell_reads);
    if diag {
        stats("raw exec `true`, stdin attached", raw_stdin);
        stats("raw exec `sh -c true`", raw_sh);
        stats("raw exec `bash -c true`", raw_bash);
    }
}
