//! The `edit` tool's text engine (docs/semantics.md#edit): match replacements against the
//! original content, apply them all or none, and render the results as a numbered display
//! diff and a standard unified patch.
//!
//! Matching works on a line-feed view of the file (CRLF and lone CR read as `\n`), so an
//! `oldText` written with `\n` matches a CRLF file. Each `oldText` is tried exactly first; an
//! exact match must be unique on its own, even if a fuzzy twin exists elsewhere. Only when no
//! exact match exists is it matched in fuzzy space (NFKC, trailing whitespace per line, smart
//! quotes, Unicode dashes and spaces), where it must be unique too. A fuzzy match rewrites
//! only the lines it touches (from their normalised form); every other byte of the file is
//! copied from the original. Line endings are restored line by line: untouched lines keep their
//! own ending, replacement lines take the endings of the lines they replace, then the file's
//! dominant ending, so mixed-ending files stay mixed.
//!
//! Everything here is pure and linear in the file size (apart from the diff, which is bounded
//! by a deadline); the tool in [`crate::edit`] does the I/O.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::time::{Duration, Instant};

use memchr::memmem;
use similar::{Algorithm, DiffOp, DiffTag};
use unicode_normalization::UnicodeNormalization;

/// Context lines around changes, in the display diff and the patch.
pub const DIFF_CONTEXT_LINES: usize = 4;

/// Longest a diff may spend looking for a minimal result before settling for a correct but
/// larger one.
const DIFF_DEADLINE: Duration = Duration::from_secs(5);

/// One requested replacement, as the model sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replacement<'a> {
    /// Text to find (must be non-empty and unique).
    pub old_text: &'a str,
    /// Text to put in its place.
    pub new_text: &'a str,
}

/// The edited content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The new content (same line-ending conventions as the original).
    pub content: String,
    /// Indices of the replacements that needed fuzzy matching, ascending.
    pub fuzzy_edits: Vec<usize>,
}

/// Why a set of replacements cannot be applied; the text is what the model reads. `index` is
/// `None` when the call had a single replacement (its message then names no `edits[i]`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EditFailure {
    /// An `oldText` is empty.
    #[error("{}", empty_message(*.index, .path))]
    EmptyOldText {
        /// Which replacement (multi-edit calls only).
        index: Option<usize>,
        /// The path the model sent.
        path: String,
    },
    /// An `oldText` matches nowhere, exactly or fuzzily.
    #[error("{}", not_found_message(*.index, .path))]
    NotFound {
        /// Which replacement (multi-edit calls only).
        index: Option<usize>,
        /// The path the model sent.
        path: String,
    },
    /// An `oldText` matches in more than one place.
    #[error("{}", ambiguous_message(*.index, *.count, *.fuzzy, .path))]
    Ambiguous {
        /// Which replacement (multi-edit calls only).
        index: Option<usize>,
        /// How many places it matches.
        count: usize,
        /// Whether the places were found by fuzzy matching (there was no exact match).
        fuzzy: bool,
        /// The path the model sent.
        path: String,
    },
    /// Two replacements claim overlapping text.
    #[error(
        "edits[{first}] and edits[{second}] overlap in {path}. Merge them into one edit or \
         target disjoint regions."
    )]
    Overlap {
        /// The replacement that comes first in the file.
        first: usize,
        /// The replacement that overlaps it.
        second: usize,
        /// The path the model sent.
        path: String,
    },
    /// An exact and a fuzzy replacement touch the same line, so the fuzzy line rewrite would
    /// clobber the exact one.
    #[error(
        "edits[{first}] and edits[{second}] touch the same line in {path}, and edits[{fuzzy}] \
         only matched after fuzzy normalisation (whitespace/quotes/Unicode). Merge them into one \
         edit."
    )]
    SharedLine {
        /// The lower index of the two.
        first: usize,
        /// The higher index of the two.
        second: usize,
        /// The one that matched fuzzily.
        fuzzy: usize,
        /// The path the model sent.
        path: String,
    },
    /// The replacements leave the content as it was.
    #[error("{}", no_change_message(*.multi, .path))]
    NoChange {
        /// Whether the call had several replacements.
        multi: bool,
        /// The path the model sent.
        path: String,
    },
}

fn empty_message(index: Option<usize>, path: &str) -> String {
    match index {
        None => format!("oldText must not be empty in {path}."),
        Some(i) => format!("edits[{i}].oldText must not be empty in {path}."),
    }
}

const FUZZY_ALSO_TRIED: &str = "Fuzzy matching (ignoring trailing whitespace and treating smart \
quotes, Unicode dashes and spaces as ASCII) found no match either. Read the file again and copy \
the text exactly.";

fn not_found_message(index: Option<usize>, path: &str) -> String {
    match index {
        None => format!(
            "Could not find the exact text in {path}. The old text must match exactly including \
             all whitespace and newlines. {FUZZY_ALSO_TRIED}"
        ),
        Some(i) => format!(
            "Could not find edits[{i}] in {path}. The oldText must match exactly including all \
             whitespace and newlines. {FUZZY_ALSO_TRIED}"
        ),
    }
}

fn ambiguous_message(index: Option<usize>, count: usize, fuzzy: bool, path: &str) -> String {
    let base = match index {
        None => format!(
            "Found {count} occurrences of the text in {path}. The text must be unique. Please \
             provide more context to make it unique."
        ),
        Some(i) => format!(
            "Found {count} occurrences of edits[{i}] in {path}. Each oldText must be unique. \
             Please provide more context to make it unique."
        ),
    };
    if fuzzy {
        format!("{base} (There is no exact match; these occurrences were found by fuzzy matching.)")
    } else {
        base
    }
}

fn no_change_message(multi: bool, path: &str) -> String {
    if multi {
        format!("No changes made to {path}. The replacements produced identical content.")
    } else {
        format!(
            "No changes made to {path}. The replacement produced identical content. This might \
             indicate an issue with special characters or the text not existing as expected."
        )
    }
}

