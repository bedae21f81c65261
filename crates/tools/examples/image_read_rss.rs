//! Memory of `read` on PNG decompression bombs: writes an all-zero SIDE×SIDE RGBA PNG
//! (default 11500: 3.2 MB on disk, 529 MB decoded) and reads it COUNT times in parallel
//! through the `read` tool over the `StdFiles` test backend, printing each result's text.
//! Measure the process's peak RSS around it:
//!
//! `/usr/bin/time -v target/release/examples/image_read_rss 6 [SIDE]`
//!
//! Build: `cargo build --release -p cordon-tools --features testing --example image_read_rss`

use std::sync::Arc;

use cordon_core::protocol::Content;
use cordon_core::tool::{AgentTool, ToolInvocation};
use cordon_tools::read::{ReadOptions, ReadTool};
use cordon_tools::testing::{StdFiles, png_zero_bomb};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    let count: usize = std::env::args()
        .nth(1)
        .map_or(1, |arg| arg.parse().expect("COUNT is a number"));
    let side: u32 = std::env::args()
        .nth(2)
        .map_or(11_500, |arg| arg.parse().expect("SIDE is a number"));
    let dir = tempfile::tempdir().expect("temporary directory");
    let bomb = png_zero_bomb(side, side);
    println!("bomb.png: {} bytes", bomb.len());
    std::fs::write(dir.path().join("bomb.png"), &bomb).expect("write the bomb");
    drop(bomb);
    let tool = Arc::new(ReadTool::new(
        Arc::new(StdFiles::new(dir.path())),
        ReadOptions::default(),
    ));
    let reads = (0..count).map(|i| {
        let tool = Arc::clone(&tool);
        tokio::spawn(async move {
            tool.execute(ToolInvocation {
                call_id: format!("read-{i}"),
                args: json!({"path": "bomb.png"}),
                cancel: CancellationToken::new(),
                on_update: Arc::new(|_| {}),
            })
            .await
        })
    });
    for (i, read) in futures::future::join_all(reads)
        .await
        .into_iter()
        .enumerate()
    {
        match read.expect("read task") {
            Ok(result) => {
                let text: Vec<&str> = result
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        Content::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                println!("read {i}: {}", text.join(" | ").replace('\n', " "));
            }
            Err(error) => println!("read {i}: error: {error}"),
        }
    }
}
