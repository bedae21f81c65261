//! `cordon doctor`: one line per item, exit 0 when the local backend can run; run inside the
//! sandbox itself (where namespaces cannot be created) it names the missing layers and exits 1.

use std::path::Path;
use std::process::{Command, Output};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

fn run(binary: &Path, args: &[&str], cwd: &Path) -> Output {
    Command::new(binary)
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run cordon")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn doctor_reports_every_item_and_exits_zero_on_a_capable_host() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(Path::new(CORDON), &["doctor"], dir.path());
    let text = stdout(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    for prefix in [
        "local: kernel: info (Linux ",
        "local: landlock: ok (ABI ",
        "local: seccomp: ok",
        "local: user namespaces: ",
        "local: user namespace restriction: ok (not restricted ",
        "local: pid namespaces: ok",
        "local: mount namespaces: ok",
        "local: network namespaces: ok",
        "local: layer landlock-fs: ok (required: ",
        "local: layer landlock-ioctl: ",
        "local: layer landlock-net: ",
        "local: layer landlock-scopes: ",
        "local: layer seccomp: ok (required: ",
        "local: layer pid-namespace: ok (required: ",
        "local: layer mount-namespace: ok (required: ",
        "local: layer process-limit: ok (required: ",
        "local: sandboxed tools: ok (",
        "local: workspace hard links: ok (none to files outside ",
    ] {
        assert_eq!(
            lines.iter().filter(|line| line.starts_with(prefix)).count(),
            1,
            "one line starting with {prefix:?} in:\n{text}"
        );
    }
    assert_eq!(
        lines.iter().filter(|line| **line == "local: ready").count(),
        1,
        "{text}"
    );
    // The remote backends get their cheap lines; only a selected one is probed.
    for line in [
        "docker: session: info (not probed; run `cordon doctor --backend docker`)",
        "docker: not probed (select it with --backend docker)",
        "ssh: not probed (select it with --backend ssh)",
    ] {
        assert!(lines.contains(&line), "{line:?} missing in:\n{text}");
    }
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("ssh: known_hosts: ")),
        "{text}"
    );
    // Whether filtered network mode can run on docker: this build's helper beside `cordon`
    // when `cargo build -p cordon-helper` made it, else the reason it is missing.
    let beside = Path::new(env!("CARGO_BIN_EXE_cordon"))
        .with_file_name("cordon-helper")
        .is_file();
    let filtered = lines
        .iter()
        .find(|line| line.starts_with("docker: filtered network: "))
        .unwrap_or_else(|| panic!("no filtered network line in:\n{text}"));
    if beside {
        assert!(
            filtered.starts_with("docker: filtered network: ok (")
                && filtered.contains("cordon-helper forwards the egress proxy"),
            "{text}"
        );
    } else {
        assert!(
            filtered.starts_with("docker: filtered network: missing (")
                && filtered.contains("are refused on this backend"),
            "{text}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("ssh: ssh-agent: ")),
        "{text}"
    );
    let selected = run(
        Path::new(CORDON),
        &["doctor", "--backend", "local"],
        dir.path(),
    );
    assert_eq!(selected.status.code(), Some(0));
    assert_eq!(stdout(&selected).lines().count(), lines.len());
}

/// A host-made hard link into the workspace is the outside file: commands could write through
/// it, so the doctor warns about it (without failing: it is the operator's call).
#[test]
fn doctor_warns_about_hard_links_to_files_outside_the_workspace() {
    let base = tempfile::tempdir().unwrap();
    let ws = base.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(base.path().join("store.txt"), "host").unwrap();
    std::fs::hard_link(base.path().join("store.txt"), ws.join("linked.txt")).unwrap();
    let output = run(
        Path::new(CORDON),
        &["doctor", "--root", ws.to_str().unwrap()],
        base.path(),
    );
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    let line = text
        .lines()
        .find(|line| line.starts_with("local: workspace hard links: "))
        .unwrap_or_else(|| panic!("no hard-link line in:\n{text}"));
    assert!(
        line.starts_with("local: workspace hard links: warning (1 file(s) in "),
        "{line}"
    );
    assert!(line.contains("linked.txt"), "{line}");
}

