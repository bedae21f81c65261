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
//! on x86_64 (kill), then a binary search over the syscall numbers that have rules, each
//! leaf jumping (through a `ja` trampoline, as conditional jumps only reach 255 instructions)
//! to that syscall's block: its rules in table order (argument tests, then the rule's action),
//! then allow. Syscalls without a rule reach "allow" after about log2(n) comparisons and
//! never look at their arguments, so the kernel's constant-action cache makes them free, and
//! building that cache at attach time (it emulates the filter for every syscall number) stays
//! cheap.

use crate::config::NetworkAccess;
use crate::linux::sys::SockFilter;

// Classic BPF opcodes.
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_ALU_AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const BPF_JMP_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JMP_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_JMP_JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
const BPF_JMP_JA: u16 = 0x05; // BPF_JMP | BPF_JA

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
    (setsid) => {
        libc::SYS_setsid
    };
    (setpgid) => {
        libc::SYS_setpgid
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

/// Rules added when the network is filtered: the private network namespace holds only
/// loopback, so IP sockets may exist (they reach the egress listener and nothing else), but
/// no other family does.
pub(crate) const NETWORK_FILTERED_RULES: &[Rule] = &[
    // Netlink (routing and interface tables), packet sockets and every other family: nothing
    // a command needs to reach the egress proxy over loopback.
    rule!(
        socket,
        &[
            Cond::LoNe(0, libc::AF_UNIX as u32),
            Cond::LoNe(0, libc::AF_INET as u32),
            Cond::LoNe(0, libc::AF_INET6 as u32),
        ],
        EPERM
    ),
];

/// Rules added when the command's process group is its whole tree (no PID namespace, in a
/// container): leaving the group would take a process out of reach of the group kill that
/// ends a command at its timeout, on cancel and after it exits.
pub(crate) const KEEP_GROUP_RULES: &[Rule] = &[
    // A new session is a new process group.
    rule!(setsid, &[], EPERM),
    // Moving to another (or a new) process group.
    rule!(setpgid, &[], EPERM),
];

/// The rules for a sandbox with the given network setting, in program order; `keep_group`
/// adds [`KEEP_GROUP_RULES`].
pub(crate) fn rules(network: NetworkAccess, keep_group: bool) -> Vec<Rule> {
    let mut rules = COMMON_RULES.to_vec();
    match network {
        NetworkAccess::Off => rules.extend_from_slice(NETWORK_OFF_RULES),
        NetworkAccess::On => {}
        NetworkAccess::Filtered => rules.extend_from_slice(NETWORK_FILTERED_RULES),
    }
    if keep_group {
        rules.extend_from_slice(KEEP_GROUP_RULES);
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

/// Compile the argument tests and action of one rule; when a test fails the code falls
/// through to the end of the returned block (the next rule of the same syscall).
fn compile_rule(rule: &Rule) -> Result<Vec<SockFilter>, &'static str> {
    // (instruction, whether its jt / jf is "skip to the end of this rule").
    let mut block: Vec<(SockFilter, bool, bool)> = Vec::new();
    for cond in rule.conds {
        match *cond {
            Cond::LoEq(index, value) => {
                block.push((stmt(BPF_LD_W_ABS, arg_lo(index)), false, false));
                block.push((jump(BPF_JMP_JEQ_K, value, 0, 0), false, true));
            }
            Cond::LoNe(index, value) => {
                block.push((stmt(BPF_LD_W_ABS, arg_lo(index)), false, false));
                block.push((jump(BPF_JMP_JEQ_K, value, 0, 0), true, false));
            }
            Cond::LoMaskedNe(index, mask, value) => {
                block.push((stmt(BPF_LD_W_ABS, arg_lo(index)), false, false));
                block.push((stmt(BPF_ALU_AND_K, mask), false, false));
                block.push((jump(BPF_JMP_JEQ_K, value, 0, 0), true, false));
            }
            Cond::LoAnyBit(index, mask) => {
                block.push((stmt(BPF_LD_W_ABS, arg_lo(index)), false, false));
                block.push((jump(BPF_JMP_JSET_K, mask, 0, 0), false, true));
            }
            Cond::NonZero(index) => {
                // low word != 0: the condition holds, jump over the high-word test.
                block.push((stmt(BPF_LD_W_ABS, arg_lo(index)), false, false));
                block.push((jump(BPF_JMP_JEQ_K, 0, 0, 2), false, false));
                block.push((stmt(BPF_LD_W_ABS, arg_hi(index)), false, false));
                block.push((jump(BPF_JMP_JEQ_K, 0, 0, 0), true, false));
            }
        }
    }
    block.push((stmt(BPF_RET_K, rule.action.ret()), false, false));
    let end = block.len();
    block
        .into_iter()
        .enumerate()
        .map(|(index, (mut insn, skip_true, skip_false))| {
            let skip = u8::try_from(end - index - 1).map_err(|_| "rule too long for a jump")?;
            if skip_true {
                insn.jt = skip;
            }
            if skip_false {
                insn.jf = skip;
            }
            Ok(insn)
        })
        .collect()
}

/// A node of the syscall-number search tree, before jump offsets are known.
enum TreeInsn {
    /// `jge pivot`: true goes to the right subtree, `right` instructions ahead.
    Split { pivot: u32, right: usize },
    /// `jeq nr`: true goes to the trampoline of syscall `group`, false to "allow".
    Leaf { nr: u32, group: usize },
}

fn emit_tree(nrs: &[(u32, usize)], out: &mut Vec<TreeInsn>) {
    match nrs {
        [] => {}
        [(nr, group)] => out.push(TreeInsn::Leaf {
            nr: *nr,
            group: *group,
        }),
        _ => {
            let (left, right) = nrs.split_at(nrs.len() / 2);
            let at = out.len();
            out.push(TreeInsn::Split {
                pivot: right[0].0,
                right: 0,
            });
            emit_tree(left, out);
            let left_len = out.len() - at - 1;
            if let Some(TreeInsn::Split { right, .. }) = out.get_mut(at) {
                *right = left_len;
            }
            emit_tree(right, out);
        }
    }
}

/// Compile `rules` for `arch` into a complete program.
pub(crate) fn compile(rules: &[Rule], arch: u32) -> Result<Vec<SockFilter>, &'static str> {
    let mut program = vec![
        stmt(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JMP_JEQ_K, arch, 1, 0),
        // A foreign architecture (e.g. int 0x80 i386 calls on x86_64) is killed.
        stmt(BPF_RET_K, RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ];
    if arch == AUDIT_ARCH_X86_64 {
        program.push(jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1));
        // x32 numbers would dodge every rule below; nothing here uses the x32 ABI.
        program.push(stmt(BPF_RET_K, RET_KILL_PROCESS));
    }
    // Group the rules by syscall, keeping table order inside a group (first match wins).
    let mut groups: Vec<(u32, Vec<&Rule>)> = Vec::new();
    for rule in rules {
        let nr = u32::try_from(rule.nr).map_err(|_| "syscall number out of range")?;
        match groups.iter_mut().find(|(group_nr, _)| *group_nr == nr) {
            Some((_, members)) => members.push(rule),
            None => groups.push((nr, vec![rule])),
        }
    }
    let mut sorted: Vec<(u32, usize)> = groups
        .iter()
        .enumerate()
        .map(|(index, (nr, _))| (*nr, index))
        .collect();
    sorted.sort_unstable();
    let mut tree = Vec::new();
    emit_tree(&sorted, &mut tree);
    // Layout: tree, allow, one trampoline per group, the group blocks.
    let tree_start = program.len();
    let allow_at = tree_start + tree.len();
    let trampolines_at = allow_at + 1;
    let short = |from: usize, to: usize| {
        u8::try_from(to - from - 1).map_err(|_| "search tree too large for a jump")
    };
    for (index, insn) in tree.iter().enumerate() {
        let at = tree_start + index;
        program.push(match *insn {
            TreeInsn::Split { pivot, right } => {
                let right = u8::try_from(right).map_err(|_| "search tree too large for a jump")?;
                jump(BPF_JMP_JGE_K, pivot, right, 0)
            }
            TreeInsn::Leaf { nr, group } => jump(
                BPF_JMP_JEQ_K,
                nr,
                short(at, trampolines_at + group)?,
                short(at, allow_at)?,
            ),
        });
    }
    program.push(stmt(BPF_RET_K, RET_ALLOW));
    let mut blocks: Vec<Vec<SockFilter>> = Vec::new();
    for (_, members) in &groups {
        let mut block = Vec::new();
        for rule in members {
            block.extend(compile_rule(rule)?);
        }
        block.push(stmt(BPF_RET_K, RET_ALLOW));
        blocks.push(block);
    }
    let blocks_at = trampolines_at + groups.len();
    let mut block_at = blocks_at;
    for (index, block) in blocks.iter().enumerate() {
        let at = trampolines_at + index;
        let offset = u32::try_from(block_at - at - 1).map_err(|_| "program too large")?;
        program.push(stmt(BPF_JMP_JA, offset));
        block_at += block.len();
    }
    for block in blocks {
        program.extend(block);
    }
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
                BPF_JMP_JA => pc += insn.k as usize,
                BPF_RET_K => return insn.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    const OFF: NetworkAccess = NetworkAccess::Off;
    const ON: NetworkAccess = NetworkAccess::On;
    const FILTERED: NetworkAccess = NetworkAccess::Filtered;
    const MODES: [NetworkAccess; 3] = [OFF, ON, FILTERED];

    fn eval(network: NetworkAccess, nr: i64, args: [u64; 6]) -> u32 {
        let program = compile(&rules(network, false), native_arch()).unwrap();
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
    fn expected(network: NetworkAccess, nr: i64, args: &[u64; 6]) -> u32 {
        rules(network, false)
            .iter()
            .find(|rule| rule.nr == nr && rule.conds.iter().all(|cond| cond_holds(cond, args)))
            .map_or(RET_ALLOW, |rule| rule.action.ret())
    }

    #[test]
    fn every_rule_matches_its_own_arguments() {
        for network in MODES {
            for rule in rules(network, false) {
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
        for network in MODES {
            for rule in rules(network, false)
                .iter()
                .filter(|rule| !rule.conds.is_empty())
            {
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
    fn every_syscall_number_gets_what_the_table_says() {
        // Exhaustive over plausible numbers, with arguments that match nothing conditional.
        for network in MODES {
            for nr in 0..600i64 {
                let args = [3, 1, 0, 0, 0, 0];
                assert_eq!(
                    eval(network, nr, args),
                    expected(network, nr, &args),
                    "syscall {nr}"
                );
            }
        }
    }

    #[test]
    fn unlisted_syscalls_take_a_short_path() {
        let program = compile(&rules(OFF, false), native_arch()).unwrap();
        let mut longest = 0;
        for nr in 0..600u32 {
            if rules(OFF, false)
                .iter()
                .any(|rule| rule.nr == i64::from(nr))
            {
                continue;
            }
            // Count executed instructions.
            let mut pc = 0usize;
            let mut steps = 0;
            let mut acc = 0u32;
            loop {
                let insn = program[pc];
                pc += 1;
                steps += 1;
                match insn.code {
                    BPF_LD_W_ABS => {
                        acc = if insn.k == DATA_ARCH {
                            native_arch()
                        } else {
                            nr
                        }
                    }
                    BPF_JMP_JEQ_K => {
                        pc += usize::from(if acc == insn.k { insn.jt } else { insn.jf })
                    }
                    BPF_JMP_JGE_K => {
                        pc += usize::from(if acc >= insn.k { insn.jt } else { insn.jf })
                    }
                    BPF_RET_K => {
                        assert_eq!(insn.k, RET_ALLOW);
                        break;
                    }
                    other => panic!("syscall {nr} reached opcode {other:#x}"),
                }
            }
            longest = longest.max(steps);
        }
        assert!(
            longest <= 16,
            "{longest} instructions for an unlisted syscall"
        );
    }

    #[test]
    fn unlisted_syscalls_are_allowed() {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
        ] {
            assert_eq!(eval(OFF, nr, [0; 6]), RET_ALLOW);
        }
    }

    #[test]
    fn foreign_architecture_is_killed() {
        let program = compile(&rules(ON, false), native_arch()).unwrap();
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
            eval(ON, (X32_SYSCALL_BIT as i64) | libc::SYS_read, [0; 6]),
            RET_KILL_PROCESS
        );
    }

    #[test]
    fn clone3_gets_enosys_and_clone_namespace_flags_eperm() {
        assert_eq!(
            eval(ON, libc::SYS_clone3, [0; 6]),
            RET_ERRNO | libc::ENOSYS as u32
        );
        let fork_flags = libc::SIGCHLD as u64;
        assert_eq!(
            eval(ON, libc::SYS_clone, [fork_flags, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        let thread_flags = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(
            eval(ON, libc::SYS_clone, [thread_flags, 0, 0, 0, 0, 0]),
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
                eval(ON, libc::SYS_clone, [flags, 0, 0, 0, 0, 0]),
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
            eval(OFF, libc::SYS_socket, [unix, stream, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            eval(OFF, libc::SYS_socket, [unix, seqpacket, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            eval(OFF, libc::SYS_socket, [unix, dgram, 0, 0, 0, 0]),
            eperm
        );
        for family in [
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
            libc::AF_PACKET,
        ] {
            let args = [family as u64, stream, 0, 0, 0, 0];
            assert_eq!(eval(OFF, libc::SYS_socket, args), eperm, "family {family}");
        }
        // High garbage bits do not turn AF_INET into something else.
        let sneaky = (1u64 << 32) | libc::AF_INET as u64;
        assert_eq!(
            eval(OFF, libc::SYS_socket, [sneaky, stream, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            eval(OFF, libc::SYS_socketpair, [unix, stream, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            eval(OFF, libc::SYS_socketpair, [unix, dgram, 0, 0, 0, 0]),
            eperm
        );
        for nr in [
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_accept4,
        ] {
            assert_eq!(eval(OFF, nr, [3, 0, 0, 0, 0, 0]), eperm);
        }
        assert_eq!(eval(OFF, libc::SYS_sendto, [3, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(eval(OFF, libc::SYS_sendto, [3, 0, 0, 0, 0x1000, 16]), eperm);
        assert_eq!(
            eval(OFF, libc::SYS_sendto, [3, 0, 0, 0, 1 << 40, 16]),
            eperm
        );
    }

    #[test]
    fn network_on_allows_ip_but_not_vsock_or_io_uring() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        let stream = libc::SOCK_STREAM as u64;
        assert_eq!(
            eval(
                ON,
                libc::SYS_socket,
                [libc::AF_INET as u64, stream, 0, 0, 0, 0]
            ),
            RET_ALLOW
        );
        assert_eq!(eval(ON, libc::SYS_connect, [3, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            eval(
                ON,
                libc::SYS_socket,
                [libc::AF_VSOCK as u64, stream, 0, 0, 0, 0]
            ),
            eperm
        );
        assert_eq!(
            eval(ON, libc::SYS_io_uring_setup, [8, 0, 0, 0, 0, 0]),
            eperm
        );
    }

    #[test]
    fn network_filtered_allows_ip_but_no_other_family() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        let stream = libc::SOCK_STREAM as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        for (family, kind) in [
            (libc::AF_INET, stream),
            (libc::AF_INET, dgram),
            (libc::AF_INET6, stream),
            (libc::AF_UNIX, stream),
        ] {
            let args = [family as u64, kind, 0, 0, 0, 0];
            assert_eq!(
                eval(FILTERED, libc::SYS_socket, args),
                RET_ALLOW,
                "family {family}"
            );
        }
        for family in [
            libc::AF_NETLINK,
            libc::AF_PACKET,
            libc::AF_VSOCK,
            libc::AF_BLUETOOTH,
        ] {
            let args = [family as u64, dgram, 0, 0, 0, 0];
            assert_eq!(
                eval(FILTERED, libc::SYS_socket, args),
                eperm,
                "family {family}"
            );
        }
        // High garbage bits do not turn AF_NETLINK into AF_INET's neighbour.
        let sneaky = (1u64 << 32) | libc::AF_NETLINK as u64;
        assert_eq!(
            eval(FILTERED, libc::SYS_socket, [sneaky, dgram, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            eval(FILTERED, libc::SYS_connect, [3, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            eval(FILTERED, libc::SYS_io_uring_setup, [8, 0, 0, 0, 0, 0]),
            eperm
        );
    }

    #[test]
    fn tiocsti_is_denied_but_other_ioctls_pass() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        assert_eq!(
            eval(ON, libc::SYS_ioctl, [0, libc::TIOCSTI, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            eval(ON, libc::SYS_ioctl, [0, libc::TCGETS, 0, 0, 0, 0]),
            RET_ALLOW
        );
    }

    #[test]
    fn keeping_the_group_refuses_setsid_and_setpgid_and_only_then() {
        for network in MODES {
            let kept = compile(&rules(network, true), native_arch()).unwrap();
            let free = compile(&rules(network, false), native_arch()).unwrap();
            for nr in [libc::SYS_setsid, libc::SYS_setpgid] {
                let data = Data {
                    nr: nr as u32,
                    arch: native_arch(),
                    args: [0; 6],
                };
                assert_eq!(run(&kept, &data), EPERM.ret(), "syscall {nr} kept");
                assert_eq!(run(&free, &data), RET_ALLOW, "syscall {nr} free");
            }
            // Everything else is as without the group rules.
            for rule in rules(network, false) {
                let args = args_for(&rule, true).expect("arguments");
                let data = Data {
                    nr: rule.nr as u32,
                    arch: native_arch(),
                    args,
                };
                assert_eq!(run(&kept, &data), rule.action.ret(), "rule {}", rule.name);
            }
        }
    }

    #[test]
    fn the_brief_s_syscalls_are_all_covered() {
        let names: Vec<&str> = rules(OFF, false).iter().map(|rule| rule.name).collect();
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
