//! The JSON-RPC line transport the rmcp service runs over: one message per line in, one per
//! line out. It owns every answer to input that never reaches a handler:
//!
//! - not JSON → `-32700` parse error (id `null`);
//! - a batch, a non-object, or an object that is no JSON-RPC message → `-32600` invalid
//!   request (with the request's id when it has a usable one);
//! - a request whose method is known but whose params do not fit → `-32602` invalid params;
//! - a line over the size limit → `-32600`, its bytes dropped as they arrived;
//! - a malformed notification or response → dropped (JSON-RPC never answers those);
//! - notifications and responses before the session lifecycle has started → dropped (the SDK
//!   would otherwise end the session on them).
//!
//! Unknown methods of well-formed requests pass through: the handler answers `-32601`.
//! It does not own the framing (`framing`) nor any MCP semantics (`server`).

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, CustomRequest, GetMeta,
    InitializeRequestParams, ProtocolVersion,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, mpsc};

use crate::framing::Frame;

/// JSON-RPC error codes this transport answers with.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;

/// UTF-8 byte order mark, which RFC 8259 lets a parser ignore.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The output side, shared by responses and the transport's own error replies.
pub(crate) type SharedWriter = Arc<Mutex<Box<dyn AsyncWrite + Send + Unpin>>>;

/// A transport over a frame channel (input) and a writer (output).
pub(crate) struct LineTransport {
    frames: mpsc::Receiver<Frame>,
    writer: SharedWriter,
    max_message_bytes: usize,
    /// Whether a request that starts the session lifecycle has been delivered.
    lifecycle_started: bool,
}

impl LineTransport {
    pub(crate) fn new(
        frames: mpsc::Receiver<Frame>,
        writer: Box<dyn AsyncWrite + Send + Unpin>,
        max_message_bytes: usize,
    ) -> Self {
        LineTransport {
            frames,
            writer: Arc::new(Mutex::new(writer)),
            max_message_bytes,
            lifecycle_started: false,
        }
    }

    async fn reply(&self, reply: Value) {
        // A failed write means the client is gone; the read side will see EOF.
        // The client closed its end: there is nobody to tell.
        let _ = write_line(&self.writer, &reply).await;
    }
}

/// What to do with one input line.
#[derive(Debug)]
enum Incoming {
    Message(Box<ClientJsonRpcMessage>),
    Reply(Value),
    Ignore,
}

/// Classify one line (without its newline).
fn classify(line: &[u8]) -> Incoming {
    let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Incoming::Ignore;
    }
    let typed_error = match serde_json::from_slice::<ClientJsonRpcMessage>(line) {
        Ok(ClientJsonRpcMessage::Request(request)) => {
            // The SDK files a standard method whose params do not fit under "custom".
            if let ClientRequest::CustomRequest(custom) = &request.request
                && let Some(reason) = standard_method_params_error(custom)
            {
                return Incoming::Reply(error_reply(
                    Some(request.id.clone().into_json_value()),
                    INVALID_PARAMS,
                    format!("Invalid params for {}: {reason}", custom.method),
                ));
            }
            return Incoming::Message(Box::new(ClientJsonRpcMessage::Request(request)));
        }
        Ok(message) => return Incoming::Message(Box::new(message)),
        Err(error) => error,
    };
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(error) => {
            return Incoming::Reply(error_reply(
                None,
                PARSE_ERROR,
                format!("Parse error: the message is not valid JSON ({error})"),
            ));
        }
    };
    let Value::Object(object) = &value else {
        let message = match value {
            Value::Array(_) => "Invalid Request: JSON-RPC batches are not supported; send one \
                                message per line"
                .to_owned(),
            _ => "Invalid Request: a JSON-RPC message must be a JSON object".to_owned(),
        };
        return Incoming::Reply(error_reply(None, INVALID_REQUEST, message));
    };
    let id = object.get("id").filter(|id| is_usable_id(id)).cloned();
    let method = object.get("method").and_then(Value::as_str);
    match (object.contains_key("id"), method) {
        // A notification (no id) is never answered, not even when it is malformed.
        (false, Some(_)) => Incoming::Ignore,
        (true, Some(method)) if id.is_some() && object.get("jsonrpc") == Some(&json!("2.0")) => {
            Incoming::Reply(error_reply(
                id,
                INVALID_PARAMS,
                format!("Invalid params for {method}: {typed_error}"),
            ))
        }
        // A response to a request this server never sent, or a malformed one: nothing to say.
        (true, None) if object.contains_key("result") || object.contains_key("error") => {
            Incoming::Ignore
        }
        _ => Incoming::Reply(error_reply(
            id,
            INVALID_REQUEST,
            "Invalid Request: expected a JSON-RPC 2.0 request with \"jsonrpc\":\"2.0\", a string \
             or integer \"id\" and a string \"method\""
                .to_owned(),
        )),
    }
}

