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
//! ends (its processes gone) with a barrier before its registration closes: the forwarder is
//! asked on its stdin (`flush N`, which only this process can write) to accept everything
//! waiting on its listener and connect each to the proxy's socket, and answers (`flushed N`);
//! then this process connects to the socket itself, behind them, and waits until the proxy
//! accepts that marker (told apart by its peer's pid: no process in the container has this
//! process's). Every connection the command made was then accepted while it was registered,
//! however long it waited in the forwarder's queue, in transit or in the socket's queue. It
//! then waits (at most [`CONNECTION_GRACE`]) for its connections to close; the ones still open
//! then that no other running command shares are cut (the proxy reports them with the reason
//! saying so), and the command takes its records. A connection another running command
//! shares stays open and is reported with that command.
//!
//! Naming the call (so a question about an `[network] ask` destination goes to whoever made
//! the call, [`Runner`]): a connection names call X when X's command was the only one
//! registered when the proxy accepted it and runs through the helper, whose container profile
//! keeps a command's processes in a process group they cannot leave and reports the end only
//! once that group is gone. For the rest of the session no connection names a call once what a
//! command started may outlive it or a barrier cannot be trusted: a command ran through the
//! shell workers, the helper failed under a command (the sandbox's warden kills what the
//! command left, but nothing says when), the forwarder ended (what it held may come later), a
//! command's end was not waited for (its caller's future dropped: [`Ticket`]), or a barrier
//! failed, timed out
//! ([`FLUSH_TIMEOUT`]) or came back unsure (the forwarder saw a handshake to its port still
//! under way, or the kernel drop connections for a full queue in the container's network
//! namespace: such a connection can be queued after the barrier; a command can cause that on
//! purpose, which only stops the naming). Attribution of records keeps the rule above either
//! way. What the barrier relies on: a loopback connection whose `connect` returned is in the
//! forwarder's queue, or its handshake is still visible as under way (its last acknowledgement
//! lost or not yet processed), or the kernel counted it dropped.
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
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, Semaphore, mpsc, watch};
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
/// How long a command's end barrier may take, each of its two steps (the forwarder's answer,
/// then the marker's turn at the proxy); past it no connection names a call any more.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest line kept of the forwarder's stdout after its ready line (longer ones are dropped).
const MAX_ANSWER_LINE: usize = 128;
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
    /// The tool calls of running commands through the helper (see [`Runner`]).
    calls: BTreeMap<u64, Arc<str>>,
    /// Why connections name no call for the rest of the session, once one could be told
    /// apart no more (see [`Egress::stop_naming`]).
    unnamed: Option<String>,
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
            calls: BTreeMap::new(),
            unnamed: None,
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

    /// The call a connection accepted now is named for: the one whose command is the only one
    /// running, when it runs through the helper and connections can still be told apart.
    fn call_of(&self, owners: &BTreeSet<u64>) -> Option<Arc<str>> {
        if self.unnamed.is_some() || owners.len() != 1 {
            return None;
        }
        owners
            .first()
            .and_then(|only| self.calls.get(only))
            .cloned()
    }

    /// From now on no connection names a call (and why, logged once).
    fn stop_naming(&mut self, reason: &str) {
        self.calls.clear();
        if self.unnamed.is_none() {
            tracing::warn!(%reason, "docker: egress connections name no call for the rest of the session");
            self.unnamed = Some(reason.to_owned());
        }
    }

    /// Command `id` ended: its attempts.
    fn take(&mut self, id: u64) -> Vec<EgressRecord> {
        self.calls.remove(&id);
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
    /// The proxy's socket on the host (the barrier's marker connects to it).
    socket: PathBuf,
    /// How many of this process's own connections (markers) the proxy's socket accepted.
    markers: watch::Receiver<u64>,
    /// The next barrier's number.
    next_flush: std::sync::atomic::AtomicU64,
    /// How many markers this process connected to the proxy's socket.
    markers_sent: std::sync::atomic::AtomicU64,
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
    /// Its stdin and the flush answers read from its stdout (one barrier at a time).
    link: Arc<tokio::sync::Mutex<FlushLink>>,
    /// Reads its output; ends with it.
    task: tokio::task::JoinHandle<()>,
}

