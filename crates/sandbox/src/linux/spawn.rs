//! Starting one command: [`PreparedSandbox::spawn`] builds the command's strings and stdio,
//! then hands it to an idle init, clones a new init into fresh namespaces, or (without
//! namespaces) starts it as a direct child that restricts itself before `execve`. Setup
//! failures come back over a pipe as an error record naming the step and path.

use std::ffi::{CStr, CString, OsStr, c_int};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::child::{self, ChildMount, CommandPlan, InitPlan};
use super::handle::SandboxedChild;
use super::mounts::{self, MountConfig, MountPlan};
use super::pool::InitProcess;
use super::prepare::{LandlockState, merge_env};
use super::sys::{self, CStringArray};
use super::{PreparedSandbox, c_string, landlock, lock, newroot, release_placeholders};
use crate::config::{NetworkAccess, SpawnRequest};
use crate::error::{SandboxError, SetupStep};

/// Symlinks of the new root's `/dev` (the host's point into the host's `/proc`).
const DEV_SYMLINKS: &[(&str, &str)] = &[
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];

impl PreparedSandbox {
    /// Run one command in the sandbox. Returns once the command is executing (or failed to
    /// start: then nothing ran).
    ///
    /// With namespaces the command runs under an init process (PID 1 of the sandbox). An
    /// init whose command has ended is kept, idle, and serves the next command when its
    /// mounts are still current (same protected and denied paths, same inodes, the same
    /// placeholders at missing protected paths; an init holding placeholders idles for at
    /// most `PLACEHOLDER_LINGER`), and it is younger than 60 s with fewer than 10 000
    /// commands served (`INIT_MAX_AGE`, `INIT_MAX_COMMANDS`): each command still starts with no process of
    /// an earlier command left and no System V IPC object either, but without building
    /// namespaces, mounts, the Landlock domain and the seccomp program again.
    ///
    /// # Errors
    /// A missing program, NUL bytes, a command too large, a protected path that cannot be
    /// pinned, or a failing setup step in the child ([`SandboxError::ChildSetup`], naming
    /// the step and path).
    pub fn spawn(&self, request: SpawnRequest) -> Result<SandboxedChild, SandboxError> {
        let SpawnRequest {
            program,
            args,
            cwd,
            env,
            stdin,
            stdout,
            stderr,
        } = request;
        let inner = &self.inner;
        if !cwd.is_absolute() {
            return Err(SandboxError::RelativePath { path: cwd });
        }
        let mut env_all = inner.env.clone();
        merge_env(&mut env_all, env);
        let path_value = env_all
            .iter()
            .find(|(key, _)| key == "PATH")
            .map(|(_, value)| value.clone())
            .unwrap_or_default();
        let program_path = resolve_program(&program, &path_value, &cwd)?;

        let c_program = c_string(program_path.as_os_str(), "program path")?;
        let mut argv = vec![c_string(&program, "program name")?];
        for arg in &args {
            argv.push(c_string(arg, "argument")?);
        }
        let mut envp = Vec::with_capacity(env_all.len());
        for (key, value) in &env_all {
            if key.is_empty() || key.as_bytes().contains(&b'=') {
                return Err(SandboxError::NulByte {
                    what: "environment name (empty or containing '=')",
                });
            }
            let mut entry = key.clone().into_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            envp.push(CString::new(entry).map_err(|_| SandboxError::NulByte {
                what: "environment entry",
            })?);
        }
        let c_cwd = c_string(cwd.as_os_str(), "working directory")?;
        let stdio = [
            stdio_fd(stdin, false)?,
            stdio_fd(stdout, true)?,
            stdio_fd(stderr, true)?,
        ];
        let paths = ErrorPaths {
            cwd,
            program: program_path,
        };
        if !inner.namespaces {
            let argv = CStringArray::new(argv);
            let envp = CStringArray::new(envp);
            return self.spawn_direct(DirectCommand {
                program: &c_program,
                cwd: &c_cwd,
                argv: &argv,
                envp: &envp,
                stdio,
                paths,
            });
        }
        let argv_refs: Vec<&CStr> = argv.iter().map(CString::as_c_str).collect();
        let envp_refs: Vec<&CStr> = envp.iter().map(CString::as_c_str).collect();
        let message = child::encode_command(&c_program, &c_cwd, &argv_refs, &envp_refs).ok_or(
            SandboxError::CommandTooLarge {
                limit: child::MAX_PAYLOAD,
                strings: child::MAX_STRINGS,
            },
        )?;
        let config = self.mount_config();
        loop {
            let (init, pooled) = match self.take_idle(&config) {
                Some(init) => (init, true),
                None => (self.start_init(&config)?, false),
            };
            match self.start_command(init, &message, &stdio, &paths) {
                Ok(child) => return Ok(child),
                // An idle init that died meanwhile: start a fresh one.
                Err(Started::InitGone) if pooled => continue,
                Err(Started::InitGone) => {
                    return Err(SandboxError::Clone {
                        source: io::Error::from(io::ErrorKind::BrokenPipe),
                    });
                }
                Err(Started::Failed(error)) => return Err(error),
            }
        }
    }

