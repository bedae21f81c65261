//! The remote helpers run for real with the shells of this host (dash, bash, busybox sh when
//! installed): file helper, exec requests driven by `drive` over a local process "transport",
//! the worker serving requests one after another, the shared runner over a local-process
//! transport, listing + ignore engine against the `ignore`
//! crate's own walker, and the fallback grep.

mod support;

mod exec;
mod files;
mod runner;
mod search;
mod worker;
