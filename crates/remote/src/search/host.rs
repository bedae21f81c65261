//! grep and find of every remote backend, written once over a [`SearchHost`]: the backend
//! starts a process on a resolved, confined search path (and says which found paths the
//! policy hides); everything else is here: `rg --json` read line by line until the limit,
//! the POSIX listing for find and for hosts without `rg`, the fallback that fetches the chosen
//! files as tar and searches them here, cancellation, and the errors of each step.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use cordon_ops::{FindOutput, FindRequest, GrepOutput, GrepRequest, SearchError, SearchOperations};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::exec::TransportEvent;
use crate::search::fallback::search_tar;
use crate::search::ignore_rules::walk;
use crate::search::listing::{
    Listing, fetch_argv, fetch_input, list_argv, parse_fetch_errors, parse_find_errors,
    parse_listing,
};
use crate::search::rg::{Flow, RgCollector, rg_argv};
use crate::search::{compile_glob, compile_pattern};
use crate::transport::{Collected, Process, StdinEnd, collect};

/// A search process started on a resolved path.
pub struct Started<P> {
    /// The process; dropping it stops the search.
    pub process: P,
    /// The canonical path it searches.
    pub base: PathBuf,
    /// What it printed on stdout while the path was being resolved.
    pub stdout: Vec<u8>,
    /// What it printed on stderr meanwhile.
    pub stderr: Vec<u8>,
}

/// A backend's part of grep and find.
pub trait SearchHost: Send + Sync + 'static {
    /// The processes it starts.
    type Process: Process;

    /// Resolve `path` (canonical, inside the roots, readable, existing: else
    /// [`SearchError::OutsideRoot`] or [`SearchError::PathNotFound`]) and start `argv` with
    /// the canonical path appended.
    fn start_on(
        &self,
        path: &Path,
        argv: Vec<String>,
        cancel: &CancellationToken,
    ) -> impl Future<Output = Result<Started<Self::Process>, SearchError>> + Send;

    /// Start `argv` as it is (the fallback's fetch).
    fn start(
        &self,
        argv: Vec<String>,
    ) -> impl Future<Output = Result<Self::Process, SearchError>> + Send;

    /// Whether grep may use `rg` on this host.
    fn has_rg(&self) -> bool;

    /// Globs of paths the policy hides that the host's own view still shows (rg skips them,
    /// and found paths under them are dropped, see [`SearchHost::hidden`]).
    fn hidden_globs(&self) -> &[String] {
        &[]
    }

    /// Whether a found path is hidden by the policy.
    fn hidden(&self, _path: &Path) -> bool {
        false
    }
}

/// [`SearchOperations`] of a remote backend over its [`SearchHost`].
pub struct RemoteSearch<H>(pub Arc<H>);

/// A transport failure as a search error.
pub fn backend(e: impl std::fmt::Display) -> SearchError {
    SearchError::Backend {
        reason: e.to_string(),
    }
}

/// `argv` without its last element (the path, which the host appends resolved).
fn without_path(mut argv: Vec<String>) -> Vec<String> {
    argv.pop();
    argv
}

#[async_trait]
impl<H: SearchHost> SearchOperations for RemoteSearch<H> {
    async fn grep(
        &self,
        request: GrepRequest,
        cancel: CancellationToken,
    ) -> Result<GrepOutput, SearchError> {
        compile_pattern(&request)?;
        compile_glob(request.glob.as_deref())?;
        if request.max_matches == 0 {
            return Ok(GrepOutput::default());
        }
        if self.0.has_rg() {
            grep_rg(&*self.0, &request, &cancel).await
        } else {
            grep_fallback(&*self.0, &request, &cancel).await
        }
    }

    async fn find(
        &self,
        request: FindRequest,
        cancel: CancellationToken,
    ) -> Result<FindOutput, SearchError> {
        let glob = compile_glob(Some(&request.pattern))?
            .ok_or_else(|| backend("the find pattern is empty"))?;
        let (base, listing, errors) = listing(&*self.0, &request.path, &cancel).await?;
        let paths: Vec<PathBuf> = walk(&listing, &base)
            .files_and_links()
            .into_iter()
            .filter(|p| glob.matches(&base, p))
            .filter(|p| !self.0.hidden(p))
            .take(request.max_results)
            .collect();
        Ok(FindOutput { paths, errors })
    }
}

