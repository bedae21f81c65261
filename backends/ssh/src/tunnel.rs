//! Byte streams to commands on an SSH host, for clients that speak their own protocol over a
//! command's stdin and stdout (the Docker backend reaches an `ssh://` engine through
//! `docker system dial-stdio`, as the docker CLI does).
//!
//! It owns one connection resolved and verified exactly like the backend's ([`crate::config`],
//! [`crate::known_hosts`]: an unknown or changed host key is refused, keys from ssh-agent or
//! key files, ProxyJump/ProxyCommand), re-established by the next [`Tunnel::open`] after it
//! drops. It does not interpret the bytes; the caller's protocol does.
//!
//! At most [`TunnelConfig::max_channels`] streams are open at once (default
//! [`DEFAULT_MAX_CHANNELS`], sshd's default `MaxSessions`); further [`Tunnel::open`] calls wait
//! for one to be dropped. A new connection is made only when the current one is closed: a
//! channel the server refuses on a live connection is asked for again a few times (sshd frees
//! the slot of a closed channel once its command exited) and then fails with an error that
//! names `MaxSessions`.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use russh::ChannelMsg;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Target;
use crate::conn::{AuthOptions, ResolveOptions, Session, connect_endpoint, resolve_endpoint};
use crate::{AgentSource, PassphraseHook, SshError};

/// How many channels a [`Tunnel`] keeps open at once unless told otherwise: OpenSSH's default
/// `MaxSessions`.
pub const DEFAULT_MAX_CHANNELS: usize = 10;

/// How often a channel the server refused on a live connection is asked for again, and the
/// pause before each new request (about five seconds in all).
const REFUSED_RETRIES: u32 = 50;
const REFUSED_PAUSE: Duration = Duration::from_millis(100);

/// A command's stdio over an exec channel: read its stdout, write its stdin (shutting down the
/// writer sends EOF). It holds one of the tunnel's channel slots until dropped.
pub struct TunnelStream {
    // Dropped first: the channel's close is on its way before the slot is given back.
    stream: russh::ChannelStream<russh::client::Msg>,
    _slot: OwnedSemaphorePermit,
}

impl std::fmt::Debug for TunnelStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelStream").finish_non_exhaustive()
    }
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Where a [`Tunnel`] connects and how it authenticates.
#[derive(Clone, Default)]
pub struct TunnelConfig {
    /// `[user@]host[:port]`, or an alias from the ssh config file.
    pub host: String,
    /// A private key file to try first.
    pub identity: Option<PathBuf>,
    /// The known_hosts file (default: the config's `UserKnownHostsFile`, else
    /// `~/.ssh/known_hosts` and `/etc/ssh/ssh_known_hosts`).
    pub known_hosts: Option<PathBuf>,
    /// The ssh config file (default `~/.ssh/config`, then `/etc/ssh/ssh_config`).
    pub ssh_config: Option<PathBuf>,
    /// Where ssh-agent is.
    pub agent: AgentSource,
    /// Asks for the passphrase of an encrypted key.
    pub passphrase: Option<PassphraseHook>,
    /// How many streams may be open at once (default [`DEFAULT_MAX_CHANNELS`]); more
    /// [`Tunnel::open`] calls wait. Keep it at or below the host's sshd `MaxSessions`.
    pub max_channels: Option<NonZeroUsize>,
}

impl std::fmt::Debug for TunnelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelConfig")
            .field("host", &self.host)
            .field("identity", &self.identity)
            .field("known_hosts", &self.known_hosts)
            .field("ssh_config", &self.ssh_config)
            .field("agent", &self.agent)
            .field("passphrase", &self.passphrase.as_ref().map(|_| "<hook>"))
            .field("max_channels", &self.max_channels)
            .finish()
    }
}

/// One SSH connection that opens command streams on demand.
pub struct Tunnel {
    endpoint: crate::conn::Endpoint,
    auth: AuthOptions,
    current: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// One permit per channel that may be open.
    channels: Arc<Semaphore>,
    max_channels: usize,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("host", &self.endpoint.label())
            .finish_non_exhaustive()
    }
}

impl Tunnel {
    /// Resolve the target through the ssh config (no connection yet).
    pub fn new(config: TunnelConfig) -> Result<Tunnel, SshError> {
        let TunnelConfig {
            host,
            identity,
            known_hosts,
            ssh_config,
            agent,
            passphrase,
            max_channels,
        } = config;
        let max_channels = max_channels.map_or(DEFAULT_MAX_CHANNELS, NonZeroUsize::get);
        let target = Target::parse(&host)?;
        let options = ResolveOptions::new(ssh_config, identity, known_hosts);
        let endpoint = resolve_endpoint(&target, &options, true)?;
        Ok(Tunnel {
            endpoint,
            auth: AuthOptions { agent, passphrase },
            current: tokio::sync::Mutex::new(None),
            channels: Arc::new(Semaphore::new(max_channels)),
            max_channels,
        })
    }

