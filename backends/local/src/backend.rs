//! [`LocalBackend`]: building the confined view of the host from a [`LocalConfig`] — one
//! [`Layout`] of granted trees from which both the command sandbox and the file operations'
//! roots are derived, the protected/denied rules, the state directories — and handing out the
//! three operation sets that share it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use cordon_core::sandbox::{NestedGit, NetworkMode, SandboxSpec};
use cordon_ops::paths::normalize_lexically;
use cordon_ops::{Backend, BackendId, BashOperations, FileOperations, SearchOperations};

use crate::egress::Egress;
use crate::exec::{self, CommandSandbox, LocalBash};
use crate::expand::Expander;
use crate::files::LocalFiles;
use crate::git_guard::{self, GitGuard};
use crate::layout::{Layout, LayoutInputs, RootSpec};
use crate::roots::{
    Access, Identity, PathRules, Root, RootKind, Roots, current_umask, open_root_dir, probe_openat2,
};
use crate::search::LocalSearch;
use crate::state::{self, StateDirs};
use crate::{LocalConfig, LocalError};

/// What the three operation sets of one backend share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// `local:<canonical root>`.
    pub id: BackendId,
    /// The canonical workspace root.
    pub root: PathBuf,
    /// Home directory for `~` and commands' `HOME`.
    pub home: Option<PathBuf>,
    /// All allowed roots with their fds.
    pub roots: Roots,
    /// Protected and denied globs (shared with the walkers' filters).
    pub rules: Arc<PathRules>,
    /// Who we are, for unprivileged writability.
    pub ident: Identity,
    /// The process umask (new files get `0o644 & !umask`).
    pub umask: u32,
    /// Spill directory and private temp dir.
    pub state: StateDirs,
    /// The spec this backend enforces.
    pub spec: SandboxSpec,
    /// The shell commands run with (`bash`, else `sh`).
    pub shell: PathBuf,
    /// The command sandbox (or why commands cannot run), prepared when the first command
    /// runs: a session that only reads and edits files never builds it.
    sandbox: std::sync::OnceLock<CommandSandbox>,
    /// What the command sandbox is prepared from.
    sandbox_config: cordon_sandbox::SandboxConfig,
    /// The host's sandbox support (or the subset a test simulates).
    host_support: cordon_sandbox::HostSupport,
    /// The layers commands run without (decided from the configuration and the host
    /// support alone, exactly as preparing the sandbox decides it).
    missing_layers: Vec<String>,
    /// The commands' private `TMPDIR` (created with the backend, so file operations can use
    /// it before the sandbox exists).
    command_tmp: PathBuf,
    /// Expands the protected/denied patterns before each command; built by the first one.
    expander: std::sync::OnceLock<std::sync::Mutex<Expander>>,
    /// What both layers grant.
    pub layout: Layout,
    /// The git metadata guard; `None` when the spec allows nested repositories.
    pub git: Option<std::sync::Mutex<GitState>>,
    /// The git metadata recorded at start (the operator's): read-only for both layers.
    pub git_protected: Vec<PathBuf>,
    /// [`LocalConfig::workspace_is_copy`].
    workspace_is_copy: bool,
    /// Commands running now: a shutdown while one runs keeps the git baseline, so the next
    /// session on this root checks again.
    pub running: std::sync::atomic::AtomicUsize,
    /// With the network filtered: the egress proxy commands' connections go through.
    pub egress: Option<Egress>,
}

/// The git metadata guard and the failure of its last sweep, if it failed (commands then
/// fail closed until a sweep succeeds).
#[derive(Debug)]
pub(crate) struct GitState {
    pub guard: GitGuard,
    pub failure: Option<String>,
}

impl Shared {
    /// Sweep the writable roots for git metadata commands made: the note for the model, if
    /// anything was quarantined or the sweep failed.
    pub(crate) fn sweep_git(&self) -> Option<String> {
        let state = self.git.as_ref()?;
        let mut state = state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match state.guard.sweep() {
            Ok(quarantined) => {
                state.failure = None;
                git_guard::quarantine_note(&quarantined, Path::to_path_buf)
            }
            Err(error) => {
                tracing::error!(%error, "git guard: sweep failed; commands fail until one succeeds");
                let text = error.to_string();
                state.failure = Some(text.clone());
                Some(format!(
                    "Cordon could not finish checking for git metadata: {text}"
                ))
            }
        }
    }

