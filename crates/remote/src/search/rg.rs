//! ripgrep as the remote search engine: the argv ([`rg_argv`]) and an incremental parser of its
//! `--json` output ([`RgCollector`]) that applies the glob filter and the match limit and yields
//! a [`GrepOutput`] identical to the local backend's.

use std::path::{Path, PathBuf};

use base64::Engine;
use cordon_ops::{GrepFile, GrepLine, GrepOutput, GrepRequest};
use serde::Deserialize;

use super::{GlobFilter, strip_terminator};

/// The argv searching `request` with `rg`: ripgrep's ignore rules with `--no-require-git` (the
/// same inside and outside repositories), hidden files, never `.git`, sorted by path. The glob
/// is applied by [`RgCollector`], not by rg (its glob dialect differs from `globset`'s).
pub fn rg_argv(request: &GrepRequest) -> Vec<String> {
    let GrepRequest {
        pattern,
        path,
        glob: _,
        ignore_case,
        literal,
        context,
        max_matches: _,
    } = request;
    let mut argv: Vec<String> = [
        "rg",
        "--json",
        "--no-config",
        "--hidden",
        "--no-require-git",
        "--sort",
        "path",
        "--glob",
        "!.git",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if *ignore_case {
        argv.push("--ignore-case".to_owned());
    } else {
        argv.push("--case-sensitive".to_owned());
    }
    if *literal {
        argv.push("--fixed-strings".to_owned());
    }
    if *context > 0 {
        argv.push("--context".to_owned());
        argv.push(context.to_string());
    }
    argv.push("--regexp".to_owned());
    argv.push(pattern.clone());
    argv.push("--".to_owned());
    argv.push(path.to_string_lossy().into_owned());
    argv
}

#[derive(Deserialize)]
struct RgData {
    text: Option<String>,
    bytes: Option<String>,
}

impl RgData {
    fn to_bytes(&self) -> Vec<u8> {
        match (&self.text, &self.bytes) {
            (Some(text), _) => text.clone().into_bytes(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap_or_default(),
            (None, None) => Vec::new(),
        }
    }

    fn to_path(&self) -> PathBuf {
        use std::os::unix::ffi::OsStringExt;
        PathBuf::from(std::ffi::OsString::from_vec(self.to_bytes()))
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "lowercase")]
enum RgMessage {
    Begin {
        path: RgData,
    },
    Match {
        lines: RgData,
        line_number: Option<u64>,
    },
    Context {
        lines: RgData,
        line_number: Option<u64>,
    },
    End {},
    Summary {},
}

/// Whether to keep reading rg's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Keep going.
    Continue,
    /// The limit is reached: stop rg.
    Stop,
}

/// Collects `rg --json` lines into a [`GrepOutput`].
#[derive(Debug)]
pub struct RgCollector {
    base: PathBuf,
    glob: Option<GlobFilter>,
    max_matches: usize,
    matches: usize,
    current: Option<GrepFile>,
    skipping: bool,
    output: GrepOutput,
    done: bool,
}

impl RgCollector {
    /// A collector for a search under `base` with an optional glob filter.
    pub fn new(base: &Path, glob: Option<GlobFilter>, max_matches: usize) -> Self {
        RgCollector {
            base: base.to_path_buf(),
            glob,
            max_matches,
            matches: 0,
            current: None,
            skipping: false,
            output: GrepOutput::default(),
            done: max_matches == 0,
        }
    }

    fn flush(&mut self) {
        if let Some(file) = self.current.take()
            && file.lines.iter().any(|l| l.is_match)
        {
            self.output.files.push(file);
        }
    }

    /// Feed one line of rg's stdout. Unknown or malformed lines are ignored (rg only prints
    /// JSON in this mode).
    pub fn push_line(&mut self, line: &[u8]) -> Flow {
        if self.done {
            return Flow::Stop;
        }
        let Ok(message) = serde_json::from_slice::<RgMessage>(line) else {
            return Flow::Continue;
        };
        match message {
            RgMessage::Begin { path } => {
                self.flush();
                let path = path.to_path();
                self.skipping = self
                    .glob
                    .as_ref()
                    .is_some_and(|g| !g.matches(&self.base, &path));
                self.current = Some(GrepFile {
                    path,
                    lines: Vec::new(),
                });
            }
            RgMessage::Match { lines, line_number } | RgMessage::Context { lines, line_number }
                if self.skipping =>
            {
                let _ = (lines, line_number);
            }
            RgMessage::Match { lines, line_number } => {
                if let Some(file) = self.current.as_mut() {
                    push_line(file, line_number, &lines, true);
                    self.matches += 1;
                    if self.matches >= self.max_matches {
                        self.done = true;
                        self.flush();
                        return Flow::Stop;
                    }
                }
            }
            RgMessage::Context { lines, line_number } => {
                if let Some(file) = self.current.as_mut() {
                    push_line(file, line_number, &lines, false);
                }
            }
            RgMessage::End {} => self.flush(),
            RgMessage::Summary {} => {}
        }
        Flow::Continue
    }

    /// Record one of rg's stderr lines (`rg: PATH: REASON`) as an error note.
    pub fn push_error(&mut self, line: &str) {
        let line = line.trim_end();
        if line.is_empty() {
            return;
        }
        let note = normalize_note(line.strip_prefix("rg: ").unwrap_or(line));
        if !self.output.errors.contains(&note) {
            self.output.errors.push(note);
        }
    }

    /// Whether the limit was reached.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The result, files in path order.
    pub fn finish(mut self) -> GrepOutput {
        self.flush();
        self.output.files.sort_by(|a, b| a.path.cmp(&b.path));
        self.output
    }
}

/// `PATH: IO error for operation on PATH: REASON` (walkdir's wording inside rg) becomes
/// `PATH: REASON`, the shape every backend reports.
fn normalize_note(note: &str) -> String {
    if let Some((path, rest)) = note.split_once(": IO error for operation on ")
        && let Some(reason) = rest.strip_prefix(path).and_then(|r| r.strip_prefix(": "))
    {
        return format!("{path}: {reason}");
    }
    note.to_owned()
}

fn push_line(file: &mut GrepFile, number: Option<u64>, lines: &RgData, is_match: bool) {
    let bytes = lines.to_bytes();
    let number = number.unwrap_or(0);
    if file.lines.last().is_some_and(|l| l.number >= number) {
        // Defensive: rg never repeats a line, but merged windows must stay unique.
        return;
    }
    file.lines.push(GrepLine {
        number,
        text: String::from_utf8_lossy(strip_terminator(&bytes)).into_owned(),
        is_match,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> GrepRequest {
        GrepRequest {
            pattern: "needle".to_owned(),
            path: PathBuf::from("/w"),
            glob: Some("*.rs".to_owned()),
            ignore_case: true,
            literal: true,
            context: 2,
            max_matches: 5,
        }
    }

    #[test]
    fn argv_is_complete_and_flag_safe() {
        let mut r = req();
        r.pattern = "--pre=x".to_owned();
        assert_eq!(
            rg_argv(&r),
            [
                "rg",
                "--json",
                "--no-config",
                "--hidden",
                "--no-require-git",
                "--sort",
                "path",
                "--glob",
                "!.git",
                "--ignore-case",
                "--fixed-strings",
                "--context",
                "2",
                "--regexp",
                "--pre=x",
                "--",
                "/w",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
        );
    }

    const BEGIN_A: &str = r#"{"type":"begin","data":{"path":{"text":"/w/a.rs"}}}"#;
    const CTX_A1: &str = r#"{"type":"context","data":{"path":{"text":"/w/a.rs"},"lines":{"text":"before\n"},"line_number":1,"absolute_offset":0,"submatches":[]}}"#;
    const MATCH_A2: &str = r#"{"type":"match","data":{"path":{"text":"/w/a.rs"},"lines":{"text":"needle\r\n"},"line_number":2,"absolute_offset":7,"submatches":[{"match":{"text":"needle"},"start":0,"end":6}]}}"#;
    const MATCH_A3: &str = r#"{"type":"match","data":{"path":{"text":"/w/a.rs"},"lines":{"bytes":"bmVlZGxl/w=="},"line_number":3,"absolute_offset":15,"submatches":[]}}"#;
    const END_A: &str =
        r#"{"type":"end","data":{"path":{"text":"/w/a.rs"},"binary_offset":null,"stats":{}}}"#;
    const BEGIN_B: &str = r#"{"type":"begin","data":{"path":{"text":"/w/b.txt"}}}"#;
    const MATCH_B1: &str = r#"{"type":"match","data":{"path":{"text":"/w/b.txt"},"lines":{"text":"needle\n"},"line_number":1,"absolute_offset":0,"submatches":[]}}"#;
    const END_B: &str =
        r#"{"type":"end","data":{"path":{"text":"/w/b.txt"},"binary_offset":null,"stats":{}}}"#;

    #[test]
    fn collects_matches_context_and_applies_the_glob() {
        let glob = GlobFilter::new("*.rs").expect("valid");
        let mut collector = RgCollector::new(Path::new("/w"), Some(glob), 10);
        for line in [
            BEGIN_B, MATCH_B1, END_B, BEGIN_A, CTX_A1, MATCH_A2, MATCH_A3, END_A,
        ] {
            assert_eq!(collector.push_line(line.as_bytes()), Flow::Continue);
        }
        collector.push_error("rg: /w/secret: Permission denied (os error 13)\n");
        collector.push_error(
            "rg: /w/dir: IO error for operation on /w/dir: Permission denied (os error 13)",
        );
        assert_eq!(
            collector.finish(),
            GrepOutput {
                files: vec![GrepFile {
                    path: PathBuf::from("/w/a.rs"),
                    lines: vec![
                        GrepLine {
                            number: 1,
                            text: "before".into(),
                            is_match: false
                        },
                        GrepLine {
                            number: 2,
                            text: "needle".into(),
                            is_match: true
                        },
                        GrepLine {
                            number: 3,
                            text: "needle\u{fffd}".into(),
                            is_match: true
                        },
                    ],
                }],
                errors: vec![
                    "/w/secret: Permission denied (os error 13)".to_owned(),
                    "/w/dir: Permission denied (os error 13)".to_owned(),
                ],
            }
        );
    }

    #[test]
    fn stops_at_the_limit() {
        let mut collector = RgCollector::new(Path::new("/w"), None, 2);
        let flows: Vec<Flow> = [
            BEGIN_A, CTX_A1, MATCH_A2, MATCH_A3, END_A, BEGIN_B, MATCH_B1,
        ]
        .iter()
        .map(|l| collector.push_line(l.as_bytes()))
        .collect();
        assert_eq!(
            flows,
            vec![
                Flow::Continue,
                Flow::Continue,
                Flow::Continue,
                Flow::Stop,
                Flow::Stop,
                Flow::Stop,
                Flow::Stop
            ]
        );
        let out = collector.finish();
        assert_eq!(out.files.len(), 1);
        assert_eq!(out.files[0].lines.len(), 3);
    }
}
