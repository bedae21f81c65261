//! Timing helpers: warm-up, samples, percentiles, formatting.

use std::future::Future;
use std::time::{Duration, Instant};

/// Samples of one measured operation.
pub struct Samples(Vec<Duration>);

impl Samples {
    /// Run `op` `warmup` times unmeasured, then `runs` times measured.
    pub async fn of<F, Fut>(warmup: usize, runs: usize, mut op: F) -> Samples
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        for _ in 0..warmup {
            op().await;
        }
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = Instant::now();
            op().await;
            samples.push(start.elapsed());
        }
        samples.sort();
        Samples(samples)
    }

    /// Wrap already-taken samples.
    pub fn from_vec(mut samples: Vec<Duration>) -> Samples {
        samples.sort();
        Samples(samples)
    }

    /// The `p`-quantile (0.0–1.0).
    pub fn quantile(&self, p: f64) -> Duration {
        let index = ((self.0.len() as f64 - 1.0) * p).round() as usize;
        self.0[index]
    }

    /// The median.
    pub fn p50(&self) -> Duration {
        self.quantile(0.5)
    }
}

/// `0.012 ms` / `12.3 ms` style.
pub fn ms(duration: Duration) -> String {
    let ms = duration.as_secs_f64() * 1e3;
    if ms < 1.0 {
        format!("{ms:.3} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

/// One Markdown row.
pub fn row(name: &str, cordon: &str, baseline: &str, ratio: &str, target: &str, reference: &str) {
    println!("| {name} | {cordon} | {baseline} | {ratio} | {target} | {reference} |");
}

/// `a / b` as `1.23×`.
pub fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64())
}

/// Peak resident set size of this process so far (`VmHWM`), in bytes.
pub fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kb| kb * 1024)
}
