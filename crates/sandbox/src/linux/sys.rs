//! The crate's whole syscall surface: thin wrappers over the raw Linux calls the sandbox
//! needs, with the kernel ABI constants and structs libc does not carry. Nearly every
//! `unsafe` block lives here; elsewhere there are only the calls of the two `unsafe fn`s that
//! create child processes (`clone_process`, `vfork_child`) and the reads of `siginfo` / the
//! plan pointer in `child.rs`.
//!
//! Two families of wrappers:
//! - parent-side ones return `io::Result` and may allocate;
//! - child-side ones (used between `clone` and `execve`) return `Result<_, Errno>`, never
//!   allocate, never lock and never panic: they are async-signal-safe.

use std::ffi::{CStr, CString, c_char, c_int, c_long, c_void};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A raw `errno` value, as returned by child-side wrappers.
pub(crate) type Errno = i32;

/// The calling thread's `errno`.
fn errno() -> Errno {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for reads.
    unsafe { *libc::__errno_location() }
}

/// Map a raw syscall return value to `Ok(value)` or `Err(errno)`.
fn check(ret: c_long) -> Result<c_long, Errno> {
    if ret < 0 { Err(errno()) } else { Ok(ret) }
}

/// Map a raw syscall return value to an `io::Result`.
fn check_io(ret: c_long) -> io::Result<c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

// ---------------------------------------------------------------------------------------
// Kernel ABI constants missing from libc for linux-gnu.

/// `open_tree(2)`: make a detached copy of the tree instead of opening it.
const OPEN_TREE_CLONE: u32 = 1;
/// `open_tree(2)`/`mount_setattr(2)`: apply to the whole subtree.
const AT_RECURSIVE: u32 = 0x8000;
/// `move_mount(2)`: the source is the fd itself.
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x04;
/// `move_mount(2)`: the target is the fd itself.
const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;
/// `mount_setattr(2)` attribute: read-only.
const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// `mount_setattr(2)` attribute: ignore setuid/setgid bits and file capabilities.
const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// `mount_setattr(2)` attribute: no device files.
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `landlock_create_ruleset(2)` flag: return the ABI version.
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
/// `landlock_add_rule(2)` rule type: a file hierarchy.
const LANDLOCK_RULE_PATH_BENEATH: c_int = 1;
/// `struct landlock_ruleset_attr` (ABI 6 layout; its size tells the kernel which fields
/// are present).
#[repr(C)]
pub(crate) struct LandlockRulesetAttr {
    /// Filesystem rights the ruleset handles (denies unless a rule grants them).
    pub handled_access_fs: u64,
    /// Network rights the ruleset handles (ABI >= 4).
    pub handled_access_net: u64,
    /// IPC scopes (ABI >= 6).
    pub scoped: u64,
}

/// `struct landlock_path_beneath_attr` (packed in the kernel ABI).
#[repr(C, packed)]
struct LandlockPathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// `struct open_how` of `openat2(2)`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `struct sock_filter`: one classic BPF instruction.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SockFilter {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Constant operand.
    pub k: u32,
}

/// `struct sock_fprog`: a BPF program.
#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const SockFilter,
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit capability sets in two data structs.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

// ---------------------------------------------------------------------------------------
// Parent-side wrappers.

/// The Landlock ABI version, or 0 when Landlock is unavailable or disabled.
pub(crate) fn landlock_abi() -> u32 {
    // SAFETY: with a NULL attr and size 0 the VERSION flag only queries the ABI number.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(ret).unwrap_or(0)
}

/// Create a Landlock ruleset; `size` selects the ABI layout of `attr` (8, 16 or 24 bytes).
pub(crate) fn landlock_create_ruleset(
    attr: &LandlockRulesetAttr,
    size: usize,
) -> io::Result<OwnedFd> {
    let size = size.min(std::mem::size_of::<LandlockRulesetAttr>());
    // SAFETY: `attr` points to a live struct at least `size` bytes long.
    let fd = check_io(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            attr as *const LandlockRulesetAttr,
            size,
            0u32,
        )
    })?;
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Add a path-beneath rule granting `rights` under the inode `parent` refers to.
pub(crate) fn landlock_add_path_rule(
    ruleset: &OwnedFd,
    parent: &OwnedFd,
    rights: u64,
) -> io::Result<()> {
    let attr = LandlockPathBeneathAttr {
        allowed_access: rights,
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: `attr` is a live, correctly laid out rule; both fds are open.
    check_io(unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const LandlockPathBeneathAttr,
            0u32,
        )
    })?;
    Ok(())
}

/// Receive the one descriptor sent with a single byte on a stream socket (blocking).
pub(crate) fn recv_one_fd(socket: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut fds = [-1 as RawFd; 4];
    let (read, count) = recv_with_fds_raw(socket.as_raw_fd(), &mut byte, &mut fds)
        .map_err(io::Error::from_raw_os_error)?;
    for &extra in fds.iter().take(count).skip(1) {
        close_raw(extra);
    }
    match (read, count) {
        // SAFETY: the kernel installed this descriptor for this process; nothing else owns it.
        (1, 1) => Ok(unsafe { OwnedFd::from_raw_fd(fds[0]) }),
        (0, 0) => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        _ => Err(io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

/// Put `fd` in non-blocking mode (`O_NONBLOCK` on its open file description).
pub(crate) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an open fd have no memory effects.
    let flags = check_io(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) }.into())?;
    let flags = flags as c_int | libc::O_NONBLOCK;
    // SAFETY: as above.
    let set = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) };
    check_io(set.into())?;
    Ok(())
}

/// Accept and close every connection waiting on the listener `fd`; how many. Each accept
/// follows a `poll` that found one waiting, so a caller that made the (shared) listener
/// blocking cannot make this block.
pub(crate) fn close_pending_connections(fd: &OwnedFd) -> usize {
    let mut closed = 0;
    loop {
        let mut waiting = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd, zero timeout.
        let ready = unsafe { libc::poll(&mut waiting, 1, 0) };
        if ready <= 0 || waiting.revents & libc::POLLIN == 0 {
            return closed;
        }
        // SAFETY: accept4 with NULL address buffers only returns a new fd or fails.
        let ret = unsafe {
            libc::accept4(
                fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if ret >= 0 {
            close_raw(ret);
            closed += 1;
            continue;
        }
        match errno() {
            libc::EINTR | libc::ECONNABORTED => {}
            _ => return closed,
        }
    }
}

/// Whether seccomp filters can be installed (the kernel knows the ERRNO and KILL_PROCESS
/// actions).
pub(crate) fn seccomp_filter_available() -> bool {
    let action: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32 from the pointer.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0u32,
            &action as *const u32,
        )
    };
    ret == 0
}

