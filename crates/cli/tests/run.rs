//! `cordon run` end to end: the built binary against a scripted HTTP server on 127.0.0.1 that
//! streams recorded SSE transcripts of both wire formats (`tests/run/*.sse`: tool-call
//! arguments split across many deltas, several calls in one message, a length stop, error
//! events mid-stream), in a temporary workspace. The tests check the files the tools really
//! wrote, the requests the model server received, the events (`--json`), the terminal view,
//! retries, `--save` replayed by `cordon replay`, `--max-turns`, Ctrl-C, approvals and exit
//! codes. No test needs the network.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use cordon_model::testing::{Reply, TestServer};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

/// Upper bound for anything a test waits for (a loaded 2-core machine is slow, never stuck).
const PATIENCE: Duration = Duration::from_secs(120);

/// Provider variables the tests control; inherited values must not leak in.
const PROVIDER_VARIABLES: [&str; 6] = [
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_COMPATIBLE_API_KEY",
    "OPENAI_COMPATIBLE_BASE_URL",
];

const LIB_RS: &str = "pub fn answer() -> u32 {\n    41\n}\n";

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/run")
        .join(name)
}

/// The SSE events of a recorded transcript, one HTTP chunk each, as a server flushes them.
fn pieces(name: &str) -> Vec<Vec<u8>> {
    let path = fixture_path(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("failed to read fixture {}: {e}", path.display()));
    text.split_inclusive("\n\n")
        .map(|event| event.as_bytes().to_vec())
        .collect()
}

fn stream(name: &str) -> Reply {
    Reply::Stream(pieces(name))
}

/// A workspace with `src/lib.rs` (the bug: 41) and a README.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("create a temporary workspace");
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), LIB_RS).unwrap();
    std::fs::write(dir.path().join("README.md"), "# demo\n").unwrap();
    dir
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("failed to read {file} in the workspace: {e}"))
}

/// `cordon ARGS --root ROOT` with a clean provider environment, no colours and stdin not a
/// terminal.
fn cordon(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(CORDON);
    command.args(args).arg("--root").arg(root).current_dir(root);
    for name in PROVIDER_VARIABLES {
        command.env_remove(name);
    }
    command
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn finish(command: &mut Command) -> Output {
    let child = command.spawn().expect("spawn the cordon binary");
    tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("cordon did not exit within the test's patience")
        .expect("wait for cordon")
}

fn openai_run(server: &TestServer, prompt: &str) -> Vec<String> {
    vec![
        "run".into(),
        "--model".into(),
        "openai:gpt-4.1".into(),
        "--base-url".into(),
        format!("{}/v1", server.url()),
        prompt.into(),
    ]
}

fn anthropic_run(server: &TestServer, prompt: &str) -> Vec<String> {
    vec![
        "run".into(),
        "--model".into(),
        "anthropic:claude-sonnet-4-5".into(),
        "--base-url".into(),
        server.url(),
        prompt.into(),
    ]
}

const ANTHROPIC_KEY: (&str, &str) = ("ANTHROPIC_API_KEY", "sk-ant-test-key");

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn events(output: &Output) -> Vec<Value> {
    text(&output.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON event {line:?}: {e}"))
        })
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["type"].as_str().unwrap())
        .collect()
}

/// The messages of the final `agent_end` event.
fn final_messages(events: &[Value]) -> Vec<Value> {
    let end = events.last().expect("at least one event");
    assert_eq!(end["type"], "agent_end", "the last event ends the run");
    end["messages"].as_array().unwrap().clone()
}

fn tool_ends(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|event| event["type"] == "tool_execution_end")
        .collect()
}

