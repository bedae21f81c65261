use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_core::sandbox::{NetworkMode, SandboxSpec, SpecSources};

use super::*;

/// A layout over `/ws` (writable) and `/usr` (read-only): `.git/**` protected (line 5),
/// `**/.env` denied (line 3).
struct Fake {
    spec: SandboxSpec,
    asked: std::sync::Mutex<Vec<PathBuf>>,
}

impl Fake {
    fn new() -> Fake {
        let mut spec = SandboxSpec {
            protected: vec![".git/**".into()],
            denied: vec!["**/.env".into()],
            sources: SpecSources {
                file: "p.toml".into(),
                protected: vec![5],
                denied: vec![3],
                write: 2,
                network: 7,
                egress_allow: vec![],
                egress_deny: vec![],
                egress_ask: vec![],
                timeout: 9,
                max_timeout: 10,
                memory: 11,
                pids: 12,
                file_size: 13,
            },
            ..SandboxSpec::default()
        };
        spec.limits.file_size_bytes = Some(1 << 20);
        spec.limits.pids = Some(64);
        Fake {
            spec,
            asked: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl DenialLayout for Fake {
    fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    fn classify(&self, path: &Path) -> Option<PathEntry> {
        self.asked.lock().unwrap().push(path.to_path_buf());
        if path.starts_with("/ws/.git") {
            Some(PathEntry::Protected(0))
        } else if path.file_name().is_some_and(|name| name == ".env") {
            Some(PathEntry::Denied(0))
        } else if path.starts_with("/ws") {
            None
        } else if path.starts_with("/usr") {
            Some(PathEntry::ReadOnly)
        } else {
            None
        }
    }
}

fn failed(output: &str) -> Evidence<'_> {
    ended(output, Some(ExitStatus::Code(1)))
}

fn ended(output: &str, status: Option<ExitStatus>) -> Evidence<'_> {
    Evidence {
        status,
        termination: Termination::Exited,
        output,
        cwd: Path::new("/ws"),
        timeout: Duration::from_secs(120),
        timeout_requested: false,
    }
}

const PROTECTED: &str = "Sandbox: /ws/.git/config is protected (read-only) by `.git/**` in \
`[filesystem] protect` (p.toml:5), so writing it was refused. Leave it unchanged; the operator \
can remove or narrow that entry.";

#[test]
fn a_write_to_a_protected_path_names_its_entry() {
    let layout = Fake::new();
    for output in [
        "touch: cannot touch '.git/config': Read-only file system\n",
        "touch: cannot touch '/ws/.git/config': Read-only file system",
        "bash: line 1: .git/config: Read-only file system\n",
        "sh: 1: cannot create .git/config: Read-only file system\n",
        "OSError: [Errno 30] Read-only file system: '.git/config'\n",
        "cp: cannot create regular file ‘./sub/../.git/config’: Read-only file system\n",
    ] {
        assert_eq!(
            explain(&failed(output), &layout),
            vec![PROTECTED.to_owned()],
            "{output}"
        );
    }
}

#[test]
fn denied_and_read_only_paths_name_their_entries() {
    let layout = Fake::new();
    assert_eq!(
        explain(&failed("cat: sub/.env: Permission denied\n"), &layout),
        vec![
            "Sandbox: /ws/sub/.env is denied (neither readable nor writable) by `**/.env` in \
             `[filesystem] deny` (p.toml:3). Do without it; the operator can remove or narrow \
             that entry."
                .to_owned()
        ]
    );
    assert_eq!(
        explain(
            &failed("mkdir: cannot create directory '/usr/x': Read-only file system\n"),
            &layout
        ),
        vec![
            "Sandbox: /usr/x is outside the writable paths, which `[filesystem] write` \
             (p.toml:2) grants, so writing it was refused. Write inside the workspace instead; \
             the operator can add a glob covering it there."
                .to_owned()
        ]
    );
    // EPERM on a read-only path is not a write refusal (e.g. chown): no note.
    assert!(
        explain(
            &failed("chown: changing '/usr/x': Operation not permitted"),
            &layout
        )
        .is_empty()
    );
}

#[test]
fn output_of_a_command_that_succeeded_is_never_explained() {
    let layout = Fake::new();
    let output = "Read-only file system: /ws/.git\ntouch: cannot touch '.git/config': Read-only file system\n";
    assert!(explain(&ended(output, Some(ExitStatus::Code(0))), &layout).is_empty());
    // Nor a cancelled one.
    let mut cancelled = failed(output);
    cancelled.termination = Termination::Cancelled;
    assert!(explain(&cancelled, &layout).is_empty());
}

#[test]
fn a_failure_for_another_reason_gets_no_note() {
    let layout = Fake::new();
    for output in [
        "cat: missing.txt: No such file or directory\n",
        // A refusal on a path the layout does not restrict.
        "bash: ./script.sh: Permission denied\n",
        // A protected path named without any refusal.
        "error: could not lock .git/config\n",
        "grep: .git/config: binary file matches\n",
    ] {
        assert!(explain(&failed(output), &layout).is_empty(), "{output}");
    }
    // Limits that are not set are never blamed.
    let mut layout = Fake::new();
    layout.spec.limits.memory_bytes = None;
    assert!(explain(&failed("Cannot allocate memory\n"), &layout).is_empty());
    // The network is on: a resolver failure is not the sandbox's.
    layout.spec.network = NetworkMode::Enabled;
    assert!(
        explain(
            &failed("curl: (6) Could not resolve host: example.com\n"),
            &layout
        )
        .is_empty()
    );
}

#[test]
fn only_the_tail_is_read_and_paths_are_capped() {
    let layout = Fake::new();
    let early = "touch: cannot touch '.git/config': Read-only file system\n";
    let filler = "x\n".repeat(TAIL_LINES);
    assert!(explain(&failed(&format!("{early}{filler}")), &layout).is_empty());
    let long = format!("{}\n{early}", "y".repeat(TAIL_BYTES));
    assert_eq!(explain(&failed(&long), &layout).len(), 1);
    // A line longer than the cap is skipped.
    let wide = format!(
        "{} '.git/config': Read-only file system\n",
        "z".repeat(MAX_LINE_BYTES)
    );
    assert!(explain(&failed(&wide), &layout).is_empty());
    // Many quoted paths: at most MAX_PATHS are resolved.
    let spam = "'a' ".repeat(100) + ": Read-only file system\n";
    let layout = Fake::new();
    assert!(explain(&failed(&spam.repeat(3)), &layout).is_empty());
    assert_eq!(layout.asked.lock().unwrap().len(), MAX_PATHS);
}

#[test]
fn one_note_per_cause_and_a_bounded_number() {
    let layout = Fake::new();
    let same = "touch: cannot touch '.git/config': Read-only file system\n".repeat(5);
    assert_eq!(explain(&failed(&same), &layout), vec![PROTECTED.to_owned()]);
    let many = "touch: cannot touch '.git/config': Read-only file system\n\
                cat: .env: Permission denied\n\
                touch: cannot touch '/usr/a': Read-only file system\n\
                curl: (6) Could not resolve host: example.com\n\
                bash: fork: retry: Resource temporarily unavailable\n";
    assert_eq!(explain(&failed(many), &layout).len(), MAX_NOTES);
}

#[test]
fn limits_name_their_entries() {
    let layout = Fake::new();
    assert_eq!(
        explain(&ended("", Some(ExitStatus::Signal(25))), &layout),
        vec![
            "Sandbox: the command hit the file size limit of 1 MiB, set by `[limits] \
             file_size` (p.toml:13). Write smaller files; the operator can raise that limit."
                .to_owned()
        ]
    );
    assert_eq!(
        explain(
            &failed("head: error writing 'big': File too large\n"),
            &layout
        )
        .len(),
        1
    );
    assert_eq!(
        explain(
            &failed("bash: fork: retry: Resource temporarily unavailable\n"),
            &layout
        ),
        vec![
            "Sandbox: the command could not start another process: the limit is 64 \
             processes, set by `[limits] pids` (p.toml:12). Run fewer processes at once; the \
             operator can raise that limit."
                .to_owned()
        ]
    );
    assert_eq!(
        explain(
            &failed("memory allocation of 1073741824 bytes failed\n"),
            &layout
        ),
        vec![
            "Sandbox: the command ran out of memory under the limit of 2 GiB per command, set \
             by `[limits] memory` (p.toml:11). Use less memory at once; the operator can raise \
             that limit."
                .to_owned()
        ]
    );
    assert_eq!(
        explain(
            &failed("curl: (6) Could not resolve host: example.com\n"),
            &layout
        ),
        vec![
            "Sandbox: commands have no network, set by `[network] enabled` (p.toml:7). \
             Nothing can be downloaded or reached; the operator can set `enabled = true`."
                .to_owned()
        ]
    );
    assert_eq!(
        explain(&failed("bash: connect: Operation not permitted\n"), &layout).len(),
        1
    );
}

#[test]
fn a_direct_connection_in_filtered_mode_points_at_the_proxy() {
    let mut layout = Fake::new();
    layout.spec.network = NetworkMode::Filtered;
    layout.spec.egress.allow = vec!["crates.io".to_owned()];
    layout.spec.sources.egress_allow = vec![12];
    let note = "Sandbox: commands reach the network only through Cordon's egress proxy, set by \
                `[network] allow` (p.toml:12): a direct connection or DNS lookup fails. Use a \
                tool or option that goes through the proxy (HTTP_PROXY, HTTPS_PROXY and \
                ALL_PROXY are set; curl, pip, cargo and git over https use them); the operator \
                can add destinations to `[network] allow`.";
    for output in [
        "ssh: Could not resolve hostname github.com: Temporary failure in name resolution\n",
        "nc: connect to 10.1.2.3 port 5432 (tcp) failed: Network is unreachable\n",
    ] {
        assert_eq!(
            explain(&failed(output), &layout),
            vec![note.to_owned()],
            "{output}"
        );
    }
    // Success, or a failure that is not the network's: no note.
    assert!(
        explain(
            &ended("Network is unreachable\n", Some(ExitStatus::Code(0))),
            &layout
        )
        .is_empty()
    );
    assert!(explain(&failed("cat: x: No such file or directory\n"), &layout).is_empty());
}

#[test]
fn the_timeout_note_names_the_limit_that_applied() {
    let layout = Fake::new();
    let mut timed_out = ended("", None);
    timed_out.termination = Termination::TimedOut;
    assert_eq!(
        explain(&timed_out, &layout),
        vec![
            "Sandbox: the command was stopped at the default timeout of 120 s, set by \
             `[limits] timeout` (p.toml:9). Pass a larger `timeout` (at most 1800 s, `[limits] \
             max_timeout` (p.toml:10)) or run less at once; the operator can raise the limits."
                .to_owned()
        ]
    );
    timed_out.timeout_requested = true;
    timed_out.timeout = Duration::from_secs(5);
    assert!(explain(&timed_out, &layout)[0].contains("the timeout of 5 s it was given"));
    timed_out.timeout = Duration::from_secs(1800);
    assert!(explain(&timed_out, &layout)[0].contains("maximum timeout of 1800 s"));
}

#[test]
fn sources_name_defaults_and_specs_without_a_policy() {
    let mut sources = SpecSources {
        file: "p.toml".into(),
        ..SpecSources::default()
    };
    assert_eq!(sources.at(4), "p.toml:4");
    assert_eq!(sources.at(0), "p.toml, not set there: the built-in default");
    sources.file.clear();
    assert_eq!(sources.at(4), "not from a policy file");
}

#[test]
fn quoted_strings_and_words_around_the_error_are_the_candidates() {
    assert_eq!(
        quoted_strings("a 'b' \"c d\" `e' ‘f’ 'unclosed"),
        vec!["b", "c d", "e", "f"]
    );
    assert_eq!(
        candidate_paths("bash: x/y: Read-only file system", Refusal::ReadOnly),
        vec!["x/y"]
    );
    assert_eq!(
        candidate_paths("Read-only file system: /a/b", Refusal::ReadOnly),
        vec!["/a/b"]
    );
    assert_eq!(
        absolute(Path::new("/ws/sub"), "../a/./b"),
        Some(PathBuf::from("/ws/a/b"))
    );
    assert_eq!(
        absolute(Path::new("/ws"), "/../../etc"),
        Some(PathBuf::from("/etc"))
    );
    assert_eq!(absolute(Path::new("/ws"), ""), None);
}

#[test]
fn a_protected_entry_the_file_does_not_write_says_cordon_added_it() {
    let mut layout = Fake::new();
    layout.spec.sources.protected = vec![0];
    assert_eq!(
        explain(
            &failed("touch: cannot touch '.git/x': Read-only file system"),
            &layout
        ),
        vec![
            "Sandbox: /ws/.git/x is protected (read-only) by `.git/**` in `[filesystem] \
             protect` (p.toml, not written there: Cordon protects it on its own (a built-in \
             default, the project's `.cordon/`, or the policy file itself)), so writing it was \
             refused. Leave it unchanged; the operator can remove or narrow that entry."
                .to_owned()
        ]
    );
}

#[test]
fn paths_to_classify_are_the_candidates_explain_looks_at() {
    let output = "ok\ntouch: cannot touch '.git/config': Read-only file system\n\
                  bash: ../x: Permission denied\nplain line /etc/passwd\n\
                  touch: cannot touch '.git/config': Read-only file system\n";
    assert_eq!(
        paths_to_classify(output, Path::new("/w/sub")),
        [PathBuf::from("/w/sub/.git/config"), PathBuf::from("/w/x")]
    );
    let many: String = (0..40)
        .map(|n| format!("cp: cannot create '/w/f{n}': Permission denied\n"))
        .collect();
    assert_eq!(paths_to_classify(&many, Path::new("/w")).len(), MAX_PATHS);
}

fn refused(host: &str, port: u16, suggestion: Option<&str>, source: Option<&str>) -> EgressRecord {
    EgressRecord {
        protocol: crate::EgressProtocol::HttpConnect,
        host: host.to_owned(),
        port,
        address: None,
        outcome: crate::EgressOutcome::Denied,
        entry: source.map(|_| host.to_owned()),
        source: source.map(str::to_owned),
        suggestion: suggestion.map(str::to_owned),
        asked: None,
        reason: match source {
            Some(at) => format!("deny entry {host:?} ({at}) matches {host}:{port}"),
            None => format!("no entry allows {host}:{port}"),
        },
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 1,
    }
}

#[test]
fn egress_note_lists_each_refused_destination_once_with_its_fix() {
    let fake = Fake::new();
    let sources = &fake.spec.sources;
    let allowed = EgressRecord {
        outcome: crate::EgressOutcome::Allowed,
        reason: "relayed until both sides closed".to_owned(),
        ..refused("crates.io", 443, None, None)
    };
    let failed = EgressRecord {
        outcome: crate::EgressOutcome::Failed,
        reason: "failed to resolve nowhere.test".to_owned(),
        ..refused("nowhere.test", 443, None, None)
    };
    assert_eq!(
        egress_note(&[allowed.clone(), failed.clone()], sources),
        None
    );
    assert_eq!(egress_note(&[], sources), None);
    let records = [
        allowed,
        refused("evil.test", 443, Some("evil.test"), None),
        refused("bad.crates.io", 443, None, Some("p.toml:9")),
        refused("evil.test", 443, Some("evil.test"), None),
        failed,
        refused("evil.test", 443, Some("evil.test"), None),
    ];
    assert_eq!(
        egress_note(&records, sources).unwrap(),
        "Sandbox: the network policy refused 2 destinations during this command (commands \
         reach only what `[network] allow` lists, through Cordon's proxy):\n\
         - evil.test:443 (3 attempts): no entry allows evil.test:443; to allow it, the operator \
         can add \"evil.test\" to `[network] allow` in p.toml\n\
         - bad.crates.io:443: deny entry \"bad.crates.io\" (p.toml:9) matches bad.crates.io:443; \
         to allow it, the operator can remove or narrow the deny entry at p.toml:9"
    );
}

#[test]
fn egress_note_is_bounded() {
    let records: Vec<EgressRecord> = (0..1000)
        .map(|i| refused(&format!("h{}.test", i % 20), 443, Some("x"), None))
        .collect();
    let note = egress_note(&records, &SpecSources::default()).unwrap();
    assert!(
        note.starts_with("Sandbox: the network policy refused 20 destinations"),
        "{note}"
    );
    assert_eq!(note.lines().count(), 1 + MAX_EGRESS_LISTED + 1, "{note}");
    assert!(note.contains("- h0.test:443 (50 attempts): "), "{note}");
    assert!(note.ends_with("\n- and 12 more destinations"), "{note}");
    assert!(
        note.contains("to `[network] allow` in the policy"),
        "{note}"
    );
    assert!(!note.contains("h8.test"), "{note}");
    let one = egress_note(&records[..1], &SpecSources::default()).unwrap();
    assert!(one.starts_with("Sandbox: the network policy refused 1 destination during"));
}
