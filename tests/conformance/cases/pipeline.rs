//! The agent-loop pipeline over a real backend: lookup and validation errors, batches
//! (parallel and sequential), the mutation queue, the length stop, cancellation.

use std::sync::Arc;

use cordon_core::CancellationToken;
use cordon_core::event::AgentEvent;
use cordon_core::protocol::StopReason;
use cordon_core::tool::ExecutionMode;
use cordon_tests::fixtures::{assistant, tool_call};
use cordon_tests::procs::{assert_gone, sleep_marker, wait_for_processes};
use cordon_tests::{Harness, Replayed, Workspace};
use serde_json::json;

pub async fn unknown_tool(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.call("nope", json!({}))
        .await
        .assert_error("Tool nope not found");
}

pub async fn validation_error(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.call("read", json!({})).await.assert_error(
        "Validation failed for tool \"read\":\n  - path: \"path\" is a required property\n\n\
             Received arguments:\n{}",
    );
    ws.call("read", json!({"path": "a.txt", "offset": "abc"}))
        .await
        .assert_error(
            "Validation failed for tool \"read\":\n  - offset: \"abc\" is not of type \
             \"number\"\n\nReceived arguments:\n{\n  \"offset\": \"abc\",\n  \"path\": \"a.txt\"\n}",
        );
}

/// Event labels without the streaming updates (their number depends on timing).
fn trace_without_updates(replayed: &Replayed) -> Vec<String> {
    replayed
        .event_trace()
        .into_iter()
        .filter(|label| !label.starts_with("tool_execution_update"))
        .collect()
}

fn assert_all_ok(replayed: &Replayed) {
    for (result, text) in replayed.results.iter().zip(&replayed.texts) {
        assert!(!result.is_error, "{}: {text}", result.tool_call_id);
    }
}

pub async fn parallel_edits_to_one_file_both_land(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let lines: Vec<String> = (1..=8).map(|i| format!("line {i}\n")).collect();
    ws.put("shared.txt", lines.concat());
    // Eight edits of one file in one parallel batch: the mutation queue serialises them, so
    // every one reads the result of the previous and all land.
    let calls = (1..=8)
        .map(|i| {
            tool_call(
                &format!("e{i}"),
                "edit",
                json!({"path": "shared.txt", "edits": [
                    {"oldText": format!("line {i}\n"), "newText": format!("LINE {i}\n")}
                ]}),
            )
        })
        .collect();
    let replayed = ws
        .replay(vec![assistant(calls)], ExecutionMode::Parallel)
        .await;
    assert_all_ok(&replayed);
    let expected: String = (1..=8).map(|i| format!("LINE {i}\n")).collect();
    assert_eq!(ws.get_text("shared.txt"), expected);
    // Results come back in source order.
    let ids: Vec<&str> = replayed
        .results
        .iter()
        .map(|r| r.tool_call_id.as_str())
        .collect();
    assert_eq!(ids, ["e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8"]);
}

pub async fn queue_keeps_call_order(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    // write then edit of one (new) file in one batch: the edit sees the write.
    let replayed = ws
        .replay(
            vec![assistant(vec![
                tool_call("w", "write", json!({"path": "new.txt", "content": "first\n"})),
                tool_call(
                    "e",
                    "edit",
                    json!({"path": "new.txt", "edits": [{"oldText": "first", "newText": "second"}]}),
                ),
            ])],
            ExecutionMode::Parallel,
        )
        .await;
    assert_eq!(
        replayed.texts,
        [
            "Successfully wrote 6 bytes to new.txt",
            "Successfully replaced 1 block(s) in new.txt."
        ]
    );
    assert_eq!(ws.get_text("new.txt"), "second\n");
    // edit then write: the write lands last. A symlink alias shares the queue.
    ws.symlink("new.txt", "alias.txt");
    let replayed = ws
        .replay(
            vec![assistant(vec![
                tool_call(
                    "e",
                    "edit",
                    json!({"path": "alias.txt", "edits": [{"oldText": "second", "newText": "third"}]}),
                ),
                tool_call("w", "write", json!({"path": "new.txt", "content": "replacement\n"})),
            ])],
            ExecutionMode::Parallel,
        )
        .await;
    assert_all_ok(&replayed);
    assert_eq!(ws.get_text("new.txt"), "replacement\n");
}

