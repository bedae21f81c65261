//! `cordon-helper` under this package's name, so `cargo test -p cordon-tests` builds it fresh
//! for the `helper_pipe` backend of the suites (a dependency's binaries are not built for
//! another package's tests).

fn main() -> std::process::ExitCode {
    cordon_helper::program::run(std::env::args().skip(1).collect())
}
