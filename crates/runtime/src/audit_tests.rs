use std::os::unix::fs::PermissionsExt;

use super::*;
use cordon_policy::Decision;
use cordon_policy::audit::{verify_audit_log, verify_audit_log_from_head};

fn record(id: &str) -> AuditRecord {
    AuditRecord {
        ts: "2026-01-01T00:00:00.000Z".into(),
        backend: "local:/ws".into(),
        tool_call_id: id.into(),
        tool: "read".into(),
        args_sha256: "0".repeat(64),
        decision: Decision::Allow,
        rule: "builtin:default.toml:1".into(),
        reason: "allowed".into(),
        is_error: None,
        duration_ms: None,
        egress: Vec::new(),
        egress_omitted: 0,
    }
}

#[test]
fn reopening_continues_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let first = AuditLog::open(&path).unwrap();
    first.append(&record("a"), None).unwrap();
    drop(first);
    let log = AuditLog::open(&path).unwrap();
    assert_eq!(log.head().lines, 1);
    log.append(&record("b"), Some("eval")).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 2);
    verify_audit_log(&text).expect("chain continues across sessions");
}

#[test]
fn a_second_session_on_the_same_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let _held = AuditLog::open(&path).unwrap();
    let error = AuditLog::open(&path).unwrap_err();
    assert!(matches!(error, AuditError::Busy { .. }), "{error}");
}

#[test]
fn a_torn_last_line_is_not_continued() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    std::fs::write(&path, "{\"prev\":\"0\"").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let error = AuditLog::open(&path).unwrap_err();
    assert!(matches!(error, AuditError::Torn { .. }), "{error}");
}

#[test]
fn a_replaced_log_refuses_this_and_every_later_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path).unwrap();
    log.append(&record("a"), None).unwrap();
    // Swap in a different file at the path (what a sandboxed `mv` would do).
    let forged = dir.path().join("forged");
    std::fs::write(&forged, "").unwrap();
    std::fs::rename(&forged, &path).unwrap();
    let error = log.append(&record("b"), None).unwrap_err();
    assert!(
        matches!(&error, AuditError::Poisoned { reason, .. } if reason.contains("replaced")),
        "{error}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "",
        "nothing written to the new file"
    );
    assert!(matches!(
        log.append(&record("c"), None).unwrap_err(),
        AuditError::Poisoned { .. }
    ));
    assert!(log.finish().is_err(), "no head for a poisoned log");
    assert!(!head_file_path(&path).exists());
}

#[test]
fn a_truncated_or_extended_log_is_poisoned() {
    for change in ["truncate", "append"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        log.append(&record("a"), None).unwrap();
        let other = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        match change {
            "truncate" => other.set_len(0).unwrap(),
            _ => other.set_len(4096).unwrap(),
        }
        let error = log.append(&record("b"), None).unwrap_err();
        assert!(
            matches!(&error, AuditError::Poisoned { reason, .. } if reason.contains("length changed")),
            "{change}: {error}"
        );
        assert!(
            log.append(&record("c"), None).is_err(),
            "{change}: stays refused"
        );
    }
}

#[test]
fn finish_records_the_head_next_to_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path).unwrap();
    log.append(&record("a"), None).unwrap();
    log.append(&record("b"), None).unwrap();
    let head = log.finish().unwrap();
    assert_eq!(head.lines, 2);
    let head_file = std::fs::read_to_string(dir.path().join("audit.jsonl.head")).unwrap();
    assert_eq!(AuditHead::parse(&head_file), Some(head.clone()));
    let text = std::fs::read_to_string(&path).unwrap();
    let report = verify_audit_log_from_head(&text, &head.sha256, Some(head.lines)).unwrap();
    assert_eq!(report.head_line, 2);
}

#[test]
fn a_symlinked_head_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("audit.jsonl.head")).unwrap();
    let log = AuditLog::open(&path).unwrap();
    log.append(&record("a"), None).unwrap();
    assert!(matches!(log.finish().unwrap_err(), AuditError::Head(_)));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
}

/// A 64 KiB tmpfs on a fresh directory, unmounted on drop (needs root, as the suite runs).
/// One at a time: run next to each other, these tests (which also start `mount`, `umount`
/// and `chattr`) at times saw the removed filler's space not given back, and the append
/// after it failed with ENOSPC (4 of 6 runs); one at a time they pass every run.
struct SmallDisk {
    dir: tempfile::TempDir,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static SMALL_DISK: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl SmallDisk {
    fn mount() -> SmallDisk {
        let one_at_a_time = SMALL_DISK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs needs root");
        SmallDisk {
            dir,
            _one_at_a_time: one_at_a_time,
        }
    }

    /// Fill the disk until a write fails.
    fn fill(&self) {
        let mut filler = File::create(self.dir.path().join("filler")).unwrap();
        while filler.write_all(&[0u8; 512]).is_ok() {}
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

#[test]
fn a_failed_write_is_cut_back_to_the_last_whole_line() {
    let disk = SmallDisk::mount();
    let path = disk.dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path).unwrap();
    log.append(&record("a"), None).unwrap();
    disk.fill();
    let mut failed = 0;
    for index in 0..64 {
        if log.append(&record(&format!("r{index}")), None).is_err() {
            failed += 1;
            break;
        }
    }
    assert_eq!(failed, 1, "the disk never filled");
    let text = std::fs::read_to_string(&path).unwrap();
    verify_audit_log(&text).expect("no torn line");
    assert_eq!(text.lines().count(), log.head().lines);
    // Not poisoned: once there is room again, the chain goes on.
    std::fs::remove_file(disk.dir.path().join("filler")).unwrap();
    log.append(&record("after"), None).unwrap();
    verify_audit_log(&std::fs::read_to_string(&path).unwrap()).unwrap();
}

#[test]
fn a_failed_write_that_cannot_be_cut_back_poisons_the_log() {
    let disk = SmallDisk::mount();
    let path = disk.dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path).unwrap();
    log.append(&record("a"), None).unwrap();
    // Append-only: writes still work, truncating fails (EPERM).
    let chattr = std::process::Command::new("chattr")
        .arg("+a")
        .arg(&path)
        .status()
        .unwrap();
    assert!(chattr.success(), "chattr +a failed");
    disk.fill();
    let error = (0..64)
        .find_map(|index| log.append(&record(&format!("r{index}")), None).err())
        .expect("the disk never filled");
    assert!(matches!(error, AuditError::Write { .. }), "{error}");
    std::fs::remove_file(disk.dir.path().join("filler")).unwrap();
    let later = log.append(&record("later"), None).unwrap_err();
    assert!(
        matches!(&later, AuditError::Poisoned { reason, .. } if reason.contains("could not be removed")),
        "{later}"
    );
    assert!(
        later.to_string().contains("no further calls run"),
        "{later}"
    );
}
