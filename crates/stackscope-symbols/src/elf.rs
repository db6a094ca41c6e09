//! The one ELF reader: every part of stackscope that looks into an ELF file (the symbolizer,
//! the unwinders, gdb's target image, perf.data's build-id check, the eBPF probes' functions
//! and USDT notes) maps it once through [`ElfFile`] and asks it for what it needs. Section
//! bytes are ranges of that one mapping.

mod bytes;
mod functions;
mod notes;

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use object::elf::{self, FileHeader32, FileHeader64};
use object::read::elf::{FileHeader, NoteIterator, ProgramHeader, SectionHeader};
use object::Endianness;

pub use bytes::SectionData;
pub use functions::{Function, SymbolTable};
pub use notes::Note;

use bytes::ElfBytes;

const MAGIC: &[u8; 4] = b"\x7fELF";

/// Why a file cannot be read as ELF.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// It cannot be opened, read or mapped.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// It does not start with the ELF magic.
    #[error("not an ELF file")]
    NotElf,
    /// Its file header cannot be read, or is of a kind not supported.
    #[error("{0}")]
    Header(object::Error),
    /// Its program headers, section headers or section names cannot be read.
    #[error("{0}")]
    Tables(object::Error),
    /// A 32-bit file where only 64-bit ones can be used.
    #[error("not a 64-bit ELF file")]
    Not64Bit,
}

/// One `PT_LOAD` program header.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub executable: bool,
}

impl Segment {
    /// The virtual address file offset `offset` is loaded at, when this segment holds it.
    pub fn vaddr_of(&self, offset: u64) -> Option<u64> {
        let delta = offset.checked_sub(self.offset)?;
        (delta < self.filesz).then(|| self.vaddr.wrapping_add(delta))
    }

    /// The file offset of virtual address `vaddr`, when this segment holds it in the file.
    pub fn offset_of(&self, vaddr: u64) -> Option<u64> {
        let delta = vaddr.checked_sub(self.vaddr)?;
        (delta < self.filesz).then(|| self.offset.wrapping_add(delta))
    }
}

/// One section header, as read when the file is opened.
#[derive(Debug)]
struct SectionEntry {
    name: Box<[u8]>,
    address: u64,
    size: u64,
    /// Where its bytes lie in the file; `None` for no bytes, `SHT_NOBITS` (stripped debug
    /// files) and compressed sections, which read as nothing useful.
    data: Option<Range<usize>>,
}

/// One section of an [`ElfFile`].
#[derive(Clone, Copy)]
pub struct Section<'a> {
    entry: &'a SectionEntry,
    bytes: &'a ElfBytes,
}

impl<'a> Section<'a> {
    /// Its stated address (`sh_addr`).
    pub fn address(&self) -> u64 {
        self.entry.address
    }

    /// Its stated size (`sh_size`), which `SHT_NOBITS` sections state too.
    pub fn size(&self) -> u64 {
        self.entry.size
    }

    /// The addresses it states it occupies; `None` when they overflow.
    pub fn svma(&self) -> Option<Range<u64>> {
        let start = self.entry.address;
        Some(start..start.checked_add(self.entry.size)?)
    }

    /// Its bytes, when it has any in the file (not `SHT_NOBITS`, not compressed).
    pub fn data(&self) -> Option<&'a [u8]> {
        Some(&self.bytes.bytes()[self.entry.data.clone()?])
    }

    /// Its bytes as a range of the file's one mapping, kept alive by the result.
    pub fn shared(&self) -> Option<SectionData> {
        Some(SectionData::new(self.bytes, self.entry.data.clone()?))
    }
}

/// An ELF file (32- or 64-bit), mapped once, with its headers read.
pub struct ElfFile {
    bytes: ElfBytes,
    is_64: bool,
    big_endian: bool,
    kind: elf::FileType,
    machine: elf::Machine,
    entry: u64,
    segments: Vec<Segment>,
    sections: Vec<SectionEntry>,
    build_id: Option<Vec<u8>>,
}

impl std::fmt::Debug for ElfFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ElfFile({} bytes)", self.bytes.bytes().len())
    }
}

impl ElfFile {
    /// Maps the ELF file at `path`, opened as a file others named ([`crate::foreign`]).
    pub fn open(path: &Path) -> Result<Self, ElfError> {
        let file =
            crate::foreign::open(path, crate::foreign::Kind::Binary).map_err(io::Error::from)?;
        Self::map(&file)
    }

