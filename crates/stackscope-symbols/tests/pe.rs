//! PE images named by RVA: from their PDB (clang for the MSVC target, linked with the Rust
//! toolchain's lld, so no Windows SDK), only a PDB that matches the image's CodeView record,
//! found where Windows debuggers look; and from the DWARF inside a mingw build.

mod common;

use std::path::Path;
use std::process::Command;

use common::line_of;
use object::{Object, ObjectSymbol};
use stackscope_symbols::pe::pdb::SymbolPath;
use stackscope_symbols::{SymFrame, Symbolizer};
use stackscope_testkit::pe::{
    build_msvc, build_msvc_rust, calls_to, pdb_store_id, require, PdbProgram,
};
use tempfile::TempDir;

const C_PROGRAM: &str = r#"
static volatile int counter;
__attribute__((noinline)) static int helper(int x) { counter += x; return counter * 3; }
static inline int twice(int x) {
    return helper(x) + helper(x + 1); /* call helper */
}
__attribute__((noinline)) int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += twice(i); /* call twice */
    return s;
}
int mainCRTStartup(void) { return work(10); }
"#;

const CPP_PROGRAM: &str = r#"
namespace shapes {
struct Widget {
    int base;
    __attribute__((noinline)) int compute(int x) const;
};
int Widget::compute(int x) const { return base * x + 1; }
}
extern "C" int cpp_entry(int x) {
    shapes::Widget w{x};
    return w.compute(x + 1);
}
"#;

/// The same C++ without debug info: only the PDB's public symbols name it.
const CPP_PUBLIC_ONLY: &str = r#"
namespace shapes {
struct Gadget {
    __attribute__((noinline)) long measure(int a, char b);
};
long Gadget::measure(int a, char b) { return a * 7 + b; }
}
extern "C" long gadget_entry(int x) {
    shapes::Gadget g;
    return g.measure(x, (char)x);
}
"#;

const C_CALLS_CPP: &str = r#"
int cpp_entry(int x);
long gadget_entry(int x);
int mainCRTStartup(void) { return cpp_entry(3) + (int)gadget_entry(4); }
"#;

const C_FLAGS: &[&str] = &["-g", "-gcodeview", "-O1"];

fn build_c(dir: &Path) -> PdbProgram {
    build_msvc(dir, "t", &[("t.c", C_PROGRAM, "clang", C_FLAGS)])
}

/// The C program built in `build/` of a directory of its own, and its PDB's store id.
fn build_c_apart() -> (TempDir, PdbProgram, String) {
    let dir = TempDir::new().unwrap();
    let build = dir.path().join("build");
    std::fs::create_dir(&build).unwrap();
    let prog = build_c(&build);
    let id = pdb_store_id(&prog.pdb);
    (dir, prog, id)
}

fn name(symbolizer: &mut Symbolizer, exe: &Path, rvas: &[u64]) -> Vec<Vec<SymFrame>> {
    symbolizer.symbolize_file(exe, None, rvas).unwrap()
}

fn names(frames: &[SymFrame]) -> Vec<&str> {
    frames.iter().map(|f| f.name.as_str()).collect()
}

#[test]
fn functions_static_functions_and_lines_come_from_the_pdb() {
    let dir = TempDir::new().unwrap();
    let prog = build_c(dir.path());
    let work = prog.rva(|n| n == "work");
    let helper = prog.rva(|n| n == "helper");
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::default());
    let named = name(&mut symbolizer, &prog.exe, &[work, helper]);

    assert_eq!(names(&named[0]), ["work"], "{named:?}");
    assert_eq!(
        named[0][0].line,
        Some(line_of(C_PROGRAM, "int work(int n)"))
    );
    assert!(named[0][0].file.as_deref().unwrap().ends_with("t.c"));
    assert!(!named[0][0].inlined);
    // A static function has no public symbol: only the PDB's module symbols name it.
    assert_eq!(names(&named[1]), ["helper"], "{named:?}");
    assert_eq!(
        named[1][0].line,
        Some(line_of(C_PROGRAM, "static int helper("))
    );
}

