//! The ELF file the stub runs (a guest kernel, or a program under gdbserver): its
//! architecture, where it is loaded, its unwind tables, and how its addresses map to file
//! offsets for the symbolizer.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use framehop::ExplicitModuleSectionInfo;
use object::elf;
use stackscope_stacks::arch::Arch;
use stackscope_stacks::module::{ModuleFile, SectionData};
use stackscope_stacks::Mapping;
use stackscope_symbols::elf::{ElfError, ElfFile, Segment, SymbolTable};

/// The target's ELF file.
#[derive(Debug)]
pub struct Image {
    path: PathBuf,
    arch: Arch,
    entry: u64,
    position_independent: bool,
    loads: Vec<Segment>,
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
    /// Reads the headers and unwind tables of the 64-bit ELF file at `path`, built for an
    /// architecture stackscope knows ([`Arch`]).
    pub fn open(path: &Path) -> Result<Image, ImageError> {
        let err = |why: String| ImageError {
            path: path.display().to_string(),
            why,
        };
        let elf = ElfFile::open(path).map_err(|e| {
            err(match e {
                ElfError::Header(e) => format!("not a 64-bit ELF file ({e})"),
                e => e.to_string(),
            })
        })?;
        if !elf.is_64() {
            return Err(err("not a 64-bit ELF file (it is 32-bit)".into()));
        }
        let Some(arch) = Arch::of_machine(elf.machine()) else {
            return Err(err(format!(
                "it is built for {}, and stackscope gdb knows x86-64, riscv64 and aarch64",
                machine_name(elf.machine())
            )));
        };
        if elf.segments().is_empty() {
            return Err(err("it has no loadable segments".into()));
        }
        let unwind = ModuleFile::new(&elf)
            .ok()
            .filter(ModuleFile::has_unwind_info);
        let without_cfi = match unwind {
            Some(_) => functions_without_cfi(&elf),
            None => Vec::new(),
        };
        Ok(Image {
            path: path.to_path_buf(),
            arch,
            entry: elf.entry(),
            position_independent: elf.kind() == elf::ET_DYN,
            loads: elf.segments().to_vec(),
            unwind,
            without_cfi,
            bias: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The architecture the file is built for, from its header.
    pub fn arch(&self) -> Arch {
        self.arch
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
        self.loads.iter().find_map(|l| l.offset_of(vaddr))
    }

    /// True when `addr` lies in a function of this file that its CFI does not describe, or
    /// in a file without CFI.
    pub fn lacks_cfi(&self, addr: u64) -> bool {
        if self.unwind.is_none() {
            return true;
        }
        let svma = addr.wrapping_sub(self.bias);
        let i = self.without_cfi.partition_point(|f| f.start <= svma);
        i > 0 && self.without_cfi[i - 1].contains(&svma)
    }

    /// This file's CFI sections and their stated addresses; `None` without CFI.
    pub fn unwind_sections(&self) -> Option<ExplicitModuleSectionInfo<SectionData>> {
        Some(self.unwind.as_ref()?.section_info())
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

/// An ELF `e_machine` as a reader would name it.
fn machine_name(machine: elf::Machine) -> String {
    let name = match machine {
        elf::EM_386 => "i386",
        elf::EM_ARM => "32-bit ARM",
        elf::EM_PPC64 => "ppc64",
        elf::EM_S390 => "s390x",
        elf::EM_MIPS => "MIPS",
        elf::EM_SPARCV9 => "sparc64",
        elf::EM_LOONGARCH => "loongarch64",
        _ => return format!("machine {machine}"),
    };
    name.to_string()
}

/// Functions (from the symbol table) whose start address has no `.eh_frame_hdr` entry.
/// Empty when the file has no `.eh_frame_hdr` in the usual encoding: then nothing is known.
fn functions_without_cfi(elf: &ElfFile) -> Vec<Range<u64>> {
    let Some(starts) = elf.fde_starts() else {
        return Vec::new();
    };
    let mut functions: Vec<Range<u64>> = elf
        .functions(SymbolTable::Static)
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f.size > 0)
        .filter(|f| starts.binary_search(&f.address).is_err())
        .map(|f| f.address..f.address + f.size)
        .collect();
    functions.sort_by_key(|f| f.start);
    functions.dedup();
    functions
}
