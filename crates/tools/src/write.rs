//! The `write` tool (docs/semantics.md#write): create or overwrite a file with the given text.
//!
//! Parent directories are created; the file is replaced atomically through
//! [`FileOperations::write_file`] (temporary file + rename, permissions kept), inside the
//! file's mutation queue. The result reports the real UTF-8 byte count. Cancellation is checked
//! between filesystem operations only: a write already in flight completes (and keeps the
//! queue) before the call reports `Operation aborted`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use cordon_core::tool::{AgentTool, AgentToolResult, ToolError, ToolInvocation};
use cordon_ops::bounds::MAX_PATH_CHARS;
use cordon_ops::paths::resolve_model_path;
use cordon_ops::{FileOperations, FsError, ToolKind};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::file_tool::{ABORTED, decode_args, fs_error_text};
use crate::queue::{finish_on_drop, with_mutation_queue_owned};

const DESCRIPTION: &str = "Write content to a file. Creates the file if it doesn't exist, \
overwrites if it does. Automatically creates parent directories.";

/// Why a `write` call failed; the text is what the model reads.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The arguments do not match the schema.
    #[error("{0}")]
    InvalidArguments(String),
    /// The call was cancelled (checked between filesystem operations).
    #[error("{ABORTED}")]
    Aborted,
    /// The parent directories could not be created.
    #[error("Could not create the parent directories of {path}. {}", fs_error_text(.source))]
    CreateParent {
        /// The path the model sent.
        path: String,
        /// The backend's error.
        #[source]
        source: FsError,
    },
    /// The file could not be written (or its queue key could not be resolved).
    #[error("Could not write file: {path}. {}", fs_error_text(.source))]
    Write {
        /// The path the model sent.
        path: String,
        /// The backend's error.
        #[source]
        source: FsError,
    },
    /// The background task running the write died (a panic in a backend).
    #[error(
        "Could not write file: {path}. The write stopped unexpectedly; read the file to check its state, then retry."
    )]
    Interrupted {
        /// The path the model sent.
        path: String,
    },
}

#[derive(Deserialize)]
struct WriteArgs {
    path: String,
    content: String,
}

/// The `write` tool over one backend's [`FileOperations`].
pub struct WriteTool {
    files: Arc<dyn FileOperations>,
}

impl WriteTool {
    /// A `write` tool writing through `files`.
    pub fn new(files: Arc<dyn FileOperations>) -> Self {
        WriteTool { files }
    }
}

fn parameters() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        json!({
            "type": "object",
            "required": ["path", "content"],
            "properties": {
                "path": {
                    "type": "string",
                    "maxLength": MAX_PATH_CHARS,
                    "description": "Path to the file to write (relative or absolute)"
                },
                "content": {
                    "type": "string",
                    "description": "Content to write to the file"
                }
            }
        })
    })
}

#[async_trait]
impl AgentTool for WriteTool {
    fn name(&self) -> &str {
        ToolKind::Write.name()
    }

