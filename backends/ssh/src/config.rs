//! Where to connect: the `[user@]host[:port]` target and its resolution through an OpenSSH
//! client config file (`~/.ssh/config` by default; the path is injectable).
//!
//! Supported: `Host` blocks (patterns with `*`/`?`, `!negation`, several per line), `Match all`
//! and `Match host/originalhost PATTERNS` (other `Match` criteria never match), `Include`
//! (globs in the file name), and the keywords `HostName` (with `%h`), `User`, `Port`,
//! `IdentityFile` and `CertificateFile` (several; `~`, `%d`, `%u`, `%h`, `%r`, `%p`, `%%`),
//! `IdentitiesOnly`,
//! `ProxyJump` (a comma-separated chain, `none`), `ProxyCommand` (run with `/bin/sh -c`, its
//! standard input and output are the connection; `%h`, `%p`, `%r`, `%n`, `%%`; `none`),
//! `UserKnownHostsFile`, `HostKeyAlias`. As in OpenSSH the first value obtained for a keyword
//! wins, and `ProxyJump` and `ProxyCommand` are one setting (whichever comes first wins); other
//! keywords are ignored.

use std::path::{Path, PathBuf};

use crate::error::SshError;

/// A `[user@]host[:port]` as given by the operator (or in a `ProxyJump`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// User, if given.
    pub user: Option<String>,
    /// Host name, alias or address (IPv6 without brackets).
    pub host: String,
    /// Port, if given.
    pub port: Option<u16>,
}

impl Target {
    /// Parse `[user@]host[:port]`, `[user@][v6addr]:port` or `ssh://[user@]host[:port]`.
    pub fn parse(text: &str) -> Result<Target, SshError> {
        let bad = |reason: &str| SshError::InvalidHost {
            host: text.to_owned(),
            reason: reason.to_owned(),
        };
        let rest = text.strip_prefix("ssh://").unwrap_or(text);
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (user, hostport) = match rest.rsplit_once('@') {
            Some((user, hostport)) if !user.is_empty() => (Some(user.to_owned()), hostport),
            Some(_) => return Err(bad("the user before `@` is empty")),
            None => (None, rest),
        };
        let (host, port) = if let Some(inner) = hostport.strip_prefix('[') {
            let (host, after) = inner
                .split_once(']')
                .ok_or_else(|| bad("missing `]` after an IPv6 address"))?;
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(bad("unexpected text after `]`")),
                },
            }
        } else if hostport.matches(':').count() > 1 {
            // A bare IPv6 address has no port.
            (hostport, None)
        } else {
            match hostport.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("the host name is empty"));
        }
        if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad(
                "the host name contains whitespace or control characters",
            ));
        }
        let port = match port {
            Some(p) => {
                Some(parse_port(p).ok_or_else(|| bad("the port is not a number in 1-65535"))?)
            }
            None => None,
        };
        Ok(Target {
            user,
            host: host.to_owned(),
            port,
        })
    }
}

fn parse_port(text: &str) -> Option<u16> {
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

/// The settings for one host after applying the config file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostSettings {
    /// `HostName` (tokens expanded).
    pub hostname: Option<String>,
    /// `User`.
    pub user: Option<String>,
    /// `Port`.
    pub port: Option<u16>,
    /// `IdentityFile`s, in order (raw, expanded later with [`expand_tokens`]).
    pub identity_files: Vec<String>,
    /// `IdentitiesOnly`.
    pub identities_only: Option<bool>,
    /// `CertificateFile`s, in order (raw, expanded later with [`expand_tokens`]).
    pub certificate_files: Vec<String>,
    /// `ProxyJump` chain (`None`: not set; empty: `none`).
    pub proxy_jump: Option<Vec<Target>>,
    /// `ProxyCommand` as written (tokens not expanded; `none` is kept as `none`). Set only when
    /// no `ProxyJump` came first.
    pub proxy_command: Option<String>,
    /// `UserKnownHostsFile`s (raw).
    pub user_known_hosts: Option<Vec<String>>,
    /// `HostKeyAlias`.
    pub host_key_alias: Option<String>,
}

