//! Running one command through a worker (docs/semantics.md#bash on a POSIX host).
//!
//! The worker ([`crate::worker`]) takes an [`ExecJob`]: it `cd`s to the working directory (or
//! reports `nocwd`), starts `bash -c` (`sh -c` without bash) in its own process group and
//! session with stdin from `/dev/null`, stdout and stderr merged onto the worker's stdout, and
//! the variable `CORDON_EXEC_ID=<tag>` in its environment so that escapees (`setsid`,
//! `nohup … &`) can still be found through `/proc/*/environ`; a process holding the command's
//! output is found too, even with a scrubbed environment. Control records travel on the
//! worker's stderr; its stdin is the control input: a line `kill` (or EOF, when the client goes
//! away) kills the whole tree (SIGTERM, grace, SIGKILL, rescanning until nothing is left).
//!
//! After the shell exits, a fast check looks at the few PIDs handed out since the command
//! started (the full `/proc` scan runs only when that cannot be trusted: PID wrap, long runs,
//! busy hosts), so a command that leaves nothing behind costs no scan at all.
//!
//! [`drive`] is the client half, shared by every transport: it forwards output with
//! back-pressure, enforces the timeout and the cancellation token, applies the idle grace after
//! the shell exits while leftover processes hold the output open (100 ms re-armed per chunk,
//! capped at 2 s, as the local backend), makes sure the kill happened before it returns, and
//! says whether the worker may serve the next call.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use cordon_ops::{ExecError, ExitStatus, Termination};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::records::{Record, RecordParser};
use crate::worker::EndMarker;
use crate::{RemoteError, checked_arg, path_arg, sh_argv};

/// The stand-alone kill script: kills every process carrying a tag (and the session of the
/// command), for when the worker itself is gone.
pub const KILL_SCRIPT: &str = concat!(include_str!("sh/proc.sh"), include_str!("sh/kill.sh"));

/// Time between SIGTERM and SIGKILL when a tree is killed.
pub const KILL_GRACE: Duration = Duration::from_secs(1);
/// Output idle grace after the shell exited while other processes still hold the output.
pub const IDLE_GRACE: Duration = Duration::from_millis(100);
/// Upper bound of the idle grace, however chatty the leftovers are.
pub const IDLE_CAP: Duration = Duration::from_secs(2);

/// What the client writes to the worker's stdin to kill the command's tree.
pub const KILL_LINE: &[u8] = b"kill\n";

/// A command for a worker: a plain, serialisable request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecJob {
    /// The tag marking this command's processes (see [`new_tag`]).
    pub tag: String,
    /// Working directory on the remote side.
    pub cwd: PathBuf,
    /// The script for `bash -c`.
    pub command: String,
    /// Extra environment for the command (not for the worker).
    pub env: Vec<(String, String)>,
    /// SIGTERM → SIGKILL grace in milliseconds.
    pub kill_grace_ms: u64,
}

impl ExecJob {
    /// The request's arguments: `TAG CWD COMMAND TICKS [NAME=VALUE...]`.
    pub fn words(&self) -> Result<Vec<String>, RemoteError> {
        let ExecJob {
            tag,
            cwd,
            command,
            env,
            kill_grace_ms,
        } = self;
        let mut words = vec![
            checked_arg("tag", tag)?,
            path_arg(cwd)?,
            checked_arg("command", command)?,
            grace_ticks(Duration::from_millis(*kill_grace_ms)),
        ];
        for (name, value) in env {
            if !is_valid_env_name(name) {
                return Err(RemoteError::InvalidEnvName { name: name.clone() });
            }
            words.push(checked_arg(name, &format!("{name}={value}"))?);
        }
        Ok(words)
    }
}

/// A fresh random tag for one command.
pub fn new_tag() -> String {
    format!("{:016x}", fastrand::u64(..))
}

fn grace_ticks(grace: Duration) -> String {
    // The scripts count the grace in 50 ms ticks; at least one.
    grace.as_millis().div_ceil(50).max(1).to_string()
}

/// Whether `name` can be exported by a POSIX shell.
pub fn is_valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The argv running the kill script for a tag, the shell's pid and the command's session,
/// when known.
pub fn kill_argv(
    tag: &str,
    main_pid: Option<u32>,
    session: Option<u32>,
    kill_grace: Duration,
) -> Vec<String> {
    sh_argv(
        KILL_SCRIPT,
        "cordon-kill",
        [
            tag.to_owned(),
            main_pid.map(|p| p.to_string()).unwrap_or_default(),
            session.map(|p| p.to_string()).unwrap_or_default(),
            grace_ticks(kill_grace),
        ],
    )
}

