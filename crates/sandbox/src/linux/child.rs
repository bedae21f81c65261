//! Code that runs in the new children, between `clone` and `execve`:
//!
//! - the init: PID 1 of the new PID namespace. It sets up the mounts, then restricts itself
//!   (`no_new_privs`, Landlock, seccomp — which every command inherits, so they are compiled
//!   and merged once per init, not once per command) and serves commands: it receives one
//!   over its control socket (see [`encode_command`] for the wire format), starts it, waits
//!   for it, kills and reaps everything else in the namespace, removes the System V IPC
//!   objects the command left, reports the status, and waits for the next one. The parent
//!   reuses an init only while its mounts are current; EOF on the control socket (the parent
//!   dropped it, or died) ends it.
//! - the command's own last steps (session, limits, stdio, capabilities, `no_new_privs`, and
//!   Landlock and seccomp when not inherited), then `execve`.
//!
//! Everything here is async-signal-safe: the data is prebuilt by the parent (an [`InitPlan`],
//! and buffers mapped before the clone), the code only reads it and calls the raw wrappers of
//! `sys`, never allocates, locks or panics, and every path ends in `execve` or `_exit`. A
//! failing step is reported to the parent as `(step, errno, path index)` over a pipe.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::os::fd::RawFd;

use crate::config::EGRESS_PORT;
use crate::error::SetupStep;
use crate::linux::mounts::MountKind;
use crate::linux::newroot::{EntryKind, RootStep};
use crate::linux::sys::{self, BindMode, Errno, SockFilter};

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
/// Exit code of an init whose parent went away or broke the protocol.
const PARENT_GONE_EXIT: c_int = 125;

/// Status record tags written by the init to the control socket.
pub(crate) const STATUS_EXITED: u32 = 0;
/// The command was killed by a signal.
pub(crate) const STATUS_SIGNALED: u32 = 1;

/// First byte an init writes on a command's exec pipe once it took the command.
pub(crate) const COMMAND_ACK: u8 = b'A';
/// Size of a command message header: payload length, argc, envc (native-endian `u32`s).
pub(crate) const HEADER_LEN: usize = 12;
/// Largest command payload (program, cwd, arguments, environment): the kernel refuses
/// larger argument lists at `execve` anyway.
pub(crate) const MAX_PAYLOAD: usize = 2 << 20;
/// Most arguments plus environment entries one command may have.
pub(crate) const MAX_STRINGS: usize = 65_536;

/// One prebuilt mount step.
pub(crate) struct ChildMount<'a> {
    /// What to do.
    pub kind: MountKind,
    /// Target path.
    pub path: &'a CStr,
}

/// Buffers the init parses commands into: mapped by the parent before the clone, so the init
/// writes to its own private copy without allocating.
#[derive(Clone, Copy)]
pub(crate) struct Inbox {
    /// `MAX_PAYLOAD` bytes.
    pub bytes: *mut u8,
    /// `MAX_STRINGS + 2` pointers (argv and envp, each NULL-terminated).
    pub pointers: *mut *const c_char,
}

/// Everything the init needs, prebuilt by the parent.
pub(crate) struct InitPlan<'a> {
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
    /// With the network on: the staging directory and the steps of the socket-free root the
    /// init pivots into once the mounts above are in place.
    pub new_root: Option<(&'a CStr, &'a [RootStep])>,
    /// With the network filtered (the init is in a new network namespace): bring loopback
    /// up, listen on `127.0.0.1:EGRESS_PORT` and send the listener to the parent over the
    /// control socket before reporting ready.
    pub egress: bool,
    /// Sorted fds the init keeps (everything else is closed).
    pub keep_fds: &'a [RawFd],
    /// Write end of the setup pipe (error records; closed once the init is ready).
    pub setup_fd: RawFd,
    /// The init's end of the control socket (commands in, status out, parent's EOF in).
    pub control_fd: RawFd,
    /// `(resource, soft, hard)` limits of every command.
    pub rlimits: &'a [(c_int, u64, u64)],
    /// Highest capability number.
    pub last_cap: u32,
    /// Landlock ruleset the init enforces on itself (and so on every command).
    pub landlock: Option<RawFd>,
    /// Rights to grant on the fresh `/proc` (added to the ruleset by the init: Landlock
    /// ignores rules on covered mount points, so the host `/proc` rule cannot reach it).
    pub proc_rights: u64,
    /// seccomp program the init installs on itself (and so on every command).
    pub seccomp: Option<&'a [SockFilter]>,
    /// The parent's argument area, overwritten in the init's copy.
    pub argv_area: Option<(usize, usize)>,
    /// Stack of the `vfork`-style command child.
    pub stack: &'a sys::ChildStack,
    /// Where commands are received.
    pub inbox: Inbox,
}

