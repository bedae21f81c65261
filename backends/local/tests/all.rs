//! Integration tests of the local backend against the real kernel: confinement, protected
//! and denied paths, atomic writes, spill files, search and command execution.

mod suite;
