//! The one source of truth for what the local backend may touch: [`Layout`] lists, once per
//! backend, the trees commands and file operations may read, execute and write, and both
//! layers are derived from it:
//!
//! - the command sandbox ([`Layout::sandbox_config`]): Landlock rules on exactly these paths;
//! - the file operations ([`Layout::file_roots`]): one kernel-confined root per granted tree,
//!   and for granted *files* (`/etc/passwd`, `~/.cargo/env`, …) their directory as an anchor
//!   that only lets those files through.
//!
//! The trees are the host defaults of `cordon-sandbox` (system directories, `/etc` minus
//! secrets, toolchains in the home directory minus credentials) plus the workspace, the
//! spec's extra roots and the spill directory. Protected and denied paths are not listed
//! here: they are globs, judged on canonical paths by [`crate::roots::PathRules`] for file
//! operations and expanded to concrete paths before each command by [`crate::expand`].
//!
//! What deliberately differs between the layers: a command sees a fresh `/proc` of its own
//! PID namespace and the device nodes (`/dev/null`, …), which file operations do not get
//! (they would see the host's); a command also gets a private `TMPDIR`, `HOME` and
//! `/dev/shm`, which file operations get as writable roots. A granted file is read-only for
//! file operations even in a writable root, since an atomic replace needs its directory.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use cordon_core::sandbox::{NetworkMode, RootAccess, SandboxSpec};
use cordon_sandbox::{HostDefaults, NetworkAccess, Rlimits, SandboxConfig};

use crate::LocalError;
use crate::roots::{Access, RootKind};

/// One granted tree (or file), canonical.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Canonical path.
    pub path: PathBuf,
    /// The spelling it was configured with, when that differs (workspace and spec roots).
    pub alias: Option<PathBuf>,
    /// Read-only or read-write.
    pub access: Access,
    /// What the grant is for.
    pub kind: RootKind,
    /// Whether the path is a directory (a tree) rather than a single file.
    pub is_dir: bool,
    /// Whether commands may execute from it (host defaults and writable trees).
    pub exec: bool,
}

/// A root for the file operations: a directory whose fd confines path resolution, granted
/// whole (`grants: None`) or only for some files inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RootSpec {
    /// Canonical directory.
    pub path: PathBuf,
    /// Configured spelling, when it differs.
    pub alias: Option<PathBuf>,
    /// Read-only or read-write.
    pub access: Access,
    /// What the root is for.
    pub kind: RootKind,
    /// `None`: the whole tree; `Some(files)`: only these canonical files.
    pub grants: Option<Vec<PathBuf>>,
}

/// What the backend may touch, computed once per backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Every grant, in a stable order (host defaults, workspace, spec roots, spill).
    pub grants: Vec<Grant>,
    /// Secrets the host defaults carved out (`/etc/shadow`, `~/.cargo/credentials.toml`, …):
    /// denied to both layers even where a broader grant would cover them.
    pub host_denied: Vec<PathBuf>,
    /// Environment of the toolchains (`PATH`, `CARGO_HOME`, …).
    pub toolchain_env: Vec<(OsString, OsString)>,
    /// Host Unix sockets the spec allows with the network on, `~` expanded.
    pub unix_sockets: Vec<PathBuf>,
}

/// The inputs of [`Layout::compute`].
pub(crate) struct LayoutInputs<'a> {
    /// Canonical workspace root.
    pub workspace: &'a Path,
    /// The workspace as configured (for its alias).
    pub workspace_alias: Option<PathBuf>,
    /// The spec.
    pub spec: &'a SandboxSpec,
    /// Home directory for `~` (and the toolchains).
    pub home: Option<&'a Path>,
    /// Canonical spill directory.
    pub spill: &'a Path,
    /// Host defaults (system dirs, `/etc` minus secrets, toolchains).
    pub defaults: HostDefaults,
}

