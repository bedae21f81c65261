//! End-to-end tests of `cordon mcp`.
//!
//! - With a real, independent client: the official MCP Python SDK (`tests/mcp/client.py`)
//!   starts the binary and drives one scenario per test (tools, calls, denial, invalid
//!   arguments, progress, cancellation, parallelism). A missing SDK fails the test with the
//!   command that installs it.
//! - Protocol robustness with raw JSON-RPC lines written to the binary's stdin: malformed
//!   JSON, batches, unknown methods, bad params, oversized messages, stray notifications, and
//!   the ends of a session (stdin EOF, SIGTERM) with and without a call in flight.
//! - Approvals of `ask` decisions through MCP elicitation ([`approvals`]).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod approvals;

/// Upper bound for anything the server must do; generous for a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(120);

/// The bearer token the `--http` tests give the server and the client.
const HTTP_TOKEN: &str = "cordon-test-token-0123456789";

const CLIENT_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/client.py");

fn cordon() -> &'static str {
    env!("CARGO_BIN_EXE_cordon")
}

/// A workspace with a `.git/config` the default policy protects.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("create a temporary workspace");
    std::fs::create_dir(dir.path().join(".git")).unwrap();
    std::fs::write(dir.path().join(".git/config"), "original\n").unwrap();
    dir
}

fn mcp_args(root: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["mcp".to_owned(), "--root".to_owned()];
    args.push(root.display().to_string());
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    args
}

/// Wait for `child` to exit, killing it after [`PATIENCE`].
fn wait_with_patience(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().expect("poll child") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// --- the Python SDK client ---------------------------------------------------------------

fn require_python_sdk() {
    let probe = Command::new("python3")
        .args(["-c", "import mcp, anyio"])
        .output();
    match probe {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "the MCP Python SDK is not installed ({}); install it with: python3 -m pip install mcp",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(error) => panic!(
            "python3 is not available ({error}); install Python 3.10+ and then: \
             python3 -m pip install mcp"
        ),
    }
}

/// Run one scenario of `client.py` against `cordon mcp --root root EXTRA…` (started by the
/// client over stdio); its JSON report.
fn python_scenario(scenario: &str, root: &Path, extra: &[&str]) -> Value {
    let mut target = vec!["--".to_owned(), cordon().to_owned()];
    target.extend(mcp_args(root, extra));
    run_python_client(scenario, root, &target)
}

/// Run one scenario of `client.py` against a running `cordon mcp --http` at `url`.
fn python_http_scenario(scenario: &str, root: &Path, url: &str) -> Value {
    run_python_client(scenario, root, &["--url".to_owned(), url.to_owned()])
}

fn run_python_client(scenario: &str, root: &Path, target: &[String]) -> Value {
    require_python_sdk();
    let mut command = Command::new("python3");
    command
        .arg(CLIENT_SCRIPT)
        .arg(scenario)
        .arg(root)
        .args(target)
        .env("CORDON_MCP_TOKEN", HTTP_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("start the Python MCP client");
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let status = wait_with_patience(&mut child, &format!("python client scenario {scenario}"));
    let stdout = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(
        status.success(),
        "scenario {scenario} failed ({status}):\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}"
    );
    let report = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(report).unwrap_or_else(|error| {
        panic!("scenario {scenario} printed no JSON report ({error}): {stdout}")
    })
}

fn drain(mut pipe: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

/// The tool definitions a session over `root` with `policy` offers a model.
fn session_definitions(
    root: &Path,
    policy: Option<PathBuf>,
) -> Vec<cordon_core::protocol::ToolDefinition> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = cordon_runtime::SessionOptions {
            policy,
            ..cordon_runtime::SessionOptions::local(root)
        };
        let session = cordon_runtime::Session::open(options)
            .await
            .expect("open a session");
        let definitions = session.definitions();
        session.shutdown().await.expect("shut the session down");
        definitions
    })
}

