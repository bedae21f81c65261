//! Batch rules (docs/semantics.md#batches): ordering, modes, preflight, hooks, updates,
//! cancellation, failures.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cordon_core::event::AgentEvent;
use cordon_core::executor::{BatchOutcome, RunControl, ToolBatch, execute_tool_calls};
use cordon_core::hooks::{BeforeOutcome, NoHooks, ResultOverride, ToolHooks};
use cordon_core::protocol::{AssistantMessage, Content, Message, StopReason, UserMessage};
use cordon_core::provider::ModelProvider;
use cordon_core::testing::ScriptedProvider;
use cordon_core::tool::{AgentTool, AgentToolResult, ExecutionMode, UpdateCallback};
use cordon_core::{Agent, AgentConfig, CancellationToken};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::support::{
    FnHooks, FnTool, Recorder, answer, assistant, call, calls, lock, roles, text_of, tool_results,
    tools, within,
};

async fn run_batch(
    tools: Vec<Arc<dyn AgentTool>>,
    hooks: &dyn ToolHooks,
    mode: ExecutionMode,
    message: &AssistantMessage,
    control: &RunControl,
) -> BatchOutcome {
    let context = vec![Message::Assistant(message.clone())];
    within(
        "batch",
        execute_tool_calls(ToolBatch {
            tools: &tools,
            hooks,
            mode,
            assistant_message: message,
            context: &context,
            control,
        }),
    )
    .await
}

async fn run_agent(
    config: AgentConfig,
    provider: &Arc<ScriptedProvider>,
    control: &RunControl,
) -> Vec<Message> {
    let agent = Agent::new(config, Arc::clone(provider) as Arc<dyn ModelProvider>);
    within(
        "agent run",
        agent.prompt(&[], UserMessage::text("go"), control),
    )
    .await
}

fn position(kinds: &[(usize, &AgentEvent)], pred: impl Fn(&AgentEvent) -> bool) -> Vec<usize> {
    kinds
        .iter()
        .filter(|(_, event)| pred(event))
        .map(|(index, _)| *index)
        .collect()
}

#[tokio::test]
async fn end_events_follow_completion_but_results_and_context_follow_source_order() {
    // call-1 cannot finish before call-2 has finished: completion order is [2, 1].
    let fast_done = Arc::new(Notify::new());
    let slow = {
        let fast_done = Arc::clone(&fast_done);
        FnTool::new("slow", move |_| {
            let fast_done = Arc::clone(&fast_done);
            async move {
                fast_done.notified().await;
                Ok(AgentToolResult::text("slow done"))
            }
        })
        .arc()
    };
    let fast = {
        let fast_done = Arc::clone(&fast_done);
        FnTool::new("fast", move |_| {
            let fast_done = Arc::clone(&fast_done);
            async move {
                fast_done.notify_one();
                Ok(AgentToolResult::text("fast done"))
            }
        })
        .arc()
    };
    let provider = Arc::new(ScriptedProvider::replies([
        calls(vec![
            call("call-1", "slow", json!({})),
            call("call-2", "fast", json!({})),
        ]),
        answer("done"),
    ]));
    let recorder = Recorder::default();
    let config = AgentConfig {
        tools: tools(&[&slow, &fast]),
        ..Default::default()
    };
    let added = run_agent(config, &provider, &recorder.control()).await;

    assert_eq!(recorder.end_order(), ["call-2", "call-1"]);
    assert_eq!(recorder.result_message_order(), ["call-1", "call-2"]);
    let turn_end_ids: Vec<Vec<String>> = recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            AgentEvent::TurnEnd { tool_results, .. } => Some(
                tool_results
                    .into_iter()
                    .map(|result| result.tool_call_id)
                    .collect(),
            ),
            _ => None,
        })
        .collect();
    assert_eq!(turn_end_ids, vec![vec!["call-1", "call-2"], vec![]]);
    // Context of the second model call, and the run's messages, in source order.
    let second = &provider.requests()[1].messages;
    assert_eq!(
        roles(second),
        ["user", "assistant", "toolResult", "toolResult"]
    );
    let ids: Vec<_> = tool_results(second)
        .into_iter()
        .map(|r| (r.tool_call_id, r.content))
        .collect();
    assert_eq!(
        ids,
        [
            ("call-1".to_owned(), vec![Content::text("slow done")]),
            ("call-2".to_owned(), vec![Content::text("fast done")]),
        ]
    );
    assert_eq!(
        roles(&added),
        ["user", "assistant", "toolResult", "toolResult", "assistant"]
    );
    // Result messages only after the whole batch.
    let events = recorder.events();
    let indexed: Vec<_> = events.iter().enumerate().collect();
    let last_end = *position(&indexed, |e| e.kind() == "tool_execution_end")
        .last()
        .unwrap();
    let first_result = position(&indexed, |e| {
        matches!(
            e,
            AgentEvent::MessageStart {
                message: Message::ToolResult(_)
            }
        )
    })[0];
    assert!(first_result > last_end, "{:?}", recorder.kinds());
}

