//! End-to-end tests of the `cordon` binary (one integration test binary for the crate).

mod run;
