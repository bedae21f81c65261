//! Directory stamps for the walks that cache what a directory held between commands (the
//! protected/denied expansion and the git metadata sweep).
//!
//! A directory's ctime changes whenever an entry is added, removed or renamed in it, or its
//! mode changes, so an unchanged `(dev, ino, ctime)` usually means an unchanged listing. Not
//! always: ctime is only as fine as the filesystem's timestamps and the kernel clock that sets
//! them (one clock tick on kernels before 6.13 and on filesystems without fine-grained ctime,
//! whole seconds on some filesystems). A command can change a directory within the same tick
//! right after Cordon read it, and the stamp stays the same. So a listing is trusted again
//! only when it is *settled*: its ctime was already older than [`RACY_MARGIN`] when the read
//! began; any later change then gets a later ctime. A racy listing is read again at every
//! walk until it settles (the same rule git applies to its index).

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime};

/// `(st_dev, st_ino, ctime seconds, ctime nanoseconds)` of a directory.
pub(crate) type Stamp = (u64, u64, i64, i64);

/// How much older than the start of a read a directory's ctime must be for its listing to be
/// trusted again on an unchanged stamp. Covers the kernel's coarse clock (a tick is at most
/// 10 ms) and filesystems whose timestamps have whole-second granularity (2 s on FAT).
pub(crate) const RACY_MARGIN: Duration = Duration::from_secs(3);

/// The stamp of what `meta` describes.
pub(crate) fn stamp_of(meta: &std::fs::Metadata) -> Stamp {
    (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
}

/// Whether a listing taken with this stamp, in a read that began at `read_started`, can be
/// trusted while the stamp stays the same. A ctime that cannot be represented, or one in the
/// future, is never settled.
pub(crate) fn settled(stamp: &Stamp, read_started: SystemTime) -> bool {
    let (Ok(secs), Ok(nanos)) = (u64::try_from(stamp.2), u32::try_from(stamp.3)) else {
        return false;
    };
    let Some(ctime) = SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, 0)) else {
        return false;
    };
    let Some(ctime) = ctime.checked_add(Duration::from_nanos(u64::from(nanos))) else {
        return false;
    };
    ctime
        .checked_add(RACY_MARGIN)
        .is_some_and(|limit| limit < read_started)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp_at(time: SystemTime) -> Stamp {
        let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        (
            1,
            2,
            i64::try_from(since.as_secs()).unwrap(),
            i64::from(since.subsec_nanos()),
        )
    }

    #[test]
    fn only_a_ctime_older_than_the_margin_is_settled() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert!(settled(&stamp_at(start - RACY_MARGIN * 2), start));
        assert!(!settled(&stamp_at(start - RACY_MARGIN), start));
        assert!(!settled(&stamp_at(start - Duration::from_millis(4)), start));
        assert!(!settled(&stamp_at(start), start));
        assert!(!settled(&stamp_at(start + Duration::from_secs(60)), start));
        assert!(!settled(&(1, 2, -1, 0), start));
        assert!(!settled(&(1, 2, 0, -1), start));
    }

    #[test]
    fn a_directory_made_now_is_not_settled() {
        let dir = tempfile::tempdir().unwrap();
        let before = SystemTime::now();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let meta = std::fs::symlink_metadata(dir.path().join("d")).unwrap();
        // Whatever the clocks' granularity, a ctime set after `before` is not settled then.
        assert!(!settled(&stamp_of(&meta), before));
    }
}
