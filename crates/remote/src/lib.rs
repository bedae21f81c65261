//! `cordon-remote`: Shared helpers for remote backends (docker, ssh): POSIX wrapper scripts, rg --json parsing, fallback search.
#![warn(missing_docs)]
