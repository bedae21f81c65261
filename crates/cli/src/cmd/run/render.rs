//! The terminal view of a run: assistant text streamed as it arrives, thinking as a marked
//! block, each tool call as a one-line summary (`● bash  cargo test`) followed by a short
//! preview of its result (the diff of an edit, the tail of a command's output, the text of an
//! error).
//!
//! It owns presentation only: what is shown for which event, colours, and making model- and
//! tool-controlled text safe for a terminal (no escape sequences get through). The events are
//! the loop's; `--json` prints them raw instead.
//!
//! Writes to the terminal are best effort (each `let _ =` on one here): a closed stdout does
//! not stop the agent, whose outcome the exit code and the transcript still carry.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;

use cordon_core::event::AgentEvent;
use cordon_core::protocol::{AssistantMessage, Content, Message};
use cordon_core::provider::AssistantStreamEvent;
use cordon_core::tool::AgentToolResult;
use cordon_ops::ToolKind;
use serde_json::Value;

/// Longest tool-call summary, in characters.
const SUMMARY_CHARS: usize = 120;
/// Lines of a result preview (head or tail).
const PREVIEW_LINES: usize = 10;
/// Lines of an edit's diff.
const DIFF_LINES: usize = 40;
/// Longest preview line, in characters.
const LINE_CHARS: usize = 200;
/// Marks each line of a thinking block.
const THINKING_PREFIX: &str = "│ ";

/// Whether to colour the output (`--color`; by default a terminal, `NO_COLOR` unset, `TERM`
/// not `dumb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Colour {
    /// ANSI colours.
    On,
    /// Plain text.
    Off,
}

impl Colour {
    /// Colour for stdout as `--color` and the environment say ([`crate::colour`]).
    pub fn detect() -> Colour {
        if crate::colour::stdout_enabled() {
            Colour::On
        } else {
            Colour::Off
        }
    }
}

/// The role a line of output plays; the colour follows from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    /// Ordinary text.
    Plain,
    /// Secondary text (tool output, notes).
    Dim,
    /// A failure.
    Error,
    /// A line a diff adds.
    Added,
    /// A line a diff removes.
    Removed,
}

impl Tone {
    fn ansi(self) -> &'static str {
        match self {
            Tone::Plain => "",
            Tone::Dim => "\x1b[2m",
            Tone::Error => "\x1b[31m",
            Tone::Added => "\x1b[32m",
            Tone::Removed => "\x1b[31m",
        }
    }
}

/// One line of a result preview.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviewLine {
    /// How it is shown.
    pub tone: Tone,
    /// The text, already safe for a terminal.
    pub text: String,
}

impl PreviewLine {
    fn new(tone: Tone, text: &str) -> Self {
        PreviewLine {
            tone,
            text: clip(&terminal_safe(text), LINE_CHARS),
        }
    }
}

/// What the terminal shows last, to place blank lines and repeat a call's header.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Last {
    Nothing,
    /// Streamed text or thinking of block `index`.
    Block {
        index: usize,
        thinking: bool,
    },
    /// The header of the call with this id, with nothing after it yet.
    Header(String),
    /// A result preview.
    Result,
}

/// Renders agent events to a terminal (or any writer).
pub struct Renderer<W: Write> {
    out: W,
    colour: Colour,
    last: Last,
    /// Whether the cursor is at the start of a line.
    at_line_start: bool,
    /// Whether the current assistant message streamed any visible text.
    streamed_text: bool,
    /// Header line of each call seen in this run, by call id.
    headers: HashMap<String, String>,
}

impl<W: Write> Renderer<W> {
    /// A renderer writing to `out`.
    pub fn new(out: W, colour: Colour) -> Self {
        Renderer {
            out,
            colour,
            last: Last::Nothing,
            at_line_start: true,
            streamed_text: false,
            headers: HashMap::new(),
        }
    }

