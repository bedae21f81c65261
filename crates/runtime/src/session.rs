//! [`Session`]: one backend, its tools and the policy hooks, opened once per entry point run.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

#[cfg(feature = "docker")]
use cordon_backend_docker::{DockerBackend, DockerConfig};
#[cfg(feature = "docker")]
pub use cordon_backend_docker::{FilesHelper, WorkspaceMode};
use cordon_backend_local::{LocalBackend, LocalConfig};
#[cfg(feature = "ssh")]
use cordon_backend_ssh::{SshBackend, SshConfig};
use cordon_core::agent::AgentConfig;
use cordon_core::executor::{RunControl, ToolBatch, execute_tool_calls};
use cordon_core::protocol::{
    AssistantContent, AssistantMessage, StopReason, ToolCall, ToolDefinition, ToolResult,
};
use cordon_core::sandbox::SandboxSpec;
use cordon_core::tool::{AgentTool, ExecutionMode};
use cordon_ops::{Backend, ShutdownError};
use cordon_policy::audit::{AuditError, AuditHead};
use cordon_policy::{CompiledPolicy, EnvMap, PolicyError, PolicySource};

use crate::approval::{Approver, NetworkApprover};
use crate::audit::AuditLog;
use crate::hooks::RuntimeHooks;
use crate::hostpaths::{
    canonical_future_location, protected_name, writable_host_roots, writable_root_of,
};
use crate::registry::build_tools;

/// Which backend a session runs on. `Docker` and `Ssh` exist only with the crate's `docker` and
/// `ssh` features.
#[derive(Clone, Debug)]
pub enum BackendChoice {
    /// The host, under the local sandbox.
    Local,
    /// One hardened container per session.
    #[cfg(feature = "docker")]
    Docker(DockerOptions),
    /// A remote host over SSH.
    #[cfg(feature = "ssh")]
    Ssh(SshOptions),
    /// This host, under the local sandbox, through a `cordon-helper` child process and the
    /// helper protocol (docs/helper.md): the remote helper's code path on a local pipe.
    #[cfg(feature = "helper")]
    Helper(HelperOptions),
}

/// Helper backend options (the workspace is [`SessionOptions::root`] on this host).
#[cfg(feature = "helper")]
#[derive(Clone, Debug, Default)]
pub struct HelperOptions {
    /// The `cordon-helper` program; `None`: `CORDON_HELPER`, else next to this program.
    pub program: Option<PathBuf>,
}

/// Docker backend options (the workspace is [`SessionOptions::root`] on this host).
#[cfg(feature = "docker")]
#[derive(Clone, Debug)]
pub struct DockerOptions {
    /// Image to run (default `cordon-sandbox:latest`, built from `Dockerfile.sandbox`).
    pub image: String,
    /// Bind-mount the workspace (default) or copy it in and out (remote daemons).
    pub mode: WorkspaceMode,
    /// Daemon URI; `None` uses `DOCKER_HOST` or the default socket.
    pub docker_host: Option<String>,
    /// Whether file operations and search run through `cordon-helper` in the container.
    pub files_helper: FilesHelper,
    /// The `cordon-helper` binary; `None` looks for it (`CORDON_HELPER`, next to the program).
    pub helper: Option<PathBuf>,
    /// Host directories mounted into the container that no policy rule grants: the escape
    /// suite's canaries ([`cordon_backend_docker::UnlistedBind`]). Empty by default; neither
    /// the policy file nor the CLI sets it.
    pub unlisted_binds: Vec<cordon_backend_docker::UnlistedBind>,
}

#[cfg(feature = "docker")]
impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions {
            image: cordon_backend_docker::DEFAULT_IMAGE.to_owned(),
            mode: WorkspaceMode::Bind,
            docker_host: None,
            files_helper: FilesHelper::Auto,
            helper: None,
            unlisted_binds: Vec::new(),
        }
    }
}

/// SSH backend options.
#[cfg(feature = "ssh")]
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
    /// The `cordon-helper` binary to run on the host (default: `cordon-helper-<arch>`, then
    /// `cordon-helper`, next to the running program).
    pub helper: Option<PathBuf>,
    /// The remote directory for Cordon's per-user state, the helper cache among it (default:
    /// spill files in `/tmp/cordon-<uid>`, the helper in `~/.cache/cordon/helper`).
    pub state_dir: Option<PathBuf>,
}

