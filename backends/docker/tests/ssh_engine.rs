//! `ssh://` engines: the SSH backend's throwaway sshd on 127.0.0.1 whose sessions have
//! `DOCKER_HOST` set to the test engine, so `docker system dial-stdio` run over SSH reaches it.
//! A session through it runs in copy mode with the file helper copied in; an unknown host key is refused before anything
//! reaches the engine.

use std::path::PathBuf;

use cordon_backend_docker::{
    DockerBackend, DockerConfig, DockerError, EngineTransport, FilesHelper, FilesPath,
    TunnelConfig, WorkspaceMode,
};
use cordon_backend_ssh::AgentSource;
use cordon_ops::Backend;

use crate::support::{self, host_or_skip, run, workspace};

#[allow(dead_code)]
#[path = "../../ssh/tests/suite/support.rs"]
mod ssh_support;

/// An sshd whose sessions reach the engine at `engine` with the docker CLI.
fn sshd(engine: &str) -> Option<ssh_support::Server> {
    assert!(
        std::process::Command::new("docker")
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success()),
        "the docker CLI is missing: an ssh:// engine runs `docker system dial-stdio` on the \
         host (install docker.io)"
    );
    ssh_support::server_with_env(Some(&format!("SHLVL=1 DOCKER_HOST={engine}")))
}

fn ssh_config(server: &ssh_support::Server) -> TunnelConfig {
    TunnelConfig {
        identity: Some(server.client_key.clone()),
        known_hosts: Some(server.known_hosts.clone()),
        ssh_config: Some(server.dir.path().join("no_ssh_config")),
        agent: AgentSource::Disabled,
        ..TunnelConfig::default()
    }
}

fn config(server: &ssh_support::Server, root: &std::path::Path) -> DockerConfig {
    DockerConfig {
        docker_host: Some(format!("ssh://root@127.0.0.1:{}", server.port)),
        ssh: ssh_config(server),
        ..DockerConfig::new(root)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_ssh_runs_in_copy_mode() {
    let host = host_or_skip!();
    let Some(server) = sshd(&host) else { return };
    let ws = workspace();
    std::fs::write(ws.path().join("in.txt"), "from host\n").expect("write");
    // File operations through the helper, copied into the engine's volume over the tunnel.
    let helper = crate::helper_copy::UniqueHelper::new(&host);
    let mut config = config(&server, ws.path());
    config.image = support::DEBIAN.to_owned();
    config.helper = Some(helper.path.clone());
    config.files_helper = FilesHelper::Required;
    let backend = DockerBackend::start(config)
        .await
        .expect("start a session over ssh://");
    assert_eq!(backend.engine_transport(), EngineTransport::Ssh);
    assert_eq!(backend.workspace_mode(), WorkspaceMode::Copy);
    assert_eq!(backend.files_path(), &FilesPath::Helper);
    let files = backend.files();
    assert_eq!(
        files
            .read_file(&PathBuf::from("/workspace/in.txt"))
            .await
            .expect("read"),
        b"from host\n"
    );
    files
        .write_file(&PathBuf::from("/workspace/out.txt"), b"written\n")
        .await
        .expect("write");
    let ran = run(&backend, "cat in.txt out.txt; echo made > made.txt").await;
    assert_eq!(ran.output, "from host\nwritten\n");
    backend.shutdown().await.expect("shut down");
    // Copy mode brought the changes back; the container is gone from the engine.
    assert_eq!(
        std::fs::read_to_string(ws.path().join("made.txt")).expect("copied back"),
        "made\n"
    );
    assert!(!support::container_exists(&host, backend.container()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_host_key_is_refused() {
    let host = host_or_skip!();
    let Some(server) = sshd(&host) else { return };
    let ws = workspace();
    let mut config = config(&server, ws.path());
    let empty = server.dir.path().join("empty_known_hosts");
    std::fs::write(&empty, "").expect("known_hosts");
    config.ssh.known_hosts = Some(empty);
    let error = DockerBackend::start(config)
        .await
        .expect_err("an unknown host key is refused");
    assert!(matches!(error, DockerError::SshEngine { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("ssh-keyscan"), "{message}");
    assert!(message.contains(&server.host_fingerprint()), "{message}");
}
