use super::*;

fn mkdirs(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
}

fn touch(path: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, "ref: refs/heads/main\n").unwrap();
}

/// A git directory's signature at `dir`.
fn git_dir_layout(dir: &Path) {
    touch(&dir.join("HEAD"));
    mkdirs(&dir.join("objects"));
    mkdirs(&dir.join("refs"));
}

fn root() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap().join("ws");
    mkdirs(&root);
    (dir, root)
}

#[test]
fn existing_metadata_is_recorded_and_protected_new_metadata_is_quarantined() {
    let (_tmp, ws) = root();
    git_dir_layout(&ws.join(".git"));
    git_dir_layout(&ws.join("vendor/lib/.git"));
    touch(&ws.join("sub/.git")); // a gitfile (submodule)
    git_dir_layout(&ws.join("fixtures/bare.git"));
    let (mut guard, quarantined) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
    assert!(quarantined.is_empty());
    assert_eq!(
        guard.protected_paths(),
        vec![
            ws.join(".git"),
            ws.join("fixtures/bare.git"),
            ws.join("sub/.git"),
            ws.join("vendor/lib/.git"),
        ]
    );
    assert!(guard.sweep().unwrap().is_empty());

    // A command makes a nested repository and turns a plain directory into a bare one.
    git_dir_layout(&ws.join("src/.git"));
    touch(&ws.join("src/.git/config"));
    git_dir_layout(&ws.join("docs"));
    let quarantined = guard.sweep().unwrap();
    assert_eq!(
        quarantined,
        vec![
            Quarantined {
                path: ws.join("docs"),
                kind: GitKind::GitDir,
                renamed_to: ws.join("docs/HEAD.cordon-quarantine"),
            },
            Quarantined {
                path: ws.join("src/.git"),
                kind: GitKind::DotGit,
                renamed_to: ws.join("src/.git.cordon-quarantine"),
            },
        ]
    );
    assert!(!ws.join("src/.git").exists());
    assert!(ws.join("src/.git.cordon-quarantine/config").exists());
    // The renamed directory is not a git directory either.
    assert!(
        ws.join("src/.git.cordon-quarantine/HEAD.cordon-quarantine")
            .exists()
    );
    assert!(!ws.join("docs/HEAD").exists());
    // The operator's metadata is untouched.
    assert!(ws.join("vendor/lib/.git/HEAD").exists());
    assert!(ws.join("fixtures/bare.git/HEAD").exists());
    assert!(guard.sweep().unwrap().is_empty());

    // Again: the quarantine name is taken, the next one is used.
    git_dir_layout(&ws.join("src/.git"));
    let again = guard.sweep().unwrap();
    assert_eq!(again[0].renamed_to, ws.join("src/.git.cordon-quarantine-2"));
}

#[test]
fn a_replaced_operator_repository_counts_as_new_and_symlinks_are_not_followed() {
    let (tmp, ws) = root();
    let outside = tmp.path().canonicalize().unwrap().join("outside");
    git_dir_layout(&outside.join("repo/.git"));
    touch(&ws.join("a/.git"));
    std::os::unix::fs::symlink(outside.join("repo"), ws.join("link")).unwrap();
    let (mut guard, _) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
    assert_eq!(guard.protected_paths(), vec![ws.join("a/.git")]);
    // Replaced by a new inode: not the operator's any more.
    std::fs::remove_file(ws.join("a/.git")).unwrap();
    touch(&ws.join("a/.git"));
    let quarantined = guard.sweep().unwrap();
    assert_eq!(quarantined.len(), 1);
    assert_eq!(quarantined[0].path, ws.join("a/.git"));
    // Nothing outside the root was touched through the link.
    assert!(outside.join("repo/.git/HEAD").exists());
}

#[test]
fn a_root_that_is_a_git_directory_protects_its_entries() {
    let (_tmp, ws) = root();
    git_dir_layout(&ws);
    touch(&ws.join("config"));
    let (guard, _) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
    assert_eq!(
        guard.protected_paths(),
        vec![
            ws.join("HEAD"),
            ws.join("config"),
            ws.join("objects"),
            ws.join("refs"),
        ]
    );
}

