//! The proxy server: one listener that speaks HTTP `CONNECT`, plain-HTTP forward proxying and
//! SOCKS5 (told apart by the first byte), decides each destination with [`Rules`], resolves
//! names itself through a [`Resolver`], connects only to addresses that passed
//! [`Rules::check_address`], relays bytes, and reports one [`ConnectionEvent`] per attempt.
//! It does not bind the listener (the caller hands it over), parse policies or write the audit
//! log.
//!
//! A forwarded plain-HTTP request is sent in origin form with the hop-by-hop and `Proxy-*`
//! headers removed and `Connection: close` added; after the head the connection is a byte
//! splice to that one destination, so a client gets one request per proxy connection (curl,
//! pip and the like open a new one).
//!
//! Relaying: a TCP or Unix client on Linux is relayed with `splice(2)` through a pipe per
//! direction (bytes stay in the kernel; see the benchmark in BENCHMARKS.md), any other stream
//! by copying through 64 KiB buffers.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::ask::{Approvals, AskRequest, Asked, EgressApprover, MAX_REFUSALS_PER_CALL};
use crate::rules::{
    AddressCheck, Decision, Host, Matched, Rules, suggested_address_entry, suggested_entry,
};

/// Bounds on what a client can make the proxy do.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest HTTP request head (request line and headers), in bytes.
    pub max_head_bytes: usize,
    /// Most header lines in an HTTP request head.
    pub max_headers: usize,
    /// Time a client has to send its whole request (HTTP head or SOCKS5 handshake).
    pub head_timeout: Duration,
    /// Time to resolve a name, and separately to connect to the destination.
    pub connect_timeout: Duration,
    /// Connections served at once; more are answered `503` and closed.
    pub max_connections: usize,
    /// Most addresses of one name that are considered.
    pub max_addresses: usize,
    /// Time an approver has to answer about a destination an ask entry matched; no answer
    /// in time is a refusal.
    pub ask_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head_bytes: 16 * 1024,
            max_headers: 100,
            head_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            max_connections: 256,
            max_addresses: 32,
            ask_timeout: Duration::from_secs(120),
        }
    }
}

/// Resolves destination names for the proxy. The default is [`SystemResolver`]; tests and
/// host overrides use [`StaticResolver`].
#[async_trait::async_trait]
pub trait Resolver: Send + Sync {
    /// The addresses of `name` (lowercase, no trailing dot), in the order to try them.
    async fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<IpAddr>>;
}

/// The system resolver (`getaddrinfo` through tokio).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

#[async_trait::async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((name, port))
            .await?
            .map(|addr| addr.ip())
            .collect())
    }
}

/// A fixed table of names and their addresses; any other name fails to resolve.
#[derive(Clone, Debug, Default)]
pub struct StaticResolver {
    names: std::collections::HashMap<Box<str>, Vec<IpAddr>>,
}

impl StaticResolver {
    /// A table from `(name, addresses)` pairs; names are compared lowercase.
    pub fn new<N: AsRef<str>>(entries: impl IntoIterator<Item = (N, Vec<IpAddr>)>) -> Self {
        let names = entries
            .into_iter()
            .map(|(name, addrs)| (name.as_ref().to_ascii_lowercase().into_boxed_str(), addrs))
            .collect();
        StaticResolver { names }
    }
}

#[async_trait::async_trait]
impl Resolver for StaticResolver {
    async fn resolve(&self, name: &str, _port: u16) -> io::Result<Vec<IpAddr>> {
        self.names.get(name).cloned().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{name} is not in the static table"),
            )
        })
    }
}

/// How the client asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP `CONNECT host:port`.
    HttpConnect,
    /// An HTTP absolute-form request (`GET http://host/…`).
    HttpForward,
    /// SOCKS5 `CONNECT`.
    Socks5,
    /// The request could not be read far enough to tell.
    Unknown,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The destination was allowed and connected; bytes were relayed.
    Allowed,
    /// The rules refused the destination (a deny entry, no allow entry, or a refused address).
    Denied,
    /// Nothing was decided or connected: a malformed or oversized request, a timeout, too many
    /// connections, a name that did not resolve, a destination that did not answer.
    Failed,
}

