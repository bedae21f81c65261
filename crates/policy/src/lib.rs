//! `cordon-policy`: Cordon's policy engine: TOML policy compiled into tool-call decisions, redaction and the sandbox spec.
#![warn(missing_docs)]

pub mod error;
pub mod shell;
