//! `cordon doctor [--backend …]`: what this host offers each backend, one line per item
//! (`BACKEND: ITEM: ok|missing|info (DETAIL)`), ending with `BACKEND: ready` or
//! `BACKEND: cannot run (…)`. Exit 0 when the selected backend can run here, 1 when it
//! cannot. A backend this binary was built without (cargo features `docker`, `ssh`) gets one
//! `BACKEND: not built into this cordon …` line; selecting it is a usage error (exit 2).
//!
//! Each backend has one check function returning its [`Report`]; adding a backend means one
//! arm in [`check`]. The local check probes the kernel (Landlock ABI, seccomp, user, PID and
//! mount namespaces), lists each sandbox layer the default policy needs or uses, and then
//! proves the whole path works: it opens a session with the default policy on a temporary
//! workspace and runs a command and a read through the real tools.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use cordon_backend_local::{LayerStatus, Requirement, sandbox_layers};
use cordon_core::event::AgentEvent;
use cordon_core::executor::RunControl;
use cordon_core::protocol::ToolCall;
use cordon_policy::{CompiledPolicy, EnvMap};
use cordon_runtime::{Session, SessionOptions};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cmd::common::{BackendKind, CommonArgs, Settings, WorkspaceModeArg};
use crate::config::Candidate;
use crate::output::print_json_line;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// `--backend` selects the backend whose readiness sets the exit code (it is also the one
    /// probed with a real session); the docker and ssh options say how to reach it.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Print one JSON object (docs/contract.md#doctor) instead of lines; the exit code is the
    /// same.
    #[arg(long)]
    pub json: bool,
}

/// How one item stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    /// Present and working.
    Ok,
    /// Absent or failing.
    Missing,
    /// A fact, neither good nor bad.
    Info,
    /// Works, but something the operator should change (not a blocker).
    Warning,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok",
            Status::Missing => "missing",
            Status::Info => "info",
            Status::Warning => "warning",
        })
    }
}

/// One line of the report.
#[derive(Debug, Serialize)]
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

/// One backend's part of the report.
#[derive(Debug)]
struct BackendSection {
    kind: BackendKind,
    /// `None` when this binary was built without the backend.
    report: Option<Report>,
    /// Whether its readiness was established (the local backend and the selected one).
    probed: bool,
}

impl BackendSection {
    fn ready(&self) -> bool {
        self.report
            .as_ref()
            .is_some_and(|report| report.blockers.is_empty())
    }
}

