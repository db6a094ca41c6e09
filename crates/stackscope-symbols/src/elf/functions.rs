//! The functions an ELF file's symbol tables name (where they are, their code, what they are
//! called), the bytes of the data objects they name, and which of them its `.eh_frame_hdr` indexes: what tells whether a binary keeps frame pointers or lacks CFI, and
//! where a function no symbol names starts.

use gimli::{BaseAddresses, EhFrame, EhFrameHdr, RunTimeEndian, UnwindSection};
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
        self.function_symbols(table, |function, _| Some(function))
    }

    /// The function `table` names `name` (as the table spells it), where the file defines it.
    pub fn function_named(&self, table: SymbolTable, name: &[u8]) -> Option<Function> {
        let pick = |function: Function, symbol: &[u8]| {
            (symbol == name && function.section.is_some()).then_some(function)
        };
        self.function_symbols(table, pick)?.into_iter().next()
    }

    /// The names of the functions `table` says the file defines (not those it imports), as
    /// the table spells them; `None` as for [`ElfFile::functions`].
    pub fn defined_function_names(&self, table: SymbolTable) -> Option<Vec<&[u8]>> {
        self.function_symbols(table, |function, name| function.section.map(|_| name))
    }

    /// The bytes of the data object `table` names `name`, where the file holds them (not in
    /// `.bss`): a constant such as a version number.
    pub fn object_bytes(&self, table: SymbolTable, name: &[u8]) -> Option<&[u8]> {
        let pick = |object: Function, symbol: &[u8]| (symbol == name).then_some(object);
        let object = self
            .symbols_of(table, &[elf::STT_OBJECT], pick)?
            .into_iter()
            .find(|o| o.section.is_some())?;
        self.code(&object, object.size)
    }

    /// `pick(function, name)` of each function symbol of `table`, where it gives one.
    fn function_symbols<'a, T>(
        &'a self,
        table: SymbolTable,
        pick: impl FnMut(Function, &'a [u8]) -> Option<T>,
    ) -> Option<Vec<T>> {
        self.symbols_of(table, &[elf::STT_FUNC, elf::STT_GNU_IFUNC], pick)
    }

    /// `pick(symbol, name)` of each symbol of `table` of one of `types`, where it gives one.
    fn symbols_of<'a, T>(
        &'a self,
        table: SymbolTable,
        types: &[elf::SymbolType],
        pick: impl FnMut(Function, &'a [u8]) -> Option<T>,
    ) -> Option<Vec<T>> {
        let sh_type = match table {
            SymbolTable::Static => elf::SHT_SYMTAB,
            SymbolTable::Dynamic => elf::SHT_DYNSYM,
        };
        if self.is_64 {
            symbols_of::<FileHeader64<Endianness>, T>(self.bytes(), (sh_type, types), pick)
        } else {
            symbols_of::<FileHeader32<Endianness>, T>(self.bytes(), (sh_type, types), pick)
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

impl ElfFile {
    /// For each of `addresses` (ELF virtual addresses), the start of the function holding it
    /// as the unwind tables tell it: the initial address of the `.eh_frame` FDE that covers
    /// it, found through `.eh_frame_hdr`'s search table. `None` where no FDE covers it, or
    /// the file has no such table.
    pub fn function_starts(&self, addresses: &[u64]) -> Vec<Option<u64>> {
        let mut starts = vec![None; addresses.len()];
        let (Some(hdr), Some(eh_frame)) =
            (self.section(".eh_frame_hdr"), self.section(".eh_frame"))
        else {
            return starts;
        };
        let (Some(hdr_data), Some(eh_data)) = (hdr.data(), eh_frame.data()) else {
            return starts;
        };
        let endian = if self.is_big_endian() {
            RunTimeEndian::Big
        } else {
            RunTimeEndian::Little
        };
        let mut bases = BaseAddresses::default()
            .set_eh_frame_hdr(hdr.address())
            .set_eh_frame(eh_frame.address());
        if let Some(text) = self.section(".text") {
            bases = bases.set_text(text.address());
        }
        if let Some(got) = self.section(".got") {
            bases = bases.set_got(got.address());
        }
        let address_size = if self.is_64() { 8 } else { 4 };
        let Ok(parsed) = EhFrameHdr::new(hdr_data, endian).parse(&bases, address_size) else {
            return starts;
        };
        let Some(table) = parsed.table() else {
            return starts;
        };
        let mut eh_frame = EhFrame::new(eh_data, endian);
        eh_frame.set_address_size(address_size);
        for (start, &address) in starts.iter_mut().zip(addresses) {
            *start = table
                .fde_for_address(&eh_frame, &bases, address, EhFrame::cie_from_offset)
                .ok()
                .map(|fde| fde.initial_address());
        }
        starts
    }
}

fn symbols_of<'data, Elf: FileHeader<Endian = Endianness>, T>(
    data: &'data [u8],
    (sh_type, types): (elf::SectionType, &[elf::SymbolType]),
    mut pick: impl FnMut(Function, &'data [u8]) -> Option<T>,
) -> Option<Vec<T>> {
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
    let picked = symbols
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, s)| types.contains(&s.st_type()))
        .filter_map(|(i, s)| {
            let function = Function {
                address: s.st_value(endian).into(),
                size: s.st_size(endian).into(),
                section: symbols
                    .symbol_section(endian, s, SymbolIndex(i))
                    .ok()
                    .flatten()
                    .map(|index| index.0),
            };
            pick(function, symbols.symbol_name(endian, s).unwrap_or_default())
        })
        .collect();
    Some(picked)
}