#[cfg(feature = "ssh")]
impl SshOptions {
    /// The backend's configuration for these options and `spec`.
    pub fn config(self, spec: SandboxSpec) -> SshConfig {
        self.config_asking(spec, None)
    }

    /// [`SshOptions::config`], with the helper's egress proxy asking `asker` about `[network]
    /// ask` destinations.
    pub fn config_asking(
        self,
        spec: SandboxSpec,
        asker: Option<Arc<dyn cordon_egress::ask::EgressApprover>>,
    ) -> SshConfig {
        let SshOptions {
            host,
            remote_root,
            identity,
            known_hosts,
            ssh_config,
            helper,
            state_dir,
        } = self;
        SshConfig {
            spec,
            identity,
            known_hosts,
            ssh_config,
            helper,
            state_dir,
            egress_asker: asker,
            ..SshConfig::new(host, remote_root)
        }
    }
}

/// How to open a [`Session`].
#[derive(Clone)]
pub struct SessionOptions {
    /// The backend.
    pub backend: BackendChoice,
    /// The workspace root (host directory for local).
    pub root: PathBuf,
    /// Policy file, or `builtin:NAME` for a shipped policy; `None` = the built-in default
    /// (`policies/default.toml`).
    pub policy: Option<PathBuf>,
    /// Audit log file to append to.
    pub audit: Option<PathBuf>,
    /// Who answers `Ask` decisions; `None` = nobody (Ask becomes Deny).
    pub approver: Option<Arc<dyn Approver>>,
    /// The operator accepts a weaker sandbox when a layer is unavailable (stated in every
    /// result's details).
    pub allow_degraded: bool,
    /// Host directories later sessions read their policy and defaults from (the user's Cordon
    /// config directory): read-only to this session when they lie in a writable root, whether
    /// or not they exist yet.
    pub config_dirs: Vec<PathBuf>,
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
            config_dirs: Vec::new(),
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
    #[cfg(feature = "docker")]
    #[error("failed to start the docker backend: {0}")]
    Docker(#[source] cordon_backend_docker::DockerError),
    /// The SSH backend could not connect (unknown host key, authentication, …).
    #[cfg(feature = "ssh")]
    #[error("failed to start the ssh backend: {0}")]
    Ssh(#[source] cordon_backend_ssh::SshError),
    /// The helper could not be found or started, or refused the session.
    #[cfg(feature = "helper")]
    #[error("failed to start the helper backend: {0}")]
    Helper(#[source] cordon_helper::HelperError),
    /// A file Cordon writes (audit log, transcript) lies where sandboxed commands can write.
    #[error(transparent)]
    InsideWritableRoot(#[from] InsideWritableRoot),
    /// The policy file lies in a writable root under a name that cannot be protected.
    #[error(
        "failed to protect the policy file {}: it is inside the writable root {} but its path is not UTF-8; move it outside the workspace",
        path.display(),
        root.display()
    )]
    PolicyName {
        /// The policy file.
        path: PathBuf,
        /// The writable root it lies in.
        root: PathBuf,
    },
}

/// A file Cordon writes (audit log, transcript) lies where sandboxed commands can write.
#[derive(Debug, thiserror::Error)]
#[error(
    "failed to use {} as the {file}: it is inside {}, which sandboxed commands can write, so a command could replace or rewrite it; put it outside the workspace and the policy's writable roots",
    path.display(),
    root.display()
)]
pub struct InsideWritableRoot {
    /// What the file is for (`audit log`, `transcript (--save)`).
    pub file: &'static str,
    /// The file.
    pub path: PathBuf,
    /// The writable root it lies in.
    pub root: PathBuf,
}