fn assert_tools_match_session(listed: &Value, root: &Path, policy: Option<PathBuf>) {
    let expected = session_definitions(root, policy);
    let listed = listed.as_array().expect("a tool list");
    let names = |tools: &[Value]| -> Vec<String> {
        tools
            .iter()
            .map(|tool| tool["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(listed),
        expected
            .iter()
            .map(|tool| tool.name.clone())
            .collect::<Vec<_>>()
    );
    for (tool, definition) in listed.iter().zip(&expected) {
        assert_eq!(
            tool["description"],
            json!(definition.description),
            "{}",
            definition.name
        );
        assert_eq!(
            tool["inputSchema"], definition.parameters,
            "{}",
            definition.name
        );
    }
}

#[test]
fn python_client_lists_every_enabled_tool_with_the_loop_schemas() {
    let dir = workspace();
    let report = python_scenario("list", dir.path(), &[]);
    assert_tools_match_session(&report["tools"], dir.path(), None);
    let read = &report["tools"][0];
    assert_eq!(read["annotations"]["readOnlyHint"], true);
}

#[test]
fn python_client_sees_only_the_tools_the_policy_enables() {
    let dir = workspace();
    let policy = dir.path().join("only-read-ls.toml");
    std::fs::write(
        &policy,
        "version = 1\ndefault = \"allow\"\n\n[tools]\nenabled = [\"read\", \"ls\"]\n",
    )
    .unwrap();
    let report = python_scenario("list", dir.path(), &["--policy", policy.to_str().unwrap()]);
    let names: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read", "ls"]);
    assert_tools_match_session(&report["tools"], dir.path(), Some(policy));
}

#[test]
fn python_client_calls_write_read_edit_bash_through_the_audited_pipeline() {
    let dir = workspace();
    // Outside the workspace: an audit log the sandbox can write is refused.
    let logs = tempfile::tempdir().expect("temp dir");
    let audit = logs.path().join("audit.jsonl");
    python_scenario("calls", dir.path(), &["--audit", audit.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/todo.txt")).unwrap(),
        "alpha\ngamma\n"
    );
    let log = std::fs::read_to_string(&audit).expect("the audit log was written");
    cordon_policy::audit::verify_audit_log(&log).expect("the audit log's hash chain is intact");
    let records: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    for tool in ["write", "read", "edit", "bash", "ls", "find", "grep"] {
        let calls: Vec<&Value> = records
            .iter()
            .filter(|record| record["tool"] == tool)
            .collect();
        assert!(!calls.is_empty(), "no audit record for {tool}: {log}");
        for record in calls {
            let id = record["toolCallId"].as_str().unwrap();
            assert!(id.starts_with("mcp-"), "unexpected call id {id}");
        }
    }
    let failed_bash = records
        .iter()
        .any(|record| record["tool"] == "bash" && record["isError"] == true);
    assert!(
        failed_bash,
        "the failing bash call is not audited as an error: {log}"
    );
}

#[test]
fn python_client_gets_a_policy_denial_as_a_tool_error() {
    let dir = workspace();
    let report = python_scenario("denied", dir.path(), &[]);
    assert!(
        report["denial"].as_str().unwrap().contains("protected"),
        "{report}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".git/config")).unwrap(),
        "original\n",
        "a denied write changed the file"
    );
}

#[test]
fn python_client_gets_invalid_arguments_as_tool_errors() {
    let dir = workspace();
    let report = python_scenario("invalid", dir.path(), &[]);
    assert!(
        report["missing"]
            .as_str()
            .unwrap()
            .contains("Validation failed for tool \"read\""),
        "{report}"
    );
    assert!(
        report["wrongType"].as_str().unwrap().contains("edits"),
        "{report}"
    );
    assert_eq!(report["unknown"], "Tool no_such_tool not found");
}

#[test]
fn python_client_receives_bash_output_as_progress_notifications() {
    let dir = workspace();
    let report = python_scenario("progress", dir.path(), &[]);
    let updates = report["updates"].as_array().unwrap();
    assert!(
        updates.iter().any(|update| update["message"]
            .as_str()
            .is_some_and(|message| message.contains("first-line"))),
        "{report}"
    );
}

#[test]
fn python_client_cancellation_kills_the_process_tree() {
    let dir = workspace();
    let report = python_scenario("cancel", dir.path(), &[]);
    let killed = report["killed"].as_array().unwrap();
    assert!(
        killed.len() >= 2,
        "expected the shell and its child: {report}"
    );
}

#[test]
fn python_client_parallel_calls_overlap_and_edits_of_one_file_serialise() {
    let dir = workspace();
    python_scenario("parallel", dir.path(), &[]);
}

// --- raw JSON-RPC -------------------------------------------------------------------------

/// `cordon mcp` with raw access to its stdin and stdout lines.
struct RawServer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl RawServer {
    fn start(root: &Path) -> RawServer {
        RawServer::start_with(root, &[], &[])
    }

    fn start_with(root: &Path, extra: &[&str], env: &[(&str, &str)]) -> RawServer {
        let mut child = Command::new(cordon())
            .args(mcp_args(root, extra))
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cordon mcp");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut pipe = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            let mut line = String::new();
            while pipe.read_line(&mut line).is_ok_and(|read| read > 0) {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        RawServer {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(bytes).expect("write to cordon mcp");
        stdin.flush().unwrap();
    }

    fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    fn next_message(&self) -> Value {
        match self.lines.recv_timeout(PATIENCE) {
            Ok(line) => serde_json::from_str(&line)
                .unwrap_or_else(|error| panic!("stdout line is not JSON ({error}): {line}")),
            Err(error) => panic!(
                "no message from cordon mcp ({error}); stderr:\n{}",
                self.stderr()
            ),
        }
    }

    /// The next message that is not a notification.
    fn next_response(&self) -> Value {
        loop {
            let message = self.next_message();
            if message.get("method").is_none() {
                return message;
            }
        }
    }

    fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        let response = self.next_response();
        assert_eq!(response["id"], json!(id), "{response}");
        response
    }

    fn initialize(&mut self) {
        let response = self.request(
            0,
            "initialize",
            json!({"protocolVersion":"2025-06-18","capabilities":{},
                   "clientInfo":{"name":"raw-test","version":"1"}}),
        );
        assert_eq!(
            response["result"]["serverInfo"]["name"], "cordon",
            "{response}"
        );
        self.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    }

    /// A cheap request proving the session still works.
    fn assert_alive(&mut self, id: i64) {
        let response = self.request(id, "tools/list", json!({}));
        assert!(
            !response["result"]["tools"].as_array().unwrap().is_empty(),
            "{response}"
        );
    }

    fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    fn wait_exit(&mut self) -> ExitStatus {
        wait_with_patience(&mut self.child, "cordon mcp")
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn error_code(response: &Value) -> i64 {
    response["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error response: {response}"))
}

#[test]
fn raw_malformed_json_gets_a_parse_error_and_the_session_goes_on() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.initialize();
    server.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\n");
    let response = server.next_response();
    assert_eq!(error_code(&response), -32700, "{response}");
    assert_eq!(response["id"], Value::Null);
    server.send_raw(b"\x00\xff not json at all\n");
    assert_eq!(error_code(&server.next_response()), -32700);
    server.assert_alive(2);
}

#[test]
fn raw_unknown_method_gets_method_not_found() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.initialize();
    let response = server.request(5, "cordon/nonsense", json!({}));
    assert_eq!(error_code(&response), -32601, "{response}");
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cordon/nonsense")
    );
    server.assert_alive(6);
}

#[test]
fn raw_batches_and_bad_params_get_invalid_request_and_invalid_params() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.initialize();
    server.send(&json!([{"jsonrpc":"2.0","id":1,"method":"tools/list"}]));
    let batch = server.next_response();
    assert_eq!(error_code(&batch), -32600, "{batch}");
    let bad = server.request(2, "tools/call", json!({"arguments": {"path": "a"}}));
    assert_eq!(error_code(&bad), -32602, "{bad}");
    assert!(
        bad["error"]["message"].as_str().unwrap().contains("name"),
        "{bad}"
    );
    server.send(&json!({"jsonrpc":"2.0","id":3}));
    assert_eq!(error_code(&server.next_response()), -32600);
    server.assert_alive(4);
}

#[test]
fn raw_oversized_message_is_rejected_and_the_session_goes_on() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.initialize();
    let limit = cordon_mcp::DEFAULT_MAX_MESSAGE_BYTES;
    let padding = "x".repeat(limit + 1024);
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{{\"name\":\"write\",\
         \"arguments\":{{\"path\":\"big.txt\",\"content\":\"{padding}\"}}}}}}\n"
    );
    server.send_raw(line.as_bytes());
    let response = server.next_response();
    assert_eq!(error_code(&response), -32600, "{response}");
    let message = response["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("limit of {limit} bytes")),
        "{message}"
    );
    assert!(
        !dir.path().join("big.txt").exists(),
        "the oversized call ran"
    );
    server.assert_alive(2);
}

#[test]
fn raw_stray_messages_before_initialize_do_not_end_the_session() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    server.send(&json!({"jsonrpc":"2.0","id":99,"result":{}}));
    server.send_raw(b"garbage\n");
    assert_eq!(error_code(&server.next_response()), -32700);
    let early = server.request(1, "tools/list", json!({}));
    assert!(
        early.get("error").is_some(),
        "tools/list before initialize: {early}"
    );
    server.initialize();
    server.assert_alive(2);
}

