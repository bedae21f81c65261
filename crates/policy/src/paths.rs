//! Which argument strings of a tool call are paths ([`paths_of`]), and a lexical resolver
//! ([`resolve_lexically`], [`lexical_accesses`]) for callers without a backend, such as
//! `cordon policy explain`. The runtime must resolve paths through the backend instead, so
//! that symlinks are followed: the policy judges canonical paths only.

use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::decision::{Op, PathAccess};

/// The tools a policy can enable.
pub const KNOWN_TOOLS: &[&str] = &["read", "edit", "write", "bash", "grep", "find", "ls"];

/// The tools whose calls name paths.
pub const PATH_TOOLS: &[&str] = &["read", "edit", "write", "grep", "find", "ls"];

/// The path argument strings of a call and what the tool does with each, for the runtime to
/// canonicalise through the backend. `grep`, `find` and `ls` default to `.`; `edit` reads and
/// writes its file. Tools without paths (bash, unknown tools) give an empty list, as does a
/// call whose `path` is missing or not a string for a tool that requires one.
pub fn paths_of(tool: &str, args: &Value) -> Vec<(String, Op)> {
    let path = args.get("path").and_then(Value::as_str).map(str::to_owned);
    match tool {
        "read" => path.map(|p| vec![(p, Op::Read)]).unwrap_or_default(),
        "write" => path.map(|p| vec![(p, Op::Write)]).unwrap_or_default(),
        "edit" => path
            .map(|p| vec![(p.clone(), Op::Read), (p, Op::Write)])
            .unwrap_or_default(),
        "grep" | "find" | "ls" => vec![(path.unwrap_or_else(|| ".".to_owned()), Op::Read)],
        _ => Vec::new(),
    }
}

/// Resolve a model path against `root` WITHOUT touching the filesystem: a leading `@` is
/// dropped, `~` and `~/…` expand to `home`, `file://` is stripped, relative paths join
/// `root`, and `.`/`..` collapse lexically. Symlinks are NOT followed, so the result is only
/// as good as the caller's knowledge of the tree (`explain` says so in its output).
pub fn resolve_lexically(path: &str, root: &Path, home: Option<&Path>) -> PathBuf {
    let text = path.strip_prefix('@').unwrap_or(path);
    let text = text
        .strip_prefix("file://localhost")
        .or_else(|| text.strip_prefix("file://"))
        .unwrap_or(text);
    let expanded = match (text, home) {
        ("~", Some(home)) => home.to_path_buf(),
        (t, Some(home)) if t.starts_with("~/") => home.join(&t[2..]),
        (t, _) => PathBuf::from(t),
    };
    let joined = if expanded.is_absolute() {
        expanded
    } else {
        root.join(expanded)
    };
    let mut out = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::Prefix(prefix) => out.push(prefix.as_os_str()),
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
        }
    }
    out
}

/// [`paths_of`] resolved with [`resolve_lexically`].
pub fn lexical_accesses(
    tool: &str,
    args: &Value,
    root: &Path,
    home: Option<&Path>,
) -> Vec<PathAccess> {
    paths_of(tool, args)
        .into_iter()
        .map(|(path, op)| PathAccess {
            canonical: resolve_lexically(&path, root, home),
            op,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_of_each_tool() {
        assert_eq!(
            paths_of("read", &json!({"path": "a"})),
            vec![("a".into(), Op::Read)]
        );
        assert_eq!(
            paths_of("write", &json!({"path": "a"})),
            vec![("a".into(), Op::Write)]
        );
        assert_eq!(
            paths_of("edit", &json!({"path": "a"})),
            vec![("a".into(), Op::Read), ("a".into(), Op::Write)]
        );
        for tool in ["grep", "find", "ls"] {
            assert_eq!(paths_of(tool, &json!({})), vec![(".".into(), Op::Read)]);
            assert_eq!(
                paths_of(tool, &json!({"path": "src"})),
                vec![("src".into(), Op::Read)]
            );
        }
        assert!(paths_of("bash", &json!({"command": "ls"})).is_empty());
        assert!(paths_of("read", &json!({})).is_empty());
        assert!(paths_of("mystery", &json!({"path": "a"})).is_empty());
    }

    #[test]
    fn lexical_resolution() {
        let root = Path::new("/ws");
        let home = Some(Path::new("/home/me"));
        assert_eq!(
            resolve_lexically("src/a.rs", root, home),
            PathBuf::from("/ws/src/a.rs")
        );
        assert_eq!(
            resolve_lexically("@src/../b", root, home),
            PathBuf::from("/ws/b")
        );
        assert_eq!(
            resolve_lexically("~/.cargo", root, home),
            PathBuf::from("/home/me/.cargo")
        );
        assert_eq!(
            resolve_lexically("/etc/../etc/x", root, home),
            PathBuf::from("/etc/x")
        );
        assert_eq!(
            resolve_lexically("../../..", root, home),
            PathBuf::from("/")
        );
        assert_eq!(
            resolve_lexically("file:///x", root, home),
            PathBuf::from("/x")
        );
        assert_eq!(resolve_lexically(".", root, home), PathBuf::from("/ws"));
        assert_eq!(
            lexical_accesses("ls", &json!({}), root, home),
            vec![PathAccess {
                canonical: "/ws".into(),
                op: Op::Read
            }]
        );
    }
}