/// One connection attempt, reported when it is over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionEvent {
    /// The session label the caller gave the proxy (to match events with commands).
    pub session: Arc<str>,
    /// How the client asked.
    pub protocol: Protocol,
    /// The destination host (normalised when it was valid; empty when none was read).
    pub host: String,
    /// The destination port (0 when none was read).
    pub port: u16,
    /// The address connected to (or refused).
    pub address: Option<SocketAddr>,
    /// How it ended.
    pub outcome: Outcome,
    /// The entry that decided, if one did.
    pub source: Option<Matched>,
    /// For a destination an ask entry matched: how it was settled.
    pub asked: Option<Asked>,
    /// Why, in words (the text a denied client also gets).
    pub reason: String,
    /// For a destination refused because no entry allows it (or its resolved address): the
    /// allow entry that would let it through. `None` otherwise (allowed, failed, or refused
    /// by a deny entry, which must be removed or narrowed instead).
    pub suggestion: Option<String>,
    /// Bytes from the client to the destination.
    pub bytes_up: u64,
    /// Bytes from the destination to the client.
    pub bytes_down: u64,
    /// From accepting the connection to closing it.
    pub duration: Duration,
}

/// Where events go: a bounded channel that never blocks the data path. A full (or closed)
/// channel drops the event, counts it and logs a warning.
#[derive(Clone, Debug)]
pub struct EventSink {
    tx: mpsc::Sender<ConnectionEvent>,
    dropped: Arc<AtomicU64>,
}

impl EventSink {
    /// A sink holding up to `capacity` (at least 1) undelivered events, and its receiver.
    pub fn channel(capacity: usize) -> (EventSink, mpsc::Receiver<ConnectionEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            EventSink {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            rx,
        )
    }

    /// Events dropped so far because the channel was full or closed.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn send(&self, event: ConnectionEvent) {
        if let Err(error) = self.tx.try_send(event) {
            let total = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            let full = matches!(error, mpsc::error::TrySendError::Full(_));
            tracing::warn!(
                full,
                dropped_total = total,
                "egress event dropped: the sink is not keeping up"
            );
        }
    }
}

/// Who a served connection belongs to: where its event goes and, when the caller knows it,
/// the tool call whose command opened it (a backend serving one command's own listener), which
/// a question about the destination carries to the approver.
#[derive(Clone, Debug)]
pub struct ConnectionOwner {
    /// Receives the connection's event.
    pub events: EventSink,
    /// The tool call whose command opened the connection; `None` when that is not known (a
    /// listener several commands share).
    pub call: Option<Arc<str>>,
}

/// Everything a proxy needs.
#[derive(Clone)]
pub struct ProxyConfig {
    /// A label copied into every event (e.g. the session id).
    pub session: Arc<str>,
    /// The allow and deny lists.
    pub rules: Arc<Rules>,
    /// Resolves destination names.
    pub resolver: Arc<dyn Resolver>,
    /// Receives one event per attempt.
    pub events: EventSink,
    /// Bounds.
    pub limits: Limits,
}

/// The listener could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// `accept` failed with an error that is not about one connection.
    #[error("failed to accept an egress proxy connection: {0}")]
    Accept(#[source] io::Error),
}

/// The egress proxy. Cheap to clone; clones share the connection limit.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

struct Shared {
    config: ProxyConfig,
    permits: Arc<Semaphore>,
    approvals: Approvals,
}

impl Proxy {
    /// A proxy with this configuration and nobody to ask: a destination only an ask entry
    /// matches is refused.
    pub fn new(config: ProxyConfig) -> Proxy {
        Proxy::with_approver(config, None)
    }

    /// A proxy that asks `approver` (when given) about destinations an ask entry matches,
    /// waiting at most [`Limits::ask_timeout`] for an answer.
    pub fn with_approver(config: ProxyConfig, approver: Option<Arc<dyn EgressApprover>>) -> Proxy {
        let permits = Arc::new(Semaphore::new(config.limits.max_connections));
        let approvals = Approvals::new(approver, config.limits.ask_timeout);
        Proxy {
            shared: Arc::new(Shared {
                config,
                permits,
                approvals,
            }),
        }
    }

    /// Serves a TCP listener until accepting fails. Dropping the future closes every
    /// connection it accepted.
    pub async fn serve_tcp(&self, listener: TcpListener) -> Result<(), ProxyError> {
        self.serve_loop(|| async {
            let (stream, _) = listener.accept().await?;
            // Small requests and replies should not wait for Nagle's algorithm.
            stream.set_nodelay(true)?;
            Ok(stream)
        })
        .await
    }

    /// Serves a Unix listener until accepting fails. Dropping the future closes every
    /// connection it accepted.
    #[cfg(unix)]
    pub async fn serve_unix(&self, listener: tokio::net::UnixListener) -> Result<(), ProxyError> {
        self.serve_loop(|| async { Ok(listener.accept().await?.0) })
            .await
    }

