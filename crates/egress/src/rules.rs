//! The allow and deny lists: entry syntax, the decision for a requested destination, and the
//! check of every address a name resolved to. Pure values, no I/O; the proxy ([`crate::proxy`])
//! asks and enforces. Parsing the policy file is not done here: its compiler hands each entry
//! over with its source label (`policy.toml:12`).
//!
//! Entry syntax (one string per entry):
//!
//! | entry | matches |
//! |---|---|
//! | `example.com` | the name `example.com` on ports 80 and 443 |
//! | `example.com:22` | the name on port 22 only |
//! | `*.example.com` | every name below `example.com` (`a.example.com`, `a.b.example.com`) on ports 80 and 443, **not** `example.com` itself (list both when both are meant) |
//! | `*.example.com:8443` | the same names on port 8443 |
//! | `10.1.2.3`, `10.1.2.0/24` | that IPv4 address or network, every port |
//! | `10.1.2.0/24:5432` | the same on port 5432 only |
//! | `fd00::1`, `fd00::/8` | that IPv6 address or network, every port |
//! | `[fd00::/8]:443` | the same on port 443 only (a port after IPv6 needs the brackets) |
//!
//! Names are lowercase ASCII (letters, digits, `-`, `_`); an internationalised name is written
//! in punycode (`xn--bcher-kva.example`) and compared as written, nothing is converted. A `*`
//! is only allowed as the whole leftmost label. Requested names are compared case-insensitively
//! and without a trailing dot, so `Example.COM.` is `example.com`.
//!
//! Decisions: a deny entry that matches beats any allow entry, an allow entry beats an ask
//! entry, and an ask entry (`[network] ask`) means the destination needs someone's approval
//! (the proxy asks its approver, if it has one, and refuses otherwise); no matching entry is a
//! denial. Ask entries never let a name's resolved address into a special range: only IP/CIDR
//! allow entries do (the proxy lets an approved IP literal through as its IP/CIDR ask entry
//! names it, as an allow entry would).
//! A name matches only name entries, an IP literal only IP/CIDR entries. After an allowed name
//! is resolved, every address is checked with [`Rules::check_address`]: loopback, private,
//! link-local (the cloud metadata address 169.254.169.254 among them), shared (CGNAT),
//! unspecified, multicast and broadcast addresses, also as IPv4-mapped IPv6 (and as the IPv6
//! forms that lead to an IPv4 address: NAT64, 6to4, IPv4-compatible), are refused unless
//! an IP/CIDR allow entry covers the address and port, and deny IP/CIDR entries apply to
//! resolved addresses too. This is the DNS-rebinding and SSRF defence: an allowed name cannot be
//! pointed at the host's own services.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// Longest entry accepted, in bytes (a 253-byte name, a port and brackets fit).
pub const MAX_ENTRY_LEN: usize = 300;
/// Most entries accepted in one list (allow or deny).
pub const MAX_ENTRIES: usize = 4096;
/// Longest name accepted, in bytes, without a trailing dot (the DNS limit). It also bounds the
/// labels of a name to 127.
pub const MAX_NAME_LEN: usize = 253;
/// Longest label accepted, in bytes (the DNS limit).
pub const MAX_LABEL_LEN: usize = 63;
/// How much of a rejected entry an error message repeats.
const SHOWN_ENTRY_LEN: usize = 80;

/// Which list an entry belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListKind {
    /// `[network] allow`
    Allow,
    /// `[network] deny`
    Deny,
    /// `[network] ask`
    Ask,
}

impl fmt::Display for ListKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListKind::Allow => f.write_str("allow"),
            ListKind::Deny => f.write_str("deny"),
            ListKind::Ask => f.write_str("ask"),
        }
    }
}

