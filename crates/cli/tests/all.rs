//! End-to-end tests of the `cordon` binary.

mod doctor;
