//! [`SearchOperations`] inside the container: grep with `rg --json` when the image has it (the
//! POSIX fallback otherwise: listing + ignore rules here, contents streamed as tar and searched
//! here), find from the POSIX listing. Both yield exactly the local backend's data.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use cordon_remote::files::{FileOp, FsRecord, files_argv, files_record_parser, parse_fs_record};
use cordon_remote::search::fallback::search_tar;
use cordon_remote::search::ignore_rules::walk;
use cordon_remote::search::listing::{
    EntryKind, fetch_argv, list_argv, parse_find_errors, parse_listing,
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

impl Inner {
    /// Resolve `path` in the container: canonical, inside the roots, existing.
    async fn search_root(&self, path: &Path) -> Result<(PathBuf, EntryKind), SearchError> {
        let argv = files_argv(&self.roots, &FileOp::Stat(path.to_path_buf())).map_err(backend)?;
        let exec = client::start_exec(&self.docker, &self.container, argv, None)
            .await
            .map_err(backend)?;
        let (_, stderr) = collect(exec.output).await.map_err(backend)?;
        let mut parser = files_record_parser();
        let mut canon = None;
        for record in parser.feed(&stderr).map_err(backend)? {
            match parse_fs_record(&record).map_err(backend)? {
                FsRecord::Canon(c) => canon = Some(c),
                FsRecord::Stat(stat) => {
                    let kind = match stat.kind {
                        cordon_tools::ops::FileKind::Dir => EntryKind::Dir,
                        cordon_tools::ops::FileKind::File => EntryKind::File,
                        cordon_tools::ops::FileKind::Symlink
                        | cordon_tools::ops::FileKind::Other => EntryKind::Other,
                    };
                    let canon = canon.clone().unwrap_or_else(|| path.to_path_buf());
                    return Ok((canon, kind));
                }
                FsRecord::Err { code, .. } => {
                    return Err(match code.as_str() {
                        "outside" => SearchError::OutsideRoot {
                            path: path.to_path_buf(),
                        },
                        _ => SearchError::PathNotFound {
                            path: path.to_path_buf(),
                        },
                    });
                }
                FsRecord::Ok | FsRecord::Ent(_) => {}
            }
        }
        Err(backend("the file helper ended without an answer"))
    }

    async fn run_collect(
        &self,
        argv: Vec<String>,
        stdin: Option<Vec<u8>>,
        cancel: &CancellationToken,
    ) -> Result<(Vec<u8>, Vec<u8>), SearchError> {
        let mut exec = client::start_exec(&self.docker, &self.container, argv, None)
            .await
            .map_err(backend)?;
        let input = stdin.unwrap_or_default();
        let writer = async move {
            let _ = exec.input.write_all(&input).await;
            let _ = exec.input.shutdown().await;
            exec.input
        };
        let reader = collect(exec.output);
        tokio::select! {
            _ = cancel.cancelled() => Err(SearchError::Cancelled),
            (result, _input) = async { tokio::join!(reader, writer) } => result.map_err(backend),
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
        let argv = rg_argv(&req);
        let exec = client::start_exec(&self.docker, &self.container, argv, None)
            .await
            .map_err(backend)?;
        let mut collector = RgCollector::new(base, glob, request.max_matches);
        let mut output: ExecOutput = exec.output;
        let mut line = Vec::new();
        let mut errors = Vec::new();
        loop {
            let frame = tokio::select! {
                _ = cancel.cancelled() => return Err(SearchError::Cancelled),
                frame = output.next() => frame,
            };
            let Some(frame) = frame else { break };
            match frame.map_err(backend)? {
                bollard::container::LogOutput::StdOut { message }
                | bollard::container::LogOutput::Console { message } => {
                    let mut stop = false;
                    for &byte in message.iter() {
                        if byte == b'\n' {
                            if collector.push_line(&line) == Flow::Stop {
                                stop = true;
                            }
                            line.clear();
                            if stop {
                                break;
                            }
                        } else {
                            line.push(byte);
                        }
                    }
                    if stop {
                        break;
                    }
                }
                bollard::container::LogOutput::StdErr { message } => {
                    errors.extend_from_slice(&message)
                }
                bollard::container::LogOutput::StdIn { .. } => {}
            }
        }
        if !line.is_empty() && !collector.is_done() {
            collector.push_line(&line);
        }
        for text in String::from_utf8_lossy(&errors).lines() {
            collector.push_error(text);
        }
        Ok(collector.finish())
    }

    async fn listing(
        &self,
        base: &Path,
        cancel: &CancellationToken,
    ) -> Result<(cordon_remote::search::listing::Listing, Vec<String>), SearchError> {
        let argv = list_argv(base).map_err(backend)?;
        let (stdout, stderr) = self.run_collect(argv, None, cancel).await?;
        let listing = parse_listing(&stdout).map_err(backend)?;
        Ok((
            listing,
            parse_find_errors(&String::from_utf8_lossy(&stderr)),
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
            .collect();
        if files.is_empty() || request.max_matches == 0 {
            return Ok(GrepOutput {
                files: Vec::new(),
                errors,
            });
        }
        let mut stdin = Vec::new();
        for f in &files {
            use std::os::unix::ffi::OsStrExt;
            stdin.extend_from_slice(f.as_os_str().as_bytes());
            stdin.push(0);
        }
        let literal = (request.literal && !request.ignore_case).then_some(request.pattern.as_str());
        let (tar, _) = self
            .run_collect(fetch_argv(literal), Some(stdin), cancel)
            .await?;
        let mut out = search_tar(&tar, &files, &regex, request.context, request.max_matches);
        out.errors = errors;
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
        let (base, _) = self.search_root(&request.path).await?;
        if request.max_matches == 0 {
            return Ok(GrepOutput::default());
        }
        if self.has_rg {
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
        let (base, _) = self.search_root(&request.path).await?;
        let (listing, errors) = self.listing(&base, &cancel).await?;
        let paths: Vec<PathBuf> = walk(&listing, &base)
            .files_and_links()
            .into_iter()
            .filter(|p| glob.matches(&base, p))
            .take(request.max_results)
            .collect();
        Ok(FindOutput { paths, errors })
    }
}
