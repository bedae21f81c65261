//! Surviving the session's container and its engine. When a call fails in a way a dead
//! container explains (the engine refuses an exec, a fresh worker ends without a word, a
//! worker's streams end mid-command, a command dies of SIGKILL), the container is inspected.
//! If it was removed or stopped (killed, its init OOM-killed, the engine restarted), a fresh
//! container with the same name, mounts and limits replaces it, the old container's workers
//! are dropped, and the caller tells the model what happened and what was lost. While the
//! engine does not answer, the check fails within [`ENGINE_TIMEOUT`] with an "engine
//! unreachable" text instead.
//!
//! It does not decide which failures are suspicious (the operation modules do) and never
//! replaces a container that still runs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bollard::query_parameters::{
    InspectContainerOptions, RemoveContainerOptions, StartContainerOptions, WaitContainerOptions,
};
use futures::StreamExt;

use crate::Inner;
use crate::client;
use cordon_remote::transport::{StdinEnd, collect};

/// How long one engine request of a check or a replacement may take before the engine counts
/// as unreachable (bollard's own default is two minutes).
pub(crate) const ENGINE_TIMEOUT: Duration = Duration::from_secs(30);

/// What happened to the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// It no longer exists (`docker rm -f`).
    Removed,
    /// Its init was killed by the out-of-memory killer (`State.OOMKilled`).
    OomKilled,
    /// It stopped while the engine was unreachable: the engine restarted.
    EngineRestarted {
        /// The container's exit code.
        exit_code: i64,
    },
    /// It stopped otherwise (`docker kill`, `docker stop`, its init died).
    Stopped {
        /// The container's exit code.
        exit_code: i64,
    },
}

impl std::fmt::Display for Fate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fate::Removed => write!(f, "was removed from the Docker engine"),
            Fate::OomKilled => write!(
                f,
                "was killed by the out-of-memory killer (its memory limit was exceeded)"
            ),
            Fate::EngineRestarted { exit_code } => write!(
                f,
                "stopped when the Docker engine restarted (exit code {exit_code})"
            ),
            Fate::Stopped { exit_code: 137 } => {
                write!(f, "was killed (exit code 137: SIGKILL, e.g. `docker kill`)")
            }
            Fate::Stopped { exit_code } => write!(f, "stopped (exit code {exit_code})"),
        }
    }
}

/// What became of the workspace when the container was replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkspaceFate {
    /// Bind mode: the workspace is the host directory.
    HostBind,
    /// Copy mode: the workspace volumes outlived the container.
    VolumeKept,
    /// Copy mode: a workspace volume was gone; the host root was copied in again.
    CopiedAgain,
}

/// A container replacement, as the model is told about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Replacement {
    /// The container's name (the fresh one has the same).
    pub container: String,
    /// What happened to the old one.
    pub fate: Fate,
    /// What became of the workspace.
    pub workspace: WorkspaceFate,
    /// The host root (copy mode's source).
    pub host_root: PathBuf,
}

/// Where the call that learnt of a replacement stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moment {
    /// The replacement happened before the call ran; the call ran in the fresh container.
    BeforeThisCall,
    /// The container died while the call ran.
    DuringThisCall,
    /// The call was not done; the model should retry it.
    NotDone,
}

impl Replacement {
    fn lost(&self) -> String {
        let outside =
            "files outside it (/tmp, the home directory) and background processes are gone";
        match self.workspace {
            WorkspaceFate::HostBind => {
                format!("The workspace is the host directory, nothing in it was lost; {outside}.")
            }
            WorkspaceFate::VolumeKept => {
                format!("The workspace volume survived, nothing in /workspace was lost; {outside}.")
            }
            WorkspaceFate::CopiedAgain => format!(
                "The workspace volume was gone: /workspace was copied in again from {}, so changes made in the container since the session started or the last sync to the host are lost; {outside}.",
                self.host_root.display()
            ),
        }
    }

    /// The text the model reads.
    pub fn notice(&self, moment: Moment) -> String {
        let Replacement {
            container, fate, ..
        } = self;
        let lost = self.lost();
        match moment {
            Moment::BeforeThisCall => format!(
                "[cordon: the sandbox container {container} {fate}; a new container was started and ran this command. {lost}]"
            ),
            Moment::DuringThisCall => format!(
                "[cordon: the sandbox container {container} {fate} while this command ran; a new container was started for the next call. {lost}]"
            ),
            Moment::NotDone => format!(
                "the sandbox container {container} {fate}; a new container was started. {lost} This operation was not done: retry it"
            ),
        }
    }
}

