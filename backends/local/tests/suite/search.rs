//! SearchOperations: ignore rules identical inside and outside git repositories, `.git` never
//! entered, globs, merged context, limits, unreadable and binary files, deterministic order.

use std::os::unix::fs::symlink;
use std::path::Path;

use cordon_ops::{
    FindOutput, FindRequest, GrepLine, GrepOutput, GrepRequest, SearchError, SearchOperations,
};
use tokio_util::sync::CancellationToken;

use super::support::Fixture;

fn grep_req(path: &Path, pattern: &str) -> GrepRequest {
    GrepRequest {
        pattern: pattern.to_string(),
        path: path.to_path_buf(),
        glob: None,
        ignore_case: false,
        literal: false,
        context: 0,
        max_matches: 1000,
    }
}

fn find_req(path: &Path, pattern: &str) -> FindRequest {
    FindRequest {
        pattern: pattern.to_string(),
        path: path.to_path_buf(),
        max_results: 1000,
    }
}

async fn grep(search: &dyn SearchOperations, request: GrepRequest) -> GrepOutput {
    search
        .grep(request, CancellationToken::new())
        .await
        .expect("grep succeeds")
}

async fn find(search: &dyn SearchOperations, request: FindRequest) -> FindOutput {
    search
        .find(request, CancellationToken::new())
        .await
        .expect("find succeeds")
}

fn rel(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .unwrap_or_else(|_| panic!("{} not under {}", path.display(), base.display()))
        .display()
        .to_string()
}

fn grep_files(out: &GrepOutput, base: &Path) -> Vec<String> {
    out.files.iter().map(|f| rel(&f.path, base)).collect()
}

fn found(out: &FindOutput, base: &Path) -> Vec<String> {
    out.paths.iter().map(|p| rel(p, base)).collect()
}

/// The same tree gives the same results without `.git`, with `.git`, and with a nested repo:
/// `.gitignore` and `.ignore` always apply, scoped to their directory.
#[tokio::test]
async fn ignore_files_apply_identically_inside_and_outside_git() {
    let fx = Fixture::new();
    let search = fx.search();
    fx.put(".gitignore", "ignored.txt\nbuild/\n");
    fx.put(".ignore", "notes.md\n");
    for file in [
        "ignored.txt",
        "kept.txt",
        "notes.md",
        "build/out.txt",
        "src/a.rs",
        "src/a.log",
        "nested/kept.txt",
        "nested/ignored.txt",
    ] {
        fx.put(file, "needle\n");
    }
    fx.put("src/.gitignore", "*.log\n");
    let expected_grep = vec!["kept.txt", "nested/kept.txt", "src/a.rs"];
    let expected_find = vec![
        ".gitignore",
        ".ignore",
        "kept.txt",
        "nested/kept.txt",
        "src/.gitignore",
        "src/a.rs",
    ];
    let check = |label: &'static str| {
        let search = search.clone();
        let ws = fx.ws.clone();
        let expected_grep = expected_grep.clone();
        let expected_find = expected_find.clone();
        async move {
            let out = grep(search.as_ref(), grep_req(&ws, "needle")).await;
            assert_eq!(grep_files(&out, &ws), expected_grep, "grep {label}");
            assert!(out.errors.is_empty(), "{label}: {:?}", out.errors);
            let out = find(search.as_ref(), find_req(&ws, "*")).await;
            assert_eq!(found(&out, &ws), expected_find, "find {label}");
        }
    };
    check("without .git").await;
    fx.put(".git/HEAD", "ref: refs/heads/main needle\n");
    fx.put(".git/info/exclude", "kept.txt\n");
    check("inside a git repo").await;
    fx.put("nested/.git/HEAD", "needle\n");
    check("with a nested repo").await;
}

