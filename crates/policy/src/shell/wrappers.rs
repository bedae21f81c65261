//! Normalising one command line: programs that run another program (`env`, `sudo`, `xargs`,
//! `timeout`, …) are stripped with their options, shells given `-c` have their script parsed,
//! `eval`/`trap` strings are parsed, and builtins that make a script opaque are reported.
//!
//! Option tables are data, one entry per program (GNU coreutils, util-linux, sudo, findutils,
//! procps and bash spellings). An option a table does not know, or a run-time value where an
//! option or the wrapped command could be, makes the script unanalysable: guessing where the
//! real command starts would let `timeout $T git push` hide `git push`.

use super::{Analyser, SimpleCommand, Word, runners};

/// Directories whose programs are the system's, not something the agent wrote. A wrapper or
/// builtin named by any other path is treated as an ordinary program (and still unwrapped).
pub const SYSTEM_BIN_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Whether `path` names a program in one of [`SYSTEM_BIN_DIRS`].
pub fn is_system_program_path(path: &str) -> bool {
    match path.rsplit_once('/') {
        Some((dir, name)) => !name.is_empty() && SYSTEM_BIN_DIRS.contains(&dir),
        None => false,
    }
}

/// How one program's options look.
struct Spec {
    short_flags: &'static str,
    short_valued: &'static str,
    /// Short options whose value, if any, is attached (`-i{}`), never the next word.
    short_optional: &'static str,
    long_flags: &'static [&'static str],
    long_valued: &'static [&'static str],
    long_optional: &'static [&'static str],
    /// `nice -5`
    numeric_short: bool,
    /// `env -`, `su -`
    lone_dash: bool,
    /// `bash +x`, `bash +o pipefail`
    plus_options: bool,
    /// Any `--name=value` is one option word (valgrind's and strace's open-ended sets); a
    /// long option without `=` must still be in the table.
    long_any_valued: bool,
}

const NONE: Spec = Spec {
    short_flags: "",
    short_valued: "",
    short_optional: "",
    long_flags: &[],
    long_valued: &[],
    long_optional: &[],
    numeric_short: false,
    lone_dash: false,
    plus_options: false,
    long_any_valued: false,
};

