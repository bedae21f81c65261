//! The POSIX listing of a search path ([`LIST_SCRIPT`]) and its parser ([`parse_listing`]).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::{RemoteError, path_arg, sh_argv};

/// The listing script (POSIX sh + find).
pub const LIST_SCRIPT: &str = include_str!("../sh/list.sh");

/// The content-fetch script of the fallback grep (xargs + tar, optional `grep -F` prefilter).
pub const FETCH_SCRIPT: &str = include_str!("../sh/fetch.sh");

/// The argv listing `path`.
pub fn list_argv(path: &Path) -> Result<Vec<String>, RemoteError> {
    Ok(sh_argv(LIST_SCRIPT, "cordon-list", [path_arg(path)?]))
}

/// The argv streaming the files named on stdin as tar, keeping only files containing
/// `literal` when given.
pub fn fetch_argv(literal: Option<&str>) -> Vec<String> {
    sh_argv(
        FETCH_SCRIPT,
        "cordon-fetch",
        [literal.unwrap_or_default().to_owned()],
    )
}

/// The fetch script's stdin: the byte count line, then the NUL-separated file names. Keep
/// stdin open afterwards; closing it (or a line) stops the fetch.
pub fn fetch_input(files: &[PathBuf]) -> Vec<u8> {
    let mut list = Vec::new();
    for file in files {
        list.extend_from_slice(file.as_os_str().as_bytes());
        list.push(0);
    }
    let mut input = format!("{}\n", list.len()).into_bytes();
    input.extend_from_slice(&list);
    input
}

/// Kind of an entry (symlinks: of their target).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Something else.
    Other,
    /// Does not exist (dangling symlink, missing search path).
    Missing,
}

fn kind(code: &[u8]) -> EntryKind {
    match code {
        b"f" => EntryKind::File,
        b"d" => EntryKind::Dir,
        b"o" => EntryKind::Other,
        _ => EntryKind::Missing,
    }
}

/// What the listing script reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Kind of the search path itself (`None` if the script printed nothing).
    pub root_kind: Option<EntryKind>,
    /// Ignore files and their lines.
    pub ignore_files: Vec<(PathBuf, Vec<String>)>,
    /// Directories (the search path included).
    pub dirs: Vec<PathBuf>,
    /// Regular files.
    pub files: Vec<PathBuf>,
    /// Symlinks and the kind of their targets.
    pub links: Vec<(PathBuf, EntryKind)>,
}

fn path(bytes: &[u8]) -> PathBuf {
    PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
}

/// Parse the listing script's stdout.
pub fn parse_listing(bytes: &[u8]) -> Result<Listing, RemoteError> {
    let mut tokens: Vec<&[u8]> = bytes.split(|&b| b == 0).collect();
    // The stream ends with a NUL, so the last split piece is empty.
    if tokens.last().is_some_and(|t| t.is_empty()) {
        tokens.pop();
    }
    let bad = |detail: &str| RemoteError::Protocol {
        detail: format!("listing: {detail}"),
    };
    let mut listing = Listing::default();
    let mut it = tokens.into_iter();
    while let Some(tag) = it.next() {
        match tag {
            b"T" => listing.root_kind = Some(kind(it.next().ok_or_else(|| bad("missing kind"))?)),
            b"I" => {
                let file = path(it.next().ok_or_else(|| bad("missing ignore file"))?);
                let mut lines = Vec::new();
                loop {
                    let token = it.next().ok_or_else(|| bad("unterminated ignore file"))?;
                    match token.split_first() {
                        Some((b'+', line)) => {
                            lines.push(String::from_utf8_lossy(line).into_owned())
                        }
                        Some((b'-', _)) => break,
                        _ => return Err(bad("bad ignore line")),
                    }
                }
                listing.ignore_files.push((file, lines));
            }
            b"D" | b"F" => loop {
                let token = it.next().ok_or_else(|| bad("unterminated section"))?;
                if token.is_empty() {
                    break;
                }
                if tag == b"D" {
                    listing.dirs.push(path(token));
                } else {
                    listing.files.push(path(token));
                }
            },
            b"L" => loop {
                let code = it.next().ok_or_else(|| bad("unterminated links"))?;
                if code.is_empty() {
                    break;
                }
                let link = it.next().ok_or_else(|| bad("missing link"))?;
                listing.links.push((path(link), kind(code)));
            },
            other => {
                return Err(bad(&format!(
                    "unexpected token `{}`",
                    String::from_utf8_lossy(other).escape_debug()
                )));
            }
        }
    }
    Ok(listing)
}