/// Client-to-server request methods of the MCP specification.
const STANDARD_REQUEST_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "subscriptions/listen",
    "completion/complete",
    "logging/setLevel",
];

/// Why a request with a standard method did not parse as that method, `None` for a method
/// outside the specification (the handler answers "method not found").
fn standard_method_params_error(request: &CustomRequest) -> Option<String> {
    if !STANDARD_REQUEST_METHODS.contains(&request.method.as_str()) {
        return None;
    }
    let params = request.params.clone().unwrap_or(Value::Null);
    let detail = match request.method.as_str() {
        "tools/call" => serde_json::from_value::<CallToolRequestParams>(params).err(),
        "initialize" => serde_json::from_value::<InitializeRequestParams>(params).err(),
        _ => None,
    };
    Some(match detail {
        Some(error) => error.to_string(),
        None => "the params do not match the method's schema".to_owned(),
    })
}

/// JSON-RPC ids are strings or integers (this server never accepts `null` or fractions).
fn is_usable_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

fn error_reply(id: Option<Value>, code: i64, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn oversized_reply(bytes: usize, max: usize) -> Value {
    error_reply(
        None,
        INVALID_REQUEST,
        format!(
            "Invalid Request: message of {bytes} bytes exceeds the limit of {max} bytes and was \
             discarded; send smaller arguments (e.g. write large files in parts)"
        ),
    )
}

/// Whether delivering `request` moves the SDK out of its pre-initialisation phase: an
/// `initialize` request, or (2026-07-28 lifecycle) a request carrying complete per-request
/// metadata. Ping and discover are answered without starting it.
fn starts_lifecycle(request: &ClientRequest) -> bool {
    match request {
        ClientRequest::InitializeRequest(_) => true,
        ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_) => false,
        other => {
            let meta = other.get_meta();
            meta.protocol_version().is_some()
                && meta
                    .missing_required_keys(&ProtocolVersion::V_2026_07_28)
                    .is_empty()
        }
    }
}

async fn write_line<T: serde::Serialize>(writer: &SharedWriter, item: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(item).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut writer = writer.lock().await;
    writer.write_all(&line).await?;
    writer.flush().await
}

impl Transport<RoleServer> for LineTransport {
    type Error = std::io::Error;

