//! Filtered network mode on the local backend. Each command's sandbox has a private network
//! namespace holding only loopback, where the one reachable port is its init's egress listener
//! (`cordon-sandbox`); this module serves that listener with the backend's egress proxy, which
//! runs in this process: one [`Egress`] per backend (session), one [`CommandEgress`] per
//! command, collecting that command's attempts as [`EgressRecord`]s.
//!
//! It owns the proxy environment commands get ([`proxy_env`]) and how a command's connections
//! end with it: accepting stops the moment the command's status is known (the init may then
//! serve the next command on the same listener), connections still open get
//! [`CONNECTION_GRACE`] to finish on their own (their client side is gone) and are then cut.
//! The rules come from the spec (`cordon_ops::egress_rules`); every decision is the proxy's.

use std::ffi::OsString;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use cordon_core::sandbox::SandboxSpec;
use cordon_egress::ask::EgressApprover;
use cordon_egress::proxy::{
    ConnectionEvent, ConnectionOwner, EventSink, Limits, Proxy, ProxyConfig, Resolver,
    SystemResolver,
};
use cordon_ops::{EgressLog, EgressOutcome, EgressProtocol, EgressRecord};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::LocalError;

/// How long connections of an ended command may take to finish by themselves before they
/// are cut (a destination holding a tunnel open would otherwise keep it forever).
pub(crate) const CONNECTION_GRACE: Duration = Duration::from_secs(2);
/// Most attempts recorded for one command; later ones are counted and logged only.
pub(crate) const MAX_RECORDS: usize = 1024;
/// Undelivered events one command's sink holds while its supervisor is busy.
const EVENT_CAPACITY: usize = 256;

/// Descriptors one relayed connection holds in this process (both sockets and a pipe per
/// direction for `splice(2)`), with room to spare.
const FDS_PER_CONNECTION: u64 = 8;
/// Descriptors left for everything else this process does (audit log, spills, commands).
const FDS_RESERVED: u64 = 512;
/// The open files limit assumed when it cannot be read (the common default soft limit).
const ASSUMED_OPEN_FILES: u64 = 1024;

/// Connections the proxy serves at once under an open files limit of `open_files`: the
/// proxy's default, or fewer when the limit leaves no room for that many (a command holding
/// every connection open would otherwise starve this whole process of descriptors; the
/// connections over the bound are answered `503`, naming it).
fn connection_limit(open_files: u64) -> usize {
    let fit = open_files.saturating_sub(FDS_RESERVED) / FDS_PER_CONNECTION;
    usize::try_from(fit)
        .unwrap_or(usize::MAX)
        .clamp(1, Limits::default().max_connections)
}

/// The environment that sends ordinary tools (curl, pip, cargo, git, npm, go) through the
/// proxy: HTTP and HTTPS through it, anything else by SOCKS5 with names resolved by the proxy
/// (`socks5h`), nothing for loopback (the command's own servers, if it runs any).
pub(crate) fn proxy_env() -> Vec<(OsString, OsString)> {
    let http = format!("http://127.0.0.1:{}", cordon_sandbox::EGRESS_PORT);
    let socks = format!("socks5h://127.0.0.1:{}", cordon_sandbox::EGRESS_PORT);
    let local = "localhost,127.0.0.1,::1".to_owned();
    let mut env = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
        ("NO_PROXY", &local),
    ] {
        env.push((name.into(), value.into()));
        env.push((name.to_ascii_lowercase().into(), value.into()));
    }
    env
}

/// The backend's egress proxy (filtered network mode only).
pub(crate) struct Egress {
    proxy: Proxy,
    /// The proxy's own sink, unused: every connection reports to its command's sink.
    _unused: mpsc::Receiver<ConnectionEvent>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").finish_non_exhaustive()
    }
}

