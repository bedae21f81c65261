//! What a `git` command line makes git run besides itself: settings given with `-c` /
//! `--config-env` (or written with `git config`, or passed as `GIT_CONFIG_KEY_<n>`) that name
//! a program (`core.pager`, `diff.external`, `alias.x=!…`, `credential.helper`, …), and
//! subcommand options whose value is a command (`rebase --exec`, `bisect run`,
//! `clone --upload-pack`, `submodule foreach`, …).
//!
//! A setting that names a program is analysed as that program running; one that loads more
//! settings or hooks from a file (`include.path`, `core.hooksPath`, `protocol.*.allow`) or whose
//! value is only known at run time makes the script unanalysable. Settings git reads from its
//! configuration files are not visible here: those files are protected or outside the
//! sandbox's reach, which is the OS layer's job.

use super::runners::option_values;
use super::{Analyser, Word};

/// How a git setting is used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum GitSetting {
    /// Not a program.
    Inert,
    /// A command line git runs through a shell (a leading `!` is dropped).
    Script,
    /// `credential.helper`: `!cmd`, a path, or a name `git credential-NAME`.
    Credential,
    /// `alias.NAME`: `!cmd` runs a shell command, anything else is git arguments.
    Alias(String),
    /// Loads settings, hooks or transports the analyser cannot see.
    Opaque(&'static str),
}

/// Keys (lower-case) whose value is a command line.
const SCRIPT_KEYS: &[&str] = &[
    "core.pager",
    "core.editor",
    "core.sshcommand",
    "core.askpass",
    "core.fsmonitor",
    "core.gitproxy",
    "sequence.editor",
    "diff.external",
    "gpg.program",
    "uploadpack.packobjectshook",
    "instaweb.httpd",
    "sendemail.smtpserver",
    "sendemail.tocmd",
    "sendemail.cccmd",
    "sendemail.sendmailcmd",
];

/// Last key components (with a subsection) whose value is a command line: `diff.<driver>.
/// textconv`, `filter.<driver>.clean`, `merge.<driver>.driver`, `difftool.<tool>.cmd`,
/// `remote.<name>.uploadpack`, `gpg.<format>.program`, `man.<tool>.path`, ….
const SCRIPT_NAMES: &[&str] = &[
    "textconv",
    "command",
    "cmd",
    "driver",
    "clean",
    "smudge",
    "process",
    "program",
    "uploadpack",
    "receivepack",
    "path",
    "update",
];

/// Key endings that name a program in any section: a setting added by a later git version
/// with one of these names is judged as a program rather than ignored.
const SCRIPT_SUFFIXES: &[&str] = &[
    "cmd", "command", "program", "hook", "editor", "pager", "helper", "askpass", "proxy",
];

/// How the setting `key` is used by git.
pub(super) fn classify_git_key(key: &str) -> GitSetting {
    let lower = key.to_ascii_lowercase();
    let parts: Vec<&str> = lower.split('.').collect();
    let (section, name) = match (parts.first(), parts.last()) {
        (Some(section), Some(name)) if parts.len() >= 2 => (*section, *name),
        _ => return GitSetting::Inert,
    };
    match section {
        "alias" => return GitSetting::Alias(lower["alias.".len()..].to_owned()),
        "include" | "includeif" => {
            return GitSetting::Opaque("reads more settings from a file the analyser cannot see");
        }
        "protocol" => {
            return GitSetting::Opaque("can enable transports that run commands (`ext::`)");
        }
        "credential" if name == "helper" => return GitSetting::Credential,
        "pager" => return GitSetting::Script,
        _ => {}
    }
    if lower == "core.hookspath" {
        return GitSetting::Opaque("runs hooks from a directory the analyser cannot see");
    }
    if lower.starts_with("remote.") && name == "vcs" {
        return GitSetting::Opaque("runs a remote helper program named by the setting");
    }
    if SCRIPT_KEYS.contains(&lower.as_str())
        || (parts.len() >= 3 && SCRIPT_NAMES.contains(&name))
        || SCRIPT_SUFFIXES.iter().any(|suffix| name.ends_with(suffix))
    {
        return GitSetting::Script;
    }
    GitSetting::Inert
}

/// Values that switch a setting on or off rather than name a program (`core.fsmonitor=true`,
/// `pager.log=false`).
fn is_boolean(value: &str) -> bool {
    matches!(
        value.to_ascii_lowercase().as_str(),
        "" | "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0"
    )
}

