//! Asking the person at the terminal about `Ask` decisions: yes, no, or always (for the rest
//! of the session, for the rule that asked). Only used when stdin is a terminal; otherwise the
//! session has no approver and `Ask` is a denial.
//!
//! The question goes to stderr (stdout may be piped); answers are read from stdin by one
//! thread that forwards lines, so a pending question never blocks the runtime or exit. Anything
//! but a clear yes/always is a no: an empty line, end of input, and Ctrl-C while waiting.

use std::io::{BufRead, Write};
use std::sync::Arc;

use async_trait::async_trait;
use cordon_core::CancellationToken;
use cordon_runtime::{Approval, ApprovalRequest, Approver, NETWORK_QUESTION, escape_for_question};
use tokio::sync::{Mutex, mpsc};

use crate::cmd::run::render::call_summary;

/// Longest rendering of a call's arguments in a question, in characters.
const MAX_CALL_CHARS: usize = 2000;

/// How many unclear answers are tolerated before the call is declined.
const MAX_UNCLEAR_ANSWERS: usize = 3;

/// Where answers come from: one line per message, `None` at end of input.
type Lines = mpsc::UnboundedReceiver<Option<String>>;

/// An [`Approver`] that asks on the terminal.
pub struct TerminalApprover {
    cancel: CancellationToken,
    /// Started on the first question.
    lines: Mutex<Option<Lines>>,
    /// Where the question is written.
    prompt: Arc<dyn Fn(&str) + Send + Sync>,
}

impl TerminalApprover {
    /// Ask on stderr, read stdin; a cancelled run answers `No` to a pending question.
    pub fn new(cancel: CancellationToken) -> Self {
        TerminalApprover {
            cancel,
            lines: Mutex::new(None),
            prompt: Arc::new(|text| {
                let mut stderr = std::io::stderr().lock();
                // A prompt on a closed stderr: the answer read from stdin still decides.
                let _ = stderr.write_all(text.as_bytes());
                let _ = stderr.flush();
            }),
        }
    }

    /// An approver over given answer lines and prompt sink (tests).
    #[cfg(test)]
    fn with_lines(
        cancel: CancellationToken,
        lines: Lines,
        prompt: Arc<dyn Fn(&str) + Send + Sync>,
    ) -> Self {
        TerminalApprover {
            cancel,
            lines: Mutex::new(Some(lines)),
            prompt,
        }
    }
}

/// Forward stdin lines to a channel from a thread of its own (a blocking read must not hold
/// up the runtime or its shutdown).
fn stdin_lines() -> Lines {
    let (sender, receiver) = mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new()
        .name("cordon-approval-stdin".into())
        .spawn(move || {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                match line {
                    Ok(line) => {
                        if sender.send(Some(line)).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            // The approver stopped listening: the session is ending.
            let _ = sender.send(None);
        });
    if spawned.is_err() {
        // No reader: the channel is closed at once and every question is answered `No`.
        let (_, closed) = mpsc::unbounded_channel();
        return closed;
    }
    receiver
}

/// What an answer line means; `None` when it is unclear.
pub fn parse_answer(line: &str) -> Option<Approval> {
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Some(Approval::Yes),
        "" | "n" | "no" => Some(Approval::No),
        "a" | "always" => Some(Approval::Always),
        _ => None,
    }
}

/// The question for `request`.
pub fn question(request: &ApprovalRequest) -> String {
    let ApprovalRequest {
        call_id: _,
        tool,
        args,
        rule,
        reason,
    } = request;
    if tool == NETWORK_QUESTION {
        // A connection a command made to a destination an `[network] ask` entry matches:
        // "always" means that destination, not the rule.
        let destination = args
            .get("destination")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        return format!(
            "? Allow a command to connect to {}? The policy asks ({}: {}).\n  [y]es this \
             connection, [N]o, [a]lways this destination in this session: ",
            bounded(&escape_for_question(destination)),
            escape_for_question(rule),
            escape_for_question(reason),
        );
    }
    let summary = call_summary(tool, args);
    format!(
        "? Allow {} {}? The policy asks ({}: {}).\n  call: {}\n  [y]es, [N]o, [a]lways for \
         this rule in this session: ",
        escape_for_question(tool),
        escape_for_question(&summary),
        escape_for_question(rule),
        escape_for_question(reason),
        call_line(args),
    )
}

/// `text` cut at [`MAX_CALL_CHARS`], saying how much was left out.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_CALL_CHARS) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}… ({} more bytes)", &text[..cut], text.len() - cut),
    }
}

/// The call's whole arguments on one line: the summary above shows only a command's first
/// line, and the person must see everything the call would run before saying yes. JSON (a
/// newline is `\n`), with what could draw or hide text escaped, cut at
/// [`MAX_CALL_CHARS`] saying how much was left out.
fn call_line(args: &serde_json::Value) -> String {
    bounded(&escape_for_question(&args.to_string()))
}