/// Why an entry (or a requested host name) is not valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryProblem {
    /// Nothing was written.
    #[error("the entry is empty")]
    Empty,
    /// Longer than [`MAX_ENTRY_LEN`].
    #[error("the entry is {len} bytes long, the limit is {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The port is not a decimal number from 1 to 65535.
    #[error("port {0:?} is not a number from 1 to 65535")]
    BadPort(String),
    /// A `*` anywhere but as the whole leftmost label.
    #[error("a `*` is only allowed as the whole leftmost label, as in \"*.example.com\"")]
    Wildcard,
    /// `*` alone (or `*:port`), which would match every name.
    #[error("a bare `*` would match every name; list the domains instead")]
    MatchAll,
    /// Longer than [`MAX_NAME_LEN`].
    #[error("the name is {len} bytes long, the limit is {max}")]
    NameTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A label longer than [`MAX_LABEL_LEN`].
    #[error("a label is {len} bytes long, the limit is {max}")]
    LabelTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Two dots in a row, or a leading dot.
    #[error("the name has an empty label (two dots in a row, or a leading or trailing dot)")]
    EmptyLabel,
    /// Uppercase letters in an entry.
    #[error("names are written in lowercase: write {0:?}")]
    Uppercase(String),
    /// A character outside lowercase ASCII letters, digits, `-` and `_`.
    #[error(
        "character {0:?} is not allowed in a name (lowercase ASCII letters, digits, '-' and '_'; \
         write an internationalised name in punycode, e.g. \"xn--bcher-kva.example\")"
    )]
    BadChar(char),
    /// A label that starts or ends with `-`.
    #[error("a label starts or ends with '-'")]
    Hyphen,
    /// Numeric like an IPv4 address but not one (`10.1.2`, `999.0.0.1`, `2130706433`).
    #[error("{0:?} looks like an IPv4 address but is not one (write four decimal octets)")]
    BadIpv4(String),
    /// Not a valid IPv6 address.
    #[error("{0:?} is not a valid IPv6 address")]
    BadIpv6(String),
    /// A prefix length that is not a number or too long for the address family.
    #[error("prefix length {prefix:?} is not a number from 0 to {max}")]
    BadPrefix {
        /// What was written after `/`.
        prefix: String,
        /// The family's maximum.
        max: u8,
    },
    /// Address bits set beyond the prefix (`10.1.2.5/24`).
    #[error("the address has bits set beyond its prefix: write {0:?}")]
    HostBits(String),
    /// `[` without `]`, or something other than `:port` after `]`.
    #[error("write a bracketed IPv6 entry as \"[fd00::1]\" or \"[fd00::/8]:443\"")]
    Brackets,
}

/// A list entry or the list as a whole could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// One entry is invalid.
    #[error("failed to parse network {list} entry {entry:?} ({at}): {problem}")]
    Entry {
        /// Which list.
        list: ListKind,
        /// The entry as written (cut to 80 bytes).
        entry: String,
        /// Where it was written.
        at: Arc<str>,
        /// What is wrong with it.
        problem: EntryProblem,
    },
    /// A list holds more than [`MAX_ENTRIES`] entries.
    #[error("failed to compile network {list} list: it has {count} entries, the limit is {max}")]
    TooManyEntries {
        /// Which list.
        list: ListKind,
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
}

/// One entry as the policy compiler hands it over: the text and where it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntrySpec {
    /// The entry as written, e.g. `*.crates.io` or `10.1.2.0/24:5432`.
    pub text: String,
    /// Where it was written, e.g. `policy.toml:12`.
    pub source: Arc<str>,
}

impl EntrySpec {
    /// An entry with its source label.
    pub fn new(text: impl Into<String>, source: impl Into<Arc<str>>) -> Self {
        EntrySpec {
            text: text.into(),
            source: source.into(),
        }
    }
}

/// An IPv4 or IPv6 network: an address and a prefix length, host bits clear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Whether `ip` (IPv4-mapped IPv6 taken as IPv4) lies in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(net.to_bits()),
                u128::from(ip.to_bits()),
                self.prefix,
                32,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(net.to_bits(), ip.to_bits(), self.prefix, 128)
            }
            (IpAddr::V4(_), IpAddr::V6(_)) | (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn prefix_eq(a: u128, b: u128, prefix: u8, width: u8) -> bool {
    let host_bits = u32::from(width - prefix);
    a.checked_shr(host_bits).unwrap_or(0) == b.checked_shr(host_bits).unwrap_or(0)
}

/// What an entry names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Exactly this name.
    Name(Box<str>),
    /// Every name strictly below this one (`*.example.com` holds `example.com`).
    Subdomains(Box<str>),
    /// An address or network.
    Net(IpNet),
}

/// Which ports an entry covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ports {
    /// 80 and 443: a name written without a port.
    Web,
    /// One port.
    One(u16),
    /// Every port: an address or network written without a port.
    Any,
}

