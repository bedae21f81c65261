//! The harness of the escape suite: a workspace with an untouchable neighbour, a real
//! `cordon_runtime::Session` (the backend `CORDON_ESCAPE_BACKEND` names, local by default;
//! built-in default policy, no degraded sandbox) and helpers to call the real tools, prove
//! targets untouched and find the processes the cases attack (on Docker, in the container).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::{ToolCall, ToolResult};
use cordon_runtime::{
    BackendChoice, DockerFilesHelper, DockerOptions, DockerUnlistedBind, HelperOptions, Session,
    SessionOptions, WorkspaceMode,
};
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
    /// Docker: the session's container (`None` on the other backends).
    container: Option<String>,
    /// Docker: the engine's `DOCKER_HOST`.
    docker_host: Option<String>,
    calls: AtomicU32,
}

/// The backend the suite attacks: the local backend; with `CORDON_ESCAPE_BACKEND=helper_pipe`
/// the same backend behind the remote helper's protocol (a `cordon-helper` child process, every
/// call over its stdin/stdout); with `CORDON_ESCAPE_BACKEND=ssh_helper` the SSH backend on the
/// test sshd (127.0.0.1), the workspace its remote root, every call through the helper it
/// uploads there, commands under the helper's sandbox; with `CORDON_ESCAPE_BACKEND=docker_helper`
/// the Docker backend (bind mode) with this build's helper required in the container, commands
/// under its container profile, and `canaries` mounted into the container without any policy
/// rule (see [`Harness::build`]). Any other value fails the suite.
fn escape_backend(ws: &Path, canaries: Vec<DockerUnlistedBind>) -> BackendChoice {
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
        Ok("docker_helper") => {
            let host = cordon_tests::infra::docker_host().unwrap_or_else(|error| panic!("{error}"));
            let helper =
                cordon_tests::helper::helper_program().unwrap_or_else(|error| panic!("{error}"));
            let image = escape_image(&host);
            BackendChoice::Docker(DockerOptions {
                image,
                docker_host: Some(host),
                mode: WorkspaceMode::Bind,
                files_helper: DockerFilesHelper::Required,
                helper: Some(helper),
                unlisted_binds: canaries,
            })
        }
        Ok(other) => panic!(
            "CORDON_ESCAPE_BACKEND={other}: expected local, helper_pipe, ssh_helper or docker_helper"
        ),
    }
}