impl Analyser {
    /// Judge the setting `key=value` (`value` `None`: only known at run time) as the program
    /// it makes git run. Aliases that are git arguments are returned for the caller.
    fn git_setting(
        &mut self,
        key: &str,
        value: Option<&str>,
        depth: usize,
    ) -> Result<Option<(String, String)>, String> {
        let setting = classify_git_key(key);
        let label = format!("git setting {key}");
        match (&setting, value) {
            (GitSetting::Inert, _) => Ok(None),
            (GitSetting::Opaque(why), _) => Err(format!("the git setting `{key}` {why}")),
            (_, None) => Err(format!(
                "the git setting `{key}` names a program and its value is only known at run time"
            )),
            (GitSetting::Script, Some(value)) => {
                if !is_boolean(value) {
                    let script = value.strip_prefix('!').unwrap_or(value);
                    self.within(label, |analyser| analyser.script(script, depth + 1));
                }
                Ok(None)
            }
            (GitSetting::Credential, Some(value)) => {
                let script = match value.strip_prefix('!') {
                    Some(script) => script.to_owned(),
                    None if value.is_empty() => return Ok(None),
                    None if value.starts_with(['/', '~', '.']) => value.to_owned(),
                    None => format!("git-credential-{value}"),
                };
                self.within(label, |analyser| analyser.script(&script, depth + 1));
                Ok(None)
            }
            (GitSetting::Alias(name), Some(value)) => match value.strip_prefix('!') {
                Some(script) => {
                    self.within(label, |analyser| analyser.script(script, depth + 1));
                    Ok(None)
                }
                None => Ok(Some((name.clone(), value.to_owned()))),
            },
        }
    }

    /// Look inside a `git` command line (already recorded as itself).
    pub(super) fn git(&mut self, args: &[Word], depth: usize) -> Result<(), String> {
        let mut aliases: Vec<(String, String)> = Vec::new();
        let mut i = 0;
        while i < args.len() {
            // A run-time word here is matched by rules as a possible subcommand (`git $x`
            // is a possible `git push`); it cannot be `-c` and its value in one word.
            let Word::Literal(text) = &args[i] else {
                return Ok(());
            };
            let text = text.as_str();
            let next = || match args.get(i + 1) {
                Some(Word::Literal(value)) => Ok(value.as_str()),
                Some(Word::Dynamic(source)) => Err(format!(
                    "`git {text} {source}` is computed at run time and could set a program git runs"
                )),
                None => Err(format!("`git {text}` is missing its value")),
            };
            match text {
                "-c" => {
                    let (key, value) = split_setting(next()?);
                    aliases.extend(self.git_setting(key, Some(value), depth)?);
                    i += 2;
                }
                "--config-env" => {
                    let (key, _) = split_setting(next()?);
                    self.git_setting(key, None, depth)?;
                    i += 2;
                }
                "-C" | "--git-dir" | "--work-tree" | "--namespace" | "--super-prefix"
                | "--list-cmds" | "--attr-source" => i += 2,
                _ if text.starts_with("--config-env=") => {
                    let (key, _) = split_setting(&text["--config-env=".len()..]);
                    self.git_setting(key, None, depth)?;
                    i += 1;
                }
                _ if text.starts_with("--exec-path=") => {
                    return Err(
                        "`git --exec-path=…` runs git's subcommands from a directory the analyser cannot see"
                            .to_owned(),
                    );
                }
                _ if text.starts_with('-') => i += 1,
                _ => break,
            }
        }
        let Some(Word::Literal(subcommand)) = args.get(i) else {
            return Ok(());
        };
        let rest = &args[i + 1..];
        let lower = subcommand.to_ascii_lowercase();
        if let Some((_, value)) = aliases.iter().rev().find(|(name, _)| *name == lower) {
            let words = super::wrappers::split_literal_words(value).ok_or_else(|| {
                format!("the git alias `{subcommand}` expands to text the analyser cannot resolve")
            })?;
            let mut argv = vec![Word::Literal("git".to_owned())];
            argv.extend(words);
            argv.extend(rest.iter().cloned());
            let label = format!("git alias {subcommand}");
            self.within(label, |analyser| analyser.run(argv, depth));
            return Ok(());
        }
        self.git_subcommand(subcommand, rest, depth)
    }

