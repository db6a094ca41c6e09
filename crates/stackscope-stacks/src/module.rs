//! The unwind data of one ELF file (executable, shared library or vDSO image): its loadable
//! segments, to place it in a process, and its CFI sections, read by the one ELF reader
//! ([`stackscope_symbols::elf`]) as ranges of one read-only mapping of the file that every
//! process mapping the file shares. Mapped, not copied: the pages are the page cache's, only
//! those an unwind touches are resident, and the kernel may drop them again under pressure.
//! The one exception is an aarch64 file whose `.eh_frame` says where return addresses are
//! signed ([`ra_state`]): that section is a copy with those instructions made no-ops.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::Path;

use framehop::ExplicitModuleSectionInfo;
use object::elf;
use stackscope_symbols::elf::{ElfError, ElfFile, Section, Segment};

use crate::Mapping;

mod ra_state;

pub use stackscope_symbols::elf::SectionData;

/// Page size the kernel maps ELF segments with on x86_64.
const PAGE: u64 = 4096;

/// A section's stated address range and its bytes.
#[derive(Debug, Clone)]
struct SectionBytes {
    svma: Range<u64>,
    data: SectionData,
}

impl SectionBytes {
    fn of(section: Section<'_>) -> Option<Self> {
        Some(SectionBytes {
            svma: section.svma()?,
            data: section.shared()?,
        })
    }
}

/// What framehop needs from one ELF file, read once.
#[derive(Debug)]
pub struct ModuleFile {
    loads: Vec<Segment>,
    text_svma: Option<Range<u64>>,
    /// `.text`, for the instructions at a leaf of code without CFI.
    text: Option<SectionBytes>,
    got_svma: Option<Range<u64>>,
    eh_frame: Option<SectionBytes>,
    eh_frame_hdr: Option<SectionBytes>,
    debug_frame: Option<SectionData>,
    build_id: Option<Vec<u8>>,
    /// The header's `e_machine`: which architecture it is built for ([`crate::arch`] says
    /// which of those stackscope walks).
    pub(crate) machine: elf::Machine,
}

impl ModuleFile {
    /// Reads the headers and CFI sections of the ELF file `file` (at `path`); when the file
    /// has no CFI but a build-id, `.debug_frame` is looked for in the matching separate debug
    /// file.
    pub fn open(file: File, path: &Path) -> io::Result<Self> {
        ElfFile::map(&file)
            .and_then(|elf| Self::new(&elf))
            .map_err(|e| match e {
                ElfError::Io(e) => e,
                e => io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("cannot read ELF unwind info from {}: {e}", path.display()),
                ),
            })
    }

    /// The unwind view of a 64-bit ELF file read from disk, with `.debug_frame` from its
    /// separate debug file when it has no CFI of its own.
    pub fn new(elf: &ElfFile) -> Result<Self, ElfError> {
        let mut module = Self::parse(elf)?;
        if !module.has_unwind_info() {
            module.debug_frame = module.debug_frame_from_debug_file();
        }
        Ok(module)
    }

    /// Reads a 64-bit ELF image already in memory (the vDSO).
    pub fn from_bytes(data: &[u8]) -> Result<Self, ElfError> {
        Self::parse(&ElfFile::from_bytes(data)?)
    }

    fn parse(elf: &ElfFile) -> Result<Self, ElfError> {
        if !elf.is_64() {
            return Err(ElfError::Not64Bit);
        }
        let svma = |name: &str| elf.section(name)?.svma();
        let with_svma = |name: &str| SectionBytes::of(elf.section(name)?);
        let mut eh_frame = with_svma(".eh_frame");
        if elf.machine() == elf::EM_AARCH64 {
            if let Some(section) = eh_frame.as_mut() {
                if let Some(patched) = ra_state::without_ra_state(&section.data) {
                    section.data = SectionData::copied(patched);
                }
            }
        }
        Ok(ModuleFile {
            loads: elf.segments().to_vec(),
            text_svma: svma(".text"),
            text: with_svma(".text"),
            got_svma: svma(".got"),
            eh_frame,
            eh_frame_hdr: with_svma(".eh_frame_hdr"),
            debug_frame: debug_frame(elf),
            build_id: elf.build_id().map(<[u8]>::to_vec),
            machine: elf.machine(),
        })
    }

    /// Distributions install `.debug_frame` for stripped files in separate debug files found
    /// by build-id.
    fn debug_frame_from_debug_file(&self) -> Option<SectionData> {
        let debug_files = stackscope_symbols::DebugFiles::from_env();
        let path = debug_files.by_build_id(self.build_id.as_deref()?)?;
        debug_frame(&ElfFile::open(&path).ok()?)
    }

    /// True when the file has `.eh_frame` or `.debug_frame`.
    pub fn has_unwind_info(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    /// The load bias of this file in a process, from the mapping of one of its executable
    /// segments: the mapping starts at the page holding the segment's first byte, so
    /// `avma = mapping.start + (file_offset - mapping.offset)` for any offset inside it, and
    /// the bias is that avma minus the segment's stated address. A file's first mapping
    /// usually is not its text, and non-PIE files have a non-zero `p_vaddr`, so
    /// `mapping.start` alone is not the base.
    pub fn bias(&self, mapping: &Mapping) -> Option<u64> {
        let covers = |seg: &&Segment| {
            let first_page = seg.offset & !(PAGE - 1);
            first_page <= mapping.offset && mapping.offset < seg.offset.saturating_add(seg.filesz)
        };
        let seg = self
            .loads
            .iter()
            .filter(|s| s.executable)
            .find(covers)
            .or_else(|| self.loads.iter().find(covers))?;
        Some(
            mapping
                .start
                .wrapping_sub(mapping.offset)
                .wrapping_add(seg.offset)
                .wrapping_sub(seg.vaddr),
        )
    }

    /// The 8-byte word of `.text` at the stated address `svma`, as the walk reads code.
    pub fn text_word(&self, svma: u64) -> Option<u64> {
        let text = self.text.as_ref()?;
        let offset = usize::try_from(svma.checked_sub(text.svma.start)?).ok()?;
        let word = text.data.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(word.try_into().ok()?))
    }

    /// Section data for `framehop::Module::new`; ELF addresses are stated relative to 0.
    pub fn section_info(&self) -> ExplicitModuleSectionInfo<SectionData> {
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text_svma.clone(),
            got_svma: self.got_svma.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|s| s.svma.clone()),
            eh_frame: self.eh_frame.as_ref().map(|s| s.data.clone()),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|s| s.svma.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|s| s.data.clone()),
            debug_frame: self.debug_frame.clone(),
            ..Default::default()
        }
    }
}

/// `.debug_frame`, where unwinders look when there is no `.eh_frame`.
fn debug_frame(elf: &ElfFile) -> Option<SectionData> {
    elf.section(".debug_frame")?.shared()
}
