//! MiniDebugInfo: the `.gnu_debugdata` section that Fedora and others leave in stripped
//! binaries, an xz-compressed ELF file whose `.symtab` names the functions `.dynsym` does not
//! (static ones included), by virtual address, as a separate debug file does.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::elf::ElfFile;

/// More than any symbol table needs: a section that decompresses to more is not one.
const MAX_SIZE: usize = 256 << 20;

/// A binary's MiniDebugInfo, decompressed into an anonymous in-memory file that lives as long
/// as this does, so that the symbolizer reads it by path like any ELF file.
#[derive(Debug)]
pub(crate) struct MiniDebugInfo {
    _file: File,
    path: PathBuf,
}

impl MiniDebugInfo {
    /// The decompressed `.gnu_debugdata` of `elf`; `None` when it has none, or it is not an
    /// xz stream holding an ELF file.
    pub(crate) fn extract(elf: &ElfFile) -> Option<Self> {
        let compressed = elf.section(".gnu_debugdata")?.data()?;
        let mut image = Bounded(Vec::new());
        lzma_rs::xz_decompress(&mut &compressed[..], &mut image).ok()?;
        ElfFile::from_bytes(&image.0).ok()?;
        let (file, path) = in_memory(&image.0)?;
        Some(MiniDebugInfo { _file: file, path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// `image` in an anonymous in-memory file, and the path that opens it.
#[cfg(target_os = "linux")]
fn in_memory(image: &[u8]) -> Option<(File, PathBuf)> {
    use std::os::fd::AsRawFd;
    let mut file = memfd()?;
    file.write_all(image).ok()?;
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    Some((file, path))
}

/// MiniDebugInfo is a Linux distributions' habit, and anonymous files by path are Linux's.
#[cfg(not(target_os = "linux"))]
fn in_memory(_: &[u8]) -> Option<(File, PathBuf)> {
    None
}

/// An anonymous file in memory, closed on exec.
#[cfg(target_os = "linux")]
fn memfd() -> Option<File> {
    // SAFETY: the name is NUL-terminated; the returned descriptor is ours alone.
    let fd = unsafe { libc::memfd_create(c"stackscope-debugdata".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Some(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// A buffer that refuses to grow past [`MAX_SIZE`], so a hostile section cannot fill memory.
struct Bounded(Vec<u8>);

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.len() + buf.len() > MAX_SIZE {
            return Err(io::Error::other(
                "MiniDebugInfo larger than any symbol table",
            ));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