const ENV: Spec = Spec {
    short_flags: "i0v",
    short_valued: "uCS",
    long_flags: &[
        "ignore-environment",
        "null",
        "debug",
        "list-signal-handling",
    ],
    long_valued: &["unset", "chdir", "split-string"],
    long_optional: &["default-signal", "ignore-signal", "block-signal"],
    lone_dash: true,
    ..NONE
};
const COMMAND: Spec = Spec {
    short_flags: "pvV",
    ..NONE
};
const EXEC: Spec = Spec {
    short_flags: "cl",
    short_valued: "a",
    ..NONE
};
const SETSID: Spec = Spec {
    short_flags: "cfw",
    long_flags: &["ctty", "fork", "wait"],
    ..NONE
};
const STDBUF: Spec = Spec {
    short_valued: "ioe",
    long_valued: &["input", "output", "error"],
    ..NONE
};
const IONICE: Spec = Spec {
    short_flags: "t",
    short_valued: "cnpPu",
    long_flags: &["ignore"],
    long_valued: &["class", "classdata", "pid", "pgid", "uid"],
    ..NONE
};
const NICE: Spec = Spec {
    short_valued: "n",
    long_valued: &["adjustment"],
    numeric_short: true,
    ..NONE
};
const TIMEOUT: Spec = Spec {
    short_flags: "v",
    short_valued: "sk",
    long_flags: &["preserve-status", "foreground", "verbose"],
    long_valued: &["signal", "kill-after"],
    ..NONE
};
const TIME: Spec = Spec {
    short_flags: "pvqa",
    short_valued: "fo",
    long_flags: &["portability", "verbose", "quiet", "append"],
    long_valued: &["format", "output"],
    ..NONE
};
const TASKSET: Spec = Spec {
    short_flags: "acp",
    long_flags: &["all-tasks", "cpu-list", "pid"],
    ..NONE
};
const FLOCK: Spec = Spec {
    short_flags: "sxenuoF",
    short_valued: "wEc",
    long_flags: &[
        "shared",
        "exclusive",
        "nonblock",
        "nb",
        "unlock",
        "close",
        "no-fork",
        "verbose",
    ],
    long_valued: &["wait", "timeout", "conflict-exit-code", "command"],
    ..NONE
};
const WATCH: Spec = Spec {
    short_flags: "bceghptwrx",
    short_valued: "nq",
    short_optional: "d",
    long_flags: &[
        "beep",
        "color",
        "no-color",
        "errexit",
        "chgexit",
        "precise",
        "no-title",
        "no-wrap",
        "no-linewrap",
        "exec",
        "no-rerun",
    ],
    long_valued: &["interval", "equexit"],
    long_optional: &["differences"],
    ..NONE
};
const SU: Spec = Spec {
    short_flags: "lmpfP",
    short_valued: "cgGswu",
    long_flags: &["login", "preserve-environment", "fast", "pty"],
    long_valued: &[
        "command",
        "session-command",
        "group",
        "supp-group",
        "shell",
        "whitelist-environment",
        "user",
    ],
    lone_dash: true,
    ..NONE
};
const SUDO: Spec = Spec {
    short_flags: "AbEeHhiKklnPSsVv",
    short_valued: "gpCDrtTUuR",
    long_flags: &[
        "askpass",
        "background",
        "bell",
        "edit",
        "help",
        "login",
        "list",
        "non-interactive",
        "preserve-groups",
        "remove-timestamp",
        "reset-timestamp",
        "set-home",
        "shell",
        "stdin",
        "validate",
        "version",
    ],
    long_valued: &[
        "chdir",
        "chroot",
        "close-from",
        "command-timeout",
        "group",
        "host",
        "other-user",
        "prompt",
        "role",
        "type",
        "user",
    ],
    long_optional: &["preserve-env"],
    ..NONE
};
const DOAS: Spec = Spec {
    short_flags: "Lns",
    short_valued: "uC",
    ..NONE
};
const CHROOT: Spec = Spec {
    long_flags: &["skip-chdir"],
    long_valued: &["userspec", "groups"],
    ..NONE
};
const PRLIMIT: Spec = Spec {
    short_valued: "po",
    short_optional: "cdefilmnqrstuvxy",
    long_flags: &["noheadings", "raw", "verbose", "help", "version"],
    long_valued: &["pid", "output"],
    long_optional: &[
        "as",
        "core",
        "cpu",
        "data",
        "fsize",
        "locks",
        "memlock",
        "msgqueue",
        "nice",
        "nofile",
        "nproc",
        "rss",
        "rtprio",
        "rttime",
        "sigpending",
        "stack",
    ],
    ..NONE
};
const SETARCH: Spec = Spec {
    short_flags: "BFILRSTXZ3vh",
    long_flags: &[
        "32bit",
        "fdpic-funcptrs",
        "short-inode",
        "addr-compat-layout",
        "addr-no-randomize",
        "whole-seconds",
        "sticky-timeouts",
        "read-implies-exec",
        "mmap-page-zero",
        "3gb",
        "4gb",
        "uname-2.6",
        "verbose",
        "list",
        "help",
        "version",
    ],
    long_optional: &["show"],
    ..NONE
};
/// Names `setarch` is installed under (util-linux): each sets that personality.
const SETARCH_ALIASES: &[&str] = &[
    "linux32",
    "linux64",
    "i386",
    "i486",
    "i586",
    "i686",
    "athlon",
    "x86_64",
    "ia64",
    "ppc",
    "ppc32",
    "ppc64",
    "ppc64le",
    "s390",
    "s390x",
    "sparc",
    "sparc32",
    "sparc32bash",
    "sparc64",
    "mips",
    "mips32",
    "mips64",
    "parisc",
    "parisc32",
    "parisc64",
    "arm",
    "armh",
    "armv7l",
    "armv8l",
    "aarch64",
    "alpha",
    "uname26",
];
const CHRT: Spec = Spec {
    short_flags: "abdfiorRmvphV",
    short_valued: "TPD",
    long_flags: &[
        "all-tasks",
        "batch",
        "deadline",
        "fifo",
        "idle",
        "other",
        "rr",
        "reset-on-fork",
        "max",
        "verbose",
        "pid",
        "help",
        "version",
    ],
    long_valued: &["sched-runtime", "sched-period", "sched-deadline"],
    ..NONE
};
const STRACE: Spec = Spec {
    short_flags: "cCdDfFhikNnqrtTvVwxyYzZ",
    short_valued: "abeEIoOpPsSuUX",
    long_flags: &[
        "follow-forks",
        "output-separately",
        "summary-only",
        "summary",
        "summary-wall-clock",
        "seccomp-bpf",
        "no-abbrev",
        "daemonize",
        "debug",
        "help",
        "version",
        "instruction-pointer",
        "stack-traces",
        "always-show-pid",
        "successful-only",
        "failed-only",
        "absolute-timestamps",
        "relative-timestamps",
        "syscall-times",
        "timestamps",
        "decode-fds",
        "decode-pids",
        "quiet",
        "kill-on-exit",
    ],
    long_valued: &[
        "output",
        "trace",
        "signal",
        "status",
        "abbrev",
        "verbose",
        "raw",
        "read",
        "write",
        "env",
        "user",
        "attach",
        "string-limit",
        "trace-path",
        "inject",
        "fault",
        "summary-sort-by",
        "columns",
    ],
    long_any_valued: true,
    ..NONE
};
const LTRACE: Spec = Spec {
    short_flags: "bcCfhiLrStTV",
    short_valued: "aADeEFlnopsuxwX",
    long_flags: &["debug", "demangle", "help", "version", "no-signals"],
    long_valued: &["align", "indent", "library", "output", "config"],
    long_any_valued: true,
    ..NONE
};
const VALGRIND: Spec = Spec {
    short_flags: "qvhd",
    long_flags: &[
        "help",
        "help-debug",
        "help-dyn-options",
        "version",
        "quiet",
        "verbose",
    ],
    long_any_valued: true,
    ..NONE
};
const UNBUFFER: Spec = Spec {
    short_flags: "p",
    ..NONE
};
const NSENTER: Spec = Spec {
    short_flags: "aFZecVh",
    short_valued: "tGSW",
    short_optional: "muinpCUTrw",
    long_flags: &[
        "all",
        "preserve-credentials",
        "env",
        "no-fork",
        "follow-context",
        "join-cgroup",
        "keep-caps",
        "user-parent",
        "help",
        "version",
    ],
    long_valued: &["target", "setgid", "setuid", "wdns"],
    long_optional: &[
        "mount", "uts", "ipc", "net", "pid", "cgroup", "user", "time", "root", "wd",
    ],
    ..NONE
};
const UNSHARE: Spec = Spec {
    short_flags: "frcVh",
    short_valued: "RwSGl",
    short_optional: "muinpUCT",
    long_flags: &[
        "fork",
        "map-root-user",
        "map-current-user",
        "map-auto",
        "keep-caps",
        "help",
        "version",
    ],
    long_valued: &[
        "propagation",
        "setgroups",
        "root",
        "wd",
        "setuid",
        "setgid",
        "map-user",
        "map-group",
        "map-users",
        "map-groups",
        "monotonic",
        "boottime",
        "load-interp",
    ],
    long_optional: &[
        "mount",
        "uts",
        "ipc",
        "net",
        "pid",
        "user",
        "cgroup",
        "time",
        "kill-child",
        "mount-proc",
        "mount-binfmt",
    ],
    ..NONE
};
const SCRIPT: Spec = Spec {
    short_flags: "aefqhV",
    short_valued: "cEIOBTmo",
    short_optional: "t",
    long_flags: &["append", "return", "flush", "quiet", "help", "version"],
    long_valued: &[
        "command",
        "echo",
        "log-in",
        "log-out",
        "log-io",
        "log-timing",
        "logging-format",
        "output-limit",
    ],
    long_optional: &["timing"],
    ..NONE
};
const SG: Spec = Spec {
    lone_dash: true,
    ..NONE
};
const PKEXEC: Spec = Spec {
    long_flags: &["disable-internal-agent", "keep-cwd", "help", "version"],
    long_valued: &["user"],
    ..NONE
};
const FAKEROOT: Spec = Spec {
    short_flags: "uhv",
    short_valued: "sib",
    long_flags: &["unknown-is-real", "help", "version"],
    ..NONE
};
const FAKETIME: Spec = Spec {
    short_flags: "mf",
    short_valued: "p",
    long_flags: &["exclude-monotonic"],
    ..NONE
};
const NUMACTL: Spec = Spec {
    short_flags: "lsHa",
    short_valued: "imNCp",
    long_flags: &["localalloc", "show", "hardware", "all"],
    long_valued: &[
        "interleave",
        "membind",
        "cpunodebind",
        "physcpubind",
        "preferred",
    ],
    ..NONE
};
/// The dynamic loader run as a program (`ld.so [options] PROGRAM …`). `--preload`,
/// `--audit` and `--library-path` load code from elsewhere: not in the table, so unanalysable.
const LDSO: Spec = Spec {
    long_flags: &[
        "list",
        "verify",
        "inhibit-cache",
        "help",
        "version",
        "list-tunables",
        "list-diagnostics",
    ],
    long_valued: &[
        "argv0",
        "inhibit-rpath",
        "glibc-hwcaps-prefix",
        "glibc-hwcaps-mask",
    ],
    ..NONE
};

/// Whether `name` is the dynamic loader (`ld.so`, `ld-linux-x86-64.so.2`, `ld64.so.2`), which
/// runs the program named by its first operand.
fn is_dynamic_loader(name: &str) -> bool {
    name == "ld.so"
        || ((name.starts_with("ld-") || name.starts_with("ld64")) && name.contains(".so"))
}

/// Programs that run commands in a way the analyser does not follow: a language or syntax of
/// their own (editors' `:!cmd`, `expect`, fish and csh), a service or session that starts
/// commands later or elsewhere (`tmux`, `systemd-run`, `start-stop-daemon`, `crond`), or option
/// syntax too open to unwrap reliably. Reviewed data: `opaque_programs_are_unanalysable` runs
/// every name.
const OPAQUE_PROGRAMS: &[(&[&str], &str)] = &[
    (
        &[
            "vi",
            "vim",
            "nvim",
            "ex",
            "view",
            "rvim",
            "rview",
            "vimdiff",
            "gvim",
            "gview",
            "evim",
            "vim.basic",
            "vim.tiny",
            "vim.nox",
            "vim.gtk3",
            "nex",
            "ed",
            "emacs",
            "emacs-nox",
        ],
        "is an editor that runs commands (`:!cmd`, `-c`, `+cmd`, `-S`, scripts on standard input); edit files with the edit and write tools",
    ),
    (
        &["fish", "tcsh", "csh", "expect", "tclsh", "wish"],
        "runs a script in a language the analyser does not parse; use bash syntax",
    ),
    (
        &[
            "tmux",
            "screen",
            "dbus-launch",
            "dbus-run-session",
            "xvfb-run",
            "rlwrap",
            "xterm",
            "x-terminal-emulator",
            "gnome-terminal",
            "konsole",
            "vipe",
        ],
        "starts a session whose commands the analyser does not follow; run the command directly",
    ),
    (
        &[
            "systemd-run",
            "start-stop-daemon",
            "daemonize",
            "at",
            "batch",
            "entr",
            "pee",
            "mispipe",
            "crond",
            "cron",
            "run-parts",
            "tcpsvd",
            "udpsvd",
            "inetd",
            "httpd",
        ],
        "starts commands later or as a service, which the analyser does not follow; run the command directly",
    ),
    (
        &[
            "setpriv",
            "capsh",
            "cpulimit",
            "firejail",
            "bwrap",
            "proot",
            "runcon",
            "chpst",
            "setuidgid",
            "envuidgid",
            "envdir",
            "softlimit",
            "sshpass",
        ],
        "runs a command the analyser does not unwrap; run the command directly",
    ),
];