#[test]
fn raw_tool_call_returns_content_structured_content_and_is_error() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.initialize();
    let response = server.request(
        1,
        "tools/call",
        json!({"name":"bash","arguments":{"command":"printf 'out\\n'; exit 2"}}),
    );
    let result = &response["result"];
    assert_eq!(result["isError"], true, "{response}");
    assert_eq!(result["structuredContent"]["exitCode"], 2, "{response}");
    assert_eq!(result["structuredContent"]["output"], "out\n", "{response}");
    assert_eq!(result["content"][0]["type"], "text");
}

#[test]
fn raw_server_under_a_builtin_policy_cites_it_in_denials() {
    let dir = workspace();
    let mut server = RawServer::start_with(dir.path(), &["--policy", "builtin:ci-untrusted"], &[]);
    server.initialize();
    let response = server.request(
        1,
        "tools/call",
        json!({"name":"bash","arguments":{"command":"curl https://example.com"}}),
    );
    let result = &response["result"];
    assert_eq!(result["isError"], true, "{response}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("Blocked by policy (builtin:ci-untrusted.toml:"),
        "{response}"
    );
}

#[test]
fn raw_stdin_eof_exits_zero() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.initialize();
    server.assert_alive(1);
    server.close_stdin();
    let status = server.wait_exit();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        server.stderr()
    );
}