/// The host's end of a forwarder's flush lines: its stdin (which only this process holds;
/// dropped, the forwarder stops) and `flushed N [unsure]` answers as `(N, sure)`.
struct FlushLink {
    input: client::ExecInput,
    answers: mpsc::Receiver<(u64, bool)>,
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

/// A running command's registration ([`Egress::begin`]). Dropped before [`Egress::finish`]
/// took it all the way (the caller's future was dropped, with the command perhaps still
/// running, or during its end barrier), no connection names a call any more and the
/// registration goes (its attempts with it).
pub(crate) struct Ticket {
    id: u64,
    ledger: Arc<Mutex<Ledger>>,
    finished: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        ledger.stop_naming("a command's end was not waited for (its caller went away)");
        for open in ledger.open.values_mut() {
            open.owners.remove(&self.id);
        }
        let dropped = ledger.take(self.id).len();
        tracing::warn!(
            dropped,
            "docker: a command's end was not waited for; its egress attempts are not reported"
        );
    }
}

/// How a command runs, which decides whether its connections can name its call.
pub(crate) enum Runner {
    /// Through the helper, whose container profile keeps every process of a command in a
    /// process group it cannot leave and reports the command's end only once that group is
    /// gone: with the end barrier, a connection accepted while this command is the only one
    /// running is its own. `call`: its tool call, when the caller named one.
    Helper { call: Option<Arc<str>> },
    /// Through the shell workers: what a command starts in the background outlives it and may
    /// connect while a later command runs, so from then on no connection names a call.
    Shell,
}

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
        let (markers_tx, markers) = watch::channel(0);
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
            markers_tx,
        ));
        tracing::info!(socket_dir = %socket_dir.display(), helper = %helper.display(), "docker: egress proxy serving");
        Ok(Egress {
            socket: socket_dir.join(SOCKET_NAME),
            markers,
            next_flush: std::sync::atomic::AtomicU64::new(0),
            markers_sent: std::sync::atomic::AtomicU64::new(0),
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
            // What it had not relayed yet may still come, through nobody's barrier.
            self.stop_naming("the egress forwarder ended under the session");
        }
        *current = None;
        let forwarder =
            start_forwarder(docker, container, &self.forwarder_user, generation).await?;
        *current = Some(forwarder);
        Ok(())
    }

    /// Register a command that starts now; it takes the attempts no command took yet.
    pub(crate) fn begin(&self, runner: Runner) -> Ticket {
        if let Runner::Shell = runner {
            self.stop_naming("a command ran through the shell workers");
        }
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        let id = ledger.next_command;
        ledger.next_command += 1;
        if let Runner::Helper { call: Some(call) } = runner
            && ledger.unnamed.is_none()
        {
            ledger.calls.insert(id, call);
        }
        let unclaimed = std::mem::replace(&mut ledger.unclaimed, EgressLog::new(MAX_RECORDS));
        ledger.running.insert(id, unclaimed);
        Ticket {
            id,
            ledger: Arc::clone(&self.ledger),
            finished: false,
        }
    }

    /// From now on no connection names a call (and why, logged once): one could no longer be
    /// told apart from another call's.
    pub(crate) fn stop_naming(&self, reason: &str) {
        self.ledger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stop_naming(reason);
    }

    /// The command ended (every process of it is gone): pass the end barrier (on failure no
    /// connection names a call any more, and attribution falls back to what was accepted so
    /// far), then wait (at most [`CONNECTION_GRACE`]) until its connections closed, and take
    /// its attempts.
    pub(crate) async fn finish(&self, mut ticket: Ticket) -> Vec<EgressRecord> {
        let id = ticket.id;
        if let Err(reason) = self.barrier().await {
            self.stop_naming(&format!("a command's end barrier failed: {reason}"));
        }
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
        ticket.finished = true;
        ledger.take(id)
    }

    /// The end barrier: the forwarder accepts and passes on every connection waiting on its
    /// listener and says so (`flush N`, `flushed N`), then a connection of this process
    /// queued behind them at the proxy's socket (recognised by its peer's pid, which no
    /// process in the container has) is accepted. Every connection made before the barrier
    /// started has then been accepted, and attributed to the commands running at that moment.
    async fn barrier(&self) -> Result<(), String> {
        let link = {
            let current = self.forwarder.lock().await;
            current
                .as_ref()
                .filter(|forwarder| forwarder.alive.load(Ordering::SeqCst))
                .map(|forwarder| Arc::clone(&forwarder.link))
        }
        .ok_or("no egress forwarder runs")?;
        // One barrier at a time (two only overlap across a replaced forwarder, when no call is
        // named any more).
        let mut link = link.lock().await;
        let n = self.next_flush.fetch_add(1, Ordering::SeqCst);
        let flushed = tokio::time::timeout(FLUSH_TIMEOUT, async {
            let line = format!("{} {n}\n", cordon_helper::forward::FLUSH);
            link.input
                .write_all(line.as_bytes())
                .await
                .map_err(|e| format!("failed to write to the forwarder: {e}"))?;
            link.input
                .flush()
                .await
                .map_err(|e| format!("failed to write to the forwarder: {e}"))?;
            loop {
                match link.answers.recv().await {
                    Some((answered, sure)) if answered == n => return Ok(sure),
                    // An earlier barrier's late answer.
                    Some(_) => {}
                    None => return Err("the forwarder ended".to_owned()),
                }
            }
        })
        .await
        .map_err(|_| format!("the forwarder did not answer within {FLUSH_TIMEOUT:?}"))??;
        if !flushed {
            return Err(
                "the forwarder could not vouch that every connection was passed on (a handshake \
                 was still under way, the kernel dropped connections for a full queue, or it ran \
                 out of descriptors)"
                    .to_owned(),
            );
        }
        let _marker = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| format!("failed to connect to the proxy's socket: {e}"))?;
        // The socket accepts in order: once it accepted as many markers as were connected,
        // this one (the last) is through, whatever became of an earlier barrier's.
        let target = self.markers_sent.fetch_add(1, Ordering::SeqCst) + 1;
        let mut markers = self.markers.clone();
        tokio::time::timeout(
            FLUSH_TIMEOUT,
            markers.wait_for(|accepted| *accepted >= target),
        )
        .await
        .map_err(|_| format!("the proxy did not reach the marker within {FLUSH_TIMEOUT:?}"))?
        .map_err(|_| "the proxy stopped".to_owned())?;
        Ok(())
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
    markers: watch::Sender<u64>,
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
        if is_marker(&stream) {
            markers.send_modify(|accepted| *accepted += 1);
            continue;
        }
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::warn!(
                max = MAX_CONNECTIONS,
                "docker: egress proxy connection refused: too many at once"
            );
            continue;
        };
        let cut = CancellationToken::new();
        let (connection, call) = {
            let mut ledger = ledger.lock().unwrap_or_else(PoisonError::into_inner);
            let id = ledger.next_connection;
            ledger.next_connection += 1;
            let owners: BTreeSet<u64> = ledger.running.keys().copied().collect();
            // Every command of the container shares this socket: a connection is a call's
            // only when that call's command is the only one running (see `Runner`).
            let call = ledger.call_of(&owners);
            ledger.open.insert(
                id,
                Open {
                    owners,
                    cut: cut.clone(),
                },
            );
            (id, call)
        };
        let (events, mut received) = EventSink::channel(1);
        let owner = ConnectionOwner { events, call };
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

