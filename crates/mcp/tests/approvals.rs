//! `ask` decisions over raw JSON-RPC to a client that declared elicitation: the replies a
//! well-behaved SDK never sends (an error, a result of the wrong kind), a call cancelled
//! while its question is pending, and a network question nobody waits for any more.

use std::sync::Arc;
use std::time::Duration;

use cordon_mcp::{ElicitationApprover, McpServer, ServeEnd, ServeOptions};
use cordon_runtime::{Approver, Session, SessionOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound for anything the server must do; generous for a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(120);

const ASK_POLICY: &str = r#"version = 1
default = "allow"

[tools]
enabled = ["read", "write", "ls"]

[filesystem]
read = ["**"]
write = ["**"]

[[rules]]
tool = "write"
path = "**"
decision = "ask"
reason = "writes need a person's approval"
"#;

struct Client {
    to_server: DuplexStream,
    from_server: Lines<BufReader<DuplexStream>>,
    served: JoinHandle<Result<ServeEnd, cordon_mcp::McpError>>,
    shutdown: CancellationToken,
    root: tempfile::TempDir,
    _policy: tempfile::TempDir,
}

/// Bash with filtered network: 127.0.0.2 (any port) needs a person's approval; the allow
/// entry only turns filtered mode on.
const EGRESS_ASK_POLICY: &str = r#"version = 1
default = "allow"

[tools]
enabled = ["bash"]

[filesystem]
read = ["**"]
write = ["**"]

[network]
allow = ["allowed.invalid"]
ask = ["127.0.0.2"]
"#;

/// A server whose session asks through elicitation, and a client that declared it.
async fn start() -> Client {
    start_with(ASK_POLICY).await
}

/// [`start`] with another policy.
async fn start_with(policy_text: &str) -> Client {
    let root = tempfile::tempdir().unwrap();
    let policy = tempfile::tempdir().unwrap();
    let policy_path = policy.path().join("ask.toml");
    std::fs::write(&policy_path, policy_text).unwrap();
    let approvals = Arc::new(ElicitationApprover::new(PATIENCE));
    let session = Session::open(SessionOptions {
        policy: Some(policy_path),
        approver: Some(approvals.clone() as Arc<dyn Approver>),
        ..SessionOptions::local(root.path())
    })
    .await
    .unwrap();
    let options = ServeOptions {
        approvals: Some(approvals),
        ..ServeOptions::default()
    };
    let server = McpServer::new(Arc::new(session), options).unwrap();
    let (to_server, server_input) = tokio::io::duplex(1 << 16);
    let (server_output, from_server) = tokio::io::duplex(1 << 16);
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(server.serve((server_input, server_output), shutdown.clone()));
    let mut client = Client {
        to_server,
        from_server: BufReader::new(from_server).lines(),
        served,
        shutdown,
        root,
        _policy: policy,
    };
    client
        .send(json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {"elicitation": {}},
                "clientInfo": {"name": "raw", "version": "1"}
            }
        }))
        .await;
    let initialized = client.next(|message| message["id"] == 1).await;
    assert!(initialized["result"].is_object(), "{initialized}");
    client
        .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    client
}

impl Client {
    async fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.to_server.write_all(&line).await.unwrap();
    }

    /// The next message from the server that satisfies `wanted` (others are skipped).
    async fn next(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
        loop {
            let line = tokio::time::timeout(PATIENCE, self.from_server.next_line())
                .await
                .expect("a message in time")
                .unwrap()
                .expect("the server is still writing");
            let message: Value = serde_json::from_str(&line).unwrap();
            if wanted(&message) {
                return message;
            }
        }
    }

    /// Call `write` on `path`; the id of the question it raised.
    async fn write_and_get_asked(&mut self, path: &str) -> Value {
        self.send(json!({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "write", "arguments": {"path": path, "content": "x"}}
        }))
        .await;
        let question = self
            .next(|message| message["method"] == "elicitation/create")
            .await;
        let message = question["params"]["message"].as_str().unwrap();
        assert!(message.contains(path), "{message}");
        question["id"].clone()
    }

    /// The text of the `write` call's result, which must be an error.
    async fn denial(&mut self) -> String {
        let response = self.next(|message| message["id"] == 2).await;
        assert_eq!(response["result"]["isError"], true, "{response}");
        response["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn end(self) {
        self.shutdown.cancel();
        let end = tokio::time::timeout(PATIENCE, self.served)
            .await
            .expect("the server ends in time")
            .unwrap()
            .unwrap();
        assert_eq!(end, ServeEnd::ShutdownRequested);
    }
}