/// Tracks how many tool executions overlap.
#[derive(Default)]
struct Overlap {
    running: AtomicUsize,
    max: AtomicUsize,
    order: Mutex<Vec<String>>,
}

fn overlap_tool(name: &str, overlap: &Arc<Overlap>) -> FnTool {
    let overlap = Arc::clone(overlap);
    let label = name.to_owned();
    FnTool::new(name, move |_| {
        let overlap = Arc::clone(&overlap);
        let label = label.clone();
        async move {
            let now = overlap.running.fetch_add(1, Ordering::SeqCst) + 1;
            overlap.max.fetch_max(now, Ordering::SeqCst);
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            overlap.running.fetch_sub(1, Ordering::SeqCst);
            lock(&overlap.order).push(label);
            Ok(AgentToolResult::text("ok"))
        }
    })
}

fn two_calls(first: &str, second: &str) -> AssistantMessage {
    calls(vec![
        call("c1", first, json!({})),
        call("c2", second, json!({})),
    ])
}

#[tokio::test]
async fn parallel_batch_overlaps_executions() {
    let overlap = Arc::new(Overlap::default());
    let a = overlap_tool("a", &overlap).arc();
    let b = overlap_tool("b", &overlap).arc();
    let recorder = Recorder::default();
    run_batch(
        tools(&[&a, &b]),
        &NoHooks,
        ExecutionMode::Parallel,
        &two_calls("a", "b"),
        &recorder.control(),
    )
    .await;
    assert_eq!(overlap.max.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn one_sequential_tool_forces_the_whole_batch_sequential() {
    let overlap = Arc::new(Overlap::default());
    let slow_sequential = overlap_tool("slow", &overlap).sequential().arc();
    let fast = overlap_tool("fast", &overlap).arc();
    let recorder = Recorder::default();
    let outcome = run_batch(
        tools(&[&slow_sequential, &fast]),
        &NoHooks,
        ExecutionMode::Parallel,
        &two_calls("slow", "fast"),
        &recorder.control(),
    )
    .await;
    assert_eq!(overlap.max.load(Ordering::SeqCst), 1);
    assert_eq!(*lock(&overlap.order), ["slow", "fast"]);
    assert_eq!(recorder.end_order(), ["c1", "c2"]);
    assert_eq!(outcome.results.len(), 2);
    // Sequential: each call starts only after the previous one ended.
    assert_eq!(
        recorder.kinds()[..4],
        [
            "tool_execution_start",
            "tool_execution_end",
            "tool_execution_start",
            "tool_execution_end"
        ]
    );
}

#[tokio::test]
async fn sequential_configuration_forces_sequential_execution() {
    let overlap = Arc::new(Overlap::default());
    let a = overlap_tool("a", &overlap).arc();
    let b = overlap_tool("b", &overlap).arc();
    run_batch(
        tools(&[&a, &b]),
        &NoHooks,
        ExecutionMode::Sequential,
        &two_calls("a", "b"),
        &Recorder::default().control(),
    )
    .await;
    assert_eq!(overlap.max.load(Ordering::SeqCst), 1);
    assert_eq!(*lock(&overlap.order), ["a", "b"]);
}

fn terminating(name: &str, terminate: bool) -> Arc<FnTool> {
    FnTool::new(name, move |_| async move {
        let mut result = AgentToolResult::text("done");
        result.terminate = terminate;
        Ok(result)
    })
    .arc()
}

#[tokio::test]
async fn batch_where_every_result_terminates_stops_the_run() {
    let a = terminating("a", true);
    let b = terminating("b", true);
    let provider = Arc::new(ScriptedProvider::replies([
        two_calls("a", "b"),
        answer("never"),
    ]));
    let recorder = Recorder::default();
    let config = AgentConfig {
        tools: tools(&[&a, &b]),
        ..Default::default()
    };
    let added = run_agent(config, &provider, &recorder.control()).await;
    assert_eq!(provider.calls(), 1);
    assert_eq!(
        roles(&added),
        ["user", "assistant", "toolResult", "toolResult"]
    );
    let turn_ends = recorder
        .kinds()
        .iter()
        .filter(|k| **k == "turn_end")
        .count();
    assert_eq!(turn_ends, 1);
}

#[tokio::test]
async fn mixed_batch_continues_the_run() {
    let a = terminating("a", true);
    let b = terminating("b", false);
    let provider = Arc::new(ScriptedProvider::replies([
        two_calls("a", "b"),
        answer("next"),
    ]));
    let config = AgentConfig {
        tools: tools(&[&a, &b]),
        ..Default::default()
    };
    let added = run_agent(config, &provider, &Recorder::default().control()).await;
    assert_eq!(provider.calls(), 2);
    assert_eq!(
        roles(&added),
        ["user", "assistant", "toolResult", "toolResult", "assistant"]
    );
}

#[tokio::test]
async fn blocked_call_with_terminate_stops_alone_but_not_in_a_mixed_batch() {
    let hooks = || {
        Arc::new(FnHooks::default().before(|call, _, _| {
            Ok(if call.id == "c1" {
                BeforeOutcome::Block {
                    reason: Some("Blocked by policy".into()),
                    terminate: true,
                }
            } else {
                BeforeOutcome::Continue
            })
        }))
    };
    // Alone: the run stops after the blocked call.
    let first = FnTool::ok("first").arc();
    let provider = Arc::new(ScriptedProvider::replies([
        calls(vec![call("c1", "first", json!({}))]),
        answer("never"),
    ]));
    let config = AgentConfig {
        tools: tools(&[&first]),
        hooks: hooks(),
        ..Default::default()
    };
    let added = run_agent(config, &provider, &Recorder::default().control()).await;
    assert_eq!(provider.calls(), 1);
    assert!(first.executed().is_empty());
    let results = tool_results(&added);
    assert!(results[0].is_error);
    assert_eq!(results[0].content, vec![Content::text("Blocked by policy")]);

    // Mixed with an executed call: the run goes on.
    let first = FnTool::ok("first").arc();
    let second = FnTool::ok("second").arc();
    let provider = Arc::new(ScriptedProvider::replies([
        two_calls("first", "second"),
        answer("next"),
    ]));
    let config = AgentConfig {
        tools: tools(&[&first, &second]),
        hooks: hooks(),
        ..Default::default()
    };
    run_agent(config, &provider, &Recorder::default().control()).await;
    assert_eq!(provider.calls(), 2);
    assert!(first.executed().is_empty());
    assert_eq!(second.executed().len(), 1);
}

#[tokio::test]
async fn after_hook_can_mark_the_batch_terminating() {
    let tool = FnTool::ok("t").arc();
    let provider = Arc::new(ScriptedProvider::replies([
        calls(vec![call("c1", "t", json!({}))]),
        answer("never"),
    ]));
    let config = AgentConfig {
        tools: tools(&[&tool]),
        hooks: Arc::new(FnHooks::default().after(|_, _| {
            Ok(ResultOverride {
                terminate: Some(true),
                ..Default::default()
            })
        })),
        ..Default::default()
    };
    run_agent(config, &provider, &Recorder::default().control()).await;
    assert_eq!(provider.calls(), 1);
}

#[tokio::test]
async fn length_stopped_message_executes_nothing_and_the_loop_calls_the_model_again() {
    let tool = FnTool::ok("write").arc();
    let provider = Arc::new(ScriptedProvider::replies([
        assistant(
            vec![
                call("c1", "write", json!({"path": "a"})),
                call("c2", "write", json!({"path": "b", "content": "trunc"})),
            ],
            StopReason::Length,
        ),
        answer("retrying later"),
    ]));
    let recorder = Recorder::default();
    let config = AgentConfig {
        tools: tools(&[&tool]),
        ..Default::default()
    };
    let added = run_agent(config, &provider, &recorder.control()).await;
    assert!(tool.executed().is_empty());
    assert_eq!(provider.calls(), 2);
    let expected = "Tool call \"write\" was not executed: the response hit the output token \
                    limit, so its arguments may be truncated. Re-issue the tool call with \
                    complete arguments.";
    assert_eq!(
        recorder.ends(),
        [
            ("c1".to_owned(), true, expected.to_owned()),
            ("c2".to_owned(), true, expected.to_owned())
        ]
    );
    let results = tool_results(&added);
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|r| r.is_error && r.text() == expected));
    assert_eq!(
        roles(&added),
        ["user", "assistant", "toolResult", "toolResult", "assistant"]
    );
    let kinds = recorder.kinds();
    let batch: Vec<_> = kinds
        .iter()
        .filter(|k| k.starts_with("tool_execution"))
        .collect();
    assert_eq!(
        batch,
        [
            &"tool_execution_start",
            &"tool_execution_end",
            &"tool_execution_start",
            &"tool_execution_end"
        ]
    );
}