/// Open a path with `O_PATH` (following symlinks), for Landlock rules.
pub(crate) fn open_path(path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: `path` is NUL-terminated; the flags create no file.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `open` returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(dirfd, path, flags, RESOLVE_NO_SYMLINKS)`: open without following any symlink.
pub(crate) fn open_no_symlinks(
    dirfd: Option<&OwnedFd>,
    path: &CStr,
    flags: c_int,
) -> io::Result<OwnedFd> {
    let dirfd = dirfd.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd);
    openat2_raw(dirfd, path, flags)
        .map_err(io::Error::from_raw_os_error)
        .map(|fd| {
            // SAFETY: openat2 returned a new file descriptor that nothing else owns.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
}

/// `sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)`: start writeback of every dirty page
/// of the file without waiting for it.
/// `renameat2(old_dir, old, new_dir, new, flags)` as the raw system call: glibc wraps it, musl
/// (the static release build) does not, and nix offers its wrapper on glibc only.
pub(crate) fn renameat2(
    old_dir: std::os::fd::BorrowedFd<'_>,
    old: &std::ffi::OsStr,
    new_dir: std::os::fd::BorrowedFd<'_>,
    new: &std::ffi::OsStr,
    flags: libc::c_uint,
) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let nul = |_| io::Error::from_raw_os_error(libc::EINVAL);
    let old = CString::new(old.as_bytes()).map_err(nul)?;
    let new = CString::new(new.as_bytes()).map_err(nul)?;
    // SAFETY: both paths are NUL-terminated strings that outlive the call and the descriptors
    // are borrowed, so open for its duration; the kernel only reads the paths.
    check_io(unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            old_dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

pub(crate) fn start_writeback(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall on a borrowed, open descriptor; no memory is passed.
    check_io(
        unsafe { libc::sync_file_range(fd.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) }
            as c_long,
    )
    .map(drop)
}

/// `flock(fd, op)`.
pub(crate) fn flock(fd: &OwnedFd, op: c_int) -> io::Result<()> {
    // SAFETY: flock on an open fd has no memory effects.
    check_io(unsafe { libc::flock(fd.as_raw_fd(), op) } as c_long).map(|_| ())
}

/// `mkdirat(dirfd, name, mode)`.
pub(crate) fn mkdirat(dirfd: &OwnedFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; dirfd is open.
    check_io(unsafe { libc::mkdirat(dirfd.as_raw_fd(), name.as_ptr(), mode) } as c_long).map(|_| ())
}

/// `fchmod(fd, mode)`.
pub(crate) fn fchmod(fd: &OwnedFd, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod on an open fd has no memory effects.
    check_io(unsafe { libc::fchmod(fd.as_raw_fd(), mode) } as c_long).map(|_| ())
}

/// `unlinkat(dirfd, name, AT_REMOVEDIR)`.
pub(crate) fn rmdirat(dirfd: &OwnedFd, name: &CStr) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; dirfd is open.
    check_io(
        unsafe { libc::unlinkat(dirfd.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) } as c_long,
    )
    .map(|_| ())
}

/// `(st_dev, st_ino)` of an open file.
pub(crate) fn fstat_id(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    fstat_raw(fd.as_raw_fd()).map_err(io::Error::from_raw_os_error)
}

/// Whether an open file is a directory.
pub(crate) fn fstat_is_dir(fd: &OwnedFd) -> io::Result<bool> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `stat` is a writable struct stat.
    check_io(unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } as c_long)?;
    // SAFETY: fstat succeeded and filled the struct.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// `(st_mode & S_IFMT, st_rdev)` of an fd (an `O_PATH` one too).
pub(crate) fn fstat_kind(fd: &OwnedFd) -> io::Result<(libc::mode_t, libc::dev_t)> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `stat` is a writable struct stat.
    check_io(unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } as c_long)?;
    // SAFETY: fstat succeeded and filled the struct.
    let stat = unsafe { stat.assume_init() };
    Ok((stat.st_mode & libc::S_IFMT, stat.st_rdev))
}

/// Whether the mount an fd (an `O_PATH` one too) lives on is read-only (`ST_RDONLY`).
pub(crate) fn on_read_only_mount(fd: &OwnedFd) -> io::Result<bool> {
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `stat` is a writable struct statvfs.
    check_io(unsafe { libc::fstatvfs(fd.as_raw_fd(), stat.as_mut_ptr()) } as c_long)?;
    // SAFETY: fstatvfs succeeded and filled the struct.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.f_flag & libc::ST_RDONLY != 0)
}

/// `(st_dev, st_ino)` of `name` in `dirfd`, without following a final symlink.
pub(crate) fn fstatat_id(dirfd: &OwnedFd, name: &CStr) -> io::Result<(u64, u64)> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `stat` is a writable struct stat; `name` is NUL-terminated.
    check_io(unsafe {
        libc::fstatat(
            dirfd.as_raw_fd(),
            name.as_ptr(),
            stat.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } as c_long)?;
    // SAFETY: fstatat succeeded and filled the struct.
    let stat = unsafe { stat.assume_init() };
    Ok((stat.st_dev, stat.st_ino))
}

/// This process's `RLIMIT_NOFILE`: `(soft, hard)`.
pub(crate) fn open_files_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the struct we own.
    check_io(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } as c_long)?;
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// Set this process's `RLIMIT_NOFILE`.
pub(crate) fn set_open_files_limit(soft: u64, hard: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads one `rlimit` from the struct we own.
    check_io(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } as c_long)?;
    Ok(())
}

/// A pipe whose both ends are close-on-exec: `(read, write)`.
pub(crate) fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    check_io(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } as c_long)?;
    // SAFETY: pipe2 returned two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Duplicate `fd` to a number >= `min`, close-on-exec.
pub(crate) fn dup_cloexec_at_least(fd: &OwnedFd, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on an open fd has no memory effects.
    let new =
        check_io(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) } as c_long)?;
    // SAFETY: fcntl returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new as RawFd) })
}

/// Read into `buf` from `fd`, retrying on EINTR.
pub(crate) fn read_retry(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is writable for `buf.len()` bytes.
        let ret = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if ret >= 0 {
            return Ok(ret as usize);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Read up to `buf.len()` bytes from a stream socket, waiting for all of them when `block`,
/// or taking them only if all are already there when not (`MSG_PEEK` first), so a partial
/// record is never consumed. Returns the bytes read (0 at EOF or when not all are there).
pub(crate) fn recv_peek_or_read(fd: &OwnedFd, buf: &mut [u8], block: bool) -> io::Result<usize> {
    let flags = if block {
        libc::MSG_WAITALL
    } else {
        libc::MSG_PEEK | libc::MSG_DONTWAIT
    };
    loop {
        // SAFETY: `buf` is writable for `buf.len()` bytes.
        let ret = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
        if ret >= 0 {
            let got = ret as usize;
            if block || got < buf.len() {
                return Ok(if got == buf.len() { got } else { 0 });
            }
            // All bytes are there: consume them.
            // SAFETY: as above.
            let ret = unsafe {
                libc::recv(
                    fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            return if ret < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(ret as usize)
            };
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(0),
            // The peer died with data of ours unread: as good as EOF.
            io::ErrorKind::ConnectionReset => return Ok(0),
            _ => return Err(error),
        }
    }
}

/// Whether the peer of a stream socket has closed it (readable with EOF).
pub(crate) fn peer_closed(fd: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `poll` is one writable pollfd.
    let ret = unsafe { libc::poll(&mut poll, 1, 0) };
    ret > 0 && poll.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
}

/// Current `(soft, hard)` limit of `resource`.
pub(crate) fn get_rlimit(resource: c_int) -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a writable rlimit64; pid 0 is the calling process.
    check_io(unsafe { libc::prlimit64(0, resource as _, std::ptr::null(), &mut limit) } as c_long)?;
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// The effective uid of this process.
pub(crate) fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The effective gid of this process.
pub(crate) fn getegid() -> u32 {
    // SAFETY: getegid has no preconditions.
    unsafe { libc::getegid() }
}

/// The kernel release, e.g. `6.18.44-fc`.
pub(crate) fn kernel_release() -> String {
    let mut name = std::mem::MaybeUninit::<libc::utsname>::zeroed();
    // SAFETY: `name` is a writable utsname.
    if unsafe { libc::uname(name.as_mut_ptr()) } != 0 {
        return String::new();
    }
    // SAFETY: uname succeeded; `release` is NUL-terminated.
    let name = unsafe { name.assume_init() };
    // SAFETY: `release` is a NUL-terminated array inside `name`.
    unsafe { CStr::from_ptr(name.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Block every signal in the calling thread; returns the previous mask.
pub(crate) fn block_all_signals() -> libc::sigset_t {
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: both sets are writable sigset_t values; sigfillset initialises `all`.
    unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
        old.assume_init()
    }
}

/// Restore a signal mask saved by [`block_all_signals`].
pub(crate) fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: `old` is a valid sigset_t.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut());
    }
}

/// The result of [`clone_process`] in each process.
pub(crate) enum Cloned {
    /// In the parent: the child's pid and a pidfd for it.
    Parent { pid: i32, pidfd: OwnedFd },
    /// In the child.
    Child,
}

/// Fork-like `clone(2)` with `flags` (namespace flags allowed) and `CLONE_PIDFD`.
///
/// # Safety
/// In the [`Cloned::Child`] branch the process is a copy of a possibly multi-threaded
/// parent with only the calling thread: it must call async-signal-safe code only and end in
/// `execve` or `_exit`. The caller should block signals around the call.
pub(crate) unsafe fn clone_process(flags: u64) -> io::Result<Cloned> {
    let mut pidfd: c_int = -1;
    let flags = flags | libc::CLONE_PIDFD as u64 | libc::SIGCHLD as u64;
    // SAFETY: a NULL stack gives fork semantics; with CLONE_PIDFD the kernel writes the
    // pidfd through the third argument (the parent-tid slot on every architecture).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            std::ptr::null_mut::<c_void>(),
            &mut pidfd as *mut c_int,
            std::ptr::null_mut::<c_void>(),
            0usize,
        )
    };
    match ret {
        0 => Ok(Cloned::Child),
        pid if pid > 0 => Ok(Cloned::Parent {
            pid: pid as i32,
            // SAFETY: the kernel stored a new pidfd that nothing else owns.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Register an fd (a pidfd or a socket) with the current tokio runtime for readability.
pub(crate) fn async_readable(pidfd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(io::Error::other(
            "wait() needs a tokio runtime; use wait_blocking()",
        ));
    }
    // SAFETY: an OwnedFd is a valid open descriptor that stays open, unchanged, for as long
    // as the AsyncFd owns it.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }
    .map_err(io::Error::from)
}

/// Take ownership of a pidfd returned through `CLONE_PIDFD`.
pub(crate) fn owned_pidfd(raw: c_int) -> io::Result<OwnedFd> {
    if raw < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: the kernel stored a new pidfd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Send `signal` to the process a pidfd refers to.
pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, signal: c_int) -> io::Result<()> {
    // SAFETY: NULL info means "as if kill(2)"; the pidfd is open.
    check_io(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<c_void>(),
            0u32,
        )
    })
    .map(|_| ())
}

/// `kill(-pgid, signal)`.
pub(crate) fn kill_process_group(pgid: i32, signal: c_int) -> io::Result<()> {
    // SAFETY: kill has no memory effects.
    check_io(unsafe { libc::kill(-pgid, signal) } as c_long).map(|_| ())
}

/// Most processes looked at in `/proc` for one process group.
const MAX_GROUP_SCAN: usize = 65_536;

/// The processes of group `pgid` that have not exited yet (a zombie has: its files are
/// closed), as `/proc` lists them; at most [`MAX_GROUP_SCAN`] entries are read.
pub(crate) fn live_group_members(pgid: i32) -> io::Result<Vec<i32>> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc")?.take(MAX_GROUP_SCAN) {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // One system call tells most processes apart (another group, or gone: -1); only the
        // group's own are read in full, for their state.
        // SAFETY: getpgid has no memory effects.
        if unsafe { libc::getpgid(pid) } != pgid {
            continue;
        }
        // Gone since the listing: nothing to wait for.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((state, group)) = parse_stat_state_and_group(&stat)
            && group == pgid
            && state != 'Z'
            && state != 'X'
        {
            members.push(pid);
        }
    }
    Ok(members)
}

/// The state and the process group of a `/proc/PID/stat` line (`pid (comm) S ppid pgrp …`;
/// the command name may hold spaces and parentheses, so the fields start after the last `)`).
pub(crate) fn parse_stat_state_and_group(stat: &str) -> Option<(char, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, group))
}

/// Wait until every process of group `pgid` has exited (after `SIGKILL` to the group), each
/// watched through a pidfd, for at most `timeout`. `Ok(false)`: some were still there.
pub(crate) fn wait_group_exited(pgid: i32, timeout: std::time::Duration) -> io::Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    let mut pidfds = Vec::new();
    for pid in live_group_members(pgid)? {
        // SAFETY: pidfd_open has no memory effects; a new descriptor is owned below.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::ESRCH) {
                continue;
            }
            return Err(error);
        }
        // SAFETY: the kernel returned a new pidfd that nothing else owns.
        pidfds.push(unsafe { OwnedFd::from_raw_fd(raw as c_int) });
    }
    while !pidfds.is_empty() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut polled: Vec<libc::pollfd> = pidfds
            .iter()
            .map(|fd| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let millis = c_int::try_from(left.as_millis().max(1)).unwrap_or(c_int::MAX);
        // SAFETY: `polled` is a valid array of `polled.len()` pollfd structures.
        let ready =
            unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, millis) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        let exited: Vec<bool> = polled.iter().map(|p| p.revents != 0).collect();
        let mut index = 0;
        pidfds.retain(|_| {
            let keep = !exited[index];
            index += 1;
            keep
        });
    }
    Ok(true)
}

/// How a reaped process ended, as `waitid` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reaped {
    /// `_exit(code)`.
    Exited(i32),
    /// Killed by a signal.
    Signaled(i32),
}

/// `waitid(P_PIDFD, pidfd, flags)`, retried on `EINTR`: the filled siginfo (`si_pid` 0 when
/// `WNOHANG` found the child still running).
fn waitid_on(pidfd: &OwnedFd, flags: c_int) -> io::Result<libc::siginfo_t> {
    let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
    loop {
        // SAFETY: `info` is a writable siginfo_t; the pidfd is open.
        let ret = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                pidfd.as_raw_fd() as libc::id_t,
                info.as_mut_ptr(),
                flags,
            )
        };
        if ret == 0 {
            // SAFETY: waitid succeeded and filled (or left zeroed) the struct.
            return Ok(unsafe { info.assume_init() });
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// `waitid(P_PIDFD, pidfd, WEXITED [| WNOHANG])`: reap the child; `None` when it is still
/// running and `block` is false.
pub(crate) fn waitid_pidfd(pidfd: &OwnedFd, block: bool) -> io::Result<Option<Reaped>> {
    let info = waitid_on(pidfd, libc::WEXITED | if block { 0 } else { libc::WNOHANG })?;
    // SAFETY: si_pid/si_status are valid fields for SIGCHLD information.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => Reaped::Exited(status),
        _ => Reaped::Signaled(status),
    }))
}

/// Whether the process behind `pidfd` has exited, without reaping it (`WNOWAIT`): it stays a
/// zombie, so its pid (and process group id) is not reused. `block` waits for the exit.
pub(crate) fn pidfd_exited(pidfd: &OwnedFd, block: bool) -> io::Result<bool> {
    let flags = libc::WEXITED | libc::WNOWAIT | if block { 0 } else { libc::WNOHANG };
    let info = waitid_on(pidfd, flags)?;
    // SAFETY: si_pid is a valid field for SIGCHLD information.
    Ok(unsafe { info.si_pid() } != 0)
}

// ---------------------------------------------------------------------------------------
// Child-side wrappers: async-signal-safe, no allocation, errors as raw errno.

/// `openat2(dirfd, path, flags | O_CLOEXEC, RESOLVE_NO_SYMLINKS)` returning a raw fd.
pub(crate) fn openat2_raw(dirfd: RawFd, path: &CStr, flags: c_int) -> Result<RawFd, Errno> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_NO_SYMLINKS,
    };
    // SAFETY: `how` is a live open_how of the size passed; `path` is NUL-terminated.
    check(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    })
    .map(|fd| fd as RawFd)
}

/// `(st_dev, st_ino)` of a raw fd.
pub(crate) fn fstat_raw(fd: RawFd) -> Result<(u64, u64), Errno> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `stat` is a writable struct stat.
    check(unsafe { libc::fstat(fd, stat.as_mut_ptr()) } as c_long)?;
    // SAFETY: fstat succeeded and filled the struct.
    let stat = unsafe { stat.assume_init() };
    Ok((stat.st_dev, stat.st_ino))
}

/// `close(fd)`, ignoring errors (the fd is gone either way on Linux).
pub(crate) fn close_raw(fd: RawFd) {
    // SAFETY: closing a descriptor this code owns has no memory effects.
    unsafe {
        libc::close(fd);
    }
}

/// `close_range(first, last, flags)`.
pub(crate) fn close_range(first: u32, last: u32, flags: u32) -> Result<(), Errno> {
    // SAFETY: close_range has no memory effects.
    check(unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) }).map(|_| ())
}

/// Make every mount below `/` private, so nothing propagates to or from the host.
pub(crate) fn make_mounts_private() -> Result<(), Errno> {
    // SAFETY: the path literal is NUL-terminated; NULL source/type/data are allowed for a
    // propagation change.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    } as c_long)
    .map(|_| ())
}

/// Mount a fresh procfs on `/proc`.
pub(crate) fn mount_proc() -> Result<(), Errno> {
    // SAFETY: every string is a NUL-terminated literal.
    check(unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    } as c_long)
    .map(|_| ())
}

/// Whether a new bind mount is read-only, writable, or keeps the source's flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindMode {
    /// Read-only, set on the detached copy before it is attached (never briefly writable).
    ReadOnly,
    /// Writable (the top mount only; submounts keep their flags).
    ReadWrite,
    /// Every mount keeps the flags it has (a copy of a tree into the new root).
    AsIs,
}

/// Bind-mount the tree `source` refers to onto the inode `target` refers to.
pub(crate) fn bind_fd_onto_fd(source: RawFd, target: RawFd, mode: BindMode) -> Result<(), Errno> {
    let clone_flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE;
    // SAFETY: the empty path literal is NUL-terminated; `source` is an open fd.
    let tree =
        check(unsafe { libc::syscall(libc::SYS_open_tree, source, c"".as_ptr(), clone_flags) })?
            as RawFd;
    let result = attach_tree(tree, target, mode);
    close_raw(tree);
    result
}

/// A change of mount attributes for [`set_mount_attr`].
struct AttrChange {
    set: u64,
    clear: u64,
    recursive: bool,
}

fn set_mount_attr(fd: RawFd, change: AttrChange) -> Result<(), Errno> {
    let AttrChange {
        set,
        clear,
        recursive,
    } = change;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = libc::AT_EMPTY_PATH as u32 | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: `attr` is a live mount_attr of the size passed; `fd` is open.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(|_| ())
}

fn attach_tree(tree: RawFd, target: RawFd, mode: BindMode) -> Result<(), Errno> {
    match mode {
        BindMode::ReadOnly => set_mount_attr(
            tree,
            AttrChange {
                set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                clear: 0,
                recursive: true,
            },
        )?,
        BindMode::ReadWrite => set_mount_attr(
            tree,
            AttrChange {
                set: 0,
                clear: MOUNT_ATTR_RDONLY,
                recursive: false,
            },
        )?,
        BindMode::AsIs => {}
    }
    // SAFETY: both fds are open; the empty path literals are NUL-terminated.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            target,
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
    .map(|_| ())
}

/// Make the mount at `path` read-only (that mount only).
pub(crate) fn make_mount_read_only(path: &CStr) -> Result<(), Errno> {
    let fd = openat2_raw(libc::AT_FDCWD, path, libc::O_PATH)?;
    let result = set_mount_attr(
        fd,
        AttrChange {
            set: MOUNT_ATTR_RDONLY,
            clear: 0,
            recursive: false,
        },
    );
    close_raw(fd);
    result
}

/// Make every mount of this namespace read-only (writable roots are re-bound writable
/// afterwards): Landlock does not cover chmod, chown, utimes or xattrs, so a
/// capability-less root could otherwise change the metadata of any file it owns.
pub(crate) fn make_all_mounts_read_only() -> Result<(), Errno> {
    let root = openat2_raw(libc::AT_FDCWD, c"/", libc::O_PATH)?;
    let result = set_mount_attr(
        root,
        AttrChange {
            set: MOUNT_ATTR_RDONLY,
            clear: 0,
            recursive: true,
        },
    );
    close_raw(root);
    result
}

/// Write all of `data` to `fd`.
pub(crate) fn write_all_raw(fd: RawFd, mut data: &[u8]) -> Result<(), Errno> {
    while !data.is_empty() {
        // SAFETY: `data` is readable for `data.len()` bytes.
        let ret = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if ret < 0 {
            let error = errno();
            if error == libc::EINTR {
                continue;
            }
            return Err(error);
        }
        data = data.get(ret as usize..).unwrap_or(&[]);
    }
    Ok(())
}

/// Write `data` to a file of the process's own `/proc/self` (a symlink by design, so it is
/// opened with a plain `open`).
pub(crate) fn write_proc_self_file(path: &CStr, data: &[u8]) -> Result<(), Errno> {
    // SAFETY: `path` is NUL-terminated; the flags create no file.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    let result = write_all_raw(fd, data);
    close_raw(fd);
    result
}

/// Write `data` to the file at `path` (opened without following symlinks).
pub(crate) fn write_file_raw(path: &CStr, data: &[u8]) -> Result<(), Errno> {
    let fd = openat2_raw(libc::AT_FDCWD, path, libc::O_WRONLY)?;
    let result = write_all_raw(fd, data);
    close_raw(fd);
    result
}

/// Reset every catchable signal to its default disposition and unblock all signals.
pub(crate) fn reset_signals() -> Result<(), Errno> {
    // 1..=64: every signal number on Linux (SIGRTMAX is 64).
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: SIG_DFL is always a valid disposition; `signal` names a real signal, and
        // the few the kernel refuses (reserved by glibc) just return EINVAL.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
        }
    }
    let mut empty = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: `empty` is a writable sigset_t initialised by sigemptyset.
    check(unsafe {
        libc::sigemptyset(empty.as_mut_ptr());
        libc::sigprocmask(libc::SIG_SETMASK, empty.as_ptr(), std::ptr::null_mut())
    } as c_long)
    .map(|_| ())
}

/// Ignore `signal`.
pub(crate) fn ignore_signal(signal: c_int) {
    // SAFETY: SIG_IGN is always a valid disposition.
    unsafe {
        libc::signal(signal, libc::SIG_IGN);
    }
}

/// Install `handler` (an `SA_SIGINFO` handler) for `signal`, with all signals blocked while
/// it runs and `SA_RESTART`.
pub(crate) fn install_handler(
    signal: c_int,
    handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void),
) -> Result<(), Errno> {
    let mut action = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: `action` is a writable, zeroed sigaction; we fill the handler, flags and mask
    // before passing it to sigaction.
    check(unsafe {
        let raw = action.as_mut_ptr();
        (*raw).sa_sigaction = handler as usize;
        (*raw).sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigfillset(&mut (*raw).sa_mask);
        libc::sigaction(signal, raw, std::ptr::null_mut())
    } as c_long)
    .map(|_| ())
}

/// `kill(-1, signal)`: every process this one may signal (in the init of a PID namespace:
/// every other process of the namespace).
pub(crate) fn kill_all(signal: c_int) {
    // SAFETY: kill has no memory effects.
    unsafe {
        libc::kill(-1, signal);
    }
}

/// What `/proc/1/cmdline` shows for the sandbox init.
const INIT_CMDLINE: &[u8] = b"cordon-sandbox-init\0";

/// The address range of this process's argument strings (`arg_start`, `arg_end` of
/// `/proc/self/stat`), read in the parent; the forked init has the same layout.
pub(crate) fn argv_area() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name (which may contain spaces).
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split(' ').collect();
    // Field 48 (arg_start) and 49 (arg_end) of proc(5); `rest` starts at field 3.
    let start: usize = fields.get(48 - 3)?.parse().ok()?;
    let end: usize = fields.get(49 - 3)?.parse().ok()?;
    (start != 0 && end > start).then_some((start, end))
}

/// Make the init's `comm` and `/proc/<pid>/cmdline` name the init instead of repeating the
/// parent's command line (which may carry secrets): overwrite this process's own, private
/// (copy-on-write) copy of the argument strings, as `setproctitle` does.
pub(crate) fn rename_init(argv_area: Option<(usize, usize)>) {
    rename_process(argv_area, c"cordon-init", INIT_CMDLINE);
}

/// Give a forked child of this process its own `comm` (at most 15 bytes) and command line
/// (`title`), as [`rename_init`] does for the init.
pub(crate) fn rename_process(argv_area: Option<(usize, usize)>, comm: &CStr, title: &[u8]) {
    // SAFETY: `comm` is NUL-terminated; PR_SET_NAME copies at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, comm.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
    let Some((start, end)) = argv_area else {
        return;
    };
    let len = end - start;
    // SAFETY: [start, end) is the argument area the kernel records for the parent, on its
    // stack; this process is a fork of it, so the same range is mapped, writable and private
    // here, and nothing in this process reads those strings afterwards.
    let area = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) };
    for (index, byte) in area.iter_mut().enumerate() {
        *byte = title.get(index).copied().unwrap_or(0);
    }
}

/// `prctl(PR_SET_DUMPABLE, 0)`: no ptrace attach and root-owned `/proc/<pid>` entries.
pub(crate) fn set_not_dumpable() -> Result<(), Errno> {
    // SAFETY: prctl with integer arguments has no memory effects.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) } as c_long)
        .map(|_| ())
}

/// A stack for a `vfork`-style child, allocated by the parent before any clone.
pub(crate) struct ChildStack {
    memory: Vec<u128>,
}

impl ChildStack {
    /// 256 KiB: the command's setup uses a few KiB; generous because there is no guard page.
    pub(crate) fn new() -> ChildStack {
        ChildStack {
            memory: vec![0u128; 256 * 1024 / 16],
        }
    }

    /// The 16-byte aligned top of the stack (stacks grow down).
    fn top(&self) -> *mut c_void {
        self.memory.as_ptr_range().end as *mut c_void
    }
}

/// Start `entry(arg)` in a `vfork`-style child (`CLONE_VM | CLONE_VFORK`, as `posix_spawn`
/// does): it shares this process's memory on its own `stack` and the calling thread is
/// suspended until it execs or exits, so no page table is copied. `namespaces` adds
/// `CLONE_NEW*` flags; with `pidfd` the child's pidfd is stored there (`CLONE_PIDFD`).
/// Returns the child's pid.
///
/// # Safety
/// `entry` must only run async-signal-safe code that reads `arg` and ends in `execve` or
/// `_exit`; `arg` must stay valid until then; `stack` must not be used by anyone else while
/// the child runs.
pub(crate) unsafe fn vfork_child(
    stack: &ChildStack,
    entry: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
    pidfd: Option<&mut c_int>,
    namespaces: c_int,
) -> Result<i32, Errno> {
    let mut flags = namespaces | libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    let pidfd_ptr = match pidfd {
        Some(slot) => {
            flags |= libc::CLONE_PIDFD;
            slot as *mut c_int
        }
        None => std::ptr::null_mut(),
    };
    // SAFETY: the caller upholds the contract above; glibc's clone wrapper runs `entry` on
    // `stack` in the child and passes `pidfd_ptr` as the parent-tid slot CLONE_PIDFD uses.
    let pid = unsafe { libc::clone(entry, stack.top(), flags, arg, pidfd_ptr) };
    if pid < 0 { Err(errno()) } else { Ok(pid) }
}

/// `wait4(-1, &status, WNOHANG)`: `Some((pid, raw status))` for a reaped child, `None`
/// when children exist but none has ended.
pub(crate) fn wait_any_nohang() -> Result<Option<(i32, c_int)>, Errno> {
    let mut status: c_int = 0;
    // SAFETY: `status` is writable; NULL rusage is allowed.
    let pid = check(unsafe {
        libc::wait4(
            -1,
            &mut status,
            libc::WNOHANG | libc::__WALL,
            std::ptr::null_mut(),
        )
    } as c_long)?;
    Ok((pid > 0).then_some((pid as i32, status)))
}

/// `wait4(-1, &status, 0)`: block until a child ends; its pid.
pub(crate) fn wait_any_blocking() -> Result<i32, Errno> {
    let mut status: c_int = 0;
    // SAFETY: `status` is writable; NULL rusage is allowed.
    let pid = check(
        unsafe { libc::wait4(-1, &mut status, libc::__WALL, std::ptr::null_mut()) } as c_long,
    )?;
    Ok(pid as i32)
}

/// Block SIGCHLD (it is unblocked atomically inside [`wait_for_hangup_or_signal`]).
pub(crate) fn block_child_signal() -> Result<(), Errno> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: `set` is a writable sigset_t initialised by sigemptyset.
    check(unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut())
    } as c_long)
    .map(|_| ())
}

/// Sleep until `fd` reports input, hang-up or an error (true), or a signal arrives (false).
/// All signals are unblocked while sleeping, so a SIGCHLD that is pending is not lost.
pub(crate) fn wait_for_hangup_or_signal(fd: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    let mut empty = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: `poll` is one writable pollfd; `empty` is initialised by sigemptyset; a NULL
    // timeout waits forever.
    let ret = unsafe {
        libc::sigemptyset(empty.as_mut_ptr());
        libc::ppoll(&mut poll, 1, std::ptr::null(), empty.as_ptr())
    };
    ret > 0 && poll.revents != 0
}

/// `setsid()`.
pub(crate) fn setsid() -> Result<(), Errno> {
    // SAFETY: setsid has no memory effects.
    check(unsafe { libc::setsid() } as c_long).map(|_| ())
}

/// Set soft and hard limit of `resource`.
pub(crate) fn set_rlimit(resource: c_int, soft: u64, hard: u64) -> Result<(), Errno> {
    let limit = libc::rlimit64 {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `limit` is a live rlimit64; pid 0 is the calling process.
    check(unsafe { libc::prlimit64(0, resource as _, &limit, std::ptr::null_mut()) } as c_long)
        .map(|_| ())
}

/// Mount a fresh tmpfs (mode 0755, `nosuid`, `nodev`) on `path` and make it unbindable, so
/// recursive copies of trees that contain it leave it out.
pub(crate) fn mount_unbindable_tmpfs(path: &CStr) -> Result<(), Errno> {
    // SAFETY: every string is NUL-terminated.
    check(unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            path.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"mode=0755".as_ptr().cast(),
        )
    } as c_long)?;
    // SAFETY: `path` is NUL-terminated; NULL source/type/data are allowed for a propagation
    // change.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            libc::MS_UNBINDABLE,
            std::ptr::null(),
        )
    } as c_long)
    .map(|_| ())
}

/// `mkdir(path, mode)`.
pub(crate) fn mkdir_raw(path: &CStr, mode: u32) -> Result<(), Errno> {
    // SAFETY: `path` is NUL-terminated.
    check(unsafe { libc::mkdir(path.as_ptr(), mode as libc::mode_t) } as c_long).map(|_| ())
}

/// `symlink(target, path)`.
pub(crate) fn symlink_raw(target: &CStr, path: &CStr) -> Result<(), Errno> {
    // SAFETY: both strings are NUL-terminated.
    check(unsafe { libc::symlink(target.as_ptr(), path.as_ptr()) } as c_long).map(|_| ())
}

/// Create the empty file `path` (it must not exist), a mount point for a non-directory.
pub(crate) fn create_file_raw(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is NUL-terminated.
    let fd = check(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o444 as libc::c_uint,
        )
    } as c_long)?;
    close_raw(fd as RawFd);
    Ok(())
}

/// Make the mount at `new_root` the root of this mount namespace and detach the old root.
/// The working directory ends up at the new `/`.
pub(crate) fn pivot_root_to(new_root: &CStr) -> Result<(), Errno> {
    chdir(new_root)?;
    // SAFETY: both path literals are NUL-terminated. With both arguments ".", the old root
    // is stacked on top of the new one and detached right after (pivot_root(2), NOTES).
    check(unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) })?;
    // SAFETY: the path literal is NUL-terminated.
    check(unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) } as c_long)?;
    chdir(c"/")
}

/// `chdir(path)`.
pub(crate) fn chdir(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is NUL-terminated.
    check(unsafe { libc::chdir(path.as_ptr()) } as c_long).map(|_| ())
}

/// `dup2(old, new)` (clears close-on-exec on `new`).
pub(crate) fn dup2(old: RawFd, new: RawFd) -> Result<(), Errno> {
    // SAFETY: dup2 has no memory effects.
    check(unsafe { libc::dup2(old, new) } as c_long).map(|_| ())
}

/// Drop every capability: ambient, bounding set (caps `0..=last_cap`), securebits that stop
/// root from regaining them at exec, then effective, permitted and inheritable sets.
pub(crate) fn drop_all_capabilities(last_cap: u32) -> Result<(), Errno> {
    // SAFETY: prctl with integer arguments has no memory effects.
    check(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    } as c_long)?;
    for cap in 0..=last_cap {
        // SAFETY: as above.
        let present = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) };
        // Dropping needs CAP_SETPCAP even for a capability that is not there (a container
        // without capabilities has an empty bounding set): drop only what is there.
        if check(present as c_long)? == 0 {
            continue;
        }
        // SAFETY: as above.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        check(ret as c_long)?;
    }
    let bits = libc::SECBIT_NOROOT
        | libc::SECBIT_NOROOT_LOCKED
        | libc::SECBIT_NO_SETUID_FIXUP
        | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
        | libc::SECBIT_KEEP_CAPS_LOCKED
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    // SAFETY: as above.
    let ret = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits as libc::c_ulong, 0, 0, 0) };
    // Setting them needs CAP_SETPCAP, which a process without capabilities lacks; with the
    // bounding set empty (every capability was checked absent or dropped above) no exec can
    // grant one (root's included), which is what the bits are for here.
    if ret != 0 && errno() != libc::EPERM {
        check(ret as c_long)?;
    }
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and two data structs are live and laid out as capset expects.
    check(unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) })
        .map(|_| ())
}

/// Whether the effective, permitted or inheritable set still holds any capability.
pub(crate) fn has_any_capability() -> Result<bool, Errno> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and two data structs are live and writable.
    check(unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    })?;
    Ok(data
        .iter()
        .any(|set| set.effective != 0 || set.permitted != 0 || set.inheritable != 0))
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)`.
pub(crate) fn set_no_new_privs() -> Result<(), Errno> {
    // SAFETY: prctl with integer arguments has no memory effects.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) } as c_long)
        .map(|_| ())
}