/// One control record of the worker or kill script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecRecord {
    /// The worker is up and reads requests.
    Ready,
    /// The working directory does not exist (or cannot be entered).
    NoCwd,
    /// The shell started with this pid.
    Pid(u32),
    /// The command's session (the shell's own, or the worker's; `None`: neither).
    Session(Option<u32>),
    /// The shell ended with this shell-style status (`$?`).
    Exit(i32),
    /// The shell was SIGKILLed and the cgroup's OOM-kill counter went up meanwhile.
    Oom,
    /// The shell exited but other processes of the command are still alive.
    Survivors,
    /// A kill request finished: nothing of the command is left.
    Killed,
    /// Processes survived 10 s of SIGKILL (uninterruptible sleep).
    Stuck,
    /// The worker finished the request with this id.
    Done(String),
}

fn exec_arity(tag: &str) -> Option<usize> {
    Some(match tag {
        "pid" | "sess" | "exit" | "done" => 1,
        "ready" | "nocwd" | "oom" | "survivors" | "killed" | "stuck" => 0,
        _ => return None,
    })
}

/// A parser for the worker's and kill script's record stream.
pub fn exec_record_parser() -> RecordParser {
    RecordParser::new(exec_arity)
}

/// Interpret a parsed record.
pub fn parse_exec_record(record: &Record) -> Result<ExecRecord, RemoteError> {
    let number = |what: &str| -> Result<i64, RemoteError> {
        record.text(0).parse().map_err(|_| RemoteError::Protocol {
            detail: format!("bad {what} `{}`", record.text(0)),
        })
    };
    Ok(match record.tag.as_str() {
        "ready" => ExecRecord::Ready,
        "nocwd" => ExecRecord::NoCwd,
        "pid" => ExecRecord::Pid(number("pid")? as u32),
        "sess" => match record.text(0).as_str() {
            "" => ExecRecord::Session(None),
            _ => ExecRecord::Session(Some(number("session")? as u32)),
        },
        "exit" => ExecRecord::Exit(number("exit status")? as i32),
        "oom" => ExecRecord::Oom,
        "survivors" => ExecRecord::Survivors,
        "killed" => ExecRecord::Killed,
        "stuck" => ExecRecord::Stuck,
        "done" => ExecRecord::Done(record.text(0)),
        other => {
            return Err(RemoteError::Protocol {
                detail: format!("unexpected record `{other}`"),
            });
        }
    })
}

/// Map a shell status (`$?`) to an [`ExitStatus`]. A POSIX shell reports death by signal N as
/// 128 + N and cannot tell it from `exit 128+N`; statuses 129–192 are read as signals (the
/// common case: OOM kills, segfaults, `kill`), so [`ExitStatus::code`] is the same either way.
pub fn shell_status(code: i32) -> ExitStatus {
    if (129..=192).contains(&code) {
        ExitStatus::Signal(code - 128)
    } else {
        ExitStatus::Code(code)
    }
}

/// What a transport delivers while an exec runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportEvent {
    /// Bytes of the exec's stdout (the command's merged output).
    Stdout(Bytes),
    /// Bytes of the exec's stderr (control records).
    Stderr(Bytes),
}

/// Parameters of [`drive`].
#[derive(Clone, Debug)]
pub struct DriveRequest {
    /// Hard timeout.
    pub timeout: Duration,
    /// Cancellation.
    pub cancel: CancellationToken,
    /// Where the command's output goes.
    pub output: mpsc::Sender<Vec<u8>>,
    /// SIGTERM → SIGKILL grace the command was started with (bounds the wait after a kill).
    pub kill_grace: Duration,
    /// The request id when the job went to a waiting worker as a request line: the request
    /// ends with its end marker and `done` record instead of the end of the streams.
    pub request_id: Option<String>,
}

/// What [`drive`] observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveOutcome {
    /// Exit status reported by the worker (`None` if it never reported one).
    pub status: Option<ExitStatus>,
    /// Why the run ended.
    pub termination: Termination,
    /// The shell's pid, when reported.
    pub pid: Option<u32>,
    /// The command's session, when reported.
    pub session: Option<u32>,
    /// The working directory did not exist: nothing ran (the caller reports
    /// [`ExecError::MissingCwd`] once it has dealt with the worker).
    pub missing_cwd: bool,
    /// The shell was OOM-killed.
    pub oom: bool,
    /// A kill request was sent to the worker.
    pub kill_sent: bool,
    /// The worker reported the exit and finished the request (or closed its streams) after
    /// its check: nothing of the command is left. `false` means the caller should run
    /// [`kill_argv`] as a last resort.
    pub clean: bool,
    /// The worker said anything about this request (a record or output): `false` means the
    /// command never started (a dead worker), so running it elsewhere is safe.
    pub answered: bool,
    /// The worker finished the request cleanly and nothing else writes to its output: it may
    /// serve the next request.
    pub reusable: bool,
    /// The transport failed mid-way (message).
    pub transport_error: Option<String>,
}

