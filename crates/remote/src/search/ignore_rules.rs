//! ripgrep's ignore rules applied to a remote listing, with the `ignore` crate's own matcher
//! (`Gitignore`), so the result is the local backend's walk (`WalkBuilder` with hidden files,
//! `require_git(false)`, parents on): for each entry, the `.ignore` files of its ancestor
//! directories are consulted from the deepest up and the first that matches decides; then the
//! `.gitignore` files the same way; `.ignore` wins over `.gitignore`; a whitelist (`!pat`)
//! match keeps the entry; an ignored directory is pruned with everything below it. The search
//! path itself is never filtered. Children are visited in file-name order, which is path order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::listing::{EntryKind, Listing};

#[derive(Default)]
struct DirRules {
    dot_ignore: Option<Gitignore>,
    git_ignore: Option<Gitignore>,
}

/// The ignore files of a listing, by directory.
pub struct IgnoreTree {
    by_dir: HashMap<PathBuf, DirRules>,
}

impl std::fmt::Debug for IgnoreTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IgnoreTree")
            .field("dirs", &self.by_dir.len())
            .finish()
    }
}

impl IgnoreTree {
    /// Build matchers from ignore files and their lines. Lines that do not parse are skipped,
    /// as the `ignore` crate does.
    pub fn new(files: &[(PathBuf, Vec<String>)]) -> Self {
        let mut by_dir: HashMap<PathBuf, DirRules> = HashMap::new();
        for (file, lines) in files {
            let Some(dir) = file.parent() else { continue };
            let mut builder = GitignoreBuilder::new(dir);
            for line in lines {
                // git ignores a malformed pattern too: the other lines still apply.
                let _ = builder.add_line(Some(file.clone()), line);
            }
            let Ok(matcher) = builder.build() else {
                continue;
            };
            let rules = by_dir.entry(dir.to_path_buf()).or_default();
            match file.file_name().and_then(|n| n.to_str()) {
                Some(".ignore") => rules.dot_ignore = Some(matcher),
                _ => rules.git_ignore = Some(matcher),
            }
        }
        IgnoreTree { by_dir }
    }

    /// Whether `path` is ignored by the rules of its ancestors.
    pub fn is_ignored(&self, path: &Path, is_dir: bool) -> bool {
        let mut dot: Option<bool> = None;
        let mut git: Option<bool> = None;
        for dir in path.ancestors().skip(1) {
            let Some(rules) = self.by_dir.get(dir) else {
                continue;
            };
            if dot.is_none() {
                dot = decide(rules.dot_ignore.as_ref(), path, is_dir);
            }
            if git.is_none() {
                git = decide(rules.git_ignore.as_ref(), path, is_dir);
            }
            if dot.is_some() {
                break;
            }
        }
        dot.or(git).unwrap_or(false)
    }
}

fn decide(matcher: Option<&Gitignore>, path: &Path, is_dir: bool) -> Option<bool> {
    match matcher?.matched(path, is_dir) {
        Match::None => None,
        Match::Ignore(_) => Some(true),
        Match::Whitelist(_) => Some(false),
    }
}

/// What the walk keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walked {
    /// Regular files, in path order.
    pub files: Vec<PathBuf>,
    /// Symlinks whose target is a regular file, in path order.
    pub file_links: Vec<PathBuf>,
}

