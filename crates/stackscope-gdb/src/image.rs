//! The ELF file the stub runs (a guest kernel, or a program under gdbserver): where it is
//! loaded, its unwind tables as a framehop module, and how its addresses map to file offsets
//! for the symbolizer.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use framehop::Module;
use object::elf::{self, FileHeader64};
use object::read::elf::{FileHeader, ProgramHeader};
use object::Endianness;
use stackscope_stacks::module::{ModuleFile, SectionData};
use stackscope_stacks::Mapping;

/// One `PT_LOAD` segment.
#[derive(Debug, Clone, Copy)]
struct Load {
    vaddr: u64,
    memsz: u64,
    offset: u64,
    filesz: u64,
}

/// The target's ELF file.
#[derive(Debug)]
pub struct Image {
    path: PathBuf,
    entry: u64,
    position_independent: bool,
    loads: Vec<Load>,
    unwind: Option<ModuleFile>,
    /// Functions (start..end, sorted) whose start has no entry in `.eh_frame_hdr`, when the
    /// file has one: framehop takes code without CFI for a frameless leaf, which is wrong
    /// where the rest of the file keeps frame pointers (C runtime CFI only, assembly).
    without_cfi: Vec<Range<u64>>,
    /// Added to the file's addresses to get the target's.
    bias: u64,
}

/// Why an ELF file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot use {path} as the target's ELF file: {why}")]
pub struct ImageError {
    path: String,
    why: String,
}

impl Image {
    /// Reads the headers and unwind tables of the 64-bit ELF file at `path`.
    pub fn open(path: &Path) -> Result<Image, ImageError> {
        let err = |why: String| ImageError {
            path: path.display().to_string(),
            why,
        };
        let data = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        if !data.starts_with(b"\x7fELF") {
            return Err(err("not an ELF file".into()));
        }
        let header = FileHeader64::<Endianness>::parse(&*data)
            .map_err(|e| err(format!("not a 64-bit ELF file ({e})")))?;
        let endian = header.endian().map_err(|e| err(e.to_string()))?;
        if header.e_machine(endian) != elf::EM_X86_64 {
            return Err(err("not an x86-64 ELF file".into()));
        }
        let loads: Vec<Load> = header
            .program_headers(endian, &*data)
            .map_err(|e| err(e.to_string()))?
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .map(|ph| Load {
                vaddr: ph.p_vaddr(endian),
                memsz: ph.p_memsz(endian),
                offset: ph.p_offset(endian),
                filesz: ph.p_filesz(endian),
            })
            .collect();
        if loads.is_empty() {
            return Err(err("it has no loadable segments".into()));
        }
        let file = File::open(path).map_err(|e| err(e.to_string()))?;
        let unwind = ModuleFile::open(file, path)
            .ok()
            .filter(ModuleFile::has_unwind_info);
        let without_cfi = match unwind {
            Some(_) => functions_without_cfi(&data),
            None => Vec::new(),
        };
        Ok(Image {
            path: path.to_path_buf(),
            entry: header.e_entry(endian),
            position_independent: header.e_type(endian) == elf::ET_DYN,
            loads,
            unwind,
            without_cfi,
            bias: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry point the file states (before relocation).
    pub fn entry(&self) -> u64 {
        self.entry
    }

    /// True for a position-independent executable, whose load address only the target knows.
    pub fn is_position_independent(&self) -> bool {
        self.position_independent
    }

    /// True when the file has DWARF CFI (`.eh_frame` or `.debug_frame`); without, stacks are
    /// unwound by frame pointers.
    pub fn has_unwind_info(&self) -> bool {
        self.unwind.is_some()
    }

    pub fn set_bias(&mut self, bias: u64) {
        self.bias = bias;
    }

    pub fn bias(&self) -> u64 {
        self.bias
    }

    /// The target addresses the file's segments occupy.
    pub fn address_range(&self) -> Range<u64> {
        let start = self.loads.iter().map(|l| l.vaddr).min().unwrap_or(0);
        let end = self
            .loads
            .iter()
            .map(|l| l.vaddr.saturating_add(l.memsz))
            .max()
            .unwrap_or(0);
        start.wrapping_add(self.bias)..end.wrapping_add(self.bias)
    }

    /// The file offset of the code at target address `addr`, if the file holds it.
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        let vaddr = addr.wrapping_sub(self.bias);
        self.loads.iter().find_map(|l| {
            let delta = vaddr.checked_sub(l.vaddr)?;
            (delta < l.filesz).then(|| l.offset + delta)
        })
    }

    /// True when `addr` lies in a function of this file that its CFI does not describe.
    pub fn lacks_cfi(&self, addr: u64) -> bool {
        let svma = addr.wrapping_sub(self.bias);
        let i = self.without_cfi.partition_point(|f| f.start <= svma);
        i > 0 && self.without_cfi[i - 1].contains(&svma)
    }

    /// This file's CFI as a framehop module at its load address; `None` without CFI.
    pub fn framehop_module(&self) -> Option<Module<SectionData>> {
        let unwind = self.unwind.as_ref()?;
        Some(Module::new(
            self.path.display().to_string(),
            self.address_range(),
            self.bias,
            unwind.section_info(),
        ))
    }

    /// Where the file's loadable segments sit in the target, one mapping each, as the stack
    /// table places and names addresses.
    pub fn mappings(&self) -> Vec<Mapping> {
        let path: Arc<str> = std::path::absolute(&self.path)
            .unwrap_or_else(|_| self.path.clone())
            .display()
            .to_string()
            .into();
        self.loads
            .iter()
            .filter(|l| l.filesz > 0)
            .map(|l| {
                let start = l.vaddr.wrapping_add(self.bias);
                Mapping {
                    start,
                    end: start.wrapping_add(l.filesz),
                    offset: l.offset,
                    path: path.clone(),
                    build_id: None,
                }
            })
            .collect()
    }

    /// The file name, as frames name their module.
    pub fn name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}

/// Functions (from the symbol table) whose start address has no `.eh_frame_hdr` entry.
/// Empty when the file has no `.eh_frame_hdr` in the usual encoding: then nothing is known.
fn functions_without_cfi(data: &[u8]) -> Vec<Range<u64>> {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    let Some(hdr) = file.section_by_name(".eh_frame_hdr") else {
        return Vec::new();
    };
    let Some(starts) = hdr
        .data()
        .ok()
        .and_then(|bytes| fde_starts(bytes, hdr.address()))
    else {
        return Vec::new();
    };
    let mut functions: Vec<Range<u64>> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter(|s| starts.binary_search(&s.address()).is_err())
        .map(|s| s.address()..s.address() + s.size())
        .collect();
    functions.sort_by_key(|f| f.start);
    functions.dedup();
    functions
}

/// The sorted start addresses of the binary search table of `.eh_frame_hdr` (version 1,
/// pc-relative 4-byte `eh_frame_ptr`, 4-byte count, section-relative 4-byte table entries, as
/// GNU ld and lld write it).
fn fde_starts(hdr: &[u8], hdr_address: u64) -> Option<Vec<u64>> {
    const PCREL_SDATA4: u8 = 0x1b;
    const UDATA4: u8 = 0x03;
    const DATAREL_SDATA4: u8 = 0x3b;
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
            hdr_address.wrapping_add_signed(i64::from(rel))
        })
        .collect();
    starts.sort_unstable();
    Some(starts)
}
