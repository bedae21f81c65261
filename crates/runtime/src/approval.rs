//! Asking a person about `Ask` decisions. Only interactive front ends provide an [`Approver`];
//! everywhere else `Ask` is a denial whose reason says approval was needed. The egress proxy's
//! questions about `[network] ask` destinations go to the same approver ([`NetworkApprover`]).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cordon_egress::ask::{AskAnswer, AskRequest, EgressApprover};
use cordon_egress::rules::{Host, special_range};
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

    /// How long this approver waits for a person before it gives up by itself, when it bounds
    /// the wait (an MCP client's `--approval-timeout`); `None` when it does not. The egress
    /// proxy then waits for its answer that long (and a little longer), not its own default.
    fn answer_within(&self) -> Option<Duration> {
        None
    }
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

/// The tool name of a question about a network destination (an `[network] ask` entry matched
/// a connection a command made); its arguments are `{"destination": "host:port"}`.
pub const NETWORK_QUESTION: &str = "network";

/// Puts the egress proxy's questions to the session's [`Approver`]: `Yes` allows the one
/// connection, `Always` the exact destination for the rest of the session, anything else
/// refuses (`Unavailable` as nobody to ask). The destination is a normalised name or address; it is escaped again by the
/// front ends like any question field.
pub(crate) struct NetworkApprover {
    pub(crate) approver: Arc<dyn Approver>,
}

#[async_trait]
impl EgressApprover for NetworkApprover {
    async fn ask(&self, request: AskRequest) -> AskAnswer {
        let AskRequest {
            session,
            call,
            host,
            port,
            entry,
        } = request;
        let destination = format!("{host}:{port}");
        // An approved address is let through even where a name may never resolve to (an IP
        // or CIDR ask entry names it): the person is told what kind of address it is.
        let special = match &host {
            Host::Ip(ip) => special_range(*ip)
                .map(|range| format!(" ({host} is {range}: approving lets the command reach it)")),
            Host::Name(_) => None,
        }
        .unwrap_or_default();
        // The call whose command opened the connection, when the backend knows it: front ends
        // that route questions by call (MCP) ask that call's client. Without one they find no
        // client and answer `Unavailable`, a refusal.
        let call_id = call.map_or_else(
            || format!("{NETWORK_QUESTION} {destination}"),
            |call| call.to_string(),
        );
        let answer = self
            .approver
            .approve(ApprovalRequest {
                call_id,
                tool: NETWORK_QUESTION.to_owned(),
                args: serde_json::json!({ "destination": destination }),
                rule: entry.source.to_string(),
                reason: format!(
                    "a command connects to {destination}, which ask entry {:?} matches{special}; \
                     always allows {destination} (not the whole entry) for the rest of the \
                     session",
                    &*entry.entry
                ),
            })
            .await;
        tracing::info!(%session, %destination, ?answer, "network destination approval answered");
        match answer {
            Approval::Yes => AskAnswer::Once,
            Approval::Always => AskAnswer::Session,
            Approval::No => AskAnswer::Deny,
            // No answer within the approver's own bound, a dismissed question, a reply that
            // could not be read: recorded as no answer, not as the person's refusal.
            Approval::Unanswered(_) => AskAnswer::NoAnswer,
            Approval::Unavailable => AskAnswer::Unavailable,
        }
    }

    fn answer_within(&self) -> Option<Duration> {
        self.approver.answer_within()
    }
}

#[cfg(test)]
mod network_tests {
    use std::sync::Mutex;

    use cordon_egress::rules::{Host, Matched};

    use super::*;

    struct Answers {
        answer: Approval,
        asked: Mutex<Vec<ApprovalRequest>>,
    }

    #[async_trait]
    impl Approver for Answers {
        async fn approve(&self, request: ApprovalRequest) -> Approval {
            self.asked.lock().expect("asked").push(request);
            self.answer.clone()
        }
    }

    async fn ask(answer: Approval) -> (AskAnswer, Vec<ApprovalRequest>) {
        ask_for(answer, None).await
    }