    async fn serve_loop<S, F, Fut>(&self, mut accept: F) -> Result<(), ProxyError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: FnMut() -> Fut,
        Fut: Future<Output = io::Result<S>>,
    {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = accept() => match accepted {
                    Ok(stream) => {
                        let proxy = self.clone();
                        connections.spawn(async move { proxy.handle(stream).await });
                    }
                    Err(error) if is_per_connection(&error) => {
                        tracing::debug!(%error, "egress proxy: one connection failed during accept");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "egress proxy: accept failed, stopping");
                        return Err(ProxyError::Accept(error));
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    }

    /// Serves one client connection (a stream a backend forwarded, say) to its end.
    pub async fn handle<S>(&self, client: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let owner = ConnectionOwner {
            events: self.shared.config.events.clone(),
            call: None,
        };
        self.serve_connection(client, &owner, std::future::pending())
            .await;
    }

    /// Serves one client connection until it ends or `stop` completes (the command that
    /// opened it has ended, say), and reports its event to the `owner`'s sink instead of the
    /// configuration's (a backend collecting one command's attempts); a question about its
    /// destination names the owner's call. A connection cut by `stop` is closed on both sides
    /// and reported with the reason saying so; bytes it relayed by `splice(2)` are then not
    /// counted.
    pub async fn serve_connection<S, F>(&self, client: S, owner: &ConnectionOwner, stop: F)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: Future<Output = ()>,
    {
        let ConnectionOwner { events, call } = owner;
        let started = Instant::now();
        let permit = self.shared.permits.clone().try_acquire_owned().ok();
        let mut attempt = Attempt::new();
        attempt.call = call.clone();
        let mut client = Counted::new(client);
        let cut = tokio::select! {
            () = self.run(&mut client, permit, &mut attempt) => false,
            () = stop => true,
        };
        if cut {
            tracing::debug!(host = %attempt.host, port = attempt.port, "egress proxy: connection cut by its owner");
            attempt.reason = match attempt.outcome {
                Outcome::Allowed => {
                    "relayed until the command that opened it ended, then cut".to_string()
                }
                Outcome::Denied => attempt.reason.clone(),
                Outcome::Failed => {
                    "cut before a decision: the command that opened it ended".to_string()
                }
            };
        }
        let config = &self.shared.config;
        // Only relayed bytes count; request heads and refusals are not traffic.
        let relayed = attempt.outcome == Outcome::Allowed;
        let event = ConnectionEvent {
            session: config.session.clone(),
            protocol: attempt.protocol,
            host: attempt.host,
            port: attempt.port,
            address: attempt.address,
            outcome: attempt.outcome,
            source: attempt.source,
            asked: attempt.asked,
            reason: attempt.reason,
            suggestion: attempt.suggestion,
            bytes_up: if relayed { client.read } else { 0 },
            bytes_down: if relayed { client.written } else { 0 },
            duration: started.elapsed(),
        };
        events.send(event);
    }

    async fn run<S>(
        &self,
        client: &mut Counted<S>,
        permit: Option<OwnedSemaphorePermit>,
        attempt: &mut Attempt,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let limits = &self.shared.config.limits;
        let Some(_permit) = permit else {
            let reason = format!(
                "too many connections through the egress proxy at once (the limit is {})",
                limits.max_connections
            );
            tracing::info!(
                limit = limits.max_connections,
                "egress proxy: connection refused, at the limit"
            );
            let reply = http_response(503, "Service Unavailable", &format!("cordon: {reason}\n"));
            // A client gone before its refusal is read needs no answer; the event says why.
            let _ = client.inner.write_all(reply.as_bytes()).await;
            attempt.fail(reason);
            return;
        };
        let request =
            match tokio::time::timeout(limits.head_timeout, read_request(client, limits, attempt))
                .await
            {
                Ok(Ok(request)) => request,
                Ok(Err(refusal)) => {
                    refuse(client, attempt.protocol, &refusal).await;
                    attempt.fail(refusal.reason);
                    return;
                }
                Err(_) => {
                    let refusal = Refusal::bad_request(
                        408,
                        format!(
                            "the request was not complete within {:?}",
                            limits.head_timeout
                        ),
                    );
                    refuse(client, attempt.protocol, &refusal).await;
                    attempt.fail(refusal.reason);
                    return;
                }
            };
        self.connect_and_relay(client, request, attempt).await;
    }

    async fn connect_and_relay<S>(
        &self,
        client: &mut Counted<S>,
        request: Request,
        attempt: &mut Attempt,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let config = &self.shared.config;
        let Request {
            host,
            port,
            forward_head,
            leftover,
        } = request;
        attempt.host = host.to_string();
        attempt.port = port;
        let destination = format!("{host}:{port}");
        let decided = match config.rules.decide(&host, port) {
            Decision::Allowed(matched) => matched,
            Decision::Denied(matched) => {
                let reason = format!("deny entry {matched} matches {destination}");
                return self
                    .deny(client, attempt, Some(matched), reason, None)
                    .await;
            }
            Decision::Ask(matched) => {
                let asked = self
                    .shared
                    .approvals
                    .settle(AskRequest {
                        session: config.session.clone(),
                        call: attempt.call.clone(),
                        host: host.clone(),
                        port,
                        entry: matched.clone(),
                    })
                    .await;
                attempt.asked = Some(asked);
                let why = match asked {
                    Asked::Once | Asked::Session | Asked::Remembered => None,
                    Asked::Refused => Some("the person asked did not approve it".to_owned()),
                    Asked::TimedOut => Some(format!(
                        "no usable answer came in time (the wait is at most {:?})",
                        self.shared.approvals.timeout()
                    )),
                    Asked::NoApprover => Some("nobody can be asked about it here".to_owned()),
                    Asked::Withheld => Some(format!(
                        "the person was not asked again: during this tool call they refused it, \
                         or {MAX_REFUSALS_PER_CALL} destinations, already"
                    )),
                };
                if let Some(why) = why {
                    let reason = format!(
                        "ask entry {matched} matches {destination}, which needs approval, and {why}"
                    );
                    let suggestion = suggested_entry(&host, port);
                    return self
                        .deny(client, attempt, Some(matched), reason, Some(suggestion))
                        .await;
                }
                matched
            }
            Decision::NotAllowed => {
                let reason = format!("no entry allows {destination}");
                let suggestion = suggested_entry(&host, port);
                return self
                    .deny(client, attempt, None, reason, Some(suggestion))
                    .await;
            }
        };
        let addresses = match &host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => match self.resolve(name, port).await {
                Ok(addresses) => addresses,
                Err(reason) => {
                    attempt.source = Some(decided);
                    let refusal = Refusal::unreachable(502, 0x04, reason);
                    refuse(client, attempt.protocol, &refusal).await;
                    return attempt.fail(refusal.reason);
                }
            },
        };
        // An IP literal a person approved was named by the IP/CIDR ask entry that matched,
        // as an allow entry would name it; an approved name gets no such pass (rebinding).
        let approved_literal =
            matches!((&host, attempt.asked), (Host::Ip(_), Some(asked)) if asked.approved());
        let mut passed = Vec::new();
        let mut first_refusal = None;
        for ip in addresses.into_iter().take(config.limits.max_addresses) {
            match config.rules.check_address(ip, port) {
                AddressCheck::Pass => passed.push(SocketAddr::new(ip, port)),
                AddressCheck::Special(_) if approved_literal => {
                    passed.push(SocketAddr::new(ip, port));
                }
                check @ (AddressCheck::Denied(_) | AddressCheck::Special(_)) => {
                    tracing::debug!(%host, %ip, port, ?check, "egress proxy: resolved address refused");
                    first_refusal.get_or_insert((ip, check));
                }
            }
        }
        if passed.is_empty() {
            attempt.address = first_refusal
                .as_ref()
                .map(|(ip, _)| SocketAddr::new(*ip, port));
            let (source, reason, suggestion) = match first_refusal {
                Some((ip, AddressCheck::Denied(matched))) => (
                    Some(matched.clone()),
                    format!("{host} resolved to {ip}, which deny entry {matched} matches"),
                    None,
                ),
                Some((ip, AddressCheck::Special(range))) => (
                    None,
                    format!(
                        "{host} resolved to {ip}, {range}, which a name entry alone does not allow \
                         (the name is allowed by {decided})"
                    ),
                    Some(suggested_address_entry(ip, port)),
                ),
                Some((_, AddressCheck::Pass)) | None => {
                    attempt.source = Some(decided);
                    let refusal = Refusal::unreachable(502, 0x04, format!("{host} has no address"));
                    refuse(client, attempt.protocol, &refusal).await;
                    return attempt.fail(refusal.reason);
                }
            };
            return self.deny(client, attempt, source, reason, suggestion).await;
        }
        tracing::debug!(%destination, by = %decided, "egress proxy: destination allowed");
        attempt.source = Some(decided);
        let upstream = match self.connect(&passed).await {
            Ok(upstream) => upstream,
            Err((address, reason)) => {
                attempt.address = Some(address);
                let refusal = Refusal::unreachable(502, 0x05, reason);
                refuse(client, attempt.protocol, &refusal).await;
                return attempt.fail(refusal.reason);
            }
        };
        attempt.address = upstream.peer_addr().ok();
        self.relay(client, upstream, forward_head, leftover, attempt)
            .await;
    }