fn assert_exit(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "exit status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_run_edits_writes_and_shows_the_terminal_view() {
    let ws = workspace();
    let server = TestServer::start(vec![
        stream("openai_edit_and_write.sse"),
        stream("openai_final.sse"),
    ])
    .await;
    let args = openai_run(&server, "Fix answer() and write notes.");
    let output = finish(&mut cordon(ws.path(), &refs(&args), &[])).await;
    assert_exit(&output, 0);

    // The tools really ran in the workspace.
    assert_eq!(read(ws.path(), "src/lib.rs"), LIB_RS.replace("41", "42"));
    assert_eq!(
        read(ws.path(), "notes.md"),
        "# Notes\n\nThe answer is 42 — fixed ✅\n"
    );

    // The terminal view: streamed text, one summary line per call, the edit's diff, the
    // write's result, the final answer. The two calls run in parallel, so their results come
    // in either order, each under its call's summary line.
    let stdout = text(&output.stdout);
    assert!(
        stdout.starts_with(
            "I'll fix the answer and add notes.\n\n● edit  src/lib.rs\n● write  notes.md\n"
        ),
        "terminal view:\n{stdout}"
    );
    let edit = [
        "● edit  src/lib.rs",
        "   1 pub fn answer() -> u32 {",
        "  -2     41",
        "  +2     42",
        "   3 }",
        "",
    ]
    .join("\n");
    let notes = "# Notes\n\nThe answer is 42 — fixed ✅\n";
    let write = format!(
        "● write  notes.md\n  Successfully wrote {} bytes to notes.md\n",
        notes.len()
    );
    assert!(stdout.contains(&edit), "terminal view:\n{stdout}");
    assert!(stdout.contains(&write), "terminal view:\n{stdout}");
    assert!(
        stdout.ends_with("\n\nDone: `answer()` now returns 42 and notes.md explains why.\n"),
        "terminal view:\n{stdout}"
    );
    assert_eq!(
        text(&output.stderr),
        "",
        "a successful run prints nothing on stderr"
    );

    // Two model calls: the first with the system prompt and the tools, the second with the
    // assistant's calls and both results.
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].path, "/v1/chat/completions");
    let messages = requests[0].body["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    let system = messages[0]["content"].as_str().unwrap();
    let root = ws.path().canonicalize().unwrap();
    for needle in [
        "Available tools:\n- read: Read file contents\n- bash: ",
        "- edit: Make precise file edits",
        "- Use read to examine files instead of cat or sed.",
        &format!("Workspace root: {} ", root.display()),
        "- Network: off.",
        "- Protected (readable, never writable, also by commands): .git/**, .cordon/**, \
         **/.gitmodules,",
        "**/.env",
    ] {
        assert!(
            system.contains(needle),
            "{needle:?} missing from:\n{system}"
        );
    }
    assert_eq!(
        messages[1],
        serde_json::json!({"role": "user", "content": "Fix answer() and write notes."})
    );
    let tools: Vec<&str> = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["read", "bash", "edit", "write", "grep", "find", "ls"]
    );
    let second = requests[1].body["messages"].as_array().unwrap();
    let roles: Vec<&str> = second
        .iter()
        .map(|message| message["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
    assert_eq!(second[2]["tool_calls"].as_array().unwrap().len(), 2);
    assert_eq!(second[3]["tool_call_id"], "call_Ed1tQ8mZ2xV7nR4kL0pW");
    assert!(
        second[3]["content"]
            .to_string()
            .contains("Successfully replaced 1 block(s) in src/lib.rs.")
    );
    assert_eq!(second[4]["tool_call_id"], "call_Wr1tE5nQ9mZ3kX7pT2sY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_run_with_json_prints_every_event() {
    let ws = workspace();
    let server = TestServer::start(vec![
        stream("anthropic_thinking_edit_ls.sse"),
        stream("anthropic_final.sse"),
    ])
    .await;
    let mut args = anthropic_run(&server, "Fix the off-by-one.");
    args.push("--json".into());
    let output = finish(&mut cordon(ws.path(), &refs(&args), &[ANTHROPIC_KEY])).await;
    assert_exit(&output, 0);
    assert_eq!(read(ws.path(), "src/lib.rs"), LIB_RS.replace("41", "42"));

    let events = events(&output);
    let kinds = types(&events);
    assert_eq!(
        kinds[..4],
        ["agent_start", "turn_start", "message_start", "message_end"]
    );
    assert_eq!(kinds[kinds.len() - 2..], ["turn_end", "agent_end"]);
    assert!(
        kinds.contains(&"message_update"),
        "streamed updates: {kinds:?}"
    );
    let deltas: String = events
        .iter()
        .filter(|event| event["assistantMessageEvent"]["type"] == "text_delta")
        .map(|event| event["assistantMessageEvent"]["delta"].as_str().unwrap())
        .collect();
    assert_eq!(
        deltas,
        "Fixing the off-by-one in `answer()`.Fixed: `answer()` returns 42; src holds lib.rs."
    );
    let starts: Vec<(&str, &Value)> = events
        .iter()
        .filter(|event| event["type"] == "tool_execution_start")
        .map(|event| (event["toolName"].as_str().unwrap(), &event["args"]))
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0].0, "edit");
    assert_eq!(
        starts[0].1,
        &serde_json::json!({"path": "src/lib.rs", "edits": [{"oldText": "    41", "newText": "    42"}]})
    );
    assert_eq!(starts[1], ("ls", &serde_json::json!({"path": "src"})));
    for end in tool_ends(&events) {
        assert_eq!(end["isError"], false, "{end}");
    }

    // The assembled conversation: prompt, the first answer (thinking with its signature, text,
    // two calls), two results, the final answer.
    let messages = final_messages(&events);
    let roles: Vec<&str> = messages
        .iter()
        .map(|message| message["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "toolResult", "toolResult", "assistant"]
    );
    let first = &messages[1];
    assert_eq!(first["stopReason"], "toolUse");
    assert_eq!(first["provider"], "anthropic");
    let blocks: Vec<&str> = first["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|block| block["type"].as_str().unwrap())
        .collect();
    assert_eq!(blocks, ["thinking", "text", "toolCall", "toolCall"]);
    assert_eq!(
        first["content"][0]["thinking"],
        "The answer is off by one.\nEdit it, then look around."
    );
    assert!(first["content"][0]["signature"].is_string());
    assert_eq!(messages[3]["content"][0]["text"], "lib.rs");
    assert_eq!(messages[4]["stopReason"], "stop");

    // The second request carries the thinking block back and both results.
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].path, "/v1/messages");
    assert_eq!(requests[0].header("x-api-key"), Some("sk-ant-test-key"));
    let system = requests[0].body["system"][0]["text"].as_str().unwrap();
    assert!(system.contains("Available tools:"), "{system}");
    let sent = requests[1].body["messages"].as_array().unwrap();
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[1]["content"][0]["type"], "thinking");
    let results: Vec<&str> = sent[2]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|block| block["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        results,
        [
            "toolu_01EdT4qW8xZ2mK5nR9pL3vYs",
            "toolu_01LsX7cV2bN9mQ4wE8rT1yUi"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_llama_cpp_server_needs_no_key_and_shows_its_reasoning() {
    let ws = workspace();
    let server = TestServer::start(vec![
        stream("llamacpp_reasoning_read.sse"),
        stream("llamacpp_final.sse"),
    ])
    .await;
    let base = format!("{}/v1", server.url());
    let args = [
        "run",
        "--model",
        "openai-compatible:qwen3:8b",
        "--base-url",
        &base,
        "What is the README's title?",
    ];
    // An OpenAI key in the environment must not travel to another server.
    let output = finish(&mut cordon(
        ws.path(),
        &args,
        &[("OPENAI_API_KEY", "sk-must-not-leak")],
    ))
    .await;
    assert_exit(&output, 0);
    assert_eq!(
        text(&output.stdout),
        "│ The user wants the README's title.\n\
         │ It is on line 1.\n\
         \n\
         ● read  README.md\n  \
         1 line\n\
         \n\
         The title is **demo**.\n"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|r| r.header("authorization").is_none()));
    assert_eq!(requests[0].body["model"], "qwen3:8b");
    assert!(
        requests[1].body["messages"][3]["content"]
            .to_string()
            .contains("# demo")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_stop_runs_no_call_and_the_model_retries() {
    let ws = workspace();
    let server = TestServer::start(vec![
        stream("openai_length_stop.sse"),
        stream("openai_final.sse"),
    ])
    .await;
    let mut args = openai_run(&server, "Write notes.");
    args.push("--json".into());
    let output = finish(&mut cordon(ws.path(), &refs(&args), &[])).await;
    assert_exit(&output, 0);
    assert!(
        !ws.path().join("notes.md").exists(),
        "a call with possibly truncated arguments must not run"
    );
    let events = events(&output);
    let ends = tool_ends(&events);
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["isError"], true);
    assert_eq!(
        ends[0]["result"]["content"][0]["text"],
        "Tool call \"write\" was not executed: the response hit the output token limit, so its \
         arguments may be truncated. Re-issue the tool call with complete arguments."
    );
    let messages = final_messages(&events);
    assert_eq!(messages[1]["stopReason"], "length");
    assert_eq!(messages[3]["stopReason"], "stop");
    assert_eq!(server.attempts(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_event_mid_stream_ends_the_run_with_exit_1() {
    for (fixture, provider) in [
        ("openai_error_mid_stream.sse", "openai"),
        ("anthropic_error_mid_stream.sse", "anthropic"),
    ] {
        let ws = workspace();
        let server = TestServer::start(vec![stream(fixture)]).await;
        let args = if provider == "openai" {
            openai_run(&server, "Look at the code.")
        } else {
            anthropic_run(&server, "Look at the code.")
        };
        let output = finish(&mut cordon(ws.path(), &refs(&args), &[ANTHROPIC_KEY])).await;
        assert_exit(&output, 1);
        let stdout = text(&output.stdout);
        let stderr = text(&output.stderr);
        let (streamed, reason) = if provider == "openai" {
            (
                "Looking at the code\n",
                "The server had an error while processing your request",
            )
        } else {
            ("Let me check\n", "Overloaded")
        };
        assert_eq!(
            stdout, streamed,
            "{provider}: the text streamed before the error"
        );
        assert!(
            stderr.starts_with("cordon: the run failed: ") && stderr.contains(reason),
            "{provider}: {stderr}"
        );
        // Output had been streamed, so the request is not repeated.
        assert_eq!(server.attempts(), 1, "{provider}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_is_retried_after_the_servers_wait() {
    let ws = workspace();
    let server = TestServer::start(vec![
        Reply::json_with(
            429,
            vec![("retry-after-ms", "20".to_owned())],
            r#"{"error":{"message":"Rate limit reached for gpt-4.1","type":"requests","code":"rate_limit_exceeded"}}"#,
        ),
        stream("openai_final.sse"),
    ])
    .await;
    let args = openai_run(&server, "Summarise.");
    let output = finish(&mut cordon(ws.path(), &refs(&args), &[])).await;
    assert_exit(&output, 0);
    assert_eq!(server.attempts(), 2);
    assert_eq!(
        text(&output.stdout),
        "Done: `answer()` now returns 42 and notes.md explains why.\n"
    );
    let requests = server.requests();
    assert_eq!(
        requests[0].body, requests[1].body,
        "the retry resends the request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_writes_a_transcript_that_replay_reexecutes() {
    let ws = workspace();
    let server = TestServer::start(vec![
        stream("openai_edit_and_write.sse"),
        stream("openai_final.sse"),
    ])
    .await;
    // Outside the workspace: a transcript the sandbox can write is refused.
    let saves = tempfile::tempdir().expect("temp dir");
    let transcript = saves.path().join("session.jsonl");
    let mut args = openai_run(&server, "Fix answer() and write notes.");
    args.extend(["--save".into(), transcript.display().to_string()]);
    let output = finish(&mut cordon(ws.path(), &refs(&args), &[])).await;
    assert_exit(&output, 0);

    let saved = read(saves.path(), "session.jsonl");
    let lines: Vec<Value> = saved
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let roles: Vec<&str> = lines
        .iter()
        .map(|line| line["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "toolResult", "toolResult", "assistant"]
    );
    assert_eq!(lines[1]["content"][1]["type"], "toolCall");
    assert_eq!(lines[1]["content"][1]["arguments"]["path"], "src/lib.rs");

    // Replayed on a fresh copy of the workspace, the assistant's calls run again.
    let fresh = workspace();
    let replay = finish(&mut cordon(
        fresh.path(),
        &["replay", transcript.to_str().unwrap()],
        &[],
    ))
    .await;
    assert_exit(&replay, 0);
    assert_eq!(read(fresh.path(), "src/lib.rs"), LIB_RS.replace("41", "42"));
    assert_eq!(
        read(fresh.path(), "notes.md"),
        "# Notes\n\nThe answer is 42 — fixed ✅\n"
    );
    let replayed = events(&replay);
    let ends = tool_ends(&replayed);
    assert_eq!(ends.len(), 2);
    assert!(ends.iter().all(|end| end["isError"] == false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_stops_after_the_last_allowed_batch() {
    let ws = workspace();
    // Only one reply is scripted: a second model call would get an error response.
    let server = TestServer::start(vec![stream("openai_edit_and_write.sse")]).await;
    let mut args = openai_run(&server, "Fix answer() and write notes.");
    args.extend(["--max-turns".into(), "1".into()]);
    let output = finish(&mut cordon(ws.path(), &refs(&args), &[])).await;
    assert_exit(&output, 1);
    assert_eq!(server.attempts(), 1);
    // The last turn's calls still ran.
    assert_eq!(read(ws.path(), "src/lib.rs"), LIB_RS.replace("41", "42"));
    assert!(ws.path().join("notes.md").exists());
    assert_eq!(
        text(&output.stderr),
        "cordon: stopped after 1 turn (--max-turns) before the model finished\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_errors_exit_2_before_anything_runs() {
    let ws = workspace();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "--model", "gemini:pro", "hi"],
            "cordon: failed to parse model \"gemini:pro\": unknown provider \"gemini\"; use \
             openai, anthropic or openai-compatible\n",
        ),
        (
            vec!["run", "--model", "anthropic:claude-sonnet-4-5", "hi"],
            "cordon: failed to configure anthropic: ANTHROPIC_API_KEY is not set; export your \
             API key in it\n",
        ),
        (
            vec!["run", "--model", "openai:gpt-4.1", "hi"],
            "cordon: failed to configure openai: OPENAI_API_KEY is not set; export your API \
             key in it\n",
        ),
        (
            vec![
                "run",
                "--model",
                "openai-compatible:qwen3:8b",
                "--base-url",
                "localhost:8080",
                "hi",
            ],
            "cordon: failed to parse base URL \"localhost:8080\": scheme \"localhost\" is not \
             http or https (write it like http://127.0.0.1:8080/v1)\n",
        ),
        (
            vec!["run", "--model", "openai-compatible:qwen3:8b", "hi"],
            "OPENAI_COMPATIBLE_BASE_URL",
        ),
        (
            vec!["run", "--model", "claude-sonnet-4-5", "hi"],
            "did you mean anthropic:claude-sonnet-4-5?",
        ),
        (
            vec![
                "run",
                "--model",
                "openai:gpt-4.1",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "  ",
            ],
            "cordon: the prompt is empty: say what the agent should do\n",
        ),
        (
            vec!["run", "--model", "openai:gpt-4.1", "--max-turns", "0", "hi"],
            "--max-turns",
        ),
        (
            vec![
                "run",
                "--model",
                "openai:gpt-4.1",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--save",
                "missing-dir/session.jsonl",
                "hi",
            ],
            "cordon: failed to create the transcript missing-dir/session.jsonl",
        ),
        (
            vec![
                "run",
                "--model",
                "openai:gpt-4.1",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--policy",
                "no-such-policy.toml",
                "--save",
                "previous.jsonl",
                "hi",
            ],
            "no-such-policy.toml",
        ),
    ];
    // A transcript from an earlier run survives a run that never started.
    std::fs::write(ws.path().join("previous.jsonl"), "{\"role\":\"user\"}\n").unwrap();
    for (args, expected) in cases {
        let output = finish(&mut cordon(ws.path(), &args, &[])).await;
        assert_exit(&output, 2);
        let stderr = text(&output.stderr);
        if expected.ends_with('\n') {
            assert_eq!(stderr, expected, "{args:?}");
        } else {
            assert!(
                stderr.starts_with("cordon: ") && stderr.contains(expected),
                "{args:?}: {stderr}"
            );
        }
        assert_eq!(text(&output.stdout), "", "{args:?}");
    }
    assert_eq!(read(ws.path(), "src/lib.rs"), LIB_RS);
    assert_eq!(read(ws.path(), "previous.jsonl"), "{\"role\":\"user\"}\n");
    assert!(!ws.path().join("missing-dir").exists());
}

const ASK_POLICY: &str = r#"version = 1
default = "allow"

[tools]
enabled = ["read", "edit", "write", "ls"]

[filesystem]
read = ["**"]
write = ["**"]

[[rules]]
tool = ["edit", "write"]
path = "**"
decision = "ask"
reason = "changes need a person's approval"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_is_a_denial_when_stdin_is_not_a_terminal() {
    let ws = workspace();
    let policy = ws.path().join("ask.toml");
    std::fs::write(&policy, ASK_POLICY).unwrap();
    let server = TestServer::start(vec![
        stream("openai_edit_and_write.sse"),
        stream("openai_final.sse"),
    ])
    .await;
    let mut args = openai_run(&server, "Fix answer() and write notes.");
    args.extend([
        "--json".into(),
        "--policy".into(),
        policy.display().to_string(),
    ]);
    let output = finish(&mut cordon(ws.path(), &refs(&args), &[])).await;
    assert_exit(&output, 0);
    assert_eq!(
        read(ws.path(), "src/lib.rs"),
        LIB_RS,
        "nothing was approved"
    );
    assert!(!ws.path().join("notes.md").exists());
    let events = events(&output);
    let ends = tool_ends(&events);
    assert_eq!(ends.len(), 2);
    for end in ends {
        assert_eq!(end["isError"], true);
        let reason = end["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            reason.contains("approval required, but this session cannot ask a person")
                && reason.contains("changes need a person's approval"),
            "{reason}"
        );
    }
    // The policy's tool list is what the model was offered.
    let requests = server.requests();
    let tools: Vec<&str> = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["read", "edit", "write", "ls"]);
}

/// `cordon ARGS` on a pseudo-terminal (util-linux `script`), so stdin is a terminal; `input`
/// is typed into it.
async fn on_a_terminal(root: &Path, args: &[String], input: &str) -> Output {
    let script = Path::new("/usr/bin/script");
    assert!(
        script.exists(),
        "this test needs util-linux `script` (/usr/bin/script) to give cordon a terminal; \
         install util-linux (bsdutils on Debian)"
    );
    let mut line = shell_quote(CORDON);
    for arg in args {
        line.push(' ');
        line.push_str(&shell_quote(arg));
    }
    line.push_str(" --root ");
    line.push_str(&shell_quote(root.to_str().unwrap()));
    let mut command = Command::new(script);
    command
        .args(["--quiet", "--return", "--command", &line, "/dev/null"])
        .current_dir(root)
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for name in PROVIDER_VARIABLES {
        command.env_remove(name);
    }
    let mut child = command.spawn().expect("spawn script");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    // Keep stdin open until cordon is done: its end would reach the terminal as end of input.
    let output = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("cordon on a terminal did not exit within the test's patience")
        .expect("wait for script");
    drop(stdin);
    output
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_ask_prompts_and_always_covers_the_rule_for_the_session() {
    let ws = workspace();
    let policy = ws.path().join("ask.toml");
    std::fs::write(&policy, ASK_POLICY).unwrap();
    let server = TestServer::start(vec![
        stream("openai_edit_and_write.sse"),
        stream("openai_final.sse"),
    ])
    .await;
    let mut args = openai_run(&server, "Fix answer() and write notes.");
    args.extend(["--policy".into(), policy.display().to_string()]);
    let output = on_a_terminal(ws.path(), &args, "always\n").await;
    assert_exit(&output, 0);
    let shown = text(&output.stdout);
    assert_eq!(
        shown.matches("? Allow ").count(),
        1,
        "one question: `always` covers the second call of the same rule\n{shown}"
    );
    assert!(
        shown.contains("? Allow edit src/lib.rs? The policy asks ("),
        "{shown}"
    );
    assert_eq!(read(ws.path(), "src/lib.rs"), LIB_RS.replace("41", "42"));
    assert!(ws.path().join("notes.md").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_no_declines_the_call() {
    let ws = workspace();
    let policy = ws.path().join("ask.toml");
    std::fs::write(&policy, ASK_POLICY).unwrap();
    let server = TestServer::start(vec![
        stream("openai_edit_and_write.sse"),
        stream("openai_final.sse"),
    ])
    .await;
    let mut args = openai_run(&server, "Fix answer() and write notes.");
    args.extend(["--policy".into(), policy.display().to_string()]);
    // yes to the edit, no to the write.
    let output = on_a_terminal(ws.path(), &args, "y\nn\n").await;
    assert_exit(&output, 0);
    assert_eq!(text(&output.stdout).matches("? Allow ").count(), 2);
    assert_eq!(read(ws.path(), "src/lib.rs"), LIB_RS.replace("41", "42"));
    assert!(!ws.path().join("notes.md").exists());
    let requests = server.requests();
    let second = &requests[1].body["messages"];
    assert!(
        second[4]["content"]
            .to_string()
            .contains("the user declined this call"),
        "{second}"
    );
}

/// Read `child`'s stdout line by line until a line satisfies `until`; returns the lines read.
async fn read_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    until: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.expect("read cordon's stdout") {
            let done = until(&line);
            seen.push(line);
            if done {
                return;
            }
        }
        panic!("cordon's stdout ended before the expected line; saw:\n{seen:#?}");
    })
    .await
    .expect("the expected output did not come within the test's patience");
    seen
}

fn interrupt(child: &Child) {
    let pid = child.id().expect("cordon is running");
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), Signal::SIGINT).expect("send SIGINT");
}

async fn rest_of_run(
    child: Child,
    mut lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    mut seen: Vec<String>,
) -> (Option<i32>, Vec<Value>, String) {
    let mut child = child;
    let mut stderr = child.stderr.take().unwrap();
    let collected = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.expect("read cordon's stdout") {
            seen.push(line);
        }
        let mut err = String::new();
        stderr.read_to_string(&mut err).await.unwrap();
        let status = child.wait().await.unwrap();
        (status.code(), err)
    })
    .await
    .expect("cordon did not finish within the test's patience after Ctrl-C");
    let events = seen
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (collected.0, events, collected.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_while_the_model_streams_aborts_the_run() {
    let ws = workspace();
    let (hung_up, hang_up_seen) = tokio::sync::oneshot::channel();
    let server = TestServer::start(vec![Reply::StreamThenHold(
        pieces("anthropic_partial_stall.sse"),
        hung_up,
    )])
    .await;
    let mut args = anthropic_run(&server, "Think about it.");
    args.push("--json".into());
    let mut child = cordon(ws.path(), &refs(&args), &[ANTHROPIC_KEY])
        .spawn()
        .expect("spawn cordon");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let seen = read_until(&mut lines, |line| line.contains("\" it\"")).await;
    interrupt(&child);
    let (code, events, stderr) = rest_of_run(child, lines, seen).await;
    assert_eq!(code, Some(1), "stderr: {stderr}");
    assert!(stderr.contains("cordon: the run was aborted"), "{stderr}");
    let messages = final_messages(&events);
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[1]["stopReason"], "aborted");
    assert_eq!(messages[1]["content"][0]["text"], "Thinking about it");
    tokio::time::timeout(PATIENCE, hang_up_seen)
        .await
        .expect("the model connection was not closed after Ctrl-C")
        .unwrap();
    assert_eq!(server.attempts(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_a_command_kills_it_records_the_result_and_aborts() {
    let ws = workspace();
    // One reply: after Ctrl-C the model must not be called again.
    let server = TestServer::start(vec![stream("openai_bash_sleep.sse")]).await;
    let mut args = openai_run(&server, "Run the slow step.");
    args.push("--json".into());
    let mut child = cordon(ws.path(), &refs(&args), &[])
        .spawn()
        .expect("spawn cordon");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let seen = read_until(&mut lines, |line| line.contains("\"tool_execution_start\"")).await;
    // The command marks its start, then becomes `sleep` under a name of its own.
    let started = ws.path().join("started.txt");
    tokio::time::timeout(PATIENCE, async {
        while !started.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the command never started");
    tokio::time::timeout(PATIENCE, async {
        while live_processes_named(SLEEPER).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the command's process never showed up");
    interrupt(&child);
    let (code, events, stderr) = rest_of_run(child, lines, seen).await;
    assert_eq!(code, Some(1), "stderr: {stderr}");

    let ends = tool_ends(&events);
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["isError"], true);
    let result = ends[0]["result"]["content"][0]["text"].as_str().unwrap();
    assert!(result.contains("aborted"), "{result}");
    let messages = final_messages(&events);
    let roles: Vec<&str> = messages
        .iter()
        .map(|message| message["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "toolResult", "assistant"]);
    assert_eq!(messages[3]["stopReason"], "aborted");
    assert_eq!(server.attempts(), 1, "no model call after Ctrl-C");
    // The command is gone: killed, not left running.
    assert_eq!(
        live_processes_named(SLEEPER),
        Vec::<u32>::new(),
        "the command survived Ctrl-C"
    );
}

/// `argv[0]` of the command the bash fixture leaves running.
const SLEEPER: &str = "cordon-run-test-sleeper";

/// Pids of running (not zombie) processes whose `argv[0]` is `name`, in any PID namespace.
fn live_processes_named(name: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.split(|byte| *byte == 0).next() != Some(name.as_bytes()) {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if !matches!(state, None | Some('Z')) {
            pids.push(pid);
        }
    }
    pids
}
