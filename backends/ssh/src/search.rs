//! The SSH [`SearchHost`] (grep and find are `cordon_remote::search::host`'s), on the remote
//! host: grep with `rg --json` when the host has ripgrep
//! (the POSIX fallback otherwise: a `find` listing filtered by the gitignore engine here, the
//! chosen files streamed back as tar and searched here), find from the POSIX listing. Both
//! produce exactly the local backend's data (`cordon-remote` does the parsing).

use std::path::{Path, PathBuf};

use cordon_ops::{FsError, SearchError};
use cordon_remote::search::host::{SearchHost, Started, backend};
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::remote::RemoteExec;

impl Inner {
    /// Whether `path` or a directory above it (inside the roots) is denied: the local backend
    /// prunes denied entries from its walk, so nothing below them is listed either.
    fn denied_or_under(&self, path: &Path) -> bool {
        if self.spec.denied.is_empty() {
            return false;
        }
        path.ancestors()
            .take_while(|p| self.rules.roots().iter().any(|r| p.starts_with(&r.path)))
            .any(|p| self.rules.is_denied(p))
    }

    /// Resolve the search path: canonical, readable under the rules, existing.
    async fn search_root(&self, path: &Path) -> Result<PathBuf, SearchError> {
        use cordon_ops::FileOperations;
        let map = |e: FsError| match e {
            FsError::OutsideRoot { .. } => SearchError::OutsideRoot {
                path: path.to_path_buf(),
            },
            FsError::NotFound { .. } | FsError::Denied { .. } => SearchError::PathNotFound {
                path: path.to_path_buf(),
            },
            other => backend(other),
        };
        let canonical = self.canonicalize(path).await.map_err(map)?;
        self.metadata(&canonical).await.map_err(map)?;
        Ok(canonical)
    }
}

impl SearchHost for Inner {
    type Process = RemoteExec;

    /// The path is resolved over SFTP (canonical, readable under the rules, existing), then
    /// `argv` runs on it.
    async fn start_on(
        &self,
        path: &Path,
        mut argv: Vec<String>,
        _cancel: &CancellationToken,
    ) -> Result<Started<RemoteExec>, SearchError> {
        let base = self.search_root(path).await?;
        argv.push(
            base.to_str()
                .ok_or_else(|| backend("the search path is not UTF-8"))?
                .to_owned(),
        );
        Ok(Started {
            process: self.start(argv).await?,
            base,
            stdout: Vec::new(),
            stderr: Vec::new(),
        })
    }

    async fn start(&self, argv: Vec<String>) -> Result<RemoteExec, SearchError> {
        RemoteExec::start(&self.pool, &argv).await.map_err(backend)
    }

    fn has_rg(&self) -> bool {
        self.identity.has_rg && !self.force_fallback
    }

    /// The policy's denied globs: the local backend prunes denied entries from its walk.
    fn hidden_globs(&self) -> &[String] {
        &self.spec.denied
    }

    fn hidden(&self, path: &Path) -> bool {
        self.denied_or_under(path)
    }
}
