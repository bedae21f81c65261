//! `ssh://[user@]host[:port]` engines, reached the way the docker CLI reaches them: every HTTP
//! connection to the engine is an SSH exec channel running `docker system dial-stdio` on the
//! host, which relays its stdio to the engine that host's docker CLI is configured for.
//!
//! The channels come from the SSH backend's [`Tunnel`] (one russh connection: the ssh config,
//! known_hosts verification that refuses unknown and changed keys, keys from ssh-agent or key
//! files); bollard's custom-transport hook sends every request through a hyper client whose
//! connector opens them, so connections are pooled and `docker exec` attaches upgrade them as
//! over a socket. Nothing listens on this machine, and the SSH connection lives as long as the
//! [`Docker`] client does.
//!
//! Every channel is a process on the host, so they are bounded: at most the tunnel's channel
//! limit are open at once (more requests wait for one), at most [`IDLE_CHANNELS`] stay open
//! idle after a burst, and an idle one is closed after [`IDLE_TIMEOUT`].
//!
//! It does not run the `ssh` program, and it cannot remove what a login shell's rc files print
//! on stdout before the command (the docker CLI cannot either): such a host fails the version
//! negotiation with an HTTP parse error.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bollard::Docker;
use cordon_backend_ssh::SshError;
use cordon_backend_ssh::tunnel::{Tunnel, TunnelConfig, TunnelStream};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

/// What runs on the host for each connection to the engine.
pub(crate) const DIAL_STDIO: &str = "docker system dial-stdio";

/// How many idle connections (channels, each a `dial-stdio` process on the host) the pool
/// keeps for the next requests; the others close when their request is done.
pub(crate) const IDLE_CHANNELS: usize = 2;

/// How long an idle connection stays open.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The SSH target of an `ssh://` engine URI: `[user@]host[:port]` (a path is refused: the
/// docker CLI has no use for one either).
pub(crate) fn ssh_target(host: &str) -> Result<String, String> {
    let rest = host
        .strip_prefix("ssh://")
        .ok_or_else(|| "not an ssh:// URI".to_owned())?;
    let target = rest.strip_suffix('/').unwrap_or(rest);
    if target.is_empty() {
        return Err("no host after ssh://; use ssh://[user@]host[:port]".to_owned());
    }
    if target.contains('/') || target.contains('?') || target.contains('#') {
        return Err(
            "an ssh:// engine takes no path or query; use ssh://[user@]host[:port]".to_owned(),
        );
    }
    if target
        .rsplit_once('@')
        .is_some_and(|(user, _)| user.contains(':'))
    {
        // It would otherwise go to the server, and into logs, as part of the user name.
        return Err(
            "a password in an ssh:// URI is not supported (the docker CLI refuses it \
                    too); authenticate with ssh-agent or a key file and use \
                    ssh://[user@]host[:port]"
                .to_owned(),
        );
    }
    Ok(target.to_owned())
}

/// `host` with the password of an `ssh://user:password@…` URI replaced by `***`, for messages
/// and logs.
pub(crate) fn without_password(host: &str) -> String {
    let Some(rest) = host.strip_prefix("ssh://") else {
        return host.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((user, at)) if user.contains(':') => {
            let name = user.split_once(':').map_or(user, |(name, _)| name);
            format!("ssh://{name}:***@{at}")
        }
        _ => host.to_owned(),
    }
}

/// Opens one `docker system dial-stdio` channel per connection hyper asks for.
#[derive(Clone)]
struct DialStdio {
    tunnel: Arc<Tunnel>,
}

/// A channel as hyper's connection.
struct Channel(TokioIo<TunnelStream>);

impl Connection for Channel {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Channel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Channel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<Channel, SshError>> + Send>>;

impl tower_service::Service<hyper::Uri> for DialStdio {
    type Response = Channel;
    type Error = SshError;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), SshError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: hyper::Uri) -> Connecting {
        let tunnel = Arc::clone(&self.tunnel);
        Box::pin(async move {
            let stream = tunnel.open(DIAL_STDIO).await?;
            Ok(Channel(TokioIo::new(stream)))
        })
    }
}

/// What bollard's custom transport returns for one request.
type Responding = Pin<
    Box<
        dyn Future<Output = Result<hyper::Response<hyper::body::Incoming>, bollard::errors::Error>>
            + Send,
    >,
>;

/// A request sender through `client` (generic so the body type is bollard's own).
fn transport<B>(
    client: Arc<Client<DialStdio, B>>,
) -> impl Fn(hyper::Request<B>) -> Responding + Send + Sync + 'static
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    move |request| -> Responding {
        let client = Arc::clone(&client);
        Box::pin(async move {
            client
                .request(request)
                .await
                .map_err(bollard::errors::Error::from)
        })
    }
}

/// A client of the engine behind `host` (`ssh://…`), authenticated as `config` says (its
/// `host` is replaced by the URI's target). The SSH connection is made (its host key verified)
/// before this returns; the first channel opens with the first request.
pub(crate) async fn connect(host: &str, mut config: TunnelConfig) -> Result<Docker, String> {
    config.host = ssh_target(host)?;
    let tunnel = Tunnel::new(config).map_err(|e| e.to_string())?;
    tunnel.connect().await.map_err(|e| e.to_string())?;
    tracing::debug!(host, via = %tunnel.label(), "docker: engine over ssh (docker system dial-stdio)");
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(IDLE_CHANNELS)
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .build(DialStdio {
            tunnel: Arc::new(tunnel),
        });
    Docker::connect_with_custom_transport(
        transport(Arc::new(client)),
        Some("http://docker"),
        120,
        bollard::API_DEFAULT_VERSION,
    )
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_the_uri_authority() {
        assert_eq!(ssh_target("ssh://me@h:2222").unwrap(), "me@h:2222");
        assert_eq!(ssh_target("ssh://h/").unwrap(), "h");
        for bad in ["ssh://", "ssh://h/var/run/docker.sock", "ssh://h?x=1"] {
            assert!(ssh_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_password_in_the_uri_is_refused_and_never_repeated() {
        let error = ssh_target("ssh://me:s3cret@h:2222").unwrap_err();
        assert!(error.contains("password"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
        assert_eq!(
            without_password("ssh://me:s3cret@h:2222"),
            "ssh://me:***@h:2222"
        );
        assert_eq!(without_password("ssh://me@h"), "ssh://me@h");
        assert_eq!(without_password("ssh://[::1]:22"), "ssh://[::1]:22");
    }
}
