//! Differential test against real bash: every program bash actually runs for a script must be
//! among the commands the analyser found, unless the analyser reported the script as
//! unanalysable. Stub programs (`git`, `cargo`, …) on a private PATH log their argv.

use std::path::Path;
use std::process::Command;

use cordon_policy::shell::{ScriptAnalysis, SimpleCommand, Word, analyse_script};

/// Programs replaced by logging stubs.
const STUBS: &[&str] = &["git", "cargo", "frob"];

const SCRIPTS: &[&str] = &[
    r"g\it push",
    r#""git" push"#,
    "$(echo git) push",
    "`echo git` push",
    "bash -c 'git push'",
    r#"sh -c "cd . && git push""#,
    "eval git push",
    "eval 'git push; cargo test'",
    "env git push",
    "env -i PATH=\"$PATH\" git env-i",
    "command git push",
    "builtin command git builtin",
    "echo | xargs git push",
    "echo push | xargs git",
    "printf 'a\\0b' | xargs -0 git zero",
    "echo push | xargs -I{} git {} now",
    "git push;",
    "true && git push",
    "false || git push",
    "(git push)",
    "( (git push) )",
    "((git push) )",
    "((git x)&&(git y))",
    "((git x);(git y))",
    "(( $(git in-arith) + 1 ))",
    "{ git grouped; }",
    "a=git; $a push",
    "$'\\x67it' push",
    "g''it quoted",
    "gi\\\nt continued",
    "find . -maxdepth 0 -exec git push \\;",
    "find . -maxdepth 0 -exec sh -c 'git nested' \\;",
    "x() { git push; }; x",
    "function y { cargo test; }; y",
    "if true; then git push; fi",
    "while false; do :; done; until true; do :; done; git after-loops",
    "for c in git; do $c push; done",
    "case $(git case) in *) git inner;; esac",
    "cat <<EOF | bash\ngit push\nEOF\n",
    "bash <<EOF\ngit heredoc\nEOF\n",
    "timeout 5 nice -n 1 git push",
    "exec git push",
    "echo $(git rev-parse)",
    "cat <(git log) >/dev/null",
    ": ${x:-$(git fetch)}",
    "echo $((1 + $(git count)))",
    "a[$(git idx)]=1",
    "trap 'git trapped' EXIT",
    "git push & wait",
    "`g\\it back`",
    "\"$(printf git)\" dyn",
    "stdbuf -oL git buf",
    "setsid -w git sess",
    "git $(echo push)",
    "cat <<EOF\n$(git heredoc-subst)\nEOF\n",
    "[[ -n $(git test) ]]",
    "(( $(git arith) + 1 ))",
    "echo \"${HOME/$(git replace)/x}\"",
    "frob --flag | cargo build 2>&1 | git filter",
    "bash -c \"bash -c 'sh -c \\\"git deep\\\"'\"",
    "env -S 'git split' extra",
    // Programs that run a program from their arguments (util-linux, coreutils, tar, busybox).
    "prlimit --nofile=64 git prl",
    "setarch x86_64 -R git sa",
    "linux32 git l32",
    "x86_64 git x64",
    "chrt -o 0 git chrt",
    "taskset -c 0 git ts",
    "ionice -c 3 git io",
    "script -qc 'git scr' /dev/null",
    "flock lk git fl",
    "nohup git nh",
    "sg root -c 'git sg'",
    "touch f; tar -cf a.tar f; tar --to-command='git tar' -xf a.tar",
    "busybox env git bb",
    "echo x | sed '1e git sed'",
    "mawk 'BEGIN { system(\"git awk\") }'",
    "env -S 'GIT_PAGER=frob git split-env'",
    // flock's `-c` after the lock file, subscripts bash evaluates, imported functions,
    // completion commands, fakeroot.
    "flock -x lk -c 'git flx'",
    "flock -w 1 lk --command 'git flc'",
    "test -v 'a[$(git tv)]'",
    "[ -v 'a[$(git bv)]' ]",
    "[[ -v 'a[$(git dv)]' ]]",
    "[[ 'a[$(git eq)]' -eq 0 ]]",
    "printf -v 'a[$(git pv)]' x",
    "read 'a[$(git rd)]' <<< x",
    "a=(1); unset 'a[$(git un)]'",
    "env 'BASH_FUNC_f%%=() { git bf; }' bash -c f",
    "compgen -C 'git cg' x",
    "fakeroot git fr",
];