impl Ports {
    fn covers(self, port: u16) -> bool {
        match self {
            Ports::Web => port == 80 || port == 443,
            Ports::One(p) => p == port,
            Ports::Any => true,
        }
    }
}

/// A compiled entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    target: Target,
    ports: Ports,
    matched: Matched,
}

impl Entry {
    /// Parses one entry.
    pub fn parse(text: &str, source: Arc<str>) -> Result<Entry, EntryProblem> {
        let (target, ports) = parse_entry(text)?;
        Ok(Entry {
            target,
            ports,
            matched: Matched {
                entry: text.into(),
                source,
            },
        })
    }

    /// What the entry names.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The ports it covers.
    pub fn ports(&self) -> Ports {
        self.ports
    }

    fn covers_name(&self, name: &str, port: u16) -> bool {
        let target = match &self.target {
            Target::Name(n) => **n == *name,
            Target::Subdomains(suffix) => name
                .strip_suffix(&**suffix)
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Target::Net(_) => false,
        };
        target && self.ports.covers(port)
    }

    fn covers_ip(&self, ip: IpAddr, port: u16) -> bool {
        match &self.target {
            Target::Net(net) => net.contains(ip) && self.ports.covers(port),
            Target::Name(_) | Target::Subdomains(_) => false,
        }
    }
}

/// The entry that decided, as written, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matched {
    /// The entry's text, e.g. `*.crates.io`.
    pub entry: Arc<str>,
    /// Where it was written, e.g. `policy.toml:12`.
    pub source: Arc<str>,
}

impl fmt::Display for Matched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({})", &*self.entry, self.source)
    }
}

/// A requested destination host: a name (normalised) or an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A DNS name: lowercase ASCII, no trailing dot.
    Name(Box<str>),
    /// An IP literal (IPv4-mapped IPv6 taken as IPv4).
    Ip(IpAddr),
}

impl Host {
    /// Reads a host as a client sent it (no brackets): an IP literal, or a name that is
    /// lowercased and loses one trailing dot before it is checked like an entry's name.
    pub fn parse(text: &str) -> Result<Host, EntryProblem> {
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Host::Ip(ip.to_canonical()));
        }
        if text.len() > MAX_ENTRY_LEN {
            return Err(EntryProblem::NameTooLong {
                len: text.len(),
                max: MAX_NAME_LEN,
            });
        }
        let lower = text.to_ascii_lowercase();
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        check_name(name)?;
        Ok(Host::Name(name.into()))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// The lists' answer for a requested host and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An allow entry matches and no deny entry does.
    Allowed(Matched),
    /// A deny entry matches (whatever the allow list says).
    Denied(Matched),
    /// No deny or allow entry matches but an ask entry does: the destination needs approval.
    Ask(Matched),
    /// No entry allows it.
    NotAllowed,
}

/// A range of addresses an allowed name may not resolve into without an IP/CIDR allow entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecialRange {
    /// 127.0.0.0/8, ::1
    Loopback,
    /// 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fc00::/7
    Private,
    /// 169.254.0.0/16 (with the metadata address 169.254.169.254), fe80::/10
    LinkLocal,
    /// 100.64.0.0/10
    SharedCgnat,
    /// 0.0.0.0/8, ::
    Unspecified,
    /// 224.0.0.0/4, ff00::/8
    Multicast,
    /// 255.255.255.255
    Broadcast,
    /// 192.0.0.0/24 (protocol assignments), 198.18.0.0/15 (benchmarking networks),
    /// 240.0.0.0/4 (reserved), 2001::/32 (Teredo: leads to an IPv4 relay and client)
    Reserved,
}

impl fmt::Display for SpecialRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpecialRange::Loopback => "a loopback address",
            SpecialRange::Private => "a private address",
            SpecialRange::LinkLocal => "a link-local address (cloud metadata lives here)",
            SpecialRange::SharedCgnat => "a shared (CGNAT) address",
            SpecialRange::Unspecified => "an unspecified address",
            SpecialRange::Multicast => "a multicast address",
            SpecialRange::Broadcast => "the broadcast address",
            SpecialRange::Reserved => "a reserved address",
        })
    }
}

