//! Latency benchmark of the SSH backend against a raw russh exec channel and the OpenSSH CLI
//! with ControlMaster, in the same run, on a server started by `scripts/ssh-test-server.sh`:
//!
//! ```sh
//! eval "$(scripts/ssh-test-server.sh start /tmp/cordon-ssh-bench)"
//! CORDON_SSH_PORT=$CORDON_SSH_PORT CORDON_SSH_KEY=$CORDON_SSH_KEY \
//!   CORDON_SSH_KNOWN_HOSTS=$CORDON_SSH_KNOWN_HOSTS CORDON_SSH_ROOT=$CORDON_SSH_ROOT \
//!   cargo run --release -p cordon-backend-ssh --example ssh_latency
//! scripts/ssh-test-server.sh stop /tmp/cordon-ssh-bench
//! ```
//!
//! Prints median and mean per-call latency of each path (`CORDON_SSH_BENCH_RUNS` calls each,
//! default 200): connection setup, then — interleaved, call after call — a raw exec channel, the
//! backend's bash, a worker round trip that starts no process (a missing working directory) and
//! a 2 KiB SFTP read, then the OpenSSH CLI with ControlMaster.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_backend_ssh::known_hosts::KnownHosts;
use cordon_backend_ssh::{AgentSource, SshBackend, SshConfig};
use cordon_ops::{Backend, ExecError, ExecRequest};
use russh::ChannelMsg;
use russh::keys::{PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start a server with scripts/ssh-test-server.sh start DIR")
    })
}

fn report(name: &str, mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    let median = samples[samples.len() / 2].as_secs_f64() * 1e3;
    let mean = samples.iter().map(Duration::as_secs_f64).sum::<f64>() / samples.len() as f64 * 1e3;
    println!(
        "{name:<44} median {median:7.3} ms   mean {mean:7.3} ms   (n={})",
        samples.len()
    );
    median
}

struct Verify {
    known: KnownHosts,
    port: u16,
}