    /// The writer (tests read what was rendered).
    #[cfg(test)]
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Show one event. Write errors (a closed pipe) are ignored: the run goes on.
    pub fn render(&mut self, event: &AgentEvent) {
        match event {
            AgentEvent::MessageStart {
                message: Message::Assistant(_),
            } => {
                self.streamed_text = false;
            }
            AgentEvent::MessageUpdate {
                assistant_message_event,
                ..
            } => self.stream(assistant_message_event),
            AgentEvent::MessageEnd {
                message: Message::Assistant(message),
            } => self.end_assistant(message),
            AgentEvent::ToolExecutionStart {
                tool_call_id,
                tool_name,
                args,
            } => {
                let header = header_line(tool_name, args);
                self.headers.insert(tool_call_id.clone(), header.clone());
                // The calls of one batch are listed together.
                let tight = matches!(self.last, Last::Header(_));
                self.start_item(tight);
                self.header(&header);
                self.last = Last::Header(tool_call_id.clone());
            }
            AgentEvent::ToolExecutionEnd {
                tool_call_id,
                tool_name,
                result,
                is_error,
            } => {
                if self.last != Last::Header(tool_call_id.clone()) {
                    // Other output came in between (a parallel batch): name the call again.
                    let header = self
                        .headers
                        .get(tool_call_id)
                        .cloned()
                        .unwrap_or_else(|| header_line(tool_name, &Value::Null));
                    self.start_item(false);
                    self.header(&header);
                }
                for line in result_preview(tool_name, result, *is_error) {
                    if !line.text.is_empty() {
                        self.write_raw("  ", Tone::Plain);
                    }
                    self.line(&line.text, line.tone);
                }
                self.last = Last::Result;
            }
            AgentEvent::AgentStart
            | AgentEvent::AgentEnd { .. }
            | AgentEvent::TurnStart
            | AgentEvent::TurnEnd { .. }
            | AgentEvent::MessageStart { .. }
            | AgentEvent::MessageEnd { .. }
            | AgentEvent::ToolExecutionUpdate { .. } => {}
        }
        // The terminal view is best effort: a closed stdout does not stop the agent.
        let _ = self.out.flush();
    }

    fn stream(&mut self, event: &AssistantStreamEvent) {
        let (index, delta, thinking) = match event {
            AssistantStreamEvent::TextDelta {
                content_index,
                delta,
            } => (*content_index, delta, false),
            AssistantStreamEvent::ThinkingDelta {
                content_index,
                delta,
            } => (*content_index, delta, true),
            AssistantStreamEvent::ToolCallStart { .. }
            | AssistantStreamEvent::ToolCallDelta { .. } => return,
        };
        if delta.is_empty() {
            return;
        }
        let here = Last::Block { index, thinking };
        if self.last != here {
            self.start_item(false);
            self.last = here;
        }
        if thinking {
            self.write_thinking(delta);
        } else {
            self.streamed_text = true;
            self.write_raw(&terminal_safe(delta), Tone::Plain);
        }
    }

    fn end_assistant(&mut self, message: &AssistantMessage) {
        // A provider that did not stream still gets its text shown.
        let text = message.text();
        if !self.streamed_text && !text.is_empty() {
            self.start_item(false);
            self.write_raw(&terminal_safe(&text), Tone::Plain);
            self.last = Last::Block {
                index: usize::MAX,
                thinking: false,
            };
        }
        self.end_line();
    }

    /// Separate a new item (text block, call) from what came before by one blank line, unless
    /// `tight`.
    fn start_item(&mut self, tight: bool) {
        self.end_line();
        if !tight && self.last != Last::Nothing {
            self.put(b"\n");
        }
    }

    fn header(&mut self, header: &str) {
        match self.colour {
            Colour::On => {
                let (name, rest) = header.split_once("  ").unwrap_or((header, ""));
                self.put(format!("\x1b[36m●\x1b[0m \x1b[1m{name}\x1b[0m  {rest}\n").as_bytes());
            }
            Colour::Off => {
                self.put(format!("● {header}\n").as_bytes());
            }
        }
        self.at_line_start = true;
    }

    fn line(&mut self, text: &str, tone: Tone) {
        if text.is_empty() && self.at_line_start {
            self.put(b"\n");
            return;
        }
        self.write_raw(text, tone);
        self.end_line();
    }

    fn end_line(&mut self) {
        if !self.at_line_start {
            self.put(b"\n");
            self.at_line_start = true;
        }
    }

    fn write_thinking(&mut self, delta: &str) {
        let safe = terminal_safe(delta);
        for piece in safe.split_inclusive('\n') {
            if self.at_line_start {
                self.write_raw(THINKING_PREFIX, Tone::Dim);
            }
            self.write_raw(piece, Tone::Dim);
        }
    }

