//! `cordon mcp`: the enabled tools as a Model Context Protocol server on stdio. Policy and
//! backend apply exactly as for `exec`. Standard output carries only JSON-RPC; diagnostics go
//! to standard error. Closing stdin, SIGINT or SIGTERM end the session cleanly (exit 0).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use cordon_core::CancellationToken;
use cordon_mcp::{McpServer, ServeOptions};

use crate::cmd::common::CommonArgs;

#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Run `cordon mcp`.
pub async fn mcp(args: McpArgs) -> anyhow::Result<ExitCode> {
    let McpArgs { common } = args;
    let session = Arc::new(common.open_session().await?);
    let server = match McpServer::new(session.clone(), ServeOptions::default()) {
        Ok(server) => server,
        Err(error) => {
            session.shutdown().await;
            return Err(error.into());
        }
    };
    let names: Vec<&str> = server
        .tools()
        .iter()
        .map(|tool| tool.name.as_ref())
        .collect();
    eprintln!(
        "cordon mcp: serving {} on stdio ({})",
        names.join(", "),
        session.backend().id()
    );
    server.serve_stdio(shutdown_on_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

/// A token cancelled by SIGINT or SIGTERM (how MCP clients stop a server that does not exit
/// after they close its stdin).
fn shutdown_on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut terminate) => {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = terminate.recv() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        token.cancel();
    });
    shutdown
}
