//! Host defaults ([`host_defaults`]): the system directories a shell needs, `/etc` minus a
//! reviewed list of secrets, and the toolchains in the home directory minus their credential
//! files. Home directories, `/root`, SSH keys and credential stores are simply never listed,
//! so Landlock keeps them unreadable.
//!
//! Why `/etc` is decomposed: commands run as a capability-less root, which still reads every
//! root-owned file with an owner-read bit (`/etc/shadow` is 0640 root:shadow). Granting all of
//! `/etc` would expose password hashes and private keys, so each child of `/etc` gets its own
//! rule and the denied ones (and denied entries deeper down) get none.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::config::HostDefaults;

/// System trees a shell, coreutils, git, Python and compilers need: read + execute.
pub(crate) const SYSTEM_READ_EXEC: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/nix/store",
];

/// Kernel information many runtimes read (CPU count, cgroup CPU quota): read only.
const SYSTEM_READ: &[&str] = &["/sys/devices/system/cpu", "/sys/fs/cgroup"];

/// Entries of `/etc` that are never readable, relative to `/etc`; `*` matches within one
/// path component.
pub(crate) const ETC_DENIED: &[(&str, &str)] = &[
    ("shadow", "password hashes"),
    ("shadow-", "backup of the password hashes"),
    ("gshadow", "group password hashes"),
    ("gshadow-", "backup of the group password hashes"),
    (
        "security/opasswd",
        "old password hashes kept by pam_pwhistory",
    ),
    ("sudoers", "who may become root and how"),
    ("sudoers.d", "more sudo rules"),
    (
        "ssh/ssh_host_*_key",
        "the SSH server's private host keys (the .pub files stay)",
    ),
    ("ssl/private", "TLS private keys (Debian layout)"),
    ("pki/tls/private", "TLS private keys (Red Hat layout)"),
    (
        "letsencrypt",
        "certificate private keys and ACME account keys",
    ),
    ("krb5.keytab", "Kerberos host keys"),
    ("ipsec.secrets", "IPsec pre-shared and private keys"),
    ("ipsec.d/private", "IPsec private keys"),
    ("wireguard", "WireGuard private keys"),
    ("openvpn", "VPN keys and credentials"),
    ("NetworkManager/system-connections", "Wi-Fi and VPN secrets"),
    ("ppp/chap-secrets", "PPP passwords"),
    ("ppp/pap-secrets", "PPP passwords"),
    (
        "kubernetes",
        "cluster admin credentials (admin.conf) and the cluster PKI",
    ),
    ("mysql/debian.cnf", "the MySQL maintenance account password"),
    ("ldap.secret", "LDAP bind password"),
    ("credstore", "systemd service credentials"),
    ("credstore.encrypted", "systemd service credentials"),
];

/// A toolchain directory under the home directory: read + execute, minus credential files.
pub(crate) struct Toolchain {
    /// Path relative to the home directory.
    pub dir: &'static str,
    /// Entries (relative to `dir`) that hold credentials and stay unreadable.
    pub denied: &'static [&'static str],
    /// Environment variable pointing at the directory (the sandbox HOME is elsewhere).
    pub env: Option<&'static str>,
    /// Subdirectories to put on `PATH`.
    pub path: &'static [&'static str],
}

