//! The repository's own text keeps pointing at things a contributor can open:
//!
//! - no comment or README cites a specification document that is not in the repository (the
//!   design lives in `docs/`, see docs/architecture.md#where-to-look);
//! - every pointer into `docs/` — `docs/FILE.md#anchor` in source and READMEs, `docs/FILE.md,
//!   "Heading"`, and the relative links between the docs themselves — names a file that exists
//!   and a heading it has.
//!
//! Pure file reads over the source tree (`.rs`, `.md`, `.toml`, `.sh` and `.ci/run`); `target`,
//! `vendor` (third-party text) and hidden directories other than `.ci` are skipped.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The workspace root (this crate is `tests/` directly below it).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_path_buf()
}

/// Directories never scanned: build output and vendored third-party text.
const SKIPPED_DIRS: [&str; 3] = ["target", "vendor", "node_modules"];

/// Every scanned file below `root`, sorted, as (path relative to `root`, text).
fn source_files(root: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("directory entry");
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                let hidden = name.starts_with('.') && name != ".ci";
                if !hidden && !SKIPPED_DIRS.contains(&name.as_str()) && !name.starts_with("target")
                {
                    pending.push(path);
                }
            } else if kind.is_file() && is_scanned(&path, root) {
                // Not UTF-8 (a binary fixture): nothing a reader follows.
                if let Ok(text) = fs::read_to_string(&path) {
                    let relative = path.strip_prefix(root).expect("below root").to_path_buf();
                    files.push((relative, text));
                }
            }
        }
    }
    files.sort();
    files
}

fn is_scanned(path: &Path, root: &Path) -> bool {
    let by_extension = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| ["rs", "md", "toml", "sh"].contains(&e));
    by_extension || path == root.join(".ci").join("run")
}

/// The markers of a citation of a document outside the repository, built at run time so
/// this file does not contain them.
fn citation_markers() -> Vec<String> {
    ["SPEC", "CONTRACT", "pi", "reference"]
        .iter()
        .map(|document| format!("{document} \u{a7}"))
        .collect()
}

/// 1-based numbers of the lines of `text` that cite an outside document.
fn citation_lines(text: &str, markers: &[String]) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            markers
                .iter()
                .any(|marker| contains_word_start(line, marker))
        })
        .map(|(index, _)| index + 1)
        .collect()
}

/// `line` contains `marker` at the start of a word (a marker inside a longer word does not count).
fn contains_word_start(line: &str, marker: &str) -> bool {
    line.match_indices(marker).any(|(at, _)| {
        line[..at]
            .chars()
            .next_back()
            .is_none_or(|before| !before.is_alphanumeric())
    })
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` removed,
/// spaces turned into `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The headings of a Markdown text (outside code fences), as written.
fn headings(markdown: &str) -> Vec<String> {
    let mut fenced = false;
    let mut found = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            found.push(line[hashes..].trim().to_owned());
        }
    }
    found
}

/// The anchors a Markdown text defines: each heading's slug, repeated ones numbered `-1`,
/// `-2`, … as GitHub does.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for heading in headings(markdown) {
        let base = slug(&heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// One pointer into the docs: which file, and the anchor or heading it names, if any.
#[derive(Debug, PartialEq, Eq)]
struct Pointer {
    line: usize,
    file: String,
    target: Target,
}

#[derive(Debug, PartialEq, Eq)]
enum Target {
    File,
    Anchor(String),
    Heading(String),
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'
}

fn is_anchor_char(c: char) -> bool {
    c.is_alphanumeric() || c == '-' || c == '_'
}

/// The `NAME.md` right at the start of `rest`, if any.
fn md_name(rest: &str) -> Option<&str> {
    let name_len = rest.find(|c: char| !is_name_char(c)).unwrap_or(rest.len());
    (name_len > 0 && rest[name_len..].starts_with(".md")).then(|| &rest[..name_len + 3])
}

/// What follows a file name: `#anchor`, `, "Heading"`, or nothing.
fn target_after(rest: &str) -> Target {
    if let Some(anchor) = rest.strip_prefix('#') {
        let len = anchor
            .find(|c: char| !is_anchor_char(c))
            .unwrap_or(anchor.len());
        return Target::Anchor(anchor[..len].to_owned());
    }
    if let Some(quoted) = rest.strip_prefix(", \"")
        && let Some(end) = quoted.find('"')
    {
        return Target::Heading(quoted[..end].to_owned());
    }
    Target::File
}

/// Pointers written as `docs/NAME.md…` anywhere in `text`.
fn docs_pointers(text: &str) -> Vec<Pointer> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices("docs/") {
            let rest = &line[at + "docs/".len()..];
            if let Some(file) = md_name(rest) {
                found.push(Pointer {
                    line: index + 1,
                    file: file.to_owned(),
                    target: target_after(&rest[file.len()..]),
                });
            }
        }
    }
    found
}

