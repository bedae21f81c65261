//! [`SshError`]: why an SSH backend could not be set up or a connection could not be made.
//! Per-call failures use the trait errors ([`FsError`](cordon_ops::FsError),
//! [`ExecError`](cordon_ops::ExecError), …) and carry these messages as their reason.

use std::path::PathBuf;

/// Why connecting, authenticating or preparing the remote side failed. Messages say what
/// failed and, where the operator can fix it, how.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// The `--host` value does not parse.
    #[error("failed to parse host `{host}`: {reason}")]
    InvalidHost {
        /// The value given.
        host: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An ssh_config file could not be read.
    #[error("failed to read ssh config {path}: {source}")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An ssh_config file has a line this parser cannot accept.
    #[error("failed to parse ssh config {path} line {line}: {reason}")]
    ParseConfig {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A known_hosts file exists but could not be read.
    #[error("failed to read known_hosts file {path}: {source}")]
    ReadKnownHosts {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The server's host key is in no known_hosts file: never trusted silently.
    #[error(
        "failed to verify host key of {host_port}: the host is not in {known_hosts} \
         (server offered {algorithm} key {fingerprint}). Check the fingerprint with the host's \
         administrator; if it is right, trust the host with: {trust_command}"
    )]
    UnknownHostKey {
        /// `host` or `[host]:port`.
        host_port: String,
        /// Key algorithm, e.g. `ssh-ed25519`.
        algorithm: String,
        /// `SHA256:…` fingerprint of the offered key.
        fingerprint: String,
        /// The known_hosts files searched.
        known_hosts: String,
        /// The `ssh-keyscan … >> FILE` command that records the key.
        trust_command: String,
    },
    /// The server's host key differs from the recorded one: refused loudly.
    #[error(
        "failed to verify host key of {host_port}: REMOTE HOST IDENTIFICATION HAS CHANGED. \
         The server offered {algorithm} key {fingerprint}, but {known_hosts} records {recorded}. \
         Someone could be intercepting the connection (man in the middle), or the host key was \
         replaced. If the change is legitimate, remove the old entry with \
         `ssh-keygen -R {host_port} -f FILE` and add the new key"
    )]
    ChangedHostKey {
        /// `host` or `[host]:port`.
        host_port: String,
        /// Algorithm of the offered key.
        algorithm: String,
        /// Fingerprint of the offered key.
        fingerprint: String,
        /// The recorded keys, `ALGORITHM SHA256:… (FILE:LINE)`, comma-separated.
        recorded: String,
        /// The known_hosts files searched.
        known_hosts: String,
    },
    /// The server's host key is marked `@revoked`.
    #[error(
        "failed to verify host key of {host_port}: its {algorithm} key {fingerprint} is marked \
         @revoked in {location}; refusing to connect"
    )]
    RevokedHostKey {
        /// `host` or `[host]:port`.
        host_port: String,
        /// Algorithm.
        algorithm: String,
        /// Fingerprint.
        fingerprint: String,
        /// `FILE:LINE` of the revocation.
        location: String,
    },
    /// Host certificates and `@cert-authority` entries are not supported.
    #[error(
        "failed to verify host key of {host_port}: {reason}; host certificates \
         (@cert-authority) are not supported, record the host's plain key instead with: \
         {trust_command}"
    )]
    UnsupportedHostCertificate {
        /// `host` or `[host]:port`.
        host_port: String,
        /// What was found.
        reason: String,
        /// The `ssh-keyscan` command.
        trust_command: String,
    },
    /// TCP connection failed.
    #[error("failed to connect to {host}:{port}: {source}")]
    Connect {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// SSH handshake or protocol failure.
    #[error("failed to establish an SSH session with {host}: {reason}")]
    Handshake {
        /// `user@host:port`.
        host: String,
        /// What russh reported.
        reason: String,
    },
    /// A key file is encrypted and no passphrase is available.
    #[error(
        "failed to load private key {path}: it is encrypted and no passphrase was provided; \
         add it to ssh-agent (`ssh-add {path}`) or run Cordon where it can ask for the passphrase"
    )]
    KeyEncrypted {
        /// The key file.
        path: PathBuf,
    },
    /// A key file could not be read or parsed.
    #[error("failed to load private key {path}: {reason}")]
    LoadKey {
        /// The key file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// Talking to ssh-agent failed.
    #[error("failed to use ssh-agent at {socket}: {reason}")]
    Agent {
        /// The agent socket.
        socket: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// No key was accepted.
    #[error(
        "failed to authenticate as {user} on {host}: no key was accepted (tried: {tried}); \
         pass --identity FILE, add the key to ssh-agent, or check the server's authorized_keys"
    )]
    AuthFailed {
        /// Remote user.
        user: String,
        /// `host:port`.
        host: String,
        /// What was tried.
        tried: String,
    },
    /// The `ProxyCommand` of the ssh config could not be started.
    #[error("failed to start the ProxyCommand `{command}`: {reason}")]
    ProxyCommand {
        /// The command line (tokens expanded).
        command: String,
        /// What went wrong.
        reason: String,
    },
    /// Opening a jump-host tunnel (ProxyJump) failed.
    #[error("failed to open a tunnel through jump host {jump} to {target}: {reason}")]
    Jump {
        /// The jump host.
        jump: String,
        /// The target `host:port`.
        target: String,
        /// What went wrong.
        reason: String,
    },
    /// A channel or the SFTP subsystem could not be opened.
    #[error("failed to open {what} on {host}: {reason}")]
    Channel {
        /// "an exec channel", "the SFTP subsystem", …
        what: &'static str,
        /// `user@host:port`.
        host: String,
        /// What went wrong.
        reason: String,
    },
    /// The remote root does not exist or is not a directory.
    #[error("failed to use remote root {path}: {reason}")]
    RemoteRoot {
        /// The remote path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The remote probe (uid, rg, spill directory) failed.
    #[error("failed to prepare the remote host {host}: {reason}")]
    Probe {
        /// `user@host:port`.
        host: String,
        /// What went wrong.
        reason: String,
    },
    /// A protected or denied glob of the sandbox spec does not parse.
    #[error(transparent)]
    Rules(#[from] cordon_remote::files::RuleError),
}
