//! `cordon-policy`: Cordon's policy engine. A declarative TOML file (docs/contract.md#policy-file)
//! is parsed, validated (errors name file, line and column) and compiled once into an immutable
//! [`CompiledPolicy`] that
//! - judges each tool call before it runs ([`CompiledPolicy::decide`] → [`PolicyDecision`]:
//!   `Allow < Ask < Deny`, the strictest matching rule wins, every decision names its rule
//!   `FILE:LINE` and gives the model a reason);
//! - analyses bash scripts with a real shell parser ([`shell`]) so command rules see every
//!   simple command, through wrappers, nesting and `bash -c` strings;
//! - redacts secrets from what the model sees after a call ([`Redactor`]);
//! - gives the backends the same file's OS-level view ([`CompiledPolicy::sandbox_spec`]).
//!
//! It also provides the audit log's hash chain ([`audit`]) and the text of `cordon policy
//! check/explain` ([`explain`]). It does no I/O beyond reading the policy file: the runtime
//! canonicalises paths through the backend (`cordon_ops::paths_of` says which arguments are
//! paths, `cordon_ops::paths::resolve_model_path` resolves them),
//! wires the decisions into `before_tool_call`/`after_tool_call`, and writes the audit file.
//!
//! ```
//! use std::path::Path;
//! use cordon_ops::paths::resolve_model_path;
//! use cordon_ops::paths_of;
//! use cordon_policy::{CompiledPolicy, Decision, DecisionRequest, EnvMap, PathAccess};
//!
//! let env: EnvMap = EnvMap::new(); // the runtime passes std::env::vars().collect()
//! let policy = CompiledPolicy::builtin_default(&env)?;
//! let args = serde_json::json!({"path": ".git/config", "content": "[core]"});
//! let root = Path::new("/ws");
//! // before_tool_call: the runtime canonicalises each path through the backend (symlinks
//! // resolved); lexical resolution stands in for it here.
//! let paths: Vec<PathAccess> = paths_of("write", &args)
//!     .into_iter()
//!     .map(|(path, op)| PathAccess { canonical: resolve_model_path(&path, root, None), op })
//!     .collect();
//! let request = DecisionRequest { tool: "write", args: &args, paths: &paths, root, home: None };
//! let decision = policy.decide(&request).non_interactive();
//! assert_eq!(decision.decision, Decision::Deny);
//! assert!(decision.block_message().starts_with("Blocked by policy (builtin:default.toml:"));
//! // after_tool_call: `policy.redactor().redact_result(&result)` gives the override, if any.
//! # Ok::<(), cordon_policy::PolicyError>(())
//! ```
#![warn(missing_docs)]

pub mod audit;
pub mod builtin;
mod decision;
pub mod error;
pub mod explain;
mod format;
mod glob;
mod paths;
mod policy;
pub mod redact;
pub mod shell;
pub mod show;

pub use builtin::{BUILTIN_POLICIES, BuiltinPolicy, PolicySource, UnknownBuiltin};
pub use decision::{Decision, DecisionRequest, PathAccess, PolicyDecision, RuleRef};
pub use error::PolicyError;
pub use paths::lexical_accesses;
pub use policy::{
    CompiledPolicy, DEFAULT_POLICY_NAME, DEFAULT_POLICY_TOML, EnvMap, MAX_POLICY_BYTES,
    read_policy_file,
};
pub use redact::Redactor;
