//! Code that runs in the new child between `clone` and `execve`: the init (PID 1 of the new
//! PID namespace, which sets up mounts, starts the command and reaps everything) and the
//! command's own last steps (session, limits, stdio, capabilities, no_new_privs, Landlock,
//! seccomp, exec).
//!
//! Everything here is async-signal-safe: the data is prebuilt by the parent in a
//! [`ChildPlan`], the code only reads it and calls the raw wrappers of `sys`, never
//! allocates, locks or panics, and every path ends in `execve` or `_exit`. A failing step is
//! reported to the parent as `(step, errno, path index)` over the exec pipe.

use std::ffi::{CStr, c_int, c_void};
use std::os::fd::RawFd;

use crate::error::SetupStep;
use crate::linux::mounts::MountKind;
use crate::linux::sys::{self, BindMode, CStringArray, Errno, SockFilter};

/// Signals the init forwards to every process of the sandbox when the parent sends them.
pub(crate) const FORWARDED_SIGNALS: [c_int; 9] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGCONT,
    libc::SIGWINCH,
];

/// "No path" in an error record.
pub(crate) const NO_INDEX: u32 = u32::MAX;
/// Exit code of a child whose setup failed.
const SETUP_FAILED_EXIT: c_int = 127;
/// Exit code of an init whose parent went away.
const PARENT_GONE_EXIT: c_int = 125;

/// Status record tags written by the init to the control socket.
pub(crate) const STATUS_EXITED: u32 = 0;
/// The command was killed by a signal.
pub(crate) const STATUS_SIGNALED: u32 = 1;

/// One prebuilt mount step.
pub(crate) struct ChildMount<'a> {
    /// What to do.
    pub kind: MountKind,
    /// Target path.
    pub path: &'a CStr,
}

/// Everything the child needs, prebuilt by the parent.
pub(crate) struct ChildPlan<'a> {
    /// `(uid_map, gid_map)` contents when a user namespace is created.
    pub user_maps: Option<(&'a [u8], &'a [u8])>,
    /// ASCII value for the PID namespace's `pid_max`.
    pub pid_max: Option<&'a [u8]>,
    /// Mount steps after `/proc` (pins, protects, masks, shm).
    pub mounts: &'a [ChildMount<'a>],
    /// Empty unreadable directory used as a mask.
    pub mask_dir: &'a CStr,
    /// Empty unreadable file used as a mask.
    pub mask_file: &'a CStr,
    /// Session directory mounted over `/dev/shm`.
    pub shm_source: &'a CStr,
    /// Sorted fds the init keeps (everything else is closed).
    pub keep_fds: &'a [RawFd],
    /// Write end of the exec pipe (error records; closed at exec).
    pub exec_fd: RawFd,
    /// The init's end of the control socket (status out, parent's EOF in).
    pub control_fd: RawFd,
    /// Standard input, output, error (all >= 3).
    pub stdio: [RawFd; 3],
    /// Working directory.
    pub cwd: &'a CStr,
    /// Program path.
    pub program: &'a CStr,
    /// argv.
    pub argv: &'a CStringArray,
    /// envp.
    pub envp: &'a CStringArray,
    /// `(resource, soft, hard)` limits.
    pub rlimits: &'a [(c_int, u64, u64)],
    /// Highest capability number.
    pub last_cap: u32,
    /// Landlock ruleset to enforce.
    pub landlock: Option<RawFd>,
    /// Rights to grant on the fresh `/proc` (added to the ruleset by the init: Landlock
    /// ignores rules on covered mount points, so the host `/proc` rule cannot reach it).
    pub proc_rights: u64,
    /// seccomp program to install.
    pub seccomp: Option<&'a [SockFilter]>,
    /// The parent's argument area, overwritten in the init's copy.
    pub argv_area: Option<(usize, usize)>,
    /// Stack of the `vfork`-style command child.
    pub stack: &'a sys::ChildStack,
}

type StepResult = Result<(), (SetupStep, Errno, u32)>;

fn step<T>(result: Result<T, Errno>, step: SetupStep) -> Result<T, (SetupStep, Errno, u32)> {
    result.map_err(|errno| (step, errno, NO_INDEX))
}