/// `landlock_add_rule` for the inode `fd` refers to, from the child.
pub(crate) fn landlock_add_path_rule_raw(
    ruleset: RawFd,
    fd: RawFd,
    rights: u64,
) -> Result<(), Errno> {
    let attr = LandlockPathBeneathAttr {
        allowed_access: rights,
        parent_fd: fd,
    };
    // SAFETY: `attr` is a live, correctly laid out rule.
    check(unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const LandlockPathBeneathAttr,
            0u32,
        )
    })
    .map(|_| ())
}

/// `landlock_restrict_self(ruleset, 0)`.
pub(crate) fn landlock_restrict_self(ruleset: RawFd) -> Result<(), Errno> {
    // SAFETY: landlock_restrict_self takes an fd and flags only.
    check(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) }).map(|_| ())
}

/// Install a seccomp BPF filter (no_new_privs must already be set).
pub(crate) fn seccomp_set_filter(program: &[SockFilter]) -> Result<(), Errno> {
    let Ok(len) = u16::try_from(program.len()) else {
        return Err(libc::EINVAL);
    };
    let prog = SockFprog {
        len,
        filter: program.as_ptr(),
    };
    // SAFETY: `prog` points to `len` live instructions for the duration of the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0u32,
            &prog as *const SockFprog,
        )
    })
    .map(|_| ())
}