/// One command's last steps, read by the `vfork`-style command child.
pub(crate) struct CommandPlan<'a> {
    /// Program path (NUL-terminated).
    pub program: *const c_char,
    /// Working directory (NUL-terminated).
    pub cwd: *const c_char,
    /// NULL-terminated argv.
    pub argv: *const *const c_char,
    /// NULL-terminated envp.
    pub envp: *const *const c_char,
    /// Standard input, output, error (all >= 3, so the dup2 onto 0..2 clobbers none).
    pub stdio: [RawFd; 3],
    /// Write end of the exec pipe (error records; closed at exec).
    pub exec_fd: RawFd,
    /// `(resource, soft, hard)` limits.
    pub rlimits: &'a [(c_int, u64, u64)],
    /// Highest capability number.
    pub last_cap: u32,
    /// Whether to drop capabilities (the init has none left to pass on; a direct child
    /// still holds the parent's). They are verified to be gone either way.
    pub drop_capabilities: bool,
    /// Landlock ruleset to enforce, unless inherited from the init.
    pub landlock: Option<RawFd>,
    /// seccomp program to install, unless inherited from the init.
    pub seccomp: Option<&'a [SockFilter]>,
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
    // The child is about to exit or exec: a report the parent cannot read shows there as a missing record.
    let _ = sys::write_all_raw(fd, &record);
}

/// Encode one command for an init: a [`HEADER_LEN`]-byte header (payload length, argc,
/// envc) then the payload `program\0cwd\0argv…\0env…\0`. The descriptors (stdin, stdout,
/// stderr, exec pipe) travel as `SCM_RIGHTS` with the first byte. `None` when the command is
/// larger than [`MAX_PAYLOAD`] or has more than [`MAX_STRINGS`] strings.
pub(crate) fn encode_command(
    program: &CStr,
    cwd: &CStr,
    argv: &[&CStr],
    envp: &[&CStr],
) -> Option<Vec<u8>> {
    if argv.len() + envp.len() > MAX_STRINGS {
        return None;
    }
    let strings = [program, cwd].into_iter().chain(argv.iter().copied());
    let payload: usize = strings
        .chain(envp.iter().copied())
        .map(|s| s.to_bytes_with_nul().len())
        .sum();
    if payload > MAX_PAYLOAD {
        return None;
    }
    let mut message = Vec::with_capacity(HEADER_LEN + payload);
    for value in [payload, argv.len(), envp.len()] {
        message.extend_from_slice(&(value as u32).to_ne_bytes());
    }
    for string in [program, cwd]
        .into_iter()
        .chain(argv.iter().copied())
        .chain(envp.iter().copied())
    {
        message.extend_from_slice(string.to_bytes_with_nul());
    }
    Some(message)
}

/// A command the init received: pointers into its inbox plus the descriptors.
struct Received {
    program: *const c_char,
    cwd: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    stdio: [RawFd; 3],
    exec_fd: RawFd,
}

/// Split `payload` (`program\0cwd\0` + `argc` + `envc` NUL-terminated strings) into
/// `pointers`: argv at `[0..argc]` then NULL, envp at `[argc + 1..]` then NULL. Returns
/// `(program, cwd, argv, envp)` or `EPROTO` when the payload does not match the counts.
fn parse_command(
    payload: &[u8],
    argc: usize,
    envc: usize,
    pointers: &mut [*const c_char],
) -> Result<
    (
        *const c_char,
        *const c_char,
        *const *const c_char,
        *const *const c_char,
    ),
    Errno,