impl Layout {
    /// Resolve every tree to its canonical form; trees that do not exist are skipped (they
    /// grant nothing).
    pub fn compute(inputs: LayoutInputs<'_>) -> Result<Layout, LocalError> {
        let LayoutInputs {
            workspace,
            workspace_alias,
            spec,
            home,
            spill,
            defaults,
        } = inputs;
        let HostDefaults {
            read_exec,
            read,
            env,
            denied,
        } = defaults;
        let mut grants = Vec::new();
        let mut parents = CanonicalParents::default();
        for path in read_exec {
            push_default(&mut grants, &mut parents, &path, true);
        }
        for path in read {
            push_default(&mut grants, &mut parents, &path, false);
        }
        let workspace_access = match spec.workspace {
            RootAccess::ReadOnly => Access::ReadOnly,
            RootAccess::ReadWrite => Access::ReadWrite,
        };
        grants.push(Grant {
            path: workspace.to_path_buf(),
            alias: workspace_alias,
            access: workspace_access,
            kind: RootKind::Workspace,
            is_dir: true,
            exec: true,
        });
        let extra = spec
            .readable_roots
            .iter()
            .map(|r| (r, Access::ReadOnly))
            .chain(spec.writable_roots.iter().map(|r| (r, Access::ReadWrite)));
        for (configured, access) in extra {
            let path = expand_root(configured, workspace, home);
            let alias = Some(cordon_ops::paths::normalize_lexically(&path));
            push_existing(&mut grants, &path, alias, access, true)?;
        }
        grants.push(Grant {
            path: spill.to_path_buf(),
            alias: None,
            access: Access::ReadOnly,
            kind: RootKind::Spill,
            is_dir: true,
            exec: false,
        });
        let mut host_denied: Vec<PathBuf> = denied
            .into_iter()
            .filter_map(|path| path.canonicalize().ok())
            .collect();
        host_denied.sort();
        host_denied.dedup();
        let unix_sockets = spec
            .unix_sockets
            .iter()
            .map(|configured| expand_root(configured, workspace, home))
            .collect();
        Ok(Layout {
            grants,
            host_denied,
            toolchain_env: env,
            unix_sockets,
        })
    }

    /// The command sandbox's configuration: the same trees, plus the spec's network mode,
    /// limits and environment. The session directory (private `TMPDIR`, `HOME`, `/dev/shm`)
    /// goes under `session_parent`. Protected and denied paths start empty: the backend sets
    /// them from the expanded globs before each command.
    pub fn sandbox_config(&self, spec: &SandboxSpec, session_parent: &Path) -> SandboxConfig {
        let mut read_exec = Vec::new();
        let mut read = Vec::new();
        let mut write = Vec::new();
        for grant in &self.grants {
            match (grant.access, grant.exec) {
                (Access::ReadWrite, _) => write.push(grant.path.clone()),
                (Access::ReadOnly, true) => read_exec.push(grant.path.clone()),
                (Access::ReadOnly, false) => read.push(grant.path.clone()),
            }
        }
        let mut env = self.toolchain_env.clone();
        // Output goes to a model, not a terminal: ask programs for plain text.
        env.push(("TERM".into(), "dumb".into()));
        match spec.network {
            // The egress proxy is the only way out; the spec's own entries may still add to
            // NO_PROXY and the like.
            NetworkMode::Filtered => env.extend(crate::egress::proxy_env()),
            NetworkMode::Disabled | NetworkMode::Enabled => {}
        }
        for name in &spec.env.pass {
            if let Some(value) = std::env::var_os(name) {
                env.push((name.into(), value));
            }
        }
        for (name, value) in &spec.env.set {
            env.push((name.into(), value.into()));
        }
        let limits = &spec.limits;
        SandboxConfig {
            read_exec,
            read,
            write,
            protected: Vec::new(),
            denied: Vec::new(),
            network: match spec.network {
                NetworkMode::Disabled => NetworkAccess::Off,
                NetworkMode::Enabled => NetworkAccess::On,
                NetworkMode::Filtered => NetworkAccess::Filtered,
            },
            unix_sockets: self.unix_sockets.clone(),
            limits: Rlimits {
                processes: limits.pids,
                memory_bytes: limits.memory_bytes,
                file_size_bytes: limits.file_size_bytes,
                open_files: limits.open_files,
                cpu_time_secs: limits.cpu_time_secs,
            },
            env,
            session_parent: Some(session_parent.to_path_buf()),
            session_dir: None,
            allow_degraded: spec.allow_degraded,
            profile: cordon_sandbox::Profile::Host,
        }
    }

    /// The file operations' roots: each granted directory, and for granted files their
    /// directory as an anchor restricted to them. `extra_write` adds writable trees that
    /// exist only once the command sandbox is prepared (its `TMPDIR` and `HOME`).
    pub fn file_roots(&self, extra_write: &[PathBuf]) -> Vec<RootSpec> {
        let mut roots: Vec<RootSpec> = Vec::new();
        let extra = extra_write.iter().map(|path| Grant {
            path: path.clone(),
            alias: None,
            access: Access::ReadWrite,
            kind: RootKind::Extra,
            is_dir: true,
            exec: true,
        });
        for grant in self.grants.iter().cloned().chain(extra) {
            if grant.is_dir {
                roots.push(RootSpec {
                    path: grant.path,
                    alias: grant.alias,
                    access: grant.access,
                    kind: grant.kind,
                    grants: None,
                });
                continue;
            }
            let Some(parent) = grant.path.parent() else {
                continue;
            };
            match roots
                .iter_mut()
                .find(|root| root.path == parent && root.grants.is_some())
            {
                Some(anchor) => {
                    if let Some(files) = anchor.grants.as_mut() {
                        files.push(grant.path);
                    }
                }
                None => roots.push(RootSpec {
                    path: parent.to_path_buf(),
                    alias: None,
                    access: Access::ReadOnly,
                    kind: grant.kind,
                    grants: Some(vec![grant.path]),
                }),
            }
        }
        roots
    }

