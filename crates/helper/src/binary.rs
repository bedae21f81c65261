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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_are_named_as_uname_and_docker_name_them() {
        assert_eq!(elf_machine("x86_64"), Some(62));
        assert_eq!(elf_machine("amd64"), Some(62));
        assert_eq!(elf_machine("aarch64"), Some(183));
        assert_eq!(elf_machine("arm64"), Some(183));
        assert_eq!(elf_machine("riscv64"), None);
    }
}