/// Run `cordon doctor`.
pub async fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let DoctorArgs { common, json } = args;
    let settings = common.settings()?;
    let backend = settings.backend;
    backend.require_built()?;
    let (config, policy) = check_config(&settings);
    let mut sections = Vec::new();
    for &kind in BackendKind::value_variants() {
        let report = if kind.is_built() {
            Some(check(kind, kind == backend, &common, &settings, policy.as_ref()).await)
        } else {
            None
        };
        sections.push(BackendSection {
            kind,
            report,
            probed: kind == backend || kind == BackendKind::Local,
        });
    }
    let ready = config.blockers.is_empty()
        && sections
            .iter()
            .any(|section| section.kind == backend && section.ready());
    if json {
        print_json(&settings, &config, &sections, ready);
    } else {
        print_text(&config, &sections);
    }
    Ok(if ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The lines: the config section, then each backend's lines and verdict.
fn print_text(config: &Report, sections: &[BackendSection]) {
    print_lines("config", config);
    for section in sections {
        let name = section.kind.name();
        let Some(report) = &section.report else {
            println!("{name}: not built into this cordon (rebuild with `--features {name}`)");
            continue;
        };
        print_lines(name, report);
        let colour = crate::colour::stdout_enabled();
        if !section.probed {
            println!("{name}: not probed (select it with --backend {name})");
        } else if section.ready() {
            println!("{name}: {}", crate::colour::paint("ready", "32", colour));
        } else {
            println!(
                "{name}: {} ({})",
                crate::colour::paint("cannot run", "31", colour),
                report.blockers.join(", ")
            );
        }
    }
}

/// The report as one JSON object (docs/contract.md#doctor).
fn print_json(settings: &Settings, config: &Report, sections: &[BackendSection], ready: bool) {
    let backends: Vec<Value> = sections
        .iter()
        .map(|section| {
            let (items, blockers) = match &section.report {
                Some(report) => (json!(report.lines), json!(report.blockers)),
                None => (json!([]), json!([])),
            };
            json!({
                "name": section.kind.name(),
                "built": section.report.is_some(),
                "selected": section.kind == settings.backend,
                "probed": section.report.is_some() && section.probed,
                "ready": section.probed && section.ready(),
                "blockers": blockers,
                "items": items,
            })
        })
        .collect();
    let files: Vec<Value> = settings
        .config
        .files
        .iter()
        .map(|file| {
            json!({
                "origin": file.origin,
                "path": file.path.display().to_string(),
                "present": file.present,
            })
        })
        .collect();
    let values: serde_json::Map<String, Value> = settings
        .origins
        .iter()
        .map(|(key, setting)| ((*key).to_owned(), json!(setting)))
        .collect();
    print_json_line(&json!({
        "selected": settings.backend.name(),
        "ready": ready,
        "config": {
            "policy": {
                "source": settings.policy.source.display_name(),
                "origin": settings.policy.origin,
                "candidates": settings.policy.candidates,
            },
            "files": files,
            "settings": values,
            "blockers": config.blockers,
            "items": config.lines,
        },
        "backends": backends,
    }));
}

impl Status {
    /// The status word, coloured when `colour` (ok green, missing red, warning yellow, info
    /// plain).
    fn mark(self, colour: bool) -> String {
        let code = match self {
            Status::Ok => "32",
            Status::Missing => "31",
            Status::Warning => "33",
            Status::Info => return self.to_string(),
        };
        crate::colour::paint(&self.to_string(), code, colour)
    }
}

/// Print a report's lines as `SECTION: ITEM: STATUS (DETAIL)`.
fn print_lines(section: &str, report: &Report) {
    let colour = crate::colour::stdout_enabled();
    for Line {
        item,
        status,
        detail,
    } in &report.lines
    {
        let status = status.mark(colour);
        if detail.is_empty() {
            println!("{section}: {item}: {status}");
        } else {
            println!("{section}: {item}: {status} ({detail})");
        }
    }
}

/// Which policy and config files were chosen and why: one line per discovery candidate, the
/// policy (compiled, so a broken one shows here), the config files and each setting's origin.
/// Returns the compiled policy when it loads.
fn check_config(settings: &Settings) -> (Report, Option<CompiledPolicy>) {
    let mut report = Report::new();
    for Candidate {
        origin,
        path,
        state,
    } in &settings.policy.candidates
    {
        let detail = match path {
            Some(path) => format!("{path}: {}", state.describe()),
            None => state.describe().to_owned(),
        };
        report.line(format!("policy candidate {origin}"), Status::Info, detail);
    }
    let env: EnvMap = std::env::vars().collect();
    let name = settings.policy.source.display_name();
    let policy = match CompiledPolicy::load_source(&settings.policy.source, &env) {
        Ok(policy) => {
            report.line(
                "policy",
                Status::Ok,
                format!(
                    "{name}, from {} ({} rules, default {})",
                    settings.policy.origin,
                    policy.rule_count(),
                    policy.default_decision()
                ),
            );
            Some(policy)
        }
        Err(error) => {
            report.needed("policy", false, error.to_string());
            None
        }
    };
    for file in &settings.config.files {
        let state = if file.present { "present" } else { "absent" };
        report.line(
            format!("config file {}", file.origin),
            Status::Info,
            format!("{}: {state}", file.path.display()),
        );
    }
    for (key, setting) in &settings.origins {
        let detail = match &setting.value {
            Some(value) => format!("{value}, from {}", setting.origin),
            None => "not set".to_owned(),
        };
        report.line(*key, Status::Info, detail);
    }
    (report, policy)
}

/// The checks of one backend. Only the selected remote backend is probed with a real session
/// (it starts a container or opens a connection); the others get the cheap lines.
async fn check(
    kind: BackendKind,
    selected: bool,
    common: &CommonArgs,
    settings: &Settings,
    policy: Option<&CompiledPolicy>,
) -> Report {
    match kind {
        BackendKind::Local => check_local(&common.root, policy).await,
        BackendKind::Docker => check_docker(selected, common, settings).await,
        BackendKind::Ssh => check_ssh(selected, common, settings).await,
    }
}

/// How the engine is reached: a socket, TLS with which certificates, or plaintext TCP.
#[cfg(feature = "docker")]
fn engine_tls(report: &mut Report) {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let engine = cordon_runtime::DockerEngine::resolve(
        None,
        &|name| std::env::var(name).ok(),
        home.as_deref(),
    );
    match engine {
        Ok(engine) => match &engine.tls {
            Some(dir) => report.line(
                "tls",
                Status::Ok,
                format!(
                    "the engine is verified with ca.pem, cert.pem and key.pem from {}",
                    dir.display()
                ),
            ),
            None if engine.host.starts_with("unix://") => {
                report.line("tls", Status::Info, "not used (a local socket)")
            }
            None => report.line(
                "tls",
                Status::Warning,
                "plaintext TCP: set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH to verify the engine",
            ),
        },
        Err(error) => report.needed("tls", false, error.to_string()),
    }
}

#[cfg(not(feature = "docker"))]
fn engine_tls(_report: &mut Report) {}

/// How the engine is reached (unix, tcp, tcp+tls, ssh) and so how the workspace reaches the
/// container: an engine that may be on another machine gets copy mode whatever was asked.
#[cfg(feature = "docker")]
fn engine_transport(report: &mut Report, asked: WorkspaceModeArg) {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let Ok(engine) = cordon_runtime::DockerEngine::resolve(
        None,
        &|name| std::env::var(name).ok(),
        home.as_deref(),
    ) else {
        // The tls line says why the engine cannot be used.
        return;
    };
    let transport = engine.transport();
    report.line("transport", Status::Info, transport.to_string());
    let mode = match (transport.is_remote(), asked) {
        (true, _) => "copy (the engine may be on another machine: the workspace and the file \
                      helper are copied in)"
            .to_owned(),
        (false, WorkspaceModeArg::Bind) => "bind (the workspace is bind-mounted)".to_owned(),
        (false, WorkspaceModeArg::Copy) => "copy (--workspace-mode copy)".to_owned(),
    };
    report.line("workspace", Status::Info, mode);
}

#[cfg(not(feature = "docker"))]
fn engine_transport(_report: &mut Report, _asked: WorkspaceModeArg) {}

/// Which engine answers (Docker or Podman), asked through a real connection.
#[cfg(feature = "docker")]
async fn engine_kind(report: &mut Report) {
    let kind = match cordon_runtime::docker_connect(None).await {
        Ok((docker, _)) => cordon_runtime::docker_engine_kind(&docker).await,
        Err(error) => Err(error),
    };
    match kind {
        Ok(kind) => report.line("engine kind", Status::Info, kind.to_string()),
        Err(error) => report.line("engine kind", Status::Missing, error.to_string()),
    }
}

#[cfg(not(feature = "docker"))]
async fn engine_kind(_report: &mut Report) {}

/// Whether filtered network mode (`[network] allow`) can run: a `cordon-helper` for this
/// machine's architecture that runs here (the engine is assumed local: filtered mode needs
/// bind mode). Not a blocker: only policies with an allow list need it.
#[cfg(feature = "docker")]
fn docker_filtered(report: &mut Report) {
    let item = "filtered network";
    let helper = match cordon_runtime::docker_egress_helper(None, std::env::consts::ARCH) {
        Ok(path) => path,
        Err(reason) => {
            report.line(
                item,
                Status::Missing,
                format!("{reason}; policies with `[network] allow` are refused on this backend"),
            );
            return;
        }
    };
    match std::process::Command::new(&helper)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => report.line(
            item,
            Status::Ok,
            format!(
                "{} forwards the egress proxy into containers (the image must be able to run \
                 it: a glibc build needs a glibc image such as cordon-sandbox)",
                helper.display()
            ),
        ),
        Ok(out) => report.line(
            item,
            Status::Missing,
            format!(
                "{} --version failed ({}); policies with `[network] allow` are refused on \
                 this backend",
                helper.display(),
                out.status
            ),
        ),
        Err(error) => report.line(
            item,
            Status::Missing,
            format!(
                "failed to run {}: {error}; policies with `[network] allow` are refused on \
                 this backend",
                helper.display()
            ),
        ),
    }
}