#[tokio::test]
async fn unknown_tool_gets_an_error_result() {
    let known = FnTool::ok("read").arc();
    let recorder = Recorder::default();
    let outcome = run_batch(
        tools(&[&known]),
        &NoHooks,
        ExecutionMode::Parallel,
        &two_calls("nope", "read"),
        &recorder.control(),
    )
    .await;
    assert!(outcome.results[0].is_error);
    assert_eq!(outcome.results[0].text(), "Tool nope not found");
    assert!(!outcome.results[1].is_error);
    assert!(!outcome.terminate);
}

fn read_schema() -> Value {
    json!({"type":"object","required":["path"],"properties":{
        "path":{"type":"string"},"offset":{"type":"number"},"limit":{"type":"number"}}})
}

#[tokio::test]
async fn validation_error_lists_every_violation_and_the_received_arguments() {
    let read = FnTool::ok("read").schema(read_schema()).arc();
    let message = calls(vec![call(
        "c1",
        "read",
        json!({"offset": "abc", "limit": [1]}),
    )]);
    let outcome = run_batch(
        tools(&[&read]),
        &NoHooks,
        ExecutionMode::Parallel,
        &message,
        &Recorder::default().control(),
    )
    .await;
    assert!(read.executed().is_empty());
    assert!(outcome.results[0].is_error);
    assert_eq!(
        outcome.results[0].text(),
        concat!(
            "Validation failed for tool \"read\":\n",
            "  - path: \"path\" is a required property\n",
            "  - limit: [1] is not of type \"number\"\n",
            "  - offset: \"abc\" is not of type \"number\"\n",
            "\n",
            "Received arguments:\n",
            "{\n  \"limit\": [\n    1\n  ],\n  \"offset\": \"abc\"\n}"
        )
    );
}