fn report(fd: RawFd, (step, errno, index): (SetupStep, Errno, u32)) {
    let mut record = [0u8; 12];
    let fields = [
        step.number().to_ne_bytes(),
        errno.to_ne_bytes(),
        index.to_ne_bytes(),
    ];
    for (chunk, field) in record.chunks_exact_mut(4).zip(fields) {
        chunk.copy_from_slice(&field);
    }
    let _ = sys::write_all_raw(fd, &record);
}

/// Entry point of the init (fork-style clone into the new namespaces). Never returns.
pub(crate) fn run_init(plan: &ChildPlan<'_>) -> ! {
    init_main(plan)
}

/// Entry point of a `vfork`-style command child: `arg` is the `ChildPlan`. Never returns.
pub(crate) extern "C" fn command_entry(arg: *mut c_void) -> c_int {
    // SAFETY: the parent passes a pointer to a ChildPlan that outlives this child (the
    // parent is suspended until the child execs or exits).
    let plan = unsafe { &*(arg as *const ChildPlan<'_>) };
    let error = match reset_for_command() {
        Ok(()) => command_main(plan),
        Err(error) => error,
    };
    report(plan.exec_fd, error);
    sys::exit_now(SETUP_FAILED_EXIT)
}

fn reset_for_command() -> StepResult {
    step(sys::reset_signals(), SetupStep::ResetSignals)
}

/// The init: PID 1 of the sandbox's PID namespace.
fn init_main(plan: &ChildPlan<'_>) -> ! {
    match init_setup(plan) {
        Ok(command) => init_wait(plan, command),
        Err(error) => {
            report(plan.exec_fd, error);
            sys::exit_now(SETUP_FAILED_EXIT)
        }
    }
}

fn close_all_but(keep: &[RawFd]) -> Result<(), Errno> {
    let mut next: u32 = 0;
    for &fd in keep {
        let fd = fd as u32;
        if fd > next {
            sys::close_range(next, fd - 1, 0)?;
        }
        next = fd.saturating_add(1);
    }
    sys::close_range(next, u32::MAX, 0)
}

fn init_setup(plan: &ChildPlan<'_>) -> Result<i32, (SetupStep, Errno, u32)> {
    step(sys::reset_signals(), SetupStep::ResetSignals)?;
    // Other threads of the parent may have created fds (pipes of concurrent spawns) that
    // must not stay open for the life of this init.
    step(close_all_but(plan.keep_fds), SetupStep::CloseFds)?;
    if let Some((uid_map, gid_map)) = plan.user_maps {
        step(
            sys::write_proc_self_file(c"/proc/self/setgroups", b"deny"),
            SetupStep::MapUsers,
        )?;
        step(
            sys::write_proc_self_file(c"/proc/self/uid_map", uid_map),
            SetupStep::MapUsers,
        )?;
        step(
            sys::write_proc_self_file(c"/proc/self/gid_map", gid_map),
            SetupStep::MapUsers,
        )?;
    }
    step(sys::make_mounts_private(), SetupStep::MakeMountsPrivate)?;
    step(sys::make_all_mounts_read_only(), SetupStep::ReadOnlyRoot)?;
    step(sys::mount_proc(), SetupStep::MountProc)?;
    if let Some(pid_max) = plan.pid_max {
        step(
            sys::write_file_raw(c"/proc/sys/kernel/pid_max", pid_max),
            SetupStep::SetPidMax,
        )?;
    }
    // The fresh /proc is writable; a capability-less root could still write most sysctls.
    if let Some(ruleset) = plan.landlock
        && plan.proc_rights != 0
    {
        let proc_fd = step(
            sys::openat2_raw(libc::AT_FDCWD, c"/proc", libc::O_PATH),
            SetupStep::Landlock,
        )?;
        let added = sys::landlock_add_path_rule_raw(ruleset, proc_fd, plan.proc_rights);
        sys::close_raw(proc_fd);
        step(added, SetupStep::Landlock)?;
    }
    // The fresh /proc is writable: a capability-less root could still write most sysctls.
    // Landlock grants only reads there too; this also holds when Landlock is degraded.
    step(sys::make_mount_read_only(c"/proc"), SetupStep::MountProc)?;
    for (index, mount) in plan.mounts.iter().enumerate() {
        let index = index as u32;
        let (step_kind, result) = match mount.kind {
            MountKind::Writable => (
                SetupStep::BindWritable,
                bind_self(mount.path, BindMode::ReadWrite, None),
            ),
            MountKind::Pin => (
                SetupStep::PinPath,
                bind_self(mount.path, BindMode::ReadWrite, None),
            ),
            MountKind::Protect { expect } => (
                SetupStep::ProtectPath,
                bind_self(mount.path, BindMode::ReadOnly, expect),
            ),
            MountKind::MaskDir => (
                SetupStep::MaskPath,
                bind_over(plan.mask_dir, mount.path, BindMode::ReadOnly),
            ),
            MountKind::MaskFile => (
                SetupStep::MaskPath,
                bind_over(plan.mask_file, mount.path, BindMode::ReadOnly),
            ),
            MountKind::Shm => (
                SetupStep::MountShm,
                bind_over(plan.shm_source, mount.path, BindMode::ReadWrite),
            ),
        };
        result.map_err(|errno| (step_kind, errno, index))?;
    }
    sys::rename_init(plan.argv_area);
    // Nothing in the sandbox may ptrace the init or read its memory (a copy of the parent's).
    step(sys::set_not_dumpable(), SetupStep::HideInit)?;
    for signal in FORWARDED_SIGNALS {
        step(
            sys::install_handler(signal, forward_signal),
            SetupStep::ResetSignals,
        )?;
    }
    step(
        sys::install_handler(libc::SIGCHLD, wake_on_child),
        SetupStep::ResetSignals,
    )?;
    step(sys::block_child_signal(), SetupStep::ResetSignals)?;
    let arg = plan as *const ChildPlan<'_> as *mut c_void;
    // SAFETY: command_entry only runs async-signal-safe code reading the plan, which this
    // (suspended) init keeps alive; the stack is reserved for this child.
    let pid = step(
        unsafe { sys::vfork_child(plan.stack, command_entry, arg, None) },
        SetupStep::ForkCommand,
    )?;
    sys::ignore_signal(libc::SIGPIPE);
    // The init needs none of the command's streams: readers see EOF as soon as the last
    // process of the sandbox is gone, not when the init's namespaces are torn down.
    for fd in plan.stdio {
        sys::close_raw(fd);
    }
    // The parent learns that the command is running (or failed) from EOF on this pipe.
    sys::close_raw(plan.exec_fd);
    Ok(pid)
}

/// Reap until the command ends; then kill and reap every other process of the namespace and
/// only then report the command's status (so the parent may treat the report as "the whole
/// tree is gone") and exit. Exit early when the parent goes away (the kernel then kills the
/// namespace with us).
fn init_wait(plan: &ChildPlan<'_>, command: i32) -> ! {
    let status = loop {
        match reap_nohang(command) {
            Some(status) => break status,
            None => {
                if sys::wait_for_hangup_or_signal(plan.control_fd) {
                    sys::exit_now(PARENT_GONE_EXIT)
                }
            }
        }
    };
    kill_and_reap_everything();
    let record = if libc::WIFSIGNALED(status) {
        status_record(STATUS_SIGNALED, libc::WTERMSIG(status))
    } else {
        status_record(STATUS_EXITED, libc::WEXITSTATUS(status))
    };
    let _ = sys::write_all_raw(plan.control_fd, &record);
    sys::exit_now(0)
}

/// Reap every ended child; the raw status of `command` once it has ended.
fn reap_nohang(command: i32) -> Option<i32> {
    let mut found = None;
    loop {
        match sys::wait_any_nohang() {
            Ok(Some((pid, status))) => {
                if pid == command {
                    found = Some(status);
                }
            }
            Ok(None) => return found,
            Err(errno) if errno == libc::EINTR => {}
            Err(_) => return found,
        }
    }
}

/// SIGKILL every other process of the namespace and reap until none is left (orphans are
/// re-parented to the init, so "no child" means "no process"). The kill is repeated each
/// round in case a process was forking when the first one landed.
fn kill_and_reap_everything() {
    loop {
        sys::kill_all(libc::SIGKILL);
        match sys::wait_any_blocking() {
            Ok(_) => {}
            Err(errno) if errno == libc::EINTR => {}
            Err(_) => return,
        }
    }
}

fn status_record(tag: u32, value: c_int) -> [u8; 8] {
    let mut record = [0u8; 8];
    record[..4].copy_from_slice(&tag.to_ne_bytes());
    record[4..].copy_from_slice(&value.to_ne_bytes());
    record
}

/// Forward a signal from the parent (sender outside the namespace: `si_pid` 0) to every
/// process of the sandbox.
extern "C" fn forward_signal(signal: c_int, info: *mut libc::siginfo_t, _context: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let from_outside = info.is_null() || unsafe { (*info).si_pid() } == 0;
    if from_outside {
        sys::kill_all(signal);
    }
}

/// SIGCHLD only needs to interrupt `ppoll`.
extern "C" fn wake_on_child(_signal: c_int, _info: *mut libc::siginfo_t, _context: *mut c_void) {}

/// Open `path` without following symlinks and bind it onto itself.
fn bind_self(path: &CStr, mode: BindMode, expect: Option<(u64, u64)>) -> Result<(), Errno> {
    let fd = sys::openat2_raw(libc::AT_FDCWD, path, libc::O_PATH)?;
    let result = (|| {
        if let Some(expect) = expect
            && sys::fstat_raw(fd)? != expect
        {
            return Err(libc::ESTALE);
        }
        sys::bind_fd_onto_fd(fd, fd, mode)
    })();
    sys::close_raw(fd);
    result
}

/// Bind `source` over `target`, both opened without following symlinks.
fn bind_over(source: &CStr, target: &CStr, mode: BindMode) -> Result<(), Errno> {
    let source_fd = sys::openat2_raw(libc::AT_FDCWD, source, libc::O_PATH)?;
    let result = sys::openat2_raw(libc::AT_FDCWD, target, libc::O_PATH).and_then(|target_fd| {
        let result = sys::bind_fd_onto_fd(source_fd, target_fd, mode);
        sys::close_raw(target_fd);
        result
    });
    sys::close_raw(source_fd);
    result
}

/// The command's last steps; returns only with the failing step.
fn command_main(plan: &ChildPlan<'_>) -> (SetupStep, Errno, u32) {
    match command_setup(plan) {
        Ok(()) => (
            SetupStep::Exec,
            sys::execve(plan.program, plan.argv, plan.envp),
            NO_INDEX,
        ),
        Err(error) => error,
    }
}

fn command_setup(plan: &ChildPlan<'_>) -> StepResult {
    // Own session and process group: the backend (and the degraded mode) signals the group.
    step(sys::setsid(), SetupStep::NewSession)?;
    for &(resource, soft, hard) in plan.rlimits {
        step(sys::set_rlimit(resource, soft, hard), SetupStep::SetRlimit)?;
    }
    step(sys::chdir(plan.cwd), SetupStep::ChangeDirectory)?;
    for (target, &fd) in plan.stdio.iter().enumerate() {
        step(sys::dup2(fd, target as RawFd), SetupStep::RedirectStdio)?;
    }
    // Nothing but stdio survives exec; the exec pipe and the ruleset fd stay usable until
    // then.
    step(
        sys::close_range(3, u32::MAX, libc::CLOSE_RANGE_CLOEXEC),
        SetupStep::CloseFds,
    )?;
    step(
        sys::drop_all_capabilities(plan.last_cap),
        SetupStep::DropCapabilities,
    )?;
    match sys::has_any_capability() {
        Ok(false) => {}
        Ok(true) => return Err((SetupStep::VerifyCapabilities, libc::EPERM, NO_INDEX)),
        Err(errno) => return Err((SetupStep::VerifyCapabilities, errno, NO_INDEX)),
    }
    step(sys::set_no_new_privs(), SetupStep::NoNewPrivs)?;
    if let Some(ruleset) = plan.landlock {
        step(sys::landlock_restrict_self(ruleset), SetupStep::Landlock)?;
    }
    if let Some(program) = plan.seccomp {
        step(sys::seccomp_set_filter(program), SetupStep::Seccomp)?;
    }
    Ok(())
}
