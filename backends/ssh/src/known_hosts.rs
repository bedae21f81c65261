//! Host key verification against OpenSSH known_hosts files. Never trust on first use: an
//! unknown host is refused with the exact command that records its key, a changed key is
//! refused loudly with both fingerprints, a `@revoked` key is refused. Hashed host entries
//! (`|1|salt|hash`, HMAC-SHA1), `[host]:port` entries, wildcards and `!negation` are understood.
//! `@cert-authority` lines are recognised but host certificates are not supported: a host
//! known only through a CA is refused with a clear message.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use russh::keys::{HashAlg, PublicKey};
use sha1::Sha1;

use crate::config::pattern_list_match;
use crate::error::SshError;

/// The name a host has in known_hosts: `host` on port 22, `[host]:port` otherwise.
pub fn host_port_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_owned()
    } else {
        format!("[{host}]:{port}")
    }
}

/// The `ssh-keyscan` command that appends the host's keys to `file`.
pub fn trust_command(host: &str, port: u16, file: &Path) -> String {
    let file = cordon_remote::quote::quote(&file.to_string_lossy());
    let host = cordon_remote::quote::quote(host);
    if port == 22 {
        format!("ssh-keyscan {host} >> {file}")
    } else {
        format!("ssh-keyscan -p {port} {host} >> {file}")
    }
}

/// The command that records the keys of `host` (reached on `port`) under `alias`, its
/// `HostKeyAlias`: `ssh-keyscan` names the host it connected to, so the name is replaced.
pub fn alias_trust_command(alias: &str, host: &str, port: u16, file: &Path) -> String {
    // The alias is the replacement of a sed `s` command: its special characters escaped.
    let mut replacement = String::new();
    for ch in alias.chars() {
        if matches!(ch, '\\' | '/' | '&') {
            replacement.push('\\');
        }
        replacement.push(ch);
    }
    let script = cordon_remote::quote::quote(&format!("s/^[^ ]*/{replacement}/"));
    let file = cordon_remote::quote::quote(&file.to_string_lossy());
    let host = cordon_remote::quote::quote(host);
    format!("ssh-keyscan -p {port} {host} | sed {script} >> {file}")
}

/// `SHA256:…` fingerprint of a key.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    None,
    Revoked,
    CertAuthority,
}

#[derive(Clone, Debug)]
struct Entry {
    marker: Marker,
    hosts: String,
    key: Option<PublicKey>,
    location: String,
}

fn hashed_match(entry: &str, name: &str) -> bool {
    let mut parts = entry.trim_start_matches("|1|").splitn(2, '|');
    let (Some(salt), Some(hash)) = (parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(salt), Ok(hash)) = (STANDARD.decode(salt), STANDARD.decode(hash)) else {
        return false;
    };
    let Ok(mac) = Hmac::<Sha1>::new_from_slice(&salt) else {
        return false;
    };
    mac.chain_update(name.as_bytes())
        .verify_slice(&hash)
        .is_ok()
}

fn hosts_match(hosts: &str, name: &str) -> bool {
    if hosts.starts_with("|1|") {
        return hosts.split(',').any(|h| hashed_match(h, name));
    }
    pattern_list_match(hosts.split(','), name)
}

fn parse_file(path: &Path, text: &str, out: &mut Vec<Entry>) {
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let mut first = words.next().unwrap_or_default();
        let marker = match first {
            "@revoked" => Marker::Revoked,
            "@cert-authority" => Marker::CertAuthority,
            _ => Marker::None,
        };
        if marker != Marker::None {
            first = words.next().unwrap_or_default();
        }
        let (Some(_algorithm), Some(blob)) = (words.next(), words.next()) else {
            continue;
        };
        out.push(Entry {
            marker,
            hosts: first.to_owned(),
            // A key OpenSSH would skip (unknown type, bad base64) is skipped here too.
            key: russh::keys::parse_public_key_base64(blob).ok(),
            location: format!("{}:{}", path.display(), index + 1),
        });
    }
}

/// The outcome of checking a host key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A matching entry records this key.
    Trusted,
    /// Refused, with the reason.
    Refused(String),
}

/// The known_hosts files to consult for one host and the file new keys should go to.
#[derive(Clone, Debug)]
pub struct KnownHosts {
    /// Files, in order; missing files are skipped.
    pub files: Vec<PathBuf>,
}