#[test]
fn a_bare_layout_made_in_the_root_is_quarantined_and_placeholders_are_skipped() {
    let (_tmp, ws) = root();
    let (mut guard, _) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
    // A sandbox placeholder at a missing protected `.git`.
    std::fs::create_dir(ws.join(".git")).unwrap();
    std::fs::set_permissions(
        ws.join(".git"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1500),
    )
    .unwrap();
    assert!(guard.sweep().unwrap().is_empty());
    touch(&ws.join("HEAD"));
    touch(&ws.join("commondir"));
    let quarantined = guard.sweep().unwrap();
    assert_eq!(quarantined.len(), 1);
    assert_eq!(quarantined[0].renamed_to, ws.join("HEAD.cordon-quarantine"));
}

/// A placeholder `.git` is judged once and then known by its stamp; anything that changes it
/// (an entry added, a swap for another directory with the marker mode) is judged afresh.
#[test]
fn a_known_placeholder_is_not_reread_but_a_changed_one_is_judged_again() {
    let (_tmp, ws) = root();
    mkdirs(&ws.join("sub"));
    let (mut guard, _) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
    let placeholder = |path: &Path| {
        std::fs::create_dir(path).unwrap();
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o1500))
            .unwrap();
    };
    placeholder(&ws.join("sub/.git"));
    assert!(guard.sweep().unwrap().is_empty());
    assert!(guard.sweep().unwrap().is_empty(), "known placeholder");
    // An entry in it (its ctime changes): no longer an empty placeholder.
    touch(&ws.join("sub/.git/config"));
    let quarantined = guard.sweep().unwrap();
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    assert_eq!(quarantined[0].path, ws.join("sub/.git"));
    // A fresh placeholder, then swapped for a non-empty directory with the marker mode.
    placeholder(&ws.join("sub/.git"));
    assert!(guard.sweep().unwrap().is_empty());
    let other = ws.join("other");
    mkdirs(&other);
    touch(&other.join("config"));
    std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o1500)).unwrap();
    std::fs::remove_dir(ws.join("sub/.git")).unwrap();
    std::fs::rename(&other, ws.join("sub/.git")).unwrap();
    let quarantined = guard.sweep().unwrap();
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    assert_eq!(quarantined[0].path, ws.join("sub/.git"));
}

/// A listing taken within the timestamp granularity of a change can miss it under an
/// unchanged stamp (coarse ctime): it is trusted again only once settled.
#[test]
fn a_cached_listing_is_reused_on_its_stamp_only_once_settled() {
    for settled in [false, true] {
        let (_tmp, ws) = root();
        mkdirs(&ws.join("sub"));
        let (mut guard, _) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
        git_dir_layout(&ws.join("sub/.git"));
        // What a read of `sub` just before that change would have cached, under the stamp
        // `sub` has now.
        let meta = std::fs::symlink_metadata(ws.join("sub")).unwrap();
        guard.cache.insert(
            ws.join("sub"),
            CachedDir {
                stamp: stamp_of(&meta),
                subdirs: Vec::new(),
                dot_git: false,
                git_dir: false,
                placeholder_git: None,
                settled,
            },
        );
        let quarantined = guard.sweep().unwrap();
        if settled {
            assert!(quarantined.is_empty(), "a settled listing is trusted");
        } else {
            assert_eq!(quarantined.len(), 1, "an unsettled listing is read again");
            assert_eq!(quarantined[0].path, ws.join("sub/.git"));
        }
    }
}

/// A FIFO (even with the placeholder's mode) at `.git` is not a placeholder: it is judged
/// without being opened, so the sweep neither blocks nor skips it.
#[test]
fn a_fifo_at_dot_git_is_quarantined_without_blocking() {
    let (_tmp, ws) = root();
    mkdirs(&ws.join("sub"));
    let (mut guard, _) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
    nix::unistd::mkfifo(
        &ws.join("sub/.git"),
        nix::sys::stat::Mode::from_bits_truncate(0o1500),
    )
    .unwrap();
    let quarantined = guard.sweep().unwrap();
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    assert_eq!(quarantined[0].path, ws.join("sub/.git"));
}

