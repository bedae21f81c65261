//! Latency benchmark of the SSH backend against a raw russh exec channel and the OpenSSH CLI
//! with ControlMaster, in the same run, on a server started by `scripts/ssh-test-server.sh`:
//!
//! ```sh
//! cargo build --release -p cordon-helper --bin cordon-helper
//! cargo build --release -p cordon-backend-ssh --example ssh_latency
//! eval "$(scripts/ssh-test-server.sh start /tmp/cordon-ssh-bench)"
//! CORDON_SSH_PORT=$CORDON_SSH_PORT CORDON_SSH_KEY=$CORDON_SSH_KEY \
//!   CORDON_SSH_KNOWN_HOSTS=$CORDON_SSH_KNOWN_HOSTS CORDON_SSH_ROOT=$CORDON_SSH_ROOT \
//!   target/release/examples/ssh_latency
//! scripts/ssh-test-server.sh stop /tmp/cordon-ssh-bench
//! ```
//!
//! The helper is `CORDON_SSH_HELPER`, else `cordon-helper` of the same build (the profile
//! directory above `examples/`), stripped into a temporary directory as a release would ship
//! it; its cache is a state directory of the benchmark's own. Prints median and p90 of each
//! path: connects (without the helper, uploading it, with it cached, raw russh), then,
//! interleaved call after call (`CORDON_SSH_BENCH_RUNS` each, default 200), a raw exec channel,
//! `bash: true` and a 2 KiB read through the helper (full sandbox on the host) and through the
//! session without it (shell workers, SFTP), then bursts of 100 reads through the helper one
//! after another and all at once, then the OpenSSH CLI with ControlMaster.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_backend_ssh::known_hosts::KnownHosts;
use cordon_backend_ssh::{AgentSource, SshBackend, SshConfig};
use cordon_ops::{Backend, BashOperations, ExecRequest, FileOperations};
use russh::ChannelMsg;
use russh::keys::{PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Reads in one burst.
const BURST: usize = 100;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start a server with scripts/ssh-test-server.sh start DIR")
    })
}

/// Prints median and p90 of `samples` in milliseconds; returns the median.
fn report(name: &str, mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    let at =
        |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    let (median, p90) = (at(0.5), at(0.9));
    println!(
        "{name:<52} median {median:8.3} ms   p90 {p90:8.3} ms   (n={})",
        samples.len()
    );
    median
}

/// The helper to measure: `CORDON_SSH_HELPER`, else this build's, stripped into `dir`.
fn helper_binary(dir: &Path) -> PathBuf {
    if let Ok(path) = std::env::var("CORDON_SSH_HELPER") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/ssh_latency → target/<profile>/cordon-helper
    let built = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("cordon-helper"))
        .expect("target directory");
    assert!(
        built.is_file(),
        "{} is missing: build it first (cargo build --release -p cordon-helper --bin cordon-helper)",
        built.display()
    );
    let copy = dir.join("cordon-helper");
    std::fs::copy(&built, &copy).expect("copy cordon-helper");
    let stripped = Command::new("strip").arg(&copy).status().expect("strip");
    assert!(stripped.success(), "strip failed");
    copy
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

/// `command` in `cwd` through `bash`, its output drained.
async fn bash_call(bash: &Arc<dyn BashOperations>, command: &str, cwd: &Path) -> Duration {
    let start = Instant::now();
    let (tx, mut rx) = mpsc::channel(16);
    let request = ExecRequest {
        call_id: None,
        command: command.to_owned(),
        cwd: cwd.to_path_buf(),
        timeout: Duration::from_secs(60),
        env: Vec::new(),
    };
    let exec = bash.exec(request, CancellationToken::new(), tx);
    let drain = async { while rx.recv().await.is_some() {} };
    let outcome = tokio::join!(exec, drain).0.expect("exec");
    assert_eq!(outcome.status.map(|s| s.code()), Some(0));
    start.elapsed()
}

/// A 2 KiB read of `path` through `files`.
async fn read_call(files: &Arc<dyn FileOperations>, path: &Path) -> Duration {
    let start = Instant::now();
    let data = files.read_file(path).await.expect("read");
    assert_eq!(data.len(), 2048);
    start.elapsed()
}

