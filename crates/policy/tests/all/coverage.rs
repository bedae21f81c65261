//! Programs and environment variables that make an allowed command run another one: the
//! inner program is judged like any other command, or the script is unanalysable.

use cordon_policy::Decision;

use crate::support::{bash, policy, shipped};

const BLOCKLIST: &str = r#"version = 1
default = "allow"

[[rules]]
command = ["git", "push"]
decision = "deny"
"#;

#[test]
fn wrappers_that_run_a_command_do_not_hide_a_denied_one() {
    let p = policy(BLOCKLIST);
    for script in [
        "prlimit git push",
        "prlimit --nofile=64 git push origin",
        "setarch x86_64 git push",
        "x86_64 git push",
        "linux32 -R git push",
        "chrt -o 0 git push",
        "tar --to-command='git push' -xf x.tar",
        "tar -xf x.tar --checkpoint-action=exec='git push'",
        "strace -f git push",
        "ltrace git push",
        "script -qc 'git push' /dev/null",
        "sg staff -c 'git push'",
        "pkexec git push",
        "valgrind -q git push",
        "unbuffer git push",
        "nsenter -t 1 -n git push",
        "unshare -r git push",
        "toybox nice git push",
        "find . -ok git push \\;",
        "git -c core.pager='git push' log",
        "git -c alias.x='!git push' x",
        "git -c alias.p=push p",
        "GIT_PAGER='git push' git log",
        "export GIT_EXTERNAL_DIFF='git push'; git diff",
        "env GIT_SSH_COMMAND='git push' git fetch",
        "rsync -e 'git push' a b:c",
        "ssh -o ProxyCommand='git push' h",
    ] {
        let got = bash(&p, script);
        assert_eq!(got.decision, Decision::Deny, "{script:?}: {got:?}");
    }
}

/// Forms an adversarial review found running `git push` unflagged: each is now judged as
/// `git push` (denied) or unanalysable (flagged).
#[test]
fn review_findings_are_denied_or_unanalysable() {
    let p = policy(BLOCKLIST);
    let missed: Vec<&str> = [
        // flock takes `-c` after the lock file, after any options
        "flock -x lockf -c 'git push'",
        "flock -s lockf -c 'git push'",
        "flock -n lockf -c 'git push'",
        "flock -w 1 lockf -c 'git push'",
        "flock -E 3 lockf -c 'git push'",
        "flock l --command 'git push'",
        "flock l --command='git push'",
        // environment entries that are not variables define functions
        "env 'BASH_FUNC_f%%=() { git push; }' bash -c f",
        "sudo 'BASH_FUNC_f%%=() { git push; }' bash -c f",
        // options read from the environment
        "TAR_OPTIONS='--to-command=git\\ push' tar xf a.tar",
        "export TAR_OPTIONS='--to-command=git\\ push'; tar xf a.tar",
        "RIPGREP_CONFIG_PATH=rgrc rg x",
        // completion builtins run commands
        "compgen -C 'git push' x",
        "compgen -F f x",
        "complete -C 'git push' x",
        // bash evaluates array subscripts in names as arithmetic, running substitutions
        "test -v 'a[$(git push)]'",
        "[ -v 'a[$(git push)]' ]",
        "[[ -v 'a[$(git push)]' ]]",
        "[[ 'a[$(git push)]' -eq 0 ]]",
        "printf -v 'a[$(git push)]' x",
        "read 'a[`git push`]' <<< x",
        "declare 'a[${x:-$(git push)}]=1'",
        "local -i 'x=a[$(git push)]'",
        "export 'a[$(git push)]'",
        "unset 'a[$(git push)]'",
        "let 'a[$(git push)]'",
        "x='a[$(git push)]'; echo $((x))",
        "a=(1); echo ${a['$(git push)']}",
        "echo ${s:'a[$(git push)]'}",
        "echo ${a[@]:0:'a[$(git push)]'}",
        // git's dashed programs
        "/usr/lib/git-core/git-push",
        "git-push origin",
        // the dynamic loader runs its first operand
        "/lib64/ld-linux-x86-64.so.2 /usr/bin/git push",
        "/lib/ld-linux.so.2 /usr/bin/git push",
        "ld.so --argv0 git /usr/bin/git push",
        "ld.so --preload ./x.so /usr/bin/git push",
        // wrappers
        "fakeroot git push",
        "faketime '2020-01-01' git push",
        "numactl -l git push",
        "catchsegv git push",
        "busybox start-stop-daemon -S -x /usr/bin/git -- push",
        "start-stop-daemon -S -x /usr/bin/git -- push",
        "setpriv --reuid=1 git push",
        "capsh -- -c 'git push'",
        "cpulimit -l 50 git push",
        "firejail git push",
        "bwrap --bind / / git push",
        "proot git push",
        "rlwrap git push",
        "dbus-launch git push",
        "xvfb-run git push",
        "tmux new-session 'git push'",
        "screen -dm git push",
        "expect -c 'spawn git push'",
        "systemd-run git push",
        "runcon -t x git push",
        "fish -c 'git push'",
        "tcsh -c 'git push'",
        "csh -c 'git push'",
        "busybox nc -l -p 1 -e git push",
        "busybox httpd -h .",
        "busybox tcpsvd 0 1 git push",
        "run-parts .",
        "busybox crond",
        "busybox hush -c 'git push'",
        "echo 'git push' | at now",
        "ls | entr git push",
        "mispipe 'git push' cat",
        "xterm -e git push",
        // editors run commands
        "vim -es -c '!git push' -c 'q!'",
        "vi -c '!git push'",
        "ex +'!git push' f",
        "view -S x.vim",
        "nvim --headless -c '!git push'",
        "busybox vi -c '!git push'",
    ]
    .into_iter()
    .filter(|script| {
        let got = bash(&p, script);
        got.decision != Decision::Deny && got.unanalysable.is_none()
    })
    .collect();
    assert!(missed.is_empty(), "ran `git push` unflagged: {missed:#?}");
}