#[test]
fn a_dead_session_s_leftovers_are_quarantined_at_the_next_start() {
    let (tmp, ws) = root();
    let state = tmp.path().join("state");
    mkdirs(&state);
    git_dir_layout(&ws.join("old/.git"));
    // A session whose process is gone knew only `old/.git`.
    let meta = std::fs::symlink_metadata(ws.join("old/.git")).unwrap();
    std::fs::write(
        state.join(format!("{}-0000000000000000.baseline", i32::MAX)),
        {
            let (dev, ino, born) = id_of(&meta);
            format!("{dev} {ino} {born}\n")
        },
    )
    .unwrap();
    git_dir_layout(&ws.join("left/.git"));
    let (mut guard, quarantined) =
        GitGuard::start(std::slice::from_ref(&ws), &[], Some(&state)).unwrap();
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    assert_eq!(quarantined[0].path, ws.join("left/.git"));
    assert_eq!(guard.protected_paths(), vec![ws.join("old/.git")]);
    // Only this guard's baseline is left; a clean finish removes it.
    let files: Vec<_> = std::fs::read_dir(&state).unwrap().flatten().collect();
    assert_eq!(files.len(), 1);
    assert!(
        files[0]
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("{}-", std::process::id()))
    );
    guard.finish().unwrap();
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
}

#[test]
fn the_note_names_each_rename_and_the_policy_setting() {
    let note = quarantine_note(
        &[Quarantined {
            path: PathBuf::from("/w/src/.git"),
            kind: GitKind::DotGit,
            renamed_to: PathBuf::from("/w/src/.git.cordon-quarantine"),
        }],
        Path::to_path_buf,
    )
    .unwrap();
    assert!(
        note.contains("/w/src/.git -> /w/src/.git.cordon-quarantine"),
        "{note}"
    );
    assert!(note.contains("nested_git = \"allow\""), "{note}");
    assert_eq!(quarantine_note(&[], Path::to_path_buf), None);
}

#[test]
fn an_exempt_workspace_git_is_neither_recorded_nor_quarantined() {
    let (_tmp, ws) = root();
    let (mut guard, _) =
        GitGuard::start(std::slice::from_ref(&ws), &[ws.join(".git")], None).unwrap();
    git_dir_layout(&ws.join(".git"));
    assert!(guard.sweep().unwrap().is_empty());
    assert!(guard.protected_paths().is_empty());
    assert!(ws.join(".git/HEAD").exists());
}

#[test]
fn writes_that_make_git_metadata_are_recognised() {
    let (_tmp, ws) = root();
    mkdirs(&ws.join("data/objects"));
    mkdirs(&ws.join("data/refs"));
    touch(&ws.join("plain/HEAD"));
    for (rel, makes) in [
        ("src/.git/config", true),
        (".git", true),
        ("data/HEAD", true),
        ("data/other", false),
        ("plain/commondir", true),
        ("plain/objects/x", false),
        ("plain/sub/HEAD", false),
        ("gitignore/.gitignore", false),
    ] {
        assert_eq!(makes_git_metadata(&ws.join(rel), &ws), makes, "{rel}");
    }
    // Above the root nothing counts.
    assert!(!makes_git_metadata(&ws.join("x"), &ws.join("data/objects")));
}

/// `levels` repositories, each inside the previous one's `.git`: `ws/a/.git/a/.git/…`.
fn nested_repositories(ws: &Path, levels: usize) -> PathBuf {
    let mut dir = ws.to_path_buf();
    for _ in 0..levels {
        dir = dir.join("a/.git");
        git_dir_layout(&dir);
    }
    dir
}

#[test]
fn deeply_nested_repositories_are_all_quarantined_in_one_sweep() {
    let (_tmp, ws) = root();
    let (mut guard, _) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
    nested_repositories(&ws, 20);
    let quarantined = guard.sweep().unwrap();
    assert_eq!(quarantined.len(), 20, "{quarantined:#?}");
    let (fresh, _) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
    assert!(fresh.recorded().is_empty(), "{:#?}", fresh.recorded());
}

#[test]
fn repositories_nested_deeper_than_the_bound_fail_the_sweep() {
    let (_tmp, ws) = root();
    let (mut guard, _) = GitGuard::start(std::slice::from_ref(&ws), &[], None).unwrap();
    nested_repositories(&ws, MAX_SWEEP_PASSES + 1);
    let error = guard.sweep().unwrap_err();
    assert!(
        matches!(error, GitGuardError::TooDeep { limit, .. } if limit == MAX_SWEEP_PASSES),
        "{error}"
    );
    assert!(error.to_string().contains("before running git on the host"));
    // The next sweep goes on from there.
    assert_eq!(guard.sweep().unwrap().len(), 1);
}

