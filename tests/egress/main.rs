//! The cross-backend egress suite: ONE set of filtered-network tests (`[network] allow`),
//! instantiated for every backend that runs the egress proxy by [`egress_tests!`]:
//! `cargo test -p cordon-tests --test egress local::` runs one backend.
//!
//! Every case opens a `cordon_runtime::Session` (see `cordon_tests::Workspace`) with a policy of
//! its own and runs unmodified tools (curl, python, pip, git) through the `bash` tool; the
//! destinations are servers on the host's loopback under test names that resolve there (see
//! [`servers::ensure_test_names`]). The proxy runs in the Cordon process (local, docker) or in
//! the helper on the SSH host (this machine too), and resolves those names itself.

mod cases;
mod servers;

use std::sync::Arc;

use cordon_tests::Harness;

/// The harness for a test, or `None` (with a note on stderr) when the user opted this backend
/// out explicitly.
fn start(harness: impl Harness) -> Option<Arc<dyn Harness>> {
    if let Some(reason) = harness.opted_out() {
        eprintln!("{} backend not tested: {reason}", harness.name());
        return None;
    }
    servers::ensure_test_names();
    Some(Arc::new(harness))
}

/// `egress_tests!(backend, harness)`: a module `backend` with one test per case.
macro_rules! egress_tests {
    ($backend:ident, $harness:expr) => {
        mod $backend {
            egress_tests!(@cases $harness;
                allowed_name_over_http_and_connect,
                unlisted_name_is_refused_naming_the_entry_to_add,
                port_and_wildcard_entries,
                deny_beats_allow,
                ip_and_cidr_entries,
                rebinding_to_loopback_is_refused,
                direct_tcp_to_an_allowed_address_is_refused,
                udp_and_dns_are_refused,
                pip_installs_from_an_allowed_index_only,
                git_clones_over_http_from_an_allowed_name_only,
            );
        }
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let Some(harness) = crate::start($harness) {
                    crate::cases::$case(harness).await;
                }
            }
        )*
    };
}

egress_tests!(local, cordon_tests::Local);
egress_tests!(docker_helper, cordon_tests::DockerHelper);

/// Questions about `[network] ask` destinations reach the asker of the call whose command
/// connected: from the proxy in this process (local, Docker, where a command's end barrier
/// through the container's forwarder tells its connections from the next command's) or in
/// the helper on the far side of its stream (a local pipe, SSH), which sends them back over it.
mod asking {
    egress_tests!(@cases cordon_tests::Local;
        an_ask_question_names_the_call_that_connected,
        an_ask_question_is_withdrawn_when_its_command_ends,
    );
    mod helper_pipe {
        egress_tests!(@cases cordon_tests::HelperPipe;
            an_ask_question_names_the_call_that_connected,
            an_ask_question_is_withdrawn_when_its_command_ends,
        );
    }
    mod ssh_helper {
        egress_tests!(@cases cordon_tests::SshHelper;
            an_ask_question_names_the_call_that_connected,
            an_ask_question_is_withdrawn_when_its_command_ends,
        );
    }
    mod docker_helper {
        egress_tests!(@cases cordon_tests::DockerHelper;
            an_ask_question_names_the_call_that_connected,
            an_ask_question_is_withdrawn_when_its_command_ends,
        );
    }
}
