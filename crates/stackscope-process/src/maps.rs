//! What a profiled process has mapped where, as the kernel tells it: its executable mappings
//! read from `/proc/PID/maps` into an [`AddressSpace`] (for processes that were running before
//! sampling began; the sources keep it up to date from mmap records); and the file behind a
//! mapping, opened as the process sees it.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use stackscope_stacks::module::ModuleFile;
use stackscope_stacks::AddressSpace;
pub use stackscope_stacks::Mapping;
use stackscope_symbols::foreign::{self, Kind};

/// Reads the executable mappings of a live process from `/proc/PID/maps`.
pub fn read_proc_maps(pid: u32) -> io::Result<AddressSpace> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_proc_maps(&text))
}

/// Parses the text of a `/proc/PID/maps` file, keeping executable mappings.
pub fn parse_proc_maps(text: &str) -> AddressSpace {
    text.lines().filter_map(parse_maps_line).collect()
}

/// `start-end perms offset dev inode path`; only executable mappings.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_ascii_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    // The path may contain spaces; it is the rest of the line after the inode.
    let path = line
        .splitn(6, |c: char| c.is_ascii_whitespace())
        .nth(5)
        .map(str::trim_start)
        .unwrap_or("");
    if !perms.contains('x') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: if path.is_empty() { "//anon" } else { path }.into(),
        build_id: None,
    })
}

/// Opens the file behind a mapping as the process sees it: through its root (it may live in
/// another mount namespace), or through `map_files` when the file was deleted or replaced;
/// as a file the process named ([`foreign`]: a FIFO or device put in its place is refused).
pub fn open_mapped_file(pid: u32, m: &Mapping) -> Option<File> {
    let open = |path: &str| foreign::open(Path::new(path), Kind::Binary);
    if let Some(path) = m.path.strip_suffix(" (deleted)") {
        return open(&format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
            .or_else(|_| open(path))
            .ok();
    }
    open(&format!("/proc/{pid}/root{}", m.path))
        .or_else(|_| open(&m.path))
        .ok()
}

/// The vDSO is the same image in every process on this kernel, so ours stands in for theirs.
pub fn own_vdso() -> Option<Arc<ModuleFile>> {
    static VDSO: OnceLock<Option<Arc<ModuleFile>>> = OnceLock::new();
    VDSO.get_or_init(|| {
        let maps = read_proc_maps(std::process::id()).ok()?;
        let m = maps.iter().find(|m| &*m.path == "[vdso]")?;
        let mut image = vec![0; usize::try_from(m.end - m.start).ok()?];
        File::open("/proc/self/mem")
            .ok()?
            .read_exact_at(&mut image, m.start)
            .ok()?;
        ModuleFile::from_bytes(&image).ok().map(Arc::new)
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c7a00000-55d0c7a02000 r--p 00000000 fe:01 1234 /usr/bin/my prog
55d0c7a02000-55d0c7a08000 r-xp 00002000 fe:01 1234 /usr/bin/my prog
7f1e3c028000-7f1e3c1bd000 r-xp 00028000 fe:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e3c400000-7f1e3c401000 rwxp 00000000 00:00 0
7ffd1a5f2000-7ffd1a5f4000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn parses_executable_mappings_with_spaces_in_paths() {
        let maps = parse_proc_maps(MAPS);
        let paths: Vec<&str> = maps.iter().map(|m| &*m.path).collect();
        assert_eq!(
            paths,
            [
                "/usr/bin/my prog",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "//anon",
                "[vdso]"
            ]
        );
        let libc = maps.find(0x7f1e3c028010).unwrap();
        assert_eq!(libc.file_offset(0x7f1e3c028010), 0x28010);
        assert!(maps.find(0x55d0c7a00010).is_none(), "not executable");
        assert!(maps.find(0x7f1e3c1bd000).is_none(), "end is exclusive");
    }
}