    fn git_subcommand(
        &mut self,
        subcommand: &str,
        args: &[Word],
        depth: usize,
    ) -> Result<(), String> {
        let label = format!("git {subcommand}");
        let scripts: Vec<String> = match subcommand {
            "rebase" => option_values(args, "git", "x", &["exec"])?,
            "difftool" | "mergetool" => option_values(args, "git", "x", &["extcmd"])?,
            "clone" => {
                for setting in option_values(args, "git", "c", &["config"])? {
                    let (key, value) = split_setting(&setting);
                    self.git_setting(key, Some(value), depth)?;
                }
                if !option_values(args, "git", "", &["template"])?.is_empty() {
                    return Err(
                        "`git clone --template` installs hooks from a directory the analyser cannot see"
                            .to_owned(),
                    );
                }
                option_values(args, "git", "u", &["upload-pack"])?
            }
            "init" => {
                if !option_values(args, "git", "", &["template"])?.is_empty() {
                    return Err(
                        "`git init --template` installs hooks from a directory the analyser cannot see"
                            .to_owned(),
                    );
                }
                Vec::new()
            }
            "fetch" | "pull" | "ls-remote" => option_values(args, "git", "", &["upload-pack"])?,
            "push" => option_values(args, "git", "", &["receive-pack", "exec"])?,
            "archive" => option_values(args, "git", "", &["exec"])?,
            "filter-branch" => option_values(
                args,
                "git",
                "",
                &[
                    "env-filter",
                    "tree-filter",
                    "index-filter",
                    "parent-filter",
                    "msg-filter",
                    "commit-filter",
                    "tag-name-filter",
                ],
            )?,
            "bisect" if args.first().and_then(Word::literal) == Some("run") => {
                let argv = args[1..].to_vec();
                self.within(label, |analyser| analyser.run(argv, depth));
                return Ok(());
            }
            "submodule" => match args
                .iter()
                .position(|word| word.literal() == Some("foreach"))
            {
                Some(index) => {
                    let words = args[index + 1..]
                        .iter()
                        .filter(|word| {
                            !matches!(word.literal(), Some("--recursive" | "-q" | "--quiet"))
                        })
                        .map(|word| word.literal().map(str::to_owned))
                        .collect::<Option<Vec<String>>>()
                        .ok_or_else(|| {
                            "`git submodule foreach` is given a command computed at run time"
                                .to_owned()
                        })?;
                    vec![words.join(" ")]
                }
                None => Vec::new(),
            },
            "config" => {
                self.git_config(args, depth)?;
                Vec::new()
            }
            _ => Vec::new(),
        };
        for script in scripts {
            self.within(label.clone(), |analyser| {
                analyser.script(&script, depth + 1)
            });
        }
        Ok(())
    }

    /// `git config [--global …] KEY VALUE` / `git config set KEY VALUE`: a setting that names a
    /// program is judged as that program running (later git commands will run it).
    fn git_config(&mut self, args: &[Word], depth: usize) -> Result<(), String> {
        let mut operands: Vec<&Word> = Vec::new();
        let mut i = 0;
        while i < args.len() {
            match args[i].literal() {
                Some(
                    "-f" | "--file" | "--blob" | "--type" | "--default" | "--comment" | "--value",
                ) => {
                    i += 2;
                    continue;
                }
                Some(text) if text.starts_with('-') => {}
                Some("set" | "add" | "replace-all") if operands.is_empty() => {}
                _ => operands.push(&args[i]),
            }
            i += 1;
        }
        if let [key, value, ..] = operands.as_slice() {
            let Some(key) = key.literal() else {
                return Err(
                    "`git config` sets a setting whose name is computed at run time".to_owned(),
                );
            };
            self.git_setting(key, value.literal(), depth)?;
        }
        Ok(())
    }
}

