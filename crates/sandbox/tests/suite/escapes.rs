//! The escape suite: each case is data (a command, the targets that must stay untouched, the
//! strings that must never appear in its output, and whether the command itself must fail),
//! so it can move to the top-level suite and run through the `bash` tool later.
//!
//! Every case gets a fresh workspace. Host-side targets (a TCP, UDP and Unix listener, a
//! process outside the sandbox, a fake key under /root, another user's home) are shared and
//! checked after every case.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::{Fixture, run_in, unique};

/// One escape attempt.
struct Case {
    name: &'static str,
    /// `bash -c` script; see [`Host::expand`] for the placeholders.
    script: &'static str,
    /// Paths whose existence, content, mode and times must not change.
    watch: &'static [&'static str],
    /// Strings that must not appear in the output.
    forbidden: &'static [&'static str],
    /// Whether the script must exit non-zero (false where the attempt is a loop or a probe
    /// whose output is the evidence).
    must_fail: bool,
}

const fn case(name: &'static str, script: &'static str, watch: &'static [&'static str]) -> Case {
    Case {
        name,
        script,
        watch,
        forbidden: &[],
        must_fail: true,
    }
}

const fn leak(
    name: &'static str,
    script: &'static str,
    forbidden: &'static [&'static str],
) -> Case {
    Case {
        name,
        script,
        watch: &[],
        forbidden,
        must_fail: true,
    }
}

const PYTHON_SYSCALL: &str = "import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True)";