impl DriveOutcome {
    /// The worker never answered and nothing was killed: it was gone before it read the
    /// request, so nothing ran and the request may go to a fresh worker.
    pub fn unanswered(&self) -> bool {
        !self.answered && self.status.is_none() && !self.kill_sent
    }
}

/// Drive a started job to completion; see the module docs. `events` are the worker's streams
/// (ending when they close); `control` is its stdin.
pub async fn drive<S, W>(
    mut events: S,
    control: W,
    request: DriveRequest,
) -> Result<DriveOutcome, ExecError>
where
    S: Stream<Item = Result<TransportEvent, String>> + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut driver = Driver::new(control, request);
    while !driver.request_finished() {
        let wake = driver.next_wake();
        let flow = tokio::select! {
            biased;
            _ = driver.cancel.cancelled(), if !driver.outcome.kill_sent => {
                // After the shell's own exit a cancel only hurries the sweep of leftovers.
                driver.interrupt(Termination::Cancelled).await;
                Flow::Continue
            }
            _ = tokio::time::sleep_until(wake) => driver.on_wake().await,
            event = events.next() => driver.on_event(event).await?,
        };
        if flow == Flow::Stop {
            break;
        }
    }
    Ok(driver.finish())
}

/// Whether [`drive`] keeps waiting after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// The state of one [`drive`]: the request, what the worker reported so far and the timers.
struct Driver<W> {
    /// The worker's stdin (the kill line goes there).
    control: W,
    cancel: CancellationToken,
    output: mpsc::Sender<Vec<u8>>,
    kill_grace: Duration,
    request_id: Option<String>,
    /// Stands in for "never" (a year from the start).
    far: Instant,
    /// The hard timeout, as an instant.
    deadline: Instant,
    parser: RecordParser,
    /// Finds the end of a request on stdout (only for a request to a waiting worker).
    marker: Option<EndMarker>,
    outcome: DriveOutcome,
    /// The receiver of the output is still there.
    output_open: bool,
    /// The worker reported the shell's exit.
    exited: bool,
    /// The worker reported processes left after the shell's exit.
    survivors: bool,
    /// End of the idle grace (re-armed per chunk after the exit), capped at `idle_cap`.
    idle_deadline: Option<Instant>,
    idle_cap: Option<Instant>,
    /// After a kill: when to stop waiting for the tree to die (the caller sweeps by tag).
    give_up_at: Option<Instant>,
    /// The worker could not kill everything.
    stuck: bool,
    streams_ended: bool,
    /// The worker sent this request's `done` record.
    done: bool,
}

impl<W: AsyncWrite + Unpin> Driver<W> {
    fn new(control: W, request: DriveRequest) -> Self {
        let DriveRequest {
            timeout,
            cancel,
            output,
            kill_grace,
            request_id,
        } = request;
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        let deadline = Instant::now().checked_add(timeout).unwrap_or(far);
        let marker = request_id.as_deref().map(EndMarker::new);
        Driver {
            control,
            cancel,
            output,
            kill_grace,
            request_id,
            far,
            deadline,
            parser: exec_record_parser(),
            marker,
            outcome: DriveOutcome {
                status: None,
                termination: Termination::Exited,
                pid: None,
                session: None,
                missing_cwd: false,
                oom: false,
                kill_sent: false,
                clean: false,
                answered: false,
                reusable: false,
                transport_error: None,
            },
            output_open: true,
            exited: false,
            survivors: false,
            idle_deadline: None,
            idle_cap: None,
            give_up_at: None,
            stuck: false,
            streams_ended: false,
            done: false,
        }
    }

    /// The worker finished this request and its end marker went by on stdout.
    fn request_finished(&self) -> bool {
        self.done && self.marker.as_ref().is_some_and(EndMarker::found)
    }

    /// The next instant a timer fires: the deadline, the idle grace (leftovers after the
    /// exit) or, after a kill, the bound on waiting for the tree to die.
    fn next_wake(&self) -> Instant {
        let mut next = self.far;
        if !self.outcome.kill_sent {
            next = next.min(self.deadline);
            if self.exited && self.survivors {
                next = next.min(self.idle_deadline.unwrap_or(self.far));
            }
        }
        if let Some(at) = self.give_up_at {
            next = next.min(at);
        }
        next
    }