/// grep with `rg --json` on the host, read line by line; the process is dropped (which stops
/// it) once the limit is reached.
async fn grep_rg<H: SearchHost>(
    host: &H,
    request: &GrepRequest,
    cancel: &CancellationToken,
) -> Result<GrepOutput, SearchError> {
    let glob = compile_glob(request.glob.as_deref())?;
    let mut argv = without_path(rg_argv(request));
    // Prune hidden paths in rg too, so they do not count against the limit; the result is
    // filtered again below with our own glob engine.
    let at = argv
        .iter()
        .position(|a| a == "--regexp")
        .unwrap_or(argv.len());
    for glob in host.hidden_globs() {
        argv.insert(at, format!("!{glob}"));
        argv.insert(at, "--glob".to_owned());
    }
    let Started {
        mut process,
        base,
        stdout,
        stderr,
    } = host.start_on(&request.path, argv, cancel).await?;
    let mut collector = RgCollector::new(&base, glob, request.max_matches);
    let mut pending = stdout;
    let mut errors = stderr;
    let mut stopped = push_lines(&mut collector, &mut pending);
    if !stopped {
        let (mut events, _control) = process.io();
        while !stopped {
            let event = tokio::select! {
                _ = cancel.cancelled() => return Err(SearchError::Cancelled),
                event = events.next() => event,
            };
            match event {
                None => break,
                Some(event) => match event.map_err(backend)? {
                    TransportEvent::Stdout(bytes) => {
                        pending.extend_from_slice(&bytes);
                        stopped = push_lines(&mut collector, &mut pending);
                    }
                    TransportEvent::Stderr(bytes) => errors.extend_from_slice(&bytes),
                },
            }
        }
    }
    if !stopped {
        if let Some(reason) = process.not_started() {
            return Err(backend(reason));
        }
        if !pending.is_empty() {
            collector.push_line(&pending);
        }
    }
    drop(process);
    for text in String::from_utf8_lossy(&errors).lines() {
        collector.push_error(text);
    }
    let mut output = collector.finish();
    output.files.retain(|f| !host.hidden(&f.path));
    Ok(output)
}

/// Feed the whole lines of `pending` to the collector (a partial line stays); `true` once it
/// has enough.
fn push_lines(collector: &mut RgCollector, pending: &mut Vec<u8>) -> bool {
    let mut consumed = 0;
    let mut stopped = false;
    while let Some(end) = pending[consumed..].iter().position(|&b| b == b'\n') {
        let line = &pending[consumed..consumed + end];
        consumed += end + 1;
        if collector.push_line(line) == Flow::Stop {
            stopped = true;
            break;
        }
    }
    pending.drain(..consumed);
    stopped
}

/// Run a started process to its end (stdin stays open until then: closing it early stops
/// the host's helper), or stop at a cancel.
async fn run_out<P: Process>(
    process: &mut P,
    stdin: Option<&[u8]>,
    cancel: &CancellationToken,
) -> Result<Collected, SearchError> {
    tokio::select! {
        _ = cancel.cancelled() => Err(SearchError::Cancelled),
        result = collect(process, stdin, StdinEnd::AfterOutput) => result.map_err(backend),
    }
}

/// The POSIX listing of `path` (one process): the canonical path, the listing and its error
/// notes.
async fn listing<H: SearchHost>(
    host: &H,
    path: &Path,
    cancel: &CancellationToken,
) -> Result<(PathBuf, Listing, Vec<String>), SearchError> {
    let argv = without_path(list_argv(path).map_err(backend)?);
    let Started {
        mut process,
        base,
        mut stdout,
        mut stderr,
    } = host.start_on(path, argv, cancel).await?;
    let rest = run_out(&mut process, None, cancel).await?;
    stdout.extend_from_slice(&rest.stdout);
    stderr.extend_from_slice(&rest.stderr);
    let listing = parse_listing(&stdout).map_err(backend)?;
    let errors = parse_find_errors(&String::from_utf8_lossy(&stderr));
    Ok((base, listing, errors))
}

/// grep without `rg`: the listing filtered by the ignore rules here, the chosen files fetched
/// as tar (one process) and searched here.
async fn grep_fallback<H: SearchHost>(
    host: &H,
    request: &GrepRequest,
    cancel: &CancellationToken,
) -> Result<GrepOutput, SearchError> {
    let regex = compile_pattern(request)?;
    let glob = compile_glob(request.glob.as_deref())?;
    let (base, listing, errors) = listing(host, &request.path, cancel).await?;
    let files: Vec<PathBuf> = walk(&listing, &base)
        .files
        .into_iter()
        .filter(|f| glob.as_ref().is_none_or(|g| g.matches(&base, f)))
        .filter(|f| !host.hidden(f))
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
    let mut fetch = host.start(fetch_argv(literal)).await?;
    // The fetch reads its file list, then takes EOF as "stop": stdin stays open.
    let fetched = run_out(&mut fetch, Some(&stdin), cancel).await?;
    let mut found = search_tar(
        &fetched.stdout,
        &files,
        &regex,
        request.context,
        request.max_matches,
    );
    found.errors = errors;
    found
        .errors
        .extend(parse_fetch_errors(&String::from_utf8_lossy(
            &fetched.stderr,
        )));
    Ok(found)
}
