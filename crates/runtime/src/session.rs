//! [`Session`]: one backend, its tools and the policy hooks, opened once per entry point run.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use cordon_backend_docker::WorkspaceMode;
use cordon_backend_docker::{DockerBackend, DockerConfig};
use cordon_backend_local::{LocalBackend, LocalConfig};
use cordon_backend_ssh::{SshBackend, SshConfig};
use cordon_core::agent::AgentConfig;
use cordon_core::executor::{RunControl, ToolBatch, execute_tool_calls};
use cordon_core::protocol::{
    AssistantContent, AssistantMessage, StopReason, ToolCall, ToolDefinition, ToolResult,
};
use cordon_core::sandbox::SandboxSpec;
use cordon_core::tool::{AgentTool, ExecutionMode};
use cordon_policy::{CompiledPolicy, EnvMap, PolicyError};
use cordon_tools::ops::Backend;

use crate::approval::Approver;
use crate::audit::{AuditError, AuditLog};
use crate::hooks::RuntimeHooks;
use crate::registry::build_tools;

/// Which backend a session runs on.
#[derive(Clone, Debug)]
pub enum BackendChoice {
    /// The host, under the local sandbox.
    Local,
    /// One hardened container per session.
    Docker(DockerOptions),
    /// A remote host over SSH.
    Ssh(SshOptions),
}

/// Docker backend options (the workspace is [`SessionOptions::root`] on this host).
#[derive(Clone, Debug)]
pub struct DockerOptions {
    /// Image to run (default `cordon-sandbox:latest`, built from `Dockerfile.sandbox`).
    pub image: String,
    /// Bind-mount the workspace (default) or copy it in and out (remote daemons).
    pub mode: WorkspaceMode,
    /// Daemon URI; `None` uses `DOCKER_HOST` or the default socket.
    pub docker_host: Option<String>,
}

impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions {
            image: cordon_backend_docker::DEFAULT_IMAGE.to_owned(),
            mode: WorkspaceMode::Bind,
            docker_host: None,
        }
    }
}

/// SSH backend options.
#[derive(Clone, Debug)]
pub struct SshOptions {
    /// `[user@]host[:port]` or an alias from the ssh config.
    pub host: String,
    /// The workspace root on the remote host.
    pub remote_root: PathBuf,
    /// A private key to try first.
    pub identity: Option<PathBuf>,
    /// known_hosts file (default: the config's, else `~/.ssh/known_hosts`).
    pub known_hosts: Option<PathBuf>,
    /// ssh config file (default `~/.ssh/config`).
    pub ssh_config: Option<PathBuf>,
}

/// How to open a [`Session`].
#[derive(Clone)]
pub struct SessionOptions {
    /// The backend.
    pub backend: BackendChoice,
    /// The workspace root (host directory for local).
    pub root: PathBuf,
    /// Policy file; `None` = the built-in default (`policies/default.toml`).
    pub policy: Option<PathBuf>,
    /// Audit log file to append to.
    pub audit: Option<PathBuf>,
    /// Who answers `Ask` decisions; `None` = nobody (Ask becomes Deny).
    pub approver: Option<Arc<dyn Approver>>,
    /// The operator accepts a weaker sandbox when a layer is unavailable (stated in every
    /// result's details).
    pub allow_degraded: bool,
}

impl SessionOptions {
    /// Local backend on `root` with the default policy, no audit, nobody to ask.
    pub fn local(root: impl Into<PathBuf>) -> Self {
        SessionOptions {
            backend: BackendChoice::Local,
            root: root.into(),
            policy: None,
            audit: None,
            approver: None,
            allow_degraded: false,
        }
    }
}

