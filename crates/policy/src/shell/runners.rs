//! Programs that are commands of their own but also run a command named in an option or
//! argument: `tar --to-command`, `rsync -e`, `ssh -o ProxyCommand=…`, `rg --pre`,
//! `sort --compress-program`, `go test -exec`, GNU `parallel`, and the ones whose own language
//! can start programs (`gdb`, `awk`'s `system()`, `sed`'s `e`, `cargo --config`), which are
//! unanalysable unless their arguments show they cannot.
//!
//! Each function runs after the command itself was recorded; a returned `Err` is the reason
//! the script is unanalysable.

use super::{Analyser, SimpleCommand, Word};

/// The literal text of `word`, or why it cannot be judged.
fn literal<'a>(word: &'a Word, program: &str) -> Result<&'a str, String> {
    match word {
        Word::Literal(text) => Ok(text),
        Word::Dynamic(source) => Err(format!(
            "`{program}` is given `{source}`, computed at run time, where a command could be named"
        )),
    }
}

/// Values of the given options anywhere in `args`. Long options may be abbreviated (GNU
/// getopt and git accept any unambiguous prefix), so a prefix of two or more characters counts.
/// In a short-option cluster the first letter from `short` takes the rest, or the next word.
pub(super) fn option_values(
    args: &[Word],
    program: &str,
    short: &str,
    long: &[&str],
) -> Result<Vec<String>, String> {
    let mut values = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let Some(text) = args[i].literal() else {
            i += 1;
            continue;
        };
        if text == "--" {
            break;
        }
        let value_at = |index: usize| match args.get(index) {
            Some(word) => literal(word, program).map(str::to_owned),
            None => Err(format!("`{program} {text}` is missing its value")),
        };
        if let Some(option) = text.strip_prefix("--") {
            let (name, value) = match option.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (option, None),
            };
            if name.len() >= 2 && long.iter().any(|candidate| candidate.starts_with(name)) {
                match value {
                    Some(value) => values.push(value),
                    None => {
                        values.push(value_at(i + 1)?);
                        i += 1;
                    }
                }
            }
        } else if let Some(cluster) = text.strip_prefix('-')
            && let Some(position) = cluster.find(|c| short.contains(c))
        {
            let rest = &cluster[position + 1..];
            if rest.is_empty() {
                values.push(value_at(i + 1)?);
                i += 1;
            } else {
                values.push(rest.to_owned());
            }
        }
        i += 1;
    }
    Ok(values)
}

impl Analyser {
    /// Analyse each value as a shell command line.
    fn scripts(&mut self, scripts: Vec<String>, depth: usize) {
        for script in scripts {
            if !script.trim().is_empty() {
                self.script(&script, depth + 1);
            }
        }
    }
}

/// `tar --to-command=CMD`, `--use-compress-program=CMD` / `-I CMD`, `--info-script=CMD` /
/// `-F CMD`, `--new-volume-script=CMD`, `--rsh-command=CMD`, `--checkpoint-action=exec=CMD`.
pub(super) fn tar(
    analyser: &mut Analyser,
    command: &SimpleCommand,
    depth: usize,
) -> Result<(), String> {
    let args = &command.args;
    // Old-style bundled options (`tar xIf prog a.tar`) take values from later words in an
    // order the analyser does not model.
    if let Some(Word::Literal(first)) = args.first()
        && !first.starts_with('-')
        && first.contains(['I', 'F'])
    {
        return Err(format!(
            "`tar {first}` names a program in old-style bundled options; write `--use-compress-program=…` or `-I …` separately"
        ));
    }
    let mut scripts = option_values(
        args,
        "tar",
        "IF",
        &[
            "to-command",
            "use-compress-program",
            "info-script",
            "new-volume-script",
            "rsh-command",
        ],
    )?;
    for action in option_values(args, "tar", "", &["checkpoint-action"])? {
        if let Some(script) = action.strip_prefix("exec=") {
            scripts.push(script.to_owned());
        }
    }
    analyser.scripts(scripts, depth);
    Ok(())
}