fn stub_dir(dir: &Path, log: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for name in STUBS {
        let path = dir.join(name);
        let script = format!(
            // One write per line: stubs of a pipeline run at the same time.
            "#!/bin/sh\nline=\"{name}\"; for a in \"$@\"; do line=\"$line $a\"; done; printf '%s\\n' \"$line\" >> '{}'\n",
            log.display()
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Whether an invocation bash really made is covered by the analysis.
fn covered(analysis: &ScriptAnalysis, argv: &[String]) -> bool {
    if !analysis.is_complete() {
        return true;
    }
    analysis.commands.iter().any(|command: &SimpleCommand| {
        command.program == argv[0]
            && (command.open_tail
                || command
                    .args
                    .iter()
                    .any(|arg| matches!(arg, Word::Dynamic(_)))
                || command
                    .args
                    .iter()
                    .map(|arg| arg.literal().unwrap_or_default())
                    .eq(argv[1..].iter().map(String::as_str)))
    })
}

#[test]
fn every_program_bash_runs_is_found_or_the_script_is_unanalysable() {
    let bash = ["/bin/bash", "/usr/bin/bash"]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .expect("bash is required for the differential test (install bash)");
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let log = dir.path().join("log");
    stub_dir(&bin, &log);
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let mut total = 0;
    let mut failures = Vec::new();
    for script in SCRIPTS {
        let _ = std::fs::remove_file(&log);
        let status = Command::new(bash)
            .arg("-c")
            .arg(script)
            .current_dir(&work)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", &work)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        let _ = status;
        let ran = std::fs::read_to_string(&log).unwrap_or_default();
        let analysis = analyse_script(script);
        for line in ran.lines() {
            total += 1;
            let argv: Vec<String> = line.split(' ').map(str::to_owned).collect();
            if !covered(&analysis, &argv) {
                failures.push(format!(
                    "{script:?} ran `{line}`, analysis found {:?}",
                    analysis
                        .commands
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The harness really ran the stubs (guards against a test that cannot fail).
    assert!(total >= 56, "only {total} stub invocations were logged");
}

/// Scripts in which the real git runs the stub `frob` through a setting or a variable.
const GIT_SCRIPTS: &[&str] = &[
    "GIT_EXTERNAL_DIFF=frob git diff",
    "export GIT_EXTERNAL_DIFF=frob; git diff",
    "env GIT_EXTERNAL_DIFF=frob git diff",
    "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=diff.external GIT_CONFIG_VALUE_0=frob git diff",
    "git -c diff.external=frob diff",
    "git -c alias.d=diff -c diff.external=frob d",
    "git -c alias.x='!frob alias' x",
    "git -c core.editor=frob commit --allow-empty",
    "GIT_EDITOR=frob git commit --allow-empty",
    "git -c core.fsmonitor=frob status",
];

#[test]
fn every_program_git_runs_is_found_or_the_script_is_unanalysable() {
    let bash = ["/bin/bash", "/usr/bin/bash"]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .expect("bash is required for the differential test (install bash)");
    assert!(
        Path::new("/usr/bin/git").exists(),
        "git is required for the differential test (install git)"
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let log = dir.path().join("log");
    // Only `frob` is a stub: git is the real one.
    stub_dir(&bin, &log);
    std::fs::remove_file(bin.join("git")).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let run = |script: &str| {
        Command::new(bash)
            .arg("-c")
            .arg(script)
            .current_dir(&work)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", &work)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
    };
    let setup = run("git init -q && echo a > a && git add a && git commit -qm a && echo b > a");
    assert!(setup.success(), "failed to set up the repository");
    let mut total = 0;
    let mut failures = Vec::new();
    for script in GIT_SCRIPTS {
        let _ = std::fs::remove_file(&log);
        let _ = run(script);
        let ran = std::fs::read_to_string(&log).unwrap_or_default();
        let analysis = analyse_script(script);
        for line in ran.lines() {
            total += 1;
            let argv: Vec<String> = line.split(' ').map(str::to_owned).collect();
            let found = !analysis.is_complete()
                || analysis
                    .commands
                    .iter()
                    .any(|command| command.program == argv[0]);
            if !found {
                failures.push(format!(
                    "{script:?} ran `{line}`, analysis found {:?}",
                    analysis
                        .commands
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // git really ran the stub for most scripts (guards against a test that cannot fail).
    assert!(total >= 8, "only {total} stub invocations were logged");
}
