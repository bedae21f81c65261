//! The worker: one POSIX shell process per remote exec that serves requests (run a command,
//! a file operation) one after another, so a call costs a line written to a process that is
//! already running instead of a new exec (docker exec ≈ 50 ms, an SSH channel plus the login
//! shell ≈ 3–5 ms).
//!
//! A transport starts [`worker_argv`] with stdin, stdout and stderr attached. The worker prints
//! the record `ready`, then reads [`WorkerRequest`]s as lines ([`WorkerRequest::line`]). Each
//! request's output comes on stdout, its records on stderr; the worker ends a request with an
//! end marker on stdout ([`EndMarker`]) and the record `done ID` on stderr, and only then reads
//! the next line. A client may hand the worker to the next call once it has seen both and the
//! request left nothing behind ([`crate::exec::DriveOutcome::reusable`]); anything else (an
//! error half-way, a killed tree that would not die, a dropped connection) closes the worker,
//! whose EOF on stdin kills what is left of a running command.
//!
//! Requests are plain, serialisable values: a resident agent can later take the same requests
//! over a wire. The same script also runs one request from its arguments and exits
//! ([`WorkerRequest::argv`]), for one-shot execs.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::exec::ExecJob;
use crate::files::FileOp;
use crate::{RemoteError, checked_arg};

/// The worker script (POSIX sh): process helpers, the exec and file requests, the request loop.
pub const WORKER_SCRIPT: &str = concat!(
    include_str!("sh/proc.sh"),
    include_str!("sh/wrapper.sh"),
    include_str!("sh/files.sh"),
    include_str!("sh/worker.sh")
);

/// The process helpers of the worker (`quick`, `scan`, `killtree`, …) alone, for tools and
/// tests that exercise them directly.
pub const PROCESS_HELPERS: &str = include_str!("sh/proc.sh");

/// Starts the worker with bash when the host has it (job control gives each command its own
/// process group without an extra exec, and `EPOCHREALTIME` a precise clock), else with `sh`.
const BOOT_SCRIPT: &str =
    r#"if command -v bash >/dev/null 2>&1; then exec bash -c "$@"; fi; exec sh -c "$@""#;

/// `$0` of the worker.
const WORKER_NAME: &str = "cordon-worker";

/// What a request line starts with.
const REQUEST_PREFIX: &str = "cordon-req ";

/// The argv starting a worker that reads its requests from stdin.
pub fn worker_argv() -> Vec<String> {
    vec![
        "sh".to_owned(),
        "-c".to_owned(),
        BOOT_SCRIPT.to_owned(),
        "cordon-boot".to_owned(),
        WORKER_SCRIPT.to_owned(),
        WORKER_NAME.to_owned(),
    ]
}

/// One request for a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "request")]
pub enum WorkerRequest {
    /// Run a command (see [`crate::exec`]).
    Exec(ExecJob),
    /// A file operation confined to `roots` (see [`crate::files`]).
    Fs {
        /// Canonical roots the operation may touch.
        roots: Vec<PathBuf>,
        /// The operation.
        op: FileOp,
    },
}

impl WorkerRequest {
    /// The words after the request id: the operation and its arguments.
    pub fn words(&self) -> Result<Vec<String>, RemoteError> {
        match self {
            WorkerRequest::Exec(job) => {
                let mut words = vec!["exec".to_owned()];
                words.extend(job.words()?);
                Ok(words)
            }
            WorkerRequest::Fs { roots, op } => {
                let mut words = vec!["fs".to_owned()];
                words.extend(crate::files::op_words(roots, op)?);
                Ok(words)
            }
        }
    }

    /// The line a waiting worker reads: `cordon-req`, then `id` and [`Self::words`], each
    /// single-quoted for the worker's `eval`, newlines written as `'"$NL"'` so the request
    /// stays one line.
    pub fn line(&self, id: &str) -> Result<Vec<u8>, RemoteError> {
        let mut line = String::from(REQUEST_PREFIX);
        line.push_str(&quote_word(&checked_arg("request id", id)?));
        for word in self.words()? {
            line.push(' ');
            line.push_str(&quote_word(&word));
        }
        line.push('\n');
        Ok(line.into_bytes())
    }

