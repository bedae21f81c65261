//! What filtered network mode adds to a command on the Docker backend, in one run:
//!
//! ```sh
//! cargo build --release -p cordon-helper --bin cordon-helper
//! cargo build --release -p cordon-backend-docker --example filtered_bench
//! DOCKER_HOST="$(scripts/docker-start.sh)" target/release/examples/filtered_bench
//! ```
//!
//! Prints p50 / p90 / mean over `BENCH_N` iterations (default 100) of `true` through
//! `BashOperations::exec` (commands through the helper) in a session without a network and in a
//! filtered one (the forwarder's check before each command and the end barrier after it), run
//! alternately, and of a command that makes one allowed connection, in the filtered session.
//! The helper is `CORDON_HELPER`, else `cordon-helper` of the same build.

mod support;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{helper_binary, stats};

use cordon_backend_docker::{DockerBackend, DockerConfig, EgressResolver, FilesHelper};
use cordon_core::sandbox::NetworkMode;
use cordon_egress::proxy::StaticResolver;
use cordon_ops::{Backend, BashOperations, ExecRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

async fn timed(bash: &Arc<dyn BashOperations>, command: &str) -> Duration {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let request = ExecRequest {
        call_id: Some("bench".to_owned()),
        command: command.to_owned(),
        cwd: PathBuf::from("/workspace"),
        timeout: Duration::from_secs(60),
        env: vec![],
    };
    let t = Instant::now();
    let outcome = bash
        .exec(request, CancellationToken::new(), tx)
        .await
        .expect("exec");
    let elapsed = t.elapsed();
    drain.await.expect("drain");
    assert_eq!(outcome.status.map(|s| s.code()), Some(0), "{command}");
    elapsed
}

/// A host server answering every request with a short body.
async fn serve(listener: tokio::net::TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream
                .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .await;
            let _ = stream.shutdown().await;
        });
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(serve(listener));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut off = DockerConfig::new(dir.path());
    off.helper = Some(helper_binary());
    off.files_helper = FilesHelper::Required;
    let mut filtered = off.clone();
    filtered.spec.network = NetworkMode::Filtered;
    filtered.spec.egress.allow = vec![format!("allowed.test:{port}"), format!("127.0.0.1:{port}")];
    filtered.egress_resolver = Some(EgressResolver(Arc::new(StaticResolver::new([(
        "allowed.test",
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    )]))));
    let off = DockerBackend::start(off).await.expect("start");
    let filtered = DockerBackend::start(filtered).await.expect("start");
    let (off_bash, filtered_bash) = (off.bash(), filtered.bash());
    let fetch = format!(
        "python3 -c \"import urllib.request; urllib.request.urlopen('http://allowed.test:{port}/').read()\""
    );
    // Warm-up (the forwarder starts with the first filtered command).
    for _ in 0..3 {
        timed(&off_bash, "true").await;
        timed(&filtered_bash, "true").await;
        timed(&filtered_bash, &fetch).await;
    }
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        a.push(timed(&off_bash, "true").await);
        b.push(timed(&filtered_bash, "true").await);
        c.push(timed(&filtered_bash, &fetch).await);
    }
    stats("bash `true`, no network", a);
    stats("bash `true`, filtered network", b);
    stats("bash python fetch (one connection), filtered", c);
    off.stop().await.expect("stop");
    filtered.stop().await.expect("stop");
}
