//! The functions an ELF file's symbol tables name, their code, and which of them its
//! `.eh_frame_hdr` indexes: what tells whether a binary keeps frame pointers or lacks CFI.

use object::elf::{self, FileHeader32, FileHeader64};
use object::read::elf::{FileHeader, Sym};
use object::{Endianness, SymbolIndex};

use super::ElfFile;

/// Which symbol table to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolTable {
    /// `.symtab`, which stripping removes.
    Static,
    /// `.dynsym`, which stays.
    Dynamic,
}

/// A function symbol (`STT_FUNC` or `STT_GNU_IFUNC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Function {
    pub address: u64,
    pub size: u64,
    /// The index of the section holding it; `None` for undefined and special sections.
    section: Option<usize>,
}

impl ElfFile {
    /// The functions `table` names; `None` when the file has no such table or it holds no
    /// symbols.
    pub fn functions(&self, table: SymbolTable) -> Option<Vec<Function>> {
        let sh_type = match table {
            SymbolTable::Static => elf::SHT_SYMTAB,
            SymbolTable::Dynamic => elf::SHT_DYNSYM,
        };
        if self.is_64 {
            functions::<FileHeader64<Endianness>>(self.bytes(), sh_type)
        } else {
            functions::<FileHeader32<Endianness>>(self.bytes(), sh_type)
        }
    }

    /// The first `len` bytes of `function`'s code, when its section holds them.
    pub fn code(&self, function: &Function, len: u64) -> Option<&[u8]> {
        let section = self.section_at(function.section?)?;
        let offset = function.address.checked_sub(section.address())?;
        let code = section.data()?.get(usize::try_from(offset).ok()?..)?;
        code.get(..usize::try_from(len).ok()?)
    }

    /// The sorted start addresses of `.eh_frame_hdr`'s binary search table, when the file has
    /// one in the encoding GNU ld and lld write: version 1, pc-relative 4-byte
    /// `eh_frame_ptr`, 4-byte count, section-relative 4-byte table entries.
    pub fn fde_starts(&self) -> Option<Vec<u64>> {
        const PCREL_SDATA4: u8 = 0x1b;
        const UDATA4: u8 = 0x03;
        const DATAREL_SDATA4: u8 = 0x3b;
        let section = self.section(".eh_frame_hdr")?;
        let hdr = section.data()?;
        if hdr.len() < 12 || hdr[0] != 1 || hdr[1] != PCREL_SDATA4 || hdr[2] != UDATA4 {
            return None;
        }
        if hdr[3] != DATAREL_SDATA4 {
            return None;
        }
        let count = u32::from_le_bytes(hdr[8..12].try_into().ok()?) as usize;
        let table = hdr.get(12..12 + count.checked_mul(8)?)?;
        let mut starts: Vec<u64> = table
            .chunks_exact(8)
            .map(|e| {
                let rel = i32::from_le_bytes([e[0], e[1], e[2], e[3]]);
                section.address().wrapping_add_signed(i64::from(rel))
            })
            .collect();
        starts.sort_unstable();
        Some(starts)
    }
}

fn functions<Elf: FileHeader<Endian = Endianness>>(
    data: &[u8],
    sh_type: elf::SectionType,
) -> Option<Vec<Function>> {
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let symbols = header
        .sections(endian, data)
        .ok()?
        .symbols(endian, data, sh_type)
        .ok()?;
    // Index 0 is the null symbol every table starts with.
    if symbols.len() <= 1 {
        return None;
    }
    let functions = symbols
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, s)| matches!(s.st_type(), elf::STT_FUNC | elf::STT_GNU_IFUNC))
        .map(|(i, s)| Function {
            address: s.st_value(endian).into(),
            size: s.st_size(endian).into(),
            section: symbols
                .symbol_section(endian, s, SymbolIndex(i))
                .ok()
                .flatten()
                .map(|index| index.0),
        })
        .collect();
    Some(functions)
}
