//! The seccomp filter: a reviewed deny table (one comment per entry) and a small compiler
//! from the table to a classic BPF program, built once in the parent.
//!
//! Why not `seccompiler`: it has one match action per filter (we need EPERM for most rules,
//! ENOSYS for `clone3` and KILL for a foreign architecture), no masked "any bit set" or
//! "masked not equal" tests, and no x32 guard. The program here is simple enough to review
//! and is checked by an interpreter in the unit tests and by the kernel in the integration
//! tests.
//!
//! Shape of the program: check the architecture (kill otherwise), reject x32 syscall numbers
//! on x86_64 (kill), then one self-contained block per rule (load nr, compare, test the
//! argument conditions, return the rule's action), then allow. Syscalls without a rule take
//! the same fixed path, so the kernel's constant-action cache makes them free.

use crate::linux::sys::SockFilter;

// Classic BPF opcodes.
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_ALU_AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const BPF_JMP_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JMP_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_JMP_JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

// struct seccomp_data offsets.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARGS: u32 = 16;

// Return values.
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;

/// `AUDIT_ARCH_X86_64`.
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// `AUDIT_ARCH_AARCH64`.
const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;
/// Syscall numbers with this bit set are x32 ABI calls on x86_64.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// What a matching syscall gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Fail with this errno.
    Errno(i32),
}

impl Action {
    fn ret(self) -> u32 {
        match self {
            Action::Errno(errno) => RET_ERRNO | (errno as u32 & 0xffff),
        }
    }
}

/// A test on one syscall argument. `Lo*` tests look at the low 32 bits only, exactly as the
/// kernel does for `int`/`unsigned int` arguments (socket family and type, clone flags,
/// ioctl request), so high garbage bits cannot dodge them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cond {
    /// `arg & 0xffffffff == value`
    LoEq(u8, u32),
    /// `arg & 0xffffffff != value`
    LoNe(u8, u32),
    /// `arg & mask != value`
    LoMaskedNe(u8, u32, u32),
    /// `arg & mask != 0`
    LoAnyBit(u8, u32),
    /// the full 64-bit argument is not zero (pointers)
    NonZero(u8),
}

/// One deny rule: the syscall, the argument tests (all must hold), the action and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    /// Syscall name, for reports and tests.
    pub name: &'static str,
    /// Syscall number on this architecture.
    pub nr: i64,
    /// Argument tests, ANDed; empty means "always".
    pub conds: &'static [Cond],
    /// Action when the rule matches.
    pub action: Action,
}

const EPERM: Action = Action::Errno(libc::EPERM);

/// Namespace flags of `clone(2)` (the low byte is the exit signal, so `CLONE_NEWTIME`
/// cannot be passed there; `unshare` and `clone3` are denied outright).
const CLONE_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

/// Socket type bits (without SOCK_NONBLOCK / SOCK_CLOEXEC).
const SOCK_TYPE_MASK: u32 = 0xf;

macro_rules! rule {
    ($name:ident, $conds:expr, $action:expr) => {
        Rule {
            name: stringify!($name),
            nr: paste_nr!($name),
            conds: $conds,
            action: $action,
        }
    };
}

