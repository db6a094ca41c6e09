//! The unwind data of one ELF file (executable, shared library or vDSO image): its loadable
//! segments, to place it in a process, and its CFI sections, read through one read-only
//! mapping of the file that every process mapping the file shares. Mapped, not copied: the
//! pages are the page cache's, only those an unwind touches are resident, and the kernel may
//! drop them again under pressure.

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use framehop::ExplicitModuleSectionInfo;
use memmap2::Mmap;
use object::elf::{self, FileHeader64};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use object::Endianness;

use crate::Mapping;

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

/// Where a file's bytes live: a read-only mapping of the file, or a copy of an image read from
/// memory (the vDSO).
#[derive(Clone)]
enum Image {
    Mapped(Arc<Mmap>),
    Copied(Arc<[u8]>),
}

impl Image {
    fn bytes(&self) -> &[u8] {
        match self {
            Image::Mapped(map) => map,
            Image::Copied(bytes) => bytes,
        }
    }
}

/// The bytes of one section: a range of its file's [`Image`], which it keeps alive.
#[derive(Clone)]
pub struct SectionData {
    image: Image,
    range: Range<usize>,
}

impl SectionData {
    /// `part` must lie inside `image`'s bytes; `None` when it does not.
    fn within(image: &Image, part: &[u8]) -> Option<Self> {
        let start = (part.as_ptr() as usize).checked_sub(image.bytes().as_ptr() as usize)?;
        let range = start..start.checked_add(part.len())?;
        image.bytes().get(range.clone())?;
        Some(SectionData {
            image: image.clone(),
            range,
        })
    }
}

impl Deref for SectionData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.image.bytes()[self.range.clone()]
    }
}

/// No bytes (framehop's section info asks for a default).
impl Default for SectionData {
    fn default() -> Self {
        SectionData {
            image: Image::Copied(Arc::from([])),
            range: 0..0,
        }
    }
}

impl fmt::Debug for SectionData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SectionData({} bytes)", self.range.len())
    }
}

/// A section's stated address range and its bytes.
#[derive(Debug, Clone)]
struct SectionBytes {
    svma: Range<u64>,
    data: SectionData,
}

/// What framehop needs from one ELF file, parsed once.
#[derive(Debug)]
pub struct ModuleFile {
    loads: Vec<LoadSegment>,
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    eh_frame: Option<SectionBytes>,
    eh_frame_hdr: Option<SectionBytes>,
    debug_frame: Option<SectionData>,
    build_id: Option<Vec<u8>>,
}

impl ModuleFile {
    /// Reads the headers and CFI sections of the ELF file at `path`; when the file has no CFI
    /// but a build-id, `.debug_frame` is looked for in the matching separate debug file.
    pub fn open(file: File, path: &Path) -> io::Result<Self> {
        let mut module = Self::parse(&Image::Mapped(Arc::new(map(&file)?))).map_err(|e| {
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
    pub fn from_bytes(data: &[u8]) -> Result<Self, object::Error> {
        Self::parse(&Image::Copied(Arc::from(data)))
    }

    fn parse(image: &Image) -> Result<Self, object::Error> {
        let data = image.bytes();
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
        let bytes = |name: &[u8]| -> Option<SectionData> {
            let (_, s) = sections.section_by_name(endian, name)?;
            if s.sh_type(endian) == elf::SHT_NOBITS
                || s.sh_flags(endian).contains(elf::SHF_COMPRESSED)
            {
                return None;
            }
            let data = s.data(endian, data).ok()?;
            (!data.is_empty()).then(|| SectionData::within(image, data))?
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
    fn debug_frame_from_debug_file(&self) -> Option<SectionData> {
        let dirs = [PathBuf::from(stackscope_symbols::DEFAULT_DEBUG_DIR)];
        let path = stackscope_symbols::find_debug_file(&dirs, self.build_id.as_deref()?)?;
        let file = File::open(path).ok()?;
        Self::parse(&Image::Mapped(Arc::new(map(&file).ok()?)))
            .ok()?
            .debug_frame
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

/// Maps `file` read-only. Binaries are replaced, not rewritten in place, by installers and
/// linkers, so the mapping keeps showing the file the process mapped.
fn map(file: &File) -> io::Result<Mmap> {
    // SAFETY: the mapping is read-only and private; the file is an ELF binary, which is
    // replaced by a new file rather than changed in place.
    unsafe { Mmap::map(file) }
}
