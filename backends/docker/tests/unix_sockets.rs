//! `[network] unix_sockets`: each listed host socket is bound into the container at the same
//! path, nothing else is; a listed path that is not a socket (or is a symbolic link) is refused
//! before any container exists, and so is a container engine's socket.

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::Path;

use cordon_backend_docker::{DockerBackend, DockerError};
use cordon_core::sandbox::NetworkMode;
use cordon_ops::Backend;

use crate::support::{self, host_or_skip, run, workspace};

/// A listening socket at `path` (open to the container's user) answering every connection with
/// `greeting`.
fn serve(path: &Path, greeting: &'static str) -> UnixListener {
    let listener = UnixListener::bind(path).expect("bind the socket");
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod the socket");
    let accepting = listener.try_clone().expect("clone the listener");
    std::thread::spawn(move || {
        for stream in accepting.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.write_all(greeting.as_bytes());
        }
    });
    listener
}

/// Connects to each socket from inside the container; one line per socket.
fn connect_script(sockets: &[&Path]) -> String {
    let paths: Vec<String> = sockets
        .iter()
        .map(|p| format!("'{}'", p.display()))
        .collect();
    format!(
        "python3 -c \"\nimport socket\nfor path in [{}]:\n    s = socket.socket(socket.AF_UNIX)\n    \
         try:\n        s.connect(path)\n        print(path, 'answered', s.recv(100).decode().strip())\n    \
         except OSError as e:\n        print(path, 'refused', type(e).__name__)\n\"",
        paths.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_host_socket_is_reachable_and_another_is_not() {
    let host = host_or_skip!();
    let ws = workspace();
    // Outside the workspace and away from the container's private /tmp.
    let dir = tempfile::Builder::new()
        .prefix("cordon-sockets-")
        .tempdir_in("/var/tmp")
        .expect("socket dir");
    let base = std::fs::canonicalize(dir.path()).expect("canonical");
    std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let granted = base.join("granted.sock");
    let other = base.join("other.sock");
    let _granted = serve(&granted, "hello from the granted socket\n");
    let _other = serve(&other, "hello from the other socket\n");

    let mut config = support::config(&host, ws.path());
    config.spec.network = NetworkMode::Enabled;
    config.spec.unix_sockets = vec![granted.display().to_string()];
    let backend = DockerBackend::start(config).await.expect("start");
    let ran = run(&backend, &connect_script(&[&granted, &other])).await;
    assert_eq!(
        ran.output,
        format!(
            "{} answered hello from the granted socket\n{} refused FileNotFoundError\n",
            granted.display(),
            other.display()
        )
    );
    backend.shutdown().await.expect("shut the session down");

    // Without the network no socket is bound (none can be connected with it off).
    let mut config = support::config(&host, ws.path());
    config.spec.unix_sockets = vec![granted.display().to_string()];
    let backend = DockerBackend::start(config).await.expect("start");
    let ran = run(&backend, &connect_script(&[&granted])).await;
    assert_eq!(
        ran.output,
        format!("{} refused FileNotFoundError\n", granted.display())
    );
    backend.shutdown().await.expect("shut the session down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_path_that_is_not_a_socket_is_refused_at_start() {
    let host = host_or_skip!();
    let ws = workspace();
    let dir = tempfile::tempdir().expect("dir");
    let base = std::fs::canonicalize(dir.path()).expect("canonical");
    let socket = base.join("real.sock");
    let _listener = UnixListener::bind(&socket).expect("bind");
    let file = base.join("file");
    std::fs::write(&file, "x").expect("write");
    let link = base.join("link.sock");
    std::os::unix::fs::symlink(&socket, &link).expect("symlink");
    for (listed, says) in [
        (&file, "it is not a Unix socket"),
        (&link, "it is a symbolic link"),
    ] {
        let mut config = support::config(&host, ws.path());
        config.spec.network = NetworkMode::Enabled;
        config.spec.unix_sockets = vec![listed.display().to_string()];
        let err = DockerBackend::start(config)
            .await
            .expect_err("a listed path that is not a socket must be refused");
        assert!(
            matches!(&err, DockerError::UnixSocket { entry, reason }
                if *entry == listed.display().to_string() && reason.contains(says)),
            "{err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_own_socket_is_refused_at_start() {
    let host = host_or_skip!();
    let ws = workspace();
    let engine = host
        .strip_prefix("unix://")
        .expect("the test engine is reached through a Unix socket");
    // Listed as the policy must list it: canonical.
    let listed = std::fs::canonicalize(engine).expect("canonical engine socket");
    let mut config = support::config(&host, ws.path());
    config.spec.network = NetworkMode::Enabled;
    config.spec.unix_sockets = vec![listed.display().to_string()];
    let err = DockerBackend::start(config)
        .await
        .expect_err("the engine's socket must not be granted");
    assert!(
        matches!(&err, DockerError::UnixSocket { entry, reason }
            if *entry == listed.display().to_string()
                && reason.contains("it is the container engine's socket")),
        "{err:?}"
    );
}
