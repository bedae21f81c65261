//! Reads of secrets: SSH keys in the host home, `/etc/shadow`, another user's home, other
//! processes' memory and environment, secrets in the workspace (`.env`). None of the content
//! reaches the model, through bash or through read/grep/ls/find, and nothing is modified.

use serde_json::json;

use crate::support::{Harness, Planted, host_home, in_docker};

/// A marker that must never appear in any output.
const SECRET: &str = "CORDON-ESCAPE-SECRET-7f3a9c";

fn assert_hidden(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET),
        "{what}: the secret reached the model:\n{text}"
    );
}

#[tokio::test]
async fn ssh_keys_in_the_host_home_are_unreachable() {
    let name = format!("cordon-escape-key-{}", std::process::id());
    let key = Planted::new(
        &host_home().join(".ssh").join(&name),
        &format!(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n{SECRET}\n-----END OPENSSH PRIVATE KEY-----\n"
        ),
    );
    // On Docker the host's `~/.ssh` is in the container at its host path (`~` there is the
    // container's own home, where the `~` attempts below find no key).
    let h = Harness::with_canaries(&[key.path.parent().unwrap()]).await;
    let path = key.path.display().to_string();
    for (what, command) in [
        ("cat the key", format!("cat {path}")),
        ("cat via ~", format!("cat ~/.ssh/{name}")),
        (
            "list ~/.ssh",
            format!("ls -la {}", key.path.parent().unwrap().display()),
        ),
        (
            "grep the home",
            format!("grep -r {SECRET} {}", host_home().display()),
        ),
        (
            "copy it into the workspace",
            format!("cp {path} stolen && cat stolen"),
        ),
        (
            "python open()",
            format!("python3 -c 'print(open(\"{path}\").read())'"),
        ),
    ] {
        let text = h.bash_fails(what, &command).await;
        assert_hidden(what, &text);
    }
    for (what, tool, arguments) in [
        ("read the key", "read", json!({"path": path})),
        (
            "read via ~",
            "read",
            json!({"path": format!("~/.ssh/{name}")}),
        ),
        ("ls ~/.ssh", "ls", json!({"path": "~/.ssh"})),
        (
            "grep ~/.ssh",
            "grep",
            json!({"pattern": SECRET, "path": "~/.ssh"}),
        ),
        (
            "find in ~/.ssh",
            "find",
            json!({"pattern": "*key*", "path": "~/.ssh"}),
        ),
    ] {
        let text = h.tool_fails(what, tool, arguments).await;
        assert_hidden(what, &text);
    }
    // A symlink planted in the workspace does not help either.
    std::os::unix::fs::symlink(&key.path, h.at("innocent.txt")).unwrap();
    let text = h
        .tool_fails(
            "read through a symlink",
            "read",
            json!({"path": "innocent.txt"}),
        )
        .await;
    assert_hidden("read through a symlink", &text);
    let text = h
        .bash_fails("cat through a symlink", "cat innocent.txt")
        .await;
    assert_hidden("cat through a symlink", &text);
    assert!(!h.at("stolen").exists(), "nothing was copied");
}