/// A connect with `config`, then a shut-down; the connect's time and whether it uploaded the
/// helper (`None`: the helper does not run).
async fn connect_once(config: &SshConfig) -> (Duration, Option<bool>) {
    let start = Instant::now();
    let backend = SshBackend::connect(config.clone()).await.expect("connect");
    let elapsed = start.elapsed();
    let uploaded = backend.helper_report().map(|r| r.uploaded);
    backend.shutdown().await.expect("shut the session down");
    (elapsed, uploaded)
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
    let scratch = tempfile::tempdir().expect("scratch directory");
    let helper = helper_binary(scratch.path());
    let helper_size = std::fs::metadata(&helper).expect("helper").len();
    println!(
        "helper {} ({:.1} MiB)",
        helper.display(),
        helper_size as f64 / (1 << 20) as f64
    );

    // Connection setup.
    let mut plain = SshConfig::new(format!("root@127.0.0.1:{port}"), &root);
    plain.identity = Some(key.clone());
    plain.known_hosts = Some(known.clone());
    // An empty ssh_config of our own (the backend reads only regular files, so not
    // /dev/null): the operator's ~/.ssh/config must not change what is measured.
    let empty_config = scratch.path().join("ssh_config");
    std::fs::write(&empty_config, "").expect("empty ssh_config");
    plain.ssh_config = Some(empty_config);
    plain.agent = AgentSource::Disabled;
    plain.state_dir = Some(scratch.path().join("state"));
    let mut with_helper = plain.clone();
    with_helper.helper = Some(helper);
    // Without the helper (a configured binary that does not exist): the session's shell
    // workers run commands, which the benchmark allows on purpose.
    plain.helper = Some(scratch.path().join("no-helper"));
    plain.spec.allow_degraded = true;

    // The first connect of a host uploads the helper into its cache; the others find it there.
    let backend = SshBackend::connect(with_helper.clone())
        .await
        .expect("connect");
    let report_of = backend.helper_report().expect("the helper runs").clone();
    println!(
        "missing sandbox layers on the host: {:?}",
        backend.missing_layers()
    );
    backend.shutdown().await.expect("shut the session down");
    let cached_dir = Path::new(&report_of.remote_path)
        .parent()
        .expect("cache directory")
        .to_path_buf();
    let (mut without, mut uploading, mut cached) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..10 {
        let (time, uploaded) = connect_once(&plain).await;
        assert_eq!(uploaded, None, "the helper ran without a binary");
        without.push(time);

        std::fs::remove_dir_all(&cached_dir).expect("empty the helper cache");
        let (time, uploaded) = connect_once(&with_helper).await;
        assert_eq!(uploaded, Some(true), "the helper was not uploaded");
        uploading.push(time);

        let (time, uploaded) = connect_once(&with_helper).await;
        assert_eq!(
            uploaded,
            Some(false),
            "the cached helper was uploaded again"
        );
        cached.push(time);
    }
    report("SshBackend::connect without the helper", without);
    report("SshBackend::connect uploading the helper", uploading);
    report("SshBackend::connect with the helper cached", cached);

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

    let ours = SshBackend::connect(with_helper).await.expect("connect");
    let theirs = SshBackend::connect(plain).await.expect("connect");
    assert!(ours.helper_report().is_some() && theirs.helper_report().is_none());
    let (bash, files) = (ours.bash(), ours.files());
    let (plain_bash, plain_files) = (theirs.bash(), theirs.files());

    // Interleaved so that load drifts on a shared machine hit every series alike; the first
    // five rounds warm every path up and are not counted.
    let small = root.canonicalize().expect("root").join("small.txt");
    let mut series: [Vec<Duration>; 5] = Default::default();
    for i in 0..runs + 5 {
        let start = Instant::now();
        let mut channel = handle.channel_open_session().await.expect("channel");
        channel.exec(false, "true").await.expect("exec");
        while let Some(msg) = channel.wait().await {
            if matches!(msg, ChannelMsg::Close) {
                break;
            }
        }
        let times = [
            start.elapsed(),
            bash_call(&bash, "true", &root).await,
            bash_call(&plain_bash, "true", &root).await,
            read_call(&files, &small).await,
            read_call(&plain_files, &small).await,
        ];
        if i >= 5 {
            for (samples, time) in series.iter_mut().zip(times) {
                samples.push(time);
            }
        }
    }
    let [raw, helper_bash, worker_bash, helper_read, sftp_read] = series;
    let raw_median = report("raw russh exec channel `true`", raw);
    let ours_median = report("bash `true` through the helper (full sandbox)", helper_bash);
    let workers_median = report("bash `true` without the helper (shell worker)", worker_bash);
    report("read_file 2 KiB through the helper", helper_read);
    report("read_file 2 KiB without the helper (SFTP)", sftp_read);

    // Bursts of reads through the helper: one after another, then all at once.
    let (mut sequential, mut parallel) = (Vec::new(), Vec::new());
    for i in 0..(runs / 10).max(5) + 2 {
        let start = Instant::now();
        for _ in 0..BURST {
            read_call(&files, &small).await;
        }
        let one_by_one = start.elapsed();
        let start = Instant::now();
        futures::future::join_all((0..BURST).map(|_| read_call(&files, &small))).await;
        let at_once = start.elapsed();
        if i >= 2 {
            sequential.push(one_by_one);
            parallel.push(at_once);
        }
    }
    let sequential_median = report("100 reads of 2 KiB one after another (helper)", sequential);
    let parallel_median = report("100 reads of 2 KiB at once (helper)", parallel);

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
        "helper bash/raw = {:.2}x   worker bash/raw = {:.2}x   helper bash/ControlMaster = {:.2}x   \
         burst sequential/parallel = {:.1}x",
        ours_median / raw_median,
        workers_median / raw_median,
        ours_median / cli_median,
        sequential_median / parallel_median
    );
    ours.shutdown().await.expect("shut the session down");
    theirs.shutdown().await.expect("shut the session down");
}
