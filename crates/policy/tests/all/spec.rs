//! How a policy file maps to the sandbox spec the backends enforce.

use std::time::Duration;

use cordon_core::sandbox::{
    EgressSpec, EnvSpec, Limits, NestedGit, NetworkMode, RootAccess, SandboxSpec, SpecSources,
};
use cordon_policy::CompiledPolicy;

use crate::support::policy;

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn globs_limits_network_and_env_map_to_the_spec() {
    let p = policy(
        r#"version = 1
[filesystem]
read = ["src/**", "/usr/share/dict/**", "~/.cargo/**", "/etc/hosts"]
write = ["target/**", "/scratch/*/out/**", "~/.cache/**"]
deny = ["**/*.key", "~/.ssh/**"]
protect = [".git/**", "Cargo.lock"]

[network]
enabled = true
unix_sockets = ["/run/postgresql/.s.PGSQL.5432", "~/.gnupg/S.gpg-agent", "/run/postgresql/.s.PGSQL.5432"]

[limits]
timeout = 30.5
max_timeout = 60
memory = "unlimited"
pids = 64
cpus = 0.5
file_size = "100MiB"
open_files = 256
cpu_time = 90
edit_file_size = "8MiB"
spill = "unlimited"
spill_session = "2GiB"

[env]
pass = ["HOME", "CARGO_HOME"]
set = { RUST_BACKTRACE = "1", LANG = "C.UTF-8" }
"#,
    );
    assert_eq!(
        p.sandbox_spec(),
        SandboxSpec {
            // `target/**` grants writes under the root: the OS layer can only say read-write.
            workspace: RootAccess::ReadWrite,
            readable_roots: strings(&["/usr/share/dict", "~/.cargo", "/etc/hosts"]),
            writable_roots: strings(&["/scratch", "~/.cache"]),
            // `.cordon/**` is added to any list.
            protected: strings(&[".git/**", "Cargo.lock", ".cordon/**"]),
            denied: strings(&["**/*.key", "~/.ssh/**"]),
            network: NetworkMode::Enabled,
            unix_sockets: strings(&["/run/postgresql/.s.PGSQL.5432", "~/.gnupg/S.gpg-agent"]),
            egress: EgressSpec::default(),
            limits: Limits {
                default_timeout: Duration::from_millis(30_500),
                max_timeout: Duration::from_secs(60),
                memory_bytes: None,
                pids: Some(64),
                cpus: Some(0.5),
                file_size_bytes: Some(100 << 20),
                open_files: Some(256),
                cpu_time_secs: Some(90),
                edit_file_bytes: Some(8 << 20),
                spill_bytes: None,
                spill_session_bytes: Some(2 << 30),
            },
            env: EnvSpec {
                pass: strings(&["HOME", "CARGO_HOME"]),
                set: vec![
                    ("LANG".to_owned(), "C.UTF-8".to_owned()),
                    ("RUST_BACKTRACE".to_owned(), "1".to_owned()),
                ],
            },
            allow_degraded: false,
            nested_git: NestedGit::Quarantine,
            sources: SpecSources {
                file: "test.toml".to_owned(),
                protected: vec![6, 6, 0],
                denied: vec![5, 5],
                write: 4,
                network: 9,
                egress_allow: vec![],
                egress_deny: vec![],
                egress_ask: vec![],
                timeout: 13,
                max_timeout: 14,
                memory: 15,
                pids: 16,
                file_size: 18,
            },
        }
    );
}

#[test]
fn entries_not_in_the_file_have_line_zero() {
    let spec = policy("version = 1\n").sandbox_spec();
    assert_eq!(
        spec.sources,
        SpecSources {
            file: "test.toml".to_owned(),
            // The default `.git/**` and `.cordon/**`.
            protected: vec![0, 0],
            ..SpecSources::default()
        }
    );
    assert_eq!(
        spec.sources.at(spec.sources.network),
        "test.toml, not set there: the built-in default"
    );
    let mut p = policy("version = 1\n[filesystem]\nprotect = [\"a\"]\n");
    p.protect_literal("conf/policy.toml").unwrap();
    let spec = p.sandbox_spec();
    assert_eq!(
        spec.protected,
        strings(&["a", ".cordon/**", "conf/policy.toml"])
    );
    assert_eq!(spec.sources.protected, vec![3, 0, 0]);
}

