//! Integration tests of `cordon-egress`: real clients through the proxy on loopback.

#[path = "all/clients.rs"]
mod clients;
#[path = "all/listeners.rs"]
mod listeners;