/// Inside the sandbox no namespace can be created: the doctor says which required layers
/// are missing, that the tools cannot run, and exits 1.
#[test]
fn doctor_inside_the_sandbox_names_the_missing_layers_and_exits_one() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    // The binary must be inside the sandboxed workspace; a hard link costs no space.
    let inner = ws.join("cordon");
    if std::fs::hard_link(CORDON, &inner).is_err() {
        std::fs::copy(CORDON, &inner).unwrap();
    }
    let args = r#"{"command": "./cordon doctor; echo \"doctor-exit=$?\""}"#;
    let output = run(
        Path::new(CORDON),
        &["exec", "bash", args, "--root", ws.to_str().unwrap()],
        dir.path(),
    );
    let text = stdout(&output);
    assert!(text.contains("doctor-exit=1"), "{text}");
    for line in [
        "local: pid namespaces: missing",
        "local: layer pid-namespace: missing (required: ",
        "local: layer mount-namespace: missing (required: ",
        "local: sandboxed tools: missing (the bash tool failed: ",
        "local: cannot run (layer pid-namespace, layer mount-namespace",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "a line starting with {line:?} in:\n{text}"
        );
    }
    assert!(!text.contains("local: ready"), "{text}");
}

/// How the docker engine would be reached: TLS from DOCKER_TLS_VERIFY/DOCKER_CERT_PATH, a
/// missing certificate named, plaintext TCP warned about (no engine is contacted).
#[test]
fn doctor_says_how_the_docker_engine_is_reached() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    for name in ["ca.pem", "cert.pem"] {
        std::fs::write(certs.join(name), "pem").unwrap();
    }
    let doctor = |vars: &[(&str, &std::ffi::OsStr)]| {
        let output = Command::new(CORDON)
            .arg("doctor")
            .current_dir(dir.path())
            .env("DOCKER_HOST", "tcp://127.0.0.1:9")
            .env_remove("DOCKER_TLS_VERIFY")
            .env_remove("DOCKER_CERT_PATH")
            .envs(vars.iter().copied())
            .output()
            .expect("run cordon doctor");
        let text = stdout(&output);
        text.lines()
            .find(|line| line.starts_with("docker: tls:"))
            .unwrap_or_else(|| panic!("no tls line: {text}"))
            .to_owned()
    };
    let verify = std::ffi::OsStr::new("1");
    let line = doctor(&[
        ("DOCKER_TLS_VERIFY", verify),
        ("DOCKER_CERT_PATH", certs.as_os_str()),
    ]);
    assert!(
        line.contains("missing") && line.contains("key.pem is missing"),
        "{line}"
    );
    std::fs::write(certs.join("key.pem"), "pem").unwrap();
    let line = doctor(&[
        ("DOCKER_TLS_VERIFY", verify),
        ("DOCKER_CERT_PATH", certs.as_os_str()),
    ]);
    assert!(
        line.contains("ok") && line.contains(certs.to_str().unwrap()),
        "{line}"
    );
    let line = doctor(&[]);
    assert!(
        line.contains("warning") && line.contains("plaintext TCP"),
        "{line}"
    );
}

