//! The kernel relay: a relay whose bytes never reach user space. Both sockets of a relayed
//! connection go into a BPF socket hash whose verdict program (`sk_skb`) sends every segment
//! one of them receives out of the other, so the kernel moves the data and no thread wakes for
//! it. What a relay costs when no process copies or splices at all: the floor under any proxy
//! in user space, to compare the others with.
//!
//! Needs `CAP_BPF` and `CAP_NET_ADMIN` (root here). Not a design for the product: nothing
//! bounds what the kernel queues for a slow receiver, and the kernel gives no sign of when a
//! queue is empty, so the end of a stream is passed on only once the receiving side has had
//! everything acknowledged (`TCP_INFO` byte counters, polled every millisecond at the end).
//!
//! Raw system calls (`bpf`, `getsockopt`, `poll`) need `unsafe`; each block says why it holds.
#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_MAP_TYPE_SOCKHASH: u32 = 18;
const BPF_PROG_TYPE_SK_SKB: u32 = 14;
const BPF_SK_SKB_VERDICT: u32 = 38;
const BPF_FUNC_GET_SOCKET_COOKIE: i32 = 46;
const BPF_FUNC_SK_REDIRECT_HASH: i32 = 72;
/// How many sockets the hash holds: two per relayed connection.
const MAX_SOCKETS: u32 = 1024;
/// `struct tcp_info`: offsets of `tcpi_bytes_acked` and `tcpi_bytes_received`, and its size.
const TCPI_BYTES_ACKED: usize = 120;
const TCPI_BYTES_RECEIVED: usize = 128;
const TCP_INFO_SIZE: usize = 232;

/// `bpf(2)` with an attribute block of 128 bytes, zero where not set; its non-negative result.
fn bpf_call(command: libc::c_long, attr: &[u64; 16]) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised block of the size passed; pointers in it point at
    // memory that outlives the call.
    let result = unsafe { libc::syscall(libc::SYS_bpf, command, attr.as_ptr(), 128usize) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(result)
}

/// `bpf(2)` for a command that creates something: the new descriptor.
fn bpf(command: libc::c_long, attr: &[u64; 16]) -> io::Result<OwnedFd> {
    let fd = bpf_call(command, attr)?;
    // SAFETY: creating commands return a new descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `bpf(2)` for a command that returns no descriptor.
fn bpf_unit(command: libc::c_long, attr: &[u64; 16]) -> io::Result<()> {
    bpf_call(command, attr).map(drop)
}

/// One BPF instruction: opcode, destination and source registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    let [o0, o1] = off.to_le_bytes();
    let [i0, i1, i2, i3] = imm.to_le_bytes();
    u64::from_le_bytes([code, (src << 4) | dst, o0, o1, i0, i1, i2, i3])
}

/// The socket hash (key: a socket's cookie; value: the socket its segments go out of) with the
/// verdict program attached.
struct Hash {
    map: OwnedFd,
    _program: OwnedFd,
}

impl Hash {
    fn new() -> io::Result<Hash> {
        let mut attr = [0u64; 16];
        attr[0] = u64::from(BPF_MAP_TYPE_SOCKHASH) | (8 << 32); // map_type, key_size
        attr[1] = 8 | (u64::from(MAX_SOCKETS) << 32); // value_size, max_entries
        let map = bpf(BPF_MAP_CREATE, &attr)?;
        // r6 = ctx; r0 = get_socket_cookie(ctx); *(u64 *)(r10 - 8) = r0;
        // return sk_redirect_hash(ctx, map, r10 - 8, 0): out of the peer's send side.
        let program = [
            insn(0xbf, 6, 1, 0, 0),
            insn(0x85, 0, 0, 0, BPF_FUNC_GET_SOCKET_COOKIE),
            insn(0x7b, 10, 0, -8, 0),
            insn(0xbf, 1, 6, 0, 0),
            insn(0x18, 2, 1, 0, map.as_raw_fd()), // ld_imm64 of the map (pseudo map fd)
            0,
            insn(0xbf, 3, 10, 0, 0),
            insn(0x07, 3, 0, 0, -8),
            insn(0xb7, 4, 0, 0, 0),
            insn(0x85, 0, 0, 0, BPF_FUNC_SK_REDIRECT_HASH),
            insn(0x95, 0, 0, 0, 0),
        ];
        let license = c"GPL";
        let mut log = vec![0u8; 64 * 1024];
        let mut attr = [0u64; 16];
        attr[0] = u64::from(BPF_PROG_TYPE_SK_SKB) | ((program.len() as u64) << 32);
        attr[1] = program.as_ptr() as u64;
        attr[2] = license.as_ptr() as u64;
        attr[3] = 1 | ((log.len() as u64) << 32); // log_level, log_size
        attr[4] = log.as_mut_ptr() as u64;
        let program = bpf(BPF_PROG_LOAD, &attr).map_err(|error| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            io::Error::other(format!(
                "load the verdict program: {error}: {}",
                String::from_utf8_lossy(&log[..end])
            ))
        })?;
        let mut attr = [0u64; 16];
        attr[0] = map.as_raw_fd() as u64 | ((program.as_raw_fd() as u64) << 32);
        attr[1] = u64::from(BPF_SK_SKB_VERDICT);
        bpf_unit(BPF_PROG_ATTACH, &attr)?;
        Ok(Hash {
            map,
            _program: program,
        })
    }

    /// Segments `from` receives go out of `to` from now on.
    fn redirect(&self, from: &TcpStream, to: &TcpStream) -> io::Result<()> {
        let key = cookie(from)?;
        let value = to.as_raw_fd() as u64;
        let mut attr = [0u64; 16];
        attr[0] = self.map.as_raw_fd() as u64;
        attr[1] = &key as *const u64 as u64;
        attr[2] = &value as *const u64 as u64;
        bpf_unit(BPF_MAP_UPDATE_ELEM, &attr)
    }
}

