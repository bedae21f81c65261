//! Asking a person about `Ask` decisions. Only interactive front ends provide an [`Approver`];
//! everywhere else `Ask` is a denial whose reason says approval was needed.

use async_trait::async_trait;
use serde_json::Value;

/// What a front end is asked to approve.
#[derive(Clone, Debug)]
pub struct ApprovalRequest {
    /// Tool name.
    pub tool: String,
    /// Arguments the tool would run with.
    pub args: Value,
    /// The rule that asked (`FILE:LINE`).
    pub rule: String,
    /// The rule's reason.
    pub reason: String,
}

/// A person's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Approval {
    /// Run this call.
    Yes,
    /// Do not run it.
    No,
    /// Run it, and every later call the same rule asks about in this session.
    Always,
}

/// Something that can ask a person (a terminal prompt, an MCP elicitation, …).
#[async_trait]
pub trait Approver: Send + Sync {
    /// Ask; an error or a closed prompt counts as `No`.
    async fn approve(&self, request: ApprovalRequest) -> Approval;
}
