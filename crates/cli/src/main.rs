//! `cordon`: the command-line entry point. A thin layer of argument parsing and wiring over
//! the library crates.

fn main() {
    println!("cordon");
}
