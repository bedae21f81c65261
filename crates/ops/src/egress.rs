//! Filtered network mode as the backends and the tools see it: the proxy's rules built from a
//! [`SandboxSpec`] (each entry labelled with its `FILE:LINE`), and one connection attempt a
//! command made through the egress proxy as plain data ([`EgressRecord`]), which the bash
//! result's note, the audit log and the MCP result are built from. It does not run the proxy
//! (a backend does) nor decide anything (the proxy's rules do).

use std::net::SocketAddr;
use std::sync::Arc;

use cordon_core::sandbox::SandboxSpec;
use cordon_egress::ask::Asked;
use cordon_egress::proxy::{ConnectionEvent, Outcome, Protocol};
use cordon_egress::rules::{EntrySpec, Rules, RulesError};
use serde::{Deserialize, Serialize};

/// The `[network] allow`, `deny` and `ask` entries of a spec, each with its `FILE:LINE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressEntrySpecs {
    /// `[network] allow`
    pub allow: Vec<EntrySpec>,
    /// `[network] deny`
    pub deny: Vec<EntrySpec>,
    /// `[network] ask`
    pub ask: Vec<EntrySpec>,
}

/// The `[network] allow`, `deny` and `ask` entries of `spec`, each with the `FILE:LINE` it
/// was written at (the label the proxy's refusals and events name).
pub fn egress_entry_specs(spec: &SandboxSpec) -> EgressEntrySpecs {
    let sources = &spec.sources;
    let label = |lines: &[usize], index: usize| -> Arc<str> {
        sources.at(lines.get(index).copied().unwrap_or(0)).into()
    };
    let list = |entries: &[String], lines: &[usize]| {
        entries
            .iter()
            .enumerate()
            .map(|(index, text)| EntrySpec::new(text.clone(), label(lines, index)))
            .collect()
    };
    EgressEntrySpecs {
        allow: list(&spec.egress.allow, &sources.egress_allow),
        deny: list(&spec.egress.deny, &sources.egress_deny),
        ask: list(&spec.egress.ask, &sources.egress_ask),
    }
}

/// The egress proxy's compiled rules for `spec` (a policy-compiled spec always compiles: the
/// policy checked every entry with the same parser).
pub fn egress_rules(spec: &SandboxSpec) -> Result<Rules, RulesError> {
    let EgressEntrySpecs { allow, deny, ask } = egress_entry_specs(spec);
    Rules::compile(&allow, &deny)?.with_ask(&ask)
}

/// How the command asked the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EgressProtocol {
    /// HTTP `CONNECT host:port` (HTTPS and other tunnels).
    HttpConnect,
    /// A plain-HTTP request forwarded by the proxy.
    HttpForward,
    /// SOCKS5 `CONNECT`.
    Socks5,
    /// The request could not be read far enough to tell.
    Unknown,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EgressOutcome {
    /// Allowed by an entry and connected; bytes were relayed.
    Allowed,
    /// Refused by the network policy: a deny entry, no allow entry, or a resolved address a
    /// name entry alone does not allow.
    Denied,
    /// Nothing was decided or connected: a malformed request, a name that did not resolve, a
    /// destination that did not answer, too many connections.
    Failed,
}

/// How a destination an ask entry (`[network] ask`) matched was settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EgressAsked {
    /// A person approved this connection.
    Once,
    /// A person approved the destination for the rest of the session.
    Session,
    /// An approval for the session given earlier covered it; nobody was asked.
    Remembered,
    /// The person asked did not approve it (said no, dismissed the question).
    Refused,
    /// Nobody answered in time.
    TimedOut,
    /// Nobody could be asked (no interactive front end).
    NoApprover,
    /// Not asked again: the person refused this destination, or too many destinations,
    /// earlier in the same call.
    Withheld,
}