    /// Why commands cannot run now because of the git guard, if they cannot.
    pub(crate) fn git_failure(&self) -> Option<String> {
        let state = self.git.as_ref()?;
        state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .failure
            .clone()
    }

    /// The last sweep, at shutdown; the baseline file is removed only when no command runs
    /// any more (otherwise the next session on this root checks again).
    pub(crate) fn finish_git(&self) {
        let Some(state) = self.git.as_ref() else {
            return;
        };
        let mut state = state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let result = if self.running.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            state.guard.finish()
        } else {
            state.guard.sweep()
        };
        match result {
            Ok(quarantined) if !quarantined.is_empty() => tracing::warn!(
                entries = quarantined.len(),
                "git guard: quarantined git metadata at shutdown"
            ),
            Ok(_) => {}
            Err(error) => tracing::error!(%error, "git guard: the sweep at shutdown failed"),
        }
    }

    /// Whether the last sweep was small enough to run on the async worker.
    pub(crate) fn git_sweep_is_small(&self, entries: usize) -> bool {
        self.git.as_ref().is_none_or(|state| {
            state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .guard
                .was_small(entries)
        })
    }
}

impl Shared {
    /// The command sandbox, prepared on first use (a failure is kept: every command then
    /// fails with it, fail closed).
    pub(crate) fn sandbox(&self) -> &CommandSandbox {
        self.sandbox
            .get_or_init(|| CommandSandbox::prepare(self.sandbox_config.clone(), self.host_support))
    }

    /// The expander of the protected/denied patterns, built on first use (only commands
    /// need it; it compares every pattern with every readable tree).
    pub(crate) fn expander(&self) -> std::sync::MutexGuard<'_, Expander> {
        self.expander
            .get_or_init(|| {
                let reach = self
                    .layout
                    .readable_trees()
                    .map(Path::to_path_buf)
                    .collect();
                let mut expander = Expander::new(Arc::clone(&self.rules), reach);
                expander.protect_also(self.git_protected.clone());
                if self.workspace_is_copy {
                    expander.exempt(self.rules.workspace());
                }
                std::sync::Mutex::new(expander)
            })
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the command sandbox has been prepared yet.
    pub(crate) fn sandbox_prepared(&self) -> bool {
        self.sandbox.get().is_some()
    }
}

/// Cordon's local backend: confined file operations, in-process search and commands on this
/// host. Cheap to share: the operation sets are `Arc`s over one shared state.
#[derive(Debug)]
pub struct LocalBackend {
    shared: Arc<Shared>,
    files: Arc<LocalFiles>,
    bash: Arc<LocalBash>,
    search: Arc<LocalSearch>,
}

impl LocalBackend {
    /// Open the workspace root, compute the layout (host defaults of the command sandbox,
    /// the workspace, the spec's extra roots, the spill directory), prepare the command
    /// sandbox from it and open the same trees as the file operations' roots; compile the
    /// protected/denied globs, prepare the state directories (cleaning up stale spill files)
    /// and pick the shell.
    ///
    /// A command sandbox that cannot be prepared (a layer the host lacks, without
    /// `allow_degraded`) does not fail the backend: file operations stay available and every
    /// command fails with an error naming the layer.
    pub fn new(config: LocalConfig) -> Result<Self, LocalError> {
        LocalBackend::build(config, None, None, None)
    }

    /// As [`LocalBackend::new`], with the egress proxy of filtered network mode asking
    /// `approver` about destinations an ask entry (`[network] ask`) matches (without one they
    /// are refused), and resolving names through `resolver` when given.
    pub fn with_egress(
        config: LocalConfig,
        resolver: Option<Arc<dyn cordon_egress::proxy::Resolver>>,
        approver: Option<Arc<dyn cordon_egress::ask::EgressApprover>>,
    ) -> Result<Self, LocalError> {
        LocalBackend::build(config, None, resolver, approver)
    }

