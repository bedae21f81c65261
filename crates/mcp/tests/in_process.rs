//! `McpServer::serve` over `tokio::io::duplex`: listing, calling, and both ends of a session.

use std::sync::Arc;
use std::time::Duration;

use cordon_mcp::{McpServer, ServeEnd, ServeOptions};
use cordon_runtime::{Session, SessionOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound for anything the server must do; generous for a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(120);

struct Client {
    to_server: DuplexStream,
    from_server: Lines<BufReader<DuplexStream>>,
    served: JoinHandle<Result<ServeEnd, cordon_mcp::McpError>>,
    shutdown: CancellationToken,
    _root: tempfile::TempDir,
}

async fn start() -> Client {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("hello.txt"), "hello\n").unwrap();
    let session = Session::open(SessionOptions::local(root.path()))
        .await
        .unwrap();
    let server = McpServer::new(Arc::new(session), ServeOptions::default()).unwrap();
    let (to_server, server_input) = tokio::io::duplex(1 << 16);
    let (server_output, from_server) = tokio::io::duplex(1 << 16);
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(server.serve((server_input, server_output), shutdown.clone()));
    Client {
        to_server,
        from_server: BufReader::new(from_server).lines(),
        served,
        shutdown,
        _root: root,
    }
}

impl Client {
    async fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.to_server.write_all(&line).await.unwrap();
    }

    async fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
            .await;
        loop {
            let line = tokio::time::timeout(PATIENCE, self.from_server.next_line())
                .await
                .expect("a response in time")
                .unwrap()
                .expect("the server is still writing");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message.get("method").is_none() {
                assert_eq!(message["id"], json!(id), "{message}");
                return message;
            }
        }
    }

    async fn initialize(&mut self) -> Value {
        let response = self
            .request(
                0,
                "initialize",
                json!({"protocolVersion":"2025-06-18","capabilities":{},
                       "clientInfo":{"name":"in-process","version":"1"}}),
            )
            .await;
        self.send(json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        response
    }

    async fn ended(self) -> ServeEnd {
        tokio::time::timeout(PATIENCE, self.served)
            .await
            .expect("the server stopped in time")
            .unwrap()
            .expect("a clean end")
    }
}

#[tokio::test]
async fn initialize_list_and_call_then_eof_ends_cleanly() {
    let mut client = start().await;
    let init = client.initialize().await;
    assert_eq!(init["result"]["capabilities"]["tools"], json!({}), "{init}");
    assert!(
        init["result"]["instructions"]
            .as_str()
            .unwrap()
            .contains("sandbox")
    );

    let listed = client.request(1, "tools/list", json!({})).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["read", "bash", "edit", "write", "grep", "find", "ls"]
    );

    let read = client
        .request(
            2,
            "tools/call",
            json!({"name":"read","arguments":{"path":"hello.txt"}}),
        )
        .await;
    assert_eq!(
        read["result"]["content"],
        json!([{"type":"text","text":"hello\n"}])
    );
    assert_eq!(read["result"]["isError"], false);

    drop(client.to_server);
    let served = tokio::time::timeout(PATIENCE, client.served)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(served.unwrap(), ServeEnd::InputClosed);
}

#[tokio::test]
async fn bash_fails_closed_without_the_os_sandbox_or_an_explicit_downgrade() {
    // This session did not accept a degraded sandbox: on a host (or branch) without the OS
    // sandbox, bash must refuse to run rather than run unconfined; with it, it runs.
    let mut client = start().await;
    client.initialize().await;
    let response = client
        .request(
            1,
            "tools/call",
            json!({"name":"bash","arguments":{"command":"echo confined"}}),
        )
        .await;
    let result = &response["result"];
    let text = result["content"][0]["text"].as_str().unwrap();
    if result["isError"] == true {
        assert!(text.contains("sandbox"), "{response}");
    } else {
        assert_eq!(text, "confined\n", "{response}");
        let sandbox = &result["_meta"][cordon_mcp::DETAILS_META_KEY]["sandbox"];
        assert_ne!(
            sandbox["degraded"], true,
            "ran degraded without opt-in: {response}"
        );
    }
}

#[tokio::test]
async fn shutdown_token_ends_the_session() {
    let mut client = start().await;
    client.initialize().await;
    client.shutdown.cancel();
    let end = client.ended().await;
    assert_eq!(end, ServeEnd::ShutdownRequested);
}

#[tokio::test]
async fn shutdown_before_initialize_ends_the_session() {
    let client = start().await;
    client.shutdown.cancel();
    assert_eq!(client.ended().await, ServeEnd::ShutdownRequested);
}
