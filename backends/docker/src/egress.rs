//! Filtered network mode on the Docker backend. The container keeps `--network none` (Docker
//! networking is not the boundary: a daemon run with `--iptables=false` isolates nothing, not
//! even an `--internal` network); the only way out is the session's egress proxy, which runs
//! in this process and serves a Unix socket in a private host directory bind-mounted into the
//! container. Inside, `cordon-helper forward` (bind-mounted read-only) listens on
//! `127.0.0.1:`[`EGRESS_PORT`] and relays each connection to that socket; commands get the
//! proxy environment ([`proxy_env`]). Every decision is the proxy's (rules from
//! `cordon_ops::egress_rules`); the forwarder is untrusted plumbing. The proxy variables are
//! in the container's environment (module `plan`), under the spec's own entries.
//!
//! The forwarder runs as a uid other than the commands' (they cannot signal it: no capability
//! in the container). Should it end anyway (the container was replaced, it crashed), the next
//! command starts a new one first; when that fails the command is refused (fail closed).
//!
//! Attribution: every command registers while it runs; a connection the proxy accepts is
//! attributed to every command running at that moment (the forwarder is shared, so commands
//! that overlap see each other's attempts), or, when none runs, to the next command. A command
//! ends by waiting (at most [`CONNECTION_GRACE`]) for its connections to close; the ones still
//! open then that no other running command shares are cut (the proxy reports them with the
//! reason saying so), and the command takes its records. A connection another running command
//! shares stays open and is reported with that command.
//!
//! It does not own the container (the backend does) nor the proxy's rules or protocol
//! (`cordon-egress`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use cordon_core::sandbox::SandboxSpec;
use cordon_egress::ask::EgressApprover;
use cordon_egress::proxy::{
    ConnectionOwner, EventSink, Limits, Proxy, ProxyConfig, Resolver, SystemResolver,
};
use cordon_ops::{EgressLog, EgressRecord};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::DockerError;
use crate::client;
use crate::recovery::ENGINE_TIMEOUT;

/// The loopback port of the forwarder inside the container (the local backend's egress port).
pub const EGRESS_PORT: u16 = 3128;
/// The container directory holding the proxy's socket (a read-only bind mount).
pub const SOCKET_DIR: &str = "/cordon-egress";
/// The socket's name in [`SOCKET_DIR`].
pub const SOCKET_NAME: &str = "proxy.sock";
/// Where the `cordon-helper` binary appears in the container (a read-only bind mount).
pub const HELPER_IN_CONTAINER: &str = "/cordon-egress-helper/cordon-helper";

/// How long connections of an ended command may take to close before its records are taken.
pub(crate) const CONNECTION_GRACE: Duration = Duration::from_secs(2);
/// Most attempts recorded for one command (and waiting for the next one); later ones are
/// counted and logged only.
pub(crate) const MAX_RECORDS: usize = 1024;
/// Connections accepted at once for one session; more are closed when accepted (the proxy
/// itself answers `503` past its own bound, [`Limits::max_connections`]).
const MAX_CONNECTIONS: usize = 512;
/// How long a new forwarder has to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Most bytes of a forwarder's output kept for an error message.
const OUTPUT_TAIL: usize = 4096;

/// The environment that sends ordinary tools (curl, pip, cargo, git, npm, go) through the
/// proxy: HTTP and HTTPS through it, anything else by SOCKS5 with names resolved by the proxy
/// (`socks5h`), nothing for loopback (the command's own servers, if it runs any). The same set
/// as the local backend's.
pub(crate) fn proxy_env() -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{EGRESS_PORT}");
    let socks = format!("socks5h://127.0.0.1:{EGRESS_PORT}");
    let local = "localhost,127.0.0.1,::1".to_owned();
    let mut env = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
        ("NO_PROXY", &local),
    ] {
        env.push((name.to_owned(), value.clone()));
        env.push((name.to_ascii_lowercase(), value.clone()));
    }
    env
}

