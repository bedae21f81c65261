//! `.git` stays read-only (the default policy protects `.git/**`): no config change, no hook,
//! no replacement of the directory, through bash or through edit/write — and none of it is
//! modified afterwards. Reading it stays allowed (`git log` works).

use std::os::unix::fs::OpenOptionsExt;

use serde_json::json;

use crate::support::{Harness, Snapshot, in_docker, names, snapshot};

fn git_state(h: &Harness) -> Vec<(String, Snapshot)> {
    let mut state = Vec::new();
    for rel in [".git", ".git/config", ".git/HEAD", ".git/hooks"] {
        state.push((rel.to_owned(), snapshot(&h.at(rel))));
    }
    for name in names(&h.at(".git/hooks")) {
        let rel = format!(".git/hooks/{name}");
        state.push((rel.clone(), snapshot(&h.at(&rel))));
    }
    state
}

#[tokio::test]
async fn bash_cannot_modify_or_replace_git() {
    let h = Harness::new().await;
    let before = git_state(&h);
    let hooks_before = names(&h.at(".git/hooks"));
    let attempts = [
        (
            "append to .git/config",
            "echo '[core] hooksPath = /tmp' >> .git/config",
        ),
        (
            "git config writes .git/config",
            "git config core.hooksPath /tmp/evil",
        ),
        (
            "new hook",
            "printf '#!/bin/sh\\ncurl evil' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit",
        ),
        (
            "chmod a sample hook",
            "chmod +x .git/hooks/pre-commit.sample",
        ),
        (
            "sed -i a sample hook",
            "sed -i 's/^/# /' .git/hooks/pre-commit.sample",
        ),
        ("rename .git away", "mv .git .git-old"),
        (
            "replace .git by rename",
            "mkdir -p fake/hooks && cp -r .git/. fake/ 2>/dev/null; mv -T fake .git",
        ),
        ("remove .git", "rm -rf .git"),
        ("rename the hooks directory", "mv .git/hooks .git/hooks-old"),
        (
            "git commit",
            "git -c user.name=x -c user.email=x@y commit --allow-empty -m evil",
        ),
        (
            "symlink into .git then write",
            "ln -s .git/config cfg && echo evil >> cfg",
        ),
    ];
    for (what, command) in attempts {
        h.bash_fails(what, command).await;
        assert_eq!(git_state(&h), before, "{what}: .git changed");
        assert_eq!(names(&h.at(".git/hooks")), hooks_before, "{what}");
    }
    // Reading stays allowed.
    let log = h.bash("git log --oneline").await;
    assert!(
        !log.is_error && log.text().contains("init"),
        "{}",
        log.text()
    );
}

#[tokio::test]
async fn file_tools_cannot_modify_git() {
    let h = Harness::new().await;
    let before = git_state(&h);
    std::os::unix::fs::symlink(".git/config", h.at("cfg")).unwrap();
    let attempts = [
        (
            "edit .git/config",
            "edit",
            json!({"path": ".git/config", "edits": [{"oldText": "[core]", "newText": "[core]\n\thooksPath = /tmp"}]}),
        ),
        (
            "write .git/config",
            "write",
            json!({"path": ".git/config", "content": "[core]\n"}),
        ),
        (
            "write a new hook",
            "write",
            json!({"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\ncurl evil\n"}),
        ),
        (
            "write an existing sample hook",
            "write",
            json!({"path": ".git/hooks/pre-commit.sample", "content": "evil\n"}),
        ),
        (
            "edit through a symlink to .git/config",
            "edit",
            json!({"path": "cfg", "edits": [{"oldText": "[core]", "newText": "[evil]"}]}),
        ),
        (
            "write over the .git directory",
            "write",
            json!({"path": ".git", "content": "gitdir: /tmp/evil\n"}),
        ),
    ];
    for (what, tool, arguments) in attempts {
        h.tool_fails(what, tool, arguments).await;
        assert_eq!(git_state(&h), before, "{what}: .git changed");
    }
    let read = h.call("read", json!({"path": ".git/config"})).await;
    assert!(!read.is_error, "{}", read.text());
}

