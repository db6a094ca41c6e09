//! Where an ELF file's bytes live, and sections as ranges of them.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use memmap2::Mmap;

/// A read-only mapping of a file, or a copy of an image read from memory (the vDSO). Mapped,
/// not copied: the pages are the page cache's, only those read are resident, and the kernel
/// may drop them again under pressure.
#[derive(Clone)]
pub(crate) enum ElfBytes {
    Mapped(Arc<Mmap>),
    Copied(Arc<[u8]>),
}

impl ElfBytes {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            ElfBytes::Mapped(map) => map,
            ElfBytes::Copied(bytes) => bytes,
        }
    }
}

/// The bytes of one section: a range of its file's bytes, which it keeps alive, so every
/// process mapping a file shares one mapping of it.
#[derive(Clone)]
pub struct SectionData {
    bytes: ElfBytes,
    range: Range<usize>,
}

impl SectionData {
    /// `range` must lie inside `bytes`.
    pub(crate) fn new(bytes: &ElfBytes, range: Range<usize>) -> Self {
        debug_assert!(range.end <= bytes.bytes().len());
        SectionData {
            bytes: bytes.clone(),
            range,
        }
    }

    /// A section's bytes as rewritten by a reader that needed them otherwise.
    pub fn copied(bytes: Vec<u8>) -> Self {
        let range = 0..bytes.len();
        SectionData {
            bytes: ElfBytes::Copied(Arc::from(bytes)),
            range,
        }
    }
}

impl Deref for SectionData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes.bytes()[self.range.clone()]
    }
}

/// No bytes (framehop's section info asks for a default).
impl Default for SectionData {
    fn default() -> Self {
        SectionData {
            bytes: ElfBytes::Copied(Arc::from([])),
            range: 0..0,
        }
    }
}

impl fmt::Debug for SectionData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SectionData({} bytes)", self.range.len())
    }
}
