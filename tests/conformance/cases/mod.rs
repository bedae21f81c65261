//! The cases, one module per tool or concern. Every case is `pub async fn(Arc<dyn Harness>)`
//! and opens its own workspace(s); `main.rs` instantiates each for every backend.

pub mod bash;
pub mod confinement;
pub mod denials;
pub mod edit;
pub mod find;
pub mod git_metadata;
pub mod grep;
pub mod ls;
pub mod pipeline;
pub mod policy;
pub mod read;
pub mod write;