/// The range `ip` falls in, if it is one an allowed name may not resolve into.
pub fn special_range(ip: IpAddr) -> Option<SpecialRange> {
    match ip.to_canonical() {
        IpAddr::V4(ip) => special_v4(ip),
        IpAddr::V6(ip) => special_v6(ip),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<SpecialRange> {
    let [a, b, _, _] = ip.octets();
    if ip.is_loopback() {
        Some(SpecialRange::Loopback)
    } else if ip.is_private() {
        Some(SpecialRange::Private)
    } else if ip.is_link_local() {
        Some(SpecialRange::LinkLocal)
    } else if a == 100 && (b & 0xc0) == 64 {
        Some(SpecialRange::SharedCgnat)
    } else if a == 0 {
        Some(SpecialRange::Unspecified)
    } else if ip.is_multicast() {
        Some(SpecialRange::Multicast)
    } else if ip.is_broadcast() {
        Some(SpecialRange::Broadcast)
    } else if (a == 192 && b == 0 && ip.octets()[2] == 0)
        || (a == 198 && (b & 0xfe) == 18)
        || a >= 240
    {
        Some(SpecialRange::Reserved)
    } else {
        None
    }
}

fn special_v6(ip: Ipv6Addr) -> Option<SpecialRange> {
    let segments = ip.segments();
    let first = segments[0];
    if ip.is_loopback() {
        Some(SpecialRange::Loopback)
    } else if ip.is_unspecified() {
        Some(SpecialRange::Unspecified)
    } else if (first & 0xfe00) == 0xfc00 {
        Some(SpecialRange::Private)
    } else if (first & 0xffc0) == 0xfe80 {
        Some(SpecialRange::LinkLocal)
    } else if ip.is_multicast() {
        Some(SpecialRange::Multicast)
    } else if segments[..2] == [0x2001, 0] {
        Some(SpecialRange::Reserved)
    } else if segments[..3] == [0x64, 0xff9b, 1] {
        // The local-use NAT64 prefix (64:ff9b:1::/48) is a network's own translator.
        Some(SpecialRange::Private)
    } else {
        embedded_v4(segments).and_then(special_v4)
    }
}

/// The IPv4 address an IPv6 address leads to: NAT64 with the well-known prefix
/// (64:ff9b::/96, where a DNS64 resolver points names and the translator connects to the
/// IPv4 address), 6to4 (2002::/16) and the deprecated IPv4-compatible form (::/96). An
/// allowed name resolving to one of these must not reach what its IPv4 address could not.
fn embedded_v4(segments: [u16; 8]) -> Option<Ipv4Addr> {
    let v4 = |high: u16, low: u16| Ipv4Addr::from_bits((u32::from(high) << 16) | u32::from(low));
    match segments {
        [0x64, 0xff9b, 0, 0, 0, 0, high, low] | [0, 0, 0, 0, 0, 0, high, low] => {
            Some(v4(high, low))
        }
        [0x2002, high, low, ..] => Some(v4(high, low)),
        _ => None,
    }
}

/// The check of one resolved address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressCheck {
    /// The proxy may connect to it.
    Pass,
    /// A deny IP/CIDR entry covers it.
    Denied(Matched),
    /// It is in a special range and no IP/CIDR allow entry covers it.
    Special(SpecialRange),
}

/// The compiled allow, deny and ask lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    allow: Vec<Entry>,
    deny: Vec<Entry>,
    ask: Vec<Entry>,
}

impl Rules {
    /// Compiles both lists; the first invalid entry is the error.
    pub fn compile(allow: &[EntrySpec], deny: &[EntrySpec]) -> Result<Rules, RulesError> {
        Ok(Rules {
            allow: compile_list(ListKind::Allow, allow)?,
            deny: compile_list(ListKind::Deny, deny)?,
            ask: Vec::new(),
        })
    }

    /// These rules with the ask list (`[network] ask`) compiled in.
    pub fn with_ask(self, ask: &[EntrySpec]) -> Result<Rules, RulesError> {
        Ok(Rules {
            ask: compile_list(ListKind::Ask, ask)?,
            ..self
        })
    }

    /// The ask entries in order.
    pub fn ask(&self) -> &[Entry] {
        &self.ask
    }

    /// The allow entries in order.
    pub fn allow(&self) -> &[Entry] {
        &self.allow
    }

