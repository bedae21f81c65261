//! Path helpers only the tools need: the other spellings `read` tries for a missing file, and
//! shell quoting for hints. Resolving a model's path is `cordon_ops::paths::resolve_model_path`
//! (docs/semantics.md#paths), shared with the policy and the runtime.

use std::path::{Path, PathBuf};

use unicode_normalization::UnicodeNormalization;

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
