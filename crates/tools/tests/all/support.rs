//! The property-test configuration shared by the modules: a small case count with a fixed
//! seed in CI, more cases (and any seed) for a longer local run.

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngSeed, TestCaseResult, TestRunner};

/// The seed CI runs with, so a failure there reproduces with the same command locally.
const CI_SEED: u64 = 0xC0_4D_0A;

/// `ci_cases` cases, or `CORDON_PROPTEST_CASES`; the fixed seed, or `CORDON_PROPTEST_SEED`
/// (a number, or `random`).
pub fn config(ci_cases: u32) -> Config {
    let cases = match std::env::var("CORDON_PROPTEST_CASES") {
        Ok(text) => text
            .parse()
            .expect("CORDON_PROPTEST_CASES must be a number of cases"),
        Err(_) => ci_cases,
    };
    let rng_seed = match std::env::var("CORDON_PROPTEST_SEED").as_deref() {
        Ok("random") => RngSeed::Random,
        Ok(text) => RngSeed::Fixed(
            text.parse()
                .expect("CORDON_PROPTEST_SEED must be a number or \"random\""),
        ),
        Err(_) => RngSeed::Fixed(CI_SEED),
    };
    Config {
        cases,
        rng_seed,
        // Failures print the minimal case; it is kept as a unit test, not as a file.
        failure_persistence: None,
        ..Config::default()
    }
}

/// Characters of a failure report shown (a minimal input can still be megabytes).
const REPORT_CHARS: usize = 4_000;

/// Run `test` on `ci_cases` (see [`config`]) values of `strategy`; a failure panics with the
/// reason and the start of the minimal failing input.
pub fn check<S>(ci_cases: u32, strategy: &S, test: impl Fn(S::Value) -> TestCaseResult)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
{
    if let Err(error) = TestRunner::new(config(ci_cases)).run(strategy, test) {
        let report = error.to_string();
        let shown: String = report.chars().take(REPORT_CHARS).collect();
        let cut = if shown.len() < report.len() {
            " …(cut)"
        } else {
            ""
        };
        panic!("{shown}{cut}");
    }
}
