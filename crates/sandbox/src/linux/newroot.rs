//! The socket-free root of a sandbox with the network on.
//!
//! With the network off seccomp refuses `connect`, `bind` and `listen` on every socket, so no
//! host Unix socket is reachable. With the network on `connect` must work, and seccomp cannot
//! tell an `AF_UNIX` address from an IP one (the address is behind a pointer), nor can Landlock
//! (connecting to a pathname socket is not a Landlock access right; read-only mounts and
//! capability-less root do not stop it either). What does stop it is not seeing the socket:
//! connecting needs a path to its inode.
//!
//! So a networked init replaces its root with a fresh, read-only tmpfs that holds only what the
//! command may use: the trees of its Landlock rules (system directories, toolchains, read and
//! writable roots, the session directory), `/etc` whole (its secrets stay unreadable through
//! Landlock; it holds no sockets), a fresh `/proc`, the allowed device nodes and `/dev/shm`, the
//! symlinks on the way to each of them (`/lib` → `usr/lib`), and the host sockets the policy
//! names. Everything else — `/run`, `/var/run`, `/tmp`, other users' homes, the Docker
//! socket, `/dev/log` — does not exist inside. Abstract sockets are kept out by Landlock's
//! abstract-socket scope, which is therefore required with the network on.
//!
//! Planned here in the parent (allocating, looking at the filesystem); built by the init with
//! fd-based binds that never follow a symlink, before it pivots into it.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use crate::error::SandboxError;

/// Most symlinks followed while planning (a loop is an error, not a hang).
const MAX_SYMLINKS: usize = 256;

/// What one entry of the new root is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// An empty directory on the way to something visible.
    Dir,
    /// A symlink with the same target text as on the host.
    Symlink(CString),
    /// A host directory bound (with its submounts) onto an empty directory.
    BindDir,
    /// A host file, device node or socket bound onto an empty file.
    BindFile,
}

/// One step of building the new root, in order (parents first).
#[derive(Debug)]
pub(crate) struct RootStep {
    /// What to create.
    pub kind: EntryKind,
    /// The path as the sandbox sees it (and as the host has it).
    pub path: PathBuf,
    /// The host path, for binds (NUL-terminated).
    pub host: CString,
    /// Where it goes under the staging directory (NUL-terminated).
    pub target: CString,
}

/// What a planned root shows.
#[derive(Debug, Default)]
pub(crate) struct RootPlan {
    /// Steps in execution order.
    pub steps: Vec<RootStep>,
    /// The host sockets bound in (their identity must not change while an init serves).
    pub sockets: Vec<PathBuf>,
}

/// Inputs of [`plan`].
pub(crate) struct RootInputs<'a> {
    /// Trees and files the command may see (any form: symlinks on the way are recreated).
    pub visible: &'a [PathBuf],
    /// Host sockets the policy allows; anything at such a path that is not a socket is
    /// left out.
    pub sockets: &'a [PathBuf],
    /// Symlinks made inside the new root only (`/dev/fd` → `/proc/self/fd`).
    pub own_symlinks: &'a [(&'a str, &'a str)],
}