    async fn deny<S>(
        &self,
        client: &mut Counted<S>,
        attempt: &mut Attempt,
        source: Option<Matched>,
        reason: String,
        suggestion: Option<String>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        tracing::info!(
            session = %self.shared.config.session,
            host = %attempt.host,
            port = attempt.port,
            source = source.as_ref().map(|m| m.source.to_string()),
            %reason,
            "egress proxy: destination denied"
        );
        let fix = match &suggestion {
            Some(entry) if attempt.asked.is_some() => format!(
                "to allow it without asking, add {entry:?} to [network] allow in the policy"
            ),
            Some(entry) => format!("to allow it, add {entry:?} to [network] allow in the policy"),
            None => "to allow it, remove or narrow that deny entry in [network] deny".to_owned(),
        };
        let body = format!(
            "cordon: connection to {}:{} refused by the network policy\n{reason}\n{fix}\n",
            attempt.host, attempt.port
        );
        let refusal = Refusal {
            status: 403,
            status_text: "Forbidden",
            socks: 0x02,
            body,
            reason,
        };
        refuse(client, attempt.protocol, &refusal).await;
        attempt.outcome = Outcome::Denied;
        attempt.source = source;
        attempt.reason = refusal.reason;
        attempt.suggestion = suggestion;
    }