#[cfg(not(feature = "docker"))]
fn docker_filtered(_report: &mut Report) {}

async fn check_docker(selected: bool, common: &CommonArgs, settings: &Settings) -> Report {
    let mut report = Report::new();
    let host =
        std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_owned());
    report.line("engine", Status::Info, format!("DOCKER_HOST={host}"));
    engine_tls(&mut report);
    engine_transport(&mut report, settings.workspace_mode);
    report.line("image", Status::Info, settings.image.clone());
    docker_filtered(&mut report);
    if !selected {
        report.line(
            "session",
            Status::Info,
            "not probed; run `cordon doctor --backend docker`",
        );
        return report;
    }
    let workspace = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => {
            report.needed(
                "session",
                false,
                format!("failed to create a workspace: {error}"),
            );
            return report;
        }
    };
    let mut options = match common.session_options_with(settings) {
        Ok(options) => options,
        Err(error) => {
            report.needed("options", false, error.to_string());
            return report;
        }
    };
    engine_kind(&mut report).await;
    options.root = workspace.path().to_path_buf();
    options.policy = None;
    let (ok, detail, paths) = run_probe_session(options).await;
    for (what, path) in paths {
        report.line(what, Status::Info, path);
    }
    report.needed("sandboxed tools", ok, detail);
    report
}

