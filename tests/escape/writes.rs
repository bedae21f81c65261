//! Writes outside the workspace, through bash and through the file tools: every spelling
//! fails and the victim next to the workspace keeps its content, and nothing appears there.

use std::time::Duration;

use serde_json::json;

use crate::support::{Harness, in_docker};

#[tokio::test]
async fn bash_redirection_cp_mv_and_dotdot_cannot_write_outside() {
    let h = Harness::new().await;
    let victim = h.victim.display().to_string();
    let outside = h.outside.display().to_string();
    std::fs::write(h.at("mine.txt"), "mine\n").unwrap();
    let attempts = [
        (
            "relative redirection",
            "echo pwned > ../outside/victim.txt".to_owned(),
        ),
        ("absolute redirection", format!("echo pwned > {victim}")),
        ("append", format!("echo pwned >> {victim}")),
        ("truncate", format!("truncate -s 0 {victim}")),
        (
            "new file outside",
            format!("echo pwned > {outside}/new.txt"),
        ),
        ("cp onto the victim", format!("cp mine.txt {victim}")),
        ("cp into the directory", format!("cp mine.txt {outside}/")),
        (
            "mv a workspace file out",
            format!("mv mine.txt {outside}/moved.txt"),
        ),
        (
            "cd .. then write",
            "cd .. && echo pwned > outside/victim.txt".to_owned(),
        ),
        ("tee", format!("echo pwned | tee {victim}")),
        (
            "dd",
            format!("dd if=/dev/zero of={victim} bs=1 count=1 conv=notrunc"),
        ),
        ("rm the victim", format!("rm -f {victim}")),
        ("chmod the victim", format!("chmod 777 {victim}")),
        ("touch the victim", format!("touch -d 2001-01-01 {victim}")),
        ("mkdir outside", format!("mkdir {outside}/dir")),
    ];
    for (what, command) in attempts {
        if in_docker() && METADATA_ONLY.contains(&what) {
            metadata_changes_in_a_container(&h, what, &command).await;
        } else {
            h.bash_fails(what, &command).await;
        }
        h.assert_victim_untouched(what);
    }
    assert_eq!(std::fs::read_to_string(h.at("mine.txt")).unwrap(), "mine\n");
}

/// The attempts above that change only a file's metadata (mode, times).
const METADATA_ONLY: [&str; 2] = ["chmod the victim", "touch the victim"];

/// A known limit of the container profile (README, Docker backend): Landlock does not cover
/// chmod, utimes or extended attributes, and without a mount namespace of its own the helper
/// cannot make the container's writable mounts read-only around the command as the local
/// sandbox does. The victim here sits on a writable mount outside the workspace that no policy
/// rule grants (only this suite makes one: in a session the container's other writable mounts
/// are roots the policy lets commands write), so a command changes its metadata although it may
/// not write it; the content stays out of reach. The protected files of the workspace are
/// read-only mounts and refuse both (`files_host_programs_run_later_are_read_only`). The case
/// asserts exactly that, so that a fix shows here (and must update it).
async fn metadata_changes_in_a_container(h: &Harness, what: &str, command: &str) {
    let result = h.bash(command).await;
    assert!(
        !result.is_error,
        "{what}: the metadata defect is gone, update this case: {}",
        result.text()
    );
}

#[tokio::test]
async fn bash_links_and_proc_paths_cannot_write_outside() {
    let h = Harness::new().await;
    let victim = h.victim.display().to_string();
    let attempts = [
        (
            "symlink then write",
            format!("ln -s {victim} link && echo pwned > link"),
        ),
        (
            "relative symlink then write",
            "ln -s ../outside/victim.txt rel && echo pwned > rel".to_owned(),
        ),
        (
            "symlinked directory then write",
            "ln -s ../outside dir && echo pwned > dir/victim.txt".to_owned(),
        ),
        (
            "hardlink then write",
            format!("ln {victim} hard && echo pwned > hard"),
        ),
        (
            "/proc/self/root",
            format!("echo pwned > /proc/self/root{victim}"),
        ),
        (
            "/proc/self/cwd/..",
            "echo pwned > /proc/self/cwd/../outside/victim.txt".to_owned(),
        ),
    ];
    for (what, command) in attempts {
        h.bash_fails(what, &command).await;
        h.assert_victim_untouched(what);
    }
    // A host process whose working directory is the outside directory: its /proc/<pid>/cwd
    // is not reachable from the sandbox (own PID namespace, fresh /proc).
    let host = h.process_outside_the_sandbox("cwd-holder", &h.outside);
    let pid = host.pid();
    h.bash_fails(
        "/proc/<pid>/cwd of a host process",
        &format!("echo pwned > /proc/{pid}/cwd/victim.txt"),
    )
    .await;
    h.bash_fails(
        "/proc/<pid>/root of a host process",
        &format!("echo pwned > /proc/{pid}/root{victim}"),
    )
    .await;
    h.assert_victim_untouched("/proc/<pid> of a host process");
    assert!(host.alive_and_running());
}

