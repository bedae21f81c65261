//! The benchmark suites. Each measures through the public pipeline and prints rows.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_core::CancellationToken;
use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::{ToolCall, ToolResult};
use cordon_core::tool::{AgentTool, ToolInvocation};
use cordon_runtime::{Session, SessionOptions};
use serde_json::{Value, json};

use crate::measure::{Samples, ms, peak_rss, ratio, row};

type BenchResult = Result<(), Box<dyn std::error::Error>>;

/// A fresh workspace under the system temp dir, removed on drop.
struct Workspace(PathBuf);

impl Workspace {
    fn new(name: &str) -> std::io::Result<Workspace> {
        let dir = std::env::temp_dir().join(format!("cordon-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Workspace(dir))
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn control() -> RunControl {
    RunControl::new(CancellationToken::new(), Arc::new(|_event: AgentEvent| {}))
}

async fn call(session: &Session, tool: &str, args: Value) -> ToolResult {
    let call = ToolCall {
        id: "bench".to_owned(),
        name: tool.to_owned(),
        arguments: args,
    };
    session.call(call, &control()).await
}

fn tool(session: &Session, name: &str) -> Arc<dyn AgentTool> {
    session
        .tools()
        .iter()
        .find(|t| t.name() == name)
        .expect("tool enabled")
        .clone()
}

async fn direct(tool: &Arc<dyn AgentTool>, args: Value) {
    let invocation = ToolInvocation {
        call_id: "bench".to_owned(),
        args,
        cancel: CancellationToken::new(),
        on_update: Arc::new(|_| {}),
    };
    let result = tool.execute(invocation).await.expect("tool call succeeds");
    assert!(
        !result.is_error,
        "tool returned an error: {:?}",
        result.content
    );
}

fn ensure_ok(result: &ToolResult) {
    assert!(!result.is_error, "call failed: {}", result.text());
}

fn two_kb() -> String {
    (0..64)
        .map(|i| format!("line {i:02} of a two kilobyte file for benchmarks.\n"))
        .collect::<String>()[..2048]
        .to_owned()
}

/// read / write / edit of small files, and an edit of a 50 MB file.
pub async fn files() -> BenchResult {
    let ws = Workspace::new("files")?;
    std::fs::write(ws.0.join("two-kb.txt"), two_kb())?;
    std::fs::write(ws.0.join("edit.txt"), two_kb())?;
    let session = Session::open(SessionOptions::local(&ws.0)).await?;

    let read = tool(&session, "read");
    let args = json!({"path": "two-kb.txt"});
    let lib = Samples::of(200, 3000, || direct(&read, args.clone())).await;
    let pipe = Samples::of(200, 3000, || async {
        ensure_ok(&call(&session, "read", args.clone()).await)
    })
    .await;
    row(
        "read 2 KB, library call (tool)",
        &ms(lib.p50()),
        "",
        "",
        "≤ 0.1 ms",
        "0.62 ms",
    );
    row(
        "read 2 KB, whole pipeline (validate + policy + tool)",
        &ms(pipe.p50()),
        "",
        "",
        "",
        "",
    );

    let write = tool(&session, "write");
    let content = two_kb();
    let lib = Samples::of(50, 1000, || {
        direct(&write, json!({"path": "out.txt", "content": content}))
    })
    .await;
    // The kernel's share: the same atomic replacement done directly (temp file, write, mode,
    // rename over the target), in the same directory.
    let raw_target = ws.0.join("raw.txt");
    std::fs::write(&raw_target, &content)?;
    let mut counter = 0u64;
    let raw = Samples::of(50, 1000, || {
        counter += 1;
        let tmp = ws.0.join(format!(".raw-{counter}.tmp"));
        let (bytes, target) = (content.as_bytes(), &raw_target);
        async move {
            use std::io::Write;
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .expect("temp file");
            file.write_all(bytes).expect("write");
            file.set_permissions(std::fs::Permissions::from_mode(0o644))
                .expect("chmod");
            drop(file);
            std::fs::rename(&tmp, target).expect("rename");
        }
    })
    .await;
    row(
        "atomic write 2 KB, library call",
        &ms(lib.p50()),
        &format!("raw temp + write + rename {}", ms(raw.p50())),
        &ratio(lib.p50(), raw.p50()),
        "≤ 0.3 ms",
        "0.40 ms (not atomic)",
    );

    let edit = tool(&session, "edit");
    let mut flip = false;
    let lib = Samples::of(20, 1000, || {
        flip = !flip;
        let (old, new) = if flip {
            ("line 10 of", "LINE 10 of")
        } else {
            ("LINE 10 of", "line 10 of")
        };
        direct(
            &edit,
            json!({"path": "edit.txt", "edits": [{"oldText": old, "newText": new}]}),
        )
    })
    .await;
    row(
        "edit one line of 2 KB, library call",
        &ms(lib.p50()),
        &format!("raw temp + write + rename {}", ms(raw.p50())),
        &ratio(lib.p50(), raw.p50()),
        "≤ 0.2 ms",
        "0.86 ms",
    );

    let big: String = (0..1_150_000)
        .map(|i| format!("line {i:07} of a fifty megabyte file......\n"))
        .collect();
    let size = big.len();
    std::fs::write(ws.0.join("big.txt"), &big)?;
    drop(big);
    let mut flip = false;
    let lib = Samples::of(1, 5, || {
        flip = !flip;
        let (old, new) = if flip {
            ("line 0400000 of", "LINE 0400000 of")
        } else {
            ("LINE 0400000 of", "line 0400000 of")
        };
        direct(
            &edit,
            json!({"path": "big.txt", "edits": [{"oldText": old, "newText": new}]}),
        )
    })
    .await;
    row(
        &format!("edit one line of a {} MB file", size / 1_000_000),
        &ms(lib.p50()),
        "",
        "",
        "linear time",
        "",
    );
    session.shutdown().await.expect("shut the session down");
    Ok(())
}

fn cordon_binary() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name("cordon");
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found: build it with `cargo build --release -p cordon`",
            path.display()
        )
        .into())
    }
}

