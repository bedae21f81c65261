//! The orchestration every remote backend shares, over its [`Transport`]: a request is sent to
//! a leased worker (an idle one, or a fresh one whose stdin holds the request until it is
//! ready); a pooled worker that died while idle (it never answered) is replaced by a fresh one
//! once; a worker goes back to the idle list only when its request finished cleanly; a spare
//! is started off the calls' path whenever none is idle; a command the worker could not
//! confirm dead is swept by its tag from a separate process; short one-shot commands are
//! collected whole.
//!
//! What stays with a backend: what a failure means for its remote side (Docker checks and
//! replaces a dead container, SSH forgets a dropped connection) and the notes it adds.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use cordon_ops::denial::DenialLayout;
use cordon_ops::{BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest, Termination};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::exec::{DriveOutcome, DriveRequest, KILL_GRACE, drive, kill_argv};
use crate::pool::WorkerPool;
use crate::transport::{Collected, Process, StdinEnd, Transport, collect, wait_ready};
use crate::worker::{ExecLine, worker_argv};

/// A worker for one call.
pub struct Lease<P> {
    /// The worker.
    pub process: P,
    /// Whether it came from the idle list (it may have died meanwhile: a request it never
    /// answered can be sent to a fresh worker).
    pub pooled: bool,
}

/// How sending a command to a worker went.
pub enum Attempt<P> {
    /// No worker could be started (why, for the model): nothing ran.
    NoWorker(String),
    /// The command was driven on this worker (a fresh worker that never answered ran
    /// nothing: see [`DriveOutcome::unanswered`]).
    Ran {
        /// What [`drive`] observed.
        outcome: DriveOutcome,
        /// The worker; give it back with [`Runner::release`].
        lease: Lease<P>,
    },
}

/// The workers of one backend on one transport; see the module docs.
pub struct Runner<T: Transport> {
    transport: T,
    idle: WorkerPool<T::Process>,
}

impl<T: Transport> Runner<T> {
    /// Workers started through `transport`, at most `max_idle` kept between calls.
    pub fn new(transport: T, max_idle: usize) -> Self {
        Runner {
            transport,
            idle: WorkerPool::new(max_idle),
        }
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// An idle worker, or a new one (started, not yet ready: the request waits in its stdin).
    pub async fn take(&self) -> Result<Lease<T::Process>, String> {
        if let Some(process) = self.idle.take_idle() {
            return Ok(Lease {
                process,
                pooled: true,
            });
        }
        tracing::debug!("no idle worker; starting one for this request");
        let process = self
            .transport
            .start(worker_argv())
            .await
            .inspect_err(|error| tracing::warn!(%error, "failed to start a worker"))?;
        Ok(Lease {
            process,
            pooled: false,
        })
    }

    /// After a request: keep the worker for the next call when `reusable` (it finished its
    /// request cleanly), else close it (closing its stdin kills whatever is left).
    pub fn release(&self, process: T::Process, reusable: bool) {
        if reusable {
            self.idle.give_back(process);
        } else {
            tracing::debug!("closing a worker whose request did not finish cleanly");
        }
    }

    /// Close every idle worker.
    pub fn clear(&self) {
        tracing::debug!("closing the idle workers");
        self.idle.clear();
    }

    /// Start a worker, wait until it reads requests, and keep it idle.
    pub async fn warm(&self) {
        self.idle
            .warm(async {
                let mut process = match self.transport.start(worker_argv()).await {
                    Ok(process) => process,
                    Err(error) => {
                        // The next call starts its own worker (and reports a failure then).
                        tracing::debug!(%error, "failed to start a spare worker");
                        return None;
                    }
                };
                let ready = wait_ready(&mut process).await;
                tracing::debug!(ready, "spare worker started");
                ready.then_some(process)
            })
            .await;
    }

    /// Start a spare worker in the background when none is idle, so the next call finds one.
    pub fn keep_a_spare(self: &Arc<Self>) {
        if self.idle.wants_spare() {
            let runner = Arc::clone(self);
            tokio::spawn(async move { runner.warm().await });
        }
    }

    /// Send the command `line` to a worker and drive it. A pooled worker that died while idle
    /// (it never answered) is replaced by a fresh one once.
    pub async fn run(
        &self,
        line: &[u8],
        request: &DriveRequest,
    ) -> Result<Attempt<T::Process>, ExecError> {
        let mut retried = false;
        loop {
            let mut lease = match self.take().await {
                Ok(lease) => lease,
                Err(reason) => return Ok(Attempt::NoWorker(reason)),
            };
            let (events, mut control) = lease.process.io();
            let sent = control.write_all(line).await;
            if sent.is_err() && lease.pooled && !retried {
                retried = true;
                tracing::debug!("an idle worker was gone before it took the request; retrying");
                continue;
            }
            let outcome = drive(events, control, request.clone()).await?;
            if lease.pooled && outcome.unanswered() && !retried {
                // The idle worker was gone before it read the request: nothing ran.
                retried = true;
                tracing::debug!("an idle worker never answered the request; retrying");
                continue;
            }
            return Ok(Attempt::Ran { outcome, lease });
        }
    }

    /// After a command's worker was dealt with: start a spare, and when the worker could not
    /// confirm that the command's tree is gone, sweep by tag and session from a separate
    /// process (the last resort).
    pub async fn settle(self: &Arc<Self>, tag: &str, outcome: &DriveOutcome) {
        self.keep_a_spare();
        if !outcome.clean {
            tracing::info!(
                tag,
                pid = outcome.pid,
                session = outcome.session,
                "sweeping a command's processes by tag"
            );
            let argv = kill_argv(tag, outcome.pid, outcome.session, KILL_GRACE);
            let sweep = self.collect(argv, None, StdinEnd::AfterOutput);
            if tokio::time::timeout(KILL_GRACE * 20, sweep).await.is_err() {
                tracing::warn!(tag, "the kill sweep did not finish in time");
            }
        }
    }

    /// Run `argv` once with `stdin` and collect everything it prints.
    pub async fn collect(
        &self,
        argv: Vec<String>,
        stdin: Option<&[u8]>,
        end: StdinEnd,
    ) -> Result<Collected, String> {
        let mut process = self.transport.start(argv).await?;
        collect(&mut process, stdin, end).await
    }
}

/// A command ready for [`CommandHost::run`].
pub struct Command {
    /// The request line, its id and the tag of its processes.
    pub line: ExecLine,
    /// What [`drive`] needs (output, timeout, cancel, request id).
    pub request: DriveRequest,
    /// The working directory (for [`ExecError::MissingCwd`]).
    pub cwd: PathBuf,
    /// Where the command's output goes (a backend may add a notice).
    pub output: mpsc::Sender<Vec<u8>>,
}

/// A backend's part of running a command; [`RemoteBash`] is the [`BashOperations`] built on
/// it, the same for every remote backend.
pub trait CommandHost: Send + Sync + 'static {
    /// The backend's id.
    fn backend_id(&self) -> &BackendId;