/// Apply `edits` to `original` (without BOM): every edit is matched against the original,
/// all succeed or none is applied.
pub fn apply_edits(
    original: &str,
    edits: &[Replacement<'_>],
    path: &str,
) -> Result<Applied, EditFailure> {
    let multi = edits.len() > 1;
    let label = |i: usize| multi.then_some(i);
    let normalised: Vec<(Cow<'_, str>, Cow<'_, str>)> = edits
        .iter()
        .map(|edit| (to_lf(edit.old_text), to_lf(edit.new_text)))
        .collect();
    if let Some(i) = normalised.iter().position(|(old, _)| old.is_empty()) {
        return Err(EditFailure::EmptyOldText {
            index: label(i),
            path: path.to_owned(),
        });
    }
    let doc = Doc::new(original);
    let fuzzy_doc: OnceCell<FuzzyDoc> = OnceCell::new();
    let mut matches = Vec::with_capacity(edits.len());
    for (index, (old, _)) in normalised.iter().enumerate() {
        let found = match find_unique(&doc.lf, old) {
            Ok(start) => Match {
                index,
                fuzzy: false,
                start,
                end: start + old.len(),
            },
            Err(count @ 2..) => {
                return Err(EditFailure::Ambiguous {
                    index: label(index),
                    count,
                    fuzzy: false,
                    path: path.to_owned(),
                });
            }
            Err(_) => {
                let fuzzy = fuzzy_doc.get_or_init(|| FuzzyDoc::new(&doc.lf));
                let needle = fuzzy_normalize(old);
                let found = if needle.is_empty() {
                    Err(0)
                } else {
                    find_unique(&fuzzy.text, &needle)
                };
                match found {
                    Ok(start) => Match {
                        index,
                        fuzzy: true,
                        start,
                        end: start + needle.len(),
                    },
                    Err(0) => {
                        return Err(EditFailure::NotFound {
                            index: label(index),
                            path: path.to_owned(),
                        });
                    }
                    Err(count) => {
                        return Err(EditFailure::Ambiguous {
                            index: label(index),
                            count,
                            fuzzy: true,
                            path: path.to_owned(),
                        });
                    }
                }
            }
        };
        matches.push(found);
    }
    let pieces = match fuzzy_doc.get() {
        None => exact_pieces(&mut matches, &normalised, path)?,
        Some(fuzzy) => mixed_pieces(&doc, fuzzy, &mut matches, &normalised, path)?,
    };
    let content = doc.assemble(&pieces);
    if content == original {
        return Err(EditFailure::NoChange {
            multi,
            path: path.to_owned(),
        });
    }
    let mut fuzzy_edits: Vec<usize> = matches
        .iter()
        .filter(|m| m.fuzzy)
        .map(|m| m.index)
        .collect();
    fuzzy_edits.sort_unstable();
    Ok(Applied {
        content,
        fuzzy_edits,
    })
}

/// `\r\n` and lone `\r` as `\n` (borrowed when there is no `\r`).
pub fn to_lf(text: &str) -> Cow<'_, str> {
    if memchr::memchr(b'\r', text.as_bytes()).is_none() {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.replace("\r\n", "\n").replace('\r', "\n"))
}

/// Where a replacement matched: byte range in the LF view (exact) or in the fuzzy view.
#[derive(Clone, Copy, Debug)]
struct Match {
    index: usize,
    fuzzy: bool,
    start: usize,
    end: usize,
}

/// A region of the LF view to replace with `text` (LF line breaks).
struct Piece<'a> {
    start: usize,
    end: usize,
    text: Cow<'a, str>,
}

/// The unique start of `needle` in `haystack`, or how many (overlapping) places it matches.
fn find_unique(haystack: &str, needle: &str) -> Result<usize, usize> {
    let finder = memmem::Finder::new(needle.as_bytes());
    let haystack = haystack.as_bytes();
    let Some(first) = finder.find(haystack) else {
        return Err(0);
    };
    let mut count = 1;
    let mut from = first + 1;
    while let Some(next) = finder.find(&haystack[from..]) {
        count += 1;
        from += next + 1;
    }
    if count == 1 { Ok(first) } else { Err(count) }
}

fn overlap_check(sorted: &[Match], path: &str) -> Result<(), EditFailure> {
    for pair in sorted.windows(2) {
        if pair[0].end > pair[1].start {
            return Err(EditFailure::Overlap {
                first: pair[0].index,
                second: pair[1].index,
                path: path.to_owned(),
            });
        }
    }
    Ok(())
}

/// All matches exact: each becomes its own piece.
fn exact_pieces<'a>(
    matches: &mut [Match],
    normalised: &'a [(Cow<'_, str>, Cow<'_, str>)],
    path: &str,
) -> Result<Vec<Piece<'a>>, EditFailure> {
    matches.sort_unstable_by_key(|m| m.start);
    overlap_check(matches, path)?;
    Ok(matches
        .iter()
        .map(|m| Piece {
            start: m.start,
            end: m.end,
            text: Cow::Borrowed(&*normalised[m.index].1),
        })
        .collect())
}

/// Some matches fuzzy: group matches sharing lines; a group with a fuzzy match rewrites its
/// whole lines from the fuzzy view, exact matches elsewhere stay exact.
fn mixed_pieces<'a>(
    doc: &Doc<'_>,
    fuzzy: &FuzzyDoc,
    matches: &mut [Match],
    normalised: &'a [(Cow<'_, str>, Cow<'_, str>)],
    path: &str,
) -> Result<Vec<Piece<'a>>, EditFailure> {
    let lf_starts = doc.line_starts();
    let span = |m: &Match| -> (usize, usize) {
        let starts: &[usize] = if m.fuzzy {
            &fuzzy.line_starts
        } else {
            lf_starts
        };
        (line_of(starts, m.start), line_of(starts, m.end - 1))
    };
    let mut by_line: Vec<(usize, usize, Match)> = matches
        .iter()
        .map(|m| {
            let (first, last) = span(m);
            (first, last, *m)
        })
        .collect();
    by_line.sort_unstable_by_key(|(first, last, m)| (*first, *last, m.start));
    let mut exact: Vec<Match> = Vec::new();
    let mut pieces = Vec::new();
    let mut group: Vec<Match> = Vec::new();
    let mut group_lines = (0usize, 0usize);
    let mut flush = |group: &mut Vec<Match>, lines: (usize, usize)| -> Result<(), EditFailure> {
        if group.is_empty() {
            return Ok(());
        }
        let first_fuzzy = group.iter().filter(|m| m.fuzzy).map(|m| m.index).min();
        let first_exact = group.iter().filter(|m| !m.fuzzy).map(|m| m.index).min();
        match (first_fuzzy, first_exact) {
            (None, _) => exact.append(group),
            (Some(fuzzy_index), Some(exact_index)) => {
                return Err(EditFailure::SharedLine {
                    first: fuzzy_index.min(exact_index),
                    second: fuzzy_index.max(exact_index),
                    fuzzy: fuzzy_index,
                    path: path.to_owned(),
                });
            }
            (Some(_), None) => {
                group.sort_unstable_by_key(|m| m.start);
                overlap_check(group, path)?;
                pieces.push(fuzzy_group_piece(doc, fuzzy, group, lines, normalised));
                group.clear();
            }
        }
        Ok(())
    };
    for (first, last, m) in by_line {
        if !group.is_empty() && first <= group_lines.1 {
            group_lines.1 = group_lines.1.max(last);
        } else {
            flush(&mut group, group_lines)?;
            group_lines = (first, last);
        }
        group.push(m);
    }
    flush(&mut group, group_lines)?;
    exact.sort_unstable_by_key(|m| m.start);
    overlap_check(&exact, path)?;
    pieces.extend(exact.iter().map(|m| Piece {
        start: m.start,
        end: m.end,
        text: Cow::Borrowed(&*normalised[m.index].1),
    }));
    pieces.sort_unstable_by_key(|piece| piece.start);
    Ok(pieces)
}

/// The piece replacing lines `first..=last` (with the last line's break) by their fuzzy form
/// with the group's replacements applied.
fn fuzzy_group_piece<'a>(
    doc: &Doc<'_>,
    fuzzy: &FuzzyDoc,
    group: &[Match],
    (first, last): (usize, usize),
    normalised: &[(Cow<'_, str>, Cow<'_, str>)],
) -> Piece<'a> {
    let lf_starts = doc.line_starts();
    let region_end =
        |starts: &[usize], total: usize| starts.get(last + 1).copied().unwrap_or(total);
    let fuzzy_start = fuzzy.line_starts[first];
    let fuzzy_end = region_end(&fuzzy.line_starts, fuzzy.text.len());
    let mut text = String::with_capacity(fuzzy_end - fuzzy_start);
    let mut cursor = fuzzy_start;
    for m in group {
        text.push_str(&fuzzy.text[cursor..m.start]);
        text.push_str(&normalised[m.index].1);
        cursor = m.end;
    }
    text.push_str(&fuzzy.text[cursor..fuzzy_end]);
    Piece {
        start: lf_starts[first],
        end: region_end(lf_starts, doc.lf.len()),
        text: Cow::Owned(text),
    }
}