#[test]
fn inlined_functions_come_from_the_pdb_with_their_call_sites() {
    let dir = TempDir::new().unwrap();
    let prog = build_c(dir.path());
    let work = prog.rva(|n| n == "work");
    let helper = prog.rva(|n| n == "helper");
    // `twice` is inlined into `work`: its calls to `helper` are in `work`'s code.
    let calls = calls_to(&prog, work, helper);
    assert!(!calls.is_empty(), "no call to helper inside work");
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::default());
    for frames in name(&mut symbolizer, &prog.exe, &calls) {
        assert_eq!(names(&frames), ["work", "twice"], "{frames:?}");
        assert_eq!(frames[0].line, Some(line_of(C_PROGRAM, "call twice")));
        assert!(!frames[0].inlined);
        assert_eq!(frames[1].line, Some(line_of(C_PROGRAM, "call helper")));
        assert!(frames[1].inlined);
    }
}

#[test]
fn cpp_names_from_the_pdb_and_from_decorated_public_symbols() {
    let dir = TempDir::new().unwrap();
    let cpp_flags: &[&str] = &["-O1"];
    let prog = build_msvc(
        dir.path(),
        "cpp",
        &[
            ("main.c", C_CALLS_CPP, "clang", C_FLAGS),
            (
                "widget.cpp",
                CPP_PROGRAM,
                "clang++",
                &["-g", "-gcodeview", "-O1"],
            ),
            ("gadget.cpp", CPP_PUBLIC_ONLY, "clang++", cpp_flags),
        ],
    );
    let compute = prog.rva(|n| n.starts_with("?compute@Widget@shapes@@"));
    let measure = prog.rva(|n| n.starts_with("?measure@Gadget@shapes@@"));
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::default());
    let named = name(&mut symbolizer, &prog.exe, &[compute, measure]);
    assert_eq!(names(&named[0]), ["shapes::Widget::compute(int) const"]);
    assert_eq!(
        named[0][0].line,
        Some(line_of(CPP_PROGRAM, "int Widget::compute(int x) const {"))
    );
    // Without debug info the name is the MSVC-decorated public symbol's, demangled.
    assert_eq!(names(&named[1]), ["shapes::Gadget::measure(int, char)"]);
    assert_eq!(named[1][0].line, None);
}

const RUST_PROGRAM: &str = r#"
#![no_std]
#![no_main]

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}

static mut COUNTER: u64 = 0;

#[inline(never)]
fn leaf_work(x: u64) -> u64 {
    unsafe {
        COUNTER = COUNTER.wrapping_add(x);
        COUNTER
    }
}

#[inline(always)]
fn middle(x: u64) -> u64 {
    leaf_work(x) ^ leaf_work(x + 1) // call leaf_work
}

#[inline(never)]
pub fn outer_work(n: u64) -> u64 {
    let mut s = 0;
    for i in 0..n {
        s += middle(i); // call middle
    }
    s
}

#[no_mangle]
pub extern "C" fn mainCRTStartup() -> u32 {
    outer_work(core::hint::black_box(10)) as u32
}
"#;

#[test]
fn rust_names_and_inlined_functions_from_the_pdb() {
    let dir = TempDir::new().unwrap();
    let prog = build_msvc_rust(
        dir.path(),
        "rprog",
        RUST_PROGRAM,
        &["-g", "-C", "opt-level=1"],
    );
    let outer = prog.rva(|n| n.contains("10outer_work"));
    let leaf = prog.rva(|n| n.contains("9leaf_work"));
    let calls = calls_to(&prog, outer, leaf);
    assert!(!calls.is_empty(), "no call to leaf_work inside outer_work");
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::default());
    let named = name(&mut symbolizer, &prog.exe, &[outer, calls[0]]);
    assert_eq!(names(&named[0]), ["rprog::outer_work"], "{named:?}");
    assert_eq!(
        named[0][0].line,
        Some(line_of(RUST_PROGRAM, "pub fn outer_work("))
    );
    assert_eq!(names(&named[1]), ["rprog::outer_work", "rprog::middle"]);
    assert_eq!(named[1][0].line, Some(line_of(RUST_PROGRAM, "call middle")));
    assert_eq!(
        named[1][1].line,
        Some(line_of(RUST_PROGRAM, "call leaf_work"))
    );
}

