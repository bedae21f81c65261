//! Printing results and errors.

use std::io::Write;

use cordon_core::protocol::{Content, ToolResult};

/// An error chain as one line: `outer: cause: root cause`.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

/// The text a person reads for a result: text blocks as they are, images as a one-line note.
pub fn result_text(result: &ToolResult) -> String {
    let mut out = String::new();
    for block in &result.content {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        match block {
            Content::Text { text } => out.push_str(text),
            Content::Image { data, mime_type } => {
                out.push_str(&format!(
                    "[image: {mime_type}, {} bytes of base64]",
                    data.len()
                ));
            }
        }
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Write one JSON value as a line to stdout and flush it (events must not sit in a buffer).
pub fn print_json_line(value: &impl serde::Serialize) {
    let mut line = serde_json::to_vec(value).expect("protocol values always serialise");
    line.push(b'\n');
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (`cordon replay | head`) must not panic; the run goes on.
    // stdout closed (a pipe to `head`): the exit code still tells the outcome.
    let _ = stdout.write_all(&line).and_then(|()| stdout.flush());
}