/// Each `.gitignore` applies only inside its own directory; searching a
/// subdirectory still honours the ignore files of its ancestors up to the workspace root,
/// relative to their own directory, and nothing above the workspace root.
#[tokio::test]
async fn gitignore_scoping_g5_g6() {
    let fx = Fixture::new();
    let search = fx.search();
    fx.put("a/.gitignore", "ignored.txt\n");
    fx.put("a/deep/.gitignore", "deep-ignored.txt\n");
    for file in [
        "a/ignored.txt",
        "a/kept.txt",
        "a/deep/kept.txt",
        "a/deep/ignored.txt",
        "a/deep/deep-ignored.txt",
        "b/ignored.txt",
        "b/kept.txt",
        "b/deep-ignored.txt",
        "root.txt",
    ] {
        fx.put(file, "x\n");
    }
    // Above the workspace root: must not apply.
    std::fs::write(fx.ws.parent().unwrap().join(".gitignore"), "*\n").unwrap();
    let out = find(search.as_ref(), find_req(&fx.ws, "*.txt")).await;
    assert_eq!(
        found(&out, &fx.ws),
        vec![
            "a/deep/kept.txt",
            "a/kept.txt",
            "b/deep-ignored.txt",
            "b/ignored.txt",
            "b/kept.txt",
            "root.txt"
        ]
    );
    // Searching inside a/deep: a/.gitignore still applies there.
    let deep = fx.at("a/deep");
    let out = find(search.as_ref(), find_req(&deep, "*.txt")).await;
    assert_eq!(found(&out, &deep), vec!["kept.txt"]);
    // An anchored pattern in the root .gitignore is relative to the root, also when the
    // search starts below it.
    fx.put(".gitignore", "/b/kept.txt\n");
    let b = fx.at("b");
    let out = grep(search.as_ref(), grep_req(&b, "x")).await;
    assert_eq!(
        grep_files(&out, &b),
        vec!["deep-ignored.txt", "ignored.txt"]
    );
}

/// `.git` is never searched or listed, even with patterns that would match inside it.
#[tokio::test]
async fn dot_git_is_never_entered() {
    let fx = Fixture::new();
    let search = fx.search();
    fx.put(".git/HEAD", "ref: refs/heads/main\n");
    fx.put(".git/config", "[core]\n");
    fx.put("sub/.git", "gitdir: ../.git/worktrees/sub\n");
    fx.put("sub/code.rs", "ref: refs in code\n");
    let out = grep(search.as_ref(), grep_req(&fx.ws, "ref: refs")).await;
    assert_eq!(grep_files(&out, &fx.ws), vec!["sub/code.rs"]);
    let git = fx.at(".git");
    let out = grep(search.as_ref(), grep_req(&git, "ref")).await;
    assert!(out.files.is_empty());
    assert_eq!(
        out.errors,
        vec![format!(
            "{}: inside a .git directory, which is never searched (use read to open a file there)",
            git.display()
        )]
    );
    let out = find(search.as_ref(), find_req(&git, "*")).await;
    assert!(out.paths.is_empty() && out.errors.len() == 1);
    for pattern in ["**", "HEAD", ".git/*", "*"] {
        let out = find(search.as_ref(), find_req(&fx.ws, pattern)).await;
        assert!(
            out.paths
                .iter()
                .all(|p| !p.components().any(|c| c.as_os_str() == ".git")),
            "{pattern}: {:?}",
            out.paths
        );
    }
}

/// Hidden files and directories are searched; denied files are not, silently.
#[tokio::test]
async fn hidden_files_found_denied_files_skipped() {
    let fx = Fixture::new();
    let search = fx.search();
    fx.put(".hidden/inner.txt", "needle\n");
    fx.put(".env.example", "needle\n");
    fx.put(".env", "needle\n");
    fx.put("app/.env", "needle\n");
    let out = grep(search.as_ref(), grep_req(&fx.ws, "needle")).await;
    assert_eq!(
        grep_files(&out, &fx.ws),
        vec![".env.example", ".hidden/inner.txt"]
    );
    assert!(out.errors.is_empty());
    let out = find(search.as_ref(), find_req(&fx.ws, "*env*")).await;
    assert_eq!(found(&out, &fx.ws), vec![".env.example"]);
}

/// A glob without `/` matches file names; with `/` the path relative to the
/// search path, `*` not crossing directories.
#[tokio::test]
async fn globs_g1_to_g4() {
    let fx = Fixture::new();
    let search = fx.search();
    for file in [
        "src/foo/bar/example.spec.ts",
        "src/foo/other.spec.ts",
        "src/foo/plain.ts",
        "lib/src/foo/x.spec.ts",
        "some/parent/child/a.txt",
        "some/parent/child/deeper/b.txt",
        "x/parent/child/c.txt",
    ] {
        fx.put(file, "needle\n");
    }
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            "*.spec.ts",
            vec![
                "lib/src/foo/x.spec.ts",
                "src/foo/bar/example.spec.ts",
                "src/foo/other.spec.ts",
            ],
        ),
        (
            "some/parent/child/**",
            vec!["some/parent/child/a.txt", "some/parent/child/deeper/b.txt"],
        ),
        (
            "**/parent/child/*",
            vec!["some/parent/child/a.txt", "x/parent/child/c.txt"],
        ),
        (
            "src/**/*.spec.ts",
            vec!["src/foo/bar/example.spec.ts", "src/foo/other.spec.ts"],
        ),
        ("src/*/plain.ts", vec!["src/foo/plain.ts"]),
    ];
    for (glob, expected) in cases {
        let out = find(search.as_ref(), find_req(&fx.ws, glob)).await;
        assert_eq!(found(&out, &fx.ws), expected, "find {glob}");
        let mut request = grep_req(&fx.ws, "needle");
        request.glob = Some(glob.to_string());
        let out = grep(search.as_ref(), request).await;
        assert_eq!(grep_files(&out, &fx.ws), expected, "grep --glob {glob}");
    }
    // Relative to the search path, not the workspace.
    let src = fx.at("src");
    let out = find(search.as_ref(), find_req(&src, "foo/*.ts")).await;
    assert_eq!(found(&out, &src), vec!["foo/other.spec.ts", "foo/plain.ts"]);
}

