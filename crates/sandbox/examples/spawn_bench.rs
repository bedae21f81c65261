//! Spawn cost of `bash -c true`: bare `Command` vs the full sandbox, plus references (one
//! extra exec hop, which is what a re-exec'd helper would add; the sandbox's spawn path with
//! no layer; the sandbox without namespaces). Interleaved runs, wall-clock p50/p95 in
//! microseconds; then CPU time per spawn (this process plus its reaped children, from
//! /proc/self/stat), which other load on the machine barely disturbs.
//!
//! `cargo run --release -p cordon-sandbox --example spawn_bench [RUNS]` (as root, Linux).

use std::time::Instant;

use cordon_sandbox::{HostSupport, PreparedSandbox, SandboxConfig, SpawnRequest};

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

fn sandboxed(sandbox: &PreparedSandbox, cwd: &std::path::Path) -> f64 {
    let start = Instant::now();
    let mut child = sandbox
        .spawn(SpawnRequest {
            program: "bash".into(),
            args: vec!["-c".into(), "true".into()],
            cwd: cwd.to_path_buf(),
            env: Vec::new(),
            stdin: None,
            stdout: None,
            stderr: None,
        })
        .expect("spawn");
    let spawned = start.elapsed().as_secs_f64() * 1e6;
    let status = child.wait_blocking().expect("wait");
    assert!(status.success());
    let total = start.elapsed().as_secs_f64() * 1e6;
    if std::env::var_os("BENCH_SPLIT").is_some() {
        eprintln!("split spawn {spawned:.0} wait {:.0}", total - spawned);
    }
    total
}

fn bare(program: &str, args: &[&str]) -> f64 {
    let start = Instant::now();
    let status = std::process::Command::new(program)
        .args(args)
        .status()
        .expect("spawn");
    assert!(status.success());
    start.elapsed().as_secs_f64() * 1e6
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let workspace = std::env::temp_dir().join(format!("cordon-bench-{}", std::process::id()));
    std::fs::create_dir_all(workspace.join(".git")).expect("workspace");
    let mut config = SandboxConfig::with_defaults(cordon_sandbox::host_defaults());
    config.write.push(workspace.clone());
    config.protected.push(workspace.join(".git"));
    let full = PreparedSandbox::prepare(config.clone()).expect("prepare");
    let config_for_cpu = config.clone();
    let mut degraded_config = config;
    degraded_config.allow_degraded = true;
    let no_namespaces = PreparedSandbox::prepare_with_support(
        degraded_config.clone(),
        HostSupport {
            pid_namespaces: false,
            mount_namespaces: false,
            ..cordon_sandbox::probe()
        },
    )
    .expect("prepare without namespaces");
    let bare_sandbox = PreparedSandbox::prepare_with_support(
        degraded_config,
        HostSupport {
            pid_namespaces: false,
            mount_namespaces: false,
            landlock_abi: 0,
            seccomp: false,
            ..cordon_sandbox::probe()
        },
    )
    .expect("prepare without any layer");

    let mut results: [(&str, Vec<f64>); 5] = [
        ("bare Command bash -c true", Vec::new()),
        ("bare + one exec hop (env bash -c true)", Vec::new()),
        ("sandbox spawn path, no layer at all", Vec::new()),
        ("sandbox, no namespaces (degraded)", Vec::new()),
        ("sandbox, full", Vec::new()),
    ];
    for _ in 0..20 {
        bare("bash", &["-c", "true"]);
        sandboxed(&full, &workspace);
    }
    for _ in 0..runs {
        results[0].1.push(bare("bash", &["-c", "true"]));
        results[1]
            .1
            .push(bare("/usr/bin/env", &["bash", "-c", "true"]));
        results[2].1.push(sandboxed(&bare_sandbox, &workspace));
        results[3].1.push(sandboxed(&no_namespaces, &workspace));
        results[4].1.push(sandboxed(&full, &workspace));
    }
    let base = percentile(&mut results[0].1.clone(), 0.5);
    println!("{runs} runs each, interleaved; microseconds");
    for (name, samples) in results.iter_mut() {
        let p50 = percentile(samples, 0.5);
        let p95 = percentile(samples, 0.95);
        println!(
            "{name:<42} p50 {p50:>7.0}  p95 {p95:>7.0}  ({:.2}x bare p50)",
            p50 / base
        );
    }
    println!("CPU time per spawn (user + system, self + children), {runs} sequential runs each:");
    let rows: [(&str, &dyn Fn()); 5] = [
        ("bare Command bash -c true", &|| {
            bare("bash", &["-c", "true"]);
        }),
        ("bare + one exec hop (env bash -c true)", &|| {
            bare("/usr/bin/env", &["bash", "-c", "true"]);
        }),
        ("sandbox spawn path, no layer at all", &|| {
            sandboxed(&bare_sandbox, &workspace);
        }),
        ("sandbox, no namespaces (degraded)", &|| {
            sandboxed(&no_namespaces, &workspace);
        }),
        (
            "sandbox, full (inits reused; CPU counted once reaped)",
            &|| {
                // A fresh sandbox, dropped at the end: its idle init exits and is reaped, which is
                // when the commands it reaped count as this process's children.
                let fresh = PreparedSandbox::prepare(config_for_cpu.clone()).expect("prepare");
                for _ in 0..runs {
                    sandboxed(&fresh, &workspace);
                }
            },
        ),
    ];
    let mut base_cpu = None;
    for (index, (name, run)) in rows.iter().enumerate() {
        let before = cpu_ticks();
        if index == rows.len() - 1 {
            run();
        } else {
            for _ in 0..runs {
                run();
            }
        }
        // Inits still tearing down are reaped in the background: let them finish.
        std::thread::sleep(std::time::Duration::from_millis(1000));
        let per_run = (cpu_ticks() - before) as f64 * 1e6 / ticks_per_second() / runs as f64;
        let base = *base_cpu.get_or_insert(per_run);
        println!(
            "{name:<52} {per_run:>7.0} us CPU  ({:.2}x bare)",
            per_run / base
        );
    }
    // Scratch directory of a benchmark: a leftover in the temp dir is harmless.
    let _ = std::fs::remove_dir_all(&workspace);
}

/// utime + stime + cutime + cstime of this process, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // Fields 14..=17 of proc(5); `rest` starts at field 3.
    (14..=17)
        .map(|field| fields[field - 3].parse::<u64>().expect("ticks"))
        .sum()
}

/// The kernel's USER_HZ (100 on every Linux architecture this targets).
fn ticks_per_second() -> f64 {
    100.0
}
