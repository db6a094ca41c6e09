//! The file a uprobe or USDT probe names, found as the user means it: a path as given, else a
//! library the target has mapped, else one the dynamic loader's cache finds, else a program in
//! PATH; and opened through the one ELF reader.

use std::path::{Path, PathBuf};

use stackscope_process::maps::read_proc_maps;
use stackscope_symbols::elf::{ElfError, ElfFile};

use super::near::{did_you_mean, near_matches};

/// The file a probe names: a path as given; a name without '/' as a library the target has
/// mapped, else as the dynamic loader's cache finds it, else as a program in PATH.
pub(super) fn find_file(file: &str, pid: Option<u32>) -> Result<PathBuf, String> {
    if file.contains('/') {
        let path = Path::new(file);
        return match std::fs::metadata(path) {
            Ok(m) if m.is_file() => Ok(path.canonicalize().unwrap_or_else(|_| path.into())),
            Ok(_) => Err(format!("{file} is not a file")),
            Err(e) => Err(format!("cannot open {file}: {e}")),
        };
    }
    let is_library = |base: &str| {
        [format!("{file}.so"), format!("lib{file}.so")]
            .iter()
            .any(|prefix| base.starts_with(prefix.as_str()))
    };
    if let Some(pid) = pid {
        if let Some(path) = mapped_library(pid, &is_library) {
            return Ok(path);
        }
    }
    let cache = loader_cache();
    if let Some((_, path)) = cache.iter().find(|(name, _)| is_library(name)) {
        return Ok(path.clone());
    }
    if let Some(path) = in_path(file) {
        return Ok(path);
    }
    let near = near_matches(
        file,
        cache
            .iter()
            .map(|(name, _)| name.split(".so").next().unwrap_or(name)),
    );
    Err(format!(
        "no library {file} in the dynamic loader's cache (/etc/ld.so.cache) nor program {file} in PATH{}",
        did_you_mean(&near)
    ))
}

/// The first file the process maps whose name `wanted` accepts, as the process sees it
/// (through its root). Its executable mappings are all that count: a uprobe fires on code,
/// and a library the process maps without code runs none to probe.
fn mapped_library(pid: u32, wanted: &dyn Fn(&str) -> bool) -> Option<PathBuf> {
    let maps = read_proc_maps(pid).ok()?;
    maps.iter()
        // A library replaced on disk since it was mapped shows as `path (deleted)`: its path
        // names the file there now, as when the user names it.
        .map(|m| m.path.strip_suffix(" (deleted)").unwrap_or(&m.path))
        .filter(|path| path.starts_with('/'))
        .find(|path| path.rsplit('/').next().is_some_and(wanted))
        .map(|path| PathBuf::from(format!("/proc/{pid}/root{path}")))
}

/// The dynamic loader's cache (glibc's ld.so.cache, new format): (soname, path) of the
/// libraries of this machine's word size, in the cache's order (the loader's preference).
fn loader_cache() -> Vec<(String, PathBuf)> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const HEADER: usize = 48;
    const ENTRY: usize = 24;
    // Flags of an x86-64 libc6 library (FLAG_X8664_LIB64 | FLAG_ELF_LIBC6).
    const X86_64_LIBC6: u32 = 0x0303;
    let Ok(bytes) = std::fs::read("/etc/ld.so.cache") else {
        return Vec::new();
    };
    let Some(start) = bytes.windows(MAGIC.len()).position(|w| w == MAGIC) else {
        return Vec::new();
    };
    let cache = &bytes[start..];
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(cache.get(at..at + 4)?.try_into().ok()?))
    };
    // Strings are offsets from the start of the new-format cache.
    let string_at = |at: u32| -> Option<String> {
        let tail = cache.get(at as usize..)?;
        let end = tail.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&tail[..end]).into_owned())
    };
    let count = u32_at(20).unwrap_or(0) as usize;
    (0..count)
        .filter_map(|i| {
            let at = HEADER + i * ENTRY;
            let flags = u32_at(at)?;
            (flags & 0xffff == X86_64_LIBC6).then_some(())?;
            let name = string_at(u32_at(at + 4)?)?;
            let path = string_at(u32_at(at + 8)?)?;
            Some((name, PathBuf::from(path)))
        })
        .collect()
}

fn in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The file at `path` as ELF; the error says whether it could not be read or is not ELF.
pub(super) fn open_elf(path: &Path) -> Result<ElfFile, String> {
    ElfFile::open(path).map_err(|e| match e {
        ElfError::Io(e) => format!("cannot read {}: {e}", path.display()),
        ElfError::NotElf => format!("{} is not an ELF file", path.display()),
        e => format!("{} is not an ELF file: {e}", path.display()),
    })
}
