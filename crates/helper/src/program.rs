//! The `cordon-helper` program (`main` only calls [`run`]; a test suite can build the same
//! program under another name): `serve`, `probe`, `--version`. Logs go to stderr, filtered by
//! `CORDON_LOG` (default `warn`).

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

const USAGE: &str = "usage: cordon-helper serve | probe | --version";

/// Run the program with `args` (without the program name).
pub fn run(args: Vec<String>) -> ExitCode {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["serve"] => serve(),
        ["probe"] => probe(),
        ["--version" | "-V"] => {
            println!(
                "cordon-helper {} (protocol {})",
                env!("CARGO_PKG_VERSION"),
                crate::PROTOCOL_VERSION
            );
            ExitCode::SUCCESS
        }
        ["--help" | "-h"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("cordon-helper: unknown arguments {words:?}; {USAGE}");
            ExitCode::from(2)
        }
    }
}

fn init_logging() {
    let filter = EnvFilter::try_from_env("CORDON_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

fn serve() -> ExitCode {
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cordon-helper: failed to start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let ended = runtime.block_on(crate::serve(tokio::io::stdin(), tokio::io::stdout()));
    // A write that outlived its call finishes before the writeback is started.
    drop(runtime);
    cordon_backend_local::wait_for_writeback();
    match ended {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cordon-helper: {error}");
            ExitCode::FAILURE
        }
    }
}

fn probe() -> ExitCode {
    let report = crate::ProbeReport::from(cordon_backend_local::probe_host());
    match serde_json::to_string(&report) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("cordon-helper: failed to encode the probe: {error}");
            ExitCode::FAILURE
        }
    }
}
