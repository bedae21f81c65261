//! `cordon-bench`: the benchmark rows of BENCHMARKS.md, measured through Cordon's public
//! pipeline (a `cordon_runtime::Session` with the default policy, the tools over a backend, the
//! `cordon` binary) next to the baseline each row is compared with, in the same run.
//!
//! ```sh
//! cargo build --release -p cordon -p cordon-bench
//! target/release/cordon-bench            # every local suite
//! target/release/cordon-bench files bash # some suites
//! ```
//! Suites: `files`, `cli`, `bash`, `grep`, `throughput`. Each prints Markdown table rows:
//! `| row | cordon | baseline | ratio | target | reference agent |`. Timing lives here, never in
//! tests.

mod measure;
mod suites;

use std::process::ExitCode;

const SUITES: [&str; 6] = ["files", "cli", "bash", "git-sweep", "grep", "throughput"];

fn main() -> ExitCode {
    let mut wanted: Vec<String> = std::env::args().skip(1).collect();
    if wanted.iter().any(|arg| arg == "-h" || arg == "--help") {
        println!(
            "usage: cordon-bench [SUITE…]   suites: {}",
            SUITES.join(" ")
        );
        return ExitCode::SUCCESS;
    }
    if wanted.is_empty() {
        wanted = SUITES.iter().map(|s| (*s).to_owned()).collect();
    }
    if let Some(unknown) = wanted.iter().find(|s| !SUITES.contains(&s.as_str())) {
        eprintln!(
            "cordon-bench: unknown suite {unknown:?} (suites: {})",
            SUITES.join(" ")
        );
        return ExitCode::from(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!("| row | cordon | baseline | ratio | target | reference agent |");
    println!("|---|---|---|---|---|---|");
    for suite in &wanted {
        // Each suite starts on a quiet disk: writeback an earlier suite left behind (the
        // 50 MB edit, the 1 GiB spill file) is not charged to the next one.
        settle();
        let result = runtime.block_on(async {
            match suite.as_str() {
                "files" => suites::files().await,
                "cli" => suites::cli().await,
                "bash" => suites::bash().await,
                "git-sweep" => suites::git_sweep().await,
                "grep" => suites::grep().await,
                _ => suites::throughput().await,
            }
        });
        if let Err(error) = result {
            eprintln!("cordon-bench: suite {suite} failed: {error}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Flush every dirty page to disk (`sync`), outside any measurement.
fn settle() {
    match std::process::Command::new("sync").status() {
        Ok(status) if status.success() => {}
        other => eprintln!("cordon-bench: sync failed ({other:?}); the numbers may be noisier"),
    }
}
