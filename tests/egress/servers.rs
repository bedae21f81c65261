//! What the egress suite's commands reach: a static HTTP origin on the host's loopback that
//! counts its connections, a git repository served over HTTP by `git http-backend`, a
//! PyPI-style simple index with one wheel, and the test names on loopback.

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The name every allowed-destination case uses, and another one no entry allows. Both map to
/// 127.0.0.1 on the host (where the proxy resolves them: in the Cordon process, or in the
/// helper on the SSH test host, which is this machine).
pub const PKG: &str = "pkg.cordon-egress.test";
/// A second test name (on loopback too).
pub const OTHER: &str = "other.cordon-egress.test";
/// The domain both names are in (itself not mapped).
pub const DOMAIN: &str = "cordon-egress.test";

const HOSTS_FILE: &str = "/etc/hosts";
const HOSTS_LINE: &str =
    "127.0.0.1 pkg.cordon-egress.test other.cordon-egress.test # cordon egress test names";

fn on_loopback(name: &str) -> bool {
    (name, 80)
        .to_socket_addrs()
        .map(|mut addrs| addrs.any(|addr| addr.ip() == Ipv4Addr::LOCALHOST))
        .unwrap_or(false)
}

/// Makes the test names resolve to 127.0.0.1 through the system resolver: when they do not
/// yet, adds one line to `/etc/hosts` (marked, and left in place: it maps only these names,
/// to loopback; another test process may be relying on it). Panics with what to do when it
/// cannot.
pub fn ensure_test_names() {
    static DONE: OnceLock<()> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::new(());
    DONE.get_or_init(|| {
        let _held = LOCK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if on_loopback(PKG) && on_loopback(OTHER) {
            return;
        }
        let appended = std::fs::OpenOptions::new()
            .append(true)
            .open(HOSTS_FILE)
            .and_then(|mut hosts| hosts.write_all(format!("\n{HOSTS_LINE}\n").as_bytes()));
        assert!(
            appended.is_ok() && on_loopback(PKG) && on_loopback(OTHER),
            "the egress suite needs its test names on loopback; add this line to {HOSTS_FILE} \
             (as root): {HOSTS_LINE} ({appended:?})"
        );
    });
}

/// A static file server (plain HTTP/1.x, one request per connection) over a directory,
/// counting the connections it accepted.
pub struct Origin {
    /// Its port.
    pub port: u16,
    /// Its files.
    pub root: PathBuf,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    /// An origin on `bind` (port 0: any) serving `hello.txt`.
    pub async fn serve(bind: Ipv4Addr) -> Origin {
        let dir = tempfile::tempdir().expect("origin dir");
        let root = dir.path().to_path_buf();
        std::fs::write(root.join("hello.txt"), "hello through the proxy\n").expect("write");
        let listener = tokio::net::TcpListener::bind(SocketAddr::from((bind, 0)))
            .await
            .expect("bind the origin server");
        let port = listener.local_addr().expect("address").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let served = root.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                let root = served.clone();
                tokio::spawn(async move {
                    let _ = answer(stream, &root).await;
                });
            }
        });
        Origin {
            port,
            root,
            accepted,
            task,
            _dir: dir,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn answer(mut stream: tokio::net::TcpStream, root: &Path) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..read]);
    }
    let head = String::from_utf8_lossy(&head);
    let target = head.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split(['?', '#']).next().unwrap_or("/");
    let mut file = root.join(path.trim_start_matches('/'));
    if file.is_dir() {
        file = file.join("index.html");
    }
    let inside = !path.split('/').any(|part| part == "..");
    let (status, body) = match std::fs::read(&file) {
        Ok(body) if inside => ("200 OK", body),
        _ => ("404 Not Found", b"not found\n".to_vec()),
    };
    let kind = match file.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html",
        Some("txt") => "text/plain",
        _ => "application/octet-stream",
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await
}

