//! Everyday commands work inside the sandbox, with the environment a user expects.

use cordon_sandbox::ExitStatus;

use crate::support::{Fixture, run_in};

#[tokio::test]
async fn bash_and_coreutils_work() {
    let fx = Fixture::new();
    let output = run_in(&fx.sandbox(), &fx.ws, "echo hello | tr a-z A-Z; printf 'b\\na\\n' | sort | head -1; ls /usr/bin/env; wc -l < file.txt").await;
    assert_eq!(
        output.stdout,
        "HELLO\na\n/usr/bin/env\n1\n",
        "{}",
        output.all()
    );
    assert_eq!(output.status, ExitStatus::Code(0));
}

#[tokio::test]
async fn python3_runs() {
    let fx = Fixture::new();
    let output = run_in(
        &fx.sandbox(),
        &fx.ws,
        "python3 -c 'import json, sys; print(json.dumps({\"sum\": 1 + 2}), sys.version_info[0])'",
    )
    .await;
    assert_eq!(output.stdout, "{\"sum\": 3} 3\n", "{}", output.all());
}

#[tokio::test]
async fn git_status_and_log_work_in_a_protected_repository() {
    let fx = Fixture::new();
    std::fs::write(fx.ws.join("file.txt"), "changed\n").unwrap();
    let output = run_in(
        &fx.sandbox(),
        &fx.ws,
        "git status --short && git log --oneline | wc -l",
    )
    .await;
    assert_eq!(output.stdout, " M file.txt\n1\n", "{}", output.all());
}

#[tokio::test]
async fn cargo_runs_with_the_toolchain_readable() {
    let fx = Fixture::new();
    let output = run_in(&fx.sandbox(), &fx.ws, "cargo --version && rustc --version").await;
    assert!(output.status.success(), "{}", output.all());
    assert!(output.stdout.starts_with("cargo "), "{}", output.all());
    assert!(output.stdout.contains("\nrustc "), "{}", output.all());
}

#[tokio::test]
async fn workspace_and_tmpdir_are_writable_and_visible_to_the_host() {
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    let output = run_in(
        &sandbox,
        &fx.ws,
        "echo made > new.txt && mkdir -p a/b && mv new.txt a/b/ && echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo h > \"$HOME/.rc\" && chmod +x a/b/new.txt && rm file.txt",
    )
    .await;
    assert_eq!(output.stdout, "t\n", "{}", output.all());
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("a/b/new.txt")).unwrap(),
        "made\n"
    );
    assert!(!fx.ws.join("file.txt").exists());
    assert_eq!(
        std::fs::read_to_string(sandbox.tmp_dir().join("t")).unwrap(),
        "t\n"
    );
    assert!(sandbox.home_dir().join(".rc").exists());
}

#[tokio::test]
async fn devices_pipes_and_process_substitution_work() {
    let fx = Fixture::new();
    let output = run_in(
        &fx.sandbox(),
        &fx.ws,
        "echo gone > /dev/null && head -c 4 /dev/zero | wc -c && head -c 8 /dev/urandom | wc -c && diff <(echo x) <(echo x) && cat <(echo sub) && echo piped | cat | cat && echo tee > >(cat)",
    )
    .await;
    assert!(output.status.success(), "{}", output.all());
    assert!(
        output.stdout.starts_with("4\n8\nsub\npiped\n"),
        "{}",
        output.all()
    );
}

#[tokio::test]
async fn environment_is_the_sandbox_baseline() {
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    let output = run_in(
        &sandbox,
        &fx.ws,
        "echo \"$HOME|$TMPDIR|$PWD\"; env | cut -d= -f1 | sort | tr '\\n' ' '",
    )
    .await;
    let mut lines = output.stdout.lines();
    assert_eq!(
        lines.next().unwrap(),
        format!(
            "{}|{}|{}",
            sandbox.home_dir().display(),
            sandbox.tmp_dir().display(),
            fx.ws.display()
        )
    );
    let names = lines.next().unwrap();
    for expected in ["HOME", "LANG", "PATH", "TERM", "TMPDIR"] {
        assert!(names.contains(expected), "{expected} missing from {names}");
    }
}

#[tokio::test]
async fn exit_codes_and_signals_are_the_command_s() {
    let fx = Fixture::new();
    let sandbox = fx.sandbox();
    assert_eq!(
        run_in(&sandbox, &fx.ws, "exit 42").await.status,
        ExitStatus::Code(42)
    );
    assert_eq!(
        run_in(&sandbox, &fx.ws, "kill -TERM $$").await.status,
        ExitStatus::Signal(15)
    );
    assert_eq!(
        run_in(&sandbox, &fx.ws, "kill -KILL $$").await.status,
        ExitStatus::Signal(9)
    );
    assert_eq!(
        run_in(&sandbox, &fx.ws, "true").await.status,
        ExitStatus::Code(0)
    );
    let status = run_in(&sandbox, &fx.ws, "exit 3").await.status;
    assert_eq!(status.code(), 3);
}

