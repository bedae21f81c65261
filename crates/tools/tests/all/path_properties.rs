//! Properties of lexical path resolution (`resolve_model_path`) on random model paths built from
//! `.`, `..`, names with Unicode spaces and NFC/NFD spellings, `@`, `~` and `file://`. The
//! result is always absolute and free of `.`/`..`; a relative path whose `..` never climbs
//! above its start stays under the root; the decorations (`@`, `file://`, `~/`) mean exactly
//! the plain path. (Confinement of what a path opens is the backend's job and is tested
//! against the kernel in the local backend's suite.)

use std::path::{Component, Path, PathBuf};

use cordon_ops::paths::{normalize_unicode_spaces, resolve_model_path};
use proptest::prelude::*;
use proptest::sample::select;

use crate::support::check;

const ROOT: &str = "/work/ws";
const HOME: &str = "/home/model";

/// Path components a model might send.
const PARTS: &[&str] = &[
    ".",
    "..",
    "..",
    "a",
    "b c",
    "d\u{A0}e",
    "f\u{202F}g",
    "\u{3000}",
    "caf\u{E9}",
    "cafe\u{301}",
    "~",
    "@x",
    "%41",
    "file:",
    "x..y",
    "...",
];

fn relative_path() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(select(PARTS), 1..8)
}

fn resolve(path: &str) -> PathBuf {
    resolve_model_path(path, Path::new(ROOT), Some(Path::new(HOME)))
}

/// Whether the `..` of these components ever climb above their starting directory.
fn climbs_out(parts: &[&str]) -> bool {
    let mut depth: i64 = 0;
    for part in parts {
        match *part {
            "." => {}
            ".." => depth -= 1,
            _ => depth += 1,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'/' | b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[test]
fn resolved_paths_are_absolute_normal_and_stay_under_the_root_unless_they_climb_out() {
    check(512, &relative_path(), |parts| {
        let path = parts.join("/");
        let resolved = resolve(&path);
        prop_assert!(resolved.is_absolute(), "{path:?} -> {resolved:?}");
        prop_assert!(
            resolved
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
            "{path:?} -> {resolved:?}"
        );
        // A path starting with `~`, `~/` or `@` is decorated, not plain relative.
        let decorated = path == "~" || path.starts_with("~/") || path.starts_with('@');
        if !decorated && !climbs_out(&parts) {
            prop_assert!(resolved.starts_with(ROOT), "{path:?} -> {resolved:?}");
        }
        prop_assert_eq!(resolve(resolved.to_str().unwrap()), resolved.clone());
        Ok(())
    });
}

#[test]
fn at_file_url_and_tilde_spellings_resolve_like_the_plain_path() {
    check(512, &relative_path(), |parts| {
        let path = parts.join("/");
        if path.starts_with('@') || path.starts_with('~') {
            return Ok(());
        }
        let plain = resolve(&path);
        prop_assert_eq!(resolve(&format!("@{path}")), plain.clone());
        let absolute = format!("{ROOT}/{path}");
        // Unicode spaces are read as spaces before a URL is decoded; an encoded one stays.
        let url = format!(
            "file://{}",
            percent_encode(&normalize_unicode_spaces(&absolute))
        );
        prop_assert_eq!(resolve(&url), resolve(&absolute), "{}", url);
        prop_assert_eq!(
            resolve(&url.replacen("file://", "file://localhost", 1)),
            resolve(&absolute)
        );
        prop_assert_eq!(
            resolve(&format!("~/{path}")),
            resolve(&format!("{HOME}/{path}"))
        );
        Ok(())
    });
}
