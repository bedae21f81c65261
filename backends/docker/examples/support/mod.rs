//! What the Docker examples share: the helper binary they run and how they print a series.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Print p50, p90 and mean of `samples` (in ms) under `name`.
pub fn stats(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    println!(
        "{name:<44} p50 {:>7.2} ms   p90 {:>7.2} ms   mean {:>7.2} ms   (n={})",
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        mean.as_secs_f64() * 1e3,
        samples.len()
    );
}

/// `CORDON_HELPER`, else this build's `cordon-helper`.
pub fn helper_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CORDON_HELPER") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/NAME → target/<profile>/cordon-helper
    exe.parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("cordon-helper"))
        .expect("target directory")
}