/// `rsync -e CMD` / `--rsh=CMD` runs CMD locally to reach the remote side.
pub(super) fn rsync(
    analyser: &mut Analyser,
    command: &SimpleCommand,
    depth: usize,
) -> Result<(), String> {
    let scripts = option_values(&command.args, "rsync", "e", &["rsh"])?;
    analyser.scripts(scripts, depth);
    Ok(())
}

/// `ssh`/`scp`/`sftp`: `-o ProxyCommand=…` / `LocalCommand` / `KnownHostsCommand`, `scp -S
/// PROG`, `sftp -S PROG` / `-D PROG` run locally; `-F FILE` reads a configuration (which may
/// hold such commands) the analyser cannot see; a provider library loads code.
pub(super) fn ssh(
    analyser: &mut Analyser,
    command: &SimpleCommand,
    depth: usize,
) -> Result<(), String> {
    let program = command.program.as_str();
    let args = &command.args;
    if !option_values(args, program, "F", &[])?.is_empty() {
        return Err(format!(
            "`{program} -F` reads a configuration file the analyser cannot see (it may run commands)"
        ));
    }
    let mut scripts = Vec::new();
    for option in option_values(args, program, "o", &[])? {
        let (key, value) = option
            .split_once(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or((option.as_str(), ""));
        let value = value.trim_start_matches(|c: char| c == '=' || c.is_whitespace());
        match key.to_ascii_lowercase().as_str() {
            "proxycommand" | "localcommand" | "knownhostscommand"
                if !value.eq_ignore_ascii_case("none") =>
            {
                scripts.push(value.to_owned());
            }
            "pkcs11provider" | "securitykeyprovider" | "include" | "match" => {
                return Err(format!(
                    "`{program} -o {key}` loads code or settings the analyser cannot see"
                ));
            }
            _ => {}
        }
    }
    if program == "ssh" && !option_values(args, program, "I", &[])?.is_empty() {
        return Err("`ssh -I` loads a PKCS#11 library the analyser cannot see".to_owned());
    }
    let program_options = match program {
        "scp" => "S",
        "sftp" => "SD",
        _ => "",
    };
    scripts.extend(option_values(args, program, program_options, &[])?);
    analyser.scripts(scripts, depth);
    Ok(())
}

/// `rg --pre CMD` runs CMD on every searched file.
pub(super) fn rg(
    analyser: &mut Analyser,
    command: &SimpleCommand,
    depth: usize,
) -> Result<(), String> {
    let scripts = option_values(&command.args, "rg", "", &["pre"])?;
    analyser.scripts(scripts, depth);
    Ok(())
}

/// `sort --compress-program=PROG` runs PROG for temporary files.
pub(super) fn sort(
    analyser: &mut Analyser,
    command: &SimpleCommand,
    depth: usize,
) -> Result<(), String> {
    let scripts = option_values(&command.args, "sort", "", &["compress-program"])?;
    analyser.scripts(scripts, depth);
    Ok(())
}

/// `go build -toolexec CMD`, `go run/test -exec CMD`, `go vet -vettool=PROG`; `go env -w`
/// stores settings (`GOFLAGS`, `CC`, …) that later `go` commands act on.
pub(super) fn go(
    analyser: &mut Analyser,
    command: &SimpleCommand,
    depth: usize,
) -> Result<(), String> {
    let args = &command.args;
    if args.first().and_then(Word::literal) == Some("env")
        && args.iter().any(|word| word.literal() == Some("-w"))
    {
        return Err(
            "`go env -w` stores settings (GOFLAGS, CC, …) that can make later go commands run other programs"
                .to_owned(),
        );
    }
    let mut scripts = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let Some(text) = args[i].literal() else {
            i += 1;
            continue;
        };
        let flag = text.trim_start_matches('-');
        if text.starts_with('-') && text != "--" {
            let (name, value) = match flag.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (flag, None),
            };
            if matches!(name, "toolexec" | "exec" | "vettool") {
                match value {
                    Some(value) => scripts.push(value),
                    None => {
                        let next = args
                            .get(i + 1)
                            .ok_or_else(|| format!("`go {text}` is missing its value"))?;
                        scripts.push(literal(next, "go")?.to_owned());
                        i += 1;
                    }
                }
            }
        }
        i += 1;
    }
    analyser.scripts(scripts, depth);
    Ok(())
}