    async fn resolve(&self, name: &str, port: u16) -> Result<Vec<IpAddr>, String> {
        let timeout = self.shared.config.limits.connect_timeout;
        match tokio::time::timeout(timeout, self.shared.config.resolver.resolve(name, port)).await {
            Ok(Ok(addresses)) => Ok(addresses),
            Ok(Err(error)) => Err(format!("failed to resolve {name}: {error}")),
            Err(_) => Err(format!("failed to resolve {name} within {timeout:?}")),
        }
    }

    async fn connect(&self, addresses: &[SocketAddr]) -> Result<TcpStream, (SocketAddr, String)> {
        let timeout = self.shared.config.limits.connect_timeout;
        let mut last = None;
        let attempts = async {
            for &address in addresses {
                match TcpStream::connect(address).await {
                    Ok(stream) => return Ok(stream),
                    Err(error) => {
                        tracing::debug!(%address, %error, "egress proxy: connect failed");
                        last = Some((address, format!("failed to connect to {address}: {error}")));
                    }
                }
            }
            Err(())
        };
        match tokio::time::timeout(timeout, attempts).await {
            Ok(Ok(stream)) => {
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(%error, "egress proxy: TCP_NODELAY not set on the upstream");
                }
                Ok(stream)
            }
            Ok(Err(())) => {
                Err(last.unwrap_or_else(|| (addresses[0], "no address to connect to".into())))
            }
            Err(_) => {
                let address = last.map_or(addresses[0], |(address, _)| address);
                Err((
                    address,
                    format!("failed to connect to {address} within {timeout:?}"),
                ))
            }
        }
    }

    async fn relay<S>(
        &self,
        client: &mut Counted<S>,
        mut upstream: TcpStream,
        forward_head: Option<Vec<u8>>,
        leftover: Vec<u8>,
        attempt: &mut Attempt,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let opened = match attempt.protocol {
            Protocol::HttpConnect => {
                client
                    .inner
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
            }
            // The bound address would be the proxy's outgoing socket on the host (its address
            // and port): clients do not need it for CONNECT, so it stays all zeros.
            Protocol::Socks5 => client.inner.write_all(&socks_reply(0x00)).await,
            Protocol::HttpForward | Protocol::Unknown => Ok(()),
        };
        // Bytes up are what reached the destination: a forwarded head (whose URL can carry as
        // much as a body) and what followed it, not a CONNECT or SOCKS5 request.
        let head_len = forward_head.as_ref().map_or(0, Vec::len);
        client.read = (head_len + leftover.len()) as u64;
        client.written = 0;
        // Connected: a relay cut before it ends is still an allowed connection.
        attempt.outcome = Outcome::Allowed;
        attempt.reason = "relaying".to_string();
        let mut sent = async {
            opened?;
            if let Some(head) = &forward_head {
                upstream.write_all(head).await?;
            }
            upstream.write_all(&leftover).await
        }
        .await;
        if sent.is_ok() {
            sent = relay_bytes(client, &mut upstream).await;
        }
        attempt.outcome = Outcome::Allowed;
        attempt.reason = match sent {
            Ok(()) => "relayed until both sides closed".to_string(),
            Err(error) => format!("relay ended: {error}"),
        };
    }
}

