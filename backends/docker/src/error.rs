//! [`DockerError`]: why a Docker session could not be set up or torn down. Errors of individual
//! operations use the backend traits' own types (`FsError`, `ExecError`, `SearchError`).

use std::path::PathBuf;

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
    /// The daemon does not answer.
    #[error(
        "failed to reach the Docker daemon at {host}: {reason}. Start one (scripts/docker-start.sh prints the DOCKER_HOST to use) or set DOCKER_HOST"
    )]
    Unreachable {
        /// The host URI.
        host: String,
        /// What went wrong.
        reason: String,
    },
    /// The sandbox image is not on the Docker host (Cordon never pulls).
    #[error(
        "failed to find image `{image}` on the Docker host: build it with scripts/build-sandbox-image.sh (Cordon never pulls images)"
    )]
    ImageMissing {
        /// The image reference.
        image: String,
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
