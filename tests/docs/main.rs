//! The repository's own text keeps pointing at things a contributor can open:
//!
//! - no comment or README cites a specification document that is not in the repository (the
//!   design lives in `docs/`, see docs/architecture.md#where-to-look);
//! - every pointer into `docs/` — `docs/FILE.md#anchor` in source and READMEs, `docs/FILE.md,
//!   "Heading"`, and the relative links between the docs themselves — names a file that exists
//!   and a heading it has;
//! - the docs name files and functions that exist: every repository path they quote exists
//!   (`crates/…`, `backends/…`, with `{a,b}` and `*` expanded; a bare `name.rs` or `dir/name.rs`
//!   must end some path), and each function in the "Where to look" table of the architecture
//!   document is defined in the file that row names. Moving or renaming one without updating
//!   the docs fails here.
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

/// The backticked spans of a text: `a`, `b` for "x `a` y `b`".
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The top-level directories a quoted repository path starts with.
const TREE_ROOTS: [&str; 7] = [
    "crates/",
    "backends/",
    "tests/",
    "bench/",
    "policies/",
    "scripts/",
    "examples/",
];

/// `a/{b,c}/d` → `a/b/d`, `a/c/d` (one brace group, as the docs write them).
fn expand_braces(path: &str) -> Vec<String> {
    match (path.find('{'), path.find('}')) {
        (Some(open), Some(close)) if open < close => path[open + 1..close]
            .split(',')
            .map(|choice| format!("{}{choice}{}", &path[..open], &path[close + 1..]))
            .collect(),
        _ => vec![path.to_owned()],
    }
}

/// The paths below `root` that `pattern` names, `*` standing for one whole component.
fn expand_glob(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let mut current = vec![PathBuf::new()];
    for component in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for base in current {
            if component == "*" {
                let Ok(entries) = fs::read_dir(root.join(&base)) else {
                    continue;
                };
                for entry in entries.flatten() {
                    next.push(base.join(entry.file_name()));
                }
            } else {
                next.push(base.join(component));
            }
        }
        current = next;
    }
    current
        .into_iter()
        .filter(|path| root.join(path).exists())
        .collect()
}

/// The repository files a quoted path names (empty when none exists).
fn named_files(root: &Path, quoted: &str) -> Vec<PathBuf> {
    expand_braces(quoted)
        .iter()
        .flat_map(|path| expand_glob(root, path))
        .collect()
}

/// Whether `span` is a repository path the docs quote.
fn is_tree_path(span: &str) -> bool {
    TREE_ROOTS.iter().any(|root| span.starts_with(root)) && !span.contains(' ')
}

/// Whether `span` is a short Rust file name such as `files.rs` or `linux/mod.rs`.
fn is_short_rust_path(span: &str) -> bool {
    span.ends_with(".rs")
        && !is_tree_path(span)
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '-'))
}

/// The rows of the table under the heading `heading`: cells of each line starting with `|`,
/// header and separator rows dropped.
fn table_rows<'a>(markdown: &'a str, heading: &str) -> Vec<Vec<&'a str>> {
    let mut lines = markdown
        .lines()
        .skip_while(|line| line.trim_start_matches('#').trim() != heading);
    lines.next();
    lines
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| line.trim_matches('|').split('|').map(str::trim).collect())
        .collect()
}

/// Whether a cell is nothing but backticked names separated by commas (`a`, `B::c`).
fn only_names(cell: &str) -> bool {
    cell.split(',').all(|part| {
        let part = part.trim();
        part.len() > 2 && part.starts_with('`') && part.ends_with('`') && !part[1..].contains(' ')
    })
}

#[test]
fn the_docs_name_files_that_exist() {
    let root = repo_root();
    let sources = source_files(&root);
    let mut problems = Vec::new();
    let mut checked = 0;
    for (path, text) in sources.iter().filter(|(path, _)| path.starts_with("docs")) {
        for span in code_spans(text) {
            if is_tree_path(span) {
                checked += 1;
                if named_files(&root, span).is_empty() {
                    problems.push(format!("{}: `{span}` does not exist", path.display()));
                }
            } else if is_short_rust_path(span) {
                checked += 1;
                let suffix = format!("/{span}");
                if !sources
                    .iter()
                    .any(|(p, _)| p.to_string_lossy().ends_with(&suffix))
                {
                    problems.push(format!("{}: no file ends with `{span}`", path.display()));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the docs name missing files:\n{}",
        problems.join("\n")
    );
    assert!(checked > 50, "only {checked} file names found in docs/");
}

#[test]
fn where_to_look_names_functions_defined_in_their_files() {
    let root = repo_root();
    let architecture =
        fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md");
    let rows = table_rows(&architecture, "Where to look");
    assert!(
        rows.len() > 10,
        "the \"Where to look\" table has only {} rows",
        rows.len()
    );
    let mut problems = Vec::new();
    for row in &rows {
        let [_, file, functions] = row.as_slice() else {
            panic!(
                "a \"Where to look\" row has {} cells, not 3: {row:?}",
                row.len()
            );
        };
        let file = file.trim_matches('`');
        let texts: Vec<String> = named_files(&root, file)
            .iter()
            .filter_map(|path| fs::read_to_string(root.join(path)).ok())
            .collect();
        if texts.is_empty() {
            problems.push(format!("`{file}` does not exist"));
            continue;
        }
        if !only_names(functions) {
            continue;
        }
        for name in code_spans(functions) {
            let function = name.rsplit("::").next().unwrap_or(name);
            let definition = format!("fn {function}");
            let defined = texts.iter().any(|text| {
                text.match_indices(&definition).any(|(at, _)| {
                    text[at + definition.len()..]
                        .chars()
                        .next()
                        .is_some_and(|c| c == '(' || c == '<')
                })
            });
            if !defined {
                problems.push(format!("`{name}` is not defined in `{file}`"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/architecture.md, \"Where to look\", is out of date:\n{}",
        problems.join("\n")
    );
}

#[test]
fn quoted_paths_expand() {
    assert_eq!(
        expand_braces("crates/tools/src/{read,ls}.rs"),
        vec!["crates/tools/src/read.rs", "crates/tools/src/ls.rs"]
    );
    let root = repo_root();
    let mut found = named_files(&root, "backends/*/src/{files,bash}.rs");
    found.sort();
    assert!(
        found.contains(&PathBuf::from("backends/local/src/files.rs")),
        "{found:?}"
    );
    assert!(named_files(&root, "crates/nowhere/src/lib.rs").is_empty());
    assert_eq!(
        table_rows(
            "## Where to look\n\ntext\n\n| a | b |\n|---|---|\n| 1 | `x` |\n\n| z |",
            "Where to look"
        ),
        vec![vec!["1", "`x`"]]
    );
    assert!(only_names("`a`, `B::c`") && !only_names("the `A` impls"));
}
