//! The multi-turn loop: event order, streaming, provider errors, cancellation, turn budget,
//! `continue_from`.

use std::sync::Arc;

use cordon_core::event::AgentEvent;
use cordon_core::protocol::{
    AssistantContent, AssistantMessage, Message, StopReason, ToolResult, UserMessage,
};
use cordon_core::provider::{AssistantStreamEvent, ModelProvider};
use cordon_core::testing::{ScriptStep, ScriptedProvider};
use cordon_core::tool::AgentToolResult;
use cordon_core::{Agent, AgentConfig, AgentError, CancellationToken};
use serde_json::json;

use crate::support::{FnTool, Recorder, answer, call, calls, roles, tools, within};

fn agent(config: AgentConfig, provider: &Arc<ScriptedProvider>) -> Agent {
    Agent::new(config, Arc::clone(provider) as Arc<dyn ModelProvider>)
}

fn one_tool_config(tool: &Arc<FnTool>) -> AgentConfig {
    AgentConfig {
        tools: tools(&[tool]),
        ..Default::default()
    }
}

#[tokio::test]
async fn exact_event_order_for_one_call_and_stop() {
    let tool = FnTool::ok("echo").arc();
    let provider = Arc::new(
        ScriptedProvider::replies([calls(vec![call("c1", "echo", json!({}))])]).without_streaming(),
    );
    let recorder = Recorder::default();
    let config = AgentConfig {
        max_turns: Some(1),
        ..one_tool_config(&tool)
    };
    let added = within(
        "run",
        agent(config, &provider).prompt(&[], UserMessage::text("hi"), &recorder.control()),
    )
    .await;
    assert_eq!(
        recorder.kinds(),
        [
            "agent_start",
            "turn_start",
            "message_start",
            "message_end",
            "message_start",
            "message_end",
            "tool_execution_start",
            "tool_execution_end",
            "message_start",
            "message_end",
            "turn_end",
            "agent_end",
        ]
    );
    let events = recorder.events();
    let role = |index: usize| match &events[index] {
        AgentEvent::MessageStart { message } | AgentEvent::MessageEnd { message } => {
            roles(std::slice::from_ref(message))[0]
        }
        other => panic!("not a message event: {other:?}"),
    };
    assert_eq!(
        [role(2), role(3), role(4), role(5), role(8), role(9)],
        [
            "user",
            "user",
            "assistant",
            "assistant",
            "toolResult",
            "toolResult"
        ]
    );
    assert_eq!(provider.calls(), 1);
    assert_eq!(roles(&added), ["user", "assistant", "toolResult"]);
    assert_eq!(
        events.last(),
        Some(&AgentEvent::AgentEnd {
            messages: added.clone()
        })
    );
    let AgentEvent::TurnEnd {
        message,
        tool_results,
    } = &events[10]
    else {
        panic!("turn_end expected")
    };
    assert_eq!(message, &added[1]);
    assert_eq!(
        tool_results,
        &vec![ToolResult {
            tool_call_id: "c1".into(),
            tool_name: "echo".into(),
            content: vec![cordon_core::protocol::Content::text("echo ran")],
            details: None,
            structured_content: None,
            is_error: false,
        }]
    );
}

#[tokio::test]
async fn streaming_starts_the_message_at_the_first_event_and_updates_per_event() {
    let reply = AssistantMessage {
        content: vec![
            AssistantContent::Thinking {
                thinking: "plan".into(),
                signature: None,
            },
            AssistantContent::Text {
                text: "Hello".into(),
            },
        ],
        stop_reason: StopReason::Stop,
        ..Default::default()
    };
    let provider = Arc::new(ScriptedProvider::replies([reply.clone()]));
    let recorder = Recorder::default();
    within(
        "run",
        agent(AgentConfig::default(), &provider).prompt(
            &[],
            UserMessage::text("hi"),
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
            "message_start",
            "message_update",
            "message_update",
            "message_end",
            "turn_end",
            "agent_end",
        ]
    );
    let events = recorder.events();
    // message_start carries the partial message as of the first stream event.
    let AgentEvent::MessageStart {
        message: Message::Assistant(first),
    } = &events[4]
    else {
        panic!("assistant message_start expected")
    };
    assert_eq!(first.content.len(), 1);
    let AgentEvent::MessageUpdate {
        assistant_message_event,
        ..
    } = &events[6]
    else {
        panic!("message_update expected")
    };
    assert_eq!(
        assistant_message_event,
        &AssistantStreamEvent::TextDelta {
            content_index: 1,
            delta: "Hello".into()
        }
    );
    assert_eq!(
        events[7],
        AgentEvent::MessageEnd {
            message: Message::Assistant(reply)
        }
    );
}