/// A NULL-terminated array of C strings for `execve`, owning its strings.
pub(crate) struct CStringArray {
    _strings: Vec<CString>,
    pointers: Vec<*const c_char>,
}

impl CStringArray {
    /// Build the array; the pointers stay valid as long as `self` lives (moving the Vec of
    /// CStrings does not move their heap buffers).
    pub(crate) fn new(strings: Vec<CString>) -> CStringArray {
        let mut pointers: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        pointers.push(std::ptr::null());
        CStringArray {
            _strings: strings,
            pointers,
        }
    }
}

impl CStringArray {
    /// The NULL-terminated pointer array.
    pub(crate) fn as_ptr(&self) -> *const *const c_char {
        self.pointers.as_ptr()
    }
}

/// `execve(path, argv, envp)` on raw NULL-terminated arrays; returns only on failure.
///
/// # Safety
/// `path` must be NUL-terminated and `argv`/`envp` NULL-terminated arrays of NUL-terminated
/// strings, all valid for the duration of the call.
pub(crate) unsafe fn execve_raw(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> Errno {
    // SAFETY: guaranteed by the caller.
    unsafe {
        libc::execve(path, argv, envp);
    }
    errno()
}

/// Private anonymous memory mapped by the parent before a clone, so the child has its own
/// zero-filled copy to work in without allocating. Unmapped (in the parent) on drop.
pub(crate) struct AnonMemory {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value alone.
unsafe impl Send for AnonMemory {}

impl AnonMemory {
    /// Map `len` bytes (rounded up by the kernel to whole pages).
    pub(crate) fn new(len: usize) -> io::Result<AnonMemory> {
        // SAFETY: an anonymous private mapping at an address the kernel chooses.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(AnonMemory {
            base: base.cast(),
            len,
        })
    }

    /// The start of the mapping.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for AnonMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `new` and nothing in this process uses it any
        // more (children that need it have their own copy).
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// Send `data` on a stream socket, with `fds` attached to its first byte (`SCM_RIGHTS`).
/// Never raises SIGPIPE: a closed peer is `BrokenPipe`.
pub(crate) fn send_with_fds(socket: &OwnedFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut c_void,
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty message header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points to `space` writable, aligned bytes, so the first header
    // exists and its data area holds `fd_bytes` bytes.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), fd_bytes);
    }
    let sent = loop {
        // SAFETY: `msg` describes live buffers for the duration of the call.
        let ret = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if ret >= 0 {
            break ret as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    let mut rest = &data[sent..];
    while !rest.is_empty() {
        // SAFETY: `rest` is readable for its length.
        let ret = unsafe {
            libc::send(
                socket.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if ret < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        rest = &rest[ret as usize..];
    }
    Ok(())
}

/// Child side: receive into `buf` from a stream socket together with up to `fds.len()`
/// descriptors (close-on-exec). Returns `(bytes, descriptors)`; `(0, 0)` at EOF. A message
/// carrying more descriptors than `fds` holds is an error (the extra ones are closed by the
/// kernel as `MSG_CTRUNC`).
pub(crate) fn recv_with_fds_raw(
    socket: RawFd,
    buf: &mut [u8],
    fds: &mut [RawFd; 4],
) -> Result<(usize, usize), Errno> {
    // Room for exactly four descriptors: CMSG_SPACE(16) is 32 bytes on 64-bit Linux.
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    loop {
        // SAFETY: an all-zero msghdr is a valid empty message header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `msg` describes live, writable buffers.
        let ret = unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if ret < 0 {
            let error = errno();
            if error == libc::EINTR {
                continue;
            }
            return Err(error);
        }
        let mut count = 0;
        // SAFETY: the kernel filled msg_control with well-formed headers; CMSG_FIRSTHDR and
        // CMSG_NXTHDR stay inside msg_controllen, and each data area holds cmsg_len bytes.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg);
                    let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                    let mut offset = 0;
                    while offset + 4 <= bytes {
                        let mut raw = [0u8; 4];
                        std::ptr::copy_nonoverlapping(data.add(offset), raw.as_mut_ptr(), 4);
                        let fd = RawFd::from_ne_bytes(raw);
                        if count < fds.len() {
                            fds[count] = fd;
                        } else {
                            close_raw(fd);
                        }
                        count += 1;
                        offset += 4;
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 || count > fds.len() {
            for &fd in fds.iter().take(count.min(fds.len())) {
                close_raw(fd);
            }
            return Err(libc::EPROTO);
        }
        return Ok((ret as usize, count));
    }
}

/// Child side: send one byte with `fd` attached (`SCM_RIGHTS`) on a stream socket.
pub(crate) fn send_one_fd_raw(socket: RawFd, fd: RawFd) -> Result<(), Errno> {
    let byte = [b'L'];
    // Room for one descriptor: CMSG_SPACE(4) is 24 bytes on 64-bit Linux.
    let mut control = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut c_void,
        iov_len: 1,
    };
    // SAFETY: an all-zero msghdr is a valid empty message header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as _;
    // SAFETY: msg_control points to enough writable, aligned bytes for one header holding
    // one descriptor (CMSG_SPACE(4) <= 32).
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
        std::ptr::copy_nonoverlapping(fd.to_ne_bytes().as_ptr(), libc::CMSG_DATA(cmsg), 4);
    }
    loop {
        // SAFETY: `msg` describes live buffers for the duration of the call.
        let ret = unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) };
        if ret >= 0 {
            return Ok(());
        }
        let error = errno();
        if error != libc::EINTR {
            return Err(error);
        }
    }
}

/// Child side: bring the loopback interface of this network namespace up (needs
/// `CAP_NET_ADMIN` over it).
pub(crate) fn loopback_up() -> Result<(), Errno> {
    // SAFETY: socket has no memory effects.
    let fd = check(
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }.into(),
    )? as RawFd;
    // SAFETY: an all-zero ifreq is valid; the name is copied in below.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as c_char;
    }
    let result = (|| {
        // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of the live `request`.
        check(unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request) }.into())?;
        // SAFETY: reading the union field SIOCGIFFLAGS just filled.
        let flags = unsafe { request.ifr_ifru.ifru_flags };
        request.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as i16;
        // SAFETY: SIOCSIFFLAGS reads the live `request`.
        check(unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &request) }.into())?;
        Ok(())
    })();
    close_raw(fd);
    result
}

