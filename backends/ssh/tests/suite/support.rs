//! A throwaway OpenSSH server for the tests: 127.0.0.1 on a free port, generated host and
//! client keys, `MaxSessions 1000` (unless a test asks for fewer), `Subsystem sftp
//! internal-sftp`, and a noisy `BASH_ENV` so
//! every test also proves that rc-file output never reaches a result. If `sshd` is missing or
//! does not start, the test fails with a clear message unless `CORDON_SKIP_SSH=1` is set.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cordon_backend_ssh::{AgentSource, SshBackend, SshConfig};
use cordon_core::sandbox::SandboxSpec;
use tempfile::TempDir;

/// A running sshd plus the files a client needs.
pub struct Server {
    pub dir: TempDir,
    pub port: u16,
    pub client_key: PathBuf,
    pub known_hosts: PathBuf,
    pub host_pub: PathBuf,
    /// A user CA the server trusts (`TrustedUserCAKeys`): keys it signs log in as root.
    pub user_ca: PathBuf,
    pub workspace: PathBuf,
    config: PathBuf,
    child: Option<Child>,
}

fn sshd_binary() -> Option<PathBuf> {
    for candidate in ["/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd"] {
        if Path::new(candidate).exists() {
            return Some(PathBuf::from(candidate));
        }
    }
    None
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("failed to run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn keygen(path: &Path, passphrase: &str) {
    run(Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            passphrase,
            "-C",
            "cordon-test",
            "-f",
        ])
        .arg(path));
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// The server, or `None` when the operator opted out with `CORDON_SKIP_SSH=1`.
pub fn server() -> Option<Server> {
    server_with_env(None)
}

/// [`server`], its sessions' environment (`SetEnv`) replaced by `set_env` when given: no
/// noisy `BASH_ENV` then (a command whose stdout carries a protocol, such as
/// `docker system dial-stdio`, cannot have rc-file output in front of it).
pub fn server_with_env(set_env: Option<&str>) -> Option<Server> {
    if std::env::var("CORDON_SKIP_SSH").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_SSH=1: skipping a test that needs sshd");
        return None;
    }
    Some(Server::start(set_env, 1000))
}

/// [`server`] with sshd's `MaxSessions` (channels per connection) set to `max_sessions`, and
/// no noisy `BASH_ENV`.
pub fn server_with_max_sessions(max_sessions: u32) -> Option<Server> {
    if std::env::var("CORDON_SKIP_SSH").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_SSH=1: skipping a test that needs sshd");
        return None;
    }
    Some(Server::start(Some("SHLVL=1"), max_sessions))
}

/// [`server`] with sshd's `SetEnv` (what it passes every command) and `MaxSessions`.
pub fn server_with_env_and_max_sessions(set_env: &str, max_sessions: u32) -> Option<Server> {
    if std::env::var("CORDON_SKIP_SSH").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_SSH=1: skipping a test that needs sshd");
        return None;
    }
    Some(Server::start(Some(set_env), max_sessions))
}

impl Server {
    fn start(set_env: Option<&str>, max_sessions: u32) -> Server {
        let Some(sshd) = sshd_binary() else {
            panic!(
                "sshd not found: install openssh-server (apt-get install -y openssh-server) \
                 or set CORDON_SKIP_SSH=1 to skip the SSH tests"
            );
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let host_key = d.join("host_ed25519");
        let client_key = d.join("client_ed25519");
        keygen(&host_key, "");
        keygen(&client_key, "");
        let user_ca = d.join("user_ca");
        keygen(&user_ca, "");
        std::fs::copy(d.join("client_ed25519.pub"), d.join("authorized_keys"))
            .expect("authorized_keys");
        let rc = d.join("noisy_rc");
        std::fs::write(
            &rc,
            "echo 'rc noise on stdout'\necho 'rc noise on stderr' >&2\n",
        )
        .expect("rc");
        let workspace = d.join("ws");
        std::fs::create_dir(&workspace).expect("workspace");
        let port = free_port();
        let set_env = match set_env {
            Some(vars) => vars.to_owned(),
            None => format!(
                "SHLVL=1 BASH_ENV={rc} CORDON_LEAK=from-sshd",
                rc = rc.display()
            ),
        };
        let config = d.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nAuthorizedKeysFile {ak}\n\
                 PidFile {pid}\nUsePAM no\nStrictModes no\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                 PermitRootLogin yes\nMaxSessions {max_sessions}\nMaxStartups 100:30:200\n\
                 AllowTcpForwarding yes\nSubsystem sftp internal-sftp\n\
                 SetEnv {set_env}\n\
                 TrustedUserCAKeys {ca}.pub\n",
                ca = user_ca.display(),
                hk = host_key.display(),
                ak = d.join("authorized_keys").display(),
                pid = d.join("sshd.pid").display(),
            ),
        )
        .expect("sshd_config");
        let host_pub = d.join("host_ed25519.pub");
        let key_line = std::fs::read_to_string(&host_pub).expect("host pub");
        let mut parts = key_line.split_whitespace();
        let known_hosts = d.join("known_hosts");
        std::fs::write(
            &known_hosts,
            format!(
                "[127.0.0.1]:{port} {} {}\n",
                parts.next().expect("type"),
                parts.next().expect("key")
            ),
        )
        .expect("known_hosts");
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let _ = sshd;
        let mut server = Server {
            dir,
            port,
            client_key,
            known_hosts,
            host_pub,
            user_ca,
            workspace,
            config,
            child: None,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let sshd = sshd_binary().expect("sshd");
        let log = self.dir.path().join("sshd.log");
        let mut child = Command::new(sshd)
            .arg("-D")
            .arg("-f")
            .arg(&self.config)
            .arg("-E")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start sshd: {e}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "sshd exited at start ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let mut banner = String::new();
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .expect("timeout");
                let mut reader = BufReader::new(stream);
                if reader.read_line(&mut banner).is_ok() && banner.starts_with("SSH-2.0") {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "sshd did not accept connections on port {} within 30 s: {}",
                self.port,
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
    }

    /// sshd's log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("sshd.log")
    }

