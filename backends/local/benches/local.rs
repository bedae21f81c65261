//! Benchmarks of the local backend (run with `cargo bench -p cordon-backend-local`):
//! small-file read/write latency, a `true` command, grep over a large real tree compared
//! with ripgrep (`rg`) on the same tree, and what expanding the protected/denied patterns
//! before each command costs on that tree.
//!
//! Environment: `CORDON_BENCH_TREE` (default `~/.cargo/registry/src`), `CORDON_BENCH_RUNS`
//! (default 5) for the grep comparison.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cordon_backend_local::{LocalBackend, LocalConfig, SandboxSpec};
use cordon_ops::{Backend, ExecRequest, GrepRequest};
use tokio_util::sync::CancellationToken;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn millis(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn backend(root: &Path) -> LocalBackend {
    LocalBackend::new(LocalConfig {
        profile: cordon_backend_local::Profile::Host,
        workspace_is_copy: false,
        root: root.to_path_buf(),
        spec: SandboxSpec {
            protected: vec![".git/**".into()],
            denied: vec!["**/.env".into()],
            allow_degraded: true,
            ..SandboxSpec::default()
        },
        home: None,
        state_base: None,
    })
    .expect("create backend")
}

async fn small_files() {
    let dir = std::env::temp_dir().join(format!("cordon-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("two-kb.txt");
    let content: Vec<u8> = (0..2048u32).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(&file, &content).unwrap();
    let backend = backend(&dir);
    let files = backend.files();
    for _ in 0..500 {
        files.read_file(&file).await.unwrap();
    }
    let mut reads = Vec::new();
    for _ in 0..5000 {
        let start = Instant::now();
        let data = files.read_file(&file).await.unwrap();
        reads.push(start.elapsed());
        assert_eq!(data.len(), 2048);
    }
    let mut writes = Vec::new();
    for _ in 0..2000 {
        let start = Instant::now();
        files.write_file(&file, &content).await.unwrap();
        writes.push(start.elapsed());
    }
    let mut stats = Vec::new();
    for _ in 0..2000 {
        let start = Instant::now();
        files.metadata(&file).await.unwrap();
        stats.push(start.elapsed());
    }
    let mut handoffs = Vec::new();
    for _ in 0..5000 {
        let start = Instant::now();
        tokio::task::spawn_blocking(|| ()).await.unwrap();
        handoffs.push(start.elapsed());
    }
    println!(
        "spawn_blocking round trip alone (why small reads run inline): p50 {}",
        micros(percentile(&mut handoffs, 0.5))
    );
    println!(
        "read_file 2 KB:  p50 {}  p90 {}",
        micros(percentile(&mut reads, 0.5)),
        micros(percentile(&mut reads, 0.9))
    );
    println!(
        "write_file 2 KB: p50 {}  p90 {}  (atomic: temp + swap in)",
        micros(percentile(&mut writes, 0.5)),
        micros(percentile(&mut writes, 0.9))
    );
    println!(
        "metadata:        p50 {}  p90 {}",
        micros(percentile(&mut stats, 0.5)),
        micros(percentile(&mut stats, 0.9))
    );

    let bash = backend.bash();
    let mut runs = Vec::new();
    for _ in 0..100 {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let start = Instant::now();
        bash.exec(
            ExecRequest {
                call_id: None,
                command: "true".into(),
                cwd: dir.clone(),
                timeout: Duration::from_secs(30),
                env: Vec::new(),
            },
            CancellationToken::new(),
            tx,
        )
        .await
        .unwrap();
        runs.push(start.elapsed());
        drain.await.unwrap();
    }
    println!(
        "bash `true`:     p50 {}  p90 {}  (full sandbox, small workspace)",
        millis(percentile(&mut runs, 0.5)),
        millis(percentile(&mut runs, 0.9))
    );
    backend.shutdown().await.expect("shut the session down");
    drop(backend);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn time_command(args: &[&str]) -> Option<Duration> {
    let start = Instant::now();
    let status = Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    // rg exits 1 when nothing matched; both 0 and 1 are complete runs.
    matches!(status.code(), Some(0 | 1)).then(|| start.elapsed())
}

async fn grep_tree(tree: &Path, runs: usize) {
    let backend = backend(tree);
    let search = backend.search();
    let literals = [
        (
            "NEEDLE_THAT_DOES_NOT_EXIST",
            usize::MAX,
            "absent literal, full scan",
        ),
        ("unsafe", 101, "common literal, tool limit 101"),
    ];
    let tree_arg = tree.to_string_lossy().into_owned();
    for (literal, limit, label) in literals {
        let request = GrepRequest {
            pattern: literal.into(),
            path: tree.to_path_buf(),
            glob: None,
            ignore_case: false,
            literal: true,
            context: 0,
            max_matches: limit,
        };
        let variants: [(&str, Vec<&str>); 3] = [
            ("rg", vec!["rg", "-F", literal, &tree_arg]),
            (
                "rg --sort path",
                vec!["rg", "--sort", "path", "-F", literal, &tree_arg],
            ),
            (
                "rg with cordon's rules (--hidden --no-require-git -g !.git --sort path)",
                vec![
                    "rg",
                    "--hidden",
                    "--no-require-git",
                    "-g",
                    "!.git",
                    "--sort",
                    "path",
                    "-F",
                    literal,
                    &tree_arg,
                ],
            ),
        ];
        // Warm the page cache, then interleave the contenders round by round so that load
        // from other processes hits them alike.
        let _ = search.grep(request.clone(), CancellationToken::new()).await;
        let mut ours = Vec::new();
        let mut theirs: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
        let mut matches = 0;
        for _ in 0..runs {
            let start = Instant::now();
            let out = search
                .grep(request.clone(), CancellationToken::new())
                .await
                .unwrap();
            ours.push(start.elapsed());
            matches = out.files.iter().map(|f| f.lines.len()).sum::<usize>();
            for ((_, args), samples) in variants.iter().zip(theirs.iter_mut()) {
                if let Some(elapsed) = time_command(args) {
                    samples.push(elapsed);
                }
            }
        }
        println!(
            "grep {label} (`{literal}`, {matches} lines): cordon p50 {}",
            millis(percentile(&mut ours, 0.5))
        );
        for ((name, _), mut samples) in variants.into_iter().zip(theirs) {
            if samples.is_empty() {
                println!("  {name}: not available");
            } else {
                println!("  {name}: p50 {}", millis(percentile(&mut samples, 0.5)));
            }
        }
    }
}

/// A command on the large tree as the workspace (read-only, so nothing is created there)
/// with the default policy's protected and denied patterns: the first command walks the
/// whole tree, later ones re-read only changed directories (one `lstat` per directory).
async fn commands_on_tree(tree: &Path) {
    let backend = LocalBackend::new(LocalConfig {
        profile: cordon_backend_local::Profile::Host,
        workspace_is_copy: false,
        root: tree.to_path_buf(),
        spec: SandboxSpec {
            workspace: cordon_core::sandbox::RootAccess::ReadOnly,
            protected: vec![".git/**".into()],
            denied: ["**/.env", "**/.env.*", "**/*.pem", "**/*.p12", "**/id_rsa*"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ..SandboxSpec::default()
        },
        home: None,
        state_base: None,
    })
    .expect("create backend");
    let bash = backend.bash();
    let mut runs = Vec::new();
    for _ in 0..21 {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let start = Instant::now();
        bash.exec(
            ExecRequest {
                call_id: None,
                command: "true".into(),
                cwd: tree.to_path_buf(),
                timeout: Duration::from_secs(600),
                env: Vec::new(),
            },
            CancellationToken::new(),
            tx,
        )
        .await
        .unwrap();
        runs.push(start.elapsed());
        drain.await.unwrap();
    }
    let first = runs.remove(0);
    println!(
        "bash `true` on the tree: first {} (walks everything), then p50 {}  p90 {}",
        millis(first),
        millis(percentile(&mut runs, 0.5)),
        millis(percentile(&mut runs, 0.9))
    );
    backend.shutdown().await.expect("shut the session down");
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        small_files().await;
        let tree = std::env::var_os("CORDON_BENCH_TREE")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/registry/src"))
            })
            .filter(|p| p.is_dir());
        let runs = std::env::var("CORDON_BENCH_RUNS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(5);
        match tree {
            Some(tree) => {
                let files = Command::new("rg")
                    .arg("--files")
                    .arg(&tree)
                    .output()
                    .map(|o| o.stdout.iter().filter(|&&b| b == b'\n').count())
                    .unwrap_or(0);
                println!("tree {} ({files} files per rg --files)", tree.display());
                grep_tree(&tree, runs).await;
                commands_on_tree(&tree).await;
            }
            None => println!("no tree to grep: set CORDON_BENCH_TREE"),
        }
    });
}