/// Relays until both directions end: by `splice(2)` when the client is a TCP or Unix socket on
/// Linux, by copying through buffers otherwise. The client's counters take the relayed bytes.
async fn relay_bytes<S>(client: &mut Counted<S>, upstream: &mut TcpStream) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    #[cfg(target_os = "linux")]
    {
        use std::any::Any;
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let tcp = (&client.inner as &dyn Any).downcast_ref::<TcpStream>();
        let unix = (&client.inner as &dyn Any).downcast_ref::<tokio::net::UnixStream>();
        let spliced = match (tcp, unix) {
            (Some(tcp), _) => Some(crate::splice::relay(tcp, upstream, &up, &down).await),
            (None, Some(unix)) => Some(crate::splice::relay(unix, upstream, &up, &down).await),
            (None, None) => None,
        };
        if let Some(result) = spliced {
            client.read += up.load(Ordering::Relaxed);
            client.written += down.load(Ordering::Relaxed);
            return result;
        }
    }
    tokio::io::copy_bidirectional_with_sizes(client, upstream, 64 * 1024, 64 * 1024)
        .await
        .map(|_| ())
}

fn is_per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// What one attempt has learnt so far; it becomes the event.
struct Attempt {
    protocol: Protocol,
    host: String,
    port: u16,
    address: Option<SocketAddr>,
    outcome: Outcome,
    source: Option<Matched>,
    asked: Option<Asked>,
    reason: String,
    suggestion: Option<String>,
    /// The tool call whose command opened the connection, when known.
    call: Option<Arc<str>>,
}

impl Attempt {
    fn new() -> Self {
        Attempt {
            protocol: Protocol::Unknown,
            host: String::new(),
            port: 0,
            address: None,
            outcome: Outcome::Failed,
            source: None,
            asked: None,
            reason: String::new(),
            suggestion: None,
            call: None,
        }
    }

    fn fail(&mut self, reason: String) {
        tracing::info!(host = %self.host, port = self.port, %reason, "egress proxy: request failed");
        self.outcome = Outcome::Failed;
        self.reason = reason;
    }
}

/// A parsed request: where to, and what to send first.
struct Request {
    host: Host,
    port: u16,
    /// The rewritten head of a forwarded plain-HTTP request.
    forward_head: Option<Vec<u8>>,
    /// Bytes the client sent after its request head.
    leftover: Vec<u8>,
}

/// A refusal to send the client before closing.
struct Refusal {
    status: u16,
    status_text: &'static str,
    socks: u8,
    body: String,
    reason: String,
}

impl Refusal {
    fn bad_request(status: u16, reason: String) -> Self {
        let status_text = match status {
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            _ => "Bad Request",
        };
        let body = format!("cordon egress proxy: {reason}\n");
        Refusal {
            status,
            status_text,
            socks: 0x01,
            body,
            reason,
        }
    }

    fn unreachable(status: u16, socks: u8, reason: String) -> Self {
        let body = format!("cordon egress proxy: {reason}\n");
        Refusal {
            status,
            status_text: "Bad Gateway",
            socks,
            body,
            reason,
        }
    }
}

async fn refuse<S>(client: &mut Counted<S>, protocol: Protocol, refusal: &Refusal)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let bytes = match protocol {
        // 0xff answers the method negotiation: no acceptable method.
        Protocol::Socks5 if refusal.socks == 0xff => vec![0x05, 0xff],
        Protocol::Socks5 => socks_reply(refusal.socks),
        Protocol::HttpConnect | Protocol::HttpForward | Protocol::Unknown => {
            http_response(refusal.status, refusal.status_text, &refusal.body).into_bytes()
        }
    };
    // The client may be gone already; the event records the refusal either way.
    let _ = client.inner.write_all(&bytes).await;
    let _ = client.inner.shutdown().await;
}

fn http_response(status: u16, text: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A SOCKS5 reply with an all-zero IPv4 bound address.
fn socks_reply(code: u8) -> Vec<u8> {
    vec![0x05, code, 0x00, 0x01, 0, 0, 0, 0, 0, 0]
}

async fn read_request<S>(
    client: &mut Counted<S>,
    limits: &Limits,
    attempt: &mut Attempt,
) -> Result<Request, Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut first = [0u8; 1];
    let n = client.read(&mut first).await.map_err(|error| {
        Refusal::bad_request(400, format!("failed to read the request: {error}"))
    })?;
    if n == 0 {
        return Err(Refusal::bad_request(
            400,
            "the client closed before sending a request".into(),
        ));
    }
    if first[0] == 0x05 {
        attempt.protocol = Protocol::Socks5;
        return read_socks5(client, attempt).await;
    }
    if first[0] == 0x04 {
        return Err(Refusal::bad_request(
            400,
            "SOCKS4 is not supported: use SOCKS5 (socks5h://)".into(),
        ));
    }
    if !first[0].is_ascii_uppercase() {
        return Err(Refusal::bad_request(
            400,
            format!(
                "not an HTTP or SOCKS5 request (first byte {:#04x})",
                first[0]
            ),
        ));
    }
    read_http(client, first[0], limits, attempt).await
}