impl russh::client::Handler for Verify {
    type Error = russh::Error;
    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(match key {
            PublicKeyOrCertificate::PublicKey { key, .. } => {
                self.known.check("127.0.0.1", self.port, key).is_ok()
            }
            PublicKeyOrCertificate::Certificate(_) => false,
        })
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let port: u16 = env("CORDON_SSH_PORT").parse().expect("port");
    let key = PathBuf::from(env("CORDON_SSH_KEY"));
    let known = PathBuf::from(env("CORDON_SSH_KNOWN_HOSTS"));
    let root = PathBuf::from(env("CORDON_SSH_ROOT"));
    let runs: usize = std::env::var("CORDON_SSH_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(200);
    std::fs::write(root.join("small.txt"), "x".repeat(2048)).expect("small file");

    // Connection setup.
    let mut config = SshConfig::new(format!("root@127.0.0.1:{port}"), &root);
    config.identity = Some(key.clone());
    config.known_hosts = Some(known.clone());
    // An empty ssh_config of our own (the backend reads only regular files, so not
    // /dev/null): the operator's ~/.ssh/config must not change what is measured.
    // Created exclusively under a random name (no predictable /tmp path another user could
    // have put a symlink at) and removed when the benchmark ends.
    let empty_config = tempfile::NamedTempFile::new().expect("empty ssh_config");
    config.ssh_config = Some(empty_config.path().to_path_buf());
    config.agent = AgentSource::Disabled;
    // The benchmark runs commands on purpose.
    config.spec.allow_degraded = true;
    let mut setups = Vec::new();
    for _ in 0..10 {
        let start = Instant::now();
        let backend = SshBackend::connect(config.clone()).await.expect("connect");
        setups.push(start.elapsed());
        backend.shutdown().await.expect("shut the session down");
    }
    report("SshBackend::connect (ssh+sftp+probe)", setups);

    let russh_config = Arc::new(russh::client::Config::default());
    let private = Arc::new(russh::keys::load_secret_key(&key, None).expect("key"));
    let mut raw_setups = Vec::new();
    let mut session = None;
    for _ in 0..10 {
        let start = Instant::now();
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("tcp");
        stream.set_nodelay(true).expect("nodelay");
        let handler = Verify {
            known: KnownHosts {
                files: vec![known.clone()],
            },
            port,
        };
        let mut handle = russh::client::connect_stream(russh_config.clone(), stream, handler)
            .await
            .expect("handshake");
        let auth = handle
            .authenticate_publickey("root", PrivateKeyWithHashAlg::new(private.clone(), None))
            .await
            .expect("auth");
        assert!(auth.success());
        raw_setups.push(start.elapsed());
        session = Some(handle);
    }
    report("raw russh connect + auth", raw_setups);
    let handle = session.expect("session");

    let backend = SshBackend::connect(config).await.expect("connect");
    let bash = backend.bash();
    let files = backend.files();

    // Interleaved so that load drifts on a shared machine hit every series alike; the first
    // five rounds warm every path up and are not counted.
    let small = root.canonicalize().expect("root").join("small.txt");
    let (mut raw, mut ours, mut trip, mut reads) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let bash_call = |command: &str, cwd: PathBuf| {
        let bash = bash.clone();
        let command = command.to_owned();
        async move {
            let (tx, mut rx) = mpsc::channel(16);
            let request = ExecRequest {
                call_id: None,
                command,
                cwd,
                timeout: Duration::from_secs(60),
                env: Vec::new(),
            };
            let exec = bash.exec(request, CancellationToken::new(), tx);
            let drain = async { while rx.recv().await.is_some() {} };
            tokio::join!(exec, drain).0
        }
    };
    for i in 0..runs + 5 {
        let start = Instant::now();
        let mut channel = handle.channel_open_session().await.expect("channel");
        channel.exec(false, "true").await.expect("exec");
        while let Some(msg) = channel.wait().await {
            if matches!(msg, ChannelMsg::Close) {
                break;
            }
        }
        let raw_time = start.elapsed();

        let start = Instant::now();
        let outcome = bash_call("true", root.clone()).await.expect("exec");
        let ours_time = start.elapsed();
        assert_eq!(outcome.status.map(|s| s.code()), Some(0));

        // A request that starts no process: the worker round trip alone.
        let start = Instant::now();
        let missing = bash_call("true", root.join("no-such-dir")).await;
        let trip_time = start.elapsed();
        assert!(
            matches!(missing, Err(ExecError::MissingCwd { .. })),
            "{missing:?}"
        );

        let start = Instant::now();
        let data = files.read_file(&small).await.expect("read");
        let read_time = start.elapsed();
        assert_eq!(data.len(), 2048);
        if i >= 5 {
            raw.push(raw_time);
            ours.push(ours_time);
            trip.push(trip_time);
            reads.push(read_time);
        }
    }
    let raw_median = report("raw russh exec channel `true`", raw);
    let ours_median = report("SshBackend BashOperations `true`", ours);
    report("SshBackend worker round trip (no process)", trip);
    report("SshBackend read_file 2 KiB", reads);

    // OpenSSH with ControlMaster.
    let control = std::env::temp_dir().join(format!("cordon-bench-cm-{port}"));
    let ssh = |extra: &[&str]| {
        let mut cmd = Command::new("ssh");
        cmd.args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ControlMaster=auto",
            "-o",
            "ControlPersist=120",
        ])
        .arg("-o")
        .arg(format!("ControlPath={}", control.display()))
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", known.display()))
        .arg("-i")
        .arg(&key)
        .args(["-p", &port.to_string(), "root@127.0.0.1"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        cmd
    };
    let mut cli = Vec::new();
    for i in 0..runs + 5 {
        let start = Instant::now();
        let status = ssh(&["true"]).status().expect("ssh");
        assert!(status.success(), "ssh with ControlMaster failed");
        if i >= 5 {
            cli.push(start.elapsed());
        }
    }
    let cli_median = report("OpenSSH CLI with ControlMaster `true`", cli);
    // Stops the benchmark's ssh control master; one already gone is fine.
    let _ = ssh(&["-O", "exit"]).status();

    println!(
        "bash/raw = {:.2}x   bash/ControlMaster = {:.2}x",
        ours_median / raw_median,
        ours_median / cli_median
    );
    backend.shutdown().await.expect("shut the session down");
}
