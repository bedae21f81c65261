//! Start-time cleanup of what earlier sessions left on the remote host: spill files past
//! their lifetime (every root's, under `/tmp/cordon-<uid>/spill/` or the configured state directory;
//! at most once per [`leftovers::SPILL_SWEEP_INTERVAL`] per host) and the root directories
//! they emptied, and the temp files of writes a killed session left in the writable roots
//! ([`stale_write_temps`]). Listing and removal go over SFTP (`readdir` reports `lstat` attributes,
//! `remove` unlinks without following a symlink); only names of Cordon's exact naming are
//! touched. The rules are [`cordon_ops::leftovers`]; a remote file cannot be locked over
//! SFTP, so a spill file still being written is recognised by its moving modification time
//! (never removed younger than [`leftovers::SPILL_MIN_AGE`]).

use std::time::{Duration, SystemTime};

use cordon_ops::leftovers::{self, SpillBounds, SpillFile};
use russh_sftp::client::error::Error as SftpError;
use russh_sftp::protocol::{FileAttributes, FileType, OpenFlags, StatusCode};

use crate::conn::{Live, Pool};
use crate::remote;

/// One directory entry: its name and `lstat` attributes.
type Listed = Vec<(String, FileAttributes)>;

/// The most entries one listing of the sweep reads: a directory filled with more (any process
/// of the remote account can) is swept in part rather than read without end.
const MAX_LISTED: usize = 100_000;

/// List `dir` (without `.` and `..`, at most [`MAX_LISTED`] entries); `None` when it cannot be
/// listed.
async fn list(live: &Live, dir: &str) -> Option<Listed> {
    let handle = live.sftp.opendir(dir.to_owned()).await.ok()?.handle;
    let mut out = Vec::new();
    let listed = loop {
        if out.len() >= MAX_LISTED {
            tracing::warn!(
                dir,
                limit = MAX_LISTED,
                "ssh: a spill directory holds more entries than the sweep reads; swept in part"
            );
            break true;
        }
        match live.sftp.readdir(handle.as_str()).await {
            Ok(name) => out.extend(
                name.files
                    .into_iter()
                    .filter(|f| f.filename != "." && f.filename != "..")
                    .map(|f| (f.filename, f.attrs)),
            ),
            Err(SftpError::Status(status)) if status.status_code == StatusCode::Eof => {
                break true;
            }
            Err(_) => break false,
        }
    };
    if let Err(error) = live.sftp.close(handle).await {
        tracing::debug!(%error, "ssh: failed to close a directory handle after the sweep's listing");
    }
    listed.then_some(out)
}

fn modified(attrs: &FileAttributes) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(attrs.mtime.unwrap_or(0)))
}

/// Whether no session swept the spill directories under `spill_parent` within
/// [`leftovers::SPILL_SWEEP_INTERVAL`] (by the stamp file [`leftovers::SPILL_SWEEP_STAMP`],
/// the same one the local backend keeps); if so, the stamp is renewed: this session sweeps now.
/// Any doubt means a sweep. SFTP cannot open without following a symlink, so the stamp is
/// never opened in place: it is unlinked and created anew with `EXCLUDE` (`O_EXCL` refuses a
/// symlink), and a new file carries the remote clock's time, the clock that judges it.
pub(crate) async fn spill_sweep_due(live: &Live, spill_parent: &str, now: SystemTime) -> bool {
    let stamp = format!("{spill_parent}/{}", leftovers::SPILL_SWEEP_STAMP);
    if let Ok(attrs) = live.sftp.lstat(stamp.clone()).await {
        let attrs = attrs.attrs;
        let stamped = modified(&attrs);
        if attrs.file_type() == FileType::File
            && stamped <= now
            && leftovers::age(now, stamped) < leftovers::SPILL_SWEEP_INTERVAL
        {
            return false;
        }
        if let Err(error) = live.sftp.remove(stamp.clone()).await {
            tracing::debug!(%error, stamp, "ssh: failed to remove the old spill sweep stamp");
        }
    }
    match live
        .sftp
        .open(
            stamp.clone(),
            OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUDE,
            FileAttributes {
                permissions: Some(0o600),
                ..FileAttributes::empty()
            },
        )
        .await
    {
        Ok(handle) => {
            if let Err(error) = live.sftp.close(handle.handle).await {
                tracing::debug!(%error, "ssh: failed to close the new spill sweep stamp");
            }
        }
        // Another session renewed it at the same moment, or the directory is unwritable: a
        // missing stamp only means the next session sweeps too.
        Err(error) => tracing::debug!(%error, stamp, "ssh: failed to renew the spill sweep stamp"),
    }
    true
}