/// Cargo settings that cannot name a program.
const CARGO_INERT_PREFIXES: &[&str] = &[
    "profile.",
    "term.",
    "net.",
    "build.jobs",
    "build.incremental",
];

/// `cargo --config KEY=VALUE` can set a runner, linker, rustc wrapper or credential provider;
/// `--config FILE` reads settings the analyser cannot see.
pub(super) fn cargo(
    _analyser: &mut Analyser,
    command: &SimpleCommand,
    _depth: usize,
) -> Result<(), String> {
    for setting in option_values(&command.args, "cargo", "", &["config"])? {
        let inert = setting.split_once('=').is_some_and(|(key, _)| {
            CARGO_INERT_PREFIXES
                .iter()
                .any(|prefix| key.trim().starts_with(prefix))
        });
        if !inert {
            return Err(format!(
                "`cargo --config {setting}` can make cargo run other programs (runner, linker, rustc wrapper); set it in a reviewed config file instead"
            ));
        }
    }
    Ok(())
}

/// `gdb` runs commands from `-ex`, script files and standard input (`shell …`, `!…`, `run`),
/// so it is always unanalysable; the program given after `--args` is judged too.
pub(super) fn gdb(
    analyser: &mut Analyser,
    command: &SimpleCommand,
    depth: usize,
) -> Result<(), String> {
    if let Some(index) = command
        .args
        .iter()
        .position(|word| word.literal() == Some("--args"))
    {
        analyser.run(command.args[index + 1..].to_vec(), depth);
    }
    Err("`gdb` runs commands from its arguments, scripts and standard input, which the analyser cannot see".to_owned())
}

/// GNU parallel's options the analyser knows: flags, then options taking a value.
const PARALLEL_FLAGS: &[&str] = &[
    "-k",
    "--keep-order",
    "-v",
    "--verbose",
    "--will-cite",
    "--bar",
    "--eta",
    "--progress",
    "--dry-run",
    "--tag",
    "-0",
    "--null",
    "--line-buffer",
    "--group",
    "-u",
    "--ungroup",
    "--no-notice",
    "-X",
    "-m",
    "--halt-on-error",
];
const PARALLEL_VALUED: &[&str] = &[
    "-j",
    "--jobs",
    "-n",
    "--max-args",
    "-N",
    "--colsep",
    "-d",
    "--delimiter",
    "--timeout",
    "--retries",
    "--joblog",
    "--results",
    "--halt",
    "--delay",
];

/// `parallel [options] COMMAND ::: ARGS`: COMMAND is run through a shell with arguments
/// appended; without a command, the commands come from input the analyser cannot see.
pub(super) fn parallel(
    analyser: &mut Analyser,
    command: &SimpleCommand,
    depth: usize,
) -> Result<(), String> {
    let args = &command.args;
    let mut i = 0;
    while let Some(word) = args.get(i) {
        let text = literal(word, "parallel")?;
        if PARALLEL_FLAGS.contains(&text) {
            i += 1;
        } else if PARALLEL_VALUED.contains(&text) {
            i += 2;
        } else if text.starts_with("--")
            && text.contains('=')
            && PARALLEL_VALUED.contains(&text.split_once('=').map_or(text, |(name, _)| name))
        {
            i += 1;
        } else if text.starts_with('-') && !text.starts_with(":::") {
            return Err(format!(
                "`parallel` is given the option `{text}`, which the analyser does not know"
            ));
        } else {
            break;
        }
    }
    let end = args[i.min(args.len())..]
        .iter()
        .position(|word| matches!(word.literal(), Some(":::" | "::::" | ":::+" | "::::+")))
        .map_or(args.len(), |offset| i + offset);
    let words = args[i.min(end)..end]
        .iter()
        .map(|word| literal(word, "parallel").map(str::to_owned))
        .collect::<Result<Vec<String>, String>>()?;
    if words.is_empty() {
        return Err("`parallel` without a command runs commands from its input, which the analyser cannot see".to_owned());
    }
    let script = words.join(" ");
    if script.contains('{') {
        return Err(format!(
            "`parallel {script}` substitutes its input into the command at run time"
        ));
    }
    let before = analyser.out.commands.len();
    analyser.script(&script, depth + 1);
    // Arguments from the input are appended to the command.
    for found in &mut analyser.out.commands[before..] {
        found.open_tail = true;
    }
    Ok(())
}

