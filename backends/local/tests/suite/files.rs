//! FileOperations: confinement by the kernel, protected and denied paths, atomic writes,
//! metadata, listings, canonical paths.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use cordon_backend_local::{LocalBackend, LocalConfig, LocalError};
use cordon_core::sandbox::RootAccess;
use cordon_ops::{Backend, FileKind, FsError};

use super::support::{Fixture, names, snapshot};

fn assert_outside(result: Result<impl std::fmt::Debug, FsError>, path: &Path) {
    match result {
        Err(FsError::OutsideRoot { path: named }) => {
            assert_eq!(named, path, "the error names the requested path");
        }
        other => panic!("expected OutsideRoot for {}, got {other:?}", path.display()),
    }
}

/// Every way out of the workspace is refused for reads and writes, and the outside file is
/// untouched (content, mtime, inode) with no temp file left next to it.
#[tokio::test]
async fn escapes_are_refused_and_leave_the_outside_untouched() {
    let fx = Fixture::new();
    let files = fx.files();
    let secret = fx.outside.join("secret.txt");
    let before = snapshot(&secret);
    symlink(&secret, fx.at("file-link")).unwrap();
    symlink(&fx.outside, fx.at("dir-link")).unwrap();
    symlink("../outside", fx.at("relative-dir-link")).unwrap();
    std::fs::create_dir(fx.at("sub")).unwrap();
    symlink("../../outside/secret.txt", fx.at("sub/up-link")).unwrap();

    let attempts: Vec<PathBuf> = vec![
        fx.ws.join("../outside/secret.txt"),
        secret.clone(),
        fx.at("file-link"),
        fx.at("dir-link/secret.txt"),
        fx.at("relative-dir-link/secret.txt"),
        fx.at("sub/up-link"),
        PathBuf::from("/etc/shadow"),
    ];
    for path in &attempts {
        assert_outside(files.read_file(path).await, path);
        assert_outside(files.read_head(path, 4).await, path);
        assert_outside(files.read_range(path, 1, 4).await, path);
        assert_outside(files.write_file(path, b"pwned").await, path);
        assert_outside(files.metadata(path).await, path);
        assert_outside(files.canonicalize(path).await, path);
    }
    for path in [
        fx.at("dir-link/new.txt"),
        fx.at("relative-dir-link/new.txt"),
        fx.ws.join("../outside/new.txt"),
    ] {
        assert_outside(files.write_file(&path, b"pwned").await, &path);
        assert_outside(files.create_dir_all(&path).await, &path);
    }
    assert_outside(files.read_dir(&fx.at("dir-link")).await, &fx.at("dir-link"));
    assert_eq!(snapshot(&secret), before, "outside file unchanged");
    assert_eq!(
        names(&fx.outside),
        vec!["secret.txt"],
        "nothing created outside"
    );
    assert!(
        std::fs::symlink_metadata(fx.at("file-link"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link itself was not replaced either"
    );
    let message = files
        .read_file(&fx.at("file-link"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        format!(
            "path is outside the allowed roots: {}",
            fx.at("file-link").display()
        )
    );
}

/// Symlinks that stay inside, including absolute ones (which RESOLVE_BENEATH alone refuses),
/// work for reads and writes; writes replace the target, not the link.
#[tokio::test]
async fn symlinks_inside_the_workspace_are_followed() {
    let fx = Fixture::new();
    let files = fx.files();
    let real = fx.put("dir/real.txt", "real\n");
    symlink("real.txt", fx.at("dir/relative")).unwrap();
    symlink(&real, fx.at("absolute")).unwrap();
    symlink(fx.at("dir"), fx.at("dir-abs")).unwrap();
    assert_eq!(
        files.read_file(&fx.at("dir/relative")).await.unwrap(),
        b"real\n"
    );
    assert_eq!(
        files.read_file(&fx.at("absolute")).await.unwrap(),
        b"real\n"
    );
    assert_eq!(
        files.read_file(&fx.at("dir-abs/real.txt")).await.unwrap(),
        b"real\n"
    );
    files
        .write_file(&fx.at("absolute"), b"new\n")
        .await
        .unwrap();
    assert_eq!(std::fs::read(&real).unwrap(), b"new\n");
    assert!(
        std::fs::symlink_metadata(fx.at("absolute"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(files.canonicalize(&fx.at("absolute")).await.unwrap(), real);
    files
        .write_file(&fx.at("dir-abs/made.txt"), b"x")
        .await
        .unwrap();
    assert_eq!(std::fs::read(fx.at("dir/made.txt")).unwrap(), b"x");
    // A dangling link inside: writing through it creates its target.
    symlink("target.txt", fx.at("dir/dangling")).unwrap();
    files
        .write_file(&fx.at("dir/dangling"), b"t")
        .await
        .unwrap();
    assert_eq!(std::fs::read(fx.at("dir/target.txt")).unwrap(), b"t");
}

/// `.git/**` is readable but never writable, through any spelling.
#[tokio::test]
async fn protected_paths_are_readable_but_never_mutated() {
    let fx = Fixture::new();
    let files = fx.files();
    let config = fx.put(".git/config", "[core]\n");
    let before = snapshot(&config);
    symlink(".git/config", fx.at("config-link")).unwrap();
    symlink(fx.at(".git"), fx.at("git-link")).unwrap();
    assert_eq!(files.read_file(&config).await.unwrap(), b"[core]\n");
    assert_eq!(
        files.read_file(&fx.at("config-link")).await.unwrap(),
        b"[core]\n"
    );

    for path in [
        config.clone(),
        fx.at("config-link"),
        fx.at("git-link/config"),
        fx.at(".git/new-file"),
        fx.at("git-link/new-file"),
    ] {
        match files.write_file(&path, b"evil").await {
            Err(FsError::Protected { path: named }) => {
                assert!(named.starts_with(fx.at(".git")), "{}", named.display())
            }
            other => panic!(
                "expected Protected writing {}, got {other:?}",
                path.display()
            ),
        }
    }
    for dir in [
        fx.at(".git/hooks"),
        fx.at(".git"),
        fx.at("git-link/objects/xx"),
    ] {
        assert!(
            matches!(
                files.create_dir_all(&dir).await,
                Err(FsError::Protected { .. })
            ),
            "mkdir {}",
            dir.display()
        );
    }
    // A missing directory under a protected one: the parent is missing (the write tool's
    // create_dir_all of it is what gets refused as Protected, above).
    assert!(matches!(
        files
            .write_file(&fx.at("git-link/hooks/pre-commit"), b"evil")
            .await,
        Err(FsError::NotFound { .. })
    ));
    assert_eq!(snapshot(&config), before);
    assert_eq!(
        names(&fx.at(".git")),
        vec!["config"],
        "no temp file, no new entry"
    );
    assert!(!files.metadata(&config).await.unwrap().writable);
    assert!(!files.metadata(&fx.at(".git")).await.unwrap().writable);

    // A link created by a command (bash) is judged on its target just the same.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let outcome = fx
        .bash()
        .exec(
            cordon_ops::ExecRequest {
                call_id: None,
                command: "ln -s .git/config smuggle && ln -s .git smuggle-dir".into(),
                cwd: fx.ws.clone(),
                timeout: std::time::Duration::from_secs(30),
                env: Vec::new(),
            },
            tokio_util::sync::CancellationToken::new(),
            tx,
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, Some(cordon_ops::ExitStatus::Code(0)));
    for path in [fx.at("smuggle"), fx.at("smuggle-dir/config")] {
        assert!(
            matches!(
                files.write_file(&path, b"evil").await,
                Err(FsError::Protected { .. })
            ),
            "{}",
            path.display()
        );
    }
    assert_eq!(snapshot(&config), before);

    // `.git` as a file (worktree pointer) cannot be replaced as a whole either.
    let fx = Fixture::new();
    let pointer = fx.put(".git", "gitdir: /elsewhere\n");
    assert!(matches!(
        fx.files().write_file(&pointer, b"gitdir: /evil\n").await,
        Err(FsError::Protected { .. })
    ));
    assert_eq!(std::fs::read(&pointer).unwrap(), b"gitdir: /elsewhere\n");
}

/// Denied paths fail every operation with Denied, and listings show them without a kind.
#[tokio::test]
async fn denied_paths_fail_every_operation() {
    let fx = Fixture::new();
    let files = fx.files();
    let env = fx.put("app/.env", "TOKEN=1\n");
    symlink("app/.env", fx.at("env-link")).unwrap();
    for path in [env.clone(), fx.at("env-link")] {
        assert!(matches!(
            files.read_file(&path).await,
            Err(FsError::Denied { .. })
        ));
        assert!(matches!(
            files.read_head(&path, 1).await,
            Err(FsError::Denied { .. })
        ));
        assert!(matches!(
            files.write_file(&path, b"x").await,
            Err(FsError::Denied { .. })
        ));
        assert!(matches!(
            files.metadata(&path).await,
            Err(FsError::Denied { .. })
        ));
        assert!(matches!(
            files.canonicalize(&path).await,
            Err(FsError::Denied { .. })
        ));
    }
    assert!(matches!(
        files.write_file(&fx.at("new/.env"), b"x").await,
        Err(FsError::NotFound { .. })
    ));
    std::fs::create_dir(fx.at("new")).unwrap();
    assert!(matches!(
        files.write_file(&fx.at("new/.env"), b"x").await,
        Err(FsError::Denied { .. })
    ));
    assert_eq!(std::fs::read(&env).unwrap(), b"TOKEN=1\n");
    let listing = files.read_dir(&fx.at("app")).await.unwrap();
    assert_eq!(listing.len(), 1);
    assert_eq!(listing[0].name, ".env");
    assert_eq!(listing[0].kind, None);
    assert_eq!(listing[0].error.as_deref(), Some("access denied by policy"));
}

/// Atomic replacement keeps the mode (and owner) of the file; a new file gets 0644 & !umask.
#[tokio::test]
async fn writes_are_atomic_and_keep_permissions() {
    let fx = Fixture::new();
    let files = fx.files();
    let path = fx.put("keep-mode.sh", "old\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750)).unwrap();
    let inode_before = snapshot(&path).2;
    files.write_file(&path, b"new content\n").await.unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o750);
    assert_eq!(std::fs::read(&path).unwrap(), b"new content\n");
    assert_ne!(
        snapshot(&path).2,
        inode_before,
        "replaced by rename, not rewritten in place"
    );

    let fresh = fx.at("fresh.txt");
    files.write_file(&fresh, b"hi").await.unwrap();
    let umask = umask_of_this_process();
    assert_eq!(
        std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777,
        0o644 & !umask
    );
    assert_eq!(
        names(&fx.ws),
        vec!["fresh.txt", "keep-mode.sh"],
        "no temp files left"
    );

    // Missing parent: a clear error, and nothing created.
    match files.write_file(&fx.at("no/such/dir/f.txt"), b"x").await {
        Err(FsError::NotFound { path }) => assert_eq!(path, fx.at("no/such/dir")),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(matches!(
        files.write_file(&fx.ws, b"x").await,
        Err(FsError::IsADirectory { .. })
    ));
    assert_eq!(names(&fx.ws), vec!["fresh.txt", "keep-mode.sh"]);
}

fn umask_of_this_process() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).unwrap()
}

/// A read-only file is judged as an unprivileged process would, even when Cordon is root:
/// not writable, and write_file refuses it.
#[tokio::test]
async fn read_only_mode_bits_are_honoured_without_root_override() {
    let fx = Fixture::new();
    let files = fx.files();
    let path = fx.put("ro.txt", "frozen\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    let meta = files.metadata(&path).await.unwrap();
    assert_eq!(
        (meta.kind, meta.mode, meta.writable),
        (FileKind::File, 0o444, false)
    );
    assert!(matches!(
        files.write_file(&path, b"thawed").await,
        Err(FsError::PermissionDenied { .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), b"frozen\n");
    let ok = fx.put("rw.txt", "x");
    assert!(files.metadata(&ok).await.unwrap().writable);
}

/// A hardlink to an outside file is the same inode: reading it returns the outside content
/// (documented), writing replaces the link's directory entry and never modifies the outside
/// file.
#[tokio::test]
async fn hardlinks_to_outside_files_cannot_be_written_through() {
    let fx = Fixture::new();
    let files = fx.files();
    let secret = fx.outside.join("secret.txt");
    let before = snapshot(&secret);
    let hard = fx.at("hard.txt");
    std::fs::hard_link(&secret, &hard).unwrap();
    assert_eq!(files.read_file(&hard).await.unwrap(), b"outside secret\n");
    files.write_file(&hard, b"replaced\n").await.unwrap();
    assert_eq!(std::fs::read(&hard).unwrap(), b"replaced\n");
    assert_eq!(std::fs::read(&secret).unwrap(), before.0);
    assert_eq!(
        std::fs::metadata(&secret).unwrap().modified().unwrap(),
        before.1
    );
}

/// Extra readable roots can be read (also through a symlink from the workspace) but not
/// written; writable roots can be written.
#[tokio::test]
async fn readable_and_writable_roots() {
    let fx = Fixture::with(|spec, base| {
        std::fs::create_dir_all(base.join("toolchain/lib")).unwrap();
        std::fs::write(base.join("toolchain/lib/core.rs"), "pub fn core() {}\n").unwrap();
        std::fs::create_dir_all(base.join("cache")).unwrap();
        spec.readable_roots = vec![base.join("toolchain").display().to_string()];
        spec.writable_roots = vec![
            base.join("cache").display().to_string(),
            base.join("missing-root").display().to_string(),
        ];
    });
    let files = fx.files();
    let base = fx.ws.parent().unwrap().to_path_buf();
    let roots = fx.backend.allowed_roots();
    for expected in [
        (base.join("cache"), true),
        (fx.backend.spill_dir().to_path_buf(), false),
        (base.join("toolchain"), false),
        (fx.ws.clone(), true),
        (fx.backend.command_tmp_dir().to_path_buf(), true),
        (PathBuf::from("/usr"), false),
    ] {
        assert!(roots.contains(&expected), "{expected:?} in {roots:?}");
    }
    assert!(
        !roots.iter().any(|(path, _)| path.ends_with("missing-root")),
        "missing roots are skipped"
    );
    let core = base.join("toolchain/lib/core.rs");
    assert_eq!(files.read_file(&core).await.unwrap(), b"pub fn core() {}\n");
    symlink(base.join("toolchain"), fx.at("tc")).unwrap();
    assert_eq!(
        files.read_file(&fx.at("tc/lib/core.rs")).await.unwrap(),
        b"pub fn core() {}\n"
    );
    for path in [
        core.clone(),
        fx.at("tc/lib/core.rs"),
        base.join("toolchain/new.rs"),
    ] {
        assert!(
            matches!(
                files.write_file(&path, b"x").await,
                Err(FsError::PermissionDenied { .. })
            ),
            "{}",
            path.display()
        );
    }
    assert!(matches!(
        files.create_dir_all(&base.join("toolchain/newdir")).await,
        Err(FsError::PermissionDenied { .. })
    ));
    assert!(!files.metadata(&core).await.unwrap().writable);
    assert_eq!(std::fs::read(&core).unwrap(), b"pub fn core() {}\n");
    files
        .write_file(&base.join("cache/out.bin"), b"ok")
        .await
        .unwrap();
    files.create_dir_all(&base.join("cache/a/b")).await.unwrap();
    assert!(base.join("cache/a/b").is_dir());
    assert!(
        files
            .metadata(&base.join("cache/out.bin"))
            .await
            .unwrap()
            .writable
    );
}

/// A read-only workspace refuses every mutation.
#[tokio::test]
async fn read_only_workspace_refuses_writes() {
    let fx = Fixture::with(|spec, _| spec.workspace = RootAccess::ReadOnly);
    let files = fx.files();
    let path = fx.put("a.txt", "a");
    assert_eq!(files.read_file(&path).await.unwrap(), b"a");
    assert!(matches!(
        files.write_file(&path, b"b").await,
        Err(FsError::PermissionDenied { .. })
    ));
    assert!(matches!(
        files.create_dir_all(&fx.at("d")).await,
        Err(FsError::PermissionDenied { .. })
    ));
    assert!(!files.metadata(&path).await.unwrap().writable);
}

/// create_dir_all makes every missing level and is a no-op on an existing directory.
#[tokio::test]
async fn create_dir_all_creates_missing_levels() {
    let fx = Fixture::new();
    let files = fx.files();
    files.create_dir_all(&fx.at("a/b/c")).await.unwrap();
    assert!(fx.at("a/b/c").is_dir());
    files.create_dir_all(&fx.at("a/b/c")).await.unwrap();
    fx.put("file", "x");
    assert!(matches!(
        files.create_dir_all(&fx.at("file/sub")).await,
        Err(FsError::NotADirectory { .. })
    ));
}

/// Canonical paths resolve symlinks; missing paths keep their missing tail.
#[tokio::test]
async fn canonicalize_resolves_links_and_missing_tails() {
    let fx = Fixture::new();
    let files = fx.files();
    std::fs::create_dir(fx.at("real")).unwrap();
    symlink("real", fx.at("alias")).unwrap();
    symlink("real/later.txt", fx.at("dangling")).unwrap();
    assert_eq!(
        files.canonicalize(&fx.at("alias")).await.unwrap(),
        fx.at("real")
    );
    assert_eq!(
        files
            .canonicalize(&fx.at("alias/new/deeper.txt"))
            .await
            .unwrap(),
        fx.at("real/new/deeper.txt")
    );
    assert_eq!(
        files.canonicalize(&fx.at("dangling")).await.unwrap(),
        fx.at("real/later.txt")
    );
    assert_eq!(
        files
            .canonicalize(&fx.at("./real/../alias/x"))
            .await
            .unwrap(),
        fx.at("real/x")
    );
    assert!(matches!(
        files.canonicalize(&fx.at("missing/../x")).await,
        Err(FsError::NotFound { .. })
    ));
    assert_outside(
        files.canonicalize(&fx.outside.join("nope")).await,
        &fx.outside.join("nope"),
    );
}

/// Every entry is listed; kinds follow symlinks; dangling and outside-pointing links are
/// reported with a reason instead of being dropped.
#[tokio::test]
async fn read_dir_lists_every_entry() {
    let fx = Fixture::new();
    let files = fx.files();
    fx.put("d/file.txt", "x");
    std::fs::create_dir(fx.at("d/sub")).unwrap();
    symlink("sub", fx.at("d/to-sub")).unwrap();
    symlink("file.txt", fx.at("d/to-file")).unwrap();
    symlink("nowhere", fx.at("d/dangling")).unwrap();
    symlink(&fx.outside, fx.at("d/escape")).unwrap();
    nix::unistd::mkfifo(
        &fx.at("d/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let mut listing = files.read_dir(&fx.at("d")).await.unwrap();
    listing.sort_by(|a, b| a.name.cmp(&b.name));
    let summary: Vec<(String, Option<FileKind>, Option<String>)> = listing
        .into_iter()
        .map(|e| (e.name, e.kind, e.error))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "dangling".to_string(),
                None,
                Some("dangling symlink (its target does not exist)".to_string())
            ),
            (
                "escape".to_string(),
                None,
                Some("symlink points outside the allowed roots".to_string())
            ),
            ("fifo".to_string(), Some(FileKind::Other), None),
            ("file.txt".to_string(), Some(FileKind::File), None),
            ("sub".to_string(), Some(FileKind::Dir), None),
            ("to-file".to_string(), Some(FileKind::File), None),
            ("to-sub".to_string(), Some(FileKind::Dir), None),
        ]
    );
    assert!(matches!(
        files.read_dir(&fx.at("d/file.txt")).await,
        Err(FsError::NotADirectory { .. })
    ));
}

/// Special files are refused with a clear error instead of blocking (FIFO) or streaming
/// forever (device); directories give IsADirectory.
#[tokio::test]
async fn reading_special_files_fails_fast() {
    let fx = Fixture::new();
    let files = fx.files();
    let fifo = fx.at("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let err = files.read_file(&fifo).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("failed to read {}: a FIFO", fifo.display())
    );
    assert!(matches!(
        files.read_file(&fx.ws).await,
        Err(FsError::IsADirectory { .. })
    ));
    fx.put("big.txt", &"0123456789".repeat(100));
    assert_eq!(
        files.read_head(&fx.at("big.txt"), 12).await.unwrap(),
        b"012345678901"
    );
    assert_eq!(
        files
            .read_head(&fx.at("big.txt"), 5000)
            .await
            .unwrap()
            .len(),
        1000
    );
}

/// Large files take the blocking-pool path and come back whole.
#[tokio::test]
async fn large_files_round_trip() {
    let fx = Fixture::new();
    let files = fx.files();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    files.write_file(&fx.at("big.bin"), &data).await.unwrap();
    assert_eq!(files.read_file(&fx.at("big.bin")).await.unwrap(), data);
    assert_eq!(
        files.read_head(&fx.at("big.bin"), 300_000).await.unwrap(),
        data[..300_000]
    );
    // Ranges: inline and blocking sizes, a short read at the end, nothing past it.
    for (offset, len) in [(0, 10), (1_000, 300_000), (2_999_990, 100), (3_000_000, 5)] {
        let end = (offset + len).min(data.len());
        assert_eq!(
            files
                .read_range(&fx.at("big.bin"), offset as u64, len)
                .await
                .unwrap(),
            data[offset..end],
            "{offset}+{len}"
        );
    }
    assert!(
        files
            .read_range(&fx.at("big.bin"), 1 << 40, 5)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A range of a 1 TiB sparse file costs its length, not the file's size.
#[tokio::test]
async fn ranges_of_a_huge_sparse_file_are_bounded() {
    let fx = Fixture::new();
    let files = fx.files();
    let file = std::fs::File::create(fx.at("sparse.bin")).unwrap();
    file.set_len(1 << 40).unwrap();
    drop(file);
    let chunk = files
        .read_range(&fx.at("sparse.bin"), (1 << 40) - 4096, 1 << 20)
        .await
        .unwrap();
    assert_eq!(chunk, vec![0u8; 4096]);
}

/// Relative paths are taken from the workspace root; the backend id names the root.
#[tokio::test]
async fn ids_roots_and_relative_paths() {
    let fx = Fixture::new();
    let files = fx.files();
    fx.put("rel.txt", "r");
    assert_eq!(files.read_file(Path::new("rel.txt")).await.unwrap(), b"r");
    assert_eq!(files.root(), fx.ws);
    assert_eq!(
        fx.backend.id().as_str(),
        format!("local:{}", fx.ws.display())
    );
    assert_eq!(files.backend_id(), fx.backend.id());
    assert_eq!(
        files.home(),
        Some(fx.ws.parent().unwrap().join("home").as_path())
    );
}

/// The workspace root may be given through a symlink; that spelling keeps working.
#[tokio::test]
async fn root_given_through_a_symlink() {
    let fx = Fixture::new();
    fx.put("x.txt", "x");
    let link = fx.ws.parent().unwrap().join("ws-link");
    symlink(&fx.ws, &link).unwrap();
    let backend = LocalBackend::new(LocalConfig {
        profile: cordon_backend_local::Profile::Host,
        workspace_is_copy: false,
        root: link.clone(),
        spec: super::support::test_spec(),
        home: None,
        state_base: Some(fx.state.clone()),
    })
    .unwrap();
    assert_eq!(backend.root(), fx.ws);
    let files = backend.files();
    assert_eq!(files.read_file(&link.join("x.txt")).await.unwrap(), b"x");
    assert_eq!(files.read_file(&fx.at("x.txt")).await.unwrap(), b"x");
}

/// Filtered network mode builds its egress rules from the spec: an entry the policy compiler
/// would have refused (a hand-built spec) fails the backend naming the allow line.
#[test]
fn an_invalid_egress_entry_fails_the_backend_naming_the_allow_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = LocalConfig::new(dir.path());
    config.spec.network = cordon_core::sandbox::NetworkMode::Filtered;
    config.spec.egress.allow = vec!["crates.io".to_owned(), "B@d".to_owned()];
    config.spec.sources.file = "policy.toml".to_owned();
    config.spec.sources.egress_allow = vec![3, 4];
    let err = LocalBackend::new(config.clone()).unwrap_err();
    assert!(matches!(err, LocalError::EgressRules { .. }), "{err:?}");
    assert!(
        err.to_string().starts_with(
            "failed to compile the egress rules of `[network] allow` (policy.toml:3): "
        ),
        "{err}"
    );
    config.spec.egress.allow.pop();
    LocalBackend::new(config).expect("valid entries build a filtered backend");
}

/// A missing root or a file as root is a clear error naming it.
#[test]
fn bad_roots_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let err = LocalBackend::new(LocalConfig::new(&missing)).unwrap_err();
    assert!(matches!(err, LocalError::OpenRoot { .. }), "{err:?}");
    assert!(err.to_string().starts_with(&format!(
        "failed to open workspace root {}: ",
        missing.display()
    )));
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let err = LocalBackend::new(LocalConfig::new(&file)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "failed to use workspace root {}: not a directory",
            file.display()
        )
    );
    let err = LocalBackend::new(LocalConfig {
        spec: cordon_backend_local::SandboxSpec {
            denied: vec!["[oops".into()],
            ..Default::default()
        },
        ..LocalConfig::new(dir.path())
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("failed to compile path glob `[oops`"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canonicalize_names_the_path_while_the_file_is_replaced() {
    // Each write swaps a new inode in; a path read back from an fd that still holds the old
    // one would be the writer's temp name or "… (deleted)".
    let fx = Fixture::new();
    let path = fx.put("shared.txt", "0\n");
    let files = fx.files();
    let writer = {
        let (files, path) = (files.clone(), path.clone());
        tokio::spawn(async move {
            for round in 0..2_000 {
                files
                    .write_file(&path, format!("{round}\n").as_bytes())
                    .await
                    .unwrap();
            }
        })
    };
    let mut resolved = 0;
    while !writer.is_finished() {
        assert_eq!(files.canonicalize(&path).await.unwrap(), path);
        resolved += 1;
    }
    writer.await.unwrap();
    assert!(resolved > 0);
}
