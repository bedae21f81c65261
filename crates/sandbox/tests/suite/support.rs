//! Test fixtures: a workspace (a git repo) next to an "outside" directory the sandbox must
//! not touch, a prepared sandbox over it, and a runner that captures a command's output.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_sandbox::{ExitStatus, PreparedSandbox, SandboxConfig, SpawnRequest};

/// Generous: the machine is a loaded 2-core VM.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// What a command printed and how it ended.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Everything the command printed.
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// A workspace and its surroundings.
pub struct Fixture {
    _dir: tempfile::TempDir,
    /// The writable workspace, a git repository with one commit.
    pub ws: PathBuf,
    /// A directory outside every sandbox root.
    pub out: PathBuf,
    /// A directory the sandbox may read but not write.
    pub ro: PathBuf,
}

fn git(dir: &Path, args: &[&str]) {
    let status = std::process::Command::new("git")
        .args([
            "-c",
            "user.email=t@example.com",
            "-c",
            "user.name=t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("git must be installed");
    assert!(status.success(), "git {args:?} failed");
}

impl Fixture {
    /// A fixture whose workspace is a git repository.
    pub fn new() -> Fixture {
        Fixture::build(true)
    }

    /// A fixture whose workspace is not a repository (no `.git`).
    pub fn without_git() -> Fixture {
        Fixture::build(false)
    }

    fn build(with_git: bool) -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("cordon-sbx-test-")
            .tempdir()
            .unwrap();
        let root = dir.path().canonicalize().unwrap();
        let ws = root.join("ws");
        let out = root.join("outside");
        let ro = root.join("readonly");
        for path in [&ws, &out, &ro] {
            std::fs::create_dir(path).unwrap();
        }
        std::fs::write(ws.join("file.txt"), "workspace file\n").unwrap();
        std::fs::write(out.join("target.txt"), "original\n").unwrap();
        std::fs::write(ro.join("data.txt"), "read-only data\n").unwrap();
        if with_git {
            git(&ws, &["init", "-q"]);
            git(&ws, &["add", "file.txt"]);
            git(&ws, &["commit", "-q", "-m", "initial"]);
        }
        Fixture {
            _dir: dir,
            ws,
            out,
            ro,
        }
    }

    /// The default test configuration: host defaults, the workspace writable with its `.git`
    /// protected, `readonly/` readable.
    pub fn config(&self) -> SandboxConfig {
        let mut config = SandboxConfig::with_defaults(cordon_sandbox::host_defaults());
        config.write.push(self.ws.clone());
        config.read.push(self.ro.clone());
        config.protected.push(self.ws.join(".git"));
        config
    }

    /// Prepare the default sandbox.
    pub fn sandbox(&self) -> PreparedSandbox {
        PreparedSandbox::prepare(self.config()).expect("prepare the sandbox")
    }
}

fn reader(pipe: std::io::PipeReader) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut pipe = pipe;
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Run `bash -c script` in `sandbox` with `cwd`, capturing stdout and stderr.
pub async fn run_in(sandbox: &PreparedSandbox, cwd: &Path, script: &str) -> Output {
    let (out_read, out_write) = std::io::pipe().unwrap();
    let (err_read, err_write) = std::io::pipe().unwrap();
    let mut child = sandbox
        .spawn(SpawnRequest {
            program: "bash".into(),
            args: vec!["-c".into(), script.into()],
            cwd: cwd.to_path_buf(),
            env: Vec::new(),
            stdin: None,
            stdout: Some(out_write.into()),
            stderr: Some(err_write.into()),
        })
        .unwrap_or_else(|error| panic!("spawn of {script:?} failed: {error}"));
    let stdout = reader(out_read);
    let stderr = reader(err_read);
    let status = match tokio::time::timeout(TIMEOUT, child.wait()).await {
        Ok(status) => status.expect("wait for the command"),
        Err(_) => {
            child.kill_tree().unwrap();
            panic!("command timed out after {TIMEOUT:?}: {script}");
        }
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Host pids of every process in the PID namespace `ns` (a `/proc/<pid>/ns/pid` link target).
pub fn processes_in_namespace(ns: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(link) = std::fs::read_link(format!("/proc/{pid}/ns/pid"))
            && link.to_string_lossy() == ns
        {
            pids.push(pid);
        }
    }
    pids
}

/// Host processes whose command line contains `needle`.
pub fn processes_matching(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// A unique marker for this test run.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}
