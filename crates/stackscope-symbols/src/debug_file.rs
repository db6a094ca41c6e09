//! Where the debug info of a binary that does not carry its own lives: the ordered lookup of
//! separate debug files, as gdb and elfutils search for them.
//!
//! For a binary without DWARF of its own, [`DebugFiles::find`] tries, in this order:
//!
//! 1. `<dir>/.build-id/xx/rest.debug` in each debug directory (by the binary's build-id, or
//!    the one its mapping stated);
//! 2. the file named by its `.gnu_debuglink`, in the binary's own directory, its `.debug/`
//!    subdirectory, then `<dir>/<the binary's directory>/` and `<dir>/` for each debug
//!    directory, taking only a file whose CRC32 matches the link's;
//!
//! and [`DebugFiles::fetch`], the last step, asks a [`FetchDebugFile`] (a debuginfod client)
//! by build-id. The symbolizer fetches only for binaries whose addresses the local sources
//! (this lookup, the binary's own symbol tables, its MiniDebugInfo) leave unnamed.
//!
//! The debug directories are `/usr/lib/debug`, or those listed (colon-separated, as gdb's
//! `debug-file-directory`) in `STACKSCOPE_DEBUG_FILE_DIRECTORY`.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::elf::{build_id_hex, ElfFile};
use crate::foreign::{self, Kind};
use crate::FileId;

/// Where distributions install separate debug files.
pub const DEFAULT_DEBUG_DIR: &str = "/usr/lib/debug";

/// The environment variable that replaces [`DEFAULT_DEBUG_DIR`]: directories separated by `:`.
pub const DEBUG_DIRS_ENV: &str = "STACKSCOPE_DEBUG_FILE_DIRECTORY";

/// The last step of the lookup: a debug file from somewhere else than this machine's debug
/// directories, by build-id (a debuginfod server, through its local cache).
pub trait FetchDebugFile: Send + Sync {
    /// A local path of the debug file (with DWARF and symbols) whose build-id is `build_id`;
    /// `None` when none can be had. Called at most once per build-id and symbolizer.
    fn fetch(&self, build_id: &[u8]) -> Option<PathBuf>;
}

/// The fetcher [`DebugFiles::from_env`] hands to every symbolizer of the process: set once,
/// at start, by the program (so that every source's naming step uses it without each one
/// carrying it).
static PROCESS_FETCHER: RwLock<Option<Arc<dyn FetchDebugFile>>> = RwLock::new(None);

/// Makes `fetcher` the last step of the lookup of every symbolizer created from now on with
/// [`DebugFiles::from_env`] (which [`crate::Symbolizer::new`] uses); `None` turns it off.
pub fn set_process_fetcher(fetcher: Option<Arc<dyn FetchDebugFile>>) {
    *PROCESS_FETCHER.write().unwrap_or_else(|e| e.into_inner()) = fetcher;
}

/// How a debug file was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundBy {
    BuildIdDir,
    DebugLink,
    Fetched,
}

/// A separate debug file of a binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugFile {
    pub path: PathBuf,
    pub found_by: FoundBy,
}

/// The debug directories to search, and the fetcher to ask last.
#[derive(Clone, Default)]
pub struct DebugFiles {
    dirs: Vec<PathBuf>,
    fetcher: Option<Arc<dyn FetchDebugFile>>,
}

impl std::fmt::Debug for DebugFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugFiles")
            .field("dirs", &self.dirs)
            .field("fetcher", &self.fetcher.is_some())
            .finish()
    }
}

