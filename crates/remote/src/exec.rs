//! Running one command through a remote exec (SPEC §4 bash semantics on a POSIX host).
//!
//! The transport (docker exec, SSH channel) runs [`wrapper_argv`]'s script with stdin, stdout
//! and stderr attached. The wrapper `cd`s to the working directory (or reports `nocwd`), starts
//! `bash -c` (`sh -c` without bash) in its own session with stdin from `/dev/null`, stdout and
//! stderr merged onto the exec's stdout, and the variable `CORDON_EXEC_ID=<tag>` in its
//! environment so that escapees (`setsid`, `nohup … &`) can still be found through
//! `/proc/*/environ`. Control records travel on the exec's stderr; the exec's stdin is the
//! control input: a line `kill` (or EOF, when the client goes away) kills the whole tree
//! (SIGTERM, grace, SIGKILL, rescanning until nothing is left).
//!
//! [`drive`] is the client half, shared by every transport: it forwards output with
//! back-pressure, enforces the timeout and the cancellation token, applies the idle grace after
//! the shell exits while leftover processes hold the output open (100 ms re-armed per chunk,
//! capped at 2 s, as the local backend), and makes sure the kill happened before it returns.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use cordon_tools::ops::{ExecError, ExitStatus, Termination};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::records::{Record, RecordParser};
use crate::{RemoteError, checked_arg, path_arg, sh_argv};

/// The exec wrapper (POSIX sh); see the module docs.
pub const WRAPPER_SCRIPT: &str = concat!(include_str!("sh/proc.sh"), include_str!("sh/wrapper.sh"));

/// The stand-alone kill script: kills every process carrying a tag (and the session of the
/// command's shell), for when the wrapper itself is gone.
pub const KILL_SCRIPT: &str = concat!(include_str!("sh/proc.sh"), include_str!("sh/kill.sh"));

/// Time between SIGTERM and SIGKILL when a tree is killed.
pub const KILL_GRACE: Duration = Duration::from_secs(1);
/// Output idle grace after the shell exited while other processes still hold the output.
pub const IDLE_GRACE: Duration = Duration::from_millis(100);
/// Upper bound of the idle grace, however chatty the leftovers are.
pub const IDLE_CAP: Duration = Duration::from_secs(2);

/// What the client writes to the wrapper's stdin to kill the command's tree.
pub const KILL_LINE: &[u8] = b"kill\n";

/// A command for the wrapper.
#[derive(Clone, Debug)]
pub struct WrapperRequest<'a> {
    /// The tag marking this command's processes (see [`new_tag`]).
    pub tag: &'a str,
    /// Working directory on the remote side.
    pub cwd: &'a Path,
    /// The script for `bash -c`.
    pub command: &'a str,
    /// Extra environment for the command (not for the wrapper).
    pub env: &'a [(String, String)],
    /// SIGTERM → SIGKILL grace.
    pub kill_grace: Duration,
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

/// The argv running the wrapper for `request`.
pub fn wrapper_argv(request: &WrapperRequest<'_>) -> Result<Vec<String>, RemoteError> {
    let WrapperRequest {
        tag,
        cwd,
        command,
        env,
        kill_grace,
    } = request;
    let mut args = vec![
        checked_arg("tag", tag)?,
        path_arg(cwd)?,
        checked_arg("command", command)?,
        grace_ticks(*kill_grace),
    ];
    for (name, value) in env.iter() {
        if !is_valid_env_name(name) {
            return Err(RemoteError::InvalidEnvName { name: name.clone() });
        }
        args.push(checked_arg(name, &format!("{name}={value}"))?);
    }
    Ok(sh_argv(WRAPPER_SCRIPT, "cordon-exec", args))
}

/// The argv running the kill script for a tag (and the shell's pid, when known).
pub fn kill_argv(tag: &str, main_pid: Option<u32>, kill_grace: Duration) -> Vec<String> {
    sh_argv(
        KILL_SCRIPT,
        "cordon-kill",
        [
            tag.to_owned(),
            main_pid.map(|p| p.to_string()).unwrap_or_default(),
            grace_ticks(kill_grace),
        ],
    )
}

/// One control record of the wrapper or kill script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecRecord {
    /// The working directory does not exist (or cannot be entered).
    NoCwd,
    /// The shell started with this pid (also its session id when `setsid` exists).
    Pid(u32),
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
}

fn exec_arity(tag: &str) -> Option<usize> {
    Some(match tag {
        "pid" | "exit" => 1,
        "nocwd" | "oom" | "survivors" | "killed" | "stuck" => 0,
        _ => return None,
    })
}

/// A parser for the wrapper's and kill script's record stream.
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
        "nocwd" => ExecRecord::NoCwd,
        "pid" => ExecRecord::Pid(number("pid")? as u32),
        "exit" => ExecRecord::Exit(number("exit status")? as i32),
        "oom" => ExecRecord::Oom,
        "survivors" => ExecRecord::Survivors,
        "killed" => ExecRecord::Killed,
        "stuck" => ExecRecord::Stuck,
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
    /// The command's working directory (for the `MissingCwd` error).
    pub cwd: PathBuf,
    /// Hard timeout.
    pub timeout: Duration,
    /// Cancellation.
    pub cancel: CancellationToken,
    /// Where the command's output goes.
    pub output: mpsc::Sender<Vec<u8>>,
    /// SIGTERM → SIGKILL grace the wrapper was started with (bounds the wait after a kill).
    pub kill_grace: Duration,
}