const CASES: &[Case] = &[
    // --- writes outside the writable roots ---
    case(
        "redirect_outside",
        "echo pwned > {out}/target.txt",
        &["{out}/target.txt"],
    ),
    case(
        "create_file_outside",
        "echo pwned > {out}/new.txt",
        &["{out}/new.txt", "{out}"],
    ),
    case(
        "cp_over_outside",
        "cp {ws}/file.txt {out}/target.txt",
        &["{out}/target.txt"],
    ),
    case(
        "mv_workspace_file_out",
        "mv {ws}/file.txt {out}/moved.txt",
        &["{out}", "{ws}/file.txt"],
    ),
    case(
        "mv_outside_file_in",
        "mv {out}/target.txt {ws}/stolen.txt",
        &["{out}/target.txt"],
    ),
    case(
        "symlink_then_write",
        "ln -s {out}/target.txt {ws}/link && echo pwned > {ws}/link",
        &["{out}/target.txt"],
    ),
    case(
        "hardlink_then_write",
        "ln {out}/target.txt {ws}/hard && echo pwned >> {ws}/hard",
        &["{out}/target.txt"],
    ),
    case(
        "dotdot_path",
        "cd {ws} && echo pwned > ../outside/target.txt",
        &["{out}/target.txt"],
    ),
    case(
        "absolute_tmp_path",
        "echo pwned > /tmp/{marker}",
        &["/tmp/{marker}"],
    ),
    case(
        "proc_self_root",
        "echo pwned > /proc/self/root{out}/target.txt",
        &["{out}/target.txt"],
    ),
    case(
        "proc_cwd_of_host_process",
        "echo pwned > /proc/{hostpid}/cwd/target.txt",
        &["{hostcwd}/target.txt"],
    ),
    Case {
        name: "proc_cwd_of_every_visible_process",
        script: "for d in /proc/[0-9]*/cwd; do echo pwned > $d/../../../{hostcwd_rel}/target.txt; done 2>/dev/null; true",
        watch: &["{hostcwd}/target.txt"],
        forbidden: &[],
        must_fail: false,
    },
    case(
        "readonly_root_append",
        "echo pwned >> {ro}/data.txt",
        &["{ro}/data.txt"],
    ),
    case(
        "readonly_root_truncate",
        "truncate -s 0 {ro}/data.txt",
        &["{ro}/data.txt"],
    ),
    case(
        "readonly_root_remove",
        "rm -f {ro}/data.txt",
        &["{ro}/data.txt", "{ro}"],
    ),
    case(
        "chmod_setuid_outside",
        "chmod 4777 {out}/target.txt",
        &["{out}/target.txt"],
    ),
    case(
        "touch_times_readonly",
        "touch -d 2001-01-01 {ro}/data.txt",
        &["{ro}/data.txt"],
    ),
    case(
        "xattr_readonly",
        "python3 -c 'import os; os.setxattr(\"{ro}/data.txt\", \"user.cordon\", b\"1\")'",
        &["{ro}/data.txt"],
    ),
    case(
        "etc_passwd_append",
        "echo 'evil::0:0::/:/bin/sh' >> /etc/passwd",
        &["/etc/passwd"],
    ),
    case(
        "usr_local_bin_create",
        "echo pwned > /usr/local/bin/{marker}",
        &["/usr/local/bin/{marker}"],
    ),
    case(
        "sysctl_hostname",
        "echo {marker} > /proc/sys/kernel/hostname",
        &["/proc/sys/kernel/hostname"],
    ),
    // --- protected paths (.git) inside the writable workspace ---
    case(
        "git_config_append",
        "echo '[core] fsmonitor = evil' >> {ws}/.git/config",
        &["{ws}/.git/config"],
    ),
    case(
        "git_hook_create",
        "printf '#!/bin/sh\\necho evil\\n' > {ws}/.git/hooks/post-checkout",
        &["{ws}/.git/hooks"],
    ),
    case(
        "git_hook_modify",
        "echo evil >> {ws}/.git/hooks/pre-commit.sample",
        &["{ws}/.git/hooks/pre-commit.sample"],
    ),
    case(
        "git_command_config",
        "git -C {ws} config core.fsmonitor evil",
        &["{ws}/.git/config"],
    ),
    case(
        "git_rm_rf",
        "rm -rf {ws}/.git",
        &["{ws}/.git", "{ws}/.git/config", "{ws}/.git/HEAD"],
    ),
    case(
        "git_rename_away_and_recreate",
        "mv {ws}/.git {ws}/.git-old; mkdir -p {ws}/.git && echo evil > {ws}/.git/config",
        &["{ws}/.git/config", "{ws}/.git-old"],
    ),
    case(
        "git_replace_by_symlink",
        "mkdir {ws}/evil && echo evil > {ws}/evil/config && ln -sfn {ws}/evil {ws}/.git",
        &["{ws}/.git", "{ws}/.git/config"],
    ),
    case(
        "git_rename_over",
        "mkdir {ws}/evil && echo evil > {ws}/evil/config && mv -T {ws}/evil {ws}/.git",
        &["{ws}/.git", "{ws}/.git/config"],
    ),
    case(
        "git_rename_syscall",
        "python3 -c 'import os; os.rename(\"{ws}/.git\", \"{ws}/moved\")'",
        &["{ws}/.git", "{ws}/moved"],
    ),
    case(
        "git_parent_rename_nested_repo",
        "mv {ws}/sub {ws}/sub2 && mkdir -p {ws}/sub/.git && echo evil > {ws}/sub/.git/config",
        &["{ws}/sub/.git/config", "{ws}/sub2"],
    ),
    case(
        "git_hardlink_config",
        "ln {ws}/.git/config {ws}/cfg && echo evil >> {ws}/cfg",
        &["{ws}/.git/config"],
    ),
    // --- denied paths inside the workspace ---
    leak("denied_file_read", "cat {ws}/.env", &["{secret}"]),
    leak(
        "denied_file_copy",
        "cp {ws}/.env {ws}/env-copy && cat {ws}/env-copy",
        &["{secret}"],
    ),
    leak(
        "denied_parent_rename",
        "mv {ws}/conf {ws}/conf2 && cat {ws}/conf2/.env",
        &["{secret}"],
    ),
    leak(
        "denied_dir_read",
        "ls {ws}/secrets && cat {ws}/secrets/key",
        &["{secret}"],
    ),
    // --- reads outside the readable roots ---
    leak(
        "read_root_home_key",
        "cat {roothome}/.ssh/id_ed25519",
        &["{secret}"],
    ),
    leak("list_root_home", "ls -a /root", &["{roothome_name}"]),
    leak("read_etc_shadow", "cat /etc/shadow", &["root:"]),
    leak("read_etc_gshadow", "cat /etc/gshadow", &["root:"]),
    leak(
        "read_other_user_home",
        "cat {otherhome}/notes.txt",
        &["{secret}"],
    ),
    leak("read_init_environ", "cat /proc/1/environ", &["PATH="]),
    leak(
        "read_host_process_environ",
        "cat /proc/{hostpid}/environ",
        &["{marker}"],
    ),
    // --- network (listeners on loopback count every connection) ---
    case(
        "curl_tcp",
        "curl -sS --max-time 5 http://127.0.0.1:{port}/",
        &[],
    ),
    case(
        "python_tcp",
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 5)'",
        &[],
    ),
    case("bash_dev_tcp", "echo hi > /dev/tcp/127.0.0.1/{port}", &[]),
    case("nc_tcp", "nc -w 3 127.0.0.1 {port} < /dev/null", &[]),
    case(
        "udp_dns_query",
        "python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(bytes.fromhex(\"123401000001000000000000076578616d706c6503636f6d0000010001\"), (\"127.0.0.1\", {udp}))'",
        &[],
    ),
    case("dns_lookup", "getent ahosts example.com", &[]),
    case(
        "host_unix_socket",
        "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{sock}\")'",
        &[],
    ),
    case(
        "host_unix_socket_curl",
        "curl -sS --max-time 5 --unix-socket {sock} http://localhost/",
        &[],
    ),
    case(
        "host_unix_datagram",
        "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.sendto(b\"x\", \"{dgram}\")'",
        &[],
    ),
    case(
        "abstract_unix_socket",
        "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"\\0{abstract}\")'",
        &[],
    ),
    case(
        "netlink_socket",
        "python3 -c 'import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)'",
        &[],
    ),
    case(
        "io_uring_setup",
        "python3 -c '{py}; p = ctypes.create_string_buffer(256); sys.exit(0 if libc.syscall(425, 8, p) >= 0 else 1)'",
        &[],
    ),
    // --- other processes and privileges ---
    case(
        "ptrace_host_process",
        "python3 -c '{py}; sys.exit(0 if libc.ptrace(16, {hostpid}, 0, 0) == 0 else 1)'",
        &[],
    ),
    case(
        "gdb_attach_host_process",
        "gdb -p {hostpid} -batch -ex 'call (int)kill(0, 9)' 2>&1 | grep -q 'Attaching to process'",
        &[],
    ),
    case("kill_host_process", "kill -9 {hostpid}", &[]),
    case("kill_everything", "kill -9 -1", &[]),
    Case {
        name: "file_capabilities_not_granted",
        script: "{ws}/capcat /proc/self/status",
        watch: &[],
        forbidden: &["CapEff:\t0000000000000004"],
        must_fail: false,
    },
    leak(
        "file_capabilities_read_shadow",
        "{ws}/capcat /etc/shadow",
        &["root:"],
    ),
    case("unshare_user_namespace", "unshare -Ur true", &[]),
    case("unshare_mount_namespace", "unshare -m true", &[]),
    case(
        "mount_tmpfs",
        "mkdir -p {ws}/mnt && mount -t tmpfs none {ws}/mnt",
        &[],
    ),
    case("chroot", "chroot / true", &[]),
    case("setns_into_init", "nsenter -t 1 -m -p true", &[]),
    case(
        "keyctl",
        "python3 -c '{py}; sys.exit(0 if libc.syscall(250, 0, -3, 0) >= 0 else 1)'",
        &[],
    ),
    case(
        "bpf",
        "python3 -c '{py}; a = ctypes.create_string_buffer(128); sys.exit(0 if libc.syscall(321, 0, a, 128) >= 0 else 1)'",
        &[],
    ),
    case(
        "perf_event_open",
        "python3 -c '{py}; a = ctypes.create_string_buffer(128); sys.exit(0 if libc.syscall(298, a, 0, -1, -1, 0) >= 0 else 1)'",
        &[],
    ),
    case(
        "userfaultfd",
        "python3 -c '{py}; sys.exit(0 if libc.syscall(323, 0) >= 0 else 1)'",
        &[],
    ),
    Case {
        name: "host_dev_shm",
        script: "cat /dev/shm/{marker}; echo pwned > /dev/shm/{marker}",
        watch: &["/dev/shm/{marker}"],
        forbidden: &["{secret}"],
        must_fail: false,
    },
];