/// Plan the new root (see the module documentation).
pub(crate) fn plan(staging: &Path, inputs: &RootInputs<'_>) -> Result<RootPlan, SandboxError> {
    let RootInputs {
        visible,
        sockets,
        own_symlinks,
    } = inputs;
    let mut entries: BTreeMap<PathBuf, EntryKind> = BTreeMap::new();
    let mut queue: Vec<(PathBuf, bool)> = visible.iter().map(|p| (p.clone(), false)).collect();
    queue.extend(sockets.iter().map(|p| (p.clone(), true)));
    queue.reverse();
    let mut followed = 0usize;
    let mut bound_sockets = Vec::new();
    while let Some((path, socket)) = queue.pop() {
        if !path.is_absolute() {
            return Err(SandboxError::RelativePath { path });
        }
        let path = coarsen(&path);
        let mut prefix = PathBuf::from("/");
        let components: Vec<Component<'_>> = path.components().skip(1).collect();
        for (index, component) in components.iter().enumerate() {
            prefix.push(component);
            match entries.get(&prefix) {
                Some(EntryKind::BindDir | EntryKind::BindFile | EntryKind::Symlink(_)) => break,
                Some(EntryKind::Dir) | None => {}
            }
            let meta = match std::fs::symlink_metadata(&prefix) {
                Ok(meta) => meta,
                // Nothing to show (a socket whose server is not running, say).
                Err(error) if error.kind() == io::ErrorKind::NotFound => break,
                Err(source) => {
                    return Err(SandboxError::OpenPath {
                        path: prefix,
                        source,
                    });
                }
            };
            let last = index + 1 == components.len();
            if meta.file_type().is_symlink() {
                followed += 1;
                if followed > MAX_SYMLINKS {
                    return Err(SandboxError::OpenPath {
                        path: path.clone(),
                        source: io::Error::from_raw_os_error(libc::ELOOP),
                    });
                }
                let link =
                    std::fs::read_link(&prefix).map_err(|source| SandboxError::OpenPath {
                        path: prefix.clone(),
                        source,
                    })?;
                entries.insert(prefix.clone(), EntryKind::Symlink(c_path(&link)?));
                let resolved = match prefix.canonicalize() {
                    Ok(resolved) => resolved,
                    // A dangling symlink shows as itself, pointing nowhere.
                    Err(error) if error.kind() == io::ErrorKind::NotFound => break,
                    Err(source) => {
                        return Err(SandboxError::OpenPath {
                            path: prefix,
                            source,
                        });
                    }
                };
                let rest: PathBuf = components[index + 1..].iter().collect();
                queue.push((resolved.join(rest), socket));
                break;
            }
            if !last {
                if meta.is_dir() {
                    entries.entry(prefix.clone()).or_insert(EntryKind::Dir);
                    continue;
                }
                break;
            }
            if socket {
                // Anything else at an allowed socket's path stays out (fail closed): the
                // list grants connecting, not reading.
                if meta.file_type().is_socket() {
                    entries.insert(prefix.clone(), EntryKind::BindFile);
                    bound_sockets.push(prefix.clone());
                }
            } else if meta.is_dir() {
                entries.insert(prefix.clone(), EntryKind::BindDir);
            } else {
                entries.insert(prefix.clone(), EntryKind::BindFile);
            }
        }
    }
    for (path, target) in own_symlinks.iter() {
        let path = PathBuf::from(path);
        if let Some(parent) = path.parent() {
            for ancestor in parent.ancestors().filter(|a| *a != Path::new("/")) {
                entries
                    .entry(ancestor.to_path_buf())
                    .or_insert(EntryKind::Dir);
            }
        }
        entries.insert(path, EntryKind::Symlink(c_path(Path::new(target))?));
    }
    // Whatever lies under a bind or a symlink comes with it.
    let covering: Vec<PathBuf> = entries
        .iter()
        .filter(|(_, kind)| !matches!(kind, EntryKind::Dir))
        .map(|(path, _)| path.clone())
        .collect();
    entries.retain(|path, _| {
        !covering
            .iter()
            .any(|outer| path != outer && path.starts_with(outer))
    });
    let mut steps = Vec::with_capacity(entries.len());
    for (path, kind) in entries {
        let relative = path.strip_prefix("/").unwrap_or(&path);
        let target = staging.join(relative);
        steps.push(RootStep {
            kind,
            host: c_path(&path)?,
            target: c_path(&target)?,
            path,
        });
    }
    bound_sockets.retain(|socket| {
        steps
            .iter()
            .any(|step| step.path == *socket && step.kind == EntryKind::BindFile)
    });
    Ok(RootPlan {
        steps,
        sockets: bound_sockets,
    })
}

/// `/etc` is shown whole: its entries are granted one by one (to carve out secrets), which
/// would otherwise be one bind each; Landlock keeps the secrets unreadable.
fn coarsen(path: &Path) -> PathBuf {
    if path.starts_with("/etc") {
        PathBuf::from("/etc")
    } else {
        path.to_path_buf()
    }
}

