//! Test doubles for the loop, for this crate's tests and other crates' tests (feature
//! `testing`): [`ScriptedProvider`] plays back pre-recorded assistant messages.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::protocol::{AssistantContent, AssistantMessage, Message, ToolCall, ToolDefinition};
use crate::provider::{
    AssistantStreamEvent, ModelProvider, ModelRequest, ProviderError, StreamCallback,
};

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum ScriptStep {
    /// Stream this message, then return it.
    Reply(AssistantMessage),
    /// Fail with this error text.
    Fail(String),
    /// Stream this message's content, then wait until the run is cancelled and fail (a
    /// provider that was interrupted mid-response).
    StallUntilCancelled(AssistantMessage),
}

/// What the provider was asked, per call.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedRequest {
    /// The system prompt.
    pub system_prompt: Option<String>,
    /// The conversation sent.
    pub messages: Vec<Message>,
    /// The tools offered.
    pub tools: Vec<ToolDefinition>,
}

/// A [`ModelProvider`] that answers from a script, streaming each message block by block
/// (one delta per text/thinking block, start + one argument delta per tool call). Running
/// out of script is a provider error.
pub struct ScriptedProvider {
    steps: Mutex<VecDeque<ScriptStep>>,
    requests: Mutex<Vec<RecordedRequest>>,
    streaming: bool,
}

impl ScriptedProvider {
    /// A provider that plays `steps` in order.
    pub fn new(steps: impl IntoIterator<Item = ScriptStep>) -> Self {
        ScriptedProvider {
            steps: Mutex::new(steps.into_iter().collect()),
            requests: Mutex::new(Vec::new()),
            streaming: true,
        }
    }

    /// A provider that replies with `messages` in order.
    pub fn replies(messages: impl IntoIterator<Item = AssistantMessage>) -> Self {
        Self::new(messages.into_iter().map(ScriptStep::Reply))
    }

    /// Builder: return messages without stream events (the loop then emits `message_start`
    /// only when the message is complete).
    pub fn without_streaming(mut self) -> Self {
        self.streaming = false;
        self
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.requests).clone()
    }

    /// How many times the model was called.
    pub fn calls(&self) -> usize {
        lock(&self.requests).len()
    }

    fn stream_blocks(&self, message: &AssistantMessage, on_event: StreamCallback<'_>) {
        if !self.streaming {
            return;
        }
        let mut partial = AssistantMessage {
            content: Vec::new(),
            ..message.clone()
        };
        for (content_index, block) in message.content.iter().enumerate() {
            match block {
                AssistantContent::Text { text } => {
                    partial
                        .content
                        .push(AssistantContent::Text { text: text.clone() });
                    let delta = text.clone();
                    on_event(
                        &partial,
                        &AssistantStreamEvent::TextDelta {
                            content_index,
                            delta,
                        },
                    );
                }
                AssistantContent::Thinking {
                    thinking,
                    signature,
                } => {
                    partial.content.push(AssistantContent::Thinking {
                        thinking: thinking.clone(),
                        signature: signature.clone(),
                    });
                    let delta = thinking.clone();
                    on_event(
                        &partial,
                        &AssistantStreamEvent::ThinkingDelta {
                            content_index,
                            delta,
                        },
                    );
                }
                AssistantContent::ToolCall(call) => {
                    partial.content.push(AssistantContent::ToolCall(ToolCall {
                        arguments: serde_json::Value::Null,
                        ..call.clone()
                    }));
                    on_event(
                        &partial,
                        &AssistantStreamEvent::ToolCallStart {
                            content_index,
                            id: call.id.clone(),
                            name: call.name.clone(),
                        },
                    );
                    partial.content[content_index] = block.clone();
                    on_event(
                        &partial,
                        &AssistantStreamEvent::ToolCallDelta {
                            content_index,
                            delta: call.arguments.to_string(),
                        },
                    );
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[async_trait]
impl ModelProvider for ScriptedProvider {
    async fn stream(
        &self,
        request: ModelRequest<'_>,
        cancel: &CancellationToken,
        on_event: StreamCallback<'_>,
    ) -> Result<AssistantMessage, ProviderError> {
        lock(&self.requests).push(RecordedRequest {
            system_prompt: request.system_prompt.map(str::to_owned),
            messages: request.messages.to_vec(),
            tools: request.tools.to_vec(),
        });
        let step = lock(&self.steps).pop_front();
        match step {
            Some(ScriptStep::Reply(message)) => {
                self.stream_blocks(&message, on_event);
                Ok(message)
            }
            Some(ScriptStep::Fail(text)) => Err(text.into()),
            Some(ScriptStep::StallUntilCancelled(message)) => {
                self.stream_blocks(&message, on_event);
                cancel.cancelled().await;
                Err("request was cancelled".into())
            }
            None => Err("scripted provider has no more responses".into()),
        }
    }
}