> {
    if argc + envc + 2 > pointers.len() || argc == 0 {
        return Err(libc::EPROTO);
    }
    let mut position = 0usize;
    let mut next = || -> Result<*const c_char, Errno> {
        let rest = payload.get(position..).ok_or(libc::EPROTO)?;
        let end = rest.iter().position(|&b| b == 0).ok_or(libc::EPROTO)?;
        let start = rest.as_ptr().cast::<c_char>();
        position += end + 1;
        Ok(start)
    };
    let program = next()?;
    let cwd = next()?;
    for slot in pointers.iter_mut().take(argc) {
        *slot = next()?;
    }
    pointers[argc] = std::ptr::null();
    for slot in pointers.iter_mut().skip(argc + 1).take(envc) {
        *slot = next()?;
    }
    pointers[argc + 1 + envc] = std::ptr::null();
    if position != payload.len() {
        return Err(libc::EPROTO);
    }
    let base = pointers.as_ptr();
    Ok((program, cwd, base, base.wrapping_add(argc + 1)))
}

/// Receive the next command; `Ok(None)` when the parent closed the socket.
fn receive_command(plan: &InitPlan<'_>) -> Result<Option<Received>, Errno> {
    let mut header = [0u8; HEADER_LEN];
    let mut fds = [-1 as RawFd; 4];
    let (read, count) = sys::recv_with_fds_raw(plan.control_fd, &mut header, &mut fds)?;
    if read == 0 {
        return Ok(None);
    }
    let close_all = |fds: &[RawFd; 4]| {
        for &fd in fds.iter().take(count) {
            sys::close_raw(fd);
        }
    };
    if count != fds.len() {
        close_all(&fds);
        return Err(libc::EPROTO);
    }
    let result = (|| {
        sys::read_exact_raw(plan.control_fd, &mut header[read..])?;
        let word = |index: usize| {
            let mut bytes = [0u8; 4];
            bytes.copy_from_slice(&header[index * 4..index * 4 + 4]);
            u32::from_ne_bytes(bytes) as usize
        };
        let (length, argc, envc) = (word(0), word(1), word(2));
        if length > MAX_PAYLOAD {
            return Err(libc::EPROTO);
        }
        // SAFETY: the parent mapped MAX_PAYLOAD bytes and MAX_STRINGS + 2 pointers at these
        // addresses before the clone; this process owns its private copy and nothing else
        // in it uses the inbox (the command child that reads it shares it only while the
        // init is suspended).
        let (bytes, pointers) = unsafe {
            (
                std::slice::from_raw_parts_mut(plan.inbox.bytes, MAX_PAYLOAD),
                std::slice::from_raw_parts_mut(plan.inbox.pointers, MAX_STRINGS + 2),
            )
        };
        let payload = &mut bytes[..length];
        sys::read_exact_raw(plan.control_fd, payload)?;
        parse_command(payload, argc, envc, pointers)
    })();
    match result {
        Ok((program, cwd, argv, envp)) => Ok(Some(Received {
            program,
            cwd,
            argv,
            envp,
            stdio: [fds[0], fds[1], fds[2]],
            exec_fd: fds[3],
        })),
        Err(errno) => {
            close_all(&fds);
            Err(errno)
        }
    }
}

/// Entry point of the init (fork-style clone into the new namespaces). Never returns.
pub(crate) fn run_init(plan: &InitPlan<'_>) -> ! {
    if let Err(error) = init_setup(plan) {
        report(plan.setup_fd, error);
        sys::exit_now(SETUP_FAILED_EXIT)
    }
    // Ready: the parent sees EOF on the setup pipe.
    sys::close_raw(plan.setup_fd);
    loop {
        let received = match receive_command(plan) {
            Ok(Some(received)) => received,
            Ok(None) | Err(_) => sys::exit_now(PARENT_GONE_EXIT),
        };
        let status = run_command(plan, received);
        kill_and_reap_everything();
        sys::remove_sysv_ipc();
        let record = if libc::WIFSIGNALED(status) {
            status_record(STATUS_SIGNALED, libc::WTERMSIG(status))
        } else {
            status_record(STATUS_EXITED, libc::WEXITSTATUS(status))
        };
        if sys::write_all_raw(plan.control_fd, &record).is_err() {
            sys::exit_now(PARENT_GONE_EXIT)
        }
    }
}

