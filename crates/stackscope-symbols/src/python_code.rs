//! CPython code objects read from a process's memory: a code object's name, file and first
//! line, and the line an instruction offset is on, from its location table; and which CPython
//! an interpreter's file is, from the version constant it exports. Generic over how
//! memory is read (a live process, a core, a test), as the walk is. A code object is read once
//! and its lines looked up as often as its frames were sampled.
//!
//! Layouts are those of x86-64 GIL builds of CPython 3.11 and 3.12, as their headers
//! (`Include/cpython/code.h`, `unicodeobject.h`, `bytesobject.h`) lay them out; the location
//! table's encoding is the one `Objects/locations.md` documents.

use crate::elf::{ElfFile, SymbolTable};

/// A CPython release, as `PY_VERSION_HEX` numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PyVersion {
    pub major: u8,
    pub minor: u8,
    pub micro: u8,
}

impl PyVersion {
    /// The version of the CPython whose ELF file `elf` is (a static interpreter's executable,
    /// or `libpython3.X.so`), from the `Py_Version` constant it exports from 3.11 on: read from
    /// the file, so a new patch release needs nothing new here. `None` for any other file.
    pub fn of_file(elf: &ElfFile) -> Option<PyVersion> {
        let bytes = [SymbolTable::Dynamic, SymbolTable::Static]
            .into_iter()
            .find_map(|table| elf.object_bytes(table, b"Py_Version"))?;
        let hex = match bytes.len() {
            8 => u64::from_ne_bytes(bytes.try_into().ok()?),
            4 => u64::from(u32::from_ne_bytes(bytes.try_into().ok()?)),
            _ => return None,
        };
        let byte = |shift: u32| (hex >> shift) as u8;
        Some(PyVersion {
            major: byte(24),
            minor: byte(16),
            micro: byte(8),
        })
    }

    /// The code object layout of this version, when this reader knows it.
    pub fn code_layout(&self) -> Option<CodeLayout> {
        CodeLayout::of(self.major, self.minor)
    }
}

impl std::fmt::Display for PyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)
    }
}

/// Where the fields this reader needs sit, for one CPython minor version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeLayout {
    pub firstlineno: u64,
    pub filename: u64,
    pub name: u64,
    pub qualname: u64,
    pub linetable: u64,
    /// Where the bytecode starts (`co_code_adaptive`, `PyCode_Type.tp_basicsize`): an
    /// instruction pointer's offset from it, in 2-byte code units, is its index.
    pub code: u64,
    /// Where a compact ASCII string's characters start (`sizeof(PyASCIIObject)`).
    pub ascii_data: u64,
    /// Where a compact non-ASCII string's characters start (`sizeof(PyCompactUnicodeObject)`).
    pub compact_data: u64,
}

impl CodeLayout {
    /// The layout of CPython `major.minor`, when this reader knows it.
    pub fn of(major: u8, minor: u8) -> Option<CodeLayout> {
        let common = CodeLayout {
            firstlineno: 72,
            filename: 112,
            name: 120,
            qualname: 128,
            linetable: 136,
            code: 184,
            ascii_data: 48,
            compact_data: 72,
        };
        match (major, minor) {
            (3, 11) => Some(common),
            // 3.12 dropped `wstr` from strings and moved the argument counts.
            (3, 12) => Some(CodeLayout {
                firstlineno: 68,
                code: 192,
                ascii_data: 40,
                compact_data: 56,
                ..common
            }),
            _ => None,
        }
    }
}

/// Strings and byte strings are read up to this many bytes: past any real name or path.
const MOST: u64 = 64 << 10;
/// `PyBytesObject`: `ob_size`, then the bytes.
const BYTES_SIZE: u64 = 16;
const BYTES_DATA: u64 = 32;
/// `PyASCIIObject`: `length` (in characters), then the `state` bit field.
const STR_LENGTH: u64 = 16;
const STR_STATE: u64 = 32;

/// What a code object says of itself: enough to name its frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyCode {
    /// `co_qualname`: `Class.method`, `outer.<locals>.inner`, `<module>`.
    pub qualname: String,
    pub filename: String,
    pub firstlineno: u32,
    /// `co_linetable`, the location table.
    linetable: Vec<u8>,
}

impl PyCode {
    /// Reads the code object at `addr` with `read(address, buffer)`, which fills the whole
    /// buffer or says it could not; `None` when a read fails or a field is not what it must be.
    pub fn read(
        addr: u64,
        layout: &CodeLayout,
        mut read: impl FnMut(u64, &mut [u8]) -> bool,
    ) -> Option<PyCode> {
        let mut word = |at: u64| -> Option<u64> {
            let mut buf = [0u8; 8];
            read(at, &mut buf).then(|| u64::from_ne_bytes(buf))
        };
        let firstlineno = word(addr + layout.firstlineno)? as u32;
        let filename = word(addr + layout.filename)?;
        let qualname = word(addr + layout.qualname)?;
        let linetable = word(addr + layout.linetable)?;
        Some(PyCode {
            qualname: read_str(qualname, layout, &mut read)?,
            filename: read_str(filename, layout, &mut read)?,
            firstlineno,
            linetable: read_bytes(linetable, &mut read)?,
        })
    }