#[tokio::test]
async fn etc_shadow_and_other_users_homes_are_unreachable() {
    let other_home = format!("/home/cordon-escape-{}", std::process::id());
    let other = Planted::new(
        &std::path::Path::new(&other_home).join("secret.txt"),
        &format!("{SECRET}\n"),
    );
    // Owned by another user, private, as a home directory is.
    let other_dir = other.path.parent().unwrap();
    std::os::unix::fs::chown(&other.path, Some(65534), Some(65534)).unwrap();
    std::os::unix::fs::chown(other_dir, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(
        &other.path,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(
        other_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let other_path = other.path.display().to_string();
    // On Docker the other home is in the container at its host path; `/etc/shadow` there is
    // the image's own (with a `root:` line too), which the container's sandbox must hide.
    let h = Harness::with_canaries(&[other_dir]).await;
    let shadow_before = std::fs::read("/etc/shadow").unwrap();
    for (what, command) in [
        ("cat /etc/shadow", "cat /etc/shadow".to_owned()),
        ("head /etc/gshadow", "head -1 /etc/gshadow".to_owned()),
        (
            "write /etc/shadow",
            "echo 'evil::0:0:::::' >> /etc/shadow".to_owned(),
        ),
        ("another user's file", format!("cat {other_path}")),
        ("list the other home", format!("ls {other_home}")),
        (
            "su to another user",
            "su -s /bin/sh nobody -c id".to_owned(),
        ),
    ] {
        let text = h.bash_fails(what, &command).await;
        assert_hidden(what, &text);
        assert!(!text.contains("root:"), "{what}: shadow content leaked");
    }
    for (what, tool, arguments) in [
        ("read /etc/shadow", "read", json!({"path": "/etc/shadow"})),
        (
            "grep /etc/shadow",
            "grep",
            json!({"pattern": "root", "path": "/etc/shadow"}),
        ),
        (
            "read another user's file",
            "read",
            json!({"path": other_path}),
        ),
        ("ls another user's home", "ls", json!({"path": other_home})),
    ] {
        let text = h.tool_fails(what, tool, arguments).await;
        assert_hidden(what, &text);
        assert!(!text.contains("root:$"), "{what}: shadow content leaked");
    }
    assert_eq!(std::fs::read("/etc/shadow").unwrap(), shadow_before);
    assert_eq!(
        std::fs::read_to_string(&other.path).unwrap(),
        format!("{SECRET}\n")
    );
}

#[tokio::test]
async fn workspace_secrets_are_masked_for_bash_and_tools() {
    let h = Harness::new().await;
    std::fs::create_dir_all(h.at("config")).unwrap();
    std::fs::write(h.at(".env"), format!("API_KEY={SECRET}\n")).unwrap();
    std::fs::write(h.at("config/server.pem"), format!("{SECRET}\n")).unwrap();
    for (what, command) in [
        ("cat .env", "cat .env"),
        ("grep the workspace", "grep -r CORDON-ESCAPE ."),
        ("cat a .pem", "cat config/server.pem"),
        (
            "move .env away and read it",
            "mv .env plain.txt; cat plain.txt",
        ),
        ("source .env", "set -a; . ./.env; echo \"$API_KEY\"; false"),
    ] {
        let text = h.bash_fails(what, command).await;
        assert_hidden(what, &text);
    }
    for (what, tool, arguments) in [
        ("read .env", "read", json!({"path": ".env"})),
        ("read a .pem", "read", json!({"path": "config/server.pem"})),
    ] {
        let text = h.tool_fails(what, tool, arguments).await;
        assert_hidden(what, &text);
    }
    let grep = h.call("grep", json!({"pattern": "CORDON-ESCAPE"})).await;
    assert_hidden("grep tool", &grep.text());
    assert_eq!(
        std::fs::read_to_string(h.at(".env")).unwrap(),
        format!("API_KEY={SECRET}\n"),
        ".env untouched"
    );
    assert!(!h.at("plain.txt").exists());
}

/// A secret deeper than `PATH_MAX` cannot be masked by its path; the deepest directory that
/// can be is hidden instead (fail closed), so bash still cannot read it.
#[tokio::test]
async fn a_secret_below_path_max_depth_stays_masked() {
    let h = Harness::new().await;
    // Planted from the host with relative steps (no single path call could reach it).
    let component = "d".repeat(250);
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -e; for i in $(seq 1 20); do mkdir {component}; cd {component}; done; \
             echo 'API_KEY={SECRET}' > .env"
        ))
        .current_dir(&h.ws)
        .status()
        .unwrap();
    assert!(status.success());
    let walk = format!("for i in $(seq 1 20); do cd {component} || exit 1; done");
    for (what, command) in [
        ("cd down and cat .env", format!("{walk}; cat .env")),
        (
            "find and cat",
            "find . -name .env -exec cat {} + ; grep -r CORDON-ESCAPE . ; false".to_owned(),
        ),
    ] {
        let text = h.bash_fails(what, &command).await;
        assert_hidden(what, &text);
    }
    if in_docker() {
        // The documented cost of the container profile (README, Docker backend): the
        // directories above a denied path no mount covers keep only reading and listing, so
        // the workspace root takes no new entry; its existing files stay writable.
        let result = h.bash("echo fine > ok.txt").await;
        assert!(
            result.is_error && result.text().contains("Permission denied"),
            "{}",
            result.text()
        );
        let result = h
            .bash("echo fine >> README.md && tail -n 1 README.md")
            .await;
        assert!(!result.is_error, "{}", result.text());
        assert_eq!(result.text().trim(), "fine");
    } else {
        // The rest of the workspace still works.
        let result = h.bash("echo fine > ok.txt && cat ok.txt").await;
        assert!(!result.is_error, "{}", result.text());
    }
}

/// Another process's memory, environment and file descriptors are out of reach: the
/// sandbox has its own PID namespace, and its init is not dumpable.
#[tokio::test]
async fn other_processes_memory_and_environment_are_unreachable() {
    let h = Harness::new().await;
    let host = h.process_outside_the_sandbox("victim-process", &h.ws);
    let pid = host.pid();
    // In a container the command shares the container's PID namespace (the container profile
    // creates none), so the names in `/proc/<pid>/fd` of a process of the same uid are
    // listable there; where they lead (which needs ptrace access, refused by Landlock across
    // domains) is what the attempt must not learn.
    let fds = if in_docker() {
        format!("ls -l /proc/{pid}/fd")
    } else {
        format!("ls /proc/{pid}/fd")
    };
    for (what, command) in [
        ("host process environ", format!("cat /proc/{pid}/environ")),
        ("host process memory", format!("head -c 16 /proc/{pid}/mem")),
        ("host process fds", fds),
        ("sandbox init environ", "cat /proc/1/environ".to_owned()),
        ("sandbox init memory", "head -c 16 /proc/1/mem".to_owned()),
        ("sandbox init root", "ls /proc/1/root/".to_owned()),
    ] {
        let text = h.bash_fails(what, &command).await;
        assert!(
            !text.contains("PATH="),
            "{what}: an environment leaked: {text}"
        );
    }
    assert!(host.alive_and_running());
}
