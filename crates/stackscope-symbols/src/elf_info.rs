//! What the symbolizer needs to know about an ELF file before handing it to blazesym: whether
//! it carries DWARF, its build-id, and its loadable segments (to turn file offsets into the
//! virtual addresses a separate debug file is indexed by).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment};

use crate::SymbolError;

/// One `PT_LOAD` segment.
#[derive(Debug, Clone, Copy)]
struct Load {
    file_offset: u64,
    file_size: u64,
    vaddr: u64,
}

/// Identity of a file's content as far as the file system tells; a change means re-inspect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

#[derive(Debug)]
pub(crate) struct ElfInfo {
    pub(crate) stamp: FileStamp,
    pub(crate) has_dwarf: bool,
    pub(crate) build_id: Option<Vec<u8>>,
    loads: Vec<Load>,
}

impl ElfInfo {
    /// Inspects the ELF file at `path`; fails when it is missing, unreadable or not ELF.
    pub(crate) fn inspect(path: &Path) -> Result<Self, SymbolError> {
        let (stamp, map) = map_elf(path)?;
        let parsed = parse(path, &map)?;
        let loads = parsed
            .segments()
            .map(|segment| {
                let (file_offset, file_size) = segment.file_range();
                Load {
                    file_offset,
                    file_size,
                    vaddr: segment.address(),
                }
            })
            .collect();
        Ok(Self {
            stamp,
            has_dwarf: parsed.has_debug_symbols(),
            // A malformed note only costs the build-id lookup, not the whole file.
            build_id: parsed.build_id().ok().flatten().map(<[u8]>::to_vec),
            loads,
        })
    }

    /// The ELF virtual address that file offset `offset` is loaded at, if any segment holds it.
    pub(crate) fn file_offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.loads.iter().find_map(|load| {
            let delta = offset.checked_sub(load.file_offset)?;
            (delta < load.file_size).then(|| load.vaddr.wrapping_add(delta))
        })
    }
}

/// Maps the ELF file at `path` (checking its magic first) with its stamp.
fn map_elf(path: &Path) -> Result<(FileStamp, memmap2::Mmap), SymbolError> {
    let read_err = |error| SymbolError::Read {
        path: path.to_path_buf(),
        error,
    };
    let mut file = File::open(path).map_err(read_err)?;
    let stamp = stamp_of(&file).map_err(read_err)?;
    let mut magic = [0u8; 4];
    if let Err(error) = file.read_exact(&mut magic) {
        if error.kind() == std::io::ErrorKind::UnexpectedEof {
            return Err(SymbolError::NotElf {
                path: path.to_path_buf(),
            });
        }
        return Err(read_err(error));
    }
    if magic != *b"\x7fELF" {
        return Err(SymbolError::NotElf {
            path: path.to_path_buf(),
        });
    }
    // SAFETY: the map is read-only and dropped before its caller returns; a binary truncated
    // while we parse it is the same hazard every profiler (and blazesym itself) accepts.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(read_err)?;
    Ok((stamp, map))
}

fn parse<'a>(path: &Path, map: &'a [u8]) -> Result<object::File<'a>, SymbolError> {
    object::File::parse(map).map_err(|e| SymbolError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
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
    use object::{ObjectSection, ObjectSymbol, SymbolKind};
    let (_, map) = map_elf(path)?;
    let parsed = parse(path, &map)?;
    let has = |name: &str| parsed.section_by_name(name).is_some_and(|s| s.size() > 0);
    let mut frame_pointers = FramePointers::Unknown;
    if parsed.architecture() == object::Architecture::X86_64 {
        let symbols: Vec<_> = if parsed.symbols().next().is_some() {
            parsed.symbols().collect()
        } else {
            parsed.dynamic_symbols().collect()
        };
        let (mut with, mut checked) = (0, 0);
        for symbol in symbols
            .iter()
            .filter(|s| s.kind() == SymbolKind::Text && s.size() >= 16)
            .take(PROLOGUES_CHECKED)
        {
            let Some(section) = symbol
                .section_index()
                .and_then(|i| parsed.section_by_index(i).ok())
            else {
                continue;
            };
            let Ok(Some(code)) = section.data_range(symbol.address(), 8) else {
                continue;
            };
            let code = code.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa]).unwrap_or(code);
            checked += 1;
            if code.starts_with(&[0x55, 0x48, 0x89, 0xe5]) {
                with += 1;
            }
        }
        if checked > 0 {
            frame_pointers = if with * 2 > checked {
                FramePointers::Kept { with, checked }
            } else {
                FramePointers::Omitted { with, checked }
            };
        }
    }
    Ok(UnwindSources {
        debug_info: has(".debug_info"),
        eh_frame: has(".eh_frame"),
        debug_frame: has(".debug_frame"),
        frame_pointers,
    })
}

/// The current stamp of the file at `path`.
pub(crate) fn stamp(path: &Path) -> std::io::Result<FileStamp> {
    stamp_of(&File::open(path)?)
}

fn stamp_of(file: &File) -> std::io::Result<FileStamp> {
    let meta = file.metadata()?;
    Ok(FileStamp {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime: meta.mtime(),
        mtime_nsec: meta.mtime_nsec(),
    })
}

/// The separate debug file for `build_id` in the first of `debug_dirs` that has one, at the
/// conventional `.build-id/xx/yyyy.debug` location.
pub fn find_debug_file(debug_dirs: &[PathBuf], build_id: &[u8]) -> Option<PathBuf> {
    // Shorter ids are bogus and could name someone else's file.
    if build_id.len() < 2 {
        return None;
    }
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let relative = Path::new(".build-id")
        .join(hex(&build_id[..1]))
        .join(format!("{}.debug", hex(&build_id[1..])));
    debug_dirs
        .iter()
        .map(|dir| dir.join(&relative))
        .find(|candidate| candidate.is_file())
}
