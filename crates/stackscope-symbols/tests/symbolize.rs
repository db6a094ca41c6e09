//! End-to-end checks of the symbolizer on binaries compiled here with gcc, g++ and rustc, on
//! this machine's kernel symbols and vDSO, and on perf map files.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{frames_at, line_of, symbol_offset, vaddr_to_offset};
use object::{Object, ObjectSymbol};
use stackscope_symbols::{SymFrame, SymbolError, Symbolizer};
use stackscope_testkit::shipped::{keep_debug, strip};
use stackscope_testkit::{compile, run};
use tempfile::TempDir;

const C_PROGRAM: &str = r#"#include <stdio.h>
#include <stdlib.h>

static volatile unsigned sink;

static __attribute__((noinline)) unsigned local_work(unsigned x)
{
    unsigned acc = 0;
    for (unsigned i = 0; i < x; i++)
        acc += (i * 2654435761u) >> 7;
    sink = acc;
    return acc;
}

static inline __attribute__((always_inline)) unsigned leaf_mix(unsigned v)
{
    sink += v * 3u; /* LEAF_LINE */
    return sink ^ (v << 5);
}

static inline __attribute__((always_inline)) unsigned middle_step(unsigned v)
{
    return leaf_mix(v + 11u) * 7u; /* MIDDLE_CALL */
}

__attribute__((noinline)) unsigned outer_loop(unsigned n)
{
    unsigned r = 0;
    for (unsigned i = 0; i < n; i++)
        r += middle_step(i); /* OUTER_CALL */
    return r;
}

int main(int argc, char **argv)
{
    unsigned n = (unsigned)atoi(argc > 1 ? argv[1] : "100");
    printf("%u\n", outer_loop(n) + local_work(n));
    return 0;
}
"#;

const C_LIBRARY: &str = r#"static volatile int lib_sink;

static __attribute__((noinline)) int lib_private(int x)
{
    for (int i = 0; i < x; i++)
        lib_sink += i;
    return lib_sink;
}

int lib_exported(int x)
{
    return lib_private(x) + 1; /* LIB_CALL */
}
"#;

const CPP_PROGRAM: &str = r#"#include <cstdio>
#include <cstdlib>

namespace shapes {
struct Widget {
    int scale;
    __attribute__((noinline)) long compute(int n) const;
};

long Widget::compute(int n) const
{
    long total = 0;
    for (int i = 0; i < n; i++)
        total += (long)i * scale;
    return total;
}
}

int main(int argc, char **argv)
{
    shapes::Widget w{argc};
    std::printf("%ld\n", w.compute(std::atoi(argc > 1 ? argv[1] : "10")));
    return 0;
}
"#;

const RUST_PROGRAM: &str = r#"use std::hint::black_box;

#[inline(never)]
fn consume(v: u64) -> u64 {
    black_box(v)
}

#[inline(always)]
fn mix_step(i: u64) -> u64 {
    let v = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(7);
    consume(v) ^ (i >> 3) // MIX_LINE
}

#[inline(never)]
pub fn outer_work(n: u64) -> u64 {
    let mut s = 0u64;
    for i in 0..n {
        s = s.wrapping_add(mix_step(black_box(i))); // OUTER_CALL
    }
    s
}

fn main() {
    let n = std::env::args().count() as u64 * 1000;
    println!("{}", outer_work(black_box(n)));
}
"#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn names(frames: &[SymFrame]) -> Vec<&str> {
    frames.iter().map(|f| f.name.as_str()).collect()
}

fn build_c_program(dir: &Path, extra: &[&str]) -> PathBuf {
    let args = [&["-O2", "-g"], extra].concat();
    compile("gcc", dir, ("prog.c", C_PROGRAM), &args, &[], "prog")
}

/// Symbolizes every byte of the function `name` in `binary`.
fn symbolize_function(
    symbolizer: &mut Symbolizer,
    symbols_from: &Path,
    binary: &Path,
    pred: impl Fn(&str) -> bool,
) -> Vec<Vec<SymFrame>> {
    let (start, size) = symbol_offset(symbols_from, pred);
    assert!(size > 0);
    let offsets: Vec<u64> = (start..start + size).collect();
    symbolizer.symbolize_file(binary, None, &offsets).unwrap()
}

