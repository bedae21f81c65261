//! Copy mode: the workspace travels as tar instead of a bind mount (remote daemons). In: a
//! loader container (created, never started) with the session's volumes mounted writable
//! receives the tar through the archive API (which works on volumes, not on tmpfs), then is
//! removed; the session container mounts the protected volumes read-only. Out: the archive of
//! `/workspace/.` is unpacked over the host root, never through a symlink the host has,
//! never writing protected or denied paths, hard links only to files it wrote itself, modes
//! without set-user-ID, set-group-ID, sticky or world-writable bits; deletions are not propagated (nothing on
//! the host is removed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, DownloadFromContainerOptions, RemoveContainerOptions,
    UploadToContainerOptions,
};
use futures::StreamExt;

use cordon_remote::files::PathRules;

use crate::error::DockerError;
use crate::plan::{WorkspaceSource, mounts};

/// What [`copy_in`] needs.
pub(crate) struct CopyIn<'a> {
    pub host_root: &'a Path,
    pub image: &'a str,
    pub labels: &'a HashMap<String, String>,
    pub workspace: &'a Path,
    pub source: &'a WorkspaceSource,
    pub protected: &'a [(PathBuf, String)],
    pub rules: &'a PathRules,
    pub user: (u32, u32),
}

fn copy_err(direction: &'static str, path: &Path, reason: impl std::fmt::Display) -> DockerError {
    DockerError::Copy {
        direction,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

const IN: &str = "into the container from";
const OUT: &str = "out of the container to";

/// Largest archive of the container's workspace the copy back takes (a command can make a
/// sparse file of any size, which the archive holds in full).
pub(crate) const MAX_COPY_BACK: u64 = 16 << 30;

/// Write the archive `stream` to an unnamed temporary file (not memory), refusing more than
/// `limit` bytes; the file is rewound for reading.
async fn spool<E: std::fmt::Display>(
    mut stream: impl futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    limit: u64,
) -> Result<std::fs::File, String> {
    use std::io::{Seek, Write};
    let mut file = tempfile::tempfile().map_err(|e| format!("a temporary file: {e}"))?;
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        total += chunk.len() as u64;
        if total > limit {
            return Err(format!(
                "the workspace's archive is larger than {limit} bytes (a huge or sparse file?); \
                 nothing was copied back"
            ));
        }
        file.write_all(&chunk)
            .map_err(|e| format!("a temporary file: {e}"))?;
    }
    file.rewind()
        .map_err(|e| format!("a temporary file: {e}"))?;
    Ok(file)
}

/// Tar the host root (symlinks kept as links), owned by the session's uid:gid; `skip` says
/// which host-relative paths stay out (denied paths never enter the container).
fn tar_root(
    root: &Path,
    prefix: &Path,
    user: (u32, u32),
    skip: &dyn Fn(&Path) -> bool,
) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Deterministic);
    // The root entry first (the archive is extracted at `/`, entries under the workspace's
    // name), so the volume's top directory gets the session's owner and the host root's mode
    // (a fresh volume copies the image's /workspace ownership).
    let root_meta = std::fs::metadata(root)?;
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(&root_meta, tar::HeaderMode::Complete);
    header.set_uid(u64::from(user.0));
    header.set_gid(u64::from(user.1));
    header.set_size(0);
    builder.append_data(&mut header, prefix, std::io::empty())?;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let host_rel = rel.join(entry.file_name());
            if skip(&host_rel) {
                continue;
            }
            let rel_path = prefix.join(&host_rel);
            let meta = std::fs::symlink_metadata(entry.path())?;
            let mut header = tar::Header::new_gnu();
            header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
            header.set_uid(u64::from(user.0));
            header.set_gid(u64::from(user.1));
            if meta.is_dir() {
                header.set_size(0);
                builder.append_data(&mut header, &rel_path, std::io::empty())?;
                stack.push(host_rel);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(entry.path())?;
                header.set_size(0);
                builder.append_link(&mut header, &rel_path, &target)?;
            } else if meta.is_file() {
                let file = std::fs::File::open(entry.path())?;
                builder.append_data(&mut header, &rel_path, file)?;
            }
        }
    }
    builder.into_inner()
}

