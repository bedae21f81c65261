//! Benchmark harness.

fn main() {}