/// Whether a netcat or socat invocation runs a program for its connection (`nc -e`, `ncat
/// --sh-exec`, `socat … EXEC:cmd`).
fn relay_runs_program(program: &str, args: &[Word]) -> bool {
    match program {
        "socat" => args.iter().any(|arg| {
            arg.literal().is_none_or(|text| {
                let lower = text.to_ascii_lowercase();
                lower.contains("exec:") || lower.contains("system:")
            })
        }),
        _ => args.iter().any(|arg| {
            arg.literal().is_none_or(|text| {
                matches!(text, "--exec" | "--sh-exec" | "--lua-exec")
                    || text.starts_with("--exec=")
                    || text.starts_with("--sh-exec=")
                    || text.starts_with("--lua-exec=")
                    || (text.starts_with('-')
                        && !text.starts_with("--")
                        && text.contains(['e', 'c']))
            })
        }),
    }
}

const RELAYS: &[&str] = &[
    "nc",
    "ncat",
    "netcat",
    "nc.traditional",
    "nc.openbsd",
    "socat",
];

const XARGS: Spec = Spec {
    short_flags: "0prtxo",
    short_valued: "EILnPsda",
    short_optional: "eil",
    long_flags: &[
        "null",
        "interactive",
        "no-run-if-empty",
        "show-limits",
        "verbose",
        "exit",
        "open-tty",
    ],
    long_valued: &[
        "arg-file",
        "delimiter",
        "max-args",
        "max-procs",
        "max-chars",
        "process-slot-var",
    ],
    long_optional: &["eof", "replace", "max-lines"],
    ..NONE
};
const SHELL: Spec = Spec {
    short_flags: "abcefhkmnptuvxBCEHPTilrsD",
    short_valued: "oO",
    long_flags: &[
        "login",
        "norc",
        "noprofile",
        "posix",
        "restricted",
        "verbose",
        "noediting",
        "debugger",
        "dump-po-strings",
        "dump-strings",
        "help",
        "version",
        "pretty-print",
    ],
    long_valued: &["rcfile", "init-file"],
    plus_options: true,
    ..NONE
};

const SHELLS: &[&str] = &[
    "bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "rbash", "hush",
];

/// The options found before the operands.
struct Parsed {
    /// `(name, value)`; short options as `-x`, long as `--name`.
    options: Vec<(String, Option<String>)>,
    /// Index of the first operand in the argument list.
    operands: usize,
}

impl Parsed {
    fn has(&self, names: &[&str]) -> bool {
        self.options
            .iter()
            .any(|(name, _)| names.contains(&name.as_str()))
    }

    fn value(&self, names: &[&str]) -> Option<Option<&str>> {
        self.options
            .iter()
            .rev()
            .find(|(name, _)| names.contains(&name.as_str()))
            .map(|(_, value)| value.as_deref())
    }
}

fn literal_at<'a>(args: &'a [Word], index: usize, program: &str) -> Result<&'a str, String> {
    match &args[index] {
        Word::Literal(text) => Ok(text),
        Word::Dynamic(source) => Err(format!(
            "`{source}` after `{program}` is computed at run time, so the command `{program}` runs cannot be determined"
        )),
    }
}

fn parse_options(spec: &Spec, program: &str, args: &[Word]) -> Result<Parsed, String> {
    let mut options = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let text = literal_at(args, i, program)?;
        if text == "--" {
            i += 1;
            break;
        }
        if text == "-" && spec.lone_dash {
            options.push(("-".to_owned(), None));
            i += 1;
            continue;
        }
        if let Some(long) = text.strip_prefix("--").filter(|long| !long.is_empty()) {
            let (name, value) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (long, None),
            };
            if spec.long_any_valued && value.is_some() && resolve_long(spec, name).is_none() {
                options.push((format!("--{name}"), value));
                i += 1;
                continue;
            }
            let name = resolve_long(spec, name).ok_or_else(|| {
                format!(
                    "`{program}` is given the option `--{name}`, which the analyser does not know"
                )
            })?;
            if spec.long_flags.contains(&name) {
                if value.is_some() {
                    return Err(format!("`{program} --{name}` does not take a value"));
                }
                options.push((format!("--{name}"), None));
                i += 1;
            } else if spec.long_optional.contains(&name) {
                options.push((format!("--{name}"), value));
                i += 1;
            } else {
                let value = match value {
                    Some(value) => {
                        i += 1;
                        value
                    }
                    None => {
                        if i + 1 >= args.len() {
                            return Err(format!("`{program} --{name}` is missing its value"));
                        }
                        let value = literal_at(args, i + 1, program)?.to_owned();
                        i += 2;
                        value
                    }
                };
                options.push((format!("--{name}"), Some(value)));
            }
            continue;
        }
        let (sign, cluster) = match text.chars().next() {
            Some('-') if text.len() > 1 => ('-', &text[1..]),
            Some('+') if text.len() > 1 && spec.plus_options => ('+', &text[1..]),
            _ => break,
        };
        if spec.numeric_short && cluster.chars().all(|c| c.is_ascii_digit()) {
            options.push((text.to_owned(), None));
            i += 1;
            continue;
        }
        let mut consumed_next = false;
        for (offset, c) in cluster.char_indices() {
            let rest = &cluster[offset + c.len_utf8()..];
            let name = format!("{sign}{c}");
            if spec.short_flags.contains(c) {
                options.push((name, None));
            } else if spec.short_optional.contains(c) {
                options.push((name, (!rest.is_empty()).then(|| rest.to_owned())));
                break;
            } else if spec.short_valued.contains(c) {
                let value = if !rest.is_empty() {
                    rest.to_owned()
                } else if i + 1 < args.len() {
                    consumed_next = true;
                    literal_at(args, i + 1, program)?.to_owned()
                } else {
                    return Err(format!("`{program} {sign}{c}` is missing its value"));
                };
                options.push((name, Some(value)));
                break;
            } else {
                return Err(format!(
                    "`{program}` is given the option `{sign}{c}`, which the analyser does not know"
                ));
            }
        }
        i += if consumed_next { 2 } else { 1 };
    }
    Ok(Parsed {
        options,
        operands: i,
    })
}

/// GNU getopt accepts any unambiguous prefix of a long option.
fn resolve_long(spec: &Spec, name: &str) -> Option<&'static str> {
    let all = || {
        spec.long_flags
            .iter()
            .chain(spec.long_valued)
            .chain(spec.long_optional)
            .copied()
    };
    if let Some(exact) = all().find(|candidate| *candidate == name) {
        return Some(exact);
    }
    let mut prefixed = all().filter(|candidate| candidate.starts_with(name));
    match (prefixed.next(), prefixed.next()) {
        (Some(only), None) if !name.is_empty() => Some(only),
        _ => None,
    }
}