#[tokio::test]
async fn an_error_reply_to_the_question_is_a_denial_that_says_so() {
    let mut client = start().await;
    let id = client.write_and_get_asked("a.txt").await;
    client
        .send(json!({
            "jsonrpc": "2.0", "id": id,
            "error": {"code": -32603, "message": "the form could not be shown"}
        }))
        .await;
    let text = client.denial().await;
    assert!(
        text.contains("no answer was obtained (failed to ask the user through the MCP client: ")
            && text.contains("the form could not be shown"),
        "{text}"
    );
    assert!(!client.root.path().join("a.txt").exists());
    client.end().await;
}

#[tokio::test]
async fn a_reply_that_is_no_elicitation_result_is_a_denial_that_says_so() {
    let mut client = start().await;
    let id = client.write_and_get_asked("b.txt").await;
    client
        .send(json!({"jsonrpc": "2.0", "id": id, "result": {"roots": []}}))
        .await;
    let text = client.denial().await;
    assert!(
        text.contains("no answer was obtained (the client's reply to the question was malformed"),
        "{text}"
    );
    assert!(!client.root.path().join("b.txt").exists());
    client.end().await;
}

#[tokio::test]
async fn cancelling_the_call_withdraws_its_question() {
    let mut client = start().await;
    let id = client.write_and_get_asked("c.txt").await;
    client
        .send(json!({
            "jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 2, "reason": "the user pressed Esc"}
        }))
        .await;
    let withdrawn = client
        .next(|message| message["method"] == "notifications/cancelled")
        .await;
    assert_eq!(withdrawn["params"]["requestId"], id, "{withdrawn}");
    assert_eq!(
        withdrawn["params"]["reason"], "the tool call was cancelled",
        "{withdrawn}"
    );
    assert!(!client.root.path().join("c.txt").exists());
    client.end().await;
}

#[tokio::test]
async fn a_network_question_nobody_waits_for_any_more_is_withdrawn() {
    let mut client = start_with(EGRESS_ASK_POLICY).await;
    // The command asks the egress proxy for 127.0.0.2:9 (a question), then ends once the
    // test says so; its connection, still waiting for the answer, is then cut.
    let command = "exec 3<>/dev/tcp/127.0.0.1/3128 && \
                   printf 'CONNECT 127.0.0.2:9 HTTP/1.1\\r\\n\\r\\n' >&3 && \
                   until [ -e go ]; do sleep 0.05; done";
    client
        .send(json!({
            "jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": command}}
        }))
        .await;
    let question = client
        .next(|message| message["method"] == "elicitation/create")
        .await;
    let message = question["params"]["message"].as_str().unwrap();
    assert!(message.contains("Destination: 127.0.0.2:9\n"), "{message}");
    std::fs::write(client.root.path().join("go"), "").unwrap();
    // Both come, in either order: the question's withdrawal and the call's result.
    let (mut withdrawn, mut result) = (None, None);
    while withdrawn.is_none() || result.is_none() {
        let message = client
            .next(|message| message["method"] == "notifications/cancelled" || message["id"] == 3)
            .await;
        if message["id"] == 3 {
            result = Some(message);
        } else {
            withdrawn = Some(message);
        }
    }
    let (withdrawn, result) = (withdrawn.unwrap(), result.unwrap());
    assert_eq!(
        (
            &withdrawn["params"]["requestId"],
            &withdrawn["params"]["reason"]
        ),
        (&question["id"], &json!("the question is no longer needed")),
        "{withdrawn}"
    );
    assert!(result["result"].is_object(), "{result}");
    client.end().await;
}