/// Index of the line containing byte `position`, given each line's start.
fn line_of(starts: &[usize], position: usize) -> usize {
    starts.partition_point(|&start| start <= position) - 1
}

/// How a line ends in the original file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Lf,
    CrLf,
    Cr,
    /// The last line, without a line break.
    None,
}

impl Ending {
    fn as_str(self) -> &'static str {
        match self {
            Ending::Lf => "\n",
            Ending::CrLf => "\r\n",
            Ending::Cr => "\r",
            Ending::None => "",
        }
    }
}

/// Where a line sits in the original file (kept only for files containing `\r`).
#[derive(Clone, Copy, Debug)]
struct LineMeta {
    original_start: usize,
    ending: Ending,
}

/// The original content and its LF view.
struct Doc<'a> {
    original: &'a str,
    lf: Cow<'a, str>,
    /// Per line (split on line breaks, a final empty line after a trailing break included),
    /// only when the original has `\r`; otherwise the LF view is the original.
    meta: Option<Vec<LineMeta>>,
    line_starts: OnceCell<Vec<usize>>,
    dominant: OnceCell<Ending>,
}

impl<'a> Doc<'a> {
    fn new(original: &'a str) -> Self {
        let bytes = original.as_bytes();
        if memchr::memchr(b'\r', bytes).is_none() {
            return Doc {
                original,
                lf: Cow::Borrowed(original),
                meta: None,
                line_starts: OnceCell::new(),
                dominant: OnceCell::new(),
            };
        }
        let mut lf = String::with_capacity(original.len());
        let mut meta = Vec::new();
        let mut starts = Vec::new();
        let mut line_start = 0;
        loop {
            starts.push(lf.len());
            let Some(offset) = memchr::memchr2(b'\n', b'\r', &bytes[line_start..]) else {
                lf.push_str(&original[line_start..]);
                meta.push(LineMeta {
                    original_start: line_start,
                    ending: Ending::None,
                });
                break;
            };
            let at = line_start + offset;
            let (ending, next) = match (bytes[at], bytes.get(at + 1)) {
                (b'\r', Some(b'\n')) => (Ending::CrLf, at + 2),
                (b'\r', _) => (Ending::Cr, at + 1),
                _ => (Ending::Lf, at + 1),
            };
            lf.push_str(&original[line_start..at]);
            lf.push('\n');
            meta.push(LineMeta {
                original_start: line_start,
                ending,
            });
            line_start = next;
        }
        Doc {
            original,
            lf: Cow::Owned(lf),
            meta: Some(meta),
            line_starts: OnceCell::from(starts),
            dominant: OnceCell::new(),
        }
    }

    /// Start of each line in the LF view.
    fn line_starts(&self) -> &[usize] {
        self.line_starts.get_or_init(|| {
            std::iter::once(0)
                .chain(memchr::memchr_iter(b'\n', self.lf.as_bytes()).map(|at| at + 1))
                .collect()
        })
    }

    /// Byte offset in the original of LF-view offset `position`.
    fn to_original(&self, position: usize) -> usize {
        let Some(meta) = &self.meta else {
            return position;
        };
        let starts = self.line_starts();
        let line = line_of(starts, position);
        meta[line].original_start + (position - starts[line])
    }

    /// The most common line ending (ties: the one met first); `\n` when there is none.
    fn dominant_ending(&self) -> Ending {
        *self.dominant.get_or_init(|| {
            let Some(meta) = &self.meta else {
                return Ending::Lf;
            };
            let mut counts = [(Ending::Lf, 0usize, usize::MAX); 3];
            counts[1].0 = Ending::CrLf;
            counts[2].0 = Ending::Cr;
            for (line, entry) in meta.iter().enumerate() {
                let slot = match entry.ending {
                    Ending::Lf => 0,
                    Ending::CrLf => 1,
                    Ending::Cr => 2,
                    Ending::None => continue,
                };
                counts[slot].1 += 1;
                counts[slot].2 = counts[slot].2.min(line);
            }
            counts
                .iter()
                .filter(|(_, count, _)| *count > 0)
                .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))
                .map_or(Ending::Lf, |(ending, _, _)| *ending)
        })
    }

    /// The original with `pieces` (sorted, disjoint, LF-view ranges) replaced.
    fn assemble(&self, pieces: &[Piece<'_>]) -> String {
        let added: usize = pieces.iter().map(|p| p.text.len()).sum();
        let mut out = String::with_capacity(self.original.len() + added);
        let mut cursor = 0;
        for piece in pieces {
            push_unmerged(
                &mut out,
                &self.original[self.to_original(cursor)..self.to_original(piece.start)],
            );
            self.push_with_endings(&mut out, piece);
            cursor = piece.end;
        }
        push_unmerged(&mut out, &self.original[self.to_original(cursor)..]);
        out
    }

    /// Append `piece.text`, giving each `\n` the ending of the line it replaces: positionally
    /// within the replaced region, the region's own final break kept for a final `\n`, the
    /// dominant ending for lines beyond.
    fn push_with_endings(&self, out: &mut String, piece: &Piece<'_>) {
        let Some(meta) = &self.meta else {
            out.push_str(&piece.text);
            return;
        };
        let starts = self.line_starts();
        let mut region: Vec<Ending> = Vec::new();
        let mut line = line_of(starts, piece.start);
        while line + 1 < starts.len() && starts[line + 1] - 1 < piece.end {
            region.push(meta[line].ending);
            line += 1;
        }
        let region_ends_with_break = piece.end > 0 && self.lf.as_bytes()[piece.end - 1] == b'\n';
        let breaks = memchr::memchr_iter(b'\n', piece.text.as_bytes()).count();
        let keep_final = region_ends_with_break && piece.text.ends_with('\n') && !region.is_empty();
        let pool = if keep_final {
            &region[..region.len() - 1]
        } else {
            &region[..]
        };
        let dominant = self.dominant_ending();
        for (k, part) in piece.text.split_inclusive('\n').enumerate() {
            match part.strip_suffix('\n') {
                Some(body) => {
                    out.push_str(body);
                    let ending = if keep_final && k + 1 == breaks {
                        region[region.len() - 1]
                    } else {
                        pool.get(k).copied().unwrap_or(dominant)
                    };
                    push_unmerged(out, ending.as_str());
                }
                None => out.push_str(part),
            }
        }
    }
}

/// Append `text` to `out`. A `\n` right after a lone `\r` line break would turn the two breaks
/// into one `\r\n` (a line lost, e.g. an empty line inserted after a `\r`-ended line, or the
/// text between a `\r` and a `\n` deleted), so that `\n` is written as `\r\n`. (Text in `out`
/// never ends with a `\r` other than a line break: line bodies hold none.)
fn push_unmerged(out: &mut String, text: &str) {
    if text.starts_with('\n') && out.ends_with('\r') {
        out.push('\r');
    }
    out.push_str(text);
}

