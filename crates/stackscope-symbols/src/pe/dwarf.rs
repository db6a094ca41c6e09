//! DWARF inside a PE image (what mingw's gcc and clang leave in it with `-g`), named by the
//! same reader as an ELF file's DWARF: the image's `.debug_*` sections are copied into a
//! section-only ELF file, which the symbolizer then reads as a separate debug file, by
//! virtual address (image base + RVA, what the DWARF in a linked image holds).

use std::io::Write;

use object::{Architecture, Object, ObjectSection};
use tempfile::NamedTempFile;

/// The image's DWARF sections as an ELF file on disk, removed when this is dropped.
pub(crate) struct DwarfAsElf {
    file: NamedTempFile,
}

impl DwarfAsElf {
    /// Copies the `.debug_*` sections of the PE image `image`; `None` when it has none or
    /// they cannot be written.
    pub(crate) fn extract(image: &[u8]) -> Option<Self> {
        let pe = object::File::parse(image).ok()?;
        let sections: Vec<(String, &[u8])> = pe
            .sections()
            .filter_map(|section| {
                let name = section.name().ok()?;
                if !name.starts_with(".debug_") {
                    return None;
                }
                Some((name.to_string(), section.data().ok()?))
            })
            .collect();
        if sections.is_empty() {
            return None;
        }
        let machine = match pe.architecture() {
            Architecture::X86_64 => EM_X86_64,
            Architecture::Aarch64 => EM_AARCH64,
            Architecture::I386 => EM_386,
            _ => return None,
        };
        let mut file = tempfile::Builder::new()
            .prefix("stackscope-pe-dwarf")
            .tempfile()
            .ok()?;
        file.write_all(&elf_with_sections(machine, &sections))
            .ok()?;
        Some(DwarfAsElf { file })
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        self.file.path()
    }
}

const EM_386: u16 = 3;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;
const SHT_PROGBITS: u32 = 1;
const SHT_STRTAB: u32 = 3;
const EHDR_SIZE: usize = 64;
const SHDR_SIZE: usize = 64;

/// A little-endian 64-bit ELF executable holding only `sections` (no program headers, no
/// symbols), and its section-name table.
fn elf_with_sections(machine: u16, sections: &[(String, &[u8])]) -> Vec<u8> {
    let mut names = vec![0u8];
    let mut headers: Vec<[u8; SHDR_SIZE]> = vec![[0; SHDR_SIZE]];
    let mut body = Vec::new();
    let mut add = |name_at: usize, kind: u32, data: &[u8]| {
        let offset = (EHDR_SIZE + body.len()) as u64;
        body.extend_from_slice(data);
        let mut header = [0u8; SHDR_SIZE];
        header[0..4].copy_from_slice(&(name_at as u32).to_le_bytes());
        header[4..8].copy_from_slice(&kind.to_le_bytes());
        header[24..32].copy_from_slice(&offset.to_le_bytes());
        header[32..40].copy_from_slice(&(data.len() as u64).to_le_bytes());
        header[48..56].copy_from_slice(&1u64.to_le_bytes());
        headers.push(header);
    };
    for (name, data) in sections {
        let name_at = names.len();
        names.extend_from_slice(name.as_bytes());
        names.push(0);
        add(name_at, SHT_PROGBITS, data);
    }
    let own_name = names.len();
    names.extend_from_slice(b".shstrtab\0");
    add(own_name, SHT_STRTAB, &names);
    let shstrndx = (headers.len() - 1) as u16;

    let shoff = (EHDR_SIZE + body.len()).next_multiple_of(8);
    let mut elf = Vec::with_capacity(shoff + headers.len() * SHDR_SIZE);
    elf.extend_from_slice(b"\x7fELF");
    // 64-bit, little-endian, version 1, System V ABI.
    elf.extend_from_slice(&[2, 1, 1, 0]);
    elf.extend_from_slice(&[0; 8]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&machine.to_le_bytes());
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&0u64.to_le_bytes()); // entry
    elf.extend_from_slice(&0u64.to_le_bytes()); // program headers: none
    elf.extend_from_slice(&(shoff as u64).to_le_bytes());
    elf.extend_from_slice(&0u32.to_le_bytes()); // flags
    elf.extend_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
    elf.extend_from_slice(&0u16.to_le_bytes()); // program header size
    elf.extend_from_slice(&0u16.to_le_bytes()); // program header count
    elf.extend_from_slice(&(SHDR_SIZE as u16).to_le_bytes());
    elf.extend_from_slice(&(headers.len() as u16).to_le_bytes());
    elf.extend_from_slice(&shstrndx.to_le_bytes());
    elf.extend_from_slice(&body);
    elf.resize(shoff, 0);
    for header in &headers {
        elf.extend_from_slice(header);
    }
    elf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::ElfFile;

    #[test]
    fn the_elf_file_holds_the_sections_by_name() {
        let info = b"info bytes".as_slice();
        let line = b"line".as_slice();
        let elf = elf_with_sections(
            EM_X86_64,
            &[(".debug_info".into(), info), (".debug_line".into(), line)],
        );
        let parsed = ElfFile::from_bytes(&elf).unwrap();
        assert_eq!(parsed.section(".debug_info").unwrap().data(), Some(info));
        assert_eq!(parsed.section(".debug_line").unwrap().data(), Some(line));
        assert!(parsed.section(".shstrtab").is_some());
    }
}