/// The outcome of [`Inner::check_container`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// The container runs: the failure was not the container's.
    Alive,
    /// It had died (now or while this call ran); a fresh container serves the next call.
    Replaced(Replacement),
    /// The engine does not answer; the text is for the model.
    Unreachable(String),
    /// The container is dead and could not be replaced (or inspected); the text says why.
    Failed(String),
}

/// The recovery state of a session.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// Bumped by every replacement: a call that started on an older container learns that it
    /// was replaced meanwhile.
    generation: AtomicU64,
    /// The engine was found unreachable since the last successful check.
    engine_lost: AtomicBool,
    /// Serialises checks; holds the last replacement.
    last: tokio::sync::Mutex<Option<Replacement>>,
}

impl Recovery {
    /// The current container's generation (read before a call uses the container).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

/// The text of an unreachable engine.
pub(crate) fn engine_unreachable(host: &str, cause: impl std::fmt::Display) -> String {
    format!(
        "docker engine unreachable at {host}: {cause}; is dockerd running? (`cordon doctor --backend docker`)"
    )
}

/// One engine request, bounded by [`ENGINE_TIMEOUT`]; `Err` is the unreachable cause.
async fn bounded<T>(
    request: impl std::future::Future<Output = Result<T, bollard::errors::Error>>,
) -> Result<Result<T, bollard::errors::Error>, String> {
    tokio::time::timeout(ENGINE_TIMEOUT, request)
        .await
        .map_err(|_| format!("no answer within {} s", ENGINE_TIMEOUT.as_secs()))
}

/// Whether bollard's error came from the engine (an HTTP answer) rather than from reaching it.
fn answered(error: &bollard::errors::Error) -> bool {
    matches!(
        error,
        bollard::errors::Error::DockerResponseServerError { .. }
            | bollard::errors::Error::JsonDataError { .. }
            | bollard::errors::Error::JsonSerdeError { .. }
    )
}

impl Inner {
    /// A call that started on generation `seen` failed in a way a dead container explains:
    /// find out, and replace the container if it died. Concurrent callers wait for one check;
    /// a caller whose container was replaced meanwhile learns of that replacement.
    pub(crate) async fn check_container(&self, seen: u64) -> Check {
        let mut last = self.recovery.last.lock().await;
        if self.recovery.generation() != seen
            && let Some(replacement) = last.as_ref()
        {
            return Check::Replaced(replacement.clone());
        }
        let fate = match self.fate().await {
            Ok(Some(fate)) => fate,
            Ok(None) => {
                // A live container after an outage: the engine kept it (live restore).
                self.recovery.engine_lost.store(false, Ordering::SeqCst);
                tracing::debug!(container = %self.container, "sandbox container checked after a failure: it runs");
                return Check::Alive;
            }
            Err(check) => return check,
        };
        tracing::warn!(container = %self.container, fate = %fate, "sandbox container died; replacing it");
        match self.replace_container().await {
            Ok(workspace) => {
                let replacement = Replacement {
                    container: self.container.clone(),
                    fate,
                    workspace,
                    host_root: self.host_root.clone(),
                };
                self.recovery.engine_lost.store(false, Ordering::SeqCst);
                let generation = self.recovery.generation.fetch_add(1, Ordering::SeqCst) + 1;
                tracing::info!(container = %self.container, generation, workspace = ?workspace, "sandbox container replaced");
                *last = Some(replacement.clone());
                drop(last);
                self.runner.keep_a_spare();
                Check::Replaced(replacement)
            }
            Err(Replace::Unreachable(cause)) => self.unreachable(cause),
            Err(Replace::Failed(reason)) => {
                tracing::error!(container = %self.container, fate = %fate, reason = %reason, "failed to replace the sandbox container");
                Check::Failed(format!(
                    "the sandbox container {} {fate} and a new one could not be started: {reason}",
                    self.container
                ))
            }
        }
    }

    /// An operation that did nothing failed with `reason` in a way a dead container explains:
    /// the text for the model (the replacement's notice, the unreachable engine, or `reason`
    /// itself when the container runs).
    pub(crate) async fn explain_failure(&self, seen: u64, reason: String) -> String {
        match self.check_container(seen).await {
            Check::Alive => reason,
            Check::Replaced(replacement) => replacement.notice(Moment::NotDone),
            Check::Unreachable(text) | Check::Failed(text) => text,
        }
    }

