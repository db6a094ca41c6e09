//! Shared by the symbolizer's tests: what they do to the binaries they build (strip them, split
//! off their debug info) and where they find a function in them.
#![allow(dead_code)]

use std::path::Path;

use object::{Object, ObjectSegment, ObjectSymbol};
use stackscope_symbols::{SymFrame, Symbolizer};

/// Frames of the one `offset` of `binary`, outermost first.
pub fn frames_at(
    symbolizer: &mut Symbolizer,
    binary: &Path,
    build_id: Option<&[u8]>,
    offset: u64,
) -> Vec<SymFrame> {
    symbolizer
        .symbolize_file(binary, build_id, &[offset])
        .unwrap()
        .remove(0)
}

/// 1-based line of the first line of `source` containing `marker`.
pub fn line_of(source: &str, marker: &str) -> u32 {
    let idx = source
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("marker {marker} not in source"));
    u32::try_from(idx + 1).unwrap()
}

/// File offset and size of the symtab symbol `pred` picks, translated from its virtual address
/// through the loadable segments.
pub fn symbol_offset(binary: &Path, pred: impl Fn(&str) -> bool) -> (u64, u64) {
    let data = std::fs::read(binary).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let (address, size) = symbol_address(&file, pred);
    (vaddr_to_offset(&file, address), size)
}

/// Virtual address and size of the symtab symbol `pred` picks.
pub fn symbol_address(file: &object::File<'_>, pred: impl Fn(&str) -> bool) -> (u64, u64) {
    let sym = file
        .symbols()
        .find(|s| s.name().map(&pred).unwrap_or(false))
        .expect("symbol not found");
    (sym.address(), sym.size())
}

pub fn vaddr_to_offset(file: &object::File<'_>, vaddr: u64) -> u64 {
    file.segments()
        .find_map(|seg| {
            let (off, size) = seg.file_range();
            (vaddr >= seg.address() && vaddr < seg.address() + size)
                .then(|| vaddr - seg.address() + off)
        })
        .expect("address in no loadable segment")
}
