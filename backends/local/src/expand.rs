//! Expanding the protected and denied patterns into the concrete paths the command sandbox
//! binds read-only or masks, before every command ([`Expander::expand`]).
//!
//! File operations judge each path against the patterns when they touch it; a command's
//! mounts are fixed when it starts, so the patterns are turned into paths right before each
//! spawn. Each pattern is split into a literal prefix and the rest:
//!
//! - fully literal patterns (`.git/**` → `.git`, `~/.ssh/**` → `/root/.ssh`) cost one
//!   `lstat`; a missing literal *protected* path is still passed on, so the sandbox pins a
//!   placeholder there and the command cannot create it;
//! - other patterns walk their prefix directory, as deep as the pattern reaches (`**` →
//!   unbounded), without following symlinks, and only inside (or towards) the trees commands
//!   can see at all. `dir/**` is expanded as `dir`: one mount covers everything below.
//!
//! The walk keeps, per directory, its identity and change time (`ctime`, which every
//! create, remove or rename of an entry updates and which no unprivileged call can set back)
//! with its subdirectories and matching entries. The next expansion re-reads only directories
//! whose change time moved, so on an unchanged tree it costs one `lstat` per directory.
//!
//! Covered: everything matching when the command starts, including files the host, git or an
//! earlier command created since the last command. Not covered: a path created *during* a
//! command that matches a wildcard pattern (e.g. a new `sub/.env`) is ordinary for the rest
//! of that command (it only holds what the command itself wrote); it is denied from the next
//! command on, and to file operations at once. A tree larger than [`MAX_ENTRIES`] entries
//! makes commands fail closed. A directory whose entries' paths reach `PATH_MAX` is denied
//! as a whole: nothing below it could be looked at or masked by path, so a secret there
//! would otherwise be readable.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::roots::PathRules;
use crate::stamp::{Stamp, settled, stamp_of};

/// Upper bound on directory entries one expansion may look at (fresh or cached).
pub(crate) const MAX_ENTRIES: usize = 2_000_000;

/// Paths of this many bytes or more cannot be opened, stat'ed or mounted by name
/// (`PATH_MAX`, counting the NUL).
const PATH_MAX_BYTES: usize = 4096;

/// The concrete paths for one command, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Expansion {
    /// Protected paths (existing matches, and literal patterns even when missing).
    pub protected: Vec<PathBuf>,
    /// Denied paths that exist.
    pub denied: Vec<PathBuf>,
}

/// Why an expansion failed (commands then fail closed).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExpandError {
    /// The walk needed more entries than [`MAX_ENTRIES`].
    #[error(
        "failed to expand the protected and denied patterns: more than {limit} entries under {base}; narrow the patterns or the workspace"
    )]
    TooLarge {
        /// Where the walk was.
        base: PathBuf,
        /// The limit.
        limit: usize,
    },
}

/// A directory walk: `base`, as deep as `depth` levels (`None`: unbounded).
#[derive(Clone, Debug, PartialEq, Eq)]
struct WalkJob {
    base: PathBuf,
    depth: Option<usize>,
}

/// A fully literal pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Literal {
    path: PathBuf,
    denied: bool,
}

/// What a directory held when it was last read.
#[derive(Debug)]
struct CachedDir {
    stamp: Stamp,
    /// Subdirectories (not symlinks), with whether each is itself protected / denied.
    subdirs: Vec<(OsString, bool, bool)>,
    /// Non-directory entries matching a pattern: `(name, protected, denied)`.
    matches: Vec<(OsString, bool, bool)>,
    /// Whether this listing may be reused while the stamp stays the same (`crate::stamp`).
    settled: bool,
}

/// Turns the backend's patterns into concrete paths, caching the walk between commands.
#[derive(Debug)]
pub(crate) struct Expander {
    rules: Arc<PathRules>,
    jobs: Vec<WalkJob>,
    literals: Vec<Literal>,
    reach: Vec<PathBuf>,
    cache: HashMap<PathBuf, CachedDir>,
    /// Entries the last expansion looked at (fresh or cached).
    last_entries: usize,
    /// Concrete paths protected on top of the patterns (the git metadata recorded at start),
    /// passed on while they exist.
    also_protected: Vec<PathBuf>,
    /// A tree whose paths are never passed on (a workspace that is only a copy).
    exempt: Option<PathBuf>,
}

/// One expansion's mutable state.
struct Walk<'a> {
    /// When this expansion began: listings are settled relative to it.
    started: std::time::SystemTime,
    rules: &'a PathRules,
    reach: &'a [PathBuf],
    old: HashMap<PathBuf, CachedDir>,
    new: HashMap<PathBuf, CachedDir>,
    out: Expansion,
    entries: usize,
}

