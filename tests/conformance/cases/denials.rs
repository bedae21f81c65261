//! Failed commands explained (docs/semantics.md#explained-denials): a command that fails
//! against the sandbox ends with a note naming what was blocked and the policy entry
//! (`FILE:LINE`) behind it — one case per kind of denial. Policies are written per case (or
//! the built-in default is used) so the lines are known.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use cordon_tests::{Called, Harness, Workspace, WorkspaceOptions};
use serde_json::json;

/// The built-in default policy, as shipped.
const DEFAULT_POLICY: &str = include_str!("../../../policies/default.toml");

/// `builtin:default.toml:LINE` of the first line of the default policy starting with `prefix`.
fn default_line(prefix: &str) -> String {
    let line = DEFAULT_POLICY
        .lines()
        .position(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("the default policy has no line starting with {prefix:?}"));
    format!("builtin:default.toml:{}", line + 1)
}

/// Panics unless `run` failed and its text ends with `note` (after a blank line).
#[track_caller]
fn assert_explained(run: &Called, note: &str) {
    assert!(run.is_error(), "expected a failure, got {run:#?}");
    assert!(
        run.text.ends_with(&format!("\n\n{note}")),
        "expected the result to end with\n{note}\ngot\n{}",
        run.text
    );
    // MCP clients that show the model the structured copy instead of the text show it too.
    let structured = run.structured();
    let last = structured["notes"]
        .as_array()
        .and_then(|notes| notes.last())
        .and_then(|note| note.as_str())
        .unwrap_or_else(|| panic!("no notes in {structured}"));
    assert!(
        last.starts_with("Sandbox: ") && run.result.text().ends_with(&format!("\n\n{last}")),
        "the structured notes end with {last:?}, not with the note the text ends with"
    );
}

/// Panics if any sandbox note is in `run`.
#[track_caller]
fn assert_unexplained(run: &Called) {
    assert!(!run.text.contains("Sandbox: "), "{}", run.text);
}

pub async fn protected_path(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open(&h).await;
    ws.put(".cordon/settings.toml", "x = 1\n");
    // The operator's configuration, there when the session starts.
    ws.restart().await;
    let run = ws
        .call("bash", json!({"command": "touch .cordon/settings.toml"}))
        .await;
    assert_explained(
        &run,
        &format!(
            "Sandbox: $ROOT/.cordon/settings.toml is protected (read-only) by `.cordon/**` in \
             `[filesystem] protect` ({}), so writing it was refused. Leave it unchanged; the \
             operator can remove or narrow that entry.",
            default_line("    \".cordon/**\",")
        ),
    );
    assert_eq!(ws.get_text(".cordon/settings.toml"), "x = 1\n");
    // The same words printed by a command that succeeds, or a failure for another reason,
    // are not explained.
    let run = ws
        .call(
            "bash",
            json!({"command": "echo \"touch: cannot touch '.cordon/settings.toml': Read-only file system\""}),
        )
        .await;
    assert!(!run.is_error());
    assert_unexplained(&run);
    let run = ws
        .call("bash", json!({"command": "cat .cordon/missing"}))
        .await;
    assert!(run.is_error());
    assert_unexplained(&run);
}

pub async fn read_only_path(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let run = ws
        .call("bash", json!({"command": "touch /usr/cordon-denial-probe"}))
        .await;
    assert_explained(
        &run,
        &format!(
            "Sandbox: /usr/cordon-denial-probe is outside the writable paths, which \
             `[filesystem] write` ({}) grants, so writing it was refused. Write inside the \
             workspace instead; the operator can add a glob covering it there.",
            default_line("write = ")
        ),
    );
}

const DENY_POLICY: &str = r#"version = 1
[filesystem]
write = ["**"]
deny = ["secret/**"]
"#;

pub async fn denied_path(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open_with(&h, WorkspaceOptions::policy(DENY_POLICY)).await;
    ws.put("secret/key.txt", "k\n");
    ws.restart().await;
    let run = ws
        .call("bash", json!({"command": "touch secret/new.txt"}))
        .await;
    assert_explained(
        &run,
        "Sandbox: $ROOT/secret/new.txt is denied (neither readable nor writable) by \
         `secret/**` in `[filesystem] deny` ($POLICY:4). Do without it; the operator can \
         remove or narrow that entry.",
    );
    assert!(!ws.exists("secret/new.txt"));
}

/// What a denied directory holds is hidden from commands, and a note must not tell it either:
/// a refusal naming a path inside one (directly, or through a symlink the model made to it)
/// gets the same note whether the entry there is a file, a directory, a symlink out of the
/// directory or nothing at all.
pub async fn denied_contents_do_not_change_the_note(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open_with(&h, WorkspaceOptions::policy(DENY_POLICY)).await;
    ws.put("secret/probe-file", "k\n");
    ws.put("secret/probe-dir/inner", "k\n");
    ws.put("public/x", "p\n");
    ws.symlink("../public", "secret/probe-out");
    ws.symlink("secret", "via");
    ws.restart().await;
    let names = ["probe-file", "probe-dir", "probe-out", "probe-missing"];
    for prefix in ["secret", "via"] {
        let mut seen: Vec<(String, String)> = Vec::new();
        for name in names {
            let run = ws
                .call(
                    "bash",
                    json!({"command": format!("echo \"cat: '{prefix}/{name}/x': Permission denied\" >&2; exit 1")}),
                )
                .await;
            assert!(run.is_error(), "{run:#?}");
            seen.push((name.to_owned(), run.text.replace(name, "NAME")));
        }
        let (first, text) = &seen[0];
        for (name, other) in &seen[1..] {
            assert_eq!(
                text, other,
                "{prefix}/{first} and {prefix}/{name} are explained differently"
            );
        }
    }
}

