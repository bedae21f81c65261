//! The one resolver for the paths a model sends (docs/semantics.md#paths). The tools resolve
//! their path arguments with it before calling the backend, the runtime resolves the paths it
//! hands the policy with it (then the backend canonicalises them), and `cordon policy explain`
//! resolves with it too — so all three judge and open the same path.
//!
//! Resolution is lexical: nothing here touches a filesystem or confines anything; the backend
//! confines the result to its roots by kernel or remote-side checks. Names are not Unicode
//! normalised (NFC and NFD spellings of a name stay distinct paths, as the kernel sees them);
//! only the `read` tool tries other spellings of a path that does not exist, and the policy
//! judges whichever path the backend then opens.

use std::path::{Component, Path, PathBuf};

/// Replace the Unicode space characters models sometimes emit (U+00A0, U+2000–U+200A, U+202F,
/// U+205F, U+3000) with a plain space.
pub fn normalize_unicode_spaces(path: &str) -> String {
    path.chars()
        .map(|c| match c {
            '\u{00A0}' | '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
            other => other,
        })
        .collect()
}

/// Resolve a model-supplied path against `root` (the workspace root), in this order: Unicode
/// spaces → space; one leading `@` stripped; a `file://` or `file://localhost` URL prefix
/// stripped and the rest percent-decoded; `~` and `~/…` expanded to `home` (`~name` stays
/// literal, as does `~` without a known home); then absolute as is or joined to `root`; `.`
/// and `..` collapsed lexically (`..` at `/` stays `/`).
pub fn resolve_model_path(path: &str, root: &Path, home: Option<&Path>) -> PathBuf {
    let spaced = normalize_unicode_spaces(path);
    let mut text: &str = spaced.strip_prefix('@').unwrap_or(&spaced);
    let decoded;
    if let Some(rest) = text.strip_prefix("file://") {
        // file:///abs/path or file://localhost/abs/path
        let rest = rest.strip_prefix("localhost").unwrap_or(rest);
        decoded = percent_decode(rest);
        text = &decoded;
    }
    let expanded: PathBuf = match (text, home) {
        ("~", Some(home)) => home.to_path_buf(),
        (t, Some(home)) if t.starts_with("~/") => home.join(&t[2..]),
        (t, _) => PathBuf::from(t),
    };
    let joined = if expanded.is_absolute() {
        expanded
    } else {
        root.join(expanded)
    };
    normalize_lexically(&joined)
}

/// Collapse `.` and `..` components without touching the filesystem (`/..` stays `/`; a
/// relative path keeps the `..` it cannot collapse). No other rewriting: this is for paths
/// that are already absolute or already resolved, such as a program path a shell will run.
pub fn normalize_lexically(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Prefix(prefix) => out.push(prefix.as_os_str()),
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() && !out.has_root() {
                    out.push("..");
                }
            }
            Component::Normal(part) => out.push(part),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// `%XX` escapes decoded (invalid escapes kept as they are, invalid UTF-8 replaced).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(value) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(value);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/work/ws";
    const HOME: &str = "/home/me";

    fn resolve(p: &str) -> PathBuf {
        resolve_model_path(p, Path::new(ROOT), Some(Path::new(HOME)))
    }

    #[test]
    fn expands_tilde() {
        assert_eq!(resolve("~"), PathBuf::from(HOME));
        assert_eq!(resolve("~/a/b"), PathBuf::from("/home/me/a/b"));
        assert_eq!(
            resolve_model_path("~/a", Path::new(ROOT), None),
            PathBuf::from("/work/ws/~/a")
        );
    }

    #[test]
    fn keeps_tilde_prefixed_names_literal() {
        assert_eq!(resolve("~draft.md"), PathBuf::from("/work/ws/~draft.md"));
        assert_eq!(resolve("@~draft.md"), PathBuf::from("/work/ws/~draft.md"));
        assert_eq!(resolve("~user/x"), PathBuf::from("/work/ws/~user/x"));
    }

    #[test]
    fn normalizes_unicode_spaces_and_at() {
        assert_eq!(
            resolve("file\u{00A0}name.txt"),
            PathBuf::from("/work/ws/file name.txt")
        );
        assert_eq!(
            resolve("a\u{202F}b\u{3000}c\u{2009}d"),
            PathBuf::from("/work/ws/a b c d")
        );
        assert_eq!(resolve("@src/a.rs"), PathBuf::from("/work/ws/src/a.rs"));
    }

    #[test]
    fn resolves_absolute_relative_and_dots() {
        assert_eq!(resolve("/etc/hosts"), PathBuf::from("/etc/hosts"));
        assert_eq!(resolve("a/./b/../c"), PathBuf::from("/work/ws/a/c"));
        assert_eq!(resolve("./a/../b"), PathBuf::from("/work/ws/b"));
        assert_eq!(resolve("../x"), PathBuf::from("/work/x"));
        assert_eq!(resolve("/../../x"), PathBuf::from("/x"));
        assert_eq!(resolve("../../../.."), PathBuf::from("/"));
        assert_eq!(resolve("."), PathBuf::from(ROOT));
    }

    #[test]
    fn decodes_file_urls() {
        assert_eq!(
            resolve("file:///tmp/a%20b.txt"),
            PathBuf::from("/tmp/a b.txt")
        );
        assert_eq!(resolve("file://localhost/x"), PathBuf::from("/x"));
        assert_eq!(resolve("file:///a%2"), PathBuf::from("/a%2"));
        assert_eq!(resolve("file:///a%zz"), PathBuf::from("/a%zz"));
    }

    #[test]
    fn does_not_normalise_nfc_or_nfd() {
        assert_eq!(resolve("caf\u{e9}"), PathBuf::from("/work/ws/caf\u{e9}"));
        assert_eq!(
            resolve("cafe\u{301}"),
            PathBuf::from("/work/ws/cafe\u{301}")
        );
    }

    #[test]
    fn normalize_lexically_keeps_unresolvable_relative_parents() {
        assert_eq!(
            normalize_lexically(Path::new("../a")),
            PathBuf::from("../a")
        );
        assert_eq!(normalize_lexically(Path::new("a/..")), PathBuf::from("."));
        assert_eq!(
            normalize_lexically(Path::new("/a/../..")),
            PathBuf::from("/")
        );
    }
}
