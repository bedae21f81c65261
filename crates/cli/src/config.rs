//! Where the CLI's defaults come from when a flag does not say: policy discovery and the
//! `config.toml` files beside the policy files.
//!
//! Policy: `--policy` > `CORDON_POLICY` > the project's `.cordon/policy.toml` (the project is
//! the workspace root, `--root`) > the user's `cordon/policy.toml` under `XDG_CONFIG_HOME`
//! (or `~/.config`) > `builtin:default`. Every candidate is looked at, so `cordon doctor` can
//! show each one and whether it existed.
//!
//! Other defaults (`backend`, `image`, `workspace_mode`, `host`, `remote_root`): the flag >
//! `CORDON_<KEY>` > the project's `.cordon/config.toml` > the user's `cordon/config.toml` >
//! the built-in default. Unknown keys are errors naming `FILE:LINE`.
//!
//! The project's files lie in the workspace, where sandboxed commands run: they are opened
//! without following a symlink or blocking on a FIFO, must be regular files owned by the user
//! (or root) and not writable by others, and are size-bounded
//! ([`cordon_core::hostfile`]). A file that exists but cannot be used is an error, never a
//! silent fall-back to the next candidate.
//!
//! It does not load or compile the policy (the policy crate does) nor open sessions.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use cordon_core::hostfile::{self, HostFileError, Trust};
use cordon_policy::{PolicySource, UnknownBuiltin};
use serde::{Deserialize, Serialize};

/// The largest `config.toml` read.
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The project's directory of Cordon files, under the workspace root.
pub const PROJECT_DIR: &str = ".cordon";

/// The settings a `config.toml` may hold, each with the environment variable that beats it.
pub const KEYS: &[(&str, &str)] = &[
    ("backend", "CORDON_BACKEND"),
    ("image", "CORDON_IMAGE"),
    ("workspace_mode", "CORDON_WORKSPACE_MODE"),
    ("host", "CORDON_HOST"),
    ("remote_root", "CORDON_REMOTE_ROOT"),
];

/// Why the configuration could not be worked out (a configuration error: exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The project's `.cordon` is a symlink: what it points at is not protected like
    /// `.cordon/` itself, so a session could have written the policy found through it.
    #[error(
        "failed to use {}: it is a symlink, and Cordon reads a project's policy and defaults only from a real .cordon directory and refuses to start beside a linked one; replace the link with a directory (or remove it)",
        path.display()
    )]
    ProjectDirLink {
        /// The project's `.cordon`.
        path: PathBuf,
    },
    /// `lstat` of a candidate failed for a reason other than its absence.
    #[error("failed to inspect {}: {source}", path.display())]
    Inspect {
        /// The candidate.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A config file exists but cannot be read safely.
    #[error("failed to read the config file: {0}")]
    Read(#[source] HostFileError),
    /// A config file is not valid TOML, has an unknown key or a value of the wrong type.
    #[error("{}:{line}: failed to parse the config file: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the offending text.
        line: usize,
        /// What the parser reported (an unknown key lists the known ones).
        message: String,
    },
    /// A setting holds a value it cannot have.
    #[error("failed to use {key} = {value:?} from {origin}: expected {expected}")]
    BadValue {
        /// The setting.
        key: &'static str,
        /// The value found.
        value: String,
        /// Where it came from (`FILE:LINE`, `CORDON_BACKEND`).
        origin: String,
        /// What it may be.
        expected: String,
    },
    /// `--policy` or `CORDON_POLICY` names an unknown built-in policy.
    #[error("failed to use {origin}: {source}")]
    Builtin {
        /// `--policy` or `CORDON_POLICY`.
        origin: &'static str,
        /// The name and the known ones.
        #[source]
        source: UnknownBuiltin,
    },
}

/// The process environment as discovery reads it (a value, so tests can make one).
#[derive(Clone, Debug, Default)]
pub struct Environment {
    /// `CORDON_POLICY`.
    pub cordon_policy: Option<OsString>,
    /// `HOME`.
    pub home: Option<PathBuf>,
    /// `XDG_CONFIG_HOME`.
    pub xdg_config_home: Option<PathBuf>,
    /// The `CORDON_<KEY>` variables of [`KEYS`] that are set.
    pub settings: BTreeMap<&'static str, String>,
}