    /// The deny entries in order.
    pub fn deny(&self) -> &[Entry] {
        &self.deny
    }

    /// Decides a requested destination: a deny entry beats an allow entry, which beats an ask
    /// entry; names match name entries, IP literals IP/CIDR entries. An allowed name must still pass
    /// [`Rules::check_address`] for each address it resolves to; an allowed IP literal too.
    pub fn decide(&self, host: &Host, port: u16) -> Decision {
        let matches = |entry: &&Entry| match host {
            Host::Name(name) => entry.covers_name(name, port),
            Host::Ip(ip) => entry.covers_ip(*ip, port),
        };
        if let Some(entry) = self.deny.iter().find(matches) {
            return Decision::Denied(entry.matched.clone());
        }
        if let Some(entry) = self.allow.iter().find(matches) {
            return Decision::Allowed(entry.matched.clone());
        }
        match self.ask.iter().find(matches) {
            Some(entry) => Decision::Ask(entry.matched.clone()),
            None => Decision::NotAllowed,
        }
    }

    /// Checks an address the proxy would connect to: deny IP/CIDR entries apply, and an
    /// address in a [`SpecialRange`] passes only when an IP/CIDR allow entry covers it and the
    /// port.
    pub fn check_address(&self, ip: IpAddr, port: u16) -> AddressCheck {
        let ip = ip.to_canonical();
        if let Some(entry) = self.deny.iter().find(|e| e.covers_ip(ip, port)) {
            return AddressCheck::Denied(entry.matched.clone());
        }
        match special_range(ip) {
            None => AddressCheck::Pass,
            Some(_) if self.allow.iter().any(|e| e.covers_ip(ip, port)) => AddressCheck::Pass,
            Some(range) => AddressCheck::Special(range),
        }
    }
}

/// The allow entry to suggest for a destination that was refused.
pub fn suggested_entry(host: &Host, port: u16) -> String {
    match host {
        Host::Name(name) if port == 80 || port == 443 => name.to_string(),
        Host::Name(name) => format!("{name}:{port}"),
        Host::Ip(IpAddr::V4(ip)) => format!("{ip}:{port}"),
        Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
    }
}

/// The IP/CIDR allow entry to suggest for a resolved address that was refused.
pub fn suggested_address_entry(ip: IpAddr, port: u16) -> String {
    match ip.to_canonical() {
        IpAddr::V4(ip) => format!("{ip}/32:{port}"),
        IpAddr::V6(ip) => format!("[{ip}/128]:{port}"),
    }
}

fn compile_list(list: ListKind, specs: &[EntrySpec]) -> Result<Vec<Entry>, RulesError> {
    if specs.len() > MAX_ENTRIES {
        return Err(RulesError::TooManyEntries {
            list,
            count: specs.len(),
            max: MAX_ENTRIES,
        });
    }
    specs
        .iter()
        .map(|spec| {
            Entry::parse(&spec.text, spec.source.clone()).map_err(|problem| RulesError::Entry {
                list,
                entry: shown(&spec.text),
                at: spec.source.clone(),
                problem,
            })
        })
        .collect()
}

fn shown(text: &str) -> String {
    if text.len() <= SHOWN_ENTRY_LEN {
        return text.to_string();
    }
    let mut end = SHOWN_ENTRY_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn parse_entry(text: &str) -> Result<(Target, Ports), EntryProblem> {
    if text.is_empty() {
        return Err(EntryProblem::Empty);
    }
    if text.len() > MAX_ENTRY_LEN {
        return Err(EntryProblem::TooLong {
            len: text.len(),
            max: MAX_ENTRY_LEN,
        });
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest.split_once(']').ok_or(EntryProblem::Brackets)?;
        let net = parse_v6_net(inner)?;
        let ports = match after {
            "" => Ports::Any,
            _ => Ports::One(parse_port(
                after.strip_prefix(':').ok_or(EntryProblem::Brackets)?,
            )?),
        };
        return Ok((Target::Net(net), ports));
    }
    if text.bytes().filter(|&b| b == b':').count() >= 2 {
        return Ok((Target::Net(parse_v6_net(text)?), Ports::Any));
    }
    let (host, port) = match text.split_once(':') {
        Some((host, port)) => (host, Some(parse_port(port)?)),
        None => (text, None),
    };
    if host.contains('/') || looks_numeric(host) {
        return Ok((
            Target::Net(parse_v4_net(host)?),
            port.map_or(Ports::Any, Ports::One),
        ));
    }
    let ports = port.map_or(Ports::Web, Ports::One);
    if host == "*" {
        return Err(EntryProblem::MatchAll);
    }
    if let Some(suffix) = host.strip_prefix("*.") {
        check_entry_name(suffix)?;
        return Ok((Target::Subdomains(suffix.into()), ports));
    }
    check_entry_name(host)?;
    Ok((Target::Name(host.into()), ports))
}

/// Whether the last label is all digits: such a name is meant as an IPv4 address (and system
/// resolvers would read `127.1` or `2130706433` as one).
fn looks_numeric(host: &str) -> bool {
    let last = host.rsplit('.').next().unwrap_or(host);
    !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())
}