/// The toolchains granted by default, so `cargo test` or `python3 -m pytest` work.
pub(crate) const TOOLCHAINS: &[Toolchain] = &[
    // Rust: cargo, the registry sources, installed binaries; never the crates.io token.
    Toolchain {
        dir: ".cargo",
        denied: &["credentials", "credentials.toml"],
        env: Some("CARGO_HOME"),
        path: &["bin"],
    },
    // Rust toolchains managed by rustup.
    Toolchain {
        dir: ".rustup",
        denied: &[],
        env: Some("RUSTUP_HOME"),
        path: &[],
    },
    // Python versions managed by pyenv (its shims need PYENV_ROOT).
    Toolchain {
        dir: ".pyenv",
        denied: &[],
        env: Some("PYENV_ROOT"),
        path: &["shims", "bin"],
    },
    // Node versions managed by nvm.
    Toolchain {
        dir: ".nvm",
        denied: &[],
        env: Some("NVM_DIR"),
        path: &[],
    },
    // Bun and Deno installs.
    Toolchain {
        dir: ".bun",
        denied: &[],
        env: None,
        path: &["bin"],
    },
    Toolchain {
        dir: ".deno",
        denied: &[],
        env: None,
        path: &["bin"],
    },
    // pip --user / pipx installs: scripts and packages.
    Toolchain {
        dir: ".local/bin",
        denied: &[],
        env: None,
        path: &[""],
    },
    Toolchain {
        dir: ".local/lib",
        denied: &[],
        env: None,
        path: &[],
    },
];

/// The `PATH` after the toolchain directories.
pub(crate) const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Host defaults for the current `HOME` (`/root` when unset).
pub fn host_defaults() -> HostDefaults {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|home| home.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/root"));
    host_defaults_for_home(&home)
}

/// Host defaults with the toolchains of an explicit home directory (a backend configured
/// with its own home uses the same one for `~` and for the toolchains it grants).
pub fn host_defaults_for_home(home: &Path) -> HostDefaults {
    host_defaults_for(Path::new("/etc"), home)
}

/// Host defaults with an explicit `/etc` and home directory (tests use temporary ones).
pub(crate) fn host_defaults_for(etc: &Path, home: &Path) -> HostDefaults {
    let mut read_exec: Vec<PathBuf> = SYSTEM_READ_EXEC
        .iter()
        .map(PathBuf::from)
        .filter(|path| path.exists())
        .collect();
    let patterns: Vec<Vec<&str>> = ETC_DENIED
        .iter()
        .map(|(pattern, _)| pattern.split('/').collect())
        .collect();
    let mut denied = Vec::new();
    grant_tree_except(etc, etc, &patterns, &mut read_exec, &mut denied);
    let read = SYSTEM_READ
        .iter()
        .map(PathBuf::from)
        .filter(|path| path.exists())
        .collect();
    let mut env = Vec::new();
    let mut path_dirs: Vec<PathBuf> = Vec::new();
    for toolchain in TOOLCHAINS {
        let dir = home.join(toolchain.dir);
        let Ok(canonical) = dir.canonicalize() else {
            continue;
        };
        let patterns: Vec<Vec<&str>> = toolchain
            .denied
            .iter()
            .map(|pattern| pattern.split('/').collect())
            .collect();
        grant_tree_except(
            &canonical,
            &canonical,
            &patterns,
            &mut read_exec,
            &mut denied,
        );
        if let Some(name) = toolchain.env {
            env.push((OsString::from(name), canonical.clone().into_os_string()));
        }
        for sub in toolchain.path {
            let bin = if sub.is_empty() {
                canonical.clone()
            } else {
                canonical.join(sub)
            };
            if bin.is_dir() {
                path_dirs.push(bin);
            }
        }
    }
    let mut path = OsString::new();
    for dir in &path_dirs {
        path.push(dir.as_os_str());
        path.push(":");
    }
    path.push(SYSTEM_PATH);
    env.push((OsString::from("PATH"), path));
    HostDefaults {
        read_exec,
        read,
        env,
        denied,
    }
}

/// Whether `pattern` matches the name `name` (`*` matches any run of characters, at most one
/// `*` per component).
fn component_matches(pattern: &str, name: &OsStr) -> bool {
    let name = name.as_encoded_bytes();
    match pattern.split_once('*') {
        None => pattern.as_bytes() == name,
        Some((prefix, suffix)) => {
            name.len() >= prefix.len() + suffix.len()
                && name.starts_with(prefix.as_bytes())
                && name.ends_with(suffix.as_bytes())
        }
    }
}

