//! [`DockerError`]: why a Docker session could not be set up or torn down. Errors of individual
//! operations use the backend traits' own types (`FsError`, `ExecError`, `SearchError`).

use std::path::{Path, PathBuf};

/// The next steps an error suggests. The repository's scripts exist only in a Cordon source
/// checkout; an installed `cordon` run anywhere else names commands the operator has instead
/// (`cordon doctor`, `docker build`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hints {
    /// The current directory is inside a Cordon source checkout: name its scripts.
    SourceCheckout,
    /// Anywhere else: only commands an installed `cordon` and Docker provide.
    Installed,
}

impl Hints {
    /// [`Hints::SourceCheckout`] when the current directory or one of its parents holds
    /// `Dockerfile.sandbox` and `scripts/build-sandbox-image.sh` (checked with `stat` only; a
    /// wrong guess changes an error's wording, nothing else).
    pub fn for_current_dir() -> Self {
        let in_checkout = std::env::current_dir().is_ok_and(|cwd| {
            cwd.ancestors().any(|dir: &Path| {
                dir.join("Dockerfile.sandbox").is_file()
                    && dir.join("scripts/build-sandbox-image.sh").is_file()
            })
        });
        if in_checkout {
            Self::SourceCheckout
        } else {
            Self::Installed
        }
    }

    /// What to do when no Docker engine answers.
    pub fn unreachable(self) -> String {
        match self {
            Self::SourceCheckout => "Start one (scripts/docker-start.sh prints the DOCKER_HOST to \
                                     use) or set DOCKER_HOST"
                .to_owned(),
            Self::Installed => "Start the Docker engine or set DOCKER_HOST to the socket of one \
                                that runs; `cordon doctor --backend docker` checks the connection"
                .to_owned(),
        }
    }

    /// What to do when `image` is not on the engine.
    pub fn image_missing(self, image: &str) -> String {
        match self {
            Self::SourceCheckout => {
                "build it with scripts/build-sandbox-image.sh (Cordon never pulls images)"
                    .to_owned()
            }
            Self::Installed => format!(
                "build it from Cordon's sources with `docker build -f Dockerfile.sandbox -t \
                 {image} .` or choose an image you have with --image (Cordon never pulls images); \
                 `cordon doctor --backend docker` checks the engine"
            ),
        }
    }
}

