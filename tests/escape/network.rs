//! No network with the default policy (`[network] enabled = false`): TCP and UDP to the
//! host's loopback listeners, DNS, and host Unix sockets (pathname and abstract) all fail,
//! and the listeners see nothing arrive.

use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};

use crate::support::{Harness, require_tool};

/// Assert a non-blocking listener has no pending connection.
fn assert_no_connection<T>(what: &str, accepted: std::io::Result<T>) {
    match accepted {
        Err(error) if error.kind() == ErrorKind::WouldBlock => {}
        Err(error) => panic!("{what}: accept failed unexpectedly: {error}"),
        Ok(_) => panic!("{what}: the sandbox reached the host listener"),
    }
}

#[tokio::test]
async fn tcp_to_the_host_is_refused() {
    require_tool("curl", "curl");
    require_tool("nc", "netcat-openbsd");
    require_tool("python3", "python3");
    let h = Harness::new().await;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    for (what, command) in [
        ("curl", format!("curl -sS --max-time 10 http://127.0.0.1:{port}/")),
        ("nc", format!("echo hi | nc -w 5 127.0.0.1 {port}")),
        ("bash /dev/tcp", format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo hi >&3")),
        (
            "python3 socket",
            format!(
                "python3 -c 'import socket; s = socket.create_connection((\"127.0.0.1\", {port}), 5); s.send(b\"hi\")'"
            ),
        ),
        (
            "python3 IPv6 socket",
            format!(
                "python3 -c 'import socket; s = socket.create_connection((\"::1\", {port}), 5)'"
            ),
        ),
        ("curl to the internet", "curl -sS --max-time 10 http://1.1.1.1/".to_owned()),
        (
            "listen for inbound connections",
            "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen()'"
                .to_owned(),
        ),
    ] {
        h.bash_fails(what, &command).await;
        assert_no_connection(what, listener.accept());
    }
}

#[tokio::test]
async fn udp_and_dns_are_refused() {
    require_tool("python3", "python3");
    require_tool("getent", "libc-bin");
    let h = Harness::new().await;
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let port = socket.local_addr().unwrap().port();
    // A DNS query for example.com, sent where a resolver would listen.
    let query = "b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07example\\x03com\\x00\\x00\\x01\\x00\\x01'";
    for (what, command) in [
        (
            "python3 UDP DNS query",
            format!(
                "python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto({query}, (\"127.0.0.1\", {port}))'"
            ),
        ),
        ("bash /dev/udp", format!("echo hi > /dev/udp/127.0.0.1/{port}")),
        ("resolver lookup", "getent hosts example.com".to_owned()),
        (
            "raw socket",
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)'"
                .to_owned(),
        ),
        (
            "netlink socket",
            "python3 -c 'import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)'"
                .to_owned(),
        ),
    ] {
        h.bash_fails(what, &command).await;
        let mut buf = [0u8; 512];
        match socket.recv_from(&mut buf) {
            Err(error) if error.kind() == ErrorKind::WouldBlock => {}
            other => panic!("{what}: the host UDP socket received {other:?}"),
        }
    }
}

#[tokio::test]
async fn host_unix_sockets_are_refused() {
    require_tool("nc", "netcat-openbsd");
    require_tool("python3", "python3");
    let h = Harness::new().await;
    // In the workspace, so the path itself is reachable from the sandbox.
    let path = h.at("host.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let abstract_name = format!("cordon-escape-{}", std::process::id());
    let abstract_listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap())
            .unwrap();
    abstract_listener.set_nonblocking(true).unwrap();
    for (what, command) in [
        ("nc -U", "echo hi | nc -w 5 -U host.sock".to_owned()),
        (
            "python3 AF_UNIX",
            "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"host.sock\")'"
                .to_owned(),
        ),
        (
            "python3 abstract socket",
            format!(
                "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"\\0{abstract_name}\")'"
            ),
        ),
        (
            "docker-style socket path",
            "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"/var/run/docker.sock\")'"
                .to_owned(),
        ),
    ] {
        h.bash_fails(what, &command).await;
        assert_no_connection(what, listener.accept());
        assert_no_connection(what, abstract_listener.accept());
    }
}
