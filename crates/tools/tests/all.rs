//! Integration tests of `cordon-tools` that exercise its public engines from outside: the
//! property tests of argument preparation and validation, edit matching and patch
//! generation, and path resolution.

#[path = "all/argument_properties.rs"]
mod argument_properties;
#[path = "all/edit_properties.rs"]
mod edit_properties;
#[path = "all/path_properties.rs"]
mod path_properties;
#[path = "all/support.rs"]
mod support;
