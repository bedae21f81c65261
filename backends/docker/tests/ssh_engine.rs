//! `ssh://` engines: the SSH backend's throwaway sshd on 127.0.0.1 whose sessions have
//! `DOCKER_HOST` set to the test engine, so `docker system dial-stdio` run over SSH reaches it.
//! A session through it runs in copy mode with the file helper copied in; an unknown host key
//! is refused before anything reaches the engine; a burst of requests leaves few `dial-stdio`
//! processes behind.

use std::path::PathBuf;

use cordon_backend_docker::client::{Engine, connect_engine_with};
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

/// The `docker system dial-stdio` processes the test sshd runs (one per open channel).
fn dial_stdio_processes(server: &ssh_support::Server) -> usize {
    ssh_support::descendants(server.pid())
        .into_iter()
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            comm.trim() == "docker" && cmdline.split(|b| *b == 0).any(|arg| arg == b"dial-stdio")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_requests_leaves_at_most_two_channels_open() {
    let host = host_or_skip!();
    let Some(server) = sshd(&host) else { return };
    let engine = Engine {
        host: format!("ssh://root@127.0.0.1:{}", server.port),
        tls: None,
    };
    let (docker, _) = connect_engine_with(&engine, &ssh_config(&server))
        .await
        .expect("connect over ssh://");
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let docker = docker.clone();
            tokio::spawn(async move { docker.version().await })
        })
        .collect();
    for request in burst {
        request.await.expect("join").expect("version over ssh://");
    }
    eprintln!(
        "dial-stdio processes right after the burst: {}",
        dial_stdio_processes(&server)
    );
    // The channels beyond the pool's idle limit close once their requests are done; their
    // processes exit after that. Without the limit all of them stay.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let open = dial_stdio_processes(&server);
        if open <= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{open} dial-stdio processes still run a minute after the burst"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The pool still works after closing the extra channels.
    docker.ping().await.expect("ping after the burst");
}
