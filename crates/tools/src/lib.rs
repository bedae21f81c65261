//! `cordon-tools`: the tools a model calls (read, edit, write, bash, grep, find, ls), written
//! only against the backend traits of `cordon-ops`, plus what they share: output truncation,
//! the per-file mutation queue and the grep/find output formatter.
//!
//! It does not know any concrete backend: local, docker and ssh implement the `cordon-ops`
//! traits and get every tool with identical behaviour.
//!
//! Process-wide state, on purpose and the only such state here: the mutation queue's chains
//! ([`queue`]) are one map per process, keyed by backend id and canonical path, so that two
//! sessions or two tool sets over the same backend still write one file strictly one after the
//! other; a key's entry is removed as soon as nobody holds or waits for it. The image decode
//! budget ([`decode_gate`]) is shared by every decode in the process because it bounds the
//! process's memory. Compiled JSON schemas are cached once and never change.
#![warn(missing_docs)]

pub mod bash;
pub mod decode_gate;
pub mod edit;
pub mod edit_diff;
mod file_tool;
pub mod find;
pub mod grep;
pub mod image;
pub mod ls;
pub mod output;
pub mod paths;
pub mod queue;
pub mod read;
pub mod sanitize;
pub mod search_format;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod truncate;
pub mod write;