#[test]
fn a_non_empty_allow_list_means_filtered_mode_with_each_entry_line() {
    let p = policy(
        "version = 1\n[network]\nenabled = false\nallow = [\n  \"crates.io\",\n  \
         \"*.crates.io\", \"10.1.2.0/24:5432\",\n]\ndeny = [\"evil.crates.io\"]\n\
         unix_sockets = [\"/run/x.sock\"]\nask = [\"*.github.com\", \"pypi.org:443\"]\n",
    );
    let spec = p.sandbox_spec();
    assert_eq!(spec.network, NetworkMode::Filtered);
    assert_eq!(
        spec.egress,
        EgressSpec {
            allow: strings(&["crates.io", "*.crates.io", "10.1.2.0/24:5432"]),
            deny: strings(&["evil.crates.io"]),
            ask: strings(&["*.github.com", "pypi.org:443"]),
        }
    );
    assert_eq!(spec.sources.egress_ask, vec![10, 10]);
    assert_eq!(
        (
            spec.sources.network,
            spec.sources.egress_allow.clone(),
            spec.sources.egress_deny.clone()
        ),
        (3, vec![5, 6, 6], vec![8])
    );
    assert_eq!(spec.unix_sockets, strings(&["/run/x.sock"]));
    let entries = cordon_ops::egress_entry_specs(&spec);
    assert_eq!(&*entries.allow[2].source, "test.toml:6");
    assert_eq!(&*entries.ask[1].source, "test.toml:10");
    cordon_ops::egress_rules(&spec).expect("what the policy accepts, the proxy compiles");

    // An empty allow list is as if absent.
    let spec = policy("version = 1\n[network]\nallow = []\n").sandbox_spec();
    assert_eq!(
        (spec.network, spec.egress, spec.sources.egress_allow),
        (NetworkMode::Disabled, EgressSpec::default(), vec![])
    );
    let spec = policy("version = 1\n[network]\nenabled = true\nallow = []\n").sandbox_spec();
    assert_eq!(spec.network, NetworkMode::Enabled);
    // Without `enabled`, the list alone turns filtered mode on.
    let spec = policy("version = 1\n[network]\nallow = [\"pypi.org:443\"]\n").sandbox_spec();
    assert_eq!(
        (
            spec.network,
            spec.sources.network,
            spec.sources.egress_allow_at()
        ),
        (NetworkMode::Filtered, 0, "test.toml:3".to_owned())
    );
}

#[test]
fn workspace_is_read_only_without_relative_write_globs() {
    let p = policy("version = 1\n[filesystem]\nwrite = [\"/tmp/out/**\"]\n");
    let spec = p.sandbox_spec();
    assert_eq!(spec.workspace, RootAccess::ReadOnly);
    assert_eq!(spec.writable_roots, strings(&["/tmp/out"]));
    assert_eq!(spec.network, NetworkMode::Disabled);
}

#[test]
fn nested_git_quarantines_by_default_and_can_be_allowed() {
    let default = policy("version = 1\n").sandbox_spec();
    assert_eq!(default.nested_git, NestedGit::Quarantine);
    let allow = policy("version = 1\n[filesystem]\nnested_git = \"allow\"\n").sandbox_spec();
    assert_eq!(allow.nested_git, NestedGit::Allow);
    let explicit =
        policy("version = 1\n[filesystem]\nnested_git = \"quarantine\"\n").sandbox_spec();
    assert_eq!(explicit.nested_git, NestedGit::Quarantine);
}

#[test]
fn one_sided_timeouts_stay_consistent() {
    let only_timeout = policy("version = 1\n[limits]\ntimeout = 3600\n").sandbox_spec();
    assert_eq!(
        only_timeout.limits.default_timeout,
        Duration::from_secs(3600)
    );
    assert_eq!(only_timeout.limits.max_timeout, Duration::from_secs(3600));
    let only_max = policy("version = 1\n[limits]\nmax_timeout = 10\n").sandbox_spec();
    assert_eq!(only_max.limits.default_timeout, Duration::from_secs(10));
    assert_eq!(only_max.limits.max_timeout, Duration::from_secs(10));
    let none = policy("version = 1\n").sandbox_spec();
    assert_eq!(none.limits, Limits::default());
}

#[test]
fn compiled_policies_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<CompiledPolicy>();
    let p = std::sync::Arc::new(policy(
        "version = 1\n[[rules]]\ncommand = \"git push\"\ndecision = \"deny\"\n",
    ));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || crate::support::bash(&p, "git push").decision)
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join().unwrap(), cordon_policy::Decision::Deny);
    }
}

#[test]
fn the_default_protect_list_covers_git_and_the_project_config() {
    let p = policy("version = 1\n[filesystem]\nwrite = [\"**\"]\n");
    assert_eq!(
        p.sandbox_spec().protected,
        strings(&[".git/**", ".cordon/**"])
    );
    let denied = crate::support::call(
        &p,
        "write",
        &serde_json::json!({"path": ".cordon/policy.toml", "content": "x"}),
    );
    assert_eq!(denied.decision, cordon_policy::Decision::Deny, "{denied:?}");
}

#[test]
fn a_literal_path_is_protected_for_the_session() {
    let mut p = policy("version = 1\n[filesystem]\nwrite = [\"**\"]\nprotect = []\n");
    let write = serde_json::json!({"path": "conf/policy.toml", "content": "x"});
    let before = crate::support::call(&p, "write", &write);
    assert_eq!(
        before.decision,
        cordon_policy::Decision::Allow,
        "{before:?}"
    );
    p.protect_literal("conf/policy.toml").unwrap();
    assert_eq!(
        p.sandbox_spec().protected,
        strings(&[".cordon/**", "conf/policy.toml"])
    );
    let after = crate::support::call(&p, "write", &write);
    assert_eq!(after.decision, cordon_policy::Decision::Deny, "{after:?}");
    assert!(
        after
            .reason
            .contains("the policy file this session runs with"),
        "{}",
        after.reason
    );
    assert_eq!(after.rule.to_string(), "builtin:policy-file:0");
    let sibling = crate::support::call(
        &p,
        "write",
        &serde_json::json!({"path": "conf/other.toml", "content": "x"}),
    );
    assert_eq!(
        sibling.decision,
        cordon_policy::Decision::Allow,
        "only that file"
    );
    let error = p.protect_literal("conf/p[1].toml").unwrap_err();
    assert!(error.to_string().contains("glob characters"), "{error}");
}
