//! [`PolicyError`]: everything that can go wrong while loading and compiling a policy file.
//!
//! Every variant except [`PolicyError::Read`] carries the file name, 1-based line and column
//! of the offending TOML, and displays as `FILE:LINE:COL: message` so editors and CI logs can
//! jump to it. Decisions are not errors: a denied call is a [`crate::PolicyDecision`].

use std::path::PathBuf;

use cordon_core::excerpt::excerpt;

/// A policy file that cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("{}: failed to read policy file: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong: I/O, or the file is a symlink, not a regular file, not the
        /// user's or root's, writable by others, too large or not UTF-8.
        #[source]
        source: cordon_core::hostfile::HostFileError,
    },
    /// A `builtin:NAME` that names no shipped policy (the message lists the known ones).
    #[error(transparent)]
    UnknownBuiltin(#[from] crate::builtin::UnknownBuiltin),
    /// The text is not valid TOML.
    #[error("{file}:{line}:{column}: failed to parse TOML: {message}")]
    Syntax {
        /// File name as given to the loader.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column (in characters).
        column: usize,
        /// What the TOML parser reported.
        message: String,
    },
    /// A key the policy format does not know (typos are errors, never ignored).
    #[error("{file}:{line}:{column}: unknown key: {message}")]
    UnknownKey {
        /// File name as given to the loader.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The key and the keys allowed there.
        message: String,
    },
    /// A required key is absent.
    #[error("{file}:{line}:{column}: missing key: {message}")]
    MissingKey {
        /// File name as given to the loader.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// Which key.
        message: String,
    },
    /// A value of the wrong TOML type (a string where a list is expected, …).
    #[error("{file}:{line}:{column}: wrong type: {message}")]
    WrongType {
        /// File name as given to the loader.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// Found and expected types.
        message: String,
    },
    /// A path glob that does not compile.
    #[error("{file}:{line}:{column}: bad glob `{glob}`: {message}")]
    BadGlob {
        /// File name as given to the loader.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The glob as written.
        glob: String,
        /// Why it is rejected.
        message: String,
    },
    /// A redaction regex that does not compile or that matches the empty string.
    #[error("{file}:{line}:{column}: bad regex `{regex}`: {message}")]
    BadRegex {
        /// File name as given to the loader.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The pattern as written.
        regex: String,
        /// Why it is rejected.
        message: String,
    },
    /// A value of the right type that is not acceptable (unknown tool, `max_timeout` below
    /// `timeout`, a rule example that does not match its rule, …).
    #[error("{file}:{line}:{column}: bad value: {message}")]
    BadValue {
        /// File name as given to the loader.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong and what is expected.
        message: String,
    },
}

impl PolicyError {
    /// The `(line, column)` the error points at, if it has one.
    pub fn position(&self) -> Option<(usize, usize)> {
        match self {
            PolicyError::Read { .. } | PolicyError::UnknownBuiltin(_) => None,
            PolicyError::Syntax { line, column, .. }
            | PolicyError::UnknownKey { line, column, .. }
            | PolicyError::MissingKey { line, column, .. }
            | PolicyError::WrongType { line, column, .. }
            | PolicyError::BadGlob { line, column, .. }
            | PolicyError::BadRegex { line, column, .. }
            | PolicyError::BadValue { line, column, .. } => Some((*line, *column)),
        }
    }
}

/// Characters of an error message kept whole; a longer one (a huge value from the file quoted
/// in it) keeps its start and its end, which says what to change.
const MAX_MESSAGE_CHARS: usize = 1_000;

/// Characters kept from the end of a cut message.
const MESSAGE_TAIL_CHARS: usize = 200;

/// `message` cut to about [`MAX_MESSAGE_CHARS`] characters: its start, the size of what was
/// left out, and its last [`MESSAGE_TAIL_CHARS`] characters.
fn bounded(message: String) -> String {
    let count = message.chars().count();
    if count <= MAX_MESSAGE_CHARS {
        return message;
    }
    let head_chars = MAX_MESSAGE_CHARS - MESSAGE_TAIL_CHARS;
    let head_end = message
        .char_indices()
        .nth(head_chars)
        .map_or(message.len(), |(at, _)| at);
    let tail_start = message
        .char_indices()
        .nth(count - MESSAGE_TAIL_CHARS)
        .map_or(message.len(), |(at, _)| at);
    format!(
        "{} … ({} bytes left out) … {}",
        &message[..head_end],
        tail_start - head_end,
        &message[tail_start..]
    )
}

