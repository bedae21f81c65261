//! Byte streams to commands on an SSH host, for clients that speak their own protocol over a
//! command's stdin and stdout (the Docker backend reaches an `ssh://` engine through
//! `docker system dial-stdio`, as the docker CLI does).
//!
//! It owns one connection resolved and verified exactly like the backend's ([`crate::config`],
//! [`crate::known_hosts`]: an unknown or changed host key is refused, keys from ssh-agent or
//! key files, ProxyJump/ProxyCommand), re-established by the next [`Tunnel::open`] after it
//! drops. It does not interpret the bytes; the caller's protocol does.

use std::path::PathBuf;
use std::sync::Arc;

use russh::ChannelMsg;

use crate::config::Target;
use crate::conn::{AuthOptions, ResolveOptions, Session, connect_endpoint, resolve_endpoint};
use crate::{AgentSource, PassphraseHook, SshError};

/// A command's stdio over an exec channel: read its stdout, write its stdin (shutting down the
/// writer sends EOF).
pub type TunnelStream = russh::ChannelStream<russh::client::Msg>;

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
            .finish()
    }
}

/// One SSH connection that opens command streams on demand.
pub struct Tunnel {
    endpoint: crate::conn::Endpoint,
    auth: AuthOptions,
    current: tokio::sync::Mutex<Option<Arc<Session>>>,
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
        } = config;
        let target = Target::parse(&host)?;
        let options = ResolveOptions::new(ssh_config, identity, known_hosts);
        let endpoint = resolve_endpoint(&target, &options, true)?;
        Ok(Tunnel {
            endpoint,
            auth: AuthOptions { agent, passphrase },
            current: tokio::sync::Mutex::new(None),
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
    /// does) and return its stdio once the server accepted the exec. A cached connection that
    /// turns out dead is replaced once.
    pub async fn open(&self, command: &str) -> Result<TunnelStream, SshError> {
        let host = self.label();
        let channel_error = |reason: String| SshError::Channel {
            what: "an exec channel",
            host: host.clone(),
            reason,
        };
        let mut attempts = 0;
        let mut channel = loop {
            attempts += 1;
            let session = self.session().await?;
            match session.handle.channel_open_session().await {
                Ok(channel) => break channel,
                Err(error) if attempts < 2 => {
                    tracing::debug!(%host, %error, "ssh tunnel: channel open failed; reconnecting");
                    let mut current = self.current.lock().await;
                    if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &session)) {
                        *current = None;
                    }
                }
                Err(error) => return Err(channel_error(error.to_string())),
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
        Ok(channel.into_stream())
    }
}