/// Fill the session volumes from the host root.
pub(crate) async fn copy_in(docker: &Docker, plan: &CopyIn<'_>) -> Result<(), DockerError> {
    let root = plan.host_root.to_path_buf();
    let user = plan.user;
    let prefix = plan
        .workspace
        .strip_prefix("/")
        .unwrap_or(plan.workspace)
        .to_path_buf();
    let rules = plan.rules.clone();
    let workspace = plan.workspace.to_path_buf();
    let tar = tokio::task::spawn_blocking(move || {
        let skip = |rel: &Path| rules.is_denied(&workspace.join(rel));
        tar_root(&root, &prefix, user, &skip)
    })
    .await
    .map_err(|e| copy_err(IN, plan.host_root, e))?
    .map_err(|e| copy_err(IN, plan.host_root, e))?;
    let loader = format!(
        "{}-loader",
        plan.labels
            .get(crate::client::LABEL_SESSION)
            .map(|s| format!("cordon-{s}"))
            .unwrap_or_else(|| "cordon".to_owned())
    );
    let spec = cordon_core::sandbox::SandboxSpec::default();
    let loader_mounts: Vec<_> = mounts(&crate::plan::ContainerPlan {
        image: plan.image,
        user: plan.user,
        spec: &spec,
        passed_env: &[],
        workspace: plan.workspace,
        source: plan.source,
        protected: plan.protected,
        masks: &[],
        extra_roots: &[],
        unix_sockets: &[],
        unlisted_binds: &[],
        spill_volume: "unused",
        network: None,
        egress: None,
        files_helper: None,
        helper_socket_dir: None,
        labels: HashMap::new(),
    })
    .into_iter()
    .filter(|m| m.target.as_deref() != Some(crate::plan::SPILL_DIR))
    .map(|mut m| {
        m.read_only = Some(false);
        m
    })
    .collect();
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(loader.clone()),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(plan.image.to_owned()),
                entrypoint: Some(
                    crate::plan::IDLE_COMMAND
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                ),
                labels: Some(plan.labels.clone()),
                network_disabled: Some(true),
                host_config: Some(HostConfig {
                    network_mode: Some("none".to_owned()),
                    mounts: Some(loader_mounts),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| copy_err(IN, plan.host_root, e))?;
    let uploaded = docker
        .upload_to_container(
            &loader,
            Some(UploadToContainerOptions {
                path: "/".to_owned(),
                ..Default::default()
            }),
            bollard::body_full(tar.into()),
        )
        .await;
    // The loader is a stopped helper container labelled like the session's: one left behind
    // is reaped with them.
    let _ = docker
        .remove_container(
            &loader,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    uploaded.map_err(|e| copy_err(IN, plan.host_root, e))?;
    Ok(())
}

/// Why `rel` may not be written under `root`: a component above it is a symlink on the host
/// (or `..`); `None` when every existing one is a real directory.
fn through_symlink(root: &Path, rel: &Path) -> Option<String> {
    let mut path = root.to_path_buf();
    let parent = rel.parent()?;
    for component in parent.components() {
        match component {
            std::path::Component::Normal(name) => path.push(name),
            _ => return Some("not a plain relative path".to_owned()),
        }
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Some(format!(
                    "{} is a symlink on the host",
                    path.strip_prefix(root).unwrap_or(&path).display()
                ));
            }
            Ok(_) => {}
            // Missing: created as a real directory from here on.
            Err(_) => return None,
        }
    }
    None
}