    /// Maps `file` read-only, after checking its magic. Binaries are replaced, not rewritten
    /// in place, by installers and linkers, so the mapping keeps showing the file opened.
    pub fn map(file: &File) -> Result<Self, ElfError> {
        let mut magic = [0u8; 4];
        match read_at(file, &mut magic, 0) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ElfError::NotElf),
            Err(e) => return Err(ElfError::Io(e)),
            Ok(()) if magic != *MAGIC => return Err(ElfError::NotElf),
            Ok(()) => {}
        }
        // SAFETY: the mapping is read-only and private; a binary truncated while we read it is
        // the same hazard every profiler (and blazesym itself) accepts.
        let map = unsafe { Mmap::map(file) }?;
        Self::parse(ElfBytes::Mapped(Arc::new(map)))
    }

    /// Reads an ELF image already in memory (the vDSO), copying it.
    pub fn from_bytes(data: &[u8]) -> Result<Self, ElfError> {
        Self::parse(ElfBytes::Copied(Arc::from(data)))
    }

    fn parse(bytes: ElfBytes) -> Result<Self, ElfError> {
        let data = bytes.bytes();
        if !data.starts_with(MAGIC) {
            return Err(ElfError::NotElf);
        }
        if data.get(4) == Some(&elf::ELFCLASS32.0) {
            read::<FileHeader32<Endianness>>(bytes)
        } else {
            read::<FileHeader64<Endianness>>(bytes)
        }
    }

    /// All of the file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.bytes()
    }

    pub fn is_64(&self) -> bool {
        self.is_64
    }

    /// Whether its multi-byte fields are big-endian.
    pub fn is_big_endian(&self) -> bool {
        self.big_endian
    }

    /// `e_type`: `ET_EXEC`, `ET_DYN`, ...
    pub fn kind(&self) -> elf::FileType {
        self.kind
    }

    /// `e_machine`: `EM_X86_64`, ...
    pub fn machine(&self) -> elf::Machine {
        self.machine
    }

    /// The entry point the file states (before relocation).
    pub fn entry(&self) -> u64 {
        self.entry
    }

    /// The `PT_LOAD` segments, in file order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The GNU build-id note: from the section headers, or the program headers without them.
    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    /// The first section named `name`.
    pub fn section(&self, name: &str) -> Option<Section<'_>> {
        let entry = self.sections.iter().find(|s| *s.name == *name.as_bytes())?;
        Some(Section {
            entry,
            bytes: &self.bytes,
        })
    }

    fn section_at(&self, index: usize) -> Option<Section<'_>> {
        Some(Section {
            entry: self.sections.get(index)?,
            bytes: &self.bytes,
        })
    }
}

/// Reads `buf.len()` bytes at `offset` (on Unix, without moving the position callers share).
#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.seek_read(&mut buf[done..], offset + done as u64)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => done += n,
        }
    }
    Ok(())
}

/// Reads the headers of a file of class `Elf`.
fn read<Elf: FileHeader<Endian = Endianness>>(bytes: ElfBytes) -> Result<ElfFile, ElfError> {
    let data = bytes.bytes();
    let header = Elf::parse(data).map_err(ElfError::Header)?;
    let endian = header.endian().map_err(ElfError::Header)?;
    let program_headers = header
        .program_headers(endian, data)
        .map_err(ElfError::Tables)?;
    let segments = program_headers
        .iter()
        .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
        .map(|ph| Segment {
            offset: ph.p_offset(endian).into(),
            vaddr: ph.p_vaddr(endian).into(),
            filesz: ph.p_filesz(endian).into(),
            memsz: ph.p_memsz(endian).into(),
            executable: ph.p_flags(endian).contains(elf::PF_X),
        })
        .collect();
    let table = header.sections(endian, data).map_err(ElfError::Tables)?;
    let sections = table
        .iter()
        .map(|s| SectionEntry {
            name: table.section_name(endian, s).unwrap_or_default().into(),
            address: s.sh_addr(endian).into(),
            size: s.sh_size(endian).into(),
            data: file_range(s, endian, data.len()),
        })
        .collect();
    let build_id = if table.is_empty() {
        program_headers
            .iter()
            .filter_map(|ph| ph.notes(endian, data).ok().flatten())
            .find_map(|notes| gnu_build_id(notes, endian))
    } else {
        table
            .iter()
            .filter_map(|s| s.notes(endian, data).ok().flatten())
            .find_map(|notes| gnu_build_id(notes, endian))
    };
    Ok(ElfFile {
        is_64: header.is_type_64(),
        big_endian: endian == Endianness::Big,
        kind: header.e_type(endian),
        machine: header.e_machine(endian),
        entry: header.e_entry(endian).into(),
        segments,
        sections,
        build_id: build_id.map(<[u8]>::to_vec),
        bytes,
    })
}

/// Where a section's bytes lie in a file of `len` bytes, when it has usable ones.
fn file_range<S: SectionHeader<Endian = Endianness>>(
    s: &S,
    endian: Endianness,
    len: usize,
) -> Option<Range<usize>> {
    if s.sh_flags(endian).contains(elf::SHF_COMPRESSED) {
        return None;
    }
    let (offset, size) = s.file_range(endian)?;
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(size).ok()?)?;
    (size > 0 && end <= len).then_some(start..end)
}

/// A build-id (or part of one) as lowercase hex, as build-id directories, perf's build-id
/// cache and the profile's metadata spell it.
pub fn build_id_hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first GNU build-id among `notes`; a malformed note ends the search.
fn gnu_build_id<'data, Elf: FileHeader>(
    mut notes: NoteIterator<'data, Elf>,
    endian: Elf::Endian,
) -> Option<&'data [u8]> {
    while let Ok(Some(note)) = notes.next() {
        if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
            return Some(note.desc());
        }
    }
    None
}

#[cfg(test)]
mod tests;