/// The fuzzy view of an LF text: each line normalised, same number of lines.
struct FuzzyDoc {
    text: String,
    line_starts: Vec<usize>,
}

impl FuzzyDoc {
    fn new(lf: &str) -> Self {
        let mut text = String::with_capacity(lf.len());
        let mut line_starts = Vec::new();
        for (index, line) in lf.split('\n').enumerate() {
            if index > 0 {
                text.push('\n');
            }
            line_starts.push(text.len());
            push_fuzzy_line(line, &mut text);
        }
        FuzzyDoc { text, line_starts }
    }
}

/// The fuzzy form of an LF text (docs/semantics.md#edit).
pub fn fuzzy_normalize(lf: &str) -> String {
    FuzzyDoc::new(lf).text
}

/// JavaScript's `trimEnd` whitespace (Unicode White_Space plus the BOM).
fn is_trailing_space(c: char) -> bool {
    c.is_whitespace() || c == '\u{FEFF}'
}

/// NFKC, trailing whitespace removed, then quotes, dashes and spaces folded to ASCII.
fn push_fuzzy_line(line: &str, out: &mut String) {
    if line.is_ascii() {
        out.push_str(line.trim_end_matches(is_trailing_space));
        return;
    }
    let composed: String = line.nfkc().collect();
    for c in composed.trim_end_matches(is_trailing_space).chars() {
        out.push(match c {
            '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' => '\'',
            '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' => '"',
            '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
            '\u{00A0}' | '\u{2002}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
            other => other,
        });
    }
}

/// The display diff, first changed line and patch of one edit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EditDiff {
    /// Numbered display diff of the LF, BOM-less texts ([`display_diff`]).
    pub diff: String,
    /// New-file line number of the first change.
    pub first_changed_line: Option<usize>,
    /// Unified patch of the exact texts ([`unified_patch`]).
    pub patch: String,
}

/// [`display_diff`] (on the LF, BOM-less forms) and [`unified_patch`] (on the exact texts) of
/// an edit, sharing one diff when the two forms are the same text.
pub fn edit_diff(path: &str, original: &str, edited: &str) -> EditDiff {
    const BOM: char = '\u{FEFF}';
    let old_lf = to_lf(original.strip_prefix(BOM).unwrap_or(original));
    let new_lf = to_lf(edited.strip_prefix(BOM).unwrap_or(edited));
    let patch_window = Window::new(original, edited, DIFF_CONTEXT_LINES);
    let patch_diff = patch_window.diff();
    let patch = format_patch(path, &patch_window, &patch_diff);
    let same_text = std::ptr::eq(old_lf.as_ptr(), original.as_ptr())
        && std::ptr::eq(new_lf.as_ptr(), edited.as_ptr())
        && old_lf.len() == original.len()
        && new_lf.len() == edited.len();
    let (diff, first_changed_line) = if same_text {
        render_display(
            &old_lf,
            &new_lf,
            &patch_window,
            &patch_diff,
            DIFF_CONTEXT_LINES,
        )
    } else {
        let window = Window::new(&old_lf, &new_lf, DIFF_CONTEXT_LINES);
        render_display(
            &old_lf,
            &new_lf,
            &window,
            &window.diff(),
            DIFF_CONTEXT_LINES,
        )
    };
    EditDiff {
        diff,
        first_changed_line,
        patch,
    }
}

/// A numbered display diff of two LF texts: `+`/`-`/` ` prefixes, line numbers padded to a
/// common width, at most `context` unchanged lines around each change and `...` for gaps. Also
/// returns the new-file line of the first change.
pub fn display_diff(old: &str, new: &str, context: usize) -> (String, Option<usize>) {
    let window = Window::new(old, new, context);
    render_display(old, new, &window, &window.diff(), context)
}

/// A unified diff of `old` to `new` with `--- path` / `+++ path` headers and
/// [`DIFF_CONTEXT_LINES`] lines of context, as `patch -p0` and `git apply -p0` accept it.
pub fn unified_patch(path: &str, old: &str, new: &str) -> String {
    let window = Window::new(old, new, DIFF_CONTEXT_LINES);
    format_patch(path, &window, &window.diff())
}

/// The part of two texts a diff has to look at: everything outside it is a common prefix or
/// suffix of whole lines. It keeps up to `context` unchanged lines on each side, so hunks and
/// display context come out as if the whole texts had been diffed, in time linear in the
/// texts plus the diff of the window.
struct Window<'a> {
    old: &'a str,
    new: &'a str,
    /// Lines before the window (same in both texts).
    lines_before: usize,
    /// Whether lines follow the window.
    lines_after: bool,
}

impl<'a> Window<'a> {
    fn new(old: &'a str, new: &'a str, context: usize) -> Self {
        let (old_bytes, new_bytes) = (old.as_bytes(), new.as_bytes());
        let prefix = common_prefix(old_bytes, new_bytes);
        // Back to the start of the line holding the first difference.
        let changed_start = memchr::memrchr(b'\n', &old_bytes[..prefix]).map_or(0, |at| at + 1);
        let suffix = common_suffix(&old_bytes[changed_start..], &new_bytes[changed_start..]);
        // The suffix must start at a line start in both texts: after a newline inside it.
        let suffix_start = old.len() - suffix;
        let changed_end = match memchr::memchr(b'\n', &old_bytes[suffix_start..]) {
            Some(at) if suffix > 0 => suffix_start + at + 1,
            _ => old.len(),
        };
        let kept_suffix = old.len() - changed_end;
        let mut start = changed_start;
        for _ in 0..context {
            if start == 0 {
                break;
            }
            start = memchr::memrchr(b'\n', &old_bytes[..start - 1]).map_or(0, |at| at + 1);
        }
        let mut old_end = changed_end;
        for _ in 0..context {
            match memchr::memchr(b'\n', &old_bytes[old_end..]) {
                Some(at) => old_end += at + 1,
                None => {
                    old_end = old.len();
                    break;
                }
            }
        }
        let new_end = new.len() - kept_suffix + (old_end - changed_end);
        Window {
            old: &old[start..old_end],
            new: &new[start..new_end],
            lines_before: memchr::memchr_iter(b'\n', &old_bytes[..start]).count(),
            lines_after: old_end < old.len(),
        }
    }

    /// The whole texts as one window (tests compare against it).
    #[cfg(test)]
    fn whole(old: &'a str, new: &'a str) -> Self {
        Window {
            old,
            new,
            lines_before: 0,
            lines_after: false,
        }
    }

    fn diff(&self) -> LineDiff<'a> {
        let old: Vec<&'a str> = self.old.split_inclusive('\n').collect();
        let new: Vec<&'a str> = self.new.split_inclusive('\n').collect();
        let deadline = Instant::now().checked_add(DIFF_DEADLINE);
        let ops = similar::capture_diff_slices_deadline(Algorithm::Myers, &old, &new, deadline);
        LineDiff { old, new, ops }
    }
}

/// A diff of lines that each end at a `\n` (the last one may lack it): the line model of
/// `diff -u` and `patch`, in which a lone `\r` is an ordinary byte. (Splitting at a lone `\r`
/// too would write a patch whose lines `patch` cannot find in the file.)
struct LineDiff<'a> {
    old: Vec<&'a str>,
    new: Vec<&'a str>,
    ops: Vec<DiffOp>,
}