/// Unpack the container's workspace over the host root (see the module docs).
pub(crate) async fn copy_out(
    docker: &Docker,
    container: &str,
    workspace: &Path,
    host_root: &Path,
    protected: &[PathBuf],
    rules: &PathRules,
) -> Result<(), DockerError> {
    let stream = docker.download_from_container(
        container,
        Some(DownloadFromContainerOptions {
            path: format!("{}/.", workspace.to_string_lossy()),
        }),
    );
    let tar = spool(stream, MAX_COPY_BACK)
        .await
        .map_err(|reason| copy_err(OUT, host_root, reason))?;
    let root = host_root.to_path_buf();
    let protected = protected.to_vec();
    let rules = rules.clone();
    let workspace = workspace.to_path_buf();
    let failed = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<String>> {
        let mut archive = tar::Archive::new(std::io::BufReader::new(tar));
        // The permission bits only (`mode & 0o777`): the files are created by the user this
        // process runs as, so a set-user-ID or set-group-ID bit a command set in the container
        // would make a program of that user's on the host.
        archive.set_preserve_permissions(false);
        // Nor the world-writable bit: another account on the host could then change the
        // session's files, or plant new ones in its directories, before the operator builds
        // and runs them.
        archive.set_mask(0o002);
        archive.set_overwrite(true);
        // A path that cannot be written is reported, and the rest still comes back: every
        // file skipped here is work lost.
        let mut failed = Vec::new();
        let mut written = std::collections::HashSet::new();
        for entry in archive.entries()? {
            let mut entry = entry?;
            let path = entry.path()?.into_owned();
            let rel: PathBuf = path
                .components()
                .filter(|c| !matches!(c, std::path::Component::CurDir))
                .collect();
            // Protected paths are never written back: the mounted directories, and every
            // other path a protected glob names (a protected file such as the session's own
            // policy file is only a copy in the container's volume, writable there).
            let in_container = workspace.join(&rel);
            if rel.as_os_str().is_empty()
                || protected.iter().any(|p| rel.starts_with(p))
                || rules.is_protected(&in_container)
                || rules.is_denied(&in_container)
            {
                continue;
            }
            // Never through a symlink the host has: a directory the container put where the
            // host has a symlink to a protected directory (`.git`) would otherwise be filled
            // on the host through it. A hard link is made only to a file this copy back wrote
            // itself: one to a path it left out (protected or denied) would give the host's
            // file of that name a second, unprotected name.
            let refused = match entry.header().entry_type() {
                kind if kind.is_hard_link() => match entry.link_name()? {
                    Some(target) => {
                        let target: PathBuf = target
                            .components()
                            .filter(|c| !matches!(c, std::path::Component::CurDir))
                            .collect();
                        if written.contains(&target) {
                            through_symlink(&root, &rel)
                        } else {
                            Some(format!(
                                "a hard link to {}, which the copy back did not write",
                                target.display()
                            ))
                        }
                    }
                    None => Some("a hard link without a target".to_owned()),
                },
                _ => through_symlink(&root, &rel),
            };
            if let Some(reason) = refused {
                tracing::warn!(path = %rel.display(), %reason, "copy-back: path not written");
                failed.push(format!("{} ({reason})", rel.display()));
                continue;
            }
            let regular = entry.header().entry_type().is_file();
            // unpack_in refuses `..` and parents that resolve outside `root`.
            if let Err(error) = entry.unpack_in(&root) {
                tracing::warn!(path = %rel.display(), %error, "copy-back: path not written");
                failed.push(format!("{} ({error})", rel.display()));
            } else if regular {
                written.insert(rel);
            }
        }
        Ok(failed)
    })
    .await
    .map_err(|e| copy_err(OUT, host_root, e))?
    .map_err(|e| copy_err(OUT, host_root, e))?;
    match failed.as_slice() {
        [] => Ok(()),
        [first, rest @ ..] => Err(copy_err(
            OUT,
            host_root,
            format!(
                "{} path(s) could not be written: {first}{}",
                failed.len(),
                match rest.len() {
                    0 => String::new(),
                    more => format!(" and {more} more (listed in the log at warn level)"),
                }
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn chunks(
        sizes: &[usize],
    ) -> impl futures::Stream<Item = Result<bytes::Bytes, String>> + Unpin {
        futures::stream::iter(
            sizes
                .iter()
                .map(|&n| Ok(bytes::Bytes::from(vec![b'x'; n])))
                .collect::<Vec<_>>(),
        )
    }

    #[tokio::test]
    async fn the_archive_is_spooled_to_a_file_and_bounded() {
        let mut file = spool(chunks(&[3, 4, 5]), 12)
            .await
            .expect("within the limit");
        let mut back = Vec::new();
        file.read_to_end(&mut back).unwrap();
        assert_eq!(back, vec![b'x'; 12]);
        let error = spool(chunks(&[8, 8]), 12).await.unwrap_err();
        assert!(error.contains("larger than 12 bytes"), "{error}");
        assert!(error.contains("nothing was copied back"), "{error}");
        let failed = futures::stream::iter(vec![Err::<bytes::Bytes, _>("engine gone".to_owned())]);
        assert_eq!(spool(failed, 12).await.unwrap_err(), "engine gone");
    }
}