/// What a sweep removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    pub files: usize,
    pub bytes: u64,
    pub dirs: usize,
}

/// Sweep the spill files of every root under `spill_parent` by `bounds`, then remove root
/// directories it emptied that nobody changed for `bounds.max_age` (a live session on that
/// root recreates its directory if it needs it again). `own` (this session's directory) is
/// never removed. Best effort: a failure leaves the file for a later sweep.
pub(crate) async fn spill(
    live: &Live,
    spill_parent: &str,
    own: &str,
    now: SystemTime,
    bounds: SpillBounds,
) -> Swept {
    let Some(roots) = list(live, spill_parent).await else {
        return Swept::default();
    };
    // (root index, path, file)
    let mut found: Vec<(usize, String, SpillFile)> = Vec::new();
    // (path, entries, modified, removed)
    let mut dirs: Vec<(String, usize, SystemTime, usize)> = Vec::new();
    for (name, attrs) in roots {
        if !leftovers::is_spill_root_dir_name(name.as_bytes()) || attrs.file_type() != FileType::Dir
        {
            continue;
        }
        let dir = format!("{spill_parent}/{name}");
        let Some(entries) = list(live, &dir).await else {
            continue;
        };
        let index = dirs.len();
        for (file, attrs) in &entries {
            if leftovers::is_spill_file_name(file.as_bytes()) && attrs.file_type() == FileType::File
            {
                found.push((
                    index,
                    format!("{dir}/{file}"),
                    SpillFile {
                        size: attrs.size.unwrap_or(0),
                        modified: modified(attrs),
                    },
                ));
            }
        }
        dirs.push((dir, entries.len(), modified(&attrs), 0));
    }
    let files: Vec<SpillFile> = found.iter().map(|(_, _, f)| *f).collect();
    let mut chosen = Vec::new();
    leftovers::sweep_spill_files(&files, now, bounds, |i| {
        chosen.push(i);
        true
    });
    let mut swept = Swept::default();
    for i in chosen {
        let (dir, path, file) = &found[i];
        if live.sftp.remove(path.clone()).await.is_ok() {
            dirs[*dir].3 += 1;
            swept.files += 1;
            swept.bytes += file.size;
        }
    }
    for (dir, entries, dir_modified, removed) in dirs {
        let idle = leftovers::age(now, dir_modified) > bounds.max_age;
        if dir != own && removed == entries && idle && live.sftp.rmdir(dir).await.is_ok() {
            swept.dirs += 1;
        }
    }
    if swept != Swept::default() {
        tracing::info!(
            files = swept.files,
            bytes = swept.bytes,
            root_dirs = swept.dirs,
            "removed remote spill files past their lifetime"
        );
    }
    swept
}

/// Remove the temp files of atomic writes (`.NAME.cordon-<16 hex>.tmp`) under the writable
/// `roots` that were not modified for [`leftovers::REMOTE_TEMP_MIN_AGE`]: an SFTP writer
/// cannot lock its file, but it streams its bytes, so a live one's modification time keeps
/// moving. One remote `find` (no symlink followed, `.git` not entered, one filesystem).
pub(crate) async fn stale_write_temps(pool: &Pool, roots: &[String]) -> usize {
    let argv =
        cordon_remote::files::remove_stale_write_temps_argv(roots, leftovers::REMOTE_TEMP_MIN_AGE);
    match remote::run_collect(
        pool,
        &argv,
        None,
        cordon_remote::transport::StdinEnd::AfterInput,
    )
    .await
    {
        Ok(out) => {
            let removed = out
                .stdout
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .count();
            if removed > 0 {
                tracing::info!(
                    files = removed,
                    "removed temp files of writes a killed session left on the remote host"
                );
            }
            removed
        }
        Err(error) => {
            tracing::warn!(%error, "failed to look for stale temp files on the remote host");
            0
        }
    }
}
