//! The control records the helper scripts print: NUL-terminated fields, the first being a tag
//! whose arity is fixed (`pid 42`, `exit 0`, `err notfound /w/x message`, …). Fields are raw
//! bytes (paths need not be UTF-8). [`RecordParser`] reassembles records from arbitrary chunks.

use crate::RemoteError;

/// One record: its tag and fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The tag, e.g. `exit`.
    pub tag: String,
    /// The fields after the tag.
    pub fields: Vec<Vec<u8>>,
}

impl Record {
    /// Field `i` as lossy UTF-8 text.
    pub fn text(&self, i: usize) -> String {
        self.fields
            .get(i)
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .unwrap_or_default()
    }

    /// Field `i` as a path (bytes kept as they are).
    pub fn path(&self, i: usize) -> std::path::PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let bytes = self.fields.get(i).map(Vec::as_slice).unwrap_or_default();
        std::path::PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
    }
}

/// Incremental parser for one record stream; `arity` maps a tag to its field count (`None`:
/// unknown tag, a protocol error).
pub struct RecordParser {
    arity: fn(&str) -> Option<usize>,
    pending: Vec<u8>,
    tokens: Vec<Vec<u8>>,
}

impl std::fmt::Debug for RecordParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordParser")
            .field("pending", &self.pending.len())
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl RecordParser {
    /// A parser for a stream whose tags have the given arities.
    pub fn new(arity: fn(&str) -> Option<usize>) -> Self {
        RecordParser {
            arity,
            pending: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// Feed a chunk; returns the records completed by it.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Record>, RemoteError> {
        let mut out = Vec::new();
        for &byte in chunk {
            if byte != 0 {
                self.pending.push(byte);
                continue;
            }
            self.tokens.push(std::mem::take(&mut self.pending));
            let tag = String::from_utf8_lossy(&self.tokens[0]).into_owned();
            let Some(arity) = (self.arity)(&tag) else {
                return Err(RemoteError::Protocol {
                    detail: format!("unknown record `{}`", tag.escape_debug()),
                });
            };
            if self.tokens.len() == arity + 1 {
                let mut tokens = std::mem::take(&mut self.tokens).into_iter();
                tokens.next();
                out.push(Record {
                    tag,
                    fields: tokens.collect(),
                });
            }
        }
        Ok(out)
    }

    /// Whether a record is incomplete (the stream ended in the middle of one).
    pub fn is_mid_record(&self) -> bool {
        !self.pending.is_empty() || !self.tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arity(tag: &str) -> Option<usize> {
        match tag {
            "ok" => Some(0),
            "pid" => Some(1),
            "err" => Some(3),
            _ => None,
        }
    }

    #[test]
    fn parses_records_split_across_chunks() {
        let mut parser = RecordParser::new(arity);
        let stream = b"pid\x0042\x00ok\x00err\x00notfound\x00/w/a b\x00no such\x00";
        let mut records = Vec::new();
        for chunk in stream.chunks(3) {
            records.extend(parser.feed(chunk).expect("valid stream"));
        }
        assert_eq!(
            records,
            vec![
                Record {
                    tag: "pid".into(),
                    fields: vec![b"42".to_vec()]
                },
                Record {
                    tag: "ok".into(),
                    fields: vec![]
                },
                Record {
                    tag: "err".into(),
                    fields: vec![
                        b"notfound".to_vec(),
                        b"/w/a b".to_vec(),
                        b"no such".to_vec()
                    ],
                },
            ]
        );
        assert!(!parser.is_mid_record());
    }

    #[test]
    fn unknown_tag_is_a_protocol_error() {
        let mut parser = RecordParser::new(arity);
        let err = parser.feed(b"bash: oops\x00").expect_err("unknown tag");
        assert_eq!(
            err.to_string(),
            "failed to parse the remote helper's answer: unknown record `bash: oops`"
        );
    }

    #[test]
    fn reports_an_unfinished_record() {
        let mut parser = RecordParser::new(arity);
        assert_eq!(parser.feed(b"err\x00io\x00").expect("valid"), vec![]);
        assert!(parser.is_mid_record());
    }
}
