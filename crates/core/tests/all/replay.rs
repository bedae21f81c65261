//! `cordon replay` semantics: pre-recorded assistant messages through the loop's batch rules.

use std::sync::Arc;

use cordon_core::hooks::BeforeOutcome;
use cordon_core::protocol::{AssistantContent, Message, StopReason};
use cordon_core::tool::{AgentToolResult, ExecutionMode};
use cordon_core::{AgentConfig, CancellationToken, replay};
use serde_json::json;

use crate::support::{
    FnHooks, FnTool, Recorder, answer, assistant, call, calls, roles, tool_results, tools, within,
};

#[tokio::test]
async fn replay_emits_the_loop_event_order() {
    let tool = FnTool::ok("bash").arc();
    let config = AgentConfig {
        tools: tools(&[&tool]),
        ..Default::default()
    };
    let recorder = Recorder::default();
    let transcript = within(
        "replay",
        replay(
            &config,
            [
                calls(vec![call("c1", "bash", json!({"command": "true"}))]),
                answer("done"),
            ],
            &recorder.control(),
        ),
    )
    .await;
    assert_eq!(
        recorder.kinds(),
        [
            "agent_start",
            "turn_start",
            "message_start",
            "message_end",
            "tool_execution_start",
            "tool_execution_end",
            "message_start",
            "message_end",
            "turn_end",
            "turn_start",
            "message_start",
            "message_end",
            "turn_end",
            "agent_end",
        ]
    );
    assert_eq!(roles(&transcript), ["assistant", "toolResult", "assistant"]);
    assert_eq!(tool.executed(), [json!({"command": "true"})]);
}

#[tokio::test]
async fn replay_applies_the_length_rule_and_hooks() {
    let tool = FnTool::ok("bash").arc();
    let hooks = FnHooks::default().before(|_, args, _| {
        Ok(if args["command"] == "git push" {
            BeforeOutcome::Block {
                reason: Some("pushing is done by CI".into()),
                terminate: true,
            }
        } else {
            BeforeOutcome::Continue
        })
    });
    let config = AgentConfig {
        tools: tools(&[&tool]),
        hooks: Arc::new(hooks),
        ..Default::default()
    };
    let transcript = within(
        "replay",
        replay(
            &config,
            [
                assistant(
                    vec![call("c1", "bash", json!({"command": "rm -rf"}))],
                    StopReason::Length,
                ),
                calls(vec![call("c2", "bash", json!({"command": "git push"}))]),
                // A terminating batch does not end a replay: later calls still pass the hooks.
                calls(vec![call("c3", "bash", json!({"command": "ls"}))]),
            ],
            &Recorder::default().control(),
        ),
    )
    .await;
    let results = tool_results(&transcript);
    assert_eq!(results.len(), 3);
    assert!(results[0].is_error && results[0].text().contains("output token limit"));
    assert_eq!(results[1].text(), "pushing is done by CI");
    assert!(!results[2].is_error);
    assert_eq!(tool.executed(), [json!({"command": "ls"})]);
}

#[tokio::test]
async fn replay_never_executes_calls_of_error_or_aborted_messages() {
    let tool = FnTool::ok("bash").arc();
    let config = AgentConfig {
        tools: tools(&[&tool]),
        ..Default::default()
    };
    let recorder = Recorder::default();
    let transcript = within(
        "replay",
        replay(
            &config,
            [
                assistant(
                    vec![call("c1", "bash", json!({"command": "partial"}))],
                    StopReason::Error,
                ),
                assistant(
                    vec![call("c2", "bash", json!({"command": "partial"}))],
                    StopReason::Aborted,
                ),
            ],
            &recorder.control(),
        ),
    )
    .await;
    assert!(tool.executed().is_empty());
    assert_eq!(roles(&transcript), ["assistant", "assistant"]);
    assert!(!recorder.kinds().contains(&"tool_execution_start"));
}

#[tokio::test]
async fn cancelling_mid_replay_answers_the_current_batch_and_ends() {
    let token = CancellationToken::new();
    let canceller = {
        let token = token.clone();
        FnTool::new("cancel", move |_| {
            let token = token.clone();
            async move {
                token.cancel();
                Ok(AgentToolResult::text("cancelled"))
            }
        })
        .arc()
    };
    let later = FnTool::ok("later").arc();
    let config = AgentConfig {
        tools: tools(&[&canceller, &later]),
        tool_execution: ExecutionMode::Sequential,
        ..Default::default()
    };
    let recorder = Recorder::default();
    let transcript = within(
        "replay",
        replay(
            &config,
            [
                calls(vec![
                    call("c1", "cancel", json!({})),
                    call("c2", "later", json!({})),
                    call("c3", "later", json!({})),
                ]),
                calls(vec![call("c4", "later", json!({}))]),
            ],
            &recorder.control_with(token),
        ),
    )
    .await;
    assert!(later.executed().is_empty());
    assert_eq!(
        roles(&transcript),
        ["assistant", "toolResult", "toolResult", "toolResult"]
    );
    let texts: Vec<_> = tool_results(&transcript).iter().map(|r| r.text()).collect();
    assert_eq!(
        texts,
        ["cancelled", "Operation aborted", "Operation aborted"]
    );
    let kinds = recorder.kinds();
    assert_eq!(kinds.iter().filter(|k| **k == "turn_start").count(), 1);
    assert_eq!(kinds[kinds.len() - 2..], ["turn_end", "agent_end"]);
    // agent_end carries the whole transcript.
    let events = recorder.events();
    assert_eq!(
        events.last(),
        Some(&cordon_core::event::AgentEvent::AgentEnd {
            messages: transcript.clone()
        })
    );
}

#[tokio::test]
async fn replay_of_text_only_messages_still_produces_turns() {
    let recorder = Recorder::default();
    let transcript = within(
        "replay",
        replay(
            &AgentConfig::default(),
            [
                answer("one"),
                assistant(
                    vec![AssistantContent::Text { text: "two".into() }],
                    StopReason::Length,
                ),
            ],
            &recorder.control(),
        ),
    )
    .await;
    assert_eq!(transcript.len(), 2);
    assert!(matches!(transcript[0], Message::Assistant(_)));
    assert_eq!(
        recorder.kinds(),
        [
            "agent_start",
            "turn_start",
            "message_start",
            "message_end",
            "turn_end",
            "turn_start",
            "message_start",
            "message_end",
            "turn_end",
            "agent_end",
        ]
    );
}