    /// Write to the terminal. A failed write (the terminal went away) has nowhere to be
    /// shown; the session goes on and its result still reaches the transcript and audit log.
    fn put(&mut self, bytes: &[u8]) {
        if let Err(error) = self.out.write_all(bytes) {
            tracing::debug!(%error, "run view: failed to write to the terminal");
        }
    }

    fn write_raw(&mut self, text: &str, tone: Tone) {
        if text.is_empty() {
            return;
        }
        let coloured = self.colour == Colour::On && tone != Tone::Plain;
        if coloured {
            self.put(tone.ansi().as_bytes());
        }
        self.put(text.as_bytes());
        if coloured {
            self.put(b"\x1b[0m");
        }
        self.at_line_start = text.ends_with('\n');
    }
}

/// `name  summary`: the one-line description of a call, from its raw arguments.
pub fn header_line(tool: &str, args: &Value) -> String {
    let summary = call_summary(tool, args);
    let name = terminal_safe(tool);
    if summary.is_empty() {
        name.into_owned()
    } else {
        format!("{name}  {summary}")
    }
}

/// The most telling argument(s) of a call, on one line.
pub fn call_summary(tool: &str, args: &Value) -> String {
    let field = |name: &str| args.get(name).and_then(Value::as_str);
    let number = |name: &str| args.get(name).and_then(Value::as_f64);
    let summary = match ToolKind::from_name(tool) {
        Some(ToolKind::Bash) => field("command").map(|command| {
            let mut lines = command.trim().lines();
            let first = lines.next().unwrap_or_default().to_owned();
            let more = lines.count();
            if more == 0 {
                first
            } else {
                format!("{first} … (+{more} lines)")
            }
        }),
        Some(ToolKind::Read) => field("path").map(|path| {
            let mut out = path.to_owned();
            match (number("offset"), number("limit")) {
                (Some(offset), Some(limit)) => {
                    out.push_str(&format!("  (from line {offset}, {limit} lines)"))
                }
                (Some(offset), None) => out.push_str(&format!("  (from line {offset})")),
                (None, Some(limit)) => out.push_str(&format!("  ({limit} lines)")),
                (None, None) => {}
            }
            out
        }),
        Some(ToolKind::Edit | ToolKind::Write) => field("path").map(str::to_owned),
        Some(ToolKind::Ls) => Some(field("path").unwrap_or(".").to_owned()),
        Some(ToolKind::Grep | ToolKind::Find) => field("pattern").map(|pattern| {
            let mut out = pattern.to_owned();
            if let Some(path) = field("path") {
                out.push_str(&format!("  in {path}"));
            }
            if let Some(glob) = field("glob") {
                out.push_str(&format!("  ({glob})"));
            }
            out
        }),
        None => None,
    };
    let summary = match summary {
        Some(summary) => summary,
        None => match args {
            Value::Null => String::new(),
            Value::Object(map) if map.is_empty() => String::new(),
            other => other.to_string(),
        },
    };
    clip(
        &terminal_safe(&summary.replace(['\n', '\r'], " ")),
        SUMMARY_CHARS,
    )
}

/// What is shown under a finished call.
pub fn result_preview(tool: &str, result: &AgentToolResult, is_error: bool) -> Vec<PreviewLine> {
    let text = result_text(result);
    let kind = ToolKind::from_name(tool);
    if is_error {
        let lines = if kind == Some(ToolKind::Bash) {
            tail(&text, PREVIEW_LINES)
        } else {
            head(&text, PREVIEW_LINES)
        };
        return lines
            .into_iter()
            .map(|(tone, line)| match tone {
                Tone::Plain => PreviewLine::new(Tone::Error, &line),
                other => PreviewLine::new(other, &line),
            })
            .collect();
    }
    let lines = match kind {
        Some(ToolKind::Edit) => match result
            .details
            .as_ref()
            .and_then(|details| details.get("diff"))
            .and_then(Value::as_str)
        {
            Some(diff) => head(diff, DIFF_LINES)
                .into_iter()
                .map(|(tone, line)| {
                    let tone = match (tone, line.chars().next()) {
                        (Tone::Plain, Some('+')) => Tone::Added,
                        (Tone::Plain, Some('-')) => Tone::Removed,
                        (Tone::Plain, _) => Tone::Dim,
                        (other, _) => other,
                    };
                    (tone, line)
                })
                .collect(),
            None => head(&text, PREVIEW_LINES),
        },
        Some(ToolKind::Bash) => tail(&text, PREVIEW_LINES),
        Some(ToolKind::Read) => vec![(Tone::Plain, read_summary(result, &text))],
        Some(ToolKind::Write | ToolKind::Grep | ToolKind::Find | ToolKind::Ls) | None => {
            head(&text, PREVIEW_LINES)
        }
    };
    lines
        .into_iter()
        .map(|(tone, line)| match tone {
            Tone::Plain => PreviewLine::new(Tone::Dim, &line),
            other => PreviewLine::new(other, &line),
        })
        .collect()
}

