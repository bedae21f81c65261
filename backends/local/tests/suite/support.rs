//! Fixtures shared by the test modules.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use cordon_backend_local::{LocalBackend, LocalConfig, SandboxSpec};
use cordon_ops::{Backend, BashOperations, FileOperations, SearchOperations};

/// A temp directory holding a workspace, an outside directory with a secret, and a state
/// base, plus a backend over the workspace.
pub struct Fixture {
    /// Keeps the directory alive.
    pub _dir: tempfile::TempDir,
    /// The workspace root (canonical).
    pub ws: PathBuf,
    /// A directory next to the workspace that must stay untouchable.
    pub outside: PathBuf,
    /// The state base given to the backend.
    pub state: PathBuf,
    /// The backend.
    pub backend: LocalBackend,
}

/// The spec most tests use: `.git/**` protected, `**/.env` denied, degraded commands allowed.
pub fn test_spec() -> SandboxSpec {
    SandboxSpec {
        protected: vec![".git/**".into()],
        denied: vec!["**/.env".into()],
        allow_degraded: true,
        ..SandboxSpec::default()
    }
}

impl Fixture {
    pub fn new() -> Fixture {
        Fixture::with(|_, _| {})
    }

    /// A fixture whose spec is adjusted by `tune(spec, tempdir)` before the backend is built.
    pub fn with(tune: impl FnOnce(&mut SandboxSpec, &Path)) -> Fixture {
        let dir = tempfile::tempdir().expect("create temp dir");
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let ws = base.join("ws");
        let outside = base.join("outside");
        let state = base.join("state");
        for d in [&ws, &outside, &state] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(outside.join("secret.txt"), "outside secret\n").unwrap();
        let mut spec = test_spec();
        tune(&mut spec, &base);
        let backend = LocalBackend::new(LocalConfig {
            profile: cordon_backend_local::Profile::Host,
            workspace_is_copy: false,
            root: ws.clone(),
            spec,
            home: Some(base.join("home")),
            state_base: Some(state.clone()),
        })
        .expect("create backend");
        Fixture {
            _dir: dir,
            ws,
            outside,
            state,
            backend,
        }
    }

    pub fn files(&self) -> Arc<dyn FileOperations> {
        self.backend.files()
    }

    pub fn bash(&self) -> Arc<dyn BashOperations> {
        self.backend.bash()
    }

    pub fn search(&self) -> Arc<dyn SearchOperations> {
        self.backend.search()
    }

    /// `ws/<rel>`.
    pub fn at(&self, rel: &str) -> PathBuf {
        self.ws.join(rel)
    }

    /// Write `ws/<rel>` (creating parents) with std, bypassing the backend.
    pub fn put(&self, rel: &str, content: &str) -> PathBuf {
        let path = self.at(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        path
    }
}

/// Content and modification time of a file, to prove it was not touched.
pub fn snapshot(path: &Path) -> (Vec<u8>, SystemTime, u64) {
    let meta = std::fs::metadata(path).unwrap();
    (
        std::fs::read(path).unwrap(),
        meta.modified().unwrap(),
        meta.ino(),
    )
}

/// Sorted entry names of a directory.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Tests that need root (to create files owned by someone else) fail without it, unless the
/// user opted out explicitly.
pub fn require_root(what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CORDON_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping {what}: not root and CORDON_SKIP_ROOT_TESTS=1");
        return false;
    }
    panic!("{what} needs root; run as root or set CORDON_SKIP_ROOT_TESTS=1 to skip it");
}