macro_rules! paste_nr {
    (ptrace) => {
        libc::SYS_ptrace
    };
    (process_vm_readv) => {
        libc::SYS_process_vm_readv
    };
    (process_vm_writev) => {
        libc::SYS_process_vm_writev
    };
    (process_madvise) => {
        libc::SYS_process_madvise
    };
    (pidfd_getfd) => {
        libc::SYS_pidfd_getfd
    };
    (add_key) => {
        libc::SYS_add_key
    };
    (request_key) => {
        libc::SYS_request_key
    };
    (keyctl) => {
        libc::SYS_keyctl
    };
    (mount) => {
        libc::SYS_mount
    };
    (umount2) => {
        libc::SYS_umount2
    };
    (pivot_root) => {
        libc::SYS_pivot_root
    };
    (chroot) => {
        libc::SYS_chroot
    };
    (fsopen) => {
        libc::SYS_fsopen
    };
    (fsconfig) => {
        libc::SYS_fsconfig
    };
    (fsmount) => {
        libc::SYS_fsmount
    };
    (fspick) => {
        libc::SYS_fspick
    };
    (move_mount) => {
        libc::SYS_move_mount
    };
    (open_tree) => {
        libc::SYS_open_tree
    };
    (mount_setattr) => {
        libc::SYS_mount_setattr
    };
    (unshare) => {
        libc::SYS_unshare
    };
    (setns) => {
        libc::SYS_setns
    };
    (clone) => {
        libc::SYS_clone
    };
    (clone3) => {
        libc::SYS_clone3
    };
    (kexec_load) => {
        libc::SYS_kexec_load
    };
    (kexec_file_load) => {
        libc::SYS_kexec_file_load
    };
    (reboot) => {
        libc::SYS_reboot
    };
    (bpf) => {
        libc::SYS_bpf
    };
    (perf_event_open) => {
        libc::SYS_perf_event_open
    };
    (userfaultfd) => {
        libc::SYS_userfaultfd
    };
    (init_module) => {
        libc::SYS_init_module
    };
    (finit_module) => {
        libc::SYS_finit_module
    };
    (delete_module) => {
        libc::SYS_delete_module
    };
    (open_by_handle_at) => {
        libc::SYS_open_by_handle_at
    };
    (name_to_handle_at) => {
        libc::SYS_name_to_handle_at
    };
    (io_uring_setup) => {
        libc::SYS_io_uring_setup
    };
    (io_uring_enter) => {
        libc::SYS_io_uring_enter
    };
    (io_uring_register) => {
        libc::SYS_io_uring_register
    };
    (ioctl) => {
        libc::SYS_ioctl
    };
    (socket) => {
        libc::SYS_socket
    };
    (socketpair) => {
        libc::SYS_socketpair
    };
    (connect) => {
        libc::SYS_connect
    };
    (bind) => {
        libc::SYS_bind
    };
    (listen) => {
        libc::SYS_listen
    };
    (accept) => {
        libc::SYS_accept
    };
    (accept4) => {
        libc::SYS_accept4
    };
    (sendto) => {
        libc::SYS_sendto
    };
}

/// Rules applied whatever the network setting.
pub(crate) const COMMON_RULES: &[Rule] = &[
    // Reading or writing another process's memory and registers.
    rule!(ptrace, &[], EPERM),
    rule!(process_vm_readv, &[], EPERM),
    rule!(process_vm_writev, &[], EPERM),
    // Advising on another process's memory (needs ptrace-like access).
    rule!(process_madvise, &[], EPERM),
    // Stealing another process's file descriptors.
    rule!(pidfd_getfd, &[], EPERM),
    // The kernel keyring holds the host user's credentials and tokens.
    rule!(add_key, &[], EPERM),
    rule!(request_key, &[], EPERM),
    rule!(keyctl, &[], EPERM),
    // Changing the filesystem topology would undo protected and denied paths.
    rule!(mount, &[], EPERM),
    rule!(umount2, &[], EPERM),
    rule!(pivot_root, &[], EPERM),
    rule!(chroot, &[], EPERM),
    rule!(fsopen, &[], EPERM),
    rule!(fsconfig, &[], EPERM),
    rule!(fsmount, &[], EPERM),
    rule!(fspick, &[], EPERM),
    rule!(move_mount, &[], EPERM),
    rule!(open_tree, &[], EPERM),
    rule!(mount_setattr, &[], EPERM),
    // New namespaces (a user namespace grants capabilities) and joining the host's.
    rule!(unshare, &[], EPERM),
    rule!(setns, &[], EPERM),
    rule!(clone, &[Cond::LoAnyBit(0, CLONE_NAMESPACE_FLAGS)], EPERM),
    // clone3 passes its flags in memory, out of reach of the filter: ENOSYS makes libc fall
    // back to clone, whose flags are checked above.
    rule!(clone3, &[], Action::Errno(libc::ENOSYS)),
    // Replacing the running kernel or rebooting.
    rule!(kexec_load, &[], EPERM),
    rule!(kexec_file_load, &[], EPERM),
    rule!(reboot, &[], EPERM),
    // Kernel attack surface with no place in a build sandbox.
    rule!(bpf, &[], EPERM),
    rule!(perf_event_open, &[], EPERM),
    rule!(userfaultfd, &[], EPERM),
    // Loading kernel modules.
    rule!(init_module, &[], EPERM),
    rule!(finit_module, &[], EPERM),
    rule!(delete_module, &[], EPERM),
    // File handles bypass path-based checks (Landlock, mounts).
    rule!(open_by_handle_at, &[], EPERM),
    rule!(name_to_handle_at, &[], EPERM),
    // io_uring opens files and sockets without the syscalls this filter sees.
    rule!(io_uring_setup, &[], EPERM),
    rule!(io_uring_enter, &[], EPERM),
    rule!(io_uring_register, &[], EPERM),
    // Pushing keystrokes into a terminal the command inherited.
    rule!(ioctl, &[Cond::LoEq(1, libc::TIOCSTI as u32)], EPERM),
    // vsock reaches the hypervisor and host VM services.
    rule!(socket, &[Cond::LoEq(0, libc::AF_VSOCK as u32)], EPERM),
];