/// Checks the C program's `outer_loop`: every address names it first, and some addresses are
/// inside `leaf_mix` inlined through `middle_step`, with each frame's line being where
/// execution is in that function.
fn check_c_outer_loop(all: &[Vec<SymFrame>]) {
    let outer_call = line_of(C_PROGRAM, "OUTER_CALL");
    let middle_call = line_of(C_PROGRAM, "MIDDLE_CALL");
    let leaf_first = line_of(C_PROGRAM, "LEAF_LINE");
    let mut deepest = 0;
    for frames in all {
        assert!(!frames.is_empty());
        assert_eq!(frames[0].name, "outer_loop");
        assert!(!frames[0].inlined);
        assert!(frames[0].file.as_deref().unwrap().ends_with("prog.c"));
        assert!(frames[0].line.is_some());
        assert!(frames[1..].iter().all(|f| f.inlined));
        if frames.len() == 3 {
            deepest += 1;
            assert_eq!(names(frames), ["outer_loop", "middle_step", "leaf_mix"]);
            assert_eq!(frames[0].line, Some(outer_call));
            assert_eq!(frames[1].line, Some(middle_call));
            let leaf_line = frames[2].line.unwrap();
            assert!(
                (leaf_first..leaf_first + 2).contains(&leaf_line),
                "line {leaf_line} not in leaf_mix"
            );
            assert!(frames[2].file.as_deref().unwrap().ends_with("prog.c"));
        }
        assert!(frames.len() <= 3, "{frames:?}");
    }
    assert!(deepest > 0, "no address inside the inlined leaf_mix");
}

#[test]
fn c_program_inlined_frames_outermost_first() {
    let dir = TempDir::new().unwrap();
    let prog = build_c_program(dir.path(), &[]);
    let mut symbolizer = Symbolizer::new();
    let all = symbolize_function(&mut symbolizer, &prog, &prog, |n| n == "outer_loop");
    check_c_outer_loop(&all);
}

#[test]
fn c_program_static_function() {
    let dir = TempDir::new().unwrap();
    let prog = build_c_program(dir.path(), &[]);
    // The point is a local symbol: check the compiler kept it so.
    let data = std::fs::read(&prog).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok("local_work"))
        .unwrap();
    assert!(sym.is_local());

    let (start, size) = symbol_offset(&prog, |n| n == "local_work");
    let mut symbolizer = Symbolizer::new();
    let frames = symbolizer
        .symbolize_file(&prog, None, &[start, start + 1, start + size - 1])
        .unwrap();
    for f in &frames {
        assert_eq!(f[0].name, "local_work");
        assert!(f[0].file.as_deref().unwrap().ends_with("prog.c"));
        assert!(f[0].line.is_some());
    }
}

#[test]
fn shared_library() {
    let dir = TempDir::new().unwrap();
    let lib = compile(
        "gcc",
        dir.path(),
        ("lib.c", C_LIBRARY),
        &["-O2", "-g", "-shared", "-fPIC"],
        &[],
        "libdemo.so",
    );
    let (exported, _) = symbol_offset(&lib, |n| n == "lib_exported");
    let (private, _) = symbol_offset(&lib, |n| n == "lib_private");
    let mut symbolizer = Symbolizer::new();
    let frames = symbolizer
        .symbolize_file(&lib, None, &[exported + 1, private + 1])
        .unwrap();
    assert_eq!(frames[0][0].name, "lib_exported");
    assert!(frames[0][0].file.as_deref().unwrap().ends_with("lib.c"));
    assert!(frames[0][0].line.is_some());
    assert_eq!(frames[1][0].name, "lib_private");
    assert!(frames[1][0].line.is_some());
}

