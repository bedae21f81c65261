//! Integration tests of the SSH backend against a real `sshd` on 127.0.0.1 (one binary).
mod suite;
