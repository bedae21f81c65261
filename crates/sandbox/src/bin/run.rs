//! `cordon-sandbox-run`: run one command in the local sandbox with the host defaults, for
//! manual checks, the README and the integration tests. Exit code: the command's (128 +
//! signal when killed); 125 when the sandbox itself fails.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::ExitCode;

use cordon_sandbox::{PreparedSandbox, Rlimits, SandboxConfig, SpawnRequest};

const USAGE: &str = "usage: cordon-sandbox-run [--probe] [--write DIR]... [--read DIR]... \
[--protect PATH]... [--deny PATH]... [--network | --network-filtered] [--unix-socket PATH]... [--allow-degraded] [--cwd DIR] \
[--container] [--pids N] [--memory BYTES] [--env NAME=VALUE]... -- PROGRAM [ARG]...";

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("cordon-sandbox-run: {message}");
            ExitCode::from(125)
        }
    }
}

fn run() -> Result<u8, String> {
    let mut args = std::env::args_os().skip(1);
    let mut config = SandboxConfig::with_defaults(cordon_sandbox::host_defaults());
    let mut limits = Rlimits::default();
    let mut cwd: Option<PathBuf> = None;
    let mut command: Vec<OsString> = Vec::new();
    let value = |args: &mut dyn Iterator<Item = OsString>, flag: &str| {
        args.next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
    };
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--probe") => {
                for line in cordon_sandbox::probe().report_lines() {
                    println!("{line}");
                }
                return Ok(0);
            }
            Some("--write") => config.write.push(value(&mut args, "--write")?.into()),
            Some("--read") => config.read.push(value(&mut args, "--read")?.into()),
            Some("--protect") => config.protected.push(value(&mut args, "--protect")?.into()),
            Some("--deny") => config.denied.push(value(&mut args, "--deny")?.into()),
            Some("--network") => config.network = cordon_sandbox::NetworkAccess::On,
            Some("--network-filtered") => config.network = cordon_sandbox::NetworkAccess::Filtered,
            Some("--unix-socket") => config
                .unix_sockets
                .push(value(&mut args, "--unix-socket")?.into()),
            Some("--allow-degraded") => config.allow_degraded = true,
            Some("--container") => config.profile = cordon_sandbox::Profile::Container,
            Some("--cwd") => cwd = Some(value(&mut args, "--cwd")?.into()),
            Some("--pids") => limits.processes = Some(number(value(&mut args, "--pids")?)?),
            Some("--memory") => limits.memory_bytes = Some(number(value(&mut args, "--memory")?)?),
            Some("--env") => {
                let entry = value(&mut args, "--env")?;
                let entry = entry.to_str().ok_or("--env needs UTF-8")?;
                let (name, val) = entry.split_once('=').ok_or("--env needs NAME=VALUE")?;
                config.env.push((name.into(), val.into()));
            }
            Some("--help") => {
                println!("{USAGE}");
                return Ok(0);
            }
            Some("--") => {
                command.extend(args.by_ref());
                break;
            }
            _ => return Err(format!("unexpected argument {arg:?}\n{USAGE}")),
        }
    }
    config.limits = limits;
    let mut command = command.into_iter();
    let program = command.next().ok_or(format!("no command given\n{USAGE}"))?;
    let cwd = match cwd {
        Some(cwd) => cwd,
        None => std::env::current_dir()
            .map_err(|e| format!("failed to read the current directory: {e}"))?,
    };
    let sandbox = PreparedSandbox::prepare(config).map_err(|e| e.to_string())?;
    for layer in sandbox.missing_layers() {
        eprintln!(
            "cordon-sandbox-run: warning: layer {layer} is not applied ({})",
            layer.requirement()
        );
    }
    let dup = |fd: std::io::Result<OwnedFd>| {
        fd.map_err(|e| format!("failed to duplicate a standard stream: {e}"))
    };
    let mut child = sandbox
        .spawn(SpawnRequest {
            program,
            args: command.collect(),
            cwd,
            env: Vec::new(),
            stdin: Some(dup(std::io::stdin().as_fd_owned())?),
            stdout: Some(dup(std::io::stdout().as_fd_owned())?),
            stderr: Some(dup(std::io::stderr().as_fd_owned())?),
        })
        .map_err(|e| e.to_string())?;
    let status = child.wait_blocking().map_err(|e| e.to_string())?;
    Ok(u8::try_from(status.code()).unwrap_or(255))
}

fn number(value: OsString) -> Result<u64, String> {
    value
        .to_str()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| format!("expected a number, got {value:?}"))
}

/// Duplicate a standard stream into an owned fd.
trait AsFdOwned {
    fn as_fd_owned(&self) -> std::io::Result<OwnedFd>;
}

impl<T: std::os::fd::AsFd> AsFdOwned for T {
    fn as_fd_owned(&self) -> std::io::Result<OwnedFd> {
        self.as_fd().try_clone_to_owned()
    }
}