/// How a program in [`RUNNERS`] runs another program.
#[derive(Clone, Copy)]
enum Kind {
    /// Options (a [`Spec`]), operands particular to the program, then the command it runs.
    Wrapper(&'static Spec),
    /// Like [`Kind::Wrapper`], and changes privileges or the root: a command of its own too,
    /// so a rule can deny `sudo` and allowlist mode has to allow it explicitly.
    Privileged(&'static Spec),
    /// A command of its own that also runs commands named in its options or arguments.
    Runs(fn(&mut Analyser, &SimpleCommand, usize) -> Result<(), String>),
    /// A multi-call binary: the first argument names the program (`busybox sh -c …`).
    MultiCall,
}

/// One program the analyser looks inside. Reviewed data: for every entry, the test
/// `every_runner_is_looked_through` analyses `example` and expects to find `finds` (and the
/// script to be unanalysable when `opaque`).
// The examples are read by the table's test only.
#[cfg_attr(not(test), allow(dead_code))]
struct Runner {
    names: &'static [&'static str],
    kind: Kind,
    example: &'static str,
    finds: &'static str,
    opaque: bool,
}

const fn wrapper_entry(
    names: &'static [&'static str],
    spec: &'static Spec,
    example: &'static str,
) -> Runner {
    Runner {
        names,
        kind: Kind::Wrapper(spec),
        example,
        finds: "git push",
        opaque: false,
    }
}

const fn privileged_entry(
    names: &'static [&'static str],
    spec: &'static Spec,
    example: &'static str,
) -> Runner {
    Runner {
        names,
        kind: Kind::Privileged(spec),
        example,
        finds: "git push",
        opaque: false,
    }
}

const fn runs_entry(
    names: &'static [&'static str],
    look: fn(&mut Analyser, &SimpleCommand, usize) -> Result<(), String>,
    example: &'static str,
    finds: &'static str,
    opaque: bool,
) -> Runner {
    Runner {
        names,
        kind: Kind::Runs(look),
        example,
        finds,
        opaque,
    }
}

/// Programs that run another program from their arguments (shells, `eval` and the other
/// builtins are handled before this table).
const RUNNERS: &[Runner] = &[
    wrapper_entry(&["env"], &ENV, "env -i -u B -- A=1 git push"),
    wrapper_entry(&["command"], &COMMAND, "command -p git push"),
    wrapper_entry(&["builtin"], &NONE, "builtin eval git push"),
    wrapper_entry(&["exec"], &EXEC, "exec -a x git push"),
    wrapper_entry(&["nohup"], &NONE, "nohup git push"),
    wrapper_entry(&["setsid"], &SETSID, "setsid -w git push"),
    wrapper_entry(&["stdbuf"], &STDBUF, "stdbuf -oL git push"),
    wrapper_entry(&["ionice"], &IONICE, "ionice -c 3 git push"),
    wrapper_entry(&["nice"], &NICE, "nice -n 5 git push"),
    wrapper_entry(&["timeout"], &TIMEOUT, "timeout -k 1 5 git push"),
    wrapper_entry(&["time"], &TIME, "time -p git push"),
    wrapper_entry(&["taskset"], &TASKSET, "taskset -c 0 git push"),
    wrapper_entry(&["flock"], &FLOCK, "flock -w 1 /tmp/l git push"),
    wrapper_entry(&["watch"], &WATCH, "watch -n 1 'git push'"),
    wrapper_entry(&["xargs"], &XARGS, "xargs -0 -I{} git push"),
    wrapper_entry(&["prlimit"], &PRLIMIT, "prlimit --nofile=64 git push"),
    wrapper_entry(&["setarch"], &SETARCH, "setarch x86_64 -R git push"),
    wrapper_entry(SETARCH_ALIASES, &SETARCH, "linux32 git push"),
    wrapper_entry(&["chrt"], &CHRT, "chrt -o 0 git push"),
    wrapper_entry(
        &["strace"],
        &STRACE,
        "strace -f -o log --trace=all git push",
    ),
    wrapper_entry(&["ltrace"], &LTRACE, "ltrace -f -o log git push"),
    wrapper_entry(
        &["valgrind"],
        &VALGRIND,
        "valgrind --tool=memcheck -q git push",
    ),
    wrapper_entry(&["unbuffer"], &UNBUFFER, "unbuffer -p git push"),
    privileged_entry(&["sudo"], &SUDO, "sudo -u bob git push"),
    privileged_entry(&["doas"], &DOAS, "doas -u bob git push"),
    privileged_entry(&["su"], &SU, "su -c 'git push' bob"),
    privileged_entry(&["runuser"], &SU, "runuser -u bob -- git push"),
    privileged_entry(&["chroot"], &CHROOT, "chroot /srv git push"),
    privileged_entry(&["pkexec"], &PKEXEC, "pkexec --user bob git push"),
    privileged_entry(&["nsenter"], &NSENTER, "nsenter -t 1 -m git push"),
    privileged_entry(&["unshare"], &UNSHARE, "unshare -r -n git push"),
    wrapper_entry(&["fakeroot"], &FAKEROOT, "fakeroot -u git push"),
    wrapper_entry(
        &["faketime"],
        &FAKETIME,
        "faketime -f '2020-01-01 00:00:00' git push",
    ),
    wrapper_entry(&["numactl"], &NUMACTL, "numactl -l -N 0 git push"),
    wrapper_entry(
        &["catchsegv", "eatmydata", "chronic"],
        &NONE,
        "catchsegv git push",
    ),
    wrapper_entry(
        &[
            "ld.so",
            "ld-linux-x86-64.so.2",
            "ld-linux.so.2",
            "ld64.so.2",
        ],
        &LDSO,
        "ld.so --argv0 x git push",
    ),
    Runner {
        names: &["busybox", "toybox"],
        kind: Kind::MultiCall,
        example: "busybox nice git push",
        finds: "git push",
        opaque: false,
    },
    runs_entry(
        &["find"],
        find_exec,
        "find . -okdir git push \\;",
        "git push",
        false,
    ),
    runs_entry(
        &["git"],
        git,
        "git -c core.pager='git push' log",
        "git push",
        false,
    ),
    wrapper_entry(&["script"], &SCRIPT, "script -q -c 'git push' /dev/null"),
    wrapper_entry(&["sg"], &SG, "sg staff -c 'git push'"),
    runs_entry(
        &["gdb"],
        runners::gdb,
        "gdb -batch --args git push",
        "git push",
        true,
    ),
    runs_entry(
        &["parallel"],
        runners::parallel,
        "parallel git ::: push",
        "git …",
        false,
    ),
    runs_entry(
        &["tar"],
        runners::tar,
        "tar --to-command='git push' -xf x.tar",
        "git push",
        false,
    ),
    runs_entry(
        &["rsync"],
        runners::rsync,
        "rsync -av -e 'git push' a b:c",
        "git push",
        false,
    ),
    runs_entry(
        &["ssh", "scp", "sftp"],
        runners::ssh,
        "ssh -o ProxyCommand='git push' h",
        "git push",
        false,
    ),
    runs_entry(
        &["rg"],
        runners::rg,
        "rg --pre 'git push' x",
        "git push",
        false,
    ),
    runs_entry(
        &["sort"],
        runners::sort,
        "sort --compress-program='git push' x",
        "git push",
        false,
    ),
    runs_entry(
        &["go"],
        runners::go,
        "go test -exec 'git push' ./...",
        "git push",
        false,
    ),
    runs_entry(
        &["cargo"],
        runners::cargo,
        "cargo --config 'target.x.runner=\"git push\"' test",
        "",
        true,
    ),
    runs_entry(
        &["awk", "gawk", "mawk", "nawk"],
        runners::awk,
        "awk 'BEGIN { system(\"git push\") }'",
        "",
        true,
    ),
    runs_entry(&["sed"], runners::sed, "sed 's/x/git push/e' f", "", true),
];

fn git(analyser: &mut Analyser, command: &SimpleCommand, depth: usize) -> Result<(), String> {
    analyser.git(&command.args, depth)
}