#[test]
fn allowlist_does_not_let_allowed_programs_run_others() {
    let p = shipped("ci-untrusted.toml");
    for script in [
        "GIT_EXTERNAL_DIFF='sh x' git diff",
        "GIT_EXTERNAL_DIFF=./x git diff",
        "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=diff.external GIT_CONFIG_VALUE_0='sh x' git diff",
        "GIT_CONFIG_PARAMETERS=\"'core.pager'='sh x'\" git log",
        "git -c core.pager='sh -c x' log",
        "git -c diff.external=./x diff",
        "PAGER=./x git log",
        "export GIT_PAGER=./x; git log",
        "env EDITOR=./x git status",
        "RUSTC_WRAPPER=./x cargo build",
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=./x cargo test",
        "cargo test --config 'target.x.runner=\"./x\"'",
        "LD_PRELOAD=./x.so cargo test",
        "PYTHONPATH=. pytest",
        "NODE_OPTIONS='--require ./x.js' npm test",
        "HOME=. git log",
        "rg --pre ./x pattern",
        "sort --compress-program=./x f",
        "go test -exec ./x ./...",
        "find . -okdir ./x \\;",
        "git -c credential.helper='!./x' status",
        "test -v 'a[$(id)]'",
        "RIPGREP_CONFIG_PATH=rgrc rg x",
        "GIT_DIR=x git status",
        "GIT_WORK_TREE=. git status",
        "GIT_COMMON_DIR=x git status",
        "env GIT_DIR=x git log",
    ] {
        let got = bash(&p, script);
        assert_eq!(got.decision, Decision::Deny, "{script:?}: {got:?}");
    }
    // Everyday forms stay allowed.
    for script in [
        "git diff",
        "GIT_PAGER=cat git log",
        "PAGER= git log --oneline",
        "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=color.ui GIT_CONFIG_VALUE_0=never git diff",
        "cargo test --config profile.dev.debug=0",
    ] {
        let got = bash(&p, script);
        assert_eq!(got.decision, Decision::Allow, "{script:?}: {got:?}");
    }
}