    /// Sends the kill line once and arms the bound on how long we wait for the tree to die.
    async fn send_kill(&mut self) {
        if !self.outcome.kill_sent {
            self.outcome.kill_sent = true;
            // A closed control channel means the process is already gone; the bound armed
            // below still ends the wait either way.
            if let Err(error) = self.control.write_all(KILL_LINE).await {
                tracing::debug!(%error, "remote: kill line not delivered");
            }
            if let Err(error) = self.control.flush().await {
                tracing::debug!(%error, "remote: kill line not flushed");
            }
            self.give_up_at = Some(Instant::now() + self.kill_grace + Duration::from_secs(15));
        }
    }

    /// Cancelled or timed out: records why (unless the shell had exited already) and kills.
    async fn interrupt(&mut self, why: Termination) {
        if !self.exited {
            self.outcome.termination = why;
        }
        self.send_kill().await;
    }

    /// A timer fired (see [`Driver::next_wake`]).
    async fn on_wake(&mut self) -> Flow {
        let now = Instant::now();
        if self.give_up_at.is_some_and(|at| now >= at) {
            // The tree did not go away in time; the caller sweeps by tag.
            return Flow::Stop;
        }
        if !self.outcome.kill_sent && now >= self.deadline {
            self.interrupt(Termination::TimedOut).await;
        } else if !self.outcome.kill_sent && self.exited && self.survivors {
            self.send_kill().await;
        }
        Flow::Continue
    }

    /// What the transport delivered (`None`: its streams ended).
    async fn on_event(
        &mut self,
        event: Option<Result<TransportEvent, String>>,
    ) -> Result<Flow, ExecError> {
        match event {
            None => {
                self.streams_ended = true;
                // Bytes held back as a possible marker start were output after all.
                let held = self
                    .marker
                    .as_mut()
                    .map(EndMarker::take_held)
                    .unwrap_or_default();
                if !held.is_empty() && self.output_open {
                    self.outcome.answered = true;
                    // The receiver is gone only when the caller stopped reading the output.
                    let _ = self.output.send(held).await;
                }
                Ok(Flow::Stop)
            }
            Some(Err(reason)) => {
                self.outcome.transport_error = Some(reason);
                Ok(Flow::Stop)
            }
            Some(Ok(TransportEvent::Stdout(bytes))) => {
                let data = match self.marker.as_mut() {
                    Some(marker) => marker.feed(&bytes).data,
                    None => bytes.to_vec(),
                };
                self.forward(data).await;
                Ok(Flow::Continue)
            }
            Some(Ok(TransportEvent::Stderr(bytes))) => self.on_records(&bytes),
        }
    }

    /// Forwards output with back-pressure, still honouring cancel and the deadline.
    async fn forward(&mut self, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        self.outcome.answered = true;
        if self.exited {
            let now = Instant::now();
            let cap = self.idle_cap.unwrap_or(now);
            self.idle_deadline = Some((now + IDLE_GRACE).min(cap));
        }
        if !self.output_open {
            return;
        }
        let interrupted = tokio::select! {
            biased;
            sent = self.output.send(bytes) => {
                self.output_open = sent.is_ok();
                None
            }
            _ = self.cancel.cancelled(), if !self.outcome.kill_sent => Some(Termination::Cancelled),
            _ = tokio::time::sleep_until(self.deadline), if !self.outcome.kill_sent => {
                Some(Termination::TimedOut)
            }
        };
        if let Some(why) = interrupted {
            self.interrupt(why).await;
        }
    }

