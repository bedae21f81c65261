//! The one multiplexed SSH connection per backend: resolving the endpoint (ssh_config,
//! ProxyJump chain), TCP with `TCP_NODELAY`, host key verification, authentication (ssh-agent,
//! key files, a passphrase hook), keepalives, the SFTP subsystem opened once per connection,
//! and reconnection: a dropped connection fails the calls in flight and is re-established by
//! the next call. Connection setup happens once, never per call.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::Channel;
use russh::client::{self, Handle};
use russh::keys::agent::AgentIdentity;
use russh::keys::agent::client::AgentClient;
use russh::keys::{PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};
use russh_sftp::client::RawSftpSession;

use crate::config::{self, Target, Tokens};
use crate::error::SshError;
use crate::known_hosts::{KnownHosts, alias_trust_command, trust_command};

/// Asks for the passphrase of an encrypted key file; `None` declines. Interactive front ends
/// (the CLI on a TTY) provide one; Cordon itself never prompts.
pub type PassphraseHook = Arc<dyn Fn(&Path) -> Option<String> + Send + Sync>;

/// Where to find ssh-agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AgentSource {
    /// `SSH_AUTH_SOCK` of this process, if set.
    #[default]
    Env,
    /// This socket.
    Socket(PathBuf),
    /// Do not use an agent.
    Disabled,
}

impl AgentSource {
    fn socket(&self) -> Option<PathBuf> {
        match self {
            AgentSource::Env => std::env::var_os("SSH_AUTH_SOCK")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            AgentSource::Socket(path) => Some(path.clone()),
            AgentSource::Disabled => None,
        }
    }
}

/// One hop: where to connect and how to authenticate.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    pub user: String,
    pub host: String,
    pub port: u16,
    /// The name recorded in known_hosts (`HostKeyAlias`, else the host name).
    pub key_host: String,
    /// Whether `key_host` is a `HostKeyAlias` (recorded without a port, whatever the port).
    pub key_alias: bool,
    pub identities: Vec<PathBuf>,
    /// Whether `identities` were named explicitly (a missing file is then an error).
    pub explicit_identity: Option<PathBuf>,
    pub identities_only: bool,
    /// `CertificateFile`s (expanded); each is offered with the identity whose key it certifies.
    pub certificates: Vec<PathBuf>,
    pub known_hosts: KnownHosts,
    pub jump: Option<Box<Endpoint>>,
    /// `ProxyCommand`, tokens expanded: the connection is its standard input and output.
    pub proxy_command: Option<String>,
}

impl Endpoint {
    /// `user@host:port`.
    pub fn label(&self) -> String {
        format!("{}@{}:{}", self.user, self.host, self.port)
    }
}

/// What [`resolve_endpoint`] needs besides the target.
#[derive(Clone, Debug)]
pub(crate) struct ResolveOptions {
    pub ssh_config: Option<PathBuf>,
    /// The system-wide config read after the user's; only when no config file was named
    /// explicitly (as `ssh -F` does).
    pub system_config: Option<PathBuf>,
    pub identity: Option<PathBuf>,
    pub known_hosts: Option<PathBuf>,
    pub home: Option<PathBuf>,
    pub local_user: String,
}

fn local_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "root".to_owned())
}

impl ResolveOptions {
    pub fn new(
        ssh_config: Option<PathBuf>,
        identity: Option<PathBuf>,
        known_hosts: Option<PathBuf>,
    ) -> Self {
        ResolveOptions {
            system_config: ssh_config
                .is_none()
                .then(|| PathBuf::from(SYSTEM_SSH_CONFIG)),
            ssh_config,
            identity,
            known_hosts,
            home: std::env::var_os("HOME").map(PathBuf::from),
            local_user: local_user(),
        }
    }
}

/// OpenSSH's system-wide client config.
pub(crate) const SYSTEM_SSH_CONFIG: &str = "/etc/ssh/ssh_config";

