//! Test doubles for the backend traits, for this crate's unit tests and other crates' tests.
//!
//! [`StdFiles`] implements [`FileOperations`] over `std::fs` with a lexical root check only —
//! it is NOT a confinement boundary (the real backends confine by kernel or remote-side
//! checks); it exists so tool logic can be tested without a backend crate.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use cordon_ops::{BackendId, DirEntry, FileKind, FileMeta, FileOperations, FsError, SpillWriter};

/// `std::fs`-backed [`FileOperations`] rooted at a directory (tests only).
#[derive(Debug)]
pub struct StdFiles {
    id: BackendId,
    root: PathBuf,
    home: Option<PathBuf>,
    spill_dir: PathBuf,
}

impl StdFiles {
    /// Files rooted at `root` (canonicalised); spill files go to `root/../<root name>.spill/`.
    pub fn new(root: &Path) -> Self {
        let root = std::fs::canonicalize(root).expect("test root must exist");
        let spill_dir = root.with_extension("spill");
        StdFiles {
            id: BackendId::new(format!("test:{}", root.display())),
            root,
            home: None,
            spill_dir,
        }
    }

    /// Builder: set the home directory used for `~`.
    pub fn with_home(mut self, home: &Path) -> Self {
        self.home = Some(home.to_path_buf());
        self
    }

    fn check(&self, path: &Path) -> Result<(), FsError> {
        if path.starts_with(&self.root) || path.starts_with(&self.spill_dir) {
            Ok(())
        } else {
            Err(FsError::OutsideRoot {
                path: path.to_path_buf(),
            })
        }
    }
}

fn kind_of(meta: &std::fs::Metadata) -> FileKind {
    if meta.is_file() {
        FileKind::File
    } else if meta.is_dir() {
        FileKind::Dir
    } else if meta.file_type().is_symlink() {
        FileKind::Symlink
    } else {
        FileKind::Other
    }
}

#[async_trait]
impl FileOperations for StdFiles {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn home(&self) -> Option<&Path> {
        self.home.as_deref()
    }

    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        self.check(path)?;
        tokio::fs::read(path)
            .await
            .map_err(|e| FsError::from_io("read", path, e))
    }

    async fn read_head(&self, path: &Path, max_bytes: usize) -> Result<Vec<u8>, FsError> {
        use tokio::io::AsyncReadExt;
        self.check(path)?;
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| FsError::from_io("open", path, e))?;
        let mut buf = Vec::with_capacity(max_bytes.min(1 << 16));
        file.take(max_bytes as u64)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| FsError::from_io("read", path, e))?;
        Ok(buf)
    }

    async fn read_range(
        &self,
        path: &Path,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, FsError> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        self.check(path)?;
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| FsError::from_io("open", path, e))?;
        file.seek(std::io::SeekFrom::Start(offset))
            .await
            .map_err(|e| FsError::from_io("read", path, e))?;
        let mut buf = Vec::with_capacity(max_bytes.min(1 << 16));
        file.take(max_bytes as u64)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| FsError::from_io("read", path, e))?;
        Ok(buf)
    }

    async fn write_file(&self, path: &Path, data: &[u8]) -> Result<(), FsError> {
        use std::os::unix::fs::PermissionsExt;
        self.check(path)?;
        let target = tokio::fs::canonicalize(path)
            .await
            .unwrap_or_else(|_| path.to_path_buf());
        let mode = tokio::fs::metadata(&target)
            .await
            .ok()
            .map(|m| m.permissions().mode());
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = target.with_file_name(format!(
            ".{}.cordon-tmp-{}",
            target
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("file"),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        tokio::fs::write(&tmp, data)
            .await
            .map_err(|e| FsError::from_io("write", path, e))?;
        if let Some(mode) = mode {
            let perms = std::fs::Permissions::from_mode(mode);
            tokio::fs::set_permissions(&tmp, perms)
                .await
                .map_err(|e| FsError::from_io("chmod", path, e))?;
        }
        tokio::fs::rename(&tmp, &target)
            .await
            .map_err(|e| FsError::from_io("rename", path, e))
    }

    async fn create_dir_all(&self, path: &Path) -> Result<(), FsError> {
        self.check(path)?;
        tokio::fs::create_dir_all(path)
            .await
            .map_err(|e| FsError::from_io("mkdir", path, e))
    }

    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
        use std::os::unix::fs::PermissionsExt;
        self.check(path)?;
        let meta = tokio::fs::metadata(path)
            .await
            .map_err(|e| FsError::from_io("stat", path, e))?;
        let mode = meta.permissions().mode() & 0o7777;
        Ok(FileMeta {
            kind: kind_of(&meta),
            size: meta.len(),
            mode,
            writable: mode & 0o222 != 0,
        })
    }

    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        self.check(path)?;
        let mut dir = tokio::fs::read_dir(path)
            .await
            .map_err(|e| FsError::from_io("list", path, e))?;
        let mut out = Vec::new();
        while let Some(entry) = dir
            .next_entry()
            .await
            .map_err(|e| FsError::from_io("list", path, e))?
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            match tokio::fs::metadata(entry.path()).await {
                Ok(meta) => out.push(DirEntry {
                    name,
                    kind: Some(kind_of(&meta)),
                    error: None,
                }),
                Err(e) => out.push(DirEntry {
                    name,
                    kind: None,
                    error: Some(e.to_string()),
                }),
            }
        }
        Ok(out)
    }

    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        let mut existing = path.to_path_buf();
        let mut rest = Vec::new();
        let resolved = loop {
            match tokio::fs::canonicalize(&existing).await {
                Ok(real) => break real,
                Err(_) => match (existing.parent(), existing.file_name()) {
                    (Some(parent), Some(name)) => {
                        rest.push(name.to_owned());
                        existing = parent.to_path_buf();
                    }
                    _ => {
                        return Err(FsError::NotFound {
                            path: path.to_path_buf(),
                        });
                    }
                },
            }
        };
        let full = rest.iter().rev().fold(resolved, |acc, name| acc.join(name));
        self.check(&full)?;
        Ok(full)
    }

    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        tokio::fs::create_dir_all(&self.spill_dir)
            .await
            .map_err(|e| FsError::from_io("mkdir", &self.spill_dir, e))?;
        let path = self
            .spill_dir
            .join(format!("cordon-bash-{:016x}.log", fastrand::u64(..)));
        let file = tokio::fs::File::create(&path)
            .await
            .map_err(|e| FsError::from_io("create", &path, e))?;
        Ok((path, Box::new(file)))
    }
}