impl KnownHosts {
    /// Check `key` offered by `host` (the name recorded in known_hosts: `HostKeyAlias` or
    /// `HostName`) on `port`. Errors are [`SshError`]s ready for the operator.
    pub fn check(&self, host: &str, port: u16, key: &PublicKey) -> Result<(), SshError> {
        let mut entries = Vec::new();
        for file in &self.files {
            match crate::config::read_ssh_file(file) {
                Ok(Some(text)) => parse_file(file, &text, &mut entries),
                Ok(None) => {}
                Err(source) => {
                    return Err(SshError::ReadKnownHosts {
                        path: file.clone(),
                        source,
                    });
                }
            }
        }
        let name = host_port_name(host, port);
        let offered_fp = fingerprint(key);
        let algorithm = key.algorithm().as_str().to_owned();
        let first_file = self
            .files
            .first()
            .cloned()
            .unwrap_or_else(|| PathBuf::from("~/.ssh/known_hosts"));
        let files_text = self
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let same_key = |e: &Entry| {
            e.key
                .as_ref()
                .is_some_and(|k| k.key_data() == key.key_data())
        };
        // A revoked key is refused whatever host it was recorded for.
        if let Some(revoked) = entries
            .iter()
            .find(|e| e.marker == Marker::Revoked && same_key(e))
        {
            return Err(SshError::RevokedHostKey {
                host_port: name,
                algorithm,
                fingerprint: offered_fp,
                location: revoked.location.clone(),
            });
        }
        let matching: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.marker != Marker::Revoked && hosts_match(&e.hosts, &name))
            .collect();
        if matching
            .iter()
            .any(|e| e.marker == Marker::None && same_key(e))
        {
            return Ok(());
        }
        let plain: Vec<&&Entry> = matching
            .iter()
            .filter(|e| e.marker == Marker::None && e.key.is_some())
            .collect();
        if !plain.is_empty() {
            let recorded = plain
                .iter()
                .filter_map(|e| {
                    e.key.as_ref().map(|k| {
                        format!(
                            "{} {} ({})",
                            k.algorithm().as_str(),
                            fingerprint(k),
                            e.location
                        )
                    })
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(SshError::ChangedHostKey {
                host_port: name,
                algorithm,
                fingerprint: offered_fp,
                recorded,
                known_hosts: files_text,
            });
        }
        if let Some(ca) = matching.iter().find(|e| e.marker == Marker::CertAuthority) {
            return Err(SshError::UnsupportedHostCertificate {
                host_port: name,
                reason: format!(
                    "the host is known only through the @cert-authority entry at {}",
                    ca.location
                ),
                trust_command: trust_command(host, port, &first_file),
            });
        }
        Err(SshError::UnknownHostKey {
            host_port: name,
            algorithm,
            fingerprint: offered_fp,
            known_hosts: files_text,
            trust_command: trust_command(host, port, &first_file),
        })
    }
}

impl KnownHosts {
    /// [`KnownHosts::check`] for a host whose keys are recorded under `alias`
    /// (`HostKeyAlias`): looked up by the alias alone whatever port the connection uses, as
    /// OpenSSH records and looks it up; the command to trust a new key records it under the
    /// alias. `host` and `port` are where the connection goes.
    pub fn check_alias(
        &self,
        alias: &str,
        host: &str,
        port: u16,
        key: &PublicKey,
    ) -> Result<(), SshError> {
        // Port 22 is the one known_hosts names without a port.
        self.check(alias, 22, key).map_err(|error| {
            let file = self
                .files
                .first()
                .cloned()
                .unwrap_or_else(|| PathBuf::from("~/.ssh/known_hosts"));
            let trust_command = alias_trust_command(alias, host, port, &file);
            match error {
                SshError::UnknownHostKey {
                    host_port,
                    algorithm,
                    fingerprint,
                    known_hosts,
                    trust_command: _,
                } => SshError::UnknownHostKey {
                    host_port,
                    algorithm,
                    fingerprint,
                    known_hosts,
                    trust_command,
                },
                SshError::UnsupportedHostCertificate {
                    host_port,
                    reason,
                    trust_command: _,
                } => SshError::UnsupportedHostCertificate {
                    host_port,
                    reason,
                    trust_command,
                },
                other => other,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "AAAAC3NzaC1lZDI1NTE5AAAAICQn8elkC5VnShk4aXresNsYGo/8S5hT2bU/0i4ND6YS";
    const KEY_B: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIPEa8KBGA3M9yQhBeQbiMb9MHE7JEvvFJKWEKBBdzRJy";

    fn key(blob: &str) -> PublicKey {
        russh::keys::parse_public_key_base64(blob).unwrap()
    }

    fn check(text: &str, host: &str, port: u16, offered: &str) -> Result<(), SshError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("known_hosts");
        std::fs::write(&file, text).unwrap();
        KnownHosts { files: vec![file] }.check(host, port, &key(offered))
    }

    fn hashed(name: &str) -> String {
        let salt = b"0123456789abcdefghij";
        let mac = Hmac::<Sha1>::new_from_slice(salt)
            .unwrap()
            .chain_update(name.as_bytes())
            .finalize()
            .into_bytes();
        format!("|1|{}|{}", STANDARD.encode(salt), STANDARD.encode(mac))
    }

    #[test]
    fn plain_bracketed_and_hashed_entries_trust() {
        check(&format!("h ssh-ed25519 {KEY_A}\n"), "h", 22, KEY_A).unwrap();
        check(&format!("[h]:2222 ssh-ed25519 {KEY_A}\n"), "h", 2222, KEY_A).unwrap();
        check(
            &format!("{} ssh-ed25519 {KEY_A}\n", hashed("[h]:2222")),
            "h",
            2222,
            KEY_A,
        )
        .unwrap();
        check(
            &format!("*.example ssh-ed25519 {KEY_A}\n"),
            "a.example",
            22,
            KEY_A,
        )
        .unwrap();
        // The port matters: an entry for port 22 does not vouch for 2222.
        let err = check(&format!("h ssh-ed25519 {KEY_A}\n"), "h", 2222, KEY_A).unwrap_err();
        assert!(matches!(err, SshError::UnknownHostKey { .. }), "{err}");
    }

    fn check_alias(text: &str, alias: &str, port: u16, offered: &str) -> Result<(), SshError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("known_hosts");
        std::fs::write(&file, text).unwrap();
        KnownHosts { files: vec![file] }.check_alias(alias, "10.1.2.3", port, &key(offered))
    }

    #[test]
    fn a_host_key_alias_is_looked_up_without_the_port() {
        // What `ssh` records for `HostKeyAlias box` on port 2222 is `box`, not `[box]:2222`.
        check_alias(&format!("box ssh-ed25519 {KEY_A}\n"), "box", 2222, KEY_A).unwrap();
        let changed =
            check_alias(&format!("box ssh-ed25519 {KEY_A}\n"), "box", 2222, KEY_B).unwrap_err();
        assert!(
            matches!(changed, SshError::ChangedHostKey { .. }),
            "{changed}"
        );
        let unknown = check_alias(
            &format!("[box]:2222 ssh-ed25519 {KEY_A}\n"),
            "box",
            2222,
            KEY_A,
        )
        .unwrap_err();
        let text = unknown.to_string();
        assert!(matches!(unknown, SshError::UnknownHostKey { .. }), "{text}");
        // The key is fetched from where the connection goes and recorded under the alias.
        assert!(
            text.contains("ssh-keyscan -p 2222 10.1.2.3 | sed 's/^[^ ]*/box/' >> "),
            "{text}"
        );
    }

    #[test]
    fn an_alias_trust_command_escapes_the_alias_for_sed() {
        assert_eq!(
            alias_trust_command("a/b&c", "h", 22, Path::new("/k")),
            "ssh-keyscan -p 22 h | sed 's/^[^ ]*/a\\/b\\&c/' >> /k"
        );
    }

    #[test]
    fn unknown_host_says_how_to_trust() {
        let err = check("", "10.1.2.3", 2222, KEY_A).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("is not in"), "{text}");
        assert!(text.contains(&fingerprint(&key(KEY_A))), "{text}");
        assert!(text.contains("ssh-keyscan -p 2222 10.1.2.3 >> "), "{text}");
    }

    #[test]
    fn changed_key_is_refused_with_both_fingerprints() {
        let err = check(&format!("h,other ssh-ed25519 {KEY_A}\n"), "h", 22, KEY_B).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("HAS CHANGED"), "{text}");
        assert!(text.contains(&fingerprint(&key(KEY_A))), "{text}");
        assert!(text.contains(&fingerprint(&key(KEY_B))), "{text}");
    }

    #[test]
    fn revoked_and_cert_authority() {
        let text = format!("h ssh-ed25519 {KEY_A}\n@revoked * ssh-ed25519 {KEY_A}\n");
        assert!(matches!(
            check(&text, "h", 22, KEY_A).unwrap_err(),
            SshError::RevokedHostKey { .. }
        ));
        let text = format!("@cert-authority *.corp ssh-ed25519 {KEY_B}\n");
        assert!(matches!(
            check(&text, "a.corp", 22, KEY_A).unwrap_err(),
            SshError::UnsupportedHostCertificate { .. }
        ));
    }

    #[test]
    fn negation_excludes_hosts() {
        let text = format!("*,!h ssh-ed25519 {KEY_A}\n");
        assert!(check(&text, "h", 22, KEY_A).is_err());
        check(&text, "g", 22, KEY_A).unwrap();
    }
}