    async fn ask_for(
        answer: Approval,
        call: Option<Arc<str>>,
    ) -> (AskAnswer, Vec<ApprovalRequest>) {
        let answers = Arc::new(Answers {
            answer,
            asked: Mutex::new(Vec::new()),
        });
        let network = NetworkApprover {
            approver: answers.clone(),
        };
        let answer = network
            .ask(AskRequest {
                session: "s".into(),
                call,
                host: Host::parse("api.github.com").expect("host"),
                port: 443,
                entry: Matched {
                    entry: "*.github.com".into(),
                    source: "policy.toml:7".into(),
                },
            })
            .await;
        let asked = answers.asked.lock().expect("asked").clone();
        (answer, asked)
    }

    #[tokio::test]
    async fn yes_is_once_always_is_the_session_no_answer_is_none_anything_else_refuses() {
        assert_eq!(ask(Approval::Yes).await.0, AskAnswer::Once);
        assert_eq!(ask(Approval::Always).await.0, AskAnswer::Session);
        assert_eq!(ask(Approval::No).await.0, AskAnswer::Deny);
        assert_eq!(ask(Approval::Unavailable).await.0, AskAnswer::Unavailable);
        assert_eq!(
            ask(Approval::Unanswered("no answer".into())).await.0,
            AskAnswer::NoAnswer
        );
    }

    #[tokio::test]
    async fn the_question_names_the_destination_and_the_ask_entry() {
        let (_, asked) = ask(Approval::No).await;
        let [request] = asked.as_slice() else {
            panic!("one question expected: {asked:?}");
        };
        assert_eq!(
            (
                request.call_id.as_str(),
                request.tool.as_str(),
                &request.args,
                request.rule.as_str(),
                request.reason.as_str()
            ),
            (
                "network api.github.com:443",
                NETWORK_QUESTION,
                &serde_json::json!({"destination": "api.github.com:443"}),
                "policy.toml:7",
                "a command connects to api.github.com:443, which ask entry \"*.github.com\" \
                 matches; always allows api.github.com:443 (not the whole entry) for the rest \
                 of the session"
            )
        );
    }

    struct Bounded;

    #[async_trait]
    impl Approver for Bounded {
        async fn approve(&self, _request: ApprovalRequest) -> Approval {
            Approval::No
        }

        fn answer_within(&self) -> Option<Duration> {
            Some(Duration::from_secs(600))
        }
    }

    #[test]
    fn the_proxy_learns_how_long_the_approver_waits() {
        let bounded = NetworkApprover {
            approver: Arc::new(Bounded),
        };
        assert_eq!(bounded.answer_within(), Some(Duration::from_secs(600)));
        let unbounded = NetworkApprover {
            approver: Arc::new(Answers {
                answer: Approval::No,
                asked: Mutex::new(Vec::new()),
            }),
        };
        assert_eq!(unbounded.answer_within(), None);
    }

    #[tokio::test]
    async fn a_question_about_a_special_address_says_what_it_is() {
        let answers = Arc::new(Answers {
            answer: Approval::No,
            asked: Mutex::new(Vec::new()),
        });
        let network = NetworkApprover {
            approver: answers.clone(),
        };
        for (host, kind) in [
            (
                "169.254.169.254",
                Some("a link-local address (cloud metadata lives here)"),
            ),
            ("127.0.0.1", Some("a loopback address")),
            ("::1", Some("a loopback address")),
            ("203.0.113.7", None),
            ("api.github.com", None),
        ] {
            let host = Host::parse(host).expect("host");
            network
                .ask(AskRequest {
                    session: "s".into(),
                    call: None,
                    host: host.clone(),
                    port: 80,
                    entry: Matched {
                        entry: "0.0.0.0/0".into(),
                        source: "policy.toml:7".into(),
                    },
                })
                .await;
            let reason = answers
                .asked
                .lock()
                .expect("asked")
                .pop()
                .expect("asked")
                .reason;
            let said = format!(
                " ({host} is {}: approving lets the command reach it)",
                kind.unwrap_or("")
            );
            assert_eq!(reason.contains(&said), kind.is_some(), "{reason}");
        }
    }

    #[tokio::test]
    async fn a_question_about_a_calls_connection_is_routed_by_that_call() {
        let (_, asked) = ask_for(Approval::No, Some("mcp-3".into())).await;
        let ids: Vec<&str> = asked.iter().map(|r| r.call_id.as_str()).collect();
        assert_eq!(ids, ["mcp-3"]);
    }
}
