//! Integration tests of the helper: the built `cordon-helper serve` as a child process.

mod forward;
mod hostile;
mod pipe;
mod socket;
