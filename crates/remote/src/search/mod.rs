//! grep and find over a remote shell, producing exactly the data the local backend produces
//! (docs/semantics.md#grep): files in path order, `.gitignore`/`.ignore` respected the same way
//! inside and outside git repositories (ripgrep's rules: ancestors' ignore files included,
//! `.ignore` over `.gitignore`, whitelists, directory pruning), hidden files included, `.git/`
//! never entered, overlapping context windows merged, stop after the limit, unreadable entries as
//! notes.
//!
//! - [`rg`]: the fast path when the sandbox has ripgrep: `rg --json` walks and searches; its
//!   output is parsed and the glob filter applied with `globset`, like the local backend.
//! - [`listing`]: a POSIX `find` listing plus the ignore files' contents, turned into the
//!   sorted, ignore-filtered file list by [`ignore_rules`] — used for find (which must also list
//!   symlinks to files) and by the fallback grep.
//! - [`host`]: grep and find themselves ([`host::RemoteSearch`]), written once over the
//!   backend's [`host::SearchHost`] (it starts a process on a resolved, confined path).
//! - [`fallback`]: the grep for images without `rg`: the chosen files stream in as tar and are
//!   searched here with the same regex engine.

pub mod fallback;
pub mod host;
pub mod ignore_rules;
pub mod listing;
pub mod rg;

use std::path::Path;

use cordon_ops::bounds::REGEX_SIZE_LIMIT;
use cordon_ops::{GrepRequest, SearchError};
use globset::{Glob, GlobSet, GlobSetBuilder};

/// The glob filter of grep and find: with a `/` it matches the path relative to the search
/// path, otherwise the file name.
#[derive(Clone, Debug)]
pub struct GlobFilter {
    /// A one-glob set: building it reports a glob too complex to compile as an error, where
    /// `Glob::compile_matcher` would panic.
    matcher: GlobSet,
    full_path: bool,
}

impl GlobFilter {
    /// Compile `pattern`.
    pub fn new(pattern: &str) -> Result<Self, SearchError> {
        let glob = Glob::new(pattern).map_err(|e| SearchError::InvalidPattern {
            what: "glob",
            pattern: pattern.to_owned(),
            reason: e.kind().to_string(),
        })?;
        let matcher =
            GlobSetBuilder::new()
                .add(glob)
                .build()
                .map_err(|e| SearchError::InvalidPattern {
                    what: "glob",
                    pattern: pattern.to_owned(),
                    reason: e.kind().to_string(),
                })?;
        Ok(GlobFilter {
            matcher,
            full_path: pattern.contains('/'),
        })
    }

    /// Whether `path` (under `base`, the search path) passes.
    pub fn matches(&self, base: &Path, path: &Path) -> bool {
        if self.full_path {
            let rel = path.strip_prefix(base).unwrap_or(path);
            self.matcher.is_match(rel)
        } else {
            match path.file_name() {
                Some(name) => self.matcher.is_match(Path::new(name)),
                None => false,
            }
        }
    }
}

/// The regex a grep request searches with (literal escaped, case flag applied), checked here so
/// that a bad pattern is reported the same way on every backend.
pub fn compile_pattern(request: &GrepRequest) -> Result<regex::bytes::Regex, SearchError> {
    let source = if request.literal {
        regex::escape(&request.pattern)
    } else {
        request.pattern.clone()
    };
    if source.contains('\n') {
        return Err(SearchError::InvalidPattern {
            what: "regex",
            pattern: request.pattern.clone(),
            reason: "the pattern must not contain a line break".to_owned(),
        });
    }
    regex::bytes::RegexBuilder::new(&source)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .case_insensitive(request.ignore_case)
        .multi_line(true)
        .build()
        .map_err(|e| SearchError::InvalidPattern {
            what: "regex",
            pattern: request.pattern.clone(),
            reason: e.to_string(),
        })
}

/// The glob filter of a request, if any.
pub fn compile_glob(glob: Option<&str>) -> Result<Option<GlobFilter>, SearchError> {
    glob.map(GlobFilter::new).transpose()
}

/// Strip one line terminator (`\n`, and a `\r` before it) from a line.
pub(crate) fn strip_terminator(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn request(pattern: &str, literal: bool) -> GrepRequest {
        GrepRequest {
            pattern: pattern.to_owned(),
            path: PathBuf::from("/w"),
            glob: None,
            ignore_case: false,
            literal,
            context: 0,
            max_matches: 10,
        }
    }

    #[test]
    fn glob_filter_by_name_or_relative_path() {
        let by_name = GlobFilter::new("*.rs").expect("valid");
        assert!(by_name.matches(Path::new("/w"), Path::new("/w/src/deep/a.rs")));
        assert!(!by_name.matches(Path::new("/w"), Path::new("/w/src/a.rs.txt")));
        let by_path = GlobFilter::new("src/**/*.rs").expect("valid");
        assert!(by_path.matches(Path::new("/w"), Path::new("/w/src/x/a.rs")));
        assert!(!by_path.matches(Path::new("/w"), Path::new("/w/lib/src/a.rs")));
    }

    #[test]
    fn a_glob_too_complex_to_compile_is_an_error_not_a_panic() {
        let err = GlobFilter::new(&"*/".repeat(100_000)).expect_err("too complex");
        assert!(matches!(
            err,
            SearchError::InvalidPattern { what: "glob", .. }
        ));
    }

    #[test]
    fn invalid_patterns_are_reported() {
        let err = compile_pattern(&request("a(", false)).expect_err("bad regex");
        assert!(matches!(
            err,
            SearchError::InvalidPattern { what: "regex", .. }
        ));
        assert!(compile_pattern(&request("a(", true)).is_ok());
        let err = compile_glob(Some("a[")).expect_err("bad glob");
        assert!(matches!(
            err,
            SearchError::InvalidPattern { what: "glob", .. }
        ));
    }
}