pub async fn parallel_end_events_in_completion_order(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    // c1 waits for a file that the test creates only once it has seen c2's end event: only a
    // parallel batch can finish (a sequential one would time out), and c2 ends first whatever
    // the machine's load, because c1 cannot end before that event.
    let released = ws.host("released");
    let replayed = ws
        .replay_observed(
            vec![assistant(vec![
                tool_call(
                    "c1",
                    "bash",
                    json!({"command": "while [ ! -e released ]; do sleep 0.02; done; echo went",
                           "timeout": 120}),
                ),
                tool_call("c2", "write", json!({"path": "go", "content": ""})),
            ])],
            ExecutionMode::Parallel,
            CancellationToken::new(),
            move |event| {
                if matches!(event, AgentEvent::ToolExecutionEnd { tool_call_id, .. } if tool_call_id == "c2")
                {
                    std::fs::write(&released, "").expect("failed to create the release file");
                }
            },
        )
        .await;
    assert_eq!(
        replayed.texts,
        ["went\n", "Successfully wrote 0 bytes to go"]
    );
    assert_eq!(
        trace_without_updates(&replayed),
        [
            "agent_start",
            "turn_start",
            "message_start:assistant",
            "message_end:assistant",
            "tool_execution_start:c1",
            "tool_execution_start:c2",
            "tool_execution_end:c2",
            "tool_execution_end:c1",
            "message_start:toolResult:c1",
            "message_end:toolResult:c1",
            "message_start:toolResult:c2",
            "message_end:toolResult:c2",
            "turn_end",
            "agent_end",
        ]
    );
}

pub async fn sequential_mode_runs_one_at_a_time(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let replayed = ws
        .replay(
            vec![assistant(vec![
                tool_call(
                    "c1",
                    "write",
                    json!({"path": "seq.txt", "content": "one\n"}),
                ),
                tool_call("c2", "read", json!({"path": "seq.txt"})),
            ])],
            ExecutionMode::Sequential,
        )
        .await;
    assert_eq!(
        replayed.texts,
        ["Successfully wrote 4 bytes to seq.txt", "one\n"]
    );
    assert_eq!(
        trace_without_updates(&replayed),
        [
            "agent_start",
            "turn_start",
            "message_start:assistant",
            "message_end:assistant",
            "tool_execution_start:c1",
            "tool_execution_end:c1",
            "tool_execution_start:c2",
            "tool_execution_end:c2",
            "message_start:toolResult:c1",
            "message_end:toolResult:c1",
            "message_start:toolResult:c2",
            "message_end:toolResult:c2",
            "turn_end",
            "agent_end",
        ]
    );
}

pub async fn length_stop_executes_nothing(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let mut message = assistant(vec![
        tool_call("c1", "write", json!({"path": "x.txt", "content": "x"})),
        tool_call("c2", "bash", json!({"command": "touch ran"})),
    ]);
    message.stop_reason = StopReason::Length;
    let replayed = ws.replay(vec![message], ExecutionMode::Parallel).await;
    let refused = |name: &str| {
        format!(
            "Tool call \"{name}\" was not executed: the response hit the output token limit, so \
             its arguments may be truncated. Re-issue the tool call with complete arguments."
        )
    };
    assert_eq!(replayed.texts, [refused("write"), refused("bash")]);
    assert!(replayed.results.iter().all(|r| r.is_error));
    assert!(!ws.exists("x.txt") && !ws.exists("ran"), "nothing ran");
}

pub async fn cancelled_batch_gives_every_call_a_result(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    // Sequential: the running call is killed, the one that never ran still gets a result.
    let marker = sleep_marker();
    let cancel = CancellationToken::new();
    let message = assistant(vec![
        tool_call("c1", "bash", json!({"command": format!("sleep {marker}")})),
        tool_call("c2", "write", json!({"path": "never.txt", "content": "x"})),
    ]);
    let (replayed, ()) = tokio::join!(
        ws.replay_with(vec![message], ExecutionMode::Sequential, cancel.clone()),
        async {
            wait_for_processes(&marker, 1).await;
            cancel.cancel();
        },
    );
    assert_eq!(replayed.texts, ["Command aborted", "Operation aborted"]);
    assert!(replayed.results.iter().all(|r| r.is_error));
    assert!(!ws.exists("never.txt"));
    assert_gone(&marker).await;
    let ends = replayed
        .events
        .iter()
        .filter(|event| matches!(event, AgentEvent::ToolExecutionEnd { .. }))
        .count();
    assert_eq!(ends, 2, "every call gets its end event");

    // Parallel: both running commands are killed and both report it.
    let (first, second) = (sleep_marker(), sleep_marker());
    let cancel = CancellationToken::new();
    let message = assistant(vec![
        tool_call("p1", "bash", json!({"command": format!("sleep {first}")})),
        tool_call("p2", "bash", json!({"command": format!("sleep {second}")})),
    ]);
    let (replayed, ()) = tokio::join!(
        ws.replay_with(vec![message], ExecutionMode::Parallel, cancel.clone()),
        async {
            wait_for_processes(&first, 1).await;
            wait_for_processes(&second, 1).await;
            cancel.cancel();
        },
    );
    assert_eq!(replayed.texts, ["Command aborted", "Command aborted"]);
    assert_gone(&first).await;
    assert_gone(&second).await;
}