/// Whether the relative path `rel` is matched by a pattern exactly (denied), or is a proper
/// prefix of one (contains denied entries).
fn classify(rel: &[&OsStr], patterns: &[Vec<&str>]) -> (bool, bool) {
    let mut denied = false;
    let mut contains = false;
    for pattern in patterns {
        if pattern.len() < rel.len() {
            continue;
        }
        let prefix_matches = rel
            .iter()
            .zip(pattern.iter())
            .all(|(name, component)| component_matches(component, name));
        if !prefix_matches {
            continue;
        }
        if pattern.len() == rel.len() {
            denied = true;
        } else {
            contains = true;
        }
    }
    (denied, contains)
}

/// Push `dir` (or, when it contains denied entries, its allowed children, recursively) onto
/// `out`, and the denied entries met on the way onto `denied`. Symlinked children are granted
/// by their target, unless the target is itself denied under `base`.
fn grant_tree_except(
    base: &Path,
    dir: &Path,
    patterns: &[Vec<&str>],
    out: &mut Vec<PathBuf>,
    denied_out: &mut Vec<PathBuf>,
) {
    let rel_of = |path: &Path| -> Option<Vec<OsString>> {
        path.strip_prefix(base)
            .ok()
            .map(|rel| rel.iter().map(OsStr::to_os_string).collect())
    };
    let Some(rel) = rel_of(dir) else {
        return;
    };
    let rel_refs: Vec<&OsStr> = rel.iter().map(OsString::as_os_str).collect();
    let (denied, contains) = classify(&rel_refs, patterns);
    if denied {
        denied_out.push(dir.to_path_buf());
        return;
    }
    if !contains {
        out.push(dir.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // The entry's type comes with `getdents` (a `stat` only where the filesystem gives none).
    let mut children: Vec<(PathBuf, std::fs::FileType)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            Some((entry.path(), entry.file_type().ok()?))
        })
        .collect();
    children.sort_by(|a, b| a.0.cmp(&b.0));
    for (child, file_type) in children {
        if file_type.is_symlink() {
            let Some(name) = child.file_name() else {
                continue;
            };
            let mut child_rel = rel_refs.clone();
            child_rel.push(name);
            if classify(&child_rel, patterns).0 {
                denied_out.push(child);
                continue;
            }
            // The rule lands on the target: refuse targets that are denied themselves.
            let Ok(target) = child.canonicalize() else {
                continue;
            };
            if let Some(target_rel) = rel_of(&target) {
                let target_refs: Vec<&OsStr> = target_rel.iter().map(OsString::as_os_str).collect();
                let (target_denied, target_contains) = classify(&target_refs, patterns);
                if target_denied || target_contains {
                    continue;
                }
            }
            out.push(child);
        } else if file_type.is_dir() {
            grant_tree_except(base, &child, patterns, out, denied_out);
        } else {
            let Some(name) = child.file_name() else {
                continue;
            };
            let mut child_rel = rel_refs.clone();
            child_rel.push(name);
            if classify(&child_rel, patterns).0 {
                denied_out.push(child);
            } else {
                out.push(child);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "x").unwrap();
    }

    fn granted(out: &[PathBuf], path: &Path) -> bool {
        out.iter().any(|rule| path.starts_with(rule))
    }

    /// A fake /etc with every denylist entry plus ordinary files around them.
    fn fake_etc() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path();
        for (pattern, _) in ETC_DENIED {
            touch(&etc.join(pattern.replace('*', "ed25519")).join("inner"));
        }
        for ok in [
            "passwd",
            "group",
            "hosts",
            "ssh/ssh_config",
            "ssh/ssh_host_ed25519_key.pub",
            "ssl/certs/ca.pem",
            "gitconfig",
        ] {
            touch(&etc.join(ok));
        }
        dir
    }

    #[test]
    fn every_etc_denylist_entry_is_withheld() {
        let dir = fake_etc();
        let etc = dir.path().canonicalize().unwrap();
        let mut out = Vec::new();
        let mut denied = Vec::new();
        let patterns: Vec<Vec<&str>> = ETC_DENIED
            .iter()
            .map(|(p, _)| p.split('/').collect())
            .collect();
        grant_tree_except(&etc, &etc, &patterns, &mut out, &mut denied);
        for (pattern, why) in ETC_DENIED {
            let path = etc.join(pattern.replace('*', "ed25519")).join("inner");
            assert!(
                !granted(&out, &path),
                "{pattern} ({why}) must not be readable"
            );
            assert!(
                granted(&denied, &path),
                "{pattern} ({why}) must be listed as denied"
            );
        }
        assert!(!denied.iter().any(|d| granted(&out, d)), "{denied:?}");
        for ok in [
            "passwd",
            "group",
            "hosts",
            "ssh/ssh_config",
            "ssh/ssh_host_ed25519_key.pub",
            "ssl/certs/ca.pem",
            "gitconfig",
        ] {
            assert!(granted(&out, &etc.join(ok)), "{ok} must stay readable");
        }
    }

    #[test]
    fn symlink_to_a_denied_entry_is_withheld() {
        let dir = fake_etc();
        let etc = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(etc.join("shadow"), etc.join("innocent")).unwrap();
        std::os::unix::fs::symlink(etc.join("hosts"), etc.join("hosts.link")).unwrap();
        let mut out = Vec::new();
        let patterns: Vec<Vec<&str>> = ETC_DENIED
            .iter()
            .map(|(p, _)| p.split('/').collect())
            .collect();
        grant_tree_except(&etc, &etc, &patterns, &mut out, &mut Vec::new());
        assert!(!out.contains(&etc.join("innocent")));
        assert!(out.contains(&etc.join("hosts.link")));
    }

    #[test]
    fn component_patterns_match_one_component() {
        assert!(component_matches(
            "ssh_host_*_key",
            OsStr::new("ssh_host_rsa_key")
        ));
        assert!(!component_matches(
            "ssh_host_*_key",
            OsStr::new("ssh_host_rsa_key.pub")
        ));
        assert!(component_matches("shadow", OsStr::new("shadow")));
        assert!(!component_matches("shadow", OsStr::new("shadow-")));
    }

    #[test]
    fn cargo_credentials_are_withheld_but_the_rest_is_granted() {
        let home = tempfile::tempdir().unwrap();
        let home_path = home.path().canonicalize().unwrap();
        touch(&home_path.join(".cargo/bin/cargo"));
        touch(&home_path.join(".cargo/registry/index/x"));
        touch(&home_path.join(".cargo/credentials.toml"));
        touch(&home_path.join(".ssh/id_ed25519"));
        touch(&home_path.join(".aws/credentials"));
        let etc = fake_etc();
        let defaults = host_defaults_for(etc.path(), &home_path);
        assert!(granted(
            &defaults.read_exec,
            &home_path.join(".cargo/bin/cargo")
        ));
        assert!(granted(
            &defaults.read_exec,
            &home_path.join(".cargo/registry/index/x")
        ));
        assert!(!granted(
            &defaults.read_exec,
            &home_path.join(".cargo/credentials.toml")
        ));
        assert!(!granted(
            &defaults.read_exec,
            &home_path.join(".ssh/id_ed25519")
        ));
        assert!(!granted(
            &defaults.read_exec,
            &home_path.join(".aws/credentials")
        ));
        assert!(!granted(&defaults.read_exec, &home_path));
        assert!(
            defaults
                .denied
                .contains(&home_path.join(".cargo/credentials.toml")),
            "{:?}",
            defaults.denied
        );
        let env: Vec<(String, String)> = defaults
            .env
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect();
        assert!(env.contains(&(
            "CARGO_HOME".to_owned(),
            home_path.join(".cargo").display().to_string()
        )));
        let path = &env.iter().find(|(k, _)| k == "PATH").unwrap().1;
        assert!(path.starts_with(&format!("{}:", home_path.join(".cargo/bin").display())));
        assert!(path.ends_with(SYSTEM_PATH));
    }
}