#[test]
fn raw_logs_at_vv_go_to_stderr_and_never_into_the_protocol_stream() {
    let dir = workspace();
    let neutral = [("CORDON_LOG", ""), ("RUST_LOG", "")];
    let mut server = RawServer::start_with(dir.path(), &["-vv"], &neutral);
    server.initialize();
    server.assert_alive(1);
    let response = server.request(
        2,
        "tools/call",
        json!({"name":"bash","arguments":{"command":"echo out"}}),
    );
    assert_eq!(response["result"]["isError"], false, "{response}");
    server.close_stdin();
    let status = server.wait_exit();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        server.stderr()
    );
    // Every line left on stdout (up to its close) is a JSON-RPC message.
    while let Ok(line) = server.lines.recv_timeout(PATIENCE) {
        let message: Value = serde_json::from_str(&line)
            .unwrap_or_else(|error| panic!("stdout line is not JSON ({error}): {line}"));
        assert_eq!(message["jsonrpc"], "2.0", "{line}");
    }
    // stderr's reader may still be draining the pipe: wait for the last event.
    let start = Instant::now();
    while !server.stderr().contains("session stopped") {
        assert!(start.elapsed() < PATIENCE, "stderr:\n{}", server.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
    let stderr = server.stderr();
    for needle in ["session started", "policy decision", " DEBUG "] {
        assert!(
            stderr.contains(needle),
            "{needle:?} not in stderr:\n{stderr}"
        );
    }
}

#[test]
fn raw_stdin_eof_before_initialize_exits_zero() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.close_stdin();
    let status = server.wait_exit();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        server.stderr()
    );
}