impl Environment {
    /// The current process's environment.
    pub fn from_process() -> Environment {
        let non_empty = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
        Environment {
            cordon_policy: non_empty("CORDON_POLICY"),
            home: non_empty("HOME").map(PathBuf::from),
            xdg_config_home: non_empty("XDG_CONFIG_HOME").map(PathBuf::from),
            settings: KEYS
                .iter()
                .filter_map(|&(_, variable)| {
                    let value = std::env::var(variable).ok().filter(|v| !v.is_empty())?;
                    Some((variable, value))
                })
                .collect(),
        }
    }

    /// The user's Cordon directory: `$XDG_CONFIG_HOME/cordon` (when absolute, as the XDG
    /// spec requires) or `~/.config/cordon`; `None` without either.
    pub fn user_dir(&self) -> Option<PathBuf> {
        match &self.xdg_config_home {
            Some(dir) if dir.is_absolute() => Some(dir.join("cordon")),
            _ => self.home.as_ref().map(|home| home.join(".config/cordon")),
        }
    }
}

/// How one discovery candidate stood.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CandidateState {
    /// This one is used.
    Chosen,
    /// The flag or variable is not set (or, for the user file, neither HOME nor
    /// XDG_CONFIG_HOME is).
    NotSet,
    /// The file does not exist.
    Absent,
    /// Set or present, but an earlier candidate won.
    Overridden,
}

impl CandidateState {
    /// The words `doctor` prints.
    pub fn describe(self) -> &'static str {
        match self {
            CandidateState::Chosen => "chosen",
            CandidateState::NotSet => "not set",
            CandidateState::Absent => "absent",
            CandidateState::Overridden => "present, overridden by an earlier candidate",
        }
    }
}

/// One place a policy or config file may come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// Which rung: `--policy`, `CORDON_POLICY`, `project`, `user`, `builtin`.
    pub origin: &'static str,
    /// The path or name it points at, when there is one.
    pub path: Option<String>,
    /// How it stood.
    pub state: CandidateState,
}

/// The policy discovery chose, and every candidate it looked at.
#[derive(Clone, Debug)]
pub struct PolicyChoice {
    /// The policy to load.
    pub source: PolicySource,
    /// The rung it came from (`--policy`, `CORDON_POLICY`, `project`, `user`, `builtin`).
    pub origin: &'static str,
    /// Every candidate, in order of precedence.
    pub candidates: Vec<Candidate>,
}

/// Whether something exists at `path` (not following a final symlink: a link is "something",
/// and opening it later refuses it). A missing parent directory, or a parent that is a file,
/// means absent.
fn exists(path: &Path) -> Result<bool, ConfigError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(error)
            if matches!(
                error.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(false)
        }
        Err(source) => Err(ConfigError::Inspect {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// `root`'s `.cordon` directory, refused when it is a symlink (absent is fine).
fn project_dir(root: &Path) -> Result<PathBuf, ConfigError> {
    let dir = root.join(PROJECT_DIR);
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(ConfigError::ProjectDirLink { path: dir }),
        Ok(_) => Ok(dir),
        Err(error)
            if matches!(
                error.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(dir)
        }
        Err(source) => Err(ConfigError::Inspect { path: dir, source }),
    }
}

/// Pick the policy for a session on `root`: `--policy` (`flag`) > `CORDON_POLICY` > the
/// project's `.cordon/policy.toml` > the user's `cordon/policy.toml` > `builtin:default`.
pub fn discover_policy(
    flag: Option<&Path>,
    root: &Path,
    env: &Environment,
) -> Result<PolicyChoice, ConfigError> {
    let mut chosen: Option<(PolicySource, &'static str)> = None;
    let mut candidates = Vec::new();
    let mut consider = |origin: &'static str,
                        path: Option<String>,
                        source: Option<PolicySource>,
                        chosen: &mut Option<(PolicySource, &'static str)>| {
        let state = match (&source, &path) {
            (None, None) => CandidateState::NotSet,
            (None, Some(_)) => CandidateState::Absent,
            (Some(_), _) if chosen.is_some() => CandidateState::Overridden,
            (Some(source), _) => {
                *chosen = Some((source.clone(), origin));
                CandidateState::Chosen
            }
        };
        candidates.push(Candidate {
            origin,
            path,
            state,
        });
    };
    match flag {
        Some(path) => {
            let source = PolicySource::parse(path).map_err(|source| ConfigError::Builtin {
                origin: "--policy",
                source,
            })?;
            consider(
                "--policy",
                Some(source.display_name()),
                Some(source),
                &mut chosen,
            );
        }
        None => consider("--policy", None, None, &mut chosen),
    }
    match &env.cordon_policy {
        Some(value) => {
            let source =
                PolicySource::parse(Path::new(value)).map_err(|source| ConfigError::Builtin {
                    origin: "CORDON_POLICY",
                    source,
                })?;
            consider(
                "CORDON_POLICY",
                Some(source.display_name()),
                Some(source),
                &mut chosen,
            );
        }
        None => consider("CORDON_POLICY", None, None, &mut chosen),
    }
    let project = project_dir(root)?.join("policy.toml");
    let user = env.user_dir().map(|dir| dir.join("policy.toml"));
    for (origin, path) in [("project", Some(project)), ("user", user)] {
        match path {
            Some(path) => {
                let source = exists(&path)?.then(|| PolicySource::File(path.clone()));
                consider(
                    origin,
                    Some(path.display().to_string()),
                    source,
                    &mut chosen,
                );
            }
            None => consider(origin, None, None, &mut chosen),
        }
    }
    let default = PolicySource::default_builtin();
    consider(
        "builtin",
        Some(default.display_name()),
        Some(default),
        &mut chosen,
    );
    let (source, origin) = chosen.unwrap_or_else(|| (PolicySource::default_builtin(), "builtin"));
    tracing::debug!(policy = %source.display_name(), origin, "policy chosen");
    Ok(PolicyChoice {
        source,
        origin,
        candidates,
    })
}

/// A `config.toml` as written: every key optional, unknown keys refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    backend: Option<toml::Spanned<String>>,
    image: Option<toml::Spanned<String>>,
    workspace_mode: Option<toml::Spanned<String>>,
    host: Option<toml::Spanned<String>>,
    remote_root: Option<toml::Spanned<String>>,
}

/// One value read from a config file, with the line it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileValue {
    value: String,
    line: usize,
}

