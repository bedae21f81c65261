//! Podman's Docker-compatible API (`podman system service`, started by
//! `scripts/podman-start.sh` on a private socket with the test images loaded offline): a real
//! session with the file helper, commands, denied paths masked, and copy mode refused. Without
//! Podman the tests FAIL (the script installs it as root), unless `CORDON_SKIP_PODMAN=1` opts
//! out explicitly.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cordon_backend_docker::{
    DockerBackend, DockerError, EngineKind, EngineTransport, FilesHelper, FilesPath, WorkspaceMode,
};
use cordon_ops::{Backend, FsError, GrepRequest};
use tokio_util::sync::CancellationToken;

use crate::support::{self, run, workspace};

static PODMAN: OnceLock<Option<String>> = OnceLock::new();

/// The Podman socket's URI, or `None` when the user opted out with `CORDON_SKIP_PODMAN=1`.
fn podman_host() -> Option<String> {
    PODMAN
        .get_or_init(|| {
            if std::env::var("CORDON_SKIP_PODMAN").as_deref() == Ok("1") {
                eprintln!("CORDON_SKIP_PODMAN=1: skipping the Podman tests as requested");
                return None;
            }
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/podman-start.sh");
            let out = Command::new("bash")
                .arg(script)
                .output()
                .expect("run scripts/podman-start.sh");
            assert!(
                out.status.success(),
                "no Podman service: scripts/podman-start.sh failed ({}):\n{}\nInstall podman and \
                 catatonit, or set CORDON_SKIP_PODMAN=1 to skip these tests explicitly.",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        })
        .clone()
}

macro_rules! podman_or_skip {
    () => {
        match podman_host() {
            Some(host) => host,
            None => return,
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_podman_runs_files_through_the_helper_and_commands() {
    let host = podman_or_skip!();
    let ws = workspace();
    std::fs::write(ws.path().join("in.txt"), "needle from host\n").expect("write");
    std::fs::create_dir(ws.path().join("secrets")).expect("mkdir");
    std::fs::write(ws.path().join("secrets/key"), "hunter2\n").expect("write");
    std::fs::write(ws.path().join(".env"), "TOKEN=hunter3\n").expect("write");
    let mut config = support::config(&host, ws.path());
    config.image = support::DEBIAN.to_owned();
    config.helper = Some(support::helper());
    config.files_helper = FilesHelper::Required;
    config.spec.denied = vec!["secrets/**".to_owned(), "**/.env".to_owned()];
    config.spec.limits.pids = Some(123);
    config.spec.limits.memory_bytes = Some(300 << 20);
    let backend = DockerBackend::start(config)
        .await
        .expect("a session on podman starts");
    assert_eq!(backend.engine_kind(), EngineKind::Podman);
    assert_eq!(backend.engine_transport(), EngineTransport::Unix);
    assert_eq!(backend.workspace_mode(), WorkspaceMode::Bind);
    assert_eq!(backend.files_path(), &FilesPath::Helper);
    // Podman reports the exec's pid as this machine sees it: the helper's socket is used.
    assert_eq!(backend.helper_transport().as_deref(), Some("socket"));

    let files = backend.files();
    files
        .write_file(Path::new("/workspace/out.txt"), b"needle written\n")
        .await
        .expect("write");
    assert_eq!(
        files
            .read_file(Path::new("/workspace/in.txt"))
            .await
            .expect("read"),
        b"needle from host\n"
    );
    assert_eq!(
        std::fs::read(ws.path().join("out.txt")).expect("host read"),
        b"needle written\n"
    );
    let err = files
        .read_file(Path::new("/workspace/.env"))
        .await
        .expect_err("denied");
    assert!(matches!(err, FsError::Denied { .. }), "{err:?}");
    // The denied directory is masked in the container: its file is not there at all.
    let err = files
        .read_file(Path::new("/workspace/secrets/key"))
        .await
        .expect_err("masked");
    assert!(
        matches!(err, FsError::Denied { .. } | FsError::NotFound { .. }),
        "{err:?}"
    );
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
    // Commands: the same hardening as on Docker (no capabilities, no new privileges, the
    // engine's seccomp filter, a read-only root, the pids limit and the memory limit with the
    // helper's 64 MiB of headroom; the interfaces read from /proc, since the helper's Landlock
    // rules keep commands out of /sys/class), a private home
    // owned by the user (Podman gives the tmpfs the image directory's mode; the session makes
    // it 0700), and the denied directory and file masked (Podman would copy the directory's
    // files into its tmpfs mask without `notmpcopyup`).
    let ran = run(
        &backend,
        "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; \
         touch /probe 2>/dev/null || echo rootfs-read-only; \
         cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max 2>/dev/null; \
         cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null; \
         stat -c '%u %a' \"$HOME\"; ls -A secrets; cat .env; grep -rs hunter . | wc -l; \
         cat out.txt; echo made > made.txt",
    )
    .await;
    assert_eq!(
        ran.output,
        "CapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nlo\nrootfs-read-only\n123\n\
         381681664\n0 700\n0\nneedle written\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("made.txt")).expect("made"),
        "made\n"
    );
    backend.shutdown().await.expect("shut down");
    assert!(!support::container_exists(&host, backend.container()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_mode_on_podman_is_refused() {
    let host = podman_or_skip!();
    let ws = workspace();
    let mut config = support::config(&host, ws.path());
    config.mode = WorkspaceMode::Copy;
    let error = DockerBackend::start(config)
        .await
        .expect_err("copy mode is refused");
    assert!(
        matches!(error, DockerError::PodmanCopyMode { .. }),
        "{error:?}"
    );
}
