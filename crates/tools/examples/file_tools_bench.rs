//! Latency of the file tools as library calls: read, write and edit of a 2 KB file over an
//! in-memory backend (the tools' own cost) and over the `StdFiles` test backend (std::fs, no
//! sandbox), and reads and edits of a 50 MB file over `StdFiles`.
//!
//! Run: `cargo run --release -p cordon-tools --features testing --example file_tools_bench`

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cordon_core::tool::{AgentTool, ToolInvocation};
use cordon_ops::{BackendId, DirEntry, FileKind, FileMeta, FileOperations, FsError, SpillWriter};
use cordon_tools::edit::EditTool;
use cordon_tools::read::{ReadOptions, ReadTool};
use cordon_tools::testing::StdFiles;
use cordon_tools::write::WriteTool;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

async fn call(tool: &dyn AgentTool, args: Value) -> Duration {
    let started = Instant::now();
    let result = tool
        .execute(ToolInvocation {
            call_id: "bench".to_owned(),
            args,
            cancel: CancellationToken::new(),
            on_update: Arc::new(|_| {}),
        })
        .await;
    let elapsed = started.elapsed();
    if let Err(error) = result {
        panic!("{} failed: {error}", tool.name());
    }
    elapsed
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let pick = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!(
        "{name:<40} n={:<5} p50={:>9.1?} p90={:>9.1?} min={:>9.1?}",
        samples.len(),
        pick(0.5),
        pick(0.9),
        samples[0]
    );
}

fn two_kb_text() -> String {
    let mut text = String::new();
    let mut line = 0;
    while text.len() < 2000 {
        line += 1;
        text.push_str(&format!(
            "line {line:03}: the quick brown fox jumps over it\n"
        ));
    }
    text
}

/// Files in a map: measures what the tools themselves cost, without filesystem I/O.
struct MemFiles {
    id: BackendId,
    root: PathBuf,
    files: Mutex<HashMap<PathBuf, Vec<u8>>>,
}

#[async_trait]
impl FileOperations for MemFiles {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }
    fn root(&self) -> &Path {
        &self.root
    }
    fn home(&self) -> Option<&Path> {
        None
    }
    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        let files = self.files.lock().unwrap();
        let data = files.get(path).ok_or_else(|| FsError::NotFound {
            path: path.to_path_buf(),
        })?;
        Ok(data.clone())
    }
    async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
        let mut data = self.read_file(path).await?;
        data.truncate(max_bytes);
        Ok(data)
    }
    async fn read_range(
        &self,
        path: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        let data = self.read_file(path).await?;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let end = start.saturating_add(max_bytes).min(data.len());
        Ok(data[start..end].to_vec())
    }
    async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
        self.files
            .lock()
            .unwrap()
            .insert(path.to_path_buf(), data.to_vec());
        Ok(())
    }
    async fn create_dir_all(&self, _path: &Path) -> Result<(), FsError> {
        Ok(())
    }
    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
        let files = self.files.lock().unwrap();
        let data = files.get(path).ok_or_else(|| FsError::NotFound {
            path: path.to_path_buf(),
        })?;
        Ok(FileMeta {
            kind: FileKind::File,
            size: data.len() as u64,
            mode: 0o644,
            writable: true,
        })
    }
    async fn read_dir(&self, _path: &Path) -> Result<Vec<DirEntry>, FsError> {
        Ok(Vec::new())
    }
    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        Ok(path.to_path_buf())
    }
    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        Err(FsError::Cancelled)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let memory: Arc<dyn FileOperations> = Arc::new(MemFiles {
        id: BackendId::new("memory"),
        root: PathBuf::from("/mem"),
        files: Mutex::new(HashMap::new()),
    });
    small_files("memory", memory).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let files: Arc<dyn FileOperations> = Arc::new(StdFiles::new(root));
    small_files("std::fs", files.clone()).await;
    let read = ReadTool::new(files.clone(), ReadOptions::default());
    let edit = EditTool::new(files);
    big_file(root, &read, &edit).await;
}

async fn small_files(backend: &str, files: Arc<dyn FileOperations>) {
    let read = ReadTool::new(files.clone(), ReadOptions::default());
    let write = WriteTool::new(files.clone());
    let edit = EditTool::new(files.clone());
    let text = two_kb_text();
    files
        .write_file(&files.root().join("small.txt"), text.as_bytes())
        .await
        .expect("write small file");
    let rounds = 2000;

    let mut samples = Vec::new();
    for _ in 0..rounds {
        samples.push(call(&read, json!({"path": "small.txt"})).await);
    }
    report(&format!("{backend}: read 2 KB"), samples);

    let mut samples = Vec::new();
    for _ in 0..rounds {
        samples.push(call(&write, json!({"path": "written.txt", "content": text})).await);
    }
    report(&format!("{backend}: write 2 KB"), samples);

    let mut samples = Vec::new();
    for round in 0..rounds {
        let (from, to) = if round % 2 == 0 {
            ("line 010: the quick", "line 010: THE QUICK")
        } else {
            ("line 010: THE QUICK", "line 010: the quick")
        };
        let args = json!({"path": "small.txt", "edits": [{"oldText": from, "newText": to}]});
        samples.push(call(&edit, args).await);
    }
    report(&format!("{backend}: edit one line of 2 KB"), samples);
}

async fn big_file(root: &Path, read: &ReadTool, edit: &EditTool) {
    let mut big = String::with_capacity(51 << 20);
    let mut line = 0u64;
    while big.len() < 50 << 20 {
        line += 1;
        big.push_str(&format!(
            "{line:09} lorem ipsum dolor sit amet, consectetur\n"
        ));
    }
    let middle = line / 2;
    std::fs::write(root.join("big.txt"), &big).expect("write big file");
    let rounds = 5;
    drop(big);

    let mut samples = Vec::new();
    for _ in 0..rounds {
        let args = json!({"path": "big.txt", "offset": middle, "limit": 100});
        samples.push(call(read, args).await);
    }
    report("std::fs: read 100 lines mid 50 MB", samples);

    let mut samples = Vec::new();
    for round in 0..rounds {
        let (from, to) = if round % 2 == 0 {
            ("lorem ipsum", "LOREM IPSUM")
        } else {
            ("LOREM IPSUM", "lorem ipsum")
        };
        let old = format!("{middle:09} {from}");
        let new = format!("{middle:09} {to}");
        let args = json!({"path": "big.txt", "edits": [{"oldText": old, "newText": new}]});
        samples.push(call(edit, args).await);
    }
    report("std::fs: edit one line of 50 MB (exact)", samples);

    let mut samples = Vec::new();
    for round in 0..rounds {
        // A no-break space in oldText misses exactly and forces the fuzzy path over the file.
        let (from, to) = if round % 2 == 0 {
            ("lorem ipsum", "LOREM ipsum")
        } else {
            ("LOREM ipsum", "lorem ipsum")
        };
        let old = format!("{:09}\u{00A0}{from}", middle + 1);
        let new = format!("{:09} {to}", middle + 1);
        let args = json!({"path": "big.txt", "edits": [{"oldText": old, "newText": new}]});
        samples.push(call(edit, args).await);
    }
    report("std::fs: edit one line of 50 MB (fuzzy)", samples);
}