/// `key=value`; a key alone means `true`.
fn split_setting(text: &str) -> (&str, &str) {
    text.split_once('=').unwrap_or((text, "true"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shell::test_support::{found, reasons};

    #[test]
    fn settings_are_classified() {
        let cases: &[(&str, GitSetting)] = &[
            ("core.pager", GitSetting::Script),
            ("core.fsmonitor", GitSetting::Script),
            ("core.sshCommand", GitSetting::Script),
            ("core.editor", GitSetting::Script),
            ("sequence.editor", GitSetting::Script),
            ("diff.external", GitSetting::Script),
            ("diff.pdf.textconv", GitSetting::Script),
            ("filter.lfs.smudge", GitSetting::Script),
            ("merge.ours.driver", GitSetting::Script),
            ("difftool.x.cmd", GitSetting::Script),
            ("pager.log", GitSetting::Script),
            ("gpg.ssh.program", GitSetting::Script),
            ("remote.origin.uploadpack", GitSetting::Script),
            ("credential.helper", GitSetting::Credential),
            ("credential.https://x.helper", GitSetting::Credential),
            ("alias.p", GitSetting::Alias("p".to_owned())),
            (
                "core.hooksPath",
                GitSetting::Opaque("runs hooks from a directory the analyser cannot see"),
            ),
            ("user.name", GitSetting::Inert),
            ("color.ui", GitSetting::Inert),
            ("x", GitSetting::Inert),
        ];
        for (key, expected) in cases {
            assert_eq!(&classify_git_key(key), expected, "{key}");
        }
        assert!(matches!(
            classify_git_key("include.path"),
            GitSetting::Opaque(_)
        ));
        assert!(matches!(
            classify_git_key("protocol.ext.allow"),
            GitSetting::Opaque(_)
        ));
        assert!(matches!(
            classify_git_key("remote.x.vcs"),
            GitSetting::Opaque(_)
        ));
    }

    #[test]
    fn settings_that_name_programs_are_judged_as_those_programs() {
        let cases: &[(&str, &str)] = &[
            ("git -c core.pager='git push' log", "git push"),
            ("git -c core.fsmonitor='hook arg' status", "hook arg"),
            ("git -c core.sshCommand='ssh -i k' fetch", "ssh -i k"),
            ("git -c alias.x='!git push' x", "git push"),
            ("git -c alias.p=push p origin", "git push origin"),
            ("git -c diff.external=evil diff", "evil"),
            (
                "git -c credential.helper=store push",
                "git-credential-store",
            ),
            (
                "git -c credential.helper='!f() { git push; }; f' fetch",
                "git push",
            ),
            ("git -c core.editor=nano commit", "nano"),
            ("git -c sequence.editor=cat rebase -i", "cat"),
            ("git config core.pager 'git push'", "git push"),
            ("git config set --global core.pager 'git push'", "git push"),
            ("git rebase --exec 'git push' main", "git push"),
            ("git rebase -x 'git push' main", "git push"),
            ("git rebase --exe='git push' main", "git push"),
            ("git bisect run git push", "git push"),
            ("git submodule foreach git push", "git push"),
            ("git clone -u 'git push' ./a b", "git push"),
            ("git clone -c core.pager='git push' ./a b", "git push"),
            ("git fetch --upload-pack='git push' ./a", "git push"),
            ("git push --receive-pack='git push' ./a", "git push"),
            ("git difftool -x 'git push'", "git push"),
            (
                "git filter-branch --tree-filter 'git push' HEAD",
                "git push",
            ),
        ];
        for (script, inner) in cases {
            let commands = found(script);
            assert!(
                commands.iter().any(|c| c == inner),
                "{script}: {commands:?} {}",
                reasons(script)
            );
            assert_eq!(reasons(script), "", "{script}");
        }
        assert_eq!(
            found("git -c core.fsmonitor=true status"),
            ["git -c core.fsmonitor=true status"]
        );
        assert_eq!(
            found("git -c user.name=x commit"),
            ["git -c user.name=x commit"]
        );
        assert_eq!(found("git config core.pager"), ["git config core.pager"]);
        assert_eq!(found("git log --exec=x"), ["git log --exec=x"]);
    }

    #[test]
    fn unresolvable_settings_are_unanalysable() {
        assert!(reasons("git --config-env=core.pager=P log").contains("core.pager"));
        assert!(reasons("git --config-env core.pager=P log").contains("core.pager"));
        assert!(reasons("git -c include.path=x log").contains("include.path"));
        assert!(reasons("git -c core.hooksPath=h commit").contains("hooks"));
        assert!(reasons("git -c protocol.ext.allow=always clone x").contains("transports"));
        assert!(reasons("git -c \"$kv\" log").contains("run time"));
        assert!(reasons("git --exec-path=./x log").contains("exec-path"));
        assert!(reasons("git clone --template=t x").contains("template"));
        assert!(reasons("git rebase --exec \"$c\" main").contains("run time"));
        assert!(reasons("git config core.pager \"$p\"").contains("run time"));
        assert_eq!(reasons("git --config-env=user.name=N log"), "");
    }
}
