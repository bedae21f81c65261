//! `cordon-ops`: the vocabulary of a tool call, shared by the tools, the policy, the runtime
//! and every backend.
//!
//! It owns:
//! - the backend traits ([`FileOperations`], [`BashOperations`], [`SearchOperations`], bundled
//!   by [`Backend`]) and their plain request, result and error types;
//! - the names of the files Cordon itself leaves behind ([`leftovers`]) and the size bounds
//!   on the tools' model-controlled arguments ([`bounds`]).
//!
//! It does not own any tool, backend or policy logic, and depends on nothing heavier than
//! `cordon-core`, `serde` and `tokio`, so a backend compiles the vocabulary without the tools.
#![warn(missing_docs)]

mod backend;
pub mod bounds;
pub mod leftovers;

pub use backend::{
    Backend, BackendId, BashOperations, DirEntry, ExecError, ExecOutcome, ExecRequest, ExitStatus,
    FileKind, FileMeta, FileOperations, FindOutput, FindRequest, FsError, GrepFile, GrepLine,
    GrepOutput, GrepRequest, SearchError, SearchOperations, SpillWriter, Termination,
};