    /// Clone a new init into fresh namespaces and wait until its mounts and restrictions are
    /// in place.
    fn start_init(&self, config: &Arc<MountConfig>) -> Result<InitProcess, SandboxError> {
        let inner = &self.inner;
        let plan = mounts::plan(config)?;
        let root_plan = match &inner.new_root {
            Some(new_root) => Some(newroot::plan(
                &new_root.staging,
                &newroot::RootInputs {
                    visible: &new_root.visible,
                    sockets: &new_root.sockets,
                    own_symlinks: DEV_SYMLINKS,
                },
            )?),
            None => None,
        };
        let child_mounts: Vec<ChildMount<'_>> = plan
            .steps
            .iter()
            .map(|step| ChildMount {
                kind: step.kind,
                path: step.c_path.as_c_str(),
            })
            .collect();
        let ruleset = inner
            .landlock
            .as_ref()
            .map(LandlockState::ruleset)
            .transpose()?;
        let (setup_read, setup_write) =
            sys::pipe_cloexec().map_err(|source| SandboxError::Pipe { source })?;
        let (control_parent, control_child) = control_pair()?;
        let mut keep: Vec<RawFd> = vec![setup_write.as_raw_fd(), control_child.as_raw_fd()];
        keep.extend(ruleset.as_ref().map(|fd| fd.as_raw_fd()));
        // The init keeps the placeholders' shared locks for as long as it lives (its mounts
        // depend on them), also when this process dies first.
        keep.extend(plan.lock_fds());
        keep.sort_unstable();
        keep.dedup();

        let stack = sys::ChildStack::new();
        let inbox_bytes = sys::AnonMemory::new(child::MAX_PAYLOAD)
            .map_err(|source| SandboxError::Clone { source })?;
        let inbox_pointers = sys::AnonMemory::new(
            (child::MAX_STRINGS + 2) * std::mem::size_of::<*const std::ffi::c_char>(),
        )
        .map_err(|source| SandboxError::Clone { source })?;
        debug_assert!(inbox_bytes.len() >= child::MAX_PAYLOAD);
        let init_plan = InitPlan {
            user_maps: inner
                .user_maps
                .as_ref()
                .map(|(uid, gid)| (uid.as_slice(), gid.as_slice())),
            pid_max: inner.pid_max.as_deref(),
            mounts: &child_mounts,
            mask_dir: &inner.session.mask_dir,
            mask_file: &inner.session.mask_file,
            shm_source: &inner.session.shm,
            new_root: match (&inner.new_root, &root_plan) {
                (Some(new_root), Some(root_plan)) => {
                    Some((new_root.staging_c.as_c_str(), root_plan.steps.as_slice()))
                }
                _ => None,
            },
            egress: inner.network == NetworkAccess::Filtered,
            keep_fds: &keep,
            setup_fd: setup_write.as_raw_fd(),
            control_fd: control_child.as_raw_fd(),
            rlimits: &inner.rlimits,
            last_cap: inner.last_cap,
            landlock: ruleset.as_ref().map(|fd| fd.as_raw_fd()),
            proc_rights: inner
                .landlock
                .as_ref()
                .map_or(0, |state| landlock::proc_rights(state.abi)),
            seccomp: inner.seccomp.as_deref(),
            argv_area: inner.argv_area,
            stack: &stack,
            inbox: child::Inbox {
                bytes: inbox_bytes.base(),
                pointers: inbox_pointers.base().cast(),
            },
        };
        let mut flags = (libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC) as u64;
        if inner.user_maps.is_some() {
            flags |= libc::CLONE_NEWUSER as u64;
        }
        if inner.network == NetworkAccess::Filtered {
            flags |= libc::CLONE_NEWNET as u64;
        }
        let saved = sys::block_all_signals();
        // SAFETY: the child branch runs only `child::run_init`, which is async-signal-safe
        // and ends in _exit; every signal is blocked across the clone.
        let cloned = match unsafe { sys::clone_process(flags) } {
            Ok(sys::Cloned::Child) => child::run_init(&init_plan),
            Ok(sys::Cloned::Parent { pid, pidfd }) => Ok((pid, pidfd)),
            Err(source) => Err(source),
        };
        sys::restore_signals(&saved);
        drop(child_mounts);
        drop(setup_write);
        drop(control_child);
        let MountPlan {
            steps,
            placeholders,
            mut identities,
        } = plan;
        // A socket replaced on the host (a restarted server) needs a fresh bind.
        for socket in root_plan.iter().flat_map(|plan| &plan.sockets) {
            if let Some(identity) = mounts::Identity::now(socket) {
                identities.push((socket.clone(), identity));
            }
        }
        let (pid, pidfd) = match cloned {
            Ok(started) => started,
            Err(source) => {
                release_placeholders(placeholders);
                return Err(SandboxError::Clone { source });
            }
        };
        let mut init = InitProcess {
            pid,
            pidfd: Some(pidfd),
            control: Some(control_parent),
            placeholders,
            identities,
            config: Arc::clone(config),
            born: Instant::now(),
            commands: 0,
            idle_since: Instant::now(),
            egress: None,
        };
        match read_error_record(&setup_read) {
            Ok(None) if inner.network == NetworkAccess::Filtered => {
                // Sent on the control socket before the init reported ready.
                let received = init
                    .control
                    .as_ref()
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
                    .and_then(sys::recv_one_fd)
                    .and_then(|listener| sys::set_nonblocking(&listener).map(|()| listener));
                match received {
                    Ok(listener) => {
                        init.egress = Some(listener);
                        Ok(init)
                    }
                    Err(source) => {
                        init.kill_and_reap();
                        Err(SandboxError::EgressListener { source })
                    }
                }
            }
            Ok(None) => Ok(init),
            Ok(Some((step, errno, index))) => {
                init.kill_and_reap();
                let path = match step {
                    SetupStep::BindWritable
                    | SetupStep::PinPath
                    | SetupStep::ProtectPath
                    | SetupStep::MaskPath
                    | SetupStep::MountShm => {
                        steps.get(index as usize).map(|step| step.path.clone())
                    }
                    SetupStep::BuildRoot => root_plan
                        .as_ref()
                        .and_then(|plan| plan.steps.get(index as usize))
                        .map(|step| step.path.clone()),
                    SetupStep::ResetSignals
                    | SetupStep::HideInit
                    | SetupStep::MapUsers
                    | SetupStep::MakeMountsPrivate
                    | SetupStep::ReadOnlyRoot
                    | SetupStep::MountProc
                    | SetupStep::SetPidMax
                    | SetupStep::ForkCommand
                    | SetupStep::NewSession
                    | SetupStep::SetRlimit
                    | SetupStep::ChangeDirectory
                    | SetupStep::RedirectStdio
                    | SetupStep::CloseFds
                    | SetupStep::DropCapabilities
                    | SetupStep::VerifyCapabilities
                    | SetupStep::NoNewPrivs
                    | SetupStep::Landlock
                    | SetupStep::Seccomp
                    | SetupStep::Exec
                    | SetupStep::EgressListener => None,
                };
                Err(SandboxError::ChildSetup {
                    step,
                    path,
                    source: io::Error::from_raw_os_error(errno),
                })
            }
            Err(source) => {
                init.kill_and_reap();
                Err(SandboxError::Wait { source })
            }
        }
    }