/// Start one command and wait for it; its raw wait status. Exits when the command cannot be
/// started (after reporting why) or when the parent goes away while it runs (the kernel then
/// kills the namespace with us).
fn run_command(plan: &InitPlan<'_>, received: Received) -> c_int {
    let Received {
        program,
        cwd,
        argv,
        envp,
        stdio,
        exec_fd,
    } = received;
    let command = CommandPlan {
        program,
        cwd,
        argv,
        envp,
        stdio,
        exec_fd,
        rlimits: plan.rlimits,
        last_cap: plan.last_cap,
        // All three are already in force in the init, and so inherited.
        drop_capabilities: false,
        landlock: None,
        seccomp: None,
    };
    // The parent waits for this byte: EOF without it means the init died before starting
    // anything (an idle init killed from outside), so the command can go to a fresh one.
    if sys::write_all_raw(exec_fd, &[COMMAND_ACK]).is_err() {
        sys::exit_now(PARENT_GONE_EXIT)
    }
    let arg = &command as *const CommandPlan<'_> as *mut c_void;
    // SAFETY: command_entry only runs async-signal-safe code reading the plan, which this
    // (suspended) init keeps alive; the stack is reserved for this child.
    let started = unsafe { sys::vfork_child(plan.stack, command_entry, arg, None, 0) };
    // The init needs none of the command's streams: readers see EOF as soon as the last
    // process of the sandbox is gone.
    for fd in stdio {
        sys::close_raw(fd);
    }
    let pid = match started {
        Ok(pid) => pid,
        Err(errno) => {
            report(exec_fd, (SetupStep::ForkCommand, errno, NO_INDEX));
            sys::exit_now(SETUP_FAILED_EXIT)
        }
    };
    // The parent learns that the command is running (or failed) from EOF on this pipe.
    sys::close_raw(exec_fd);
    loop {
        if let Some(status) = reap_nohang(pid) {
            return status;
        }
        if sys::wait_for_hangup_or_signal(plan.control_fd) {
            sys::exit_now(PARENT_GONE_EXIT)
        }
    }
}