/// The `cordon-helper forward` command line run in the container.
pub(crate) fn forwarder_argv() -> Vec<String> {
    vec![
        HELPER_IN_CONTAINER.to_owned(),
        "forward".to_owned(),
        EGRESS_PORT.to_string(),
        format!("{SOCKET_DIR}/{SOCKET_NAME}"),
    ]
}

/// The uid:gid the forwarder runs as: not the commands' (so they cannot signal it) and not
/// root.
pub(crate) fn forwarder_user(command_uid: u32) -> String {
    let uid = if command_uid == 65534 { 65533 } else { 65534 };
    format!("{uid}:{uid}")
}

/// The host side of the mounts filtered mode adds: `(socket directory, helper binary)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressMounts {
    /// The host directory holding the proxy's socket (mounted at [`SOCKET_DIR`]).
    pub socket_dir: PathBuf,
    /// The host `cordon-helper` binary (mounted at [`HELPER_IN_CONTAINER`]).
    pub helper: PathBuf,
}

/// Resolves destination names for the session's proxy (the system resolver by default).
#[derive(Clone)]
pub struct EgressResolver(pub Arc<dyn Resolver>);

impl std::fmt::Debug for EgressResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EgressResolver(..)")
    }
}

/// Who the session's proxy asks about destinations an `[network] ask` entry matches (nobody by
/// default: they are refused).
#[derive(Clone)]
pub struct EgressAsker(pub Arc<dyn EgressApprover>);

impl std::fmt::Debug for EgressAsker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EgressAsker(..)")
    }
}

/// What the session's proxy calls back into this process for.
#[derive(Default)]
pub(crate) struct ProxyHooks {
    pub(crate) resolver: Option<EgressResolver>,
    pub(crate) asker: Option<EgressAsker>,
}

/// What the records of running commands and the connections attributed to them look like.
/// Each command's attempts are an [`EgressLog`]: a flood of connections to one destination
/// cannot push another destination it reached out of its record.
struct Ledger {
    next_command: u64,
    /// Running commands and the attempts attributed to them so far.
    running: BTreeMap<u64, EgressLog>,
    /// Attempts no running command could take: the next command reports them.
    unclaimed: EgressLog,
    /// Open connections: the commands they are attributed to, and what cuts them.
    open: BTreeMap<u64, Open>,
    next_connection: u64,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            next_command: 0,
            running: BTreeMap::new(),
            unclaimed: EgressLog::new(MAX_RECORDS),
            open: BTreeMap::new(),
            next_connection: 0,
        }
    }
}

impl Ledger {
    /// Attribute one finished attempt to `owners` that still run, else to the next command.
    fn attribute(&mut self, owners: &BTreeSet<u64>, record: EgressRecord) {
        let mut taken = false;
        for owner in owners {
            if let Some(log) = self.running.get_mut(owner) {
                log.push(record.clone());
                taken = true;
            }
        }
        if !taken {
            self.unclaimed.push(record);
        }
    }

    /// Command `id` ended: its attempts.
    fn take(&mut self, id: u64) -> Vec<EgressRecord> {
        let Some(log) = self.running.remove(&id) else {
            return Vec::new();
        };
        if log.omitted() > 0 {
            tracing::warn!(
                omitted = log.omitted(),
                "docker: egress attempts not recorded (a command made more than {MAX_RECORDS}; \
                 each destination's first attempt was kept)"
            );
        }
        log.into_records()
    }
}

/// One open connection.
struct Open {
    owners: BTreeSet<u64>,
    cut: CancellationToken,
}