    /// Every granted tree and file, canonical (how far commands can see, which bounds the
    /// glob expansion).
    pub fn readable_trees(&self) -> impl Iterator<Item = &Path> {
        self.grants.iter().map(|grant| grant.path.as_path())
    }
}

/// Canonical forms of the directories host defaults live in (`/etc`, `~/.cargo`, …), each
/// resolved once: a default that is not a symlink is then canonical as its canonical parent
/// plus its name, for one `lstat` instead of a full `realpath` and a `stat`. There are a few
/// hundred defaults (mostly `/etc` entries), so this is most of a backend's start-up I/O.
#[derive(Default)]
struct CanonicalParents {
    known: Vec<(PathBuf, Option<PathBuf>)>,
}

impl CanonicalParents {
    fn of(&mut self, parent: &Path) -> Option<&Path> {
        let index = match self.known.iter().position(|(path, _)| path == parent) {
            Some(index) => index,
            None => {
                let canonical = std::fs::canonicalize(parent).ok();
                self.known.push((parent.to_path_buf(), canonical));
                self.known.len() - 1
            }
        };
        self.known[index].1.as_deref()
    }
}

/// Push a host default (read-only; `exec` as given) when it exists: through its canonical
/// parent when it is not a symlink, else by full resolution. A default that cannot be
/// inspected grants nothing.
fn push_default(grants: &mut Vec<Grant>, parents: &mut CanonicalParents, path: &Path, exec: bool) {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        // A default that cannot be inspected grants nothing (see above).
        let _ = push_existing(grants, path, None, Access::ReadOnly, exec);
        return;
    };
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.file_type().is_symlink() {
        // Its target is resolved there; an unresolvable one grants nothing.
        let _ = push_existing(grants, path, None, Access::ReadOnly, exec);
        return;
    }
    let Some(canonical_parent) = parents.of(parent) else {
        return;
    };
    grants.push(Grant {
        path: canonical_parent.join(name),
        alias: None,
        access: Access::ReadOnly,
        kind: RootKind::Extra,
        is_dir: meta.is_dir(),
        exec,
    });
}

