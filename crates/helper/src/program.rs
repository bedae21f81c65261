//! The `cordon-helper` program (`main` only calls [`run`]; a test suite can build the same
//! program under another name): `serve` (on stdin/stdout, or `--connect SOCKET`: on a Unix
//! socket its starter listens on), `probe`, `forward`, `--version`. Logs go to stderr, filtered by
//! `CORDON_LOG` (default `warn`).

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

const USAGE: &str =
    "usage: cordon-helper serve [--connect SOCKET] | probe | forward PORT SOCKET | --version";

/// Run the program with `args` (without the program name).
pub fn run(args: Vec<String>) -> ExitCode {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["serve"] => serve(None),
        ["serve", "--connect", socket] => serve(Some(socket)),
        ["probe"] => probe(),
        ["forward", port, socket] => forward(port, socket),
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

/// `serve`: on stdin/stdout, or on a connection to the Unix socket `connect` (then stdin and
/// stdout are not used; the session ends with that connection). A socket that cannot be
/// reached exits with status 3 before anything is served, so the starter can tell it from a
/// session that failed.
fn serve(connect: Option<&str>) -> ExitCode {
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
    let ended = runtime.block_on(async {
        match connect {
            None => {
                let (reader, writer) = crate::stdio::streams();
                Ok(crate::serve(reader, writer).await)
            }
            Some(socket) => match tokio::net::UnixStream::connect(socket).await {
                Ok(stream) => {
                    let (reader, writer) = stream.into_split();
                    Ok(crate::serve(reader, writer).await)
                }
                Err(error) => Err(format!("failed to connect to {socket}: {error}")),
            },
        }
    });
    let ended = match ended {
        Ok(ended) => ended,
        Err(reason) => {
            eprintln!("cordon-helper: {reason}");
            return ExitCode::from(3);
        }
    };
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

/// `forward PORT SOCKET` (module `forward`): relays `127.0.0.1:PORT` to the Unix socket,
/// answering flush lines on stdin, until stdin ends.
fn forward(port: &str, socket: &str) -> ExitCode {
    init_logging();
    let config = match crate::forward::ForwardConfig::from_args(port, socket) {
        Ok(config) => config,
        Err(reason) => {
            eprintln!("cordon-helper: forward: {reason}; {USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cordon-helper: failed to start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let ended = runtime.block_on(crate::forward::run(
        &config,
        |bound| {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // The starter waits for this line; a failed write shows as a forwarder that never
            // became ready.
            let _ = writeln!(out, "{} {bound}", crate::forward::READY).and_then(|()| out.flush());
        },
        // Stdin carries the starter's flush lines (its end stops the relay); the answers go
        // to stdout after the ready line.
        tokio::io::stdin(),
        tokio::io::stdout(),
    ));
    match ended {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "cordon-helper: failed to forward 127.0.0.1:{port} to {socket}: {error}",
                port = config.port,
                socket = config.socket.display()
            );
            ExitCode::FAILURE
        }
    }
}