/// Entry point of a `vfork`-style command child: `arg` is the `CommandPlan`. Never returns.
pub(crate) extern "C" fn command_entry(arg: *mut c_void) -> c_int {
    // SAFETY: the creator passes a pointer to a CommandPlan that outlives this child (it is
    // suspended until the child execs or exits).
    let plan = unsafe { &*(arg as *const CommandPlan<'_>) };
    let error = match step(sys::reset_signals(), SetupStep::ResetSignals) {
        Ok(()) => command_main(plan),
        Err(error) => error,
    };
    report(plan.exec_fd, error);
    sys::exit_now(SETUP_FAILED_EXIT)
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

fn init_setup(plan: &InitPlan<'_>) -> StepResult {
    step(sys::reset_signals(), SetupStep::ResetSignals)?;
    // Other threads of the parent may have created fds (pipes of concurrent spawns) that
    // must not stay open for the life of this init.
    step(close_all_but(plan.keep_fds), SetupStep::CloseFds)?;
    // Hold 0, 1 and 2 so descriptors received with a command land at 3 and up, where the
    // command's dup2 onto 0..2 cannot clobber one of them.
    for _ in 0..3 {
        step(
            sys::openat2_raw(libc::AT_FDCWD, c"/dev/null", libc::O_RDWR),
            SetupStep::CloseFds,
        )?;
    }
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
    if let Some((staging, steps)) = plan.new_root {
        build_new_root(staging, steps)?;
    }
    if plan.egress {
        open_egress_listener(plan.control_fd)?;
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
    sys::ignore_signal(libc::SIGPIPE);
    // From here on the init itself is confined like its commands, which inherit it all:
    // no capability (dropped and locked out once, not per command), no_new_privs, Landlock
    // merged and the seccomp program compiled once per init. What the init still does
    // (receive, vfork, wait and kill its own uid's processes, remove IPC objects of its own
    // uid, report) needs none of them.
    step(
        sys::drop_all_capabilities(plan.last_cap),
        SetupStep::DropCapabilities,
    )?;
    verify_no_capability()?;
    step(sys::set_no_new_privs(), SetupStep::NoNewPrivs)?;
    if let Some(ruleset) = plan.landlock {
        step(sys::landlock_restrict_self(ruleset), SetupStep::Landlock)?;
    }
    if let Some(program) = plan.seccomp {
        step(sys::seccomp_set_filter(program), SetupStep::Seccomp)?;
    }
    Ok(())
}

/// In the init's fresh network namespace (while it still has `CAP_NET_ADMIN` there): bring
/// loopback up, listen on the egress port and hand the listener to the parent, which serves
/// it. The init keeps no copy: nothing in the sandbox can accept on it.
fn open_egress_listener(control_fd: RawFd) -> StepResult {
    step(sys::loopback_up(), SetupStep::EgressListener)?;
    let listener = step(
        sys::listen_loopback_raw(EGRESS_PORT),
        SetupStep::EgressListener,
    )?;
    let sent = sys::send_one_fd_raw(control_fd, listener);
    sys::close_raw(listener);
    step(sent, SetupStep::EgressListener)
}

/// Build the new root on a tmpfs at `staging` (see `newroot`) and pivot into it. Binds copy
/// each tree with its submounts and their flags (read-only, protected, masked, writable) as
/// set up before.
fn build_new_root(staging: &CStr, steps: &[RootStep]) -> StepResult {
    let index_error =
        |index: usize| move |errno: Errno| (SetupStep::BuildRoot, errno, index as u32);
    step(sys::mount_unbindable_tmpfs(staging), SetupStep::BuildRoot)?;
    for (index, root_step) in steps.iter().enumerate() {
        let target = root_step.target.as_c_str();
        let made = match &root_step.kind {
            EntryKind::Dir | EntryKind::BindDir => sys::mkdir_raw(target, 0o755),
            EntryKind::BindFile => sys::create_file_raw(target),
            EntryKind::Symlink(link) => sys::symlink_raw(link, target),
        };
        made.map_err(index_error(index))?;
        match root_step.kind {
            EntryKind::BindDir | EntryKind::BindFile => {
                bind_over(&root_step.host, target, BindMode::AsIs).map_err(index_error(index))?
            }
            EntryKind::Dir | EntryKind::Symlink(_) => {}
        }
    }
    step(sys::pivot_root_to(staging), SetupStep::BuildRoot)?;
    step(sys::make_mount_read_only(c"/"), SetupStep::BuildRoot)
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
fn command_main(plan: &CommandPlan<'_>) -> (SetupStep, Errno, u32) {
    match command_setup(plan) {
        // SAFETY: the pointers come from a CStringArray (direct spawn) or from the init's
        // parsed inbox, both NULL-terminated and alive until exec.
        Ok(()) => (
            SetupStep::Exec,
            unsafe { sys::execve_raw(plan.program, plan.argv, plan.envp) },
            NO_INDEX,
        ),
        Err(error) => error,
    }
}

fn command_setup(plan: &CommandPlan<'_>) -> StepResult {
    // Own session and process group: the backend (and the degraded mode) signals the group.
    step(sys::setsid(), SetupStep::NewSession)?;
    for &(resource, soft, hard) in plan.rlimits {
        step(sys::set_rlimit(resource, soft, hard), SetupStep::SetRlimit)?;
    }
    // SAFETY: `cwd` is a NUL-terminated string alive until exec.
    let cwd = unsafe { CStr::from_ptr(plan.cwd) };
    step(sys::chdir(cwd), SetupStep::ChangeDirectory)?;
    for (target, &fd) in plan.stdio.iter().enumerate() {
        step(sys::dup2(fd, target as RawFd), SetupStep::RedirectStdio)?;
    }
    // Nothing but stdio survives exec; the exec pipe and the ruleset fd stay usable until
    // then.
    step(
        sys::close_range(3, u32::MAX, libc::CLOSE_RANGE_CLOEXEC),
        SetupStep::CloseFds,
    )?;
    if plan.drop_capabilities {
        step(
            sys::drop_all_capabilities(plan.last_cap),
            SetupStep::DropCapabilities,
        )?;
    }
    verify_no_capability()?;
    step(sys::set_no_new_privs(), SetupStep::NoNewPrivs)?;
    if let Some(ruleset) = plan.landlock {
        step(sys::landlock_restrict_self(ruleset), SetupStep::Landlock)?;
    }
    if let Some(program) = plan.seccomp {
        step(sys::seccomp_set_filter(program), SetupStep::Seccomp)?;
    }
    Ok(())
}

fn verify_no_capability() -> StepResult {
    match sys::has_any_capability() {
        Ok(false) => Ok(()),
        Ok(true) => Err((SetupStep::VerifyCapabilities, libc::EPERM, NO_INDEX)),
        Err(errno) => Err((SetupStep::VerifyCapabilities, errno, NO_INDEX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(pointers: &[*const c_char], start: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut index = start;
        while !pointers[index].is_null() {
            // SAFETY: the parser stored pointers to NUL-terminated strings in the payload.
            out.push(
                unsafe { CStr::from_ptr(pointers[index]) }
                    .to_string_lossy()
                    .into_owned(),
            );
            index += 1;
        }
        out
    }

    #[test]
    fn commands_round_trip_through_the_wire_format() {
        let message = encode_command(
            c"/bin/bash",
            c"/w",
            &[c"bash", c"-c", c"echo hi"],
            &[c"PATH=/bin", c"HOME=/h"],
        )
        .unwrap();
        let header = &message[..HEADER_LEN];
        let word = |i: usize| u32::from_ne_bytes(header[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(word(0) as usize, message.len() - HEADER_LEN);
        assert_eq!((word(1), word(2)), (3, 2));
        let payload = &message[HEADER_LEN..];
        let mut pointers = vec![std::ptr::null(); 8];
        let (program, cwd, argv, envp) = parse_command(payload, 3, 2, &mut pointers).unwrap();
        // SAFETY: as above.
        unsafe {
            assert_eq!(CStr::from_ptr(program), c"/bin/bash");
            assert_eq!(CStr::from_ptr(cwd), c"/w");
        }
        assert_eq!(argv, pointers.as_ptr());
        assert_eq!(strings(&pointers, 0), vec!["bash", "-c", "echo hi"]);
        assert_eq!(envp, pointers.as_ptr().wrapping_add(4));
        assert_eq!(strings(&pointers, 4), vec!["PATH=/bin", "HOME=/h"]);
    }

    #[test]
    fn malformed_payloads_are_refused() {
        let mut pointers = vec![std::ptr::null(); 8];
        // Counts larger than the strings present.
        assert_eq!(
            parse_command(b"/p\0/c\0a\0", 2, 0, &mut pointers),
            Err(libc::EPROTO)
        );
        // Trailing bytes beyond the counted strings.
        assert_eq!(
            parse_command(b"/p\0/c\0a\0extra\0", 1, 0, &mut pointers),
            Err(libc::EPROTO)
        );
        // No terminating NUL.
        assert_eq!(
            parse_command(b"/p\0/c\0a", 1, 0, &mut pointers),
            Err(libc::EPROTO)
        );
        // Too many strings for the pointer array, or no argv[0].
        assert_eq!(
            parse_command(b"/p\0/c\0a\0b\0c\0d\0e\0f\0g\0", 4, 3, &mut pointers),
            Err(libc::EPROTO)
        );
        assert_eq!(
            parse_command(b"/p\0/c\0", 0, 0, &mut pointers),
            Err(libc::EPROTO)
        );
    }

    #[test]
    fn oversized_commands_are_not_encoded() {
        let big = std::ffi::CString::new(vec![b'x'; MAX_PAYLOAD]).unwrap();
        assert!(encode_command(c"/p", c"/", &[big.as_c_str()], &[]).is_none());
        let many: Vec<&CStr> = vec![c"x"; MAX_STRINGS + 1];
        assert!(encode_command(c"/p", c"/", &many, &[]).is_none());
    }
}
