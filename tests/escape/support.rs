//! The harness of the escape suite: a workspace with an untouchable neighbour, a real
//! `cordon_runtime::Session` (local backend, built-in default policy, no degraded sandbox) and
//! helpers to call the real tools, prove targets untouched and find host processes.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::{ToolCall, ToolResult};
use cordon_runtime::{BackendChoice, HelperOptions, Session, SessionOptions};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Bound for a call that must not hang (never a timing assertion on the result).
pub const HANG_GUARD: Duration = Duration::from_secs(120);

/// A workspace, an outside directory holding a victim file, and a session over the workspace.
pub struct Harness {
    /// Keeps the temp directory alive.
    pub _dir: tempfile::TempDir,
    /// The workspace root (canonical).
    pub ws: PathBuf,
    /// A sibling of the workspace that must stay untouched.
    pub outside: PathBuf,
    /// `outside/victim.txt`.
    pub victim: PathBuf,
    /// The session (shared by concurrent calls).
    pub session: Arc<Session>,
    calls: AtomicU32,
}

/// The backend the suite attacks: the local backend; with `CORDON_ESCAPE_BACKEND=helper_pipe`
/// the same backend behind the remote helper's protocol (a `cordon-helper` child process, every
/// call over its stdin/stdout); with `CORDON_ESCAPE_BACKEND=ssh_helper` the SSH backend on the
/// test sshd (127.0.0.1), the workspace its remote root, every call through the helper it
/// uploads there, commands under the helper's sandbox. Any other value fails the suite.
fn escape_backend(ws: &Path) -> BackendChoice {
    match std::env::var("CORDON_ESCAPE_BACKEND").as_deref() {
        Err(_) | Ok("local") => BackendChoice::Local,
        Ok("helper_pipe") => BackendChoice::Helper(HelperOptions {
            program: Some(cordon_tests::helper::helper_program().expect("the helper program")),
        }),
        Ok("ssh_helper") => {
            let sshd = cordon_tests::infra::sshd().unwrap_or_else(|error| panic!("{error}"));
            let helper =
                cordon_tests::infra::helper_binary().unwrap_or_else(|error| panic!("{error}"));
            BackendChoice::Ssh(cordon_tests::ssh_helper_options(
                &sshd,
                helper,
                ws.to_path_buf(),
            ))
        }
        Ok(other) => {
            panic!("CORDON_ESCAPE_BACKEND={other}: expected local, helper_pipe or ssh_helper")
        }
    }
}

/// Once per process, in a session of its own: commands run on the SSH host (the helper runs
/// there). A refused command would make every attempt "fail" and the suite pass for nothing.
async fn commands_run_over_ssh() {
    static CHECKED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    CHECKED
        .get_or_init(|| async {
            let dir = tempfile::tempdir().expect("create temp dir");
            let ws = dir.path().canonicalize().unwrap();
            let local_root = ws.join("local-root");
            std::fs::create_dir(&local_root).unwrap();
            let options = SessionOptions {
                backend: escape_backend(&ws),
                ..SessionOptions::local(&local_root)
            };
            let session = Session::open(options).await.expect("open a session");
            let control = RunControl::new(CancellationToken::new(), Arc::new(|_: AgentEvent| {}));
            let call = ToolCall {
                id: "ssh-ready".to_owned(),
                name: "bash".to_owned(),
                arguments: json!({"command": "echo ready > ready.txt", "timeout": 60}),
            };
            let result = session.call(call, &control).await;
            assert!(
                !result.is_error,
                "commands do not run over ssh: {}",
                result.text()
            );
            assert_eq!(
                std::fs::read_to_string(ws.join("ready.txt")).unwrap(),
                "ready\n"
            );
            session.shutdown().await.expect("shut the session down");
        })
        .await;
}

impl Harness {
    /// A harness whose workspace is a git repository (`git init`, one commit).
    pub async fn new() -> Harness {
        let harness = Harness::bare().await;
        harness.git_init();
        harness
    }

    /// A harness whose workspace is an empty directory.
    pub async fn bare() -> Harness {
        Harness::build(|_| None).await
    }