/// One config file candidate and what it held.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    /// `project` or `user`.
    pub origin: &'static str,
    /// Where it is (or would be).
    pub path: PathBuf,
    /// Whether it exists (it was read when it does).
    pub present: bool,
    values: BTreeMap<&'static str, FileValue>,
}

/// 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Parse a config file's text; `path` names it in errors.
fn parse_config(path: &Path, text: &str) -> Result<BTreeMap<&'static str, FileValue>, ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|error| ConfigError::Parse {
        path: path.to_path_buf(),
        line: error.span().map_or(1, |span| line_of(text, span.start)),
        message: error.message().trim().replace('\n', " "),
    })?;
    let RawConfig {
        backend,
        image,
        workspace_mode,
        host,
        remote_root,
    } = raw;
    let mut values = BTreeMap::new();
    for (key, value) in [
        ("backend", backend),
        ("image", image),
        ("workspace_mode", workspace_mode),
        ("host", host),
        ("remote_root", remote_root),
    ] {
        if let Some(value) = value {
            let line = line_of(text, value.span().start);
            values.insert(
                key,
                FileValue {
                    value: value.into_inner(),
                    line,
                },
            );
        }
    }
    Ok(values)
}

/// Read the config file at `path` if something is there.
fn read_config(origin: &'static str, path: PathBuf) -> Result<ConfigFile, ConfigError> {
    if !exists(&path)? {
        return Ok(ConfigFile {
            origin,
            path,
            present: false,
            values: BTreeMap::new(),
        });
    }
    let text = hostfile::read_to_string(&path, Trust::Owned, MAX_CONFIG_BYTES)
        .map_err(ConfigError::Read)?;
    let values = parse_config(&path, &text)?;
    tracing::debug!(path = %path.display(), keys = values.len(), "config file read");
    Ok(ConfigFile {
        origin,
        path,
        present: true,
        values,
    })
}

/// A setting's value and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Setting {
    /// The value, or `None` when nothing set it (the built-in default applies).
    pub value: Option<String>,
    /// `--FLAG`, `CORDON_KEY`, `FILE:LINE`, or `default`.
    pub origin: String,
}

/// The config files found for a workspace.
#[derive(Clone, Debug)]
pub struct Config {
    /// The project's, then the user's (the user's is missing without HOME/XDG_CONFIG_HOME).
    pub files: Vec<ConfigFile>,
}

impl Config {
    /// Read the project's `.cordon/config.toml` under `root` and the user's.
    pub fn load(root: &Path, env: &Environment) -> Result<Config, ConfigError> {
        let mut files = vec![read_config(
            "project",
            project_dir(root)?.join("config.toml"),
        )?];
        if let Some(dir) = env.user_dir() {
            files.push(read_config("user", dir.join("config.toml"))?);
        }
        Ok(Config { files })
    }

