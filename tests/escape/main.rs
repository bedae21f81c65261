//! The escape suite: real escape attempts by a model through the real tools —
//! `cordon_runtime::Session` on the local backend with the built-in default policy and the
//! full sandbox (`allow_degraded = false`). Each attempt asserts that it failed and that its
//! target is untouched.
//!
//! Needs root, Linux with Landlock, seccomp and namespaces, and these Debian packages:
//! `git curl netcat-openbsd python3 gdb strace libcap2-bin libc-bin util-linux procps`
//! (plus coreutils and bash). A missing tool fails the test with the package to install.
//!
//! `cargo test -p cordon-tests --test escape`; with `CORDON_ESCAPE_BACKEND=helper_pipe` the
//! same attempts go through the remote helper's protocol to the local backend in a
//! `cordon-helper` child process; with `CORDON_ESCAPE_BACKEND=ssh_helper` through the SSH
//! backend to the helper it uploads to a test sshd on 127.0.0.1 (commands enforced there, the
//! workspace its remote root; `cargo build -p cordon-helper` first).

mod environment;
mod git;
mod limits;
mod network;
mod processes;
mod reads;
mod spill;
mod support;
mod writes;
