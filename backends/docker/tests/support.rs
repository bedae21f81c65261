//! Finding or starting the engine, building the images, small helpers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use cordon_backend_docker::{DockerBackend, DockerConfig};
use cordon_ops::{Backend, ExecOutcome, ExecRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub const BUSYBOX: &str = "cordon-sandbox-busybox:latest";
pub const DEBIAN: &str = cordon_backend_docker::DEFAULT_IMAGE;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Env {
    host: String,
}

static ENV: OnceLock<Option<Env>> = OnceLock::new();

fn setup() -> Option<Env> {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_DOCKER=1: skipping Docker tests as requested");
        return None;
    }
    let out = Command::new("bash")
        .arg(repo().join("scripts/docker-start.sh"))
        .output()
        .expect("run scripts/docker-start.sh");
    assert!(
        out.status.success(),
        "no Docker engine: scripts/docker-start.sh failed ({}):\n{}\nSet DOCKER_HOST to a reachable engine, or CORDON_SKIP_DOCKER=1 to skip these tests explicitly.",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let host = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    for args in [vec![], vec!["--busybox"]] {
        let out = Command::new("bash")
            .arg(repo().join("scripts/build-sandbox-image.sh"))
            .args(&args)
            .env("DOCKER_HOST", &host)
            .output()
            .expect("run scripts/build-sandbox-image.sh");
        assert!(
            out.status.success(),
            "failed to build the sandbox image {args:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Some(Env { host })
}

/// The engine's URI, or `None` when the user opted out with `CORDON_SKIP_DOCKER=1`.
pub fn docker_host() -> Option<String> {
    ENV.get_or_init(setup).as_ref().map(|e| e.host.clone())
}

/// Skip (explicit opt-out only) or get the host.
macro_rules! host_or_skip {
    () => {
        match crate::support::docker_host() {
            Some(host) => host,
            None => return,
        }
    };
}
pub(crate) use host_or_skip;

pub fn config(host: &str, root: &Path) -> DockerConfig {
    let mut config = DockerConfig::new(root);
    config.docker_host = Some(host.to_owned());
    config
}

pub async fn session(host: &str, root: &Path) -> DockerBackend {
    DockerBackend::start(config(host, root))
        .await
        .expect("start a docker session")
}

/// A temp workspace owned by root and readable by everyone (containers run as its owner).
pub fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    dir
}

pub struct Ran {
    pub output: String,
    pub outcome: ExecOutcome,
}

pub async fn run_with(
    backend: &DockerBackend,
    command: &str,
    timeout: Duration,
    cancel: CancellationToken,
) -> Ran {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    let request = ExecRequest {
        call_id: None,
        command: command.to_owned(),
        cwd: PathBuf::from("/workspace"),
        timeout,
        env: vec![],
    };
    let bash = backend.bash();
    let collector = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            out.extend_from_slice(&chunk);
        }
        out
    });
    let outcome = bash.exec(request, cancel, tx).await.expect("exec runs");
    let output = String::from_utf8_lossy(&collector.await.expect("collector")).into_owned();
    Ran { output, outcome }
}

pub async fn run(backend: &DockerBackend, command: &str) -> Ran {
    run_with(
        backend,
        command,
        Duration::from_secs(60),
        CancellationToken::new(),
    )
    .await
}

/// Whether a container with this name exists (any state).
pub async fn container_exists(backend_host: &str, name: &str) -> bool {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            &format!("name=^{name}$"),
            "--format",
            "{{.Names}}",
        ])
        .env("DOCKER_HOST", backend_host)
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l == name)
}

/// This build's `cordon-helper` (`cargo build -p cordon-helper` makes it), beside the test
/// binary's directory.
pub fn helper() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .join("cordon-helper");
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build -p cordon-helper` before these tests",
        path.display()
    );
    path
}
