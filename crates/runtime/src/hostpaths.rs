//! Where Cordon's own host files may lie. Everything under a directory the sandbox can write
//! is the model's at any time, so a file Cordon writes or trusts must not be there:
//!
//! - the audit log and the `--save` transcript are refused there (a command could replace
//!   them with a symlink, a FIFO or a forged copy);
//! - the policy file is allowed there but made read-only to the session (commands and file
//!   tools), the way `.git` is: the policy a session runs with is never writable by it;
//! - directories later sessions read their policy and defaults from (the user's Cordon config
//!   directory) are made read-only the same way, whether or not they exist yet.
//!
//! Paths are compared canonically: the canonical parent directory of the file against the
//! canonical writable roots on the host.

use std::path::{Path, PathBuf};

use cordon_core::sandbox::{RootAccess, SandboxSpec};

/// The host directories a session's commands can write: the workspace root when writable and
/// the policy's extra writable roots, canonical (roots that do not exist are left out: the
/// sandbox cannot grant them either). `None` for `home` leaves `~/` roots out.
pub(crate) fn writable_host_roots(
    root: &Path,
    home: Option<&Path>,
    spec: &SandboxSpec,
) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let workspace = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    match spec.workspace {
        RootAccess::ReadWrite => roots.push(workspace.clone()),
        RootAccess::ReadOnly => {}
    }
    for configured in &spec.writable_roots {
        let expanded = match (configured.as_str(), home) {
            ("~", Some(home)) => home.to_path_buf(),
            (text, Some(home)) if text.starts_with("~/") => home.join(&text[2..]),
            (text, None) if text == "~" || text.starts_with("~/") => continue,
            (text, _) => workspace.join(text),
        };
        if let Ok(canonical) = std::fs::canonicalize(&expanded)
            && !roots.contains(&canonical)
        {
            roots.push(canonical);
        }
    }
    roots
}

/// `path` with its parent directory canonicalised (the final component is kept as given:
/// it may not exist yet, and a symlink there is refused when the file is opened).
pub(crate) fn canonical_location(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    std::fs::canonicalize(parent).ok().map(|dir| dir.join(name))
}

/// `path` with its deepest existing ancestor canonicalised and the missing rest appended
/// (`None` when the rest holds `..` or the path is relative): where a directory that may not
/// exist yet would be created.
pub(crate) fn canonical_future_location(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = std::fs::canonicalize(existing) {
            let mut out = canonical;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return Some(out);
        }
        let name = existing.file_name()?;
        if name == ".." {
            return None;
        }
        rest.push(name.to_owned());
        existing = existing.parent()?;
    }
}

/// The writable root `path` lies in, if any.
pub(crate) fn writable_root_of<'a>(roots: &'a [PathBuf], path: &Path) -> Option<&'a Path> {
    let location = canonical_location(path)?;
    roots
        .iter()
        .find(|root| location.starts_with(root))
        .map(PathBuf::as_path)
}

/// How the policy file is named in the spec's protected list: relative to the workspace
/// root when inside it, else absolute.
pub(crate) fn protected_name(workspace: &Path, policy: &Path) -> Option<String> {
    let location = canonical_location(policy)?;
    let workspace = std::fs::canonicalize(workspace).ok()?;
    let name = match location.strip_prefix(&workspace) {
        Ok(rel) => rel.to_str()?.to_owned(),
        Err(_) => location.to_str()?.to_owned(),
    };
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_located_through_its_deepest_existing_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(base.join("real")).unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("link")).unwrap();
        assert_eq!(
            canonical_future_location(&base.join("link/.config/cordon")),
            Some(base.join("real/.config/cordon"))
        );
        assert_eq!(
            canonical_future_location(&base.join("real")),
            Some(base.join("real"))
        );
        assert_eq!(canonical_future_location(Path::new("relative/x")), None);
    }

    #[test]
    fn files_are_located_through_their_canonical_parent() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let ws = base.join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir(base.join("cache")).unwrap();
        std::os::unix::fs::symlink(ws.join("sub"), base.join("alias")).unwrap();
        let spec = SandboxSpec {
            writable_roots: vec![base.join("cache").to_string_lossy().into_owned()],
            ..SandboxSpec::default()
        };
        let roots = writable_host_roots(&ws, None, &spec);
        assert_eq!(roots, vec![ws.clone(), base.join("cache")]);
        // Through a symlinked parent directory: still inside.
        assert_eq!(
            writable_root_of(&roots, &base.join("alias/audit.jsonl")),
            Some(ws.as_path())
        );
        assert_eq!(
            writable_root_of(&roots, &base.join("cache/x")),
            Some(base.join("cache").as_path())
        );
        assert_eq!(writable_root_of(&roots, &base.join("audit.jsonl")), None);
        assert_eq!(
            protected_name(&ws, &base.join("alias/policy.toml")).as_deref(),
            Some("sub/policy.toml")
        );
        let read_only = SandboxSpec {
            workspace: RootAccess::ReadOnly,
            ..SandboxSpec::default()
        };
        assert!(writable_host_roots(&ws, None, &read_only).is_empty());
    }
}