/// Whether `pattern` (`*`, `?` wildcards) matches `text`, case-insensitively as OpenSSH does
/// for host names.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.to_lowercase().chars().collect();
    let t: Vec<char> = text.to_lowercase().chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// OpenSSH pattern-list semantics: true if some positive pattern matches and no negated one
/// does.
pub fn pattern_list_match<'a>(patterns: impl IntoIterator<Item = &'a str>, text: &str) -> bool {
    let mut matched = false;
    for pattern in patterns {
        if let Some(negated) = pattern.strip_prefix('!') {
            if wildcard_match(negated, text) {
                return false;
            }
        } else if wildcard_match(pattern, text) {
            matched = true;
        }
    }
    matched
}

/// Split a config line into words: whitespace separated, `"double quotes"` group, an optional
/// `=` between keyword and value.
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if !quoted && c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            c => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if quoted {
        return Err("unterminated quote".to_owned());
    }
    if in_word {
        words.push(current);
    }
    // `Keyword=value` and `Keyword = value`.
    if let Some(first) = words.first().cloned()
        && let Some((key, value)) = first.split_once('=')
    {
        let mut out = vec![key.to_owned()];
        if !value.is_empty() {
            out.push(value.to_owned());
        }
        out.extend(words.into_iter().skip(1));
        return Ok(out);
    }
    if words.get(1).is_some_and(|w| w == "=") {
        words.remove(1);
    } else if let Some(second) = words.get_mut(1)
        && let Some(rest) = second.strip_prefix('=')
    {
        *second = rest.to_owned();
    }
    Ok(words)
}

/// Context for evaluating a config file for one host.
struct Eval<'a> {
    original: &'a str,
    settings: HostSettings,
    home: Option<PathBuf>,
    /// Where relative `Include`s of the file being read are taken from.
    include_base: PathBuf,
    depth: usize,
}

/// The largest ssh config or known_hosts file read.
const MAX_SSH_FILE_BYTES: u64 = 16 << 20;

/// The value of a `Keyword value` or `Keyword=value` line, unsplit.
fn rest_of_line(line: &str) -> &str {
    let after = line.trim_start_matches(|c: char| !c.is_whitespace() && c != '=');
    let after = after.trim_start();
    after.strip_prefix('=').unwrap_or(after).trim()
}