/// Push the canonical form of `path` when it exists.
fn push_existing(
    grants: &mut Vec<Grant>,
    path: &Path,
    alias: Option<PathBuf>,
    access: Access,
    exec: bool,
) -> Result<(), LocalError> {
    let canonical = match std::fs::canonicalize(path) {
        Ok(canonical) => canonical,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(LocalError::OpenExtraRoot {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let meta = std::fs::metadata(&canonical).map_err(|source| LocalError::OpenExtraRoot {
        path: path.to_path_buf(),
        source,
    })?;
    let alias = alias.filter(|alias| *alias != canonical);
    grants.push(Grant {
        path: canonical,
        alias,
        access,
        kind: RootKind::Extra,
        is_dir: meta.is_dir(),
        exec: exec || access == Access::ReadWrite,
    });
    Ok(())
}

/// `~/…` against the home, relative against the workspace root.
pub(crate) fn expand_root(configured: &str, workspace: &Path, home: Option<&Path>) -> PathBuf {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_resolved_through_their_parent_match_full_resolution() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::create_dir(base.join("real")).unwrap();
        std::fs::write(base.join("real/file"), "x").unwrap();
        std::fs::create_dir(base.join("real/sub")).unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("linked-dir")).unwrap();
        std::os::unix::fs::symlink("file", base.join("real/link-to-file")).unwrap();
        std::os::unix::fs::symlink("missing", base.join("real/dangling")).unwrap();
        let mut paths: Vec<PathBuf> =
            ["real/file", "real/sub", "linked-dir/file", "linked-dir/sub"]
                .iter()
                .chain(&[
                    "real/link-to-file",
                    "real/dangling",
                    "real/absent",
                    "linked-dir",
                ])
                .map(|rel| base.join(rel))
                .collect();
        // And every default of this host.
        let defaults = cordon_sandbox::host_defaults();
        paths.extend(defaults.read_exec.iter().chain(&defaults.read).cloned());
        let (mut fast, mut slow) = (Vec::new(), Vec::new());
        let mut parents = CanonicalParents::default();
        for path in &paths {
            push_default(&mut fast, &mut parents, path, true);
            let _ = push_existing(&mut slow, path, None, Access::ReadOnly, true);
        }
        assert_eq!(fast, slow);
        assert!(fast.len() >= 5, "{fast:?}");
    }

    fn grant(path: &str, access: Access, is_dir: bool) -> Grant {
        Grant {
            path: PathBuf::from(path),
            alias: None,
            access,
            kind: RootKind::Extra,
            is_dir,
            exec: true,
        }
    }

    fn layout(grants: Vec<Grant>) -> Layout {
        Layout {
            grants,
            host_denied: Vec::new(),
            toolchain_env: Vec::new(),
            unix_sockets: vec![PathBuf::from("/run/app.sock")],
        }
    }

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

    #[test]
    fn granted_files_share_one_read_only_anchor_per_directory() {
        let layout = layout(vec![
            grant("/usr", Access::ReadOnly, true),
            grant("/etc/passwd", Access::ReadOnly, false),
            grant("/etc/apt", Access::ReadOnly, true),
            grant("/etc/hosts", Access::ReadOnly, false),
            grant("/w/notes.txt", Access::ReadWrite, false),
        ]);
        let roots = layout.file_roots(&[PathBuf::from("/s/tmp")]);
        let summary: Vec<(&str, Access, Option<Vec<&str>>)> = roots
            .iter()
            .map(|root| {
                (
                    root.path.to_str().unwrap(),
                    root.access,
                    root.grants
                        .as_ref()
                        .map(|g| g.iter().map(|p| p.to_str().unwrap()).collect()),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("/usr", Access::ReadOnly, None),
                (
                    "/etc",
                    Access::ReadOnly,
                    Some(vec!["/etc/passwd", "/etc/hosts"])
                ),
                ("/etc/apt", Access::ReadOnly, None),
                ("/w", Access::ReadOnly, Some(vec!["/w/notes.txt"])),
                ("/s/tmp", Access::ReadWrite, None),
            ]
        );
    }

    #[test]
    fn sandbox_config_splits_the_same_grants_by_access() {
        let mut spill = grant("/state/spill", Access::ReadOnly, true);
        spill.exec = false;
        spill.kind = RootKind::Spill;
        let layout = layout(vec![
            grant("/usr", Access::ReadOnly, true),
            grant("/etc/passwd", Access::ReadOnly, false),
            grant("/ws", Access::ReadWrite, true),
            spill,
        ]);
        let spec = SandboxSpec {
            env: cordon_core::sandbox::EnvSpec {
                pass: vec![],
                set: vec![("A".into(), "1".into())],
            },
            ..SandboxSpec::default()
        };
        let config = layout.sandbox_config(&spec, Path::new("/state/tmp"));
        assert_eq!(
            config.read_exec,
            vec![PathBuf::from("/usr"), PathBuf::from("/etc/passwd")]
        );
        assert_eq!(config.read, vec![PathBuf::from("/state/spill")]);
        assert_eq!(config.write, vec![PathBuf::from("/ws")]);
        assert_eq!(config.network, NetworkAccess::Off);
        assert_eq!(config.unix_sockets, vec![PathBuf::from("/run/app.sock")]);
        assert_eq!(config.limits.processes, Some(512));
        assert_eq!(config.session_parent, Some(PathBuf::from("/state/tmp")));
        assert_eq!(
            config.env,
            vec![("TERM".into(), "dumb".into()), ("A".into(), "1".into())]
        );
        assert!(!config.allow_degraded);
    }

    #[test]
    fn filtered_network_gets_its_own_namespace_and_the_proxy_environment() {
        let layout = layout(vec![grant("/ws", Access::ReadWrite, true)]);
        let spec = SandboxSpec {
            network: NetworkMode::Filtered,
            env: cordon_core::sandbox::EnvSpec {
                pass: vec![],
                set: vec![("NO_PROXY".into(), "localhost,internal.test".into())],
            },
            ..SandboxSpec::default()
        };
        let config = layout.sandbox_config(&spec, Path::new("/state/tmp"));
        assert_eq!(config.network, NetworkAccess::Filtered);
        let mut expected: Vec<(std::ffi::OsString, std::ffi::OsString)> =
            vec![("TERM".into(), "dumb".into())];
        expected.extend(crate::egress::proxy_env());
        // The spec's own entries come last, so they win when the sandbox merges them.
        expected.push(("NO_PROXY".into(), "localhost,internal.test".into()));
        assert_eq!(config.env, expected);
        for mode in [NetworkMode::Disabled, NetworkMode::Enabled] {
            let spec = SandboxSpec {
                network: mode,
                ..SandboxSpec::default()
            };
            let config = layout.sandbox_config(&spec, Path::new("/state/tmp"));
            assert!(
                !config.env.iter().any(|(name, _)| name == "HTTP_PROXY"),
                "{mode:?}"
            );
        }
    }
}
