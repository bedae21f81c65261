//! Helpers shared by the test modules.

use std::path::{Path, PathBuf};

use cordon_ops::paths::resolve_model_path;
use cordon_ops::{Op, paths_of};
use cordon_policy::{CompiledPolicy, DecisionRequest, EnvMap, PathAccess, PolicyDecision};
use serde_json::{Value, json};

pub const ROOT: &str = "/ws";
pub const HOME: &str = "/home/agent";

/// Compile an inline policy named `test.toml`.
pub fn policy(text: &str) -> CompiledPolicy {
    CompiledPolicy::from_toml("test.toml", text, &EnvMap::new())
        .unwrap_or_else(|error| panic!("policy should compile: {error}"))
}

/// Compile a shipped policy from `policies/`.
pub fn shipped(name: &str) -> CompiledPolicy {
    let path = repo_root().join("policies").join(name);
    CompiledPolicy::load(&path, &EnvMap::new())
        .unwrap_or_else(|error| panic!("{name} should compile: {error}"))
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Judge a bash script.
pub fn bash(policy: &CompiledPolicy, script: &str) -> PolicyDecision {
    call(policy, "bash", &json!({ "command": script }))
}

/// Judge a call whose paths are resolved lexically against `/ws` (no symlinks involved).
pub fn call(policy: &CompiledPolicy, tool: &str, args: &Value) -> PolicyDecision {
    let paths: Vec<PathAccess> = paths_of(tool, args)
        .into_iter()
        .map(|(path, op)| PathAccess {
            canonical: resolve_model_path(&path, Path::new(ROOT), Some(Path::new(HOME))),
            op,
        })
        .collect();
    decide(policy, tool, args, &paths)
}

/// Judge a call with explicit canonical paths.
pub fn decide(
    policy: &CompiledPolicy,
    tool: &str,
    args: &Value,
    paths: &[PathAccess],
) -> PolicyDecision {
    policy.decide(&DecisionRequest {
        tool,
        args,
        paths,
        root: Path::new(ROOT),
        home: Some(Path::new(HOME)),
    })
}

pub fn access(path: &str, op: Op) -> PathAccess {
    PathAccess {
        canonical: PathBuf::from(path),
        op,
    }
}