/// `cordon exec read` as a whole process.
pub async fn cli() -> BenchResult {
    let ws = Workspace::new("cli")?;
    std::fs::write(ws.0.join("two-kb.txt"), two_kb())?;
    let cordon = cordon_binary()?;
    let run = || {
        let status = Command::new(&cordon)
            .args(["exec", "read", r#"{"path":"two-kb.txt"}"#, "--root"])
            .arg(&ws.0)
            .stdout(Stdio::null())
            .status()
            .expect("spawn cordon");
        assert!(status.success(), "cordon exec read failed");
    };
    let samples = Samples::of(5, 100, || async { run() }).await;
    row(
        "`cordon exec read` 2 KB, whole process (wall)",
        &ms(samples.p50()),
        "",
        "",
        "≤ 10 ms",
        "662 ms (cold start)",
    );
    Ok(())
}

fn bare_bash_true() {
    let status = Command::new("bash")
        .args(["-c", "true"])
        .status()
        .expect("spawn bash");
    assert!(status.success());
}

/// `bash: true` through the whole pipeline with the full sandbox vs a bare spawn, interleaved:
/// in a git repository (the common case) and in a plain directory (where the protected `.git`
/// does not exist yet: the sandbox guards it with a placeholder, kept between commands).
pub async fn bash() -> BenchResult {
    for with_git in [true, false] {
        let ws = Workspace::new(if with_git { "bash-git" } else { "bash-plain" })?;
        if with_git {
            let status = Command::new("git")
                .args(["init", "-q"])
                .current_dir(&ws.0)
                .status()?;
            assert!(status.success(), "git init failed");
        }
        let session = Session::open(SessionOptions::local(&ws.0)).await?;
        let args = json!({"command": "true"});
        let place = if with_git {
            "git repository"
        } else {
            "directory without .git"
        };
        let interleaved = |count: usize| {
            let (session, args) = (&session, &args);
            async move {
                let (mut ours, mut bare) = (Vec::new(), Vec::new());
                for _ in 0..count {
                    let start = Instant::now();
                    ensure_ok(&call(session, "bash", args.clone()).await);
                    ours.push(start.elapsed());
                    let start = Instant::now();
                    bare_bash_true();
                    bare.push(start.elapsed());
                }
                (Samples::from_vec(ours), Samples::from_vec(bare))
            }
        };
        // Just after `git init`: the local backend reads a directory changed within the last
        // 3 s again before every command (its ctime may not tell a change made in the same
        // clock tick), so the new repository's directories are read each time.
        let (ours, bare) = interleaved(30).await;
        if with_git {
            row(
                "`bash: true`, git repository made < 3 s ago (directories read again), vs bare `bash -c true`",
                &ms(ours.p50()),
                &ms(bare.p50()),
                &ratio(ours.p50(), bare.p50()),
                "",
                "",
            );
        }
        // The steady state: the workspace's directories have settled.
        tokio::time::sleep(std::time::Duration::from_millis(3500)).await;
        let (ours, bare) = interleaved(400).await;
        row(
            &format!("`bash: true`, whole pipeline, full sandbox, {place}, vs bare `bash -c true`"),
            &ms(ours.p50()),
            &ms(bare.p50()),
            &ratio(ours.p50(), bare.p50()),
            "≤ 1.1× (tools), ≤ 1.3× (sandbox)",
            "≈ 1.05× (no sandbox)",
        );
        session.shutdown().await.expect("shut the session down");
    }
    Ok(())
}

/// The built-in default policy with `[filesystem] nested_git` set to `mode`, written to
/// `path` (outside the workspace).
fn default_policy_with_nested_git(path: &Path, mode: &str) -> std::io::Result<PathBuf> {
    let text = include_str!("../../policies/default.toml").replacen(
        "[filesystem]\n",
        &format!("[filesystem]\nnested_git = \"{mode}\"\n"),
        1,
    );
    std::fs::write(path, text)?;
    Ok(path.to_path_buf())
}

/// `bash: true` with the git metadata sweep after each command (default policy) vs without
/// it (`nested_git = "allow"`), interleaved, on a small workspace and on a generated one of
/// 50 000 files in 5 050 directories.
pub async fn git_sweep() -> BenchResult {
    for (label, parents, dirs_per_parent, files_per_dir) in [
        ("10 files", 1, 1, 10),
        ("50 000 files / 5 050 directories", 50, 100, 10),
    ] {
        let ws = Workspace::new("git-sweep")?;
        let root = ws.0.join("ws");
        for parent in 0..parents {
            for dir in 0..dirs_per_parent {
                let path = root.join(format!("p{parent}/d{dir}"));
                std::fs::create_dir_all(&path)?;
                for file in 0..files_per_dir {
                    std::fs::write(path.join(format!("f{file}.txt")), "x\n")?;
                }
            }
        }
        let status = Command::new("git")
            .args(["init", "-q"])
            .current_dir(&root)
            .status()?;
        assert!(status.success(), "git init failed");
        let mut sessions = Vec::new();
        for mode in ["quarantine", "allow"] {
            let policy = default_policy_with_nested_git(&ws.0.join(format!("{mode}.toml")), mode)?;
            let mut options = SessionOptions::local(&root);
            options.policy = Some(policy);
            sessions.push(Session::open(options).await?);
        }
        let args = json!({"command": "true"});
        for _ in 0..20 {
            for session in &sessions {
                ensure_ok(&call(session, "bash", args.clone()).await);
            }
        }
        let (mut swept, mut plain) = (Vec::new(), Vec::new());
        for _ in 0..200 {
            for (session, samples) in sessions.iter().zip([&mut swept, &mut plain]) {
                let start = Instant::now();
                ensure_ok(&call(session, "bash", args.clone()).await);
                samples.push(start.elapsed());
            }
        }
        let (swept, plain) = (Samples::from_vec(swept), Samples::from_vec(plain));
        row(
            &format!(
                "`bash: true` with the git metadata sweep, {label}, vs `nested_git = \"allow\"`"
            ),
            &ms(swept.p50()),
            &ms(plain.p50()),
            &ratio(swept.p50(), plain.p50()),
            "",
            "",
        );
        for session in sessions {
            session.shutdown().await.expect("shut the session down");
        }
    }
    Ok(())
}

fn default_tree() -> PathBuf {
    match std::env::var_os("CORDON_BENCH_TREE") {
        Some(tree) => PathBuf::from(tree),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo/registry/src")
        }
    }
}

fn rg(args: &[&str], tree: &Path) -> Duration {
    let start = Instant::now();
    let status = Command::new("rg")
        .args(args)
        .arg(tree)
        .stdout(Stdio::null())
        .status()
        .expect("spawn rg");
    assert!(status.code().is_some_and(|c| c <= 1), "rg failed");
    start.elapsed()
}

/// A literal grep over a large real tree vs ripgrep, interleaved.
pub async fn grep() -> BenchResult {
    let tree = default_tree();
    if !tree.is_dir() {
        return Err(format!(
            "{} is not a directory (set CORDON_BENCH_TREE)",
            tree.display()
        )
        .into());
    }
    let session = Session::open(SessionOptions::local(&tree)).await?;
    let literal = "cordon_bench_absent_literal_7f3a";
    let args = json!({"pattern": literal, "literal": true});
    let equivalent = ["-F", "--hidden", "--no-require-git", "-g", "!.git", literal];
    let sorted = [
        "-F",
        "--hidden",
        "--no-require-git",
        "-g",
        "!.git",
        "--sort",
        "path",
        literal,
    ];
    let (mut ours, mut plain, mut by_path) = (Vec::new(), Vec::new(), Vec::new());
    ensure_ok(&call(&session, "grep", args.clone()).await);
    rg(&equivalent, &tree);
    for _ in 0..5 {
        let start = Instant::now();
        ensure_ok(&call(&session, "grep", args.clone()).await);
        ours.push(start.elapsed());
        plain.push(rg(&equivalent, &tree));
        by_path.push(rg(&sorted, &tree));
    }
    let (ours, plain, by_path) = (
        Samples::from_vec(ours),
        Samples::from_vec(plain),
        Samples::from_vec(by_path),
    );
    let name = format!("grep literal over {} (full scan)", tree.display());
    row(
        &name,
        &ms(ours.p50()),
        &format!("rg {}", ms(plain.p50())),
        &ratio(ours.p50(), plain.p50()),
        "≤ 1.0× rg",
        "1.04× (spawns rg)",
    );
    row(
        &format!("{name}, sorted output"),
        &ms(ours.p50()),
        &format!("rg --sort path {}", ms(by_path.p50())),
        &ratio(ours.p50(), by_path.p50()),
        "≤ 1.0× rg",
        "",
    );
    session.shutdown().await.expect("shut the session down");
    Ok(())
}

/// 1 GiB of command output through the bash tool: throughput to the spill file and the peak
/// RSS growth of this process.
pub async fn throughput() -> BenchResult {
    const GIB: u64 = 1 << 30;
    let ws = Workspace::new("throughput")?;
    let session = Session::open(SessionOptions::local(&ws.0)).await?;
    // The producer must outrun the pipeline being measured: `cat` of a page-cached 64 MiB file
    // of text lines, 16 times (`yes | head` alone tops out near 450 MB/s here).
    let chunk = ws.0.join("chunk.txt");
    let line = "a line of command output, about sixty bytes long ..........\n";
    let mut text = line.repeat((64 << 20) / line.len() + 1);
    text.truncate(64 << 20);
    std::fs::write(&chunk, text)?;
    let producer = format!("for i in $(seq 16); do cat {}; done", chunk.display());
    let baseline_start = Instant::now();
    let status = Command::new("bash")
        .args([
            "-c",
            &format!("{producer} > {}", ws.0.join("baseline.out").display()),
        ])
        .status()?;
    assert!(status.success());
    let baseline = baseline_start.elapsed();
    std::fs::remove_file(ws.0.join("baseline.out"))?;
    // Reset the peak (the producer file above raised it), then measure growth from here.
    std::fs::write("/proc/self/clear_refs", "5")?;
    let rss_before = peak_rss();
    let start = Instant::now();
    let result = call(
        &session,
        "bash",
        json!({"command": producer, "timeout": 600}),
    )
    .await;
    let elapsed = start.elapsed();
    let growth = peak_rss().saturating_sub(rss_before);
    ensure_ok(&result);
    let spill = result
        .details
        .as_ref()
        .and_then(|d| d.get("fullOutputPath"))
        .and_then(Value::as_str)
        .ok_or("no fullOutputPath in details")?
        .to_owned();
    let spilled = std::fs::metadata(&spill)?.len();
    assert_eq!(spilled, GIB, "spill file holds the whole output");
    std::fs::remove_file(&spill)?;
    let rate = |d: Duration| format!("{:.0} MB/s", GIB as f64 / 1e6 / d.as_secs_f64());
    row(
        "bash, 1 GiB of output to the spill file",
        &rate(elapsed),
        &format!("`… > file` {}", rate(baseline)),
        &ratio(baseline, elapsed),
        "≥ 500 MB/s",
        "149 MB/s (100 MB)",
    );
    row(
        "bash, 1 GiB of output: peak RSS growth",
        &format!("{:.1} MiB", growth as f64 / (1 << 20) as f64),
        "",
        "",
        "≤ 16 MiB",
        "+40 MB",
    );
    session.shutdown().await.expect("shut the session down");
    Ok(())
}
