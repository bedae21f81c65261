//! Resolving the paths a model sends (docs/semantics.md#paths): Unicode spaces, a leading
//! `@`, `~`, `file://` URLs, then relative to the workspace root. Resolution is lexical; the
//! backend confines the result to its roots by kernel or remote-side checks, never here.

use std::path::{Component, Path, PathBuf};

use unicode_normalization::UnicodeNormalization;

/// Replace the Unicode space characters models sometimes emit with a plain space.
pub fn normalize_unicode_spaces(path: &str) -> String {
    path.chars()
        .map(|c| match c {
            '\u{00A0}' | '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
            other => other,
        })
        .collect()
}

/// Resolve a model-supplied path against `cwd` (the workspace root), in this order: Unicode
/// spaces → space; one leading `@` stripped; `~` and `~/…` expanded to `home` (`~name` stays
/// literal); `file://` URLs decoded; then absolute as is or joined to `cwd`; `.` and `..`
/// collapsed lexically.
pub fn resolve_to_cwd(path: &str, cwd: &Path, home: Option<&Path>) -> PathBuf {
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
        cwd.join(expanded)
    };
    normalize_lexically(&joined)
}

/// Collapse `.` and `..` components without touching the filesystem (`/..` stays `/`).
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

/// Alternative spellings `read` tries when a path does not exist (macOS screenshot names):
/// ` AM.`/` PM.` with a narrow no-break space; NFD; `'` as U+2019; NFD plus U+2019.
/// Variants equal to the input or to an earlier variant are left out.
pub fn read_path_variants(path: &Path) -> Vec<PathBuf> {
    let Some(text) = path.to_str() else {
        return Vec::new();
    };
    let am_pm = replace_am_pm(text);
    let nfd: String = text.nfd().collect();
    let curly = text.replace('\'', "\u{2019}");
    let nfd_curly = nfd.replace('\'', "\u{2019}");
    let mut out: Vec<PathBuf> = Vec::new();
    for candidate in [am_pm, nfd, curly, nfd_curly] {
        let candidate = PathBuf::from(candidate);
        if candidate != path && !out.contains(&candidate) {
            out.push(candidate);
        }
    }
    out
}

fn replace_am_pm(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(index) = rest.find(' ') {
        let after = &rest[index + 1..];
        let is_marker = after.len() >= 3
            && after.is_char_boundary(3)
            && matches!(after[..2].to_ascii_uppercase().as_str(), "AM" | "PM")
            && after.as_bytes()[2] == b'.';
        out.push_str(&rest[..index]);
        out.push(if is_marker { '\u{202F}' } else { ' ' });
        rest = after;
    }
    out.push_str(rest);
    out
}

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

/// Quote a string for a POSIX shell (single quotes), for hints such as `sed -n …`.
pub fn shell_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%,=".contains(&b))
    {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CWD: &str = "/work/ws";
    const HOME: &str = "/home/me";

    fn resolve(p: &str) -> PathBuf {
        resolve_to_cwd(p, Path::new(CWD), Some(Path::new(HOME)))
    }

    #[test]
    fn expands_tilde() {
        assert_eq!(resolve("~"), PathBuf::from(HOME));
        assert_eq!(resolve("~/a/b"), PathBuf::from("/home/me/a/b"));
    }

    #[test]
    fn keeps_tilde_prefixed_names_literal() {
        assert_eq!(resolve("~draft.md"), PathBuf::from("/work/ws/~draft.md"));
        assert_eq!(resolve("@~draft.md"), PathBuf::from("/work/ws/~draft.md"));
    }

    #[test]
    fn normalizes_unicode_spaces_and_at() {
        assert_eq!(
            resolve("file\u{00A0}name.txt"),
            PathBuf::from("/work/ws/file name.txt")
        );
        assert_eq!(resolve("@src/a.rs"), PathBuf::from("/work/ws/src/a.rs"));
    }

    #[test]
    fn resolves_absolute_relative_and_dots() {
        assert_eq!(resolve("/etc/hosts"), PathBuf::from("/etc/hosts"));
        assert_eq!(resolve("a/./b/../c"), PathBuf::from("/work/ws/a/c"));
        assert_eq!(resolve("../x"), PathBuf::from("/work/x"));
        assert_eq!(resolve("/../../x"), PathBuf::from("/x"));
    }

    #[test]
    fn decodes_file_urls() {
        assert_eq!(
            resolve("file:///tmp/a%20b.txt"),
            PathBuf::from("/tmp/a b.txt")
        );
    }

    #[test]
    fn read_variants_cover_macos_names() {
        let variants = read_path_variants(Path::new("/s/Shot 10.00.00 am.png"));
        assert_eq!(variants[0], PathBuf::from("/s/Shot 10.00.00\u{202F}am.png"));
        let variants = read_path_variants(Path::new("/s/it's.png"));
        assert!(variants.contains(&PathBuf::from("/s/it\u{2019}s.png")));
        let variants = read_path_variants(Path::new("/s/café.png"));
        assert!(variants.contains(&PathBuf::from("/s/cafe\u{301}.png")));
    }

    #[test]
    fn shell_quotes() {
        assert_eq!(shell_quote("src/a.rs"), "src/a.rs");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
