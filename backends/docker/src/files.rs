//! The Docker [`FileHost`]: file operations are `cordon_remote::file_ops::RemoteFiles` over the
//! session's workers (each operation one request to a worker in the container, paths confined
//! and canonicalised there, rules judged here on the canonical path). What Docker adds: the
//! container's workspace, home and spill paths, the session's uid:gid, and a dead container as
//! the explanation of an operation that did nothing (module `recovery`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordon_ops::BackendId;
use cordon_remote::file_ops::FileHost;
use cordon_remote::files::PathRules;
use cordon_remote::runner::Runner;

use crate::Inner;
use crate::client::DockerTransport;

impl FileHost for Inner {
    type Transport = DockerTransport;

    fn runner(&self) -> &Arc<Runner<DockerTransport>> {
        &self.runner
    }

    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    fn root(&self) -> &Path {
        &self.workspace
    }

    fn home(&self) -> Option<&Path> {
        Some(&self.home)
    }

    fn spill_dir(&self) -> &Path {
        &self.spill_dir
    }

    fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    fn rules(&self) -> &PathRules {
        &self.rules
    }

    fn account(&self) -> (u32, &[u32]) {
        (self.uid, std::slice::from_ref(&self.gid))
    }

    fn pinned(&self) -> &[PathBuf] {
        &self.pinned
    }

    fn generation(&self) -> u64 {
        self.recovery.generation()
    }

    /// A dead container explains the silence: it is replaced, and the model is told.
    async fn explain(&self, seen: u64, reason: String) -> String {
        self.explain_failure(seen, reason).await
    }
}