    /// What happened to the container; `None` while it runs. A container the engine still
    /// reports running must also run a probe: one whose worker streams just ended may be
    /// dying, with the engine not yet aware; then its end is awaited.
    async fn fate(&self) -> Result<Option<Fate>, Check> {
        let mut probed = false;
        loop {
            let inspected = bounded(
                self.docker
                    .inspect_container(&self.container, None::<InspectContainerOptions>),
            )
            .await;
            let state = match inspected {
                Err(cause) => return Err(self.unreachable(cause)),
                Ok(Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404,
                    ..
                })) => return Ok(Some(Fate::Removed)),
                Ok(Err(e)) if !answered(&e) => return Err(self.unreachable(e)),
                Ok(Err(e)) => {
                    tracing::error!(container = %self.container, error = %e, "failed to inspect the sandbox container");
                    return Err(Check::Failed(format!(
                        "failed to inspect the sandbox container {}: {e}",
                        self.container
                    )));
                }
                Ok(Ok(container)) => container.state.unwrap_or_default(),
            };
            if state.running == Some(true) {
                if probed || self.runs_a_probe().await {
                    return Ok(None);
                }
                probed = true;
                tracing::debug!(container = %self.container, "sandbox container reported running but refuses a probe; waiting for it to stop");
                let mut wait = self.docker.wait_container(
                    &self.container,
                    Some(WaitContainerOptions {
                        condition: "not-running".to_owned(),
                    }),
                );
                // Any answer (an exit code is an error item for bollard) or none in time.
                let _ = tokio::time::timeout(ENGINE_TIMEOUT, wait.next()).await;
                continue;
            }
            let exit_code = state.exit_code.unwrap_or(-1);
            return Ok(Some(if state.oom_killed == Some(true) {
                Fate::OomKilled
            } else if self.recovery.engine_lost.load(Ordering::SeqCst) {
                Fate::EngineRestarted { exit_code }
            } else {
                Fate::Stopped { exit_code }
            }));
        }
    }

    /// Whether a trivial exec (`true`, as root) runs to a zero exit in the container.
    async fn runs_a_probe(&self) -> bool {
        let argv = vec!["true".to_owned()];
        let started = tokio::time::timeout(
            ENGINE_TIMEOUT,
            client::start_exec(&self.docker, &self.container, argv, Some("0:0")),
        )
        .await;
        let Ok(Ok(mut exec)) = started else {
            return false;
        };
        let drained = tokio::time::timeout(
            ENGINE_TIMEOUT,
            collect(&mut exec, None, StdinEnd::AfterOutput),
        )
        .await;
        if !matches!(drained, Ok(Ok(_))) {
            return false;
        }
        matches!(
            bounded(self.docker.inspect_exec(&exec.id)).await,
            Ok(Ok(inspect)) if inspect.exit_code == Some(0)
        )
    }

    fn unreachable(&self, cause: impl std::fmt::Display) -> Check {
        self.recovery.engine_lost.store(true, Ordering::SeqCst);
        tracing::warn!(host = %self.host, cause = %cause, "docker engine unreachable");
        Check::Unreachable(engine_unreachable(&self.host, cause))
    }

    /// Remove what is left of the container and start a fresh one from the same plan (copy
    /// mode: refill the workspace volumes first if one is gone).
    async fn replace_container(&self) -> Result<WorkspaceFate, Replace> {
        self.runner.clear();
        let removed = bounded(self.docker.remove_container(
            &self.container,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        ))
        .await?;
        match removed {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => return Err(Replace::api("remove the dead container", e)),
        }
        let workspace = match &self.copy {
            None => WorkspaceFate::HostBind,
            Some(copy) => self.restore_volumes(copy).await?,
        };
        bounded(self.docker.create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some(self.container.clone()),
                ..Default::default()
            }),
            self.body.clone(),
        ))
        .await?
        .map_err(|e| Replace::api("create the container", e))?;
        bounded(
            self.docker
                .start_container(&self.container, None::<StartContainerOptions>),
        )
        .await?
        .map_err(|e| Replace::api("start the container", e))?;
        tokio::time::timeout(ENGINE_TIMEOUT, self.probe())
            .await
            .map_err(|_| {
                Replace::Unreachable(format!("no answer within {} s", ENGINE_TIMEOUT.as_secs()))
            })?
            .map_err(|e| Replace::Failed(e.to_string()))?;
        // Workers started on the old container meanwhile are dead; none may be reused.
        self.runner.clear();
        Ok(workspace)
    }

    /// Copy mode: keep the workspace volumes when they all survived, otherwise recreate them
    /// and copy the host root in again.
    async fn restore_volumes(&self, copy: &crate::CopyState) -> Result<WorkspaceFate, Replace> {
        let mut all_there = true;
        for volume in &copy.volumes {
            match bounded(self.docker.inspect_volume(volume)).await? {
                Ok(_) => {}
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => all_there = false,
                Err(e) => return Err(Replace::api(format!("inspect volume {volume}"), e)),
            }
        }
        if all_there {
            return Ok(WorkspaceFate::VolumeKept);
        }
        tracing::warn!(container = %self.container, "workspace volume gone; copying the host root in again");
        crate::remove_container_and_volumes(&self.docker, "", &copy.volumes).await;
        crate::create_workspace_volumes(&self.docker, &copy.volumes, &copy.labels)
            .await
            .map_err(|e| Replace::Failed(e.to_string()))?;
        crate::copy::copy_in(
            &self.docker,
            &crate::copy::CopyIn {
                host_root: &self.host_root,
                image: &copy.image,
                labels: &copy.labels,
                workspace: &self.workspace,
                source: &copy.source,
                protected: &copy.mounts,
                rules: &self.rules,
                user: (self.uid, self.gid),
            },
        )
        .await
        .map_err(|e| Replace::Failed(e.to_string()))?;
        Ok(WorkspaceFate::CopiedAgain)
    }
}