/// Maps byte offsets of a policy text to 1-based line and column numbers.
#[derive(Clone, Debug)]
pub(crate) struct SourceMap {
    file: String,
    line_starts: Vec<usize>,
    text_len: usize,
    text: String,
}

impl SourceMap {
    pub(crate) fn new(file: &str, text: &str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(index, _)| index + 1));
        SourceMap {
            file: file.to_owned(),
            line_starts,
            text_len: text.len(),
            text: text.to_owned(),
        }
    }

    pub(crate) fn file(&self) -> &str {
        &self.file
    }

    /// 1-based line and column (in characters) of byte `offset`.
    pub(crate) fn position(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text_len);
        let line_index = match self.line_starts.binary_search(&offset) {
            Ok(index) => index,
            Err(index) => index - 1,
        };
        let start = self.line_starts[line_index];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |prefix| prefix.chars().count());
        (line_index + 1, column + 1)
    }

    /// 1-based line of byte `offset`.
    pub(crate) fn line(&self, offset: usize) -> usize {
        self.position(offset).0
    }

    pub(crate) fn bad_value(&self, offset: usize, message: impl Into<String>) -> PolicyError {
        let (line, column) = self.position(offset);
        PolicyError::BadValue {
            file: self.file.clone(),
            line,
            column,
            message: bounded(message.into()),
        }
    }

    pub(crate) fn bad_glob(&self, offset: usize, glob: &str, message: String) -> PolicyError {
        let (line, column) = self.position(offset);
        PolicyError::BadGlob {
            file: self.file.clone(),
            line,
            column,
            glob: excerpt(glob).into_owned(),
            message: bounded(message),
        }
    }

    pub(crate) fn bad_regex(&self, offset: usize, regex: &str, message: String) -> PolicyError {
        let (line, column) = self.position(offset);
        PolicyError::BadRegex {
            file: self.file.clone(),
            line,
            column,
            regex: excerpt(regex).into_owned(),
            message: bounded(message),
        }
    }

    /// Classify an error from `toml`'s serde layer by serde's stable message prefixes.
    pub(crate) fn toml_error(&self, error: &toml::de::Error, syntax: bool) -> PolicyError {
        let offset = error.span().map_or(0, |span| span.start);
        let (line, column) = self.position(offset);
        let file = self.file.clone();
        let message = bounded(error.message().trim().to_owned());
        if syntax {
            return PolicyError::Syntax {
                file,
                line,
                column,
                message,
            };
        }
        if message.starts_with("unknown field") {
            PolicyError::UnknownKey {
                file,
                line,
                column,
                message,
            }
        } else if message.starts_with("missing field") {
            PolicyError::MissingKey {
                file,
                line,
                column,
                message,
            }
        } else if message.starts_with("invalid type") {
            PolicyError::WrongType {
                file,
                line,
                column,
                message,
            }
        } else {
            PolicyError::BadValue {
                file,
                line,
                column,
                message,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_and_count_characters() {
        let map = SourceMap::new("p.toml", "ab\nçd = 1\n\nx");
        assert_eq!(map.position(0), (1, 1));
        assert_eq!(map.position(1), (1, 2));
        assert_eq!(map.position(3), (2, 1));
        // `ç` is two bytes: byte 5 is the second character of line 2.
        assert_eq!(map.position(5), (2, 2));
        assert_eq!(map.position(12), (4, 1));
        assert_eq!(map.position(999), (4, 2));
    }

    #[test]
    fn long_messages_keep_their_start_and_end() {
        let map = SourceMap::new("p.toml", "x = 1\n");
        let long = format!(
            "the example `{}` does not match, listed under `match`",
            "(".repeat(50_000)
        );
        let shown = map.bad_value(0, long).to_string();
        assert!(shown.len() < 2 * MAX_MESSAGE_CHARS, "{}", shown.len());
        assert!(
            shown.starts_with("p.toml:1:1: bad value: the example `((("),
            "{shown}"
        );
        assert!(shown.ends_with("listed under `match`"), "{shown}");
        assert!(shown.contains("bytes left out"), "{shown}");
        let glob = map.bad_glob(0, &"*".repeat(10_000), "too long".to_owned());
        assert!(glob.to_string().len() < 400, "{glob}");
    }

    #[test]
    fn errors_display_file_line_column() {
        let map = SourceMap::new("p.toml", "a\nb = 1");
        let error = map.bad_value(2, "nope");
        assert_eq!(error.to_string(), "p.toml:2:1: bad value: nope");
        assert_eq!(error.position(), Some((2, 1)));
    }
}
