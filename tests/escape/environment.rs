//! Secrets in the runtime's environment never reach a command: the environment is built from
//! scratch, and the sandbox init (a copy of the runtime process) cannot be read. The runtime's
//! environment is set for a child copy of this test binary, which runs the probe.

use std::process::Command;

use crate::support::Harness;

/// The value of the secret the child runtime carries.
const SECRET: &str = "cordon-escape-aws-secret-5b1e0d4c9a";

/// Runs in a re-executed copy of this binary whose environment holds the secret; ignored in
/// a normal run (it is the child half of `runtime_environment_secrets_stay_out`).
#[tokio::test]
#[ignore = "child half of runtime_environment_secrets_stay_out"]
async fn environment_probe_child() {
    assert_eq!(
        std::env::var("AWS_SECRET_ACCESS_KEY").as_deref(),
        Ok(SECRET),
        "run by runtime_environment_secrets_stay_out only"
    );
    let h = Harness::new().await;
    for (what, command) in [
        ("env", "env"),
        ("printenv", "printenv AWS_SECRET_ACCESS_KEY; true"),
        ("own environ", "tr '\\0' '\\n' < /proc/self/environ"),
        (
            "parent environ",
            "tr '\\0' '\\n' < /proc/$PPID/environ; true",
        ),
        ("init environ", "cat /proc/1/environ; true"),
        ("init cmdline", "cat /proc/1/cmdline; true"),
        (
            "grep every process",
            "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; true",
        ),
    ] {
        let result = h.bash(command).await;
        let structured = result
            .structured_content
            .as_ref()
            .map(|value| value.to_string())
            .unwrap_or_default();
        // The redaction layer would hide the value from the model: check the raw output.
        for text in [result.text(), structured] {
            assert!(
                !text.contains(SECRET),
                "{what}: the secret reached the command: {text}"
            );
            assert!(
                !text.contains("[REDACTED]"),
                "{what}: only redaction hid the secret: {text}"
            );
        }
    }
    let env = h.bash("env").await.text();
    assert!(!env.contains("AWS_SECRET_ACCESS_KEY"), "{env}");
    assert!(env.contains("PATH="), "{env}");
    println!("environment probe passed");
}

#[test]
fn runtime_environment_secrets_stay_out() {
    let exe = std::env::current_exe().unwrap();
    let output = Command::new(exe)
        .args([
            "--exact",
            "environment::environment_probe_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("GITHUB_TOKEN", "ghp_cordonescapetesttokenabcdefghijklmnopq")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("environment probe passed"),
        "the probe failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("1 passed"), "the probe ran:\n{stdout}");
}

/// Sanity for the probe above: the harness does see ordinary variables it sets.
#[tokio::test]
async fn the_environment_is_the_sandbox_baseline() {
    let h = Harness::new().await;
    let env = h.bash("env | cut -d= -f1 | sort").await.text();
    for name in ["HOME", "PATH", "TMPDIR", "LANG", "TERM"] {
        assert!(
            env.lines().any(|line| line == name),
            "{name} missing: {env}"
        );
    }
    assert!(
        !env.lines().any(|line| line == "CARGO_MANIFEST_DIR"),
        "{env}"
    );
}
