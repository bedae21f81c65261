//! The files Cordon itself leaves behind — bash spill files and the temp files of atomic
//! writes — their exact names, and the pure rules deciding which of them a later session
//! removes.
//!
//! No I/O here: every backend lists, checks and unlinks with its own primitives (dir fds
//! locally, SFTP over ssh, a root exec in a docker container) and asks these functions what
//! to do. A name that does not match Cordon's exact naming is never Cordon's and is never
//! removed.

use std::time::{Duration, SystemTime};

/// Spill files older than this are removed when a backend starts (a command runs at most
/// 30 minutes, so such a file is never being written).
pub const SPILL_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// Spill bytes kept per user (all workspace roots together; per root volume with docker):
/// past this, the oldest files go first when a backend starts.
pub const SPILL_MAX_TOTAL: u64 = 4 << 30;

/// A spill file or directory modified more recently than this is never removed by the size
/// bound: another session may still be writing it, or its model about to read it.
pub const SPILL_MIN_AGE: Duration = Duration::from_secs(10 * 60);

/// A local write temp file modified more recently than this is never removed, even unlocked:
/// its writer may be between creating it and taking its lock.
pub const WRITE_TEMP_MIN_AGE: Duration = Duration::from_secs(60);

/// A write temp file on a remote host (ssh, docker) whose modification time is older than
/// this is no longer being written: a writer sends its bytes in one go, so a live temp file's
/// time keeps moving.
pub const REMOTE_TEMP_MIN_AGE: Duration = Duration::from_secs(10 * 60);

/// A local backend start sweeps the spill directories only when no other did within this
/// interval (a stamp file `.swept` in the spill directory records the last sweep): a CI
/// runner starting Cordon many times a minute pays for one listing a minute, not one per call.
pub const SPILL_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Name of the stamp file recording the last spill sweep.
pub const SPILL_SWEEP_STAMP: &str = ".swept";

/// Prefix of every spill file name: `cordon-bash-<16 hex>.log`.
pub const SPILL_PREFIX: &str = "cordon-bash-";

/// The 16 lowercase hex digits every Cordon-made name carries.
fn is_hex16(bytes: &[u8]) -> bool {
    bytes.len() == 16 && bytes.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `name` is exactly a spill file name, `cordon-bash-<16 lowercase hex>.log`.
pub fn is_spill_file_name(name: &[u8]) -> bool {
    name.strip_prefix(SPILL_PREFIX.as_bytes())
        .and_then(|rest| rest.strip_suffix(b".log"))
        .is_some_and(is_hex16)
}

/// Whether `name` is exactly a per-root spill directory name: 16 lowercase hex digits.
pub fn is_spill_root_dir_name(name: &[u8]) -> bool {
    is_hex16(name)
}

/// Whether `name` is exactly the temp file name of an atomic write: `.<NAME>.cordon-<16
/// lowercase hex>.tmp`, with `<NAME>` the first 1 to 255 bytes of the target's name.
pub fn is_write_temp_name(name: &[u8]) -> bool {
    let Some(inner) = name
        .strip_prefix(b".")
        .and_then(|rest| rest.strip_suffix(b".tmp"))
    else {
        return false;
    };
    // `<NAME>.cordon-` then 16 hex digits.
    if inner.len() < 1 + ".cordon-".len() + 16 {
        return false;
    }
    let (head, hex) = inner.split_at(inner.len() - 16);
    is_hex16(hex)
        && head
            .strip_suffix(b".cordon-")
            .is_some_and(|target| !target.is_empty() && !target.contains(&b'/'))
}

/// One spill file found at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpillFile {
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time.
    pub modified: SystemTime,
}

/// The bounds of a spill sweep (the constants above; tests use small ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpillBounds {
    /// Files older than this are removed.
    pub max_age: Duration,
    /// Bytes kept over all the files listed; the oldest beyond go first.
    pub max_total: u64,
    /// Files younger than this are never removed by the size bound.
    pub min_age: Duration,
}

impl Default for SpillBounds {
    fn default() -> Self {
        SpillBounds {
            max_age: SPILL_MAX_AGE,
            max_total: SPILL_MAX_TOTAL,
            min_age: SPILL_MIN_AGE,
        }
    }
}

/// How long ago `modified` was (zero for a time in the future).
pub fn age(now: SystemTime, modified: SystemTime) -> Duration {
    now.duration_since(modified).unwrap_or(Duration::ZERO)
}

