//! Property: a model path, resolved like the tools resolve it and then read or written through
//! the local backend, never reaches outside the workspace. Paths are random mixes of `..`,
//! `.`, `~`, `@`, `file://`, Unicode spaces, NFC/NFD names and symlinks (inside, absolute and
//! relative ones pointing out, a chain) in a temp tree next to an `outside` directory.

use std::os::unix::fs::symlink;

use cordon_ops::paths::resolve_model_path;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngSeed, TestRunner};

use super::support::Fixture;

const PARTS: &[&str] = &[
    "..",
    "..",
    ".",
    "a",
    "in.txt",
    "link-in",
    "link-out",
    "link-out-rel",
    "link-chain",
    "outside",
    "secret.txt",
    "caf\u{E9}.txt",
    "cafe\u{301}.txt",
    "b\u{A0}c",
    "~",
    "ws",
    "",
];

const PREFIXES: &[&str] = &["", "@", "~/", "file://", "/"];

fn config() -> Config {
    let cases = std::env::var("CORDON_PROPTEST_CASES")
        .map(|text| {
            text.parse()
                .expect("CORDON_PROPTEST_CASES must be a number")
        })
        .unwrap_or(256);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolved_model_paths_never_read_or_write_outside_the_workspace() {
    let fx = Fixture::new();
    fx.put("in.txt", "INSIDE\n");
    fx.put("a/in.txt", "INSIDE\n");
    fx.put("caf\u{E9}.txt", "INSIDE\n");
    symlink(fx.at("a"), fx.at("link-in")).unwrap();
    symlink(&fx.outside, fx.at("link-out")).unwrap();
    symlink("../outside", fx.at("link-out-rel")).unwrap();
    symlink("link-out-rel", fx.at("link-chain")).unwrap();
    let before = super::support::names(&fx.outside);
    let secret = std::fs::read(fx.outside.join("secret.txt")).unwrap();
    let home = fx.ws.parent().unwrap().join("home");
    let files = fx.files();
    let runtime = tokio::runtime::Handle::current();
    let strategy = (select(PREFIXES), prop::collection::vec(select(PARTS), 1..7));
    let result = tokio::task::block_in_place(|| {
        TestRunner::new(config()).run(&strategy, |(prefix, parts)| {
            let text = format!("{prefix}{}", parts.join("/"));
            let path = resolve_model_path(&text, &fx.ws, Some(&home));
            if let Ok(data) = runtime.block_on(files.read_file(&path)) {
                prop_assert_eq!(&data, b"INSIDE\n", "read {:?} ({:?})", text, path);
            }
            let wrote = runtime.block_on(files.write_file(&path, b"INSIDE\n"));
            if wrote.is_ok() {
                let real = std::fs::canonicalize(&path).unwrap();
                prop_assert!(real.starts_with(&fx.ws), "wrote {:?} ({:?})", text, real);
            }
            prop_assert_eq!(super::support::names(&fx.outside), before.clone());
            prop_assert_eq!(
                std::fs::read(fx.outside.join("secret.txt")).unwrap(),
                secret.clone()
            );
            Ok(())
        })
    });
    if let Err(error) = result {
        panic!("{error}");
    }
}
