//! Git metadata left in the workspace cannot make the operator's `git` run code the model
//! chose after the session: a repository a command creates (nested, or the workspace itself as
//! a bare repository) is quarantined, the file tools refuse to write one, and the operator's
//! own nested repositories stay usable and read-only. Host git runs after the session is shut
//! down, as the operator's would, with a canary as the "code".
//!
//! Run for the backends whose workspace is on this host (local, Docker bind mounts).

use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use cordon_tests::{Harness, Workspace, WorkspaceOptions};
use serde_json::json;

/// Host `git` in `dir`, discovery stopping at the workspace's parent; `safe.directory` lets it
/// open repositories a container user made (the operator may well be that user).
fn host_git(ws: &Workspace, dir: &Path, args: &[&str]) -> Output {
    let ceiling = ws.host_root().parent().expect("the workspace has a parent");
    std::process::Command::new("git")
        .arg("-c")
        .arg("safe.directory=*")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CEILING_DIRECTORIES", ceiling)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("git is installed on the host")
}

#[track_caller]
fn assert_quarantined(text: &str, line: &str) {
    assert!(
        text.contains("Cordon quarantined git metadata this session created"),
        "no quarantine note: {text}"
    );
    assert!(text.contains(line), "{line:?} missing from: {text}");
    assert!(text.contains("nested_git = \"allow\""), "{text}");
}

pub async fn nested_repository_config_does_not_run_on_the_host(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open(&h).await;
    let canary = ws.outside("fsmonitor-ran");
    let made = ws
        .call(
            "bash",
            json!({"command": format!(
                "mkdir src && cd src && git init -q && git config core.fsmonitor 'touch {}; false' && echo made",
                canary.display()
            )}),
        )
        .await;
    assert!(made.text.starts_with("made\n"), "{made:#?}");
    assert_quarantined(
        &made.text,
        "$ROOT/src/.git -> $ROOT/src/.git.cordon-quarantine",
    );
    ws.close().await;
    let status = host_git(&ws, &ws.host("src"), &["status"]);
    assert!(!canary.exists(), "host git ran the model's fsmonitor");
    assert!(!status.status.success(), "src is no repository any more");
    // Kept for the operator to inspect.
    assert!(ws.exists("src/.git.cordon-quarantine/config"));
}

pub async fn bare_repository_in_the_root_does_not_run_on_the_host(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open(&h).await;
    let canary = ws.outside("bare-fsmonitor-ran");
    let host_root = ws.host_root().display().to_string();
    let made = ws
        .call(
            "bash",
            json!({"command": format!(
                "git init -q --bare . && git config core.fsmonitor 'touch {}; false' \
                 && git config core.bare false && git config core.worktree {host_root} && echo made",
                canary.display()
            )}),
        )
        .await;
    assert!(made.text.starts_with("made\n"), "{made:#?}");
    assert_quarantined(&made.text, "$ROOT -> $ROOT/HEAD.cordon-quarantine");
    ws.close().await;
    let status = host_git(&ws, ws.host_root(), &["status"]);
    let log = host_git(&ws, ws.host_root(), &["log"]);
    assert!(!canary.exists(), "host git ran the model's fsmonitor");
    assert!(!status.status.success() && !log.status.success());
}

pub async fn hooks_path_of_a_nested_repository_does_not_run_on_commit(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open(&h).await;
    let canary = ws.outside("hook-ran");
    let hooks = ws.host("hooks");
    let made = ws
        .call(
            "bash",
            json!({"command": format!(
                "git init -q sub && mkdir hooks && printf '#!/bin/sh\\ntouch {}\\n' > hooks/pre-commit \
                 && chmod +x hooks/pre-commit && git -C sub config core.hooksPath {} && echo made",
                canary.display(),
                hooks.display()
            )}),
        )
        .await;
    assert!(made.text.starts_with("made\n"), "{made:#?}");
    assert_quarantined(
        &made.text,
        "$ROOT/sub/.git -> $ROOT/sub/.git.cordon-quarantine",
    );
    ws.close().await;
    let commit = host_git(
        &ws,
        &ws.host("sub"),
        &[
            "-c",
            "user.name=op",
            "-c",
            "user.email=op@example.com",
            "commit",
            "--allow-empty",
            "-m",
            "operator commit",
        ],
    );
    assert!(!canary.exists(), "host git ran the model's hook");
    assert!(!commit.status.success(), "sub is no repository any more");
}

pub async fn file_tools_refuse_nested_git_metadata(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let write = ws
        .call(
            "write",
            json!({"path": "src/.git/config", "content": "[core]\n\tfsmonitor = touch x\n"}),
        )
        .await;
    assert!(write.is_error(), "{write:#?}");
    assert!(
        write.text.contains("refused to write git metadata"),
        "{write:#?}"
    );
    assert!(write.text.contains("nested_git = \"allow\""), "{write:#?}");
    assert!(!ws.exists("src/.git"), "nothing was created");
}