/// The session's proxy, its socket and the forwarder in the container.
pub(crate) struct Egress {
    /// The private host directory (0700) holding the socket directory; removed at the end.
    _dir: tempfile::TempDir,
    mounts: EgressMounts,
    ledger: Arc<Mutex<Ledger>>,
    closed: Arc<Notify>,
    /// Serves the socket; aborted when the session ends.
    server: tokio::task::JoinHandle<()>,
    forwarder: tokio::sync::Mutex<Option<Forwarder>>,
    forwarder_user: String,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("mounts", &self.mounts)
            .finish_non_exhaustive()
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A forwarder process in the container.
struct Forwarder {
    /// Its exec id.
    exec: String,
    /// The container generation it was started in.
    generation: u64,
    alive: Arc<AtomicBool>,
    /// Holds its stdin open; aborting it ends the forwarder.
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    /// Whether the engine says it still runs (its attached stream may not have ended yet when
    /// it was just killed, so the flag alone could be late).
    async fn runs(&self, docker: &Docker) -> bool {
        match tokio::time::timeout(ENGINE_TIMEOUT, docker.inspect_exec(&self.exec)).await {
            Ok(Ok(inspect)) => inspect.running == Some(true),
            // The engine did not answer: a second forwarder could not bind the port anyway,
            // and the command itself needs the engine; the stream's flag decides.
            Ok(Err(error)) => {
                tracing::debug!(%error, "docker: failed to inspect the egress forwarder");
                self.alive.load(Ordering::SeqCst)
            }
            Err(_) => self.alive.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A running command's registration ([`Egress::begin`]).
pub(crate) struct Ticket(u64);

impl Egress {
    /// The proxy for `spec` (rules labelled with their policy lines), serving a socket in a new
    /// private temporary directory (never inside `writable`, the host directories the
    /// container writes); `helper` is the host binary the forwarder runs, as a uid other than
    /// `command_uid`.
    pub(crate) fn start(
        spec: &SandboxSpec,
        session: &str,
        helper: PathBuf,
        hooks: ProxyHooks,
        command_uid: u32,
        writable: &[&Path],
    ) -> Result<Egress, DockerError> {
        let ProxyHooks { resolver, asker } = hooks;
        let rules = cordon_ops::egress_rules(spec).map_err(|e| DockerError::Egress {
            step: "compile the [network] allow and deny lists",
            reason: format!("{e} ({})", spec.sources.egress_allow_at()),
        })?;
        let (dir, socket_dir, listener) = bind_socket(writable)?;
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let closed = Arc::new(Notify::new());
        let config = ProxyConfig {
            session: Arc::from(session),
            rules: Arc::new(rules),
            resolver: resolver
                .map_or_else(|| Arc::new(SystemResolver) as Arc<dyn Resolver>, |r| r.0),
            // Each connection gets its own sink (see `serve`); this one is never used.
            events: EventSink::channel(1).0,
            limits: Limits::default(),
        };
        let server = tokio::spawn(serve(
            listener,
            Proxy::with_approver(config, asker.map(|a| a.0)),
            Arc::clone(&ledger),
            Arc::clone(&closed),
        ));
        tracing::info!(socket_dir = %socket_dir.display(), helper = %helper.display(), "docker: egress proxy serving");
        Ok(Egress {
            _dir: dir,
            mounts: EgressMounts { socket_dir, helper },
            ledger,
            closed,
            server,
            forwarder: tokio::sync::Mutex::new(None),
            forwarder_user: forwarder_user(command_uid),
        })
    }

    /// The host paths to mount.
    pub(crate) fn mounts(&self) -> &EgressMounts {
        &self.mounts
    }

    /// Make sure a forwarder runs in the current container (`generation`), starting one when
    /// there is none, it ended, or it belongs to a replaced container.
    pub(crate) async fn ensure_forwarder(
        &self,
        docker: &Docker,
        container: &str,
        generation: u64,
    ) -> Result<(), DockerError> {
        let mut current = self.forwarder.lock().await;
        if let Some(forwarder) = current.as_ref()
            && forwarder.generation == generation
            && forwarder.alive.load(Ordering::SeqCst)
            && forwarder.runs(docker).await
        {
            return Ok(());
        }
        if current.is_some() {
            tracing::warn!(
                container,
                "docker: the egress forwarder ended; starting a new one"
            );
        }
        *current = None;
        let forwarder =
            start_forwarder(docker, container, &self.forwarder_user, generation).await?;
        *current = Some(forwarder);
        Ok(())
    }

    /// Register a command that starts now; it takes the attempts no command took yet.
    pub(crate) fn begin(&self) -> Ticket {
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        let id = ledger.next_command;
        ledger.next_command += 1;
        let unclaimed = std::mem::replace(&mut ledger.unclaimed, EgressLog::new(MAX_RECORDS));
        ledger.running.insert(id, unclaimed);
        Ticket(id)
    }

    /// The command ended: wait (at most [`CONNECTION_GRACE`]) until its connections closed,
    /// then take its attempts.
    pub(crate) async fn finish(&self, ticket: Ticket) -> Vec<EgressRecord> {
        let Ticket(id) = ticket;
        if tokio::time::timeout(CONNECTION_GRACE, self.settled(id))
            .await
            .is_err()
        {
            let cut = {
                let ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
                let mut cut = 0;
                for open in ledger.open.values() {
                    if open.owners.contains(&id) && open.owners.len() == 1 {
                        open.cut.cancel();
                        cut += 1;
                    }
                }
                cut
            };
            tracing::debug!(
                cut,
                "docker: egress connections of an ended command still open after the grace"
            );
            // A cut connection reports at once; a shared one stays with its other command.
            let _ = tokio::time::timeout(CONNECTION_GRACE, self.settled_alone(id)).await;
        }
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        for open in ledger.open.values_mut() {
            open.owners.remove(&id);
        }
        ledger.take(id)
    }

    /// Until no open connection is attributed to command `id`.
    async fn settled(&self, id: u64) {
        self.until(|open| open.owners.contains(&id)).await;
    }

    /// Until no open connection is attributed to command `id` alone.
    async fn settled_alone(&self, id: u64) {
        self.until(|open| open.owners.contains(&id) && open.owners.len() == 1)
            .await;
    }

    /// Until no open connection matches `pending`.
    async fn until(&self, pending: impl Fn(&Open) -> bool) {
        loop {
            let notified = self.closed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let waiting = {
                let ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
                ledger.open.values().any(&pending)
            };
            if !waiting {
                return;
            }
            notified.await;
        }
    }
}

/// The proxy's socket ([`SOCKET_NAME`], any uid may connect: only the container reaches it,
/// through the mount) in a new private socket directory (`helper_socket::socket_dir`, never
/// inside `writable`).
fn bind_socket(
    writable: &[&Path],
) -> Result<(tempfile::TempDir, PathBuf, UnixListener), DockerError> {
    let fail = |step: &'static str| {
        move |e: std::io::Error| DockerError::Egress {
            step,
            reason: e.to_string(),
        }
    };
    let (dir, socket_dir) = crate::helper_socket::socket_dir("cordon-egress-", writable)
        .map_err(fail("create the egress proxy's private directory"))?;
    let listener = crate::helper_socket::bind_for_anyone(&socket_dir.join(SOCKET_NAME))
        .map_err(fail("bind the egress proxy socket"))?;
    Ok((dir, socket_dir, listener))
}

/// Accept connections from the forwarder: each is served by the proxy with its own event
/// sink and a token that cuts it, and its one event becomes a record of the commands it is
/// attributed to.
async fn serve(
    listener: UnixListener,
    proxy: Proxy,
    ledger: Arc<Mutex<Ledger>>,
    closed: Arc<Notify>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "docker: egress proxy accept failed");
                if error.raw_os_error() == Some(24) {
                    // Out of descriptors: give open connections time to end.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                return;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::warn!(
                max = MAX_CONNECTIONS,
                "docker: egress proxy connection refused: too many at once"
            );
            continue;
        };
        let cut = CancellationToken::new();
        let connection = {
            let mut ledger = ledger.lock().unwrap_or_else(PoisonError::into_inner);
            let id = ledger.next_connection;
            ledger.next_connection += 1;
            let owners: BTreeSet<u64> = ledger.running.keys().copied().collect();
            ledger.open.insert(
                id,
                Open {
                    owners,
                    cut: cut.clone(),
                },
            );
            id
        };
        let (events, mut received) = EventSink::channel(1);
        // Every command of the container shares this socket (and a background process of an
        // earlier call may open a connection while a later one runs): no call owns a
        // connection here, so a question about one reaches nobody who made it.
        let owner = ConnectionOwner { events, call: None };
        let proxy = proxy.clone();
        let ledger = Arc::clone(&ledger);
        let closed = Arc::clone(&closed);
        tokio::spawn(async move {
            proxy
                .serve_connection(stream, &owner, cut.cancelled())
                .await;
            drop(permit);
            let record = received.try_recv().ok().map(|e| EgressRecord::from(&e));
            let mut ledger = ledger.lock().unwrap_or_else(PoisonError::into_inner);
            let owners = ledger
                .open
                .remove(&connection)
                .map(|open| open.owners)
                .unwrap_or_default();
            if let Some(record) = record {
                tracing::debug!(host = %record.host, port = record.port, outcome = ?record.outcome, "docker: egress attempt");
                ledger.attribute(&owners, record);
            }
            drop(ledger);
            closed.notify_waiters();
        });
    }
}