/// Start a long bash call whose processes carry a unique marker; return the marker once the
/// shell and its child run.
fn start_marked_sleep(server: &mut RawServer, root: &Path, id: i64) -> String {
    // Unique across the tests running concurrently in this process and across runs.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let marker = format!(
        "4{serial:03}.{:09}",
        (nanos + std::process::id()) % 1_000_000_000
    );
    let command = format!("sleep {marker} & echo $! > child.pid; echo $$ > shell.pid; wait");
    server.send(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
                        "params":{"name":"bash","arguments":{"command":command,"timeout":900}}}));
    let deadline = Instant::now() + PATIENCE;
    while !(root.join("child.pid").exists() && processes_with(&marker).len() >= 2) {
        assert!(
            Instant::now() < deadline,
            "the command did not start; stderr:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    marker
}

/// Host pids whose command line contains `marker` (works across PID namespaces).
fn processes_with(marker: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let running = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|stat| {
                let state = stat.rsplit_once(") ")?.1.chars().next()?;
                Some(state != 'Z' && state != 'X')
            })
            .unwrap_or(false);
        if running
            && cmdline
                .windows(marker.len())
                .any(|window| window == marker.as_bytes())
        {
            pids.push(pid);
        }
    }
    pids
}

fn assert_processes_end(marker: &str, stderr: impl Fn() -> String) {
    let deadline = Instant::now() + PATIENCE;
    while !processes_with(marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "processes {:?} outlived the session; stderr:\n{}",
            processes_with(marker),
            stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn raw_stdin_eof_with_a_call_in_flight_kills_it_and_exits_zero() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.initialize();
    let marker = start_marked_sleep(&mut server, dir.path(), 1);
    server.close_stdin();
    let status = server.wait_exit();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        server.stderr()
    );
    assert_processes_end(&marker, || server.stderr());
}

#[test]
fn raw_cancelled_notification_kills_the_call_and_sends_no_response() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.initialize();
    let marker = start_marked_sleep(&mut server, dir.path(), 7);
    server.send(&json!({"jsonrpc":"2.0","method":"notifications/cancelled",
                        "params":{"requestId":7,"reason":"test"}}));
    assert_processes_end(&marker, || server.stderr());
    // The next response is for the next request: the cancelled one gets none.
    server.assert_alive(8);
}

#[test]
fn raw_sigterm_ends_the_session_kills_calls_and_exits_zero() {
    let dir = workspace();
    let mut server = RawServer::start(dir.path());
    server.initialize();
    let marker = start_marked_sleep(&mut server, dir.path(), 1);
    let pid = server.child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let status = server.wait_exit();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        server.stderr()
    );
    assert_processes_end(&marker, || server.stderr());
}

#[test]
fn unreadable_policy_is_a_configuration_error() {
    let dir = workspace();
    let output = Command::new(cordon())
        .args(mcp_args(
            dir.path(),
            &["--policy", "/nonexistent/policy.toml"],
        ))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "stdout must carry only JSON-RPC");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent/policy.toml"), "{stderr}");
}

// --- other backends ------------------------------------------------------------------------