/// Why the Docker backend failed at a lifecycle step.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The `DOCKER_HOST` value cannot be used.
    #[error("failed to use Docker host `{host}`: {source}")]
    Host {
        /// The host URI.
        host: String,
        /// bollard's error.
        #[source]
        source: bollard::errors::Error,
    },
    /// An `ssh://` engine's URI or SSH connection cannot be used (a bad URI, an unknown or
    /// changed host key, failed authentication).
    #[error("failed to reach Docker host `{host}` over ssh: {reason}")]
    SshEngine {
        /// The host URI.
        host: String,
        /// What went wrong, with what to do about it.
        reason: String,
    },
    /// Copy mode asked of a Podman engine.
    #[error(
        "failed to start a copy-mode session on the Podman engine at `{host}`: Podman's archive \
         API fills only the mount that holds the target path, so the workspace volumes cannot \
         be filled; reach Podman through its local socket (unix://, bind mode)"
    )]
    PodmanCopyMode {
        /// The host URI.
        host: String,
    },
    /// Unlisted binds (a test's canaries) asked of a copy-mode session, whose engine may be on
    /// another machine.
    #[error(
        "failed to start a copy-mode session at `{host}` with unlisted bind mounts: they name \
         paths of this machine, which the engine may not share"
    )]
    UnlistedBindsInCopyMode {
        /// The host URI.
        host: String,
    },
    /// The engine says it would run the container without a layer of the sandbox.
    #[error("failed to confirm that the engine at {host} applies every sandbox layer: {reason}")]
    EngineLayers {
        /// The host URI.
        host: String,
        /// Which layer it lacks, and what to change.
        reason: String,
    },
    /// The engine's TLS settings (`DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH`) cannot be used.
    #[error("failed to set up TLS for Docker host `{host}`: {reason}")]
    Tls {
        /// The host URI.
        host: String,
        /// What is wrong and what to set.
        reason: String,
    },
    /// A protected directory that must exist to be mounted read-only could not be made.
    #[error("failed to create {path} to keep it read-only: {source}")]
    PinProtected {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Filtered network mode (`[network] allow`) cannot run in this configuration: refused
    /// rather than run with the network fully on or silently off.
    #[error(
        "failed to start the container: filtered network mode ({at}) cannot run here: {reason}; \
         fix that, remove `[network] allow` or use --backend local"
    )]
    FilteredNetwork {
        /// `FILE:LINE` of the first `[network] allow` entry.
        at: String,
        /// Why (copy mode, no usable helper binary).
        reason: String,
    },
    /// The configuration requires the file helper and it cannot run in this container.
    #[error(
        "failed to start the file helper in the container: {reason}; use an image that can run \
         cordon-helper (such as cordon-sandbox) or let file operations fall back to the shell"
    )]
    FilesHelper {
        /// Why it cannot run.
        reason: String,
    },
    /// A step of setting up the egress proxy failed.
    #[error("failed to {step} (filtered network mode): {reason}")]
    Egress {
        /// The step.
        step: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The forwarder that brings the egress proxy into the container did not start.
    #[error(
        "failed to start the egress forwarder (cordon-helper forward) in container {container}: \
         {reason}; without it commands cannot reach the network in filtered mode"
    )]
    Forwarder {
        /// The container name.
        container: String,
        /// What went wrong.
        reason: String,
    },
    /// The daemon does not answer.
    #[error("failed to reach the Docker daemon at {host}: {reason}. {next_step}")]
    Unreachable {
        /// The host URI.
        host: String,
        /// What went wrong.
        reason: String,
        /// What the operator can do, naming commands they have ([`Hints::unreachable`]).
        next_step: String,
    },
    /// The sandbox image is not on the Docker host (Cordon never pulls).
    #[error("failed to find image `{image}` on the Docker host: {next_step}")]
    ImageMissing {
        /// The image reference.
        image: String,
        /// How to build or choose an image ([`Hints::image_missing`]).
        next_step: String,
    },
    /// The workspace root cannot be used.
    #[error("failed to open workspace root {path}: {source}")]
    Root {
        /// The root.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The spec's protected/denied globs do not parse.
    #[error(transparent)]
    Rules(#[from] cordon_remote::files::RuleError),
    /// The workspace is too large to find its denied paths (fail closed).
    #[error(
        "failed to hide denied paths from commands: {path} has more than {limit} entries; narrow the workspace or accept a degraded sandbox"
    )]
    DeniedScan {
        /// The host root.
        path: PathBuf,
        /// The walk's limit.
        limit: usize,
    },
    /// The configuration would let the container reach a host Unix socket.
    #[error("failed to keep host Unix sockets out of the container: {reason}")]
    HostSocket {
        /// What would expose which socket, and what to change.
        reason: String,
    },
    /// A `[network] unix_sockets` entry cannot be bind-mounted into the container.
    #[error("failed to grant the host Unix socket {entry}: {reason}")]
    UnixSocket {
        /// The entry as listed.
        entry: String,
        /// What is wrong with it, and what to change.
        reason: String,
    },
    /// A Docker API call failed.
    #[error("failed to {step}: {source}")]
    Api {
        /// The step, e.g. "create container".
        step: String,
        /// bollard's error.
        #[source]
        source: bollard::errors::Error,
    },
    /// The started container does not behave as expected.
    #[error("failed to {step} in container {container}: {reason}")]
    Container {
        /// The step.
        step: &'static str,
        /// The container name.
        container: String,
        /// What went wrong.
        reason: String,
    },
    /// The git metadata in the bind-mounted workspace could not be recorded at start (set
    /// `nested_git = "allow"` to run without the check).
    #[error("{source}")]
    GitGuard {
        /// What failed.
        #[from]
        source: cordon_backend_local::git_guard::GitGuardError,
    },
    /// Copying the workspace in or out failed.
    #[error("failed to copy the workspace {direction} {path}: {reason}")]
    Copy {
        /// "into the container from" or "out of the container to".
        direction: &'static str,
        /// The host root.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

impl DockerError {
    pub(crate) fn api(step: impl Into<String>, source: bollard::errors::Error) -> Self {
        DockerError::Api {
            step: step.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_installed_binary_names_commands_the_operator_has() {
        assert_eq!(
            Hints::Installed.unreachable(),
            "Start the Docker engine or set DOCKER_HOST to the socket of one that runs; \
             `cordon doctor --backend docker` checks the connection"
        );
        assert_eq!(
            Hints::Installed.image_missing("cordon-sandbox:latest"),
            "build it from Cordon's sources with `docker build -f Dockerfile.sandbox -t \
             cordon-sandbox:latest .` or choose an image you have with --image (Cordon never \
             pulls images); `cordon doctor --backend docker` checks the engine"
        );
    }

    #[test]
    fn a_source_checkout_names_its_scripts() {
        assert_eq!(
            Hints::SourceCheckout.unreachable(),
            "Start one (scripts/docker-start.sh prints the DOCKER_HOST to use) or set DOCKER_HOST"
        );
        assert_eq!(
            Hints::SourceCheckout.image_missing("x"),
            "build it with scripts/build-sandbox-image.sh (Cordon never pulls images)"
        );
    }
}