/// Relative Markdown links between the docs: `](NAME.md…)` and `](#anchor)`; `this` is the
/// file the text is in.
fn relative_links(text: &str, this: &str) -> Vec<Pointer> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices("](") {
            let rest = &line[at + 2..];
            let (file, after) = match md_name(rest) {
                Some(file) => (file, &rest[file.len()..]),
                None if rest.starts_with('#') => (this, rest),
                None => continue,
            };
            found.push(Pointer {
                line: index + 1,
                file: file.to_owned(),
                target: target_after(after),
            });
        }
    }
    found
}

/// Why `pointer` does not resolve in `docs`, if it does not.
fn broken(docs: &Path, pointer: &Pointer) -> Option<String> {
    let Ok(text) = fs::read_to_string(docs.join(&pointer.file)) else {
        return Some(format!("docs/{} does not exist", pointer.file));
    };
    match &pointer.target {
        Target::File => None,
        Target::Anchor(anchor) => (!anchors(&text).contains(anchor)).then(|| {
            format!(
                "docs/{} has no heading with the anchor #{anchor}",
                pointer.file
            )
        }),
        Target::Heading(heading) => (!headings(&text).contains(heading))
            .then(|| format!("docs/{} has no heading \"{heading}\"", pointer.file)),
    }
}

#[test]
fn no_comment_cites_a_document_outside_the_repository() {
    let root = repo_root();
    let markers = citation_markers();
    let mut found = Vec::new();
    for (path, text) in source_files(&root) {
        for line in citation_lines(&text, &markers) {
            found.push(format!("{}:{line}", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "these lines cite a document that is not in the repository; describe the behaviour in \
         docs/ and point there instead (e.g. docs/semantics.md#bash):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_pointer_into_docs_names_an_existing_heading() {
    let root = repo_root();
    let docs = root.join("docs");
    let mut checked = 0;
    let mut problems = Vec::new();
    for (path, text) in source_files(&root) {
        let mut pointers = docs_pointers(&text);
        if path.parent() == Some(Path::new("docs")) {
            let this = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("docs file name");
            pointers.extend(relative_links(&text, this));
        }
        for pointer in pointers {
            checked += 1;
            if let Some(problem) = broken(&docs, &pointer) {
                problems.push(format!("{}:{}: {problem}", path.display(), pointer.line));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken pointers into docs/:\n{}",
        problems.join("\n")
    );
    // The source does point into the docs; a scan that finds nothing is a broken scan.
    assert!(checked > 50, "only {checked} pointers into docs/ found");
}

#[test]
fn citations_are_found_at_word_starts_only() {
    let markers = citation_markers();
    let text = format!(
        "fine\n// see {}2\n// the api \u{a7} is not one\n// ({}4.3)\n",
        markers[0], markers[2]
    );
    assert_eq!(citation_lines(&text, &markers), vec![2, 4]);
}

#[test]
fn pointers_and_their_targets_are_parsed() {
    let text = "//! (docs/semantics.md#mutation-queue) and docs/contract.md, \"Exit codes\"\n\
                see docs/architecture.md. and docs/ alone and docs/x.txt\n";
    assert_eq!(
        docs_pointers(text),
        vec![
            Pointer {
                line: 1,
                file: "semantics.md".into(),
                target: Target::Anchor("mutation-queue".into())
            },
            Pointer {
                line: 1,
                file: "contract.md".into(),
                target: Target::Heading("Exit codes".into())
            },
            Pointer {
                line: 2,
                file: "architecture.md".into(),
                target: Target::File
            },
        ]
    );
    let links = "[a](semantics.md#paths), [b](#crates), [c](../policies/README.md)";
    assert_eq!(
        relative_links(links, "architecture.md"),
        vec![
            Pointer {
                line: 1,
                file: "semantics.md".into(),
                target: Target::Anchor("paths".into())
            },
            Pointer {
                line: 1,
                file: "architecture.md".into(),
                target: Target::Anchor("crates".into())
            },
        ]
    );
}

#[test]
fn anchors_follow_github() {
    let markdown = "# Title\n## One tool call, end to end\n```\n# not a heading\n```\n\
                    ## Docker and SSH: the remote worker\n## `read`\n## Read\n## Read\n";
    assert_eq!(
        anchors(markdown),
        BTreeSet::from(
            [
                "title",
                "one-tool-call-end-to-end",
                "docker-and-ssh-the-remote-worker",
                "read",
                "read-1",
                "read-2"
            ]
            .map(String::from)
        )
    );
}

#[test]
fn a_missing_heading_is_reported() {
    let docs = repo_root().join("docs");
    let pointer = Pointer {
        line: 1,
        file: "semantics.md".into(),
        target: Target::Anchor("no-such-heading".into()),
    };
    assert_eq!(
        broken(&docs, &pointer).as_deref(),
        Some("docs/semantics.md has no heading with the anchor #no-such-heading")
    );
    let missing = Pointer {
        line: 1,
        file: "nowhere.md".into(),
        target: Target::File,
    };
    // Built, so that this file holds no pointer to a missing file itself.
    let expected = format!("docs/{} does not exist", missing.file);
    assert_eq!(broken(&docs, &missing), Some(expected));
}