    /// As [`LocalBackend::new`], with the egress proxy of filtered network mode resolving
    /// destination names through `resolver` instead of the system resolver (a fixed table,
    /// e.g. `cordon_egress::proxy::StaticResolver`, for tests or a pinned hosts list).
    pub fn with_egress_resolver(
        config: LocalConfig,
        resolver: Arc<dyn cordon_egress::proxy::Resolver>,
    ) -> Result<Self, LocalError> {
        LocalBackend::build(config, None, Some(resolver), None)
    }

    /// As [`LocalBackend::new`], with the command sandbox built as if the host supported
    /// exactly `support` (a subset of what it really supports): to check how the backend fails
    /// closed, or runs degraded when the spec allows it, on a weaker host.
    pub fn with_host_support(
        config: LocalConfig,
        support: cordon_sandbox::HostSupport,
    ) -> Result<Self, LocalError> {
        LocalBackend::build(config, Some(support), None, None)
    }

    /// The general form of the constructors above: the command sandbox as if the host
    /// supported `support` (`None`: what it supports), and filtered network mode's `resolver`
    /// and `approver` (`None`: the system resolver, nobody to ask).
    pub fn with_parts(
        config: LocalConfig,
        support: Option<cordon_sandbox::HostSupport>,
        resolver: Option<Arc<dyn cordon_egress::proxy::Resolver>>,
        approver: Option<Arc<dyn cordon_egress::ask::EgressApprover>>,
    ) -> Result<Self, LocalError> {
        LocalBackend::build(config, support, resolver, approver)
    }

