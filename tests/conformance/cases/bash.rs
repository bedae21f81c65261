//! `bash`: merged output, exit codes, sanitising, timeouts and cancellation that leave no
//! process behind, tail truncation with a spill file the `read` tool can open (also from a
//! later session), structured content.

use std::sync::Arc;

use cordon_core::CancellationToken;
use cordon_core::event::AgentEvent;
use cordon_tests::fixtures::numbered_range;
use cordon_tests::procs::{assert_gone, sleep_marker, wait_for_processes};
use cordon_tests::{Harness, Workspace, WorkspaceOptions};
use serde_json::{Value, json};

/// `builtin:default.toml:LINE` of `max_timeout` in the default policy, as shipped.
fn max_timeout_line() -> String {
    let line = include_str!("../../../policies/default.toml")
        .lines()
        .position(|line| line.starts_with("max_timeout"))
        .expect("the default policy sets max_timeout");
    format!("builtin:default.toml:{}", line + 1)
}

pub async fn merged_output_and_structured_content(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let run = ws
        .call(
            "bash",
            json!({"command": "echo out; echo err >&2; echo out2"}),
        )
        .await;
    run.assert_ok("out\nerr\nout2\n");
    assert_eq!(run.details(), Value::Null);
    assert_eq!(
        run.structured(),
        json!({"output": "out\nerr\nout2\n", "exitCode": 0, "truncated": false,
               "fullOutputPath": null, "notes": []})
    );
    // Multi-byte characters survive the stream.
    ws.call(
        "bash",
        json!({"command": "printf 'h\\303\\251 \\342\\202\\254\\n'"}),
    )
    .await
    .assert_ok("hé €\n");
}

pub async fn no_output(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let run = ws.call("bash", json!({"command": "true"})).await;
    run.assert_ok("(no output)");
    assert_eq!(run.structured()["output"], json!(""));
    assert_eq!(run.structured()["exitCode"], json!(0));
}

pub async fn runs_in_workspace_root(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("marker.txt", "here\n");
    ws.call("bash", json!({"command": "pwd; cat marker.txt"}))
        .await
        .assert_ok("$ROOT\nhere\n");
    // stdin is closed: a command reading it sees end-of-file instead of hanging.
    ws.call("bash", json!({"command": "cat; echo done"}))
        .await
        .assert_ok("done\n");
}

pub async fn exit_code(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let run = ws
        .call("bash", json!({"command": "echo out; exit 3"}))
        .await;
    run.assert_error("out\n\n\nCommand exited with code 3");
    assert_eq!(
        run.structured(),
        json!({"output": "out\n", "exitCode": 3, "truncated": false, "fullOutputPath": null,
               "notes": []})
    );
    ws.call("bash", json!({"command": "exit 1"}))
        .await
        .assert_error("Command exited with code 1");
}

pub async fn killed_by_signal(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let run = ws.call("bash", json!({"command": "kill -9 $$"})).await;
    run.assert_error("Command exited with code 137 (killed by signal 9)");
    assert_eq!(run.structured()["exitCode"], json!(137));
}

pub async fn strips_ansi_and_control_characters(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let run = ws
        .call(
            "bash",
            json!({"command": "printf '\\033[31mred\\033[0m\\r\\n\\007bell\\n'"}),
        )
        .await;
    run.assert_ok("red\nbell\n");
    assert_eq!(run.structured()["output"], json!("red\nbell\n"));
}

pub async fn file_changes_visible_to_file_tools(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.call(
        "bash",
        json!({"command": "mkdir -p gen && printf 'made\\n' > gen/made.txt"}),
    )
    .await
    .assert_ok("(no output)");
    ws.call("read", json!({"path": "gen/made.txt"}))
        .await
        .assert_ok("made\n");
    assert_eq!(ws.get_text("gen/made.txt"), "made\n");
    ws.call(
        "write",
        json!({"path": "gen/back.txt", "content": "from write\n"}),
    )
    .await
    .assert_ok("Successfully wrote 11 bytes to gen/back.txt");
    ws.call("bash", json!({"command": "cat gen/back.txt"}))
        .await
        .assert_ok("from write\n");
}

pub async fn timeout_kills_process_tree(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let marker = sleep_marker();
    // A background child and the foreground command; both must be gone after the timeout.
    let command = format!("echo before; sleep {marker} & sleep {marker}");
    let (run, ()) = tokio::join!(
        ws.call("bash", json!({"command": command, "timeout": 5})),
        wait_for_processes(&marker, 2),
    );
    // The note explaining the timeout comes from the sandbox, which SSH runs without.
    let note = match ws.backend_name() {
        "ssh" => String::new(),
        _ => format!(
            "\n\nSandbox: the command was stopped at the timeout of 5 s it was given. Pass a \
             larger `timeout` (at most 1800 s, `[limits] max_timeout` ({})).",
            max_timeout_line()
        ),
    };
    run.assert_error(&format!(
        "before\n\n\nCommand timed out after 5 seconds{note}"
    ));
    assert_eq!(run.structured()["output"], json!("before\n"));
    assert_eq!(
        run.structured()["exitCode"],
        json!(143),
        "SIGTERM ends the shell"
    );
    assert_gone(&marker).await;
}

pub async fn cancel_kills_process_tree(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let marker = sleep_marker();
    let command = format!("echo started; sleep {marker} & sleep {marker}");
    let cancel = CancellationToken::new();
    let (run, ()) = tokio::join!(
        ws.call_with("bash", json!({ "command": command }), cancel.clone()),
        async {
            wait_for_processes(&marker, 2).await;
            cancel.cancel();
        },
    );
    run.assert_error("started\n\n\nCommand aborted");
    assert_gone(&marker).await;
}