impl Egress {
    /// The proxy for `spec`'s allow, deny and ask entries, labelling its events with
    /// `session`. `resolver`: the system resolver unless a caller (a test) brings its own;
    /// `approver`: who is asked about ask entries' destinations (nobody: refused).
    pub(crate) fn new(
        spec: &SandboxSpec,
        session: &str,
        resolver: Option<Arc<dyn Resolver>>,
        approver: Option<Arc<dyn EgressApprover>>,
    ) -> Result<Egress, LocalError> {
        let rules = cordon_ops::egress_rules(spec).map_err(|source| LocalError::EgressRules {
            at: spec.sources.egress_allow_at(),
            source,
        })?;
        let (events, unused) = EventSink::channel(1);
        // The proxy's connections hold this process's descriptors: raise the soft limit and
        // serve only as many connections at once as the limit leaves room for.
        let open_files = cordon_sandbox::raise_open_files_limit().unwrap_or_else(|error| {
            tracing::warn!(%error, assumed = ASSUMED_OPEN_FILES, "local egress: the open files limit is unknown");
            ASSUMED_OPEN_FILES
        });
        let limits = Limits {
            max_connections: connection_limit(open_files),
            ..Limits::default()
        };
        tracing::debug!(
            open_files,
            max_connections = limits.max_connections,
            "local egress: connection limit"
        );
        let proxy = Proxy::with_approver(
            ProxyConfig {
                session: session.into(),
                rules: Arc::new(rules),
                resolver: resolver.unwrap_or_else(|| Arc::new(SystemResolver)),
                events,
                limits,
            },
            approver,
        );
        Ok(Egress {
            proxy,
            _unused: unused,
        })
    }

    /// Serve one command's egress listener. Only that command's sandbox reaches it, so its
    /// connections are that command's: questions about them name `call` (the tool call that
    /// runs the command, when there is one).
    pub(crate) fn command(
        &self,
        listener: std::net::TcpListener,
        call: Option<String>,
    ) -> io::Result<CommandEgress> {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let (sink, events) = EventSink::channel(EVENT_CAPACITY);
        Ok(CommandEgress {
            proxy: self.proxy.clone(),
            listener,
            accepting: true,
            owner: ConnectionOwner {
                events: sink,
                call: call.map(Arc::from),
            },
            events,
            connections: JoinSet::new(),
            stop: CancellationToken::new(),
            records: EgressLog::new(MAX_RECORDS),
        })
    }
}

/// One command's side of the proxy: its listener, its connections and their records.
pub(crate) struct CommandEgress {
    proxy: Proxy,
    listener: tokio::net::TcpListener,
    /// False after accepting failed for a reason that is not one connection's.
    accepting: bool,
    /// The command's sink and call.
    owner: ConnectionOwner,
    events: mpsc::Receiver<ConnectionEvent>,
    connections: JoinSet<()>,
    stop: CancellationToken,
    records: EgressLog,
}

impl CommandEgress {
    /// Wait for the next thing to do (a connection to accept, an event to record, a
    /// connection task to reap) and do it. Cancel-safe: the supervisor drops it the moment the
    /// command has ended, and nothing accepted is lost.
    pub(crate) async fn step(&mut self) {
        tokio::select! {
            accepted = self.listener.accept(), if self.accepting => match accepted {
                Ok((stream, _)) => {
                    // Small requests and replies should not wait for Nagle's algorithm.
                    let _ = stream.set_nodelay(true);
                    let proxy = self.proxy.clone();
                    let owner = self.owner.clone();
                    let stop = self.stop.clone();
                    self.connections.spawn(async move {
                        proxy.serve_connection(stream, &owner, stop.cancelled_owned()).await;
                    });
                }
                Err(error) if is_per_connection(&error) => {
                    tracing::debug!(%error, "local egress: one connection failed during accept");
                }
                Err(error) => {
                    tracing::warn!(%error, "local egress: accept failed; the command's further connections wait unanswered");
                    self.accepting = false;
                }
            },
            Some(event) = self.events.recv() => self.record(&event),
            Some(_) = self.connections.join_next(), if !self.connections.is_empty() => {}
        }
    }