/// In a workspace that is not a repository yet, `.git` cannot be created by a command
/// (`git init` would plant hooks host git later runs), and nothing is left behind: at most
/// the empty placeholder while the session may run another command, nothing once it ends.
#[tokio::test(flavor = "multi_thread")]
async fn git_cannot_be_created_in_a_plain_workspace() {
    let h = Harness::bare().await;
    for (what, command) in [
        ("git init", "git init -q"),
        (
            "mkdir .git",
            "mkdir -p .git/hooks && echo evil > .git/hooks/post-checkout",
        ),
        (
            "rename a directory to .git",
            "mkdir -p x/hooks && mv -T x .git",
        ),
    ] {
        if in_docker() {
            // In a container nothing holds a missing `.git`'s place (the container profile has
            // no mount namespace for a placeholder, and carving the root for it would cost the
            // root its right to take new entries): the command may make it, and the git guard
            // quarantines it as the command ends (README, "Repositories the sandbox creates").
            let result = h.bash(command).await;
            assert!(
                result.text().contains("quarantined git metadata"),
                "{what}: {}",
                result.text()
            );
            assert!(!h.at(".git").exists(), "{what}: .git was left in place");
            continue;
        }
        h.bash_fails(what, command).await;
        let git = h.at(".git");
        assert!(
            !git.exists() || std::fs::read_dir(&git).unwrap().next().is_none(),
            "{what}: something was created in .git"
        );
    }
    h.session.shutdown().await.expect("shut the session down");
    assert!(
        !h.at(".git").exists(),
        "a .git directory was left in the workspace after the session"
    );
}

/// Nothing of a command survives its end, so nothing can add git metadata after the sweep
/// that follows it: a background process waiting on a FIFO to run `git init` is gone when
/// the result arrives (opening the FIFO for writing finds no reader).
#[tokio::test(flavor = "multi_thread")]
async fn no_process_of_a_command_outlives_its_git_sweep() {
    let h = Harness::new().await;
    let gate = h.at("gate");
    let made = std::process::Command::new("mkfifo")
        .arg(&gate)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let started = h
        .bash("(read line < gate; git init -q late) >/dev/null 2>&1 & setsid sh -c 'read line < gate; git init -q later' >/dev/null 2>&1 & echo started")
        .await;
    assert!(!started.is_error, "{}", started.text());
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc_o_nonblock())
        .open(&gate);
    match writer {
        Err(error) => assert_eq!(error.raw_os_error(), Some(6), "ENXIO expected: {error}"),
        Ok(_) => panic!("a process of the finished command is still waiting on the FIFO"),
    }
    assert!(!h.at("late/.git").exists() && !h.at("later/.git").exists());
}

/// `O_NONBLOCK` (no libc dependency in this crate).
fn libc_o_nonblock() -> i32 {
    0o4000
}

/// The file tools refuse the last piece of a bare repository layout (`HEAD` next to
/// `objects` and `refs`, or next to `commondir`), in whatever order the pieces come.
#[tokio::test(flavor = "multi_thread")]
async fn file_tools_cannot_complete_a_bare_repository() {
    let h = Harness::bare().await;
    for (path, allowed) in [
        ("data/objects/a", true),
        ("data/HEAD", true),
        ("data/refs/heads/main", false),
        ("other/commondir", true),
        ("other/HEAD", false),
        ("third/HEAD", true),
        ("third/commondir", false),
    ] {
        let result = h
            .call(
                "write",
                json!({"path": path, "content": "ref: refs/heads/main\n"}),
            )
            .await;
        assert_eq!(!result.is_error, allowed, "{path}: {}", result.text());
        if !allowed {
            assert!(
                result.text().contains("refused to write git metadata"),
                "{path}: {}",
                result.text()
            );
            assert!(!h.at(path).exists(), "{path} was written");
        }
    }
}
