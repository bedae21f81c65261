//! The container profile's warden: without a PID namespace per command, nothing would take a
//! command's processes along when the process that started them (the helper) dies — killed,
//! out of memory, crashed — under a running command. The warden is a small child process of
//! this one, started with the sandbox, that knows the process group of every running command
//! (each command's whole tree: it cannot leave its group) and kills those groups once this
//! process is gone.
//!
//! Protocol: one pipe, this process writes, the warden reads 4-byte records (native-endian
//! `i32`): `+pgid` when a command starts, `-pgid` once its group is gone. A write of 4 bytes
//! to a pipe is atomic, so records never tear. End of file (this process exited, whatever
//! the cause: the kernel closes the write end) makes the warden `SIGKILL` every group still
//! listed, then exit.
//!
//! The warden is outside every command's Landlock domain, so with Landlock's signal scope
//! (ABI 6) a command cannot signal it (nor this process); it ignores the signals a terminal
//! or a process-group kill sends (HUP, INT, QUIT, TERM, USR1, USR2, PIPE, ALRM, and the job
//! control stops TSTP, TTIN, TTOU), so only `SIGKILL` ends it and `SIGSTOP` stops it early.
//! Should it have ended anyway, a thread watching it (one per warden, ending with it) starts a
//! new one at once, told about every group still running; failing that, the next command's
//! start tries again, and when that fails too the command is refused. A warden that can no longer
//! be told (its pipe full: it stopped reading) is killed, not just let go — on the end of file
//! it would kill every group it lists, the running commands among them — and replaced at once.
//!
//! Groups are listed while the command's leader is not reaped (its zombie holds the group id,
//! so it cannot be reused): registered right after the start, removed once the group is gone
//! or its tree was killed.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, Weak};

use super::sys;

/// Most groups the warden lists at once (more running commands are refused).
pub(crate) const MAX_GROUPS: usize = 4096;

/// The signals the warden ignores: what a terminal or a signal to the helper's process group
/// sends.
const IGNORED: [libc::c_int; 11] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGPIPE,
    libc::SIGALRM,
    // Job control (a terminal's ^Z, a background read or write): a stopped warden reads
    // nothing, and its pipe fills up.
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
];

/// The warden of one sandbox: the running process (started on demand) and the groups it must
/// know about.
#[derive(Debug)]
pub(crate) struct Warden {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    /// This state itself, for the watcher thread of each warden started.
    this: Weak<Mutex<State>>,
    /// Whether each warden started gets a watcher (always, but in tests of the replacement
    /// at a command's start).
    watched: bool,
    process: Option<Process>,
    /// Running commands' groups, with how often each is registered (a group id can only be
    /// registered again after the first was removed, but count rather than assume).
    groups: BTreeMap<i32, u32>,
}

#[derive(Debug)]
struct Process {
    pid: i32,
    /// Taken only when dropped.
    pidfd: Option<OwnedFd>,
    /// The write end of the pipe (non-blocking: a warden that stopped reading fails the
    /// write instead of blocking a command's start). Taken only when dropped.
    pipe: Option<OwnedFd>,
}