/// The result's text blocks, and a note per image.
fn result_text(result: &AgentToolResult) -> String {
    let mut out = String::new();
    for block in &result.content {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        match block {
            Content::Text { text } => out.push_str(text),
            Content::Image { mime_type, .. } => out.push_str(&format!("[image: {mime_type}]")),
        }
    }
    out
}

/// `42 lines` for a text read (`, truncated` when cut), the image note for an image.
fn read_summary(result: &AgentToolResult, text: &str) -> String {
    if let Some(mime) = result.content.iter().find_map(|block| match block {
        Content::Image { mime_type, .. } => Some(mime_type.as_str()),
        Content::Text { .. } => None,
    }) {
        return format!("image ({mime})");
    }
    let truncation = result
        .details
        .as_ref()
        .and_then(|details| details.get("truncation"));
    match truncation {
        Some(truncation) => {
            let shown = truncation.get("outputLines").and_then(Value::as_u64);
            let total = truncation.get("totalLines").and_then(Value::as_u64);
            match (shown, total) {
                (Some(shown), Some(total)) => format!("{shown} of {total} lines (truncated)"),
                _ => format!("{} lines (truncated)", text.lines().count()),
            }
        }
        None => {
            let lines = text.lines().count();
            if lines == 1 {
                "1 line".to_owned()
            } else {
                format!("{lines} lines")
            }
        }
    }
}

/// The first `count` lines, with a note of how many follow.
fn head(text: &str, count: usize) -> Vec<(Tone, String)> {
    let lines: Vec<&str> = text.trim_end_matches('\n').lines().collect();
    let mut out: Vec<(Tone, String)> = lines
        .iter()
        .take(count)
        .map(|line| (Tone::Plain, (*line).to_owned()))
        .collect();
    if lines.len() > count {
        out.push((Tone::Dim, format!("… {} more lines", lines.len() - count)));
    }
    out
}

/// The last `count` lines, with a note of how many came before.
fn tail(text: &str, count: usize) -> Vec<(Tone, String)> {
    let lines: Vec<&str> = text.trim_end_matches('\n').lines().collect();
    let skip = lines.len().saturating_sub(count);
    let mut out = Vec::new();
    if skip > 0 {
        out.push((Tone::Dim, format!("… {skip} earlier lines")));
    }
    out.extend(
        lines
            .iter()
            .skip(skip)
            .map(|line| (Tone::Plain, (*line).to_owned())),
    );
    out
}

