//! Properties of argument preparation and validation on random JSON, for every tool's real
//! schema and `prepare_arguments`: nothing panics whatever the shape (deep nesting, wide
//! objects, huge strings, numbers as strings), accepted arguments validate again unchanged,
//! and the error text the model gets back stays small however large the input was.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use cordon_core::tool::AgentTool;
use cordon_core::validate::validate_tool_arguments;
use cordon_ops::{
    BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest, FindOutput, FindRequest,
    GrepOutput, GrepRequest, SearchError, SearchOperations,
};
use cordon_tools::bash::{BashOptions, BashTool};
use cordon_tools::edit::EditTool;
use cordon_tools::find::FindTool;
use cordon_tools::grep::GrepTool;
use cordon_tools::ls::LsTool;
use cordon_tools::read::{ReadOptions, ReadTool};
use cordon_tools::testing::StdFiles;
use cordon_tools::write::WriteTool;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::check;

/// Largest error text accepted, whatever the input: the violations (at most 20, each cut)
/// and a cut quotation of the arguments.
const MAX_ERROR_BYTES: usize = 64 * 1024;

/// Only `parameters()` and `prepare_arguments()` are used; running a command or a search
/// is not part of these properties.
struct Unused(BackendId);

#[async_trait]
impl BashOperations for Unused {
    fn backend_id(&self) -> &BackendId {
        &self.0
    }

    async fn exec(
        &self,
        _: ExecRequest,
        _: CancellationToken,
        _: mpsc::Sender<Vec<u8>>,
    ) -> Result<ExecOutcome, ExecError> {
        unreachable!("argument properties never run a command")
    }
}

#[async_trait]
impl SearchOperations for Unused {
    async fn grep(&self, _: GrepRequest, _: CancellationToken) -> Result<GrepOutput, SearchError> {
        unreachable!("argument properties never search")
    }

    async fn find(&self, _: FindRequest, _: CancellationToken) -> Result<FindOutput, SearchError> {
        unreachable!("argument properties never search")
    }
}

fn tools(root: &Path) -> Vec<Arc<dyn AgentTool>> {
    let files = Arc::new(StdFiles::new(root));
    let unused = Arc::new(Unused(BackendId::new("unused")));
    vec![
        Arc::new(ReadTool::new(files.clone(), ReadOptions::default())),
        Arc::new(BashTool::new(
            unused.clone(),
            files.clone(),
            BashOptions::default(),
        )),
        Arc::new(EditTool::new(files.clone())),
        Arc::new(WriteTool::new(files.clone())),
        Arc::new(GrepTool::new(unused.clone(), files.clone())),
        Arc::new(FindTool::new(unused, files.clone())),
        Arc::new(LsTool::new(files)),
    ]
}

/// Property names the tools know, plus near misses.
const KEYS: &[&str] = &[
    "path",
    "offset",
    "limit",
    "edits",
    "oldText",
    "newText",
    "content",
    "command",
    "timeout",
    "pattern",
    "glob",
    "ignoreCase",
    "literal",
    "context",
    "file_path",
    "old_text",
    "x",
    "",
];

/// Strings models send where numbers, booleans or JSON are expected.
const TEXTS: &[&str] = &[
    "5",
    "-1",
    "1e400",
    "0x10",
    "true",
    "false",
    "null",
    "",
    " ",
    "[]",
    "{}",
    "[{\"oldText\":\"a\",\"newText\":\"b\"}]",
    "{\"oldText\":\"a\",\"newText\":\"b\"}",
    "[\"{\\\"oldText\\\":1}\"]",
    "[{\"oldText\":\"a\n\",\"newText\":\"\t\"}]",
    "~/x",
    "@a",
    "file:///tmp",
    "\u{0}",
    "é\u{301}",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        select(TEXTS).prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        // A long string, made of a repeated piece (generation stays cheap).
        (select(TEXTS), 1000usize..20_000).prop_map(|(piece, n)| Value::from(piece.repeat(n))),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 96, 12, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..12).prop_map(Value::Array),
            prop::collection::vec((select(KEYS), inner), 0..12).prop_map(|entries| {
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(key, value)| (key.to_owned(), value))
                        .collect::<Map<String, Value>>(),
                )
            }),
        ]
    })
}

/// Arguments: mostly an object with the tools' keys, sometimes any value, sometimes a deep or
/// wide structure under a known key (as deep as JSON parsing lets a model nest: 128).
fn arguments() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => prop::collection::vec((select(KEYS), json_value()), 0..6).prop_map(|entries| {
            Value::Object(entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
        }),
        1 => json_value(),
        1 => (select(KEYS), 1usize..120).prop_map(|(key, depth)| {
            let mut value = Value::from("deep");
            for level in 0..depth {
                value = if level % 2 == 0 {
                    Value::Array(vec![value])
                } else {
                    Value::Object(Map::from_iter([(key.to_owned(), value)]))
                };
            }
            Value::Object(Map::from_iter([(key.to_owned(), value)]))
        }),
        1 => (select(KEYS), 2usize..48, 1usize..4).prop_map(|(key, width, depth)| {
            // Every level as wide as an excerpt shows, strings as long as it quotes.
            let mut value = Value::from("w".repeat(300));
            for _ in 0..depth {
                value = Value::Array(vec![value; width]);
            }
            Value::Object(Map::from_iter([(key.to_owned(), value)]))
        }),
    ]
}

#[test]
fn preparation_and_validation_never_panic_and_errors_stay_small() {
    let root = tempfile::tempdir().unwrap();
    let tools = tools(root.path());
    check(128, &arguments(), |args| {
        for tool in &tools {
            let prepared = tool.prepare_arguments(args.clone());
            match validate_tool_arguments(tool.name(), tool.parameters(), &prepared) {
                Ok(coerced) => {
                    // What validation accepted is accepted again, as it is.
                    let again = validate_tool_arguments(tool.name(), tool.parameters(), &coerced);
                    prop_assert_eq!(again.as_ref(), Ok(&coerced), "{}", tool.name());
                }
                Err(text) => prop_assert!(
                    text.len() <= MAX_ERROR_BYTES,
                    "{}: a {}-byte error for a {}-byte input",
                    tool.name(),
                    text.len(),
                    args.to_string().len()
                ),
            }
        }
        Ok(())
    });
}