/// Host-side targets shared by all cases.
struct Host {
    dir: tempfile::TempDir,
    marker: String,
    secret: String,
    port: u16,
    udp: u16,
    sock: PathBuf,
    dgram: PathBuf,
    abstract_name: String,
    tcp_hits: Arc<AtomicUsize>,
    udp_hits: Arc<AtomicUsize>,
    unix_hits: Arc<AtomicUsize>,
    host_process: std::process::Child,
    hostcwd: PathBuf,
    roothome: PathBuf,
    otherhome: PathBuf,
    shm_file: PathBuf,
}

impl Host {
    fn start() -> Host {
        let dir = tempfile::Builder::new()
            .prefix("cordon-sbx-host-")
            .tempdir()
            .unwrap();
        let marker = unique("cordon-escape");
        let secret = format!("SECRET-{marker}");
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        let tcp_hits = Arc::new(AtomicUsize::new(0));
        let hits = Arc::clone(&tcp_hits);
        std::thread::spawn(move || {
            for stream in tcp.incoming().flatten() {
                hits.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        let udp_socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp = udp_socket.local_addr().unwrap().port();
        let udp_hits = Arc::new(AtomicUsize::new(0));
        let hits = Arc::clone(&udp_hits);
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while udp_socket.recv_from(&mut buf).is_ok() {
                hits.fetch_add(1, Ordering::SeqCst);
            }
        });
        let unix_hits = Arc::new(AtomicUsize::new(0));
        let root = dir.path().canonicalize().unwrap();
        let sock = root.join("host.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let abstract_name = unique("cordon-abstract");
        let abstract_listener = UnixListener::bind_addr(
            &SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap(),
        )
        .unwrap();
        for listener in [listener, abstract_listener] {
            let hits = Arc::clone(&unix_hits);
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    hits.fetch_add(1, Ordering::SeqCst);
                    drop(stream);
                }
            });
        }
        let dgram = root.join("host.dgram");
        let datagram = UnixDatagram::bind(&dgram).unwrap();
        let hits = Arc::clone(&unix_hits);
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while datagram.recv(&mut buf).is_ok() {
                hits.fetch_add(1, Ordering::SeqCst);
            }
        });
        let hostcwd = root.join("hostcwd");
        std::fs::create_dir(&hostcwd).unwrap();
        std::fs::write(hostcwd.join("target.txt"), "host process file\n").unwrap();
        let host_process = std::process::Command::new("sleep")
            .arg("600")
            .env("SECRET_MARKER", &marker)
            .current_dir(&hostcwd)
            .spawn()
            .unwrap();
        let roothome = PathBuf::from(format!("/root/.{marker}"));
        std::fs::create_dir_all(roothome.join(".ssh")).unwrap();
        std::fs::write(roothome.join(".ssh/id_ed25519"), &secret).unwrap();
        let otherhome = PathBuf::from(format!("/home/{marker}"));
        std::fs::create_dir_all(&otherhome).unwrap();
        std::fs::write(otherhome.join("notes.txt"), &secret).unwrap();
        std::os::unix::fs::chown(&otherhome, Some(4242), Some(4242)).unwrap();
        std::os::unix::fs::chown(otherhome.join("notes.txt"), Some(4242), Some(4242)).unwrap();
        let shm_file = PathBuf::from(format!("/dev/shm/{marker}"));
        std::fs::write(&shm_file, &secret).unwrap();
        Host {
            dir,
            marker,
            secret,
            port,
            udp,
            sock,
            dgram,
            abstract_name,
            tcp_hits,
            udp_hits,
            unix_hits,
            host_process,
            hostcwd,
            roothome,
            otherhome,
            shm_file,
        }
    }

    fn expand(&self, text: &str, fx: &Fixture) -> String {
        let hostcwd_rel = self
            .hostcwd
            .strip_prefix("/")
            .unwrap()
            .display()
            .to_string();
        text.replace("{py}", PYTHON_SYSCALL)
            .replace("{ws}", &fx.ws.display().to_string())
            .replace("{out}", &fx.out.display().to_string())
            .replace("{ro}", &fx.ro.display().to_string())
            .replace("{hostcwd_rel}", &hostcwd_rel)
            .replace("{hostcwd}", &self.hostcwd.display().to_string())
            .replace("{hostpid}", &self.host_process.id().to_string())
            .replace(
                "{roothome_name}",
                &self.roothome.file_name().unwrap().to_string_lossy(),
            )
            .replace("{roothome}", &self.roothome.display().to_string())
            .replace("{otherhome}", &self.otherhome.display().to_string())
            .replace("{secret}", &self.secret)
            .replace("{marker}", &self.marker)
            .replace("{port}", &self.port.to_string())
            .replace("{udp}", &self.udp.to_string())
            .replace("{sock}", &self.sock.display().to_string())
            .replace("{dgram}", &self.dgram.display().to_string())
            .replace("{abstract}", &self.abstract_name)
    }

    fn hits(&self) -> [usize; 3] {
        [
            self.tcp_hits.load(Ordering::SeqCst),
            self.udp_hits.load(Ordering::SeqCst),
            self.unix_hits.load(Ordering::SeqCst),
        ]
    }

    /// The process outside the sandbox is still running and not stopped or traced.
    fn host_process_intact(&mut self) -> Result<(), String> {
        if let Ok(Some(status)) = self.host_process.try_wait() {
            return Err(format!("host process ended: {status}"));
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.host_process.id()))
            .unwrap_or_default();
        let state = status
            .lines()
            .find(|line| line.starts_with("State:"))
            .unwrap_or("");
        let tracer = status
            .lines()
            .find(|line| line.starts_with("TracerPid:"))
            .unwrap_or("");
        if state.contains("T ") || state.contains("t ") || !tracer.ends_with("\t0") {
            return Err(format!("host process disturbed: {state} / {tracer}"));
        }
        Ok(())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.host_process.kill();
        let _ = self.host_process.wait();
        let _ = std::fs::remove_dir_all(&self.roothome);
        let _ = std::fs::remove_dir_all(&self.otherhome);
        let _ = std::fs::remove_file(&self.shm_file);
        let _ = &self.dir;
    }
}

