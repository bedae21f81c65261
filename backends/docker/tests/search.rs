//! grep and find data: gitignore inside and outside git repos, `.git` never entered, hidden
//! files, symlinks, globs, context merging, limits — and the POSIX fallback (busybox image,
//! no rg) returning exactly what rg returns.

use std::path::{Path, PathBuf};

use cordon_ops::{
    Backend, FindOutput, FindRequest, GrepFile, GrepLine, GrepOutput, GrepRequest, SearchError,
};
use tokio_util::sync::CancellationToken;

use crate::support::{self, BUSYBOX, host_or_skip, session, workspace};

fn tree(root: &Path, git: bool) {
    let w = |rel: &str, body: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, body).expect("write");
    };
    if git {
        w(".git/HEAD", "ref: refs/heads/main needle\n");
    }
    w(".gitignore", "ignored.txt\nbuild/\n");
    w("a.txt", "alpha\nneedle one\nbeta\nneedle two\ngamma\n");
    w("ignored.txt", "needle ignored\n");
    w("build/out.txt", "needle built\n");
    w(".hidden/h.txt", "needle hidden\n");
    w("src/lib.rs", "fn needle() {}\n");
    w("src/sub/.gitignore", "local.rs\n");
    w("src/sub/local.rs", "needle local\n");
    w("src/sub/kept.rs", "needle kept\n");
    w("bin.dat", "needle\0binary\n");
    std::os::unix::fs::symlink("a.txt", root.join("link.txt")).expect("symlink");
}

fn grep_request(path: &str, glob: Option<&str>, context: usize, max: usize) -> GrepRequest {
    GrepRequest {
        pattern: "needle".to_owned(),
        path: PathBuf::from(path),
        glob: glob.map(str::to_owned),
        ignore_case: false,
        literal: false,
        context,
        max_matches: max,
    }
}

fn line(number: u64, text: &str, is_match: bool) -> GrepLine {
    GrepLine {
        number,
        text: text.to_owned(),
        is_match,
    }
}

fn expected_grep() -> GrepOutput {
    let file = |p: &str, lines: Vec<GrepLine>| GrepFile {
        path: PathBuf::from(p),
        lines,
    };
    GrepOutput {
        files: vec![
            file(
                "/workspace/.hidden/h.txt",
                vec![line(1, "needle hidden", true)],
            ),
            file(
                "/workspace/a.txt",
                vec![line(2, "needle one", true), line(4, "needle two", true)],
            ),
            file(
                "/workspace/src/lib.rs",
                vec![line(1, "fn needle() {}", true)],
            ),
            file(
                "/workspace/src/sub/kept.rs",
                vec![line(1, "needle kept", true)],
            ),
        ],
        errors: vec![],
    }
}

