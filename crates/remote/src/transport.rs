//! The transport a remote backend brings: how to start a process on the remote side with its
//! stdin, stdout and stderr attached ([`Transport::start`]), and how to read and write that
//! process ([`Process`]). Docker implements it with bollard execs, SSH with russh exec
//! channels; everything above it (workers, retries, the spare, the kill sweep, one-shot
//! commands) is written once in [`crate::runner`].
//!
//! What a transport must guarantee: the argv runs as given (no shell of ours in between; a
//! transport that can only send a command line, like SSH, quotes it with
//! [`crate::quote::command_line`] and strips whatever the remote login shell prints first),
//! stdout and stderr arrive as separate [`TransportEvent`]s, and closing stdin (or dropping the
//! process) reaches the remote side as EOF.

use std::future::Future;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::exec::TransportEvent;
use crate::pool::{PooledWorker, ReadyCheck};

/// A process's output: stdout and stderr chunks, ending when its streams close; an error says
/// the transport failed.
pub type Events<'a> = Pin<Box<dyn Stream<Item = Result<TransportEvent, String>> + Send + 'a>>;

/// A process's stdin.
pub type Control<'a> = Pin<Box<dyn AsyncWrite + Send + 'a>>;

/// A process a [`Transport`] started, with its streams attached. As a pooled worker it must
/// also say whether it still waits for a request ([`PooledWorker`]).
pub trait Process: PooledWorker {
    /// Its output and its stdin, borrowed together (a request writes while it reads).
    /// Shutting the stdin down must reach the process as EOF.
    fn io(&mut self) -> (Events<'_>, Control<'_>);

    /// Why the argv never ran, once the streams ended (e.g. a remote login shell that refused
    /// the command line); `None` when it ran.
    fn not_started(&self) -> Option<String> {
        None
    }
}

/// Starts processes on the remote side.
pub trait Transport: Send + Sync + 'static {
    /// What [`Transport::start`] returns.
    type Process: Process;

    /// Start `argv` with stdin, stdout and stderr attached; the error says why it could not
    /// be started, for the model.
    fn start(
        &self,
        argv: Vec<String>,
    ) -> impl Future<Output = Result<Self::Process, String>> + Send;
}

/// Everything a short command printed.
#[derive(Debug, Default)]
pub struct Collected {
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: Vec<u8>,
}

/// When a collected command's stdin is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdinEnd {
    /// Right after the input (the command reads to EOF).
    AfterInput,
    /// Once the command's output ended: scripts whose stdin is also their control input treat
    /// EOF as "the client went away" and stop.
    AfterOutput,
}

/// Write `stdin` to `process` and read everything it prints, at once (the remote side may
/// answer before it has read all its input).
pub async fn collect<P: Process>(
    process: &mut P,
    stdin: Option<&[u8]>,
    end: StdinEnd,
) -> Result<Collected, String> {
    let (mut events, mut control) = process.io();
    let input = stdin.unwrap_or_default();
    let (finished_tx, finished_rx) = tokio::sync::oneshot::channel::<()>();
    let write = async move {
        if !input.is_empty() {
            // A process that exits without reading its stdin is not an error: its exit
            // status and output are the answer.
            let _ = control.write_all(input).await;
            let _ = control.flush().await;
        }
        if end == StdinEnd::AfterOutput {
            // Sent or dropped, the output side is done either way.
            let _ = finished_rx.await;
        }
        // Closing stdin of a process that already exited fails harmlessly.
        let _ = control.shutdown().await;
    };
    let read = async {
        let mut out = Collected::default();
        let result = async {
            while let Some(event) = events.next().await {
                match event? {
                    TransportEvent::Stdout(b) => out.stdout.extend_from_slice(&b),
                    TransportEvent::Stderr(b) => out.stderr.extend_from_slice(&b),
                }
            }
            Ok::<(), String>(())
        }
        .await;
        // The writer may have finished already and dropped its receiver.
        let _ = finished_tx.send(());
        result.map(|()| out)
    };
    let ((), out) = tokio::join!(write, read);
    drop(events);
    let out = out?;
    match process.not_started() {
        Some(reason) => Err(reason),
        None => Ok(out),
    }
}

/// Read a new worker's first record; `true` if it is `ready`.
pub async fn wait_ready<P: Process>(process: &mut P) -> bool {
    let (mut events, _control) = process.io();
    let mut check = ReadyCheck::default();
    while let Some(event) = events.next().await {
        match event {
            Ok(TransportEvent::Stderr(bytes)) => {
                if let Some(ready) = check.feed(&bytes) {
                    return ready;
                }
            }
            Ok(TransportEvent::Stdout(_)) | Err(_) => return false,
        }
    }
    false
}
