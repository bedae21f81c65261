//! Commands (`cordon_remote::runner::RemoteBash` over this [`CommandHost`]) through the connection's workers (a `cordon_remote::runner::Runner` on SSH
//! exec channels, module `remote`): each command is one request to a `cordon-remote` worker,
//! driven by `cordon_remote::exec::drive`: streaming merged output, timeout and cancel killing the whole remote tree (SIGTERM, grace, SIGKILL;
//! setsid/nohup escapees found by their tag or by the output they hold), idle-grace drain, no
//! survivors. A dropped connection fails the call with a clear error; the worker, seeing its
//! stdin close, kills the tree on the remote side, and a sweep over a fresh connection makes
//! sure of it.
//!
//! These workers are the path without the helper (module `helper`: the policy's sandbox on the
//! host). They confine nothing (no network cut, no limits, no filesystem confinement), so
//! commands are refused unless the operator accepted that with `allow_degraded`
//! (`--allow-degraded`).

use cordon_ops::{BackendId, ExecError, ExecOutcome};
use cordon_remote::runner::{Attempt, Command, CommandHost, Lease};

use crate::Inner;

/// The sandbox layer the SSH backend cannot provide for commands.
pub(crate) const REMOTE_SANDBOX_LAYER: &str = "remote-sandbox";

/// Idle workers kept per connection (sshd's default `MaxSessions` is 10 per connection, one
/// of them SFTP).
pub(crate) const MAX_IDLE: usize = 2;

impl CommandHost for Inner {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    /// Without the helper, commands are refused unless the operator accepted an unconfined
    /// remote account.
    fn admit(&self) -> Result<(), ExecError> {
        if self.spec.allow_degraded {
            return Ok(());
        }
        let why = self
            .helper_refusal
            .as_deref()
            .unwrap_or("the helper does not run");
        tracing::info!(host = %self.pool.label(), reason = %why, "ssh: command refused: no remote sandbox");
        Err(ExecError::Sandbox {
            layer: REMOTE_SANDBOX_LAYER,
            reason: format!(
                "the SSH backend cannot confine commands on {}: the Cordon helper, which runs \
                 them under the policy's sandbox on the host, does not run there ({why}). Fix \
                 that, or pass --allow-degraded (allow_degraded in the sandbox spec) to run \
                 commands there with the remote account's own rights. File tools stay \
                 confined to the remote roots either way",
                self.pool.label()
            ),
        })
    }

    /// Passed host variables, fixed ones, then the request's.
    fn command_env(&self, extra: Vec<(String, String)>) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .spec
            .env
            .pass
            .iter()
            .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
            .collect();
        env.extend(self.spec.env.set.iter().cloned());
        env.extend(extra);
        env
    }

    /// A dropped connection is forgotten (the next call reconnects) and fails the command
    /// with a clear error; a login shell that never ran the worker says why.
    async fn run(&self, command: Command) -> Result<ExecOutcome, ExecError> {
        let Command {
            line,
            request,
            cwd,
            output: _,
        } = command;
        let (outcome, exec) = match self.runner.run(&line.line, &request).await {
            Ok(Attempt::Ran {
                outcome,
                lease: Lease { process, .. },
            }) => (outcome, process),
            Ok(Attempt::NoWorker(reason)) => {
                self.runner.keep_a_spare();
                return Err(ExecError::Backend { reason });
            }
            Err(e) => {
                self.runner.keep_a_spare();
                return Err(e);
            }
        };
        let lost = outcome.transport_error.is_some() || exec.live.is_closed();
        if lost {
            self.pool.invalidate(&exec.live).await;
        }
        let not_started = (!exec.started()).then(|| exec.not_started_reason());
        // Closing the channel of a worker that is not kept tells it to kill whatever is left.
        self.runner.release(exec, outcome.reusable && !lost);
        self.runner.settle(&line.tag, &outcome).await;
        if outcome.missing_cwd {
            return Err(ExecError::MissingCwd { cwd });
        }
        if outcome.status.is_none() {
            if lost {
                return Err(ExecError::Backend {
                    reason: format!(
                        "the SSH connection to {} was lost while the command ran{}; its remote \
                         processes were killed. The connection is re-established on the next \
                         call: run the command again",
                        self.pool.label(),
                        outcome
                            .transport_error
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    ),
                });
            }
            if let Some(reason) = not_started {
                return Err(ExecError::Backend { reason });
            }
        }
        Ok(ExecOutcome {
            status: outcome.status,
            termination: outcome.termination,
            notes: Vec::new(),
            egress: Vec::new(),
        })
    }
}
