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
        // SAFETY: the map is read-only and dropped before returning; a binary truncated while
        // we parse it is the same hazard every profiler (and blazesym itself) accepts.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(read_err)?;
        let parsed = object::File::parse(&*map).map_err(|e| SymbolError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
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