async fn read_socks5<S>(client: &mut Counted<S>, attempt: &mut Attempt) -> Result<Request, Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = |error: io::Error| {
        Refusal::bad_request(400, format!("failed to read the SOCKS5 request: {error}"))
    };
    let count = client.read_u8().await.map_err(io)?;
    let mut methods = vec![0u8; usize::from(count)];
    client.read_exact(&mut methods).await.map_err(io)?;
    if !methods.contains(&0x00) {
        let mut refusal = Refusal::bad_request(
            400,
            "the SOCKS5 client offered no method without authentication".into(),
        );
        refusal.socks = 0xff;
        return Err(refusal);
    }
    client.inner.write_all(&[0x05, 0x00]).await.map_err(io)?;
    let mut header = [0u8; 4];
    client.read_exact(&mut header).await.map_err(io)?;
    let [version, command, _reserved, kind] = header;
    if version != 0x05 {
        return Err(Refusal::bad_request(
            400,
            format!("SOCKS version {version} in the request, expected 5"),
        ));
    }
    if command != 0x01 {
        let mut refusal = Refusal::bad_request(
            400,
            format!("SOCKS5 command {command} is not supported (only CONNECT)"),
        );
        refusal.socks = 0x07;
        return Err(refusal);
    }
    let host_text = match kind {
        0x01 => {
            let mut octets = [0u8; 4];
            client.read_exact(&mut octets).await.map_err(io)?;
            IpAddr::from(octets).to_string()
        }
        0x04 => {
            let mut octets = [0u8; 16];
            client.read_exact(&mut octets).await.map_err(io)?;
            IpAddr::from(octets).to_string()
        }
        0x03 => {
            let len = client.read_u8().await.map_err(io)?;
            let mut name = vec![0u8; usize::from(len)];
            client.read_exact(&mut name).await.map_err(io)?;
            String::from_utf8_lossy(&name).into_owned()
        }
        other => {
            let mut refusal =
                Refusal::bad_request(400, format!("SOCKS5 address type {other} is not supported"));
            refusal.socks = 0x08;
            return Err(refusal);
        }
    };
    let port = client.read_u16().await.map_err(io)?;
    attempt.port = port;
    let host = parse_host(&host_text, attempt)?;
    if port == 0 {
        return Err(Refusal::bad_request(
            400,
            "port 0 is not a destination".into(),
        ));
    }
    Ok(Request {
        host,
        port,
        forward_head: None,
        leftover: Vec::new(),
    })
}

fn parse_host(text: &str, attempt: &mut Attempt) -> Result<Host, Refusal> {
    let shown: String = text.chars().take(crate::rules::MAX_NAME_LEN).collect();
    // The event's host reaches the audit log, the model and terminals: an invalid one keeps
    // no control or non-ASCII characters (a valid host has none to escape).
    attempt.host = shown.chars().flat_map(char::escape_default).collect();
    Host::parse(text).map_err(|problem| {
        let mut refusal = Refusal::bad_request(
            400,
            format!("invalid destination host {shown:?}: {problem}"),
        );
        refusal.socks = 0x04;
        refusal
    })
}

