//! Helpers shared by the provider tests: fixtures, providers pointed at the test server,
//! an event recorder and a bounded way to run one model call.

use std::sync::Mutex;
use std::time::Duration;

use cordon_core::protocol::{AssistantMessage, Message, ToolDefinition, UserMessage};
use cordon_core::provider::{AssistantStreamEvent, ModelProvider, ModelRequest, ProviderError};
use cordon_model::{
    AnthropicConfig, AnthropicProvider, OpenAiConfig, OpenAiProvider, ProviderKind, RetryPolicy,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::server::TestServer;

/// The bytes of `tests/fixtures/NAME`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("failed to read fixture {path}: {e}"))
}

/// Retries that do not slow the tests down: 3 attempts, 1 ms initial backoff.
pub fn fast_retries() -> RetryPolicy {
    RetryPolicy::new(3, Duration::from_millis(1))
}

/// An OpenAI-compatible provider talking to `server` with key `sk-test`.
pub fn openai(server: &TestServer, kind: ProviderKind) -> OpenAiProvider {
    let mut config = OpenAiConfig::new(kind, "gpt-4.1", format!("{}/v1", server.url()));
    config.api_key = Some("sk-test".into());
    config.retry = fast_retries();
    OpenAiProvider::new(config).expect("valid OpenAI test config")
}

/// An Anthropic provider talking to `server` with key `sk-ant-test`.
pub fn anthropic(server: &TestServer) -> AnthropicProvider {
    let mut config = AnthropicConfig::new("claude-sonnet-4-5", server.url(), "sk-ant-test");
    config.retry = fast_retries();
    AnthropicProvider::new(config).expect("valid Anthropic test config")
}

/// The tools every test offers the model.
pub fn tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: "read".into(),
            description: "Read a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"},
                "limit": {"type": "integer"}}, "required": ["path"]}),
        },
        ToolDefinition {
            name: "bash".into(),
            description: "Run a command".into(),
            parameters: json!({"type": "object", "properties": {"command": {"type": "string"},
                "timeout": {"type": "integer"}}, "required": ["command"]}),
        },
    ]
}

/// A one-prompt conversation.
pub fn prompt(text: &str) -> Vec<Message> {
    vec![Message::User(UserMessage::text(text))]
}

/// Everything the callback saw: each event with the partial message at that moment.
#[derive(Default)]
pub struct Recorder {
    seen: Mutex<Vec<(AssistantMessage, AssistantStreamEvent)>>,
}

impl Recorder {
    /// Record one callback invocation.
    pub fn record(&self, message: &AssistantMessage, event: &AssistantStreamEvent) {
        self.seen
            .lock()
            .unwrap()
            .push((message.clone(), event.clone()));
    }

    /// The events in order.
    pub fn events(&self) -> Vec<AssistantStreamEvent> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// The partial messages in order.
    pub fn partials(&self) -> Vec<AssistantMessage> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// The text deltas of block `index`, concatenated.
    pub fn text_of(&self, index: usize) -> String {
        self.events()
            .iter()
            .filter_map(|e| match e {
                AssistantStreamEvent::TextDelta {
                    content_index,
                    delta,
                } if *content_index == index => Some(delta.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// Run one `stream` call with a generous timeout, recording the events.
pub async fn run(
    provider: &dyn ModelProvider,
    messages: &[Message],
    cancel: &CancellationToken,
    recorder: &Recorder,
) -> Result<AssistantMessage, ProviderError> {
    let tools = tools();
    let request = ModelRequest {
        system_prompt: Some("You are a careful coding agent."),
        messages,
        tools: &tools,
    };
    let on_event =
        |message: &AssistantMessage, event: &AssistantStreamEvent| recorder.record(message, event);
    tokio::time::timeout(
        Duration::from_secs(120),
        provider.stream(request, cancel, &on_event),
    )
    .await
    .expect("the provider call did not finish within 120 s")
}

/// The Display text of a provider error.
pub fn error_text(result: Result<AssistantMessage, ProviderError>) -> String {
    match result {
        Ok(message) => panic!("expected an error, got {message:?}"),
        Err(error) => error.to_string(),
    }
}