async fn check_ssh(selected: bool, common: &CommonArgs, settings: &Settings) -> Report {
    let mut report = Report::new();
    match std::env::var_os("SSH_AUTH_SOCK") {
        Some(sock) if std::path::Path::new(&sock).exists() => {
            report.line(
                "ssh-agent",
                Status::Ok,
                format!("SSH_AUTH_SOCK={}", sock.to_string_lossy()),
            );
        }
        Some(sock) => report.line(
            "ssh-agent",
            Status::Missing,
            format!("SSH_AUTH_SOCK={} does not exist", sock.to_string_lossy()),
        ),
        None => report.line(
            "ssh-agent",
            Status::Missing,
            "SSH_AUTH_SOCK is not set; keys come from --identity or the ssh config",
        ),
    }
    let known_hosts = common.known_hosts.clone().or_else(|| {
        std::env::var_os("HOME").map(|home| std::path::PathBuf::from(home).join(".ssh/known_hosts"))
    });
    match known_hosts
        .as_deref()
        .map(|path| (path, std::fs::read_to_string(path)))
    {
        Some((path, Ok(text))) => {
            let entries = text
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .count();
            report.line(
                "known_hosts",
                Status::Ok,
                format!("{} ({entries} entries)", path.display()),
            );
        }
        Some((path, Err(error))) => report.line(
            "known_hosts",
            Status::Missing,
            format!(
                "{}: {error}; unknown hosts are refused until trusted with ssh-keyscan",
                path.display()
            ),
        ),
        None => report.line(
            "known_hosts",
            Status::Missing,
            "no HOME and no --known-hosts",
        ),
    }
    if !selected {
        report.line(
            "session",
            Status::Info,
            "not probed; run `cordon doctor --backend ssh --host HOST --remote-root DIR`",
        );
        return report;
    }
    let options = match common.session_options_with(settings) {
        Ok(options) => options,
        Err(error) => {
            report.needed("options", false, error.to_string());
            return report;
        }
    };
    #[cfg(feature = "ssh")]
    if let cordon_runtime::BackendChoice::Ssh(ssh) = &options.backend {
        remote_helper(&mut report, ssh.clone(), options.allow_degraded).await;
    }
    let (ok, detail, _) = run_probe_session(SessionOptions {
        policy: None,
        ..options
    })
    .await;
    report.needed("sandboxed tools", ok, detail);
    report
}