/// Rules added when the network is off: only Unix stream/seqpacket sockets may exist, and
/// they cannot be connected, bound or listened on (so no host Unix socket is reachable);
/// socketpair-style IPC inside the sandbox keeps working.
pub(crate) const NETWORK_OFF_RULES: &[Rule] = &[
    // IP, netlink, packet and every other family.
    rule!(socket, &[Cond::LoNe(0, libc::AF_UNIX as u32)], EPERM),
    // Datagram Unix sockets can send to any socket path with sendto/sendmsg.
    rule!(
        socket,
        &[
            Cond::LoMaskedNe(1, SOCK_TYPE_MASK, libc::SOCK_STREAM as u32),
            Cond::LoMaskedNe(1, SOCK_TYPE_MASK, libc::SOCK_SEQPACKET as u32),
        ],
        EPERM
    ),
    // Same for socket pairs.
    rule!(socketpair, &[Cond::LoNe(0, libc::AF_UNIX as u32)], EPERM),
    rule!(
        socketpair,
        &[
            Cond::LoMaskedNe(1, SOCK_TYPE_MASK, libc::SOCK_STREAM as u32),
            Cond::LoMaskedNe(1, SOCK_TYPE_MASK, libc::SOCK_SEQPACKET as u32),
        ],
        EPERM
    ),
    // Reaching any socket path or address, e.g. /var/run/docker.sock.
    rule!(connect, &[], EPERM),
    // Serving anything.
    rule!(bind, &[], EPERM),
    rule!(listen, &[], EPERM),
    rule!(accept, &[], EPERM),
    rule!(accept4, &[], EPERM),
    // sendto with a destination address (libc's send() passes NULL and stays allowed).
    rule!(sendto, &[Cond::NonZero(4)], EPERM),
];

/// The rules for a sandbox with the given network setting, in program order.
pub(crate) fn rules(network: bool) -> Vec<Rule> {
    let mut rules = COMMON_RULES.to_vec();
    if !network {
        rules.extend_from_slice(NETWORK_OFF_RULES);
    }
    rules
}

/// The audit architecture of the build target.
pub(crate) fn native_arch() -> u32 {
    if cfg!(target_arch = "x86_64") {
        AUDIT_ARCH_X86_64
    } else {
        AUDIT_ARCH_AARCH64
    }
}