#[tokio::test]
async fn coerced_arguments_reach_execute() {
    let read = FnTool::ok("read").schema(read_schema()).arc();
    let message = calls(vec![call(
        "c1",
        "read",
        json!({"path": 7, "offset": "5", "limit": null}),
    )]);
    run_batch(
        tools(&[&read]),
        &NoHooks,
        ExecutionMode::Parallel,
        &message,
        &Recorder::default().control(),
    )
    .await;
    assert_eq!(read.executed(), [json!({"path": "7", "offset": 5})]);
}

#[tokio::test]
async fn prepare_arguments_runs_before_validation() {
    let edit = FnTool::ok("edit")
        .schema(json!({"type":"object","required":["edits"],"properties":{
            "edits":{"type":"array","items":{"type":"object","required":["oldText","newText"]}}}}))
        .prepare(|mut args| {
            if let Some(object) = args.as_object_mut()
                && let (Some(old), Some(new)) = (object.remove("oldText"), object.remove("newText"))
            {
                object.insert("edits".into(), json!([{"oldText": old, "newText": new}]));
            }
            args
        })
        .arc();
    let message = calls(vec![call(
        "c1",
        "edit",
        json!({"oldText": "before", "newText": "after"}),
    )]);
    let recorder = Recorder::default();
    let outcome = run_batch(
        tools(&[&edit]),
        &NoHooks,
        ExecutionMode::Parallel,
        &message,
        &recorder.control(),
    )
    .await;
    assert!(
        !outcome.results[0].is_error,
        "{}",
        outcome.results[0].text()
    );
    assert_eq!(
        edit.executed(),
        [json!({"edits": [{"oldText": "before", "newText": "after"}]})]
    );
    // The start event carries the raw arguments as the model sent them.
    assert!(recorder.events().contains(&AgentEvent::ToolExecutionStart {
        tool_call_id: "c1".into(),
        tool_name: "edit".into(),
        args: json!({"oldText": "before", "newText": "after"}),
    }));
}