fn c_path(path: &Path) -> Result<CString, SandboxError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| SandboxError::NulByte {
        what: "sandbox path",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(plan: &RootPlan, staging: &Path) -> Vec<(String, EntryKind)> {
        plan.steps
            .iter()
            .map(|step| {
                let target = PathBuf::from(std::ffi::OsStr::from_bytes(step.target.as_bytes()));
                assert_eq!(
                    target,
                    staging.join(step.path.strip_prefix("/").unwrap()),
                    "target of {}",
                    step.path.display()
                );
                (step.path.display().to_string(), step.kind.clone())
            })
            .collect()
    }

    #[test]
    fn shows_only_visible_trees_their_parents_symlinks_and_allowed_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let staging = base.join("staging");
        std::fs::create_dir_all(base.join("real/sub")).unwrap();
        std::fs::create_dir_all(base.join("other")).unwrap();
        std::os::unix::fs::symlink("real", base.join("link")).unwrap();
        std::fs::write(base.join("real/file"), "x").unwrap();
        std::fs::write(base.join("not-a-socket"), "x").unwrap();
        let listener = std::os::unix::net::UnixListener::bind(base.join("other/s.sock")).unwrap();
        let _ = std::os::unix::net::UnixListener::bind(base.join("other/hidden.sock")).unwrap();
        let plan = plan(
            &staging,
            &RootInputs {
                visible: &[
                    base.join("link/sub"),
                    base.join("real/file"),
                    base.join("missing/x"),
                ],
                sockets: &[base.join("other/s.sock"), base.join("not-a-socket")],
                own_symlinks: &[("/dev/fd", "/proc/self/fd")],
            },
        )
        .unwrap();
        drop(listener);
        let b = base.display().to_string();
        let mut expected: Vec<(String, EntryKind)> = Vec::new();
        for ancestor in base.ancestors().filter(|a| *a != Path::new("/")) {
            expected.push((ancestor.display().to_string(), EntryKind::Dir));
        }
        expected.extend([
            ("/dev".to_owned(), EntryKind::Dir),
            (
                "/dev/fd".to_owned(),
                EntryKind::Symlink(c"/proc/self/fd".to_owned()),
            ),
            (format!("{b}/link"), EntryKind::Symlink(c"real".to_owned())),
            (format!("{b}/other"), EntryKind::Dir),
            (format!("{b}/other/s.sock"), EntryKind::BindFile),
            (format!("{b}/real"), EntryKind::Dir),
            (format!("{b}/real/file"), EntryKind::BindFile),
            (format!("{b}/real/sub"), EntryKind::BindDir),
        ]);
        expected.sort_by(|a, b| PathBuf::from(&a.0).cmp(&PathBuf::from(&b.0)));
        assert_eq!(kinds(&plan, &staging), expected);
        assert_eq!(plan.sockets, vec![base.join("other/s.sock")]);
    }

    #[test]
    fn a_visible_tree_covers_what_is_below_it_and_etc_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("a/b/c")).unwrap();
        let plan = plan(
            Path::new("/staging"),
            &RootInputs {
                visible: &[
                    base.join("a/b/c"),
                    base.join("a"),
                    PathBuf::from("/etc/hostname"),
                ],
                sockets: &[],
                own_symlinks: &[],
            },
        )
        .unwrap();
        let shown: Vec<(PathBuf, EntryKind)> = plan
            .steps
            .iter()
            .filter(|step| step.kind != EntryKind::Dir)
            .map(|step| (step.path.clone(), step.kind.clone()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (PathBuf::from("/etc"), EntryKind::BindDir),
                (base.join("a"), EntryKind::BindDir),
            ]
        );
    }

    #[test]
    fn symlink_loops_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(base.join("b"), base.join("a")).unwrap();
        std::os::unix::fs::symlink(base.join("a"), base.join("b")).unwrap();
        // canonicalize refuses the loop: an error, never a hang.
        assert!(
            plan(
                Path::new("/staging"),
                &RootInputs {
                    visible: &[base.join("a/x")],
                    sockets: &[],
                    own_symlinks: &[],
                },
            )
            .is_err()
        );
    }
}