/// Containers the Docker backend started for the process `pid`.
fn containers_of(docker_host: &str, pid: u32) -> Vec<String> {
    let output = Command::new("docker")
        .args(["ps", "-a", "-q", "--filter"])
        .arg(format!("label=cordon.owner.pid={pid}"))
        .env("DOCKER_HOST", docker_host)
        .output()
        .expect("run the docker CLI");
    assert!(output.status.success(), "docker ps failed: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn docker_backend_runs_calls_in_a_container_removed_at_stdin_eof() {
    if std::env::var("CORDON_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("skipped: CORDON_SKIP_DOCKER=1");
        return;
    }
    let docker_host = cordon_tests::infra::docker_host()
        .unwrap_or_else(|reason| panic!("no Docker engine for the docker backend: {reason}"));
    let dir = workspace();
    let mut server = RawServer::start_with(
        dir.path(),
        &["--backend", "docker"],
        &[("DOCKER_HOST", &docker_host)],
    );
    server.initialize();
    let written = server.request(
        1,
        "tools/call",
        json!({"name":"write","arguments":{"path":"from-mcp.txt","content":"inside\n"}}),
    );
    assert_eq!(written["result"]["isError"], false, "{written}");
    let bash = server.request(
        2,
        "tools/call",
        json!({"name":"bash","arguments":{"command":"cat from-mcp.txt; pwd"}}),
    );
    assert_eq!(bash["result"]["isError"], false, "{bash}");
    assert_eq!(
        bash["result"]["structuredContent"]["output"], "inside\n/workspace\n",
        "{bash}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("from-mcp.txt")).unwrap(),
        "inside\n"
    );
    let pid = server.child.id();
    assert_eq!(
        containers_of(&docker_host, pid).len(),
        1,
        "one container per session"
    );

    server.close_stdin();
    let status = server.wait_exit();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        server.stderr()
    );
    assert_eq!(
        containers_of(&docker_host, pid),
        Vec::<String>::new(),
        "the container outlived the session"
    );
}

#[test]
fn ssh_backend_runs_calls_on_the_remote_host_and_exits_cleanly() {
    if std::env::var("CORDON_SKIP_SSH").as_deref() == Ok("1") {
        eprintln!("skipped: CORDON_SKIP_SSH=1");
        return;
    }
    let sshd = cordon_tests::infra::sshd()
        .unwrap_or_else(|reason| panic!("no test sshd for the ssh backend: {reason}"));
    let dir = workspace();
    let host = format!("root@127.0.0.1:{}", sshd.port);
    let root = dir.path().to_str().unwrap();
    let mut extra = vec![
        "--backend",
        "ssh",
        "--host",
        &host,
        "--identity",
        sshd.key.to_str().unwrap(),
        "--known-hosts",
        sshd.known_hosts.to_str().unwrap(),
        "--ssh-config",
        sshd.ssh_config.to_str().unwrap(),
        "--remote-root",
        root,
    ];
    // The remote side cannot enforce the sandbox for commands in this phase, so the ssh
    // backend runs them only with an explicit downgrade (as the conformance suite does).
    extra.push("--allow-degraded");
    let mut server = RawServer::start_with(dir.path(), &extra, &[]);
    server.initialize();
    let written = server.request(
        1,
        "tools/call",
        json!({"name":"write","arguments":{"path":"over-ssh.txt","content":"remote\n"}}),
    );
    assert_eq!(written["result"]["isError"], false, "{written}");
    let bash = server.request(
        2,
        "tools/call",
        json!({"name":"bash","arguments":{"command":"cat over-ssh.txt"}}),
    );
    assert_eq!(
        bash["result"]["structuredContent"]["output"], "remote\n",
        "{bash}"
    );
    let denied = server.request(
        3,
        "tools/call",
        json!({"name":"write","arguments":{"path":".git/config","content":"x"}}),
    );
    assert_eq!(denied["result"]["isError"], true, "{denied}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".git/config")).unwrap(),
        "original\n"
    );
    server.close_stdin();
    let status = server.wait_exit();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        server.stderr()
    );
}

// --- streamable HTTP ----------------------------------------------------------------------

/// `cordon mcp --http 127.0.0.1:0` with [`HTTP_TOKEN`].
struct HttpServer {
    child: Child,
    url: String,
    stderr: Arc<Mutex<String>>,
}

impl HttpServer {
    fn start(root: &Path) -> HttpServer {
        HttpServer::start_with(root, &[])
    }

    /// `cordon mcp --http 127.0.0.1:0 EXTRA…` on `root`.
    fn start_with(root: &Path, extra: &[&str]) -> HttpServer {
        let mut args = vec!["--http", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let mut child = Command::new(cordon())
            .args(mcp_args(root, &args))
            .env("CORDON_MCP_TOKEN", HTTP_TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cordon mcp --http");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (sender, lines) = mpsc::channel();
        let sink = stderr.clone();
        let mut pipe = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            let mut line = String::new();
            while pipe.read_line(&mut line).is_ok_and(|read| read > 0) {
                sink.lock().unwrap().push_str(&line);
                let _ = sender.send(line.clone());
                line.clear();
            }
        });
        let url = loop {
            let line = lines.recv_timeout(PATIENCE).unwrap_or_else(|error| {
                panic!(
                    "cordon mcp --http did not announce its URL ({error}): {}",
                    stderr.lock().unwrap()
                )
            });
            if let Some((_, rest)) = line.split_once(" at http://") {
                let address = rest.split_whitespace().next().unwrap();
                break format!("http://{address}");
            }
        };
        assert!(url.ends_with(cordon_mcp::HTTP_PATH), "{url}");
        HttpServer { child, url, stderr }
    }