#[test]
fn a_pdb_of_another_build_is_not_used() {
    let dir = TempDir::new().unwrap();
    let prog = build_c(dir.path());
    let other_dir = TempDir::new().unwrap();
    let changed = C_PROGRAM.replace("counter * 3", "counter * 5");
    let other = build_msvc(
        other_dir.path(),
        "t",
        &[("t.c", &changed, "clang", C_FLAGS)],
    );
    assert_ne!(pdb_store_id(&prog.pdb), pdb_store_id(&other.pdb));
    let work = prog.rva(|n| n == "work");

    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::default());
    assert_eq!(
        names(&name(&mut symbolizer, &prog.exe, &[work])[0]),
        ["work"]
    );

    // The other build's PDB, where this image's was, and next to it.
    std::fs::copy(&other.pdb, &prog.pdb).unwrap();
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::default());
    assert_eq!(name(&mut symbolizer, &prog.exe, &[work]), [vec![]]);
    let codeview = stackscope_symbols::pe::codeview(&prog.exe).unwrap();
    assert!(!stackscope_symbols::pe::pdb::matches(&prog.pdb, &codeview));
    // Its function starts are all that is left to name its code by.
    assert_eq!(symbolizer.function_starts(&prog.exe, &[work + 3]), [work]);
}

#[test]
fn pdbs_are_found_next_to_the_image_and_in_symbol_stores() {
    let (dir, prog, id) = build_c_apart();
    let work = prog.rva(|n| n == "work");

    // Moved with its image: not at the recorded path any more, next to the image.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let exe = bin.join("t.exe");
    std::fs::rename(&prog.exe, &exe).unwrap();
    std::fs::rename(&prog.pdb, bin.join("t.pdb")).unwrap();
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::default());
    assert_eq!(names(&name(&mut symbolizer, &exe, &[work])[0]), ["work"]);

    // In a symbol store's layout, which only the symbol path leads to.
    let store = dir.path().join("store");
    let in_store = store.join("t.pdb").join(&id);
    std::fs::create_dir_all(&in_store).unwrap();
    std::fs::rename(bin.join("t.pdb"), in_store.join("t.pdb")).unwrap();
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::default());
    assert_eq!(name(&mut symbolizer, &exe, &[work]), [vec![]]);
    let srv = format!("srv*{}*https://symbols.example.invalid", store.display());
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::parse(&srv));
    assert_eq!(names(&name(&mut symbolizer, &exe, &[work])[0]), ["work"]);

    // A plain directory of the symbol path, by name.
    let flat = dir.path().join("flat");
    std::fs::create_dir(&flat).unwrap();
    std::fs::rename(in_store.join("t.pdb"), flat.join("t.pdb")).unwrap();
    let plain = format!(
        "{};{}",
        dir.path().join("nothing").display(),
        flat.display()
    );
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::parse(&plain));
    assert_eq!(names(&name(&mut symbolizer, &exe, &[work])[0]), ["work"]);
}

const MINGW_PROGRAM: &str = r#"
#include <stdio.h>
static volatile int counter;
__attribute__((noinline)) static int helper(int x) { counter += x; return counter * 3; }
__attribute__((noinline)) int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += helper(i);
    return s;
}
int main(void) { printf("%d\n", work(10)); return 0; }
"#;

