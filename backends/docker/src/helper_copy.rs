//! The file helper for copy mode: an engine that may run on another machine cannot bind-mount
//! this machine's `cordon-helper`, so the binary travels through the archive API into a volume
//! named by its content (`cordon-helper-<sha256 prefix>`, one per helper version, kept between
//! sessions so a session does not upload it again). The archive API cannot write into the
//! read-only root filesystem or a tmpfs; a loader container (created, never started) mounts the
//! volume writable and receives a tar holding the binary, root-owned, mode 0555. Session
//! containers mount the volume read-only at the directory of [`HELPER_IN_CONTAINER`], so the
//! command user cannot change it; every start of the helper checks its sha256 in the container
//! first (`sha256sum`) and refuses to exec a binary that differs.
//!
//! It does not decide whether the helper runs (the files path does, with the reason when not),
//! and it never removes the volume (another session may use it; `docker volume rm` does).

use std::collections::HashMap;
use std::path::Path;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptions, RemoveContainerOptions, UploadToContainerOptions,
};
use cordon_remote::transport::{Collected, StdinEnd, collect};
use sha2::{Digest, Sha256};

use crate::client;
use crate::egress::HELPER_IN_CONTAINER;

/// Label on helper volumes: the binary's sha256.
pub(crate) const LABEL_HELPER_SHA256: &str = "cordon.helper.sha256";
/// Where the loader container mounts the volume it fills.
const LOAD_DIR: &str = "/cordon-helper-load";
/// The binary's name in the volume (and in the directory of [`HELPER_IN_CONTAINER`]).
const BINARY_NAME: &str = "cordon-helper";
/// The largest helper binary copied in.
const MAX_BINARY: usize = 256 * 1024 * 1024;

/// A helper binary in a volume, ready to mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CopiedHelper {
    /// The volume holding it.
    pub volume: String,
    /// Its sha256, lower-case hex.
    pub sha256: String,
}

/// The directory the helper volume is mounted at (read-only) in session containers.
pub(crate) fn mount_dir() -> &'static str {
    HELPER_IN_CONTAINER
        .rsplit_once('/')
        .map_or("/", |(dir, _)| dir)
}

/// The volume name of a binary with this sha256.
pub(crate) fn volume_name(sha256: &str) -> String {
    format!("cordon-helper-{}", &sha256[..sha256.len().min(16)])
}

/// The argv that starts `cordon-helper serve` only when the mounted binary's sha256 is
/// `sha256` (otherwise it says so on stderr and exits 97).
pub(crate) fn verified_serve_argv(sha256: &str) -> Vec<String> {
    vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!(
            "set -- $(sha256sum {HELPER_IN_CONTAINER} 2>/dev/null); \
             if [ \"$1\" = {sha256} ]; then exec {HELPER_IN_CONTAINER} serve; fi; \
             echo \"cordon-helper: {HELPER_IN_CONTAINER} is not the binary with sha256 \
             {sha256} (got ${{1:-nothing}})\" >&2; exit 97"
        ),
    ]
}

/// The tar the loader receives: the volume's top directory and the binary, root-owned, 0555.
fn helper_tar(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o555);
    dir.set_uid(0);
    dir.set_gid(0);
    dir.set_size(0);
    builder.append_data(&mut dir, "./", std::io::empty())?;
    let mut file = tar::Header::new_gnu();
    file.set_entry_type(tar::EntryType::Regular);
    file.set_mode(0o555);
    file.set_uid(0);
    file.set_gid(0);
    file.set_size(bytes.len() as u64);
    builder.append_data(&mut file, BINARY_NAME, bytes)?;
    builder.into_inner()
}

/// Read `binary` (bounded) and its sha256.
fn read_and_hash(binary: &Path) -> Result<(Vec<u8>, String), String> {
    let bytes = cordon_helper::binary::read_binary(binary, MAX_BINARY)
        .map_err(|e| format!("failed to read {}: {e}", binary.display()))?;
    let sha256 = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((bytes, sha256))
}