    /// `key`'s value: `flag` (given as `--FLAG`) > its environment variable > the project
    /// file > the user file > unset.
    pub fn resolve(&self, key: &'static str, flag: Option<String>, env: &Environment) -> Setting {
        let variable = KEYS
            .iter()
            .find(|(name, _)| *name == key)
            .map(|&(_, variable)| variable);
        if let Some(value) = flag {
            return Setting {
                value: Some(value),
                origin: format!("--{}", key.replace('_', "-")),
            };
        }
        if let Some(variable) = variable
            && let Some(value) = env.settings.get(variable)
        {
            return Setting {
                value: Some(value.clone()),
                origin: variable.to_owned(),
            };
        }
        for file in &self.files {
            if let Some(FileValue { value, line }) = file.values.get(key) {
                return Setting {
                    value: Some(value.clone()),
                    origin: format!("{}:{line}", file.path.display()),
                };
            }
        }
        Setting {
            value: None,
            origin: "default".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_with_home(home: &Path) -> Environment {
        Environment {
            home: Some(home.to_path_buf()),
            ..Environment::default()
        }
    }

    fn states(choice: &PolicyChoice) -> Vec<(&'static str, CandidateState)> {
        choice
            .candidates
            .iter()
            .map(|candidate| (candidate.origin, candidate.state))
            .collect()
    }

    #[test]
    fn discovery_order_is_flag_env_project_user_builtin() {
        use CandidateState::*;
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("ws");
        let home = base.path().join("home");
        let mut env = env_with_home(&home);
        let none = discover_policy(None, &root, &env).unwrap();
        assert_eq!(none.source, PolicySource::default_builtin());
        assert_eq!(
            states(&none),
            [
                ("--policy", NotSet),
                ("CORDON_POLICY", NotSet),
                ("project", Absent),
                ("user", Absent),
                ("builtin", Chosen)
            ]
        );
        let user = home.join(".config/cordon/policy.toml");
        std::fs::create_dir_all(user.parent().unwrap()).unwrap();
        std::fs::write(&user, "version = 1\n").unwrap();
        let chosen = discover_policy(None, &root, &env).unwrap();
        assert_eq!(chosen.source, PolicySource::File(user.clone()));
        assert_eq!(chosen.origin, "user");
        let project = root.join(".cordon/policy.toml");
        std::fs::create_dir_all(project.parent().unwrap()).unwrap();
        std::fs::write(&project, "version = 1\n").unwrap();
        let chosen = discover_policy(None, &root, &env).unwrap();
        assert_eq!(chosen.source, PolicySource::File(project.clone()));
        assert_eq!(chosen.origin, "project");
        env.cordon_policy = Some("builtin:readonly".into());
        let chosen = discover_policy(None, &root, &env).unwrap();
        assert_eq!(chosen.source.display_name(), "builtin:readonly.toml");
        let chosen = discover_policy(Some(Path::new("p.toml")), &root, &env).unwrap();
        assert_eq!(chosen.source, PolicySource::File("p.toml".into()));
        assert_eq!(
            states(&chosen),
            [
                ("--policy", Chosen),
                ("CORDON_POLICY", Overridden),
                ("project", Overridden),
                ("user", Overridden),
                ("builtin", Overridden)
            ]
        );
    }

    #[test]
    fn xdg_config_home_beats_home_when_absolute() {
        let mut env = env_with_home(Path::new("/h"));
        assert_eq!(env.user_dir(), Some(PathBuf::from("/h/.config/cordon")));
        env.xdg_config_home = Some("/x".into());
        assert_eq!(env.user_dir(), Some(PathBuf::from("/x/cordon")));
        env.xdg_config_home = Some("relative".into());
        assert_eq!(env.user_dir(), Some(PathBuf::from("/h/.config/cordon")));
        env.home = None;
        assert_eq!(env.user_dir(), None);
    }

    #[test]
    fn config_values_carry_their_line_and_unknown_keys_name_file_and_line() {
        let path = Path::new("/p/config.toml");
        let values = parse_config(path, "# c\nbackend = \"docker\"\n\nimage = \"i:1\"\n").unwrap();
        assert_eq!(
            values.get("backend"),
            Some(&FileValue {
                value: "docker".into(),
                line: 2
            })
        );
        assert_eq!(values.get("image").map(|v| v.line), Some(4));
        let error = parse_config(path, "image = \"x\"\nbakend = \"docker\"\n").unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with(
                "/p/config.toml:2: failed to parse the config file: unknown field `bakend`"
            ),
            "{text}"
        );
        let error = parse_config(path, "\n\nhost = 3\n").unwrap_err();
        assert!(
            error.to_string().starts_with("/p/config.toml:3: "),
            "{error}"
        );
    }
}
