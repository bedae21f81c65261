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
//!
//! With `CORDON_ESCAPE_BACKEND=docker_helper` they go to the Docker backend in bind mode with
//! this build's helper required in the container: every command runs under the helper's
//! container profile (Landlock and seccomp; the container supplies the namespaces), checked
//! per session (`Session::commands_path`, no missing layer). The engine comes from
//! `scripts/docker-start.sh` (a failure fails the suite), and the image is `cordon-sandbox`
//! plus the programs the attempts use (`escape/image/Dockerfile`, built by the suite), so no
//! attempt fails for want of `gdb` or `nc`.
//!
//! A canary that is missing from the container would make every attempt on it fail for
//! nothing, so on Docker the canaries are really there: the harness's `outside` directory is
//! bind-mounted read-write at its host path and at `/outside` (where `../outside` leads from
//! the container's `/workspace`), and the cases' other host canaries (a key in the host's
//! `~/.ssh`, another user's home) at their host paths. These mounts come from a test-only
//! option of the backend (`DockerOptions::unlisted_binds`, which neither the policy file nor
//! the CLI can set); no policy rule names them, so only the helper's Landlock rules stand
//! between a command and them. Each session checks from outside the sandbox (`docker exec`)
//! that they are present. The processes the cases attack run in the container beside the
//! helper (a plain `docker exec`, same uid as commands), since the container's PID namespace
//! already hides the host's.
//!
//! Where the container profile leaves a layer to the container, the Docker run asserts the
//! documented container behaviour instead of passing for want of a target:
//! - `setsid` is refused (the command's process group is its tree), so the cases that start a
//!   `setsid` child check that refusal and attack with a child ignoring TERM/HUP instead;
//! - the command shares the container's PID namespace: `gdb -p` on a process beside the helper
//!   must report that ptrace was refused, and its `/proc/<pid>/fd` names are listable but not
//!   where they lead;
//! - loopback is the container's: with the network on, the reachable listener runs in the
//!   container, and a host Unix socket stays out of reach because the container does not have
//!   it (Landlock does not mediate connecting to a pathname socket; the backend binds only the
//!   sockets the policy lists), which the case checks;
//! - a missing `.git` has no placeholder: a command may create one and the git guard
//!   quarantines it when the command ends;
//! - a denied path no mount covers costs its ancestors the right to take new entries (the
//!   deep `.env` case: the workspace root refuses `ok.txt`, its existing files stay writable);
//! - a known defect: Landlock does not cover chmod or utimes and the container profile has no
//!   mount namespace to make the container's writable mounts read-only around a command, so
//!   `chmod`/`touch -d` on the victim succeed there (its content and directory stay
//!   untouched); the case asserts that so a fix shows up.

mod environment;
mod git;
mod limits;
mod network;
mod processes;
mod reads;
mod spill;
mod support;
mod writes;