/// Writes the `cordon-demo` 0.1 wheel to `sys.argv[1]`.
const WHEEL_SCRIPT: &str = r#"
import sys, zipfile
files = {
    "cordon_demo/__init__.py": "VALUE = 42\n",
    "cordon_demo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: cordon-demo\nVersion: 0.1\n",
    "cordon_demo-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "".join(f"{name},,\n" for name in files) + "cordon_demo-0.1.dist-info/RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as wheel:
    for name, text in files.items():
        wheel.writestr(name, text)
    wheel.writestr("cordon_demo-0.1.dist-info/RECORD", record)
"#;

/// Publishes a PyPI-style simple index (`/simple/cordon-demo/`) with one pure-Python wheel
/// under the origin's root.
pub fn publish_wheel(origin: &Origin) {
    let wheel = "cordon_demo-0.1-py3-none-any.whl";
    let simple = origin.root.join("simple/cordon-demo");
    std::fs::create_dir_all(&simple).expect("mkdir simple");
    let out = Command::new("python3")
        .arg("-c")
        .arg(WHEEL_SCRIPT)
        .arg(simple.join(wheel))
        .output()
        .expect("run python3 (the egress suite needs it on the host)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(
        simple.join("index.html"),
        format!("<html><body><a href=\"{wheel}\">{wheel}</a></body></html>\n"),
    )
    .expect("write index");
}

/// A bare repository with one commit, served over git's smart HTTP protocol by `git
/// http-backend` (through python's CGI server) on the host's loopback: `(server, port, dir)`.
pub async fn git_server() -> (tokio::process::Child, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    // The CGI server runs its scripts as nobody when it runs as root.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let git = |args: &[&str], cwd: &Path| {
        let out = Command::new("git")
            .args(args)
            .current_dir(cwd)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
            .output()
            .expect("run git (the egress suite needs it on the host)");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let work = dir.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    git(&["init", "-q", "-b", "main"], &work);
    std::fs::write(work.join("README"), "fetched through the proxy\n").expect("write");
    git(&["add", "README"], &work);
    git(&["commit", "-q", "-m", "one"], &work);
    let repos = dir.path().join("repos");
    std::fs::create_dir(&repos).expect("mkdir");
    git(&["clone", "-q", "--bare", "../work", "repo.git"], &repos);
    git(
        &["config", "http.receivepack", "false"],
        &repos.join("repo.git"),
    );
    // `git http-backend` as a CGI program under /cgi-bin/git (python's CGI handler runs
    // files of that directory).
    let exec_path = Command::new("git")
        .arg("--exec-path")
        .output()
        .expect("git --exec-path");
    let backend =
        PathBuf::from(String::from_utf8_lossy(&exec_path.stdout).trim()).join("git-http-backend");
    let cgi = dir.path().join("cgi-bin");
    std::fs::create_dir(&cgi).expect("mkdir cgi-bin");
    std::fs::write(
        cgi.join("git"),
        format!(
            // It runs as nobody, the repository is root's: trusted explicitly.
            "#!/bin/sh\nHOME='{}' XDG_CONFIG_HOME='{}' GIT_PROJECT_ROOT='{}' GIT_HTTP_EXPORT_ALL=1 \
             GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*' exec '{}'\n",
            dir.path().display(),
            dir.path().display(),
            repos.display(),
            backend.display()
        ),
    )
    .expect("write the CGI script");
    std::fs::set_permissions(
        cgi.join("git"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let mut server = tokio::process::Command::new("python3")
        .args([
            "-u",
            "-m",
            "http.server",
            "--cgi",
            "0",
            "--bind",
            "127.0.0.1",
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start python3 -m http.server --cgi (the egress suite needs python3 on the host)");
    let stdout = server.stdout.take().expect("stdout");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let line = lines
        .next_line()
        .await
        .expect("read the server's first line")
        .expect("the server says where it listens");
    // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
    let port = line
        .split(" port ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (server, port, dir)
}

/// The host's own IPv4 addresses other than loopback.
pub fn host_addresses() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("run ip addr (iproute2)");
    let mut found: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(3))
        .filter_map(|cidr| cidr.split('/').next())
        .filter(|ip| !ip.starts_with("127."))
        .map(str::to_owned)
        .collect();
    found.sort();
    found.dedup();
    found
}
