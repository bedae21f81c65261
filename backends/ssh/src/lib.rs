//! `cordon-backend-ssh`: Cordon's SSH backend (russh). It runs the agent's tool calls on a
//! remote host over one multiplexed SSH connection:
//!
//! - **connection** ([`conn`]): `[user@]host[:port]` resolved through `~/.ssh/config`
//!   ([`config`]: HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump,
//!   UserKnownHostsFile, HostKeyAlias, Include, Host/Match blocks); host keys verified against
//!   known_hosts ([`known_hosts`]: unknown → refused with the `ssh-keyscan` command to trust it,
//!   changed → refused loudly, `@revoked` → refused; never trust on first use); keys from
//!   ssh-agent or key files (an encrypted key without a passphrase hook is a clear error);
//!   `TCP_NODELAY`, keepalives, reconnection on the next call after a drop.
//! - **the helper** ([`helper`]): at connect, `cordon-helper serve` for the host's architecture
//!   is started over one exec channel (uploaded once per host and version into a
//!   content-addressed cache the remote user alone can write, its sha256 checked by the exec
//!   that starts it) and every call goes through it: the local backend on the far side, so
//!   files are confined with `openat2`, grep/find are the in-process ripgrep libraries, and
//!   commands run under the policy's sandbox enforced by the host's kernel. The cache is denied
//!   to the session. A helper that died is replaced for the next call.
//!
//! Without a helper that runs (no binary for the architecture, an unsafe or noexec cache, a
//! failed upload or start), the backend falls back to what needs nothing on the host:
//!
//! - **files** over SFTP (canonical paths from `realpath`, confinement to the remote root,
//!   atomic writes with `posix-rename@openssh.com`, modes kept).
//! - **search** with `rg --json` on the host, or a POSIX fallback, giving the local backend's
//!   data.
//! - **commands** fail closed: `exec` refuses with `ExecError::Sandbox { layer:
//!   "remote-sandbox", .. }` naming why the helper does not run, unless `spec.allow_degraded`
//!   is set (`--allow-degraded`). Then they run through the connection's workers (a
//!   `cordon_remote::runner::Runner` over the SSH transport of module `remote`): exec channels
//!   running the `cordon-remote` worker, started once (with an explicit environment, `env -i`,
//!   so the login shell's rc files never corrupt results) and reused for one command after
//!   another; each command in its own process group and session, the whole tree killed on
//!   timeout/cancel, nothing outliving the call; but with the remote account's rights, its
//!   network and no limits, which [`Backend::missing_layers`] reports in every result.
//!
//! Latency: sshd runs every exec channel through the account's login shell, which reads its rc
//! files (`.bashrc` for bash) before Cordon's command line starts. Their output is discarded;
//! their run time is paid once per helper or worker (not per command).
#![warn(missing_docs)]

pub mod config;
mod conn;
mod error;
pub mod known_hosts;

mod bash;
mod files;
pub mod helper;
mod remote;
mod search;
mod sweep;
pub mod tunnel;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use cordon_core::sandbox::{NetworkMode, RootAccess, SandboxSpec};
use cordon_ops::BackendId;
use cordon_remote::files::{PathRules, Root};
use sha2::{Digest, Sha256};

pub use crate::conn::{AgentSource, PassphraseHook};
pub use crate::error::SshError;

use crate::config::Target;
use crate::conn::{AuthOptions, Pool, ResolveOptions, resolve_endpoint};
use crate::remote::SshTransport;
use cordon_remote::runner::Runner;

