//! Protected and denied paths without a mount namespace (the container profile): Landlock
//! cannot take rights away below a rule, so the rules above such a path are carved instead.
//! A rule whose tree holds a protected or denied path is replaced by:
//!
//! - on each directory between the rule's path and the excluded path (a "spine"
//!   directory), only the rights that cannot change the protected path or read the denied
//!   one ([`ABOVE_PROTECTED`], [`ABOVE_DENIED`]) — they reach everything below;
//! - on every other entry of a spine directory (directories and regular files, found by
//!   listing it), the rule's own rights, one rule per entry;
//! - on a protected path itself, [`PROTECTED`] (read, list, execute); on a denied path,
//!   nothing.
//!
//! What it costs: in a spine directory commands can read, list and run what is there and
//! change the entries that existed when the command started, but not create, remove or
//! rename entries (creating one would reach into a protected directory below, removing one
//! would let a protected file be replaced). The names inside a denied directory stay
//! listable (its contents are not readable). An excluded path that is already read-only by a
//! mount (protected on a read-only mount; denied behind an empty read-only mount or
//! `/dev/null`: what the container's own masks are) needs none of this and is skipped, as is
//! one that does not exist (nothing to protect: a command may create it, and the next
//! command's expansion sees it).
//!
//! The listing is bounded ([`MAX_LISTED`] entries per command); more is an error, never a
//! weaker rule set. Every path is opened without following symlinks (a command may swap a
//! directory for a symlink at any time): an entry that turned into a symlink gets no rule.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::landlock::{EXECUTE, PathRule, READ_DIR, READ_FILE};
use super::sys;
use crate::error::SandboxError;

/// Rights kept on a protected path: read, list and run it; nothing that changes it.
pub(crate) const PROTECTED: u64 = READ_FILE | READ_DIR | EXECUTE;
/// Rights kept on a directory above a protected path: the same as on the path itself (they
/// reach it); creating, removing or renaming entries would reach into or replace it.
pub(crate) const ABOVE_PROTECTED: u64 = READ_FILE | READ_DIR | EXECUTE;
/// Rights kept on a directory above a denied path: listing only (reading or running files
/// would reach the denied one); the entries beside it keep their rights one by one.
pub(crate) const ABOVE_DENIED: u64 = READ_DIR;

/// Most directory entries listed to carve the rules for one command.
pub(crate) const MAX_LISTED: usize = 16_384;

/// Why a path is carved out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exclusion {
    /// Read-only.
    Protected,
    /// Neither readable nor writable.
    Denied,
}

/// One entry of a spine directory, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Its path.
    pub path: PathBuf,
    /// A directory or regular file (anything else gets no rule).
    pub ruled: bool,
}

