//! The scripted test server now lives in the crate behind the `testing` feature, so other
//! crates' tests (`cordon run`) can serve recorded transcripts with it too.

pub use cordon_model::testing::{Reply, TestServer};
