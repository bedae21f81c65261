//! Listing + ignore engine against the `ignore` crate's own walker (the local backend's
//! engine) on a tree full of ignore-rule corner cases, and the fallback grep end to end.

use std::path::{Path, PathBuf};

use cordon_ops::{GrepFile, GrepLine, GrepOutput};
use cordon_remote::search::fallback::search_tar;
use cordon_remote::search::ignore_rules::walk;
use cordon_remote::search::listing::{
    EntryKind, fetch_argv, fetch_input, list_argv, parse_listing,
};

use crate::support::{run, run_holding_stdin, shells};

fn write(root: &Path, rel: &str, body: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, body).expect("write");
}

fn tree(root: &Path) {
    write(
        root,
        ".gitignore",
        "*.log\n!keep.log\nbuild/\n/anchored.txt\ndocs/**/*.tmp\n# comment\n\\#hash\n",
    );
    write(
        root,
        ".ignore",
        "ignored-by-dot-ignore\n!also-gitignored.txt\n",
    );
    write(root, "also-gitignored.txt", "x\n");
    write(root, ".gitignore2", "x\n");
    write(root, "a.log", "x\n");
    write(root, "keep.log", "needle\n");
    write(root, "anchored.txt", "x\n");
    write(root, "sub/anchored.txt", "needle\n");
    write(root, "build/x.txt", "needle\n");
    write(root, "sub/build/y.txt", "needle\n");
    write(root, "docs/a/b.tmp", "x\n");
    write(root, "docs/c.tmp", "needle\n");
    write(root, "ignored-by-dot-ignore", "x\n");
    write(root, "#hash", "x\n");
    write(root, ".hidden/inner.txt", "needle hidden\n");
    write(root, ".git/config", "needle\n");
    write(root, "nested/.git/HEAD", "needle\n");
    write(root, "nested/.gitignore", "!*.log\n*.txt\n");
    write(root, "nested/n.log", "needle\n");
    write(root, "nested/n.txt", "x\n");
    write(root, "deep/er/est/file.rs", "fn needle() {}\n");
    write(root, "deep/.gitignore", "er/est/\n");
    write(root, "deep/er/other.rs", "needle\n");
    write(root, "bin.dat", "needle\0\n");
    std::fs::write(root.join("also-gitignored.txt"), "needle\n").expect("write");
    std::fs::write(root.join(".gitignore2"), "x\n").expect("write");
    std::os::unix::fs::symlink("keep.log", root.join("link.log")).expect("symlink");
    std::os::unix::fs::symlink("deep", root.join("deep-link")).expect("symlink");
    std::os::unix::fs::symlink("none", root.join("dangling")).expect("symlink");
}

/// What the local backend's walker yields: (regular files, symlinks to files).
fn reference(root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut files = Vec::new();
    let mut links = Vec::new();
    let walker = ignore::WalkBuilder::new(root)
        .hidden(false)
        .require_git(false)
        .git_global(false)
        .filter_entry(|e| e.file_name() != ".git")
        .sort_by_file_name(|a, b| a.cmp(b))
        .build();
    for entry in walker {
        let entry = entry.expect("walk");
        let Some(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_file() {
            files.push(entry.into_path());
        } else if kind.is_symlink() && std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file()) {
            links.push(entry.into_path());
        }
    }
    (files, links)
}

#[tokio::test]
async fn listing_and_ignore_engine_match_the_ignore_crate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("canon").join("ws");
    std::fs::create_dir(&root).expect("mkdir");
    tree(&root);
    let (want_files, want_links) = reference(&root);
    assert!(
        want_files.contains(&root.join("keep.log")) && !want_files.contains(&root.join("a.log"))
    );
    for shell in shells() {
        let (stdout, stderr) = run(&shell, &list_argv(&root).expect("argv"), b"").await;
        assert_eq!(String::from_utf8_lossy(&stderr), "", "{shell:?}");
        let listing = parse_listing(&stdout).expect("listing");
        assert_eq!(listing.root_kind, Some(EntryKind::Dir));
        let walked = walk(&listing, &root);
        assert_eq!(walked.files, want_files, "{shell:?}");
        assert_eq!(walked.file_links, want_links, "{shell:?}");
    }
}

#[tokio::test]
async fn fallback_grep_streams_and_searches_the_walked_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("canon").join("ws");
    std::fs::create_dir(&root).expect("mkdir");
    tree(&root);
    let (files, _) = reference(&root);
    let regex = regex::bytes::Regex::new("needle").expect("regex");
    let stdin = fetch_input(&files);
    let expected = GrepOutput {
        files: [
            ".hidden/inner.txt",
            "also-gitignored.txt",
            "deep/er/other.rs",
            "keep.log",
        ]
        .iter()
        .map(|rel| GrepFile {
            path: root.join(rel),
            lines: vec![GrepLine {
                number: 1,
                text: std::fs::read_to_string(root.join(rel))
                    .expect("read")
                    .trim_end()
                    .to_owned(),
                is_match: true,
            }],
        })
        .collect(),
        errors: vec![],
    };
    for shell in shells() {
        for literal in [None, Some("needle")] {
            let (tar, _) = run_holding_stdin(&shell, &fetch_argv(literal), &stdin).await;
            let got = search_tar(&tar, &files, &regex, 0, 4);
            assert_eq!(got, expected, "{shell:?} literal={literal:?}");
        }
    }
}