    fn record(&mut self, event: &ConnectionEvent) {
        self.records.push(EgressRecord::from(event));
    }

    /// After the command ended: let its connections finish (cutting those still open after
    /// [`CONNECTION_GRACE`]) and return its attempts, in the order they ended, then the
    /// `unaccepted` connections the sandbox closed with the command (never read, so nothing
    /// is known of them but that they were made).
    pub(crate) async fn finish(mut self, unaccepted: usize) -> Vec<EgressRecord> {
        let grace = tokio::time::sleep(CONNECTION_GRACE);
        tokio::pin!(grace);
        let mut cut = false;
        loop {
            tokio::select! {
                joined = self.connections.join_next() => {
                    if joined.is_none() {
                        break;
                    }
                }
                // Keep the sink drained: many connections may end at once.
                Some(event) = self.events.recv() => self.record(&event),
                () = &mut grace, if !cut => {
                    tracing::debug!(
                        open = self.connections.len(),
                        "local egress: cutting connections the ended command left open"
                    );
                    self.stop.cancel();
                    cut = true;
                }
            }
        }
        // Every connection has sent its event by now.
        while let Ok(event) = self.events.try_recv() {
            self.record(&event);
        }
        if unaccepted > 0 {
            tracing::debug!(
                unaccepted,
                "local egress: connections the ended command left unaccepted were closed"
            );
        }
        for _ in 0..unaccepted {
            self.records.push(unaccepted_record());
        }
        let unrecorded = self.records.omitted();
        if unrecorded > 0 {
            tracing::warn!(
                recorded = MAX_RECORDS,
                unrecorded,
                "local egress: the command made more connection attempts than are recorded"
            );
        }
        let dropped = self.owner.events.dropped();
        if dropped > 0 {
            tracing::warn!(dropped, "local egress: events dropped for this command");
        }
        self.records.into_records()
    }
}

/// The record of a connection the command made but ended before the proxy accepted it.
fn unaccepted_record() -> EgressRecord {
    EgressRecord {
        protocol: EgressProtocol::Unknown,
        host: String::new(),
        port: 0,
        address: None,
        outcome: EgressOutcome::Failed,
        entry: None,
        source: None,
        suggestion: None,
        asked: None,
        reason: "the command ended before the egress proxy accepted the connection".to_owned(),
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_limit_leaves_descriptors_for_the_rest_of_the_process() {
        assert_eq!(connection_limit(1024), 64);
        assert_eq!(
            connection_limit(4096),
            448.min(Limits::default().max_connections)
        );
        assert_eq!(connection_limit(1 << 20), Limits::default().max_connections);
        assert_eq!(connection_limit(100), 1);
        assert_eq!(
            connection_limit(u64::MAX),
            Limits::default().max_connections
        );
    }

    #[test]
    fn commands_get_every_proxy_variable_in_both_cases() {
        let env: Vec<(String, String)> = proxy_env()
            .into_iter()
            .map(|(name, value)| {
                (
                    name.into_string().expect("utf-8"),
                    value.into_string().expect("utf-8"),
                )
            })
            .collect();
        let http = "http://127.0.0.1:3128".to_owned();
        let socks = "socks5h://127.0.0.1:3128".to_owned();
        let local = "localhost,127.0.0.1,::1".to_owned();
        assert_eq!(
            env,
            vec![
                ("HTTP_PROXY".to_owned(), http.clone()),
                ("http_proxy".to_owned(), http.clone()),
                ("HTTPS_PROXY".to_owned(), http.clone()),
                ("https_proxy".to_owned(), http),
                ("ALL_PROXY".to_owned(), socks.clone()),
                ("all_proxy".to_owned(), socks),
                ("NO_PROXY".to_owned(), local.clone()),
                ("no_proxy".to_owned(), local),
            ]
        );
    }
}