/// The helper the host runs commands in (which binary, whether it was uploaded now or found
/// in the cache, its hash) and the sandbox layers its kernel provides.
#[cfg(feature = "ssh")]
async fn remote_helper(report: &mut Report, ssh: cordon_runtime::SshOptions, degraded_ok: bool) {
    use cordon_runtime::ssh::SshBackend;
    let spec = cordon_core::sandbox::SandboxSpec::default();
    let backend = match SshBackend::connect(ssh.config(spec)).await {
        Ok(backend) => backend,
        Err(error) => {
            report.needed("helper", false, format!("failed to connect: {error}"));
            return;
        }
    };
    match backend.helper_report() {
        Some(helper) => report.line(
            "helper",
            Status::Ok,
            format!(
                "{} (sha256 {}) runs on the {} host from {} ({})",
                helper.local.path.display(),
                helper.local.sha256,
                helper.arch,
                helper.remote_path,
                if helper.uploaded {
                    "uploaded now"
                } else {
                    "cached"
                }
            ),
        ),
        None => {
            let reason = backend
                .helper_refusal()
                .unwrap_or("the helper does not run");
            if degraded_ok {
                report.line(
                    "helper",
                    Status::Warning,
                    format!("{reason}; commands run unconfined (--allow-degraded)"),
                );
            } else {
                report.needed(
                    "helper",
                    false,
                    format!("{reason}; commands are refused (or pass --allow-degraded)"),
                );
            }
        }
    }
    if backend.helper_report().is_some() {
        match backend.helper_probe().await {
            Ok(probe) => {
                let landlock = match probe.landlock_abi {
                    0 => "not available".to_owned(),
                    abi => format!("ABI {abi}"),
                };
                report.line(
                    "remote landlock",
                    ok_or_missing(probe.landlock_abi >= 3),
                    landlock,
                );
                report.line(
                    "remote seccomp",
                    ok_or_missing(probe.seccomp),
                    "filter mode",
                );
                report.line(
                    "remote namespaces",
                    ok_or_missing(probe.pid_namespaces && probe.mount_namespaces),
                    format!(
                        "user {}, pid {}, mount {}{}",
                        yes_no(probe.user_namespaces),
                        yes_no(probe.pid_namespaces),
                        yes_no(probe.mount_namespaces),
                        if probe.root {
                            " (the helper runs as root)"
                        } else {
                            ""
                        }
                    ),
                );
            }
            Err(error) => report.line("remote layers", Status::Missing, error),
        }
        let missing = cordon_ops::Backend::missing_layers(&backend);
        if !missing.is_empty() {
            report.line("remote sandbox", Status::Warning, missing.join("; "));
        }
    }
    if let Err(error) = cordon_ops::Backend::shutdown(&backend).await {
        tracing::debug!(%error, "doctor: ssh shutdown failed");
    }
}

#[cfg(feature = "ssh")]
fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

