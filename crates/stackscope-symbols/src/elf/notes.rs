//! The notes an ELF section holds (`SHT_NOTE`): what a file says about itself beside its
//! code, such as SystemTap's USDT probe sites (`.note.stapsdt`).

use object::elf::{FileHeader32, FileHeader64};
use object::read::elf::{FileHeader, SectionHeader};
use object::Endianness;

use super::ElfFile;

/// One note: who wrote it, its type in that writer's numbering, and its contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Note<'a> {
    /// The owner's name, without its terminating NUL (`GNU`, `stapsdt`).
    pub owner: &'a [u8],
    /// `n_type`, which means something only together with the owner.
    pub kind: u32,
    /// The note's descriptor, in the file's byte order.
    pub desc: &'a [u8],
}

impl ElfFile {
    /// The notes of the first section named `section`, up to the first malformed one; none
    /// when it is not there or not a note section.
    pub fn notes(&self, section: &str) -> Vec<Note<'_>> {
        let name = section.as_bytes();
        if self.is_64 {
            section_notes::<FileHeader64<Endianness>>(self.bytes(), name)
        } else {
            section_notes::<FileHeader32<Endianness>>(self.bytes(), name)
        }
        .unwrap_or_default()
    }
}

fn section_notes<'data, Elf: FileHeader<Endian = Endianness>>(
    data: &'data [u8],
    name: &[u8],
) -> Option<Vec<Note<'data>>> {
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, data).ok()?;
    let (_, section) = sections.section_by_name(endian, name)?;
    let mut iter = section.notes(endian, data).ok()??;
    let mut notes = Vec::new();
    while let Ok(Some(note)) = iter.next() {
        notes.push(Note {
            owner: note.name(),
            kind: note.n_type(endian).0,
            desc: note.desc(),
        });
    }
    Some(notes)
}
