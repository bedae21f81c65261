//! The file helper in copy mode: copied into a content-addressed volume (the engine may not see
//! this machine's files), mounted read-only, checked by sha256 before it starts, and copied
//! again when the volume holds something else.

use std::path::{Path, PathBuf};
use std::process::Command;

use cordon_backend_docker::{DockerBackend, FilesHelper, FilesPath, WorkspaceMode};
use cordon_ops::{Backend, GrepRequest};
use tokio_util::sync::CancellationToken;

use crate::support::{self, host_or_skip, run, workspace};

/// A stripped copy of this build's helper with a unique tail (an ELF ignores trailing bytes),
/// so each test has a volume of its own; removes the volume when dropped.
pub(crate) struct UniqueHelper {
    _dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
    volume: String,
    host: String,
}

impl UniqueHelper {
    pub(crate) fn new(host: &str) -> UniqueHelper {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cordon-helper");
        std::fs::copy(support::helper(), &path).expect("copy the helper");
        let stripped = Command::new("strip").arg(&path).status().expect("strip");
        assert!(stripped.success(), "strip failed");
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.extend_from_slice(format!("\0cordon-test-{:016x}", fastrand::u64(..)).as_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let out = Command::new("sha256sum")
            .arg(&path)
            .output()
            .expect("sha256sum");
        let sha = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .expect("hash")
            .to_owned();
        UniqueHelper {
            _dir: dir,
            path,
            volume: format!("cordon-helper-{}", &sha[..16]),
            host: host.to_owned(),
        }
    }

    /// The sha256 of the binary in the volume (read in a throwaway container: commands of a
    /// session cannot read the helper's mount, its Landlock rules leave it out).
    fn volume_sha256(&self) -> String {
        let out = Command::new("docker")
            .args(["run", "--rm", "--network", "none", "--user", "0:0", "-v"])
            .arg(format!("{}:/h:ro", self.volume))
            .args([support::DEBIAN, "sha256sum", "/h/cordon-helper"])
            .env("DOCKER_HOST", &self.host)
            .output()
            .expect("docker run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .expect("hash")
            .to_owned()
    }

    /// Overwrite the binary in the volume (as root in a throwaway container).
    fn corrupt_volume(&self) {
        let out = Command::new("docker")
            .args(["run", "--rm", "--network", "none", "--user", "0:0", "-v"])
            .arg(format!("{}:/h", self.volume))
            .args([
                support::DEBIAN,
                "sh",
                "-c",
                "echo corrupted > /h/cordon-helper",
            ])
            .env("DOCKER_HOST", &self.host)
            .output()
            .expect("docker run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for UniqueHelper {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["volume", "rm", "-f", &self.volume])
            .env("DOCKER_HOST", &self.host)
            .output();
    }
}

async fn copy_session(host: &str, root: &Path, helper: &UniqueHelper) -> DockerBackend {
    let mut config = support::config(host, root);
    config.mode = WorkspaceMode::Copy;
    config.image = support::DEBIAN.to_owned();
    config.helper = Some(helper.path.clone());
    config.files_helper = FilesHelper::Required;
    DockerBackend::start(config)
        .await
        .expect("a copy-mode session with the helper starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_mode_runs_the_helper_from_a_read_only_volume() {
    let host = host_or_skip!();
    let helper = UniqueHelper::new(&host);
    let ws = workspace();
    std::fs::write(ws.path().join("in.txt"), "needle from host\n").expect("write");
    let backend = copy_session(&host, ws.path(), &helper).await;
    assert_eq!(backend.workspace_mode(), WorkspaceMode::Copy);
    assert_eq!(backend.files_path(), &FilesPath::Helper);
    let files = backend.files();
    assert_eq!(
        files
            .read_file(Path::new("/workspace/in.txt"))
            .await
            .expect("read"),
        b"needle from host\n"
    );
    files
        .write_file(Path::new("/workspace/out.txt"), b"needle written\n")
        .await
        .expect("write");
    let found = backend
        .search()
        .grep(
            GrepRequest {
                pattern: "needle".to_owned(),
                path: PathBuf::from("/workspace"),
                glob: None,
                ignore_case: false,
                literal: false,
                context: 0,
                max_matches: 10,
            },
            CancellationToken::new(),
        )
        .await
        .expect("grep");
    let names: Vec<&Path> = found.files.iter().map(|f| f.path.as_path()).collect();
    assert_eq!(
        names,
        [
            Path::new("/workspace/in.txt"),
            Path::new("/workspace/out.txt")
        ]
    );
    // The binary is root's, read-only, on a read-only mount: the command user cannot change it.
    let ran = run(
        &backend,
        "stat -c '%u:%g %a' /cordon-egress-helper/cordon-helper; \
         (echo x >> /cordon-egress-helper/cordon-helper) 2>/dev/null && echo changed || echo refused; \
         touch /cordon-egress-helper/other 2>/dev/null && echo created || echo refused; \
         pgrep -f 'cordon-helper [s]erve' | wc -l",
    )
    .await;
    assert_eq!(ran.output, "0:0 555\nrefused\nrefused\n1\n");
    backend.shutdown().await.expect("shut down");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("out.txt")).expect("copied back"),
        "needle written\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_holding_another_binary_is_copied_again_before_the_helper_starts() {
    let host = host_or_skip!();
    let helper = UniqueHelper::new(&host);
    let ws = workspace();
    // The first session fills the volume; then something else lands in it.
    copy_session(&host, ws.path(), &helper)
        .await
        .shutdown()
        .await
        .expect("shut down");
    helper.corrupt_volume();
    let backend = copy_session(&host, ws.path(), &helper).await;
    assert_eq!(backend.files_path(), &FilesPath::Helper);
    let local = Command::new("sha256sum")
        .arg(&helper.path)
        .output()
        .expect("sha256sum");
    let local = String::from_utf8_lossy(&local.stdout)
        .split_whitespace()
        .next()
        .expect("hash")
        .to_owned();
    assert_eq!(helper.volume_sha256(), local);
    backend.shutdown().await.expect("shut down");
}