async fn read_http<S>(
    client: &mut Counted<S>,
    first: u8,
    limits: &Limits,
    attempt: &mut Attempt,
) -> Result<Request, Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut buf = Vec::with_capacity(1024);
    buf.push(first);
    let end = loop {
        if let Some(end) = find_head_end(&buf) {
            break end;
        }
        if buf.len() > limits.max_head_bytes {
            return Err(Refusal::bad_request(
                431,
                format!(
                    "the request head is larger than {} bytes",
                    limits.max_head_bytes
                ),
            ));
        }
        let mut chunk = [0u8; 4096];
        let want = chunk.len().min(limits.max_head_bytes + 4 - buf.len());
        let n = client.read(&mut chunk[..want]).await.map_err(|error| {
            Refusal::bad_request(400, format!("failed to read the request head: {error}"))
        })?;
        if n == 0 {
            return Err(Refusal::bad_request(
                400,
                "the client closed before the end of the request head".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    if end > limits.max_head_bytes {
        return Err(Refusal::bad_request(
            431,
            format!(
                "the request head is larger than {} bytes",
                limits.max_head_bytes
            ),
        ));
    }
    let leftover = buf[end + 4..].to_vec();
    let head = std::str::from_utf8(&buf[..end])
        .map_err(|_| Refusal::bad_request(400, "the request head is not valid UTF-8".into()))?;
    parse_http_head(head, limits, attempt).map(|(host, port, forward_head)| Request {
        host,
        port,
        forward_head,
        leftover,
    })
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Headers a proxy consumes or that describe one hop, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "host",
];

fn parse_http_head(
    head: &str,
    limits: &Limits,
    attempt: &mut Attempt,
) -> Result<(Host, u16, Option<Vec<u8>>), Refusal> {
    let bad = |reason: String| Refusal::bad_request(400, reason);
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(
            "the request line is not `METHOD TARGET HTTP/1.x`".into()
        ));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(bad("the request method is not a word".into()));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(bad("only HTTP/1.0 and HTTP/1.1 requests are proxied".into()));
    }
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() >= limits.max_headers {
            return Err(Refusal::bad_request(
                431,
                format!(
                    "the request has more than {} header lines",
                    limits.max_headers
                ),
            ));
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(bad("a header line has no `:`".into()));
        };
        let token = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
        if name.is_empty() || !name.bytes().all(token) {
            return Err(bad(
                "a header name is empty or has characters a header name may not have".into(),
            ));
        }
        if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            return Err(bad("a header value has control characters".into()));
        }
        headers.push((name, value.trim()));
    }
    if method == "CONNECT" {
        attempt.protocol = Protocol::HttpConnect;
        let (host, port) = split_authority(target, None, attempt)?;
        return Ok((host, port, None));
    }
    attempt.protocol = Protocol::HttpForward;
    let Some(rest) = strip_prefix_ignore_case(target, "http://") else {
        if strip_prefix_ignore_case(target, "https://").is_some() {
            return Err(bad("an https:// URL must go through CONNECT (set HTTPS_PROXY, not a plain http request)".into()));
        }
        return Err(bad(
            "this is a proxy: send `CONNECT host:port` or a request for an absolute http:// URL"
                .into(),
        ));
    };
    let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let (host, port) = split_authority(authority, Some(80), attempt)?;
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('/') => p.to_string(),
        p => format!("/{p}"),
    };
    let path = path.split('#').next().unwrap_or("/");
    let connection_tokens: Vec<String> = headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, value)| value.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .collect();
    let mut out = format!("{method} {path} {version}\r\nHost: {authority}\r\n");
    for (name, value) in &headers {
        let lower = name.to_ascii_lowercase();
        let framing = lower == "content-length" || lower == "transfer-encoding";
        if HOP_BY_HOP.contains(&lower.as_str())
            || lower.starts_with("proxy-")
            || (!framing && connection_tokens.contains(&lower))
        {
            continue;
        }
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok((host, port, Some(out.into_bytes())))
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// `host:port`, `[v6]:port`, or without the port when a default is given.
fn split_authority(
    authority: &str,
    default_port: Option<u16>,
    attempt: &mut Attempt,
) -> Result<(Host, u16), Refusal> {
    let bad = |reason: String| Refusal::bad_request(400, reason);
    if authority.contains('@') {
        return Err(bad("credentials in a proxied URL are not supported".into()));
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| bad("an IPv6 host is missing its `]`".into()))?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| bad("expected `:port` after `]`".into()))?,
                ),
            ),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port != 0 && text.bytes().all(|b| b.is_ascii_digit()) => port,
            Ok(_) | Err(_) => {
                return Err(bad(format!(
                    "port {:?} is not a number from 1 to 65535",
                    cut(text)
                )));
            }
        },
        None => default_port.ok_or_else(|| bad("`CONNECT` needs `host:port`".into()))?,
    };
    attempt.port = port;
    if host.is_empty() {
        return Err(bad("the destination host is empty".into()));
    }
    let host = parse_host(host, attempt)?;
    Ok((host, port))
}

fn cut(text: &str) -> String {
    text.chars().take(32).collect()
}

/// A client stream that counts the bytes read from and written to it.
struct Counted<S> {
    inner: S,
    read: u64,
    written: u64,
}

impl<S> Counted<S> {
    fn new(inner: S) -> Self {
        Counted {
            inner,
            read: 0,
            written: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.read += (buf.filled().len() - before) as u64;
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            this.written += *n as u64;
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