    /// Hand one command to `init` and wait until it runs (or failed to start).
    fn start_command(
        &self,
        mut init: InitProcess,
        message: &[u8],
        stdio: &[OwnedFd; 3],
        paths: &ErrorPaths,
    ) -> Result<SandboxedChild, Started> {
        let (exec_read, exec_write) =
            sys::pipe_cloexec().map_err(|source| Started::Failed(SandboxError::Pipe { source }))?;
        let fds = [
            stdio[0].as_raw_fd(),
            stdio[1].as_raw_fd(),
            stdio[2].as_raw_fd(),
            exec_write.as_raw_fd(),
        ];
        let Some(control) = init.control.as_ref() else {
            return Err(Started::InitGone);
        };
        if let Err(error) = sys::send_with_fds(control, message, &fds) {
            init.kill_and_reap();
            return Err(match error.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => Started::InitGone,
                _ => Started::Failed(SandboxError::Pipe { source: error }),
            });
        }
        drop(exec_write);
        let mut ack = [0u8; 1];
        match sys::read_retry(&exec_read, &mut ack) {
            Ok(1) if ack[0] == child::COMMAND_ACK => {}
            // EOF first: the init died before taking the command; nothing ran.
            Ok(_) => {
                init.kill_and_reap();
                return Err(Started::InitGone);
            }
            Err(source) => {
                init.kill_and_reap();
                return Err(Started::Failed(SandboxError::Wait { source }));
            }
        }
        init.commands += 1;
        match read_error_record(&exec_read) {
            Ok(None) => Ok(SandboxedChild::under_init(init, self)),
            Ok(Some((step, errno, _))) => {
                init.kill_and_reap();
                let path = match step {
                    SetupStep::ChangeDirectory => Some(paths.cwd.clone()),
                    SetupStep::Exec => Some(paths.program.clone()),
                    _ => None,
                };
                Err(Started::Failed(SandboxError::ChildSetup {
                    step,
                    path,
                    source: io::Error::from_raw_os_error(errno),
                }))
            }
            Err(source) => {
                init.kill_and_reap();
                Err(Started::Failed(SandboxError::Wait { source }))
            }
        }
    }

    /// Without namespaces (an explicitly degraded host): the command is this process's
    /// direct child, restricting itself before `execve`.
    fn spawn_direct(&self, command: DirectCommand<'_>) -> Result<SandboxedChild, SandboxError> {
        let DirectCommand {
            program,
            cwd,
            argv,
            envp,
            stdio,
            paths,
        } = command;
        let inner = &self.inner;
        let mounts = Arc::clone(&*lock(&inner.mounts));
        let ruleset = inner
            .landlock
            .as_ref()
            .map(|state| state.ruleset_for_direct(&mounts.protected, &mounts.denied))
            .transpose()?;
        let (exec_read, exec_write) =
            sys::pipe_cloexec().map_err(|source| SandboxError::Pipe { source })?;
        let plan = CommandPlan {
            program: program.as_ptr(),
            cwd: cwd.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            stdio: [
                stdio[0].as_raw_fd(),
                stdio[1].as_raw_fd(),
                stdio[2].as_raw_fd(),
            ],
            exec_fd: exec_write.as_raw_fd(),
            rlimits: &inner.rlimits,
            last_cap: inner.last_cap,
            drop_capabilities: true,
            landlock: ruleset.as_ref().map(|fd| fd.as_raw_fd()),
            seccomp: inner.seccomp.as_deref(),
        };
        let stack = sys::ChildStack::new();
        let mut raw_pidfd: c_int = -1;
        let arg = &plan as *const CommandPlan<'_> as *mut std::ffi::c_void;
        let saved = sys::block_all_signals();
        // SAFETY: command_entry only runs async-signal-safe code reading the plan, which this
        // thread keeps alive while it is suspended until the child execs or exits; the stack
        // is reserved for this child; every signal is blocked across the clone.
        let started =
            unsafe { sys::vfork_child(&stack, child::command_entry, arg, Some(&mut raw_pidfd), 0) };
        sys::restore_signals(&saved);
        drop(exec_write);
        drop(stdio);
        let (pid, pidfd) = started
            .map_err(io::Error::from_raw_os_error)
            .and_then(|pid| sys::owned_pidfd(raw_pidfd).map(|pidfd| (pid, pidfd)))
            .map_err(|source| SandboxError::Clone { source })?;
        let mut child = SandboxedChild {
            pid,
            pidfd: Some(pidfd),
            control: None,
            egress: None,
            unaccepted: 0,
            namespaces: false,
            group_is_tree: inner.keep_group,
            status: None,
            placeholders: Vec::new(),
            reuse: None,
            running: Arc::new(std::sync::Mutex::new(true)),
            warden: None,
            _session: Arc::clone(&inner.session),
        };
        match read_error_record(&exec_read) {
            Ok(None) => {
                // Listed with the warden before anything else can fail, so that the group
                // does not outlive this process.
                if let Some(warden) = inner.warden.as_ref() {
                    if let Err(source) = warden.register(pid) {
                        child.kill_and_reap();
                        return Err(SandboxError::Warden { source });
                    }
                    child.warden =
                        Some((Arc::clone(warden), std::sync::atomic::AtomicBool::new(true)));
                }
                Ok(child)
            }
            Ok(Some((step, errno, _))) => {
                child.kill_and_reap();
                let path = match step {
                    SetupStep::ChangeDirectory => Some(paths.cwd),
                    SetupStep::Exec => Some(paths.program),
                    _ => None,
                };
                Err(SandboxError::ChildSetup {
                    step,
                    path,
                    source: io::Error::from_raw_os_error(errno),
                })
            }
            Err(source) => {
                child.kill_and_reap();
                Err(SandboxError::Wait { source })
            }
        }
    }
}