/// Resolve `target` (and its ProxyJump chain) through the ssh config.
pub(crate) fn resolve_endpoint(
    target: &Target,
    options: &ResolveOptions,
    allow_jump: bool,
) -> Result<Endpoint, SshError> {
    let home = options.home.as_deref();
    let config_path = options
        .ssh_config
        .clone()
        .or_else(|| home.map(|h| h.join(".ssh/config")));
    let settings = config::resolve_all(
        config_path.as_deref(),
        options.system_config.as_deref(),
        &target.host,
        home,
    )?;
    let host = settings
        .hostname
        .clone()
        .unwrap_or_else(|| target.host.clone());
    let user = target
        .user
        .clone()
        .or(settings.user.clone())
        .unwrap_or_else(|| options.local_user.clone());
    let port = target.port.or(settings.port).unwrap_or(22);
    let tokens = Tokens {
        home,
        local_user: &options.local_user,
        host: &host,
        remote_user: &user,
        port,
    };
    let mut identities: Vec<PathBuf> = Vec::new();
    if let Some(identity) = &options.identity {
        identities.push(identity.clone());
    }
    for raw in &settings.identity_files {
        let path = config::expand_tokens(raw, &tokens);
        if !identities.contains(&path) {
            identities.push(path);
        }
    }
    if identities.is_empty()
        && let Some(home) = home
    {
        for name in ["id_ed25519", "id_ecdsa", "id_rsa"] {
            identities.push(home.join(".ssh").join(name));
        }
    }
    let certificates = settings
        .certificate_files
        .iter()
        .map(|raw| config::expand_tokens(raw, &tokens))
        .collect();
    let known_files = match (&options.known_hosts, &settings.user_known_hosts) {
        (Some(explicit), _) => vec![explicit.clone()],
        (None, Some(files)) => files
            .iter()
            .map(|f| config::expand_tokens(f, &tokens))
            .collect(),
        (None, None) => {
            let mut files = Vec::new();
            if let Some(home) = home {
                files.push(home.join(".ssh/known_hosts"));
            }
            files.push(PathBuf::from("/etc/ssh/ssh_known_hosts"));
            files
        }
    };
    let mut jump = None;
    if allow_jump && let Some(chain) = settings.proxy_jump.as_ref().filter(|c| !c.is_empty()) {
        // `a,b`: connect to a, through it to b, through b to the target.
        for hop in chain {
            let mut endpoint = resolve_endpoint(hop, options, false)?;
            endpoint.jump = jump.take();
            jump = Some(Box::new(endpoint));
        }
    }
    let proxy_command = settings
        .proxy_command
        .as_deref()
        .filter(|command| !command.eq_ignore_ascii_case("none"))
        .map(|command| config::expand_proxy_command(command, &host, port, &user, &target.host));
    Ok(Endpoint {
        proxy_command,
        key_host: settings
            .host_key_alias
            .clone()
            .unwrap_or_else(|| host.clone()),
        key_alias: settings.host_key_alias.is_some(),
        user,
        host,
        port,
        identities,
        explicit_identity: options.identity.clone(),
        identities_only: settings.identities_only.unwrap_or(false),
        certificates,
        known_hosts: KnownHosts { files: known_files },
        jump,
    })
}

/// russh's client callbacks: host key verification.
pub(crate) struct ClientHandler {
    known_hosts: KnownHosts,
    key_host: String,
    key_alias: bool,
    /// Where the connection goes (the command to trust a new key fetches it there).
    host: String,
    port: u16,
    verdict: Arc<Mutex<Option<SshError>>>,
}

