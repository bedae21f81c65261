//! `cordon-backend-ssh`: Cordon's SSH backend (russh): verified host keys, SFTP files, multiplexed exec.
#![warn(missing_docs)]