fn expected_find() -> FindOutput {
    FindOutput {
        paths: [
            "/workspace/.hidden/h.txt",
            "/workspace/a.txt",
            "/workspace/link.txt",
        ]
        .iter()
        .map(PathBuf::from)
        .collect(),
        errors: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_and_find_respect_gitignore_inside_and_outside_git_and_match_the_fallback() {
    let host = host_or_skip!();
    for git in [true, false] {
        let ws = workspace();
        tree(ws.path(), git);
        let rg = session(&host, ws.path()).await;
        assert!(rg.has_ripgrep());
        let mut config = support::config(&host, ws.path());
        config.image = BUSYBOX.to_owned();
        let fallback = cordon_backend_docker::DockerBackend::start(config)
            .await
            .expect("busybox session");
        assert!(!fallback.has_ripgrep());
        for backend in [&rg, &fallback] {
            let search = backend.search();
            let got = search
                .grep(
                    grep_request("/workspace", None, 0, 100),
                    CancellationToken::new(),
                )
                .await
                .expect("grep");
            assert_eq!(
                got,
                expected_grep(),
                "git={git} rg={}",
                backend.has_ripgrep()
            );
            let found = search
                .find(
                    FindRequest {
                        pattern: "*.txt".to_owned(),
                        path: PathBuf::from("/workspace"),
                        max_results: 100,
                    },
                    CancellationToken::new(),
                )
                .await
                .expect("find");
            assert_eq!(
                found,
                expected_find(),
                "git={git} rg={}",
                backend.has_ripgrep()
            );
            let found = search
                .find(
                    FindRequest {
                        pattern: "src/**/*.rs".to_owned(),
                        path: PathBuf::from("/workspace"),
                        max_results: 1,
                    },
                    CancellationToken::new(),
                )
                .await
                .expect("find");
            assert_eq!(found.paths, vec![PathBuf::from("/workspace/src/lib.rs")]);

            // Context windows merge; the limit stops the search; globs filter.
            let got = search
                .grep(
                    grep_request("/workspace/a.txt", None, 1, 100),
                    CancellationToken::new(),
                )
                .await
                .expect("grep");
            assert_eq!(
                got.files[0].lines,
                vec![
                    line(1, "alpha", false),
                    line(2, "needle one", true),
                    line(3, "beta", false),
                    line(4, "needle two", true),
                    line(5, "gamma", false),
                ]
            );
            let got = search
                .grep(
                    grep_request("/workspace", None, 0, 2),
                    CancellationToken::new(),
                )
                .await
                .expect("grep");
            let matches: usize = got.files.iter().map(|f| f.lines.len()).sum();
            assert_eq!(matches, 2);
            let got = search
                .grep(
                    grep_request("/workspace", Some("*.rs"), 0, 100),
                    CancellationToken::new(),
                )
                .await
                .expect("grep");
            assert_eq!(got.files.len(), 2);
            let got = search
                .grep(
                    grep_request("/workspace", Some("src/sub/*.rs"), 0, 100),
                    CancellationToken::new(),
                )
                .await
                .expect("grep");
            assert_eq!(
                got.files.iter().map(|f| f.path.clone()).collect::<Vec<_>>(),
                vec![PathBuf::from("/workspace/src/sub/kept.rs")]
            );

            let err = search
                .grep(
                    grep_request("/workspace/missing", None, 0, 10),
                    CancellationToken::new(),
                )
                .await
                .expect_err("missing");
            assert!(matches!(err, SearchError::PathNotFound { .. }), "{err:?}");
            let err = search
                .grep(grep_request("/etc", None, 0, 10), CancellationToken::new())
                .await
                .expect_err("outside");
            assert!(matches!(err, SearchError::OutsideRoot { .. }), "{err:?}");
            let mut bad = grep_request("/workspace", None, 0, 10);
            bad.pattern = "needle(".to_owned();
            let err = search
                .grep(bad, CancellationToken::new())
                .await
                .expect_err("bad regex");
            assert!(
                matches!(err, SearchError::InvalidPattern { what: "regex", .. }),
                "{err:?}"
            );
        }
        rg.shutdown().await.expect("shut the session down");
        fallback.shutdown().await.expect("shut the session down");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_entries_become_notes_and_do_not_fail_the_search() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("ok.txt"), "needle\n").expect("write");
    std::fs::create_dir(ws.path().join("locked")).expect("mkdir");
    std::fs::write(ws.path().join("locked/inner.txt"), "needle\n").expect("write");
    std::fs::write(ws.path().join("secret.txt"), "needle\n").expect("write");
    // Commands run as 1234; the locked entries belong to root and are private.
    std::os::unix::fs::chown(ws.path(), Some(1234), Some(1234)).expect("chown");
    std::os::unix::fs::chown(ws.path().join("ok.txt"), Some(1234), Some(1234)).expect("chown");
    std::fs::set_permissions(
        ws.path().join("locked"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    std::fs::set_permissions(
        ws.path().join("secret.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let mut config = support::config(&host, ws.path());
    let rg = cordon_backend_docker::DockerBackend::start(config.clone())
        .await
        .expect("start");
    config.image = BUSYBOX.to_owned();
    let fallback = cordon_backend_docker::DockerBackend::start(config)
        .await
        .expect("start busybox");
    for backend in [&rg, &fallback] {
        let got = backend
            .search()
            .grep(
                grep_request("/workspace", None, 0, 100),
                CancellationToken::new(),
            )
            .await
            .expect("grep");
        assert_eq!(
            got.files.iter().map(|f| f.path.clone()).collect::<Vec<_>>(),
            vec![PathBuf::from("/workspace/ok.txt")],
            "rg={}",
            backend.has_ripgrep()
        );
        assert_eq!(
            got.errors,
            vec![
                "/workspace/locked: Permission denied (os error 13)".to_owned(),
                "/workspace/secret.txt: Permission denied (os error 13)".to_owned(),
            ],
            "rg={}",
            backend.has_ripgrep()
        );
        let found = backend
            .search()
            .find(
                FindRequest {
                    pattern: "*.txt".to_owned(),
                    path: PathBuf::from("/workspace"),
                    max_results: 10,
                },
                CancellationToken::new(),
            )
            .await
            .expect("find");
        assert_eq!(
            found,
            FindOutput {
                paths: vec![
                    PathBuf::from("/workspace/ok.txt"),
                    PathBuf::from("/workspace/secret.txt")
                ],
                errors: vec!["/workspace/locked: Permission denied (os error 13)".to_owned()],
            }
        );
    }
    rg.shutdown().await.expect("shut the session down");
    fallback.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_cut_at_its_limit_leaves_no_process_behind() {
    let host = host_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("many.txt"), "needle\n".repeat(300_000)).expect("write");
    let backend = crate::support::session(&host, ws.path()).await;
    let got = backend
        .search()
        .grep(
            grep_request("/workspace", None, 0, 1),
            CancellationToken::new(),
        )
        .await
        .expect("grep");
    assert_eq!(got.files.len(), 1);
    assert_eq!(got.files[0].lines.len(), 1);
    // The helper kills rg once we stop reading; wait for it (bounded), never for a fixed time.
    let mut left = String::new();
    for _ in 0..300 {
        left = crate::support::run(&backend, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done | grep -c '^rg ' || true")
            .await
            .output;
        if left == "0\n" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(left, "0\n", "rg is still running after the search returned");
    backend.shutdown().await.expect("shut the session down");
}