    fn name() -> Cow<'static, str> {
        Cow::Borrowed("cordon-stdio")
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let writer = self.writer.clone();
        async move { write_line(&writer, &item).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let line = match self.frames.recv().await? {
                Frame::Line(line) => line,
                Frame::Oversized { bytes } => {
                    self.reply(oversized_reply(bytes, self.max_message_bytes))
                        .await;
                    continue;
                }
                Frame::ReadFailed(reason) => {
                    eprintln!("cordon mcp: failed to read the input stream: {reason}");
                    return None;
                }
            };
            match classify(&line) {
                Incoming::Message(message) => {
                    let message = *message;
                    match &message {
                        ClientJsonRpcMessage::Request(request) => {
                            self.lifecycle_started |= starts_lifecycle(&request.request);
                        }
                        ClientJsonRpcMessage::Notification(_)
                        | ClientJsonRpcMessage::Response(_)
                        | ClientJsonRpcMessage::Error(_) => {
                            if !self.lifecycle_started {
                                continue;
                            }
                        }
                    }
                    return Some(message);
                }
                Incoming::Reply(reply) => self.reply(reply).await,
                Incoming::Ignore => {}
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.writer.lock().await.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(line: &str) -> Value {
        match classify(line.as_bytes()) {
            Incoming::Reply(reply) => reply,
            other => panic!("expected a reply for {line:?}, got {other:?}"),
        }
    }

    fn code_and_id(reply: &Value) -> (i64, Value) {
        (
            reply["error"]["code"].as_i64().unwrap(),
            reply["id"].clone(),
        )
    }

    #[test]
    fn well_formed_messages_pass_through() {
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":"a","method":"no/such/method","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\r",
        ] {
            assert!(
                matches!(classify(line.as_bytes()), Incoming::Message(_)),
                "{line}"
            );
        }
    }

    #[test]
    fn blank_lines_are_ignored() {
        assert!(matches!(classify(b""), Incoming::Ignore));
        assert!(matches!(classify(b"  \t\r"), Incoming::Ignore));
    }

    #[test]
    fn invalid_json_is_a_parse_error_without_id() {
        let reply = reply(r#"{"jsonrpc":"2.0","id":1,"method":"#);
        assert_eq!(code_and_id(&reply), (PARSE_ERROR, Value::Null));
        assert_eq!(reply["jsonrpc"], "2.0");
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("Parse error")
        );
        assert_eq!(code_and_id(&self::reply("\u{1}garbage")).0, PARSE_ERROR);
    }

    #[test]
    fn batches_and_scalars_are_invalid_requests() {
        let batch = reply(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
        assert_eq!(code_and_id(&batch), (INVALID_REQUEST, Value::Null));
        assert!(
            batch["error"]["message"]
                .as_str()
                .unwrap()
                .contains("batches")
        );
        assert_eq!(code_and_id(&reply("42")), (INVALID_REQUEST, Value::Null));
    }

    #[test]
    fn known_method_with_bad_params_is_invalid_params_with_the_id() {
        let reply = reply(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"x":1}}"#);
        assert_eq!(code_and_id(&reply), (INVALID_PARAMS, json!(7)));
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap()
                .contains("tools/call")
        );
    }

    #[test]
    fn objects_that_are_not_messages_are_invalid_requests() {
        assert_eq!(
            code_and_id(&reply(r#"{"hello":"world"}"#)),
            (INVALID_REQUEST, Value::Null)
        );
        assert_eq!(
            code_and_id(&reply(r#"{"jsonrpc":"1.0","id":"x","method":5}"#)),
            (INVALID_REQUEST, json!("x"))
        );
        assert_eq!(
            code_and_id(&reply(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#)),
            (INVALID_REQUEST, Value::Null)
        );
    }

    #[test]
    fn malformed_notifications_and_stray_responses_get_no_answer() {
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":5}"#),
            Incoming::Ignore
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":3,"error":"nope"}"#),
            Incoming::Ignore
        ));
    }

    #[test]
    fn oversized_reply_names_both_sizes() {
        let reply = oversized_reply(20, 10);
        assert_eq!(code_and_id(&reply), (INVALID_REQUEST, Value::Null));
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("20 bytes") && message.contains("10 bytes"),
            "{message}"
        );
    }

    #[test]
    fn only_initialize_or_complete_inline_metadata_starts_the_lifecycle() {
        let request = |line: &str| match classify(line.as_bytes()) {
            Incoming::Message(message) => match *message {
                ClientJsonRpcMessage::Request(request) => request.request,
                other => panic!("not a request: {other:?}"),
            },
            other => panic!("not a message: {other:?}"),
        };
        assert!(starts_lifecycle(&request(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#
        )));
        assert!(!starts_lifecycle(&request(
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#
        )));
        assert!(!starts_lifecycle(&request(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
        )));
    }
}