#[async_trait]
impl Approver for TerminalApprover {
    async fn approve(&self, request: ApprovalRequest) -> Approval {
        let mut lines = self.lines.lock().await;
        let lines = lines.get_or_insert_with(stdin_lines);
        (self.prompt)(&question(&request));
        for _ in 0..MAX_UNCLEAR_ANSWERS {
            let line = tokio::select! {
                biased;
                () = self.cancel.cancelled() => {
                    (self.prompt)("\n");
                    return Approval::No;
                }
                line = lines.recv() => line,
            };
            let Some(Some(line)) = line else {
                (self.prompt)("\n");
                return Approval::No;
            };
            match parse_answer(&line) {
                Some(answer) => return answer,
                None => (self.prompt)("  Please answer y, n or a: "),
            }
        }
        (self.prompt)("  No clear answer: the call is declined.\n");
        Approval::No
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use serde_json::json;

    use super::*;

    fn request() -> ApprovalRequest {
        ApprovalRequest {
            call_id: "c1".into(),
            tool: "write".into(),
            args: json!({"path": "Cargo.lock", "content": "x"}),
            rule: "policy.toml:12".into(),
            reason: "lock file changes need review".into(),
        }
    }

    fn scripted(answers: &[Option<&str>]) -> (TerminalApprover, Arc<StdMutex<String>>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        for answer in answers {
            sender.send(answer.map(str::to_owned)).unwrap();
        }
        // Keep the channel open: a missing answer must wait, not read as end of input.
        std::mem::forget(sender);
        let shown = Arc::new(StdMutex::new(String::new()));
        let sink = shown.clone();
        let approver = TerminalApprover::with_lines(
            CancellationToken::new(),
            receiver,
            Arc::new(move |text| sink.lock().unwrap().push_str(text)),
        );
        (approver, shown)
    }

    #[test]
    fn answers_mean_yes_no_always_and_default_to_no() {
        assert_eq!(parse_answer("y"), Some(Approval::Yes));
        assert_eq!(parse_answer(" YES "), Some(Approval::Yes));
        assert_eq!(parse_answer(""), Some(Approval::No));
        assert_eq!(parse_answer("no"), Some(Approval::No));
        assert_eq!(parse_answer("A"), Some(Approval::Always));
        assert_eq!(parse_answer("always"), Some(Approval::Always));
        assert_eq!(parse_answer("sure"), None);
    }

    #[test]
    fn the_question_names_the_call_and_the_rule() {
        assert_eq!(
            question(&request()),
            "? Allow write Cargo.lock? The policy asks (policy.toml:12: lock file changes need \
             review).\n  call: {\"content\":\"x\",\"path\":\"Cargo.lock\"}\n  [y]es, [N]o, \
             [a]lways for this rule in this session: "
        );
    }

    #[test]
    fn a_network_question_names_the_destination_and_what_always_means() {
        let text = question(&ApprovalRequest {
            call_id: "network api.github.com:443".into(),
            tool: NETWORK_QUESTION.into(),
            args: json!({"destination": "api.github.com:443"}),
            rule: "policy.toml:7".into(),
            reason: "ask entry \"*.github.com\" matches\u{1b}[2K".into(),
        });
        assert_eq!(
            text,
            "? Allow a command to connect to api.github.com:443? The policy asks (policy.toml:7: \
             ask entry \"*.github.com\" matches\\u001b[2K).\n  [y]es this connection, [N]o, \
             [a]lways this destination in this session: "
        );
    }

    #[test]
    fn the_question_shows_every_line_of_a_command_and_nothing_that_draws_or_hides() {
        let text = question(&ApprovalRequest {
            tool: "bash".into(),
            args: json!({"command": "git status\nrm -rf ~ \u{202e}\u{1b}[2K"}),
            reason: "needs review\n? Allow bash ls".into(),
            ..request()
        });
        // The summary shows the first line; the call line shows all of it.
        assert!(
            text.contains("? Allow bash git status … (+1 lines)?"),
            "{text}"
        );
        assert!(
            text.contains(r#"  call: {"command":"git status\nrm -rf ~ \u202e\u001b[2K"}"#),
            "{text}"
        );
        assert!(
            text.contains(r"needs review\u000a? Allow bash ls"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(!text.contains('\u{202e}') && !text.contains('\u{1b}'));

        let long = question(&ApprovalRequest {
            args: json!({"path": "a", "content": "x".repeat(5000)}),
            ..request()
        });
        assert!(long.contains("… (3"), "{long}");
        assert!(long.chars().count() < MAX_CALL_CHARS + 300);
    }

    #[tokio::test]
    async fn unclear_answers_are_asked_again() {
        let (approver, shown) = scripted(&[Some("what?"), Some("a")]);
        assert_eq!(approver.approve(request()).await, Approval::Always);
        assert!(shown.lock().unwrap().contains("Please answer y, n or a"));
    }

    #[tokio::test]
    async fn end_of_input_and_repeated_nonsense_decline() {
        let (approver, _) = scripted(&[None]);
        assert_eq!(approver.approve(request()).await, Approval::No);
        let (approver, shown) = scripted(&[Some("?"), Some("??"), Some("???"), Some("y")]);
        assert_eq!(approver.approve(request()).await, Approval::No);
        assert!(shown.lock().unwrap().contains("the call is declined"));
    }

    #[tokio::test]
    async fn cancelling_the_run_declines_a_pending_question() {
        let (approver, _) = scripted(&[]);
        approver.cancel.cancel();
        assert_eq!(approver.approve(request()).await, Approval::No);
    }
}