    /// `127.0.0.1:PORT`.
    fn authority(&self) -> &str {
        let rest = self.url.strip_prefix("http://").unwrap();
        &rest[..rest.find('/').unwrap()]
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        wait_with_patience(&mut self.child, "cordon mcp --http")
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 POST over a fresh connection; the status code and the whole response.
fn http_post(authority: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(authority).expect("connect");
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    let mut buffer = [0u8; 4096];
    // Read until the status line and a body fragment arrived; an SSE stream stays open.
    while !String::from_utf8_lossy(&response).contains("\r\n\r\n") {
        let read = stream.read(&mut buffer).expect("read the response");
        if read == 0 {
            break;
        }
        response.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status line: {text:?}"));
    (status, text)
}

const INITIALIZE_BODY: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw-http","version":"1"}}}"#;

#[test]
fn http_python_client_calls_streams_progress_and_cancels() {
    let dir = workspace();
    let mut server = HttpServer::start(dir.path());
    python_http_scenario("calls", dir.path(), &server.url);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/todo.txt")).unwrap(),
        "alpha\ngamma\n"
    );
    python_http_scenario("progress", dir.path(), &server.url);
    let report = python_http_scenario("cancel", dir.path(), &server.url);
    assert!(report["killed"].as_array().unwrap().len() >= 2, "{report}");
    python_http_scenario("denied", dir.path(), &server.url);
    let status = server.terminate();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        server.stderr()
    );
}

#[test]
fn http_requests_need_the_token_and_no_browser_origin() {
    let dir = workspace();
    let mut server = HttpServer::start(dir.path());
    let authority = server.authority().to_owned();
    let bearer = format!("Bearer {HTTP_TOKEN}");
    let path = cordon_mcp::HTTP_PATH;

    let (status, response) = http_post(&authority, path, &[], INITIALIZE_BODY);
    assert_eq!(status, 401, "{response}");
    assert!(
        response.to_lowercase().contains("www-authenticate: bearer"),
        "{response}"
    );
    let (status, _) = http_post(
        &authority,
        path,
        &[("Authorization", "Bearer wrong-token-0123456789")],
        INITIALIZE_BODY,
    );
    assert_eq!(status, 401);
    let (status, _) = http_post(
        &authority,
        "/other",
        &[("Authorization", &bearer)],
        INITIALIZE_BODY,
    );
    assert_eq!(status, 404);
    let (status, response) = http_post(
        &authority,
        path,
        &[
            ("Authorization", &bearer),
            ("Origin", "http://evil.example"),
        ],
        INITIALIZE_BODY,
    );
    assert_eq!(status, 403, "{response}");
    let (status, response) = http_post(
        &authority,
        path,
        &[("Authorization", &bearer)],
        INITIALIZE_BODY,
    );
    assert_eq!(status, 200, "{response}");

    let exit = server.terminate();
    assert!(exit.success(), "exit {exit}; stderr:\n{}", server.stderr());
}

#[test]
fn http_refuses_non_loopback_addresses_and_weak_tokens() {
    let dir = workspace();
    let output = Command::new(cordon())
        .args(mcp_args(dir.path(), &["--http", "0.0.0.0:0"]))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("loopback"),
        "{output:?}"
    );

    let output = Command::new(cordon())
        .args(mcp_args(dir.path(), &["--http", "127.0.0.1:0"]))
        .env("CORDON_MCP_TOKEN", "short")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("CORDON_MCP_TOKEN"),
        "{output:?}"
    );
}
