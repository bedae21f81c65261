//! Shared test infrastructure started once per test process: a Docker engine with the sandbox
//! image, and a throwaway sshd on 127.0.0.1. Both come from the repository's scripts
//! (`scripts/docker-start.sh`, `scripts/build-sandbox-image.sh`, `scripts/ssh-test-server.sh`),
//! the same ones the README and CI use. A failure is returned as a message naming what is
//! missing; the calling test fails with it (opting out is explicit: `CORDON_SKIP_DOCKER=1`,
//! `CORDON_SKIP_SSH=1`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn run_script(script: &str, args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let path = repo_root().join("scripts").join(script);
    let output = Command::new(&path)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("failed to run {}: {error}", path.display()))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{} {} failed ({}): {}",
            path.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// `DOCKER_HOST` of a reachable engine with `cordon-sandbox:latest` built (started and built
/// on first use).
pub fn docker_host() -> Result<String, String> {
    static DOCKER: OnceLock<Result<String, String>> = OnceLock::new();
    DOCKER
        .get_or_init(|| {
            let host = run_script("docker-start.sh", &[], &[])?.trim().to_owned();
            if host.is_empty() {
                return Err("scripts/docker-start.sh printed no DOCKER_HOST".to_owned());
            }
            run_script("build-sandbox-image.sh", &[], &[("DOCKER_HOST", &host)])?;
            Ok(host)
        })
        .clone()
}

/// A running test sshd.
#[derive(Clone, Debug)]
pub struct Sshd {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The client key it accepts (for root).
    pub key: PathBuf,
    /// A known_hosts file trusting its host key.
    pub known_hosts: PathBuf,
    /// An empty ssh config file (so the user's `~/.ssh/config` cannot interfere).
    pub ssh_config: PathBuf,
    /// Its directory (removed when the test process ends): a place for remote state.
    pub dir: PathBuf,
}

/// The shared test sshd (started on first use; stopped by a watchdog when this process ends).
pub fn sshd() -> Result<Sshd, String> {
    static SSHD: OnceLock<Result<Sshd, String>> = OnceLock::new();
    SSHD.get_or_init(start_sshd).clone()
}

fn start_sshd() -> Result<Sshd, String> {
    let dir = std::env::temp_dir().join(format!("cordon-test-sshd-{}", std::process::id()));
    let dir_text = dir.to_string_lossy().into_owned();
    let out = run_script("ssh-test-server.sh", &["start", &dir_text], &[])?;
    // Stop the server when this test process exits, however it exits.
    let stop = repo_root().join("scripts/ssh-test-server.sh");
    let watchdog = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; '{stop}' stop '{dir}'; rm -rf '{dir}'",
        pid = std::process::id(),
        stop = stop.display(),
        dir = dir_text,
    );
    Command::new("sh")
        .args(["-c", &watchdog])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|error| format!("failed to start the sshd watchdog: {error}"))?;
    let value = |name: &str| {
        out.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .map(str::to_owned)
            .ok_or_else(|| format!("scripts/ssh-test-server.sh did not print {name}: {out}"))
    };
    let port = value("CORDON_SSH_PORT")?
        .parse()
        .map_err(|error| format!("bad CORDON_SSH_PORT: {error}"))?;
    let ssh_config = dir.join("client_config");
    std::fs::write(&ssh_config, "")
        .map_err(|error| format!("failed to write ssh config: {error}"))?;
    Ok(Sshd {
        port,
        key: PathBuf::from(value("CORDON_SSH_KEY")?),
        known_hosts: PathBuf::from(value("CORDON_SSH_KNOWN_HOSTS")?),
        ssh_config,
        dir,
    })
}

/// This build's `cordon-helper` (`cargo build -p cordon-helper`), stripped into the test
/// sshd's directory: the debug build carries ~100 MB of debug information that the helper
/// cache on the host does not need.
pub fn helper_binary() -> Result<PathBuf, String> {
    static HELPER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HELPER
        .get_or_init(|| {
            let sshd = sshd()?;
            let exe = std::env::current_exe().map_err(|error| error.to_string())?;
            // target/<profile>/deps/<test>-<hash> → target/<profile>/cordon-helper
            let built = exe
                .parent()
                .and_then(Path::parent)
                .map(|profile| profile.join("cordon-helper"))
                .ok_or_else(|| format!("no target directory above {}", exe.display()))?;
            if !built.is_file() {
                return Err(format!(
                    "{} is missing: build the helper first (cargo build -p cordon-helper)",
                    built.display()
                ));
            }
            let copy = sshd.dir.join("cordon-helper");
            std::fs::copy(&built, &copy)
                .map_err(|error| format!("failed to copy {}: {error}", built.display()))?;
            let status = Command::new("strip")
                .arg(&copy)
                .status()
                .map_err(|error| format!("failed to run strip (binutils): {error}"))?;
            if !status.success() {
                return Err(format!("strip {} failed: {status}", copy.display()));
            }
            Ok(copy)
        })
        .clone()
}

use std::os::unix::process::CommandExt as _;