/// Turn find's stderr (`find: 'PATH': REASON`, quotes optional) into `PATH: REASON` notes,
/// without duplicates.
pub fn parse_find_errors(stderr: &str) -> Vec<String> {
    let mut notes: Vec<String> = Vec::new();
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix("find: ") else {
            continue;
        };
        let (path, reason) = match rest.strip_prefix('\'').or_else(|| rest.strip_prefix('‘')) {
            Some(quoted) => match quoted.find(['\'', '’']) {
                Some(end) => {
                    let close_len = quoted[end..].chars().next().map_or(1, char::len_utf8);
                    (
                        &quoted[..end],
                        quoted[end + close_len..].trim_start_matches(": "),
                    )
                }
                None => (quoted, ""),
            },
            None => match rest.rsplit_once(": ") {
                Some((path, reason)) => (path, reason),
                None => (rest, ""),
            },
        };
        let reason = match reason {
            "Permission denied" => "Permission denied (os error 13)",
            "No such file or directory" => "No such file or directory (os error 2)",
            other => other,
        };
        let note = format!("{path}: {reason}");
        if !notes.contains(&note) {
            notes.push(note);
        }
    }
    notes
}

/// Turn the fetch script's stderr (`unreadable PATH` lines) into notes.
pub fn parse_fetch_errors(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("unreadable "))
        .map(|path| format!("{path}: Permission denied (os error 13)"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_section() {
        let stream = b"T\0d\0I\0/.gitignore\0+*.log\0+\0-\0I\0/w/.gitignore\0+target/\0-\0D\0/w\0/w/src\0\0F\0/w/a.txt\0/w/src/b.rs\0\0L\0f\0/w/link\0-\0/w/dangling\0\0";
        assert_eq!(
            parse_listing(stream).expect("valid"),
            Listing {
                root_kind: Some(EntryKind::Dir),
                ignore_files: vec![
                    (
                        PathBuf::from("/.gitignore"),
                        vec!["*.log".to_owned(), String::new()]
                    ),
                    (PathBuf::from("/w/.gitignore"), vec!["target/".to_owned()]),
                ],
                dirs: vec![PathBuf::from("/w"), PathBuf::from("/w/src")],
                files: vec![PathBuf::from("/w/a.txt"), PathBuf::from("/w/src/b.rs")],
                links: vec![
                    (PathBuf::from("/w/link"), EntryKind::File),
                    (PathBuf::from("/w/dangling"), EntryKind::Missing),
                ],
            }
        );
    }

    #[test]
    fn fetch_input_is_length_prefixed() {
        assert_eq!(
            fetch_input(&[PathBuf::from("/w/a"), PathBuf::from("/w/b c")]),
            b"12\n/w/a\0/w/b c\0".to_vec()
        );
    }

    #[test]
    fn missing_root_is_reported() {
        assert_eq!(
            parse_listing(b"T\0-\0").expect("valid").root_kind,
            Some(EntryKind::Missing)
        );
    }

    #[test]
    fn find_errors_become_notes() {
        let stderr = "find: '/w/secret': Permission denied\nfind: /w/other: Permission denied\nfind: '/w/secret': Permission denied\n";
        assert_eq!(
            parse_find_errors(stderr),
            vec![
                "/w/secret: Permission denied (os error 13)".to_owned(),
                "/w/other: Permission denied (os error 13)".to_owned(),
            ]
        );
    }
}