pub async fn operator_nested_repository_is_kept_usable_and_read_only(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open(&h).await;
    // The operator makes the repository between sessions (one made while a session runs
    // cannot be told from the session's own and is quarantined).
    ws.close().await;
    let repo = ws.host("vendor/lib");
    std::fs::create_dir_all(&repo).expect("create vendor/lib");
    for args in [
        &["init", "-q"][..],
        &[
            "-c",
            "user.name=op",
            "-c",
            "user.email=op@example.com",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "operator",
        ][..],
    ] {
        let out = host_git(&ws, &repo, args);
        assert!(out.status.success(), "{out:?}");
    }
    // The session that sees it from the start.
    ws.restart().await;
    let canary = ws.outside("operator-repo-hook");
    let change = ws
        .call(
            "bash",
            json!({"command": format!(
                "git -C vendor/lib config core.fsmonitor 'touch {}' || echo refused-config; \
                 echo evil > vendor/lib/.git/hooks/pre-commit || echo refused-hook; \
                 mv vendor/lib/.git vendor/lib/.git-old || echo refused-move",
                canary.display()
            )}),
        )
        .await;
    for refused in ["refused-config", "refused-hook", "refused-move"] {
        assert!(change.text.contains(refused), "{refused}: {change:#?}");
    }
    assert!(!change.text.contains("quarantined"), "{change:#?}");
    let write = ws
        .call(
            "write",
            json!({"path": "vendor/lib/.git/config", "content": "[core]\n"}),
        )
        .await;
    assert!(write.is_error(), "{write:#?}");
    // Reading it is fine.
    let log = ws
        .call(
            "bash",
            json!({"command": "git -C vendor/lib log --format=%s"}),
        )
        .await;
    assert!(log.text.starts_with("operator\n"), "{log:#?}");
    ws.close().await;
    let status = host_git(&ws, &repo, &["status", "--porcelain"]);
    assert!(status.status.success(), "{status:?}");
    let log = host_git(&ws, &repo, &["log", "--format=%s"]);
    assert_eq!(String::from_utf8_lossy(&log.stdout), "operator\n");
    assert!(!canary.exists());
}

pub async fn allowed_nested_repository_is_kept(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open_with(
        &h,
        WorkspaceOptions::policy(
            "version = 1\n[filesystem]\nread = [\"**\"]\nwrite = [\"**\"]\nprotect = [\".git/**\"]\nnested_git = \"allow\"\n",
        ),
    )
    .await;
    let made = ws
        .call("bash", json!({"command": "git init -q src && echo made"}))
        .await;
    made.assert_ok("made\n");
    let write = ws
        .call(
            "write",
            json!({"path": "src/.git/description", "content": "mine\n"}),
        )
        .await;
    assert!(!write.is_error(), "{write:#?}");
    ws.close().await;
    assert!(ws.exists("src/.git/HEAD"));
    let status = host_git(&ws, &ws.host("src"), &["status", "--porcelain"]);
    assert!(status.status.success(), "{status:?}");
}

/// Git accepts a directory as a git directory when `objects` and `refs` pass `access(X_OK)`:
/// executable regular files do. Such a layout, nested or in the root, is quarantined too.
pub async fn layout_with_executable_files_for_objects_and_refs_is_quarantined(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open(&h).await;
    let canary = ws.outside("file-layout-ran");
    let layout = |dir: &Path| {
        format!(
            "printf 'ref: refs/heads/main\\n' > HEAD && touch objects refs && chmod +x objects refs \
             && printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = {}\\n\\tfsmonitor = \"touch {}; false\"\\n' > config",
            dir.display(),
            canary.display()
        )
    };
    let made = ws
        .call(
            "bash",
            json!({"command": format!(
                "mkdir sub && (cd sub && {}) && {} && echo made",
                layout(&ws.host("sub")),
                layout(ws.host_root())
            )}),
        )
        .await;
    assert!(made.text.starts_with("made\n"), "{made:#?}");
    assert_quarantined(&made.text, "$ROOT/sub -> $ROOT/sub/HEAD.cordon-quarantine");
    assert_quarantined(&made.text, "$ROOT -> $ROOT/HEAD.cordon-quarantine");
    ws.close().await;
    for dir in [ws.host("sub"), ws.host_root().to_path_buf()] {
        let status = host_git(&ws, &dir, &["status"]);
        assert!(!status.status.success(), "{status:?}");
    }
    assert!(!canary.exists(), "host git ran the model's fsmonitor");
}

/// The operator's repository runs hooks from the working tree (`core.hooksPath = .husky`, as
/// husky sets it up): that directory stays read-only, so the next commit does not run a hook
/// the model wrote.
pub async fn hooks_path_in_the_workspace_is_read_only(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open(&h).await;
    ws.close().await;
    for args in [
        &["init", "-q"][..],
        &["config", "core.hooksPath", ".husky"][..],
    ] {
        let out = host_git(&ws, ws.host_root(), args);
        assert!(out.status.success(), "{out:?}");
    }
    std::fs::create_dir(ws.host(".husky")).expect("create .husky");
    std::fs::write(ws.host(".husky/pre-commit"), "#!/bin/sh\nexit 0\n").expect("write hook");
    ws.restart().await;
    let canary = ws.outside("husky-hook-ran");
    let change = ws
        .call(
            "bash",
            json!({"command": format!(
                "printf '#!/bin/sh\\ntouch {}\\n' > .husky/pre-commit || echo refused-hook; \
                 printf 'x' > .husky/pre-push || echo refused-new",
                canary.display()
            )}),
        )
        .await;
    for refused in ["refused-hook", "refused-new"] {
        assert!(change.text.contains(refused), "{refused}: {change:#?}");
    }
    let write = ws
        .call(
            "write",
            json!({"path": ".husky/pre-commit", "content": "#!/bin/sh\ntouch x\n"}),
        )
        .await;
    assert!(write.is_error(), "{write:#?}");
    ws.close().await;
    assert_eq!(
        std::fs::read_to_string(ws.host(".husky/pre-commit")).expect("hook kept"),
        "#!/bin/sh\nexit 0\n"
    );
    assert!(!canary.exists());
}