/// The transport from DOCKER_HOST's scheme, and copy mode for every engine that may be on
/// another machine (no engine is contacted).
#[test]
fn doctor_names_the_engine_transport_and_the_workspace_mode() {
    let dir = tempfile::tempdir().unwrap();
    for (host, args, transport, workspace) in [
        (
            "unix:///run/podman/podman.sock",
            &[][..],
            "unix",
            "bind (the workspace is bind-mounted)",
        ),
        (
            "unix:///var/run/docker.sock",
            &["--workspace-mode", "copy"][..],
            "unix",
            "copy (--workspace-mode copy)",
        ),
        (
            "tcp://127.0.0.1:9",
            &[][..],
            "tcp",
            "copy (the engine may be on another machine: the workspace and the file helper are \
             copied in)",
        ),
        (
            "ssh://builder@127.0.0.1:9",
            &[][..],
            "ssh",
            "copy (the engine may be on another machine: the workspace and the file helper are \
             copied in)",
        ),
    ] {
        let output = Command::new(CORDON)
            .arg("doctor")
            .args(args)
            .current_dir(dir.path())
            .env("DOCKER_HOST", host)
            .env_remove("DOCKER_TLS_VERIFY")
            .output()
            .expect("run cordon doctor");
        let text = stdout(&output);
        let lines: Vec<&str> = text.lines().collect();
        for line in [
            format!("docker: transport: info ({transport})"),
            format!("docker: workspace: info ({workspace})"),
        ] {
            assert!(
                lines.contains(&line.as_str()),
                "{line:?} missing in:\n{text}"
            );
        }
    }
}

#[test]
fn doctor_rejects_an_unknown_backend() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(
        Path::new(CORDON),
        &["doctor", "--backend", "nowhere"],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("nowhere"));
}

/// `--backend docker` probes a real container session (engine and image from the shared test
/// infrastructure; `CORDON_SKIP_DOCKER=1` opts out explicitly).
#[test]
fn doctor_probes_the_selected_docker_backend() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_DOCKER=1: not testing doctor --backend docker");
        return;
    }
    let host = cordon_tests::infra::docker_host().unwrap_or_else(|error| panic!("{error}"));
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(CORDON)
        .args(["doctor", "--backend", "docker"])
        .env("DOCKER_HOST", &host)
        .current_dir(dir.path())
        .output()
        .expect("run cordon");
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("docker: engine: info (DOCKER_HOST={host})")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("docker: sandboxed tools: ok (")),
        "{text}"
    );
    assert!(text.lines().any(|l| l == "docker: ready"), "{text}");
    for line in [
        "docker: engine kind: info (docker)",
        "docker: transport: info (unix)",
        "docker: workspace: info (bind (the workspace is bind-mounted))",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing in:\n{text}"
        );
    }
    // Which path file operations took: the helper beside this build's `cordon` when it was
    // built, else the shell workers with the reason.
    let helper_built = Path::new(CORDON).with_file_name("cordon-helper").is_file();
    let files = text
        .lines()
        .find(|l| l.starts_with("docker: file operations: info ("))
        .unwrap_or_else(|| panic!("no file operations line: {text}"));
    if helper_built {
        assert_eq!(
            files, "docker: file operations: info (helper over socket)",
            "{text}"
        );
    } else {
        assert!(
            files.starts_with("docker: file operations: info (shell ("),
            "{text}"
        );
    }
}

/// `--backend docker` on Podman's socket (`scripts/podman-start.sh` starts a private service;
/// `CORDON_SKIP_PODMAN=1` opts out explicitly): the engine kind says so and a session runs.
#[test]
fn doctor_names_a_podman_engine() {
    if std::env::var("CORDON_SKIP_PODMAN").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_PODMAN=1: not testing doctor on podman");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/podman-start.sh");
    let started = Command::new("bash")
        .arg(script)
        .output()
        .expect("run scripts/podman-start.sh");
    assert!(
        started.status.success(),
        "no Podman service: scripts/podman-start.sh failed:\n{}\nInstall podman and catatonit, \
         or set CORDON_SKIP_PODMAN=1 to skip this test explicitly.",
        String::from_utf8_lossy(&started.stderr)
    );
    let host = String::from_utf8_lossy(&started.stdout).trim().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(CORDON)
        .args(["doctor", "--backend", "docker"])
        .env("DOCKER_HOST", &host)
        .current_dir(dir.path())
        .output()
        .expect("run cordon");
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    for line in [
        "docker: engine kind: info (podman)",
        "docker: transport: info (unix)",
        "docker: ready",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing in:\n{text}"
        );
    }
}

