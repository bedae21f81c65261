//! Path globs of the policy file, anchored at the workspace root, the filesystem root, or the
//! backend's home directory, and matched against canonical paths.
//!
//! Syntax is `globset`'s with `*` not crossing `/` and `**` crossing it; `X/**` also matches
//! the directory `X` itself, and `**` matches the root. A `~/` glob needs the backend's home
//! directory; when the runtime does not know it, deny/protect globs fall back to matching the
//! rest anywhere (`~/.ssh/**` → `**/.ssh/**`, stricter) and allow globs match nothing.

use std::path::{Component, Path};
use std::sync::OnceLock;

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use crate::error::{PolicyError, SourceMap};

/// Where a glob is anchored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Anchor {
    /// Relative to the workspace root.
    Root,
    /// An absolute path.
    Absolute,
    /// Below the backend's home directory (`~/…`).
    Home,
}

/// The directories a path is judged against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PathContext<'a> {
    pub root: &'a Path,
    pub home: Option<&'a Path>,
}

/// One compiled glob.
#[derive(Clone, Debug)]
pub(crate) struct PathGlob {
    /// As written in the policy.
    pub source: String,
    /// 1-based line in the policy file.
    pub line: usize,
    pub anchor: Anchor,
    /// Pattern text after the anchor (`~/` and `./` removed).
    rest: String,
    matcher: GlobMatcher,
    /// For `X/**`: matches `X` itself.
    base: Option<GlobMatcher>,
    /// For `~/` globs: `**/REST`, used by strict matching when the home is unknown.
    anywhere: Option<GlobMatcher>,
}

/// A parsed glob, compiled on first use. Parsing (at load) finds every syntax error; the
/// matcher itself — a one-glob `GlobSet`, which picks a literal, extension, prefix or suffix
/// strategy where one applies and builds a regex only for the rest — is built the first time
/// the glob is consulted, so loading a policy (paid by every `cordon exec`) compiles only the
/// globs a call actually needs.
#[derive(Clone, Debug)]
struct GlobMatcher {
    glob: Glob,
    compiled: OnceLock<Compiled>,
}

#[derive(Clone, Debug)]
enum Compiled {
    Set(GlobSet),
    /// Never expected: globset could not build a set for a glob it parsed.
    Single(globset::GlobMatcher),
}

impl GlobMatcher {
    fn is_match(&self, text: &str) -> bool {
        let compiled = self.compiled.get_or_init(|| {
            match GlobSetBuilder::new().add(self.glob.clone()).build() {
                Ok(set) => Compiled::Set(set),
                Err(_) => Compiled::Single(self.glob.compile_matcher()),
            }
        });
        match compiled {
            Compiled::Set(set) => set.is_match(text),
            Compiled::Single(matcher) => matcher.is_match(text),
        }
    }
}

/// Longest glob a policy may give (globset compiles each into a regex).
pub const MAX_GLOB_BYTES: usize = 4096;

fn build(pattern: &str) -> Result<GlobMatcher, globset::Error> {
    let glob = GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()?;
    Ok(GlobMatcher {
        glob,
        compiled: OnceLock::new(),
    })
}

impl PathGlob {
    /// Compile `text` written at byte `offset` of the policy.
    pub(crate) fn compile(text: &str, offset: usize, map: &SourceMap) -> Result<Self, PolicyError> {
        let bad = |message: &str| map.bad_glob(offset, text, message.to_owned());
        if text.is_empty() {
            return Err(bad("a glob must not be empty"));
        }
        if text.len() > MAX_GLOB_BYTES {
            let prefix: String = text.chars().take(64).collect();
            return Err(map.bad_glob(
                offset,
                &prefix,
                format!("a glob must not be longer than {MAX_GLOB_BYTES} bytes"),
            ));
        }
        let (anchor, rest) = if text == "~" {
            (Anchor::Home, "")
        } else if let Some(rest) = text.strip_prefix("~/") {
            (Anchor::Home, rest)
        } else if text.starts_with('~') {
            return Err(bad(
                "only `~/` (the backend's home directory) is supported, not `~user`",
            ));
        } else if text.starts_with('/') {
            (Anchor::Absolute, text)
        } else {
            let mut rest = text;
            while let Some(stripped) = rest.strip_prefix("./") {
                rest = stripped;
            }
            if rest == "." {
                rest = "";
            }
            (Anchor::Root, rest)
        };
        if rest.split('/').any(|component| component == "..") {
            return Err(bad("a glob must not contain `..`"));
        }
        let matcher = build(rest).map_err(|error| bad(&error.kind().to_string()))?;
        let base = match rest.strip_suffix("/**") {
            Some(base) => Some(build(base).map_err(|error| bad(&error.kind().to_string()))?),
            None => None,
        };
        let anywhere = match anchor {
            Anchor::Home => {
                let pattern = if rest.is_empty() {
                    "**".to_owned()
                } else {
                    format!("**/{rest}")
                };
                Some(build(&pattern).map_err(|error| bad(&error.kind().to_string()))?)
            }
            Anchor::Root | Anchor::Absolute => None,
        };
        Ok(PathGlob {
            source: text.to_owned(),
            line: map.line(offset),
            anchor,
            rest: rest.to_owned(),
            matcher,
            base,
            anywhere,
        })
    }

    fn is_match_text(&self, text: &str) -> bool {
        self.matcher.is_match(text) || self.base.as_ref().is_some_and(|base| base.is_match(text))
    }