    /// `user@host:port` of the target.
    pub fn label(&self) -> String {
        self.endpoint.label()
    }

    /// The live session, connecting (once, for all concurrent callers) when there is none or
    /// the last one dropped.
    async fn session(&self) -> Result<Arc<Session>, SshError> {
        let mut current = self.current.lock().await;
        if let Some(session) = current.as_ref()
            && !session.handle.is_closed()
        {
            return Ok(session.clone());
        }
        let reconnect = current.take().is_some();
        let host = self.label();
        let session = connect_endpoint(&self.endpoint, &self.auth)
            .await
            .inspect_err(
                |error| tracing::warn!(%host, reconnect, %error, "ssh tunnel: connect failed"),
            )?;
        tracing::info!(%host, reconnect, "ssh tunnel: connected");
        let session = Arc::new(session);
        *current = Some(session.clone());
        Ok(session)
    }

    /// Connect now (verifying the host key and authenticating) rather than at the first
    /// [`Tunnel::open`].
    pub async fn connect(&self) -> Result<(), SshError> {
        self.session().await.map(drop)
    }

    /// Start `command` on the host (through the account's login shell, as `ssh HOST COMMAND`
    /// does) and return its stdio once the server accepted the exec. Waits while
    /// `max_channels` streams are open. A cached connection that turns out closed is replaced
    /// once; a channel refused on a live connection is asked for again for a few seconds, then
    /// fails.
    pub async fn open(&self, command: &str) -> Result<TunnelStream, SshError> {
        let host = self.label();
        let channel_error = |reason: String| SshError::Channel {
            what: "an exec channel",
            host: host.clone(),
            reason,
        };
        if self.channels.available_permits() == 0 {
            tracing::debug!(%host, limit = self.max_channels, "ssh tunnel: all channels busy; waiting");
        }
        let slot = Arc::clone(&self.channels)
            .acquire_owned()
            .await
            .map_err(|_| channel_error("the tunnel's channel limit was closed".to_owned()))?;
        let mut reconnected = false;
        let mut refused = 0;
        let mut channel = loop {
            let session = self.session().await?;
            let error = match session.handle.channel_open_session().await {
                Ok(channel) => break channel,
                Err(error) => error,
            };
            if session.handle.is_closed() {
                if reconnected {
                    return Err(channel_error(error.to_string()));
                }
                reconnected = true;
                tracing::debug!(%host, %error, "ssh tunnel: connection closed; reconnecting");
                let mut current = self.current.lock().await;
                if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &session)) {
                    *current = None;
                }
                continue;
            }
            match error {
                russh::Error::ChannelOpenFailure(reason) if refused < REFUSED_RETRIES => {
                    refused += 1;
                    tracing::debug!(%host, ?reason, refused, "ssh tunnel: channel refused on a live connection; asking again");
                    tokio::time::sleep(REFUSED_PAUSE).await;
                }
                russh::Error::ChannelOpenFailure(reason) => {
                    tracing::warn!(%host, ?reason, limit = self.max_channels, "ssh tunnel: channel refused");
                    return Err(channel_error(format!(
                        "the server refused a new channel ({reason:?}) on a live connection with at \
                         most {} channels open; raise `MaxSessions` in the host's sshd_config or \
                         lower the tunnel's channel limit",
                        self.max_channels
                    )));
                }
                other => return Err(channel_error(other.to_string())),
            }
        };
        channel
            .exec(true, command)
            .await
            .map_err(|e| channel_error(e.to_string()))?;
        // The server answers the exec request before any output of the command.
        loop {
            match channel.wait().await {
                Some(ChannelMsg::Success) => break,
                Some(ChannelMsg::Failure) => {
                    return Err(channel_error(format!(
                        "the server refused to run `{command}`"
                    )));
                }
                Some(ChannelMsg::WindowAdjusted { .. }) => {}
                Some(other) => {
                    return Err(channel_error(format!(
                        "unexpected answer to the exec of `{command}`: {other:?}"
                    )));
                }
                None => {
                    return Err(channel_error(format!(
                        "the channel closed before `{command}` started"
                    )));
                }
            }
        }
        tracing::debug!(%host, command, "ssh tunnel: command started");
        Ok(TunnelStream {
            stream: channel.into_stream(),
            _slot: slot,
        })
    }
}