impl client::Handler for ClientHandler {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let result = match server_key {
            PublicKeyOrCertificate::PublicKey { key, .. } if self.key_alias => self
                .known_hosts
                .check_alias(&self.key_host, &self.host, self.port, key),
            PublicKeyOrCertificate::PublicKey { key, .. } => {
                self.known_hosts.check(&self.key_host, self.port, key)
            }
            PublicKeyOrCertificate::Certificate(_) => {
                let file = self
                    .known_hosts
                    .files
                    .first()
                    .cloned()
                    .unwrap_or_else(|| PathBuf::from("~/.ssh/known_hosts"));
                let (host_port, trust_command) = if self.key_alias {
                    (
                        self.key_host.clone(),
                        alias_trust_command(&self.key_host, &self.host, self.port, &file),
                    )
                } else {
                    (
                        crate::known_hosts::host_port_name(&self.key_host, self.port),
                        trust_command(&self.key_host, self.port, &file),
                    )
                };
                Err(SshError::UnsupportedHostCertificate {
                    host_port,
                    reason: "the server presented a host certificate".to_owned(),
                    trust_command,
                })
            }
        };
        match result {
            Ok(()) => Ok(true),
            Err(err) => {
                if let Ok(mut slot) = self.verdict.lock() {
                    *slot = Some(err);
                }
                Ok(false)
            }
        }
    }
}

/// Authentication inputs shared by every hop.
#[derive(Clone, Default)]
pub(crate) struct AuthOptions {
    pub agent: AgentSource,
    pub passphrase: Option<PassphraseHook>,
}

/// An authenticated SSH session, with the sessions it tunnels through.
pub(crate) struct Session {
    pub handle: Handle<ClientHandler>,
    _via: Option<Box<Session>>,
    /// The `ProxyCommand` process carrying the connection (killed when the session goes).
    _proxy: Option<tokio::process::Child>,
}

fn client_config() -> Arc<client::Config> {
    Arc::new(client::Config {
        keepalive_interval: Some(Duration::from_secs(10)),
        keepalive_max: 3,
        inactivity_timeout: None,
        nodelay: true,
        ..client::Config::default()
    })
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Connect, verify and authenticate one endpoint (recursively through its jump hosts).
pub(crate) fn connect_endpoint<'a>(
    endpoint: &'a Endpoint,
    auth: &'a AuthOptions,
) -> BoxFuture<'a, Result<Session, SshError>> {
    Box::pin(async move {
        let verdict = Arc::new(Mutex::new(None));
        let handler = ClientHandler {
            known_hosts: endpoint.known_hosts.clone(),
            key_host: endpoint.key_host.clone(),
            key_alias: endpoint.key_alias,
            host: endpoint.host.clone(),
            port: endpoint.port,
            verdict: verdict.clone(),
        };
        let config = client_config();
        let handshake_error = |e: russh::Error| {
            let stored = verdict.lock().ok().and_then(|mut slot| slot.take());
            stored.unwrap_or_else(|| SshError::Handshake {
                host: endpoint.label(),
                reason: e.to_string(),
            })
        };
        let mut proxy = None;
        let (handle, via) = match &endpoint.jump {
            None if endpoint.proxy_command.is_some() => {
                let command = endpoint.proxy_command.as_deref().unwrap_or_default();
                let (child, stream) = spawn_proxy_command(command)?;
                let child = proxy.insert(child);
                let handshake = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    client::connect_stream(config, stream, handler),
                )
                .await;
                // A failed handshake is usually the command's exit (its output closed): its
                // status is waited for briefly so the error can name it.
                let exited = if matches!(handshake, Ok(Ok(_))) {
                    String::new()
                } else {
                    match tokio::time::timeout(PROXY_EXIT_WAIT, child.wait()).await {
                        Ok(Ok(status)) => format!(", which exited with {status}"),
                        _ => ", which is still running".to_owned(),
                    }
                };
                let handle = match handshake {
                    Err(_) => {
                        return Err(SshError::Handshake {
                            host: endpoint.label(),
                            reason: format!("timed out through ProxyCommand `{command}`{exited}"),
                        });
                    }
                    Ok(Err(e)) => {
                        return Err(match handshake_error(e) {
                            SshError::Handshake { host, reason } => SshError::Handshake {
                                host,
                                reason: format!(
                                    "{reason} (through ProxyCommand `{command}`{exited})"
                                ),
                            },
                            other => other,
                        });
                    }
                    Ok(Ok(handle)) => handle,
                };
                (handle, None)
            }
            Some(jump) => {
                let via = connect_endpoint(jump, auth).await?;
                let channel = via
                    .handle
                    .channel_open_direct_tcpip(
                        endpoint.host.clone(),
                        u32::from(endpoint.port),
                        "127.0.0.1",
                        0,
                    )
                    .await
                    .map_err(|e| SshError::Jump {
                        jump: jump.label(),
                        target: format!("{}:{}", endpoint.host, endpoint.port),
                        reason: e.to_string(),
                    })?;
                let handle = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    client::connect_stream(config, channel.into_stream(), handler),
                )
                .await
                .map_err(|_| SshError::Handshake {
                    host: endpoint.label(),
                    reason: "timed out".to_owned(),
                })?
                .map_err(handshake_error)?;
                (handle, Some(Box::new(via)))
            }
            None => {
                let connect_error = |source| SshError::Connect {
                    host: endpoint.host.clone(),
                    port: endpoint.port,
                    source,
                };
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port)),
                )
                .await
                .map_err(|_| {
                    connect_error(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connection timed out",
                    ))
                })?
                .map_err(connect_error)?;
                // russh's own connect would leave Nagle on: ~40 ms per exec round trip.
                stream.set_nodelay(true).map_err(connect_error)?;
                let handle = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    client::connect_stream(config, stream, handler),
                )
                .await
                .map_err(|_| SshError::Handshake {
                    host: endpoint.label(),
                    reason: "timed out".to_owned(),
                })?
                .map_err(handshake_error)?;
                (handle, None)
            }
        };
        let mut session = Session {
            handle,
            _via: via,
            _proxy: proxy,
        };
        authenticate(&mut session.handle, endpoint, auth).await?;
        Ok(session)
    })
}