/// The full-output path from a truncated result: in the footer, `details` and structured
/// content alike.
fn spill_path(run: &cordon_tests::Called) -> String {
    let path = run.details()["fullOutputPath"]
        .as_str()
        .unwrap_or_else(|| panic!("no fullOutputPath in details: {run:#?}"))
        .to_owned();
    assert_eq!(run.structured()["fullOutputPath"], json!(path));
    assert_eq!(run.structured()["truncated"], json!(true));
    path
}

pub async fn spill_file_readable_with_read(h: Arc<dyn Harness>) {
    let mut ws = Workspace::open(&h).await;
    let run = ws.call("bash", json!({"command": "seq 1 5000"})).await;
    let path = spill_path(&run);
    run.assert_ok(&format!(
        "{}\n[Showing lines 3001-5000 of 5000. Full output: {path}]",
        numbered_range("", 3001, 5000)
    ));
    let truncation = &run.details()["truncation"];
    assert_eq!(truncation["truncatedBy"], json!("lines"));
    assert_eq!(truncation["totalLines"], json!(5000));
    assert_eq!(truncation["outputLines"], json!(2000));
    // The model can open the full output with `read`, on the same backend…
    ws.call("read", json!({ "path": path }))
        .await
        .assert_ok(&format!(
            "{}\n[Showing lines 1-2000 of 5000. Use offset=2001 to continue.]",
            numbered_range("", 1, 2000)
        ));
    // …and still from a later session on the same root.
    ws.restart().await;
    ws.call("read", json!({"path": path, "offset": 4991}))
        .await
        .assert_ok(&numbered_range("", 4991, 5000));
}

pub async fn spill_file_on_error_result(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let run = ws
        .call("bash", json!({"command": "seq 1 3000; exit 2"}))
        .await;
    let path = spill_path(&run);
    run.assert_error(&format!(
        "{}\n[Showing lines 1001-3000 of 3000. Full output: {path}]\n\nCommand exited with code 2",
        numbered_range("", 1001, 3000)
    ));
    assert_eq!(run.structured()["exitCode"], json!(2));
    ws.call("read", json!({"path": path, "offset": 2999}))
        .await
        .assert_ok("2999\n3000\n");
    // Truncated by bytes: one long line, the footer states the partial line.
    let run = ws
        .call("bash", json!({"command": "printf '%060000d' 0"}))
        .await;
    let path = spill_path(&run);
    assert!(
        run.text.ends_with(&format!(
            "\n\n[Showing last 50.0KB of line 1 (line is 58.6KB). Full output: {path}]"
        )),
        "{run:#?}"
    );
}

pub async fn invalid_timeout(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.call("bash", json!({"command": "touch ran", "timeout": 0}))
        .await
        .assert_error(
            "Invalid timeout: must be a finite number of seconds greater than 0 (got 0). Omit \
             timeout to use the default of 120 seconds.",
        );
    assert!(!ws.exists("ran"), "the command did not run");
}

pub async fn streams_partial_updates(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let run = ws
        .call("bash", json!({"command": "echo one; echo two"}))
        .await;
    run.assert_ok("one\ntwo\n");
    let updates: Vec<(usize, String)> = run
        .events
        .iter()
        .enumerate()
        .filter_map(|(index, event)| match event {
            AgentEvent::ToolExecutionUpdate { partial_result, .. } => Some((
                index,
                partial_result
                    .content
                    .iter()
                    .filter_map(|block| block.as_text())
                    .collect(),
            )),
            _ => None,
        })
        .collect();
    let end = run
        .events
        .iter()
        .position(|event| matches!(event, AgentEvent::ToolExecutionEnd { .. }))
        .expect("an end event");
    let (last_index, last_text) = updates.last().expect("at least one partial update");
    assert!(*last_index < end, "updates come before the end event");
    assert_eq!(
        last_text, "one\ntwo\n",
        "the last update holds the whole output"
    );
}

const SHORT_LIMITS: &str = r#"version = 1

[limits]
timeout = 1
max_timeout = 2
"#;

pub async fn timeout_clamped_to_policy_maximum(h: Arc<dyn Harness>) {
    let ws = Workspace::open_with(&h, WorkspaceOptions::policy(SHORT_LIMITS)).await;
    // The policy's default applies when the model gives none…
    let marker = sleep_marker();
    let run = ws
        .call("bash", json!({"command": format!("sleep {marker}")}))
        .await;
    let explained = |note: &str| match ws.backend_name() {
        "ssh" => String::new(),
        _ => format!("\n\nSandbox: {note}"),
    };
    run.assert_error(&format!(
        "Command timed out after 1 seconds{}",
        explained(
            "the command was stopped at the default timeout of 1 s, set by `[limits] timeout` \
             ($POLICY:4). Pass a larger `timeout` (at most 2 s, `[limits] max_timeout` \
             ($POLICY:5)) or run less at once; the operator can raise the limits."
        )
    ));
    assert_gone(&marker).await;
    // …and a larger request is clamped to its maximum, which the details state.
    let marker = sleep_marker();
    let run = ws
        .call(
            "bash",
            json!({"command": format!("sleep {marker}"), "timeout": 600}),
        )
        .await;
    run.assert_error(&format!(
        "Command timed out after 2 seconds{}",
        explained(
            "the command was stopped at the maximum timeout of 2 s, set by `[limits] \
             max_timeout` ($POLICY:5). Run less at once; the operator can raise that limit."
        )
    ));
    assert_eq!(run.details()["timeoutClampedTo"], json!(2));
    assert_gone(&marker).await;
}