/// Why a session could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The policy file is unreadable or invalid (the message names file, line and column).
    #[error("{0}")]
    Policy(#[from] PolicyError),
    /// The audit log cannot be opened.
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// The local backend could not start (missing root, sandbox layer unavailable, …).
    #[error("failed to start the local backend: {0}")]
    Local(#[source] cordon_backend_local::LocalError),
    /// The Docker backend could not start (daemon unreachable, image missing, …).
    #[error("failed to start the docker backend: {0}")]
    Docker(#[source] cordon_backend_docker::DockerError),
    /// The SSH backend could not connect (unknown host key, authentication, …).
    #[error("failed to start the ssh backend: {0}")]
    Ssh(#[source] cordon_backend_ssh::SshError),
}

/// An open session: backend + tools + policy hooks.
pub struct Session {
    backend: Arc<dyn Backend>,
    policy: Arc<CompiledPolicy>,
    spec: SandboxSpec,
    tools: Vec<Arc<dyn AgentTool>>,
    hooks: Arc<RuntimeHooks>,
}

impl Session {
    /// Load the policy, start the backend, build the tools.
    pub async fn open(options: SessionOptions) -> Result<Session, RuntimeError> {
        let SessionOptions {
            backend,
            root,
            policy,
            audit,
            approver,
            allow_degraded,
        } = options;
        let env: EnvMap = std::env::vars().collect();
        let policy = Arc::new(match &policy {
            Some(path) => CompiledPolicy::load(path, &env)?,
            None => CompiledPolicy::builtin_default(&env)?,
        });
        let mut spec = policy.sandbox_spec();
        spec.allow_degraded |= allow_degraded;
        let audit = audit
            .as_deref()
            .map(AuditLog::open)
            .transpose()?
            .map(Arc::new);
        let backend: Arc<dyn Backend> = match backend {
            BackendChoice::Local => {
                let config = LocalConfig {
                    spec: spec.clone(),
                    ..LocalConfig::new(root)
                };
                Arc::new(LocalBackend::new(config).map_err(RuntimeError::Local)?)
            }
            BackendChoice::Docker(DockerOptions {
                image,
                mode,
                docker_host,
            }) => {
                let config = DockerConfig {
                    spec: spec.clone(),
                    image,
                    mode,
                    docker_host,
                    ..DockerConfig::new(root)
                };
                Arc::new(
                    DockerBackend::start(config)
                        .await
                        .map_err(RuntimeError::Docker)?,
                )
            }
            BackendChoice::Ssh(SshOptions {
                host,
                remote_root,
                identity,
                known_hosts,
                ssh_config,
            }) => {
                let config = SshConfig {
                    spec: spec.clone(),
                    identity,
                    known_hosts,
                    ssh_config,
                    ..SshConfig::new(host, remote_root)
                };
                Arc::new(
                    SshBackend::connect(config)
                        .await
                        .map_err(RuntimeError::Ssh)?,
                )
            }
        };
        let tools = build_tools(backend.as_ref(), &policy, &spec);
        let hooks = Arc::new(RuntimeHooks {
            policy: policy.clone(),
            files: backend.files(),
            backend: backend.id().clone(),
            missing_layers: backend.missing_layers(),
            audit,
            approver,
            approved_rules: Mutex::new(HashSet::new()),
            in_flight: Mutex::new(HashMap::new()),
        });
        Ok(Session {
            backend,
            policy,
            spec,
            tools,
            hooks,
        })
    }

    /// The agent-loop configuration: this session's tools and hooks.
    pub fn agent_config(&self, tool_execution: ExecutionMode) -> AgentConfig {
        AgentConfig {
            tools: self.tools.clone(),
            hooks: self.hooks.clone(),
            tool_execution,
            ..AgentConfig::default()
        }
    }

    /// The enabled tools.
    pub fn tools(&self) -> &[Arc<dyn AgentTool>] {
        &self.tools
    }

    /// What a model is told about the enabled tools.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.tools.iter().map(|tool| tool.definition()).collect()
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The compiled policy.
    pub fn policy(&self) -> &CompiledPolicy {
        &self.policy
    }

    /// The sandbox spec the backend enforces.
    pub fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    /// Run one call through the whole pipeline (prepare, validate, policy, execute, after
    /// hooks, audit) — `cordon exec` and MCP `tools/call`.
    pub async fn call(&self, call: ToolCall, control: &RunControl) -> ToolResult {
        let assistant = AssistantMessage {
            content: vec![AssistantContent::ToolCall(call)],
            stop_reason: StopReason::ToolUse,
            ..AssistantMessage::default()
        };
        let outcome = execute_tool_calls(ToolBatch {
            tools: &self.tools,
            hooks: self.hooks.as_ref(),
            mode: ExecutionMode::Parallel,
            assistant_message: &assistant,
            context: &[],
            control,
        })
        .await;
        outcome
            .results
            .into_iter()
            .next()
            .expect("a batch of one call yields one result")
    }

    /// Release backend resources (containers, connections). Idempotent.
    pub async fn shutdown(&self) {
        self.backend.shutdown().await;
    }
}