/// The excluded paths that still need carving: the protected ones that exist and are not on a
/// read-only mount, the denied ones that exist and are not already a mask (`/dev/null`, or an
/// empty directory on a read-only mount).
pub(crate) fn needing_carve(
    protected: &[PathBuf],
    denied: &[PathBuf],
) -> Vec<(PathBuf, Exclusion)> {
    let mut out = Vec::new();
    for path in protected {
        match open_exact(path) {
            Ok(fd) if sys::on_read_only_mount(&fd).unwrap_or(false) => {}
            Ok(_) => out.push((path.clone(), Exclusion::Protected)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            // Unreadable metadata: carve (the stricter choice).
            Err(_) => out.push((path.clone(), Exclusion::Protected)),
        }
    }
    for path in denied {
        match open_exact(path) {
            Ok(fd) if is_mask(&fd) => {}
            Ok(_) => out.push((path.clone(), Exclusion::Denied)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(_) => out.push((path.clone(), Exclusion::Denied)),
        }
    }
    out
}

/// `/dev/null` (a file mask) or an empty directory on a read-only mount (a directory mask).
fn is_mask(fd: &OwnedFd) -> bool {
    const DEV_NULL: libc::dev_t = libc::makedev(1, 3);
    match sys::fstat_kind(fd) {
        Ok((libc::S_IFCHR, rdev)) => rdev == DEV_NULL,
        Ok((libc::S_IFDIR, _)) => {
            sys::on_read_only_mount(fd).unwrap_or(false)
                && read_dir_of(fd).is_ok_and(|mut entries| entries.next().is_none())
        }
        Ok(_) | Err(_) => false,
    }
}

/// Open `path` with `O_PATH` and no symlink anywhere on the way (the last component
/// included, which is then opened itself).
pub(crate) fn open_exact(path: &Path) -> io::Result<OwnedFd> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    sys::open_no_symlinks(None, &c_path, libc::O_PATH | libc::O_NOFOLLOW)
}

/// The directory `fd` refers to, listed through its `/proc/self/fd` link (so the directory
/// listed is the one opened, whatever a command renamed or swapped since).
fn read_dir_of(fd: &OwnedFd) -> io::Result<std::fs::ReadDir> {
    std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// List a spine directory: its entries, each a directory or regular file or not (never
/// following a symlink, the directory itself included). At most [`MAX_LISTED`] + 1 entries
/// are read, enough for [`carve`] to refuse a directory past the bound without holding all
/// of a huge one in memory.
pub(crate) fn list_dir(dir: &Path) -> io::Result<Vec<Listed>> {
    let fd = open_exact(dir)?;
    let mut out = Vec::new();
    for entry in read_dir_of(&fd)?.take(MAX_LISTED + 1) {
        let entry = entry?;
        let kind = entry.file_type()?;
        out.push(Listed {
            path: dir.join(entry.file_name()),
            ruled: kind.is_dir() || kind.is_file(),
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The rules with `excluded` carved out (see the module docs); `list` lists a spine
/// directory. Rules untouched by any exclusion are kept as they are.
///
/// # Errors
/// [`SandboxError::CarveTooLarge`] past [`MAX_LISTED`] listed entries;
/// [`SandboxError::OpenPath`] when a spine directory cannot be listed.
pub(crate) fn carve(
    rules: &[PathRule],
    excluded: &[(PathBuf, Exclusion)],
    list: &mut dyn FnMut(&Path) -> io::Result<Vec<Listed>>,
) -> Result<Vec<PathRule>, SandboxError> {
    let mut out = Vec::new();
    let mut listed = 0usize;
    for rule in rules {
        let below: Vec<&(PathBuf, Exclusion)> = excluded
            .iter()
            .filter(|(path, _)| path.starts_with(&rule.path))
            .collect();
        if below.is_empty() {
            out.push(rule.clone());
            continue;
        }
        if below
            .iter()
            .any(|(path, kind)| *path == rule.path && *kind == Exclusion::Denied)
        {
            // Nothing below a denied path is granted by this rule.
            continue;
        }
        // The rights kept on each carved node: a spine directory (listed) or a protected
        // path (a leaf unless it is a spine too).
        let mut nodes: BTreeMap<PathBuf, (u64, bool)> = BTreeMap::new();
        for (path, kind) in &below {
            if *kind == Exclusion::Protected {
                let node = nodes.entry(path.clone()).or_insert((rule.keep, false));
                node.0 &= PROTECTED;
            }
            let above = match kind {
                Exclusion::Protected => ABOVE_PROTECTED,
                Exclusion::Denied => ABOVE_DENIED,
            };
            let mut dir = path.parent();
            while let Some(spine) = dir.filter(|dir| dir.starts_with(&rule.path)) {
                let node = nodes
                    .entry(spine.to_path_buf())
                    .or_insert((rule.keep, false));
                node.0 &= above;
                node.1 = true;
                dir = spine.parent();
            }
        }
        let denied: Vec<&PathBuf> = below
            .iter()
            .filter(|(_, kind)| *kind == Exclusion::Denied)
            .map(|(path, _)| path)
            .collect();
        for (path, (keep, spine)) in &nodes {
            out.push(PathRule {
                path: path.clone(),
                access: rule.access,
                keep: *keep,
                listed: path != &rule.path,
            });
            if !spine {
                continue;
            }
            let entries = list(path).map_err(|source| SandboxError::OpenPath {
                path: path.clone(),
                source,
            })?;
            listed = listed.saturating_add(entries.len());
            if listed > MAX_LISTED {
                return Err(SandboxError::CarveTooLarge {
                    path: path.clone(),
                    limit: MAX_LISTED,
                });
            }
            // The rule's rights, less what a protected path at or above this one keeps.
            let inherited = below
                .iter()
                .filter(|(other, kind)| *kind == Exclusion::Protected && path.starts_with(other))
                .fold(rule.keep, |keep, _| keep & PROTECTED);
            for entry in entries {
                if !entry.ruled || nodes.contains_key(&entry.path) || denied.contains(&&entry.path)
                {
                    continue;
                }
                out.push(PathRule {
                    path: entry.path,
                    access: rule.access,
                    keep: inherited,
                    listed: true,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::landlock::{ALL_RIGHTS, Access};

    #[test]
    fn a_spine_directory_swapped_for_a_symlink_is_not_listed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("target");
        std::fs::create_dir(&target).expect("dir");
        std::fs::write(target.join("inside"), "x").expect("file");
        let link = dir.path().join("spine");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(list_dir(&link).is_err(), "a symlinked spine was listed");
        let listed = list_dir(&target).expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].path, target.join("inside"));
    }

    #[test]
    fn a_huge_spine_directory_is_read_only_up_to_the_bound() {
        let dir = tempfile::tempdir().expect("temp dir");
        for i in 0..MAX_LISTED + 20 {
            std::fs::File::create(dir.path().join(i.to_string())).expect("file");
        }
        assert_eq!(list_dir(dir.path()).expect("list").len(), MAX_LISTED + 1);
    }

    fn rule(path: &str, access: Access) -> PathRule {
        PathRule {
            path: PathBuf::from(path),
            access,
            keep: ALL_RIGHTS,
            listed: false,
        }
    }

    fn carved(path: &str, access: Access, keep: u64) -> PathRule {
        PathRule {
            path: PathBuf::from(path),
            access,
            keep,
            listed: true,
        }
    }

    /// A fixed tree: `/w` holds `a.txt`, `src/` and `.git/`; `/w/src` holds `x.pem` and
    /// `lib.rs`; a symlink `/w/link`.
    fn tree(dir: &Path) -> io::Result<Vec<Listed>> {
        let entry = |path: &str, ruled: bool| Listed {
            path: PathBuf::from(path),
            ruled,
        };
        match dir.to_str() {
            Some("/w") => Ok(vec![
                entry("/w/.git", true),
                entry("/w/a.txt", true),
                entry("/w/link", false),
                entry("/w/src", true),
            ]),
            Some("/w/src") => Ok(vec![
                entry("/w/src/lib.rs", true),
                entry("/w/src/x.pem", true),
            ]),
            _ => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    #[test]
    fn rules_without_exclusions_below_them_are_kept_whole() {
        let rules = vec![rule("/usr", Access::ReadExec), rule("/w", Access::Write)];
        let excluded = vec![(PathBuf::from("/etc/shadow"), Exclusion::Denied)];
        assert_eq!(carve(&rules, &excluded, &mut tree).unwrap(), rules);
    }

    #[test]
    fn a_protected_directory_leaves_read_only_spines_and_full_siblings() {
        let rules = vec![rule("/w", Access::Write)];
        let excluded = vec![(PathBuf::from("/w/.git"), Exclusion::Protected)];
        assert_eq!(
            carve(&rules, &excluded, &mut tree).unwrap(),
            vec![
                carved("/w", Access::Write, ABOVE_PROTECTED),
                carved("/w/a.txt", Access::Write, ALL_RIGHTS),
                carved("/w/src", Access::Write, ALL_RIGHTS),
                carved("/w/.git", Access::Write, PROTECTED),
            ]
            .into_iter()
            .map(|mut rule| {
                // The rule's own path keeps its original origin.
                rule.listed = rule.path != Path::new("/w");
                rule
            })
            .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_denied_file_deeper_down_leaves_listing_only_spines() {
        let rules = vec![rule("/w", Access::Write)];
        let excluded = vec![(PathBuf::from("/w/src/x.pem"), Exclusion::Denied)];
        let mut got = carve(&rules, &excluded, &mut tree).unwrap();
        got.sort_by(|a, b| a.path.cmp(&b.path));
        let mut root = carved("/w", Access::Write, ABOVE_DENIED);
        root.listed = false;
        assert_eq!(
            got,
            vec![
                root,
                carved("/w/.git", Access::Write, ALL_RIGHTS),
                carved("/w/a.txt", Access::Write, ALL_RIGHTS),
                carved("/w/src", Access::Write, ABOVE_DENIED),
                carved("/w/src/lib.rs", Access::Write, ALL_RIGHTS),
            ]
        );
    }

    #[test]
    fn a_denied_root_grants_nothing_and_a_protected_root_reads_only() {
        let rules = vec![rule("/w", Access::Write)];
        let denied = vec![(PathBuf::from("/w"), Exclusion::Denied)];
        assert_eq!(carve(&rules, &denied, &mut tree).unwrap(), vec![]);
        let protected = vec![(PathBuf::from("/w"), Exclusion::Protected)];
        let mut root = rule("/w", Access::Write);
        root.keep = PROTECTED;
        assert_eq!(carve(&rules, &protected, &mut tree).unwrap(), vec![root]);
    }

    #[test]
    fn a_denied_path_under_a_protected_one_is_carved_from_it_too() {
        let rules = vec![rule("/w", Access::Write)];
        let excluded = vec![
            (PathBuf::from("/w"), Exclusion::Protected),
            (PathBuf::from("/w/src/x.pem"), Exclusion::Denied),
        ];
        let mut got = carve(&rules, &excluded, &mut tree).unwrap();
        got.sort_by(|a, b| a.path.cmp(&b.path));
        let mut root = carved("/w", Access::Write, PROTECTED & ABOVE_DENIED);
        root.listed = false;
        assert_eq!(
            got,
            vec![
                root,
                carved("/w/.git", Access::Write, PROTECTED),
                carved("/w/a.txt", Access::Write, PROTECTED),
                carved("/w/src", Access::Write, ABOVE_DENIED),
                carved("/w/src/lib.rs", Access::Write, PROTECTED),
            ]
        );
    }

    #[test]
    fn listing_more_than_the_bound_fails_closed() {
        let rules = vec![rule("/w", Access::Write)];
        let excluded = vec![(PathBuf::from("/w/.git"), Exclusion::Protected)];
        let mut huge = |_: &Path| -> io::Result<Vec<Listed>> {
            Ok((0..=MAX_LISTED)
                .map(|i| Listed {
                    path: PathBuf::from(format!("/w/f{i}")),
                    ruled: true,
                })
                .collect())
        };
        assert!(matches!(
            carve(&rules, &excluded, &mut huge),
            Err(SandboxError::CarveTooLarge { .. })
        ));
    }

    #[test]
    fn the_kept_rights_change_nothing_below_them() {
        use crate::linux::landlock::{
            MAKE_DIR, MAKE_REG, MAKE_SYM, REFER, REMOVE_DIR, REMOVE_FILE, TRUNCATE, WRITE_FILE,
        };
        let changes = WRITE_FILE
            | TRUNCATE
            | MAKE_REG
            | MAKE_DIR
            | MAKE_SYM
            | REMOVE_FILE
            | REMOVE_DIR
            | REFER;
        for keep in [PROTECTED, ABOVE_PROTECTED, ABOVE_DENIED] {
            assert_eq!(keep & changes, 0);
        }
        assert_eq!(ABOVE_DENIED & (READ_FILE | EXECUTE), 0);
    }
}
