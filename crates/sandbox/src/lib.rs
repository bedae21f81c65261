//! `cordon-sandbox`: Cordon's local sandbox boundary: Landlock, seccomp, namespaces and rlimits applied right before execve (the only crate with unsafe).
#![warn(missing_docs)]
#![allow(unsafe_code)]
