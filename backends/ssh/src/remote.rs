//! Running an argv on the remote host over one exec channel, independent of the login shell's
//! rc files: sshd hands our command line to the user's login shell, which may print banners or
//! run slow init code (`.bashrc`) first. The command line prints a random marker on stdout and
//! stderr, then `exec env -i` with an explicit environment runs the argv; everything before the
//! markers is discarded here, so rc-file output never reaches a result. (Its time cost cannot
//! be avoided from the client side; see the crate docs.)

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use cordon_remote::exec::TransportEvent;
use cordon_remote::pool::PooledWorker;
use cordon_remote::quote;
use cordon_remote::transport::{Collected, Control, Events, Process, StdinEnd, Transport, collect};
use russh::client::Msg;
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf};
use tokio::io::AsyncWrite;

use crate::conn::{Live, Pool};

/// PATH of every remote command (the policy's environment may override it for bash).
pub(crate) const REMOTE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Largest amount of login-shell output skipped before the marker.
const MAX_PREAMBLE: usize = 1 << 20;

/// The command line for sshd: markers, then `argv` under an explicit environment.
pub(crate) fn command_line(marker: &str, argv: &[String]) -> String {
    format!(
        "printf %s {marker}; printf %s {marker} >&2; exec env -i HOME=\"$HOME\" \
         USER=\"$USER\" LOGNAME=\"$LOGNAME\" PATH={REMOTE_PATH} LANG=C.UTF-8 TERM=dumb {}",
        quote::command_line(argv)
    )
}

/// A fresh marker.
pub(crate) fn new_marker() -> String {
    format!("cordon-ready-{:016x}", fastrand::u64(..))
}

/// Drops a stream's bytes up to and including the marker.
#[derive(Debug)]
pub(crate) struct Preamble {
    marker: Vec<u8>,
    pending: Option<Vec<u8>>,
}

impl Preamble {
    pub fn new(marker: &str) -> Self {
        Preamble {
            marker: marker.as_bytes().to_vec(),
            pending: Some(Vec::new()),
        }
    }

    /// Feed a chunk; returns the bytes after the marker (empty until it was seen).
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<u8>, String> {
        let Some(pending) = self.pending.as_mut() else {
            return Ok(chunk.to_vec());
        };
        pending.extend_from_slice(chunk);
        if let Some(at) = pending
            .windows(self.marker.len())
            .position(|w| w == self.marker.as_slice())
        {
            let rest = pending.split_off(at + self.marker.len());
            self.pending = None;
            return Ok(rest);
        }
        if pending.len() > MAX_PREAMBLE {
            return Err(
                "the remote login shell printed more than 1 MiB before running the command".into(),
            );
        }
        Ok(Vec::new())
    }

    /// Whether the marker was seen.
    pub fn done(&self) -> bool {
        self.pending.is_none()
    }