/// The image the Docker sessions run: `cordon-sandbox:latest` plus the programs the attempts
/// use (`tests/escape/image/Dockerfile`), built once per process (Docker's cache makes it
/// quick after the first time; the first build installs the packages from the Debian mirror,
/// like `scripts/build-sandbox-image.sh`). Without them an attempt such as `gdb -p` would
/// fail with "command not found" and prove nothing.
fn escape_image(host: &str) -> String {
    const IMAGE: &str = "cordon-sandbox-escape:latest";
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let context = Path::new(env!("CARGO_MANIFEST_DIR")).join("escape/image");
        let context = context.to_string_lossy();
        let output = docker(
            host,
            &["build", "--network", "host", "-q", "-t", IMAGE, &context],
        );
        assert!(
            output.status.success(),
            "failed to build {IMAGE} from {context}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    });
    IMAGE.to_owned()
}

/// Whether the suite attacks the Docker backend (`CORDON_ESCAPE_BACKEND=docker_helper`).
pub fn in_docker() -> bool {
    std::env::var("CORDON_ESCAPE_BACKEND").as_deref() == Ok("docker_helper")
}

/// Where the Docker backend mounts the workspace in the container.
const CONTAINER_WORKSPACE: &str = "/workspace";

/// `outside` as a command in the container reaches it relative to the workspace
/// (`../outside`: the container's workspace is `/workspace`).
const CONTAINER_OUTSIDE: &str = "/outside";

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
                backend: escape_backend(&ws, Vec::new()),
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
        Harness::build(|_| None, &[], true, &[]).await
    }

    /// A harness whose workspace is an empty directory.
    pub async fn bare() -> Harness {
        Harness::build(|_| None, &[], false, &[]).await
    }

    /// A harness whose workspace holds `files` (relative path, content) before the session
    /// opens: the operator's files, present when the session starts.
    pub async fn with_files(files: &[(&str, &str)]) -> Harness {
        Harness::build(|_| None, &[], false, files).await
    }

    /// A harness over a git repository whose host directories `canaries` (secrets planted
    /// by the test) are, on Docker, mounted into the container at the same path without any
    /// policy rule, as `outside` is; on the other backends they are where they are anyway.
    pub async fn with_canaries(canaries: &[&Path]) -> Harness {
        Harness::build(|_| None, canaries, true, &[]).await
    }

    /// A harness whose session runs the policy `policy(outside)` returns (TOML text, written
    /// next to the workspace), over a git repository.
    pub async fn with_policy(policy: impl FnOnce(&Path) -> String) -> Harness {
        Harness::build(|outside| Some(policy(outside)), &[], true, &[]).await
    }

    /// On Docker, the canaries must be in the container for real, or an attempt on them would
    /// fail for want of a target: `outside` is bind-mounted read-write at its host path and
    /// at `/outside` (where `../outside` leads from `/workspace`), the test's other canaries at
    /// their host paths. No policy rule names any of them (the policy file and the CLI cannot
    /// add such mounts), so the helper's Landlock rules are all that stands between a command
    /// and them.
    ///
    /// With `git`, the workspace is a git repository before the session opens (the operator's
    /// repository: a session quarantines git metadata that appears while it runs).
    async fn build(
        policy: impl FnOnce(&Path) -> Option<String>,
        canaries: &[&Path],
        git: bool,
        files: &[(&str, &str)],
    ) -> Harness {
        let dir = tempfile::tempdir().expect("create temp dir");
        let base = dir.path().canonicalize().unwrap();
        let ws = base.join("ws");
        let outside = base.join("outside");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let victim = outside.join("victim.txt");
        std::fs::write(&victim, "untouched victim\n").unwrap();
        for (rel, content) in files {
            let path = ws.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, content).unwrap();
        }
        if git {
            git_init(&ws);
        }
        let mut binds = vec![
            DockerUnlistedBind {
                source: outside.clone(),
                target: outside.clone(),
            },
            DockerUnlistedBind {
                source: outside.clone(),
                target: PathBuf::from(CONTAINER_OUTSIDE),
            },
        ];
        binds.extend(canaries.iter().map(|path| DockerUnlistedBind {
            source: path.to_path_buf(),
            target: path.to_path_buf(),
        }));
        let backend = escape_backend(&ws, binds);
        // The session's own root: the workspace itself, except over SSH, where the workspace
        // is the remote root and the local root is a directory of its own.
        let remote = matches!(backend, BackendChoice::Ssh(_));
        let docker_host = match &backend {
            BackendChoice::Docker(options) => options.docker_host.clone(),
            _ => None,
        };
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
        let container = docker_host.map(|host| {
            let commands = session.commands_path().unwrap_or_default();
            assert!(
                commands.starts_with("helper"),
                "commands must run under the helper's sandbox in the container: {commands}"
            );
            let id = session.backend().id().to_string();
            let container = id
                .strip_prefix("docker:")
                .unwrap_or_else(|| panic!("not a Docker session: {id}"))
                .to_owned();
            // The premise of every case: seen from outside the sandbox (a plain exec in the
            // container), every canary is there, at every path the cases use.
            let mut present = vec![
                victim.display().to_string(),
                format!("{CONTAINER_OUTSIDE}/victim.txt"),
            ];
            present.extend(canaries.iter().map(|path| path.display().to_string()));
            let checks: Vec<String> = present
                .iter()
                .map(|path| format!("test -e '{path}'"))
                .collect();
            let output = docker(
                &host,
                &["exec", &container, "sh", "-c", &checks.join(" && ")],
            );
            assert!(
                output.status.success(),
                "the canaries {present:?} are not all in container {container}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            (host, container)
        });
        let harness = Harness {
            _dir: dir,
            ws,
            outside,
            victim,
            session: Arc::new(session),
            container: container.clone().map(|(_, container)| container),
            docker_host: container.map(|(host, _)| host),
            calls: AtomicU32::new(0),
        };
        if remote {
            commands_run_over_ssh().await;
        }
        harness
    }

    /// Docker: whether `path` exists in the session's container, seen by a plain `docker exec`
    /// outside the helper's sandbox. Panics on the other backends.
    pub fn container_has(&self, path: &Path) -> bool {
        let (Some(host), Some(container)) = (&self.docker_host, &self.container) else {
            panic!("no container: not the Docker backend");
        };
        let path = path.to_string_lossy();
        let script = "if test -e \"$1\"; then echo present; else echo absent; fi";
        let output = docker(host, &["exec", container, "sh", "-c", script, "sh", &path]);
        // A failed `docker exec` answers neither (never "absent" by accident).
        match String::from_utf8_lossy(&output.stdout).trim() {
            "present" => true,
            "absent" => false,
            other => panic!(
                "failed to look for {path} in {container}: {other} {}",
                String::from_utf8_lossy(&output.stderr)
            ),
        }
    }

    /// Docker: a TCP listener on the container's loopback, outside the helper's sandbox (a
    /// plain `docker exec` of python3), and its port once it listens. Killed on drop. It
    /// answers every connection with an empty HTTP response before closing it, so each
    /// attempt a case makes (`curl` too, which fails on a connection closed without an
    /// answer) succeeds once connected.
    pub fn listen_in_container(&self) -> (HostProcess, u16) {
        let (Some(host), Some(container)) = (&self.docker_host, &self.container) else {
            panic!("no container: not the Docker backend");
        };
        let name = token("listener");
        let script = format!(
            "exec -a {name} python3 -c 'import socket\n\
             s = socket.socket()\n\
             s.bind((\"127.0.0.1\", 0))\n\
             s.listen()\n\
             print(s.getsockname()[1], flush=True)\n\
             while True:\n\
             \x20   c = s.accept()[0]\n\
             \x20   c.sendall(b\"HTTP/1.0 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n\")\n\
             \x20   c.close()'"
        );
        let mut child = std::process::Command::new("docker")
            .args(["exec", container, "bash", "-c", &script])
            .env("DOCKER_HOST", host)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start a listener in the container (docker CLI)");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the listener in the container printed {line:?}"));
        let host_pid = wait_for_process(&name);
        let process = HostProcess {
            child,
            host_pid,
            pid: pid_in_container(host_pid),
            name,
        };
        (process, port)
    }

    /// A process outside the command's sandbox that the cases attack: on the host, and on
    /// Docker in the session's container (started by a plain `docker exec` as the workspace
    /// owner, the same uid as commands, beside the helper: the container's PID namespace
    /// already hides the host's processes, so what the sandbox must protect is the rest of
    /// the container). `cwd` is a host path: the workspace or a canary.
    pub fn process_outside_the_sandbox(&self, label: &str, cwd: &Path) -> HostProcess {
        match (&self.docker_host, &self.container) {
            (Some(host), Some(container)) => {
                let cwd = if cwd == self.ws {
                    PathBuf::from(CONTAINER_WORKSPACE)
                } else {
                    cwd.to_path_buf()
                };
                HostProcess::start_in_container(label, host, container, &cwd)
            }
            _ => HostProcess::start(label, cwd),
        }
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

/// `git init` in `ws` with one commit.
fn git_init(ws: &Path) {
    require_tool("git", "git");
    let run = |args: &[&str]| {
        let status = std::process::Command::new("git")
            .args(args)
            .current_dir(ws)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .status()
            .expect("run git");
        assert!(status.success(), "git {args:?}");
    };
    std::fs::write(ws.join("README.md"), "hello\n").unwrap();
    run(&["init", "-q"]);
    run(&["add", "README.md"]);
    run(&["commit", "-qm", "init"]);
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

/// Run the docker CLI against `host`.
fn docker(host: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("docker")
        .args(args)
        .env("DOCKER_HOST", host)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("run docker {args:?} (install the docker CLI): {error}"))
}

/// A process outside the sandbox (`sleep`, with `argv[0]` = a token), killed on drop: on the
/// host, or in a container beside the helper.
pub struct HostProcess {
    child: std::process::Child,
    /// Its pid on the host (where the suite runs).
    host_pid: i32,
    /// Its pid as commands see it (in the container's PID namespace on Docker).
    pid: i32,
    /// Its name.
    pub name: String,
}

/// Wait (bounded) for the one live process named `name` and return its host pid.
fn wait_for_process(name: &str) -> i32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(&pid) = processes_named(name).first() {
            return pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {name} did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The pid of a container's process (host pid `host_pid`) in the container's PID namespace:
/// the last `NSpid` field.
fn pid_in_container(host_pid: i32) -> i32 {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).unwrap();
    let pid = status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .and_then(|pids| pids.split_whitespace().last())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no NSpid for {host_pid}: {status}"));
    assert_ne!(
        pid, host_pid,
        "{host_pid} is not in a PID namespace of its own"
    );
    pid
}

impl HostProcess {
    /// Start `sleep 600` named by a fresh token, in `cwd`, on the host.
    pub fn start(label: &str, cwd: &Path) -> HostProcess {
        let name = token(label);
        let child = std::process::Command::new("bash")
            .args(["-c", &format!("exec -a {name} sleep 600")])
            .current_dir(cwd)
            .spawn()
            .expect("start a host process");
        wait_for_process(&name);
        let pid = child.id() as i32;
        HostProcess {
            child,
            host_pid: pid,
            pid,
            name,
        }
    }

    /// Start `sleep 600` named by a fresh token in `container`, in `cwd` there (a `docker
    /// exec` as the container's user, outside any sandbox of the helper).
    fn start_in_container(label: &str, host: &str, container: &str, cwd: &Path) -> HostProcess {
        let name = token(label);
        let cwd = cwd.display().to_string();
        let child = std::process::Command::new("docker")
            .args(["exec", "-w", &cwd, container, "bash", "-c"])
            .arg(format!("exec -a {name} sleep 600"))
            .env("DOCKER_HOST", host)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("start a process in the container (docker CLI)");
        // The container's processes are the host's too: find it there, then its pid in the
        // container's namespace (the last `NSpid` field).
        let host_pid = wait_for_process(&name);
        let pid = pid_in_container(host_pid);
        HostProcess {
            child,
            host_pid,
            pid,
            name,
        }
    }

    /// Its pid as commands see it.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether it still runs, not stopped or traced.
    pub fn alive_and_running(&self) -> bool {
        matches!(process_state(self.host_pid), Some('S' | 'R'))
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        if self.host_pid != self.child.id() as i32 {
            // In a container: the docker CLI is not its parent.
            let _ = std::process::Command::new("kill")
                .args(["-9", &self.host_pid.to_string()])
                .status();
        }
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