/// Whether a pattern component needs matching (as opposed to a literal name).
fn is_glob_component(component: &str) -> bool {
    component.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

impl Expander {
    /// Plan the expansion of `rules`' patterns; walks never leave `reach` (the trees
    /// commands can see), except to get to them.
    pub fn new(rules: Arc<PathRules>, reach: Vec<PathBuf>) -> Expander {
        let mut jobs: Vec<WalkJob> = Vec::new();
        let mut literals: Vec<Literal> = Vec::new();
        for pattern in rules.patterns() {
            let text = pattern
                .text
                .strip_suffix("/**")
                .filter(|dir| !dir.is_empty())
                .unwrap_or(&pattern.text);
            let anchor = if pattern.absolute {
                PathBuf::from("/")
            } else {
                rules.workspace().to_path_buf()
            };
            let components: Vec<&str> = text.split('/').filter(|c| !c.is_empty()).collect();
            let literal_len = components
                .iter()
                .take_while(|c| !is_glob_component(c))
                .count();
            let mut base = anchor;
            for component in &components[..literal_len] {
                base.push(component);
            }
            let rest = &components[literal_len..];
            if rest.is_empty() {
                literals.push(Literal {
                    path: base,
                    denied: pattern.denied,
                });
            } else {
                let unbounded = rest.iter().any(|c| c.contains("**"));
                jobs.push(WalkJob {
                    base,
                    depth: (!unbounded).then_some(rest.len()),
                });
            }
        }
        for path in rules.denied_paths() {
            literals.push(Literal {
                path: path.clone(),
                denied: true,
            });
        }
        // What commands cannot see at all needs no mount: keep literals inside the reach and
        // walks inside or towards it.
        literals.retain(|literal| reach.iter().any(|tree| literal.path.starts_with(tree)));
        jobs.retain(|job| {
            reach
                .iter()
                .any(|tree| job.base.starts_with(tree) || tree.starts_with(&job.base))
        });
        Expander {
            rules,
            jobs: merge_jobs(jobs),
            literals,
            reach,
            cache: HashMap::new(),
            last_entries: usize::MAX,
            also_protected: Vec::new(),
            exempt: None,
        }
    }

    /// Pass on nothing under `tree` (and do not walk it): a copied workspace, whose
    /// protected and denied paths are kept out when it is copied back.
    pub fn exempt(&mut self, tree: &Path) {
        self.literals
            .retain(|literal| !literal.path.starts_with(tree));
        self.jobs.retain(|job| !job.base.starts_with(tree));
        self.reach.retain(|reach| !reach.starts_with(tree));
        self.exempt = Some(tree.to_path_buf());
    }

    /// Protect these concrete paths too, whenever they exist.
    pub fn protect_also(&mut self, paths: Vec<PathBuf>) {
        self.also_protected = paths;
    }

    /// Whether the last expansion was small (at most `entries` entries looked at, fresh or
    /// cached), so the next one is likely cheap too. False before the first expansion.
    pub fn was_small(&self, entries: usize) -> bool {
        self.last_entries <= entries
    }

    /// The concrete protected and denied paths now.
    ///
    /// # Errors
    /// [`ExpandError::TooLarge`] when the walk exceeds [`MAX_ENTRIES`].
    pub fn expand(&mut self) -> Result<Expansion, ExpandError> {
        let mut walk = Walk {
            started: std::time::SystemTime::now(),
            rules: &self.rules,
            reach: &self.reach,
            old: std::mem::take(&mut self.cache),
            new: HashMap::new(),
            out: Expansion::default(),
            entries: 0,
        };
        for literal in &self.literals {
            match std::fs::symlink_metadata(&literal.path) {
                Ok(_) if literal.denied => walk.out.denied.push(literal.path.clone()),
                Ok(_) => walk.out.protected.push(literal.path.clone()),
                Err(_) if !literal.denied => walk.out.protected.push(literal.path.clone()),
                Err(_) => {}
            }
        }
        for path in &self.also_protected {
            if std::fs::symlink_metadata(path).is_ok() {
                walk.out.protected.push(path.clone());
            }
        }
        let mut result = Ok(());
        for job in &self.jobs {
            // The workspace root (where the common `**/…` patterns start) is canonical
            // already; other bases may have a symlink on the way.
            let base = if job.base == self.rules.workspace() {
                job.base.clone()
            } else {
                let Ok(base) = job.base.canonicalize() else {
                    continue;
                };
                base
            };
            let inside = walk.reach.iter().any(|tree| within(&base, tree));
            let towards = walk.reach.iter().any(|tree| within(tree, &base));
            if !inside && !towards {
                continue;
            }
            result = walk.visit(&base, job.depth, !inside, false);
            if result.is_err() {
                break;
            }
        }
        let Walk {
            new,
            mut out,
            entries,
            ..
        } = walk;
        self.cache = new;
        self.last_entries = if result.is_ok() { entries } else { usize::MAX };
        result?;
        if let Some(tree) = &self.exempt {
            out.protected.retain(|path| !path.starts_with(tree));
            out.denied.retain(|path| !path.starts_with(tree));
        }
        out.protected.sort();
        out.protected.dedup();
        out.denied.sort();
        out.denied.dedup();
        Ok(out)
    }
}

/// Sort the jobs and drop those an unbounded job at or above them already covers.
fn merge_jobs(mut jobs: Vec<WalkJob>) -> Vec<WalkJob> {
    jobs.sort_by(|a, b| a.base.cmp(&b.base).then(b.depth.cmp(&a.depth)));
    let mut merged: Vec<WalkJob> = Vec::new();
    for job in jobs {
        let covered = merged.iter().any(|kept| {
            job.base.starts_with(&kept.base)
                && match (kept.depth, job.depth) {
                    (None, _) => true,
                    (Some(kept_depth), Some(depth)) => {
                        let below = job.base.components().count() - kept.base.components().count();
                        below + depth <= kept_depth
                    }
                    (Some(_), None) => false,
                }
        });
        if !covered {
            merged.push(job);
        }
    }
    merged
}

/// `path.starts_with(tree)` for canonical paths, compared as bytes (as the roots do): every
/// command checks each walked directory against every readable tree, a few hundred of them.
fn within(path: &Path, tree: &Path) -> bool {
    crate::roots::strip_root(path, tree, true).is_some()
}

impl Walk<'_> {
    /// Visit `dir` (canonical); `depth` levels of entries below it are examined.
    /// `check_reach`: descend only into directories within or towards the reach.
    /// `under_protected`: an ancestor is already protected (its mount covers this tree).
    fn visit(
        &mut self,
        dir: &Path,
        depth: Option<usize>,
        check_reach: bool,
        under_protected: bool,
    ) -> Result<(), ExpandError> {
        if depth == Some(0) {
            return Ok(());
        }
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            return Ok(());
        };
        if !meta.is_dir() {
            return Ok(());
        }
        let stamp = stamp_of(&meta);
        let cached = match self.old.remove(dir) {
            Some(cached) if cached.stamp == stamp && cached.settled => cached,
            _ => match self.read(dir, stamp) {
                Ok(mut fresh) => {
                    fresh.settled = settled(&fresh.stamp, self.started);
                    fresh
                }
                // Unreadable to Cordon: no less to the command, which runs with fewer rights.
                Err(_) => return Ok(()),
            },
        };
        self.entries += cached.subdirs.len() + cached.matches.len() + 1;
        if self.entries > MAX_ENTRIES {
            return Err(ExpandError::TooLarge {
                base: dir.to_path_buf(),
                limit: MAX_ENTRIES,
            });
        }
        if cached
            .matches
            .iter()
            .any(|(name, _, _)| dir.as_os_str().len() + 1 + name.len() >= PATH_MAX_BYTES)
        {
            self.out.denied.push(dir.to_path_buf());
        }
        for (name, protected, denied) in &cached.matches {
            if *denied {
                self.out.denied.push(dir.join(name));
            } else if *protected && !under_protected {
                self.out.protected.push(dir.join(name));
            }
        }
        let subdirs: Vec<(PathBuf, bool, bool)> = cached
            .subdirs
            .iter()
            .map(|(name, protected, denied)| (dir.join(name), *protected, *denied))
            .collect();
        self.new.insert(dir.to_path_buf(), cached);
        let next = depth.map(|d| d - 1);
        for (sub, protected, denied) in subdirs {
            if sub.as_os_str().len() >= PATH_MAX_BYTES {
                // Fail closed: below here nothing can be judged or masked by path.
                self.out.denied.push(dir.to_path_buf());
                break;
            }
            if denied {
                self.out.denied.push(sub);
                continue;
            }
            if protected && !under_protected {
                self.out.protected.push(sub.clone());
            }
            let mut check = check_reach;
            if check_reach {
                let inside = self.reach.iter().any(|tree| within(&sub, tree));
                let towards = self.reach.iter().any(|tree| within(tree, &sub));
                if !inside && !towards {
                    continue;
                }
                check = !inside;
            }
            self.visit(&sub, next, check, under_protected || protected)?;
        }
        Ok(())
    }

    /// Read a directory afresh.
    fn read(&mut self, dir: &Path, stamp: Stamp) -> io::Result<CachedDir> {
        let mut subdirs = Vec::new();
        let mut matches = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let Ok(entry) = entry else {
                continue;
            };
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            self.entries += 1;
            let path = entry.path();
            let (protected, denied) = self.rules.judge_entry(&path);
            if file_type.is_dir() {
                subdirs.push((entry.file_name(), protected, denied));
            } else if protected || denied {
                matches.push((entry.file_name(), protected, denied));
            }
        }
        subdirs.sort();
        matches.sort();
        Ok(CachedDir {
            stamp,
            subdirs,
            matches,
            settled: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_core::sandbox::SandboxSpec;

    fn expander(root: &Path, protected: &[&str], denied: &[&str]) -> Expander {
        let spec = SandboxSpec {
            protected: protected.iter().map(|s| s.to_string()).collect(),
            denied: denied.iter().map(|s| s.to_string()).collect(),
            ..SandboxSpec::default()
        };
        let rules = PathRules::new(&root.join("ws"), Some(&root.join("home")), &spec, vec![])
            .expect("rules");
        Expander::new(Arc::new(rules), vec![root.join("ws"), root.join("home")])
    }

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "x").unwrap();
    }

    #[test]
    fn a_directory_whose_entries_reach_path_max_is_denied_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let ws = root.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(root.join("home")).unwrap();
        // Build a chain deeper than PATH_MAX with relative steps (no single path call could).
        let component = "d".repeat(200);
        let status = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "set -e; for i in $(seq 1 25); do mkdir {component}; cd {component}; done"
            ))
            .current_dir(&ws)
            .status()
            .unwrap();
        assert!(status.success());
        let mut depth_path = ws.clone();
        let mut expected = None;
        for _ in 0..25 {
            let next = depth_path.join(&component);
            if next.as_os_str().len() >= PATH_MAX_BYTES && expected.is_none() {
                expected = Some(depth_path.clone());
            }
            depth_path = next;
        }
        let mut expander = expander(&root, &[], &["**/.env"]);
        let expansion = expander.expand().unwrap();
        assert_eq!(expansion.denied, vec![expected.unwrap()]);
    }

    /// A listing taken within the timestamp granularity of a change can miss it under an
    /// unchanged stamp: it is reused only once settled.
    #[test]
    fn a_cached_listing_is_reused_on_its_stamp_only_once_settled() {
        for settled in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().canonicalize().unwrap();
            let ws = root.join("ws");
            std::fs::create_dir_all(ws.join("sub")).unwrap();
            std::fs::create_dir_all(root.join("home")).unwrap();
            let mut expander = expander(&root, &[], &["**/.env"]);
            expander.expand().unwrap();
            touch(&ws.join("sub/.env"));
            let meta = std::fs::symlink_metadata(ws.join("sub")).unwrap();
            expander.cache.insert(
                ws.join("sub"),
                CachedDir {
                    stamp: stamp_of(&meta),
                    subdirs: Vec::new(),
                    matches: Vec::new(),
                    settled,
                },
            );
            let denied = expander.expand().unwrap().denied;
            if settled {
                assert!(
                    denied.is_empty(),
                    "a settled listing is trusted: {denied:?}"
                );
            } else {
                assert_eq!(
                    denied,
                    vec![ws.join("sub/.env")],
                    "an unsettled listing is read again"
                );
            }
        }
    }

    #[test]
    fn an_exempt_tree_passes_nothing_on_and_the_rest_still_expands() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        touch(&root.join("ws/policy.toml"));
        touch(&root.join("ws/sub/.env"));
        touch(&root.join("home/.env"));
        touch(&root.join("home/.ssh/id"));
        let patterns = (["policy.toml"], ["**/.env", "~/.env", "~/.ssh/**"]);
        let mut whole = expander(&root, &patterns.0, &patterns.1);
        let all = whole.expand().unwrap();
        assert!(all.protected.contains(&root.join("ws/policy.toml")));
        assert!(all.denied.contains(&root.join("ws/sub/.env")));

        let mut copied = expander(&root, &patterns.0, &patterns.1);
        copied.protect_also(vec![root.join("ws/policy.toml")]);
        copied.exempt(&root.join("ws"));
        let out = copied.expand().unwrap();
        assert_eq!(out.protected, Vec::<PathBuf>::new());
        assert_eq!(
            out.denied,
            vec![root.join("home/.env"), root.join("home/.ssh")]
        );
    }

    #[test]
    fn jobs_split_literal_prefixes_from_wildcards() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let expander = expander(
            &root,
            &[".git/**", "**/.git/**"],
            &[
                "~/.ssh/**",
                "**/.env",
                "secrets/*.key",
                "~/.cargo/credentials*",
            ],
        );
        assert_eq!(
            expander.literals,
            vec![
                Literal {
                    path: root.join("ws/.git"),
                    denied: false
                },
                Literal {
                    path: root.join("home/.ssh"),
                    denied: true
                },
            ]
        );
        assert_eq!(
            expander.jobs,
            vec![
                WalkJob {
                    base: root.join("home/.cargo"),
                    depth: Some(1)
                },
                WalkJob {
                    base: root.join("ws"),
                    depth: None
                },
            ]
        );
    }

    #[test]
    fn expansion_finds_matches_and_keeps_up_with_changes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let ws = root.join("ws");
        touch(&ws.join("a/.env"));
        touch(&ws.join("a/b/c/.env"));
        touch(&ws.join("keep.txt"));
        touch(&ws.join(".git/config"));
        touch(&ws.join(".git/sub/.env"));
        touch(&ws.join("secret/.env/inner"));
        let mut expander = expander(&root, &[".git/**", "**/hooks/**"], &["**/.env"]);
        let first = expander.expand().unwrap();
        assert_eq!(first.protected, vec![ws.join(".git")]);
        assert_eq!(
            first.denied,
            vec![
                ws.join(".git/sub/.env"),
                ws.join("a/.env"),
                ws.join("a/b/c/.env"),
                ws.join("secret/.env"),
            ]
        );
        // Unchanged tree: same answer from the cache.
        assert_eq!(expander.expand().unwrap(), first);
        // A new match deep down, a removed one, a new protected directory.
        touch(&ws.join("a/b/new/.env"));
        std::fs::remove_file(ws.join("a/.env")).unwrap();
        std::fs::create_dir_all(ws.join("x/hooks")).unwrap();
        let second = expander.expand().unwrap();
        assert_eq!(second.protected, vec![ws.join(".git"), ws.join("x/hooks")]);
        assert_eq!(
            second.denied,
            vec![
                ws.join(".git/sub/.env"),
                ws.join("a/b/c/.env"),
                ws.join("a/b/new/.env"),
                ws.join("secret/.env"),
            ]
        );
    }

    #[test]
    fn missing_literal_protected_paths_are_kept_and_symlinks_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let ws = root.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        touch(&root.join("outside/.env"));
        std::os::unix::fs::symlink(root.join("outside"), ws.join("link")).unwrap();
        let mut expander = expander(&root, &[".git/**"], &["**/.env"]);
        let expansion = expander.expand().unwrap();
        assert_eq!(expansion.protected, vec![ws.join(".git")]);
        assert!(expansion.denied.is_empty(), "{expansion:?}");
    }

    #[test]
    fn byte_wise_within_agrees_with_starts_with_on_canonical_paths() {
        let paths = ["/", "/a", "/ab", "/a/b", "/a/b/c", "/b", "/a-b", "/a/bc"];
        for path in paths {
            for tree in paths {
                assert_eq!(
                    within(Path::new(path), Path::new(tree)),
                    Path::new(path).starts_with(tree),
                    "{path} within {tree}"
                );
            }
        }
    }

    #[test]
    fn walks_stay_within_the_reach() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        touch(&root.join("ws/in.pem"));
        touch(&root.join("elsewhere/out.pem"));
        touch(&root.join("home/.cargo/key.pem"));
        let absolute = format!("{}/**/*.pem", root.display());
        let mut expander = expander(&root, &[], &[absolute.as_str()]);
        let expansion = expander.expand().unwrap();
        assert_eq!(
            expansion.denied,
            vec![root.join("home/.cargo/key.pem"), root.join("ws/in.pem")]
        );
    }

    #[test]
    fn nested_jobs_are_merged_into_the_unbounded_one() {
        let jobs = merge_jobs(vec![
            WalkJob {
                base: PathBuf::from("/w/a"),
                depth: Some(2),
            },
            WalkJob {
                base: PathBuf::from("/w"),
                depth: None,
            },
            WalkJob {
                base: PathBuf::from("/x"),
                depth: Some(1),
            },
            WalkJob {
                base: PathBuf::from("/x/y"),
                depth: Some(3),
            },
        ]);
        assert_eq!(
            jobs,
            vec![
                WalkJob {
                    base: PathBuf::from("/w"),
                    depth: None
                },
                WalkJob {
                    base: PathBuf::from("/x"),
                    depth: Some(1)
                },
                WalkJob {
                    base: PathBuf::from("/x/y"),
                    depth: Some(3)
                },
            ]
        );
    }
}
