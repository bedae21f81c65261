//! Integration tests of the policy engine: table-driven decisions, the obfuscation set,
//! symlink smuggling, the shipped policies, load errors, redaction, the audit chain,
//! `explain`/`check` output, the sandbox spec, and properties of loading random and mutated
//! policy files.

#[path = "all/audit.rs"]
mod audit;
#[path = "all/coverage.rs"]
mod coverage;
#[path = "all/decisions.rs"]
mod decisions;
#[path = "all/differential.rs"]
mod differential;
#[path = "all/errors.rs"]
mod errors;
#[path = "all/explain.rs"]
mod explain;
#[path = "all/fuzz.rs"]
mod fuzz;
#[path = "all/obfuscation.rs"]
mod obfuscation;
#[path = "all/properties.rs"]
mod properties;
#[path = "all/redaction.rs"]
mod redaction;
#[path = "all/shipped.rs"]
mod shipped;
#[path = "all/spec.rs"]
mod spec;
#[path = "all/support.rs"]
mod support;
#[path = "all/symlinks.rs"]
mod symlinks;