async fn check_local(root: &Path, policy: Option<&CompiledPolicy>) -> Report {
    let mut report = Report::new();
    match outside_hard_links(root, HARD_LINK_SCAN_LIMIT) {
        Ok(scan) if scan.linked.is_empty() => report.line(
            "workspace hard links",
            Status::Ok,
            format!(
                "none to files outside {} ({} entries looked at)",
                root.display(),
                scan.entries
            ),
        ),
        Ok(scan) => report.line(
            "workspace hard links",
            Status::Warning,
            format!(
                "{} file(s) in {} are hard links to files outside it, e.g. {}; commands can \
                 write through them to the outside file (copy them instead: pnpm \
                 package-import-method=copy, UV_LINK_MODE=copy)",
                scan.linked.len(),
                root.display(),
                scan.linked[0].display()
            ),
        ),
        Err(error) => report.line(
            "workspace hard links",
            Status::Info,
            format!("not checked: {error}"),
        ),
    }
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
    let restriction = userns_restriction(Path::new("/proc"));
    tracing::debug!(?restriction, "user namespace restriction read");
    let (status, detail) = describe_userns_restriction(
        &restriction,
        support.user_namespaces,
        std::env::current_exe().ok().as_deref(),
    );
    report.line("user namespace restriction", status, detail);
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
    report.line(
        "network namespaces",
        ok_or_missing(support.network_namespaces),
        "filtered network mode: loopback only, the egress proxy the one way out",
    );

    // The layers the policy in use needs; without one (it failed to load, which the config
    // section reports), those of the default policy.
    let spec = match policy {
        Some(policy) => policy.sandbox_spec(),
        None => match CompiledPolicy::builtin_default(&EnvMap::new()) {
            Ok(policy) => policy.sandbox_spec(),
            Err(error) => {
                report.needed("default policy", false, error.to_string());
                return report;
            }
        },
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
    let workspace = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => {
            report.needed(
                "sandboxed tools",
                false,
                format!("failed to create a workspace: {error}"),
            );
            return report;
        }
    };
    let (ok, detail, _) = run_probe_session(SessionOptions::local(workspace.path())).await;
    report.needed("sandboxed tools", ok, detail);
    report
}

/// A host setting that keeps unprivileged processes from creating user namespaces.
#[derive(Clone, Debug, PartialEq, Eq)]
enum UsernsRestriction {
    /// Nothing restricts them (the settings are absent or permissive).
    None,
    /// Ubuntu 23.10+: `kernel.apparmor_restrict_unprivileged_userns = 1`; only processes
    /// whose AppArmor profile grants `userns` may create one.
    AppArmor,
    /// Debian-patched kernels: `kernel.unprivileged_userns_clone = 0`.
    CloneDisabled,
    /// `user.max_user_namespaces = 0`.
    NoneAllowed,
}

/// Read the settings under `proc_root` (`/proc` on a real host; a directory of the same
/// layout in tests). The first restriction found wins; an unreadable setting counts as absent.
fn userns_restriction(proc_root: &Path) -> UsernsRestriction {
    let read = |relative: &str| {
        std::fs::read_to_string(proc_root.join(relative))
            .ok()
            .map(|text| text.trim().to_owned())
    };
    if read("sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        UsernsRestriction::AppArmor
    } else if read("sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        UsernsRestriction::CloneDisabled
    } else if read("sys/user/max_user_namespaces").as_deref() == Some("0") {
        UsernsRestriction::NoneAllowed
    } else {
        UsernsRestriction::None
    }
}

/// The doctor line for a restriction: what it is and what to do. `works` says whether user
/// namespaces could be created anyway (root, or a profile already allows the binary).
fn describe_userns_restriction(
    restriction: &UsernsRestriction,
    works: bool,
    binary: Option<&Path>,
) -> (Status, String) {
    let fix = match restriction {
        UsernsRestriction::None => {
            return (
                Status::Ok,
                "not restricted (no AppArmor userns restriction, unprivileged_userns_clone \
                 and max_user_namespaces allow them)"
                    .to_owned(),
            );
        }
        UsernsRestriction::AppArmor => {
            let binary = binary.map_or_else(
                || "/usr/local/bin/cordon".to_owned(),
                |path| path.display().to_string(),
            );
            format!(
                "kernel.apparmor_restrict_unprivileged_userns = 1 (Ubuntu 23.10 and later): \
                 only programs whose AppArmor profile allows `userns` may create user \
                 namespaces. Either give cordon a profile that allows it: `printf \
                 'abi <abi/4.0>,\\ninclude <tunables/global>\\nprofile cordon {binary} \
                 flags=(unconfined) {{\\n  userns,\\n}}\\n' | sudo tee \
                 /etc/apparmor.d/cordon && sudo apparmor_parser -r \
                 /etc/apparmor.d/cordon`; or lift the restriction for every program: `sudo \
                 sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (persist it in \
                 /etc/sysctl.d/)"
            )
        }
        UsernsRestriction::CloneDisabled => "kernel.unprivileged_userns_clone = 0 (a \
            Debian-patched kernel): unprivileged user namespaces are off; `sudo sysctl -w \
            kernel.unprivileged_userns_clone=1` (persist it in /etc/sysctl.d/)"
            .to_owned(),
        UsernsRestriction::NoneAllowed => "user.max_user_namespaces = 0: no user namespace \
            may be created; `sudo sysctl -w user.max_user_namespaces=15000` (persist it in \
            /etc/sysctl.d/)"
            .to_owned(),
    };
    if works {
        (
            Status::Info,
            format!(
                "{fix}; user namespaces work for cordon here all the same (root, or a profile allows it)"
            ),
        )
    } else {
        (Status::Warning, fix)
    }
}

