//! `cordon-backend-docker`: Cordon's Docker backend (bollard): one hardened container per session.
#![warn(missing_docs)]