    /// Control records from the worker's stderr.
    fn on_records(&mut self, bytes: &[u8]) -> Result<Flow, ExecError> {
        let records = self.parser.feed(bytes).map_err(|e| ExecError::Backend {
            reason: e.to_string(),
        })?;
        for record in records {
            let record = parse_exec_record(&record).map_err(|e| ExecError::Backend {
                reason: e.to_string(),
            })?;
            match record {
                ExecRecord::Ready | ExecRecord::Done(_) => {}
                _ => self.outcome.answered = true,
            }
            match record {
                ExecRecord::Ready => {}
                ExecRecord::NoCwd => {
                    self.outcome.missing_cwd = true;
                    if self.request_id.is_none() {
                        // A one-shot exec ends right after.
                        return Ok(Flow::Stop);
                    }
                }
                ExecRecord::Pid(pid) => self.outcome.pid = Some(pid),
                ExecRecord::Session(session) => self.outcome.session = session,
                ExecRecord::Exit(code) => {
                    self.outcome.status = Some(shell_status(code));
                    self.exited = true;
                    let now = Instant::now();
                    self.idle_deadline = Some(now + IDLE_GRACE);
                    self.idle_cap = Some(now + IDLE_CAP);
                }
                ExecRecord::Oom => self.outcome.oom = true,
                ExecRecord::Survivors => self.survivors = true,
                ExecRecord::Killed => {}
                ExecRecord::Stuck => self.stuck = true,
                ExecRecord::Done(id) => {
                    if self.request_id.as_deref() == Some(id.as_str()) {
                        self.done = true;
                    } else {
                        return Err(ExecError::Backend {
                            reason: format!(
                                "the remote worker finished request `{id}` instead of this one"
                            ),
                        });
                    }
                }
            }
        }
        Ok(Flow::Continue)
    }

    /// The outcome, with whether the run ended cleanly and the worker may be reused.
    fn finish(self) -> DriveOutcome {
        let finished = self.request_finished();
        let Driver {
            request_id,
            parser,
            marker,
            mut outcome,
            exited,
            stuck,
            streams_ended,
            ..
        } = self;
        // The worker only finishes a request (or closes its streams) after the shell exited and
        // either nothing was left or its watcher finished killing the rest.
        let ended = streams_ended || finished || (outcome.missing_cwd && request_id.is_none());
        outcome.clean =
            ended && (exited || outcome.missing_cwd) && !stuck && outcome.transport_error.is_none();
        outcome.reusable = finished
            && outcome.clean
            && !marker.as_ref().is_some_and(EndMarker::trailing)
            && !parser.is_mid_record();
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(env: Vec<(String, String)>) -> ExecJob {
        ExecJob {
            tag: "t1".to_owned(),
            cwd: PathBuf::from("/w"),
            command: "echo hi".to_owned(),
            env,
            kill_grace_ms: 1000,
        }
    }

    #[test]
    fn exec_words_carry_everything_positionally() {
        let words = job(vec![("FOO".to_owned(), "a b".to_owned())])
            .words()
            .expect("valid request");
        assert_eq!(words, vec!["t1", "/w", "echo hi", "20", "FOO=a b"]);
    }

    #[test]
    fn exec_words_reject_bad_env_names_and_nul() {
        let err = job(vec![("1X".to_owned(), "v".to_owned())])
            .words()
            .expect_err("invalid name");
        assert_eq!(
            err.to_string(),
            "failed to pass environment variable `1X`: not a valid shell variable name"
        );
        let mut nul = job(Vec::new());
        nul.command = "a\0b".to_owned();
        assert_eq!(
            nul.words().expect_err("NUL").to_string(),
            "failed to pass argument command: it must be UTF-8 without NUL bytes"
        );
    }

    #[test]
    fn kill_argv_shape() {
        assert_eq!(
            kill_argv("t9", Some(42), Some(40), Duration::from_millis(120)),
            vec![
                "sh".to_owned(),
                "-c".to_owned(),
                KILL_SCRIPT.to_owned(),
                "cordon-kill".to_owned(),
                "t9".to_owned(),
                "42".to_owned(),
                "40".to_owned(),
                "3".to_owned(),
            ]
        );
    }

    #[test]
    fn shell_status_mapping() {
        assert_eq!(shell_status(0), ExitStatus::Code(0));
        assert_eq!(shell_status(128), ExitStatus::Code(128));
        assert_eq!(shell_status(137), ExitStatus::Signal(9));
        assert_eq!(shell_status(192), ExitStatus::Signal(64));
        assert_eq!(shell_status(200), ExitStatus::Code(200));
    }

    #[test]
    fn parses_exec_records() {
        let mut parser = exec_record_parser();
        let records = parser
            .feed(b"ready\x00pid\x00314\x00sess\x00\x00exit\x00143\x00oom\x00survivors\x00killed\x00done\x00r1\x00")
            .expect("valid");
        let parsed: Vec<ExecRecord> = records
            .iter()
            .map(|r| parse_exec_record(r).expect("known"))
            .collect();
        assert_eq!(
            parsed,
            vec![
                ExecRecord::Ready,
                ExecRecord::Pid(314),
                ExecRecord::Session(None),
                ExecRecord::Exit(143),
                ExecRecord::Oom,
                ExecRecord::Survivors,
                ExecRecord::Killed,
                ExecRecord::Done("r1".to_owned()),
            ]
        );
    }
}
