//! The seven tools by kind ([`ToolKind`]): their names, the orders they are listed in, and
//! which of their arguments are paths with the operation each implies ([`PathArg`], [`Op`]).
//! The policy judges, and the runtime resolves, exactly the paths listed here.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The operation a tool performs on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Reading a file or listing/searching a directory.
    Read,
    /// Creating or modifying a file.
    Write,
}

impl Op {
    /// `read` or `write`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }

    /// `reading` or `writing`, for messages.
    pub fn verb(self) -> &'static str {
        match self {
            Op::Read => "reading",
            Op::Write => "writing",
        }
    }
}

/// One of Cordon's tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolKind {
    /// `read`: a file's text or image.
    Read,
    /// `edit`: exact text replacements in a file.
    Edit,
    /// `write`: create or overwrite a file.
    Write,
    /// `bash`: run a command.
    Bash,
    /// `grep`: search file contents.
    Grep,
    /// `find`: search file names.
    Find,
    /// `ls`: list a directory.
    Ls,
}

/// A path argument of a tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathArg {
    /// The argument's name.
    pub name: &'static str,
    /// The path used when the argument is missing or not a string; `None` when the tool
    /// then names no path (its argument validation refuses the call).
    pub default: Option<&'static str>,
    /// What the tool does at that path, in order.
    pub ops: &'static [Op],
}

const PATH_READ: &[PathArg] = &[PathArg {
    name: "path",
    default: None,
    ops: &[Op::Read],
}];
const PATH_WRITE: &[PathArg] = &[PathArg {
    name: "path",
    default: None,
    ops: &[Op::Write],
}];
const PATH_READ_WRITE: &[PathArg] = &[PathArg {
    name: "path",
    default: None,
    ops: &[Op::Read, Op::Write],
}];
const PATH_OR_CWD_READ: &[PathArg] = &[PathArg {
    name: "path",
    default: Some("."),
    ops: &[Op::Read],
}];

impl ToolKind {
    /// Every tool, in the order policies and messages list them.
    pub const ALL: [ToolKind; 7] = [
        ToolKind::Read,
        ToolKind::Edit,
        ToolKind::Write,
        ToolKind::Bash,
        ToolKind::Grep,
        ToolKind::Find,
        ToolKind::Ls,
    ];

    /// Every tool, in the order the model sees them (docs/semantics.md#tools).
    pub const MODEL_ORDER: [ToolKind; 7] = [
        ToolKind::Read,
        ToolKind::Bash,
        ToolKind::Edit,
        ToolKind::Write,
        ToolKind::Grep,
        ToolKind::Find,
        ToolKind::Ls,
    ];

    /// The tool's name, as the model calls it and a policy names it.
    pub fn name(self) -> &'static str {
        match self {
            ToolKind::Read => "read",
            ToolKind::Edit => "edit",
            ToolKind::Write => "write",
            ToolKind::Bash => "bash",
            ToolKind::Grep => "grep",
            ToolKind::Find => "find",
            ToolKind::Ls => "ls",
        }
    }

    /// The tool called `name`, if it is one of Cordon's.
    pub fn from_name(name: &str) -> Option<ToolKind> {
        ToolKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The tool's path arguments: `path` for every tool but bash; `grep`, `find` and `ls`
    /// default to `.`; `edit` reads and then writes its file.
    pub fn path_args(self) -> &'static [PathArg] {
        match self {
            ToolKind::Read => PATH_READ,
            ToolKind::Write => PATH_WRITE,
            ToolKind::Edit => PATH_READ_WRITE,
            ToolKind::Grep | ToolKind::Find | ToolKind::Ls => PATH_OR_CWD_READ,
            ToolKind::Bash => &[],
        }
    }

    /// Whether the tool's calls name paths (path rules of a policy apply to it).
    pub fn takes_paths(self) -> bool {
        !self.path_args().is_empty()
    }

    /// The path argument strings of a call of this tool, unresolved, with what the tool does
    /// with each (see [`ToolKind::path_args`]).
    pub fn paths_in(self, args: &Value) -> Vec<(String, Op)> {
        let mut out = Vec::new();
        for arg in self.path_args() {
            let given = args.get(arg.name).and_then(Value::as_str);
            let Some(path) = given.or(arg.default) else {
                continue;
            };
            out.extend(arg.ops.iter().map(|op| (path.to_owned(), *op)));
        }
        out
    }
}

impl std::fmt::Display for ToolKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// [`ToolKind::paths_in`] for a tool named `tool`; tools that are not Cordon's name no paths.
pub fn paths_of(tool: &str, args: &Value) -> Vec<(String, Op)> {
    ToolKind::from_name(tool).map_or_else(Vec::new, |kind| kind.paths_in(args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_round_trip_and_orders_hold_every_tool_once() {
        for kind in ToolKind::ALL {
            assert_eq!(ToolKind::from_name(kind.name()), Some(kind));
            assert!(ToolKind::MODEL_ORDER.contains(&kind));
        }
        assert_eq!(ToolKind::from_name("Read"), None);
        assert_eq!(ToolKind::from_name("mystery"), None);
        let names: Vec<&str> = ToolKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            ["read", "edit", "write", "bash", "grep", "find", "ls"]
        );
        let names: Vec<&str> = ToolKind::MODEL_ORDER.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            ["read", "bash", "edit", "write", "grep", "find", "ls"]
        );
    }

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
                paths_of(tool, &json!({"path": 7})),
                vec![(".".into(), Op::Read)]
            );
            assert_eq!(
                paths_of(tool, &json!({"path": "src"})),
                vec![("src".into(), Op::Read)]
            );
        }
        assert!(paths_of("bash", &json!({"command": "ls", "path": "a"})).is_empty());
        assert!(paths_of("read", &json!({})).is_empty());
        assert!(paths_of("read", &json!({"path": 1})).is_empty());
        assert!(paths_of("mystery", &json!({"path": "a"})).is_empty());
        let path_tools: Vec<&str> = ToolKind::ALL
            .into_iter()
            .filter(|k| k.takes_paths())
            .map(ToolKind::name)
            .collect();
        assert_eq!(path_tools, ["read", "edit", "write", "grep", "find", "ls"]);
    }
}
