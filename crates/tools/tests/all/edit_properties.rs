//! Properties of the edit engine on random files and random edits:
//!
//! - exact edits do exactly what a splice of the line-feed view predicts (nothing lost,
//!   nothing added), or fail as ambiguous when an `oldText` is not unique;
//! - fuzzy edits rewrite only the lines they touch;
//! - the unified patch of any applied edit, fed to GNU `patch -p0 --fuzz=0`, turns the
//!   original into exactly the new file; the display diff locates the first change.

use std::path::Path;
use std::process::{Command, Stdio};

use cordon_tools::edit_diff::{EditFailure, Replacement, apply_edits, edit_diff, to_lf};
use proptest::prelude::*;
use proptest::sample::{Index, select};

use crate::support::check;

/// Pieces of lines: repeats (so uniqueness matters), fuzzy-equivalent spellings (smart
/// quotes, dashes, no-break spaces, NFC/NFD), trailing blanks and multi-byte characters.
const TOKENS: &[&str] = &[
    "fn",
    "let",
    "x",
    "y",
    "=",
    "1",
    "(",
    ")",
    "{",
    "}",
    " ",
    "  ",
    "\t",
    "é",
    "e\u{301}",
    "\u{201C}q\u{201D}",
    "\"q\"",
    "'",
    "\u{2019}",
    "\u{2014}",
    "-",
    "\u{A0}",
    "ß",
    "日本",
];

fn line() -> impl Strategy<Value = String> {
    prop::collection::vec(select(TOKENS), 0..6).prop_map(|tokens| tokens.concat())
}

/// A file of up to 24 lines with the given line endings; the last line may lack one.
fn file(endings: &'static [&'static str]) -> impl Strategy<Value = String> {
    (
        prop::collection::vec((line(), select(endings)), 1..24),
        any::<bool>(),
    )
        .prop_map(|(lines, final_newline)| {
            let mut text = String::new();
            let count = lines.len();
            for (i, (body, ending)) in lines.into_iter().enumerate() {
                text.push_str(&body);
                if i + 1 < count || final_newline {
                    text.push_str(ending);
                }
            }
            text
        })
}

/// Replacement text: tokens and line breaks of any style.
fn new_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![4 => select(TOKENS), 1 => select(&["\n", "\r\n", "\r"][..])],
        0..8,
    )
    .prop_map(|tokens| tokens.concat())
}

/// Up to three disjoint, non-empty byte ranges at character boundaries of `text`, sorted.
fn ranges(text: &str, picks: &[(Index, Index)]) -> Vec<(usize, usize)> {
    let mut bounds: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
    bounds.push(text.len());
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (a, b) in picks {
        let (a, b) = (a.get(&bounds), b.get(&bounds));
        let (start, end) = (*a.min(b), *a.max(b));
        if start < end && ranges.iter().all(|&(s, e)| end <= s || start >= e) {
            ranges.push((start, end));
        }
    }
    ranges.sort_unstable();
    ranges
}

