//! `cordon`: the command-line entry point. A thin layer of argument parsing and wiring over the
//! library crates (`cordon-runtime` does the work). Exit codes (docs/contract.md#exit-codes): 0
//! success, 1 error result, 2 usage or configuration error with a one-line reason on stderr.

mod args;
#[cfg(test)]
#[path = "../build_commit.rs"]
mod build_commit;
mod cmd;
mod colour;
mod config;
mod logging;
mod output;

use std::process::ExitCode;

use clap::Parser;

use crate::args::Cli;

/// musl's allocator hands memory back to the kernel eagerly and serialises threads on one lock:
/// a static musl `cordon exec read` made ten times the `mmap`/`munmap`/`futex` calls of the
/// glibc build (BENCHMARKS.md, "Static binary"). The static release build uses mimalloc.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code of a usage or configuration error.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return args::report_parse_error(&error),
    };
    if let Err(error) = logging::init(cli.verbose, cli.log_file.as_deref()) {
        eprintln!("cordon: {error}");
        return ExitCode::from(EXIT_USAGE);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if matches!(cli.command, args::Command::Exec(_)) {
        // One call needs one worker; every extra worker is a thread to start and stop.
        builder.worker_threads(1);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cordon: failed to start the async runtime: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let outcome = runtime.block_on(cmd::run(cli));
    // Blocking work still running (a write that outlived its call) finishes first; then files
    // the local backend swapped in get their writeback started before the process goes.
    drop(runtime);
    cordon_backend_local::wait_for_writeback();
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("cordon: {}", output::one_line(&error));
            ExitCode::from(EXIT_USAGE)
        }
    }
}
