use std::os::unix::fs::PermissionsExt;

use super::*;

fn fifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
}

#[test]
fn a_symlink_is_refused_and_its_target_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::write(&target, "keep").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for mode in [WriteMode::Append, WriteMode::Truncate, WriteMode::Existing] {
        let error = open_write(&link, mode).unwrap_err();
        assert!(matches!(error, HostFileError::Symlink { .. }), "{error}");
    }
    assert!(matches!(
        open_read(&link, Trust::Any).unwrap_err(),
        HostFileError::Symlink { .. }
    ));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
}

#[test]
fn a_dangling_symlink_does_not_create_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("made-by-cordon");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let error = open_write(&link, WriteMode::Append).unwrap_err();
    assert!(matches!(error, HostFileError::Symlink { .. }), "{error}");
    assert!(!target.exists());
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fifo");
    fifo(&path);
    // Each of these would block forever on a FIFO without a peer if the open blocked.
    let read = open_read(&path, Trust::Any).unwrap_err();
    assert!(
        matches!(
            read,
            HostFileError::WrongType {
                found: "a FIFO",
                ..
            }
        ),
        "{read}"
    );
    let append = open_write(&path, WriteMode::Append).unwrap_err();
    assert!(
        matches!(
            append,
            HostFileError::WrongType {
                found: "a FIFO",
                ..
            }
        ),
        "{append}"
    );
    // Write-only on a FIFO without a reader fails at once (ENXIO) instead of blocking.
    assert!(open_write(&path, WriteMode::Truncate).is_err());
}

#[test]
fn directories_are_files_only_where_expected() {
    let dir = tempfile::tempdir().unwrap();
    let error = open_read(dir.path(), Trust::Any).unwrap_err();
    assert!(
        matches!(
            error,
            HostFileError::WrongType {
                found: "a directory",
                ..
            }
        ),
        "{error}"
    );
    open_dir(dir.path(), Trust::Any).expect("a directory opens as one");
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    assert!(open_dir(&file, Trust::Any).is_err());
}

#[test]
fn trusted_files_must_not_be_writable_by_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, "x").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    let error = open_read(&path, Trust::Owned).unwrap_err();
    assert!(
        matches!(error, HostFileError::Writable { mode: 0o664, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("chmod go-w"), "{error}");
    open_read(&path, Trust::Any).expect("untrusted reads do not care");
    assert!(matches!(
        open_write(&path, WriteMode::Append).unwrap_err(),
        HostFileError::Writable { .. }
    ));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    open_read(&path, Trust::Owned).expect("owner-writable only is fine");
}

#[test]
fn trusted_files_must_belong_to_the_user_or_root() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    std::fs::write(&path, "").unwrap();
    let me = nix::unistd::geteuid().as_raw();
    let other = if me == 0 { 4242 } else { me };
    if me != 0 {
        // Only root can give a file away; as another user the check is the same code path.
        return assert!(open_write(&path, WriteMode::Append).is_ok());
    }
    std::os::unix::fs::chown(&path, Some(other), None).unwrap();
    let error = open_write(&path, WriteMode::Append).unwrap_err();
    assert!(
        matches!(error, HostFileError::Owner { owner: 4242, .. }),
        "{error}"
    );
}

#[test]
fn created_files_are_private_and_truncate_waits_for_the_checks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.jsonl");
    drop(open_write(&path, WriteMode::Append).unwrap());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o077, 0, "mode {mode:o}");
    std::fs::write(&path, "old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(open_write(&path, WriteMode::Truncate).is_err());
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "old",
        "not truncated"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    drop(open_write(&path, WriteMode::Truncate).unwrap());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
}

#[test]
fn read_to_string_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    std::fs::write(&path, "12345").unwrap();
    assert_eq!(read_to_string(&path, Trust::Any, 5).unwrap(), "12345");
    assert!(matches!(
        read_to_string(&path, Trust::Any, 4).unwrap_err(),
        HostFileError::TooLarge { limit: 4, .. }
    ));
}

#[test]
fn shared_configuration_follows_symlinks_but_not_into_fifos() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("config");
    std::fs::write(&real, "Host a\n").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_eq!(
        read_following_to_string(&link, Trust::Owned, 100).unwrap(),
        "Host a\n"
    );
    let pipe = dir.path().join("fifo");
    fifo(&pipe);
    let to_pipe = dir.path().join("to-fifo");
    std::os::unix::fs::symlink(&pipe, &to_pipe).unwrap();
    let error = read_following_to_string(&to_pipe, Trust::Owned, 100).unwrap_err();
    assert!(
        matches!(
            error,
            HostFileError::WrongType {
                found: "a FIFO",
                ..
            }
        ),
        "{error}"
    );
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o646)).unwrap();
    assert!(matches!(
        read_following_to_string(&link, Trust::Owned, 100).unwrap_err(),
        HostFileError::Writable { .. }
    ));
}

#[test]
fn trusted_files_with_a_second_hard_link_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    std::fs::write(&path, "x").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let other = dir.path().join("planted");
    std::fs::hard_link(&path, &other).unwrap();
    for error in [
        open_read(&path, Trust::Owned).unwrap_err(),
        open_write(&path, WriteMode::Append).unwrap_err(),
        open_write(&path, WriteMode::Truncate).unwrap_err(),
    ] {
        assert!(
            matches!(error, HostFileError::HardLinked { links: 2, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("mv "), "{error}");
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"x",
        "truncate waited for the check"
    );
    open_read(&path, Trust::Any).expect("untrusted reads do not care");
    assert_eq!(
        read_following_to_string(&path, Trust::Owned, 100).unwrap(),
        "x",
        "shared configuration may be hard-linked"
    );
    std::fs::remove_file(&other).unwrap();
    open_write(&path, WriteMode::Append).expect("one link is fine");
}