/// `text` with each range replaced by the matching replacement.
fn splice(text: &str, ranges: &[(usize, usize)], replacements: &[String]) -> String {
    let mut out = String::new();
    let mut at = 0;
    for (&(start, end), replacement) in ranges.iter().zip(replacements) {
        out.push_str(&text[at..start]);
        out.push_str(replacement);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

fn occurrences(haystack: &str, needle: &str) -> usize {
    (0..haystack.len())
        .filter(|&at| haystack.as_bytes()[at..].starts_with(needle.as_bytes()))
        .count()
}

/// Apply `patch` to a file holding `original` with GNU patch, exactly (no fuzz), and return
/// the result.
fn apply_with_gnu_patch(dir: &Path, original: &str, patch: &str) -> Result<String, String> {
    std::fs::write(dir.join("f.txt"), original).unwrap();
    std::fs::write(dir.join("change.patch"), patch).unwrap();
    let output = Command::new("patch")
        .args([
            "-p0",
            "--batch",
            "--fuzz=0",
            "--no-backup-if-mismatch",
            "--reject-file=-",
            "-i",
            "change.patch",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("GNU patch is installed (apt-get install patch)");
    if !output.status.success() {
        return Err(format!(
            "patch failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(std::fs::read_to_string(dir.join("f.txt")).unwrap())
}

/// The patch reproduces `edited` from `original`, and the display diff points at a line.
fn check_patch(dir: &Path, original: &str, edited: &str) -> Result<(), TestCaseError> {
    let diff = edit_diff("f.txt", original, edited);
    let patched = apply_with_gnu_patch(dir, original, &diff.patch)
        .map_err(|e| TestCaseError::fail(format!("{e}\npatch:\n{}", diff.patch)))?;
    prop_assert_eq!(&patched, edited, "patch:\n{}", diff.patch);
    if to_lf(original) != to_lf(edited) {
        prop_assert!(diff.first_changed_line.is_some(), "diff:\n{}", diff.diff);
    }
    Ok(())
}

#[test]
fn exact_edits_match_a_splice_of_the_line_feed_view_and_their_patch_applies() {
    let dir = tempfile::tempdir().unwrap();
    let strategy = (
        file(&["\n", "\n", "\r\n", "\r"]),
        prop::collection::vec((any::<Index>(), any::<Index>()), 1..4),
        prop::collection::vec(new_text(), 3),
    );
    check(192, &strategy, |(original, picks, news)| {
        let lf = to_lf(&original).into_owned();
        let ranges = ranges(&lf, &picks);
        let olds: Vec<&str> = ranges.iter().map(|&(s, e)| &lf[s..e]).collect();
        let edits: Vec<Replacement<'_>> = olds
            .iter()
            .zip(&news)
            .map(|(old, new)| Replacement {
                old_text: old,
                new_text: new,
            })
            .collect();
        let unique = olds.iter().all(|old| occurrences(&lf, old) == 1);
        let news_lf: Vec<String> = news.iter().map(|n| to_lf(n).into_owned()).collect();
        let expected = splice(&lf, &ranges, &news_lf);
        match apply_edits(&original, &edits, "f.txt") {
            Ok(applied) => {
                prop_assert!(unique, "applied an ambiguous edit");
                prop_assert!(applied.fuzzy_edits.is_empty());
                prop_assert_eq!(to_lf(&applied.content), expected.as_str());
                check_patch(dir.path(), &original, &applied.content)?;
            }
            Err(EditFailure::NoChange { .. }) => {
                prop_assert!(unique);
                prop_assert_eq!(expected.as_str(), lf.as_str());
            }
            Err(EditFailure::Ambiguous { .. }) => prop_assert!(!unique),
            Err(other) => {
                return Err(TestCaseError::fail(format!("unexpected failure: {other}")));
            }
        }
        Ok(())
    });
}

/// The fuzzy spelling a model might send for `text`: ASCII quotes and dashes, plain spaces,
/// no trailing blanks.
fn plain_spelling(text: &str) -> String {
    let replaced: String = text
        .chars()
        .map(|c| match c {
            '\u{201C}' | '\u{201D}' => '"',
            '\u{2019}' => '\'',
            '\u{2014}' => '-',
            '\u{A0}' => ' ',
            other => other,
        })
        .collect();
    replaced
        .split('\n')
        .map(|line| line.trim_end_matches([' ', '\t']))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn fuzzy_edits_rewrite_only_the_lines_they_touch_and_their_patch_applies() {
    let dir = tempfile::tempdir().unwrap();
    let strategy = (file(&["\n"]), (any::<Index>(), any::<Index>()), new_text());
    check(192, &strategy, |(original, pick, new)| {
        let ranges = ranges(&original, &[pick]);
        let Some(&(start, end)) = ranges.first() else {
            return Ok(());
        };
        let old = plain_spelling(&original[start..end]);
        let edits = [Replacement {
            old_text: &old,
            new_text: &new,
        }];
        let Ok(applied) = apply_edits(&original, &edits, "f.txt") else {
            return Ok(());
        };
        // Whole lines before the first touched line and after the last one are kept.
        let line_start = original[..start].rfind('\n').map_or(0, |at| at + 1);
        let line_end = original[end..]
            .find('\n')
            .map_or(original.len(), |at| end + at);
        if applied.fuzzy_edits.is_empty() {
            // The plain spelling was in the file already, once: an exact edit there.
            prop_assert_eq!(occurrences(&original, &old), 1);
            let expected = original.replacen(&old, &to_lf(&new), 1);
            prop_assert_eq!(applied.content.as_str(), expected.as_str());
        } else {
            prop_assert!(
                applied.content.starts_with(&original[..line_start]),
                "lines before the edit changed: {:?}",
                applied.content
            );
            prop_assert!(
                applied.content.ends_with(&original[line_end..]),
                "lines after the edit changed: {:?}",
                applied.content
            );
        }
        check_patch(dir.path(), &original, &applied.content)
    });
}

#[test]
fn the_patch_of_any_two_texts_applies() {
    let dir = tempfile::tempdir().unwrap();
    let strategy = (
        file(&["\n", "\n", "\r\n", "\r"]),
        file(&["\n", "\n", "\r\n", "\r"]),
    );
    check(128, &strategy, |(old, new)| {
        check_patch(dir.path(), &old, &new)
    });
}
