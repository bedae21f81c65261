//! [`SearchOperations`] inside the container, one exec per search: the file helper resolves and
//! confines the search path, then runs `rg --json` (when the image has it) or the POSIX listing
//! on the canonical path. Without rg, grep lists, applies the ignore rules here and streams the
//! chosen files as tar to search them here. find always uses the listing (it must include
//! symlinks to files, which rg skips). Both yield exactly the local backend's data.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use cordon_remote::files::{FileOp, RunPrelude, files_argv, split_run_prelude};
use cordon_remote::search::fallback::search_tar;
use cordon_remote::search::ignore_rules::walk;
use cordon_remote::search::listing::{
    Listing, fetch_argv, fetch_input, list_argv, parse_fetch_errors, parse_find_errors,
    parse_listing,
};
use cordon_remote::search::rg::{Flow, RgCollector, rg_argv};
use cordon_remote::search::{compile_glob, compile_pattern};
use cordon_tools::ops::{
    FindOutput, FindRequest, GrepOutput, GrepRequest, SearchError, SearchOperations,
};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::client::{self, ExecOutput};
use crate::files::collect;

fn backend(e: impl std::fmt::Display) -> SearchError {
    SearchError::Backend {
        reason: e.to_string(),
    }
}

/// `argv` without its last element (the path, which the helper appends canonicalised).
fn without_path(mut argv: Vec<String>) -> Vec<String> {
    argv.pop();
    argv
}

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

/// The streams of a `run` exec, split into the resolved path and the command's output. The
/// exec's stdin is held open while we read: dropping it (limit reached, cancelled, done) makes
/// the helper kill the command, so nothing stays blocked writing to a closed connection.
struct RunExec {
    _input: crate::client::ExecInput,
    output: ExecOutput,
    stderr: Vec<u8>,
    stdout: Vec<u8>,
}

impl RunExec {
    /// Read until the prelude is known; command output read meanwhile stays buffered.
    async fn resolve(
        &mut self,
        path: &Path,
        cancel: &CancellationToken,
    ) -> Result<PathBuf, SearchError> {
        loop {
            if let Some((prelude, offset)) = split_run_prelude(&self.stderr) {
                self.stderr.drain(..offset);
                return match prelude {
                    RunPrelude::Resolved(base) => Ok(base),
                    RunPrelude::Failed { code, .. } => Err(prelude_error(path, &code)),
                };
            }
            if !self.pump(cancel).await? {
                return Err(backend("the file helper ended without an answer"));
            }
        }
    }

    /// Read one frame; `false` at the end of the streams.
    async fn pump(&mut self, cancel: &CancellationToken) -> Result<bool, SearchError> {
        let frame = tokio::select! {
            _ = cancel.cancelled() => return Err(SearchError::Cancelled),
            frame = self.output.next() => frame,
        };
        match frame {
            None => Ok(false),
            Some(frame) => {
                match frame.map_err(backend)? {
                    bollard::container::LogOutput::StdOut { message }
                    | bollard::container::LogOutput::Console { message } => {
                        self.stdout.extend_from_slice(&message)
                    }
                    bollard::container::LogOutput::StdErr { message } => {
                        self.stderr.extend_from_slice(&message)
                    }
                    bollard::container::LogOutput::StdIn { .. } => {}
                }
                Ok(true)
            }
        }
    }
}

impl Inner {
    /// Start a search exec; when the engine refuses, a dead container may explain it (the
    /// search was not done: the error says so).
    async fn start_search_exec(&self, argv: Vec<String>) -> Result<client::Exec, SearchError> {
        let seen = self.recovery.generation();
        match client::start_exec(&self.docker, &self.container, argv, None).await {
            Ok(exec) => Ok(exec),
            Err(e) => Err(SearchError::Backend {
                reason: self.explain_failure(seen, e.to_string()).await,
            }),
        }
    }

    async fn start_run(&self, path: &Path, argv: Vec<String>) -> Result<RunExec, SearchError> {
        let op = FileOp::Run {
            path: path.to_path_buf(),
            argv,
        };
        let helper = files_argv(&self.roots, &op).map_err(backend)?;
        let exec = self.start_search_exec(helper).await?;
        Ok(RunExec {
            _input: exec.input,
            output: exec.output,
            stderr: Vec::new(),
            stdout: Vec::new(),
        })
    }