/// Child side: a TCP socket listening on `127.0.0.1:port` (close-on-exec); its fd.
pub(crate) fn listen_loopback_raw(port: u16) -> Result<RawFd, Errno> {
    // SAFETY: socket has no memory effects.
    let fd = check(
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) }.into(),
    )? as RawFd;
    let address = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let result = (|| {
        let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let pointer = (&address as *const libc::sockaddr_in).cast();
        // SAFETY: `address` is a live sockaddr_in of the size passed.
        let bound = unsafe { libc::bind(fd, pointer, size) };
        check(bound.into())?;
        // SAFETY: listen has no memory effects.
        check(unsafe { libc::listen(fd, 512) }.into())?;
        Ok(())
    })();
    match result {
        Ok(()) => Ok(fd),
        Err(errno) => {
            close_raw(fd);
            Err(errno)
        }
    }
}

/// Child side: read exactly `buf.len()` bytes; EOF before that is `EPIPE`.
pub(crate) fn read_exact_raw(fd: RawFd, buf: &mut [u8]) -> Result<(), Errno> {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: the remaining part of `buf` is writable.
        let ret = unsafe { libc::read(fd, buf[filled..].as_mut_ptr().cast(), buf.len() - filled) };
        if ret < 0 {
            let error = errno();
            if error == libc::EINTR {
                continue;
            }
            return Err(error);
        }
        if ret == 0 {
            return Err(libc::EPIPE);
        }
        filled += ret as usize;
    }
    Ok(())
}

