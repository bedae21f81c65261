//! `cordon doctor [--backend …]`: what this host offers each backend, one line per item
//! (`BACKEND: ITEM: ok|missing|info (DETAIL)`), ending with `BACKEND: ready` or
//! `BACKEND: cannot run (…)`. Exit 0 when the selected backend can run here, 1 when it
//! cannot.
//!
//! Each backend has one check function returning its [`Report`]; adding a backend means one
//! arm in [`check`]. The local check probes the kernel (Landlock ABI, seccomp, user, PID and
//! mount namespaces), lists each sandbox layer the default policy needs or uses, and then
//! proves the whole path works: it opens a session with the default policy on a temporary
//! workspace and runs a command and a read through the real tools.

use std::fmt;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use cordon_backend_local::{LayerStatus, Requirement, sandbox_layers};
use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::ToolCall;
use cordon_policy::{CompiledPolicy, EnvMap};
use cordon_runtime::{Session, SessionOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::cmd::common::BackendKind;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The backend whose readiness sets the exit code.
    #[arg(long, value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,
}

/// How one item stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Present and working.
    Ok,
    /// Absent or failing.
    Missing,
    /// A fact, neither good nor bad.
    Info,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok",
            Status::Missing => "missing",
            Status::Info => "info",
        })
    }
}

/// One line of the report.
#[derive(Debug)]
struct Line {
    item: String,
    status: Status,
    detail: String,
}

/// One backend's lines and verdict.
#[derive(Debug)]
struct Report {
    lines: Vec<Line>,
    /// Why the backend cannot run here; empty when it can.
    blockers: Vec<String>,
}

impl Report {
    fn new() -> Report {
        Report {
            lines: Vec::new(),
            blockers: Vec::new(),
        }
    }

    fn line(&mut self, item: impl Into<String>, status: Status, detail: impl Into<String>) {
        self.lines.push(Line {
            item: item.into(),
            status,
            detail: detail.into(),
        });
    }

    /// A line that, when missing, also stops the backend from running.
    fn needed(&mut self, item: impl Into<String>, ok: bool, detail: impl Into<String>) {
        let item = item.into();
        if !ok {
            self.blockers.push(item.clone());
        }
        let status = if ok { Status::Ok } else { Status::Missing };
        self.line(item, status, detail);
    }
}

/// Run `cordon doctor`.
pub async fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let DoctorArgs { backend } = args;
    let mut selected_ready = false;
    for &kind in BackendKind::value_variants() {
        let name = backend_name(kind);
        let report = check(kind).await;
        for Line {
            item,
            status,
            detail,
        } in &report.lines
        {
            if detail.is_empty() {
                println!("{name}: {item}: {status}");
            } else {
                println!("{name}: {item}: {status} ({detail})");
            }
        }
        let ready = report.blockers.is_empty();
        if ready {
            println!("{name}: ready");
        } else {
            println!("{name}: cannot run ({})", report.blockers.join(", "));
        }
        if kind == backend {
            selected_ready = ready;
        }
    }
    Ok(if selected_ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn backend_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Local => "local",
    }
}

/// The checks of one backend.
async fn check(kind: BackendKind) -> Report {
    match kind {
        BackendKind::Local => check_local().await,
    }
}

async fn check_local() -> Report {
    let mut report = Report::new();
    let support = cordon_backend_local::probe_host();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|text| text.trim().to_owned())
        .unwrap_or_else(|error| format!("unknown: {error}"));
    report.line("kernel", Status::Info, format!("Linux {release}"));
    let landlock_detail = match support.landlock_abi {
        0 => "not available; needs Linux 6.2 or later with Landlock enabled".to_owned(),
        abi @ 1..=2 => format!("ABI {abi}; ABI 3 or later (Linux 6.2) is needed"),
        abi => format!("ABI {abi}"),
    };
    report.line(
        "landlock",
        ok_or_missing(support.landlock_abi >= 3),
        landlock_detail,
    );
    report.line(
        "seccomp",
        ok_or_missing(support.seccomp),
        "filter mode, CONFIG_SECCOMP_FILTER",
    );
    let user_detail = match (support.user_namespaces, support.root) {
        (true, _) => "unprivileged user namespaces work",
        (false, true) => "unavailable; not needed as root",
        (false, false) => "unavailable; needed when not running as root",
    };
    report.line(
        "user namespaces",
        ok_or_missing(support.user_namespaces),
        user_detail,
    );
    report.line(
        "pid namespaces",
        ok_or_missing(support.pid_namespaces),
        "a PID namespace per command: nothing outlives it",
    );
    report.line(
        "mount namespaces",
        ok_or_missing(support.mount_namespaces),
        "read-only system, protected and masked paths",
    );

    let env: EnvMap = std::env::vars().collect();
    let spec = match CompiledPolicy::builtin_default(&env) {
        Ok(policy) => policy.sandbox_spec(),
        Err(error) => {
            report.needed("default policy", false, error.to_string());
            return report;
        }
    };
    for LayerStatus {
        layer,
        requirement,
        available,
    } in sandbox_layers(&spec, &support)
    {
        let item = format!("layer {layer}");
        match requirement {
            Requirement::Required => {
                report.needed(
                    item,
                    available,
                    format!("required: {}", layer.requirement()),
                );
            }
            Requirement::Optional => report.line(
                item,
                ok_or_missing(available),
                format!("optional: {}", layer.requirement()),
            ),
        }
    }
    let (ok, detail) = run_probe_session().await;
    report.needed("sandboxed tools", ok, detail);
    report
}

fn ok_or_missing(ok: bool) -> Status {
    if ok { Status::Ok } else { Status::Missing }
}

/// Open a session with the default policy on a temporary workspace and run a command and a
/// read through the whole pipeline: `(worked, what happened)`.
async fn run_probe_session() -> (bool, String) {
    let workspace = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => return (false, format!("failed to create a workspace: {error}")),
    };
    let session = match Session::open(SessionOptions::local(workspace.path())).await {
        Ok(session) => session,
        Err(error) => return (false, format!("failed to open a session: {error}")),
    };
    let control = RunControl::new(CancellationToken::new(), Arc::new(|_: AgentEvent| {}));
    let calls = [
        (
            "bash",
            json!({"command": "echo cordon-doctor > probe.txt", "timeout": 60}),
        ),
        ("read", json!({"path": "probe.txt"})),
    ];
    let mut outcome = (
        true,
        "a command and a read ran under the default policy".to_owned(),
    );
    for (index, (tool, arguments)) in calls.into_iter().enumerate() {
        let call = ToolCall {
            id: format!("doctor-{index}"),
            name: tool.to_owned(),
            arguments,
        };
        let result = session.call(call, &control).await;
        let text = result.text();
        let worked = !result.is_error && (tool != "read" || text.contains("cordon-doctor"));
        if !worked {
            let first = text.lines().find(|line| !line.trim().is_empty());
            outcome = (
                false,
                format!("the {tool} tool failed: {}", first.unwrap_or("no output")),
            );
            break;
        }
    }
    session.shutdown().await;
    outcome
}
