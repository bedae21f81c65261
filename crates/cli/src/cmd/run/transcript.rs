//! `--save FILE`: the session as JSONL messages (user, assistant, toolResult), one complete
//! message per line, written as each message ends. `cordon replay FILE` re-runs it: it skips
//! the user and toolResult lines and executes the assistant messages' calls.
//!
//! Lines are appended as the run goes, so an interrupted run (even a second Ctrl-C) leaves a
//! transcript of everything up to that point, and every line in it is a whole message. The
//! path is checked before the run, but the file is only created (or an existing one replaced)
//! when the first message is recorded: a configuration error found after the check leaves an
//! existing file as it was.
//!
//! The file is opened without following a symlink or blocking on a FIFO, must be a regular
//! file of the current user (or root) that group and others cannot write, and must not lie
//! where sandboxed commands can write (checked by the caller once the session is open).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use cordon_core::event::AgentEvent;
use cordon_core::hostfile::{self, WriteMode};
use cordon_core::protocol::Message;

/// An open transcript file.
pub struct Transcript {
    path: PathBuf,
    state: Mutex<State>,
}

struct State {
    /// Created at the first message.
    file: Option<File>,
    /// The first write failure; nothing is written after it.
    failure: Option<std::io::Error>,
}

impl Transcript {
    /// A transcript at `path`, which must be writable: an existing file is opened for writing
    /// without being changed, a new one is created and removed again. Fails before the run
    /// starts if it cannot be written.
    pub fn create(path: &Path) -> anyhow::Result<Transcript> {
        let failed = || format!("failed to create the transcript {}", path.display());
        if std::fs::symlink_metadata(path).is_ok() {
            hostfile::open_write(path, WriteMode::Existing).with_context(failed)?;
        } else {
            hostfile::open_write(path, WriteMode::Truncate).with_context(failed)?;
            std::fs::remove_file(path).with_context(failed)?;
        }
        Ok(Transcript {
            path: path.to_owned(),
            state: Mutex::new(State {
                file: None,
                failure: None,
            }),
        })
    }

    /// Append the message of a `message_end` event; other events are ignored.
    pub fn record(&self, event: &AgentEvent) {
        let AgentEvent::MessageEnd { message } = event else {
            return;
        };
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.failure.is_some() {
            return;
        }
        let State { file, failure } = &mut *state;
        let written = match file {
            Some(file) => Ok(file),
            None => hostfile::open_write(&self.path, WriteMode::Truncate)
                .map_err(std::io::Error::other)
                .map(|created| file.insert(created)),
        }
        .and_then(|file| file.write_all(&transcript_line(message)?));
        if let Err(error) = written {
            *failure = Some(error);
        }
    }

    /// After the run: the first write failure, if any, as an error naming the file; else the
    /// file is synced to disk.
    pub fn finish(&self) -> anyhow::Result<()> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let State { file, failure } = &mut *state;
        let synced = match (failure.take(), file) {
            (Some(error), _) => Err(error),
            (None, Some(file)) => file.sync_all(),
            (None, None) => Ok(()),
        };
        synced.with_context(|| format!("failed to write the transcript {}", self.path.display()))
    }
}

/// One message as a JSON line, written with a single `write_all`.
fn transcript_line(message: &Message) -> std::io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    Ok(line)
}

#[cfg(test)]
mod tests {
    use cordon_core::protocol::{AssistantMessage, UserMessage};

    use super::*;

    #[test]
    fn writes_one_line_per_finished_message_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.jsonl");
        let transcript = Transcript::create(&path).unwrap();
        let user = Message::User(UserMessage::text("fix it"));
        transcript.record(&AgentEvent::AgentStart);
        transcript.record(&AgentEvent::MessageStart {
            message: user.clone(),
        });
        transcript.record(&AgentEvent::MessageEnd {
            message: user.clone(),
        });
        let assistant = Message::Assistant(AssistantMessage::default());
        transcript.record(&AgentEvent::MessageEnd {
            message: assistant.clone(),
        });
        transcript.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Message> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines, vec![user, assistant]);
    }

    #[test]
    fn an_existing_file_is_kept_until_the_first_message() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.jsonl");
        std::fs::write(&path, "previous\n").unwrap();
        let transcript = Transcript::create(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "previous\n");
        let user = Message::User(UserMessage::text("again"));
        transcript.record(&AgentEvent::MessageEnd {
            message: user.clone(),
        });
        transcript.finish().unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\n", serde_json::to_string(&user).unwrap())
        );

        let fresh = dir.path().join("fresh.jsonl");
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let refused = Transcript::create(&link).err().unwrap();
        assert!(
            format!("{refused:#}").contains("symbolic link"),
            "{refused:#}"
        );
        Transcript::create(&fresh).unwrap().finish().unwrap();
        assert!(!fresh.exists(), "nothing recorded, nothing created");
    }

    #[test]
    fn an_unwritable_path_fails_before_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let error = Transcript::create(&dir.path().join("missing/session.jsonl"))
            .err()
            .unwrap();
        assert!(
            format!("{error:#}").starts_with("failed to create the transcript"),
            "{error:#}"
        );
    }
}
