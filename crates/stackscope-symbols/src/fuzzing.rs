//! Entry points for the fuzz targets (`fuzz/`) into readers of what others write that are not
//! public otherwise: a perf map's lines, a jitdump's records, a MiniDebugInfo stream, an ELF file's headers and
//! debug link. Not an API.

use crate::elf::ElfFile;

/// Parses `text` as a perf map and looks up a few addresses in it.
pub fn perf_map(text: &str) {
    let map = crate::perf_map::PerfMap::parse(text);
    for addr in [0, 1, 0x1000, u64::MAX / 2, u64::MAX] {
        let _ = map.lookup(addr);
    }
}

/// Parses `bytes` as a jitdump and looks up a few addresses in it.
pub fn jitdump(bytes: &[u8]) {
    let dump = crate::jitdump::JitDump::parse(bytes);
    for addr in [0, 1, 0x1000, u64::MAX / 2, u64::MAX] {
        let _ = dump.lookup(addr);
    }
}

/// Decompresses `compressed` as MiniDebugInfo, bounded to `bound` bytes; the bytes it gave.
pub fn mini_debuginfo(compressed: &[u8], bound: u64) -> usize {
    match crate::mini_debuginfo::decompress(compressed, bound) {
        Ok(Some(image)) => {
            assert!(image.len() as u64 <= bound);
            image.len()
        }
        _ => 0,
    }
}

/// Reads `bytes` as an ELF file: its headers, build-id, debug link and function symbols.
pub fn elf(bytes: &[u8]) {
    let Ok(elf) = ElfFile::from_bytes(bytes) else {
        return;
    };
    let _ = elf.build_id();
    let _ = crate::debug_file::debug_link(&elf);
    let _ = elf.functions(crate::elf::SymbolTable::Static);
    let _ = elf.function_starts(&[0, 0x1000]);
}