/// What [`drive`] observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveOutcome {
    /// Exit status reported by the wrapper (`None` if it never reported one).
    pub status: Option<ExitStatus>,
    /// Why the run ended.
    pub termination: Termination,
    /// The shell's pid, when reported.
    pub pid: Option<u32>,
    /// The shell was OOM-killed.
    pub oom: bool,
    /// A kill request was sent to the wrapper.
    pub kill_sent: bool,
    /// The wrapper reported the exit and closed its streams after its sweep: nothing of the
    /// command is left. `false` means the caller should run [`kill_argv`] as a last resort.
    pub clean: bool,
    /// The transport failed mid-way (message).
    pub transport_error: Option<String>,
}

/// Drive a started wrapper to completion; see the module docs. `events` ends when the exec's
/// streams close; `control` is the exec's stdin.
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
        cwd,
        timeout,
        cancel,
        output,
        kill_grace,
    } = request;
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let deadline = Instant::now().checked_add(timeout).unwrap_or(far);
    let mut parser = exec_record_parser();
    let mut outcome = DriveOutcome {
        status: None,
        termination: Termination::Exited,
        pid: None,
        oom: false,
        kill_sent: false,
        clean: false,
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

    loop {
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
                    break;
                }
                Some(Err(reason)) => {
                    outcome.transport_error = Some(reason);
                    break;
                }
                Some(Ok(TransportEvent::Stdout(bytes))) => {
                    if exited {
                        let now = Instant::now();
                        let cap = idle_cap.unwrap_or(now);
                        idle_deadline = Some((now + IDLE_GRACE).min(cap));
                    }
                    if output_open {
                        tokio::select! {
                            biased;
                            sent = output.send(bytes.to_vec()) => {
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
                Some(Ok(TransportEvent::Stderr(bytes))) => {
                    let records = parser.feed(&bytes).map_err(|e| ExecError::Backend {
                        reason: e.to_string(),
                    })?;
                    for record in records {
                        match parse_exec_record(&record).map_err(|e| ExecError::Backend {
                            reason: e.to_string(),
                        })? {
                            ExecRecord::NoCwd => return Err(ExecError::MissingCwd { cwd }),
                            ExecRecord::Pid(pid) => outcome.pid = Some(pid),
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
                        }
                    }
                }
            }
        }
    }
    // The wrapper only closes its streams after the shell exited and either nothing was left
    // or its watcher finished killing the rest.
    outcome.clean = streams_ended && exited && !stuck && outcome.transport_error.is_none();
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapper_argv_carries_everything_positionally() {
        let env = vec![("FOO".to_owned(), "a b".to_owned())];
        let argv = wrapper_argv(&WrapperRequest {
            tag: "t1",
            cwd: Path::new("/w"),
            command: "echo hi",
            env: &env,
            kill_grace: Duration::from_millis(1000),
        })
        .expect("valid request");
        assert_eq!(
            argv,
            vec![
                "sh".to_owned(),
                "-c".to_owned(),
                WRAPPER_SCRIPT.to_owned(),
                "cordon-exec".to_owned(),
                "t1".to_owned(),
                "/w".to_owned(),
                "echo hi".to_owned(),
                "20".to_owned(),
                "FOO=a b".to_owned(),
            ]
        );
    }

    #[test]
    fn wrapper_argv_rejects_bad_env_names() {
        let env = vec![("1X".to_owned(), "v".to_owned())];
        let err = wrapper_argv(&WrapperRequest {
            tag: "t",
            cwd: Path::new("/"),
            command: "true",
            env: &env,
            kill_grace: KILL_GRACE,
        })
        .expect_err("invalid name");
        assert_eq!(
            err.to_string(),
            "failed to pass environment variable `1X`: not a valid shell variable name"
        );
    }

    #[test]
    fn kill_argv_shape() {
        assert_eq!(
            kill_argv("t9", Some(42), Duration::from_millis(120)),
            vec![
                "sh".to_owned(),
                "-c".to_owned(),
                KILL_SCRIPT.to_owned(),
                "cordon-kill".to_owned(),
                "t9".to_owned(),
                "42".to_owned(),
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
            .feed(b"pid\x00314\x00exit\x00143\x00oom\x00survivors\x00killed\x00")
            .expect("valid");
        let parsed: Vec<ExecRecord> = records
            .iter()
            .map(|r| parse_exec_record(r).expect("known"))
            .collect();
        assert_eq!(
            parsed,
            vec![
                ExecRecord::Pid(314),
                ExecRecord::Exit(143),
                ExecRecord::Oom,
                ExecRecord::Survivors,
                ExecRecord::Killed,
            ]
        );
    }
}