/// Entries [`outside_hard_links`] looks at before it stops (a doctor run stays quick).
const HARD_LINK_SCAN_LIMIT: usize = 200_000;

/// What [`outside_hard_links`] found.
#[derive(Debug, Default)]
struct HardLinkScan {
    /// Regular files with more links than the walk found inside the root, sorted.
    linked: Vec<PathBuf>,
    /// Entries looked at.
    entries: usize,
}

/// Regular files under `root` that share their inode with a file outside it: files whose link
/// count exceeds the links the walk saw inside. Symlinks are not followed, `.git` is skipped,
/// and the walk stops with an error after `limit` entries.
fn outside_hard_links(root: &Path, limit: usize) -> std::io::Result<HardLinkScan> {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;

    let mut scan = HardLinkScan::default();
    // (dev, ino) → (links seen inside, link count, first path)
    let mut seen: HashMap<(u64, u64), (u64, u64, PathBuf)> = HashMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            scan.entries += 1;
            if scan.entries > limit {
                return Err(std::io::Error::other(format!(
                    "more than {limit} entries under {}",
                    root.display()
                )));
            }
            let file_type = entry.file_type()?;
            if file_type.is_dir() {
                if entry.file_name() != ".git" {
                    pending.push(entry.path());
                }
            } else if file_type.is_file() {
                let meta = entry.metadata()?;
                if meta.nlink() > 1 {
                    seen.entry((meta.dev(), meta.ino()))
                        .or_insert_with(|| (0, meta.nlink(), entry.path()))
                        .0 += 1;
                }
            }
        }
    }
    scan.linked = seen
        .into_values()
        .filter(|(inside, links, _)| inside < links)
        .map(|(_, _, path)| path)
        .collect();
    scan.linked.sort();
    Ok(scan)
}

fn ok_or_missing(ok: bool) -> Status {
    if ok { Status::Ok } else { Status::Missing }
}

