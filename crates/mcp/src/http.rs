//! `cordon mcp --http`: MCP's streamable HTTP transport on a loopback address (rmcp's
//! `StreamableHttpService` behind hyper), for clients that connect instead of spawning the
//! server, or several clients sharing one sandbox session.
//!
//! Loopback is not a security boundary between local users, so every request must carry
//! `Authorization: Bearer TOKEN`; requests with an `Origin` header (browsers) and Host headers
//! other than loopback names (DNS rebinding) are refused; the listener must be on a loopback
//! address. It owns the listener, the token check and the connections' lifetime; the MCP
//! semantics are the shared handler's (`server`).

use std::convert::Infallible;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::McpError;
use crate::server::{Handler, McpServer, ServeEnd};

/// The path of the MCP endpoint: `http://ADDR/mcp`.
pub const HTTP_PATH: &str = "/mcp";

/// Shortest token accepted from the operator.
const MIN_TOKEN_LEN: usize = 16;

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

type HttpResponse = Response<http_body_util::combinators::BoxBody<Bytes, Infallible>>;

/// The bearer token HTTP clients must present.
#[derive(Clone)]
pub struct AccessToken(String);

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessToken(<redacted>)")
    }
}

impl AccessToken {
    /// A fresh random token (256 bits from the OS, hex).
    pub fn generate() -> Result<AccessToken, McpError> {
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut random| random.read_exact(&mut bytes))
            .map_err(|source| McpError::Token { source })?;
        Ok(AccessToken(
            bytes.iter().map(|byte| format!("{byte:02x}")).collect(),
        ))
    }

    /// An operator-chosen token: at least 16 visible ASCII characters.
    pub fn new(token: impl Into<String>) -> Result<AccessToken, McpError> {
        let token = token.into();
        if token.len() < MIN_TOKEN_LEN || !token.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(McpError::WeakToken { min: MIN_TOKEN_LEN });
        }
        Ok(AccessToken(token))
    }

    /// The token, to hand to the client.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether an `Authorization` header presents this token (compared in constant time).
    fn admits(&self, header: Option<&HeaderValue>) -> bool {
        let Some(presented) = header
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
        else {
            return false;
        };
        let (presented, expected) = (presented.trim().as_bytes(), self.0.as_bytes());
        presented.len() == expected.len()
            && presented
                .iter()
                .zip(expected)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

impl McpServer {
    /// Serve MCP's streamable HTTP transport at `http://ADDR/mcp` on `listener` (which must be
    /// bound to a loopback address) until `shutdown` is cancelled; then cancel and await
    /// in-flight calls and shut the session down. Every HTTP session shares this server's
    /// backend session.
    pub async fn serve_http(
        self,
        listener: TcpListener,
        token: AccessToken,
        shutdown: CancellationToken,
    ) -> Result<ServeEnd, McpError> {
        let address = listener
            .local_addr()
            .map_err(|source| McpError::Listen { source })?;
        if !address.ip().is_loopback() {
            return Err(McpError::NotLoopback { address });
        }
        let max_body = self.max_message_bytes();
        let shared = self.into_shared(&shutdown);
        let sessions_done = shutdown.child_token();
        let config = StreamableHttpServerConfig::default()
            .with_cancellation_token(sessions_done.clone())
            .with_max_request_body_bytes(max_body)
            .enforce_origin_validation();
        let for_sessions = shared.clone();
        let service = StreamableHttpService::new(
            move || Ok(Handler(for_sessions.clone())),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let token = Arc::new(token);
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        let service = service.clone();
                        let token = token.clone();
                        let respond = service_fn(move |request| {
                            let service = service.clone();
                            let token = token.clone();
                            async move { Ok::<_, Infallible>(route(&service, &token, request).await) }
                        });
                        connections.spawn(async move {
                            // A client dropping its connection is not the server's failure.
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), respond)
                                .await;
                        });
                    }
                    Err(error) => {
                        eprintln!("cordon mcp: failed to accept a connection: {error}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        sessions_done.cancel();
        connections.shutdown().await;
        shared.finish().await?;
        Ok(ServeEnd::ShutdownRequested)
    }
}

async fn route(
    service: &StreamableHttpService<Handler, LocalSessionManager>,
    token: &AccessToken,
    request: Request<Incoming>,
) -> HttpResponse {
    if request.uri().path() != HTTP_PATH {
        return plain(
            StatusCode::NOT_FOUND,
            format!("not found: the MCP endpoint is {HTTP_PATH}"),
        );
    }
    if !token.admits(request.headers().get(AUTHORIZATION)) {
        let mut response = plain(
            StatusCode::UNAUTHORIZED,
            "unauthorized: send the token cordon mcp printed (or CORDON_MCP_TOKEN) as \
             `Authorization: Bearer TOKEN`"
                .to_owned(),
        );
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    let terminating = request.method() == Method::DELETE;
    let mut response = service.handle(request).await;
    // The SDK accepts a session's termination with 202; clients (the official Python one)
    // expect 200 or 204 and log a failure otherwise.
    if terminating && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

fn plain(status: StatusCode, text: String) -> HttpResponse {
    let mut response = Response::new(Full::new(Bytes::from(text)).boxed());
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_long_random_hex() {
        let one = AccessToken::generate().unwrap();
        let two = AccessToken::generate().unwrap();
        assert_eq!(one.as_str().len(), 64);
        assert!(one.as_str().bytes().all(|byte| byte.is_ascii_hexdigit()));
        assert_ne!(one.as_str(), two.as_str());
    }

    #[test]
    fn short_or_invisible_tokens_are_refused() {
        for weak in ["short", "has a space in it!", "tab\tinside-the-token"] {
            let error = AccessToken::new(weak).unwrap_err();
            assert_eq!(
                error.to_string(),
                "failed to accept the access token: use at least 16 visible ASCII characters"
            );
        }
        assert!(AccessToken::new("0123456789abcdef").is_ok());
    }

    #[test]
    fn only_the_exact_bearer_token_is_admitted() {
        let token = AccessToken::new("0123456789abcdef").unwrap();
        let header = |value: &str| HeaderValue::from_str(value).unwrap();
        assert!(token.admits(Some(&header("Bearer 0123456789abcdef"))));
        assert!(!token.admits(None));
        assert!(!token.admits(Some(&header("Bearer 0123456789abcdeF"))));
        assert!(!token.admits(Some(&header("Bearer 0123456789abcde"))));
        assert!(!token.admits(Some(&header("Basic 0123456789abcdef"))));
        assert!(!token.admits(Some(&header("0123456789abcdef"))));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let token = AccessToken::new("0123456789abcdef").unwrap();
        assert!(!format!("{token:?}").contains("0123"));
    }
}