    fn label(&self) -> &str {
        "write"
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn parameters(&self) -> &Value {
        parameters()
    }

    fn prompt_snippet(&self) -> Option<&str> {
        Some("Create or overwrite files")
    }

    fn prompt_guidelines(&self) -> &[&str] {
        &["Use write only for new files or complete rewrites."]
    }

    async fn execute(&self, invocation: ToolInvocation) -> Result<AgentToolResult, ToolError> {
        let ToolInvocation { args, cancel, .. } = invocation;
        let WriteArgs { path, content } =
            decode_args("write", args).map_err(WriteError::InvalidArguments)?;
        if cancel.is_cancelled() {
            return Err(WriteError::Aborted.into());
        }
        let absolute = resolve_model_path(&path, self.files.root(), self.files.home());
        let bytes = content.into_bytes();
        let written = bytes.len();
        let work = write_in_queue(WriteJob {
            files: self.files.clone(),
            absolute: absolute.clone(),
            bytes,
            cancel,
            path: path.clone(),
        });
        // Finished in the background if the caller stops waiting, so that the queue stays held
        // until the write has settled; the queue place is taken here, in call order.
        let queued = with_mutation_queue_owned(self.files.clone(), absolute, work);
        match finish_on_drop(queued).await {
            Ok(Ok(Ok(()))) => Ok(AgentToolResult::text(format!(
                "Successfully wrote {written} bytes to {path}"
            ))),
            Ok(Ok(Err(error))) => Err(error.into()),
            Ok(Err(source)) => Err(WriteError::Write { path, source }.into()),
            Err(_) => Err(WriteError::Interrupted { path }.into()),
        }
    }
}

/// What one queued write needs.
struct WriteJob {
    files: Arc<dyn FileOperations>,
    absolute: PathBuf,
    bytes: Vec<u8>,
    cancel: CancellationToken,
    path: String,
}

async fn write_in_queue(job: WriteJob) -> Result<(), WriteError> {
    let WriteJob {
        files,
        absolute,
        bytes,
        cancel,
        path,
    } = job;
    let aborted = || cancel.is_cancelled();
    if aborted() {
        return Err(WriteError::Aborted);
    }
    if let Some(parent) = absolute.parent().filter(|p| *p != Path::new("")) {
        files
            .create_dir_all(parent)
            .await
            .map_err(|source| WriteError::CreateParent {
                path: path.clone(),
                source,
            })?;
    }
    if aborted() {
        return Err(WriteError::Aborted);
    }
    files
        .write_file(&absolute, &bytes)
        .await
        .map_err(|source| WriteError::Write {
            path: path.clone(),
            source,
        })?;
    if aborted() {
        // The write has landed; report the cancellation like every other settled step.
        return Err(WriteError::Aborted);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde_json::json;

    use super::*;
    use crate::file_tool::test_util::{call, call_with, error, text};
    use crate::queue::probe::{Op, ProbeFiles, wait_for};
    use crate::testing::StdFiles;

    fn tool(root: &Path) -> WriteTool {
        WriteTool::new(Arc::new(StdFiles::new(root)))
    }

    #[test]
    fn definition_matches_reference() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(dir.path());
        assert_eq!(tool.name(), "write");
        assert_eq!(tool.description(), DESCRIPTION);
        assert_eq!(tool.parameters()["required"], json!(["path", "content"]));
        assert_eq!(tool.prompt_snippet(), Some("Create or overwrite files"));
    }

    #[tokio::test]
    async fn writes_file_contents() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(dir.path());
        let result = call(&tool, json!({"path": "out.txt", "content": "hello"}))
            .await
            .unwrap();
        assert_eq!(text(&result), "Successfully wrote 5 bytes to out.txt");
        assert_eq!(result.details, None);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
            "hello"
        );
    }

    #[tokio::test]
    async fn creates_parent_directories() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(dir.path());
        let result = call(
            &tool,
            json!({"path": "nested/dir/file.txt", "content": "hello"}),
        )
        .await
        .unwrap();
        assert_eq!(
            text(&result),
            "Successfully wrote 5 bytes to nested/dir/file.txt"
        );
        let written = std::fs::read_to_string(dir.path().join("nested/dir/file.txt")).unwrap();
        assert_eq!(written, "hello");
    }

    #[tokio::test]
    async fn reports_utf8_byte_count() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(dir.path());
        // 1 + 2 + 4 + 3 bytes, not 5 UTF-16 units.
        let content = "aé🙂€";
        let result = call(&tool, json!({"path": "u.txt", "content": content}))
            .await
            .unwrap();
        assert_eq!(text(&result), "Successfully wrote 10 bytes to u.txt");
        assert_eq!(std::fs::read(dir.path().join("u.txt")).unwrap().len(), 10);
    }

    #[tokio::test]
    async fn overwrites_and_keeps_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("script.sh");
        std::fs::write(&file, "old").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o750)).unwrap();
        let tool = tool(dir.path());
        call(&tool, json!({"path": "script.sh", "content": "new"}))
            .await
            .unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o750);
    }

    #[tokio::test]
    async fn writing_a_directory_fails_clearly() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let tool = tool(dir.path());
        let message = error(call(&tool, json!({"path": "sub", "content": "x"})).await);
        assert!(
            message.starts_with("Could not write file: sub. "),
            "{message}"
        );
        assert!(dir.path().join("sub").is_dir());
    }

    #[tokio::test]
    async fn paths_outside_the_roots_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(dir.path());
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("x.txt");
        let path = target.to_str().unwrap();
        let message = error(call(&tool, json!({"path": path, "content": "x"})).await);
        assert_eq!(
            message,
            format!(
                "Could not write file: {path}. The path {path} is outside the directories this \
                 sandbox may access; use a path inside the workspace."
            )
        );
        assert!(!target.exists());
    }

    #[tokio::test]
    async fn invalid_arguments_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(dir.path());
        let message = error(call(&tool, json!({"path": "a.txt"})).await);
        assert!(message.contains("Invalid arguments for write"), "{message}");
        assert!(message.contains("content"), "{message}");
    }

    #[tokio::test]
    async fn cancelled_before_start_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(dir.path());
        let cancel = CancellationToken::new();
        cancel.cancel();
        let outcome = call_with(&tool, json!({"path": "a.txt", "content": "x"}), cancel).await;
        assert_eq!(error(outcome), "Operation aborted");
        assert!(!dir.path().join("a.txt").exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_reader_never_sees_a_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("big.txt");
        let old = "a".repeat(4 << 20);
        std::fs::write(&file, &old).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            let file = file.clone();
            std::thread::spawn(move || {
                let mut reads = 0usize;
                while !stop.load(Ordering::SeqCst) || reads == 0 {
                    let data = std::fs::read(&file).unwrap();
                    let whole_old = data.len() == 4 << 20 && data.iter().all(|&b| b == b'a');
                    let whole_new = data.len() == 3 << 20 && data.iter().all(|&b| b == b'b');
                    assert!(whole_old || whole_new, "torn read of {} bytes", data.len());
                    reads += 1;
                }
                reads
            })
        };
        let tool = tool(dir.path());
        for round in 0..6 {
            let content = if round % 2 == 0 {
                "b".repeat(3 << 20)
            } else {
                old.clone()
            };
            call(&tool, json!({"path": "big.txt", "content": content}))
                .await
                .unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        assert!(reader.join().unwrap() > 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancelled_write_holds_the_queue_until_its_write_settles() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "original\n").unwrap();
        let (probe, mut events) = ProbeFiles::new(dir.path());
        let release = probe.gate(Op::Write, "f.txt");
        let tool = Arc::new(WriteTool::new(Arc::new(probe)));
        let cancel = CancellationToken::new();
        let first = {
            let tool = tool.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                call_with(
                    &*tool,
                    json!({"path": "f.txt", "content": "first\n"}),
                    cancel,
                )
                .await
            })
        };
        wait_for(&mut events, Op::Write, "f.txt", true).await;
        cancel.cancel();
        let second = {
            let tool = tool.clone();
            tokio::spawn(async move {
                call(&*tool, json!({"path": "f.txt", "content": "second\n"})).await
            })
        };
        // The second write must not start while the first is still in flight. A bounded wait
        // can only miss a bug on a slow machine, never fail a correct implementation.
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(150),
            wait_for(&mut events, Op::Write, "f.txt", true),
        )
        .await;
        assert!(
            early.is_err(),
            "second write started while the first was in flight"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("f.txt")).unwrap(),
            "original\n"
        );
        release.send(()).unwrap();
        assert_eq!(error(first.await.unwrap()), "Operation aborted");
        let second = second.await.unwrap().unwrap();
        assert_eq!(text(&second), "Successfully wrote 7 bytes to f.txt");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("f.txt")).unwrap(),
            "second\n"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_caller_does_not_abandon_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let (probe, mut events) = ProbeFiles::new(dir.path());
        let release = probe.gate(Op::Write, "g.txt");
        let tool = Arc::new(WriteTool::new(Arc::new(probe)));
        let first = {
            let tool = tool.clone();
            tokio::spawn(async move {
                call(&*tool, json!({"path": "g.txt", "content": "first\n"})).await
            })
        };
        wait_for(&mut events, Op::Write, "g.txt", true).await;
        first.abort();
        let _ = first.await;
        let second = {
            let tool = tool.clone();
            tokio::spawn(async move {
                call(&*tool, json!({"path": "g.txt", "content": "second\n"})).await
            })
        };
        release.send(()).unwrap();
        // The first write finishes first, then the second lands on top.
        wait_for(&mut events, Op::Write, "g.txt", false).await;
        second.await.unwrap().unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("g.txt")).unwrap(),
            "second\n"
        );
    }
}