#[tokio::test]
async fn arguments_mutated_by_the_before_hook_reach_execute_unvalidated() {
    let tool = FnTool::ok("t")
        .schema(
            json!({"type":"object","required":["value"],"properties":{"value":{"type":"string"}}}),
        )
        .arc();
    let hooks = FnHooks::default().before(|_, args, _| {
        args["value"] = json!(123);
        Ok(BeforeOutcome::Continue)
    });
    let outcome = run_batch(
        tools(&[&tool]),
        &hooks,
        ExecutionMode::Parallel,
        &calls(vec![call("c1", "t", json!({"value": "hello"}))]),
        &Recorder::default().control(),
    )
    .await;
    assert!(!outcome.results[0].is_error);
    assert_eq!(tool.executed(), [json!({"value": 123})]);
}

#[tokio::test]
async fn blocked_call_never_executes_and_the_model_reads_the_reason() {
    let bash = FnTool::ok("bash").arc();
    let hooks = Arc::new(FnHooks::default().before(|call, _, context| {
        // Hooks see the conversation including the assistant message being executed.
        assert!(matches!(context.last(), Some(Message::Assistant(_))));
        Ok(BeforeOutcome::Block {
            reason: (call.id == "c1").then(|| "pushing is done by CI".to_owned()),
            terminate: false,
        })
    }));
    let provider = Arc::new(ScriptedProvider::replies([
        two_calls("bash", "bash"),
        answer("ok"),
    ]));
    let config = AgentConfig {
        tools: tools(&[&bash]),
        hooks,
        ..Default::default()
    };
    run_agent(config, &provider, &Recorder::default().control()).await;
    assert!(bash.executed().is_empty());
    let seen = tool_results(&provider.requests()[1].messages);
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|r| r.is_error));
    assert_eq!(seen[0].text(), "pushing is done by CI");
    assert_eq!(seen[1].text(), "Tool execution was blocked");
}

#[tokio::test]
async fn after_hook_overrides_field_by_field() {
    let tool = FnTool::new("t", |_| async {
        Ok(AgentToolResult::text("original")
            .with_details(json!({"d": 1}))
            .with_structured_content(json!({"output": "original"})))
    })
    .arc();
    let hooks = FnHooks::default().after(|call, result| {
        assert_eq!(text_of(result), "original");
        Ok(match call.id.as_str() {
            "details" => ResultOverride {
                details: Some(Some(json!({"replaced": true}))),
                ..Default::default()
            },
            "content" => ResultOverride {
                content: Some(vec![Content::text("[redacted]")]),
                ..Default::default()
            },
            _ => ResultOverride {
                is_error: Some(true),
                ..Default::default()
            },
        })
    });
    let message = calls(vec![
        call("details", "t", json!({})),
        call("content", "t", json!({})),
        call("flag", "t", json!({})),
    ]);
    let recorder = Recorder::default();
    let outcome = run_batch(
        tools(&[&tool]),
        &hooks,
        ExecutionMode::Parallel,
        &message,
        &recorder.control(),
    )
    .await;
    let [details, content, flag] = &outcome.results[..] else {
        panic!("three results expected")
    };
    assert_eq!(details.text(), "original");
    assert_eq!(details.details, Some(json!({"replaced": true})));
    assert_eq!(
        details.structured_content,
        Some(json!({"output": "original"}))
    );
    assert!(!details.is_error);

    assert_eq!(content.text(), "[redacted]");
    assert_eq!(content.details, Some(json!({"d": 1})));
    assert_eq!(content.structured_content, None);

    assert!(flag.is_error);
    assert_eq!(flag.text(), "original");
    assert_eq!(flag.details, Some(json!({"d": 1})));
    // The end event carries the overridden result too.
    assert!(
        recorder
            .ends()
            .contains(&("content".into(), false, "[redacted]".into()))
    );
}

#[tokio::test]
async fn failing_or_panicking_after_hook_yields_an_error_result() {
    let tool = FnTool::new("t", |_| async {
        Ok(AgentToolResult::text("secret ghp_123").with_structured_content(json!({"o": 1})))
    })
    .arc();
    let hooks = FnHooks::default().after(|call, _| {
        if call.id == "fails" {
            Err("redaction rules could not be loaded".into())
        } else {
            panic!("redactor bug")
        }
    });
    let message = calls(vec![
        call("fails", "t", json!({})),
        call("panics", "t", json!({})),
    ]);
    let outcome = run_batch(
        tools(&[&tool]),
        &hooks,
        ExecutionMode::Parallel,
        &message,
        &Recorder::default().control(),
    )
    .await;
    let failed = &outcome.results[0];
    assert!(failed.is_error);
    assert_eq!(failed.text(), "redaction rules could not be loaded");
    assert_eq!(failed.structured_content, None);
    let panicked = &outcome.results[1];
    assert!(panicked.is_error);
    assert!(
        panicked.text().contains("redactor bug"),
        "{}",
        panicked.text()
    );
    assert!(!panicked.text().contains("ghp_123"));
    assert_eq!(panicked.structured_content, None);
}