/// An open session: backend + tools + policy hooks.
pub struct Session {
    backend: Arc<dyn Backend>,
    policy: Arc<CompiledPolicy>,
    spec: SandboxSpec,
    tools: Vec<Arc<dyn AgentTool>>,
    hooks: Arc<RuntimeHooks>,
    /// Host directories the sandbox can write (canonical).
    writable_roots: Vec<PathBuf>,
    audit: Option<Arc<AuditLog>>,
    /// The audit head recorded at shutdown.
    audit_head: OnceLock<Result<AuditHead, String>>,
    /// Docker: which path file operations and search take (`helper over socket`, `helper over
    /// attach (reason)`, `shell (reason)`).
    files_path: Option<String>,
    /// Docker: which path commands take (`helper (…)`, `shell (reason)`).
    commands_path: Option<String>,
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
            config_dirs,
        } = options;
        let env: EnvMap = std::env::vars().collect();
        let source = match &policy {
            Some(path) => PolicySource::parse(path).map_err(PolicyError::from)?,
            None => PolicySource::default_builtin(),
        };
        let mut compiled = CompiledPolicy::load_source(&source, &env)?;
        tracing::info!(
            file = compiled.file(),
            rules = compiled.rule_count(),
            default = ?compiled.default_decision(),
            "policy loaded"
        );
        // Host files matter only where the sandbox's writable directories are host ones.
        let host_writable = match &backend {
            BackendChoice::Local => true,
            #[cfg(feature = "docker")]
            BackendChoice::Docker(_) => true,
            #[cfg(feature = "ssh")]
            BackendChoice::Ssh(_) => false,
            #[cfg(feature = "helper")]
            BackendChoice::Helper(_) => true,
        };
        let writable_roots = if host_writable {
            let home = std::env::var_os("HOME").map(PathBuf::from);
            writable_host_roots(&root, home.as_deref(), &compiled.sandbox_spec())
        } else {
            Vec::new()
        };
        if let PolicySource::File(path) = &source
            && let Some(inside) = writable_root_of(&writable_roots, path)
        {
            let name = protected_name(&root, path).ok_or_else(|| RuntimeError::PolicyName {
                path: path.clone(),
                root: inside.to_path_buf(),
            })?;
            compiled.protect_literal(&name)?;
        }
        let workspace = std::fs::canonicalize(&root).unwrap_or_else(|_| root.clone());
        for dir in &config_dirs {
            let Some(location) = canonical_future_location(dir) else {
                tracing::debug!(dir = %dir.display(), "config directory not absolute; not protected");
                continue;
            };
            if !writable_roots.iter().any(|root| location.starts_with(root)) {
                continue;
            }
            let name = match location.strip_prefix(&workspace) {
                Ok(rel) if !rel.as_os_str().is_empty() => rel.to_str(),
                _ => location.to_str(),
            };
            let name = name.ok_or_else(|| RuntimeError::PolicyName {
                path: location.clone(),
                root: workspace.clone(),
            })?;
            tracing::info!(dir = %location.display(), "a Cordon config directory is in a writable root: read-only for the session");
            compiled.protect_config_dir(name)?;
        }
        let policy = Arc::new(compiled);
        let mut spec = policy.sandbox_spec();
        spec.allow_degraded |= allow_degraded;
        if let Some(path) = &audit {
            refuse_inside(&writable_roots, path, "audit log")?;
        }
        let audit = audit
            .as_deref()
            .map(AuditLog::open)
            .transpose()?
            .map(Arc::new);
        // The egress proxy (filtered network mode) asks the same person about `[network] ask`
        // destinations.
        let egress_approver = approver.clone().map(|approver| {
            Arc::new(NetworkApprover { approver }) as Arc<dyn cordon_egress::ask::EgressApprover>
        });
        // Only the Docker backend sets it.
        #[cfg_attr(not(feature = "docker"), allow(unused_mut))]
        let mut files_path = None;
        #[cfg_attr(not(feature = "docker"), allow(unused_mut))]
        let mut commands_path = None;
        let backend: Arc<dyn Backend> = match backend {
            BackendChoice::Local => {
                let config = LocalConfig {
                    spec: spec.clone(),
                    ..LocalConfig::new(root)
                };
                Arc::new(
                    LocalBackend::with_egress(config, None, egress_approver)
                        .map_err(RuntimeError::Local)?,
                )
            }
            #[cfg(feature = "docker")]
            BackendChoice::Docker(DockerOptions {
                image,
                mode,
                docker_host,
                files_helper,
                helper,
                unlisted_binds,
            }) => {
                let config = DockerConfig {
                    spec: spec.clone(),
                    image,
                    mode,
                    docker_host,
                    egress_asker: egress_approver.map(cordon_backend_docker::EgressAsker),
                    files_helper,
                    helper,
                    unlisted_binds,
                    ..DockerConfig::new(root)
                };
                let docker = DockerBackend::start(config)
                    .await
                    .map_err(RuntimeError::Docker)?;
                files_path = Some(match docker.helper_transport() {
                    Some(transport) => format!("{} over {transport}", docker.files_path()),
                    None => docker.files_path().to_string(),
                });
                commands_path = Some(docker.commands_path().to_string());
                Arc::new(docker)
            }
            #[cfg(feature = "ssh")]
            BackendChoice::Ssh(SshOptions {
                host,
                remote_root,
                identity,
                known_hosts,
                ssh_config,
                helper,
                state_dir,
            }) => {
                let config = SshOptions {
                    host,
                    remote_root,
                    identity,
                    known_hosts,
                    ssh_config,
                    helper,
                    state_dir,
                }
                .config_asking(spec.clone(), egress_approver);
                Arc::new(
                    SshBackend::connect(config)
                        .await
                        .map_err(RuntimeError::Ssh)?,
                )
            }
            #[cfg(feature = "helper")]
            BackendChoice::Helper(HelperOptions { program }) => {
                let program = cordon_helper::locate_helper(program.as_deref())
                    .map_err(RuntimeError::Helper)?;
                let start = cordon_helper::SessionStart::new(root, spec.clone());
                Arc::new(
                    cordon_helper::HelperBackend::start_asking(
                        Box::new(cordon_helper::PipeConnector::new(program)),
                        start,
                        egress_approver,
                    )
                    .await
                    .map_err(RuntimeError::Helper)?,
                )
            }
        };
        let missing_layers = backend.missing_layers();
        tracing::info!(
            backend = %backend.id(),
            network = ?spec.network,
            missing_layers = ?missing_layers,
            audit = audit.is_some(),
            "session started"
        );
        let tools = build_tools(backend.as_ref(), &policy, &spec);
        let hooks = Arc::new(RuntimeHooks {
            policy: policy.clone(),
            files: backend.files(),
            backend: backend.id().clone(),
            missing_layers,
            audit: audit.clone(),
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
            writable_roots,
            audit,
            audit_head: OnceLock::new(),
            files_path,
            commands_path,
        })
    }

    /// Docker: which path file operations and search take, `helper over socket`, `helper over
    /// attach (reason)` or `shell (reason)`;
    /// `None` on other backends.
    pub fn files_path(&self) -> Option<&str> {
        self.files_path.as_deref()
    }

    /// Docker: which path commands take, `helper (…)` (under the helper's sandbox in the
    /// container) or `shell (reason)` (the container's confinement only); `None` on other
    /// backends.
    pub fn commands_path(&self) -> Option<&str> {
        self.commands_path.as_deref()
    }

    /// Refuse `path` as a file Cordon writes (`file` says which, e.g. `transcript`) when it
    /// lies in a directory this session's commands can write.
    pub fn refuse_in_writable_root(
        &self,
        path: &Path,
        file: &'static str,
    ) -> Result<(), InsideWritableRoot> {
        refuse_inside(&self.writable_roots, path, file)
    }

    /// The audit head recorded by [`Session::shutdown`] (`None` without an audit log or
    /// before shutdown): the hash of the last line and the line count, also written to
    /// `FILE.head`; or why it could not be recorded.
    pub fn audit_head(&self) -> Option<(&Path, Result<&AuditHead, &str>)> {
        let log = self.audit.as_ref()?;
        let head = self.audit_head.get()?;
        Some((log.path(), head.as_ref().map_err(String::as_str)))
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

    /// Release backend resources (containers, connections) and record the audit head next
    /// to the audit log (see [`Session::audit_head`]). Idempotent. The audit head is recorded
    /// even when the backend reports an error (work it could not bring back, say), which is
    /// returned for the caller to show.
    pub async fn shutdown(&self) -> Result<(), ShutdownError> {
        let backend = self.backend.id().clone();
        let stopped = self.backend.shutdown().await;
        if let Some(log) = &self.audit {
            self.audit_head
                .get_or_init(|| log.finish().map_err(|error| error.to_string()));
        }
        match &stopped {
            Ok(()) => tracing::info!(%backend, "session stopped"),
            // The caller shows the error itself; this keeps it in the log's order of events.
            Err(error) => tracing::info!(%backend, %error, "session stopped with an error"),
        }
        stopped
    }
}

fn refuse_inside(
    roots: &[PathBuf],
    path: &Path,
    file: &'static str,
) -> Result<(), InsideWritableRoot> {
    match writable_root_of(roots, path) {
        Some(root) => Err(InsideWritableRoot {
            file,
            path: path.to_path_buf(),
            root: root.to_path_buf(),
        }),
        None => Ok(()),
    }
}