/// The paths an error while starting a command may name.
struct ErrorPaths {
    cwd: PathBuf,
    program: PathBuf,
}

/// One command for [`PreparedSandbox::spawn_direct`].
struct DirectCommand<'a> {
    program: &'a CStr,
    cwd: &'a CStr,
    argv: &'a CStringArray,
    envp: &'a CStringArray,
    stdio: [OwnedFd; 3],
    paths: ErrorPaths,
}

/// Why handing a command to an init did not work.
enum Started {
    /// The init is gone (an idle one may have died meanwhile).
    InitGone,
    /// The command could not be started.
    Failed(SandboxError),
}

/// Read a `(step, errno, index)` error record from a setup or exec pipe: `None` at EOF
/// without one (the step succeeded).
fn read_error_record(pipe: &OwnedFd) -> io::Result<Option<(SetupStep, i32, u32)>> {
    let mut record = [0u8; 12];
    let mut filled = 0;
    while filled < record.len() {
        match sys::read_retry(pipe, &mut record[filled..])? {
            0 => break,
            read => filled += read,
        }
    }
    if filled == 0 {
        return Ok(None);
    }
    let word = |index: usize| {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(&record[index * 4..index * 4 + 4]);
        bytes
    };
    let step = SetupStep::from_number(u32::from_ne_bytes(word(0))).unwrap_or(SetupStep::Exec);
    Ok(Some((
        step,
        i32::from_ne_bytes(word(1)),
        u32::from_ne_bytes(word(2)),
    )))
}