fn parse_port(text: &str) -> Result<u16, EntryProblem> {
    let bad = || EntryProblem::BadPort(shown(text));
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(port) => Ok(port),
    }
}

fn parse_prefix(text: Option<&str>, max: u8) -> Result<u8, EntryProblem> {
    let Some(text) = text else { return Ok(max) };
    let bad = || EntryProblem::BadPrefix {
        prefix: shown(text),
        max,
    };
    if text.is_empty() || text.len() > 3 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u8>() {
        Ok(prefix) if prefix <= max => Ok(prefix),
        Ok(_) | Err(_) => Err(bad()),
    }
}

fn parse_v4_net(text: &str) -> Result<IpNet, EntryProblem> {
    let (addr, prefix) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (text, None),
    };
    let addr: Ipv4Addr = addr
        .parse()
        .map_err(|_| EntryProblem::BadIpv4(shown(addr)))?;
    let prefix = parse_prefix(prefix, 32)?;
    let bits = addr.to_bits();
    let masked = bits & u32::MAX.checked_shl(u32::from(32 - prefix)).unwrap_or(0);
    if masked != bits {
        return Err(EntryProblem::HostBits(format!(
            "{}/{prefix}",
            Ipv4Addr::from_bits(masked)
        )));
    }
    Ok(IpNet {
        addr: IpAddr::V4(addr),
        prefix,
    })
}

fn parse_v6_net(text: &str) -> Result<IpNet, EntryProblem> {
    let (addr, prefix) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (text, None),
    };
    let addr: Ipv6Addr = addr
        .parse()
        .map_err(|_| EntryProblem::BadIpv6(shown(addr)))?;
    let prefix = parse_prefix(prefix, 128)?;
    let bits = addr.to_bits();
    let masked = bits & u128::MAX.checked_shl(u32::from(128 - prefix)).unwrap_or(0);
    if masked != bits {
        return Err(EntryProblem::HostBits(format!(
            "{}/{prefix}",
            Ipv6Addr::from_bits(masked)
        )));
    }
    // An IPv4-mapped network is an IPv4 network: requests are compared as IPv4.
    match addr.to_ipv4_mapped() {
        Some(v4) if prefix >= 96 => Ok(IpNet {
            addr: IpAddr::V4(v4),
            prefix: prefix - 96,
        }),
        Some(_) | None => Ok(IpNet {
            addr: IpAddr::V6(addr),
            prefix,
        }),
    }
}

fn check_entry_name(name: &str) -> Result<(), EntryProblem> {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(EntryProblem::Uppercase(shown(&name.to_ascii_lowercase())));
    }
    if name.ends_with('.') {
        return Err(EntryProblem::EmptyLabel);
    }
    check_name(name)
}

/// Checks a lowercase name without a trailing dot.
fn check_name(name: &str) -> Result<(), EntryProblem> {
    if name.len() > MAX_NAME_LEN {
        return Err(EntryProblem::NameTooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(EntryProblem::EmptyLabel);
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(EntryProblem::LabelTooLong {
                len: label.len(),
                max: MAX_LABEL_LEN,
            });
        }
        if let Some(ch) = label
            .chars()
            .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-' | '_'))
        {
            return Err(if ch == '*' {
                EntryProblem::Wildcard
            } else {
                EntryProblem::BadChar(ch)
            });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(EntryProblem::Hyphen);
        }
    }
    if looks_numeric(name) {
        return Err(EntryProblem::BadIpv4(shown(name)));
    }
    Ok(())
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
