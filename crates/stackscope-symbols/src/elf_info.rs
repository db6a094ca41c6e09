//! What the symbolizer needs to know about an ELF file before handing it to blazesym: whether
//! it carries DWARF, its build-id, and its loadable segments (to turn file offsets into the
//! virtual addresses a separate debug file is indexed by).

use std::fs::File;
use std::path::Path;

use crate::elf::{ElfError, ElfFile, Segment, SymbolTable};
use crate::{FileId, SymbolError};

#[derive(Debug)]
pub(crate) struct ElfInfo {
    pub(crate) id: FileId,
    pub(crate) has_dwarf: bool,
    pub(crate) build_id: Option<Vec<u8>>,
    /// It has a `.gnu_debugdata` section.
    pub(crate) has_mini_debuginfo: bool,
    /// The entry point the file states, if any (shared objects may state none: 0).
    pub(crate) entry: Option<u64>,
    loads: Vec<Segment>,
}

impl ElfInfo {
    /// Inspects the ELF file at `path`; fails when it is missing, unreadable or not ELF.
    pub(crate) fn inspect(path: &Path) -> Result<Self, SymbolError> {
        let (file, id) = FileId::open(path)?;
        let elf = map_elf(path, &file)?;
        Ok(Self {
            id,
            has_dwarf: elf.section(".debug_info").is_some()
                || elf.section(".zdebug_info").is_some(),
            build_id: elf.build_id().map(<[u8]>::to_vec),
            has_mini_debuginfo: elf.section(".gnu_debugdata").is_some(),
            entry: Some(elf.entry()).filter(|&entry| entry != 0),
            loads: elf.segments().to_vec(),
        })
    }

    /// The ELF virtual address that file offset `offset` is loaded at, if any segment holds it.
    pub(crate) fn file_offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.loads.iter().find_map(|load| load.vaddr_of(offset))
    }
}

/// Maps the ELF file `file` (at `path`), in the symbolizer's terms when it cannot.
fn map_elf(path: &Path, file: &File) -> Result<ElfFile, SymbolError> {
    ElfFile::map(file).map_err(|e| match e {
        ElfError::Io(error) => SymbolError::Read {
            path: path.to_path_buf(),
            error,
        },
        ElfError::NotElf => SymbolError::NotElf {
            path: path.to_path_buf(),
        },
        e => SymbolError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        },
    })
}

/// What a binary offers to whoever unwinds its stacks and names its frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnwindSources {
    /// DWARF debug info (`.debug_info`): names of inlined functions, files and lines.
    pub debug_info: bool,
    /// `.eh_frame`: the call frame information DWARF unwinding reads.
    pub eh_frame: bool,
    /// `.debug_frame`: the same kind of table, kept with the debug info.
    pub debug_frame: bool,
    /// Whether its functions keep frame pointers, as far as [`FramePointers`] can tell.
    pub frame_pointers: FramePointers,
}

/// The frame pointer heuristic: functions of at least 16 bytes in the symbol table are taken
/// as keeping frame pointers when their first instructions (after an optional `endbr64`) are
/// `push %rbp; mov %rsp,%rbp`, the prologue gcc, clang and rustc emit when frame pointers are
/// kept and almost never otherwise. More than half of them with it: kept. x86-64 only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramePointers {
    Kept {
        with: usize,
        checked: usize,
    },
    Omitted {
        with: usize,
        checked: usize,
    },
    /// Not x86-64, or no function symbols to look at (a stripped binary).
    Unknown,
}

/// Functions looked at by the heuristic, at most: enough for a clear majority, bounded time.
const PROLOGUES_CHECKED: usize = 4000;

/// Reads what the binary at `path` offers for unwinding; fails when it is missing, unreadable
/// or not ELF.
pub fn unwind_sources(path: &Path) -> Result<UnwindSources, SymbolError> {
    let file = crate::foreign::open(path, crate::foreign::Kind::Binary).map_err(|refusal| {
        SymbolError::Read {
            path: path.to_path_buf(),
            error: refusal.into(),
        }
    })?;
    let elf = map_elf(path, &file)?;
    let has = |name: &str| elf.section(name).is_some_and(|s| s.size() > 0);
    Ok(UnwindSources {
        debug_info: has(".debug_info"),
        eh_frame: has(".eh_frame"),
        debug_frame: has(".debug_frame"),
        frame_pointers: frame_pointers(&elf),
    })
}

/// [`FramePointers`] of `elf`, from the prologues of its first [`PROLOGUES_CHECKED`] functions.
fn frame_pointers(elf: &ElfFile) -> FramePointers {
    if !elf.is_64() || elf.machine() != object::elf::EM_X86_64 {
        return FramePointers::Unknown;
    }
    let functions = elf
        .functions(SymbolTable::Static)
        .or_else(|| elf.functions(SymbolTable::Dynamic))
        .unwrap_or_default();
    let (mut with, mut checked) = (0, 0);
    for function in functions
        .iter()
        .filter(|f| f.size >= 16)
        .take(PROLOGUES_CHECKED)
    {
        let Some(code) = elf.code(function, 8) else {
            continue;
        };
        let code = code.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa]).unwrap_or(code);
        checked += 1;
        if code.starts_with(&[0x55, 0x48, 0x89, 0xe5]) {
            with += 1;
        }
    }
    match checked {
        0 => FramePointers::Unknown,
        _ if with * 2 > checked => FramePointers::Kept { with, checked },
        _ => FramePointers::Omitted { with, checked },
    }
}