const UNREADABLE_ENV: &str = "CORDON_GIT_GUARD_UNREADABLE_DIRS";

/// Root reads every directory, so the restore path only runs for another user: run as root,
/// this test runs itself again as uid 65534 on directories set up for that user (one it
/// owns, one root owns that it can search but not read); run as another user, it checks the
/// restore path directly (a directory of another owner cannot be made then).
#[test]
fn unreadable_directories_are_restored_or_fail_the_sweep() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if let Ok(dirs) = std::env::var(UNREADABLE_ENV) {
        let (own, foreign) = dirs.split_once(':').unwrap();
        unreadable_body(Path::new(own), Some(Path::new(foreign)));
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let base_path = base.path().canonicalize().unwrap();
    let own = base_path.join("own");
    mkdirs(&own);
    if !nix::unistd::geteuid().is_root() {
        unreadable_body(&own, None);
        return;
    }
    let foreign_ws = base_path.join("foreign-ws");
    mkdirs(&foreign_ws);
    for dir in [&base_path, &own, &foreign_ws] {
        std::os::unix::fs::chown(dir, Some(65534), Some(65534)).unwrap();
    }
    let foreign = foreign_ws.join("foreign");
    mkdirs(&foreign);
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o311)).unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "git_guard::tests::unreadable_directories_are_restored_or_fail_the_sweep",
            "--test-threads=1",
        ])
        .env(
            UNREADABLE_ENV,
            format!("{}:{}", own.display(), foreign_ws.display()),
        )
        .uid(65534)
        .gid(65534)
        .status()
        .unwrap();
    assert!(status.success(), "the run as uid 65534 failed: {status}");
}

fn unreadable_body(own: &Path, foreign_ws: Option<&Path>) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    let (mut guard, _) = GitGuard::start(&[own.to_path_buf()], &[], None).unwrap();
    // A command hides a repository in a directory nobody can list, and makes the root
    // unlistable too.
    git_dir_layout(&own.join("sub/hidden/.git"));
    std::fs::set_permissions(own.join("sub"), std::fs::Permissions::from_mode(0o311)).unwrap();
    std::fs::set_permissions(own, std::fs::Permissions::from_mode(0o311)).unwrap();
    assert!(std::fs::read_dir(own).is_err(), "unreadable now");
    let quarantined = guard.sweep().unwrap();
    assert_eq!(
        quarantined
            .iter()
            .map(|entry| entry.path.clone())
            .collect::<Vec<_>>(),
        vec![own.join("sub/hidden/.git")]
    );
    assert_eq!(mode(own), 0o711);
    assert_eq!(mode(&own.join("sub")), 0o711);
    if let Some(foreign_ws) = foreign_ws {
        let error = GitGuard::start(&[foreign_ws.to_path_buf()], &[], None).unwrap_err();
        assert!(
            matches!(&error, GitGuardError::Unreadable { path, .. } if path == &foreign_ws.join("foreign")),
            "{error}"
        );
        assert!(error.to_string().contains("chmod u+rx"), "{error}");
    }
}

#[test]
fn a_hooks_path_inside_the_root_is_protected() {
    let (_tmp, ws) = root();
    git_dir_layout(&ws.join(".git"));
    std::fs::write(
        ws.join(".git/config"),
        "[core]\n\tbare = false\n[user]\n\thooksPath = ignored\n[CORE]\n\thooksPath = \"./.husky\" # husky\n",
    )
    .unwrap();
    touch(&ws.join(".husky/pre-commit"));
    let exempt = [ws.join(".git")];
    let (guard, _) = GitGuard::start(std::slice::from_ref(&ws), &exempt, None).unwrap();
    assert_eq!(guard.protected_paths(), vec![ws.join(".husky")]);

    // Outside the writable roots it is not Cordon's to protect.
    std::fs::write(ws.join(".git/config"), "[core]\n\thooksPath = ../hooks\n").unwrap();
    let (guard, _) = GitGuard::start(std::slice::from_ref(&ws), &exempt, None).unwrap();
    assert!(guard.protected_paths().is_empty());
    assert_eq!(
        config_hooks_path("[core]\n\thooksPath = a\n\thookspath = b\n").as_deref(),
        Some("b")
    );
}
