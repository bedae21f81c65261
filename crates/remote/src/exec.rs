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
use cordon_tools::ops::{ExecError, ExitStatus, Termination};
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
    mut control: W,
    request: DriveRequest,
) -> Result<DriveOutcome, ExecError>
where
    S: Stream<Item = Result<TransportEvent, String>> + Unpin,
    W: AsyncWrite + Unpin,
{
    let DriveRequest {
        timeout,
        cancel,
        output,
        kill_grace,
        request_id,
    } = request;
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let deadline = Instant::now().checked_add(timeout).unwrap_or(far);
    let mut parser = exec_record_parser();
    let mut marker = request_id.as_deref().map(EndMarker::new);
    let mut outcome = DriveOutcome {
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
    };
    let mut output_open = true;
    let mut exited = false;
    let mut survivors = false;
    let mut idle_deadline: Option<Instant> = None;
    let mut idle_cap: Option<Instant> = None;
    let mut give_up_at: Option<Instant> = None;
    let mut stuck = false;
    let mut streams_ended = false;
    let mut done = false;

    // Sends the kill line once and arms the bound on how long we wait for the tree to die.
    macro_rules! send_kill {
        () => {
            if !outcome.kill_sent {
                outcome.kill_sent = true;
                let _ = control.write_all(KILL_LINE).await;
                let _ = control.flush().await;
                give_up_at = Some(Instant::now() + kill_grace + Duration::from_secs(15));
            }
        };
    }

    // Forwards output with back-pressure, still honouring cancel and the deadline.
    macro_rules! forward {
        ($bytes:expr) => {
            let bytes: Vec<u8> = $bytes;
            if !bytes.is_empty() {
                outcome.answered = true;
                if exited {
                    let now = Instant::now();
                    let cap = idle_cap.unwrap_or(now);
                    idle_deadline = Some((now + IDLE_GRACE).min(cap));
                }
                if output_open {
                    tokio::select! {
                        biased;
                        sent = output.send(bytes) => {
                            output_open = sent.is_ok();
                        }
                        _ = cancel.cancelled(), if !outcome.kill_sent => {
                            if !exited {
                                outcome.termination = Termination::Cancelled;
                            }
                            send_kill!();
                        }
                        _ = tokio::time::sleep_until(deadline), if !outcome.kill_sent => {
                            if !exited {
                                outcome.termination = Termination::TimedOut;
                            }
                            send_kill!();
                        }
                    }
                }
            }
        };
    }

    'run: loop {
        if done && marker.as_ref().is_some_and(EndMarker::found) {
            break;
        }
        let mut next = far;
        if !outcome.kill_sent {
            next = next.min(deadline);
            if exited && survivors {
                next = next.min(idle_deadline.unwrap_or(far));
            }
        }
        if let Some(at) = give_up_at {
            next = next.min(at);
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled(), if !outcome.kill_sent => {
                // After the shell's own exit a cancel only hurries the sweep of leftovers.
                if !exited {
                    outcome.termination = Termination::Cancelled;
                }
                send_kill!();
            }
            _ = tokio::time::sleep_until(next) => {
                let now = Instant::now();
                if give_up_at.is_some_and(|at| now >= at) {
                    // The tree did not go away in time; the caller sweeps by tag.
                    break;
                }
                if !outcome.kill_sent && now >= deadline {
                    if !exited {
                        outcome.termination = Termination::TimedOut;
                    }
                    send_kill!();
                } else if !outcome.kill_sent && exited && survivors {
                    send_kill!();
                }
            }
            event = events.next() => match event {
                None => {
                    streams_ended = true;
                    // Bytes held back as a possible marker start were output after all.
                    let held = marker.as_mut().map(EndMarker::take_held).unwrap_or_default();
                    if !held.is_empty() && output_open {
                        outcome.answered = true;
                        let _ = output.send(held).await;
                    }
                    break;
                }
                Some(Err(reason)) => {
                    outcome.transport_error = Some(reason);
                    break;
                }
                Some(Ok(TransportEvent::Stdout(bytes))) => {
                    let data = match marker.as_mut() {
                        Some(marker) => marker.feed(&bytes).data,
                        None => bytes.to_vec(),
                    };
                    forward!(data);
                }
                Some(Ok(TransportEvent::Stderr(bytes))) => {
                    let records = parser.feed(&bytes).map_err(|e| ExecError::Backend {
                        reason: e.to_string(),
                    })?;
                    for record in records {
                        let record = parse_exec_record(&record).map_err(|e| ExecError::Backend {
                            reason: e.to_string(),
                        })?;
                        match record {
                            ExecRecord::Ready | ExecRecord::Done(_) => {}
                            _ => outcome.answered = true,
                        }
                        match record {
                            ExecRecord::Ready => {}
                            ExecRecord::NoCwd => {
                                outcome.missing_cwd = true;
                                if request_id.is_none() {
                                    // A one-shot exec ends right after.
                                    break 'run;
                                }
                            }
                            ExecRecord::Pid(pid) => outcome.pid = Some(pid),
                            ExecRecord::Session(session) => outcome.session = session,
                            ExecRecord::Exit(code) => {
                                outcome.status = Some(shell_status(code));
                                exited = true;
                                let now = Instant::now();
                                idle_deadline = Some(now + IDLE_GRACE);
                                idle_cap = Some(now + IDLE_CAP);
                            }
                            ExecRecord::Oom => outcome.oom = true,
                            ExecRecord::Survivors => survivors = true,
                            ExecRecord::Killed => {}
                            ExecRecord::Stuck => stuck = true,
                            ExecRecord::Done(id) => {
                                if request_id.as_deref() == Some(id.as_str()) {
                                    done = true;
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
                }
            }
        }
    }
    let finished = done && marker.as_ref().is_some_and(EndMarker::found);
    // The worker only finishes a request (or closes its streams) after the shell exited and
    // either nothing was left or its watcher finished killing the rest.
    let ended = streams_ended || finished || (outcome.missing_cwd && request_id.is_none());
    outcome.clean =
        ended && (exited || outcome.missing_cwd) && !stuck && outcome.transport_error.is_none();
    outcome.reusable = finished
        && outcome.clean
        && !marker.as_ref().is_some_and(EndMarker::trailing)
        && !parser.is_mid_record();
    Ok(outcome)
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