/// Whether `stream` is this process's own connection (a barrier's marker): no process in the
/// container has this process's pid (its peers' pids are seen from this namespace).
fn is_marker(stream: &tokio::net::UnixStream) -> bool {
    let own = i32::try_from(std::process::id()).ok();
    own.is_some() && stream.peer_cred().ok().and_then(|cred| cred.pid()) == own
}

/// The `(N, sure)` of a forwarder's `flushed N [unsure]` line; `None` for any other line.
fn parse_flushed(line: &str) -> Option<(u64, bool)> {
    let mut words = line.trim_end().split(' ');
    if words.next()? != cordon_helper::forward::FLUSHED {
        return None;
    }
    let n = words.next()?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = n.parse().ok()?;
    match (words.next(), words.next()) {
        (None, _) => Some((n, true)),
        (Some(cordon_helper::forward::UNSURE), None) => Some((n, false)),
        _ => None,
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
    let (answers_tx, answers) = mpsc::channel(16);
    let mut output = exec.output;
    let task = tokio::spawn(async move {
        // Its stderr is only logged; stdout after the ready line carries flush answers. The
        // stream ends with the process.
        let mut line: Vec<u8> = Vec::new();
        let mut overlong = false;
        while let Some(frame) = output.next().await {
            match frame {
                Ok(LogOutput::StdErr { message }) => {
                    tracing::debug!(container = %container_name, message = %String::from_utf8_lossy(&message), "docker: egress forwarder");
                }
                Ok(LogOutput::StdOut { message }) => {
                    for &byte in message.iter() {
                        if byte == b'\n' {
                            if !overlong
                                && let Some(answer) = parse_flushed(&String::from_utf8_lossy(&line))
                            {
                                // A barrier waits for it; one nobody waits for is dropped.
                                let _ = answers_tx.try_send(answer);
                            }
                            line.clear();
                            overlong = false;
                        } else if line.len() < MAX_ANSWER_LINE {
                            line.push(byte);
                        } else {
                            overlong = true;
                        }
                    }
                }
                _ => {}
            }
        }
        flag.store(false, Ordering::SeqCst);
        tracing::warn!(container = %container_name, "docker: the egress forwarder ended");
    });
    Ok(Forwarder {
        exec: exec_id,
        generation,
        alive,
        link: Arc::new(tokio::sync::Mutex::new(FlushLink {
            input: exec.input,
            answers,
        })),
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

    #[test]
    fn flush_answers_are_a_number_and_perhaps_unsure() {
        assert_eq!(parse_flushed("flushed 3"), Some((3, true)));
        assert_eq!(parse_flushed("flushed 3\r"), Some((3, true)));
        assert_eq!(parse_flushed("flushed 3 unsure"), Some((3, false)));
        for other in [
            "flushed",
            "flushed ",
            "flushed x",
            "flushed 3 sure",
            "flushed 3 unsure more",
            "flush 3",
            "cordon-forward ready 127.0.0.1:3128",
        ] {
            assert_eq!(parse_flushed(other), None, "{other}");
        }
    }

    /// Records the call each question names, and refuses.
    #[derive(Default)]
    struct Calls(Mutex<Vec<Option<String>>>);

    #[async_trait::async_trait]
    impl EgressApprover for Calls {
        async fn ask(
            &self,
            request: cordon_egress::ask::AskRequest,
        ) -> cordon_egress::ask::AskAnswer {
            self.0
                .lock()
                .expect("calls")
                .push(request.call.as_deref().map(str::to_owned));
            cordon_egress::ask::AskAnswer::Deny
        }
    }

    /// A session proxy asking `calls` about `pkg.ask.test:443`, with a stand-in forwarder
    /// driven by the returned lines and answers.
    fn asking_egress(
        calls: &Arc<Calls>,
    ) -> (Egress, tokio::io::DuplexStream, mpsc::Sender<(u64, bool)>) {
        let mut spec = SandboxSpec::default();
        spec.egress.ask = vec!["pkg.ask.test:443".to_owned()];
        spec.sources.file = "policy.toml".to_owned();
        spec.sources.egress_ask = vec![7];
        let hooks = ProxyHooks {
            resolver: None,
            asker: Some(EgressAsker(calls.clone())),
        };
        let egress = Egress::start(&spec, "test", PathBuf::from("/nowhere"), hooks, 1000, &[])
            .expect("start");
        let (input, lines) = tokio::io::duplex(1024);
        let (answers_tx, answers) = mpsc::channel(16);
        let forwarder = Forwarder {
            exec: String::new(),
            generation: 0,
            alive: Arc::new(AtomicBool::new(true)),
            link: Arc::new(tokio::sync::Mutex::new(FlushLink {
                input: Box::pin(input),
                answers,
            })),
            task: tokio::spawn(async {}),
        };
        *egress.forwarder.try_lock().expect("unlocked") = Some(forwarder);
        (egress, lines, answers_tx)
    }

    /// A connection to `path` made by another process (a child that connects and ends), as
    /// the forwarder's are.
    fn connect_from_another_process(path: &Path) -> UnixStream {
        let (fd, _) = crate::helper_socket::tests::connect_from_an_ended_process(path);
        let stream = std::os::unix::net::UnixStream::from(fd);
        stream.set_nonblocking(true).expect("nonblocking");
        UnixStream::from_std(stream).expect("stream")
    }

    #[tokio::test]
    async fn only_this_process_s_own_connections_are_markers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let _own = UnixStream::connect(&path).await.expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        assert!(is_marker(&accepted));
        let _other = connect_from_another_process(&path);
        let (accepted, _) = listener.accept().await.expect("accept");
        assert!(!is_marker(&accepted));
    }

    /// What a command's connection carries to the proxy through the forwarder.
    async fn relay_connect(socket: &Path) {
        let mut stream = connect_from_another_process(socket);
        stream
            .write_all(b"CONNECT pkg.ask.test:443 HTTP/1.1\r\nHost: pkg.ask.test:443\r\n\r\n")
            .await
            .expect("request");
        tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut sink).await;
        });
    }

    /// A connection call A's command made that is still held in the forwarder (its queue, or
    /// on its way) when A's command ended reaches the proxy only while A's ticket is open:
    /// its question names A and its record is A's, never B's, whose command starts next.
    /// The stand-in forwarder passes it on at the first of: a flush line, or B's start.
    #[tokio::test]
    async fn a_connection_held_in_the_forwarder_past_its_command_s_end_stays_its_command_s() {
        let calls = Arc::new(Calls::default());
        let (egress, lines, answers) = asking_egress(&calls);
        let socket = egress.socket.clone();
        let b_began = Arc::new(Notify::new());
        let forwarder = tokio::spawn({
            let b_began = Arc::clone(&b_began);
            async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(lines).lines();
                let mut held = true;
                loop {
                    tokio::select! {
                        line = lines.next_line() => {
                            let Ok(Some(line)) = line else { return };
                            let n: u64 = line
                                .strip_prefix("flush ")
                                .and_then(|n| n.parse().ok())
                                .expect("a flush line");
                            if std::mem::take(&mut held) {
                                relay_connect(&socket).await;
                            }
                            answers.send((n, true)).await.expect("answer");
                        }
                        () = b_began.notified(), if held => {
                            held = false;
                            relay_connect(&socket).await;
                        }
                    }
                }
            }
        });
        let a = egress.begin(Runner::Helper {
            call: Some(Arc::from("call-A")),
        });
        let a_records = egress.finish(a).await;
        let b = egress.begin(Runner::Helper {
            call: Some(Arc::from("call-B")),
        });
        b_began.notify_one();
        let b_records = egress.finish(b).await;
        assert_eq!(
            *calls.0.lock().expect("calls"),
            vec![Some("call-A".to_owned())],
            "the question names A"
        );
        assert_eq!(a_records.len(), 1, "{a_records:?}");
        assert_eq!(a_records[0].host, "pkg.ask.test");
        assert!(b_records.is_empty(), "{b_records:?}");
        drop(egress);
        forwarder.abort();
    }

    /// A barrier the forwarder cannot vouch for (unsure, or no answer because it ended) turns
    /// naming off for the rest of the session; the command still gets its records.
    #[tokio::test]
    async fn a_barrier_that_fails_stops_naming_calls() {
        let calls = Arc::new(Calls::default());
        let (egress, lines, answers) = asking_egress(&calls);
        let socket = egress.socket.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(lines).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let n = line.strip_prefix("flush ").and_then(|n| n.parse().ok());
                answers
                    .send((n.expect("a flush line"), false))
                    .await
                    .expect("answer");
            }
        });
        let a = egress.begin(Runner::Helper {
            call: Some(Arc::from("call-A")),
        });
        assert!(egress.finish(a).await.is_empty());
        let b = egress.begin(Runner::Helper {
            call: Some(Arc::from("call-B")),
        });
        relay_connect(&socket).await;
        let b_records = egress.finish(b).await;
        assert_eq!(b_records.len(), 1, "{b_records:?}");
        assert_eq!(*calls.0.lock().expect("calls"), vec![None], "no call named");
    }

    /// A command whose end is never passed (its future dropped: the caller went away, or the
    /// end barrier itself was abandoned) may still run and connect: naming stops, and its
    /// registration goes (not open forever, taking later connections and the records of every
    /// later command's attempts, and naming its call whenever no other command runs).
    #[tokio::test]
    async fn a_command_whose_end_is_never_passed_stops_naming_and_leaves_no_registration() {
        let calls = Arc::new(Calls::default());
        let (egress, _lines, _answers) = asking_egress(&calls);
        let a = egress.begin(Runner::Helper {
            call: Some(Arc::from("call-A")),
        });
        drop(a);
        let ledger = egress.ledger.lock().expect("ledger");
        assert!(ledger.running.is_empty(), "still registered");
        assert!(ledger.calls.is_empty());
        assert!(ledger.unnamed.is_some(), "naming goes on");
    }

    #[tokio::test]
    async fn a_command_through_the_shell_workers_stops_naming_calls() {
        let calls = Arc::new(Calls::default());
        let (egress, _lines, _answers) = asking_egress(&calls);
        let shell = egress.begin(Runner::Shell);
        let mut ledger = egress.ledger.lock().expect("ledger");
        assert!(ledger.unnamed.is_some());
        ledger.running.remove(&shell.id);
        ledger.running.insert(9, EgressLog::new(MAX_RECORDS));
        ledger.calls.insert(9, Arc::from("call-9"));
        assert_eq!(ledger.call_of(&BTreeSet::from([9])), None);
        ledger.unnamed = None;
        assert_eq!(
            ledger.call_of(&BTreeSet::from([9])).as_deref(),
            Some("call-9")
        );
        assert_eq!(
            ledger.call_of(&BTreeSet::from([9, 10])),
            None,
            "two running"
        );
    }
}
