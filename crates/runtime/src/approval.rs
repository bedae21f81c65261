//! Asking a person about `Ask` decisions. Only interactive front ends provide an [`Approver`];
//! everywhere else `Ask` is a denial whose reason says approval was needed.

use std::fmt::Write as _;

use async_trait::async_trait;
use serde_json::Value;

/// What a front end is asked to approve.
#[derive(Clone, Debug)]
pub struct ApprovalRequest {
    /// The call's id: front ends serving several clients at once (MCP) route the question to
    /// the client that made the call by it.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// Arguments the tool would run with.
    pub args: Value,
    /// The rules that asked (`FILE:LINE`, comma-separated when several did; "always" approves
    /// each of them).
    pub rule: String,
    /// The rule's reason.
    pub reason: String,
}

/// A person's answer, or why there is none. Everything but `Yes` and `Always` is a denial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Approval {
    /// Run this call.
    Yes,
    /// Do not run it.
    No,
    /// Run it, and every later call the same rule asks about in this session.
    Always,
    /// Nobody can be asked about this call (e.g. an MCP client that cannot show questions):
    /// the same denial as in a session without an approver.
    Unavailable,
    /// A person was asked but no usable answer came back; the text says what happened (no
    /// answer in time, the question was dismissed, a malformed reply, a broken connection).
    Unanswered(String),
}

/// Something that can ask a person (a terminal prompt, an MCP elicitation, …).
#[async_trait]
pub trait Approver: Send + Sync {
    /// Ask; an error or a closed prompt is a denial (`No`, `Unanswered`).
    async fn approve(&self, request: ApprovalRequest) -> Approval;
}

/// `text` with control, line-breaking, direction-changing and invisible characters (format
/// characters, fillers that render as blank, variation selectors, tag characters) written as
/// `\uXXXX`, so a question to a person shows exactly one line per field whatever the model sent and two
/// calls that differ only in what cannot be seen do not look the same.
pub fn escape_for_question(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        let invisible = matches!(
            ch,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'..='\u{1160}'
                | '\u{17B4}'..='\u{17B5}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0000}'..='\u{E007F}'
                | '\u{E0100}'..='\u{E01EF}'
        );
        if ch.is_control() || invisible {
            let mut units = [0u16; 2];
            for unit in ch.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(ch);
        }
    }
    out
}