/// A PNG "decompression bomb": an all-zero `width`×`height` RGBA image whose pixels compress
/// about 330:1 (an 11500×11500 image is 3.2 MB on disk and 529 MB decoded).
///
/// The deflate stream is written by hand (one fixed-Huffman block: a zero literal, then
/// 258-byte copies at distance 1) so a bomb of any size costs only its encoded bytes to make.
pub fn png_zero_bomb(width: u32, height: u32) -> Vec<u8> {
    let row = 1 + u64::from(width) * 4; // filter byte + RGBA pixels
    let raw = row * u64::from(height);
    let mut bits = BitWriter::default();
    bits.push(1, 1); // BFINAL
    bits.push(1, 2); // BTYPE = fixed Huffman
    let mut left = raw;
    let literal_zero = |bits: &mut BitWriter| bits.push_code(0x30, 8);
    if left > 0 {
        literal_zero(&mut bits);
        left -= 1;
    }
    while left >= 258 {
        bits.push_code(0xC5, 8); // length code 285: 258 bytes
        bits.push_code(0, 5); // distance code 0: distance 1
        left -= 258;
    }
    for _ in 0..left {
        literal_zero(&mut bits);
    }
    bits.push_code(0, 7); // end of block (256)
    let mut zlib = vec![0x78, 0x01];
    zlib.extend_from_slice(&bits.finish());
    // Adler-32 of `raw` zero bytes: a stays 1, b gains 1 per byte.
    let adler = (((raw % 65_521) << 16) | 1) as u32;
    zlib.extend_from_slice(&adler.to_be_bytes());

    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]); // 8-bit RGBA, deflate, no filter, no interlace
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png_chunk(&mut png, b"IHDR", &ihdr);
    png_chunk(&mut png, b"IDAT", &zlib);
    png_chunk(&mut png, b"IEND", &[]);
    png
}

fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    let length = u32::try_from(data.len()).expect("test chunks are under 4 GiB");
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&[kind.as_slice(), data].concat());
    out.extend_from_slice(&crc.to_be_bytes());
}

fn crc32(bytes: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|mut c| {
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            c
        })
        .collect();
    !bytes.iter().fold(!0u32, |crc, &byte| {
        table[((crc ^ u32::from(byte)) & 0xFF) as usize] ^ (crc >> 8)
    })
}

/// Deflate's bit order: values least significant bit first, Huffman codes most significant
/// bit first.
#[derive(Default)]
struct BitWriter {
    bytes: Vec<u8>,
    current: u8,
    used: u8,
}

impl BitWriter {
    fn push(&mut self, value: u32, count: u8) {
        for i in 0..count {
            self.bit((value >> i) & 1 == 1);
        }
    }

    fn push_code(&mut self, code: u32, count: u8) {
        for i in (0..count).rev() {
            self.bit((code >> i) & 1 == 1);
        }
    }

    fn bit(&mut self, set: bool) {
        self.current |= u8::from(set) << self.used;
        self.used += 1;
        if self.used == 8 {
            self.bytes.push(self.current);
            (self.current, self.used) = (0, 0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        if self.used > 0 {
            self.bytes.push(self.current);
        }
        self.bytes
    }
}