/// Overlapping context windows are merged: every line appears once, in order.
#[tokio::test]
async fn context_windows_merge() {
    let fx = Fixture::new();
    let search = fx.search();
    let text: String = (1..=12)
        .map(|n| {
            if n == 4 || n == 6 || n == 11 {
                format!("match {n}\n")
            } else {
                format!("line {n}\n")
            }
        })
        .collect();
    let path = fx.put("ctx.txt", &text);
    let mut request = grep_req(&fx.ws, "match");
    request.context = 2;
    let out = grep(search.as_ref(), request).await;
    assert_eq!(out.files.len(), 1);
    assert_eq!(out.files[0].path, path);
    let lines: Vec<(u64, bool)> = out.files[0]
        .lines
        .iter()
        .map(|l| (l.number, l.is_match))
        .collect();
    assert_eq!(
        lines,
        vec![
            (2, false),
            (3, false),
            (4, true),
            (5, false),
            (6, true),
            (7, false),
            (8, false),
            (9, false),
            (10, false),
            (11, true),
            (12, false)
        ]
    );
    assert_eq!(
        out.files[0].lines[2],
        GrepLine {
            number: 4,
            text: "match 4".into(),
            is_match: true
        }
    );
}

/// The limit keeps exactly the first N matches in path order (the cut file keeps only the
/// context of its kept matches), identically on every run; find keeps the first N paths.
#[tokio::test]
async fn limits_stop_deterministically() {
    let fx = Fixture::new();
    let search = fx.search();
    for i in 0..40 {
        fx.put(
            &format!("d{}/f{i:02}.txt", i % 4),
            "hit one\nquiet\nhit two\nquiet\nhit three\n",
        );
    }
    let mut request = grep_req(&fx.ws, "hit");
    request.max_matches = 7;
    request.context = 1;
    let first = grep(search.as_ref(), request.clone()).await;
    assert_eq!(
        grep_files(&first, &fx.ws),
        vec!["d0/f00.txt", "d0/f04.txt", "d0/f08.txt"]
    );
    let matches: usize = first
        .files
        .iter()
        .map(|f| f.lines.iter().filter(|l| l.is_match).count())
        .sum();
    assert_eq!(matches, 7);
    let last: Vec<(u64, bool)> = first.files[2]
        .lines
        .iter()
        .map(|l| (l.number, l.is_match))
        .collect();
    assert_eq!(last, vec![(1, true), (2, false)]);
    for _ in 0..5 {
        assert_eq!(grep(search.as_ref(), request.clone()).await, first);
    }
    request.max_matches = 6;
    let exact = grep(search.as_ref(), request).await;
    assert_eq!(grep_files(&exact, &fx.ws), vec!["d0/f00.txt", "d0/f04.txt"]);

    let mut request = find_req(&fx.ws, "*.txt");
    request.max_results = 5;
    let out = find(search.as_ref(), request.clone()).await;
    assert_eq!(
        found(&out, &fx.ws),
        vec![
            "d0/f00.txt",
            "d0/f04.txt",
            "d0/f08.txt",
            "d0/f12.txt",
            "d0/f16.txt"
        ]
    );
    for _ in 0..5 {
        assert_eq!(find(search.as_ref(), request.clone()).await, out);
    }
}

/// Order is by path, component by component (byte order within a component).
#[tokio::test]
async fn order_is_by_path_components() {
    let fx = Fixture::new();
    let search = fx.search();
    for file in [
        "b.txt",
        "a.txt",
        "a/z.txt",
        "A.txt",
        "a-b/y.txt",
        "a/b/c.txt",
    ] {
        fx.put(file, "needle\n");
    }
    let expected = vec![
        "A.txt",
        "a/b/c.txt",
        "a/z.txt",
        "a-b/y.txt",
        "a.txt",
        "b.txt",
    ];
    let out = grep(search.as_ref(), grep_req(&fx.ws, "needle")).await;
    assert_eq!(grep_files(&out, &fx.ws), expected);
    let out = find(search.as_ref(), find_req(&fx.ws, "*.txt")).await;
    assert_eq!(found(&out, &fx.ws), expected);
}