    /// Refuse commands before anything is sent (the default admits them).
    fn admit(&self) -> Result<(), ExecError> {
        Ok(())
    }

    /// The environment a command runs with, given the request's (the default: just that).
    fn command_env(&self, env: Vec<(String, String)>) -> Vec<(String, String)> {
        env
    }

    /// Run `command` on a worker ([`Runner::run`]) and turn what happened into the result.
    fn run(&self, command: Command) -> impl Future<Output = Result<ExecOutcome, ExecError>> + Send;

    /// The sandbox layout failed commands are explained against
    /// ([`BashOperations::denial_layout`]); the default: none.
    fn denial_layout(&self) -> Option<&dyn DenialLayout> {
        None
    }
}

/// [`BashOperations`] of a remote backend: refusal, an early cancel, the request line, then
/// the backend's [`CommandHost::run`].
pub struct RemoteBash<H>(pub Arc<H>);

#[async_trait]
impl<H: CommandHost> BashOperations for RemoteBash<H> {
    fn backend_id(&self) -> &BackendId {
        self.0.backend_id()
    }

    fn denial_layout(&self) -> Option<&dyn DenialLayout> {
        self.0.denial_layout()
    }

    async fn exec(
        &self,
        request: ExecRequest,
        cancel: CancellationToken,
        output: mpsc::Sender<Vec<u8>>,
    ) -> Result<ExecOutcome, ExecError> {
        let ExecRequest {
            // Shell workers run commands unfiltered: no egress proxy asks about a call.
            call_id: _,
            command,
            cwd,
            timeout,
            env,
        } = request;
        self.0.admit()?;
        if cancel.is_cancelled() {
            return Ok(ExecOutcome {
                status: None,
                termination: Termination::Cancelled,
                notes: Vec::new(),
                egress: Vec::new(),
            });
        }
        let line = ExecLine::new(command, cwd.clone(), self.0.command_env(env)).map_err(|e| {
            ExecError::Spawn {
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
            }
        })?;
        let request = DriveRequest {
            timeout,
            cancel,
            output: output.clone(),
            kill_grace: KILL_GRACE,
            request_id: Some(line.id.clone()),
        };
        self.0
            .run(Command {
                line,
                request,
                cwd,
                output,
            })
            .await
    }
}

/// Implements `Backend` for a remote backend type: `id`, `bash` and `search` come from its
/// `inner: Arc<Inner>` (a [`CommandHost`] behind [`RemoteBash`] and a
/// [`SearchHost`](crate::search::host::SearchHost) behind
/// [`RemoteSearch`](crate::search::host::RemoteSearch)); `files`, `missing_layers` and
/// `shutdown` from its inherent `file_operations()`, `layers_missing()` and
/// `close_session()`.
#[macro_export]
macro_rules! impl_remote_backend {
    ($backend:ty) => {
        #[$crate::reexport::async_trait]
        impl $crate::reexport::ops::Backend for $backend {
            fn id(&self) -> &$crate::reexport::ops::BackendId {
                $crate::runner::CommandHost::backend_id(&*self.inner)
            }

            fn files(&self) -> ::std::sync::Arc<dyn $crate::reexport::ops::FileOperations> {
                self.file_operations()
            }

            fn bash(&self) -> ::std::sync::Arc<dyn $crate::reexport::ops::BashOperations> {
                ::std::sync::Arc::new($crate::runner::RemoteBash(self.inner.clone()))
            }

            fn search(&self) -> ::std::sync::Arc<dyn $crate::reexport::ops::SearchOperations> {
                ::std::sync::Arc::new($crate::search::host::RemoteSearch(self.inner.clone()))
            }

            fn missing_layers(&self) -> Vec<String> {
                self.layers_missing()
            }

            async fn shutdown(&self) -> Result<(), $crate::reexport::ops::ShutdownError> {
                self.close_session().await
            }
        }
    };
}