/// How to reach the remote host and what the tools may touch there.
#[derive(Clone)]
pub struct SshConfig {
    /// `[user@]host[:port]`, or an alias from the ssh config file.
    pub host: String,
    /// A private key file to try first (`--identity`).
    pub identity: Option<PathBuf>,
    /// The known_hosts file (default: the config's `UserKnownHostsFile`, else
    /// `~/.ssh/known_hosts` and `/etc/ssh/ssh_known_hosts`).
    pub known_hosts: Option<PathBuf>,
    /// The ssh config file (default `~/.ssh/config`; a missing file is no config).
    pub ssh_config: Option<PathBuf>,
    /// The workspace root on the remote host (absolute, `~/…`, or relative to the home).
    pub remote_root: PathBuf,
    /// The sandbox spec (roots, protected and denied globs, environment). [`SshConfig::new`]
    /// protects `.git/**`.
    pub spec: SandboxSpec,
    /// Where ssh-agent is.
    pub agent: AgentSource,
    /// Asks for the passphrase of an encrypted key; `None`: encrypted keys are an error
    /// unless ssh-agent holds them.
    pub passphrase: Option<PassphraseHook>,
    /// Search with the POSIX fallback even when the host has `rg` (tests, odd `rg` builds).
    pub force_search_fallback: bool,
    /// The remote directory for Cordon's per-user state (the spill files of every root under
    /// `spill/`); `None` is `/tmp/cordon-<uid>`. Absolute; each level Cordon creates is 0700,
    /// and it, `spill/` and the root's directory must be real directories owned by the remote
    /// user; every directory above it must be owned by root or the remote user and writable by
    /// nobody else unless sticky (`/tmp`).
    pub state_dir: Option<PathBuf>,
    /// The `cordon-helper` binary to run on the remote host (`--ssh-helper`); `None`: the one
    /// next to the current executable, `cordon-helper-<arch>` for the host's architecture
    /// first, then `cordon-helper`. It must be a 64-bit ELF executable for the host's
    /// architecture (`uname -m`).
    pub helper: Option<PathBuf>,
    /// Filtered network mode: who the helper's egress proxy asks, through this connection,
    /// about destinations an ask entry (`[network] ask`) matches; `None`: nobody, they are
    /// refused.
    pub egress_asker: Option<Arc<dyn cordon_helper::EgressApprover>>,
}

impl std::fmt::Debug for SshConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshConfig")
            .field("host", &self.host)
            .field("identity", &self.identity)
            .field("known_hosts", &self.known_hosts)
            .field("ssh_config", &self.ssh_config)
            .field("remote_root", &self.remote_root)
            .field("agent", &self.agent)
            .field("state_dir", &self.state_dir)
            .field("helper", &self.helper)
            .field("passphrase", &self.passphrase.as_ref().map(|_| "<hook>"))
            .field(
                "egress_asker",
                &self.egress_asker.as_ref().map(|_| "<approver>"),
            )
            .finish_non_exhaustive()
    }
}

impl SshConfig {
    /// A config for `host` and `remote_root` with every other field at its default (agent
    /// from `SSH_AUTH_SOCK`, `~/.ssh/config`, `~/.ssh/known_hosts`, `.git/**` protected).
    pub fn new(host: impl Into<String>, remote_root: impl Into<PathBuf>) -> Self {
        SshConfig {
            host: host.into(),
            identity: None,
            known_hosts: None,
            ssh_config: None,
            remote_root: remote_root.into(),
            spec: SandboxSpec {
                protected: vec![".git/**".to_owned()],
                ..SandboxSpec::default()
            },
            agent: AgentSource::Env,
            passphrase: None,
            force_search_fallback: false,
            state_dir: None,
            helper: None,
            egress_asker: None,
        }
    }
}

/// Facts about the remote account learned once at connect.
#[derive(Clone, Debug)]
pub(crate) struct RemoteIdentity {
    pub uid: u32,
    pub gids: Vec<u32>,
    pub home: Option<PathBuf>,
    pub has_rg: bool,
    /// `uname -m`.
    pub arch: String,
}

/// The shared state behind every operation set.
pub(crate) struct Inner {
    pub id: BackendId,
    pub pool: Arc<Pool>,
    pub root: PathBuf,
    pub spill_dir: PathBuf,
    pub rules: PathRules,
    pub spec: SandboxSpec,
    pub identity: RemoteIdentity,
    pub force_fallback: bool,
    pub runner: Arc<Runner<SshTransport>>,
    /// The configured helper binary ([`SshConfig::helper`]).
    pub helper_binary: Option<PathBuf>,
    /// The configured state directory, as the start script takes it.
    pub state_dir: Option<String>,
    /// Why the helper does not run on the host (commands are then refused unless the spec
    /// allows a degraded sandbox); `None` when it runs.
    pub helper_refusal: Option<String>,
    this: Weak<Inner>,
}

