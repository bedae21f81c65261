//! The paths of a call resolved lexically ([`lexical_accesses`]), for callers without a
//! backend such as `cordon policy explain`. Which arguments are paths is
//! `cordon_ops::paths_of`; the resolver is `cordon_ops::paths::resolve_model_path`, the one the
//! tools and the runtime use, so explain judges the path the tool would open. The runtime
//! resolves the same way and then canonicalises through the backend, so that symlinks are
//! followed: the policy judges canonical paths only.

use std::path::Path;

use cordon_ops::paths::resolve_model_path;
use cordon_ops::{ToolKind, paths_of};
use serde_json::Value;

use crate::decision::PathAccess;

/// Whether `tool` is one of Cordon's tools whose calls name paths (path rules apply to it).
pub(crate) fn is_path_tool(tool: &str) -> bool {
    ToolKind::from_name(tool).is_some_and(ToolKind::takes_paths)
}

/// The names of the tools `keep` selects, in listing order, joined by `, ` (for messages).
pub(crate) fn tool_names(keep: impl Fn(ToolKind) -> bool) -> String {
    let names: Vec<&str> = ToolKind::ALL
        .into_iter()
        .filter(|kind| keep(*kind))
        .map(ToolKind::name)
        .collect();
    names.join(", ")
}

/// The path arguments of a call ([`cordon_ops::paths_of`]) resolved with
/// [`resolve_model_path`] against `root`, WITHOUT touching the filesystem: symlinks are not
/// followed, so the result is only as good as the caller's knowledge of the tree (`explain`
/// says so in its output).
pub fn lexical_accesses(
    tool: &str,
    args: &Value,
    root: &Path,
    home: Option<&Path>,
) -> Vec<PathAccess> {
    paths_of(tool, args)
        .into_iter()
        .map(|(path, op)| PathAccess {
            canonical: resolve_model_path(&path, root, home),
            op,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use cordon_ops::Op;
    use serde_json::json;

    use super::*;

    #[test]
    fn lexical_resolution() {
        let root = Path::new("/ws");
        let home = Some(Path::new("/home/me"));
        let one = |tool: &str, args: Value| lexical_accesses(tool, &args, root, home);
        let access = |path: &str, op| PathAccess {
            canonical: PathBuf::from(path),
            op,
        };
        assert_eq!(
            one("read", json!({"path": "src/a.rs"})),
            [access("/ws/src/a.rs", Op::Read)]
        );
        assert_eq!(
            one("edit", json!({"path": "@src/../b"})),
            [access("/ws/b", Op::Read), access("/ws/b", Op::Write)]
        );
        assert_eq!(
            one("write", json!({"path": "~/.cargo"})),
            [access("/home/me/.cargo", Op::Write)]
        );
        assert_eq!(
            one("read", json!({"path": "/etc/../etc/x"})),
            [access("/etc/x", Op::Read)]
        );
        assert_eq!(
            one("ls", json!({"path": "../../.."})),
            [access("/", Op::Read)]
        );
        assert_eq!(
            one("read", json!({"path": "file:///a%20b"})),
            [access("/a b", Op::Read)]
        );
        assert_eq!(
            one("read", json!({"path": "a\u{a0}b"})),
            [access("/ws/a b", Op::Read)]
        );
        assert_eq!(one("ls", json!({})), [access("/ws", Op::Read)]);
        assert_eq!(one("bash", json!({"command": "cat a"})), []);
    }
}
