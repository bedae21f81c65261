//! No network with the default policy (`[network] enabled = false`): TCP and UDP to the
//! host's loopback listeners, DNS, and host Unix sockets (pathname and abstract) all fail,
//! and the listeners see nothing arrive. With the network on, host Unix sockets stay out of
//! reach unless the policy names them.

use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};

use crate::support::{Harness, in_docker, require_tool};

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
    let mut port = listener.local_addr().unwrap().port();
    // In a container 127.0.0.1 is the container's loopback, where nothing of the host listens:
    // the attempts aim at a listener there (outside the sandbox), so a connection the sandbox
    // let through would succeed.
    let _in_container = in_docker().then(|| {
        let (listener, listening) = h.listen_in_container();
        port = listening;
        listener
    });
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

/// A policy with the network on, naming `allowed` as reachable host sockets.
fn networked_policy(allowed: &[String]) -> String {
    let list: Vec<String> = allowed.iter().map(|path| format!("{path:?}")).collect();
    format!(
        "version = 1\ndefault = \"allow\"\n[network]\nenabled = true\nunix_sockets = [{}]\n",
        list.join(", ")
    )
}

#[tokio::test]
async fn host_unix_sockets_stay_refused_with_the_network_on() {
    require_tool("python3", "python3");
    let name = format!("cordon-escape-net-{}", std::process::id());
    let h = Harness::with_policy(|_| networked_policy(&[])).await;
    // On Docker no Landlock rule mediates connect(2) to a pathname socket on this kernel: what
    // keeps a host socket out of reach there is the container's own mount namespace, into
    // which the backend binds only the sockets the policy lists. So the socket lives in a host
    // directory the container does not have (`outside` is mounted there for the file cases),
    // and the case checks that the container indeed lacks it.
    let socket_dir = tempfile::tempdir().unwrap();
    let path = if in_docker() {
        socket_dir.path().join("host.sock")
    } else {
        h.outside.join("host.sock")
    };
    let listener = UnixListener::bind(&path).unwrap();
    if in_docker() {
        assert!(
            !h.container_has(&path),
            "{} is in the container",
            path.display()
        );
    }
    listener.set_nonblocking(true).unwrap();
    let abstract_listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    abstract_listener.set_nonblocking(true).unwrap();
    let connect = |target: &str| {
        format!(
            "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{target}\")'"
        )
    };
    let mut targets = vec![
        (
            "pathname socket outside the workspace",
            connect(&path.display().to_string()),
        ),
        ("abstract socket", connect(&format!("\\0{name}"))),
        ("docker socket", connect("/var/run/docker.sock")),
    ];
    // The private dockerd the test machines run, when there is one.
    if let Some(socket) = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|host| host.strip_prefix("unix://").map(str::to_owned))
    {
        targets.push(("DOCKER_HOST socket", connect(&socket)));
    }
    for (what, command) in &targets {
        h.bash_fails(what, command).await;
        assert_no_connection(what, listener.accept());
        assert_no_connection(what, abstract_listener.accept());
    }
    // The network itself is on: a loopback listener on the host is reachable; in a container
    // loopback is the container's own, so the listener runs there, outside the sandbox.
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut port = tcp.local_addr().unwrap().port();
    let _in_container = in_docker().then(|| {
        let (listener, listening) = h.listen_in_container();
        port = listening;
        listener
    });
    let result = h
        .bash(&format!(
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 5)'"
        ))
        .await;
    assert!(
        !result.is_error,
        "TCP with the network on: {}",
        result.text()
    );
}

#[tokio::test]
async fn a_host_unix_socket_the_policy_names_is_reachable() {
    require_tool("python3", "python3");
    let mut socket = None;
    // Listening before the session opens: the Docker backend binds a listed socket into the
    // container when it starts, so it must exist by then.
    let h = Harness::with_policy(|outside| {
        let path = outside.join("allowed.sock");
        socket = Some((path.clone(), UnixListener::bind(&path).unwrap()));
        networked_policy(&[path.display().to_string()])
    })
    .await;
    let (path, listener) = socket.unwrap();
    let served = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        std::io::Write::write_all(&mut stream, b"allowed-reply").unwrap();
    });
    let result = h
        .bash(&format!(
            "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{}\"); print(s.recv(64).decode())'",
            path.display()
        ))
        .await;
    served.join().unwrap();
    assert!(!result.is_error, "{}", result.text());
    assert!(result.text().contains("allowed-reply"), "{}", result.text());
}
