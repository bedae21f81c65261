//! The analyser terminates within its step budget on random scripts made of shell
//! metacharacters (unclosed quotes, brackets, substitutions, here-documents, wrappers).
//!
//! `CORDON_FUZZ_CASES` sets the number of cases (default 300, sized for CI) and
//! `CORDON_FUZZ_SEED` the first seed; each case is reproducible from its seed, which a failure
//! names. The assertion is on the budget outcome, never on wall time.

use cordon_policy::shell::{analyse_script, step_budget};

/// Pieces scripts are built from: the constructs the parser backtracks on, plus words.
const PIECES: &[&str] = &[
    "(",
    ")",
    "((",
    "))",
    "{",
    "}",
    "{a,",
    ",",
    "$(",
    "${",
    "${a:-",
    "$((",
    "`",
    "\"",
    "'",
    "$'",
    "\\",
    "<<EOF\n",
    "\nEOF\n",
    "<(",
    ">(",
    "|",
    "||",
    "&&",
    ";",
    "&",
    "\n",
    " ",
    "*",
    "?",
    "[",
    "]",
    "[[",
    "]]",
    "=",
    "a",
    "echo ",
    "git push",
    "env ",
    "bash -c ",
    "eval ",
    "if ",
    "then ",
    "fi",
    "case ",
    "esac",
    "for x in ",
    "do ",
    "done",
    "x=",
    "!",
    "#",
    "~",
    "@(",
];

/// Pieces that nest inside one word (no quotes or blanks that would end it early).
const WORD_PIECES: &[&str] = &[
    "{", "}", "{a,", ",", "a", "$(", "$(echo ", ")", "${", "${a:-", "}", "$((", "((", "(", "\"$(",
    "@(", "*(", "[", "]", "~", "x",
];

fn script(rng: &mut fastrand::Rng) -> String {
    let len = rng.usize(1..=60);
    let pick = |rng: &mut fastrand::Rng, pieces: &[&'static str]| pieces[rng.usize(..pieces.len())];
    match rng.u8(..4) {
        // Anything.
        0 => (0..len).map(|_| pick(rng, PIECES)).collect(),
        // One long word after a command.
        1 => {
            let word: String = (0..len).map(|_| pick(rng, WORD_PIECES)).collect();
            format!("echo {word}")
        }
        // A here-document body.
        2 => {
            let body: String = (0..len).map(|_| pick(rng, WORD_PIECES)).collect();
            format!("cat <<EOF\n{body}\nEOF\n")
        }
        // Subshells, groups and keywords.
        _ => (0..len)
            .map(|_| {
                pick(
                    rng,
                    &[
                        "(",
                        "( ",
                        ")",
                        "{ ",
                        "} ",
                        "; ",
                        "if a; then ",
                        "fi ",
                        "$(",
                        "git push ",
                    ],
                )
            })
            .collect(),
    }
}

#[test]
fn random_metacharacter_scripts_stay_within_the_budget() {
    let cases: u64 = std::env::var("CORDON_FUZZ_CASES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(300);
    let first: u64 = std::env::var("CORDON_FUZZ_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1);
    let mut worst = (std::time::Duration::ZERO, 0u64, String::new());
    let mut exhausted = 0;
    for seed in first..first + cases {
        let mut rng = fastrand::Rng::with_seed(seed);
        let script = script(&mut rng);
        let started = std::time::Instant::now();
        let analysis = analyse_script(&script);
        let took = started.elapsed();
        let budget = step_budget(script.len());
        assert!(
            analysis.steps <= budget,
            "seed {seed}: {} steps over a budget of {budget} for {script:?}",
            analysis.steps
        );
        if analysis
            .unanalysable
            .iter()
            .any(|reason| reason.contains("too complex"))
        {
            exhausted += 1;
            assert_eq!(
                analysis.unanalysable.len(),
                1,
                "seed {seed}: an exhausted budget is the only reason given"
            );
        }
        if took > worst.0 {
            worst = (took, seed, script);
        }
    }
    // Reported, not asserted: the run's slowest case (recorded in BENCHMARKS.md).
    if std::env::var("CORDON_FUZZ_SHOW").is_ok() {
        eprintln!("slowest script: {:?}", worst.2);
    }
    eprintln!(
        "{cases} cases, {exhausted} out of budget; slowest: {:?} (seed {}, {} bytes)",
        worst.0,
        worst.1,
        worst.2.len()
    );
}