/// How long a failed handshake waits for the `ProxyCommand` to exit before the error is made.
const PROXY_EXIT_WAIT: Duration = Duration::from_secs(5);

/// Start `command` with `/bin/sh -c` (as OpenSSH runs a `ProxyCommand`): its standard input
/// and output are the connection, its standard error lines go to the log (bounded).
fn spawn_proxy_command(
    command: &str,
) -> Result<
    (
        tokio::process::Child,
        tokio::io::Join<tokio::process::ChildStdout, tokio::process::ChildStdin>,
    ),
    SshError,
> {
    let failed = |reason: String| SshError::ProxyCommand {
        command: command.to_owned(),
        reason,
    };
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(failed("its standard streams could not be opened".into()));
    };
    tracing::debug!(command, "ssh: connecting through a ProxyCommand");
    tokio::spawn(async move {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        // At most 64 lines of at most 4 KiB are logged; the rest is read and dropped so the
        // command never blocks on a full pipe.
        let mut lines = tokio::io::BufReader::new(stderr);
        let mut line = Vec::new();
        let mut logged = 0;
        loop {
            line.clear();
            match (&mut lines).take(4096).read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if logged < 64 {
                        logged += 1;
                        let text = String::from_utf8_lossy(&line);
                        tracing::warn!(stderr = %text.trim_end(), "ssh: ProxyCommand");
                    }
                }
            }
        }
    });
    Ok((child, tokio::io::join(stdout, stdin)))
}

/// The certificates that may go with the identity at `path`: every `CertificateFile`, then
/// `<path>-cert.pub` as OpenSSH looks for it. Unreadable or malformed ones are logged and left
/// out; which key each certifies is checked against the loaded key.
fn certificates_for(endpoint: &Endpoint, path: &Path) -> Vec<(PathBuf, russh::keys::Certificate)> {
    let mut beside = path.as_os_str().to_owned();
    beside.push("-cert.pub");
    let beside = PathBuf::from(beside);
    let named = endpoint.certificates.iter().cloned();
    let implicit = (!endpoint.certificates.contains(&beside) && beside.exists()).then_some(beside);
    named
        .chain(implicit)
        .filter_map(|cert_path| {
            match config::read_ssh_file(&cert_path) {
                Ok(Some(text)) => match russh::keys::Certificate::from_openssh(text.trim()) {
                    Ok(cert) => return Some((cert_path, cert)),
                    Err(error) => tracing::warn!(
                        path = %cert_path.display(),
                        %error,
                        "ssh: a certificate file could not be parsed; it is not offered"
                    ),
                },
                Ok(None) => tracing::warn!(
                    path = %cert_path.display(),
                    "ssh: a CertificateFile does not exist; it is not offered"
                ),
                Err(error) => tracing::warn!(
                    path = %cert_path.display(),
                    %error,
                    "ssh: a certificate file could not be read; it is not offered"
                ),
            }
            None
        })
        .collect()
}