/// `awk`'s `system()`, pipes to and from commands, and extension loading run programs; a
/// program file or a program computed at run time cannot be checked.
pub(super) fn awk(
    _analyser: &mut Analyser,
    command: &SimpleCommand,
    _depth: usize,
) -> Result<(), String> {
    let program = command.program.as_str();
    let mut texts = Vec::new();
    let mut i = 0;
    let mut has_program = false;
    while let Some(word) = command.args.get(i) {
        let text = literal(word, program)?;
        match text {
            "-f" | "--file" | "-E" | "--exec" | "-l" | "--load" | "-i" | "--include" => {
                return Err(format!(
                    "`{program} {text}` runs awk code from a file the analyser cannot see"
                ));
            }
            "-F" | "-v" | "--assign" | "--field-separator" => i += 2,
            "--" => {
                i += 1;
                break;
            }
            _ if text.starts_with("--file=")
                || text.starts_with("--exec=")
                || text.starts_with("--load=")
                || text.starts_with("--include=") =>
            {
                return Err(format!(
                    "`{program} {text}` runs awk code from a file the analyser cannot see"
                ));
            }
            "-e" | "--source" => {
                if let Some(next) = command.args.get(i + 1) {
                    texts.push(literal(next, program)?.to_owned());
                }
                has_program = true;
                i += 2;
            }
            _ if text.starts_with('-') => i += 1,
            _ => break,
        }
    }
    if !has_program && let Some(word) = command.args.get(i) {
        texts.push(literal(word, program)?.to_owned());
    }
    for text in texts {
        if text.contains("system") || text.contains('|') || text.contains("@load") {
            return Err(format!(
                "the `{program}` program can run commands (`system`, pipes or `@load`), which the analyser cannot check"
            ));
        }
    }
    Ok(())
}

/// `sed`'s `e` command and the `e` flag of `s` run the pattern space as a command; `--sandbox`
/// refuses them. Script files cannot be checked.
pub(super) fn sed(
    _analyser: &mut Analyser,
    command: &SimpleCommand,
    _depth: usize,
) -> Result<(), String> {
    let args = &command.args;
    if args.iter().any(|word| word.literal() == Some("--sandbox")) {
        return Ok(());
    }
    let mut scripts = Vec::new();
    let mut explicit = false;
    let mut i = 0;
    while let Some(word) = args.get(i) {
        let text = literal(word, "sed")?;
        if text == "--" {
            i += 1;
            break;
        }
        if text == "-f"
            || text.starts_with("--file")
            || (text.starts_with('-') && !text.starts_with("--") && text.contains('f'))
        {
            return Err(
                "`sed -f` runs a script file the analyser cannot see; give the script with -e"
                    .to_owned(),
            );
        }
        if text == "-e" || text == "--expression" {
            let next = args.get(i + 1).ok_or("`sed -e` is missing its script")?;
            scripts.push(literal(next, "sed")?.to_owned());
            explicit = true;
            i += 2;
            continue;
        }
        if let Some(script) = text.strip_prefix("--expression=") {
            scripts.push(script.to_owned());
            explicit = true;
        } else if let Some(script) = text.strip_prefix("-e").filter(|_| !text.starts_with("--")) {
            if !script.is_empty() {
                scripts.push(script.to_owned());
                explicit = true;
            }
        } else if text.starts_with('-') {
            // -n, -i[SUFFIX], -E, -r, -s, -u, -z, --posix, … take no separate value
            // except -l N.
            if text == "-l" || text == "--line-length" {
                i += 1;
            }
        } else if !explicit {
            scripts.push(text.to_owned());
            explicit = true;
        }
        i += 1;
    }
    if !explicit && let Some(word) = args.get(i) {
        scripts.push(literal(word, "sed")?.to_owned());
    }
    for script in scripts {
        if sed_runs_commands(&script, false) || sed_runs_commands(&script, true) {
            return Err(
                "the `sed` script can run commands (the `e` command or flag), which the analyser cannot check; use `sed --sandbox`"
                    .to_owned(),
            );
        }
    }
    Ok(())
}