/// Start `cordon-helper forward` in the container and wait for its ready line; the error
/// says what it printed instead (a binary the image cannot run, say).
async fn start_forwarder(
    docker: &Docker,
    container: &str,
    user: &str,
    generation: u64,
) -> Result<Forwarder, DockerError> {
    let fail = |reason: String| DockerError::Forwarder {
        container: container.to_owned(),
        reason,
    };
    let mut exec = client::start_exec(docker, container, forwarder_argv(), Some(user))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut seen: Vec<u8> = Vec::new();
    let ready = tokio::time::timeout(READY_TIMEOUT, async {
        while let Some(frame) = exec.output.next().await {
            match frame {
                Ok(LogOutput::StdOut { message } | LogOutput::StdErr { message }) => {
                    if seen.len() < OUTPUT_TAIL {
                        seen.extend_from_slice(&message[..message.len().min(OUTPUT_TAIL)]);
                    }
                    if String::from_utf8_lossy(&seen)
                        .lines()
                        .any(|line| line.starts_with(cordon_helper::forward::READY))
                    {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Err("it ended".to_owned())
    })
    .await;
    let said = || {
        let text = String::from_utf8_lossy(&seen).trim().to_owned();
        if text.is_empty() {
            "no output".to_owned()
        } else {
            format!("output: {text}")
        }
    };
    match ready {
        Ok(Ok(())) => {}
        Ok(Err(how)) => {
            let code = docker
                .inspect_exec(&exec.id)
                .await
                .ok()
                .and_then(|i| i.exit_code);
            let status = code.map(|c| format!(" (status {c})")).unwrap_or_default();
            let output = String::from_utf8_lossy(&seen);
            let cannot_exec = code == Some(126)
                || code == Some(127)
                || output.lines().any(|line| {
                    line.starts_with("exec ") && line.ends_with("no such file or directory")
                });
            let hint = if cannot_exec {
                " (the image cannot run the helper binary: a glibc build needs an image with \
                 glibc, like cordon-sandbox; a static build runs in any image: \
                 scripts/release.sh builds one and CORDON_HELPER names it)"
            } else {
                ""
            };
            tracing::warn!(container, %how, "docker: the egress forwarder did not start");
            return Err(fail(format!(
                "{how} before it was ready{status}, {}{hint}",
                said()
            )));
        }
        Err(_) => {
            return Err(fail(format!(
                "not ready after {}s, {}",
                READY_TIMEOUT.as_secs(),
                said()
            )));
        }
    }
    tracing::info!(container, user, "docker: egress forwarder started");
    let exec_id = exec.id.clone();
    let alive = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&alive);
    let container_name = container.to_owned();
    let task = tokio::spawn(async move {
        // Its output is only logged; the stream ends with the process.
        while let Some(frame) = exec.output.next().await {
            if let Ok(LogOutput::StdErr { message }) = frame {
                tracing::debug!(container = %container_name, message = %String::from_utf8_lossy(&message), "docker: egress forwarder");
            }
        }
        flag.store(false, Ordering::SeqCst);
        tracing::warn!(container = %container_name, "docker: the egress forwarder ended");
        // Keep stdin open until here: closing it asks the forwarder to stop.
        let _ = exec.input.shutdown().await;
    });
    Ok(Forwarder {
        exec: exec_id,
        generation,
        alive,
        task,
    })
}

/// Where the helper binary is looked for: `explicit`, then `CORDON_HELPER`, then next to the
/// current executable; it must be a 64-bit ELF executable for `arch` (the engine's, as
/// `docker info` names it).
pub fn choose_helper(explicit: Option<&Path>, arch: &str) -> Result<PathBuf, String> {
    let path = cordon_helper::locate_helper(explicit).map_err(|e| e.to_string())?;
    let machine = cordon_helper::binary::elf_machine(arch).ok_or_else(|| {
        format!("Cordon builds no cordon-helper for the engine's architecture `{arch}`")
    })?;
    let head = cordon_helper::binary::read_binary(&path, 64)
        .map_err(|e| format!("failed to read {}: {e}", path.display()))?;
    cordon_helper::binary::check_elf(&head, machine)
        .map_err(|reason| format!("{} cannot run in the container: {reason}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(host: &str, outcome: cordon_ops::EgressOutcome) -> EgressRecord {
        EgressRecord {
            protocol: cordon_ops::EgressProtocol::HttpConnect,
            host: host.to_owned(),
            port: 443,
            address: None,
            outcome,
            entry: None,
            source: None,
            suggestion: None,
            asked: None,
            reason: String::new(),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
        }
    }

    #[test]
    fn a_flood_to_one_destination_does_not_hide_another_from_the_command() {
        use cordon_ops::EgressOutcome::{Allowed, Denied};
        let mut ledger = Ledger::default();
        let id = 7;
        ledger.running.insert(id, EgressLog::new(MAX_RECORDS));
        let owners = BTreeSet::from([id]);
        for _ in 0..MAX_RECORDS + 100 {
            ledger.attribute(&owners, attempt("junk.test", Denied));
        }
        ledger.attribute(&owners, attempt("allowed.test", Allowed));
        let records = ledger.take(id);
        assert_eq!(records.len(), MAX_RECORDS);
        assert!(
            records.iter().any(|record| record.host == "allowed.test"),
            "the later destination was pushed out"
        );
        // Attempts no running command takes go to the next one, bounded the same way.
        ledger.attribute(&BTreeSet::from([99]), attempt("later.test", Allowed));
        assert_eq!(ledger.unclaimed.into_records().len(), 1);
    }

    #[test]
    fn commands_get_the_local_backends_proxy_environment() {
        let env = proxy_env();
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(get("HTTP_PROXY"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("https_proxy"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("ALL_PROXY"), Some("socks5h://127.0.0.1:3128"));
        assert_eq!(get("no_proxy"), Some("localhost,127.0.0.1,::1"));
        assert_eq!(env.len(), 8);
    }

    #[test]
    fn the_forwarder_runs_the_mounted_helper_as_another_user() {
        assert_eq!(
            forwarder_argv(),
            [
                "/cordon-egress-helper/cordon-helper",
                "forward",
                "3128",
                "/cordon-egress/proxy.sock"
            ]
        );
        assert_eq!(forwarder_user(1000), "65534:65534");
        assert_eq!(forwarder_user(0), "65534:65534");
        assert_eq!(forwarder_user(65534), "65533:65533");
    }

    #[tokio::test]
    async fn no_socket_directory_inside_a_root_the_container_writes() {
        let temp = std::env::temp_dir();
        let error = bind_socket(&[temp.as_path()]).expect_err("inside");
        assert!(
            error.to_string().contains("which the container can write"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn the_socket_directory_is_private_and_its_socket_reachable() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, socket_dir, _listener) = bind_socket(&[]).expect("bind");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode(dir.path()), 0o700);
        assert_eq!(mode(&socket_dir), 0o755);
        let socket = socket_dir.join(SOCKET_NAME);
        assert_eq!(mode(&socket), 0o666);
        assert!(socket_dir.starts_with(dir.path()));
    }
}