fn public_key_of(path: &Path) -> Option<PublicKey> {
    let mut pub_path = path.as_os_str().to_owned();
    pub_path.push(".pub");
    russh::keys::load_public_key(PathBuf::from(pub_path)).ok()
}

async fn authenticate(
    handle: &mut Handle<ClientHandler>,
    endpoint: &Endpoint,
    auth: &AuthOptions,
) -> Result<(), SshError> {
    let user = endpoint.user.clone();
    let mut tried: Vec<String> = Vec::new();
    let mut encrypted: Option<SshError> = None;
    let wanted: Vec<PublicKey> = endpoint
        .identities
        .iter()
        .filter_map(|p| public_key_of(p))
        .collect();
    let mut agent_keys: Vec<PublicKey> = Vec::new();

    if let Some(socket) = auth.agent.socket() {
        match AgentClient::connect_uds(&socket).await {
            Ok(mut agent) => {
                let identities = agent
                    .request_identities()
                    .await
                    .map_err(|e| SshError::Agent {
                        socket: socket.clone(),
                        reason: e.to_string(),
                    })?;
                for identity in identities {
                    let key = match identity {
                        AgentIdentity::PublicKey { key, .. } => key,
                        // Certificates held by the agent are not offered.
                        AgentIdentity::Certificate { .. } => continue,
                    };
                    if endpoint.identities_only
                        && !wanted.iter().any(|w| w.key_data() == key.key_data())
                    {
                        continue;
                    }
                    let hash = if key.algorithm().is_rsa() {
                        handle
                            .best_supported_rsa_hash()
                            .await
                            .ok()
                            .flatten()
                            .flatten()
                    } else {
                        None
                    };
                    tried.push(format!(
                        "agent key {}",
                        crate::known_hosts::fingerprint(&key)
                    ));
                    agent_keys.push(key.clone());
                    match handle
                        .authenticate_publickey_with(user.clone(), key, hash, &mut agent)
                        .await
                    {
                        Ok(result) if result.success() => return Ok(()),
                        Ok(_) => {}
                        Err(e) => tried.push(format!("(agent signing failed: {e})")),
                    }
                }
            }
            Err(e) => {
                if matches!(auth.agent, AgentSource::Socket(_)) {
                    return Err(SshError::Agent {
                        socket,
                        reason: e.to_string(),
                    });
                }
                tried.push(format!(
                    "ssh-agent at {} (unreachable: {e})",
                    socket.display()
                ));
            }
        }
    }

    for path in &endpoint.identities {
        if !path.exists() {
            if endpoint.explicit_identity.as_ref() == Some(path) {
                return Err(SshError::LoadKey {
                    path: path.clone(),
                    reason: "no such file".to_owned(),
                });
            }
            continue;
        }
        let certificates = certificates_for(endpoint, path);
        // The agent already offered this key (a certificate for it still needs the key file).
        if certificates.is_empty()
            && let Some(public) = public_key_of(path)
            && agent_keys.iter().any(|k| k.key_data() == public.key_data())
        {
            continue;
        }
        let key = match russh::keys::load_secret_key(path, None) {
            Ok(key) => key,
            Err(russh::keys::Error::KeyIsEncrypted) => {
                let passphrase = auth.passphrase.as_ref().and_then(|hook| hook(path));
                match passphrase {
                    Some(pass) => russh::keys::load_secret_key(path, Some(&pass)).map_err(|e| {
                        SshError::LoadKey {
                            path: path.clone(),
                            reason: format!("wrong passphrase or unreadable key ({e})"),
                        }
                    })?,
                    None => {
                        tried.push(format!("{} (encrypted)", path.display()));
                        encrypted.get_or_insert(SshError::KeyEncrypted { path: path.clone() });
                        continue;
                    }
                }
            }
            Err(e) => {
                if endpoint.explicit_identity.as_ref() == Some(path) {
                    return Err(SshError::LoadKey {
                        path: path.clone(),
                        reason: e.to_string(),
                    });
                }
                tried.push(format!("{} (unreadable: {e})", path.display()));
                continue;
            }
        };
        let hash = if key.algorithm().is_rsa() {
            handle
                .best_supported_rsa_hash()
                .await
                .ok()
                .flatten()
                .flatten()
        } else {
            None
        };
        let key = Arc::new(key);
        // OpenSSH offers a key's certificate first, then the key itself.
        for (cert_path, cert) in certificates {
            if cert.public_key() != key.public_key().key_data() {
                continue;
            }
            tried.push(format!(
                "{} with certificate {}",
                path.display(),
                cert_path.display()
            ));
            let result = handle
                .authenticate_openssh_cert(user.clone(), key.clone(), cert)
                .await
                .map_err(|e| SshError::Handshake {
                    host: endpoint.label(),
                    reason: e.to_string(),
                })?;
            if result.success() {
                return Ok(());
            }
        }
        tried.push(path.display().to_string());
        let result = handle
            .authenticate_publickey(user.clone(), PrivateKeyWithHashAlg::new(key, hash))
            .await
            .map_err(|e| SshError::Handshake {
                host: endpoint.label(),
                reason: e.to_string(),
            })?;
        if result.success() {
            return Ok(());
        }
    }
    if let Some(err) = encrypted {
        return Err(err);
    }
    Err(SshError::AuthFailed {
        user,
        host: format!("{}:{}", endpoint.host, endpoint.port),
        tried: if tried.is_empty() {
            "no keys found".to_owned()
        } else {
            tried.join(", ")
        },
    })
}