fn stmt(code: u16, k: u32) -> SockFilter {
    SockFilter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> SockFilter {
    SockFilter { code, jt, jf, k }
}

fn arg_lo(index: u8) -> u32 {
    DATA_ARGS + 8 * u32::from(index)
}

fn arg_hi(index: u8) -> u32 {
    arg_lo(index) + 4
}

/// A jump target inside one rule block: the next instruction, or the block's end (rule does
/// not match).
#[derive(Clone, Copy)]
enum Target {
    Next,
    Skip,
}

/// Compile one rule into a self-contained block; the caller appends it.
fn compile_rule(rule: &Rule) -> Result<Vec<SockFilter>, &'static str> {
    // (instruction, jt target, jf target) with symbolic targets patched below.
    let mut block: Vec<(SockFilter, Target, Target)> = Vec::new();
    let nr = u32::try_from(rule.nr).map_err(|_| "syscall number out of range")?;
    block.push((stmt(BPF_LD_W_ABS, DATA_NR), Target::Next, Target::Next));
    block.push((jump(BPF_JMP_JEQ_K, nr, 0, 0), Target::Next, Target::Skip));
    for cond in rule.conds {
        match *cond {
            Cond::LoEq(index, value) => {
                block.push((
                    stmt(BPF_LD_W_ABS, arg_lo(index)),
                    Target::Next,
                    Target::Next,
                ));
                block.push((jump(BPF_JMP_JEQ_K, value, 0, 0), Target::Next, Target::Skip));
            }
            Cond::LoNe(index, value) => {
                block.push((
                    stmt(BPF_LD_W_ABS, arg_lo(index)),
                    Target::Next,
                    Target::Next,
                ));
                block.push((jump(BPF_JMP_JEQ_K, value, 0, 0), Target::Skip, Target::Next));
            }
            Cond::LoMaskedNe(index, mask, value) => {
                block.push((
                    stmt(BPF_LD_W_ABS, arg_lo(index)),
                    Target::Next,
                    Target::Next,
                ));
                block.push((stmt(BPF_ALU_AND_K, mask), Target::Next, Target::Next));
                block.push((jump(BPF_JMP_JEQ_K, value, 0, 0), Target::Skip, Target::Next));
            }
            Cond::LoAnyBit(index, mask) => {
                block.push((
                    stmt(BPF_LD_W_ABS, arg_lo(index)),
                    Target::Next,
                    Target::Next,
                ));
                block.push((jump(BPF_JMP_JSET_K, mask, 0, 0), Target::Next, Target::Skip));
            }
            Cond::NonZero(index) => {
                // low word != 0 → condition holds: jump over the high-word test.
                block.push((
                    stmt(BPF_LD_W_ABS, arg_lo(index)),
                    Target::Next,
                    Target::Next,
                ));
                block.push((jump(BPF_JMP_JEQ_K, 0, 0, 2), Target::Next, Target::Next));
                block.push((
                    stmt(BPF_LD_W_ABS, arg_hi(index)),
                    Target::Next,
                    Target::Next,
                ));
                block.push((jump(BPF_JMP_JEQ_K, 0, 0, 0), Target::Skip, Target::Next));
            }
        }
    }
    block.push((
        stmt(BPF_RET_K, rule.action.ret()),
        Target::Next,
        Target::Next,
    ));
    let end = block.len();
    let mut out = Vec::with_capacity(end);
    for (index, (mut insn, jt, jf)) in block.into_iter().enumerate() {
        if insn.code == BPF_JMP_JEQ_K || insn.code == BPF_JMP_JSET_K {
            let skip = u8::try_from(end - index - 1).map_err(|_| "rule too long for a jump")?;
            // A literal offset already set (NonZero's "jump over") is kept.
            if insn.jt == 0 {
                insn.jt = match jt {
                    Target::Next => 0,
                    Target::Skip => skip,
                };
            }
            if insn.jf == 0 {
                insn.jf = match jf {
                    Target::Next => 0,
                    Target::Skip => skip,
                };
            }
        }
        out.push(insn);
    }
    Ok(out)
}

