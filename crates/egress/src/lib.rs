//! `cordon-egress`: Cordon's egress proxy, the one way out of a sandbox in filtered network mode.
//!
//! It owns the allow and deny lists of network destinations ([`rules`]) and the proxy that
//! enforces them ([`proxy`]): one listener (TCP or Unix) that speaks HTTP `CONNECT`, plain-HTTP
//! forward proxying (absolute-form requests) and SOCKS5, told apart by the first byte. It does
//! not own the policy file (the policy compiler builds the [`rules::EntrySpec`]s with their
//! `FILE:LINE` labels), nor how a sandbox reaches the listener (a backend's forwarder, a bind
//! mount), nor the audit log (it consumes the [`proxy::ConnectionEvent`]s).
//!
//! # How a connection is decided
//! 1. The request names a host and a port. A name is normalised (lowercase, no trailing dot)
//!    and checked (length, characters); an IP literal is taken as an address.
//! 2. [`rules::Rules::decide`]: a matching deny entry wins; then a matching allow entry; else
//!    "no entry allows it". Names match name entries only, IP literals IP/CIDR entries only.
//! 3. An allowed name is resolved by the proxy (a [`proxy::Resolver`]; the sandbox never
//!    resolves) and every address is checked with [`rules::Rules::check_address`]. An address
//!    in a loopback, private, link-local (cloud metadata), shared, unspecified, multicast,
//!    broadcast or reserved range, also written as IPv6 that leads to it (IPv4-mapped, NAT64,
//!    6to4), is
//!    refused unless an IP/CIDR allow entry covers it: an allowed name cannot be re-pointed
//!    (DNS rebinding) at the host's own services. The proxy connects only to an address that passed, taken from that one
//!    resolution, so a second answer cannot differ from the checked one.
//!    A destination only an ask entry matches is first put to the proxy's approver
//!    ([`ask::EgressApprover`], when it has one): approved once or for the session it goes on
//!    to resolution and the same address check; refused, unanswered in time, or with nobody
//!    to ask it is refused.
//! 4. A refusal answers HTTP `403` (body: the destination, the deciding entry and its
//!    `FILE:LINE` or "no entry allows it", and the entry to add to `[network] allow`) or SOCKS5
//!    reply `0x02`. Every attempt, allowed or not, ends in one [`proxy::ConnectionEvent`] to the
//!    caller's [`proxy::EventSink`].
//!
//! Every input from the sandbox is bounded: the request head size and header count, the name
//! length, the time to send a request and to connect, and the number of connections at once.

#![warn(missing_docs)]

pub mod ask;
pub mod proxy;
pub mod rules;
#[cfg(target_os = "linux")]
mod splice;