impl Inner {
    fn this(&self) -> Arc<Inner> {
        // `Inner` only ever lives in the `Arc` built by `SshBackend::connect`.
        self.this
            .upgrade()
            .unwrap_or_else(|| unreachable!("Inner outlived its Arc"))
    }
}

/// The SSH backend: one connection; with the helper running on the host every operation goes
/// through it, else SFTP files, remote search and (with a degraded sandbox) shell workers.
pub struct SshBackend {
    inner: Arc<Inner>,
    /// The helper session, when the helper runs on the host.
    helper: Option<cordon_helper::HelperBackend>,
    /// Which helper was started, for reports.
    helper_report: Option<helper::HelperReport>,
}

impl std::fmt::Debug for SshBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshBackend")
            .field("id", &self.inner.id)
            .finish_non_exhaustive()
    }
}

/// The probe run once at connect: account facts, `rg`, and the per-root spill directory
/// (`<state>/spill/<hash of the root>`, `<state>` being `$2` or `/tmp/cordon-<uid>`, each level
/// 0700, owned by us, not a symlink). Prints NUL-separated `key value` pairs. The spill sweep
/// follows over SFTP.
const PROBE_SCRIPT: &str = r#"
hash=$1
uid=$(id -u) || exit 1
base=${2:-/tmp/cordon-$uid}
printf 'uid\0%s\0' "$uid"
printf 'gids\0%s\0' "$(id -G)"
printf 'home\0%s\0' "$HOME"
if command -v rg >/dev/null 2>&1; then r=1; else r=0; fi
printf 'rg\0%s\0' "$r"
printf 'arch\0%s\0' "$(uname -m)"
umask 077
# Above the state directory (canonical): owned by root or us, writable by nobody else unless
# sticky, or another user could swap the spill chain (and read what commands printed).
mkdir -p "$base" 2>/dev/null
if canon=$(cd "$base" 2>/dev/null && pwd -P); then
    p=$canon
    while [ "$p" != / ]; do
        p=${p%/*}
        [ -n "$p" ] || p=/
        set -- $(ls -ldn -- "$p")
        case $3 in
            0|"$uid") ;;
            *) printf 'above\0%s is owned by uid %s, not by root or the remote user (%s)\0' "$p" "$3" "$uid"; exit 0 ;;
        esac
        case $1 in
            ?????????[tT]*) ;;
            ?????w*|????????w*) printf 'above\0%s is writable by its group or by others and not sticky (mode %s)\0' "$p" "$1"; exit 0 ;;
        esac
    done
fi
for d in "$base" "$base/spill" "$base/spill/$hash"; do
    mkdir -p "$d" 2>/dev/null
    if [ -L "$d" ] || [ ! -d "$d" ] || [ ! -O "$d" ]; then
        printf 'unsafe\0%s\0' "$d"
        exit 0
    fi
    chmod 700 "$d"
done
d="$base/spill/$hash"
printf 'spill\0%s\0' "$(cd "$d" && pwd -P)"
printf 'now\0%s\0' "$(date +%s)"
"#;

fn hash16(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_probe(bytes: &[u8]) -> Vec<(String, String)> {
    let fields: Vec<String> = bytes
        .split(|b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    fields
        .chunks(2)
        .filter(|pair| pair.len() == 2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect()
}

impl SshBackend {
    /// Connect, verify the host, authenticate, open SFTP, check the remote root and prepare
    /// the spill directory. Nothing is trusted on first use.
    pub async fn connect(config: SshConfig) -> Result<SshBackend, SshError> {
        let SshConfig {
            host,
            identity,
            known_hosts,
            ssh_config,
            remote_root,
            spec,
            agent,
            passphrase,
            force_search_fallback,
            state_dir,
            helper: helper_path,
            egress_asker,
        } = config;
        let target = Target::parse(&host)?;
        let options = ResolveOptions::new(ssh_config, identity, known_hosts);
        let endpoint = resolve_endpoint(&target, &options, true)?;
        let pool = Arc::new(Pool::new(endpoint, AuthOptions { agent, passphrase }));
        let label = pool.label();
        let probe_error = |reason: String| SshError::Probe {
            host: label.clone(),
            reason,
        };
        let state_arg = match &state_dir {
            None => String::new(),
            Some(dir) => match dir.to_str() {
                Some(text) if dir.is_absolute() => text.to_owned(),
                _ => {
                    return Err(probe_error(format!(
                        "the state directory {} is not an absolute UTF-8 path",
                        dir.display()
                    )));
                }
            },
        };
        let live = pool.live().await?;

        // The remote root, canonical.
        let root_text = remote_root.to_string_lossy().into_owned();
        let root_request = match root_text.as_str() {
            "~" => ".".to_owned(),
            t => t.strip_prefix("~/").unwrap_or(t).to_owned(),
        };
        let root_error = |reason: String| SshError::RemoteRoot {
            path: remote_root.clone(),
            reason,
        };
        let root = live
            .sftp
            .realpath(root_request)
            .await
            .map_err(|e| root_error(e.to_string()))?
            .files
            .first()
            .map(|f| PathBuf::from(&f.filename))
            .ok_or_else(|| root_error("the SFTP server returned no path".into()))?;
        let root_text = root.to_string_lossy().into_owned();
        let attrs = live
            .sftp
            .stat(root_text.clone())
            .await
            .map_err(|e| root_error(format!("{e} (does it exist?)")))?;
        if !attrs.attrs.is_dir() {
            return Err(root_error("not a directory".into()));
        }

        // Probe: account, rg, spill directory.
        let argv = cordon_remote::sh_argv(
            PROBE_SCRIPT,
            "cordon-probe",
            [hash16(&root_text), state_arg.clone()],
        );
        let mut probe = remote::RemoteExec::start(&pool, &argv)
            .await
            .map_err(probe_error)?;
        // The helper's start (the cache's checks, the hash, the exec, the session in it) needs
        // nothing from the probe but the machine: it runs beside the probe, on a channel of its
        // own, for the machine this process runs on, and again after the probe when the host's
        // differs or when this start failed (a server allowing only two sessions per
        // connection refuses its channel while the SFTP channel and the probe hold theirs).
        let early = EarlyStart::spawn(HelperSetup {
            pool: Arc::clone(&pool),
            configured: helper_path.clone(),
            arch: std::env::consts::ARCH.to_owned(),
            state_dir: (!state_arg.is_empty()).then(|| state_arg.clone()),
            root: root.clone(),
            spec: spec.clone(),
            asker: egress_asker.clone(),
            reconnect: false,
        });
        let out = cordon_remote::transport::collect(
            &mut probe,
            None,
            cordon_remote::transport::StdinEnd::AfterInput,
        )
        .await
        .map_err(probe_error)?;
        drop(probe);
        let pairs = parse_probe(&out.stdout);
        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        if let Some(reason) = get("above") {
            tracing::warn!(host = %label, %reason, "ssh: refused a state directory another user could swap");
            return Err(probe_error(format!(
                "the state directory is unsafe: {reason}, so another user could replace it; \
                 choose a state directory whose parents only root and the remote user can \
                 write"
            )));
        }
        if let Some(dir) = get("unsafe") {
            return Err(probe_error(format!(
                "the spill directory {dir} is a symlink, not a directory, or not owned by the \
                 remote user; remove it and connect again"
            )));
        }
        let uid = get("uid").and_then(|u| u.parse().ok()).ok_or_else(|| {
            probe_error(format!(
                "the probe script gave no uid (stderr: {})",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })?;
        let gids = get("gids")
            .map(|g| {
                g.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let home = get("home")
            .filter(|h| h.starts_with('/'))
            .map(PathBuf::from);
        let spill_dir = get("spill")
            .filter(|s| s.starts_with('/'))
            .map(PathBuf::from)
            .ok_or_else(|| probe_error("the spill directory could not be created".into()))?;
        if let (Some(own), Some(parent)) = (
            spill_dir.to_str(),
            spill_dir.parent().and_then(|p| p.to_str()),
        ) {
            // The remote's clock judges the remote's modification times.
            let now = get("now")
                .and_then(|n| n.parse::<u64>().ok())
                .map(|secs| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
                .unwrap_or_else(std::time::SystemTime::now);
            if sweep::spill_sweep_due(&live, parent, now).await {
                sweep::spill(
                    &live,
                    parent,
                    own,
                    now,
                    cordon_ops::leftovers::SpillBounds::default(),
                )
                .await;
            }
        }
        let identity = RemoteIdentity {
            uid,
            gids,
            home: home.clone(),
            has_rg: get("rg").as_deref() == Some("1"),
            arch: get("arch").unwrap_or_default(),
        };

        // Extra roots, canonical; missing ones give no access.
        let mut extra = Vec::new();
        for (list, writable) in [(&spec.readable_roots, false), (&spec.writable_roots, true)] {
            for raw in list {
                let path = if let Some(rest) = raw.strip_prefix("~/") {
                    match &home {
                        Some(h) => h.join(rest),
                        None => continue,
                    }
                } else if Path::new(raw).is_absolute() {
                    PathBuf::from(raw)
                } else {
                    root.join(raw)
                };
                let Some(text) = path.to_str() else { continue };
                if let Ok(name) = live.sftp.realpath(text.to_owned()).await
                    && let Some(first) = name.files.first()
                {
                    extra.push(Root {
                        path: PathBuf::from(&first.filename),
                        writable,
                    });
                }
            }
        }
        extra.push(Root {
            path: spill_dir.clone(),
            writable: false,
        });
        // Temp files of writes a killed session left in the writable roots (swept below when
        // the helper does not run: a running helper's local backend sweeps them at its start).
        let writable: Vec<String> = (spec.workspace == RootAccess::ReadWrite)
            .then(|| root_text.clone())
            .into_iter()
            .chain(
                extra
                    .iter()
                    .filter(|r| r.writable)
                    .filter_map(|r| r.path.to_str().map(str::to_owned)),
            )
            .collect();
        let rules = PathRules::new(&root, &spec, extra)?;
        let endpoint = pool.endpoint();
        let id = BackendId::new(format!(
            "ssh:{}@{}:{}:{}",
            endpoint.user, endpoint.host, endpoint.port, root_text
        ));
        drop(live);
        let state_dir = (!state_arg.is_empty()).then_some(state_arg);
        let started = match early.finish(&identity.arch).await {
            Some(started) => started,
            None => {
                start_helper(HelperSetup {
                    pool: Arc::clone(&pool),
                    configured: helper_path.clone(),
                    arch: identity.arch.clone(),
                    state_dir: state_dir.clone(),
                    root: root.clone(),
                    spec: spec.clone(),
                    asker: egress_asker.clone(),
                    reconnect: true,
                })
                .await
            }
        };
        let (helper, helper_report, helper_refusal) = match started {
            Ok((backend, report)) => (Some(backend), Some(report), None),
            Err(reason) => {
                tracing::warn!(
                    host = %label,
                    %reason,
                    allow_degraded = spec.allow_degraded,
                    "ssh: the helper does not run; commands are refused unless the sandbox may be degraded"
                );
                (None, None, Some(reason))
            }
        };
        if helper.is_none() && !writable.is_empty() {
            // Without the helper, one remote `find`. With it, this is left to the helper's
            // local backend, which also keeps a temp file whose writer still holds its lock
            // (a write in flight in another session's helper); the `find` cannot see locks.
            sweep::stale_write_temps(&pool, &writable).await;
        }
        let inner = Arc::new_cyclic(|this| Inner {
            id,
            root,
            spill_dir,
            rules,
            spec,
            identity,
            force_fallback: force_search_fallback,
            runner: Arc::new(Runner::new(SshTransport(Arc::clone(&pool)), bash::MAX_IDLE)),
            pool,
            helper_binary: helper_path,
            state_dir,
            helper_refusal,
            this: this.clone(),
        });
        if helper.is_none() && inner.spec.allow_degraded {
            // The first command then finds a worker ready.
            inner.runner.keep_a_spare();
        }
        Ok(SshBackend {
            inner,
            helper,
            helper_report,
        })
    }

    /// The remote directory holding this root's spill files.
    pub fn spill_dir(&self) -> &Path {
        &self.inner.spill_dir
    }

    /// Choose the helper binary for the host, upload it to the remote cache unless it is
    /// there, and run its hash-verified start once (then close it): what `cordon doctor`
    /// reports.
    pub async fn check_helper(&self) -> Result<helper::HelperReport, helper::RemoteHelperError> {
        let local = helper::choose_blocking(
            self.inner.helper_binary.clone(),
            self.inner.identity.arch.clone(),
        )
        .await?;
        let channel = helper::start(
            &self.inner.pool,
            &local,
            self.inner.state_dir.as_deref(),
            None,
            true,
        )
        .await?;
        Ok(helper::HelperReport {
            arch: self.inner.identity.arch.clone(),
            remote_path: channel.remote_path.clone(),
            uploaded: channel.uploaded,
            local,
        })
    }

    /// The helper running on the host (binary, hash, cache path, whether this connect
    /// uploaded it); `None` when it does not run ([`SshBackend::helper_refusal`] says why).
    pub fn helper_report(&self) -> Option<&helper::HelperReport> {
        self.helper_report.as_ref()
    }

    /// Why the helper does not run on the host; `None` when it runs.
    pub fn helper_refusal(&self) -> Option<&str> {
        self.inner.helper_refusal.as_deref()
    }

    /// The sandbox layers the host's kernel provides, as the running helper probes them.
    pub async fn helper_probe(&self) -> Result<cordon_helper::ProbeReport, String> {
        let Some(helper) = &self.helper else {
            return Err(self
                .inner
                .helper_refusal
                .clone()
                .unwrap_or_else(|| "the helper does not run".to_owned()));
        };
        let client = helper
            .ops()
            .current()
            .await
            .ok_or_else(|| "the helper died; the next call starts a new one".to_owned())?;
        client.probe().await.map_err(|e| e.to_string())
    }

    /// Whether searches use `rg` on the remote host.
    pub fn has_rg(&self) -> bool {
        self.inner.identity.has_rg && !self.inner.force_fallback
    }
}

#[async_trait::async_trait]
impl cordon_ops::Backend for SshBackend {
    fn id(&self) -> &BackendId {
        &self.inner.id
    }

    fn files(&self) -> Arc<dyn cordon_ops::FileOperations> {
        match &self.helper {
            Some(helper) => helper.files(),
            None => self.inner.clone(),
        }
    }

    fn bash(&self) -> Arc<dyn cordon_ops::BashOperations> {
        match &self.helper {
            Some(helper) => helper.bash(),
            None => Arc::new(cordon_remote::runner::RemoteBash(self.inner.clone())),
        }
    }

    fn search(&self) -> Arc<dyn cordon_ops::SearchOperations> {
        match &self.helper {
            Some(helper) => helper.search(),
            None => Arc::new(cordon_remote::search::host::RemoteSearch(
                self.inner.clone(),
            )),
        }
    }

    fn missing_layers(&self) -> Vec<String> {
        match &self.helper {
            Some(helper) => helper
                .missing_layers()
                .into_iter()
                .map(|layer| format!("ssh: {layer}"))
                .collect(),
            None => self.layers_missing(),
        }
    }

    async fn shutdown(&self) -> Result<(), cordon_ops::ShutdownError> {
        if let Some(helper) = &self.helper {
            helper.shutdown().await?;
        }
        self.close_session().await
    }
}

/// What [`start_helper`] needs.
struct HelperSetup {
    pool: Arc<Pool>,
    configured: Option<PathBuf>,
    /// The host's machine (`uname -m`), checked by the start script.
    arch: String,
    state_dir: Option<String>,
    root: PathBuf,
    spec: SandboxSpec,
    /// Who the helper's egress proxy asks (`SshConfig::egress_asker`).
    asker: Option<Arc<dyn cordon_helper::EgressApprover>>,
    /// Whether a refused channel may replace the connection ([`Pool::open_channel`]):
    /// not for the start beside the probe, whose refusal only means "start again after it".
    reconnect: bool,
}

/// What [`start_helper`] gives.
type Started = Result<(cordon_helper::HelperBackend, helper::HelperReport), String>;

/// The helper's start begun before the probe reported the host's machine (`connect`), for the
/// machine this process runs on. Dropped, it is aborted (and its channel closed).
struct EarlyStart {
    machine: String,
    task: tokio_util::task::AbortOnDropHandle<Started>,
}

impl EarlyStart {
    fn spawn(setup: HelperSetup) -> Self {
        EarlyStart {
            machine: setup.arch.clone(),
            task: tokio_util::task::AbortOnDropHandle::new(tokio::spawn(start_helper(setup))),
        }
    }

    /// The helper it started when `machine` is the one it started for; `None` when it must be
    /// started again: another machine, or this start failed (the error is logged).
    async fn finish(self, machine: &str) -> Option<Started> {
        if self.machine != machine {
            tracing::debug!(guessed = %self.machine, %machine, "ssh: the host's machine differs; starting its helper");
            return None;
        }
        match self.task.await {
            Ok(Ok(started)) => Some(Ok(started)),
            Ok(Err(error)) => {
                tracing::debug!(%error, "ssh: the early helper start failed; starting it again");
                None
            }
            Err(error) => {
                tracing::debug!(%error, "ssh: the early helper start did not finish");
                None
            }
        }
    }
}

/// Start the helper on the host and open the session in it: the binary for the host's
/// architecture, uploaded unless cached, hash-verified, its cache denied to the session (a
/// command must not replace the helper the next session runs). `Err` says why it cannot run.
async fn start_helper(setup: HelperSetup) -> Started {
    let HelperSetup {
        pool,
        configured,
        arch,
        state_dir,
        root,
        spec,
        asker,
        reconnect,
    } = setup;
    let local = helper::choose_blocking(configured, arch.clone())
        .await
        .map_err(|e| e.to_string())?;
    let channel = helper::start(&pool, &local, state_dir.as_deref(), Some(&arch), reconnect)
        .await
        .map_err(|e| e.to_string())?;
    let report = helper::HelperReport {
        arch,
        local: local.clone(),
        remote_path: channel.remote_path.clone(),
        uploaded: channel.uploaded,
    };
    let session = cordon_helper::SessionStart::new(root, helper_spec(&spec, &channel.cache_dir));
    let connector = helper::SshConnector {
        pool,
        local,
        state_dir,
        cache_dir: channel.cache_dir.clone(),
        first: std::sync::Mutex::new(Some(channel)),
    };
    let backend = cordon_helper::HelperBackend::start_asking(Box::new(connector), session, asker)
        .await
        .map_err(|e| e.to_string())?;
    Ok((backend, report))
}

/// The spec the helper's session gets: the helper cache denied, and the variables passed by
/// name taken from this process (as the shell workers do), not from the helper's scrubbed
/// environment.
fn helper_spec(spec: &SandboxSpec, cache_dir: &str) -> SandboxSpec {
    let mut spec = spec.clone();
    if spec.sources.denied.len() == spec.denied.len() {
        // Not a policy line: Cordon protects its own helper.
        spec.sources.denied.push(0);
    }
    spec.denied.push(format!("{}/**", glob_literal(cache_dir)));
    let passed: Vec<(String, String)> = std::mem::take(&mut spec.env.pass)
        .into_iter()
        .filter_map(|name| std::env::var(&name).ok().map(|value| (name, value)))
        .collect();
    spec.env.set.splice(0..0, passed);
    spec
}

/// `path` as a glob matching exactly itself: a directory named `st[a]te` or `a{b,c}` must not
/// turn the cache's denial into a pattern for other paths.
fn glob_literal(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl SshBackend {
    /// What commands run without on the remote host (only when they run at all).
    fn layers_missing(&self) -> Vec<String> {
        if !self.inner.spec.allow_degraded {
            // Commands are refused; the file tools are confined.
            return Vec::new();
        }
        let mut layers = vec![
            "ssh: commands run with the remote account's full rights (no remote Landlock/seccomp; \
             file tools are confined to the remote roots)"
                .to_owned(),
            "ssh: no resource limits on remote commands".to_owned(),
        ];
        if let Some(reason) = &self.inner.helper_refusal {
            layers.push(format!(
                "ssh: the Cordon helper does not run on the host, so commands run through a \
                 plain shell: {reason}"
            ));
        }
        match self.inner.spec.network {
            NetworkMode::Disabled => layers.push(
                "ssh: network is not disabled for remote commands (the policy asks for none)"
                    .to_owned(),
            ),
            NetworkMode::Filtered => layers.push(
                "ssh: network is not filtered for remote commands (the policy asks for an allow \
                 list)"
                    .to_owned(),
            ),
            NetworkMode::Enabled => {}
        }
        layers
    }

    /// Close the workers and the connection.
    async fn close_session(&self) -> Result<(), cordon_ops::ShutdownError> {
        self.inner.runner.clear();
        self.inner.pool.shutdown().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_pairs_parse() {
        let pairs = parse_probe(b"uid\x000\x00gids\x000 1\x00rg\x001\x00");
        assert_eq!(
            pairs,
            vec![
                ("uid".to_owned(), "0".to_owned()),
                ("gids".to_owned(), "0 1".to_owned()),
                ("rg".to_owned(), "1".to_owned()),
            ]
        );
    }

    #[test]
    fn the_helper_cache_is_denied_as_a_literal_path() {
        let cache = "/srv/st[a]te/a{b,c}/*?\\/helper";
        let spec = helper_spec(&SandboxSpec::default(), cache);
        assert_eq!(
            spec.denied,
            vec!["/srv/st\\[a\\]te/a\\{b,c\\}/\\*\\?\\\\/helper/**".to_owned()]
        );
        let rules = PathRules::new(Path::new("/srv"), &spec, Vec::new()).unwrap();
        let inside = Path::new(cache).join("0123/cordon-helper");
        assert!(rules.entry_of(&inside).is_some(), "the cache is not denied");
        assert!(rules.entry_of(Path::new(cache)).is_some());
        // What the path read as a pattern would have matched instead.
        for other in ["/srv/state/ab/xy/helper/f", "/srv/state/ac/xy/helper/f"] {
            assert!(rules.entry_of(Path::new(other)).is_none(), "{other}");
        }
    }

    #[test]
    fn the_helper_spec_denies_the_cache_and_takes_passed_variables_from_here() {
        let mut spec = SandboxSpec {
            denied: vec!["secret/**".to_owned()],
            ..SandboxSpec::default()
        };
        spec.sources.denied = vec![4];
        spec.env.pass = vec!["PATH".to_owned(), "CORDON_SURELY_UNSET_VARIABLE".to_owned()];
        spec.env.set = vec![("A".to_owned(), "1".to_owned())];
        let helper = helper_spec(&spec, "/home/a*b/.cache/cordon/helper");
        assert_eq!(
            helper.denied,
            vec![
                "secret/**".to_owned(),
                "/home/a\\*b/.cache/cordon/helper/**".to_owned()
            ]
        );
        assert_eq!(helper.sources.denied, vec![4, 0]);
        assert!(helper.env.pass.is_empty());
        assert_eq!(
            helper.env.set,
            vec![
                ("PATH".to_owned(), std::env::var("PATH").unwrap()),
                ("A".to_owned(), "1".to_owned())
            ]
        );
        // Sources that do not line up with the entries are left alone.
        let mut odd = SandboxSpec {
            denied: vec!["x".to_owned()],
            ..SandboxSpec::default()
        };
        odd.sources.denied.clear();
        let odd = helper_spec(&odd, "/c");
        assert_eq!(odd.denied, vec!["x".to_owned(), "/c/**".to_owned()]);
        assert!(odd.sources.denied.is_empty());
    }

    #[test]
    fn root_hash_is_stable() {
        assert_eq!(hash16("/w"), hash16("/w"));
        assert_eq!(hash16("/w").len(), 16);
        assert_ne!(hash16("/w"), hash16("/x"));
    }
}