impl DebugFiles {
    /// Searches `dirs`, and fetches nothing.
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        DebugFiles {
            dirs,
            fetcher: None,
        }
    }

    /// The directories of [`DEBUG_DIRS_ENV`] (else [`DEFAULT_DEBUG_DIR`]) and the process's
    /// fetcher, if one was set.
    pub fn from_env() -> Self {
        DebugFiles {
            dirs: dirs_from_env(),
            fetcher: PROCESS_FETCHER
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    /// Asks `fetcher` last.
    pub fn with_fetcher(mut self, fetcher: Arc<dyn FetchDebugFile>) -> Self {
        self.fetcher = Some(fetcher);
        self
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    pub fn has_fetcher(&self) -> bool {
        self.fetcher.is_some()
    }

    /// The local debug file of the binary at `binary`: by `build_id` (the caller's, else the
    /// binary's own) under the debug directories, then by its debug link.
    pub fn find(&self, binary: &Path, build_id: Option<&[u8]>) -> Option<DebugFile> {
        let elf = ElfFile::open(binary).ok()?;
        let by_id = build_id
            .or(elf.build_id())
            .and_then(|id| self.by_build_id(id))
            .map(|path| DebugFile {
                path,
                found_by: FoundBy::BuildIdDir,
            });
        by_id.or_else(|| {
            self.by_debug_link(binary, &elf).map(|path| DebugFile {
                path,
                found_by: FoundBy::DebugLink,
            })
        })
    }

    /// The last step: the fetcher's file for `build_id`, when there is a fetcher.
    pub fn fetch(&self, build_id: &[u8]) -> Option<DebugFile> {
        let path = self.fetcher.as_ref()?.fetch(build_id)?;
        Some(DebugFile {
            path,
            found_by: FoundBy::Fetched,
        })
    }

    /// `<dir>/.build-id/xx/rest.debug` in the first debug directory that has it, whose own
    /// build-id is `build_id`: a file there of another build (a stale or planted one) is
    /// counted as [`foreign::mismatched`] and passed over.
    pub fn by_build_id(&self, build_id: &[u8]) -> Option<PathBuf> {
        // Shorter ids are bogus and could name someone else's file.
        if build_id.len() < 2 {
            return None;
        }
        let relative = Path::new(".build-id")
            .join(build_id_hex(&build_id[..1]))
            .join(format!("{}.debug", build_id_hex(&build_id[1..])));
        self.dirs
            .iter()
            .map(|dir| dir.join(&relative))
            .find(|candidate| has_build_id(candidate, build_id))
    }

    /// The file `.gnu_debuglink` names, in gdb's places, whose CRC32 is the one the link states.
    fn by_debug_link(&self, binary: &Path, elf: &ElfFile) -> Option<PathBuf> {
        let (name, crc) = debug_link(elf)?;
        // The places are relative to where the binary really is, not to a link to it.
        let real = std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf());
        let dir = real.parent()?;
        let own = FileId::of_path(&real).ok();
        let mut candidates = vec![dir.join(&name), dir.join(".debug").join(&name)];
        for debug_dir in &self.dirs {
            let inside = dir.strip_prefix("/").unwrap_or(dir);
            candidates.push(debug_dir.join(inside).join(&name));
            candidates.push(debug_dir.join(&name));
        }
        candidates.into_iter().find(|candidate| {
            let Ok(file) = foreign::open(candidate, Kind::Binary) else {
                return false;
            };
            // A link naming the binary itself (same name, same directory) is no debug file.
            if FileId::of_file(&file).ok() == own {
                return false;
            }
            match crc32_of(&file) {
                Some(found) if found == crc => true,
                Some(_) => {
                    foreign::mismatched(candidate, "its CRC is not the one the debug link states");
                    false
                }
                None => false,
            }
        })
    }
}

/// Whether the file at `path` (which need not exist) is an ELF file whose build-id is
/// `build_id`; one that is ELF with another build-id, or none, is counted as mismatched.
pub fn has_build_id(path: &Path, build_id: &[u8]) -> bool {
    let file = match foreign::open(path, Kind::Binary) {
        Ok(file) => file,
        Err(_) => return false,
    };
    let Ok(elf) = ElfFile::map(&file) else {
        return false;
    };
    if elf.build_id() == Some(build_id) {
        return true;
    }
    foreign::mismatched(
        path,
        &format!(
            "its build-id is {}, not the {} looked up",
            elf.build_id().map_or("missing".to_string(), build_id_hex),
            build_id_hex(build_id)
        ),
    );
    false
}

impl DebugFiles {
    /// Whether blazesym may read the DWARF of the ELF file at `path`: it follows the file's
    /// `.gnu_debuglink`, `.gnu_debugaltlink` and `.debug_sup` itself, opening by path the
    /// first place that exists (beside the file, in its `.debug/`, under the debug
    /// directories, by build-id). Where any such place holds something [`foreign::open`]
    /// would refuse (a FIFO, a device, a file past its bound), it is named in a warning and
    /// the file's DWARF is not read: its symbol tables still name it.
    pub fn links_are_files(&self, path: &Path) -> bool {
        let Ok(elf) = ElfFile::open(path) else {
            return true;
        };
        let mut names: Vec<(String, Option<Vec<u8>>)> = Vec::new();
        if let Some((name, _)) = debug_link(&elf) {
            names.push((name, elf.build_id().map(<[u8]>::to_vec)));
        }
        for (section, skip) in [(".gnu_debugaltlink", 0), (".debug_sup", 3)] {
            let Some(data) = elf.section(section).and_then(|s| s.data()) else {
                continue;
            };
            let data = data.get(skip..).unwrap_or_default();
            let Some(end) = data.iter().position(|&b| b == 0) else {
                continue;
            };
            let name = String::from_utf8_lossy(&data[..end]).into_owned();
            let build_id = data.get(end + 1..).filter(|id| !id.is_empty());
            names.push((name, build_id.map(<[u8]>::to_vec)));
        }
        if names.is_empty() {
            return true;
        }
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let dir = real.parent().unwrap_or(Path::new("/"));
        let inside = dir.strip_prefix("/").unwrap_or(dir);
        let mut places = Vec::new();
        for (name, build_id) in &names {
            let name = Path::new(name);
            places.extend([dir.join(name), dir.join(".debug").join(name)]);
            for debug_dir in &self.dirs {
                places.extend([debug_dir.join(name), debug_dir.join(inside).join(name)]);
                if let Some(id) = build_id.as_deref().filter(|id| id.len() >= 2) {
                    places.push(
                        debug_dir
                            .join(".build-id")
                            .join(build_id_hex(&id[..1]))
                            .join(format!("{}.debug", build_id_hex(&id[1..]))),
                    );
                }
            }
        }
        places.iter().all(|place| match std::fs::metadata(place) {
            Err(_) => true,
            Ok(meta) if meta.is_file() && meta.len() <= Kind::Binary.bound() => true,
            // Opened without blocking, only to be refused and named.
            Ok(_) => foreign::open(place, Kind::Binary).is_ok(),
        })
    }
}

/// The debug directories the environment asks for, else the default one.
fn dirs_from_env() -> Vec<PathBuf> {
    match std::env::var_os(DEBUG_DIRS_ENV) {
        Some(value) if !value.is_empty() => std::env::split_paths(&value)
            .filter(|dir| !dir.as_os_str().is_empty())
            .collect(),
        _ => vec![PathBuf::from(DEFAULT_DEBUG_DIR)],
    }
}

/// The file name and CRC32 of a `.gnu_debuglink`: the name, NUL-terminated, padded to a
/// multiple of 4 bytes, then the CRC in the file's byte order.
pub(crate) fn debug_link(elf: &ElfFile) -> Option<(String, u32)> {
    let data = elf.section(".gnu_debuglink")?.data()?;
    let end = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..end]).ok()?;
    // A name with a directory in it could point anywhere.
    if name.is_empty() || name.contains('/') {
        return None;
    }
    let crc_at = (end + 1).next_multiple_of(4);
    let crc: [u8; 4] = data.get(crc_at..crc_at + 4)?.try_into().ok()?;
    let crc = if elf.is_big_endian() {
        u32::from_be_bytes(crc)
    } else {
        u32::from_le_bytes(crc)
    };
    Some((name.to_string(), crc))
}

/// The CRC32 (the zlib one, which debug links use) of a whole file, which [`foreign::open`]
/// has bounded; `None` when it cannot be read or naming was interrupted meanwhile. Read, not
/// mapped, so that a large file costs page cache, not this process's memory.
fn crc32_of(mut file: &File) -> Option<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        if crate::interrupt::interrupted() {
            return None;
        }
        match file.read(&mut buffer) {
            Ok(0) => return Some(hasher.finalize()),
            Ok(n) => hasher.update(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_build_ids_name_no_file() {
        let files = DebugFiles::new(vec![PathBuf::from("/")]);
        assert_eq!(files.by_build_id(&[0xab]), None);
    }
}
