//! The reader against object's own parse of the test binary, and its refusals.

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use super::*;
use crate::FileId;

fn own_binary() -> std::path::PathBuf {
    std::env::current_exe().unwrap()
}

#[test]
fn reads_what_object_reads_of_the_test_binary() {
    let path = own_binary();
    let elf = ElfFile::open(&path).unwrap();
    let data = std::fs::read(&path).unwrap();
    let oracle = object::File::parse(&*data).unwrap();
    assert!(elf.is_64());
    assert_eq!(elf.machine(), elf::EM_X86_64);
    assert_eq!(elf.entry(), oracle.entry());
    assert_eq!(elf.build_id(), oracle.build_id().unwrap());
    let segments: Vec<(u64, u64, u64)> = elf
        .segments()
        .iter()
        .map(|s| (s.offset, s.filesz, s.vaddr))
        .collect();
    let expected: Vec<(u64, u64, u64)> = oracle
        .segments()
        .map(|s| (s.file_range().0, s.file_range().1, s.address()))
        .collect();
    assert_eq!(segments, expected);
    assert!(elf.segments().iter().any(|s| s.executable));
    for name in [".text", ".eh_frame", ".eh_frame_hdr"] {
        let ours = elf.section(name).unwrap();
        let theirs = oracle.section_by_name(name).unwrap();
        assert_eq!(ours.address(), theirs.address(), "{name}");
        assert_eq!(ours.data(), Some(theirs.data().unwrap()), "{name}");
        assert_eq!(&*ours.shared().unwrap(), theirs.data().unwrap(), "{name}");
    }
    assert!(elf.section(".no_such_section").is_none());
}

#[test]
fn functions_and_their_code_match_the_symbol_table() {
    let path = own_binary();
    let elf = ElfFile::open(&path).unwrap();
    let data = std::fs::read(&path).unwrap();
    let oracle = object::File::parse(&*data).unwrap();
    let functions = elf.functions(SymbolTable::Static).unwrap();
    let expected: Vec<(u64, u64)> = oracle
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text)
        .map(|s| (s.address(), s.size()))
        .collect();
    let got: Vec<(u64, u64)> = functions.iter().map(|f| (f.address, f.size)).collect();
    assert_eq!(got, expected);
    let text = oracle.section_by_name(".text").unwrap();
    let function = functions
        .iter()
        .find(|f| f.size >= 8 && text.address() <= f.address)
        .unwrap();
    assert_eq!(
        elf.code(function, 8),
        text.data_range(function.address, 8).unwrap()
    );
}

#[test]
fn defined_function_names_are_the_symbol_tables_defined_text_symbols() {
    let path = own_binary();
    let elf = ElfFile::open(&path).unwrap();
    let data = std::fs::read(&path).unwrap();
    let oracle = object::File::parse(&*data).unwrap();
    for (table, symbols) in [
        (SymbolTable::Static, oracle.symbols()),
        (SymbolTable::Dynamic, oracle.dynamic_symbols()),
    ] {
        let expected: Vec<&[u8]> = symbols
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
            .map(|s| s.name_bytes().unwrap())
            .collect();
        let got = elf.defined_function_names(table).unwrap_or_default();
        assert_eq!(got, expected, "{table:?}");
    }
    let names = elf.defined_function_names(SymbolTable::Static).unwrap();
    assert!(names.iter().any(|n| n.starts_with(b"main")));
}

#[test]
fn notes_are_read_from_the_named_section() {
    let elf = ElfFile::open(&own_binary()).unwrap();
    let notes = elf.notes(".note.gnu.build-id");
    let build_id = notes
        .iter()
        .find(|n| n.owner == b"GNU" && n.kind == elf::NT_GNU_BUILD_ID.0)
        .unwrap();
    assert_eq!(Some(build_id.desc), elf.build_id());
    assert!(elf.notes(".text").is_empty(), "not a note section");
    assert!(elf.notes(".no_such_section").is_empty());
}

#[test]
fn fde_starts_are_sorted_and_name_functions() {
    let elf = ElfFile::open(&own_binary()).unwrap();
    let starts = elf.fde_starts().unwrap();
    assert!(!starts.is_empty());
    assert!(starts.windows(2).all(|w| w[0] <= w[1]));
    let functions = elf.functions(SymbolTable::Static).unwrap();
    let described = functions
        .iter()
        .filter(|f| starts.binary_search(&f.address).is_ok())
        .count();
    assert!(
        described * 2 > functions.len(),
        "{described} of {}",
        functions.len()
    );
}

#[test]
fn segments_turn_offsets_into_addresses_and_back() {
    let segment = Segment {
        offset: 0x1000,
        vaddr: 0x401000,
        filesz: 0x200,
        memsz: 0x300,
        executable: true,
    };
    assert_eq!(segment.vaddr_of(0x1010), Some(0x401010));
    assert_eq!(segment.offset_of(0x401010), Some(0x1010));
    assert_eq!(segment.vaddr_of(0x1200), None);
    assert_eq!(segment.offset_of(0x401250), None, "past the file's bytes");
    assert_eq!(segment.vaddr_of(0xfff), None);
}

#[test]
fn files_that_are_not_elf_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in [
        ("empty", &b""[..]),
        ("short", b"\x7fEL"),
        ("text", b"hello"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        assert!(
            matches!(ElfFile::open(&path), Err(ElfError::NotElf)),
            "{name}"
        );
    }
    assert!(matches!(
        ElfFile::from_bytes(b"\x7fELF\x02\x01"),
        Err(ElfError::Header(_))
    ));
    let missing = ElfFile::open(&dir.path().join("missing"));
    assert!(matches!(missing, Err(ElfError::Io(_))));
}

#[test]
fn a_rewritten_file_gets_a_new_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("binary");
    std::fs::write(&path, b"one").unwrap();
    let first = FileId::of_path(&path).unwrap();
    assert_eq!(FileId::of_path(&path).unwrap(), first);
    std::fs::write(&path, b"three").unwrap();
    assert_ne!(FileId::of_path(&path).unwrap(), first);
}