    async fn grep_rg(
        &self,
        request: &GrepRequest,
        cancel: &CancellationToken,
    ) -> Result<GrepOutput, SearchError> {
        let glob = compile_glob(request.glob.as_deref())?;
        let mut run = self
            .start_run(&request.path, without_path(rg_argv(request)))
            .await?;
        let base = run.resolve(&request.path, cancel).await?;
        let mut collector = RgCollector::new(&base, glob, request.max_matches);
        let mut consumed = 0;
        'read: loop {
            // Whole lines only; a partial line waits for the next frame.
            while let Some(end) = run.stdout[consumed..].iter().position(|&b| b == b'\n') {
                let line = &run.stdout[consumed..consumed + end];
                consumed += end + 1;
                if collector.push_line(line) == Flow::Stop {
                    break 'read;
                }
            }
            if !run.pump(cancel).await? {
                if consumed < run.stdout.len() {
                    collector.push_line(&run.stdout[consumed..]);
                }
                break;
            }
        }
        for text in String::from_utf8_lossy(&run.stderr).lines() {
            collector.push_error(text);
        }
        Ok(collector.finish())
    }

    /// The POSIX listing of `path` (one exec) and its error notes.
    async fn listing(
        &self,
        path: &Path,
        cancel: &CancellationToken,
    ) -> Result<(PathBuf, Listing, Vec<String>), SearchError> {
        let argv = without_path(list_argv(path).map_err(backend)?);
        let mut run = self.start_run(path, argv).await?;
        let base = run.resolve(path, cancel).await?;
        while run.pump(cancel).await? {}
        let listing = parse_listing(&run.stdout).map_err(backend)?;
        let errors = parse_find_errors(&String::from_utf8_lossy(&run.stderr));
        Ok((base, listing, errors))
    }

    async fn grep_fallback(
        &self,
        request: &GrepRequest,
        cancel: &CancellationToken,
    ) -> Result<GrepOutput, SearchError> {
        let regex = compile_pattern(request)?;
        let glob = compile_glob(request.glob.as_deref())?;
        let (base, listing, errors) = self.listing(&request.path, cancel).await?;
        let files: Vec<PathBuf> = walk(&listing, &base)
            .files
            .into_iter()
            .filter(|f| glob.as_ref().is_none_or(|g| g.matches(&base, f)))
            .collect();
        if files.is_empty() {
            return Ok(GrepOutput {
                files: Vec::new(),
                errors,
            });
        }
        let stdin = fetch_input(&files);
        // The grep -F prefilter only where its matching equals ours (case-sensitive literal).
        let literal = (request.literal && !request.ignore_case).then_some(request.pattern.as_str());
        let mut exec = self.start_search_exec(fetch_argv(literal)).await?;
        // stdin stays open until the output ends; dropping it early stops the fetch.
        exec.input.write_all(&stdin).await.map_err(backend)?;
        exec.input.flush().await.map_err(backend)?;
        let (tar, fetch_stderr) = tokio::select! {
            _ = cancel.cancelled() => return Err(SearchError::Cancelled),
            result = collect(exec.output) => result.map_err(backend)?,
        };
        drop(exec.input);
        let mut out = search_tar(&tar, &files, &regex, request.context, request.max_matches);
        out.errors = errors;
        out.errors
            .extend(parse_fetch_errors(&String::from_utf8_lossy(&fetch_stderr)));
        Ok(out)
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
        if self.has_rg {
            self.grep_rg(&request, &cancel).await
        } else {
            self.grep_fallback(&request, &cancel).await
        }
    }

    async fn find(
        &self,
        request: FindRequest,
        cancel: CancellationToken,
    ) -> Result<FindOutput, SearchError> {
        let glob = compile_glob(Some(&request.pattern))?
            .ok_or_else(|| backend("the find pattern is empty"))?;
        let (base, listing, errors) = self.listing(&request.path, &cancel).await?;
        let paths: Vec<PathBuf> = walk(&listing, &base)
            .files_and_links()
            .into_iter()
            .filter(|p| glob.matches(&base, p))
            .take(request.max_results)
            .collect();
        Ok(FindOutput { paths, errors })
    }
}