#[test]
fn cpp_names_are_demangled() {
    let dir = TempDir::new().unwrap();
    let prog = compile(
        "g++",
        dir.path(),
        ("prog.cpp", CPP_PROGRAM),
        &["-O2", "-g"],
        &[],
        "cprog",
    );
    let (start, _) = symbol_offset(&prog, |n| n.starts_with("_ZNK6shapes6Widget7compute"));
    let mut symbolizer = Symbolizer::new();
    let frames = frames_at(&mut symbolizer, &prog, None, start);
    assert_eq!(frames[0].name, "shapes::Widget::compute(int) const");
    assert!(frames[0].file.as_deref().unwrap().ends_with("prog.cpp"));

    // Without DWARF the name comes from the symbol table and must be demangled as well.
    let stripped = dir.path().join("cprog-nodebug");
    strip("--strip-debug", &prog, &stripped);
    let frames = frames_at(&mut symbolizer, &stripped, None, start);
    assert_eq!(frames[0].name, "shapes::Widget::compute(int) const");
    assert_eq!(frames[0].file, None);
}

fn has_legacy_hash(name: &str) -> bool {
    name.rsplit_once("::h")
        .is_some_and(|(_, h)| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn build_rust(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let common: &[&str] = &[
        "--edition",
        "2021",
        "--crate-name",
        "rprog",
        "-C",
        "opt-level=3",
    ];
    let args = [common, flags].concat();
    compile("rustc", dir, ("rprog.rs", RUST_PROGRAM), &args, &[], name)
}

/// `rprog::outer_work` under the legacy mangling.
fn is_legacy_outer_work(symbol: &str) -> bool {
    symbol.starts_with("_ZN") && symbol.contains("10outer_work17h")
}

/// Builds the Rust program as `name` with `flags`, symbolizes all of `outer_work` (the symbol
/// `pred` picks) and asserts some address has the inlined `mix_step` frame, named `mix_name`.
fn check_rust_build(name: &str, flags: &[&str], pred: impl Fn(&str) -> bool, mix_name: &str) {
    let dir = TempDir::new().unwrap();
    let prog = build_rust(dir.path(), name, flags);
    let mut symbolizer = Symbolizer::new();
    let all = symbolize_function(&mut symbolizer, &prog, &prog, pred);
    assert!(
        check_rust_outer_work(&all, mix_name) > 0,
        "no inlined mix_step frame"
    );
}

/// Checks frames over all of `rprog::outer_work`; returns how many addresses had the inlined
/// `mix_step` frame, named `mix_name`.
fn check_rust_outer_work(all: &[Vec<SymFrame>], mix_name: &str) -> usize {
    let mix_line = line_of(RUST_PROGRAM, "MIX_LINE");
    let mut inlined_mix = 0;
    let mut located = 0;
    for frames in all {
        assert!(!frames.is_empty());
        assert_eq!(frames[0].name, "rprog::outer_work", "{frames:?}");
        // Line-0 code (no source position) has neither file nor line.
        assert_eq!(frames[0].file.is_some(), frames[0].line.is_some());
        if let Some(file) = &frames[0].file {
            assert!(file.ends_with("rprog.rs"), "{frames:#?}");
            located += 1;
        }
        for f in frames {
            assert!(!has_legacy_hash(&f.name), "hash left in {}", f.name);
            assert!(!f.name.starts_with("_R") && !f.name.starts_with("_ZN"));
        }
        if let Some(pos) = frames.iter().position(|f| f.name == mix_name) {
            inlined_mix += 1;
            assert!(pos >= 1 && frames[pos].inlined);
            // mix_step calls only std code inlined further in, so everything after it is std.
            assert!(frames[pos + 1..].iter().all(|f| f.inlined));
            if pos + 1 == frames.len() {
                assert_eq!(frames[pos].line, Some(mix_line));
            }
            assert_eq!(
                frames[pos - 1].line,
                Some(line_of(RUST_PROGRAM, "OUTER_CALL"))
            );
        }
    }
    assert!(located > 0, "no line anywhere in outer_work");
    inlined_mix
}

#[test]
fn rust_legacy_mangling_full_debuginfo() {
    check_rust_build(
        "legacy",
        &["-C", "debuginfo=2"],
        is_legacy_outer_work,
        "rprog::mix_step",
    );
}

#[test]
fn rust_v0_mangling_full_debuginfo() {
    check_rust_build(
        "v0",
        &["-C", "debuginfo=2", "-C", "symbol-mangling-version=v0"],
        |n| n.starts_with("_R") && n.contains("10outer_work"),
        "rprog::mix_step",
    );
}

#[test]
fn rust_line_tables_only() {
    // Line tables only still describe inlined calls, but without linkage names: inlined
    // functions come out unqualified. The real function's name comes from the symbol table.
    check_rust_build(
        "lines",
        &["-C", "debuginfo=line-tables-only"],
        is_legacy_outer_work,
        "mix_step",
    );
}

#[test]
fn rust_symbol_table_only() {
    let dir = TempDir::new().unwrap();
    let prog = build_rust(dir.path(), "nodebug", &["-C", "debuginfo=0"]);
    let (start, _) = symbol_offset(&prog, is_legacy_outer_work);
    let frames = frames_at(&mut Symbolizer::new(), &prog, None, start);
    assert_eq!(names(&frames), ["rprog::outer_work"]);
}

/// Stripped binary plus its debug file under `<debug dir>/.build-id/xx/yyyy.debug`.
#[test]
fn stripped_binary_uses_build_id_debug_file() {
    let dir = TempDir::new().unwrap();
    let prog = build_c_program(dir.path(), &["-Wl,--build-id=sha1"]);
    let debug = dir.path().join("prog.debug");
    keep_debug(&prog, &debug);
    let stripped = dir.path().join("prog-stripped");
    strip("--strip-all", &prog, &stripped);

    let data = std::fs::read(&stripped).unwrap();
    let file = object::File::parse(&*data).unwrap();
    assert!(file.symbols().next().is_none(), "strip left a symbol table");
    let build_id = file.build_id().unwrap().unwrap().to_vec();
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    let debug_dir = dir.path().join("debug");
    let target = debug_dir
        .join(".build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]));
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::copy(&debug, &target).unwrap();

    let (local, _) = symbol_offset(&prog, |n| n == "local_work");
    // Without the debug dir the static function cannot be named.
    let mut plain = Symbolizer::with_debug_dirs(vec![dir.path().join("empty")]);
    let frames = frames_at(&mut plain, &stripped, None, local);
    assert!(frames.iter().all(|f| f.name != "local_work"));

    let mut symbolizer = Symbolizer::with_debug_dirs(vec![debug_dir]);
    let frames = frames_at(&mut symbolizer, &stripped, None, local);
    assert_eq!(frames[0].name, "local_work");
    assert!(frames[0].line.is_some());
    let all = symbolize_function(&mut symbolizer, &prog, &stripped, |n| n == "outer_loop");
    check_c_outer_loop(&all);
}

/// A build-id passed by the caller (e.g. from the mapping) finds the debug file even when the
/// binary has no build-id note of its own.
#[test]
fn caller_build_id_finds_debug_file() {
    let dir = TempDir::new().unwrap();
    let prog = build_c_program(dir.path(), &["-Wl,--build-id=0xabcdef0123456789"]);
    let stripped = dir.path().join("prog-stripped");
    strip("--strip-all", &prog, &stripped);
    run(Command::new("objcopy")
        .arg("--remove-section=.note.gnu.build-id")
        .arg(&stripped));
    let build_id = [0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89];
    let debug_dir = dir.path().join("debug");
    let target = debug_dir.join(".build-id/ab/cdef0123456789.debug");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    keep_debug(&prog, &target);

    let (local, _) = symbol_offset(&prog, |n| n == "local_work");
    let mut symbolizer = Symbolizer::with_debug_dirs(vec![debug_dir]);
    let without = frames_at(&mut symbolizer, &stripped, None, local);
    assert!(without.iter().all(|f| f.name != "local_work"));
    let with = frames_at(&mut symbolizer, &stripped, Some(&build_id), local);
    assert_eq!(with[0].name, "local_work");
}

/// A debug file at a build-id's path whose own build-id is another (a stale file, or one
/// planted there) names nothing: the binary's own symbols name what they can.
#[test]
fn a_debug_file_of_another_build_at_the_build_id_path_is_not_used() {
    let dir = TempDir::new().unwrap();
    let prog = build_c_program(dir.path(), &["-Wl,--build-id=0xabcdef0123456789"]);
    std::fs::create_dir_all(dir.path().join("other")).unwrap();
    let other = build_c_program(
        &dir.path().join("other"),
        &["-Wl,--build-id=0x0123456789abcdef"],
    );
    let stripped = dir.path().join("prog-stripped");
    strip("--strip-all", &prog, &stripped);
    let debug_dir = dir.path().join("debug");
    let target = debug_dir.join(".build-id/ab/cdef0123456789.debug");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    keep_debug(&other, &target);

    let (local, _) = symbol_offset(&prog, |n| n == "local_work");
    let mut symbolizer = Symbolizer::with_debug_dirs(vec![debug_dir]);
    let before = stackscope_symbols::foreign::mismatched_count();
    let frames = frames_at(&mut symbolizer, &stripped, None, local);
    assert!(
        frames
            .iter()
            .all(|f| f.name != "local_work" && f.line.is_none()),
        "named from another build's debug file: {frames:?}"
    );
    assert!(stackscope_symbols::foreign::mismatched_count() > before);

    // The same file with the right build-id names it, so the file itself was fine.
    keep_debug(&prog, &target);
    let mut symbolizer = Symbolizer::with_debug_dirs(vec![dir.path().join("debug")]);
    assert_eq!(
        frames_at(&mut symbolizer, &stripped, None, local)[0].name,
        "local_work"
    );
}

/// A binary with a `.gnu_debuglink` (and no build-id) finds its debug file by name in the
/// debug dir.
#[test]
fn stripped_binary_uses_debug_link() {
    let dir = TempDir::new().unwrap();
    let prog = build_c_program(dir.path(), &["-Wl,--build-id=none"]);
    let debug = dir.path().join("prog.debug");
    keep_debug(&prog, &debug);
    let stripped = dir.path().join("bin").join("prog");
    std::fs::create_dir_all(stripped.parent().unwrap()).unwrap();
    strip("--strip-all", &prog, &stripped);
    run(Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(&stripped));
    let debug_dir = dir.path().join("debug");
    std::fs::create_dir_all(&debug_dir).unwrap();
    std::fs::rename(&debug, debug_dir.join("prog.debug")).unwrap();

    let (local, _) = symbol_offset(&prog, |n| n == "local_work");
    let mut symbolizer = Symbolizer::with_debug_dirs(vec![debug_dir]);
    let frames = frames_at(&mut symbolizer, &stripped, None, local);
    assert_eq!(frames[0].name, "local_work");
    assert!(frames[0].line.is_some());
}

#[test]
fn offsets_outside_code_are_unknown() {
    let dir = TempDir::new().unwrap();
    let prog = build_c_program(dir.path(), &[]);
    let len = std::fs::metadata(&prog).unwrap().len();
    let mut symbolizer = Symbolizer::new();
    let frames = symbolizer
        .symbolize_file(&prog, None, &[len + 0x10_0000, u64::MAX])
        .unwrap();
    assert_eq!(frames, vec![Vec::new(), Vec::new()]);
    assert!(symbolizer
        .symbolize_file(&prog, None, &[])
        .unwrap()
        .is_empty());
}

#[test]
fn missing_file_error_names_path() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("no-such-binary");
    let err = Symbolizer::new()
        .symbolize_file(&missing, None, &[0x1000])
        .unwrap_err();
    assert!(matches!(err, SymbolError::Read { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&*missing.to_string_lossy()),
        "{err}"
    );
}

#[test]
fn non_elf_files_are_errors() {
    let dir = TempDir::new().unwrap();
    let text = write(dir.path(), "notes.txt", "this is not a binary\n");
    let err = Symbolizer::new()
        .symbolize_file(&text, None, &[0])
        .unwrap_err();
    assert!(matches!(err, SymbolError::NotElf { .. }), "{err:?}");
    assert!(err.to_string().contains(&*text.to_string_lossy()), "{err}");

    let empty = write(dir.path(), "empty", "");
    let err = Symbolizer::new()
        .symbolize_file(&empty, None, &[0])
        .unwrap_err();
    assert!(matches!(err, SymbolError::NotElf { .. }), "{err:?}");

    let truncated = dir.path().join("truncated");
    std::fs::write(&truncated, b"\x7fELF\x02\x01\x01garbage").unwrap();
    let err = Symbolizer::new()
        .symbolize_file(&truncated, None, &[0])
        .unwrap_err();
    assert!(matches!(err, SymbolError::Parse { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&*truncated.to_string_lossy()),
        "{err}"
    );
}

fn kallsyms_address(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let addr = text
        .lines()
        .find_map(|l| {
            let mut parts = l.split_whitespace();
            let addr = parts.next()?;
            let _kind = parts.next()?;
            (parts.next()? == name).then(|| u64::from_str_radix(addr, 16).unwrap())
        })
        .unwrap_or_else(|| panic!("{name} not in /proc/kallsyms"));
    assert_ne!(
        addr, 0,
        "kallsyms addresses hidden (kptr_restrict); run as root"
    );
    addr
}

#[test]
fn kernel_addresses() {
    let schedule = kallsyms_address("schedule");
    let mut symbolizer = Symbolizer::new();
    let frames = symbolizer.symbolize_kernel(&[schedule + 1, schedule, 0x1000]);
    let first = frames[0].as_ref().unwrap();
    assert_eq!(first.name, "schedule");
    assert!(!first.inlined);
    assert_eq!(frames[1].as_ref().unwrap().name, "schedule");
    assert_eq!(frames[2], None);
}

#[test]
fn perf_map_for_fake_pid() {
    let dir = TempDir::new().unwrap();
    let pid = 4_000_001u32;
    std::fs::write(
        dir.path().join(format!("perf-{pid}.map")),
        "7f0000001000 40 LazyCompile:*hot_loop app.js:12\n\
         7f0000002000 10 jit_stub\n",
    )
    .unwrap();
    let mut symbolizer = Symbolizer::new().with_perf_map_dir(dir.path());
    let frames = symbolizer.symbolize_jit(
        pid,
        None,
        &[
            0x7f00_0000_1000,
            0x7f00_0000_103f,
            0x7f00_0000_1040,
            0x7f00_0000_2008,
        ],
    );
    assert_eq!(
        frames[0].as_ref().unwrap().name,
        "LazyCompile:*hot_loop app.js:12"
    );
    assert_eq!(
        frames[1].as_ref().unwrap().name,
        "LazyCompile:*hot_loop app.js:12"
    );
    assert_eq!(frames[2], None);
    assert_eq!(frames[3].as_ref().unwrap().name, "jit_stub");

    // No map: unknown, and the answer is kept for the pid (read once).
    let other = pid + 1;
    assert_eq!(
        symbolizer.symbolize_jit(other, None, &[0x7f00_0000_1000]),
        vec![None]
    );
    std::fs::write(
        dir.path().join(format!("perf-{other}.map")),
        "7f0000001000 40 late\n",
    )
    .unwrap();
    assert_eq!(
        symbolizer.symbolize_jit(other, None, &[0x7f00_0000_1000]),
        vec![None]
    );
}

/// Our own vDSO image, copied out of memory.
fn vdso_image() -> Vec<u8> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| l.ends_with("[vdso]"))
        .expect("no [vdso] mapping");
    let range = line.split_whitespace().next().unwrap();
    let (start, end) = range.split_once('-').unwrap();
    let start = usize::from_str_radix(start, 16).unwrap();
    let end = usize::from_str_radix(end, 16).unwrap();
    // SAFETY: the vDSO is mapped readable for the life of the process.
    unsafe { std::slice::from_raw_parts(start as *const u8, end - start) }.to_vec()
}

#[test]
fn vdso_offsets() {
    let image = vdso_image();
    let file = object::File::parse(&*image).unwrap();
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("__vdso_gettimeofday") || s.name() == Ok("gettimeofday"))
        .expect("no gettimeofday in the vDSO");
    let offset = vaddr_to_offset(&file, sym.address());
    let mut symbolizer = Symbolizer::new();
    let frames = symbolizer.symbolize_vdso(&[offset + 1, image.len() as u64 + 0x10_0000]);
    assert!(
        frames[0][0].name.contains("gettimeofday"),
        "{:?}",
        frames[0]
    );
    assert!(frames[1].is_empty(), "{:?}", frames[1]);
}
