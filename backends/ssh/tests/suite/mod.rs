//! Test modules; `support` starts the throwaway sshd.
mod connect;
pub mod exec;
mod files;
mod helper;
mod search;
pub mod support;
mod tunnel;
