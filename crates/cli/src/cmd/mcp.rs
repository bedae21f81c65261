//! `cordon mcp`: the enabled tools as a Model Context Protocol server, on stdio (the default)
//! or, with `--http ADDR`, on MCP's streamable HTTP transport at a loopback address behind a
//! bearer token. Policy and backend apply exactly as for `exec`, except that a policy `ask` is
//! a question to the user (MCP elicitation) when the client can show one. On stdio, standard output
//! carries only JSON-RPC; diagnostics go to standard error. Closing stdin (stdio), SIGINT or
//! SIGTERM end the session cleanly (exit 0).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use cordon_core::CancellationToken;
use cordon_mcp::{
    AccessToken, DEFAULT_APPROVAL_TIMEOUT, ElicitationApprover, HTTP_PATH, McpError, McpServer,
    ServeOptions,
};
use cordon_runtime::{Approver, Session};

use crate::cmd::common::{CommonArgs, report_audit_head, shutdown_reporting};

/// Environment variable holding the bearer token for `--http` (otherwise one is generated
/// and printed on stderr).
const TOKEN_ENV: &str = "CORDON_MCP_TOKEN";

/// Longest `--approval-timeout` (a day: a question nobody answers must end).
const MAX_APPROVAL_TIMEOUT_SECS: u64 = 86_400;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Serve MCP's streamable HTTP transport at http://ADDR/mcp instead of stdio. ADDR must
    /// be a loopback address (e.g. 127.0.0.1:8765; port 0 picks a free one). Clients send
    /// `Authorization: Bearer TOKEN`, TOKEN from $CORDON_MCP_TOKEN or printed on stderr.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// How long a policy `ask` waits for the user's answer (MCP elicitation, for clients
    /// that support it) before the call is denied.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = DEFAULT_APPROVAL_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=MAX_APPROVAL_TIMEOUT_SECS)
    )]
    pub approval_timeout: u64,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Run `cordon mcp`.
pub async fn mcp(args: McpArgs) -> anyhow::Result<ExitCode> {
    let McpArgs {
        http,
        approval_timeout,
        common,
    } = args;
    // Refuse a bad --http before starting anything.
    let http = match http {
        Some(address) => Some(http_setup(address)?),
        None => None,
    };
    // `ask` is a question to the client of the call, when that client can answer one.
    let approvals = Arc::new(ElicitationApprover::new(Duration::from_secs(
        approval_timeout,
    )));
    let mut options = common.session_options()?;
    options.approver = Some(approvals.clone() as Arc<dyn Approver>);
    let session = Arc::new(Session::open(options).await?);
    let serve_options = ServeOptions {
        approvals: Some(approvals),
        ..ServeOptions::default()
    };
    let server = match McpServer::new(session.clone(), serve_options) {
        Ok(server) => server,
        Err(error) => {
            shutdown_reporting(&session).await;
            return Err(error.into());
        }
    };
    let names: Vec<&str> = server
        .tools()
        .iter()
        .map(|tool| tool.name.as_ref())
        .collect();
    let tools = names.join(", ");
    let backend = session.backend().id().to_string();
    let shutdown = shutdown_on_signal();
    let served;
    match http {
        None => {
            eprintln!("cordon mcp: serving {tools} on stdio ({backend})");
            served = server.serve_stdio(shutdown).await;
        }
        Some(HttpSetup { address, token }) => {
            let listener = match tokio::net::TcpListener::bind(address).await {
                Ok(listener) => listener,
                Err(error) => {
                    shutdown_reporting(&session).await;
                    return Err(error).with_context(|| format!("failed to listen on {address}"));
                }
            };
            let bound = listener
                .local_addr()
                .context("failed to read the bound address")?;
            eprintln!("cordon mcp: serving {tools} at http://{bound}{HTTP_PATH} ({backend})");
            match &token {
                Token::Generated(token) => eprintln!(
                    "cordon mcp: clients must send `Authorization: Bearer {}` (set \
                     {TOKEN_ENV} to choose the token)",
                    token.as_str()
                ),
                Token::FromEnv(_) => {
                    eprintln!("cordon mcp: clients must send `Authorization: Bearer ${TOKEN_ENV}`")
                }
            }
            served = server
                .serve_http(listener, token.into_inner(), shutdown)
                .await;
        }
    }
    // The server shut the session down, which recorded the audit head.
    report_audit_head(&session);
    match served {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(McpError::Shutdown(error)) => {
            eprintln!("cordon: error: {error}");
            Ok(ExitCode::FAILURE)
        }
        Err(error) => Err(error.into()),
    }
}

struct HttpSetup {
    address: SocketAddr,
    token: Token,
}

enum Token {
    Generated(AccessToken),
    FromEnv(AccessToken),
}

impl Token {
    fn into_inner(self) -> AccessToken {
        match self {
            Token::Generated(token) | Token::FromEnv(token) => token,
        }
    }
}

fn http_setup(address: SocketAddr) -> anyhow::Result<HttpSetup> {
    if !address.ip().is_loopback() {
        anyhow::bail!(
            "--http {address}: only loopback addresses (127.0.0.1, ::1) are allowed; reach a \
             remote host through an SSH tunnel instead"
        );
    }
    let token = match std::env::var(TOKEN_ENV) {
        Ok(token) => {
            Token::FromEnv(AccessToken::new(token).with_context(|| format!("invalid {TOKEN_ENV}"))?)
        }
        Err(std::env::VarError::NotPresent) => Token::Generated(AccessToken::generate()?),
        Err(std::env::VarError::NotUnicode(_)) => {
            anyhow::bail!("invalid {TOKEN_ENV}: not valid UTF-8")
        }
    };
    Ok(HttpSetup { address, token })
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
                    // Without a SIGTERM handler, Ctrl-C (or nothing) ends the wait.
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        // Ctrl-C or nothing: an error here means no signal will come, so wait no more.
        let _ = tokio::signal::ctrl_c().await;
        token.cancel();
    });
    shutdown
}