/// Find the program: as given when it contains `/` (relative to `cwd`), else in `PATH`.
fn resolve_program(program: &OsStr, path: &OsStr, cwd: &Path) -> Result<PathBuf, SandboxError> {
    let not_found = || SandboxError::ProgramNotFound {
        program: PathBuf::from(program),
    };
    if program.is_empty() {
        return Err(not_found());
    }
    if program.as_bytes().contains(&b'/') {
        return Ok(cwd.join(program));
    }
    for dir in path.as_bytes().split(|&b| b == b':') {
        if dir.is_empty() {
            continue;
        }
        let candidate = Path::new(OsStr::from_bytes(dir)).join(program);
        if let Ok(meta) = std::fs::metadata(&candidate)
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return Ok(candidate);
        }
    }
    Err(not_found())
}

/// A standard stream's fd, numbered >= 3 so the child's dup2 onto 0..2 never clobbers
/// another stream.
fn stdio_fd(fd: Option<OwnedFd>, write: bool) -> Result<OwnedFd, SandboxError> {
    let fd = match fd {
        Some(fd) => fd,
        None => std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|source| SandboxError::DevNull { source })?,
    };
    if fd.as_raw_fd() >= 3 {
        return Ok(fd);
    }
    sys::dup_cloexec_at_least(&fd, 3).map_err(|source| SandboxError::Pipe { source })
}

fn control_pair() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    let (parent, child) =
        std::os::unix::net::UnixStream::pair().map_err(|source| SandboxError::Pipe { source })?;
    Ok((OwnedFd::from(parent), OwnedFd::from(child)))
}
