//! `cordon-helper forward`: the plumbing that brings an egress proxy on the other side of a
//! Unix socket into a sandbox without a network (a container started with `--network none`).
//!
//! It listens on `127.0.0.1:PORT` (the address the proxy environment variables of commands
//! name), and relays each accepted connection to a new connection to the Unix socket, both
//! ways, until both sides are done. It makes no decision: the proxy behind the socket reads
//! the request and allows or refuses it, so the forwarder is untrusted plumbing (a command
//! that kills it only loses its way out). It does not own the proxy, the socket or the policy.
//!
//! Once the listener is bound it prints [`READY`] and the bound address on stdout (one line),
//! so the starter knows the port is served (or, when the line never comes, that this binary cannot run there). It exits
//! when its standard input ends (the starter went away) or the listener fails.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The start of the line printed on stdout once the listener is bound (the address follows
/// after a space).
pub const READY: &str = "cordon-forward ready";

/// Connections relayed at once by default; more are closed as soon as they are accepted.
pub const MAX_CONNECTIONS: usize = 256;

/// What [`run`] needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardConfig {
    /// The loopback port to listen on (0: any free port, named in the ready line).
    pub port: u16,
    /// The Unix socket each connection is relayed to.
    pub socket: PathBuf,
    /// Connections relayed at once.
    pub max_connections: usize,
}

impl ForwardConfig {
    /// `forward PORT SOCKET` as the program's words (without `forward`).
    pub fn from_args(port: &str, socket: &str) -> Result<ForwardConfig, String> {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{port}` is not a port (0-65535)"))?;
        let socket = PathBuf::from(socket);
        if !socket.is_absolute() {
            return Err(format!(
                "the socket `{}` is not an absolute path",
                socket.display()
            ));
        }
        Ok(ForwardConfig {
            port,
            socket,
            max_connections: MAX_CONNECTIONS,
        })
    }
}

/// Bind `127.0.0.1:PORT`, then [`serve`] it until `stop` completes (or the listener fails).
/// `ready` is called once the listener is bound.
pub async fn run(
    config: &ForwardConfig,
    ready: impl FnOnce(SocketAddr),
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, config.port)).await?;
    ready(listener.local_addr()?);
    tokio::select! {
        served = serve(listener, &config.socket, config.max_connections) => served,
        () = stop => {
            tracing::debug!("forward: stopped by its starter");
            Ok(())
        }
    }
}

/// Relay every connection accepted on `listener` to a new connection to `socket`, at most
/// `max_connections` at once (the ones over the bound are closed at once). Returns when
/// accepting fails for a reason that is not about one connection.
pub async fn serve(listener: TcpListener, socket: &Path, max_connections: usize) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
    let socket: Arc<Path> = Arc::from(socket);
    let mut relays = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                        tracing::warn!(%peer, max_connections, "forward: too many connections, one closed");
                        drop(stream);
                        continue;
                    };
                    let socket = Arc::clone(&socket);
                    relays.spawn(async move {
                        if let Err(error) = relay(stream, &socket).await {
                            tracing::debug!(%peer, %error, "forward: a relay ended with an error");
                        }
                        drop(permit);
                    });
                }
                Err(error) if per_connection(&error) => {
                    tracing::debug!(%error, "forward: one connection failed during accept");
                }
                Err(error) => {
                    tracing::warn!(%error, "forward: accept failed, stopping");
                    return Err(error);
                }
            },
            Some(_) = relays.join_next(), if !relays.is_empty() => {}
        }
    }
}

/// Errors of `accept` that concern one connection (the listener still works).
fn per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || error.raw_os_error() == Some(24) // EMFILE: wait for a relay to end
}

/// One connection: connect the socket, then copy both ways; each side's end is passed on as a
/// half-close, and the relay ends when both directions did or either failed (then both are
/// closed). A socket that cannot be reached closes the client's connection: nothing leads out
/// without the proxy.
async fn relay(mut client: TcpStream, socket: &Path) -> io::Result<()> {
    client.set_nodelay(true)?;
    let mut upstream = match UnixStream::connect(socket).await {
        Ok(upstream) => upstream,
        Err(error) => {
            tracing::warn!(socket = %socket.display(), %error, "forward: failed to connect the proxy socket");
            return Err(error);
        }
    };
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_a_port_and_an_absolute_socket_path() {
        assert_eq!(
            ForwardConfig::from_args("3128", "/run/e/proxy.sock"),
            Ok(ForwardConfig {
                port: 3128,
                socket: PathBuf::from("/run/e/proxy.sock"),
                max_connections: MAX_CONNECTIONS,
            })
        );
        assert_eq!(ForwardConfig::from_args("0", "/s").map(|c| c.port), Ok(0));
        assert!(ForwardConfig::from_args("70000", "/s").is_err());
        assert!(ForwardConfig::from_args("x", "/s").is_err());
        assert!(ForwardConfig::from_args("3128", "rel/s").is_err());
    }
}