    /// A harness whose session runs the policy `policy(outside)` returns (TOML text, written
    /// next to the workspace), over a git repository.
    pub async fn with_policy(policy: impl FnOnce(&Path) -> String) -> Harness {
        let harness = Harness::build(|outside| Some(policy(outside))).await;
        harness.git_init();
        harness
    }

    async fn build(policy: impl FnOnce(&Path) -> Option<String>) -> Harness {
        let dir = tempfile::tempdir().expect("create temp dir");
        let base = dir.path().canonicalize().unwrap();
        let ws = base.join("ws");
        let outside = base.join("outside");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let victim = outside.join("victim.txt");
        std::fs::write(&victim, "untouched victim\n").unwrap();
        let backend = escape_backend(&ws);
        // The session's own root: the workspace itself, except over SSH, where the workspace
        // is the remote root and the local root is a directory of its own.
        let remote = matches!(backend, BackendChoice::Ssh(_));
        let local_root = match backend {
            BackendChoice::Ssh(_) => {
                let root = base.join("local-root");
                std::fs::create_dir(&root).unwrap();
                root
            }
            _ => ws.clone(),
        };
        let mut options = SessionOptions {
            backend,
            ..SessionOptions::local(&local_root)
        };
        if let Some(text) = policy(&outside) {
            let path = base.join("policy.toml");
            std::fs::write(&path, text).unwrap();
            options.policy = Some(path);
        }
        assert!(!options.allow_degraded, "the suite runs the full sandbox");
        let session = Session::open(options).await.expect("open a session");
        assert!(
            session.backend().missing_layers().is_empty(),
            "this host must support every sandbox layer: {:?}",
            session.backend().missing_layers()
        );
        let harness = Harness {
            _dir: dir,
            ws,
            outside,
            victim,
            session: Arc::new(session),
            calls: AtomicU32::new(0),
        };
        if remote {
            commands_run_over_ssh().await;
        }
        harness
    }

    fn git_init(&self) {
        require_tool("git", "git");
        let run = |args: &[&str]| {
            let status = std::process::Command::new("git")
                .args(args)
                .current_dir(&self.ws)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@example.com")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@example.com")
                .status()
                .expect("run git");
            assert!(status.success(), "git {args:?}");
        };
        std::fs::write(self.ws.join("README.md"), "hello\n").unwrap();
        run(&["init", "-q"]);
        run(&["add", "README.md"]);
        run(&["commit", "-qm", "init"]);
    }

    /// `ws/<rel>`.
    pub fn at(&self, rel: &str) -> PathBuf {
        self.ws.join(rel)
    }

    /// Call `tool` with `arguments` through the whole pipeline.
    pub async fn call(&self, tool: &str, arguments: Value) -> ToolResult {
        let id = self.calls.fetch_add(1, Ordering::Relaxed);
        let control = RunControl::new(CancellationToken::new(), Arc::new(|_: AgentEvent| {}));
        let call = ToolCall {
            id: format!("call-{id}"),
            name: tool.to_owned(),
            arguments,
        };
        tokio::time::timeout(HANG_GUARD, self.session.call(call, &control))
            .await
            .unwrap_or_else(|_| panic!("{tool} call must not hang"))
    }

    /// Run a bash command (timeout 60 s unless the script says otherwise).
    pub async fn bash(&self, command: &str) -> ToolResult {
        self.call("bash", json!({"command": command, "timeout": 60}))
            .await
    }

    /// Run a bash command with a timeout in seconds.
    pub async fn bash_with_timeout(&self, command: &str, timeout: u64) -> ToolResult {
        self.call("bash", json!({"command": command, "timeout": timeout}))
            .await
    }

    /// Assert a bash command fails, returning its output.
    pub async fn bash_fails(&self, what: &str, command: &str) -> String {
        let result = self.bash(command).await;
        assert!(
            result.is_error,
            "{what}: expected the command to fail, got {}",
            result.text()
        );
        result.text()
    }

    /// Assert a tool call fails, returning its text.
    pub async fn tool_fails(&self, what: &str, tool: &str, arguments: Value) -> String {
        let result = self.call(tool, arguments).await;
        assert!(
            result.is_error,
            "{what}: expected the {tool} call to fail, got {}",
            result.text()
        );
        result.text()
    }

    /// Assert the victim file is exactly as created.
    pub fn assert_victim_untouched(&self, what: &str) {
        assert_eq!(
            std::fs::read_to_string(&self.victim).unwrap(),
            "untouched victim\n",
            "{what}: the victim changed"
        );
        assert_eq!(
            names(&self.outside),
            vec!["victim.txt"],
            "{what}: something appeared outside the workspace"
        );
    }
}