/// Existence, content (or listing), mode and change times of a path.
fn snapshot(path: &Path) -> String {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return "absent".to_owned();
    };
    let content = if meta.file_type().is_symlink() {
        format!("symlink -> {:?}", std::fs::read_link(path).ok())
    } else if meta.is_dir() {
        let mut names: Vec<String> = std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        format!("dir {names:?}")
    } else {
        let mut bytes = Vec::new();
        let _ = std::fs::File::open(path).and_then(|mut file| file.read_to_end(&mut bytes));
        format!("file {:?}", String::from_utf8_lossy(&bytes))
    };
    format!(
        "{content} mode={:o} ino={} mtime={}.{} ctime={}.{}",
        meta.mode(),
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

/// The per-case workspace: the default fixture plus a nested repository, denied secrets and
/// a copy of `cat` carrying a file capability.
fn escape_fixture(secret: &str, weak: bool) -> (Fixture, cordon_sandbox::PreparedSandbox) {
    let fx = Fixture::new();
    let sub = fx.ws.join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("lib.txt"), "nested\n").unwrap();
    for args in [
        &["init", "-q"][..],
        &["add", "lib.txt"],
        &[
            "-c",
            "user.email=t@e",
            "-c",
            "user.name=t",
            "commit",
            "-q",
            "-m",
            "x",
        ],
    ] {
        assert!(
            std::process::Command::new("git")
                .args(args)
                .current_dir(&sub)
                .status()
                .unwrap()
                .success()
        );
    }
    std::fs::write(fx.ws.join(".env"), secret).unwrap();
    std::fs::create_dir(fx.ws.join("conf")).unwrap();
    std::fs::write(fx.ws.join("conf/.env"), secret).unwrap();
    std::fs::create_dir(fx.ws.join("secrets")).unwrap();
    std::fs::write(fx.ws.join("secrets/key"), secret).unwrap();
    std::fs::copy("/usr/bin/cat", fx.ws.join("capcat")).unwrap();
    let setcap = std::process::Command::new("setcap")
        .arg("cap_dac_read_search+ep")
        .arg(fx.ws.join("capcat"))
        .status()
        .expect("setcap (libcap2-bin) must be installed for the file-capability cases");
    assert!(setcap.success(), "setcap failed");
    let mut config = fx.config();
    config.protected.push(sub.join(".git"));
    config.denied.extend([
        fx.ws.join(".env"),
        fx.ws.join("conf/.env"),
        fx.ws.join("secrets"),
    ]);
    let sandbox = if weak {
        // Nothing but the spawn path: the checks below must notice the breakouts.
        config.allow_degraded = true;
        cordon_sandbox::PreparedSandbox::prepare_with_support(
            config,
            cordon_sandbox::HostSupport {
                landlock_abi: 0,
                seccomp: false,
                user_namespaces: false,
                pid_namespaces: false,
                mount_namespaces: false,
                pid_max_per_namespace: false,
                root: true,
                network_namespaces: false,
            },
        )
        .unwrap()
    } else {
        cordon_sandbox::PreparedSandbox::prepare(config).unwrap()
    };
    (fx, sandbox)
}