/// Binary files are skipped in a walk (like rg); a binary file named explicitly gets a note.
#[tokio::test]
async fn binary_files_are_skipped() {
    let fx = Fixture::new();
    let search = fx.search();
    let bin = fx.at("blob.bin");
    std::fs::write(&bin, b"needle\0\x01\x02needle\n").unwrap();
    fx.put("text.txt", "needle\n");
    let out = grep(search.as_ref(), grep_req(&fx.ws, "needle")).await;
    assert_eq!(grep_files(&out, &fx.ws), vec!["text.txt"]);
    let out = grep(search.as_ref(), grep_req(&bin, "needle")).await;
    assert!(out.files.is_empty());
    assert_eq!(
        out.errors,
        vec![format!("{}: binary file, not searched", bin.display())]
    );
}

/// A named file is searched even if ignored; results name it as requested.
#[tokio::test]
async fn single_file_search() {
    let fx = Fixture::new();
    let search = fx.search();
    fx.put(".gitignore", "gen.rs\n");
    let file = fx.put("gen.rs", "fn a() {}\nfn b() {}\n");
    let out = grep(search.as_ref(), grep_req(&file, "fn b")).await;
    assert_eq!(out.files.len(), 1);
    assert_eq!(out.files[0].path, file);
    assert_eq!(out.files[0].lines[0].number, 2);
}

/// Case-insensitive and literal matching.
#[tokio::test]
async fn case_and_literal() {
    let fx = Fixture::new();
    let search = fx.search();
    fx.put("f.txt", "Needle\na.b\naxb\n");
    let mut request = grep_req(&fx.ws, "needle");
    assert!(
        grep(search.as_ref(), request.clone())
            .await
            .files
            .is_empty()
    );
    request.ignore_case = true;
    assert_eq!(grep(search.as_ref(), request).await.files[0].lines.len(), 1);
    let mut request = grep_req(&fx.ws, "a.b");
    assert_eq!(
        grep(search.as_ref(), request.clone()).await.files[0]
            .lines
            .len(),
        2
    );
    request.literal = true;
    let out = grep(search.as_ref(), request).await;
    assert_eq!(out.files[0].lines.len(), 1);
    assert_eq!(out.files[0].lines[0].text, "a.b");
    let mut request = grep_req(&fx.ws, "(unclosed");
    request.literal = true;
    assert!(grep(search.as_ref(), request).await.files.is_empty());
}

/// Bad patterns and paths are specific errors.
#[tokio::test]
async fn invalid_patterns_and_paths() {
    let fx = Fixture::new();
    let search = fx.search();
    let err = search
        .grep(grep_req(&fx.ws, "a("), CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SearchError::InvalidPattern { what: "regex", pattern, .. } if pattern == "a("),
        "{err:?}"
    );
    let mut request = grep_req(&fx.ws, "a");
    request.glob = Some("src/[".into());
    let err = search
        .grep(request, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(err, SearchError::InvalidPattern { what: "glob", .. }),
        "{err:?}"
    );
    let err = search
        .find(find_req(&fx.ws, "{a,b"), CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(err, SearchError::InvalidPattern { what: "glob", .. }),
        "{err:?}"
    );
    let missing = fx.at("missing");
    let err = search
        .grep(grep_req(&missing, "a"), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("Path not found: {}", missing.display())
    );
    let err = search
        .find(find_req(&fx.outside, "*"), CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, SearchError::OutsideRoot { .. }), "{err:?}");
    symlink(&fx.outside, fx.at("escape")).unwrap();
    let err = search
        .grep(
            grep_req(&fx.at("escape"), "secret"),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, SearchError::OutsideRoot { .. }), "{err:?}");
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    assert!(matches!(
        search.grep(grep_req(&fx.ws, "a"), cancelled.clone()).await,
        Err(SearchError::Cancelled)
    ));
    assert!(matches!(
        search.find(find_req(&fx.ws, "*"), cancelled).await,
        Err(SearchError::Cancelled)
    ));
}