/// Fail (never skip) when a tool the suite needs is missing, naming the Debian package.
pub fn require_tool(tool: &str, package: &str) {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|out| out.status.success());
    assert!(
        found,
        "the escape suite needs `{tool}`: install it with `apt-get install -y {package}`"
    );
}

/// Content, modification time, inode and mode of a file.
pub type Snapshot = (Vec<u8>, SystemTime, u64, u32);

/// Content, modification time, inode and mode of a file, to prove it was not touched.
pub fn snapshot(path: &Path) -> Snapshot {
    let meta = std::fs::symlink_metadata(path).unwrap();
    let content = if meta.is_file() {
        std::fs::read(path).unwrap()
    } else {
        Vec::new()
    };
    (content, meta.modified().unwrap(), meta.ino(), meta.mode())
}

/// Sorted entry names of a directory.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A process name nothing else on the host uses.
pub fn token(label: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("cordon-escape-{label}-{}-{n}", std::process::id())
}

/// Shell that waits until a process with `argv[0]` = `token` runs in the sandbox.
pub fn wait_for(token: &str) -> String {
    format!(
        "found=; while [ -z \"$found\" ]; do for f in /proc/[0-9]*/cmdline; do \
         if read -r -d '' arg0 2>/dev/null < \"$f\" && [ \"$arg0\" = {token} ]; then found=1; fi; \
         done; done;"
    )
}

/// Host pids of live (non-zombie) processes whose `argv[0]` is `token`.
pub fn processes_named(token: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.split(|&b| b == 0).next() != Some(token.as_bytes()) {
            continue;
        }
        if process_state(pid).is_some_and(|state| state != 'Z') {
            found.push(pid);
        }
    }
    found
}

/// The state letter of a host process (`R`, `S`, `T`, `Z`, …).
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Wait (bounded) until no process named `token` is left on the host.
pub async fn assert_no_process_named(token: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = processes_named(token);
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "processes {left:?} named {token} survived the call"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A host process outside the sandbox (`sleep`, with `argv[0]` = a token), killed on drop.
pub struct HostProcess {
    child: std::process::Child,
    /// Its name.
    pub name: String,
}

impl HostProcess {
    /// Start `sleep 600` named by a fresh token, in `cwd`.
    pub fn start(label: &str, cwd: &Path) -> HostProcess {
        let name = token(label);
        let child = std::process::Command::new("bash")
            .args(["-c", &format!("exec -a {name} sleep 600")])
            .current_dir(cwd)
            .spawn()
            .expect("start a host process");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while processes_named(&name).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "host process did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        HostProcess { child, name }
    }

    /// Its host pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether it still runs, not stopped or traced.
    pub fn alive_and_running(&self) -> bool {
        matches!(process_state(self.pid()), Some('S' | 'R'))
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A file created for the test and removed afterwards, together with the directories the
/// test had to create for it (anything that already existed is left alone).
pub struct Planted {
    /// The file.
    pub path: PathBuf,
    created_dirs: Vec<PathBuf>,
}

impl Planted {
    /// Create `path` with `content`; it must not exist yet.
    pub fn new(path: &Path, content: &str) -> Planted {
        assert!(
            std::fs::symlink_metadata(path).is_err(),
            "{} already exists; refusing to overwrite it",
            path.display()
        );
        let mut created_dirs = Vec::new();
        let mut missing = Vec::new();
        let mut dir = path.parent();
        while let Some(d) = dir {
            if d.exists() {
                break;
            }
            missing.push(d.to_path_buf());
            dir = d.parent();
        }
        for d in missing.iter().rev() {
            std::fs::create_dir(d).unwrap();
            created_dirs.push(d.clone());
        }
        std::fs::write(path, content).unwrap();
        Planted {
            path: path.to_path_buf(),
            created_dirs,
        }
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        for dir in self.created_dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The host home directory the session's backend uses (`$HOME`, else `/root`).
pub fn host_home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|home| home.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/root"))
}
