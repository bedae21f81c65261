//! Properties of policy loading on random and mutated TOML: compiling never panics, and every
//! error names a position inside the text (`FILE:LINE:COL: ` first) and stays short however
//! large the input. Inputs are the shipped policies with random edits (bytes removed, tokens
//! inserted, lines duplicated or dropped) and small random documents. The bash analyser itself
//! is out of scope here (it has its own property tests): inserted tokens stay short.

use cordon_policy::{CompiledPolicy, DEFAULT_POLICY_TOML, EnvMap};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::{Config, RngSeed, TestRunner};

/// Longest error text accepted: a message and a cut quotation of the offending value.
const MAX_ERROR_BYTES: usize = 4096;

const SHIPPED: &[&str] = &[
    DEFAULT_POLICY_TOML,
    include_str!("../../../../policies/build-host.toml"),
    include_str!("../../../../policies/ci-untrusted.toml"),
    include_str!("../../../../policies/readonly.toml"),
];

/// Fragments that break or bend TOML and policy semantics.
const TOKENS: &[&str] = &[
    "\"",
    "'",
    "'''",
    "\"\"\"",
    "[",
    "]",
    "[[",
    "]]",
    "{",
    "}",
    "=",
    ",",
    ".",
    "#",
    "\n",
    "\r",
    "\t",
    " ",
    "\\",
    "\\u",
    "\u{0}",
    "\u{FEFF}",
    "é",
    "true",
    "1",
    "-1",
    "1e99",
    "0x",
    "1979-05-27",
    "inf",
    "nan",
    "version",
    "default",
    "deny",
    "ask",
    "allow",
    "tools",
    "rules",
    "match",
    "paths",
    "glob",
    "regex",
    "**",
    "{a,",
    "[!",
    "(?",
    "*",
    "~",
    "$HOME",
    "${X",
    "[[rules]]",
    "[sandbox]",
    "network",
    "limits",
    "1GiB",
    "99999999999999999999",
    "unknown_key",
];

/// `CORDON_PROPTEST_CASES` cases (else `ci_cases`) with the CI seed, or
/// `CORDON_PROPTEST_SEED` (a number, or `random`).
fn config(ci_cases: u32) -> Config {
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
        Err(_) => RngSeed::Fixed(0xC0_4D_0A),
    };
    Config {
        cases,
        rng_seed,
        failure_persistence: None,
        ..Config::default()
    }
}

#[derive(Clone, Debug)]
enum Mutation {
    Remove(Index, usize),
    Insert(Index, &'static str),
    DuplicateLine(Index),
    DropLine(Index),
    Repeat(Index, &'static str, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => (any::<Index>(), 1usize..40).prop_map(|(at, len)| Mutation::Remove(at, len)),
        3 => (any::<Index>(), select(TOKENS)).prop_map(|(at, t)| Mutation::Insert(at, t)),
        1 => any::<Index>().prop_map(Mutation::DuplicateLine),
        1 => any::<Index>().prop_map(Mutation::DropLine),
        1 => (any::<Index>(), select(TOKENS), 100usize..20_000)
            .prop_map(|(at, t, n)| Mutation::Repeat(at, t, n)),
    ]
}

/// Nearest character boundary at or before `at`.
fn boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn apply(text: &mut String, mutation: &Mutation) {
    let lines: Vec<(usize, usize)> = {
        let mut start = 0;
        text.split_inclusive('\n')
            .map(|line| {
                let span = (start, start + line.len());
                start += line.len();
                span
            })
            .collect()
    };
    match mutation {
        Mutation::Remove(at, len) => {
            let start = boundary(text, at.index(text.len() + 1));
            let end = boundary(text, start + len);
            text.replace_range(start..end, "");
        }
        Mutation::Insert(at, token) => {
            let at = boundary(text, at.index(text.len() + 1));
            text.insert_str(at, token);
        }
        Mutation::Repeat(at, token, count) => {
            let at = boundary(text, at.index(text.len() + 1));
            text.insert_str(at, &token.repeat(*count));
        }
        Mutation::DuplicateLine(at) | Mutation::DropLine(at) if !lines.is_empty() => {
            let (start, end) = lines[at.index(lines.len())];
            if matches!(mutation, Mutation::DropLine(_)) {
                text.replace_range(start..end, "");
            } else {
                let line = text[start..end].to_owned();
                text.insert_str(end, &line);
            }
        }
        Mutation::DuplicateLine(_) | Mutation::DropLine(_) => {}
    }
}

/// Compile `text`; on error, check the position and size of the error.
fn check(text: &str) -> Result<(), TestCaseError> {
    let Err(error) = CompiledPolicy::from_toml("fuzz.toml", text, &EnvMap::new()) else {
        return Ok(());
    };
    let shown = error.to_string();
    let Some((line, column)) = error.position() else {
        return Err(TestCaseError::fail(format!("no position: {shown}")));
    };
    let lines = text.split('\n').count();
    prop_assert!(
        (1..=lines).contains(&line) && column >= 1,
        "{line}:{column} is outside a {lines}-line text: {shown}"
    );
    let prefix = format!("fuzz.toml:{line}:{column}: ");
    prop_assert!(shown.starts_with(&prefix), "{shown:?}");
    prop_assert!(
        shown.len() <= MAX_ERROR_BYTES,
        "a {}-byte error for a {}-byte policy: {}…",
        shown.len(),
        text.len(),
        shown.chars().take(300).collect::<String>()
    );
    Ok(())
}

#[test]
fn mutated_shipped_policies_compile_or_fail_with_a_short_positioned_error() {
    let strategy = (select(SHIPPED), prop::collection::vec(mutation(), 1..6));
    TestRunner::new(config(256))
        .run(&strategy, |(shipped, mutations)| {
            let mut text = shipped.to_owned();
            for mutation in &mutations {
                apply(&mut text, mutation);
            }
            check(&text)
        })
        .unwrap();
}

#[test]
fn random_token_documents_compile_or_fail_with_a_short_positioned_error() {
    let strategy = prop::collection::vec(select(TOKENS), 0..60);
    TestRunner::new(config(512))
        .run(&strategy, |tokens| check(&tokens.concat()))
        .unwrap();
}
