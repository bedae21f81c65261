//! grep and find on the remote host: `rg --json` and the POSIX fallback give the same data
//! (sorted, `.gitignore` respected, hidden files included, `.git/` never entered, context
//! merged, stopping at the limit, regular files only for find).

use std::path::{Path, PathBuf};

use cordon_backend_ssh::SshBackend;
use cordon_ops::{Backend, FindRequest, GrepLine, GrepRequest, SearchError};
use tokio_util::sync::CancellationToken;

use super::support::{Server, server};

fn tree(ws: &Path) {
    let write = |rel: &str, text: &str| {
        let path = ws.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(".gitignore", "ignored.txt\nbuild/\n");
    write("a.txt", "one\nneedle 1\ntwo\nthree\nneedle 2\nfour\n");
    write("ignored.txt", "needle ignored\n");
    write("build/out.txt", "needle built\n");
    write(".hidden.txt", "needle hidden\n");
    write(".git/HEAD", "needle in git\n");
    write("src/deep/b.rs", "fn needle() {}\n");
    write("src/c.rs", "nothing\n");
    std::os::unix::fs::symlink("a.txt", ws.join("link.txt")).unwrap();
}

fn grep_request(ws: &Path, pattern: &str, context: usize, max: usize) -> GrepRequest {
    GrepRequest {
        pattern: pattern.to_owned(),
        path: ws.to_path_buf(),
        glob: None,
        ignore_case: false,
        literal: false,
        context,
        max_matches: max,
    }
}

async fn both(server: &Server) -> (SshBackend, SshBackend) {
    let rg = server.connect().await;
    assert!(
        rg.has_rg(),
        "the test host needs rg for the fast path (apt-get install ripgrep)"
    );
    let mut config = server.config();
    config.force_search_fallback = true;
    let fallback = SshBackend::connect(config).await.unwrap();
    assert!(!fallback.has_rg());
    (rg, fallback)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_data_is_the_same_with_rg_and_the_fallback() {
    let Some(server) = server() else { return };
    let ws = server.workspace.canonicalize().unwrap();
    tree(&ws);
    let (rg, fallback) = both(&server).await;
    let request = grep_request(&ws, "needle", 1, 100);
    let a = rg
        .search()
        .grep(request.clone(), CancellationToken::new())
        .await
        .unwrap();
    let b = fallback
        .search()
        .grep(request, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(a, b);
    let paths: Vec<PathBuf> = a.files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(
        paths,
        vec![
            ws.join(".hidden.txt"),
            ws.join("a.txt"),
            ws.join("src/deep/b.rs"),
        ]
    );
    // Context windows of the two matches in a.txt overlap and are merged.
    let lines: Vec<(u64, bool)> = a.files[1]
        .lines
        .iter()
        .map(
            |GrepLine {
                 number, is_match, ..
             }| (*number, *is_match),
        )
        .collect();
    assert_eq!(
        lines,
        vec![
            (1, false),
            (2, true),
            (3, false),
            (4, false),
            (5, true),
            (6, false)
        ]
    );

    // Stops at the limit.
    let limited = grep_request(&ws, "needle", 0, 2);
    let a = rg
        .search()
        .grep(limited.clone(), CancellationToken::new())
        .await
        .unwrap();
    let b = fallback
        .search()
        .grep(limited, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(a, b);
    let count: usize = a.files.iter().map(|f| f.lines.len()).sum();
    assert_eq!(count, 2);

    // Glob, case-insensitive literal.
    let mut globbed = grep_request(&ws, "NEEDLE()", 0, 100);
    globbed.glob = Some("*.rs".into());
    globbed.ignore_case = true;
    globbed.literal = true;
    let a = rg
        .search()
        .grep(globbed.clone(), CancellationToken::new())
        .await
        .unwrap();
    let b = fallback
        .search()
        .grep(globbed, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.files.len(), 1);
    assert_eq!(a.files[0].path, ws.join("src/deep/b.rs"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_errors() {
    let Some(server) = server() else { return };
    let backend = server.connect().await;
    let ws = server.workspace.canonicalize().unwrap();
    let bad = grep_request(&ws, "a(", 0, 10);
    assert!(matches!(
        backend.search().grep(bad, CancellationToken::new()).await,
        Err(SearchError::InvalidPattern { what: "regex", .. })
    ));
    let missing = grep_request(&ws.join("nope"), "x", 0, 10);
    assert!(matches!(
        backend
            .search()
            .grep(missing, CancellationToken::new())
            .await,
        Err(SearchError::PathNotFound { .. })
    ));
    let outside = grep_request(Path::new("/etc"), "x", 0, 10);
    assert!(matches!(
        backend
            .search()
            .grep(outside, CancellationToken::new())
            .await,
        Err(SearchError::OutsideRoot { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_lists_regular_files_sorted_and_ignore_aware() {
    let Some(server) = server() else { return };
    let ws = server.workspace.canonicalize().unwrap();
    tree(&ws);
    let backend = server.connect().await;
    let request = FindRequest {
        pattern: "*".into(),
        path: ws.clone(),
        max_results: 100,
    };
    let found = backend
        .search()
        .find(request, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        found.paths,
        vec![
            ws.join(".gitignore"),
            ws.join(".hidden.txt"),
            ws.join("a.txt"),
            ws.join("link.txt"),
            ws.join("src/c.rs"),
            ws.join("src/deep/b.rs"),
        ]
    );
    let request = FindRequest {
        pattern: "src/**/*.rs".into(),
        path: ws.clone(),
        max_results: 1,
    };
    let found = backend
        .search()
        .find(request, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(found.paths, vec![ws.join("src/c.rs")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_paths_are_never_listed() {
    let Some(server) = server() else { return };
    let ws = server.workspace.canonicalize().unwrap();
    tree(&ws);
    std::fs::write(ws.join(".env"), "needle=token\n").unwrap();
    std::fs::create_dir(ws.join("secret")).unwrap();
    std::fs::write(ws.join("secret/key.txt"), "needle key\n").unwrap();
    let mut results = Vec::new();
    for fallback in [false, true] {
        let mut config = server.config();
        config.spec.denied = vec!["**/.env".into(), "secret".into()];
        config.force_search_fallback = fallback;
        let backend = SshBackend::connect(config).await.unwrap();
        let grep = backend
            .search()
            .grep(
                grep_request(&ws, "needle", 0, 100),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        let find = backend
            .search()
            .find(
                FindRequest {
                    pattern: "*".into(),
                    path: ws.clone(),
                    max_results: 100,
                },
                CancellationToken::new(),
            )
            .await
            .unwrap();
        for path in grep.files.iter().map(|f| &f.path).chain(find.paths.iter()) {
            assert!(
                !path.ends_with(".env") && !path.starts_with(ws.join("secret")),
                "denied path listed: {}",
                path.display()
            );
        }
        results.push((grep, find));
    }
    assert_eq!(results[0], results[1]);
}
