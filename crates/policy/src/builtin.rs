//! The shipped policies (`policies/*.toml`), built into the binary and addressable as
//! `builtin:NAME` or `builtin:NAME.toml` wherever a policy path is accepted, and
//! [`PolicySource`]: a policy argument told apart as a built-in name or a file path.
//!
//! It does not decide which policy applies when none is given (the CLI's discovery does).

use std::path::{Path, PathBuf};

/// The prefix that names a built-in policy instead of a file.
pub const BUILTIN_PREFIX: &str = "builtin:";

/// One shipped policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuiltinPolicy {
    /// Its name without prefix or extension (`default`, `ci-untrusted`, …).
    pub name: &'static str,
    /// The file's text, exactly as shipped.
    pub text: &'static str,
}

impl BuiltinPolicy {
    /// The name rule references and errors cite: `builtin:NAME.toml`.
    pub fn file_name(&self) -> String {
        format!("{BUILTIN_PREFIX}{}.toml", self.name)
    }
}

/// `policies/default.toml`: what an omitted policy means.
pub const DEFAULT_BUILTIN: BuiltinPolicy = BuiltinPolicy {
    name: "default",
    text: crate::policy::DEFAULT_POLICY_TOML,
};

/// Every shipped policy, sorted by name; `default` is what an omitted policy means.
pub const BUILTIN_POLICIES: &[BuiltinPolicy] = &[
    BuiltinPolicy {
        name: "build-host",
        text: include_str!("../../../policies/build-host.toml"),
    },
    BuiltinPolicy {
        name: "ci-untrusted",
        text: include_str!("../../../policies/ci-untrusted.toml"),
    },
    DEFAULT_BUILTIN,
    BuiltinPolicy {
        name: "readonly",
        text: include_str!("../../../policies/readonly.toml"),
    },
];

/// The built-in policy called `name` (`NAME` or `NAME.toml`, without the `builtin:` prefix).
pub fn builtin_policy(name: &str) -> Result<&'static BuiltinPolicy, UnknownBuiltin> {
    let bare = name.strip_suffix(".toml").unwrap_or(name);
    BUILTIN_POLICIES
        .iter()
        .find(|policy| policy.name == bare)
        .ok_or_else(|| UnknownBuiltin {
            name: name.to_owned(),
        })
}

/// A `builtin:NAME` that names no shipped policy.
#[derive(Debug, thiserror::Error)]
#[error(
    "failed to find the built-in policy builtin:{name}: the built-in policies are {}",
    available_names()
)]
pub struct UnknownBuiltin {
    /// The name asked for (without the prefix).
    pub name: String,
}

/// `builtin:a, builtin:b, …` for messages.
fn available_names() -> String {
    BUILTIN_POLICIES
        .iter()
        .map(|policy| format!("{BUILTIN_PREFIX}{}", policy.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where a policy comes from: a shipped one or a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicySource {
    /// A shipped policy.
    Builtin(&'static BuiltinPolicy),
    /// A file on the host.
    File(PathBuf),
}

impl PolicySource {
    /// A policy argument as given: `builtin:NAME[.toml]` is a shipped policy (an unknown name
    /// is an error listing the known ones), anything else a file path (`./builtin:x` names a
    /// file of that name).
    pub fn parse(argument: &Path) -> Result<PolicySource, UnknownBuiltin> {
        match argument
            .to_str()
            .and_then(|s| s.strip_prefix(BUILTIN_PREFIX))
        {
            Some(name) => builtin_policy(name).map(PolicySource::Builtin),
            None => Ok(PolicySource::File(argument.to_path_buf())),
        }
    }

    /// The built-in default policy.
    pub fn default_builtin() -> PolicySource {
        PolicySource::Builtin(&DEFAULT_BUILTIN)
    }

    /// How the source is written on the command line and in rule references.
    pub fn display_name(&self) -> String {
        match self {
            PolicySource::Builtin(policy) => policy.file_name(),
            PolicySource::File(path) => path.display().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_policy_file_is_built_in_under_its_name() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter_map(|name| name.strip_suffix(".toml").map(str::to_owned))
            .collect();
        on_disk.sort();
        let built_in: Vec<&str> = BUILTIN_POLICIES.iter().map(|p| p.name).collect();
        assert_eq!(on_disk, built_in);
        for policy in BUILTIN_POLICIES {
            let text = std::fs::read_to_string(dir.join(format!("{}.toml", policy.name))).unwrap();
            assert_eq!(policy.text, text, "{}", policy.name);
        }
    }

    #[test]
    fn builtin_names_parse_with_and_without_the_extension_and_others_are_files() {
        let default = PolicySource::default_builtin();
        assert_eq!(default.display_name(), "builtin:default.toml");
        assert_eq!(
            PolicySource::parse(Path::new("builtin:default")).unwrap(),
            default
        );
        assert_eq!(
            PolicySource::parse(Path::new("builtin:default.toml")).unwrap(),
            default
        );
        assert_eq!(
            PolicySource::parse(Path::new("./builtin:default")).unwrap(),
            PolicySource::File(PathBuf::from("./builtin:default"))
        );
        let error = PolicySource::parse(Path::new("builtin:nope")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "failed to find the built-in policy builtin:nope: the built-in policies are \
             builtin:build-host, builtin:ci-untrusted, builtin:default, builtin:readonly"
        );
    }
}
