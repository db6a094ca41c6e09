//! The unwind data of one ELF file (executable, shared library or vDSO image): its loadable
//! segments, to place it in a process, and its CFI sections, copied once so that every process
//! mapping the file shares them.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use framehop::ExplicitModuleSectionInfo;
use object::elf::{self, FileHeader64};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use object::read::{ReadCache, ReadRef};
use object::Endianness;

use crate::maps::Mapping;

/// Page size the kernel maps ELF segments with on x86_64.
const PAGE: u64 = 4096;

/// One `PT_LOAD` program header.
#[derive(Debug, Clone, Copy)]
struct LoadSegment {
    offset: u64,
    vaddr: u64,
    filesz: u64,
    executable: bool,
}

/// A section's stated address range and its bytes.
#[derive(Debug, Clone)]
struct SectionBytes {
    svma: Range<u64>,
    data: Arc<[u8]>,
}

/// What framehop needs from one ELF file, parsed once.
#[derive(Debug)]
pub struct ModuleFile {
    loads: Vec<LoadSegment>,
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    eh_frame: Option<SectionBytes>,
    eh_frame_hdr: Option<SectionBytes>,
    debug_frame: Option<Arc<[u8]>>,
    build_id: Option<Vec<u8>>,
}

impl ModuleFile {
    /// Reads the headers and CFI sections of the ELF file at `path`; when the file has no CFI
    /// but a build-id, `.debug_frame` is looked for in the matching separate debug file.
    pub fn open(file: File, path: &Path) -> io::Result<Self> {
        let cache = ReadCache::new(file);
        let mut module = Self::parse(&cache).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("cannot read ELF unwind info from {}: {e}", path.display()),
            )
        })?;
        if !module.has_unwind_info() {
            module.debug_frame = module.debug_frame_from_debug_file();
        }
        Ok(module)
    }

    /// Parses an ELF image already in memory (the vDSO).
    pub(crate) fn from_bytes(data: &[u8]) -> Result<Self, object::Error> {
        Self::parse(data)
    }

    fn parse<'data, R: ReadRef<'data>>(data: R) -> Result<Self, object::Error> {
        let header = FileHeader64::<Endianness>::parse(data)?;
        let endian = header.endian()?;
        let loads = header
            .program_headers(endian, data)?
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .map(|ph| LoadSegment {
                offset: ph.p_offset(endian),
                vaddr: ph.p_vaddr(endian),
                filesz: ph.p_filesz(endian),
                executable: ph.p_flags(endian).contains(elf::PF_X),
            })
            .collect();
        let sections = header.sections(endian, data)?;
        let svma = |name: &[u8]| {
            let (_, s) = sections.section_by_name(endian, name)?;
            let start = s.sh_addr(endian);
            Some(start..start.checked_add(s.sh_size(endian))?)
        };
        // Compressed or NOBITS sections (stripped debug files) read as nothing useful.
        let bytes = |name: &[u8]| -> Option<Arc<[u8]>> {
            let (_, s) = sections.section_by_name(endian, name)?;
            if s.sh_type(endian) == elf::SHT_NOBITS
                || s.sh_flags(endian).contains(elf::SHF_COMPRESSED)
            {
                return None;
            }
            let data = s.data(endian, data).ok()?;
            (!data.is_empty()).then(|| Arc::from(data))
        };
        let with_svma = |name: &[u8]| {
            Some(SectionBytes {
                svma: svma(name)?,
                data: bytes(name)?,
            })
        };
        let mut build_id = None;
        for s in sections.iter() {
            let Ok(Some(mut notes)) = s.notes(endian, data) else {
                continue;
            };
            while let Ok(Some(note)) = notes.next() {
                if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
                    build_id = Some(note.desc().to_vec());
                }
            }
        }
        Ok(ModuleFile {
            loads,
            text_svma: svma(b".text"),
            got_svma: svma(b".got"),
            eh_frame: with_svma(b".eh_frame"),
            eh_frame_hdr: with_svma(b".eh_frame_hdr"),
            debug_frame: bytes(b".debug_frame"),
            build_id,
        })
    }

    /// Distributions install `.debug_frame` for stripped files in separate debug files found
    /// by build-id.
    fn debug_frame_from_debug_file(&self) -> Option<Arc<[u8]>> {
        let dirs = [PathBuf::from(stackscope_symbols::DEFAULT_DEBUG_DIR)];
        let path = stackscope_symbols::find_debug_file(&dirs, self.build_id.as_deref()?)?;
        let file = File::open(path).ok()?;
        let cache = ReadCache::new(file);
        Self::parse(&cache).ok()?.debug_frame
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
    pub(crate) fn bias(&self, mapping: &Mapping) -> Option<u64> {
        let covers = |seg: &&LoadSegment| {
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

    /// Section data for `framehop::Module::new`; ELF addresses are stated relative to 0.
    pub fn section_info(&self) -> ExplicitModuleSectionInfo<Arc<[u8]>> {
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
