//! [`LocalBackend`]: building the confined view of the host (roots, rules, state directories)
//! from a [`LocalConfig`], and handing out the three operation sets that share it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use cordon_core::sandbox::{RootAccess, SandboxSpec};
use cordon_tools::ops::{Backend, BackendId, BashOperations, FileOperations, SearchOperations};
use cordon_tools::paths::normalize_lexically;

use crate::exec::{self, LocalBash};
use crate::files::LocalFiles;
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
    /// Open the workspace root and the spec's extra roots, compile the protected/denied globs,
    /// prepare the state directories (cleaning up stale spill files) and pick the shell.
    pub fn new(config: LocalConfig) -> Result<Self, LocalError> {
        let LocalConfig {
            root,
            spec,
            home,
            state_base,
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
        let home = home.or_else(host_home);
        let ident = Identity::current()?;
        let umask = current_umask()?;
        let base = state_base.unwrap_or_else(std::env::temp_dir);
        let state = state::prepare(&base, &canonical, ident.uid())?;

        let workspace_access = match spec.workspace {
            RootAccess::ReadOnly => Access::ReadOnly,
            RootAccess::ReadWrite => Access::ReadWrite,
        };
        let mut roots = vec![Root {
            alias: alias_of(&root, &canonical),
            path: canonical.clone(),
            fd: root_fd,
            access: workspace_access,
            kind: RootKind::Workspace,
        }];
        let extra = spec
            .readable_roots
            .iter()
            .map(|r| (r, Access::ReadOnly))
            .chain(spec.writable_roots.iter().map(|r| (r, Access::ReadWrite)));
        for (configured, access) in extra {
            let path = expand_root(configured, &canonical, home.as_deref());
            if let Some(root) = open_extra_root(&path, access)? {
                roots.push(root);
            }
        }
        let spill_fd = state
            .spill_fd
            .try_clone()
            .map_err(|source| LocalError::StateDir {
                op: "open",
                path: state.spill_path.clone(),
                source,
            })?;
        roots.push(Root {
            path: state.spill_path.clone(),
            alias: None,
            fd: spill_fd,
            access: Access::ReadOnly,
            kind: RootKind::Spill,
        });
        let rules = PathRules::new(&canonical, home.as_deref(), &spec)?;
        let shell = exec::find_shell();
        let shared = Arc::new(Shared {
            id: BackendId::new(format!("local:{}", canonical.display())),
            root: canonical,
            home,
            roots: Roots::new(roots),
            rules: Arc::new(rules),
            ident,
            umask,
            state,
            spec,
            shell,
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

    /// The spec this backend enforces.
    pub fn spec(&self) -> &SandboxSpec {
        &self.shared.spec
    }

    /// Where this root's spill files live (readable through [`FileOperations::read_file`]).
    pub fn spill_dir(&self) -> &Path {
        &self.shared.state.spill_path
    }

    /// The private temp directory given to commands as `TMPDIR` (0700, removed on shutdown).
    /// The command sandbox must let commands write here.
    pub fn command_tmp_dir(&self) -> &Path {
        self.shared.state.tmp.path()
    }

    /// The allowed roots as `(canonical path, writable)`, most specific first: what the
    /// command sandbox must grant.
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
        exec::missing_layers(&self.shared.spec)
    }

    async fn shutdown(&self) {
        self.shared.state.tmp.remove();
    }
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

/// `~/…` against the home, relative against the workspace root.
fn expand_root(configured: &str, workspace: &Path, home: Option<&Path>) -> PathBuf {
    let expanded = match (configured, home) {
        ("~", Some(home)) => home.to_path_buf(),
        (text, Some(home)) if text.starts_with("~/") => home.join(&text[2..]),
        (text, _) => PathBuf::from(text),
    };
    if expanded.is_absolute() {
        expanded
    } else {
        workspace.join(expanded)
    }
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

/// Open an extra root; a missing one (or one that is not a directory, which only the command
/// sandbox can use) is skipped.
fn open_extra_root(path: &Path, access: Access) -> Result<Option<Root>, LocalError> {
    let canonical = match std::fs::canonicalize(path) {
        Ok(canonical) => canonical,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(LocalError::OpenExtraRoot {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    match open_root_dir(&canonical) {
        Ok(fd) => Ok(Some(Root {
            alias: alias_of(path, &canonical),
            path: canonical,
            fd,
            access,
            kind: RootKind::Extra,
        })),
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOTDIR as i32) => Ok(None),
        Err(source) => Err(LocalError::OpenExtraRoot {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_roots_expand_home_and_workspace() {
        let ws = Path::new("/ws");
        let home = Some(Path::new("/home/me"));
        assert_eq!(
            expand_root("~/.cargo", ws, home),
            PathBuf::from("/home/me/.cargo")
        );
        assert_eq!(expand_root("~", ws, home), PathBuf::from("/home/me"));
        assert_eq!(expand_root("vendor", ws, home), PathBuf::from("/ws/vendor"));
        assert_eq!(expand_root("/opt/sdk", ws, home), PathBuf::from("/opt/sdk"));
        assert_eq!(expand_root("~x", ws, home), PathBuf::from("/ws/~x"));
    }
}