/// Why a replacement failed.
enum Replace {
    /// The engine stopped answering.
    Unreachable(String),
    /// The engine refused a step.
    Failed(String),
}

impl Replace {
    fn api(step: impl std::fmt::Display, e: bollard::errors::Error) -> Replace {
        if answered(&e) {
            Replace::Failed(format!("failed to {step}: {e}"))
        } else {
            Replace::Unreachable(e.to_string())
        }
    }
}

impl From<String> for Replace {
    fn from(cause: String) -> Replace {
        Replace::Unreachable(cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replacement(fate: Fate, workspace: WorkspaceFate) -> Replacement {
        Replacement {
            container: "cordon-abc".to_owned(),
            fate,
            workspace,
            host_root: PathBuf::from("/work/project"),
        }
    }

    #[test]
    fn a_killed_container_in_bind_mode_loses_nothing_of_the_workspace() {
        let text = replacement(Fate::Stopped { exit_code: 137 }, WorkspaceFate::HostBind)
            .notice(Moment::BeforeThisCall);
        assert_eq!(
            text,
            "[cordon: the sandbox container cordon-abc was killed (exit code 137: SIGKILL, e.g. `docker kill`); a new container was started and ran this command. The workspace is the host directory, nothing in it was lost; files outside it (/tmp, the home directory) and background processes are gone.]"
        );
    }

    #[test]
    fn a_lost_copy_volume_says_which_changes_are_gone() {
        let text = replacement(Fate::Removed, WorkspaceFate::CopiedAgain).notice(Moment::NotDone);
        assert_eq!(
            text,
            "the sandbox container cordon-abc was removed from the Docker engine; a new container was started. The workspace volume was gone: /workspace was copied in again from /work/project, so changes made in the container since the session started or the last sync to the host are lost; files outside it (/tmp, the home directory) and background processes are gone. This operation was not done: retry it"
        );
    }

    #[test]
    fn each_fate_names_its_cause() {
        assert_eq!(
            Fate::OomKilled.to_string(),
            "was killed by the out-of-memory killer (its memory limit was exceeded)"
        );
        assert_eq!(
            Fate::EngineRestarted { exit_code: 143 }.to_string(),
            "stopped when the Docker engine restarted (exit code 143)"
        );
        assert_eq!(
            Fate::Stopped { exit_code: 0 }.to_string(),
            "stopped (exit code 0)"
        );
        let during =
            replacement(Fate::OomKilled, WorkspaceFate::VolumeKept).notice(Moment::DuringThisCall);
        assert!(
            during.starts_with("[cordon: the sandbox container cordon-abc was killed by the out-of-memory killer (its memory limit was exceeded) while this command ran; a new container was started for the next call. The workspace volume survived"),
            "{during}"
        );
    }

    #[test]
    fn the_unreachable_text_names_the_host_and_the_next_step() {
        assert_eq!(
            engine_unreachable("unix:///run/d.sock", "connection refused"),
            "docker engine unreachable at unix:///run/d.sock: connection refused; is dockerd running? (`cordon doctor --backend docker`)"
        );
    }
}
