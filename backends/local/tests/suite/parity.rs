//! One source of truth: what file operations may read and write is exactly what commands may
//! read and write, path by path — system directories, `/etc` minus secrets, toolchains minus
//! credentials, the workspace minus protected and denied paths, the private temp directory,
//! the spill directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_ops::{BashOperations, ExecRequest, ExitStatus};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::support::{Fixture, snapshot};

/// Run `script` and return whether it exited 0.
async fn succeeds(bash: &dyn BashOperations, cwd: &Path, script: &str) -> bool {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        bash.exec(
            ExecRequest {
                call_id: None,
                command: script.to_owned(),
                cwd: cwd.to_path_buf(),
                timeout: Duration::from_secs(30),
                env: Vec::new(),
            },
            CancellationToken::new(),
            tx,
        ),
    )
    .await
    .expect("exec must not hang")
    .expect("exec runs");
    drain.await.unwrap();
    outcome.status == Some(ExitStatus::Code(0))
}

fn quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

#[tokio::test]
async fn file_operations_and_commands_agree_on_every_path() {
    let fx = Fixture::with(|_, base| {
        let home = base.join("home");
        for (rel, content) in [
            (".cargo/bin/tool", "#!/bin/sh\n"),
            (".cargo/registry/index.txt", "crates\n"),
            (".cargo/credentials.toml", "token = \"secret\"\n"),
            (".ssh/id_ed25519", "PRIVATE KEY\n"),
            ("notes.txt", "home notes\n"),
        ] {
            let path = home.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
    });
    let home = fx.ws.parent().unwrap().join("home");
    fx.put(".git/config", "[core]\n");
    fx.put("app/.env", "TOKEN=1\n");
    fx.put("src/main.rs", "fn main() {}\n");
    let tmp = fx.backend.command_tmp_dir().to_path_buf();
    std::fs::write(tmp.join("scratch.txt"), "scratch\n").unwrap();
    let spill = fx.backend.spill_dir().join("cordon-bash-parity.log");
    std::fs::write(&spill, "full output\n").unwrap();
    let files = fx.files();
    let bash = fx.bash();

    // (path, readable by both)
    let reads: Vec<(PathBuf, bool)> = vec![
        (PathBuf::from("/etc/passwd"), true),
        (PathBuf::from("/usr/bin/env"), true),
        (fx.at("src/main.rs"), true),
        (fx.at(".git/config"), true),
        (tmp.join("scratch.txt"), true),
        (spill.clone(), true),
        (home.join(".cargo/registry/index.txt"), true),
        (PathBuf::from("/etc/shadow"), false),
        (fx.at("app/.env"), false),
        (home.join(".cargo/credentials.toml"), false),
        (home.join(".ssh/id_ed25519"), false),
        (home.join("notes.txt"), false),
        (fx.outside.join("secret.txt"), false),
    ];
    for (path, readable) in &reads {
        let by_files = files.read_file(path).await.is_ok();
        let by_bash = succeeds(
            bash.as_ref(),
            &fx.ws,
            &format!("cat {} >/dev/null", quote(path)),
        )
        .await;
        assert_eq!(
            (by_files, by_bash),
            (*readable, *readable),
            "read {} (file operations, command)",
            path.display()
        );
    }

    // Listing a directory that is only partly granted fails for both.
    assert!(files.read_dir(Path::new("/etc")).await.is_err());
    assert!(!succeeds(bash.as_ref(), &fx.ws, "ls /etc >/dev/null").await);

    // (path, writable by both); each layer writes its own new file next to the target.
    let protected_before = snapshot(&fx.at(".git/config"));
    let writes: Vec<(PathBuf, bool)> = vec![
        (fx.at("src"), true),
        (tmp.clone(), true),
        (fx.at(".git"), false),
        (PathBuf::from("/etc"), false),
        (home.join(".cargo/bin"), false),
        (fx.backend.spill_dir().to_path_buf(), false),
        (fx.outside.clone(), false),
    ];
    for (dir, writable) in &writes {
        let by_files = files
            .write_file(&dir.join("by-files.txt"), b"x")
            .await
            .is_ok();
        let target = dir.join("by-bash.txt");
        let by_bash = succeeds(
            bash.as_ref(),
            &fx.ws,
            &format!("echo x > {}", quote(&target)),
        )
        .await;
        assert_eq!(
            (by_files, by_bash),
            (*writable, *writable),
            "write in {} (file operations, command)",
            dir.display()
        );
        assert_eq!(dir.join("by-files.txt").exists(), *writable);
        assert_eq!(target.exists(), *writable);
    }
    // Existing protected and denied files: neither layer modifies them.
    assert!(files.write_file(&fx.at(".git/config"), b"x").await.is_err());
    assert!(
        !succeeds(
            bash.as_ref(),
            &fx.ws,
            &format!("echo x >> {}", quote(&fx.at(".git/config")))
        )
        .await
    );
    assert_eq!(snapshot(&fx.at(".git/config")), protected_before);
    assert!(files.write_file(&fx.at("app/.env"), b"x").await.is_err());
    assert!(
        !succeeds(
            bash.as_ref(),
            &fx.ws,
            &format!("echo x >> {}", quote(&fx.at("app/.env")))
        )
        .await
    );
    assert_eq!(
        std::fs::read_to_string(fx.at("app/.env")).unwrap(),
        "TOKEN=1\n"
    );
}

/// A denied file that appears between two commands is masked from the next command on, the
/// same moment file operations refuse it.
#[tokio::test]
async fn new_denied_and_protected_paths_apply_to_the_next_command() {
    let fx = Fixture::new();
    let bash = fx.bash();
    let files = fx.files();
    assert!(succeeds(bash.as_ref(), &fx.ws, "true").await);
    fx.put("later/deep/.env", "LATE_SECRET=1\n");
    assert!(files.read_file(&fx.at("later/deep/.env")).await.is_err());
    assert!(
        !succeeds(bash.as_ref(), &fx.ws, "grep -q LATE_SECRET later/deep/.env").await,
        "a .env created by the host after the last command is masked"
    );
    // `.git` created by the host (git init) is read-only from the next command on.
    assert!(succeeds(bash.as_ref(), &fx.ws, "test ! -e .git/HEAD").await);
    fx.put(".git/HEAD", "ref: refs/heads/main\n");
    assert!(
        !succeeds(bash.as_ref(), &fx.ws, "echo hijack > .git/HEAD").await,
        "a .git that appeared is protected"
    );
    assert_eq!(
        std::fs::read_to_string(fx.at(".git/HEAD")).unwrap(),
        "ref: refs/heads/main\n"
    );
}