#[tokio::test]
async fn file_tools_cannot_write_outside() {
    let h = Harness::new().await;
    let victim = h.victim.display().to_string();
    std::os::unix::fs::symlink(&h.victim, h.at("link")).unwrap();
    std::os::unix::fs::symlink(&h.outside, h.at("dir-link")).unwrap();
    let attempts = [
        (
            "write, absolute path",
            "write",
            json!({"path": victim, "content": "pwned"}),
        ),
        (
            "write, .. path",
            "write",
            json!({"path": "../outside/victim.txt", "content": "pwned"}),
        ),
        (
            "write through a symlink",
            "write",
            json!({"path": "link", "content": "pwned"}),
        ),
        (
            "write through a symlinked directory",
            "write",
            json!({"path": "dir-link/new.txt", "content": "pwned"}),
        ),
        (
            "write to the home directory",
            "write",
            json!({"path": "~/.bashrc-cordon-escape", "content": "pwned"}),
        ),
        (
            "edit through a symlink",
            "edit",
            json!({"path": "link", "edits": [{"oldText": "untouched", "newText": "pwned"}]}),
        ),
        (
            "edit, absolute path",
            "edit",
            json!({"path": victim, "edits": [{"oldText": "untouched", "newText": "pwned"}]}),
        ),
    ];
    for (what, tool, arguments) in attempts {
        h.tool_fails(what, tool, arguments).await;
        h.assert_victim_untouched(what);
    }
    assert!(
        !crate::support::host_home()
            .join(".bashrc-cordon-escape")
            .exists()
    );
}

/// A bash loop keeps swapping `target` between a regular file and a symlink to the victim
/// while write and edit calls hit `target`: every call lands in the workspace or fails; the
/// victim never changes.
#[tokio::test]
async fn symlink_swap_races_cannot_redirect_writes() {
    let h = Harness::new().await;
    let swapper = {
        let session = h.session.clone();
        let script = "end=$((SECONDS + 4)); \
                      while [ $SECONDS -lt $end ]; do \
                        ln -sfn ../outside/victim.txt target.tmp && mv -T target.tmp target; \
                        printf 'untouched victim\\n' > plain.tmp && mv -T plain.tmp target; \
                      done; echo swapped";
        tokio::spawn(async move {
            let control = cordon_core::executor::RunControl::new(
                tokio_util::sync::CancellationToken::new(),
                std::sync::Arc::new(|_: cordon_core::event::AgentEvent| {}),
            );
            let call = cordon_core::protocol::ToolCall {
                id: "swapper".into(),
                name: "bash".into(),
                arguments: json!({"command": script, "timeout": 60}),
            };
            session.call(call, &control).await
        })
    };
    let mut landed = 0;
    let mut refused = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline {
        for arguments in [
            json!({"path": "target", "content": "pwned by write\n"}),
            json!({"path": "target", "edits": [{"oldText": "untouched victim", "newText": "pwned by edit"}]}),
        ] {
            let tool = if arguments.get("edits").is_some() {
                "edit"
            } else {
                "write"
            };
            if h.call(tool, arguments).await.is_error {
                refused += 1;
            } else {
                landed += 1;
            }
            h.assert_victim_untouched("write/edit during a symlink swap");
        }
    }
    let swap = swapper.await.unwrap();
    assert!(!swap.is_error, "{}", swap.text());
    assert!(swap.text().contains("swapped"));
    assert!(landed + refused > 0);
    h.assert_victim_untouched("after the symlink swap race");
}

/// Files host programs run later (editor tasks, direnv, shell start-up files, agent
/// configuration) are protected by the default policy: bash cannot change existing ones at
/// any depth (content, mode or times), and the file tools refuse them whether or not they
/// exist.
#[tokio::test(flavor = "multi_thread")]
async fn files_host_programs_run_later_are_read_only() {
    let planted = [
        ".vscode/tasks.json",
        "sub/.envrc",
        "deep/er/.bashrc",
        ".claude/settings.json",
        ".mcp.json",
    ];
    // The operator's files, there when the session starts.
    let h = Harness::with_files(&planted.map(|rel| (rel, "operator\n"))).await;
    let metadata = |rel: &str| {
        let meta = std::fs::metadata(h.at(rel)).unwrap();
        (
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()),
            meta.modified().unwrap(),
        )
    };
    for rel in planted {
        let before = metadata(rel);
        h.bash_fails(rel, &format!("echo evil >> {rel}")).await;
        h.bash_fails(rel, &format!("rm -f {rel} && test ! -e {rel}"))
            .await;
        // Nor their mode or times (a container's command too: they are read-only mounts).
        h.bash_fails(rel, &format!("chmod 777 {rel}")).await;
        h.bash_fails(rel, &format!("touch -d 2001-01-01 {rel}"))
            .await;
        assert_eq!(metadata(rel), before, "{rel}");
        h.tool_fails(rel, "write", json!({"path": rel, "content": "evil\n"}))
            .await;
        assert_eq!(
            std::fs::read_to_string(h.at(rel)).unwrap(),
            "operator\n",
            "{rel}"
        );
    }
    for rel in ["new/.envrc", ".idea/workspace.xml", ".codex/config.toml"] {
        h.tool_fails(rel, "write", json!({"path": rel, "content": "evil\n"}))
            .await;
        assert!(!h.at(rel).exists(), "{rel}");
    }
}