/// Walk `files` oldest first and call `remove(index)` for each one past `bounds`: every file
/// older than `max_age`, then, while the kept bytes exceed `max_total`, the oldest files that
/// are at least `min_age` old. `remove` returns whether the file is gone (a file in use, or
/// one that vanished meanwhile, stays counted if it is still there). Returns the bytes kept.
pub fn sweep_spill_files(
    files: &[SpillFile],
    now: SystemTime,
    bounds: SpillBounds,
    mut remove: impl FnMut(usize) -> bool,
) -> u64 {
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by_key(|&i| files[i].modified);
    let mut kept: u64 = files.iter().map(|f| f.size).fold(0, u64::saturating_add);
    for i in order {
        let file = files[i];
        let file_age = age(now, file.modified);
        let expired = file_age > bounds.max_age;
        let over = kept > bounds.max_total && file_age >= bounds.min_age;
        if (expired || over) && remove(i) {
            kept = kept.saturating_sub(file.size);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::from_secs(1_000_000);

    fn file(size: u64, age_secs: u64) -> SpillFile {
        SpillFile {
            size,
            modified: SystemTime::UNIX_EPOCH + NOW - Duration::from_secs(age_secs),
        }
    }

    fn bounds() -> SpillBounds {
        SpillBounds {
            max_age: Duration::from_secs(1000),
            max_total: 100,
            min_age: Duration::from_secs(10),
        }
    }

    fn swept(files: &[SpillFile], refuse: &[usize]) -> (Vec<usize>, u64) {
        let mut removed = Vec::new();
        let kept = sweep_spill_files(files, SystemTime::UNIX_EPOCH + NOW, bounds(), |i| {
            if refuse.contains(&i) {
                false
            } else {
                removed.push(i);
                true
            }
        });
        (removed, kept)
    }

    #[test]
    fn spill_names_match_exactly() {
        assert!(is_spill_file_name(b"cordon-bash-0123456789abcdef.log"));
        for other in [
            &b"cordon-bash-0123456789ABCDEF.log"[..],
            b"cordon-bash-0123456789abcde.log",
            b"cordon-bash-0123456789abcdef0.log",
            b"cordon-bash-0123456789abcdef.log.bak",
            b"xcordon-bash-0123456789abcdef.log",
            b"cordon-bash-0123456789abcdeg.log",
            b"notes.log",
        ] {
            assert!(
                !is_spill_file_name(other),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        assert!(is_spill_root_dir_name(b"00ff00ff00ff00ff"));
        assert!(!is_spill_root_dir_name(b"00ff00ff00ff00f"));
        assert!(!is_spill_root_dir_name(b"tmp-1-00ff00ff00ff00ff"));
    }

    #[test]
    fn temp_names_match_exactly() {
        for ours in [
            &b".a.txt.cordon-0123456789abcdef.tmp"[..],
            b"..x.cordon-0123456789abcdef.tmp",
            b".x.cordon-0123456789abcdef.cordon-fedcba9876543210.tmp",
        ] {
            assert!(
                is_write_temp_name(ours),
                "{}",
                String::from_utf8_lossy(ours)
            );
        }
        for other in [
            &b".cordon-0123456789abcdef.tmp"[..],
            b"a.txt.cordon-0123456789abcdef.tmp",
            b".a.txt.cordon-0123456789abcdef.tmp~",
            b".a.txt.cordon-0123456789ABCDEF.tmp",
            b".a.txt.cordon-0123456789abcde.tmp",
            b".a.txt-0123456789abcdef.tmp",
            b".a.txt.tmp",
            b"",
        ] {
            assert!(
                !is_write_temp_name(other),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn expired_files_go_whatever_the_total() {
        let files = [file(1, 2000), file(1, 5), file(1, 1001)];
        assert_eq!(swept(&files, &[]), (vec![0, 2], 1));
    }

    #[test]
    fn the_size_bound_removes_oldest_first_down_to_the_bound() {
        let files = [file(40, 50), file(40, 300), file(40, 100), file(40, 200)];
        // 160 bytes: the two oldest go (300 s, then 200 s), 80 stay.
        assert_eq!(swept(&files, &[]), (vec![1, 3], 80));
    }

    #[test]
    fn the_size_bound_never_removes_young_files() {
        let files = [file(90, 5), file(90, 9), file(10, 500)];
        assert_eq!(swept(&files, &[]), (vec![2], 180));
    }

    #[test]
    fn a_file_that_cannot_be_removed_stays_counted() {
        let files = [file(60, 300), file(60, 200), file(60, 100)];
        // The oldest is in use: the next two go instead to get under the bound.
        assert_eq!(swept(&files, &[0]), (vec![1, 2], 60));
        assert_eq!(swept(&files, &[]), (vec![0, 1], 60));
    }

    #[test]
    fn a_modification_time_in_the_future_is_young() {
        let future = SpillFile {
            size: 500,
            modified: SystemTime::UNIX_EPOCH + NOW + Duration::from_secs(60),
        };
        assert_eq!(swept(&[future], &[]), (vec![], 500));
    }
}