#[tokio::test]
async fn system_prompt_tools_and_context_reach_the_provider() {
    let tool = FnTool::ok("read").arc();
    let provider = Arc::new(ScriptedProvider::replies([answer("hi")]));
    let history = vec![
        Message::User(UserMessage::text("earlier")),
        Message::Assistant(answer("earlier answer")),
    ];
    let config = AgentConfig {
        system_prompt: Some("You are careful.".into()),
        ..one_tool_config(&tool)
    };
    let added = within(
        "run",
        agent(config, &provider).prompt(
            &history,
            UserMessage::text("now"),
            &Recorder::default().control(),
        ),
    )
    .await;
    let request = &provider.requests()[0];
    assert_eq!(request.system_prompt.as_deref(), Some("You are careful."));
    assert_eq!(request.tools, vec![tool.definition_for_test()]);
    assert_eq!(roles(&request.messages), ["user", "assistant", "user"]);
    // Only the run's own messages are returned.
    assert_eq!(roles(&added), ["user", "assistant"]);
}

trait DefinitionForTest {
    fn definition_for_test(&self) -> cordon_core::protocol::ToolDefinition;
}

impl DefinitionForTest for FnTool {
    fn definition_for_test(&self) -> cordon_core::protocol::ToolDefinition {
        cordon_core::tool::AgentTool::definition(self)
    }
}

#[tokio::test]
async fn provider_error_becomes_an_error_message_and_ends_the_run() {
    let provider = Arc::new(ScriptedProvider::new([ScriptStep::Fail(
        "HTTP 529: overloaded".into(),
    )]));
    let recorder = Recorder::default();
    let added = within(
        "run",
        agent(AgentConfig::default(), &provider).prompt(
            &[],
            UserMessage::text("hi"),
            &recorder.control(),
        ),
    )
    .await;
    assert_eq!(roles(&added), ["user", "assistant"]);
    let Message::Assistant(error) = &added[1] else {
        unreachable!()
    };
    assert_eq!(error.stop_reason, StopReason::Error);
    assert_eq!(error.error_message.as_deref(), Some("HTTP 529: overloaded"));
    assert_eq!(
        recorder.kinds(),
        [
            "agent_start",
            "turn_start",
            "message_start",
            "message_end",
            "message_start",
            "message_end",
            "turn_end",
            "agent_end",
        ]
    );
    assert_eq!(
        serde_json::to_value(&added[1]).unwrap(),
        json!({"role":"assistant","content":[],"stopReason":"error",
               "errorMessage":"HTTP 529: overloaded"})
    );
}