/// SFTP server extensions the file operations use.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SftpExtensions {
    /// `posix-rename@openssh.com`: rename over an existing file atomically.
    pub posix_rename: bool,
    /// `statvfs@openssh.com`: free space of a file system (tells a full disk from other
    /// write failures).
    pub statvfs: bool,
}

/// One established connection: the session plus its SFTP subsystem.
pub(crate) struct Live {
    pub session: Session,
    pub sftp: RawSftpSession,
    pub extensions: SftpExtensions,
    pub generation: u64,
}

impl Live {
    /// Whether the transport is gone.
    pub fn is_closed(&self) -> bool {
        self.session.handle.is_closed()
    }
}

const SFTP_REQUEST_TIMEOUT_SECS: u64 = 60;

async fn open_sftp(
    session: &Session,
    label: &str,
) -> Result<(RawSftpSession, SftpExtensions), SshError> {
    let channel_error = |reason: String| SshError::Channel {
        what: "the SFTP subsystem",
        host: label.to_owned(),
        reason,
    };
    let channel = session
        .handle
        .channel_open_session()
        .await
        .map_err(|e| channel_error(e.to_string()))?;
    channel
        .request_subsystem(true, "sftp")
        .await
        .map_err(|e| channel_error(e.to_string()))?;
    let sftp = RawSftpSession::new(channel.into_stream());
    sftp.set_timeout(SFTP_REQUEST_TIMEOUT_SECS);
    let version = sftp
        .init()
        .await
        .map_err(|e| channel_error(format!("{e} (is `Subsystem sftp` enabled in sshd_config?)")))?;
    let has = |name: &str| version.extensions.get(name).is_some_and(|v| v == "1");
    Ok((
        sftp,
        SftpExtensions {
            posix_rename: has("posix-rename@openssh.com"),
            statvfs: version.extensions.contains_key("statvfs@openssh.com"),
        },
    ))
}

/// The connection of one backend, re-established on demand.
pub(crate) struct Pool {
    endpoint: Endpoint,
    auth: AuthOptions,
    current: tokio::sync::Mutex<Option<Arc<Live>>>,
    generation: AtomicU64,
}

