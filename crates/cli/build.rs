//! Records the commit `cordon --version` prints (`CORDON_BUILD_COMMIT`), from `CORDON_COMMIT`
//! when set, else the git checkout the sources are in, else `unknown`.

#[path = "build_commit.rs"]
mod build_commit;

use std::path::PathBuf;

fn main() {
    let source_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let override_label = std::env::var("CORDON_COMMIT").ok();
    let label = build_commit::commit_label(&source_dir, override_label.as_deref());
    println!("cargo:rustc-env=CORDON_BUILD_COMMIT={label}");
    println!("cargo:rerun-if-env-changed=CORDON_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build_commit.rs");
    for input in build_commit::git_head_inputs(&source_dir) {
        println!("cargo:rerun-if-changed={input}");
    }
}