/// find lists files and symlinks to files, never directories; bad links are noted; symlinks
/// are not followed into directories, nor out of the roots.
#[tokio::test]
async fn find_lists_files_and_file_links_only() {
    let fx = Fixture::new();
    let search = fx.search();
    fx.put("dir/file.txt", "x");
    std::fs::create_dir(fx.at("empty")).unwrap();
    symlink("dir/file.txt", fx.at("file-link.txt")).unwrap();
    symlink("dir", fx.at("dir-link.txt")).unwrap();
    symlink("nowhere", fx.at("dangling.txt")).unwrap();
    symlink(fx.outside.join("secret.txt"), fx.at("escape.txt")).unwrap();
    let out = find(search.as_ref(), find_req(&fx.ws, "*")).await;
    assert_eq!(found(&out, &fx.ws), vec!["dir/file.txt", "file-link.txt"]);
    assert_eq!(
        out.errors,
        vec![
            format!(
                "{}: dangling symlink (its target does not exist)",
                fx.at("dangling.txt").display()
            ),
            format!(
                "{}: symlink points outside the allowed roots",
                fx.at("escape.txt").display()
            ),
        ]
    );
    // grep does not follow symlinks at all (like rg without --follow).
    let out = grep(search.as_ref(), grep_req(&fx.ws, "x|secret")).await;
    assert_eq!(grep_files(&out, &fx.ws), vec!["dir/file.txt"]);
}

/// Results keep the spelling of the requested search path (here through a symlink).
#[tokio::test]
async fn results_use_the_requested_spelling() {
    let fx = Fixture::new();
    let search = fx.search();
    fx.put("real/inner/f.txt", "needle\n");
    symlink("real", fx.at("alias")).unwrap();
    let alias = fx.at("alias");
    let out = grep(search.as_ref(), grep_req(&alias, "needle")).await;
    assert_eq!(out.files[0].path, alias.join("inner/f.txt"));
    let out = find(search.as_ref(), find_req(&alias, "*.txt")).await;
    assert_eq!(out.paths, vec![alias.join("inner/f.txt")]);
}

/// Unreadable files are reported as notes and never fail the call. Root bypasses
/// permission bits, so the test makes files unreadable with Landlock on a thread of its own
/// (Landlock binds root too); the search's threads inherit the restriction. (Landlock grants
/// directory listing for whole subtrees, so unreadable directories are covered by the unit
/// test of the walk-error notes instead.)
#[test]
fn unreadable_files_are_noted_not_fatal() {
    use landlock::{
        ABI, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    };
    if std::env::var("CORDON_SKIP_LANDLOCK").as_deref() == Ok("1") {
        eprintln!("skipping: CORDON_SKIP_LANDLOCK=1");
        return;
    }
    let fx = Fixture::new();
    fx.put("readable.txt", "needle\n");
    fx.put("locked.txt", "needle\n");
    fx.put("zdir/open.txt", "needle\n");
    fx.put("closed/inside.txt", "needle\n");
    let ws = fx.ws.clone();
    let search = fx.search();
    let result = std::thread::spawn(move || {
        let read = AccessFs::ReadFile | AccessFs::ReadDir;
        let status = Ruleset::default()
            .handle_access(AccessFs::from_read(ABI::V1))
            .unwrap()
            .create()
            .unwrap()
            .add_rule(PathBeneath::new(
                PathFd::new(&ws).unwrap(),
                AccessFs::ReadDir,
            ))
            .unwrap()
            .add_rule(PathBeneath::new(
                PathFd::new(ws.join("zdir")).unwrap(),
                read,
            ))
            .unwrap()
            .add_rule(PathBeneath::new(
                PathFd::new(ws.join("readable.txt")).unwrap(),
                AccessFs::ReadFile,
            ))
            .unwrap()
            .restrict_self()
            .expect("Landlock is required for this test (set CORDON_SKIP_LANDLOCK=1 to skip)");
        assert_eq!(status.ruleset, RulesetStatus::FullyEnforced);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let grep_out = grep(search.as_ref(), grep_req(&ws, "needle")).await;
            let find_out = find(search.as_ref(), find_req(&ws, "*.txt")).await;
            (grep_out, find_out)
        })
    })
    .join()
    .unwrap();
    let (grep_out, find_out) = result;
    assert_eq!(
        grep_files(&grep_out, &fx.ws),
        vec!["readable.txt", "zdir/open.txt"]
    );
    assert_eq!(
        grep_out.errors,
        vec![
            format!(
                "{}: permission denied",
                fx.at("closed/inside.txt").display()
            ),
            format!("{}: permission denied", fx.at("locked.txt").display()),
        ]
    );
    assert_eq!(
        found(&find_out, &fx.ws),
        vec![
            "closed/inside.txt",
            "locked.txt",
            "readable.txt",
            "zdir/open.txt"
        ]
    );
    assert!(find_out.errors.is_empty());
}