    fn build(
        config: LocalConfig,
        support: Option<cordon_sandbox::HostSupport>,
        resolver: Option<Arc<dyn cordon_egress::proxy::Resolver>>,
        approver: Option<Arc<dyn cordon_egress::ask::EgressApprover>>,
    ) -> Result<Self, LocalError> {
        let LocalConfig {
            root,
            spec,
            home,
            state_base,
            profile,
            workspace_is_copy,
        } = config;
        let canonical = std::fs::canonicalize(&root).map_err(|source| LocalError::OpenRoot {
            path: root.clone(),
            source,
        })?;
        let root_fd = open_root_dir(&canonical).map_err(|source| {
            if source.raw_os_error() == Some(nix::errno::Errno::ENOTDIR as i32) {
                LocalError::RootNotDirectory { path: root.clone() }
            } else {
                LocalError::OpenRoot {
                    path: root.clone(),
                    source,
                }
            }
        })?;
        probe_openat2(std::os::fd::AsFd::as_fd(&root_fd))?;
        drop(root_fd);
        let home = home.or_else(host_home);
        let ident = Identity::current()?;
        let umask = current_umask()?;
        let base = state_base.unwrap_or_else(std::env::temp_dir);
        let state = state::prepare(&base, &canonical, ident.uid())?;

        let defaults = match home.as_deref() {
            Some(home) => cordon_sandbox::host_defaults_for_home(home),
            None => cordon_sandbox::host_defaults(),
        };
        let layout = Layout::compute(LayoutInputs {
            workspace: &canonical,
            workspace_alias: alias_of(&root, &canonical),
            spec: &spec,
            home: home.as_deref(),
            spill: &state.spill_path,
            defaults,
        })?;
        // The session directory's TMPDIR and HOME exist from the start (file operations may
        // use them); the sandbox itself is prepared by the first command.
        let session_dir = state.tmp.path().join("sandbox");
        let command_tmp = session_dir.join("tmp");
        let command_home = session_dir.join("home");
        for dir in [&session_dir, &command_tmp, &command_home] {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(|source| LocalError::StateDir {
                    op: "create",
                    path: dir.clone(),
                    source,
                })?;
        }
        let mut sandbox_config = layout.sandbox_config(&spec, state.tmp.path());
        sandbox_config.session_dir = Some(session_dir);
        sandbox_config.profile = profile;
        let host_support = support.unwrap_or_else(cordon_sandbox::probe);
        // A sandbox that cannot run at all runs nothing, so nothing is degraded.
        let missing_layers = sandbox_config
            .missing_layers(&host_support)
            .map(|layers| layers.iter().map(|l| l.name().to_owned()).collect())
            .unwrap_or_default();
        let session_dirs = vec![command_tmp.clone(), command_home];
        let mut roots = Vec::new();
        for spec_root in layout.file_roots(&session_dirs) {
            if let Some(root) = open_root(spec_root)? {
                roots.push(root);
            }
        }
        let rules = Arc::new(PathRules::new(
            &canonical,
            home.as_deref(),
            &spec,
            layout.host_denied.clone(),
        )?);
        // Temp files of writes a killed session left (only those no live writer holds).
        let writable_roots: Vec<PathBuf> = roots
            .iter()
            .filter(|root| {
                matches!(
                    (root.kind, root.access),
                    (RootKind::Workspace | RootKind::Extra, Access::ReadWrite)
                )
            })
            .map(|root| root.path.clone())
            .collect();
        crate::temp_sweep::remove_write_temps(&writable_roots);
        let shell = exec::find_shell();
        let git = match spec.nested_git {
            NestedGit::Allow => None,
            NestedGit::Quarantine => {
                let writable: Vec<PathBuf> = roots
                    .iter()
                    .filter(|root| {
                        matches!(
                            (root.kind, root.access),
                            (RootKind::Workspace | RootKind::Extra, Access::ReadWrite)
                        )
                    })
                    .map(|root| root.path.clone())
                    .collect();
                // The workspace's own `.git` under a literal protected pattern is read-only to
                // both layers, and pinned by a placeholder while it does not exist.
                let exempt: Vec<PathBuf> = protects_literally(&spec.protected, ".git")
                    .then(|| canonical.join(".git"))
                    .into_iter()
                    .collect();
                let (guard, quarantined) =
                    GitGuard::start(&writable, &exempt, Some(&state.git_path))?;
                for entry in &quarantined {
                    tracing::warn!(
                        path = %entry.path.display(),
                        renamed_to = %entry.renamed_to.display(),
                        "git guard: quarantined git metadata left by a session that did not shut down"
                    );
                }
                Some(guard)
            }
        };
        let git_protected = git
            .as_ref()
            .map(GitGuard::protected_paths)
            .unwrap_or_default();
        let id = BackendId::new(format!("local:{}", canonical.display()));
        let egress = match spec.network {
            NetworkMode::Filtered => {
                tracing::debug!(
                    allow = spec.egress.allow.len(),
                    deny = spec.egress.deny.len(),
                    ask = spec.egress.ask.len(),
                    approver = approver.is_some(),
                    "local: filtered network mode, egress proxy in this process"
                );
                Some(Egress::new(&spec, id.as_str(), resolver, approver)?)
            }
            NetworkMode::Disabled | NetworkMode::Enabled => None,
        };
        let shared = Arc::new(Shared {
            id,
            root: canonical,
            home,
            roots: Roots::new(roots),
            rules,
            ident,
            umask,
            state,
            spec,
            shell,
            sandbox: std::sync::OnceLock::new(),
            sandbox_config,
            host_support,
            missing_layers,
            command_tmp,
            expander: std::sync::OnceLock::new(),
            layout,
            git: git.map(|guard| {
                std::sync::Mutex::new(GitState {
                    guard,
                    failure: None,
                })
            }),
            git_protected,
            workspace_is_copy,
            running: std::sync::atomic::AtomicUsize::new(0),
            egress,
        });
        Ok(LocalBackend {
            files: Arc::new(LocalFiles::new(shared.clone())),
            bash: Arc::new(LocalBash::new(shared.clone())),
            search: Arc::new(LocalSearch::new(shared.clone())),
            shared,
        })
    }

    /// The canonical workspace root.
    pub fn root(&self) -> &Path {
        &self.shared.root
    }

    /// Whether the command sandbox has been built yet: the first command builds it, so a
    /// session that only uses file tools never pays for it.
    pub fn command_sandbox_prepared(&self) -> bool {
        self.shared.sandbox_prepared()
    }