const READ_ONLY_POLICY: &str = r#"version = 1
[filesystem]
write = []
protect = ["guarded"]
"#;

/// In a read-only workspace a refused write is explained, but a file the host's own
/// permissions refuse (mode 000: nobody without capabilities may read it) is not blamed on
/// `[filesystem] write` or `protect`: the command did not write, and the sandbox is not why
/// it failed.
/// (Local only: the local backend judges the mode bits on the host.)
pub async fn host_permissions_are_not_blamed_on_the_sandbox(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open_with(&h, WorkspaceOptions::policy(READ_ONLY_POLICY)).await;
    for name in ["unreadable", "guarded"] {
        ws.put(name, "s\n");
        std::fs::set_permissions(ws.host(name), std::fs::Permissions::from_mode(0o000))
            .expect("failed to chmod the probe");
    }
    ws.restart().await;
    let run = ws.call("bash", json!({"command": "touch new.txt"})).await;
    assert_explained(
        &run,
        "Sandbox: $ROOT/new.txt is outside the writable paths, which `[filesystem] write` \
         ($POLICY:3) grants, so writing it was refused. Write inside the workspace instead; \
         the operator can add a glob covering it there.",
    );
    for name in ["unreadable", "guarded"] {
        let run = ws
            .call("bash", json!({"command": format!("cat {name}")}))
            .await;
        assert!(run.is_error(), "{run:#?}");
        assert!(run.text.contains("Permission denied"), "{}", run.text);
        assert_unexplained(&run);
    }
}

pub async fn network_off(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    // TEST-NET-1: never routed, whatever the host's network.
    let run = ws
        .call("bash", json!({"command": "exec 3<>/dev/tcp/192.0.2.1/80"}))
        .await;
    assert_explained(
        &run,
        &format!(
            "Sandbox: commands have no network, set by `[network] enabled` ({}). Nothing can \
             be downloaded or reached; the operator can set `enabled = true`.",
            default_line("enabled = false")
        ),
    );
}

const LIMITS_POLICY: &str = r#"version = 1
[filesystem]
write = ["**"]
[limits]
timeout = 1
file_size = "1MiB"
memory = "64MiB"
"#;

/// Room for the backend's own processes (a container's init and workers count too).
const PIDS_POLICY: &str = r#"version = 1
[filesystem]
write = ["**"]
[limits]
pids = 32
"#;

pub async fn timeout(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(LIMITS_POLICY)).await;
    let run = ws.call("bash", json!({"command": "sleep 30"})).await;
    assert_explained(
        &run,
        "Sandbox: the command was stopped at the default timeout of 1 s, set by `[limits] \
         timeout` ($POLICY:5). Pass a larger `timeout` (at most 1800 s, `[limits] max_timeout` \
         ($POLICY, not set there: the built-in default)) or run less at once; the operator can \
         raise the limits.",
    );
}

pub async fn file_size(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(LIMITS_POLICY)).await;
    let run = ws
        .call(
            "bash",
            json!({"command": "head -c 2000000 /dev/zero > big.bin", "timeout": 60}),
        )
        .await;
    assert_explained(
        &run,
        "Sandbox: the command hit the file size limit of 1 MiB, set by `[limits] file_size` \
         ($POLICY:6). Write smaller files; the operator can raise that limit.",
    );
}

pub async fn memory(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(LIMITS_POLICY)).await;
    // `tail` keeps a file without newlines in memory: /dev/zero never ends.
    let run = ws
        .call("bash", json!({"command": "tail /dev/zero", "timeout": 60}))
        .await;
    assert_explained(
        &run,
        "Sandbox: the command ran out of memory under the limit of 64 MiB per command, set by \
         `[limits] memory` ($POLICY:7). Use less memory at once; the operator can raise that \
         limit.",
    );
}

pub async fn pids(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(PIDS_POLICY)).await;
    // More processes than the limit, none of which ends while the others start; bash retries
    // a refused fork with growing pauses, so the call's own timeout ends it (and gets its
    // own note before this one).
    let run = ws
        .call(
            "bash",
            json!({"command": "for i in $(seq 400); do sleep 30 & done; wait", "timeout": 3}),
        )
        .await;
    assert_explained(
        &run,
        "Sandbox: the command could not start another process: the limit is 32 processes, set \
         by `[limits] pids` ($POLICY:5). Run fewer processes at once; the operator can raise \
         that limit.",
    );
}

/// A backend without a sandbox (SSH, which runs commands only with `allow_degraded`) has no
/// layout to match against: the same failure gets no note.
pub async fn nothing_is_explained_without_a_sandbox(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let run = ws
        .call(
            "bash",
            json!({"command": "echo \"touch: cannot touch '.git/config': Read-only file system\" >&2; exit 1"}),
        )
        .await;
    run.assert_error(
        "touch: cannot touch '.git/config': Read-only file system\n\n\nCommand exited with code 1",
    );
    let run = ws
        .call("bash", json!({"command": "sleep 5", "timeout": 0.2}))
        .await;
    run.assert_error("Command timed out after 0.2 seconds");
}