impl Walked {
    /// Files and symlinks to files merged, in path order (find's result set).
    pub fn files_and_links(&self) -> Vec<PathBuf> {
        let mut all: Vec<PathBuf> = self.files.iter().chain(&self.file_links).cloned().collect();
        all.sort();
        all
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    File,
    Link(EntryKind),
}

/// Walk a listing from `root` like the local backend's walker.
pub fn walk(listing: &Listing, root: &Path) -> Walked {
    let tree = IgnoreTree::new(&listing.ignore_files);
    let mut children: HashMap<&Path, Vec<(&Path, Node)>> = HashMap::new();
    let entries = listing
        .dirs
        .iter()
        .map(|d| (d.as_path(), Node::Dir))
        .chain(listing.files.iter().map(|f| (f.as_path(), Node::File)))
        .chain(
            listing
                .links
                .iter()
                .map(|(l, k)| (l.as_path(), Node::Link(*k))),
        );
    for (path, node) in entries {
        if path == root {
            continue;
        }
        if let Some(parent) = path.parent() {
            children.entry(parent).or_default().push((path, node));
        }
    }
    for list in children.values_mut() {
        list.sort_by(|a, b| a.0.file_name().cmp(&b.0.file_name()));
    }
    let mut out = Walked::default();
    if listing.files.iter().any(|f| f == root) {
        out.files.push(root.to_path_buf());
        return out;
    }
    // Depth-first, children in name order: push in reverse so the smallest pops first, and
    // emit files as they are reached so the output is in path order.
    let mut pending: Vec<(&Path, Node)> = Vec::new();
    if let Some(list) = children.get(root) {
        pending.extend(list.iter().rev().copied());
    }
    while let Some((path, node)) = pending.pop() {
        match node {
            Node::Dir => {
                if tree.is_ignored(path, true) {
                    continue;
                }
                if let Some(list) = children.get(path) {
                    pending.extend(list.iter().rev().copied());
                }
            }
            Node::File => {
                if !tree.is_ignored(path, false) {
                    out.files.push(path.to_path_buf());
                }
            }
            Node::Link(kind) => {
                if kind == EntryKind::File && !tree.is_ignored(path, false) {
                    out.file_links.push(path.to_path_buf());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn listing() -> Listing {
        Listing {
            root_kind: Some(EntryKind::Dir),
            ignore_files: vec![
                (p("/.gitignore"), vec!["*.tmp".to_owned()]),
                (
                    p("/w/.gitignore"),
                    vec![
                        "build/".to_owned(),
                        "*.log".to_owned(),
                        "!keep.log".to_owned(),
                    ],
                ),
                (p("/w/sub/.gitignore"), vec!["local.txt".to_owned()]),
                (p("/w/sub/.ignore"), vec!["!a.log".to_owned()]),
            ],
            dirs: vec![p("/w"), p("/w/build"), p("/w/sub"), p("/w/z")],
            files: vec![
                p("/w/.hidden"),
                p("/w/a.txt"),
                p("/w/x.log"),
                p("/w/keep.log"),
                p("/w/t.tmp"),
                p("/w/build/out.txt"),
                p("/w/sub/a.log"),
                p("/w/sub/b.log"),
                p("/w/sub/local.txt"),
                p("/w/z/local.txt"),
            ],
            links: vec![
                (p("/w/link"), EntryKind::File),
                (p("/w/dlink"), EntryKind::Dir),
            ],
        }
    }

    #[test]
    fn walks_like_ripgreps_walker() {
        let walked = walk(&listing(), Path::new("/w"));
        assert_eq!(
            walked,
            Walked {
                files: vec![
                    p("/w/.hidden"),
                    p("/w/a.txt"),
                    p("/w/keep.log"),
                    p("/w/sub/a.log"),
                    p("/w/z/local.txt"),
                ],
                file_links: vec![p("/w/link")],
            }
        );
        assert_eq!(
            walked.files_and_links(),
            vec![
                p("/w/.hidden"),
                p("/w/a.txt"),
                p("/w/keep.log"),
                p("/w/link"),
                p("/w/sub/a.log"),
                p("/w/z/local.txt"),
            ]
        );
    }

    #[test]
    fn a_file_search_path_is_kept() {
        let listing = Listing {
            root_kind: Some(EntryKind::File),
            files: vec![p("/w/x.log")],
            ignore_files: vec![(p("/w/.gitignore"), vec!["*.log".to_owned()])],
            ..Listing::default()
        };
        assert_eq!(
            walk(&listing, Path::new("/w/x.log")).files,
            vec![p("/w/x.log")]
        );
    }
}