/// Normalise `command` and hand every command it runs to the analyser.
pub(super) fn normalise(analyser: &mut Analyser, command: SimpleCommand, depth: usize) {
    // A wrapper or builtin named by a path outside the system directories may be anything
    // the agent wrote: record it as a program of its own, and still look inside.
    let system_named = command
        .program_path
        .as_deref()
        .is_none_or(is_system_program_path);
    let program = command.program.clone();
    let result = match program.as_str() {
        name if SHELLS.contains(&name) => shell(analyser, &command, depth),
        "eval" if system_named => eval(analyser, &command, depth),
        "source" | "." | "enable" | "fc" if system_named => Err(format!(
            "`{program}` runs code the analyser cannot see; run the commands directly"
        )),
        "trap" if system_named => trap(analyser, &command, depth),
        "alias" if system_named => alias(analyser, command.clone(), depth),
        // Completion specs run a command (`-C`) or a function (`-F`) when completing;
        // `compgen` completes at once.
        "compgen" | "complete" if system_named => {
            let sets_runner = |text: &str| {
                text.starts_with('-') && !text.starts_with("--") && text.contains(['C', 'F'])
            };
            if command
                .args
                .iter()
                .any(|arg| arg.literal().is_none_or(sets_runner))
            {
                Err(format!(
                    "`{program} -C`/`-F` runs a command or function the analyser does not follow"
                ))
            } else {
                analyser.record(command.clone(), depth);
                Ok(())
            }
        }
        "hash" | "mapfile" | "readarray" if system_named => {
            let flag = if program == "hash" { 'p' } else { 'C' };
            let sets_hook = |text: &str| {
                text.starts_with('-') && !text.starts_with("--") && text.contains(flag)
            };
            if command
                .args
                .iter()
                .any(|arg| arg.literal().is_none_or(sets_hook))
            {
                Err(format!(
                    "`{program} -{flag}` can make later commands run code the analyser cannot see"
                ))
            } else {
                analyser.record(command.clone(), depth);
                Ok(())
            }
        }
        name if OPAQUE_PROGRAMS
            .iter()
            .any(|(names, _)| names.contains(&name)) =>
        {
            let reason = OPAQUE_PROGRAMS
                .iter()
                .find(|(names, _)| names.contains(&name))
                .map_or("", |(_, reason)| reason);
            Err(format!("`{program}` {reason}"))
        }
        name if RELAYS.contains(&name) && relay_runs_program(name, &command.args) => Err(format!(
            "`{program}` runs a program for its connections (`-e`, `-c`, `--exec`, `EXEC:`); run the command directly"
        )),
        name if name.len() > 4 && name.starts_with("git-") => {
            // `git-push`, `/usr/lib/git-core/git-push`: git's dashed programs are its
            // subcommands.
            analyser.record(command.clone(), depth);
            let mut argv = vec![
                Word::Literal("git".to_owned()),
                Word::Literal(name["git-".len()..].to_owned()),
            ];
            argv.extend(command.args.iter().cloned());
            analyser.within(program.clone(), |analyser| {
                analyser.run_with_tail(argv, command.open_tail, depth)
            });
            Ok(())
        }
        name => match RUNNERS.iter().find(|runner| {
            runner.names.contains(&name) || (runner.names[0] == "ld.so" && is_dynamic_loader(name))
        }) {
            Some(runner) => look_inside(analyser, runner.kind, &command, system_named, depth),
            None => {
                analyser.record(command.clone(), depth);
                Ok(())
            }
        },
    };
    if let Err(reason) = result {
        analyser.opaque(reason);
    }
}

fn look_inside(
    analyser: &mut Analyser,
    kind: Kind,
    command: &SimpleCommand,
    system_named: bool,
    depth: usize,
) -> Result<(), String> {
    let step = command.program.clone();
    match kind {
        Kind::Runs(look) => {
            analyser.record(command.clone(), depth);
            analyser.within(step, |analyser| look(analyser, command, depth))
        }
        Kind::MultiCall => {
            if !system_named || command.args.is_empty() {
                analyser.record(command.clone(), depth);
            }
            if !command.args.is_empty() {
                analyser.within(step, |analyser| {
                    analyser.run_with_tail(command.args.clone(), command.open_tail, depth)
                });
            }
            Ok(())
        }
        Kind::Wrapper(spec) | Kind::Privileged(spec) => {
            let recorded = !system_named || matches!(kind, Kind::Privileged(_));
            if recorded {
                analyser.record(command.clone(), depth);
            }
            match wrapper(analyser, spec, command, depth)? {
                Inner::Nothing => {
                    // Nothing wrapped (`env`, `exec 3>&1`, `command -v x`): the wrapper is
                    // the program that runs.
                    if !recorded {
                        analyser.record(command.clone(), depth);
                    }
                }
                Inner::Script(script) => {
                    analyser.within(step, |analyser| analyser.script(&script, depth + 1))
                }
                Inner::Command(words, open_tail) => analyser.within(step, |analyser| {
                    analyser.run_with_tail(words, open_tail, depth)
                }),
            }
            Ok(())
        }
    }
}

/// What a wrapper runs.
enum Inner {
    /// Nothing: the wrapper only looks something up or changes the shell itself.
    Nothing,
    /// A script string run through a shell (`su -c`, `flock -c`, `watch`).
    Script(String),
    /// A command line, and whether arguments are appended at run time.
    Command(Vec<Word>, bool),
}

