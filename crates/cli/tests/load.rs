//! A load test of `cordon mcp` over stdio: thousands of tool calls (`CORDON_LOAD_CALLS`,
//! default 5,000) with 64 in flight, a mix of every tool, and a quarter of them edits of one
//! shared file. Checked: every request gets exactly one answer and no call fails; the shared
//! file ends exactly as the serialised edits predict (each edit rewrites its own line of it, so
//! a lost update shows as a line left unchanged); each written file holds what was written;
//! after stdin closes the server exits 0 and leaves no process and no file behind. The
//! server's resident memory at the end is printed (the figure BENCHMARKS.md records).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Upper bound for any one answer; generous for a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(120);

/// Requests in flight at once.
const IN_FLIGHT: usize = 64;

/// Calls in CI; `CORDON_LOAD_CALLS` for a longer run.
const CI_CALLS: usize = 5_000;

fn calls() -> usize {
    match std::env::var("CORDON_LOAD_CALLS") {
        Ok(text) => text
            .parse()
            .expect("CORDON_LOAD_CALLS must be a number of calls"),
        Err(_) => CI_CALLS,
    }
}

/// What one call is and what its answer must say.
enum Call {
    /// Rewrite line `n` of `shared.txt`.
    Edit(usize),
    Read,
    /// Write `out/<n>.txt`.
    Write(usize),
    Bash(usize),
    Ls,
    Grep,
    Find,
}

impl Call {
    /// The `n`th call of the mix: a quarter edits, then reads, writes, bash and searches.
    fn nth(n: usize) -> Call {
        match n % 12 {
            0..=2 => Call::Edit(n),
            3 | 4 => Call::Read,
            5 | 6 => Call::Write(n),
            7 | 8 => Call::Bash(n),
            9 => Call::Ls,
            10 => Call::Grep,
            _ => Call::Find,
        }
    }

    fn request(&self) -> (&'static str, Value) {
        match self {
            Call::Edit(n) => (
                "edit",
                json!({"path": "shared.txt", "edits": [
                    {"oldText": pending_line(*n), "newText": done_line(*n)}
                ]}),
            ),
            Call::Read => ("read", json!({"path": "shared.txt", "limit": 20})),
            Call::Write(n) => (
                "write",
                json!({"path": format!("out/{n}.txt"), "content": written(*n)}),
            ),
            Call::Bash(n) => ("bash", json!({"command": format!("echo call-{n}")})),
            Call::Ls => ("ls", json!({"path": "."})),
            Call::Grep => (
                "grep",
                json!({"pattern": "line-1[0-9]*: ", "path": "shared.txt"}),
            ),
            Call::Find => ("find", json!({"pattern": "shared.*"})),
        }
    }

    /// Check a successful answer's text.
    fn check(&self, text: &str) -> Result<(), String> {
        let ok = match self {
            Call::Edit(_) => text == "Successfully replaced 1 block(s) in shared.txt.",
            Call::Read => text.starts_with("line-0: "),
            Call::Write(n) => text.contains(&format!("out/{n}.txt")),
            Call::Bash(n) => text == format!("call-{n}\n"),
            Call::Ls | Call::Find => text.lines().any(|line| line == "shared.txt"),
            Call::Grep => text.starts_with("shared.txt:"),
        };
        if ok {
            Ok(())
        } else {
            Err(format!("unexpected answer text: {text:?}"))
        }
    }
}

fn pending_line(n: usize) -> String {
    format!("line-{n}: pending\n")
}

fn done_line(n: usize) -> String {
    format!("line-{n}: done by edit {n}\n")
}

fn written(n: usize) -> String {
    format!("written by call {n}\n")
}

/// The shared file before (`done = false`) or after every edit.
fn shared_file(calls: usize, done: bool) -> String {
    (0..calls)
        .filter(|n| matches!(Call::nth(*n), Call::Edit(_)))
        .map(|n| if done { done_line(n) } else { pending_line(n) })
        .collect()
}

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Server {
    fn start(root: &Path, tmp: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(["mcp", "--root"])
            .arg(root)
            .env("TMPDIR", tmp)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start cordon mcp");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Server {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        stdin.write_all(&line).expect("write to cordon mcp");
        stdin.flush().unwrap();
    }

    /// The next response (notifications skipped).
    fn response(&self) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(PATIENCE)
                .expect("an answer from cordon mcp in time");
            let message: Value = serde_json::from_str(&line)
                .unwrap_or_else(|error| panic!("stdout line is not JSON ({error}): {line}"));
            if message.get("method").is_none() {
                return message;
            }
        }
    }

    fn resident_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("read the server's /proc status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc status")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Every file under `dir`, relative, sorted.
fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                out.insert(path.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out
}

/// Processes whose working directory is inside `dir`.
fn processes_in(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Ok(cwd) = std::fs::read_link(entry.path().join("cwd"))
            && cwd.starts_with(dir)
        {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(format!("{pid}: {}", String::from_utf8_lossy(&cmdline)));
        }
    }
    found
}

#[test]
fn thousands_of_concurrent_calls_are_all_answered_and_same_file_edits_serialise() {
    let calls = calls();
    let base = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(base.path()).unwrap().join("ws");
    let tmp = root.with_file_name("tmp");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&tmp).unwrap();
    std::fs::create_dir(root.join("out")).unwrap();
    std::fs::write(root.join("shared.txt"), shared_file(calls, false)).unwrap();

    let mut server = Server::start(&root, &tmp);
    server.send(
        &json!({"jsonrpc":"2.0","id":"init","method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},
        "clientInfo":{"name":"load-test","version":"1"}}}),
    );
    let init = server.response();
    assert_eq!(init["id"], "init", "{init}");
    server.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    let initial_kib = server.resident_kib();

    let started = Instant::now();
    let mut pending: BTreeMap<u64, Call> = BTreeMap::new();
    let mut failures: Vec<String> = Vec::new();
    let mut next = 0usize;
    let mut answered = 0usize;
    while answered < calls {
        while next < calls && pending.len() < IN_FLIGHT {
            let call = Call::nth(next);
            let (name, arguments) = call.request();
            server.send(&json!({"jsonrpc":"2.0","id":next,"method":"tools/call",
                "params":{"name":name,"arguments":arguments}}));
            pending.insert(next as u64, call);
            next += 1;
        }
        let response = server.response();
        let id = response["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("response without a call id: {response}"));
        let call = pending.remove(&id).unwrap_or_else(|| {
            panic!("an answer to no pending call (or a second one): {response}")
        });
        answered += 1;
        let result = &response["result"];
        let text = result["content"][0]["text"].as_str().unwrap_or("");
        if result["isError"] != false {
            failures.push(format!("call {id}: {response}"));
        } else if let Err(reason) = call.check(text) {
            failures.push(format!("call {id}: {reason}"));
        }
    }
    let elapsed = started.elapsed();
    let rss_kib = server.resident_kib();
    eprintln!(
        "{calls} calls, {IN_FLIGHT} in flight: {:.1} s, server RSS {:.1} MB after initialize, \
         {:.1} MB after the calls",
        elapsed.as_secs_f64(),
        initial_kib as f64 / 1024.0,
        rss_kib as f64 / 1024.0
    );
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed, first: {}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );

    // The serialised edits: every line rewritten by its own edit, nothing lost.
    let shared = std::fs::read_to_string(root.join("shared.txt")).unwrap();
    assert!(
        shared == shared_file(calls, true),
        "shared.txt is not what the serialised edits predict; lines left pending: {:?}",
        shared
            .lines()
            .filter(|line| line.ends_with("pending"))
            .take(10)
            .collect::<Vec<_>>()
    );
    for n in (0..calls).filter(|n| matches!(Call::nth(*n), Call::Write(_))) {
        let path = root.join(format!("out/{n}.txt"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), written(n));
    }

    // End of input: a clean exit, nothing left running, nothing left behind.
    drop(server.stdin.take());
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "cordon mcp did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "cordon mcp exited with {status}");
    assert_eq!(processes_in(&root), Vec::<String>::new(), "processes left");
    let mut expected: BTreeSet<PathBuf> = (0..calls)
        .filter(|n| matches!(Call::nth(*n), Call::Write(_)))
        .map(|n| PathBuf::from(format!("out/{n}.txt")))
        .collect();
    expected.insert(PathBuf::from("shared.txt"));
    assert_eq!(files_under(&root), expected, "files left in the workspace");
}