/// The volume holding `binary`, created and filled unless it exists already (its content is
/// checked when the helper starts, see [`verify`]).
pub(crate) async fn prepare(
    docker: &Docker,
    binary: &Path,
    image: &str,
    labels: &HashMap<String, String>,
) -> Result<(CopiedHelper, Vec<u8>), String> {
    let path = binary.to_path_buf();
    let (bytes, sha256) = tokio::task::spawn_blocking(move || read_and_hash(&path))
        .await
        .map_err(|e| format!("failed to read the helper binary: {e}"))??;
    let helper = CopiedHelper {
        volume: volume_name(&sha256),
        sha256,
    };
    match docker.inspect_volume(&helper.volume).await {
        Ok(_) => {
            tracing::debug!(volume = helper.volume, "docker: helper volume present");
        }
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {
            docker
                .create_volume(VolumeCreateRequest {
                    name: Some(helper.volume.clone()),
                    labels: Some(HashMap::from([(
                        LABEL_HELPER_SHA256.to_owned(),
                        helper.sha256.clone(),
                    )])),
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("failed to create volume {}: {e}", helper.volume))?;
            fill(docker, &helper, &bytes, image, labels).await?;
        }
        Err(e) => return Err(format!("failed to inspect volume {}: {e}", helper.volume)),
    }
    Ok((helper, bytes))
}

/// Copy `bytes` into the helper's volume through a loader container (created from the
/// session's image, never started, removed after).
pub(crate) async fn fill(
    docker: &Docker,
    helper: &CopiedHelper,
    bytes: &[u8],
    image: &str,
    labels: &HashMap<String, String>,
) -> Result<(), String> {
    let tar = helper_tar(bytes).map_err(|e| format!("failed to pack the helper: {e}"))?;
    let loader = format!(
        "{}-helper-loader-{:08x}",
        labels
            .get(client::LABEL_SESSION)
            .map(|s| format!("cordon-{s}"))
            .unwrap_or_else(|| "cordon".to_owned()),
        fastrand::u32(..)
    );
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(loader.clone()),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(image.to_owned()),
                entrypoint: Some(
                    crate::plan::IDLE_COMMAND
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                ),
                labels: Some(labels.clone()),
                network_disabled: Some(true),
                host_config: Some(HostConfig {
                    network_mode: Some("none".to_owned()),
                    mounts: Some(vec![Mount {
                        target: Some(LOAD_DIR.to_owned()),
                        source: Some(helper.volume.clone()),
                        typ: Some(MountType::VOLUME),
                        read_only: Some(false),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("failed to create the helper loader container: {e}"))?;
    let uploaded = docker
        .upload_to_container(
            &loader,
            Some(UploadToContainerOptions {
                // At the mount point itself: Podman extracts into the mount holding this path.
                path: LOAD_DIR.to_owned(),
                ..Default::default()
            }),
            bollard::body_full(tar.into()),
        )
        .await;
    // Labelled like the session's containers: one left behind is reaped with them.
    if let Err(error) = docker
        .remove_container(
            &loader,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
    {
        tracing::debug!(%loader, %error, "docker: helper loader not removed");
    }
    uploaded.map_err(|e| format!("failed to copy the helper into {}: {e}", helper.volume))?;
    tracing::info!(
        volume = helper.volume,
        bytes = bytes.len(),
        "docker: helper copied into its volume"
    );
    Ok(())
}

/// Whether the helper mounted in `container` has the expected sha256 (as `user`, through the
/// image's `sha256sum`). `Err` when it cannot be checked.
pub(crate) async fn verify(
    docker: &Docker,
    container: &str,
    user: &str,
    helper: &CopiedHelper,
) -> Result<bool, String> {
    let argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!(
            "command -v sha256sum >/dev/null 2>&1 || {{ echo nosha; exit 0; }}; \
             sha256sum {HELPER_IN_CONTAINER} 2>/dev/null || echo missing"
        ),
    ];
    let mut exec = client::start_exec(docker, container, argv, Some(user))
        .await
        .map_err(|e| format!("failed to check the copied helper: {e}"))?;
    let Collected { stdout, .. } = collect(&mut exec, None, StdinEnd::AfterOutput)
        .await
        .map_err(|e| format!("failed to check the copied helper: {e}"))?;
    let text = String::from_utf8_lossy(&stdout);
    let first = text.split_whitespace().next().unwrap_or_default();
    match first {
        "nosha" => Err("the image has no sha256sum to verify the copied helper with".to_owned()),
        found => {
            let matches = found == helper.sha256;
            if !matches {
                tracing::warn!(
                    volume = helper.volume,
                    expected = helper.sha256,
                    found,
                    "docker: the copied helper's sha256 differs"
                );
            }
            Ok(matches)
        }
    }
}

/// The argv that starts the copied helper in `container`, once its sha256 there is checked:
/// a binary that differs (a volume filled by an interrupted session, changed on the engine's
/// machine) is copied again from `bytes` and checked again.
pub(crate) async fn serve_argv_after_check(
    docker: &Docker,
    container: &str,
    user: &str,
    (helper, bytes): &(CopiedHelper, Vec<u8>),
    image: &str,
    labels: &HashMap<String, String>,
) -> Result<Vec<String>, String> {
    if !verify(docker, container, user, helper).await? {
        tracing::warn!(
            volume = helper.volume,
            "docker: copying the helper again into its volume"
        );
        fill(docker, helper, bytes, image, labels).await?;
        if !verify(docker, container, user, helper).await? {
            return Err(format!(
                "the helper in volume {} does not match its sha256 {} even after a fresh copy",
                helper.volume, helper.sha256
            ));
        }
    }
    Ok(verified_serve_argv(&helper.sha256))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_volume_is_mounted_at_the_helpers_directory() {
        assert_eq!(mount_dir(), "/cordon-egress-helper");
        assert_eq!(
            volume_name(&"ab".repeat(32)),
            "cordon-helper-abababababababab"
        );
    }

    #[test]
    fn the_tar_holds_a_root_owned_read_only_binary() {
        let tar = helper_tar(b"\x7fELF").unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let entries: Vec<(String, u32, u64, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.size().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            entries,
            [
                ("./".to_owned(), 0o555, 0, 0),
                ("cordon-helper".to_owned(), 0o555, 0, 4),
            ]
        );
    }

    #[test]
    fn the_serve_argv_checks_the_hash_before_exec() {
        let argv = verified_serve_argv("abc");
        assert_eq!(argv[..2], ["/bin/sh", "-c"]);
        assert!(
            argv[2].starts_with(
                "set -- $(sha256sum /cordon-egress-helper/cordon-helper 2>/dev/null); \
                 if [ \"$1\" = abc ]; then exec /cordon-egress-helper/cordon-helper serve; fi;"
            ),
            "{}",
            argv[2]
        );
    }
}
