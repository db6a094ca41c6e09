//! MiniDebugInfo: the `.gnu_debugdata` section that Fedora and others leave in stripped
//! binaries, an xz-compressed ELF file whose `.symtab` names the functions `.dynsym` does not
//! (static ones included), by virtual address, as a separate debug file does.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::elf::ElfFile;
use crate::foreign::{self, Kind, Refusal};

/// A binary's MiniDebugInfo, decompressed into an anonymous in-memory file that lives as long
/// as this does, so that the symbolizer reads it by path like any ELF file.
#[derive(Debug)]
pub(crate) struct MiniDebugInfo {
    _file: File,
    path: PathBuf,
}

impl MiniDebugInfo {
    /// The decompressed `.gnu_debugdata` of `elf` (at `path`, for the warning); `None` when it
    /// has none, it is not an xz stream holding an ELF file, it would decompress to more than
    /// [`Kind::MiniDebugInfo`]'s bound (told by its chunk headers before anything is
    /// decompressed: the xz decoder holds a block's whole output in memory), or naming was
    /// interrupted meanwhile.
    pub(crate) fn extract(elf: &ElfFile, path: &Path) -> Option<Self> {
        let compressed = elf.section(".gnu_debugdata")?.data()?;
        let image = match decompress(compressed, Kind::MiniDebugInfo.bound()) {
            Ok(image) => image?,
            Err(refusal) => {
                foreign::warn(path, &refusal);
                return None;
            }
        };
        ElfFile::from_bytes(&image).ok()?;
        let (file, path) = in_memory(&image)?;
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

/// A buffer that refuses to grow past `bound`, and stops when naming is interrupted.
struct Bounded {
    image: Vec<u8>,
    bound: u64,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if (self.image.len() + buf.len()) as u64 > self.bound {
            return Err(io::Error::other("MiniDebugInfo larger than its bound"));
        }
        if crate::interrupt::interrupted() {
            return Err(io::ErrorKind::Interrupted.into());
        }
        self.image.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The xz stream `compressed`, decompressed if it holds no more than `bound` bytes; `Ok(None)`
/// when it is no xz stream, a refusal when it is too large.
pub(crate) fn decompress(compressed: &[u8], bound: u64) -> Result<Option<Vec<u8>>, Refusal> {
    let Some(size) = xz_size(compressed) else {
        return Ok(None);
    };
    if size > bound {
        return Err(Refusal::TooLarge {
            size,
            kind: Kind::MiniDebugInfo,
        });
    }
    let mut image = Bounded {
        image: Vec::new(),
        bound,
    };
    Ok(lzma_rs::xz_decompress(&mut &compressed[..], &mut image)
        .ok()
        .map(|()| image.image))
}

/// The size the first xz stream in `data` decompresses to, from its blocks' LZMA2 chunk headers
/// (each states its unpacked size, at most 2 MiB, and the packed size to skip to the next);
/// `None` when the stream is not laid out as xz with LZMA2 says.
fn xz_size(data: &[u8]) -> Option<u64> {
    const MAGIC: &[u8] = b"\xfd7zXZ\0";
    if !data.starts_with(MAGIC) || data.len() < 12 {
        return None;
    }
    // The stream flags' check type sets the size of the check after each block.
    let check_size = match data[7] & 0x0f {
        0 => 0,
        t @ 1..=3 => 4 << ((t - 1) / 3),
        t @ 4..=6 => 8 << ((t - 4) / 3),
        t @ 7..=9 => 16 << ((t - 7) / 3),
        t => 32 << ((t - 10) / 3),
    };
    let mut at = 12;
    let mut total: u64 = 0;
    loop {
        let block = at;
        let indicator = *data.get(at)?;
        if indicator == 0 {
            // The index: every block has been seen.
            return Some(total);
        }
        at += (usize::from(indicator) + 1) * 4;
        loop {
            let control = *data.get(at)?;
            let (unpacked, packed, header) = match control {
                0 => {
                    at += 1;
                    break;
                }
                1 | 2 => {
                    let size =
                        usize::from(u16::from_be_bytes([*data.get(at + 1)?, *data.get(at + 2)?]))
                            + 1;
                    (size as u64, size, 3)
                }
                0x80..=0xff => {
                    let unpacked = (u64::from(control & 0x1f) << 16)
                        + u64::from(u16::from_be_bytes([*data.get(at + 1)?, *data.get(at + 2)?]))
                        + 1;
                    let packed =
                        usize::from(u16::from_be_bytes([*data.get(at + 3)?, *data.get(at + 4)?]))
                            + 1;
                    // A chunk that resets the properties states them in one more byte.
                    let props = usize::from((control >> 5) & 3 >= 2);
                    (unpacked, packed, 5 + props)
                }
                _ => return None,
            };
            total = total.checked_add(unpacked)?;
            at = at.checked_add(header + packed)?;
        }
        // Block padding to a multiple of four bytes, then the check.
        at = block + (at - block).next_multiple_of(4) + check_size;
    }
}

#[cfg(test)]
mod tests {
    use super::xz_size;

    #[test]
    fn an_xz_streams_size_is_read_from_its_chunk_headers() {
        for len in [0usize, 1, 100_000, 5 << 20] {
            let data: Vec<u8> = (0..len)
                .map(|i| (i % 251) as u8 ^ (i / 7919) as u8)
                .collect();
            let mut compressed = Vec::new();
            lzma_rs::xz_compress(&mut &data[..], &mut compressed).unwrap();
            assert_eq!(xz_size(&compressed), Some(len as u64), "{len} bytes");
        }
        assert_eq!(xz_size(b"\xfd7zXZ\0\0\x01"), None);
        assert_eq!(xz_size(b"not xz at all"), None);
    }
}
