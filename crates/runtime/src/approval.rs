//! Asking a person about `Ask` decisions. Only interactive front ends provide an [`Approver`];
//! everywhere else `Ask` is a denial whose reason says approval was needed.

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
