//! The Docker [`SearchHost`] (grep and find are `cordon_remote::search::host`'s), one exec per
//! search: the file helper resolves and
//! confines the search path, then runs `rg --json` (when the image has it) or the POSIX listing
//! on the canonical path. Without rg, grep lists, applies the ignore rules here and streams the
//! chosen files as tar to search them here. find always uses the listing (it must include
//! symlinks to files, which rg skips). Both yield exactly the local backend's data.

use std::path::Path;

use cordon_ops::SearchError;
use cordon_remote::exec::TransportEvent;
use cordon_remote::files::{FileOp, RunPrelude, files_argv, split_run_prelude};
use cordon_remote::search::host::{SearchHost, Started, backend};
use cordon_remote::transport::Process;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::client::{self, Exec};

fn prelude_error(path: &Path, code: &str) -> SearchError {
    match code {
        "outside" => SearchError::OutsideRoot {
            path: path.to_path_buf(),
        },
        _ => SearchError::PathNotFound {
            path: path.to_path_buf(),
        },
    }
}

impl SearchHost for Inner {
    type Process = Exec;

    /// The file helper resolves and confines `path` in the container, says so in a prelude on
    /// stderr, then runs `argv` on the canonical path. Its stdin is held open while we read:
    /// dropping it (limit reached, cancelled, done) makes the helper kill the command.
    async fn start_on(
        &self,
        path: &Path,
        argv: Vec<String>,
        cancel: &CancellationToken,
    ) -> Result<Started<Exec>, SearchError> {
        let op = FileOp::Run {
            path: path.to_path_buf(),
            argv,
        };
        let helper = files_argv(&self.roots, &op).map_err(backend)?;
        let mut exec = self.start(helper).await?;
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let base = {
            let (mut events, _control) = exec.io();
            loop {
                if let Some((prelude, offset)) = split_run_prelude(&stderr) {
                    stderr.drain(..offset);
                    match prelude {
                        RunPrelude::Resolved(base) => break base,
                        RunPrelude::Failed { code, .. } => return Err(prelude_error(path, &code)),
                    }
                }
                let event = tokio::select! {
                    _ = cancel.cancelled() => return Err(SearchError::Cancelled),
                    event = events.next() => event,
                };
                match event.map(|e| e.map_err(backend)) {
                    None => return Err(backend("the file helper ended without an answer")),
                    Some(Err(e)) => return Err(e),
                    Some(Ok(TransportEvent::Stdout(bytes))) => stdout.extend_from_slice(&bytes),
                    Some(Ok(TransportEvent::Stderr(bytes))) => stderr.extend_from_slice(&bytes),
                }
            }
        };
        Ok(Started {
            process: exec,
            base,
            stdout,
            stderr,
        })
    }

    /// When the engine refuses, a dead container may explain it (the search was not done: the
    /// error says so).
    async fn start(&self, argv: Vec<String>) -> Result<Exec, SearchError> {
        let seen = self.recovery.generation();
        match client::start_exec(&self.docker, &self.container, argv, None).await {
            Ok(exec) => Ok(exec),
            Err(e) => Err(SearchError::Backend {
                reason: self.explain_failure(seen, e.to_string()).await,
            }),
        }
    }

    fn has_rg(&self) -> bool {
        self.has_rg
    }
}