    /// What came before the marker (for error messages), lossy.
    pub fn skipped(&self) -> String {
        self.pending
            .as_ref()
            .map(|p| {
                String::from_utf8_lossy(p)
                    .trim()
                    .chars()
                    .take(300)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A started remote command.
pub(crate) struct RemoteExec {
    /// The connection it runs on.
    pub live: Arc<Live>,
    read: ChannelReadHalf,
    /// Always `Some` until drop.
    write: Option<ChannelWriteHalf<Msg>>,
    stdout: Preamble,
    stderr: Preamble,
    /// The channel's exit status, once reported.
    pub exit_status: Option<u32>,
    finished: bool,
}

impl RemoteExec {
    /// Open a channel and start `argv`.
    pub async fn start(pool: &Pool, argv: &[String]) -> Result<RemoteExec, String> {
        Self::start_with(pool, argv, true).await
    }

    /// [`RemoteExec::start`]; `reconnect` as in [`Pool::open_channel`].
    pub async fn start_with(
        pool: &Pool,
        argv: &[String],
        reconnect: bool,
    ) -> Result<RemoteExec, String> {
        let (live, channel) = pool.open_channel(reconnect).await.map_err(|e| e.0)?;
        let marker = new_marker();
        if let Err(e) = channel.exec(false, command_line(&marker, argv)).await {
            pool.invalidate(&live).await;
            return Err(format!(
                "failed to start a command on {}: {e}",
                pool.label()
            ));
        }
        let (read, write) = channel.split();
        Ok(RemoteExec {
            live,
            read,
            write: Some(write),
            stdout: Preamble::new(&marker),
            stderr: Preamble::new(&marker),
            exit_status: None,
            finished: false,
        })
    }

    /// The next output event, with the login shell's preamble removed; `None` once the
    /// channel closed. An error says the transport failed.
    pub async fn next(&mut self) -> Option<Result<TransportEvent, String>> {
        loop {
            if self.finished {
                return None;
            }
            let Some(msg) = self.read.wait().await else {
                self.finished = true;
                if self.live.is_closed() {
                    return Some(Err(
                        "the SSH connection was lost while the command ran".to_owned()
                    ));
                }
                return None;
            };
            match msg {
                ChannelMsg::Data { data } => match self.stdout.feed(&data) {
                    Ok(bytes) if bytes.is_empty() => {}
                    Ok(bytes) => return Some(Ok(TransportEvent::Stdout(Bytes::from(bytes)))),
                    Err(e) => return Some(Err(e)),
                },
                ChannelMsg::ExtendedData { data, ext: 1 } => match self.stderr.feed(&data) {
                    Ok(bytes) if bytes.is_empty() => {}
                    Ok(bytes) => return Some(Ok(TransportEvent::Stderr(Bytes::from(bytes)))),
                    Err(e) => return Some(Err(e)),
                },
                ChannelMsg::ExitStatus { exit_status } => self.exit_status = Some(exit_status),
                ChannelMsg::Close => {
                    self.finished = true;
                    return None;
                }
                _ => {}
            }
        }
    }

    /// Whether an idle worker's channel is open and quiet. Anything it sent while idle (output,
    /// EOF, an exit) means it no longer waits for a request; window adjustments and the like
    /// are skipped.
    pub fn idle_alive(&mut self) -> bool {
        use futures::FutureExt;
        if self.finished || self.live.is_closed() {
            return false;
        }
        loop {
            match self.read.wait().now_or_never() {
                None => return true,
                Some(None) => {
                    self.finished = true;
                    return false;
                }
                Some(Some(
                    ChannelMsg::Data { .. }
                    | ChannelMsg::ExtendedData { .. }
                    | ChannelMsg::Eof
                    | ChannelMsg::Close
                    | ChannelMsg::ExitStatus { .. }
                    | ChannelMsg::ExitSignal { .. },
                )) => return false,
                Some(Some(_)) => {}
            }
        }
    }

    /// Whether the command line got past the login shell (markers seen on both streams).
    pub fn started(&self) -> bool {
        self.stdout.done() && self.stderr.done()
    }

    /// A description of what the login shell printed instead of starting the command.
    pub fn not_started_reason(&self) -> String {
        let skipped = if self.stdout.done() {
            self.stderr.skipped()
        } else {
            self.stdout.skipped()
        };
        format!(
            "the remote login shell did not run the command (exit status {}; output: `{}`); \
             the account needs a POSIX login shell (sh, bash, dash, zsh, ksh)",
            self.exit_status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "unknown".into()),
            skipped
        )
    }

    /// The channel's stdin.
    pub fn stdin(&self) -> Pin<Box<dyn AsyncWrite + Send>> {
        match &self.write {
            Some(write) => Box::pin(write.make_writer()),
            None => Box::pin(tokio::io::sink()),
        }
    }
}

impl Drop for RemoteExec {
    fn drop(&mut self) {
        // russh keeps a channel open until it is closed explicitly: a command abandoned
        // half-way (error, early stop) must not hold a server session slot.
        if !self.finished
            && let Some(write) = self.write.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                // The command was abandoned: a channel that is already gone has nothing to close.
                let _ = write.close().await;
            });
        }
    }
}

/// The SSH transport: exec channels on the backend's one connection.
pub(crate) struct SshTransport(pub Arc<Pool>);

impl Transport for SshTransport {
    type Process = RemoteExec;

    async fn start(&self, argv: Vec<String>) -> Result<RemoteExec, String> {
        RemoteExec::start(&self.0, &argv).await
    }
}

impl PooledWorker for RemoteExec {
    fn idle_alive(&mut self) -> bool {
        RemoteExec::idle_alive(self)
    }

    fn keepable(&self) -> bool {
        !self.live.is_closed()
    }
}

impl Process for RemoteExec {
    fn io(&mut self) -> (Events<'_>, Control<'_>) {
        let control = self.stdin();
        let events = Box::pin(futures::stream::unfold(self, |exec| async move {
            exec.next().await.map(|event| (event, exec))
        }));
        (events, control)
    }

    fn not_started(&self) -> Option<String> {
        (!self.started()).then(|| self.not_started_reason())
    }
}

/// Run `argv` with `stdin` on a new channel and collect everything.
pub(crate) async fn run_collect(
    pool: &Pool,
    argv: &[String],
    stdin: Option<&[u8]>,
    end: StdinEnd,
) -> Result<Collected, String> {
    let mut exec = RemoteExec::start(pool, argv).await?;
    collect(&mut exec, stdin, end).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preamble_is_dropped_across_chunks() {
        let mut p = Preamble::new("MARK");
        assert_eq!(p.feed(b"rc noise MA").unwrap(), b"");
        assert!(!p.done());
        assert_eq!(p.feed(b"RKhello").unwrap(), b"hello");
        assert!(p.done());
        assert_eq!(p.feed(b" world").unwrap(), b" world");
    }

    #[test]
    fn command_line_quotes_the_argv() {
        let line = command_line("M", &["sh".into(), "-c".into(), "echo 'hi'".into()]);
        assert_eq!(
            line,
            format!(
                "printf %s M; printf %s M >&2; exec env -i HOME=\"$HOME\" USER=\"$USER\" \
                 LOGNAME=\"$LOGNAME\" PATH={REMOTE_PATH} LANG=C.UTF-8 TERM=dumb sh -c 'echo '\\''hi'\\'''"
            )
        );
    }
}
