//! [`SearchOperations`] on the remote host: grep with `rg --json` when the host has ripgrep
//! (the POSIX fallback otherwise: a `find` listing filtered by the gitignore engine here, the
//! chosen files streamed back as tar and searched here), find from the POSIX listing. Both
//! produce exactly the local backend's data (`cordon-remote` does the parsing).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use cordon_remote::exec::TransportEvent;
use cordon_remote::search::fallback::search_tar;
use cordon_remote::search::ignore_rules::walk;
use cordon_remote::search::listing::{
    Listing, fetch_argv, fetch_input, list_argv, parse_fetch_errors, parse_find_errors,
    parse_listing,
};
use cordon_remote::search::rg::{Flow, RgCollector, rg_argv};
use cordon_remote::search::{compile_glob, compile_pattern};
use cordon_tools::ops::{
    FindOutput, FindRequest, FsError, GrepOutput, GrepRequest, SearchError, SearchOperations,
};
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::remote::{Collected, RemoteExec, StdinEnd, run_collect};

fn backend(e: impl std::fmt::Display) -> SearchError {
    SearchError::Backend {
        reason: e.to_string(),
    }
}

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
        use cordon_tools::ops::FileOperations;
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

    async fn collect_cancellable(
        &self,
        argv: &[String],
        stdin: Option<&[u8]>,
        end: StdinEnd,
        cancel: &CancellationToken,
    ) -> Result<Collected, SearchError> {
        tokio::select! {
            _ = cancel.cancelled() => Err(SearchError::Cancelled),
            result = run_collect(&self.pool, argv, stdin, end) => result.map_err(backend),
        }
    }

    async fn grep_rg(
        &self,
        request: &GrepRequest,
        base: &Path,
        cancel: &CancellationToken,
    ) -> Result<GrepOutput, SearchError> {
        let glob = compile_glob(request.glob.as_deref())?;
        let mut req = request.clone();
        req.path = base.to_path_buf();
        let mut argv = rg_argv(&req);
        // Prune denied paths in rg too, so they do not count against the limit; the result is
        // filtered again below with the backend's own glob engine.
        let at = argv
            .iter()
            .position(|a| a == "--regexp")
            .unwrap_or(argv.len());
        for glob in &self.spec.denied {
            argv.insert(at, format!("!{glob}"));
            argv.insert(at, "--glob".to_owned());
        }
        let mut exec = RemoteExec::start(&self.pool, &argv)
            .await
            .map_err(backend)?;
        exec.eof().await;
        let mut collector = RgCollector::new(base, glob, request.max_matches);
        let mut line = Vec::new();
        let mut errors = Vec::new();
        let mut stopped = false;
        loop {
            let event = tokio::select! {
                _ = cancel.cancelled() => {
                    exec.close().await;
                    return Err(SearchError::Cancelled);
                }
                event = exec.next() => event,
            };
            let Some(event) = event else { break };
            match event.map_err(backend)? {
                TransportEvent::Stdout(bytes) => {
                    for &byte in bytes.iter() {
                        if byte == b'\n' {
                            if collector.push_line(&line) == Flow::Stop {
                                stopped = true;
                            }
                            line.clear();
                            if stopped {
                                break;
                            }
                        } else {
                            line.push(byte);
                        }
                    }
                    if stopped {
                        // Enough matches: stop the remote rg.
                        exec.close().await;
                        break;
                    }
                }
                TransportEvent::Stderr(bytes) => errors.extend_from_slice(&bytes),
            }
        }
        if !stopped && !exec.started() {
            return Err(backend(exec.not_started_reason()));
        }
        if !line.is_empty() && !collector.is_done() {
            collector.push_line(&line);
        }
        for text in String::from_utf8_lossy(&errors).lines() {
            collector.push_error(text);
        }
        let mut output = collector.finish();
        output.files.retain(|f| !self.denied_or_under(&f.path));
        Ok(output)
    }

    async fn listing(
        &self,
        base: &Path,
        cancel: &CancellationToken,
    ) -> Result<(Listing, Vec<String>), SearchError> {
        let argv = list_argv(base).map_err(backend)?;
        let out = self
            .collect_cancellable(&argv, None, StdinEnd::AfterInput, cancel)
            .await?;
        let listing = parse_listing(&out.stdout).map_err(backend)?;
        Ok((
            listing,
            parse_find_errors(&String::from_utf8_lossy(&out.stderr)),
        ))
    }

    async fn grep_fallback(
        &self,
        request: &GrepRequest,
        base: &Path,
        cancel: &CancellationToken,
    ) -> Result<GrepOutput, SearchError> {
        let regex = compile_pattern(request)?;
        let glob = compile_glob(request.glob.as_deref())?;
        let (listing, errors) = self.listing(base, cancel).await?;
        let files: Vec<PathBuf> = walk(&listing, base)
            .files
            .into_iter()
            .filter(|f| glob.as_ref().is_none_or(|g| g.matches(base, f)))
            .filter(|f| !self.denied_or_under(f))
            .collect();
        if files.is_empty() {
            return Ok(GrepOutput {
                files: Vec::new(),
                errors,
            });
        }
        let stdin = fetch_input(&files);
        let literal = (request.literal && !request.ignore_case).then_some(request.pattern.as_str());
        let out = self
            // The fetch reads its file list, then takes EOF as "stop": keep stdin open.
            .collect_cancellable(
                &fetch_argv(literal),
                Some(&stdin),
                StdinEnd::AfterOutput,
                cancel,
            )
            .await?;
        let mut found = search_tar(
            &out.stdout,
            &files,
            &regex,
            request.context,
            request.max_matches,
        );
        found.errors = errors;
        found
            .errors
            .extend(parse_fetch_errors(&String::from_utf8_lossy(&out.stderr)));
        Ok(found)
    }
}

#[async_trait]
impl SearchOperations for Inner {
    async fn grep(
        &self,
        request: GrepRequest,
        cancel: CancellationToken,
    ) -> Result<GrepOutput, SearchError> {
        compile_pattern(&request)?;
        compile_glob(request.glob.as_deref())?;
        let base = self.search_root(&request.path).await?;
        if request.max_matches == 0 {
            return Ok(GrepOutput::default());
        }
        if self.identity.has_rg && !self.force_fallback {
            self.grep_rg(&request, &base, &cancel).await
        } else {
            self.grep_fallback(&request, &base, &cancel).await
        }
    }

    async fn find(
        &self,
        request: FindRequest,
        cancel: CancellationToken,
    ) -> Result<FindOutput, SearchError> {
        let glob = compile_glob(Some(&request.pattern))?.ok_or_else(|| backend("empty glob"))?;
        let base = self.search_root(&request.path).await?;
        let (listing, errors) = self.listing(&base, &cancel).await?;
        let paths: Vec<PathBuf> = walk(&listing, &base)
            .files_and_links()
            .into_iter()
            .filter(|p| glob.matches(&base, p))
            .filter(|p| !self.denied_or_under(p))
            .take(request.max_results)
            .collect();
        Ok(FindOutput { paths, errors })
    }
}