/// A tool that sends one update, stashes its update callback and returns.
fn stashing_tool(name: &str, stash: &Arc<Mutex<Option<UpdateCallback>>>) -> Arc<FnTool> {
    let stash = Arc::clone(stash);
    FnTool::new(name, move |invocation| {
        let stash = Arc::clone(&stash);
        async move {
            (invocation.on_update)(AgentToolResult::text("partial 1"));
            *lock(&stash) = Some(invocation.on_update);
            Ok(AgentToolResult::text("final"))
        }
    })
    .arc()
}

fn updates_of(recorder: &Recorder, id: &str) -> Vec<String> {
    recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            AgentEvent::ToolExecutionUpdate {
                tool_call_id,
                partial_result,
                ..
            } if tool_call_id == id => Some(text_of(&partial_result)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn updates_after_settlement_are_dropped() {
    let stash = Arc::new(Mutex::new(None));
    let tool = stashing_tool("t", &stash);
    let recorder = Recorder::default();
    run_batch(
        tools(&[&tool]),
        &NoHooks,
        ExecutionMode::Parallel,
        &calls(vec![call("c1", "t", json!({"x": 1}))]),
        &recorder.control(),
    )
    .await;
    let late = lock(&stash).take().expect("tool stashed its callback");
    late(AgentToolResult::text("late"));
    assert_eq!(updates_of(&recorder, "c1"), ["partial 1"]);
    let update = recorder
        .events()
        .into_iter()
        .find(|e| e.kind() == "tool_execution_update")
        .unwrap();
    assert_eq!(
        update,
        AgentEvent::ToolExecutionUpdate {
            tool_call_id: "c1".into(),
            tool_name: "t".into(),
            args: json!({"x": 1}),
            partial_result: AgentToolResult::text("partial 1"),
        }
    );
}

#[tokio::test]
async fn settled_call_update_is_dropped_while_another_call_still_runs() {
    let stash: Arc<Mutex<Option<UpdateCallback>>> = Arc::new(Mutex::new(None));
    let first = stashing_tool("first", &stash);
    let first_ended = Arc::new(Notify::new());
    let second = {
        let stash = Arc::clone(&stash);
        let first_ended = Arc::clone(&first_ended);
        FnTool::new("second", move |invocation| {
            let stash = Arc::clone(&stash);
            let first_ended = Arc::clone(&first_ended);
            async move {
                first_ended.notified().await;
                let late = lock(&stash).take().expect("first stashed its callback");
                late(AgentToolResult::text("late from first"));
                (invocation.on_update)(AgentToolResult::text("second running"));
                Ok(AgentToolResult::text("second done"))
            }
        })
        .arc()
    };
    let recorder = Recorder::default();
    {
        let first_ended = Arc::clone(&first_ended);
        recorder.on_event(move |event| {
            if let AgentEvent::ToolExecutionEnd { tool_call_id, .. } = event
                && tool_call_id == "c1"
            {
                first_ended.notify_one();
            }
        });
    }
    run_batch(
        tools(&[&first, &second]),
        &NoHooks,
        ExecutionMode::Parallel,
        &two_calls("first", "second"),
        &recorder.control(),
    )
    .await;
    assert_eq!(updates_of(&recorder, "c1"), ["partial 1"]);
    assert_eq!(updates_of(&recorder, "c2"), ["second running"]);
    assert_eq!(recorder.end_order(), ["c1", "c2"]);
}

fn cancels(name: &str, token: &CancellationToken) -> Arc<FnTool> {
    let token = token.clone();
    FnTool::new(name, move |_| {
        let token = token.clone();
        async move {
            token.cancel();
            Ok(AgentToolResult::text("cancelled the run"))
        }
    })
    .arc()
}

#[tokio::test]
async fn cancelling_a_parallel_batch_stops_running_tools_and_answers_every_call() {
    let token = CancellationToken::new();
    // All three calls are running before the cancel.
    let all_running = Arc::new(tokio::sync::Barrier::new(3));
    let waiter = {
        let all_running = Arc::clone(&all_running);
        FnTool::new("wait", move |invocation| {
            let all_running = Arc::clone(&all_running);
            async move {
                all_running.wait().await;
                invocation.cancel.cancelled().await;
                Err("Command aborted".into())
            }
        })
        .arc()
    };
    let canceller = {
        let all_running = Arc::clone(&all_running);
        let token = token.clone();
        FnTool::new("cancel", move |_| {
            let all_running = Arc::clone(&all_running);
            let token = token.clone();
            async move {
                all_running.wait().await;
                token.cancel();
                Ok(AgentToolResult::text("cancelled the run"))
            }
        })
        .arc()
    };
    let recorder = Recorder::default();
    let message = calls(vec![
        call("c1", "wait", json!({})),
        call("c2", "cancel", json!({})),
        call("c3", "wait", json!({})),
    ]);
    let outcome = run_batch(
        tools(&[&waiter, &canceller]),
        &NoHooks,
        ExecutionMode::Parallel,
        &message,
        &recorder.control_with(token),
    )
    .await;
    let summary: Vec<_> = outcome
        .results
        .iter()
        .map(|r| (r.tool_call_id.as_str(), r.is_error, r.text()))
        .collect();
    assert_eq!(
        summary,
        [
            ("c1", true, "Command aborted".to_owned()),
            ("c2", false, "cancelled the run".to_owned()),
            ("c3", true, "Command aborted".to_owned()),
        ]
    );
    assert_eq!(waiter.executed().len(), 2);
    assert_eq!(recorder.result_message_order(), ["c1", "c2", "c3"]);
}

#[tokio::test]
async fn cancelling_during_parallel_preflight_answers_every_call_without_running_any() {
    let token = CancellationToken::new();
    let tool = FnTool::ok("t").arc();
    let hooks = {
        let token = token.clone();
        FnHooks::default().before(move |call, _, _| {
            if call.id == "c2" {
                token.cancel();
            }
            Ok(BeforeOutcome::Continue)
        })
    };
    let message = calls(vec![
        call("c1", "t", json!({})),
        call("c2", "t", json!({})),
        call("c3", "t", json!({})),
    ]);
    let recorder = Recorder::default();
    let outcome = run_batch(
        tools(&[&tool]),
        &hooks,
        ExecutionMode::Parallel,
        &message,
        &recorder.control_with(token),
    )
    .await;
    assert!(tool.executed().is_empty());
    assert_eq!(outcome.results.len(), 3);
    assert!(
        outcome
            .results
            .iter()
            .all(|r| r.is_error && r.text() == "Operation aborted")
    );
    assert_eq!(recorder.end_order(), ["c2", "c3", "c1"]);
    let starts = recorder
        .kinds()
        .iter()
        .filter(|k| **k == "tool_execution_start")
        .count();
    assert_eq!(starts, 3);
}

#[tokio::test]
async fn cancelling_a_sequential_batch_still_answers_the_calls_that_never_ran() {
    let token = CancellationToken::new();
    let canceller = cancels("cancel", &token);
    let later = FnTool::ok("later").arc();
    let message = calls(vec![
        call("c1", "cancel", json!({})),
        call("c2", "later", json!({})),
        call("c3", "later", json!({})),
    ]);
    let recorder = Recorder::default();
    let outcome = run_batch(
        tools(&[&canceller, &later]),
        &NoHooks,
        ExecutionMode::Sequential,
        &message,
        &recorder.control_with(token),
    )
    .await;
    assert!(later.executed().is_empty());
    let summary: Vec<_> = outcome
        .results
        .iter()
        .map(|r| (r.tool_call_id.as_str(), r.is_error, r.text()))
        .collect();
    assert_eq!(
        summary,
        [
            ("c1", false, "cancelled the run".to_owned()),
            ("c2", true, "Operation aborted".to_owned()),
            ("c3", true, "Operation aborted".to_owned()),
        ]
    );
    assert_eq!(recorder.end_order(), ["c1", "c2", "c3"]);
    assert_eq!(recorder.result_message_order(), ["c1", "c2", "c3"]);
}

#[tokio::test]
async fn every_failure_kind_becomes_an_error_result() {
    let panics = FnTool::new("panics", |_| async { panic!("index out of bounds") }).arc();
    let fails = FnTool::new("fails", |_| async {
        Err("ENOENT: no such file or directory, access 'x'".into())
    })
    .arc();
    let bad_shim = FnTool::ok("bad_shim")
        .prepare(|_| panic!("shim exploded"))
        .arc();
    let guarded = FnTool::ok("guarded").arc();
    let policy_broken = FnTool::ok("policy_broken").arc();
    let reports_error = FnTool::new("reports_error", |_| async {
        Ok(AgentToolResult::error("Command exited with code 2").with_details(json!({"k": 1})))
    })
    .arc();
    let hooks = FnHooks::default().before(|call, _, _| match call.name.as_str() {
        "guarded" => Err("policy file unreadable: deny by default".into()),
        "policy_broken" => panic!("rule engine bug"),
        _ => Ok(BeforeOutcome::Continue),
    });
    let message = calls(vec![
        call("c1", "panics", json!({})),
        call("c2", "fails", json!({})),
        call("c3", "bad_shim", json!({})),
        call("c4", "guarded", json!({})),
        call("c5", "policy_broken", json!({})),
        call("c6", "reports_error", json!({})),
    ]);
    let outcome = run_batch(
        tools(&[
            &panics,
            &fails,
            &bad_shim,
            &guarded,
            &policy_broken,
            &reports_error,
        ]),
        &hooks,
        ExecutionMode::Parallel,
        &message,
        &Recorder::default().control(),
    )
    .await;
    let texts: Vec<_> = outcome.results.iter().map(|r| r.text()).collect();
    assert!(outcome.results.iter().all(|r| r.is_error), "{texts:#?}");
    assert!(texts[0].starts_with("Tool panics failed with an internal error: index out of bounds"));
    assert_eq!(texts[1], "ENOENT: no such file or directory, access 'x'");
    assert!(texts[2].contains("shim exploded"), "{}", texts[2]);
    assert_eq!(texts[3], "policy file unreadable: deny by default");
    assert!(texts[4].contains("rule engine bug"), "{}", texts[4]);
    assert!(texts[4].contains("not executed"), "{}", texts[4]);
    assert_eq!(texts[5], "Command exited with code 2");
    assert_eq!(outcome.results[5].details, Some(json!({"k": 1})));
    assert!(guarded.executed().is_empty() && policy_broken.executed().is_empty());
}

#[tokio::test]
async fn a_panicking_tool_does_not_end_the_run() {
    let panics = FnTool::new("panics", |_| async { panic!("boom") }).arc();
    let provider = Arc::new(ScriptedProvider::replies([
        calls(vec![call("c1", "panics", json!({}))]),
        answer("recovered"),
    ]));
    let config = AgentConfig {
        tools: tools(&[&panics]),
        ..Default::default()
    };
    let added = run_agent(config, &provider, &Recorder::default().control()).await;
    assert_eq!(provider.calls(), 2);
    let results = tool_results(&added);
    assert!(results[0].is_error && results[0].text().contains("boom"));
}

#[tokio::test]
async fn empty_batch_does_not_terminate() {
    let outcome = run_batch(
        Vec::new(),
        &NoHooks,
        ExecutionMode::Parallel,
        &answer("no calls"),
        &Recorder::default().control(),
    )
    .await;
    assert_eq!(
        outcome,
        BatchOutcome {
            results: Vec::new(),
            terminate: false
        }
    );
}

#[tokio::test]
async fn a_panicking_call_fails_alone_and_the_next_call_of_the_same_tool_works() {
    let calls_made = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls_made);
    let flaky = FnTool::new("flaky", move |_| {
        let attempt = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if attempt == 0 {
                panic!("regex compilation shouldn't fail");
            }
            Ok(AgentToolResult::text("found 3 files"))
        }
    })
    .arc();
    let other = FnTool::ok("other").arc();
    let recorder = Recorder::default();
    let first = run_batch(
        tools(&[&flaky, &other]),
        &NoHooks,
        ExecutionMode::Parallel,
        &calls(vec![
            call("c1", "flaky", json!({})),
            call("c2", "other", json!({})),
        ]),
        &recorder.control(),
    )
    .await;
    assert!(first.results[0].is_error);
    assert!(
        first.results[0]
            .text()
            .starts_with("Tool flaky failed with an internal error: regex compilation"),
        "{}",
        first.results[0].text()
    );
    assert!(!first.results[1].is_error, "{}", first.results[1].text());
    let second = run_batch(
        tools(&[&flaky]),
        &NoHooks,
        ExecutionMode::Parallel,
        &calls(vec![call("c3", "flaky", json!({}))]),
        &recorder.control(),
    )
    .await;
    assert!(!second.results[0].is_error);
    assert_eq!(second.results[0].text(), "found 3 files");
}
