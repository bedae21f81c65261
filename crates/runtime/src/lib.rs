//! `cordon-runtime`: Cordon's runtime wiring: backend + tools + policy hooks + audit for every entry point.
#![warn(missing_docs)]
