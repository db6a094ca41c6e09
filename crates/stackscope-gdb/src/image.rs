//! The ELF file the stub runs (a guest kernel, or a program under gdbserver): where it is
//! loaded, its unwind tables as a framehop module, and how its addresses map to file offsets
//! for the symbolizer.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use framehop::x86_64::UnwinderX86_64;
use framehop::{Module, Unwinder as _};
use object::elf::{self, FileHeader64};
use object::read::elf::{FileHeader, ProgramHeader};
use object::Endianness;
use stackscope_linux::unwind::module::ModuleFile;

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
        Ok(Image {
            path: path.to_path_buf(),
            entry: header.e_entry(endian),
            position_independent: header.e_type(endian) == elf::ET_DYN,
            loads,
            unwind,
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

    /// A framehop unwinder holding this file's CFI at its load address; with no CFI it is
    /// empty and framehop follows frame pointers.
    pub fn unwinder(&self) -> UnwinderX86_64<Arc<[u8]>> {
        let mut unwinder = UnwinderX86_64::new();
        if let Some(module) = &self.unwind {
            unwinder.add_module(Module::new(
                self.path.display().to_string(),
                self.address_range(),
                self.bias,
                module.section_info(),
            ));
        }
        unwinder
    }
}
