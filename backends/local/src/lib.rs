//! `cordon-backend-local`: Cordon's local backend: kernel-confined file operations, in-process search, sandboxed commands.
#![warn(missing_docs)]