/// `--backend ssh` with a reachable host probes a real session; without `--host` it cannot run.
#[test]
fn doctor_probes_the_selected_ssh_backend() {
    let dir = tempfile::tempdir().unwrap();
    let missing = run(
        Path::new(CORDON),
        &["doctor", "--backend", "ssh"],
        dir.path(),
    );
    assert_eq!(missing.status.code(), Some(1), "{}", stdout(&missing));
    assert!(
        stdout(&missing).contains("ssh: options: missing (--backend ssh needs --host"),
        "{}",
        stdout(&missing)
    );
    if std::env::var("CORDON_SKIP_SSH").as_deref() == Ok("1") {
        eprintln!("CORDON_SKIP_SSH=1: not testing doctor --backend ssh against a server");
        return;
    }
    let sshd = cordon_tests::infra::sshd().unwrap_or_else(|error| panic!("{error}"));
    let host = format!("root@127.0.0.1:{}", sshd.port);
    let output = run(
        Path::new(CORDON),
        &[
            "doctor",
            "--backend",
            "ssh",
            "--host",
            &host,
            "--identity",
            sshd.key.to_str().unwrap(),
            "--known-hosts",
            sshd.known_hosts.to_str().unwrap(),
            "--ssh-config",
            sshd.ssh_config.to_str().unwrap(),
            "--remote-root",
            dir.path().to_str().unwrap(),
            "--allow-degraded",
            "--ssh-helper",
            "/nonexistent/cordon-helper",
        ],
        dir.path(),
    );
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("ssh: sandboxed tools: ok (")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with(
            "ssh: helper: warning (failed to read the helper binary /nonexistent/cordon-helper"
        ) && l.ends_with("commands run unconfined (--allow-degraded))")),
        "{text}"
    );
    assert!(!dir.path().join(".cordon-doctor-probe.txt").exists());

    // With the helper: commands confined on the host, no --allow-degraded needed.
    let helper = cordon_tests::infra::helper_binary().unwrap_or_else(|error| panic!("{error}"));
    let output = run(
        Path::new(CORDON),
        &[
            "doctor",
            "--backend",
            "ssh",
            "--host",
            &host,
            "--identity",
            sshd.key.to_str().unwrap(),
            "--known-hosts",
            sshd.known_hosts.to_str().unwrap(),
            "--ssh-config",
            sshd.ssh_config.to_str().unwrap(),
            "--remote-root",
            dir.path().to_str().unwrap(),
            "--ssh-helper",
            helper.to_str().unwrap(),
        ],
        dir.path(),
    );
    let text = stdout(&output);
    // The helper lands in the remote user's cache (root's, here): removed again below.
    let cached = text
        .lines()
        .find_map(|l| l.strip_prefix("ssh: helper: ok ("))
        .and_then(|rest| rest.split(" from ").nth(1))
        .and_then(|rest| rest.split(" (").next())
        .map(std::path::PathBuf::from);
    if let Some(dir) = cached.as_ref().and_then(|c| c.parent()) {
        let _ = std::fs::remove_dir_all(dir);
    }
    assert_eq!(output.status.code(), Some(0), "{text}");
    let cached = cached.unwrap_or_else(|| panic!("no helper line: {text}"));
    assert!(
        cached.ends_with("cordon-helper")
            && cached.to_string_lossy().contains("/.cache/cordon/helper/"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("ssh: helper: ok ({} (sha256 ", helper.display()))),
        "{text}"
    );
    for line in [
        "ssh: remote landlock: ok (ABI ",
        "ssh: remote seccomp: ok (",
        "ssh: remote namespaces: ok (",
        "ssh: sandboxed tools: ok (",
    ] {
        assert!(text.lines().any(|l| l.starts_with(line)), "{line}: {text}");
    }
}