/// Read an OpenSSH file (config, an `Include`d file, known_hosts) the way OpenSSH accepts it:
/// a symlink is followed (dotfile managers link these), but a FIFO or anything else that is
/// not a regular file is refused without blocking, and the file must belong to the user or
/// root and not be writable by group or others (a writable known_hosts lets others add
/// keys). A missing file is `None`.
pub(crate) fn read_ssh_file(path: &Path) -> std::io::Result<Option<String>> {
    use cordon_core::hostfile::{HostFileError, Trust, read_following_to_string};
    match read_following_to_string(path, Trust::Owned, MAX_SSH_FILE_BYTES) {
        Ok(text) => Ok(Some(text)),
        Err(HostFileError::Open { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(error) => Err(std::io::Error::other(error)),
    }
}

/// Resolve `alias` through the user's config file at `path` (a missing file gives no
/// settings).
pub fn resolve(path: &Path, alias: &str, home: Option<&Path>) -> Result<HostSettings, SshError> {
    resolve_all(Some(path), None, alias, home)
}

/// Resolve `alias` through the user's config file at `user`, then the system-wide one at
/// `system` (OpenSSH's order: a value the user's file gave wins). Relative `Include`s are taken
/// from `~/.ssh` in the user's file and from the system file's directory in the system one. A
/// missing file gives no settings.
pub fn resolve_all(
    user: Option<&Path>,
    system: Option<&Path>,
    alias: &str,
    home: Option<&Path>,
) -> Result<HostSettings, SshError> {
    let mut eval = Eval {
        original: alias,
        settings: HostSettings::default(),
        home: home.map(Path::to_path_buf),
        include_base: PathBuf::new(),
        depth: 0,
    };
    let base_of = |path: &Path| path.parent().unwrap_or(Path::new("/")).to_path_buf();
    let user = user.map(|path| match home {
        Some(home) => (path, home.join(".ssh")),
        None => (path, base_of(path)),
    });
    let files = user
        .into_iter()
        .chain(system.map(|path| (path, base_of(path))));
    for (path, base) in files {
        eval.include_base = base;
        match read_ssh_file(path) {
            Ok(Some(text)) => eval.file(path, &text)?,
            Ok(None) => {}
            Err(source) => {
                return Err(SshError::ReadConfig {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    }
    let mut settings = eval.settings;
    if let Some(hostname) = settings.hostname.take() {
        settings.hostname = Some(hostname.replace("%h", alias).replace("%%", "%"));
    }
    Ok(settings)
}

impl Eval<'_> {
    fn file(&mut self, path: &Path, text: &str) -> Result<(), SshError> {
        let err = |line: usize, reason: String| SshError::ParseConfig {
            path: path.to_path_buf(),
            line,
            reason,
        };
        // Lines before the first Host/Match apply to every host.
        let mut active = true;
        // The criterion of the current `Match` block when it cannot be evaluated here.
        let mut undecided: Option<String> = None;
        for (index, raw) in text.lines().enumerate() {
            let number = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let words = split_words(trimmed).map_err(|r| err(number, r))?;
            let Some(keyword) = words.first() else {
                continue;
            };
            let keyword = keyword.to_ascii_lowercase();
            let args = &words[1..];
            match keyword.as_str() {
                "host" => {
                    if args.is_empty() {
                        return Err(err(number, "`Host` needs at least one pattern".into()));
                    }
                    active = pattern_list_match(args.iter().map(String::as_str), self.original);
                    undecided = None;
                    continue;
                }
                "match" => {
                    undecided = None;
                    active = match self.match_line(args).map_err(|r| err(number, r))? {
                        Ok(decided) => decided,
                        Err(criterion) => {
                            undecided = Some(criterion);
                            false
                        }
                    };
                    continue;
                }
                _ => {}
            }
            // A block whose `Match` cannot be evaluated here is not applied; if it would change
            // where or as whom the connection goes, guessing either way could connect somewhere
            // OpenSSH would not, so that is an error.
            if let Some(criterion) = &undecided
                && matches!(
                    keyword.as_str(),
                    "hostname" | "port" | "user" | "proxyjump" | "proxycommand"
                )
            {
                return Err(err(
                    number,
                    format!(
                        "this line is in a `Match {criterion}` block, which Cordon cannot \
                         evaluate, and it changes where the connection goes; move it into a \
                         `Host` block or name a config file for Cordon with --ssh-config"
                    ),
                ));
            }
            if !active {
                continue;
            }
            let first = || {
                args.first()
                    .cloned()
                    .ok_or_else(|| err(number, format!("`{keyword}` needs a value")))
            };
            let s = &mut self.settings;
            match keyword.as_str() {
                "include" => {
                    for pattern in args {
                        self.include(path, pattern).map_err(|e| match e {
                            SshError::ParseConfig { .. } | SshError::ReadConfig { .. } => e,
                            other => err(number, other.to_string()),
                        })?;
                    }
                }
                "hostname" => {
                    let v = first()?;
                    s.hostname.get_or_insert(v);
                }
                "user" => {
                    let v = first()?;
                    s.user.get_or_insert(v);
                }
                "port" => {
                    let v = first()?;
                    let port =
                        parse_port(&v).ok_or_else(|| err(number, format!("bad port `{v}`")))?;
                    s.port.get_or_insert(port);
                }
                "identityfile" => {
                    let v = first()?;
                    if !s.identity_files.contains(&v) {
                        s.identity_files.push(v);
                    }
                }
                "certificatefile" => {
                    let v = first()?;
                    if !s.certificate_files.contains(&v) {
                        s.certificate_files.push(v);
                    }
                }
                "identitiesonly" => {
                    let v = first()?;
                    let flag = match v.to_ascii_lowercase().as_str() {
                        "yes" | "true" => true,
                        "no" | "false" => false,
                        _ => return Err(err(number, format!("bad IdentitiesOnly `{v}`"))),
                    };
                    s.identities_only.get_or_insert(flag);
                }
                "proxyjump" => {
                    let v = first()?;
                    if s.proxy_jump.is_none() && s.proxy_command.is_none() {
                        let chain = if v.eq_ignore_ascii_case("none") {
                            Vec::new()
                        } else {
                            v.split(',')
                                .map(Target::parse)
                                .collect::<Result<Vec<_>, _>>()
                                .map_err(|e| err(number, e.to_string()))?
                        };
                        s.proxy_jump = Some(chain);
                    }
                }
                "proxycommand" => {
                    // The rest of the line, verbatim (a shell command line).
                    let command = rest_of_line(trimmed);
                    if command.is_empty() {
                        return Err(err(number, "`ProxyCommand` needs a value".into()));
                    }
                    if s.proxy_jump.is_none() && s.proxy_command.is_none() {
                        s.proxy_command = Some(command.to_owned());
                    }
                }
                "userknownhostsfile" => {
                    if args.is_empty() {
                        return Err(err(number, "`UserKnownHostsFile` needs a value".into()));
                    }
                    s.user_known_hosts.get_or_insert_with(|| args.to_vec());
                }
                "hostkeyalias" => {
                    let v = first()?;
                    s.host_key_alias.get_or_insert(v);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Evaluate a `Match` line: `Ok(decided)`, or `Err(criterion)` when it depends on a
    /// criterion this parser does not evaluate (exec, user, localuser, …) and the others do
    /// not already rule the block out.
    fn match_line(&self, args: &[String]) -> Result<Result<bool, String>, String> {
        let mut i = 0;
        let mut known = true;
        let mut unknown: Option<String> = None;
        if args.is_empty() {
            return Err("`Match` needs criteria".into());
        }
        while i < args.len() {
            let (negate, criterion) = match args[i].strip_prefix('!') {
                Some(rest) => (true, rest.to_ascii_lowercase()),
                None => (false, args[i].to_ascii_lowercase()),
            };
            match criterion.as_str() {
                "all" => known &= !negate,
                "host" | "originalhost" => {
                    let list = args
                        .get(i + 1)
                        .ok_or_else(|| format!("`Match {criterion}` needs patterns"))?;
                    i += 1;
                    let subject = match criterion.as_str() {
                        "host" => self.settings.hostname.as_deref().unwrap_or(self.original),
                        _ => self.original,
                    };
                    known &= pattern_list_match(list.split(','), subject) != negate;
                }
                _ => {
                    if args.get(i + 1).is_some() && !criterion.starts_with("canonical") {
                        i += 1;
                    }
                    unknown.get_or_insert(criterion);
                }
            }
            i += 1;
        }
        Ok(match unknown {
            Some(criterion) if known => Err(criterion),
            _ => Ok(known),
        })
    }

    fn include(&mut self, from: &Path, pattern: &str) -> Result<(), SshError> {
        if self.depth >= 16 {
            return Err(SshError::ParseConfig {
                path: from.to_path_buf(),
                line: 0,
                reason: "`Include` nested too deeply".into(),
            });
        }
        let expanded = expand_tilde(pattern, self.home.as_deref());
        let full = if expanded.is_absolute() {
            expanded
        } else {
            // As OpenSSH: relative to ~/.ssh in the user's config, /etc/ssh in the system's.
            self.include_base.join(expanded)
        };
        let mut files = Vec::new();
        let name = full
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.contains(['*', '?']) {
            let dir = full.parent().unwrap_or(Path::new("/"));
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.flatten() {
                    let entry_name = entry.file_name().to_string_lossy().into_owned();
                    if wildcard_match(&name, &entry_name) {
                        files.push(entry.path());
                    }
                }
            }
            files.sort();
        } else {
            files.push(full);
        }
        for file in files {
            match read_ssh_file(&file) {
                Ok(Some(text)) => {
                    self.depth += 1;
                    let result = self.file(&file, &text);
                    self.depth -= 1;
                    result?;
                }
                Ok(None) => {}
                Err(source) => return Err(SshError::ReadConfig { path: file, source }),
            }
        }
        Ok(())
    }
}

/// `~` and `~/…` → the home directory.
pub fn expand_tilde(text: &str, home: Option<&Path>) -> PathBuf {
    match (text, home) {
        ("~", Some(home)) => home.to_path_buf(),
        (t, Some(home)) if t.starts_with("~/") => home.join(&t[2..]),
        (t, _) => PathBuf::from(t),
    }
}

/// Values for the `%` tokens of `IdentityFile` and `UserKnownHostsFile`.
#[derive(Clone, Debug)]
pub struct Tokens<'a> {
    /// `%d`: local home.
    pub home: Option<&'a Path>,
    /// `%u`: local user.
    pub local_user: &'a str,
    /// `%h`: remote host name.
    pub host: &'a str,
    /// `%r`: remote user.
    pub remote_user: &'a str,
    /// `%p`: port.
    pub port: u16,
}

/// Expand `~` and the `%` tokens of a path-valued keyword.
pub fn expand_tokens(text: &str, tokens: &Tokens<'_>) -> PathBuf {
    let out = percent_expand(text, |token| match token {
        'd' => Some(
            tokens
                .home
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
        'u' => Some(tokens.local_user.to_owned()),
        'h' => Some(tokens.host.to_owned()),
        'r' => Some(tokens.remote_user.to_owned()),
        'p' => Some(tokens.port.to_string()),
        _ => None,
    });
    expand_tilde(&out, tokens.home)
}

/// `text` with `%%` as `%` and every other `%X` replaced by `value(X)`; a token `value` does
/// not know (and a trailing `%`) is kept as written.
fn percent_expand(text: &str, value: impl Fn(char) -> Option<String>) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some(token) => match value(token) {
                Some(text) => out.push_str(&text),
                None => {
                    out.push('%');
                    out.push(token);
                }
            },
            None => out.push('%'),
        }
    }
    out
}

/// `ProxyCommand` with its tokens expanded: `%h` host name, `%p` port, `%r` remote user, `%n`
/// the alias as given, `%%`. Other `%` sequences are kept as written.
pub fn expand_proxy_command(text: &str, host: &str, port: u16, user: &str, alias: &str) -> String {
    percent_expand(text, |token| match token {
        'h' => Some(host.to_owned()),
        'p' => Some(port.to_string()),
        'r' => Some(user.to_owned()),
        'n' => Some(alias.to_owned()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(user: Option<&str>, host: &str, port: Option<u16>) -> Target {
        Target {
            user: user.map(str::to_owned),
            host: host.to_owned(),
            port,
        }
    }

    #[test]
    fn parses_targets() {
        assert_eq!(Target::parse("h").unwrap(), target(None, "h", None));
        assert_eq!(
            Target::parse("me@h:2222").unwrap(),
            target(Some("me"), "h", Some(2222))
        );
        assert_eq!(
            Target::parse("me@[::1]:22").unwrap(),
            target(Some("me"), "::1", Some(22))
        );
        assert_eq!(Target::parse("::1").unwrap(), target(None, "::1", None));
        assert_eq!(
            Target::parse("ssh://a@b.example:7/").unwrap(),
            target(Some("a"), "b.example", Some(7))
        );
        assert!(Target::parse("h:0").is_err());
        assert!(Target::parse("h:x").is_err());
        assert!(Target::parse("@h").is_err());
        assert!(Target::parse("").is_err());
        assert!(Target::parse("a b").is_err());
    }

    #[test]
    fn wildcards_and_negation() {
        assert!(wildcard_match("*.example.com", "a.example.com"));
        assert!(wildcard_match("h?st", "HOST"));
        assert!(!wildcard_match("*.example.com", "example.com"));
        assert!(wildcard_match("*", ""));
        assert!(pattern_list_match(["*", "!bad"], "good"));
        assert!(!pattern_list_match(["*", "!bad"], "bad"));
        assert!(!pattern_list_match(["!bad"], "good"));
    }

    fn resolve_text(text: &str, alias: &str) -> HostSettings {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, text).unwrap();
        resolve(&path, alias, Some(Path::new("/home/me"))).unwrap()
    }

    #[test]
    fn first_value_wins_and_identity_files_accumulate() {
        let text = "\
# comment
Host build
  HostName %h.internal
  User = deploy
  Port=2200
  IdentityFile ~/.ssh/build_key
  IdentitiesOnly yes
  ProxyJump jump@bastion:2022,other
Host *
  User fallback
  Port 22
  IdentityFile \"~/.ssh/id with space\"
  UserKnownHostsFile ~/.ssh/kh1 ~/.ssh/kh2
";
        let s = resolve_text(text, "build");
        assert_eq!(
            s,
            HostSettings {
                hostname: Some("build.internal".into()),
                user: Some("deploy".into()),
                port: Some(2200),
                identity_files: vec!["~/.ssh/build_key".into(), "~/.ssh/id with space".into()],
                identities_only: Some(true),
                certificate_files: Vec::new(),
                proxy_jump: Some(vec![
                    target(Some("jump"), "bastion", Some(2022)),
                    target(None, "other", None)
                ]),
                proxy_command: None,
                user_known_hosts: Some(vec!["~/.ssh/kh1".into(), "~/.ssh/kh2".into()]),
                host_key_alias: None,
            }
        );
        let other = resolve_text(text, "elsewhere");
        assert_eq!(other.user.as_deref(), Some("fallback"));
        assert_eq!(other.hostname, None);
        assert_eq!(other.proxy_jump, None);
    }

    #[test]
    fn match_blocks_and_negated_hosts() {
        let text = "\
Host * !secret
  User everyone
Match originalhost secret
  User special
Match exec \"true\"
  IdentityFile ~/.ssh/only-if-exec
Match originalhost elsewhere exec \"true\"
  Port 99
Match all
  Port 2222
";
        let s = resolve_text(text, "secret");
        assert_eq!(s.user.as_deref(), Some("special"));
        assert_eq!(s.port, Some(2222));
        assert!(
            s.identity_files.is_empty(),
            "an unevaluated block is not applied"
        );
        assert_eq!(resolve_text(text, "x").user.as_deref(), Some("everyone"));
        let none = resolve_text("Host a\n ProxyJump none\n", "a");
        assert_eq!(none.proxy_jump, Some(vec![]));
    }

    #[test]
    fn an_unevaluable_match_block_that_would_redirect_the_connection_is_an_error() {
        for (text, line) in [
            ("Match exec \"corp-vpn-up\"\n  ProxyCommand nc corp %p\n", 2),
            (
                "Host a\n  User me\nMatch !exec \"x\" host a\n  HostName 10.9.9.9\n",
                4,
            ),
            ("Match user root\n  Port 2022\n", 2),
        ] {
            match resolve_text_err(text, "a") {
                SshError::ParseConfig {
                    line: got, reason, ..
                } => {
                    assert_eq!(got, line, "{text}");
                    assert!(reason.contains("cannot evaluate"), "{reason}");
                }
                other => panic!("{text}: {other}"),
            }
        }
        // Ruled out by a criterion that is evaluated: no doubt, no error.
        let s = resolve_text(
            "Match host other exec \"x\"\n  ProxyCommand nc %h %p\n",
            "a",
        );
        assert_eq!(s.proxy_command, None);
    }

    #[test]
    fn includes_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("conf.d")).unwrap();
        std::fs::write(
            dir.path().join("conf.d/a.conf"),
            "Host inc\n HostName 10.0.0.1\n",
        )
        .unwrap();
        let main = dir.path().join("config");
        std::fs::write(
            &main,
            format!(
                "Include {}/conf.d/*.conf\nHost inc\n HostName ignored\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let s = resolve(&main, "inc", None).unwrap();
        assert_eq!(s.hostname.as_deref(), Some("10.0.0.1"));
    }

    #[test]
    fn proxy_command_is_kept_verbatim_and_shares_first_wins_with_proxy_jump() {
        let text = "\
Host cmd
  ProxyCommand ssh -W \"%h:%p\" bastion  # not a comment to OpenSSH either
Host eq
  ProxyCommand=nc %h %p
Host jump-first
  ProxyJump bastion
  ProxyCommand nc %h %p
Host cmd-first
  ProxyCommand nc %h %p
  ProxyJump bastion
Host off
  ProxyCommand none
Host *
  ProxyCommand late %n
";
        assert_eq!(
            resolve_text(text, "cmd").proxy_command.as_deref(),
            Some("ssh -W \"%h:%p\" bastion  # not a comment to OpenSSH either")
        );
        assert_eq!(
            resolve_text(text, "eq").proxy_command.as_deref(),
            Some("nc %h %p")
        );
        let jump = resolve_text(text, "jump-first");
        assert_eq!(jump.proxy_command, None);
        assert_eq!(jump.proxy_jump.map(|c| c.len()), Some(1));
        let cmd = resolve_text(text, "cmd-first");
        assert_eq!(cmd.proxy_command.as_deref(), Some("nc %h %p"));
        assert_eq!(cmd.proxy_jump, None);
        assert_eq!(
            resolve_text(text, "off").proxy_command.as_deref(),
            Some("none")
        );
        assert_eq!(
            resolve_text(text, "other").proxy_command.as_deref(),
            Some("late %n")
        );
        assert!(matches!(
            resolve_text_err("Host a\n ProxyCommand\n", "a"),
            SshError::ParseConfig { line: 2, .. }
        ));
        assert_eq!(
            expand_proxy_command("x %h:%p %r %n %% %z", "10.0.0.1", 2222, "me", "box"),
            "x 10.0.0.1:2222 me box % %z"
        );
    }

    fn resolve_text_err(text: &str, alias: &str) -> SshError {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, text).unwrap();
        resolve(&path, alias, None).unwrap_err()
    }

    #[test]
    fn the_system_config_is_read_after_the_user_config_with_its_own_include_base() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let etc = dir.path().join("etc/ssh");
        std::fs::create_dir_all(home.join(".ssh/conf.d")).unwrap();
        std::fs::create_dir_all(etc.join("ssh_config.d")).unwrap();
        let user = home.join(".ssh/config");
        std::fs::write(&user, "Include conf.d/*\nHost box\n  User mine\n").unwrap();
        std::fs::write(home.join(".ssh/conf.d/a"), "Host box\n  Port 2200\n").unwrap();
        let system = etc.join("ssh_config");
        std::fs::write(
            &system,
            "Include ssh_config.d/*.conf\nHost *\n  User system\n  Port 22\n",
        )
        .unwrap();
        std::fs::write(
            etc.join("ssh_config.d/corp.conf"),
            "Host box\n  ProxyCommand corp-proxy %h\n",
        )
        .unwrap();
        let s = resolve_all(Some(&user), Some(&system), "box", Some(&home)).unwrap();
        assert_eq!(s.user.as_deref(), Some("mine"), "the user's file wins");
        assert_eq!(
            s.port,
            Some(2200),
            "the user's include is relative to ~/.ssh"
        );
        assert_eq!(
            s.proxy_command.as_deref(),
            Some("corp-proxy %h"),
            "the system include is relative to the system file's directory"
        );
        // No user file: the system file alone.
        let only = resolve_all(None, Some(&system), "box", Some(&home)).unwrap();
        assert_eq!(only.user.as_deref(), Some("system"));
    }

    #[test]
    fn a_fifo_or_a_shared_config_is_refused_without_blocking() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Without a writer, a blocking open of the FIFO would never return.
        let error = resolve(&fifo, "h", None).unwrap_err();
        assert!(error.to_string().contains("FIFO"), "{error}");
        let shared = dir.path().join("shared");
        std::fs::write(&shared, "Host h\n  Port 2222\n").unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o666)).unwrap();
        let error = resolve(&shared, "h", None).unwrap_err();
        assert!(
            error.to_string().contains("writable by group or others"),
            "{error}"
        );
        // A symlink to a private file is followed, as OpenSSH does.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&shared, &link).unwrap();
        assert_eq!(resolve(&link, "h", None).unwrap().port, Some(2222));
        assert_eq!(
            resolve(&dir.path().join("missing"), "h", None).unwrap(),
            HostSettings::default()
        );
    }

    #[test]
    fn reports_bad_lines_with_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, "Host a\n  Port nope\n").unwrap();
        let err = resolve(&path, "a", None).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "failed to parse ssh config {} line 2: bad port `nope`",
                path.display()
            )
        );
    }

    #[test]
    fn expands_tokens() {
        let tokens = Tokens {
            home: Some(Path::new("/home/me")),
            local_user: "me",
            host: "h",
            remote_user: "r",
            port: 22,
        };
        assert_eq!(
            expand_tokens("~/.ssh/%r@%h:%p-%u-%%", &tokens),
            PathBuf::from("/home/me/.ssh/r@h:22-me-%")
        );
        assert_eq!(expand_tokens("%d/k", &tokens), PathBuf::from("/home/me/k"));
    }
}