fn cookie(socket: &TcpStream) -> io::Result<u64> {
    let mut value = 0u64;
    let mut len = 8 as libc::socklen_t;
    // SAFETY: `value` is 8 writable bytes, their length passed.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// A socket's `tcpi_bytes_acked` and `tcpi_bytes_received`.
fn byte_counts(socket: &TcpStream) -> io::Result<(u64, u64)> {
    let mut info = [0u8; TCP_INFO_SIZE];
    let mut len = TCP_INFO_SIZE as libc::socklen_t;
    // SAFETY: `info` is `len` writable bytes.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if (len as usize) < TCPI_BYTES_RECEIVED + 8 {
        return Err(io::Error::other("TCP_INFO without byte counters"));
    }
    let at =
        |offset: usize| u64::from_ne_bytes(info[offset..offset + 8].try_into().expect("8 bytes"));
    Ok((at(TCPI_BYTES_ACKED), at(TCPI_BYTES_RECEIVED)))
}

/// Waits until `socket`'s peer has sent everything (its end of stream has arrived).
fn wait_for_end(socket: &TcpStream) {
    let mut poll = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    loop {
        // SAFETY: one valid `pollfd`.
        let rc = unsafe { libc::poll(&mut poll, 1, -1) };
        if rc > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return;
        }
        if rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// One direction's end: once `from` has reached its end, waits until `to` has had all that
/// `from` received acknowledged, then ends `to`'s sending side.
///
/// The counters count sequence numbers, not only data: `from`'s received count includes the
/// end of stream (one), and the acknowledged count of a socket that opened its connection
/// (`to_opened`) includes its opening (one).
fn pass_end(from: &TcpStream, to: &TcpStream, to_opened: bool) {
    wait_for_end(from);
    loop {
        match (byte_counts(from), byte_counts(to)) {
            (Ok((_, received)), Ok((acked, _)))
                if acked.saturating_sub(u64::from(to_opened)) < received.saturating_sub(1) =>
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            _ => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Writes to `to` what `from` has received and not yet been read, without waiting for more.
fn pass_queued(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    use std::io::{Read, Write};
    from.set_nonblocking(true)?;
    let mut buffer = vec![0u8; 64 * 1024];
    let result = loop {
        match (&*from).read(&mut buffer) {
            Ok(0) => break Ok(()),
            Ok(n) => (&*to).write_all(&buffer[..n])?,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break Ok(()),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => break Err(error),
        }
    };
    from.set_nonblocking(false)?;
    result
}

/// Starts a kernel relay to `origin` on a loopback port; its address, or why BPF cannot do it
/// here.
pub fn start(origin: SocketAddr) -> io::Result<SocketAddr> {
    let hash = Arc::new(Hash::new()?);
    let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    let address = listener.local_addr()?;
    std::thread::spawn(move || {
        while let Ok((client, _)) = listener.accept() {
            let Ok(upstream) = TcpStream::connect(origin) else {
                continue;
            };
            let _ = client.set_nodelay(true);
            if let Err(error) = hash
                .redirect(&client, &upstream)
                .and_then(|()| hash.redirect(&upstream, &client))
            {
                eprintln!("kernel relay: {error}");
                continue;
            }
            // What the client sent before its redirection was in place waits in its receive
            // queue, out of the kernel's reach: pass it on here. A client that sends its
            // request and waits for the answer (every client of the bench) sends nothing
            // more meanwhile, so nothing overtakes it.
            if let Err(error) = pass_queued(&client, &upstream) {
                eprintln!("kernel relay: {error}");
                continue;
            }
            let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || pass_end(&client, &upstream, true));
            std::thread::spawn(move || pass_end(&upstream2, &client2, false));
        }
    });
    Ok(address)
}