/// What went wrong getting a channel.
#[derive(Debug)]
pub(crate) struct ChannelFailure(pub String);

impl Pool {
    pub fn new(endpoint: Endpoint, auth: AuthOptions) -> Self {
        Pool {
            endpoint,
            auth,
            current: tokio::sync::Mutex::new(None),
            generation: AtomicU64::new(0),
        }
    }

    /// `user@host:port` of the target.
    pub fn label(&self) -> String {
        self.endpoint.label()
    }

    /// The target endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The live connection, connecting (once, for all concurrent callers) if there is none or
    /// the last one dropped.
    pub async fn live(&self) -> Result<Arc<Live>, SshError> {
        let mut current = self.current.lock().await;
        if let Some(live) = current.as_ref()
            && !live.is_closed()
        {
            return Ok(live.clone());
        }
        let reconnect = current.take().is_some();
        let host = self.endpoint.label();
        tracing::debug!(%host, reconnect, "ssh: connecting");
        let session = connect_endpoint(&self.endpoint, &self.auth)
            .await
            .inspect_err(|error| tracing::warn!(%host, reconnect, %error, "ssh: connect failed"))?;
        let (sftp, extensions) = open_sftp(&session, &host)
            .await
            .inspect_err(|error| tracing::warn!(%host, %error, "ssh: sftp subsystem failed"))?;
        let live = Arc::new(Live {
            session,
            sftp,
            extensions,
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
        });
        match reconnect {
            true => {
                tracing::warn!(%host, generation = live.generation, "ssh: reconnected after the connection dropped")
            }
            false => tracing::info!(%host, "ssh: connected"),
        }
        *current = Some(live.clone());
        Ok(live)
    }

    /// Forget `live` if it is still the current connection (its transport failed).
    pub async fn invalidate(&self, live: &Live) {
        let mut current = self.current.lock().await;
        if current
            .as_ref()
            .is_some_and(|c| c.generation == live.generation)
        {
            *current = None;
        }
    }

    /// Open a session channel. With `reconnect`, a cached connection that turns out dead
    /// (nothing was started on it yet) is replaced once; without, a refused channel is only an
    /// error and the connection is kept (a server limiting the channels per connection refuses
    /// one while others are open, and a new connection would authenticate again).
    pub async fn open_channel(
        &self,
        reconnect: bool,
    ) -> Result<(Arc<Live>, Channel<client::Msg>), ChannelFailure> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let live = self
                .live()
                .await
                .map_err(|e| ChannelFailure(e.to_string()))?;
            match live.session.handle.channel_open_session().await {
                Ok(channel) => return Ok((live, channel)),
                Err(e) if !reconnect => {
                    return Err(ChannelFailure(format!(
                        "failed to open an exec channel on {}: {e}",
                        self.label()
                    )));
                }
                Err(e) => {
                    tracing::debug!(host = %self.label(), attempts, error = %e, "ssh: channel open failed; dropping the connection");
                    self.invalidate(&live).await;
                    if attempts >= 2 {
                        return Err(ChannelFailure(format!(
                            "failed to open an exec channel on {}: {e}",
                            self.label()
                        )));
                    }
                }
            }
        }
    }

    /// Close the connection (idempotent).
    pub async fn shutdown(&self) {
        let live = self.current.lock().await.take();
        if let Some(live) = live {
            // Best effort on the way out: the connection is dropped right after, which ends
            // the SFTP subsystem and the session on the server in any case.
            if let Err(error) = live.sftp.close_session() {
                tracing::debug!(%error, "ssh: failed to close the sftp session");
            }
            tracing::info!(host = %self.label(), "ssh: disconnecting");
            if let Err(error) = live
                .session
                .handle
                .disconnect(russh::Disconnect::ByApplication, "cordon shutdown", "en")
                .await
            {
                // The connection is dropped right after either way.
                tracing::debug!(%error, "ssh: the disconnect message was not sent");
            }
        }
    }
}