/// Whether a sed script has an `e` command or an `s///e` flag, or something this scanner does
/// not understand (then `true`: fail closed). `brackets`: whether the delimiter is literal
/// inside `[…]` (implementations differ, so both readings are checked).
fn sed_runs_commands(script: &str, brackets: bool) -> bool {
    let chars: Vec<char> = script.chars().collect();
    let len = chars.len();
    let mut i = 0;
    // Skip a delimited part starting after its opening delimiter; returns the index after the
    // closing one, or None if unterminated.
    let skip_part = |mut i: usize, delimiter: char| -> Option<usize> {
        let mut in_bracket = false;
        while i < len {
            let c = chars[i];
            if c == '\\' {
                i += 2;
                continue;
            }
            if brackets && c == '[' && !in_bracket {
                in_bracket = true;
            } else if in_bracket && c == ']' {
                in_bracket = false;
            } else if c == delimiter && !in_bracket {
                return Some(i + 1);
            }
            i += 1;
        }
        None
    };
    let to_line_end = |mut i: usize| -> usize {
        while i < len && chars[i] != '\n' {
            if chars[i] == '\\' {
                i += 1;
            }
            i += 1;
        }
        i
    };
    let skip_address = |mut i: usize| -> Option<usize> {
        match chars.get(i) {
            Some(c) if c.is_ascii_digit() => {
                while i < len && (chars[i].is_ascii_digit() || chars[i] == '~') {
                    i += 1;
                }
            }
            Some('$') => i += 1,
            Some('/') => {
                i = skip_part(i + 1, '/')?;
            }
            Some('\\') => {
                let delimiter = *chars.get(i + 1)?;
                i = skip_part(i + 2, delimiter)?;
            }
            _ => return Some(i),
        }
        while i < len && matches!(chars[i], 'I' | 'M') {
            i += 1;
        }
        Some(i)
    };
    loop {
        while i < len && (chars[i].is_whitespace() || chars[i] == ';') {
            i += 1;
        }
        if i >= len {
            return false;
        }
        let Some(next) = skip_address(i) else {
            return true;
        };
        i = next;
        if chars.get(i) == Some(&',') {
            i += 1;
            if matches!(chars.get(i), Some('+' | '~')) {
                i += 1;
            }
            let Some(next) = skip_address(i) else {
                return true;
            };
            i = next;
        }
        while i < len && (chars[i].is_whitespace() || chars[i] == '!') {
            i += 1;
        }
        let Some(&c) = chars.get(i) else {
            return false;
        };
        i += 1;
        match c {
            'e' => return true,
            '{' | '}' | '=' | 'd' | 'D' | 'g' | 'G' | 'h' | 'H' | 'n' | 'N' | 'p' | 'P' | 'x'
            | 'z' | 'F' => {}
            'q' | 'Q' | 'l' | 'L' => {
                while i < len && (chars[i].is_ascii_digit() || chars[i] == ' ') {
                    i += 1;
                }
            }
            ':' | 'b' | 't' | 'T' | 'v' => {
                while i < len && !matches!(chars[i], ';' | '\n') {
                    i += 1;
                }
            }
            '#' | 'a' | 'i' | 'c' | 'r' | 'R' | 'w' | 'W' => i = to_line_end(i),
            's' | 'y' => {
                let Some(&delimiter) = chars.get(i) else {
                    return true;
                };
                if delimiter == '\n' || delimiter == '\\' {
                    return true;
                }
                let Some(after) = skip_part(i + 1, delimiter).and_then(|j| skip_part(j, delimiter))
                else {
                    return true;
                };
                i = after;
                if c == 's' {
                    while i < len {
                        match chars[i] {
                            'e' => return true,
                            'w' => {
                                i = to_line_end(i);
                                break;
                            }
                            'g' | 'p' | 'i' | 'I' | 'm' | 'M' => i += 1,
                            d if d.is_ascii_digit() => i += 1,
                            _ => break,
                        }
                    }
                }
            }
            _ => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shell::test_support::{found, reasons};

    #[test]
    fn option_commands_are_judged() {
        let cases: &[&str] = &[
            "tar -x -I 'git push' -f a.tar",
            "tar -xIgit\\ push -f a.tar",
            "tar --use-compress='git push' -xf a.tar",
            "tar --checkpoint=1 --checkpoint-action=exec='git push' -cf a.tar .",
            "tar -F 'git push' -cf a.tar .",
            "rsync -avze 'git push' a b:c",
            "rsync --rsh='git push' a b:c",
            "ssh -oProxyCommand='git push' h",
            "ssh -o 'LocalCommand git push' -o PermitLocalCommand=yes h",
            "scp -S 'git push' a h:b",
            "sftp -D 'git push' h",
            "rg --pre='git push' x",
            "sort --compress-prog 'git push' x",
            "go build -toolexec='git push' .",
            "go vet --vettool 'git push' .",
        ];
        for script in cases {
            assert!(
                found(script).iter().any(|c| c == "git push"),
                "{script}: {:?} {}",
                found(script),
                reasons(script)
            );
            assert_eq!(reasons(script), "", "{script}");
        }
        assert_eq!(found("tar -xzf a.tar"), ["tar -xzf a.tar"]);
        assert_eq!(
            found("ssh -o ProxyCommand=none h"),
            ["ssh -o ProxyCommand=none h"]
        );
        assert_eq!(found("ssh h git push"), ["ssh h git push"]);
        assert_eq!(found("sort -u x"), ["sort -u x"]);
        assert_eq!(found("go test ./..."), ["go test ./..."]);
        assert_eq!(
            found("parallel -j 2 git ::: push"),
            ["parallel -j 2 git ::: push", "git …"]
        );
    }

    #[test]
    fn programs_with_their_own_command_language_are_unanalysable_when_they_may_run_commands() {
        assert!(reasons("tar xIf git a.tar").contains("old-style"));
        assert!(reasons("ssh -F cfg h").contains("-F"));
        assert!(reasons("ssh -o PKCS11Provider=x.so h").contains("loads code"));
        assert!(reasons("go env -w GOFLAGS=-toolexec=x").contains("go env -w"));
        assert!(reasons("cargo --config 'target.x.runner=\"sh\"' test").contains("cargo --config"));
        assert!(reasons("cargo test --config cfg.toml").contains("cargo --config"));
        assert_eq!(reasons("cargo --config profile.dev.opt-level=1 test"), "");
        assert!(reasons("gdb -ex 'shell git push'").contains("gdb"));
        assert!(reasons("parallel ::: a b").contains("input"));
        assert!(reasons("parallel git {} ::: push").contains("run time"));
        assert!(reasons("parallel --frob git ::: push").contains("--frob"));
        assert!(reasons("awk 'BEGIN { system(\"x\") }'").contains("awk"));
        assert!(reasons("awk '{ print | \"sh\" }' f").contains("awk"));
        assert!(reasons("gawk -f prog.awk f").contains("file"));
        assert!(reasons("awk \"$p\" f").contains("run time"));
        assert_eq!(reasons("awk -F: '{ print $1 }' /etc/passwd"), "");
        assert!(reasons("sed 's/x/y/e' f").contains("sed"));
        assert!(reasons("sed -e 1e f").contains("sed"));
        assert!(reasons("sed -n '/a/{e\n}' f").contains("sed"));
        assert!(reasons("sed -f s.sed f").contains("script file"));
        assert_eq!(reasons("sed -i 's/e/E/g; /x/d' f"), "");
        assert_eq!(reasons("sed --sandbox 's/x/y/e' f"), "");
        assert_eq!(reasons("sed -n '1,/end/p; $a\\\ndone' f"), "");
    }

    #[test]
    fn sed_scanner_reads_both_delimiter_conventions() {
        assert!(!sed_runs_commands("s/[/]/x/g", true));
        assert!(sed_runs_commands("s/[/]/x/e", true));
        assert!(sed_runs_commands("s/[/]/x/e", false));
        assert!(sed_runs_commands("y/abc/xyz/;e", false));
        assert!(!sed_runs_commands("s|a|b|gp", false));
        assert!(sed_runs_commands("s/a/b/w out\ne", false));
        assert!(sed_runs_commands("K", false));
    }
}
