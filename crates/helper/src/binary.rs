//! Which `cordon-helper` build runs where: the architectures Cordon builds it for and a check
//! that a file is an executable for one of them (the SSH backend before an upload, the Docker
//! backend before a bind mount). It does not find the file (see `locate_helper`).

/// The ELF machine numbers of the architectures Cordon builds a helper for, by the names
/// `uname -m` gives them.
pub const ARCHITECTURES: &[(&str, u16, &str)] = &[
    // (uname -m, e_machine, the helper's suffix)
    ("x86_64", 62, "x86_64"),
    ("amd64", 62, "x86_64"),
    ("aarch64", 183, "aarch64"),
    ("arm64", 183, "aarch64"),
];

/// Whether `head` (the first bytes of a file) is a 64-bit little-endian ELF executable for
/// `machine`; the error says what it is instead.
pub fn check_elf(head: &[u8], machine: u16) -> Result<(), String> {
    if head.len() < 20 || &head[..4] != b"\x7fELF" {
        return Err("it is not an ELF executable".to_owned());
    }
    if head[4] != 2 || head[5] != 1 {
        return Err("it is not a 64-bit little-endian ELF file".to_owned());
    }
    let kind = u16::from_le_bytes([head[16], head[17]]);
    if kind != 2 && kind != 3 {
        return Err(format!("its ELF type {kind} is not an executable"));
    }
    let found = u16::from_le_bytes([head[18], head[19]]);
    if found != machine {
        let name = ARCHITECTURES
            .iter()
            .find(|(_, m, _)| *m == found)
            .map(|(_, _, suffix)| (*suffix).to_owned())
            .unwrap_or_else(|| format!("ELF machine {found}"));
        return Err(format!("it is built for {name}"));
    }
    Ok(())
}

/// The ELF machine number of the helper build for an architecture as `uname -m` (or
/// `docker info`) names it.
pub fn elf_machine(arch: &str) -> Option<u16> {
    ARCHITECTURES
        .iter()
        .find(|(name, _, _)| *name == arch)
        .map(|(_, machine, _)| *machine)
}

/// Largest file Cordon reads as a helper binary (a static build is tens of MiB).
pub const MAX_BINARY_BYTES: u64 = 256 << 20;

/// The first `limit` bytes of the helper binary at `path` (`usize::MAX`: all of it). Whatever
/// sits at the path, the read is bounded: a FIFO does not block the open (`O_NONBLOCK`) and is
/// refused with anything else that is not a regular file, and a file larger than
/// [`MAX_BINARY_BYTES`] (a sparse 1 TiB file, say) is refused before anything is read.
pub fn read_binary(path: &std::path::Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "not a regular file: a helper binary must be one",
        ));
    }
    if meta.len() > MAX_BINARY_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{} bytes, more than the {MAX_BINARY_BYTES} a helper binary may have",
                meta.len()
            ),
        ));
    }
    let mut bytes = Vec::new();
    file.take(u64::try_from(limit).unwrap_or(u64::MAX))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_binary_is_bounded_whatever_sits_at_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("helper");
        std::fs::write(&file, b"\x7fELF and the rest").unwrap();
        assert_eq!(read_binary(&file, 4).unwrap(), b"\x7fELF");
        assert_eq!(read_binary(&file, usize::MAX).unwrap().len(), 17);
        // A FIFO: refused at once, never waiting for a writer.
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let error = read_binary(&fifo, 64).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        let error = read_binary(dir.path(), 64).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        // A sparse 1 TiB file: refused by its size before anything is read.
        let huge = dir.path().join("huge");
        std::fs::File::create(&huge)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let error = read_binary(&huge, usize::MAX).unwrap_err();
        assert!(error.to_string().contains("more than"), "{error}");
    }

    #[test]
    fn architectures_are_named_as_uname_and_docker_name_them() {
        assert_eq!(elf_machine("x86_64"), Some(62));
        assert_eq!(elf_machine("amd64"), Some(62));
        assert_eq!(elf_machine("aarch64"), Some(183));
        assert_eq!(elf_machine("arm64"), Some(183));
        assert_eq!(elf_machine("riscv64"), None);
    }
}