    /// The argv running this request alone (the worker exits afterwards; no end marker).
    pub fn argv(&self) -> Result<Vec<String>, RemoteError> {
        let mut argv = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            WORKER_SCRIPT.to_owned(),
            WORKER_NAME.to_owned(),
        ];
        argv.extend(self.words()?);
        Ok(argv)
    }
}

/// A command ready for a worker: the tag marking its processes, the request id (it ends the
/// request's output) and the request line.
#[derive(Clone, Debug)]
pub struct ExecLine {
    /// The tag of the command's processes (for a kill sweep).
    pub tag: String,
    /// The request id.
    pub id: String,
    /// What to write to the worker's stdin.
    pub line: Vec<u8>,
}

impl ExecLine {
    /// `command` in `cwd` with `env`, killed with [`crate::exec::KILL_GRACE`] between SIGTERM
    /// and SIGKILL. Fails on arguments a shell word cannot carry (NUL bytes, bad names).
    pub fn new(
        command: String,
        cwd: PathBuf,
        env: Vec<(String, String)>,
    ) -> Result<ExecLine, RemoteError> {
        let tag = crate::exec::new_tag();
        let id = new_request_id();
        let line = WorkerRequest::Exec(ExecJob {
            tag: tag.clone(),
            cwd,
            command,
            env,
            kill_grace_ms: crate::exec::KILL_GRACE.as_millis() as u64,
        })
        .line(&id)?;
        Ok(ExecLine { tag, id, line })
    }
}

/// A word for the worker's `eval "set -- …"`: single quotes, `'` as `'\''`, newline as
/// `'"$NL"'` (the worker sets `NL` to a newline).
fn quote_word(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    out.push('\'');
    for ch in word.chars() {
        match ch {
            '\'' => out.push_str("'\\''"),
            '\n' => out.push_str("'\"$NL\"'"),
            other => out.push(other),
        }
    }
    out.push('\'');
    out
}

/// A fresh request id (also what makes the end marker unguessable for the command).
pub fn new_request_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// Finds the end marker of one request in the worker's stdout and passes on only the bytes
/// before it. Bytes that could be the start of the marker are held back until the next chunk
/// says whether they are.
#[derive(Clone, Debug)]
pub struct EndMarker {
    needle: Vec<u8>,
    held: Vec<u8>,
    found: bool,
    trailing: bool,
}

/// What [`EndMarker::feed`] found in a chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Output of the request.
    pub data: Vec<u8>,
    /// The marker was complete in this chunk.
    pub ended: bool,
}

impl EndMarker {
    /// The marker of request `id`.
    pub fn new(id: &str) -> Self {
        let mut needle = b"\x00\x1bcordon-end-".to_vec();
        needle.extend_from_slice(id.as_bytes());
        needle.push(0);
        EndMarker {
            needle,
            held: Vec::new(),
            found: false,
            trailing: false,
        }
    }