/// At most `max` characters, with `…` when cut.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// `text` without anything a terminal would interpret: C0 controls other than newline and
/// tab, DEL and C1 controls are dropped, so neither the model nor a tool can move the cursor,
/// retitle the window or rewrite earlier lines.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    let unsafe_char =
        |c: char| (c.is_control() && c != '\n' && c != '\t') || ('\u{80}'..='\u{9f}').contains(&c);
    if text.chars().any(unsafe_char) {
        Cow::Owned(text.chars().filter(|&c| !unsafe_char(c)).collect())
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use cordon_core::protocol::{AssistantContent, StopReason};
    use serde_json::json;

    use super::*;

    fn render_all(events: &[AgentEvent], colour: Colour) -> String {
        let mut renderer = Renderer::new(Vec::new(), colour);
        for event in events {
            renderer.render(event);
        }
        String::from_utf8(renderer.into_inner()).unwrap()
    }

    fn text_delta(index: usize, delta: &str) -> AgentEvent {
        AgentEvent::MessageUpdate {
            message: Message::Assistant(AssistantMessage::default()),
            assistant_message_event: AssistantStreamEvent::TextDelta {
                content_index: index,
                delta: delta.into(),
            },
        }
    }

    fn thinking_delta(index: usize, delta: &str) -> AgentEvent {
        AgentEvent::MessageUpdate {
            message: Message::Assistant(AssistantMessage::default()),
            assistant_message_event: AssistantStreamEvent::ThinkingDelta {
                content_index: index,
                delta: delta.into(),
            },
        }
    }

    fn assistant(content: Vec<AssistantContent>) -> Message {
        Message::Assistant(AssistantMessage {
            content,
            stop_reason: StopReason::ToolUse,
            ..AssistantMessage::default()
        })
    }

    fn start(id: &str, name: &str, args: Value) -> AgentEvent {
        AgentEvent::ToolExecutionStart {
            tool_call_id: id.into(),
            tool_name: name.into(),
            args,
        }
    }

    fn end(id: &str, name: &str, result: AgentToolResult) -> AgentEvent {
        let is_error = result.is_error;
        AgentEvent::ToolExecutionEnd {
            tool_call_id: id.into(),
            tool_name: name.into(),
            result,
            is_error,
        }
    }

    #[test]
    fn streams_text_then_calls_with_previews() {
        let diff = "-1 hello\n+1 bye\n 2 same";
        let events = vec![
            AgentEvent::MessageStart {
                message: assistant(Vec::new()),
            },
            thinking_delta(0, "Plan:\nedit it"),
            text_delta(1, "I'll edit"),
            text_delta(1, " the file."),
            AgentEvent::MessageEnd {
                message: assistant(vec![AssistantContent::Text {
                    text: "I'll edit the file.".into(),
                }]),
            },
            start("c1", "edit", json!({"path": "src/lib.rs", "edits": []})),
            start("c2", "bash", json!({"command": "cargo test\necho done"})),
            end(
                "c1",
                "edit",
                AgentToolResult::text("Successfully replaced 1 block(s) in src/lib.rs.")
                    .with_details(json!({"diff": diff})),
            ),
            end(
                "c2",
                "bash",
                AgentToolResult::error("boom\n\nCommand exited with code 101"),
            ),
            AgentEvent::MessageStart {
                message: assistant(Vec::new()),
            },
            text_delta(0, "Done."),
            AgentEvent::MessageEnd {
                message: assistant(Vec::new()),
            },
        ];
        assert_eq!(
            render_all(&events, Colour::Off),
            "│ Plan:\n\
             │ edit it\n\
             \n\
             I'll edit the file.\n\
             \n\
             ● edit  src/lib.rs\n\
             ● bash  cargo test … (+1 lines)\n\
             \n\
             ● edit  src/lib.rs\n  \
             -1 hello\n  \
             +1 bye\n   \
             2 same\n\
             \n\
             ● bash  cargo test … (+1 lines)\n  \
             boom\n\
             \n  \
             Command exited with code 101\n\
             \n\
             Done.\n"
        );
    }

    #[test]
    fn a_call_ending_right_after_its_header_is_not_named_twice() {
        let events = vec![
            start("c1", "write", json!({"path": "notes.md", "content": "x"})),
            end(
                "c1",
                "write",
                AgentToolResult::text("Successfully wrote 1 bytes to notes.md"),
            ),
        ];
        assert_eq!(
            render_all(&events, Colour::Off),
            "● write  notes.md\n  Successfully wrote 1 bytes to notes.md\n"
        );
    }

    #[test]
    fn colours_diff_lines_errors_and_headers() {
        let events = vec![
            start("c1", "edit", json!({"path": "a"})),
            end(
                "c1",
                "edit",
                AgentToolResult::text("ok").with_details(json!({"diff": "-1 a\n+1 b"})),
            ),
            start("c2", "read", json!({"path": "nope"})),
            end("c2", "read", AgentToolResult::error("ENOENT")),
        ];
        assert_eq!(
            render_all(&events, Colour::On),
            "\x1b[36m●\x1b[0m \x1b[1medit\x1b[0m  a\n  \
             \x1b[31m-1 a\x1b[0m\n  \
             \x1b[32m+1 b\x1b[0m\n\
             \n\
             \x1b[36m●\x1b[0m \x1b[1mread\x1b[0m  nope\n  \
             \x1b[31mENOENT\x1b[0m\n"
        );
    }

    #[test]
    fn text_that_was_not_streamed_is_printed_at_message_end() {
        let events = vec![AgentEvent::MessageEnd {
            message: assistant(vec![AssistantContent::Text {
                text: "whole answer".into(),
            }]),
        }];
        assert_eq!(render_all(&events, Colour::Off), "whole answer\n");
    }

    #[test]
    fn escape_sequences_from_the_model_and_tools_never_reach_the_terminal() {
        let events = vec![
            text_delta(0, "hi\x1b]0;pwned\x07 there\r\n"),
            start("c1", "bash", json!({"command": "echo \x1b[2J"})),
            end("c1", "bash", AgentToolResult::text("out\u{9b}31m")),
        ];
        let shown = render_all(&events, Colour::Off);
        assert_eq!(shown, "hi]0;pwned there\n\n● bash  echo [2J\n  out31m\n");
    }

    #[test]
    fn summaries_name_the_telling_argument() {
        assert_eq!(
            call_summary("bash", &json!({"command": "ls -la"})),
            "ls -la"
        );
        assert_eq!(
            call_summary("read", &json!({"path": "a.rs", "offset": 10, "limit": 5})),
            "a.rs  (from line 10, 5 lines)"
        );
        assert_eq!(call_summary("ls", &json!({})), ".");
        assert_eq!(
            call_summary(
                "grep",
                &json!({"pattern": "TODO", "path": "src", "glob": "*.rs"})
            ),
            "TODO  in src  (*.rs)"
        );
        assert_eq!(
            call_summary("find", &json!({"pattern": "*.toml"})),
            "*.toml"
        );
        assert_eq!(
            call_summary("custom", &json!({"x": 1})),
            "{\"x\":1}",
            "unknown tools show their arguments"
        );
        // Arguments that did not parse stay the raw string the model sent.
        assert_eq!(
            call_summary("write", &json!("{\"path\": \"a")),
            "\"{\\\"path\\\": \\\"a\""
        );
        let long = "x".repeat(300);
        assert_eq!(
            call_summary("bash", &json!({ "command": long }))
                .chars()
                .count(),
            SUMMARY_CHARS + 1
        );
    }

    #[test]
    fn bash_shows_the_tail_and_read_a_line_count() {
        let output: String = (1..=25).map(|n| format!("line {n}\n")).collect();
        let preview = result_preview("bash", &AgentToolResult::text(output), false);
        assert_eq!(preview.len(), PREVIEW_LINES + 1);
        assert_eq!(
            preview[0],
            PreviewLine::new(Tone::Dim, "… 15 earlier lines")
        );
        assert_eq!(preview[10], PreviewLine::new(Tone::Dim, "line 25"));

        let read = AgentToolResult::text("a\nb\nc");
        assert_eq!(
            result_preview("read", &read, false),
            vec![PreviewLine::new(Tone::Dim, "3 lines")]
        );
        let truncated = AgentToolResult::text("…")
            .with_details(json!({"truncation": {"outputLines": 2000, "totalLines": 5000}}));
        assert_eq!(
            result_preview("read", &truncated, false),
            vec![PreviewLine::new(
                Tone::Dim,
                "2000 of 5000 lines (truncated)"
            )]
        );
        let image = AgentToolResult {
            content: vec![
                Content::text("Read image file [image/png]"),
                Content::Image {
                    data: "AAAA".into(),
                    mime_type: "image/png".into(),
                },
            ],
            ..AgentToolResult::default()
        };
        assert_eq!(
            result_preview("read", &image, false),
            vec![PreviewLine::new(Tone::Dim, "image (image/png)")]
        );
    }

    #[test]
    fn long_errors_show_their_head() {
        let error: String = (1..=30).map(|n| format!("problem {n}\n")).collect();
        let preview = result_preview("edit", &AgentToolResult::error(error), true);
        assert_eq!(preview[0], PreviewLine::new(Tone::Error, "problem 1"));
        assert_eq!(preview[10], PreviewLine::new(Tone::Dim, "… 20 more lines"));
    }
}
