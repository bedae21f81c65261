//! Which path a session's commands take, and commands through `cordon-helper serve` in the
//! container ([`HelperBash`]): when the file helper runs, every command runs under the
//! helper's sandbox in its container profile (Landlock, seccomp, rlimits, a scrubbed
//! environment, a process group the command cannot leave; docs/helper.md) on the stream the
//! file operations already use, so a command costs no `docker exec`.
//!
//! A container whose kernel or seccomp profile lacks a layer that profile requires fails every
//! command with an error naming the layer (the helper's local backend does that), unless the
//! spec allows a degraded sandbox: then commands keep the shell workers (the container's own
//! confinement only) and the session's missing layers say so. It does not start the helper
//! (module `files_helper`) and leaves the shell path to module `bash`.

use std::sync::Arc;

use async_trait::async_trait;
use cordon_core::sandbox::{NetworkMode, SandboxSpec};
use cordon_helper::backend::HelperOps;
use cordon_ops::{BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::recovery::{Check, Moment};

/// Which path a session's commands take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandsPath {
    /// `cordon-helper serve` in the container, under its sandbox's container profile.
    Helper,
    /// The shell workers (`docker exec`): the container's own confinement only, and why.
    Shell {
        /// Why commands do not run through the helper.
        reason: String,
    },
}

impl std::fmt::Display for CommandsPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommandsPath::Helper => f.write_str("helper (Landlock and seccomp in the container)"),
            CommandsPath::Shell { reason } => write!(f, "shell ({reason})"),
        }
    }
}

/// The layers the helper's container profile requires (by name), for a spec like `spec`.
pub(crate) fn required_layers(spec: &SandboxSpec) -> Vec<&'static str> {
    let nothing = cordon_backend_local::HostSupport {
        landlock_abi: 0,
        seccomp: false,
        user_namespaces: false,
        pid_namespaces: false,
        mount_namespaces: false,
        pid_max_per_namespace: false,
        root: false,
        network_namespaces: false,
    };
    cordon_backend_local::sandbox_layers_in(
        &commands_spec(spec),
        &nothing,
        cordon_backend_local::Profile::Container,
    )
    .into_iter()
    .filter(|status| status.requirement == cordon_backend_local::Requirement::Required)
    .map(|status| status.layer.name())
    .collect()
}

/// Where commands go, given the layers the started helper's sandbox runs without (`missing`,
/// only ever non-empty when the spec allows a degraded sandbox: otherwise a missing required
/// layer fails each command instead): the helper, unless a layer its profile requires is
/// missing, in which case commands keep the shell workers.
pub(crate) fn choose(spec: &SandboxSpec, missing: &[String]) -> CommandsPath {
    let lacking: Vec<&str> = required_layers(spec)
        .into_iter()
        .filter(|layer| missing.iter().any(|m| m == layer))
        .collect();
    if lacking.is_empty() {
        CommandsPath::Helper
    } else {
        CommandsPath::Shell {
            reason: format!(
                "the container cannot apply {} (allow_degraded)",
                lacking.join(", ")
            ),
        }
    }
}

/// The spec the helper's commands get: the container's network namespace is a filtered
/// network's boundary (only loopback, where the forwarder listens), so the helper sees the
/// network on with the proxy variables set; everything else as the operator's spec.
pub(crate) fn commands_spec(spec: &SandboxSpec) -> SandboxSpec {
    let mut spec = spec.clone();
    match spec.network {
        NetworkMode::Filtered => {
            spec.network = NetworkMode::Enabled;
            // The spec's own entries still win, as on the other paths.
            let own = std::mem::take(&mut spec.env.set);
            spec.env.set = crate::egress::proxy_env();
            spec.env.set.extend(own);
        }
        NetworkMode::Disabled | NetworkMode::Enabled => {}
    }
    spec
}