/// Open a session with the default policy and run a command and a read through the whole
/// pipeline: `(worked, what happened)`. The probe file is written into the workspace of
/// `options` (a temporary directory for local and docker; the remote root for ssh).
/// Run a command and a read in a session: whether they worked, what failed, and (Docker)
/// which path file operations took.
/// Run the probe calls in a session: whether they worked, what happened, and (Docker) which
/// path file operations and commands took.
async fn run_probe_session(options: SessionOptions) -> (bool, String, Vec<(&'static str, String)>) {
    let session = match Session::open(options).await {
        Ok(session) => session,
        Err(error) => {
            return (
                false,
                format!("failed to open a session: {error}"),
                Vec::new(),
            );
        }
    };
    let paths: Vec<(&'static str, String)> = [
        ("file operations", session.files_path()),
        ("commands", session.commands_path()),
    ]
    .into_iter()
    .filter_map(|(what, path)| path.map(|path| (what, path.to_owned())))
    .collect();
    let control = RunControl::new(CancellationToken::new(), Arc::new(|_: AgentEvent| {}));
    let calls = [
        (
            "bash",
            json!({"command": "echo cordon-doctor > .cordon-doctor-probe.txt", "timeout": 60}),
        ),
        ("read", json!({"path": ".cordon-doctor-probe.txt"})),
        (
            "bash",
            json!({"command": "rm -f .cordon-doctor-probe.txt", "timeout": 60}),
        ),
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
    if let Err(error) = session.shutdown().await
        && outcome.0
    {
        outcome = (false, error.to_string());
    }
    (outcome.0, outcome.1, paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory laid out like `/proc` with the given `(relative path, content)` settings.
    fn fake_proc(settings: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (relative, content) in settings {
            let path = dir.path().join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        dir
    }

    #[test]
    fn userns_restrictions_are_read_from_the_proc_root() {
        let apparmor = "sys/kernel/apparmor_restrict_unprivileged_userns";
        let clone = "sys/kernel/unprivileged_userns_clone";
        let max = "sys/user/max_user_namespaces";
        let cases: &[(&[(&str, &str)], UsernsRestriction)] = &[
            (&[], UsernsRestriction::None),
            (
                &[(apparmor, "0\n"), (clone, "1\n"), (max, "63000\n")],
                UsernsRestriction::None,
            ),
            (&[(apparmor, "1\n")], UsernsRestriction::AppArmor),
            (
                &[(apparmor, "1\n"), (clone, "0\n")],
                UsernsRestriction::AppArmor,
            ),
            (&[(clone, "0\n")], UsernsRestriction::CloneDisabled),
            (&[(max, "0\n")], UsernsRestriction::NoneAllowed),
        ];
        for (settings, expected) in cases {
            let proc_root = fake_proc(settings);
            assert_eq!(
                &userns_restriction(proc_root.path()),
                expected,
                "{settings:?}"
            );
        }
    }

    #[test]
    fn a_userns_restriction_says_what_to_do() {
        let binary = Path::new("/opt/bin/cordon");
        let (status, detail) =
            describe_userns_restriction(&UsernsRestriction::AppArmor, false, Some(binary));
        assert_eq!(status, Status::Warning);
        assert!(
            detail.starts_with("kernel.apparmor_restrict_unprivileged_userns = 1"),
            "{detail}"
        );
        assert!(
            detail.contains(
                "`printf 'abi <abi/4.0>,\\ninclude <tunables/global>\\nprofile cordon \
                 /opt/bin/cordon flags=(unconfined) {\\n  userns,\\n}\\n' | sudo tee \
                 /etc/apparmor.d/cordon && sudo apparmor_parser -r /etc/apparmor.d/cordon`"
            ),
            "{detail}"
        );
        assert!(
            detail.contains("sudo apparmor_parser -r /etc/apparmor.d/cordon"),
            "{detail}"
        );
        assert!(
            detail.contains("sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"),
            "{detail}"
        );
        let (status, detail) =
            describe_userns_restriction(&UsernsRestriction::AppArmor, true, Some(binary));
        assert_eq!(status, Status::Info);
        assert!(
            detail.ends_with("work for cordon here all the same (root, or a profile allows it)")
        );
        let (status, detail) =
            describe_userns_restriction(&UsernsRestriction::CloneDisabled, false, None);
        assert_eq!(status, Status::Warning);
        assert!(
            detail.contains("sudo sysctl -w kernel.unprivileged_userns_clone=1"),
            "{detail}"
        );
        let (status, detail) =
            describe_userns_restriction(&UsernsRestriction::NoneAllowed, false, None);
        assert_eq!(status, Status::Warning);
        assert!(
            detail.contains("sudo sysctl -w user.max_user_namespaces=15000"),
            "{detail}"
        );
        let (status, _) = describe_userns_restriction(&UsernsRestriction::None, true, None);
        assert_eq!(status, Status::Ok);
    }

    #[test]
    fn hard_links_to_outside_files_are_found_and_inside_pairs_are_not() {
        let base = tempfile::tempdir().unwrap();
        let ws = base.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(base.path().join("outside.txt"), "host").unwrap();
        std::fs::hard_link(base.path().join("outside.txt"), ws.join("sub/linked.txt")).unwrap();
        std::fs::write(ws.join("a.txt"), "a").unwrap();
        std::fs::hard_link(ws.join("a.txt"), ws.join("b.txt")).unwrap();
        let scan = outside_hard_links(&ws, 1000).unwrap();
        assert_eq!(scan.linked, [ws.join("sub/linked.txt")]);
        assert!(outside_hard_links(&ws, 2).is_err());
    }
}