#[tokio::test]
async fn cancelling_while_streaming_ends_with_an_aborted_message_and_runs_no_tools() {
    let tool = FnTool::ok("bash").arc();
    let provider = Arc::new(ScriptedProvider::new([ScriptStep::StallUntilCancelled(
        calls(vec![
            AssistantContent::Text {
                text: "Let me run it".into(),
            },
            call("c1", "bash", json!({"command": "rm -rf /"})),
        ]),
    )]));
    let token = CancellationToken::new();
    let recorder = Recorder::default();
    {
        let token = token.clone();
        recorder.on_event(move |event| {
            if event.kind() == "message_update" {
                token.cancel();
            }
        });
    }
    let added = within(
        "run",
        agent(one_tool_config(&tool), &provider).prompt(
            &[],
            UserMessage::text("hi"),
            &recorder.control_with(token),
        ),
    )
    .await;
    assert!(tool.executed().is_empty());
    assert_eq!(roles(&added), ["user", "assistant"]);
    let Message::Assistant(aborted) = &added[1] else {
        unreachable!()
    };
    assert_eq!(aborted.stop_reason, StopReason::Aborted);
    assert_eq!(aborted.error_message.as_deref(), Some("Operation aborted"));
    assert_eq!(
        aborted.content,
        vec![AssistantContent::Text {
            text: "Let me run it".into()
        }]
    );
    let kinds = recorder.kinds();
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["message_end", "turn_end", "agent_end"]
    );
    assert!(!kinds.contains(&"tool_execution_start"));
}

#[tokio::test]
async fn a_cancelled_run_never_calls_the_provider() {
    let provider = Arc::new(ScriptedProvider::replies([answer("never")]));
    let token = CancellationToken::new();
    token.cancel();
    let recorder = Recorder::default();
    let added = within(
        "run",
        agent(AgentConfig::default(), &provider).prompt(
            &[],
            UserMessage::text("hi"),
            &recorder.control_with(token),
        ),
    )
    .await;
    assert_eq!(provider.calls(), 0);
    let Message::Assistant(aborted) = &added[1] else {
        panic!("aborted assistant message expected")
    };
    assert_eq!(aborted.stop_reason, StopReason::Aborted);
}

#[tokio::test]
async fn cancelling_during_a_batch_answers_every_call_then_aborts_without_another_model_call() {
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
    let provider = Arc::new(ScriptedProvider::replies([
        calls(vec![
            call("c1", "cancel", json!({})),
            call("c2", "later", json!({})),
        ]),
        answer("never"),
    ]));
    let config = AgentConfig {
        tools: tools(&[&canceller, &later]),
        tool_execution: cordon_core::tool::ExecutionMode::Sequential,
        ..Default::default()
    };
    let recorder = Recorder::default();
    let added = within(
        "run",
        agent(config, &provider).prompt(
            &[],
            UserMessage::text("hi"),
            &recorder.control_with(token),
        ),
    )
    .await;
    assert_eq!(provider.calls(), 1);
    assert!(later.executed().is_empty());
    assert_eq!(
        roles(&added),
        ["user", "assistant", "toolResult", "toolResult", "assistant"]
    );
    let Message::Assistant(last) = added.last().unwrap() else {
        unreachable!()
    };
    assert_eq!(last.stop_reason, StopReason::Aborted);
    assert_eq!(recorder.kinds().last(), Some(&"agent_end"));
}

#[tokio::test]
async fn max_turns_stops_after_that_turns_batch_and_continue_from_resumes() {
    let tool = FnTool::ok("step").arc();
    let provider = Arc::new(ScriptedProvider::replies([
        calls(vec![call("c1", "step", json!({}))]),
        calls(vec![call("c2", "step", json!({}))]),
        calls(vec![call("c3", "step", json!({}))]),
        answer("finished"),
    ]));
    let config = AgentConfig {
        max_turns: Some(2),
        ..one_tool_config(&tool)
    };
    let agent = agent(config, &provider);
    let recorder = Recorder::default();
    let added = within(
        "run",
        agent.prompt(&[], UserMessage::text("go"), &recorder.control()),
    )
    .await;
    assert_eq!(provider.calls(), 2);
    assert_eq!(tool.executed().len(), 2);
    assert_eq!(
        roles(&added),
        ["user", "assistant", "toolResult", "assistant", "toolResult"]
    );
    let kinds = recorder.kinds();
    assert_eq!(kinds.iter().filter(|k| **k == "turn_start").count(), 2);
    assert_eq!(kinds.iter().filter(|k| **k == "turn_end").count(), 2);
    assert_eq!(kinds.last(), Some(&"agent_end"));

    // The context ends with a tool result: the run can be continued.
    let recorder = Recorder::default();
    let resumed = within("continue", agent.continue_from(&added, &recorder.control()))
        .await
        .expect("continue_from accepts a tool-result tail");
    assert_eq!(roles(&resumed), ["assistant", "toolResult", "assistant"]);
    assert_eq!(provider.calls(), 4);
    assert_eq!(provider.requests()[2].messages, added);
}