/// One connection attempt of a command through the egress proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressRecord {
    /// How the command asked.
    pub protocol: EgressProtocol,
    /// The destination host as requested (normalised; empty when none was read).
    pub host: String,
    /// The destination port (0 when none was read).
    pub port: u16,
    /// The address connected to, or the resolved address that was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<SocketAddr>,
    /// How it ended.
    pub outcome: EgressOutcome,
    /// The entry that decided, as written (`*.crates.io`), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// Where that entry is written (`FILE:LINE`), if one decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// For a destination no entry allows: the `[network] allow` entry that would.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<String>,
    /// For a destination an ask entry matched: whether a person was asked and the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<EgressAsked>,
    /// Why, in words (what a refused command was also told).
    pub reason: String,
    /// Bytes relayed from the command to the destination.
    pub bytes_up: u64,
    /// Bytes relayed from the destination to the command.
    pub bytes_down: u64,
    /// From the proxy accepting the connection to closing it, in milliseconds.
    pub duration_ms: u64,
}

impl EgressRecord {
    /// Whether the network policy refused it (the attempts a command is told about).
    pub fn is_denied(&self) -> bool {
        match self.outcome {
            EgressOutcome::Denied => true,
            EgressOutcome::Allowed | EgressOutcome::Failed => false,
        }
    }