fn wrapper(
    analyser: &mut Analyser,
    spec: &Spec,
    command: &SimpleCommand,
    depth: usize,
) -> Result<Inner, String> {
    let program = command.program.as_str();
    let mut args: &[Word] = &command.args;
    // `setarch ARCH [options] [command]`: the architecture comes first.
    if program == "setarch"
        && let Some(Word::Literal(arch)) = args.first()
        && !arch.starts_with('-')
    {
        args = &args[1..];
    }
    let parsed = parse_options(spec, program, args)?;
    let mut rest: Vec<Word> = args[parsed.operands..].to_vec();
    let mut open_tail = command.open_tail;
    match program {
        "env" => {
            if let Some(Some(split)) = parsed.value(&["-S", "--split-string"]) {
                let mut words = split_literal_words(split).ok_or_else(|| {
                    format!("`env -S {split}` splits a string the analyser cannot resolve")
                })?;
                words.extend(rest);
                rest = words;
            }
            // NAME=VALUE words before the command. env takes every word with a `=` as an
            // assignment, whatever the name.
            while let Some(Word::Literal(text)) = rest.first() {
                let Some((name, value)) = text.split_once('=') else {
                    break;
                };
                exported_name(name)?;
                analyser.check_assignment(name, Some(value), depth);
                rest.remove(0);
            }
            if rest.iter().take(1).any(|word| word.literal().is_none()) {
                return Err(format!(
                    "`{}` after `env` is computed at run time, so the command `env` runs cannot be determined",
                    display(&rest[0])
                ));
            }
        }
        "prlimit" if parsed.has(&["-p", "--pid"]) => return Ok(Inner::Nothing),
        "setarch" if parsed.has(&["--list", "--show"]) => return Ok(Inner::Nothing),
        "setarch" if args.len() == command.args.len() => {
            // The architecture came after the options.
            take_operand(&mut rest, program, "ARCH")?;
            if rest.is_empty() {
                return Err(format!(
                    "`{program}` without a command starts a shell that reads commands the analyser cannot see"
                ));
            }
        }
        name if (name == "setarch" || SETARCH_ALIASES.contains(&name)) && rest.is_empty() => {
            return Err(format!(
                "`{program}` without a command starts a shell that reads commands the analyser cannot see"
            ));
        }
        "chrt"
            if parsed.has(&[
                "-p",
                "--pid",
                "-m",
                "--max",
                "-h",
                "--help",
                "-V",
                "--version",
            ]) =>
        {
            return Ok(Inner::Nothing);
        }
        "chrt" => take_operand(&mut rest, program, "PRIORITY")?,
        "script" => {
            return match parsed.value(&["-c", "--command"]) {
                Some(Some(script)) => Ok(Inner::Script(script.to_owned())),
                Some(None) | None => Err(
                    "`script` without -c starts a shell that reads commands the analyser cannot see"
                        .to_owned(),
                ),
            };
        }
        "sg" => {
            // sg [-] GROUP [-c] COMMAND: the command is one string run by /bin/sh -c.
            take_operand(&mut rest, program, "GROUP")?;
            if rest.first().and_then(Word::literal) == Some("-c") {
                rest.remove(0);
            }
            if rest.is_empty() {
                return Err(
                    "`sg` without a command starts a shell that reads commands the analyser cannot see"
                        .to_owned(),
                );
            }
            let words = rest
                .iter()
                .map(|word| word.literal().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| "`sg` is given a command computed at run time".to_owned())?;
            return Ok(Inner::Script(words.join(" ")));
        }
        "faketime" => take_operand(&mut rest, program, "TIMESTAMP")?,
        "numactl" if parsed.has(&["-s", "--show", "-H", "--hardware"]) && rest.is_empty() => {
            return Ok(Inner::Nothing);
        }
        "nsenter" | "unshare" | "pkexec" | "fakeroot" | "numactl" if rest.is_empty() => {
            return Err(format!(
                "`{program}` without a command starts a shell that reads commands the analyser cannot see"
            ));
        }
        // `command -v x` only looks a program up.
        "command" if parsed.has(&["-v", "-V"]) => return Ok(Inner::Nothing),
        "chroot" => {
            take_operand(&mut rest, program, "NEWROOT")?;
            if rest.is_empty() {
                return Err("`chroot` without a command starts an interactive shell".to_owned());
            }
        }
        "ionice" if parsed.has(&["-p", "-P", "-u", "--pid", "--pgid", "--uid"]) => {
            return Ok(Inner::Nothing);
        }
        "timeout" => take_operand(&mut rest, program, "DURATION")?,
        "taskset" if parsed.has(&["-p", "--pid"]) => return Ok(Inner::Nothing),
        "taskset" => take_operand(&mut rest, program, "MASK")?,
        "flock" => {
            take_operand(&mut rest, program, "FILE")?;
            if let Some(Some(script)) = parsed.value(&["-c", "--command"]) {
                return Ok(Inner::Script(script.to_owned()));
            }
            // flock stops parsing options at the lock file, then takes `-c`/`--command`
            // right after it: `flock -x FILE -c 'git push'`.
            let after_file = rest.first().map(|word| word.literal());
            match after_file {
                Some(Some("-c" | "--command")) => {
                    return match rest.get(1) {
                        Some(Word::Literal(script)) => Ok(Inner::Script(script.clone())),
                        Some(Word::Dynamic(source)) => Err(format!(
                            "`flock -c {source}` runs a script computed at run time"
                        )),
                        None => Err("`flock -c` is missing its command".to_owned()),
                    };
                }
                Some(Some(text)) if text.starts_with("--command=") => {
                    return Ok(Inner::Script(text["--command=".len()..].to_owned()));
                }
                _ => {}
            }
        }
        // watch runs its arguments joined by spaces through `sh -c` unless given -x.
        "watch" if !parsed.has(&["-x", "--exec"]) => {
            let words = rest
                .iter()
                .map(|word| word.literal().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| "`watch` is given a command computed at run time".to_owned())?;
            return Ok(Inner::Script(words.join(" ")));
        }
        "xargs" => {
            let replace = match parsed.value(&["-I"]) {
                Some(value) => value.map(str::to_owned),
                None => parsed
                    .value(&["-i", "--replace"])
                    .map(|value| value.unwrap_or("{}").to_owned()),
            };
            if rest.is_empty() {
                rest.push(Word::Literal("echo".to_owned()));
            }
            match replace {
                Some(replace) => {
                    rest = rest
                        .into_iter()
                        .map(|word| match word {
                            Word::Literal(text) if text.contains(&replace) => Word::Dynamic(text),
                            other => other,
                        })
                        .collect();
                }
                None => open_tail = true,
            }
        }
        "sudo" | "doas" => {
            if parsed.has(&["-e", "--edit"]) {
                rest.insert(0, Word::Literal("sudoedit".to_owned()));
            } else if parsed.has(&[
                "-l",
                "-v",
                "-K",
                "-k",
                "-V",
                "-h",
                "--list",
                "--validate",
                "--version",
                "--help",
                "--remove-timestamp",
                "-L",
            ]) && rest.is_empty()
            {
                return Ok(Inner::Nothing);
            }
            while let Some(Word::Literal(text)) = rest.first() {
                match text.split_once('=') {
                    Some((name, value)) if !name.is_empty() && !name.starts_with('-') => {
                        exported_name(name)?;
                        analyser.check_assignment(name, Some(value), depth);
                        rest.remove(0);
                    }
                    _ => break,
                }
            }
            if rest.is_empty() {
                return Err(format!(
                    "`{program}` without a command starts a shell that reads commands the analyser cannot see"
                ));
            }
        }
        "su" | "runuser" => {
            if let Some(Some(script)) = parsed.value(&["-c", "--command", "--session-command"]) {
                return Ok(Inner::Script(script.to_owned()));
            }
            if program == "runuser" && parsed.has(&["-u", "--user"]) {
                // runuser -u USER [--] COMMAND …
            } else {
                return Err(format!(
                    "`{program}` without -c starts a shell that reads commands the analyser cannot see"
                ));
            }
        }
        _ => {}
    }
    if rest.is_empty() {
        return Ok(Inner::Nothing);
    }
    Ok(Inner::Command(rest, open_tail))
}

fn take_operand(rest: &mut Vec<Word>, program: &str, what: &str) -> Result<(), String> {
    if rest.is_empty() {
        return Err(format!("`{program}` is missing its {what}"));
    }
    rest.remove(0);
    Ok(())
}

fn shell(analyser: &mut Analyser, command: &SimpleCommand, depth: usize) -> Result<(), String> {
    let program = command.program.as_str();
    let system_named = command
        .program_path
        .as_deref()
        .is_none_or(is_system_program_path);
    if !system_named {
        analyser.record(command.clone(), depth);
    }
    let parsed = parse_options(&SHELL, program, &command.args)?;
    let operands = &command.args[parsed.operands..];
    if parsed.has(&["-c"]) {
        return match operands.first() {
            Some(Word::Literal(script)) => {
                analyser.within(format!("{program} -c"), |analyser| {
                    analyser.script(script, depth + 1)
                });
                Ok(())
            }
            Some(Word::Dynamic(source)) => Err(format!(
                "`{program} -c {source}` runs a script computed at run time"
            )),
            None => Err(format!("`{program} -c` is missing its script")),
        };
    }
    if parsed.has(&["-s"]) || operands.is_empty() {
        return Err(format!(
            "`{program}` without -c reads commands from standard input, which the analyser cannot see"
        ));
    }
    Err(format!(
        "`{program} {}` runs a script file the analyser cannot see; run its commands directly",
        display(&operands[0])
    ))
}

fn eval(analyser: &mut Analyser, command: &SimpleCommand, depth: usize) -> Result<(), String> {
    let mut args = command.args.as_slice();
    if let Some(Word::Literal(first)) = args.first()
        && first == "--"
    {
        args = &args[1..];
    }
    let words = args
        .iter()
        .map(|word| word.literal().map(str::to_owned))
        .collect::<Option<Vec<String>>>()
        .ok_or_else(|| {
            "`eval` runs a string computed at run time; run the commands directly".to_owned()
        })?;
    if command.open_tail {
        return Err("`eval` is given arguments at run time".to_owned());
    }
    analyser.script(&words.join(" "), depth + 1);
    Ok(())
}

