//! The `cordon` binary's integration tests: one test binary, one module per area. Each module
//! runs the built binary (`CARGO_BIN_EXE_cordon`) the way a user or a CI job would.

mod cli;
mod config;
mod doctor;
mod hostfiles;
mod install;
mod load;
mod logs;
mod mcp;
mod run;