    /// The line of the instruction at `index` (in code units), from the location table; the
    /// first line for an index the table has no line for.
    pub fn line(&self, index: u32) -> u32 {
        line_at(&self.linetable, self.firstlineno, index).unwrap_or(self.firstlineno)
    }
}

/// The bytes of the `bytes` object at `addr`.
fn read_bytes(addr: u64, read: &mut impl FnMut(u64, &mut [u8]) -> bool) -> Option<Vec<u8>> {
    let mut size = [0u8; 8];
    if !read(addr + BYTES_SIZE, &mut size) {
        return None;
    }
    let size = u64::from_ne_bytes(size);
    if size > MOST {
        return None;
    }
    let mut bytes = vec![0u8; size as usize];
    read(addr + BYTES_DATA, &mut bytes).then_some(bytes)
}

/// The `str` object at `addr`, compact (as code objects' strings are): ASCII, or Latin-1,
/// UCS-2 or UCS-4 by its kind.
fn read_str(
    addr: u64,
    layout: &CodeLayout,
    read: &mut impl FnMut(u64, &mut [u8]) -> bool,
) -> Option<String> {
    let mut length = [0u8; 8];
    let mut state = [0u8; 4];
    if !read(addr + STR_LENGTH, &mut length) || !read(addr + STR_STATE, &mut state) {
        return None;
    }
    let length = u64::from_ne_bytes(length);
    let state = u32::from_ne_bytes(state);
    let kind = u64::from((state >> 2) & 7);
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact || !matches!(kind, 1 | 2 | 4) || length.saturating_mul(kind) > MOST {
        return None;
    }
    let data = if ascii {
        layout.ascii_data
    } else {
        layout.compact_data
    };
    let mut raw = vec![0u8; (length * kind) as usize];
    if !read(addr + data, &mut raw) {
        return None;
    }
    let chars: Option<String> = match kind {
        1 => Some(raw.iter().map(|&b| char::from(b)).collect()),
        2 => raw
            .chunks_exact(2)
            .map(|c| char::from_u32(u32::from(u16::from_ne_bytes([c[0], c[1]]))))
            .collect(),
        _ => raw
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
    };
    chars
}

/// The line of code unit `index` in a location table starting at `first`; `None` when the
/// table gives that instruction no line or does not reach it.
fn line_at(table: &[u8], first: u32, index: u32) -> Option<u32> {
    let mut bytes = table.iter().copied().peekable();
    let mut line = i64::from(first);
    let mut start = 0u32;
    while let Some(head) = bytes.next() {
        if head & 0x80 == 0 {
            return None;
        }
        let code = (head >> 3) & 15;
        let units = u32::from(head & 7) + 1;
        let mut varint = || -> Option<u64> {
            let mut value = 0u64;
            for shift in (0..64).step_by(6) {
                let b = *bytes.peek()?;
                if b & 0x80 != 0 {
                    return None;
                }
                bytes.next();
                value |= u64::from(b & 63) << shift;
                if b & 64 == 0 {
                    return Some(value);
                }
            }
            None
        };
        let (delta, has_line) = match code {
            15 => (0, false),
            14 | 13 => {
                let v = varint()?;
                let delta = if v & 1 != 0 {
                    -((v >> 1) as i64)
                } else {
                    (v >> 1) as i64
                };
                if code == 14 {
                    // End line, column and end column.
                    for _ in 0..3 {
                        varint()?;
                    }
                }
                (delta, true)
            }
            10..=12 => {
                // Column and end column, a byte each.
                bytes.next()?;
                bytes.next()?;
                (i64::from(code) - 10, true)
            }
            _ => {
                bytes.next()?;
                (0, true)
            }
        };
        line += delta;
        if index < start + units {
            return has_line.then(|| u32::try_from(line).ok()).flatten();
        }
        start += units;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::line_at;

    #[test]
    fn each_kind_of_location_entry_moves_the_line_as_it_says() {
        let table = [
            0x80 | (13 << 3), // no column, 1 unit: line + svarint(2) = 12
            4,
            0x80 | (11 << 3) | 1, // one line form, 2 units: line + 1 = 13
            5,
            9,
            0x80 | (3 << 3), // short form, 1 unit: same line
            0x12,
            0x80 | (15 << 3), // no location, 1 unit
            0x80 | (14 << 3), // long form, 1 unit: line - svarint(3) = 10
            7,
            1,
            2,
            3,
        ];
        let at = |i| line_at(&table, 10, i);
        assert_eq!(at(0), Some(12));
        assert_eq!(at(1), Some(13));
        assert_eq!(at(2), Some(13));
        assert_eq!(at(3), Some(13));
        assert_eq!(at(4), None);
        assert_eq!(at(5), Some(10));
        assert_eq!(at(6), None, "past the table");
        assert_eq!(line_at(&[0x12], 1, 0), None, "not an entry's first byte");
        assert_eq!(
            line_at(&[0x80 | (13 << 3), 0x40], 1, 0),
            None,
            "a varint cut short"
        );
    }
}
