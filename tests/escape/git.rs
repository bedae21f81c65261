//! `.git` stays read-only (the default policy protects `.git/**`): no config change, no hook,
//! no replacement of the directory, through bash or through edit/write — and none of it is
//! modified afterwards. Reading it stays allowed (`git log` works).

use serde_json::json;

use crate::support::{Harness, Snapshot, names, snapshot};

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
        h.bash_fails(what, command).await;
        let git = h.at(".git");
        assert!(
            !git.exists() || std::fs::read_dir(&git).unwrap().next().is_none(),
            "{what}: something was created in .git"
        );
    }
    h.session.shutdown().await;
    assert!(
        !h.at(".git").exists(),
        "a .git directory was left in the workspace after the session"
    );
}
