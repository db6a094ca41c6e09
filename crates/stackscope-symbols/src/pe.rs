//! PE images (Windows executables and DLLs), which are named by RVA (the address's offset
//! from the image's base, what a mapping at the image base with file offset 0 gives): from
//! the PDB their CodeView record names, when one that matches is found ([`pdb`]), else from
//! the DWARF a mingw build carries inside the image ([`dwarf`]).

pub(crate) mod dwarf;
pub mod pdb;

use std::io::Read;
use std::path::Path;

use memmap2::Mmap;
use object::{Architecture, Object, ObjectSection};

use crate::{FileId, SymbolError};

/// Whether the file at `path` starts as a PE image does (`MZ`, its DOS header).
pub(crate) fn is_pe(path: &Path) -> bool {
    let mut magic = [0u8; 2];
    crate::foreign::open(path, crate::foreign::Kind::Binary)
        .map_err(std::io::Error::from)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok()
        && magic == *b"MZ"
}

/// The PDB a PE image was linked with, as its CodeView (`RSDS`) debug record states it: a
/// PDB is that image's only if its GUID and age are these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeView {
    /// As stored in the image: the Windows `GUID` layout (three little-endian fields, then
    /// eight bytes).
    pub guid: [u8; 16],
    pub age: u32,
    /// The PDB's path when it was linked (a Windows path, as a rule).
    pub path: String,
}

impl CodeView {
    /// The PDB's file name: the last component of its recorded path, `\` or `/` separated.
    pub fn file_name(&self) -> &str {
        self.path.rsplit(['\\', '/']).next().unwrap_or(&self.path)
    }

    /// The directory name a symbol store keeps this PDB under: the GUID as 32 upper-case hex
    /// digits in its fields' order, then the age in hex without leading zeros.
    pub fn store_id(&self) -> String {
        let g = &self.guid;
        let data1 = u32::from_le_bytes([g[0], g[1], g[2], g[3]]);
        let data2 = u16::from_le_bytes([g[4], g[5]]);
        let data3 = u16::from_le_bytes([g[6], g[7]]);
        let mut id = format!("{data1:08X}{data2:04X}{data3:04X}");
        for byte in &g[8..] {
            id.push_str(&format!("{byte:02X}"));
        }
        id.push_str(&format!("{:X}", self.age));
        id
    }
}

/// The CodeView record of the PE image at `path`; `None` when it has none or is no image.
pub fn codeview(path: &Path) -> Option<CodeView> {
    PeInfo::inspect(path).ok()?.codeview
}

/// What naming a PE image's addresses needs to know about it.
#[derive(Debug)]
pub(crate) struct PeInfo {
    pub(crate) id: FileId,
    /// The preferred load address, which DWARF inside the image is addressed from.
    pub(crate) image_base: u64,
    pub(crate) codeview: Option<CodeView>,
    pub(crate) has_dwarf: bool,
    /// The start and end RVA of each function its unwind table (`.pdata`) lists, ascending.
    functions: Vec<(u32, u32)>,
}

impl PeInfo {
    pub(crate) fn inspect(path: &Path) -> Result<Self, SymbolError> {
        let (file, id) = FileId::open(path)?;
        // SAFETY: read-only private mapping; a file changed under us only gives wrong names.
        let map = unsafe { Mmap::map(&file) }.map_err(|error| SymbolError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let parse_err = |message: String| SymbolError::Parse {
            path: path.to_path_buf(),
            message,
        };
        let image = object::File::parse(&*map).map_err(|e| parse_err(e.to_string()))?;
        if !matches!(image, object::File::Pe32(_) | object::File::Pe64(_)) {
            return Err(parse_err("not a PE image".to_string()));
        }
        let codeview = image.pdb_info().ok().flatten().map(|cv| CodeView {
            guid: cv.guid(),
            age: cv.age(),
            path: String::from_utf8_lossy(cv.path()).into_owned(),
        });
        let functions = match (image.architecture(), image.section_by_name(".pdata")) {
            (Architecture::X86_64, Some(pdata)) => {
                pdata.data().map(unwind_functions).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        Ok(PeInfo {
            id,
            image_base: image.relative_address_base(),
            codeview,
            has_dwarf: image.section_by_name(".debug_info").is_some(),
            functions,
        })
    }

    /// The RVA of the start of the function holding `rva`, if the unwind table lists it
    /// (leaf functions that touch no stack have no entry).
    pub(crate) fn function_start(&self, rva: u32) -> Option<u32> {
        let at = self.functions.partition_point(|&(start, _)| start <= rva);
        let &(start, end) = self.functions[..at].last()?;
        (rva < end).then_some(start)
    }
}

/// The (begin, end) RVAs of an x64 `.pdata` section's `RUNTIME_FUNCTION` entries (begin, end
/// and unwind-info RVAs, 4 bytes each, little-endian), sorted.
fn unwind_functions(pdata: &[u8]) -> Vec<(u32, u32)> {
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let mut functions: Vec<(u32, u32)> = pdata
        .chunks_exact(12)
        .map(|entry| (word(&entry[0..4]), word(&entry[4..8])))
        .filter(|&(begin, end)| begin != 0 && begin < end)
        .collect();
    functions.sort_unstable();
    functions.dedup();
    functions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_ids_put_the_guid_fields_in_order_and_the_age_in_hex() {
        let cv = CodeView {
            guid: [
                0x78, 0x56, 0x34, 0x12, 0xbc, 0x9a, 0xf0, 0xde, 1, 2, 3, 4, 5, 6, 7, 8,
            ],
            age: 0x1a,
            path: r"C:\build\out\app.pdb".to_string(),
        };
        assert_eq!(cv.store_id(), "123456789ABCDEF001020304050607081A");
        assert_eq!(cv.file_name(), "app.pdb");
    }

    #[test]
    fn unwind_entries_give_the_function_holding_an_rva() {
        let entry = |begin: u32, end: u32| {
            let mut e = begin.to_le_bytes().to_vec();
            e.extend(end.to_le_bytes());
            e.extend(0u32.to_le_bytes());
            e
        };
        let pdata = [entry(0x2000, 0x2040), entry(0x1000, 0x1100), vec![0; 12]].concat();
        let functions = unwind_functions(&pdata);
        assert_eq!(functions, vec![(0x1000, 0x1100), (0x2000, 0x2040)]);
        let info = |functions| PeInfo {
            id: FileId::of(&std::fs::metadata(".").unwrap()),
            image_base: 0,
            codeview: None,
            has_dwarf: false,
            functions,
        };
        let info = info(functions);
        assert_eq!(info.function_start(0x1000), Some(0x1000));
        assert_eq!(info.function_start(0x10ff), Some(0x1000));
        assert_eq!(info.function_start(0x1100), None, "between two functions");
        assert_eq!(info.function_start(0x2010), Some(0x2000));
        assert_eq!(info.function_start(0xfff), None);
    }
}
