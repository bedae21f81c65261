//! Environment variables that decide what a later command runs. Reviewed data: one entry per
//! variable (or family), each with a unit test in this module.
//!
//! Two kinds matter. Some hold a command line another program runs (`GIT_EXTERNAL_DIFF`,
//! `PAGER`, `RUSTC_WRAPPER`, …): a literal value is analysed as that command running, a value
//! only known at run time is unanalysable. The others load code or settings from a place the
//! analyser cannot read (`LD_PRELOAD`, `PYTHONPATH`, `NODE_OPTIONS`, `HOME` for `~/.gitconfig`,
//! …): assigning them at all makes the script unanalysable.

use super::git::{GitSetting, classify_git_key};

/// What assigning a variable does to the commands that follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Effect {
    /// Nothing the analyser needs to know.
    Inert,
    /// The value is a command line some program runs through a shell.
    Command,
    /// The value names a git setting (`GIT_CONFIG_KEY_<n>`): judged by the key.
    GitKey,
    /// The value is read as code or points at code or settings the analyser cannot see.
    Opaque,
}

/// Variables whose value is a command line a program runs (git, ssh, pagers, editors, cargo).
const COMMAND_VARIABLES: &[&str] = &[
    // git
    "GIT_EXTERNAL_DIFF",
    "GIT_SSH_COMMAND",
    "GIT_SSH",
    "GIT_PROXY_COMMAND",
    "GIT_ASKPASS",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    // ssh, sudo
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    // pagers, editors, viewers
    "PAGER",
    "MANPAGER",
    "SYSTEMD_PAGER",
    "EDITOR",
    "VISUAL",
    "BROWSER",
    "LESSOPEN",
    "LESSCLOSE",
    // cargo and rustc
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTDOC",
    "CARGO_BUILD_RUSTC",
    "CARGO_BUILD_RUSTC_WRAPPER",
    "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTDOC",
    "CARGO_REGISTRY_CREDENTIAL_PROVIDER",
    // npm runs package scripts with this shell
    "NPM_CONFIG_SCRIPT_SHELL",
];

/// Variables that load code, or settings that may name programs, from somewhere the analyser
/// cannot read.
const OPAQUE_VARIABLES: &[&str] = &[
    // program lookup and the dynamic loader
    "PATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "GCONV_PATH",
    // bash itself
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "BASH_LOADABLES_PATH",
    "EXECIGNORE",
    "ZDOTDIR",
    // interpreters' startup code and module paths
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "PERL5DB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    // settings files that may name programs (pagers, runners, hooks)
    "HOME",
    "XDG_CONFIG_HOME",
    "GIT_CONFIG",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_PARAMETERS",
    "GIT_EXEC_PATH",
    "GIT_TEMPLATE_DIR",
    // git reads the repository config (hooks, pagers, filters) of the repository they name
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    // options read from the environment or a file: `tar --to-command`, `rg --pre`
    "TAR_OPTIONS",
    "RIPGREP_CONFIG_PATH",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "GOFLAGS",
    "GOROOT",
];

/// What assigning `name` does.
pub(super) fn effect(name: &str) -> Effect {
    if COMMAND_VARIABLES.contains(&name) {
        return Effect::Command;
    }
    if OPAQUE_VARIABLES.contains(&name) {
        return Effect::Opaque;
    }
    if name.starts_with("GIT_CONFIG_KEY_") {
        return Effect::GitKey;
    }
    // `CARGO_TARGET_<triple>_RUNNER` / `_LINKER`, `CARGO_REGISTRIES_<name>_CREDENTIAL_PROVIDER`.
    if (name.starts_with("CARGO_TARGET_")
        && (name.ends_with("_RUNNER") || name.ends_with("_LINKER")))
        || (name.starts_with("CARGO_REGISTRIES_") && name.ends_with("_CREDENTIAL_PROVIDER"))
    {
        return Effect::Command;
    }
    Effect::Inert
}

/// The command line a [`Effect::Command`] variable's value runs (`LESSOPEN='|lesspipe %s'`
/// runs `lesspipe %s`).
pub(super) fn command_line(name: &str, value: &str) -> String {
    match name {
        "LESSOPEN" | "LESSCLOSE" => value.trim_start_matches(['|', '-']).to_owned(),
        _ => value.to_owned(),
    }
}

/// Whether a `GIT_CONFIG_KEY_<n>` value names a setting that runs a program.
pub(super) fn git_key_runs_program(key: &str) -> bool {
    !matches!(classify_git_key(key), GitSetting::Inert)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_variable_is_judged_as_a_command() {
        for name in COMMAND_VARIABLES {
            assert_eq!(effect(name), Effect::Command, "{name}");
            let analysis = super::super::analyse_script(&format!("{name}='git push' true"));
            assert!(
                analysis
                    .commands
                    .iter()
                    .any(|c| c.to_string() == "git push"),
                "{name}: {:?}",
                analysis.commands
            );
            let analysis = super::super::analyse_script(&format!("{name}=\"$x\" true"));
            assert!(!analysis.is_complete(), "{name} with a run-time value");
        }
        for name in [
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER",
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER",
            "CARGO_REGISTRIES_MINE_CREDENTIAL_PROVIDER",
        ] {
            assert_eq!(effect(name), Effect::Command, "{name}");
        }
        assert_eq!(command_line("LESSOPEN", "||lesspipe %s"), "lesspipe %s");
    }

    #[test]
    fn every_opaque_variable_makes_the_script_unanalysable() {
        for name in OPAQUE_VARIABLES {
            assert_eq!(effect(name), Effect::Opaque, "{name}");
            let analysis = super::super::analyse_script(&format!("{name}=x true"));
            assert!(
                analysis.unanalysable.iter().any(|r| r.contains(name)),
                "{name}: {:?}",
                analysis.unanalysable
            );
        }
    }

    #[test]
    fn git_config_keys_are_judged_by_the_setting() {
        assert_eq!(effect("GIT_CONFIG_KEY_0"), Effect::GitKey);
        assert!(git_key_runs_program("diff.external"));
        assert!(git_key_runs_program("Core.Pager"));
        assert!(!git_key_runs_program("user.name"));
        assert_eq!(effect("GIT_CONFIG_VALUE_0"), Effect::Inert);
        assert_eq!(effect("GIT_CONFIG_COUNT"), Effect::Inert);
        assert_eq!(effect("FOO"), Effect::Inert);
    }
}