/// `SHM_INFO` of `shmctl(2)` (missing from libc).
const SHM_INFO: c_int = 14;
/// `SHM_STAT_ANY`, `MSG_STAT_ANY`, `SEM_STAT_ANY` (Linux 4.17): like `*_STAT` without the
/// read-permission check, so an init without capabilities finds objects of mode 000 too.
const SHM_STAT_ANY: c_int = 15;
const MSG_STAT_ANY: c_int = 13;
const SEM_STAT_ANY: c_int = 20;

/// Child side: remove every System V shared memory segment, semaphore set and message queue
/// of the calling process's IPC namespace (what commands left behind). Best effort; needs no
/// capability for objects of the caller's own uid, which is what commands create.
pub(crate) fn remove_sysv_ipc() {
    // `struct seminfo` (40 bytes) and `struct semid64_ds` (at most 120 bytes on the 64-bit
    // targets) are what `semctl(SEM_INFO / SEM_STAT_ANY)` writes; libc declares neither on musl,
    // so one aligned buffer larger than both serves for the two commands.
    let mut sem = [0u64; 32];
    // SAFETY: every call gets a writable buffer at least as large as the structure the
    // command writes (shmid_ds > shm_info, msqid_ds > msginfo, 256 bytes > seminfo and
    // semid64_ds); IPC_RMID takes no buffer.
    unsafe {
        let mut shm: libc::shmid_ds = std::mem::zeroed();
        let max = libc::shmctl(0, SHM_INFO, &mut shm);
        for index in 0..=max.max(-1) {
            let id = libc::shmctl(index, SHM_STAT_ANY, &mut shm);
            if id >= 0 {
                libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
            }
        }
        let mut msg: libc::msqid_ds = std::mem::zeroed();
        let max = libc::msgctl(0, libc::MSG_INFO, &mut msg);
        for index in 0..=max.max(-1) {
            let id = libc::msgctl(index, MSG_STAT_ANY, &mut msg);
            if id >= 0 {
                libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut());
            }
        }
        let max = libc::semctl(0, 0, libc::SEM_INFO, sem.as_mut_ptr());
        for index in 0..=max.max(-1) {
            let id = libc::semctl(index, 0, SEM_STAT_ANY, sem.as_mut_ptr());
            if id >= 0 {
                libc::semctl(id, 0, libc::IPC_RMID);
            }
        }
    }
}