impl Process {
    /// Let go of a warden that can no longer be told (or kept) up to date. It is killed
    /// first: if it only saw its pipe close, it would kill every group it still lists — the
    /// commands still running, and a group that ended and whose id may be another's by now.
    fn give_up(self) {
        if let Some(pidfd) = self.pidfd.as_ref() {
            // ESRCH: it is already gone, which is the goal.
            let _ = sys::pidfd_send_signal(pidfd, libc::SIGKILL);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Closing the pipe is the end of file the warden waits for (nothing is listed any
        // more when a sandbox drops it, so it just exits); it is reaped in the background.
        drop(self.pipe.take());
        if let Some(pidfd) = self.pidfd.take() {
            super::background::reap_later(pidfd);
        }
    }
}

impl Warden {
    /// A warden with its process started (the sandbox fails to prepare when it cannot).
    pub(crate) fn start() -> io::Result<Warden> {
        Warden::start_with(true)
    }

    fn start_with(watched: bool) -> io::Result<Warden> {
        let state = Arc::new_cyclic(|this| {
            Mutex::new(State {
                this: this.clone(),
                watched,
                process: None,
                groups: BTreeMap::new(),
            })
        });
        super::lock(&state).ensure_running()?;
        Ok(Warden { state })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        super::lock(&self.state)
    }

    /// A command whose process group is `pgid` started.
    ///
    /// # Errors
    /// The warden could not be (re)started or told; the caller kills the command.
    pub(crate) fn register(&self, pgid: i32) -> io::Result<()> {
        let mut state = self.lock();
        if state.groups.len() >= MAX_GROUPS && !state.groups.contains_key(&pgid) {
            return Err(io::Error::other(format!(
                "more than {MAX_GROUPS} commands running at once"
            )));
        }
        // Started (when it must be) before the group is listed: a new warden is told every
        // listed group, and must not be told this one twice.
        let result = state
            .ensure_running()
            .and_then(|process| send(process, pgid));
        match &result {
            Ok(()) => *state.groups.entry(pgid).or_default() += 1,
            Err(error) => {
                tracing::warn!(%error, pgid, "sandbox: the warden of command groups could not be told about a command; it is refused");
                // A warden that cannot be written to is of no use: the running commands get
                // a new one.
                state.replace();
            }
        }
        result
    }

    /// The group `pgid` registered earlier is gone (or its tree was killed).
    pub(crate) fn unregister(&self, pgid: i32) {
        let mut state = self.lock();
        if !state.forget(pgid) {
            return;
        }
        let Some(process) = state.process.as_ref() else {
            return;
        };
        if let Err(error) = send(process, -pgid) {
            // The warden would kill a group that no longer is this command's: start a new
            // one (told only about the groups still running) before the next command.
            tracing::warn!(%error, pgid, "sandbox: the warden of command groups could not be told that a command ended; it is replaced");
            state.replace();
        }
    }

    /// The warden's pid, if one runs (tests).
    #[cfg(test)]
    pub(crate) fn pid(&self) -> Option<i32> {
        self.lock().process.as_ref().map(|process| process.pid)
    }

    /// Wait until the running warden has exited (tests).
    #[cfg(test)]
    fn wait_for_exit(&self) {
        let state = self.lock();
        let pidfd = state
            .process
            .as_ref()
            .and_then(|p| p.pidfd.as_ref())
            .unwrap();
        sys::pidfd_exited(pidfd, true).unwrap();
    }
}

impl State {
    /// Remove one registration of `pgid`; whether there was one.
    fn forget(&mut self, pgid: i32) -> bool {
        match self.groups.get_mut(&pgid) {
            Some(count) if *count > 1 => {
                *count -= 1;
                true
            }
            Some(_) => {
                self.groups.remove(&pgid);
                true
            }
            None => false,
        }
    }

    /// Give the current warden up and start a new one, told the listed groups (when that
    /// fails, the next command's start tries again).
    fn replace(&mut self) {
        if let Some(old) = self.process.take() {
            old.give_up();
        }
        if let Err(error) = self.ensure_running() {
            tracing::warn!(%error, "sandbox: no new warden of command groups could be started");
        }
    }

    /// The running warden, started anew (and told every listed group) when the last one
    /// ended or was given up.
    fn ensure_running(&mut self) -> io::Result<&Process> {
        let alive = match self.process.as_ref() {
            Some(Process {
                pidfd: Some(pidfd), ..
            }) => !sys::pidfd_exited(pidfd, false)?,
            Some(_) => false,
            None => false,
        };
        if !alive {
            if let Some(old) = self.process.take() {
                tracing::warn!(
                    pid = old.pid,
                    "sandbox: the warden of command groups ended; starting a new one"
                );
                old.give_up();
            }
            let process = spawn()?;
            // Watched from now on: a warden that ends (the OOM killer, a signal on a kernel
            // without Landlock's signal scope) is replaced at once, not at the next command.
            if let Some(pidfd) = process.pidfd.as_ref().filter(|_| self.watched) {
                watch(
                    self.this.clone(),
                    process.pid,
                    sys::dup_cloexec_at_least(pidfd, 3)?,
                )?;
            }
            for (&pgid, &count) in &self.groups {
                for _ in 0..count {
                    if let Err(error) = send(&process, pgid) {
                        process.give_up();
                        return Err(error);
                    }
                }
            }
            self.process = Some(process);
        }
        self.process
            .as_ref()
            .ok_or_else(|| io::Error::other("no warden"))
    }
}

/// Start the thread that waits for the warden `pid` (behind `pidfd`) to end and then, if it
/// is still the sandbox's warden, replaces it (told the groups still listed). The thread ends
/// with its warden; a sandbox dropped ends its warden.
fn watch(state: Weak<Mutex<State>>, pid: i32, pidfd: OwnedFd) -> io::Result<()> {
    std::thread::Builder::new()
        .name("cordon-warden-watch".to_owned())
        .spawn(move || {
            // Ended, or already reaped by the background reaper (ECHILD): gone either way.
            let _ = sys::pidfd_exited(&pidfd, true);
            drop(pidfd);
            let Some(state) = state.upgrade() else {
                return;
            };
            let mut state = super::lock(&state);
            if state.process.as_ref().map(|process| process.pid) != Some(pid) {
                // Given up and replaced already (or the sandbox is going away).
                return;
            }
            tracing::warn!(
                pid,
                "sandbox: the warden of command groups ended; starting a new one"
            );
            state.replace();
        })
        .map(|_| ())
}

/// Write one record.
fn send(process: &Process, value: i32) -> io::Result<()> {
    let record = value.to_ne_bytes();
    let Some(pipe) = process.pipe.as_ref() else {
        return Err(io::Error::from(io::ErrorKind::BrokenPipe));
    };
    // SAFETY: `record` is readable for its length; the fd is open.
    let written = unsafe { libc::write(pipe.as_raw_fd(), record.as_ptr().cast(), record.len()) };
    match written {
        4 => Ok(()),
        n if n < 0 => Err(io::Error::last_os_error()),
        // A pipe write of 4 bytes is all or nothing; anything else is a broken contract.
        _ => Err(io::Error::other("a short write to the warden's pipe")),
    }
}

/// Start a warden process; returns once it has set its signals up.
fn spawn() -> io::Result<Process> {
    let (read, write) = sys::pipe_cloexec()?;
    sys::set_nonblocking(&write)?;
    // Closed by the warden (with every other descriptor but `read`) once it is ready.
    let (ready_read, ready_write) = sys::pipe_cloexec()?;
    let keep = read.as_raw_fd();
    // Read before the clone: the child may not allocate.
    let argv_area = sys::argv_area();
    let saved = sys::block_all_signals();
    // SAFETY: the child branch runs only `run`, which is async-signal-safe and ends in
    // _exit; every signal is blocked across the clone.
    let cloned = unsafe { sys::clone_process(0) };
    let cloned = match cloned {
        Ok(sys::Cloned::Child) => run(keep, argv_area),
        other => other,
    };
    sys::restore_signals(&saved);
    drop(read);
    drop(ready_write);
    let (pid, pidfd) = match cloned? {
        sys::Cloned::Parent { pid, pidfd } => (pid, pidfd),
        sys::Cloned::Child => unreachable!("the child branch never returns"),
    };
    let process = Process {
        pid,
        pidfd: Some(pidfd),
        pipe: Some(write),
    };
    // End of file: the warden closed its copy (ready), or it died (seen at its next use).
    let mut byte = [0u8; 1];
    loop {
        // SAFETY: `byte` is writable for its length; the fd is open.
        let n = unsafe { libc::read(ready_read.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break;
    }
    Ok(process)
}

/// The warden's life (in the child: async-signal-safe only, no allocation, ends in `_exit`).
fn run(pipe: RawFd, argv_area: Option<(usize, usize)>) -> ! {
    let _ = sys::reset_signals();
    for signal in IGNORED {
        sys::ignore_signal(signal);
    }
    // Only the pipe stays open: the warden must hold nothing of the parent's (a socket, a
    // command's pipe) that would keep its peer waiting.
    let pipe_u = pipe as u32;
    if (pipe_u > 0 && sys::close_range(0, pipe_u - 1, 0).is_err())
        || sys::close_range(pipe_u + 1, u32::MAX, 0).is_err()
    {
        sys::exit_now(1);
    }
    // Not the parent's command line (which may carry secrets, and which tools looking for
    // the parent by its command line would find twice).
    sys::rename_process(argv_area, c"cordon-warden", b"cordon-sandbox-warden\0");
    // Nothing may ptrace it or read its memory (a copy of the parent's); it carries on if
    // this fails, as it has nothing to set up that could be undone.
    let _ = sys::set_not_dumpable();
    let mut groups = [0i32; MAX_GROUPS];
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::read(pipe, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            // SAFETY: reading errno is async-signal-safe.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            break;
        }
        if n == 0 {
            break;
        }
        // Every write is 4 bytes and atomic, so a read holds whole records.
        for record in buf[..n as usize].chunks_exact(4) {
            let value = i32::from_ne_bytes([record[0], record[1], record[2], record[3]]);
            if value > 0 {
                if let Some(slot) = groups.iter_mut().find(|slot| **slot == 0) {
                    *slot = value;
                }
            } else if value < 0
                && let Some(slot) = groups.iter_mut().find(|slot| **slot == -value)
            {
                *slot = 0;
            }
        }
    }
    for &pgid in &groups {
        if pgid > 0 {
            // SAFETY: kill has no memory effects.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
    sys::exit_now(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process in a group of its own (its own pid), sleeping until killed.
    fn sleeper() -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .unwrap()
    }

    fn wait_gone(child: &mut std::process::Child) -> std::process::ExitStatus {
        // Blocks until the process ends: the warden is what ends it.
        child.wait().unwrap()
    }

    #[test]
    fn listed_groups_are_killed_when_the_sandbox_side_goes_away() {
        use std::os::unix::process::ExitStatusExt;
        let warden = Warden::start().unwrap();
        let (mut a, mut b, mut c) = (sleeper(), sleeper(), sleeper());
        let (pa, pb, pc) = (a.id() as i32, b.id() as i32, c.id() as i32);
        warden.register(pa).unwrap();
        warden.register(pb).unwrap();
        warden.register(pc).unwrap();
        warden.unregister(pb);
        // The end of file the warden sees when its parent dies.
        drop(warden);
        assert_eq!(wait_gone(&mut a).signal(), Some(libc::SIGKILL));
        assert_eq!(wait_gone(&mut c).signal(), Some(libc::SIGKILL));
        // The one that ended (unregistered) is left alone.
        assert_eq!(ended_by_our_term(&mut b), Some(libc::SIGTERM));
    }

    #[test]
    fn a_warden_that_ended_is_replaced_at_once_and_told_the_running_groups() {
        use std::os::unix::process::ExitStatusExt;
        let warden = Warden::start().unwrap();
        let mut a = sleeper();
        let pa = a.id() as i32;
        warden.register(pa).unwrap();
        let first = warden.pid().unwrap();
        // SAFETY: kill has no memory effects; the pid is our own child's.
        assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);
        // Replaced without waiting for a command to start (its watcher saw it end), and the
        // new one is told the running group.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while warden.pid() == Some(first) {
            assert!(
                std::time::Instant::now() < deadline,
                "the warden that ended was not replaced"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(warden.pid().is_some());
        let mut b = sleeper();
        let pb = b.id() as i32;
        warden.register(pb).unwrap();
        assert_ne!(warden.pid(), Some(first));
        drop(warden);
        assert_eq!(wait_gone(&mut a).signal(), Some(libc::SIGKILL));
        assert_eq!(wait_gone(&mut b).signal(), Some(libc::SIGKILL));
    }

    /// Wait until our child `pid` (a warden) has stopped.
    fn wait_stopped(pid: i32) {
        // SAFETY: an all-zero siginfo_t is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is writable; WNOWAIT leaves the state to be seen again.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WSTOPPED | libc::WNOWAIT | libc::__WALL,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    }

    /// A pidfd of `pid` of our own, to see it exit after the warden let go of it (and maybe
    /// reaped it already).
    fn pidfd_of(pid: i32) -> OwnedFd {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes no pointers; the result is a new fd we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: a new, open fd owned by nothing else.
        unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
    }

    /// Block until the process behind `pidfd` has exited (reaped or not).
    fn wait_exited(pidfd: &OwnedFd) {
        let mut poll = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `poll` is one valid pollfd.
        while unsafe { libc::poll(&mut poll, 1, -1) } != 1 {
            assert_eq!(
                io::Error::last_os_error().kind(),
                io::ErrorKind::Interrupted
            );
        }
    }

    /// What ends `child` when this test sends it SIGTERM now: SIGTERM if nothing killed it
    /// before, SIGKILL if a warden did (a process already dying of SIGKILL drops later
    /// signals), so a kill that was sent but not yet delivered is seen too.
    fn ended_by_our_term(child: &mut std::process::Child) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        // SAFETY: kill has no memory effects; the pid is our own unreaped child's.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        child.wait().unwrap().signal()
    }

    /// Group ids no process has (above the largest pid Linux allows).
    const NO_SUCH_GROUP: i32 = 0x4000_0000;

    #[test]
    fn a_warden_given_up_kills_nothing_and_is_replaced_at_once() {
        use std::os::unix::process::ExitStatusExt;
        let warden = Warden::start().unwrap();
        let (mut a, mut c) = (sleeper(), sleeper());
        warden.register(a.id() as i32).unwrap();
        warden.register(c.id() as i32).unwrap();
        let first = warden.pid().unwrap();
        let first_fd = pidfd_of(first);
        // A warden that stopped reading (stopped, starved): its pipe fills up until telling
        // it fails and it is given up.
        // SAFETY: kill has no memory effects; the pid is our own child's.
        assert_eq!(unsafe { libc::kill(first, libc::SIGSTOP) }, 0);
        wait_stopped(first);
        let mut given_up = false;
        for index in 0..100_000 {
            let pgid = NO_SUCH_GROUP + index;
            if warden.register(pgid).is_err() {
                given_up = true;
                break;
            }
            warden.unregister(pgid);
            if warden.pid() != Some(first) {
                given_up = true;
                break;
            }
        }
        assert!(given_up, "a full pipe never failed");
        // Were it to go on, it would see the end of file and kill what it lists.
        // SAFETY: kill has no memory effects; the pid is (or was) our own child's.
        unsafe { libc::kill(first, libc::SIGCONT) };
        wait_exited(&first_fd);
        assert_eq!(
            ended_by_our_term(&mut c),
            Some(libc::SIGTERM),
            "the given-up warden killed a running command"
        );
        // And the running command is covered by a new warden straight away.
        let second = warden.pid().expect("no warden runs after one was given up");
        assert_ne!(second, first);
        drop(warden);
        assert_eq!(wait_gone(&mut a).signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn a_replacement_warden_lists_the_new_command_once() {
        let warden = Warden::start_with(false).unwrap();
        let first = warden.pid().unwrap();
        // SAFETY: kill has no memory effects; the pid is our own child's.
        assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);
        warden.wait_for_exit();
        // This start finds the warden gone and starts a new one.
        let mut b = sleeper();
        let pb = b.id() as i32;
        warden.register(pb).unwrap();
        assert_ne!(warden.pid(), Some(first));
        // The command ended (as far as the sandbox knows): it must not be killed any more.
        warden.unregister(pb);
        let second_fd = pidfd_of(warden.pid().unwrap());
        drop(warden);
        wait_exited(&second_fd);
        assert_eq!(
            ended_by_our_term(&mut b),
            Some(libc::SIGTERM),
            "an ended command's group was killed"
        );
    }

    /// The mask of signals process `pid` ignores (`SigIgn` of its status).
    fn ignored_signals(pid: i32) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix("SigIgn:"))
            .map(|mask| u64::from_str_radix(mask.trim(), 16).unwrap())
            .unwrap()
    }

    #[test]
    fn the_warden_does_not_stop_for_job_control_signals() {
        let warden = Warden::start().unwrap();
        let pid = warden.pid().unwrap();
        let ignored = ignored_signals(pid);
        for signal in [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU] {
            assert_ne!(
                ignored & (1 << (signal - 1)),
                0,
                "signal {signal} is not ignored"
            );
        }
    }

    #[test]
    fn the_warden_ignores_the_signals_of_a_terminal_or_group_kill() {
        let warden = Warden::start().unwrap();
        let mut a = sleeper();
        warden.register(a.id() as i32).unwrap();
        let pid = warden.pid().unwrap();
        // Named for what it is, not a copy of this process's command line.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(
            cmdline.starts_with(b"cordon-sandbox-warden\0"),
            "{cmdline:?}"
        );
        // Ignored signals are discarded when sent, so the warden is untouched by these.
        let ignored = ignored_signals(pid);
        for signal in IGNORED {
            assert_ne!(
                ignored & (1 << (signal - 1)),
                0,
                "signal {signal} is not ignored"
            );
            // SAFETY: kill has no memory effects; the pid is our own child's.
            assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        }
        let mut b = sleeper();
        warden.register(b.id() as i32).unwrap();
        assert_eq!(warden.pid(), Some(pid));
        drop(warden);
        wait_gone(&mut a);
        wait_gone(&mut b);
    }
}