fn trap(analyser: &mut Analyser, command: &SimpleCommand, depth: usize) -> Result<(), String> {
    analyser.record(command.clone(), depth);
    let args = &command.args;
    let mut index = 0;
    while let Some(Word::Literal(text)) = args.get(index) {
        if text == "--" {
            index += 1;
            break;
        }
        if text.starts_with('-') && text.len() > 1 {
            index += 1;
            continue;
        }
        break;
    }
    let rest = &args[index.min(args.len())..];
    if rest.len() < 2 {
        return Ok(());
    }
    match &rest[0] {
        Word::Literal(action) if action == "-" || action.is_empty() => Ok(()),
        Word::Literal(action) => {
            analyser.script(action, depth + 1);
            Ok(())
        }
        Word::Dynamic(source) => Err(format!(
            "`trap {source}` installs a handler computed at run time"
        )),
    }
}

fn alias(analyser: &mut Analyser, command: SimpleCommand, depth: usize) -> Result<(), String> {
    if command
        .args
        .iter()
        .any(|arg| arg.literal().is_none_or(|text| text.contains('=')))
    {
        return Err(
            "`alias` defines a command the analyser cannot follow; call programs by name"
                .to_owned(),
        );
    }
    analyser.record(command, depth);
    Ok(())
}

fn find_exec(analyser: &mut Analyser, command: &SimpleCommand, depth: usize) -> Result<(), String> {
    let args = &command.args;
    let mut i = 0;
    while i < args.len() {
        let is_exec = matches!(
            args[i].literal(),
            Some("-exec" | "-execdir" | "-ok" | "-okdir")
        );
        if !is_exec {
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut end = start;
        while end < args.len() && !matches!(args[end].literal(), Some(";" | "+")) {
            end += 1;
        }
        let nested: Vec<Word> = args[start..end]
            .iter()
            .map(|word| match word {
                Word::Literal(text) if text.contains("{}") => Word::Dynamic(text.clone()),
                other => other.clone(),
            })
            .collect();
        analyser.run_with_tail(nested, false, depth);
        i = end + 1;
    }
    Ok(())
}

/// An environment entry a wrapper puts before the command must be a plain variable: bash
/// imports `BASH_FUNC_name%%=() { …; }` as the function `name`, and other odd names are what
/// such tricks look like.
fn exported_name(name: &str) -> Result<(), String> {
    if is_variable_name(name) {
        return Ok(());
    }
    Err(format!(
        "the environment entry `{name}=…` is not a variable name; a shell would import `BASH_FUNC_name%%` entries as functions the analyser cannot see"
    ))
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Split a string into literal words with shell quoting rules; `None` if any word is dynamic
/// or the string contains operators.
pub(super) fn split_literal_words(text: &str) -> Option<Vec<Word>> {
    let tokens = brush_parser::tokenize_str(text).ok()?;
    let mut analyser = Analyser::default();
    let mut words = Vec::new();
    for token in tokens {
        match token {
            brush_parser::Token::Word(word, _) => {
                let expanded = analyser.expand(&word, 0);
                if expanded.dynamic {
                    return None;
                }
                words.push(Word::Literal(expanded.text));
            }
            brush_parser::Token::Operator(..) => return None,
        }
    }
    analyser.out.is_complete().then_some(words)
}

fn display(word: &Word) -> String {
    word.display()
}

#[cfg(test)]
mod tests {
    use super::super::analyse_script;

    fn commands(script: &str) -> Vec<String> {
        let analysis = analyse_script(script);
        assert!(
            analysis.is_complete(),
            "unexpected unanalysable parts in {script:?}: {:?}",
            analysis.unanalysable
        );
        analysis.commands.iter().map(ToString::to_string).collect()
    }

    fn opaque(script: &str) -> String {
        let analysis = analyse_script(script);
        assert!(
            !analysis.is_complete(),
            "{script:?} should be unanalysable, got {:?}",
            analysis.commands
        );
        analysis.unanalysable.join("; ")
    }

    #[test]
    fn wrappers_are_stripped_with_their_options() {
        let cases: &[(&str, &[&str])] = &[
            ("env git push", &["git push"]),
            ("env -i A=1 B=2 git push", &["git push"]),
            ("env -u HOME --chdir=/x -- git push", &["git push"]),
            ("env -S 'git push' origin", &["git push origin"]),
            ("command git push", &["git push"]),
            ("command -p git push", &["git push"]),
            ("builtin echo hi", &["echo hi"]),
            ("exec git push", &["git push"]),
            ("exec -a name git push", &["git push"]),
            ("nohup git push", &["git push"]),
            ("setsid -w git push", &["git push"]),
            ("stdbuf -oL -e0 git push", &["git push"]),
            ("ionice -c2 -n 7 git push", &["git push"]),
            ("nice git push", &["git push"]),
            ("nice -n 5 git push", &["git push"]),
            ("nice -5 git push", &["git push"]),
            ("nice --adjustment=5 git push", &["git push"]),
            ("timeout 5 git push", &["git push"]),
            ("timeout -s KILL -k 1 5s git push", &["git push"]),
            ("timeout --signal=TERM --preserve 5 git push", &["git push"]),
            ("time -p git push", &["git push"]),
            ("taskset -c 0 git push", &["git push"]),
            ("flock /tmp/l git push", &["git push"]),
            ("flock -c 'git push' /tmp/l", &["git push"]),
            ("flock -x -w 1 /tmp/l -c 'git push'", &["git push"]),
            ("flock /tmp/l --command 'git push'", &["git push"]),
            ("flock /tmp/l --command='git push'", &["git push"]),
            ("watch -n 1 git push", &["git push"]),
            ("watch -x git push", &["git push"]),
            ("xargs git push", &["git push …"]),
            ("xargs -0 -n1 git push", &["git push …"]),
            ("xargs -I{} git push {}", &["git push {}"]),
            ("xargs", &["echo …"]),
            ("sudo git push", &["sudo git push", "git push"]),
            (
                "sudo -u bob -E FOO=/x git push",
                &["sudo -u bob -E FOO=/x git push", "git push"],
            ),
            (
                "doas -u bob git push",
                &["doas -u bob git push", "git push"],
            ),
            (
                "su -c 'git push' bob",
                &["su -c 'git push' bob", "git push"],
            ),
            (
                "runuser -u bob -- git push",
                &["runuser -u bob -- git push", "git push"],
            ),
            (
                "chroot /srv git push",
                &["chroot /srv git push", "git push"],
            ),
            ("busybox git push", &["git push"]),
            ("/usr/bin/env /usr/bin/git push", &["/usr/bin/git push"]),
            ("env nice timeout 5 command git push", &["git push"]),
        ];
        for (script, expected) in cases {
            assert_eq!(&commands(script), expected, "{script}");
        }
    }

    #[test]
    fn every_runner_is_looked_through() {
        for runner in super::RUNNERS {
            let analysis = analyse_script(runner.example);
            let found: Vec<String> = analysis.commands.iter().map(ToString::to_string).collect();
            let names = runner.names.join("/");
            assert!(
                runner.finds.is_empty() || found.iter().any(|c| c == runner.finds),
                "{names}: {:?} should find {:?} in {found:?} ({:?})",
                runner.example,
                runner.finds,
                analysis.unanalysable
            );
            assert_eq!(
                !analysis.is_complete(),
                runner.opaque,
                "{names}: {:?}: {:?}",
                runner.example,
                analysis.unanalysable
            );
            // Every name of the entry is looked through the same way.
            for name in runner.names.iter().skip(1) {
                let example = runner.example.replacen(runner.names[0], name, 1);
                assert_eq!(
                    analyse_script(&example).is_complete(),
                    analysis.is_complete(),
                    "{example}"
                );
            }
        }
    }

    #[test]
    fn opaque_programs_are_unanalysable() {
        for (names, _) in super::OPAQUE_PROGRAMS {
            for name in *names {
                assert!(
                    opaque(&format!("{name} -c 'git push'")).contains(name),
                    "{name}"
                );
                assert!(
                    opaque(&format!("busybox {name} x")).contains(name),
                    "{name}"
                );
            }
        }
        for script in [
            "nc -l -p 1 -e /bin/sh",
            "busybox nc -lp 1 -e git",
            "ncat --sh-exec 'git push' h 1",
            "ncat --exec=/usr/bin/git h 1",
            "socat TCP-LISTEN:1 EXEC:'git push'",
            "socat - system:'git push'",
        ] {
            assert!(opaque(script).contains("connections"), "{script}");
        }
        assert_eq!(commands("nc -z h 22"), ["nc -z h 22"]);
        assert_eq!(commands("socat - TCP:h:1"), ["socat - TCP:h:1"]);
    }

    #[test]
    fn dashed_git_programs_and_the_loader_are_looked_through() {
        assert_eq!(
            commands("/usr/lib/git-core/git-push origin"),
            ["/usr/lib/git-core/git-push origin", "git push origin"]
        );
        assert_eq!(commands("git-push"), ["git-push", "git push"]);
        assert_eq!(
            commands("/lib64/ld-linux-x86-64.so.2 /usr/bin/git push"),
            [
                "/lib64/ld-linux-x86-64.so.2 /usr/bin/git push",
                "/usr/bin/git push"
            ]
        );
        assert_eq!(
            commands("ld-linux-aarch64.so.1 --inhibit-cache git push"),
            ["git push"]
        );
        assert!(opaque("ld.so --preload ./x.so /usr/bin/git status").contains("--preload"));
        assert!(opaque("ld.so --library-path . git status").contains("--library-path"));
        assert!(opaque("fakeroot").contains("shell"));
        assert!(opaque("fakeroot --faked ./x git push").contains("--faked"));
        assert!(opaque("faketime --date-prog ./x 2020-01-01 git").contains("--date-prog"));
        assert_eq!(commands("faketime '2020-01-01' git push"), ["git push"]);
        assert_eq!(commands("numactl --hardware"), ["numactl --hardware"]);
        assert_eq!(commands("numactl --interleave=all git push"), ["git push"]);
    }

    #[test]
    fn new_wrappers_need_their_command() {
        assert!(opaque("setarch x86_64").contains("shell"));
        assert!(opaque("linux32").contains("shell"));
        assert!(opaque("nsenter -t 1 -a").contains("shell"));
        assert!(opaque("unshare -r").contains("shell"));
        assert!(opaque("pkexec").contains("shell"));
        assert!(opaque("script -q log").contains("-c"));
        assert!(opaque("sg staff").contains("shell"));
        assert!(opaque("prlimit --frob git push").contains("--frob"));
        assert_eq!(commands("setarch -R x86_64 git push"), ["git push"]);
        assert_eq!(
            commands("prlimit -p 1 --nofile=5"),
            ["prlimit -p 1 --nofile=5"]
        );
        assert_eq!(commands("chrt -p 1"), ["chrt -p 1"]);
        assert_eq!(commands("strace -p 1"), ["strace -p 1"]);
        assert_eq!(commands("pkexec git push"), ["pkexec git push", "git push"]);
        assert_eq!(
            commands("env -S 'GIT_PAGER=cat git log'"),
            ["cat", "git log"]
        );
    }

    #[test]
    fn shell_strings_are_parsed_recursively() {
        assert_eq!(commands("bash -c 'git push'"), ["git push"]);
        assert_eq!(commands("sh -c \"cd x && git push\""), ["cd x", "git push"]);
        assert_eq!(commands("bash -lc 'a; b' name arg"), ["a", "b"]);
        assert_eq!(commands("zsh -e -c 'git push'"), ["git push"]);
        assert_eq!(commands("bash +o pipefail -c 'git push'"), ["git push"]);
        assert_eq!(commands("bash -c \"bash -c 'git push'\""), ["git push"]);
        assert_eq!(commands("eval git push"), ["git push"]);
        assert_eq!(commands("eval 'git push; ls'"), ["git push", "ls"]);
        assert_eq!(
            commands("trap 'git push' EXIT"),
            ["trap 'git push' EXIT", "git push"]
        );
        assert_eq!(commands("trap - EXIT"), ["trap - EXIT"]);
    }

    #[test]
    fn find_exec_commands_are_found() {
        assert_eq!(
            commands("find . -name '*.rs' -exec git add {} \\; -execdir rm {} +"),
            [
                "find . -name '*.rs' -exec git add {} ';' -execdir rm {} +",
                "git add {}",
                "rm {}"
            ]
        );
        assert_eq!(
            commands("find . -exec sh -c 'git push' \\;"),
            ["find . -exec sh -c 'git push' ';'", "git push"]
        );
    }

    #[test]
    fn opaque_constructs_are_reported() {
        assert!(opaque("bash script.sh").contains("script file"));
        assert!(opaque("echo 'git push' | bash").contains("standard input"));
        assert!(opaque("bash -c \"$x\"").contains("computed at run time"));
        assert!(opaque("eval \"$x\"").contains("eval"));
        assert!(opaque("source ./x.sh").contains("source"));
        assert!(opaque(". ./x.sh").contains("`.`"));
        assert!(opaque("alias g='git push'").contains("alias"));
        assert!(opaque("hash -p ./evil git").contains("hash -p"));
        assert!(opaque("enable -f ./x.so git").contains("enable"));
        assert!(opaque("mapfile -C cb arr").contains("mapfile -C"));
        assert!(opaque("readarray -tC cb arr").contains("readarray -C"));
        assert!(opaque("compgen -C 'git push' x").contains("compgen -C"));
        assert!(opaque("complete -o default -F f x").contains("complete -C"));
        assert_eq!(commands("compgen -W 'a b' a"), ["compgen -W 'a b' a"]);
        assert!(opaque("env 'BASH_FUNC_f%%=() { git push; }' bash -c f").contains("BASH_FUNC"));
        assert!(opaque("env 'a-b=1' git push").contains("not a variable name"));
        assert!(opaque("flock /tmp/l -c \"$x\"").contains("computed at run time"));
        assert_eq!(commands("mapfile -t lines"), ["mapfile -t lines"]);
        assert!(opaque("timeout $T git push").contains("$T"));
        assert!(opaque("nice -n $N git push").contains("$N"));
        assert!(opaque("env $X git push").contains("$X"));
        assert!(opaque("timeout --frobnicate 5 git push").contains("--frobnicate"));
        assert!(opaque("sudo -s").contains("shell"));
        assert!(opaque("su bob").contains("shell"));
        assert!(opaque("env PATH=/tmp git push").contains("PATH"));
        assert!(opaque("sudo LD_PRELOAD=x git").contains("LD_PRELOAD"));
        assert!(opaque("xargs -I{} sh -c '{}'").contains("computed at run time"));
    }

    #[test]
    fn path_named_wrappers_are_programs_of_their_own() {
        assert_eq!(
            commands("./timeout 5 git push"),
            ["./timeout 5 git push", "git push"]
        );
        assert_eq!(
            commands("./bash -c 'git push'"),
            ["./bash -c 'git push'", "git push"]
        );
        assert_eq!(commands("./eval git push"), ["./eval git push"]);
        assert!(super::is_system_program_path("/usr/bin/git"));
        assert!(!super::is_system_program_path("/usr/bin/"));
        assert!(!super::is_system_program_path("/home/me/bin/git"));
        assert!(!super::is_system_program_path("git"));
    }

    #[test]
    fn lookups_do_not_unwrap() {
        assert_eq!(commands("command -v git"), ["command -v git"]);
        assert_eq!(commands("sudo -l"), ["sudo -l"]);
        assert_eq!(commands("env"), ["env"]);
        assert_eq!(commands("exec 3>&1"), ["exec"]);
        assert_eq!(commands("ionice -p 1"), ["ionice -p 1"]);
    }
}
