//! Agent events (docs/contract.md#events): one JSON object per event, tagged by `"type"`, fields
//! camelCase.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{Message, ToolResult};
use crate::provider::AssistantStreamEvent;
use crate::tool::AgentToolResult;

/// An event of an agent run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum AgentEvent {
    /// The run started.
    AgentStart,
    /// The run ended; `messages` are the messages it added to the context.
    AgentEnd {
        /// Messages added by this run.
        messages: Vec<Message>,
    },
    /// A turn (one model response plus its tool batch) started.
    TurnStart,
    /// A turn ended.
    TurnEnd {
        /// The assistant message of the turn.
        message: Message,
        /// The turn's tool results, in source order.
        tool_results: Vec<ToolResult>,
    },
    /// A message started (user, assistant or tool result).
    MessageStart {
        /// The message (partial for a streaming assistant message).
        message: Message,
    },
    /// A streaming assistant message changed.
    MessageUpdate {
        /// The partial message so far.
        message: Message,
        /// The provider event that changed it.
        assistant_message_event: AssistantStreamEvent,
    },
    /// A message is complete.
    MessageEnd {
        /// The complete message.
        message: Message,
    },
    /// A tool call started.
    ToolExecutionStart {
        /// Call id.
        tool_call_id: String,
        /// Tool name.
        tool_name: String,
        /// Raw arguments as the model sent them.
        args: Value,
    },
    /// A running tool reported a partial result.
    ToolExecutionUpdate {
        /// Call id.
        tool_call_id: String,
        /// Tool name.
        tool_name: String,
        /// Arguments the tool runs with.
        args: Value,
        /// The partial result.
        partial_result: AgentToolResult,
    },
    /// A tool call finished (in completion order for parallel batches).
    ToolExecutionEnd {
        /// Call id.
        tool_call_id: String,
        /// Tool name.
        tool_name: String,
        /// The final result.
        result: AgentToolResult,
        /// Whether it failed.
        is_error: bool,
    },
}

impl AgentEvent {
    /// The `"type"` tag of this event.
    pub fn kind(&self) -> &'static str {
        match self {
            AgentEvent::AgentStart => "agent_start",
            AgentEvent::AgentEnd { .. } => "agent_end",
            AgentEvent::TurnStart => "turn_start",
            AgentEvent::TurnEnd { .. } => "turn_end",
            AgentEvent::MessageStart { .. } => "message_start",
            AgentEvent::MessageUpdate { .. } => "message_update",
            AgentEvent::MessageEnd { .. } => "message_end",
            AgentEvent::ToolExecutionStart { .. } => "tool_execution_start",
            AgentEvent::ToolExecutionUpdate { .. } => "tool_execution_update",
            AgentEvent::ToolExecutionEnd { .. } => "tool_execution_end",
        }
    }
}

/// Where the loop sends events. Called synchronously, in emission order.
pub type EventSink = Arc<dyn Fn(AgentEvent) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_are_snake_case_tagged_with_camel_case_fields() {
        let event = AgentEvent::ToolExecutionStart {
            tool_call_id: "c1".into(),
            tool_name: "read".into(),
            args: json!({"path": "a"}),
        };
        assert_eq!(
            serde_json::to_value(&event).unwrap(),
            json!({"type":"tool_execution_start","toolCallId":"c1","toolName":"read","args":{"path":"a"}})
        );
        assert_eq!(
            serde_json::to_value(AgentEvent::AgentStart).unwrap(),
            json!({"type":"agent_start"})
        );
    }

    #[test]
    fn tool_end_and_turn_end_have_contract_shapes() {
        let result = AgentToolResult::error("Tool nope not found");
        let end = AgentEvent::ToolExecutionEnd {
            tool_call_id: "c1".into(),
            tool_name: "nope".into(),
            result: result.clone(),
            is_error: true,
        };
        assert_eq!(
            serde_json::to_value(&end).unwrap(),
            json!({"type":"tool_execution_end","toolCallId":"c1","toolName":"nope",
                   "result":{"content":[{"type":"text","text":"Tool nope not found"}],
                             "details":null,"structuredContent":null,"isError":true,
                             "terminate":false},
                   "isError":true})
        );
        let message = Message::Assistant(crate::protocol::AssistantMessage::default());
        let turn_end = AgentEvent::TurnEnd {
            message,
            tool_results: vec![result.into_tool_result("c1", "nope")],
        };
        assert_eq!(
            serde_json::to_value(&turn_end).unwrap(),
            json!({"type":"turn_end",
                   "message":{"role":"assistant","content":[],"stopReason":"stop"},
                   "toolResults":[{"toolCallId":"c1","toolName":"nope",
                       "content":[{"type":"text","text":"Tool nope not found"}],
                       "details":null,"structuredContent":null,"isError":true}]})
        );
    }
}