    /// `host:port`, with an IPv6 literal in brackets (the proxy already writes it so).
    pub fn destination(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl From<&ConnectionEvent> for EgressRecord {
    fn from(event: &ConnectionEvent) -> Self {
        let ConnectionEvent {
            session: _,
            protocol,
            host,
            port,
            address,
            outcome,
            source,
            asked,
            reason,
            suggestion,
            bytes_up,
            bytes_down,
            duration,
        } = event;
        EgressRecord {
            protocol: match protocol {
                Protocol::HttpConnect => EgressProtocol::HttpConnect,
                Protocol::HttpForward => EgressProtocol::HttpForward,
                Protocol::Socks5 => EgressProtocol::Socks5,
                Protocol::Unknown => EgressProtocol::Unknown,
            },
            host: host.clone(),
            port: *port,
            address: *address,
            outcome: match outcome {
                Outcome::Allowed => EgressOutcome::Allowed,
                Outcome::Denied => EgressOutcome::Denied,
                Outcome::Failed => EgressOutcome::Failed,
            },
            entry: source.as_ref().map(|m| m.entry.to_string()),
            source: source.as_ref().map(|m| m.source.to_string()),
            suggestion: suggestion.clone(),
            asked: asked.map(|asked| match asked {
                Asked::Once => EgressAsked::Once,
                Asked::Session => EgressAsked::Session,
                Asked::Remembered => EgressAsked::Remembered,
                Asked::Refused => EgressAsked::Refused,
                Asked::TimedOut => EgressAsked::TimedOut,
                Asked::NoApprover => EgressAsked::NoApprover,
                Asked::Withheld => EgressAsked::Withheld,
            }),
            reason: reason.clone(),
            bytes_up: *bytes_up,
            bytes_down: *bytes_down,
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// A command's attempts, at most a given number, in the order they ended. When more arrive
/// than it holds it keeps each destination's first attempt (allowed before refused before
/// failed) before any repeat, and earlier before later among equals: a command flooding the
/// proxy with garbage, or with one allowed destination, cannot push another destination it
/// reached (or tried) out of the record. Only a flood of distinct destinations fills it.
#[derive(Debug)]
pub struct EgressLog {
    max: usize,
    /// `(rank, arrival, record)`; a lower rank is kept first.
    kept: Vec<(u8, u64, EgressRecord)>,
    /// Destinations seen so far, at most [`EgressLog::MAX_SEEN`].
    seen: std::collections::HashSet<(String, u16, u8)>,
    arrived: u64,
    omitted: u64,
}

impl EgressLog {
    /// Most distinct destinations remembered to tell a first attempt from a repeat; beyond,
    /// an attempt to a destination not remembered counts as a first one.
    pub const MAX_SEEN: usize = 8192;

    /// An empty log keeping at most `max` records.
    pub fn new(max: usize) -> Self {
        EgressLog {
            max,
            kept: Vec::new(),
            seen: std::collections::HashSet::new(),
            arrived: 0,
            omitted: 0,
        }
    }

    /// Adds one attempt (possibly in place of a kept one that matters less).
    pub fn push(&mut self, record: EgressRecord) {
        let outcome: u8 = match record.outcome {
            EgressOutcome::Allowed => 0,
            EgressOutcome::Denied => 1,
            EgressOutcome::Failed => 2,
        };
        let key = (record.host.clone(), record.port, outcome);
        let first = if self.seen.contains(&key) {
            false
        } else {
            if self.seen.len() < Self::MAX_SEEN {
                self.seen.insert(key);
            }
            true
        };
        let rank = if first { outcome } else { 3 + outcome };
        let arrival = self.arrived;
        self.arrived += 1;
        if self.kept.len() < self.max {
            self.kept.push((rank, arrival, record));
            return;
        }
        self.omitted += 1;
        // The kept record that matters least: the highest rank, the latest among those.
        let worst = self
            .kept
            .iter()
            .enumerate()
            .max_by_key(|(_, (rank, arrival, _))| (*rank, *arrival))
            .map(|(index, (rank, _, _))| (index, *rank));
        if let Some((index, worst_rank)) = worst
            && worst_rank > rank
        {
            self.kept.remove(index);
            self.kept.push((rank, arrival, record));
        }
    }

    /// How many attempts were left out.
    pub fn omitted(&self) -> u64 {
        self.omitted
    }

    /// The kept records in the order they ended.
    pub fn into_records(self) -> Vec<EgressRecord> {
        let mut kept = self.kept;
        kept.sort_by_key(|(_, arrival, _)| *arrival);
        kept.into_iter().map(|(_, _, record)| record).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cordon_egress::rules::Matched;

    use super::*;

    fn event() -> ConnectionEvent {
        ConnectionEvent {
            session: Arc::from("s1"),
            protocol: Protocol::HttpConnect,
            host: "static.crates.io".to_owned(),
            port: 443,
            address: Some("203.0.113.7:443".parse().expect("address")),
            outcome: Outcome::Allowed,
            source: Some(Matched {
                entry: Arc::from("*.crates.io"),
                source: Arc::from("policy.toml:7"),
            }),
            asked: None,
            reason: "relayed until both sides closed".to_owned(),
            suggestion: None,
            bytes_up: 517,
            bytes_down: 40_960,
            duration: Duration::from_micros(12_345),
        }
    }

    fn attempt(host: &str, outcome: EgressOutcome) -> EgressRecord {
        EgressRecord {
            host: host.to_owned(),
            outcome,
            ..EgressRecord::from(&event())
        }
    }

    #[test]
    fn a_full_log_keeps_each_destination_before_repeats() {
        use EgressOutcome::{Allowed, Denied, Failed};
        let mut log = EgressLog::new(4);
        for _ in 0..3 {
            log.push(attempt("", Failed));
        }
        log.push(attempt("a.test", Allowed));
        log.push(attempt("a.test", Allowed));
        log.push(attempt("b.test", Denied));
        log.push(attempt("c.test", Allowed));
        log.push(attempt("a.test", Allowed));
        log.push(attempt("d.test", Failed));
        assert_eq!(log.omitted(), 5);
        let kept: Vec<(String, EgressOutcome)> = log
            .into_records()
            .into_iter()
            .map(|record| (record.host, record.outcome))
            .collect();
        assert_eq!(
            kept,
            vec![
                (String::new(), Failed),
                ("a.test".to_owned(), Allowed),
                ("b.test".to_owned(), Denied),
                ("c.test".to_owned(), Allowed),
            ]
        );

        // Under the bound, everything in order.
        let mut log = EgressLog::new(4);
        log.push(attempt("a.test", Allowed));
        log.push(attempt("a.test", Allowed));
        assert_eq!(log.omitted(), 0);
        assert_eq!(log.into_records().len(), 2);
    }

    #[test]
    fn an_event_becomes_a_record() {
        assert_eq!(
            EgressRecord::from(&event()),
            EgressRecord {
                protocol: EgressProtocol::HttpConnect,
                host: "static.crates.io".to_owned(),
                port: 443,
                address: Some("203.0.113.7:443".parse().expect("address")),
                outcome: EgressOutcome::Allowed,
                entry: Some("*.crates.io".to_owned()),
                source: Some("policy.toml:7".to_owned()),
                suggestion: None,
                asked: None,
                reason: "relayed until both sides closed".to_owned(),
                bytes_up: 517,
                bytes_down: 40_960,
                duration_ms: 12,
            }
        );
    }

    #[test]
    fn a_refusal_keeps_the_suggestion_and_serialises_without_empty_fields() {
        let refused = ConnectionEvent {
            protocol: Protocol::Socks5,
            host: "evil.test".to_owned(),
            port: 22,
            address: None,
            outcome: Outcome::Denied,
            source: None,
            reason: "no entry allows evil.test:22".to_owned(),
            suggestion: Some("evil.test:22".to_owned()),
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::from_millis(3),
            ..event()
        };
        let record = EgressRecord::from(&refused);
        assert!(record.is_denied());
        assert_eq!(record.destination(), "evil.test:22");
        let json = serde_json::to_value(&record).expect("serialise");
        assert_eq!(
            json,
            serde_json::json!({
                "protocol": "socks5",
                "host": "evil.test",
                "port": 22,
                "outcome": "denied",
                "suggestion": "evil.test:22",
                "reason": "no entry allows evil.test:22",
                "bytesUp": 0,
                "bytesDown": 0,
                "durationMs": 3,
            })
        );
        let back: EgressRecord = serde_json::from_value(json).expect("deserialise");
        assert_eq!(back, record);
    }

    #[test]
    fn an_asked_destination_records_the_answer() {
        let refused = ConnectionEvent {
            outcome: Outcome::Denied,
            asked: Some(Asked::TimedOut),
            ..event()
        };
        let record = EgressRecord::from(&refused);
        assert_eq!(record.asked, Some(EgressAsked::TimedOut));
        let json = serde_json::to_value(&record).expect("serialise");
        assert_eq!(json["asked"], "timedOut");
        let approved = EgressRecord::from(&ConnectionEvent {
            asked: Some(Asked::Session),
            ..event()
        });
        assert_eq!(approved.asked, Some(EgressAsked::Session));
    }

    #[test]
    fn entry_specs_carry_their_policy_lines() {
        let mut spec = SandboxSpec::default();
        spec.egress.allow = vec!["crates.io".to_owned(), "*.crates.io".to_owned()];
        spec.egress.deny = vec!["evil.crates.io".to_owned()];
        spec.sources.file = "p.toml".to_owned();
        spec.sources.egress_allow = vec![4, 5];
        spec.sources.egress_deny = vec![9];
        spec.egress.ask = vec!["*.github.com".to_owned()];
        spec.sources.egress_ask = vec![11];
        assert_eq!(
            egress_entry_specs(&spec),
            EgressEntrySpecs {
                allow: vec![
                    EntrySpec::new("crates.io", "p.toml:4"),
                    EntrySpec::new("*.crates.io", "p.toml:5"),
                ],
                deny: vec![EntrySpec::new("evil.crates.io", "p.toml:9")],
                ask: vec![EntrySpec::new("*.github.com", "p.toml:11")],
            }
        );
        let rules = egress_rules(&spec).expect("compile");
        let host = cordon_egress::rules::Host::parse("evil.crates.io").expect("host");
        assert_eq!(
            rules.decide(&host, 443),
            cordon_egress::rules::Decision::Denied(Matched {
                entry: Arc::from("evil.crates.io"),
                source: Arc::from("p.toml:9"),
            })
        );
        let host = cordon_egress::rules::Host::parse("api.github.com").expect("host");
        assert_eq!(
            rules.decide(&host, 443),
            cordon_egress::rules::Decision::Ask(Matched {
                entry: Arc::from("*.github.com"),
                source: Arc::from("p.toml:11"),
            })
        );
        spec.egress.ask.push("B@d".to_owned());
        assert!(egress_rules(&spec).is_err());
        spec.egress.ask.pop();
        spec.egress.allow.push("B@d".to_owned());
        assert!(egress_rules(&spec).is_err());
    }

    #[test]
    fn only_policy_refusals_count_as_denied() {
        let mut record = EgressRecord::from(&event());
        assert!(!record.is_denied());
        record.outcome = EgressOutcome::Failed;
        assert!(!record.is_denied());
        record.host = "2001:db8::1".to_owned();
        assert_eq!(record.destination(), "[2001:db8::1]:443");
        record.host = "[2001:db8::1]".to_owned();
        assert_eq!(record.destination(), "[2001:db8::1]:443");
    }
}