/// Compile `rules` for `arch` into a complete program.
pub(crate) fn compile(rules: &[Rule], arch: u32) -> Result<Vec<SockFilter>, &'static str> {
    let mut program = vec![
        stmt(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JMP_JEQ_K, arch, 1, 0),
        // A foreign architecture (e.g. int 0x80 i386 calls on x86_64) is killed.
        stmt(BPF_RET_K, RET_KILL_PROCESS),
    ];
    if arch == AUDIT_ARCH_X86_64 {
        program.push(stmt(BPF_LD_W_ABS, DATA_NR));
        program.push(jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1));
        // x32 numbers would dodge every rule below; nothing here uses the x32 ABI.
        program.push(stmt(BPF_RET_K, RET_KILL_PROCESS));
    }
    for rule in rules {
        program.extend(compile_rule(rule)?);
    }
    program.push(stmt(BPF_RET_K, RET_ALLOW));
    if program.len() > 4096 {
        return Err("program longer than the kernel's 4096 instructions");
    }
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `struct seccomp_data` as the interpreter sees it.
    struct Data {
        nr: u32,
        arch: u32,
        args: [u64; 6],
    }

    impl Data {
        fn word(&self, offset: u32) -> u32 {
            match offset {
                DATA_NR => self.nr,
                DATA_ARCH => self.arch,
                offset if (DATA_ARGS..DATA_ARGS + 48).contains(&offset) => {
                    let arg = self.args[((offset - DATA_ARGS) / 8) as usize];
                    if (offset - DATA_ARGS).is_multiple_of(8) {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
                other => panic!("unexpected load offset {other}"),
            }
        }
    }

    /// A classic BPF interpreter for the opcodes the compiler emits.
    fn run(program: &[SockFilter], data: &Data) -> u32 {
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let insn = program[pc];
            pc += 1;
            match insn.code {
                BPF_LD_W_ABS => acc = data.word(insn.k),
                BPF_ALU_AND_K => acc &= insn.k,
                BPF_JMP_JEQ_K | BPF_JMP_JGE_K | BPF_JMP_JSET_K => {
                    let taken = match insn.code {
                        BPF_JMP_JEQ_K => acc == insn.k,
                        BPF_JMP_JGE_K => acc >= insn.k,
                        _ => acc & insn.k != 0,
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                BPF_RET_K => return insn.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    fn eval(network: bool, nr: i64, args: [u64; 6]) -> u32 {
        let program = compile(&rules(network), native_arch()).unwrap();
        run(
            &program,
            &Data {
                nr: nr as u32,
                arch: native_arch(),
                args,
            },
        )
    }

    fn cond_holds(cond: &Cond, args: &[u64; 6]) -> bool {
        match *cond {
            Cond::LoEq(i, v) => args[i as usize] as u32 == v,
            Cond::LoNe(i, v) => args[i as usize] as u32 != v,
            Cond::LoMaskedNe(i, m, v) => args[i as usize] as u32 & m != v,
            Cond::LoAnyBit(i, m) => args[i as usize] as u32 & m != 0,
            Cond::NonZero(i) => args[i as usize] != 0,
        }
    }

    const CANDIDATES: [u64; 12] = [
        0,
        1,
        2,
        3,
        5,
        40,
        0x5412,
        0x2_0000,
        0x1000_0000,
        0x1_0000_0000,
        0x7fff_0000_0000,
        u64::MAX,
    ];

    /// Arguments satisfying every condition of `rule` (searched among small candidates),
    /// or violating at least one when `satisfy` is false.
    fn args_for(rule: &Rule, satisfy: bool) -> Option<[u64; 6]> {
        let mut args = [0u64; 6];
        let indices: Vec<u8> = rule
            .conds
            .iter()
            .map(|cond| match *cond {
                Cond::LoEq(i, _)
                | Cond::LoNe(i, _)
                | Cond::LoMaskedNe(i, _, _)
                | Cond::LoAnyBit(i, _)
                | Cond::NonZero(i) => i,
            })
            .collect();
        let mut unique = indices.clone();
        unique.sort();
        unique.dedup();
        // Try every combination of candidates for the (at most two) argument slots used.
        let slots = unique.len();
        let total = CANDIDATES.len().pow(slots as u32);
        for combo in 0..total {
            let mut rest = combo;
            for &slot in &unique {
                args[slot as usize] = CANDIDATES[rest % CANDIDATES.len()];
                rest /= CANDIDATES.len();
            }
            let all = rule.conds.iter().all(|cond| cond_holds(cond, &args));
            if all == satisfy {
                return Some(args);
            }
        }
        None
    }

    /// First action the full rule list gives these arguments (what the program must do).
    fn expected(network: bool, nr: i64, args: &[u64; 6]) -> u32 {
        rules(network)
            .iter()
            .find(|rule| rule.nr == nr && rule.conds.iter().all(|cond| cond_holds(cond, args)))
            .map_or(RET_ALLOW, |rule| rule.action.ret())
    }

    #[test]
    fn every_rule_matches_its_own_arguments() {
        for network in [false, true] {
            for rule in rules(network) {
                let args = args_for(&rule, true)
                    .unwrap_or_else(|| panic!("no arguments satisfy rule {}", rule.name));
                assert_eq!(
                    eval(network, rule.nr, args),
                    rule.action.ret(),
                    "rule {} with {args:x?}",
                    rule.name
                );
            }
        }
    }

    #[test]
    fn every_conditional_rule_lets_other_arguments_through() {
        for network in [false, true] {
            for rule in rules(network).iter().filter(|rule| !rule.conds.is_empty()) {
                let args = args_for(rule, false).expect("some arguments violate the rule");
                assert_eq!(
                    eval(network, rule.nr, args),
                    expected(network, rule.nr, &args),
                    "rule {} with {args:x?}",
                    rule.name
                );
            }
        }
    }

    #[test]
    fn unlisted_syscalls_are_allowed() {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
        ] {
            assert_eq!(eval(false, nr, [0; 6]), RET_ALLOW);
        }
    }

    #[test]
    fn foreign_architecture_is_killed() {
        let program = compile(&rules(true), native_arch()).unwrap();
        let data = Data {
            nr: libc::SYS_read as u32,
            arch: 0x4000_0003, // AUDIT_ARCH_I386
            args: [0; 6],
        };
        assert_eq!(run(&program, &data), RET_KILL_PROCESS);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn x32_syscall_numbers_are_killed() {
        assert_eq!(
            eval(true, (X32_SYSCALL_BIT as i64) | libc::SYS_read, [0; 6]),
            RET_KILL_PROCESS
        );
    }

    #[test]
    fn clone3_gets_enosys_and_clone_namespace_flags_eperm() {
        assert_eq!(
            eval(true, libc::SYS_clone3, [0; 6]),
            RET_ERRNO | libc::ENOSYS as u32
        );
        let fork_flags = libc::SIGCHLD as u64;
        assert_eq!(
            eval(true, libc::SYS_clone, [fork_flags, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        let thread_flags = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(
            eval(true, libc::SYS_clone, [thread_flags, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWPID,
        ] {
            let flags = fork_flags | flag as u64;
            assert_eq!(
                eval(true, libc::SYS_clone, [flags, 0, 0, 0, 0, 0]),
                RET_ERRNO | 1
            );
        }
    }

    #[test]
    fn network_off_allows_only_unix_stream_sockets() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        let unix = libc::AF_UNIX as u64;
        let stream = (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64;
        let seqpacket = libc::SOCK_SEQPACKET as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        assert_eq!(
            eval(false, libc::SYS_socket, [unix, stream, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            eval(false, libc::SYS_socket, [unix, seqpacket, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            eval(false, libc::SYS_socket, [unix, dgram, 0, 0, 0, 0]),
            eperm
        );
        for family in [
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
            libc::AF_PACKET,
        ] {
            let args = [family as u64, stream, 0, 0, 0, 0];
            assert_eq!(
                eval(false, libc::SYS_socket, args),
                eperm,
                "family {family}"
            );
        }
        // High garbage bits do not turn AF_INET into something else.
        let sneaky = (1u64 << 32) | libc::AF_INET as u64;
        assert_eq!(
            eval(false, libc::SYS_socket, [sneaky, stream, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            eval(false, libc::SYS_socketpair, [unix, stream, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            eval(false, libc::SYS_socketpair, [unix, dgram, 0, 0, 0, 0]),
            eperm
        );
        for nr in [
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_accept4,
        ] {
            assert_eq!(eval(false, nr, [3, 0, 0, 0, 0, 0]), eperm);
        }
        assert_eq!(eval(false, libc::SYS_sendto, [3, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            eval(false, libc::SYS_sendto, [3, 0, 0, 0, 0x1000, 16]),
            eperm
        );
        assert_eq!(
            eval(false, libc::SYS_sendto, [3, 0, 0, 0, 1 << 40, 16]),
            eperm
        );
    }

    #[test]
    fn network_on_allows_ip_but_not_vsock_or_io_uring() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        let stream = libc::SOCK_STREAM as u64;
        assert_eq!(
            eval(
                true,
                libc::SYS_socket,
                [libc::AF_INET as u64, stream, 0, 0, 0, 0]
            ),
            RET_ALLOW
        );
        assert_eq!(eval(true, libc::SYS_connect, [3, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            eval(
                true,
                libc::SYS_socket,
                [libc::AF_VSOCK as u64, stream, 0, 0, 0, 0]
            ),
            eperm
        );
        assert_eq!(
            eval(true, libc::SYS_io_uring_setup, [8, 0, 0, 0, 0, 0]),
            eperm
        );
    }

    #[test]
    fn tiocsti_is_denied_but_other_ioctls_pass() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        assert_eq!(
            eval(true, libc::SYS_ioctl, [0, libc::TIOCSTI, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            eval(true, libc::SYS_ioctl, [0, libc::TCGETS, 0, 0, 0, 0]),
            RET_ALLOW
        );
    }

    #[test]
    fn the_brief_s_syscalls_are_all_covered() {
        let names: Vec<&str> = rules(false).iter().map(|rule| rule.name).collect();
        for required in [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "keyctl",
            "add_key",
            "request_key",
            "mount",
            "unshare",
            "setns",
            "kexec_load",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "init_module",
            "finit_module",
            "open_by_handle_at",
            "clone3",
            "io_uring_setup",
            "connect",
            "bind",
        ] {
            assert!(
                names.contains(&required),
                "{required} missing from the table"
            );
        }
    }
}