impl<'a> LineDiff<'a> {
    fn old_slice(&self, index: usize) -> Option<&'a str> {
        self.old.get(index).copied()
    }

    fn new_slice(&self, index: usize) -> Option<&'a str> {
        self.new.get(index).copied()
    }
}

/// Length of the common prefix of two byte strings.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 4096;
    let limit = a.len().min(b.len());
    let mut at = 0;
    while at + CHUNK <= limit && a[at..at + CHUNK] == b[at..at + CHUNK] {
        at += CHUNK;
    }
    at + a[at..limit]
        .iter()
        .zip(&b[at..limit])
        .take_while(|(x, y)| x == y)
        .count()
}

/// Length of the common suffix of two byte strings.
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 4096;
    let limit = a.len().min(b.len());
    let (a_end, b_end) = (a.len(), b.len());
    let mut len = 0;
    while len + CHUNK <= limit
        && a[a_end - len - CHUNK..a_end - len] == b[b_end - len - CHUNK..b_end - len]
    {
        len += CHUNK;
    }
    len + a[..a_end - len]
        .iter()
        .rev()
        .zip(b[..b_end - len].iter().rev())
        .take(limit - len)
        .take_while(|(x, y)| x == y)
        .count()
}

fn render_display(
    old: &str,
    new: &str,
    window: &Window<'_>,
    diff: &LineDiff<'_>,
    context: usize,
) -> (String, Option<usize>) {
    let total_lines = |text: &str| memchr::memchr_iter(b'\n', text.as_bytes()).count() + 1;
    let width = total_lines(old).max(total_lines(new)).to_string().len();
    let mut parts = diff_parts(&diff.ops);
    // Lines outside the window are unchanged lines of the first and last runs.
    if window.lines_before > 0 {
        match parts.first_mut() {
            Some(Part::Equal { hidden_before, .. }) => *hidden_before = window.lines_before,
            _ => parts.insert(
                0,
                Part::Equal {
                    hidden_before: window.lines_before,
                    range: 0..0,
                    hidden_after: 0,
                },
            ),
        }
    }
    if window.lines_after {
        match parts.last_mut() {
            Some(Part::Equal { hidden_after, .. }) => *hidden_after = 1,
            _ => {
                let end = diff.old.len();
                parts.push(Part::Equal {
                    hidden_before: 0,
                    range: end..end,
                    hidden_after: 1,
                });
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    let mut old_no = 1usize;
    let mut new_no = 1usize;
    let mut first_changed = None;
    let mut last_was_change = false;
    let line = |text: &str| text.strip_suffix('\n').unwrap_or(text).to_owned();
    let gap = format!(" {} ...", " ".repeat(width));
    for (i, part) in parts.iter().enumerate() {
        match part {
            Part::Removed(range) => {
                first_changed.get_or_insert(new_no);
                for index in range.clone() {
                    let text = line(diff.old_slice(index).unwrap_or(""));
                    out.push(format!("-{old_no:>width$} {text}"));
                    old_no += 1;
                }
                last_was_change = true;
            }
            Part::Added(range) => {
                first_changed.get_or_insert(new_no);
                for index in range.clone() {
                    let text = line(diff.new_slice(index).unwrap_or(""));
                    out.push(format!("+{new_no:>width$} {text}"));
                    new_no += 1;
                }
                last_was_change = true;
            }
            Part::Equal {
                hidden_before,
                range,
                hidden_after,
            } => {
                let next_is_change = i + 1 < parts.len();
                let count = hidden_before + range.len() + hidden_after;
                let (head, tail) = match (last_was_change, next_is_change) {
                    (true, true) if count <= context * 2 => (count, 0),
                    (true, true) => (context, context),
                    (true, false) => (count.min(context), 0),
                    (false, true) => (0, count.min(context)),
                    (false, false) => (0, 0),
                };
                // Hidden lines are only ever at the outer ends, away from any change; clamp
                // anyway so a shown line is always a real one.
                let head = if *hidden_before == 0 {
                    head.min(range.len())
                } else {
                    0
                };
                let tail = if *hidden_after == 0 {
                    tail.min(range.len() - head)
                } else {
                    0
                };
                let context_line = |index: usize, number: usize| {
                    let text = line(diff.old_slice(index).unwrap_or(""));
                    format!(" {number:>width$} {text}")
                };
                for index in range.start..range.start + head {
                    out.push(context_line(index, old_no));
                    old_no += 1;
                    new_no += 1;
                }
                let skipped = count - head - tail;
                if skipped > 0 && (last_was_change || next_is_change) {
                    out.push(gap.clone());
                }
                old_no += skipped;
                new_no += skipped;
                for index in range.end - tail..range.end {
                    out.push(context_line(index, old_no));
                    old_no += 1;
                    new_no += 1;
                }
                last_was_change = false;
            }
        }
    }
    (out.join("\n"), first_changed)
}

/// The unified patch of a windowed diff, hunk line numbers shifted to the whole file.
fn format_patch(path: &str, window: &Window<'_>, diff: &LineDiff<'_>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    // `-start,len` (1-based), `-start` for one line, `-before,0` for none (as `diff -u`).
    let range = |start: usize, end: usize| -> String {
        let len = end - start;
        let start = start + window.lines_before;
        match len {
            0 => format!("{start},0"),
            1 => format!("{}", start + 1),
            _ => format!("{},{len}", start + 1),
        }
    };
    let line = |out: &mut String, sign: char, text: &str| {
        out.push(sign);
        out.push_str(text);
        if !text.ends_with('\n') {
            out.push_str("\n\\ No newline at end of file\n");
        }
    };
    for hunk in similar::group_diff_ops(diff.ops.clone(), DIFF_CONTEXT_LINES) {
        let (Some(first), Some(last)) = (hunk.first(), hunk.last()) else {
            continue;
        };
        if out.is_empty() {
            // Writing to a String cannot fail.
            let _ = write!(out, "--- {path}\n+++ {path}\n");
        }
        let _ = writeln!(
            out,
            "@@ -{} +{} @@",
            range(first.old_range().start, last.old_range().end),
            range(first.new_range().start, last.new_range().end)
        );
        for op in &hunk {
            let (tag, old_range, new_range) = op.as_tag_tuple();
            let (removed, added) = match tag {
                DiffTag::Equal => {
                    for text in &diff.old[old_range] {
                        line(&mut out, ' ', text);
                    }
                    continue;
                }
                DiffTag::Delete => (old_range, 0..0),
                DiffTag::Insert => (0..0, new_range),
                DiffTag::Replace => (old_range, new_range),
            };
            for text in &diff.old[removed] {
                line(&mut out, '-', text);
            }
            for text in &diff.new[added] {
                line(&mut out, '+', text);
            }
        }
    }
    out
}

/// A run of the diff: unchanged lines (old indices, with unchanged lines outside the diffed
/// window counted before and after), removed lines (old indices) or added lines (new indices).
enum Part {
    Equal {
        hidden_before: usize,
        range: std::ops::Range<usize>,
        hidden_after: usize,
    },
    Removed(std::ops::Range<usize>),
    Added(std::ops::Range<usize>),
}

fn diff_parts(ops: &[DiffOp]) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::with_capacity(ops.len() + 1);
    for op in ops {
        match *op {
            DiffOp::Equal { old_index, len, .. } => match parts.last_mut() {
                Some(Part::Equal { range, .. }) if range.end == old_index => range.end += len,
                _ => parts.push(Part::Equal {
                    hidden_before: 0,
                    range: old_index..old_index + len,
                    hidden_after: 0,
                }),
            },
            DiffOp::Delete {
                old_index, old_len, ..
            } => parts.push(Part::Removed(old_index..old_index + old_len)),
            DiffOp::Insert {
                new_index, new_len, ..
            } => parts.push(Part::Added(new_index..new_index + new_len)),
            DiffOp::Replace {
                old_index,
                old_len,
                new_index,
                new_len,
            } => {
                parts.push(Part::Removed(old_index..old_index + old_len));
                parts.push(Part::Added(new_index..new_index + new_len));
            }
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "test.txt";

    fn edit(original: &str, old_text: &str, new_text: &str) -> Result<Applied, EditFailure> {
        apply_edits(original, &[Replacement { old_text, new_text }], PATH)
    }

    fn edits(original: &str, pairs: &[(&str, &str)]) -> Result<Applied, EditFailure> {
        let replacements: Vec<Replacement<'_>> = pairs
            .iter()
            .map(|(old_text, new_text)| Replacement { old_text, new_text })
            .collect();
        apply_edits(original, &replacements, PATH)
    }

    fn content(outcome: Result<Applied, EditFailure>) -> String {
        outcome.unwrap().content
    }

    fn message(outcome: Result<Applied, EditFailure>) -> String {
        outcome.unwrap_err().to_string()
    }

    #[test]
    fn replaces_exact_text() {
        let applied = edit("Hello, world!\n", "world", "testing").unwrap();
        assert_eq!(applied.content, "Hello, testing!\n");
        assert!(applied.fuzzy_edits.is_empty());
    }

    #[test]
    fn replaces_disjoint_regions_against_the_original() {
        let out = edits(
            "alpha\nbeta\ngamma\ndelta\n",
            &[("alpha", "ALPHA"), ("gamma", "GAMMA")],
        );
        assert_eq!(content(out), "ALPHA\nbeta\nGAMMA\ndelta\n");
        // The second edit matches the original, not the result of the first.
        let out = edits(
            "foo\nbar\nbaz\n",
            &[("foo\n", "foo bar\n"), ("bar\n", "BAR\n")],
        );
        assert_eq!(content(out), "foo bar\nBAR\nbaz\n");
    }

    #[test]
    fn touching_edits_are_allowed_overlapping_are_not() {
        let out = edits("abcdef", &[("abc", "1"), ("def", "2")]);
        assert_eq!(content(out), "12");
        let out = edits("abcdef", &[("abcd", "1"), ("cdef", "2")]);
        assert_eq!(
            message(out),
            "edits[0] and edits[1] overlap in test.txt. Merge them into one edit or target \
             disjoint regions."
        );
        let out = edits("abcdef", &[("cdef", "2"), ("abcd", "1")]);
        assert_eq!(
            message(out),
            "edits[1] and edits[0] overlap in test.txt. Merge them into one edit or target \
             disjoint regions."
        );
    }

    #[test]
    fn empty_old_text() {
        assert_eq!(
            message(edit("x", "", "y")),
            "oldText must not be empty in test.txt."
        );
        assert_eq!(
            message(edits("x", &[("x", "y"), ("", "z")])),
            "edits[1].oldText must not be empty in test.txt."
        );
    }

    #[test]
    fn not_found_mentions_fuzzy_matching() {
        assert_eq!(
            message(edit("hello\n", "absent", "x")),
            format!(
                "Could not find the exact text in test.txt. The old text must match exactly \
                 including all whitespace and newlines. {FUZZY_ALSO_TRIED}"
            )
        );
        assert_eq!(
            message(edits("hello\n", &[("hello", "x"), ("absent", "y")])),
            format!(
                "Could not find edits[1] in test.txt. The oldText must match exactly including \
                 all whitespace and newlines. {FUZZY_ALSO_TRIED}"
            )
        );
        // Whitespace-only oldText that is not in the file must not fuzzy-match everywhere.
        assert!(message(edit("a\nb\n", "   ", "x")).starts_with("Could not find the exact text"));
    }

    #[test]
    fn duplicates_are_rejected_with_a_count() {
        assert_eq!(
            message(edit("foo foo foo\n", "foo", "bar")),
            "Found 3 occurrences of the text in test.txt. The text must be unique. Please \
             provide more context to make it unique."
        );
        assert_eq!(
            message(edits("a\nfoo\nfoo\n", &[("a", "b"), ("foo", "bar")])),
            "Found 2 occurrences of edits[1] in test.txt. Each oldText must be unique. Please \
             provide more context to make it unique."
        );
        // Overlapping candidates are ambiguous too.
        assert!(message(edit("aaa", "aa", "b")).starts_with("Found 2 occurrences"));
    }

    #[test]
    fn no_change() {
        assert_eq!(
            message(edit("same\n", "same", "same")),
            "No changes made to test.txt. The replacement produced identical content. This \
             might indicate an issue with special characters or the text not existing as \
             expected."
        );
        assert_eq!(
            message(edits("a b\n", &[("a", "a"), ("b", "b")])),
            "No changes made to test.txt. The replacements produced identical content."
        );
    }

    #[test]
    fn fuzzy_trailing_whitespace() {
        let applied = edit(
            "line one   \nline two  \nline three\n",
            "line one\nline two\n",
            "replaced\n",
        )
        .unwrap();
        assert_eq!(applied.content, "replaced\nline three\n");
        assert_eq!(applied.fuzzy_edits, [0]);
    }

    #[test]
    fn fuzzy_fullwidth_punctuation_keeps_untouched_text() {
        let original = "你好，世界\n你好（pi）\n";
        let out = edits(
            original,
            &[("你好,世界", "你好，pi"), ("你好(pi)", "你好(pi)")],
        );
        // The second edit is a no-op on its line but rewrites it normalised: a fuzzy match
        // rewrites every line it touches from its normalised form.
        assert_eq!(content(out), "你好，pi\n你好(pi)\n");
    }

    #[test]
    fn fuzzy_compatibility_forms() {
        let out = edit("ＡＢＣ１２３\ncafe\u{301}\n", "ABC123\ncafé", "done");
        assert_eq!(content(out), "done\n");
    }

    #[test]
    fn fuzzy_quotes_dashes_and_spaces() {
        assert_eq!(
            content(edit("say \u{2018}hi\u{2019}\n", "say 'hi'", "say 'bye'")),
            "say 'bye'\n"
        );
        assert_eq!(
            content(edit("say \u{201C}hi\u{201D}\n", "say \"hi\"", "ok")),
            "ok\n"
        );
        assert_eq!(
            content(edit("a\u{2013}b\u{2014}c\u{2212}d\n", "a-b-c-d", "x")),
            "x\n"
        );
        assert_eq!(content(edit("a\u{00A0}b\u{3000}c\n", "a b c", "y")), "y\n");
    }

    #[test]
    fn exact_match_is_preferred_and_touches_nothing_else() {
        let original = "it\u{2019}s   \nit's here\n";
        let applied = edit(original, "it's here", "it is here").unwrap();
        assert_eq!(applied.content, "it\u{2019}s   \nit is here\n");
        assert!(applied.fuzzy_edits.is_empty());
    }

    #[test]
    fn exact_unique_match_accepted_next_to_a_fuzzy_twin() {
        // Counted in fuzzy space this would be ambiguous; the exact match is unique on its own.
        let original = "x = 'a'\nx = \u{2018}a\u{2019}\n";
        assert_eq!(
            content(edit(original, "x = 'a'", "x = 1")),
            "x = 1\nx = \u{2018}a\u{2019}\n"
        );
        assert_eq!(
            content(edit(original, "x = \u{2018}a\u{2019}", "x = 2")),
            "x = 'a'\nx = 2\n"
        );
    }

    #[test]
    fn fuzzy_still_fails_when_absent() {
        assert!(
            message(edit("hello\n", "goodbye", "x")).starts_with("Could not find the exact text")
        );
    }

    #[test]
    fn fuzzy_duplicates_are_counted_in_fuzzy_space() {
        let out = edit(
            "hello  world   \nhello \u{00A0}world\n",
            "hello  world\nx",
            "y",
        );
        assert!(message(out).starts_with("Could not find"));
        let out = edit("a\u{2019}b\na\u{2018}b\n", "a'b", "c");
        assert_eq!(
            message(out),
            "Found 2 occurrences of the text in test.txt. The text must be unique. Please \
             provide more context to make it unique. (There is no exact match; these occurrences \
             were found by fuzzy matching.)"
        );
    }

    #[test]
    fn fuzzy_multi_edit() {
        let applied = edits(
            "one   \n\u{201C}two\u{201D}\nthree\n",
            &[("one\n", "ONE\n"), ("\"two\"", "TWO")],
        )
        .unwrap();
        assert_eq!(applied.content, "ONE\nTWO\nthree\n");
        assert_eq!(applied.fuzzy_edits, [0, 1]);
    }

    #[test]
    fn fuzzy_replacement_equal_to_a_nearby_line() {
        let applied = edit("replace me   \nafter   \n", "replace me\n", "after\n").unwrap();
        assert_eq!(applied.content, "after\nafter   \n");
    }

    #[test]
    fn fuzzy_keeps_untouched_lines_byte_for_byte() {
        let original =
            "keep \u{2018}this\u{2019}   \nfix\u{00A0}me  \nalso\u{2014}keep  \t\nlast\u{3000}\n";
        let applied = edit(original, "fix me", "fixed").unwrap();
        assert_eq!(applied.fuzzy_edits, [0]);
        assert_eq!(
            applied.content,
            "keep \u{2018}this\u{2019}   \nfixed\nalso\u{2014}keep  \t\nlast\u{3000}\n"
        );
    }

    #[test]
    fn exact_and_fuzzy_on_one_line_must_be_merged() {
        let out = edits(
            "a = \u{2018}x\u{2019}; b = 1\n",
            &[("b = 1", "b = 2"), ("a = 'x'", "a = 'y'")],
        );
        assert_eq!(
            message(out),
            "edits[0] and edits[1] touch the same line in test.txt, and edits[1] only matched \
             after fuzzy normalisation (whitespace/quotes/Unicode). Merge them into one edit."
        );
        // On different lines they combine.
        let out = edits(
            "a = \u{2018}x\u{2019}\nb = 1\n",
            &[("b = 1", "b = 2"), ("a = 'x'", "a = 'y'")],
        );
        assert_eq!(content(out), "a = 'y'\nb = 2\n");
    }

    #[test]
    fn two_fuzzy_edits_on_one_line() {
        let out = edits(
            "\u{201C}a\u{201D} and \u{201C}b\u{201D}   \n",
            &[("\"a\"", "A"), ("\"b\"", "B")],
        );
        assert_eq!(content(out), "A and B\n");
        let out = edits("\u{201C}ab\u{201D}\n", &[("\"a", "1"), ("ab\"", "2")]);
        assert!(message(out).contains("overlap"));
    }

    #[test]
    fn lf_old_text_matches_crlf_content() {
        let out = edit(
            "first\r\nsecond\r\nthird\r\n",
            "second\nthird",
            "REPLACED\nTHIRD",
        );
        assert_eq!(content(out), "first\r\nREPLACED\r\nTHIRD\r\n");
        let out = edit("first\r\nsecond\r\nthird\r\n", "second", "REPLACED");
        assert_eq!(content(out), "first\r\nREPLACED\r\nthird\r\n");
        let out = edit("first\nsecond\nthird\n", "second", "REPLACED");
        assert_eq!(content(out), "first\nREPLACED\nthird\n");
        // CRLF in oldText and newText are read as LF too.
        let out = edit("a\r\nb\r\n", "a\r\nb", "x\r\ny\r\nz");
        assert_eq!(content(out), "x\r\ny\r\nz\r\n");
    }

    #[test]
    fn duplicates_across_crlf_and_lf() {
        let out = edit("same\r\ntext\nsame\ntext\n", "same\ntext", "x");
        assert!(message(out).starts_with("Found 2 occurrences"));
    }

    #[test]
    fn mixed_line_endings_stay_mixed() {
        let original = "one\r\ntwo\nthree\r\nfour\n";
        // New lines take the dominant ending (tie: the first one met, CRLF).
        assert_eq!(
            content(edit(original, "two", "TWO\nextra")),
            "one\r\nTWO\r\nextra\nthree\r\nfour\n"
        );
        // A replaced line break keeps its own ending.
        assert_eq!(
            content(edit(original, "two\nthree", "2\n3")),
            "one\r\n2\n3\r\nfour\n"
        );
        // Whole lines replaced: positional endings, the region's final break kept.
        assert_eq!(
            content(edit(original, "one\ntwo\nthree\n", "1\n2\n3\n")),
            "1\r\n2\n3\r\nfour\n"
        );
        assert_eq!(
            content(edit(original, "one\ntwo\nthree\n", "only\n")),
            "only\r\nfour\n"
        );
        // Untouched lines are byte-for-byte, fuzzy too.
        let original = "keep   \r\nfix  \nkeep2\r\n";
        assert_eq!(
            content(edit(original, "fix\nkeep2", "fixed\nkept")),
            "keep   \r\nfixed\nkept\r\n"
        );
    }

    #[test]
    fn lone_carriage_returns() {
        let out = edit("a\rb\rc", "b", "B\nB2");
        assert_eq!(content(out), "a\rB\rB2\rc");
    }

    #[test]
    fn dominant_ending_counts() {
        let doc = Doc::new("a\nb\r\nc\r\nd\n\n");
        assert_eq!(doc.dominant_ending(), Ending::Lf);
        let doc = Doc::new("a\r\nb\nc\r\n");
        assert_eq!(doc.dominant_ending(), Ending::CrLf);
        assert_eq!(Doc::new("no breaks").dominant_ending(), Ending::Lf);
    }

    #[test]
    fn large_files_work() {
        let mut original = String::with_capacity(20 << 20);
        for i in 0..400_000 {
            original.push_str(&format!("line {i:07} {}\r\n", "x".repeat(40)));
        }
        let applied = edit(&original, "line 0200000", "LINE 0200000").unwrap();
        assert_eq!(applied.content.len(), original.len());
        assert!(applied.content.contains("LINE 0200000 x"));
        let (diff, first) = display_diff(&to_lf(&original), &to_lf(&applied.content), 4);
        assert_eq!(first, Some(200_001));
        // gap, 4 context, -, +, 4 context, gap
        assert_eq!(diff.lines().count(), 12);
    }

    #[test]
    fn fuzzy_normalisation_steps() {
        assert_eq!(fuzzy_normalize("a  \nb\t\n"), "a\nb\n");
        assert_eq!(fuzzy_normalize("\u{FB01}le \u{2460}"), "file 1");
        assert_eq!(fuzzy_normalize("x\u{2011}y"), "x-y");
        assert_eq!(fuzzy_normalize("\u{201E}q\u{201F}"), "\"q\"");
        assert_eq!(fuzzy_normalize("end\u{00A0}\u{3000}"), "end");
    }

    #[test]
    fn display_diff_format() {
        let old = "a\nb\nc\n";
        let new = "a\nB\nc\n";
        let (diff, first) = display_diff(old, new, 4);
        assert_eq!(diff, " 1 a\n-2 b\n+2 B\n 3 c");
        assert_eq!(first, Some(2));
    }

    #[test]
    fn display_diff_collapses_context() {
        let old: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let new = old
            .replace("line 2\n", "LINE 2\n")
            .replace("line 25\n", "LINE 25\n");
        let (diff, first) = display_diff(&old, &new, 4);
        let expected = [
            "  1 line 1",
            "- 2 line 2",
            "+ 2 LINE 2",
            "  3 line 3",
            "  4 line 4",
            "  5 line 5",
            "  6 line 6",
            "    ...",
            " 21 line 21",
            " 22 line 22",
            " 23 line 23",
            " 24 line 24",
            "-25 line 25",
            "+25 LINE 25",
            " 26 line 26",
            " 27 line 27",
            " 28 line 28",
            " 29 line 29",
            "    ...",
        ]
        .join("\n");
        assert_eq!(diff, expected);
        assert_eq!(first, Some(2));
    }

    #[test]
    fn display_diff_leading_gap_and_short_middle() {
        let old: String = (1..=12).map(|i| format!("{i}\n")).collect();
        let new = old.replace("7\n", "seven\n").replace("10\n", "ten\n");
        let (diff, first) = display_diff(&old, &new, 4);
        let expected = [
            "    ...",
            "  3 3",
            "  4 4",
            "  5 5",
            "  6 6",
            "- 7 7",
            "+ 7 seven",
            "  8 8",
            "  9 9",
            "-10 10",
            "+10 ten",
            " 11 11",
            " 12 12",
        ]
        .join("\n");
        assert_eq!(diff, expected);
        assert_eq!(first, Some(7));
    }

    /// Random line-based texts and edits of them.
    fn random_case(rng: &mut fastrand::Rng) -> (String, String) {
        let words = ["a", "b", "c", "", "dd", "a b"];
        let lines: Vec<&str> = (0..rng.usize(0..40))
            .map(|_| words[rng.usize(..words.len())])
            .collect();
        let mut old = lines.join("\n");
        if rng.bool() {
            old.push('\n');
        }
        let mut new_lines: Vec<String> = old.split('\n').map(str::to_owned).collect();
        for _ in 0..rng.usize(1..4) {
            let at = rng.usize(..new_lines.len());
            match rng.u8(..3) {
                0 => new_lines[at] = format!("x{}", rng.u8(..)),
                1 => new_lines.insert(at, "ins".to_owned()),
                _ => {
                    new_lines.remove(at);
                    if new_lines.is_empty() {
                        new_lines.push(String::new());
                    }
                }
            }
        }
        (old, new_lines.join("\n"))
    }

    #[test]
    fn windowed_diff_equals_whole_text_diff() {
        let mut rng = fastrand::Rng::with_seed(11);
        for case in 0..3000 {
            let (old, new) = random_case(&mut rng);
            if old == new {
                continue;
            }
            let whole = Window::whole(&old, &new);
            let whole_diff = whole.diff();
            let window = Window::new(&old, &new, DIFF_CONTEXT_LINES);
            let window_diff = window.diff();
            assert_eq!(
                render_display(&old, &new, &window, &window_diff, DIFF_CONTEXT_LINES),
                render_display(&old, &new, &whole, &whole_diff, DIFF_CONTEXT_LINES),
                "display, case {case}: {old:?} -> {new:?}"
            );
            assert_eq!(
                format_patch("f", &window, &window_diff),
                format_patch("f", &whole, &whole_diff),
                "patch, case {case}: {old:?} -> {new:?}"
            );
        }
    }

    #[test]
    fn patch_format_matches_similar() {
        let mut rng = fastrand::Rng::with_seed(5);
        for _ in 0..500 {
            let (old, new) = random_case(&mut rng);
            if old == new {
                continue;
            }
            let reference = similar::TextDiff::from_lines(&old, &new)
                .unified_diff()
                .context_radius(DIFF_CONTEXT_LINES)
                .header("f", "f")
                .to_string();
            assert_eq!(
                unified_patch("f", &old, &new),
                reference,
                "{old:?} -> {new:?}"
            );
        }
    }

    #[test]
    fn a_line_break_next_to_a_lone_carriage_return_is_not_merged_into_crlf() {
        // Deleting the text between a `\r` break and a `\n` break keeps both breaks.
        let out = content(edit("a\rb\nc\n", "b", ""));
        assert_eq!(to_lf(&out), "a\n\nc\n");
        assert_eq!(out, "a\r\r\nc\n");
        // An inserted empty line ended with the dominant `\r` before an original `\n`.
        let out = content(edit("a\rb\rc\nd", "c", "\n"));
        assert_eq!(to_lf(&out), "a\nb\n\n\nd");
        // An inserted `\n` ending right after an original `\r` break.
        let out = content(edit("a\rb\nc\nd\n", "b", "\nx"));
        assert_eq!(to_lf(&out), "a\n\nx\nc\nd\n");
    }

    #[test]
    fn a_lone_carriage_return_does_not_end_a_patch_line() {
        // `patch` reads lines up to `\n`; a `\r` line break inside one is an ordinary byte.
        let patch = unified_patch("f", "a\nx\ry\n", "b\nx\ry\n");
        assert_eq!(patch, "--- f\n+++ f\n@@ -1,2 +1,2 @@\n-a\n+b\n x\ry\n");
        let patch = unified_patch("f", "a\rb", "a\rc");
        assert_eq!(
            patch,
            "--- f\n+++ f\n@@ -1 +1 @@\n-a\rb\n\\ No newline at end of file\n+a\rc\n\\ No newline at end of file\n"
        );
    }

    #[test]
    fn unified_patch_has_headers_and_context() {
        let patch = unified_patch("src/a.txt", "1\n2\n3\n", "1\nTWO\n3\n");
        assert_eq!(
            patch,
            "--- src/a.txt\n+++ src/a.txt\n@@ -1,3 +1,3 @@\n 1\n-2\n+TWO\n 3\n"
        );
        let patch = unified_patch("a", "x", "y");
        assert_eq!(
            patch,
            "--- a\n+++ a\n@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+y\n\\ No newline at end of file\n"
        );
    }
}