    /// Feed a chunk of the worker's stdout.
    pub fn feed(&mut self, chunk: &[u8]) -> Split {
        if self.found {
            if !chunk.is_empty() {
                self.trailing = true;
            }
            return Split::default();
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(chunk);
        if let Some(at) = find(&buf, &self.needle) {
            self.found = true;
            if at + self.needle.len() < buf.len() {
                self.trailing = true;
            }
            buf.truncate(at);
            return Split {
                data: buf,
                ended: true,
            };
        }
        // Hold back the longest tail that is a prefix of the marker.
        let max = (self.needle.len() - 1).min(buf.len());
        let keep = (1..=max)
            .rev()
            .find(|&n| buf[buf.len() - n..] == self.needle[..n])
            .unwrap_or(0);
        self.held = buf.split_off(buf.len() - keep);
        Split {
            data: buf,
            ended: false,
        }
    }

    /// Whether the marker was seen.
    pub fn found(&self) -> bool {
        self.found
    }

    /// Whether bytes came after the marker (something else writes to the worker's stdout).
    pub fn trailing(&self) -> bool {
        self.trailing
    }

    /// Bytes held back when the stream ends without the marker: they were output after all.
    pub fn take_held(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_line_carries_its_tag_and_id_and_refuses_nul() {
        let exec = ExecLine::new(
            "echo hi".to_owned(),
            PathBuf::from("/w"),
            vec![("A".to_owned(), "b".to_owned())],
        )
        .unwrap();
        let text = String::from_utf8(exec.line.clone()).unwrap();
        assert!(
            text.starts_with(REQUEST_PREFIX) && text.ends_with('\n'),
            "{text}"
        );
        assert!(
            text.contains(&exec.tag) && text.contains(&exec.id),
            "{text}"
        );
        assert_ne!(
            ExecLine::new("x".to_owned(), PathBuf::from("/w"), vec![])
                .unwrap()
                .id,
            exec.id
        );
        assert!(matches!(
            ExecLine::new("a\0b".to_owned(), PathBuf::from("/w"), vec![]),
            Err(RemoteError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn request_lines_are_one_line_of_quoted_words() {
        let request = WorkerRequest::Fs {
            roots: vec![PathBuf::from("/w")],
            op: FileOp::Canon(PathBuf::from("/w/it's\na")),
        };
        assert_eq!(
            String::from_utf8(request.line("r1").expect("valid")).expect("utf-8"),
            "cordon-req 'r1' 'fs' 'canon' '1' '/w' '/w/it'\\''s'\"$NL\"'a'\n"
        );
    }

    #[test]
    fn request_lines_round_trip_through_eval() {
        let job = ExecJob {
            tag: "t".to_owned(),
            cwd: PathBuf::from("/"),
            command: "printf '%s' \"$x\"\necho 'a\\b' $((1+1)) `id`\n\n".to_owned(),
            env: vec![("A".to_owned(), "x y".to_owned())],
            kill_grace_ms: 1000,
        };
        let request = WorkerRequest::Exec(job);
        let line = String::from_utf8(request.line("id").expect("valid")).expect("utf-8");
        let words = line
            .strip_prefix(REQUEST_PREFIX)
            .expect("prefix")
            .trim_end_matches('\n');
        for shell in ["dash", "bash"] {
            let script = "NL='\n'\nIFS= read -r l\neval \"set -- $l\"\nfor w; do printf '%s\\0' \"$w\"; done";
            let mut child = std::process::Command::new(shell)
                .args(["-c", script])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("shell");
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin
                .write_all(format!("{words}\n").as_bytes())
                .expect("write");
            drop(stdin);
            let out = child.wait_with_output().expect("output");
            let got: Vec<String> = out
                .stdout
                .split(|b| *b == 0)
                .filter(|w| !w.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            let mut want = vec!["id".to_owned()];
            want.extend(request.words().expect("words"));
            assert_eq!(got, want, "{shell}");
        }
    }

    #[test]
    fn requests_serialise_as_plain_data() {
        let request = WorkerRequest::Fs {
            roots: vec![PathBuf::from("/w")],
            op: FileOp::Stat(PathBuf::from("/w/a")),
        };
        let json = serde_json::to_value(&request).expect("serialise");
        assert_eq!(
            json,
            serde_json::json!({"request": "fs", "roots": ["/w"], "op": {"op": "stat", "args": "/w/a"}})
        );
        let back: WorkerRequest = serde_json::from_value(json).expect("deserialise");
        assert_eq!(back, request);
    }

    #[test]
    fn end_marker_split_across_chunks() {
        let mut marker = EndMarker::new("ab");
        let stream = b"out\x00put\x00\x1bcordon-end-ab\x00";
        let mut data = Vec::new();
        let mut ended = false;
        for chunk in stream.chunks(3) {
            let split = marker.feed(chunk);
            assert!(!ended, "nothing after the marker");
            data.extend(split.data);
            ended = split.ended;
        }
        assert!(ended && marker.found() && !marker.trailing());
        assert_eq!(data, b"out\x00put");
    }

    #[test]
    fn end_marker_passes_lookalikes_and_flags_trailing_bytes() {
        let mut marker = EndMarker::new("ab");
        let split = marker.feed(b"x\x00\x1bcordon-end-zz\x00y\x00\x1bcor");
        assert_eq!(split.data, b"x\x00\x1bcordon-end-zz\x00y");
        assert!(!split.ended);
        let split = marker.feed(b"don-end-ab\x00late");
        assert_eq!(
            split,
            Split {
                data: Vec::new(),
                ended: true
            }
        );
        assert!(marker.trailing());
        let mut cut = EndMarker::new("ab");
        assert_eq!(cut.feed(b"tail\x00\x1bcordon").data, b"tail");
        assert_eq!(cut.take_held(), b"\x00\x1bcordon");
    }
}