    /// Whether `path` (canonical, absolute) matches. `strict` is for deny-like checks: an
    /// unknown home makes `~/` globs match more, never less.
    pub(crate) fn matches(&self, path: &Path, context: PathContext<'_>, strict: bool) -> bool {
        match self.anchor {
            Anchor::Root => match relative_text(path, context.root) {
                Some(relative) => self.is_match_text(&relative),
                None => false,
            },
            Anchor::Absolute => self.is_match_text(&path.to_string_lossy()),
            Anchor::Home => match context.home {
                Some(home) => match relative_text(path, home) {
                    Some(relative) => self.is_match_text(&relative),
                    None => false,
                },
                None if strict => {
                    let text = path.to_string_lossy();
                    let text = text.trim_start_matches('/');
                    self.anywhere.as_ref().is_some_and(|m| m.is_match(text))
                }
                None => false,
            },
        }
    }

    /// The literal directory prefix of the glob in the sandbox spec's notation: the
    /// components before the first one containing a glob character (`~/.cargo/**` →
    /// `~/.cargo`, `/opt/*/bin` → `/opt`). `None` for root-anchored globs.
    pub(crate) fn literal_root(&self) -> Option<String> {
        let literal: Vec<&str> = self
            .rest
            .split('/')
            .take_while(|component| !component.contains(['*', '?', '[', '{', '\\']))
            .collect();
        let joined = literal.join("/");
        match self.anchor {
            Anchor::Root => None,
            Anchor::Absolute => Some(if joined.is_empty() {
                "/".to_owned()
            } else {
                joined
            }),
            Anchor::Home => Some(if joined.is_empty() {
                "~/".to_owned()
            } else {
                format!("~/{joined}")
            }),
        }
    }
}

/// `path` relative to `base` as `/`-separated text (`""` for `base` itself), if below it.
fn relative_text(path: &Path, base: &Path) -> Option<String> {
    let relative = path.strip_prefix(base).ok()?;
    let mut parts = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            // A canonical path has none of these; refuse to guess.
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(text: &str) -> PathGlob {
        PathGlob::compile(text, 0, &SourceMap::new("t.toml", text)).unwrap()
    }

    fn context<'a>(home: Option<&'a Path>) -> PathContext<'a> {
        PathContext {
            root: Path::new("/ws"),
            home,
        }
    }

    #[test]
    fn root_globs_match_relative_to_the_workspace() {
        let home = Some(Path::new("/home/me"));
        let all = glob("**");
        assert!(all.matches(Path::new("/ws"), context(home), false));
        assert!(all.matches(Path::new("/ws/a/b"), context(home), false));
        assert!(!all.matches(Path::new("/etc/passwd"), context(home), false));
        let git = glob(".git/**");
        assert!(git.matches(Path::new("/ws/.git"), context(home), false));
        assert!(git.matches(Path::new("/ws/.git/config"), context(home), false));
        assert!(!git.matches(Path::new("/ws/sub/.git/config"), context(home), false));
        let env = glob("**/.env");
        assert!(env.matches(Path::new("/ws/.env"), context(home), false));
        assert!(env.matches(Path::new("/ws/a/.env"), context(home), false));
        assert!(!env.matches(Path::new("/ws/a/.envrc"), context(home), false));
        let star = glob("src/*.rs");
        assert!(star.matches(Path::new("/ws/src/a.rs"), context(home), false));
        assert!(!star.matches(Path::new("/ws/src/a/b.rs"), context(home), false));
        assert!(glob("./Cargo.lock").matches(Path::new("/ws/Cargo.lock"), context(home), false));
    }

    #[test]
    fn absolute_and_home_globs() {
        let home = Some(Path::new("/home/me"));
        assert!(glob("/opt/**").matches(Path::new("/opt/x"), context(home), false));
        let cargo = glob("~/.cargo/**");
        assert!(cargo.matches(Path::new("/home/me/.cargo/bin/cargo"), context(home), false));
        assert!(!cargo.matches(Path::new("/root/.cargo/bin/cargo"), context(home), false));
        // Unknown home: allow-side never matches, deny-side matches anywhere.
        assert!(!cargo.matches(Path::new("/root/.cargo/bin"), context(None), false));
        assert!(cargo.matches(Path::new("/root/.cargo/bin"), context(None), true));
    }

    #[test]
    fn literal_roots() {
        assert_eq!(
            glob("~/.cargo/**").literal_root().as_deref(),
            Some("~/.cargo")
        );
        assert_eq!(
            glob("~/.local/lib/python*/**").literal_root().as_deref(),
            Some("~/.local/lib")
        );
        assert_eq!(glob("/opt/*/bin").literal_root().as_deref(), Some("/opt"));
        assert_eq!(glob("/**").literal_root().as_deref(), Some("/"));
        assert_eq!(glob("~/**").literal_root().as_deref(), Some("~/"));
        assert_eq!(
            glob("/etc/hosts").literal_root().as_deref(),
            Some("/etc/hosts")
        );
        assert_eq!(glob("src/**").literal_root(), None);
    }

    #[test]
    fn bad_globs_are_rejected_with_position() {
        let map = SourceMap::new("t.toml", "x\n  [");
        let error = PathGlob::compile("a/[", 4, &map).unwrap_err();
        assert!(
            matches!(
                error,
                PolicyError::BadGlob {
                    line: 2,
                    column: 3,
                    ..
                }
            ),
            "{error}"
        );
        for bad in ["", "~bob/x", "../x", "a/../../b"] {
            assert!(PathGlob::compile(bad, 0, &map).is_err(), "{bad}");
        }
    }
}