#[tokio::test]
async fn continue_from_emits_no_message_events_for_the_context() {
    let provider = Arc::new(ScriptedProvider::replies([answer("again")]));
    let context = vec![Message::User(UserMessage::text("hello"))];
    let recorder = Recorder::default();
    let added = within(
        "continue",
        agent(AgentConfig::default(), &provider).continue_from(&context, &recorder.control()),
    )
    .await
    .unwrap();
    assert_eq!(roles(&added), ["assistant"]);
    assert_eq!(
        recorder.kinds(),
        [
            "agent_start",
            "turn_start",
            "message_start",
            "message_update",
            "message_end",
            "turn_end",
            "agent_end",
        ]
    );
}

#[tokio::test]
async fn continue_from_rejects_an_empty_context_or_an_assistant_tail() {
    let provider = Arc::new(ScriptedProvider::replies([]));
    let agent = agent(AgentConfig::default(), &provider);
    let recorder = Recorder::default();
    let empty = agent
        .continue_from(&[], &recorder.control())
        .await
        .unwrap_err();
    assert!(matches!(empty, AgentError::EmptyContext));
    assert_eq!(empty.to_string(), "Cannot continue: no messages in context");
    let tail = [
        Message::User(UserMessage::text("q")),
        Message::Assistant(answer("a")),
    ];
    let assistant_tail = agent
        .continue_from(&tail, &recorder.control())
        .await
        .unwrap_err();
    assert_eq!(
        assistant_tail.to_string(),
        "Cannot continue from message role: assistant"
    );
    assert!(recorder.events().is_empty());
    assert_eq!(provider.calls(), 0);
}

#[tokio::test]
async fn running_out_of_script_is_a_provider_error() {
    let provider = Arc::new(ScriptedProvider::replies([]));
    let added = within(
        "run",
        agent(AgentConfig::default(), &provider).prompt(
            &[],
            UserMessage::text("hi"),
            &Recorder::default().control(),
        ),
    )
    .await;
    let Message::Assistant(error) = &added[1] else {
        unreachable!()
    };
    assert_eq!(error.stop_reason, StopReason::Error);
    assert_eq!(
        error.error_message.as_deref(),
        Some("scripted provider has no more responses")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_can_be_spawned_on_a_multi_threaded_runtime() {
    let tool = FnTool::new("spawns", |invocation| async move {
        // Updates may come from another task of the runtime.
        let on_update = invocation.on_update.clone();
        tokio::spawn(async move { on_update(AgentToolResult::text("from a task")) })
            .await
            .expect("update task");
        Ok(AgentToolResult::text("done"))
    })
    .arc();
    let provider = Arc::new(ScriptedProvider::replies([
        calls(vec![
            call("c1", "spawns", json!({})),
            call("c2", "spawns", json!({})),
        ]),
        answer("ok"),
    ]));
    let agent = Arc::new(agent(one_tool_config(&tool), &provider));
    let recorder = Recorder::default();
    let control = recorder.control();
    let handle = tokio::spawn({
        let agent = Arc::clone(&agent);
        async move { agent.prompt(&[], UserMessage::text("go"), &control).await }
    });
    let added = within("spawned run", handle).await.expect("run task");
    assert_eq!(
        roles(&added),
        ["user", "assistant", "toolResult", "toolResult", "assistant"]
    );
    let updates = recorder
        .kinds()
        .iter()
        .filter(|k| **k == "tool_execution_update")
        .count();
    assert_eq!(updates, 2);
}
