//! Fail closed: a host without a required layer refuses with an error naming it, unless the
//! operator opted into `allow_degraded`, and then the missing layers are reported. Hosts are
//! simulated by handing `prepare_with_support` a weaker probe result.

use cordon_sandbox::{ExitStatus, HostSupport, Layer, PreparedSandbox, Rlimits, SandboxError};

use crate::support::{Fixture, run_in};

fn full() -> HostSupport {
    let support = cordon_sandbox::probe();
    for layer in Layer::ALL {
        assert!(
            support.supports(layer),
            "this test host must support {layer}"
        );
    }
    support
}

fn refused(fx: &Fixture, support: HostSupport) -> Vec<Layer> {
    match PreparedSandbox::prepare_with_support(fx.config(), support) {
        Err(SandboxError::MissingLayers { layers }) => layers,
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("a sandbox missing a required layer was prepared"),
    }
}

#[test]
fn each_missing_required_layer_is_named() {
    let fx = Fixture::new();
    let host = full();
    let cases = [
        (
            HostSupport {
                landlock_abi: 0,
                ..host
            },
            vec![Layer::LandlockFilesystem],
        ),
        (
            HostSupport {
                landlock_abi: 2,
                ..host
            },
            vec![Layer::LandlockFilesystem],
        ),
        (
            HostSupport {
                seccomp: false,
                ..host
            },
            vec![Layer::Seccomp],
        ),
        (
            HostSupport {
                pid_namespaces: false,
                ..host
            },
            vec![Layer::PidNamespace, Layer::MountNamespace],
        ),
        (
            HostSupport {
                root: false,
                user_namespaces: false,
                ..host
            },
            vec![
                Layer::UserNamespace,
                Layer::PidNamespace,
                Layer::MountNamespace,
            ],
        ),
    ];
    for (support, expected) in cases {
        let mut layers = refused(&fx, support);
        layers.sort();
        let mut expected = expected;
        expected.sort();
        assert_eq!(layers, expected, "for {support:?}");
    }
}

#[test]
fn the_error_message_names_the_layer_and_the_opt_in() {
    let fx = Fixture::new();
    let error = PreparedSandbox::prepare_with_support(
        fx.config(),
        HostSupport {
            seccomp: false,
            ..full()
        },
    )
    .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("seccomp"), "{message}");
    assert!(message.contains("allow_degraded"), "{message}");
}

#[test]
fn a_process_limit_needs_an_enforcing_kernel() {
    let fx = Fixture::new();
    let mut config = fx.config();
    config.limits = Rlimits {
        processes: Some(100),
        ..Rlimits::default()
    };
    let old_kernel = HostSupport {
        pid_max_per_namespace: false,
        ..full()
    };
    match PreparedSandbox::prepare_with_support(config, old_kernel) {
        Err(SandboxError::MissingLayers { layers }) => {
            assert_eq!(layers, vec![Layer::ProcessLimit])
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn optional_layers_are_reported_but_not_refused() {
    let fx = Fixture::new();
    let sandbox = PreparedSandbox::prepare_with_support(
        fx.config(),
        HostSupport {
            landlock_abi: 4,
            ..full()
        },
    )
    .unwrap();
    assert_eq!(
        sandbox.missing_layers(),
        &[Layer::LandlockIoctl, Layer::LandlockScopes]
    );
}

#[tokio::test]
async fn degraded_without_namespaces_still_runs_and_reports_what_is_missing() {
    let fx = Fixture::new();
    let mut config = fx.config();
    config.allow_degraded = true;
    let support = HostSupport {
        pid_namespaces: false,
        mount_namespaces: false,
        ..full()
    };
    let sandbox = PreparedSandbox::prepare_with_support(config, support).unwrap();
    assert_eq!(
        sandbox.missing_layers(),
        &[Layer::PidNamespace, Layer::MountNamespace]
    );
    let output = run_in(
        &sandbox,
        &fx.ws,
        "echo ok > made && cat made && cat /etc/shadow",
    )
    .await;
    assert_eq!(output.stdout, "ok\n", "{}", output.all());
    assert_eq!(
        output.status,
        ExitStatus::Code(1),
        "Landlock still denies /etc/shadow"
    );
}

#[tokio::test]
async fn degraded_without_seccomp_keeps_landlock_tcp_denial() {
    let fx = Fixture::new();
    let mut config = fx.config();
    config.allow_degraded = true;
    let sandbox = PreparedSandbox::prepare_with_support(
        config,
        HostSupport {
            seccomp: false,
            ..full()
        },
    )
    .unwrap();
    assert_eq!(sandbox.missing_layers(), &[Layer::Seccomp]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let output = run_in(
        &sandbox,
        &fx.ws,
        &format!("echo hi > /dev/tcp/127.0.0.1/{port}"),
    )
    .await;
    assert!(!output.status.success(), "{}", output.all());
    assert!(
        listener.accept().is_err(),
        "the connection reached the listener"
    );
}

#[tokio::test]
async fn user_namespace_mode_runs_commands() {
    // As root, claim not to be root: the sandbox then creates a user namespace mapping the
    // current uid, the path an unprivileged Cordon takes.
    let fx = Fixture::new();
    let sandbox = PreparedSandbox::prepare_with_support(
        fx.config(),
        HostSupport {
            root: false,
            ..full()
        },
    )
    .unwrap();
    let output = run_in(
        &sandbox,
        &fx.ws,
        "echo made > by-userns && id -u && cat /etc/shadow",
    )
    .await;
    assert_eq!(output.stdout, "0\n", "{}", output.all());
    assert_eq!(output.status, ExitStatus::Code(1));
    let meta = std::fs::metadata(fx.ws.join("by-userns")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        0,
        "files keep the caller's owner"
    );
}
