//! Test doubles for the backend traits, for this crate's unit tests and other crates' tests.
//!
//! [`StdFiles`] implements [`FileOperations`] over `std::fs` with a lexical root check only —
//! it is NOT a confinement boundary (the real backends confine by kernel or remote-side
//! checks); it exists so tool logic can be tested without a backend crate.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use crate::ops::{BackendId, DirEntry, FileKind, FileMeta, FileOperations, FsError, SpillWriter};

/// `std::fs`-backed [`FileOperations`] rooted at a directory (tests only).
#[derive(Debug)]
pub struct StdFiles {
    id: BackendId,
    root: PathBuf,
    home: Option<PathBuf>,
    spill_dir: PathBuf,
}

impl StdFiles {
    /// Files rooted at `root` (canonicalised); spill files go to `root/../<root name>.spill/`.
    pub fn new(root: &Path) -> Self {
        let root = std::fs::canonicalize(root).expect("test root must exist");
        let spill_dir = root.with_extension("spill");
        StdFiles {
            id: BackendId::new(format!("test:{}", root.display())),
            root,
            home: None,
            spill_dir,
        }
    }

    /// Builder: set the home directory used for `~`.
    pub fn with_home(mut self, home: &Path) -> Self {
        self.home = Some(home.to_path_buf());
        self
    }

    fn check(&self, path: &Path) -> Result<(), FsError> {
        if path.starts_with(&self.root) || path.starts_with(&self.spill_dir) {
            Ok(())
        } else {
            Err(FsError::OutsideRoot {
                path: path.to_path_buf(),
            })
        }
    }
}

fn kind_of(meta: &std::fs::Metadata) -> FileKind {
    if meta.is_file() {
        FileKind::File
    } else if meta.is_dir() {
        FileKind::Dir
    } else if meta.file_type().is_symlink() {
        FileKind::Symlink
    } else {
        FileKind::Other
    }
}

#[async_trait]
impl FileOperations for StdFiles {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn home(&self) -> Option<&Path> {
        self.home.as_deref()
    }

    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        self.check(path)?;
        tokio::fs::read(path)
            .await
            .map_err(|e| FsError::from_io("read", path, e))
    }

    async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
        use tokio::io::AsyncReadExt;
        self.check(path)?;
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| FsError::from_io("open", path, e))?;
        let mut buf = Vec::with_capacity(max_bytes.min(1 << 16));
        file.take(max_bytes as u64)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| FsError::from_io("read", path, e))?;
        Ok(buf)
    }

    async fn read_range(
        &self,
        path: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        self.check(path)?;
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| FsError::from_io("open", path, e))?;
        file.seek(std::io::SeekFrom::Start(offset))
            .await
            .map_err(|e| FsError::from_io("read", path, e))?;
        let mut buf = Vec::with_capacity(max_bytes.min(1 << 16));
        file.take(max_bytes as u64)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| FsError::from_io("read", path, e))?;
        Ok(buf)
    }

    async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
        use std::os::unix::fs::PermissionsExt;
        self.check(path)?;
        let target = tokio::fs::canonicalize(path)
            .await
            .unwrap_or_else(|_| path.to_path_buf());
        let mode = tokio::fs::metadata(&target)
            .await
            .ok()
            .map(|m| m.permissions().mode());
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = target.with_file_name(format!(
            ".{}.cordon-tmp-{}",
            target
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("file"),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        tokio::fs::write(&tmp, data)
            .await
            .map_err(|e| FsError::from_io("write", path, e))?;
        if let Some(mode) = mode {
            let perms = std::fs::Permissions::from_mode(mode);
            tokio::fs::set_permissions(&tmp, perms)
                .await
                .map_err(|e| FsError::from_io("chmod", path, e))?;
        }
        tokio::fs::rename(&tmp, &target)
            .await
            .map_err(|e| FsError::from_io("rename", path, e))
    }

    async fn create_dir_all(&self, path: &Path) -> Result<(), FsError> {
        self.check(path)?;
        tokio::fs::create_dir_all(path)
            .await
            .map_err(|e| FsError::from_io("mkdir", path, e))
    }

    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
        use std::os::unix::fs::PermissionsExt;
        self.check(path)?;
        let meta = tokio::fs::metadata(path)
            .await
            .map_err(|e| FsError::from_io("stat", path, e))?;
        let mode = meta.permissions().mode() & 0o7777;
        Ok(FileMeta {
            kind: kind_of(&meta),
            size: meta.len(),
            mode,
            writable: mode & 0o222 != 0,
        })
    }

    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        self.check(path)?;
        let mut dir = tokio::fs::read_dir(path)
            .await
            .map_err(|e| FsError::from_io("list", path, e))?;
        let mut out = Vec::new();
        while let Some(entry) = dir
            .next_entry()
            .await
            .map_err(|e| FsError::from_io("list", path, e))?
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            match tokio::fs::metadata(entry.path()).await {
                Ok(meta) => out.push(DirEntry {
                    name,
                    kind: Some(kind_of(&meta)),
                    error: None,
                }),
                Err(e) => out.push(DirEntry {
                    name,
                    kind: None,
                    error: Some(e.to_string()),
                }),
            }
        }
        Ok(out)
    }

    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        let mut existing = path.to_path_buf();
        let mut rest = Vec::new();
        let resolved = loop {
            match tokio::fs::canonicalize(&existing).await {
                Ok(real) => break real,
                Err(_) => match (existing.parent(), existing.file_name()) {
                    (Some(parent), Some(name)) => {
                        rest.push(name.to_owned());
                        existing = parent.to_path_buf();
                    }
                    _ => {
                        return Err(FsError::NotFound {
                            path: path.to_path_buf(),
                        });
                    }
                },
            }
        };
        let full = rest.iter().rev().fold(resolved, |acc, name| acc.join(name));
        self.check(&full)?;
        Ok(full)
    }

    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        tokio::fs::create_dir_all(&self.spill_dir)
            .await
            .map_err(|e| FsError::from_io("mkdir", &self.spill_dir, e))?;
        let path = self
            .spill_dir
            .join(format!("cordon-bash-{:016x}.log", fastrand::u64(..)));
        let file = tokio::fs::File::create(&path)
            .await
            .map_err(|e| FsError::from_io("create", &path, e))?;
        Ok((path, Box::new(file)))
    }
}
