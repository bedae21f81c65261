//! The grep for sandboxes without `rg`: the walk's files stream in as tar (see
//! [`FETCH_SCRIPT`](super::listing::FETCH_SCRIPT)) and are searched here, line by line, with the
//! request's regex; files with a NUL byte are treated as binary and skipped, as ripgrep does.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use cordon_ops::{GrepFile, GrepLine, GrepOutput};

use super::strip_terminator;

/// Search one file's bytes; returns its lines (matches and merged context) and how many
/// matches were taken (at most `budget`; no context after the last taken match when the budget
/// ran out).
pub fn search_bytes(
    data: &[u8],
    regex: &regex::bytes::Regex,
    context: usize,
    budget: usize,
) -> (Vec<GrepLine>, usize) {
    if budget == 0 || memchr_nul(data) {
        return (Vec::new(), 0);
    }
    let mut lines: Vec<&[u8]> = data.split_inclusive(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    let mut matched: Vec<usize> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        if regex.is_match(body) {
            matched.push(i);
            if matched.len() == budget {
                break;
            }
        }
    }
    let hit_budget = matched.len() == budget;
    let mut keep: Vec<(usize, bool)> = Vec::new();
    for (k, &m) in matched.iter().enumerate() {
        let start = m.saturating_sub(context);
        let last = k + 1 == matched.len();
        let end = if last && hit_budget {
            m
        } else {
            (m + context).min(lines.len() - 1)
        };
        for i in start..=end {
            let is_match = i == m || matched.binary_search(&i).is_ok();
            match keep.last_mut() {
                Some((prev, flag)) if *prev == i => *flag |= is_match,
                Some((prev, _)) if *prev > i => {}
                _ => keep.push((i, is_match)),
            }
        }
    }
    let out = keep
        .into_iter()
        .map(|(i, is_match)| GrepLine {
            number: i as u64 + 1,
            text: String::from_utf8_lossy(strip_terminator(lines[i])).into_owned(),
            is_match,
        })
        .collect();
    (out, matched.len())
}

fn memchr_nul(data: &[u8]) -> bool {
    data.contains(&0)
}

/// Search a tar stream (concatenated archives allowed) of files in `order`, stopping after
/// `max_matches` matches. Entries are matched back to `order` by path.
pub fn search_tar(
    tar_bytes: &[u8],
    order: &[PathBuf],
    regex: &regex::bytes::Regex,
    context: usize,
    max_matches: usize,
) -> GrepOutput {
    let mut contents: HashMap<PathBuf, Vec<u8>> = HashMap::new();
    let mut archive = tar::Archive::new(tar_bytes);
    archive.set_ignore_zeros(true);
    if let Ok(entries) = archive.entries() {
        for entry in entries {
            let Ok(mut entry) = entry else { break };
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let Ok(path) = entry.path() else { continue };
            let path = Path::new("/").join(path.as_ref());
            let mut data = Vec::new();
            if entry.read_to_end(&mut data).is_ok() {
                contents.insert(path, data);
            }
        }
    }
    let mut output = GrepOutput::default();
    let mut remaining = max_matches;
    for path in order {
        if remaining == 0 {
            break;
        }
        let Some(data) = contents.get(path) else {
            continue;
        };
        let (lines, taken) = search_bytes(data, regex, context, remaining);
        remaining -= taken;
        if !lines.is_empty() {
            output.files.push(GrepFile {
                path: path.clone(),
                lines,
            });
        }
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    fn re(p: &str) -> regex::bytes::Regex {
        regex::bytes::RegexBuilder::new(p)
            .multi_line(true)
            .build()
            .expect("valid")
    }

    fn line(number: u64, text: &str, is_match: bool) -> GrepLine {
        GrepLine {
            number,
            text: text.to_owned(),
            is_match,
        }
    }

    #[test]
    fn merges_overlapping_context_windows() {
        let data = b"a\nx1\nb\nx2\nc\nd\ne\nx3\n";
        let (lines, taken) = search_bytes(data, &re("x"), 1, 10);
        assert_eq!(taken, 3);
        assert_eq!(
            lines,
            vec![
                line(1, "a", false),
                line(2, "x1", true),
                line(3, "b", false),
                line(4, "x2", true),
                line(5, "c", false),
                line(7, "e", false),
                line(8, "x3", true),
            ]
        );
    }

    #[test]
    fn stops_at_the_budget_without_trailing_context() {
        let data = b"x1\ny\nx2\nz\n";
        let (lines, taken) = search_bytes(data, &re("x"), 1, 2);
        assert_eq!(taken, 2);
        assert_eq!(
            lines,
            vec![
                line(1, "x1", true),
                line(2, "y", false),
                line(3, "x2", true)
            ]
        );
    }

    #[test]
    fn skips_binary_and_strips_crlf() {
        assert_eq!(search_bytes(b"x\0\n", &re("x"), 0, 5), (vec![], 0));
        let (lines, _) = search_bytes(b"x\r\n", &re("x$"), 0, 5);
        assert_eq!(lines, vec![]);
        let (lines, _) = search_bytes(b"x\r\n", &re("x"), 0, 5);
        assert_eq!(lines, vec![line(1, "x", true)]);
    }

    #[test]
    fn searches_a_tar_stream_in_the_given_order() {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, body) in [("w/b.txt", "x\n"), ("w/a.txt", "x\nx\n")] {
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, name, body.as_bytes())
                .expect("append");
        }
        let bytes = builder.into_inner().expect("tar");
        let order = vec![PathBuf::from("/w/a.txt"), PathBuf::from("/w/b.txt")];
        let out = search_tar(&bytes, &order, &re("x"), 0, 2);
        assert_eq!(
            out,
            GrepOutput {
                files: vec![GrepFile {
                    path: PathBuf::from("/w/a.txt"),
                    lines: vec![line(1, "x", true), line(2, "x", true)],
                }],
                errors: vec![],
            }
        );
    }
}
