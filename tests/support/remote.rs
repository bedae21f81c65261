//! The Docker and SSH backends' [`Harness`]es. The workspace is the same host directory the
//! local backend uses: bind-mounted into the container, or the remote root of an sshd on
//! 127.0.0.1 (same machine, so the suites can inspect files and processes from the host).

use std::path::PathBuf;

use async_trait::async_trait;
use cordon_runtime::{BackendChoice, DockerFilesHelper, DockerOptions, SessionOptions, SshOptions};

use crate::harness::{Harness, SessionRequest};
use crate::infra;

fn opted_out(var: &str) -> Option<String> {
    (std::env::var(var).as_deref() == Ok("1")).then(|| format!("{var}=1"))
}

/// The Docker backend's factory (container per session from `cordon-sandbox:latest`), file
/// operations and search on the POSIX shell workers (the fallback for images that cannot run
/// the helper).
#[derive(Clone, Copy, Debug, Default)]
pub struct Docker;

#[async_trait]
impl Harness for Docker {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn opted_out(&self) -> Option<String> {
        opted_out("CORDON_SKIP_DOCKER")
    }

    async fn session_options(&self, request: SessionRequest) -> Result<SessionOptions, String> {
        docker_session(request, DockerFilesHelper::Shell, None).await
    }
}

/// The Docker backend with file operations and search through this build's helper in the
/// container (required: a session that cannot run it fails instead of falling back).
#[derive(Clone, Copy, Debug, Default)]
pub struct DockerHelper;

#[async_trait]
impl Harness for DockerHelper {
    fn name(&self) -> &'static str {
        "docker_helper"
    }

    fn opted_out(&self) -> Option<String> {
        opted_out("CORDON_SKIP_DOCKER")
    }

    async fn session_options(&self, request: SessionRequest) -> Result<SessionOptions, String> {
        let program = crate::helper::helper_program()?;
        docker_session(request, DockerFilesHelper::Required, Some(program)).await
    }
}

async fn docker_session(
    request: SessionRequest,
    files_helper: DockerFilesHelper,
    helper: Option<PathBuf>,
) -> Result<SessionOptions, String> {
    let SessionRequest {
        host_root,
        policy,
        audit,
    } = request;
    let host = tokio::task::spawn_blocking(infra::docker_host)
        .await
        .map_err(|error| error.to_string())??;
    Ok(SessionOptions {
        backend: BackendChoice::Docker(DockerOptions {
            docker_host: Some(host),
            files_helper,
            helper,
            ..DockerOptions::default()
        }),
        policy,
        audit,
        ..SessionOptions::local(host_root)
    })
}

/// The SSH backend's factory (root on a throwaway sshd on 127.0.0.1).
///
/// The remote host cannot enforce the policy's sandbox for commands in this phase, so the
/// backend runs them only when the operator accepts that (`allow_degraded`), which the suites
/// do here; every result then names the missing layers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ssh;

#[async_trait]
impl Harness for Ssh {
    fn name(&self) -> &'static str {
        "ssh"
    }

    fn opted_out(&self) -> Option<String> {
        opted_out("CORDON_SKIP_SSH")
    }

    async fn session_options(&self, request: SessionRequest) -> Result<SessionOptions, String> {
        let SessionRequest {
            host_root,
            policy,
            audit,
        } = request;
        let sshd = tokio::task::spawn_blocking(infra::sshd)
            .await
            .map_err(|error| error.to_string())??;
        Ok(SessionOptions {
            backend: BackendChoice::Ssh(SshOptions {
                host: format!("root@127.0.0.1:{}", sshd.port),
                remote_root: host_root.clone(),
                identity: Some(sshd.key),
                known_hosts: Some(sshd.known_hosts),
                ssh_config: Some(sshd.ssh_config),
                // No helper (a path that does not exist): commands run through the shell
                // workers, unconfined.
                helper: Some(sshd.dir.join("no-cordon-helper")),
                state_dir: None,
            }),
            policy,
            audit,
            allow_degraded: true,
            ..SessionOptions::local(host_root)
        })
    }
}

/// The SSH backend with the helper on the host (root on the throwaway sshd on 127.0.0.1):
/// this build's `cordon-helper` is uploaded into a state directory of the test sshd and runs
/// every call, commands under the policy's full sandbox (no `allow_degraded`). The session's
/// local root is an empty directory of its own, not the remote root.
#[derive(Clone, Copy, Debug, Default)]
pub struct SshHelper;

#[async_trait]
impl Harness for SshHelper {
    fn name(&self) -> &'static str {
        "ssh_helper"
    }

    fn opted_out(&self) -> Option<String> {
        opted_out("CORDON_SKIP_SSH")
    }

    async fn session_options(&self, request: SessionRequest) -> Result<SessionOptions, String> {
        let SessionRequest {
            host_root,
            policy,
            audit,
        } = request;
        let (sshd, helper) = tokio::task::spawn_blocking(|| {
            let sshd = infra::sshd()?;
            infra::helper_binary().map(|helper| (sshd, helper))
        })
        .await
        .map_err(|error| error.to_string())??;
        let local_root = sshd.dir.join("local-root");
        std::fs::create_dir_all(&local_root).map_err(|error| error.to_string())?;
        Ok(SessionOptions {
            backend: BackendChoice::Ssh(ssh_helper_options(&sshd, helper, host_root)),
            policy,
            audit,
            allow_degraded: false,
            ..SessionOptions::local(local_root)
        })
    }
}

/// Options for the test sshd with the helper, over `remote_root`.
pub fn ssh_helper_options(sshd: &infra::Sshd, helper: PathBuf, remote_root: PathBuf) -> SshOptions {
    SshOptions {
        host: format!("root@127.0.0.1:{}", sshd.port),
        remote_root,
        identity: Some(sshd.key.clone()),
        known_hosts: Some(sshd.known_hosts.clone()),
        ssh_config: Some(sshd.ssh_config.clone()),
        helper: Some(helper),
        state_dir: Some(sshd.dir.join("state")),
    }
}
