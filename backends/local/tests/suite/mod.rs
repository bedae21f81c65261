//! One module per area; `support` holds the shared fixture.

mod egress;
mod exec;
mod files;
mod parity;
mod paths;
mod search;
mod state;
mod support;