#[test]
fn dwarf_inside_a_mingw_build_names_functions_and_lines() {
    require("x86_64-w64-mingw32-gcc", "gcc-mingw-w64-x86-64");
    let dir = TempDir::new().unwrap();
    let src = dir.path().join("m.c");
    std::fs::write(&src, MINGW_PROGRAM).unwrap();
    let exe = dir.path().join("m.exe");
    stackscope_testkit::run(
        Command::new("x86_64-w64-mingw32-gcc")
            .args(["-g", "-O1", "-o"])
            .arg(&exe)
            .arg(&src),
    );
    let data = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let base = file.relative_address_base();
    let rva = |wanted: &str| {
        file.symbols()
            .find(|s| s.name() == Ok(wanted))
            .map(|s| s.address() - base)
            .unwrap_or_else(|| panic!("no symbol {wanted}"))
    };
    let (work, helper) = (rva("work"), rva("helper"));
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::default());
    let named = name(&mut symbolizer, &exe, &[work, helper]);
    assert_eq!(names(&named[0]), ["work"], "{named:?}");
    assert_eq!(
        named[0][0].line,
        Some(line_of(MINGW_PROGRAM, "int work(int n)"))
    );
    assert!(named[0][0].file.as_deref().unwrap().ends_with("m.c"));
    assert_eq!(names(&named[1]), ["helper"], "{named:?}");
    assert_eq!(
        named[1][0].line,
        Some(line_of(MINGW_PROGRAM, "static int helper("))
    );
}

/// A symbol server on this machine: answers `GET /PATH` with `root/PATH`, 404 when there is
/// none, and tells each path asked.
fn symbol_server(root: std::path::PathBuf) -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (asked, paths) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            reader.read_line(&mut request).unwrap();
            // The rest of the request's head.
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 2 {
                line.clear();
            }
            let path = request.split(' ').nth(1).unwrap_or("/").to_string();
            let body = std::fs::read(root.join(path.trim_start_matches('/')));
            let _ = asked.send(path);
            let _ = match body {
                Ok(body) => {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    stream
                        .write_all(head.as_bytes())
                        .and_then(|()| stream.write_all(&body))
                }
                Err(_) => stream.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                ),
            };
        }
    });
    (url, paths)
}

/// With the `symbol-server` feature, a PDB no local place has is downloaded from the server
/// of a `srv*` entry into its store, and one of another build is not kept; without it, no
/// server is asked.
#[test]
fn symbol_servers_are_asked_only_with_the_feature() {
    let (dir, prog, id) = build_c_apart();
    let work = prog.rva(|n| n == "work");
    let other_dir = TempDir::new().unwrap();
    let other = build_c(other_dir.path());
    // The server holds, where this image's PDB would be, first another build's PDB, then
    // its own; the image stands alone.
    let served = dir.path().join("served");
    let at = served.join("t.pdb").join(&id);
    std::fs::create_dir_all(&at).unwrap();
    std::fs::rename(&other.pdb, at.join("t.pdb")).unwrap();
    let held = dir.path().join("held.pdb");
    std::fs::rename(&prog.pdb, &held).unwrap();
    let (url, asked) = symbol_server(served);
    let store = dir.path().join("store");
    let srv = format!("srv*{}*{url}", store.display());
    let kept = store.join("t.pdb").join(&id).join("t.pdb");

    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::parse(&srv));
    assert_eq!(name(&mut symbolizer, &prog.exe, &[work]), [vec![]]);
    assert!(!kept.exists(), "a PDB of another build is not kept");
    let first = asked.try_recv();

    std::fs::rename(&held, at.join("t.pdb")).unwrap();
    let mut symbolizer = Symbolizer::new().with_symbol_path(SymbolPath::parse(&srv));
    let named = name(&mut symbolizer, &prog.exe, &[work]);
    if cfg!(feature = "symbol-server") {
        assert_eq!(first.unwrap(), format!("/t.pdb/{id}/t.pdb"));
        assert_eq!(names(&named[0]), ["work"]);
        assert_eq!(asked.try_recv().unwrap(), format!("/t.pdb/{id}/t.pdb"));
        assert!(kept.is_file(), "the download is kept in the store");
    } else {
        assert!(first.is_err(), "a server was asked");
        assert_eq!(named, [vec![]]);
        assert!(asked.try_recv().is_err(), "a server was asked");
        assert!(!kept.exists());
    }
}