    /// The spec this backend enforces.
    pub fn spec(&self) -> &SandboxSpec {
        &self.shared.spec
    }

    /// Where this root's spill files live (readable through [`FileOperations::read_file`]).
    pub fn spill_dir(&self) -> &Path {
        &self.shared.state.spill_path
    }

    /// The private temp directory given to commands as `TMPDIR` (0700, inside the backend's
    /// private state directory, removed on shutdown), writable by file operations too.
    pub fn command_tmp_dir(&self) -> &Path {
        &self.shared.command_tmp
    }

    /// The allowed roots of the file operations as `(canonical path, writable)`, most
    /// specific first. Roots that only grant some files inside them (e.g. `/etc` for
    /// `/etc/passwd`) are included as read-only.
    pub fn allowed_roots(&self) -> Vec<(PathBuf, bool)> {
        self.shared
            .roots
            .iter()
            .map(|root| {
                let writable = match (root.kind, root.access) {
                    (RootKind::Spill, _) | (_, Access::ReadOnly) => false,
                    (RootKind::Workspace | RootKind::Extra, Access::ReadWrite) => true,
                };
                (root.path.clone(), writable)
            })
            .collect()
    }

    /// What commands may touch, as given to the command sandbox: `(read + execute, read,
    /// write)` trees, canonical (the session's `TMPDIR` and `HOME` come on top). The file
    /// operations' roots are derived from the same list.
    pub fn sandbox_trees(&self) -> (Vec<PathBuf>, Vec<PathBuf>, Vec<PathBuf>) {
        let config = self
            .shared
            .layout
            .sandbox_config(&self.shared.spec, self.shared.state.tmp.path());
        (config.read_exec, config.read, config.write)
    }
}

#[async_trait]
impl Backend for LocalBackend {
    fn id(&self) -> &BackendId {
        &self.shared.id
    }

    fn files(&self) -> Arc<dyn FileOperations> {
        self.files.clone()
    }

    fn bash(&self) -> Arc<dyn BashOperations> {
        self.bash.clone()
    }

    fn search(&self) -> Arc<dyn SearchOperations> {
        self.search.clone()
    }

    fn missing_layers(&self) -> Vec<String> {
        self.shared.missing_layers.clone()
    }

    async fn shutdown(&self) -> Result<(), cordon_ops::ShutdownError> {
        // Idle sandbox inits end now, taking any `.git` placeholder with them.
        if let Some(CommandSandbox::Ready(sandbox)) = self.shared.sandbox.get() {
            sandbox.retire_idle();
        }
        self.shared.finish_git();
        self.shared.state.tmp.remove();
        Ok(())
    }
}

/// Whether `patterns` protect the workspace entry `name` by a literal pattern (`name`,
/// `name/**`, `./name/**`).
pub(crate) fn protects_literally(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|pattern| {
        let mut text = pattern.as_str();
        while let Some(rest) = text.strip_prefix("./") {
            text = rest;
        }
        text.strip_suffix("/**").unwrap_or(text) == name
    })
}

/// The host home: `$HOME` when absolute, else the password database.
fn host_home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|home| home.is_absolute())
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|user| user.dir)
        })
}

/// The configured absolute spelling of a root when it differs from the canonical one.
fn alias_of(configured: &Path, canonical: &Path) -> Option<PathBuf> {
    let absolute = if configured.is_absolute() {
        configured.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(configured)
    };
    let absolute = normalize_lexically(&absolute);
    (absolute != canonical).then_some(absolute)
}

/// Open a root of the file operations; one that vanished since the layout was computed is
/// skipped.
fn open_root(spec: RootSpec) -> Result<Option<Root>, LocalError> {
    let RootSpec {
        path,
        alias,
        access,
        kind,
        grants,
    } = spec;
    match open_root_dir(&path) {
        Ok(fd) => Ok(Some(Root {
            path,
            alias,
            fd,
            access,
            kind,
            grants,
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LocalError::OpenExtraRoot { path, source }),
    }
}
