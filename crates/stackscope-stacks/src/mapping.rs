//! Where a module sits in an address space: one mapping of a file (or a pseudo-file such as
//! the vDSO) at an address, as the kernel reports it or a GDB stub lists it.

use std::sync::Arc;

/// One executable mapping of a file (or a pseudo-file such as `[vdso]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Offset in the file of the byte mapped at `start`.
    pub offset: u64,
    /// Path of the mapped file as the kernel reports it, e.g. `/usr/lib/x86_64-linux-gnu/libc.so.6`,
    /// `[vdso]`, or `//anon` for anonymous executable memory (JIT code).
    pub path: Arc<str>,
    /// GNU build-id, when the kernel reported one.
    pub build_id: Option<Arc<[u8]>>,
}

impl Mapping {
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// Offset in the mapped file of the byte at `addr`.
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }

    /// True for mappings backed by a regular file we can open and read ELF (or, for a
    /// Windows image, PE) from: an absolute path, `C:\...` for a Windows image.
    pub fn is_file(&self) -> bool {
        let windows = self.path.as_bytes().get(1..3) == Some(b":\\");
        windows || (self.path.starts_with('/') && !self.path.starts_with("//anon"))
    }

    /// True for a JIT runtime's jitdump (`jit-PID.dump`), which it maps only so that
    /// profilers learn where it is.
    pub fn is_jitdump(&self) -> bool {
        let name = self.path.rsplit('/').next().unwrap_or_default();
        name.strip_prefix("jit-")
            .and_then(|rest| rest.strip_suffix(".dump"))
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
    }
}