/// Commands through the helper, with what the Docker session adds around each: the egress
/// forwarder and the attempts a command made (filtered network mode), the git metadata
/// sweep, and a dead container explained (and replaced) when the helper's stream broke.
pub(crate) struct HelperBash {
    pub inner: Arc<Inner>,
    pub helper: Arc<HelperOps>,
}

#[async_trait]
impl BashOperations for HelperBash {
    fn backend_id(&self) -> &BackendId {
        &self.inner.id
    }

    async fn exec(
        &self,
        request: ExecRequest,
        cancel: CancellationToken,
        output: mpsc::Sender<Vec<u8>>,
    ) -> Result<ExecOutcome, ExecError> {
        let inner = &self.inner;
        let seen = inner.recovery.generation();
        let ticket = match &inner.egress {
            Some(egress) => {
                egress
                    .ensure_forwarder(&inner.docker, &inner.container, seen)
                    .await
                    .map_err(|e| ExecError::Backend {
                        reason: e.to_string(),
                    })?;
                Some(egress.begin(crate::egress::Runner::Helper {
                    call: request.call_id.as_deref().map(Arc::from),
                }))
            }
            None => None,
        };
        let ran = self.helper.exec(request, cancel, output).await;
        if let (Some(egress), Err(ExecError::Backend { reason })) = (&inner.egress, &ran) {
            // The helper's stream broke: the helper may have died under the command, and what
            // the command started is then killed by the sandbox's warden, but nothing says
            // when; it may still connect while the next command runs.
            egress.stop_naming(&format!("a command's helper failed: {reason}"));
        }
        let attempts = match (&inner.egress, ticket) {
            (Some(egress), Some(ticket)) => egress.finish(ticket).await,
            _ => Vec::new(),
        };
        match ran {
            Ok(mut outcome) => {
                outcome.egress = attempts;
                outcome.notes.extend(inner.sweep_git().await);
                Ok(outcome)
            }
            Err(ExecError::Backend { reason }) => {
                // The helper's stream broke: a dead container explains it (and is replaced).
                let reason = match inner.check_container(seen).await {
                    Check::Alive => reason,
                    Check::Replaced(replacement) => replacement.notice(Moment::DuringThisCall),
                    Check::Unreachable(text) | Check::Failed(text) => text,
                };
                Err(ExecError::Backend { reason })
            }
            Err(other) => Err(other),
        }
    }

    fn denial_layout(&self) -> Option<&dyn cordon_ops::denial::DenialLayout> {
        self.helper.denial_layout()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_profile_requires_landlock_and_seccomp() {
        assert_eq!(
            required_layers(&SandboxSpec::default()),
            ["landlock-fs", "seccomp"]
        );
    }

    #[test]
    fn commands_keep_the_shell_only_when_a_required_layer_is_missing() {
        let spec = SandboxSpec::default();
        assert_eq!(choose(&spec, &[]), CommandsPath::Helper);
        // An optional layer missing (an older kernel's Landlock) keeps the helper.
        assert_eq!(
            choose(&spec, &["landlock-scopes".to_owned()]),
            CommandsPath::Helper
        );
        assert_eq!(
            choose(
                &spec,
                &["landlock-fs".to_owned(), "landlock-scopes".to_owned()]
            ),
            CommandsPath::Shell {
                reason: "the container cannot apply landlock-fs (allow_degraded)".to_owned()
            }
        );
    }

    #[test]
    fn a_filtered_network_is_the_container_s_with_the_proxy_variables() {
        let mut spec = SandboxSpec {
            network: NetworkMode::Filtered,
            ..SandboxSpec::default()
        };
        spec.env.set = vec![("NO_PROXY".to_owned(), "example.test".to_owned())];
        let commands = commands_spec(&spec);
        assert_eq!(commands.network, NetworkMode::Enabled);
        let mut expected = crate::egress::proxy_env();
        expected.push(("NO_PROXY".to_owned(), "example.test".to_owned()));
        assert_eq!(commands.env.set, expected);
        let off = SandboxSpec::default();
        assert_eq!(commands_spec(&off).network, NetworkMode::Disabled);
    }
}