    /// How many connections sshd has authenticated so far (its log's `Accepted` lines; each is
    /// written before the connection can open a channel).
    pub fn authenticated_connections(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("sshd.log"))
            .expect("sshd log")
            .lines()
            .filter(|line| line.contains("Accepted publickey"))
            .count()
    }

    /// The listener's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Kill every per-connection sshd process (the connection drops; commands see EOF).
    pub fn kill_sessions(&self) {
        for pid in descendants(self.pid()) {
            if comm(pid).as_deref() == Some("sshd") {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }

    /// Stop the server (listener and sessions) and start it again on the same port and key.
    pub fn restart(&mut self) {
        self.kill_sessions();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.launch();
    }

    /// A config for this server with the client key and known_hosts. Commands are allowed
    /// (`allow_degraded`): the tests run them on purpose; [`Server::strict_config`] does not.
    pub fn config(&self) -> SshConfig {
        let mut config = self.strict_config();
        config.spec.allow_degraded = true;
        config
    }

    /// [`Server::config`] without `allow_degraded`: commands are refused.
    pub fn strict_config(&self) -> SshConfig {
        let mut config = SshConfig::new(format!("root@127.0.0.1:{}", self.port), &self.workspace);
        config.identity = Some(self.client_key.clone());
        config.known_hosts = Some(self.known_hosts.clone());
        config.ssh_config = Some(self.dir.path().join("no_ssh_config"));
        config.agent = AgentSource::Disabled;
        config.spec = SandboxSpec {
            protected: vec![".git/**".into()],
            ..SandboxSpec::default()
        };
        config
    }

    /// [`Server::strict_config`] with this build's helper (see [`helper_binary`]) and a
    /// state directory of this server's own (so the helper cache is per test): commands run
    /// under the policy's sandbox on the host, without `allow_degraded`.
    pub fn helper_config(&self) -> SshConfig {
        let mut config = self.strict_config();
        config.helper = Some(helper_binary(self.dir.path()));
        config.state_dir = Some(self.dir.path().join("state"));
        config
    }

    /// Connect with [`Server::config`].
    pub async fn connect(&self) -> SshBackend {
        SshBackend::connect(self.config())
            .await
            .unwrap_or_else(|e| panic!("connect: {e}"))
    }

    /// `SHA256:…` of the host key, as ssh-keygen prints it.
    pub fn host_fingerprint(&self) -> String {
        fingerprint_of(&self.host_pub)
    }
}

/// This build's `cordon-helper`, stripped into `dir` (the debug build carries ~100 MB of debug
/// information the host does not need). It is built by `cargo build -p cordon-helper`; a test
/// that needs it fails without it.
pub fn helper_binary(dir: &Path) -> PathBuf {
    let copy = dir.join("cordon-helper");
    if copy.exists() {
        return copy;
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/all-<hash> → target/<profile>/cordon-helper
    let built = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("cordon-helper"))
        .expect("target directory");
    assert!(
        built.is_file(),
        "{} is missing: build the helper first (cargo build -p cordon-helper)",
        built.display()
    );
    std::fs::copy(&built, &copy).expect("copy cordon-helper");
    run(Command::new("strip").arg(&copy));
    copy
}

/// `SHA256:…` of a public key file.
pub fn fingerprint_of(pub_file: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(pub_file)
        .output()
        .expect("ssh-keygen -lf");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .expect("fingerprint")
        .to_owned()
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill_sessions();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The parent pid of a process.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Every live descendant of `root`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &pid in &pids {
            if parent_of(pid) == Some(parent) && !all.contains(&pid) {
                all.push(pid);
                frontier.push(pid);
            }
        }
    }
    all
}

/// Whether a process is alive (zombies count as dead).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}
