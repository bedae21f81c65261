//! `cordon-ops`: the vocabulary of a tool call, shared by the tools, the policy, the runtime
//! and every backend.
//!
//! It owns:
//! - the backend traits ([`FileOperations`], [`BashOperations`], [`SearchOperations`], bundled
//!   by [`Backend`]) and their plain request, result and error types;
//! - the tools by kind ([`ToolKind`]): names, the orders they are listed in, and which
//!   arguments are paths with the operation each implies ([`paths_of`], [`Op`]);
//! - the one resolver for model-supplied paths ([`paths::resolve_model_path`]), used by the
//!   tools, by the runtime for what it hands the policy, and by `cordon policy explain`;
//! - the record of one connection attempt through the egress proxy ([`EgressRecord`]);
//! - the names of the files Cordon itself leaves behind ([`leftovers`]) and the size bounds
//!   on the tools' model-controlled arguments ([`bounds`]).
//!
//! It does not own any tool, backend or policy logic, and depends on nothing heavier than
//! `cordon-core`, `cordon-egress` (for the proxy's event type; itself only `tokio`), `serde` and
//! `tokio`, so a backend compiles the vocabulary without the tools.
#![warn(missing_docs)]

mod backend;
pub mod bounds;
pub mod denial;
mod egress;
pub mod leftovers;
pub mod paths;
mod tool;

pub use backend::{
    Backend, BackendId, BashOperations, DirEntry, ExecError, ExecOutcome, ExecRequest, ExitStatus,
    FileKind, FileMeta, FileOperations, FindOutput, FindRequest, FsError, GrepFile, GrepLine,
    GrepOutput, GrepRequest, SearchError, SearchOperations, ShutdownError, SpillWriter,
    Termination,
};
pub use egress::{
    EgressAsked, EgressEntrySpecs, EgressLog, EgressOutcome, EgressProtocol, EgressRecord,
    egress_entry_specs, egress_rules,
};
pub use tool::{Op, PathArg, ToolKind, paths_of};