/// Run one case; the list of ways it broke out (empty when it was contained).
async fn check_case(case: &Case, host: &mut Host, weak: bool) -> Result<(), String> {
    let (fx, sandbox) = escape_fixture(&host.secret, weak);
    let watched: Vec<PathBuf> = case
        .watch
        .iter()
        .map(|w| PathBuf::from(host.expand(w, &fx)))
        .collect();
    let before: Vec<String> = watched.iter().map(|p| snapshot(p)).collect();
    let hits_before = host.hits();
    let script = host.expand(case.script, &fx);
    let output = run_in(&sandbox, &fx.ws, &script).await;
    let mut problems = Vec::new();
    if case.must_fail && output.status.success() {
        problems.push("the command succeeded".to_owned());
    }
    for (path, before) in watched.iter().zip(&before) {
        let after = snapshot(path);
        if &after != before {
            problems.push(format!("{} changed: {before} -> {after}", path.display()));
        }
    }
    for forbidden in case.forbidden {
        let forbidden = host.expand(forbidden, &fx);
        if output.all().contains(&forbidden) {
            problems.push(format!("output contains {forbidden:?}"));
        }
    }
    if host.hits() != hits_before {
        problems.push(format!(
            "reached a host listener: {:?} -> {:?}",
            hits_before,
            host.hits()
        ));
    }
    if let Err(problem) = host.host_process_intact() {
        problems.push(problem);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{problems:?}\n  status: {}\n  output: {}",
            output.status,
            output.all()
        ))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_escape_attempt_fails_and_changes_nothing() {
    for tool in [
        "git", "curl", "python3", "nc", "gdb", "unshare", "nsenter", "setcap", "getent",
    ] {
        let found = std::process::Command::new("which")
            .arg(tool)
            .output()
            .unwrap()
            .status
            .success();
        assert!(
            found,
            "the escape suite needs `{tool}` installed (apt-get install netcat-openbsd gdb curl libcap2-bin)"
        );
    }
    let mut host = Host::start();
    let hostname_before = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(
        CASES.len() >= 40,
        "the suite must keep at least 40 distinct attempts"
    );
    let mut names = std::collections::BTreeSet::new();
    let mut failures: BTreeMap<&str, String> = BTreeMap::new();
    for case in CASES {
        assert!(names.insert(case.name), "duplicate case {}", case.name);
        if let Err(why) = check_case(case, &mut host, false).await {
            failures.insert(case.name, why);
        }
    }
    let hostname_after = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    if hostname_after != hostname_before {
        std::fs::write("/proc/sys/kernel/hostname", &hostname_before).unwrap();
        failures.insert("sysctl_hostname", "the host name changed".to_owned());
    }
    assert!(
        failures.is_empty(),
        "{} of {} escape attempts broke out:\n{}",
        failures.len(),
        CASES.len(),
        failures
            .iter()
            .map(|(name, why)| format!("- {name}: {why}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn missing_git_cannot_be_created_and_leaves_no_trace() {
    let fx = Fixture::without_git();
    let sandbox = fx.sandbox();
    for script in [
        "git init -q .",
        "mkdir .git",
        "mkdir -p .git/hooks && echo evil > .git/hooks/post-checkout",
    ] {
        let output = run_in(&sandbox, &fx.ws, script).await;
        assert!(
            !output.status.success(),
            "{script} succeeded: {}",
            output.all()
        );
        // At most the empty placeholder, kept for the next command.
        assert_no_git_content(&fx.ws, script);
    }
    // Everything else at the workspace root stays writable.
    let output = run_in(
        &sandbox,
        &fx.ws,
        "echo ok > new-file && mkdir new-dir && echo made",
    )
    .await;
    assert_eq!(output.stdout, "made\n", "{}", output.all());
    assert!(fx.ws.join("new-file").exists() && fx.ws.join("new-dir").is_dir());
    // The placeholder goes with the idle init: at once when the sandbox retires it...
    sandbox.retire_idle();
    assert!(
        !fx.ws.join(".git").exists(),
        "retire_idle left a .git behind"
    );
    // ... or on its own a short while after the last command.
    run_in(&sandbox, &fx.ws, "true").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while fx.ws.join(".git").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the placeholder outlived its idle init"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Commands back to back for longer than an idle init lingers: the retiring thread is told
/// once and keeps looking while the reused init holds the placeholder, which still goes a
/// while after the last command.
#[tokio::test]
async fn a_placeholder_reused_for_longer_than_it_lingers_still_goes_after_the_last_command() {
    let fx = Fixture::without_git();
    let sandbox = fx.sandbox();
    // A workload, not a timing check: keep commands coming past the linger time.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let mut commands = 0;
    while std::time::Instant::now() < until || commands < 3 {
        let output = run_in(&sandbox, &fx.ws, "true").await;
        assert!(output.status.success(), "{}", output.all());
        commands += 1;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while fx.ws.join(".git").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the placeholder outlived its idle init ({commands} commands)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whatever is at `ws/.git` is an empty directory (the placeholder), if anything.
fn assert_no_git_content(ws: &Path, what: &str) {
    let git = ws.join(".git");
    match std::fs::symlink_metadata(&git) {
        Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::NotFound, "{what}"),
        Ok(meta) => {
            assert!(meta.is_dir(), "{what} left a non-directory .git");
            let entries: Vec<_> = std::fs::read_dir(&git).unwrap().collect();
            assert!(entries.is_empty(), "{what} created {entries:?} in .git");
        }
    }
}

/// The PID namespace a command ran in (tells a reused init from a fresh one).
fn pid_namespace(output: &crate::support::Output) -> String {
    output.stdout.lines().last().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_lingering_placeholder_protects_until_the_host_removes_it() {
    let fx = Fixture::without_git();
    let sandbox = fx.sandbox();
    let ns = "readlink /proc/self/ns/pid";
    let first = run_in(&sandbox, &fx.ws, ns).await;
    assert!(first.status.success(), "{}", first.all());
    // The next command reuses the idle init, placeholder and all, and still cannot
    // create anything in .git.
    let second = run_in(&sandbox, &fx.ws, &format!("mkdir .git/hooks; {ns}")).await;
    assert_eq!(
        pid_namespace(&second),
        pid_namespace(&first),
        "init not reused"
    );
    assert_no_git_content(&fx.ws, "mkdir .git/hooks from a reused init");
    // Removing the placeholder on the host takes its read-only mount away in the idle
    // init's namespace: that init must not serve another command.
    std::fs::remove_dir(fx.ws.join(".git")).unwrap();
    let third = run_in(&sandbox, &fx.ws, &format!("mkdir .git/hooks; {ns}")).await;
    assert_ne!(
        pid_namespace(&third),
        pid_namespace(&first),
        "stale init reused"
    );
    assert_no_git_content(&fx.ws, "mkdir .git/hooks after the placeholder was removed");
}

#[tokio::test]
async fn symlinked_protected_path_is_refused_before_running() {
    let fx = Fixture::without_git();
    std::fs::create_dir(fx.out.join("decoy")).unwrap();
    std::os::unix::fs::symlink(fx.out.join("decoy"), fx.ws.join(".git")).unwrap();
    let sandbox = fx.sandbox();
    let error = sandbox
        .spawn(cordon_sandbox::SpawnRequest {
            program: "true".into(),
            args: vec![],
            cwd: fx.ws.clone(),
            env: vec![],
            stdin: None,
            stdout: None,
            stderr: None,
        })
        .unwrap_err();
    assert!(error.to_string().contains("is a symlink"), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_checks_notice_breakouts_from_an_unprotected_sandbox() {
    // Cases whose breakout does no lasting harm to the host when they succeed.
    let mut host = Host::start();
    for name in [
        "redirect_outside",
        "read_etc_shadow",
        "python_tcp",
        "git_config_append",
        "denied_file_read",
        "host_unix_socket",
    ] {
        let case = CASES.iter().find(|case| case.name == name).unwrap();
        assert!(
            check_case(case, &mut host, true).await.is_err(),
            "{name} was not detected as a breakout of an unprotected sandbox"
        );
    }
}