#[tokio::test]
async fn only_the_sandbox_s_processes_are_visible() {
    let fx = Fixture::new();
    let output = run_in(&fx.sandbox(), &fx.ws, "ls -d /proc/[0-9]* | wc -l; echo $$").await;
    let lines: Vec<&str> = output.stdout.lines().collect();
    // init, bash, ls (and wc's subshell at most)
    let count: usize = lines[0].trim().parse().unwrap();
    assert!(count <= 4, "{}", output.all());
    assert_eq!(lines[1], "2", "the command is PID 2, the init PID 1");
}

#[tokio::test]
async fn programs_are_resolved_in_the_sandbox_path_or_relative_to_cwd() {
    let fx = Fixture::new();
    std::fs::write(fx.ws.join("run.sh"), "#!/bin/sh\necho script $1\n").unwrap();
    std::fs::set_permissions(
        fx.ws.join("run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let sandbox = fx.sandbox();
    let (read, write) = std::io::pipe().unwrap();
    let mut child = sandbox
        .spawn(cordon_sandbox::SpawnRequest {
            program: "./run.sh".into(),
            args: vec!["arg".into()],
            cwd: fx.ws.clone(),
            env: vec![("EXTRA".into(), "1".into())],
            stdin: None,
            stdout: Some(write.into()),
            stderr: None,
        })
        .unwrap();
    assert_eq!(child.wait().await.unwrap(), ExitStatus::Code(0));
    let mut text = String::new();
    std::io::Read::read_to_string(&mut { read }, &mut text).unwrap();
    assert_eq!(text, "script arg\n");
    let missing = sandbox.spawn(cordon_sandbox::SpawnRequest {
        program: "no-such-program-anywhere".into(),
        args: vec![],
        cwd: fx.ws.clone(),
        env: vec![],
        stdin: None,
        stdout: None,
        stderr: None,
    });
    assert!(matches!(
        missing,
        Err(cordon_sandbox::SandboxError::ProgramNotFound { .. })
    ));
}

#[tokio::test]
async fn a_bad_working_directory_is_reported_with_its_path() {
    let fx = Fixture::new();
    let error = fx
        .sandbox()
        .spawn(cordon_sandbox::SpawnRequest {
            program: "true".into(),
            args: vec![],
            cwd: fx.ws.join("does-not-exist"),
            env: vec![],
            stdin: None,
            stdout: None,
            stderr: None,
        })
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("failed to change to the working directory"),
        "{message}"
    );
    assert!(message.contains("does-not-exist"), "{message}");
}

#[test]
fn probe_reports_every_layer_on_this_host() {
    let support = cordon_sandbox::probe();
    let lines = support.report_lines();
    assert_eq!(lines.len(), cordon_sandbox::Layer::ALL.len());
    for layer in cordon_sandbox::Layer::ALL {
        assert!(
            support.supports(layer),
            "this test host must support {layer}: {lines:?}"
        );
    }
}

#[tokio::test]
async fn no_capability_is_left_and_no_new_privs_is_set() {
    let fx = Fixture::new();
    let output = run_in(
        &fx.sandbox(),
        &fx.ws,
        "grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status",
    )
    .await;
    assert_eq!(
        output.stdout,
        "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n",
        "{}",
        output.all()
    );
}

#[tokio::test]
async fn network_on_reaches_a_local_listener() {
    let fx = Fixture::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        std::io::Write::write_all(
            &mut stream,
            b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        )
        .unwrap();
    });
    let mut config = fx.config();
    config.network = cordon_sandbox::NetworkAccess::On;
    let sandbox = cordon_sandbox::PreparedSandbox::prepare(config).unwrap();
    let output = run_in(
        &sandbox,
        &fx.ws,
        &format!("curl -sS --max-time 30 http://127.0.0.1:{port}/"),
    )
    .await;
    assert_eq!(output.stdout, "hello", "{}", output.all());
    server.join().unwrap();
}

#[test]
fn missing_read_roots_are_skipped_but_missing_writable_roots_fail() {
    let fx = Fixture::new();
    let mut config = fx.config();
    config.read.push(fx.ws.join("no-such-dir"));
    config.read_exec.push(fx.ws.join("no-such-file"));
    cordon_sandbox::PreparedSandbox::prepare(config.clone())
        .expect("a missing read root grants nothing");
    config.write.push(fx.ws.join("no-such-dir"));
    let error = cordon_sandbox::PreparedSandbox::prepare(config).unwrap_err();
    assert!(
        matches!(error, cordon_sandbox::SandboxError::OpenPath { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn cargo_test_builds_and_runs_with_a_read_only_cargo_home() {
    let fx = Fixture::without_git();
    let krate = fx.ws.join("demo");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        "[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::write(
        krate.join("src/lib.rs"),
        "#[test]\nfn adds() { assert_eq!(1 + 1, 2); }\n",
    )
    .unwrap();
    let output = run_in(&fx.sandbox(), &krate, "cargo test --offline -q 2>&1").await;
    assert!(output.status.success(), "{}", output.all());
    assert!(output.stdout.contains("1 passed"), "{}", output.all());
}