/// `_exit(code)`: leave without running destructors or atexit handlers.
pub(crate) fn exit_now(code: c_int) -> ! {
    // SAFETY: _exit is async-signal-safe and never returns.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_state_and_group_whatever_the_command_name() {
        assert_eq!(
            parse_stat_state_and_group("42 (bash) S 1 42 42 0 -1 4194560"),
            Some(('S', 42))
        );
        assert_eq!(
            parse_stat_state_and_group("7 (a) (b) Z 3) Z 1 99 99 0"),
            Some(('Z', 99))
        );
        assert_eq!(parse_stat_state_and_group("7 (truncated"), None);
        assert_eq!(parse_stat_state_and_group("7 (x) R 1"), None);
    }

    #[test]
    fn a_killed_group_is_waited_for_until_every_member_exited() {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::process::CommandExt;
        // A group leader with two members in the background, each holding the FIFO open.
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("gate");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let mut leader = std::process::Command::new("sh")
            .arg("-c")
            .arg("(read x < \"$1\") & (read y < \"$1\") & echo up; wait")
            .arg("sh")
            .arg(&fifo)
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut up = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(leader.stdout.take().unwrap()),
            &mut up,
        )
        .unwrap();
        let pgid = leader.id() as i32;
        // The readers are there (they block in open until a writer comes).
        let members = live_group_members(pgid).unwrap();
        assert!(members.len() >= 3, "{members:?}");
        kill_process_group(pgid, libc::SIGKILL).unwrap();
        assert!(wait_group_exited(pgid, std::time::Duration::from_secs(30)).unwrap());
        // Nothing of the group holds the FIFO: a writer finds no reader.
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
        assert_eq!(
            writer.map(|_| ()).unwrap_err().raw_os_error(),
            Some(libc::ENXIO)
        );
        // The leader is our child: a zombie until reaped, not a live member.
        assert_eq!(live_group_members(pgid).unwrap(), Vec::<i32>::new());
        leader.wait().unwrap();
    }
}
