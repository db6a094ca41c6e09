//! Windows test programs built on Linux: PE images with a PDB (clang for the MSVC target,
//! linked by the Rust toolchain's lld without any Windows SDK) or with DWARF inside (mingw's
//! gcc), and the linker map and PDB summary that say where their functions are.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSection};

use crate::run;

/// A linked PE image and its PDB.
#[derive(Debug, Clone)]
pub struct PdbProgram {
    pub exe: PathBuf,
    pub pdb: PathBuf,
    /// Each symbol of the linker map (decorated as linked) and its RVA.
    pub symbols: HashMap<String, u64>,
}

impl PdbProgram {
    /// The RVA where the function at `start` ends: the next map symbol's.
    pub fn end_of(&self, start: u64) -> u64 {
        self.symbols
            .values()
            .copied()
            .filter(|&rva| rva > start)
            .min()
            .expect("no symbol after it in the map")
    }

    /// The RVA of the one map symbol `pred` picks.
    pub fn rva(&self, pred: impl Fn(&str) -> bool) -> u64 {
        let found: Vec<(&String, &u64)> = self.symbols.iter().filter(|(n, _)| pred(n)).collect();
        assert_eq!(
            found.len(),
            1,
            "expected one such symbol, map has {found:?}"
        );
        *found[0].1
    }
}

/// The RVAs of the `call rel32` instructions in the function at `function` whose target is
/// `callee`: each one's address is in the code that calls `callee`, inlined or not.
pub fn calls_to(prog: &PdbProgram, function: u64, callee: u64) -> Vec<u64> {
    let end = prog.end_of(function);
    let data = std::fs::read(&prog.exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let base = file.relative_address_base();
    let text = file
        .sections()
        .find(|s| s.address() <= base + function && base + function < s.address() + s.size())
        .expect("the function is in no section");
    let end = end.min(text.address() + text.size() - base);
    let at = (base + function - text.address()) as usize;
    let bytes = &text.data().unwrap()[at..at + (end - function) as usize];
    (0..bytes.len().saturating_sub(4))
        .filter(|&i| bytes[i] == 0xe8)
        .filter(|&i| {
            let rel = i32::from_le_bytes(bytes[i + 1..i + 5].try_into().unwrap());
            let next = function + i as u64 + 5;
            next.checked_add_signed(i64::from(rel)) == Some(callee)
        })
        .map(|i| function + i as u64)
        .collect()
}

/// Panics naming the apt package to install when `tool` cannot be run.
pub fn require(tool: &str, package: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{tool} is needed to build the Windows test programs: install the apt package \
         {package} (scripts/install-deps.sh test installs it)"
    );
}

/// The Rust toolchain's lld, which links PE images as `link.exe` does.
pub fn rust_lld() -> PathBuf {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("cannot run rustc --print sysroot");
    let sysroot = String::from_utf8(out.stdout).unwrap();
    let host = rustc_host();
    let lld = Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(host)
        .join("bin/rust-lld");
    assert!(
        lld.is_file(),
        "{} is missing: the Rust toolchain ships rust-lld (rustup component add rust-src \
         does not; reinstall the toolchain with its default profile)",
        lld.display()
    );
    lld
}

fn rustc_host() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("cannot run rustc -vV");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names no host")
}

/// Compiles each of `sources` (name, text, compiler, flags) for x86_64-pc-windows-msvc in
/// `dir` and links them into `dir/NAME.exe` with its PDB at `dir/NAME.pdb`, with no C runtime:
/// the program's entry point is its `mainCRTStartup`.
pub fn build_msvc(dir: &Path, name: &str, sources: &[(&str, &str, &str, &[&str])]) -> PdbProgram {
    require("clang", "clang");
    let mut objects = Vec::new();
    for (src_name, text, compiler, flags) in sources {
        let src = dir.join(src_name);
        std::fs::write(&src, text).unwrap();
        let obj = dir.join(format!("{src_name}.obj"));
        run(Command::new(compiler)
            .arg("--target=x86_64-pc-windows-msvc")
            .args(*flags)
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj));
        objects.push(obj);
    }
    let exe = dir.join(format!("{name}.exe"));
    let pdb = dir.join(format!("{name}.pdb"));
    let map = dir.join(format!("{name}.map"));
    let arg = |flag: &str, path: &Path| format!("{flag}:{}", path.display());
    run(Command::new(rust_lld())
        .args(["-flavor", "link", "/nodefaultlib", "/entry:mainCRTStartup"])
        .args(["/subsystem:console", "/debug"])
        .arg(arg("/pdb", &pdb))
        .arg(arg("/map", &map))
        .arg(arg("/out", &exe))
        .args(&objects));
    let symbols = map_symbols(&std::fs::read_to_string(&map).unwrap());
    PdbProgram { exe, pdb, symbols }
}

/// Compiles the `#![no_std]` Rust program `source` (entry point `mainCRTStartup`) for
/// x86_64-pc-windows-msvc with `flags`, linked by rust-lld, into `dir/NAME.exe` and the PDB
/// rustc has the linker write beside it.
pub fn build_msvc_rust(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PdbProgram {
    let src = dir.join(format!("{name}.rs"));
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(format!("{name}.exe"));
    let map = dir.join(format!("{name}.map"));
    let lld = format!("linker={}", rust_lld().display());
    let mut cmd = Command::new("rustc");
    cmd.args(["--edition", "2021", "--crate-name", name])
        .args([
            "--target",
            "x86_64-pc-windows-msvc",
            "-C",
            "panic=abort",
            "-C",
            &lld,
        ])
        .args(flags);
    for arg in [
        "/nodefaultlib",
        "/entry:mainCRTStartup",
        "/subsystem:console",
    ] {
        cmd.arg("-C").arg(format!("link-arg={arg}"));
    }
    cmd.arg("-C")
        .arg(format!("link-arg=/map:{}", map.display()))
        .arg("-o")
        .arg(&exe)
        .arg(&src);
    let out = cmd.output().expect("cannot run rustc");
    assert!(
        out.status.success(),
        "{cmd:?} failed (is the target installed? rustup target add x86_64-pc-windows-msvc): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let symbols = map_symbols(&std::fs::read_to_string(&map).unwrap());
    PdbProgram {
        pdb: exe.with_extension("pdb"),
        exe,
        symbols,
    }
}

/// The symbols of an lld map file and their RVAs: lines `SECTION:OFFSET NAME RVA+BASE OBJ`
/// after its `Preferred load address is BASE` line.
fn map_symbols(map: &str) -> HashMap<String, u64> {
    let base = map
        .lines()
        .find_map(|l| l.trim().strip_prefix("Preferred load address is "))
        .and_then(|b| u64::from_str_radix(b.trim(), 16).ok())
        .expect("map states no load address");
    map.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [place, name, address, _object] = fields[..] else {
                return None;
            };
            place.split_once(':')?;
            let address = u64::from_str_radix(address, 16).ok()?;
            Some((name.to_string(), address.checked_sub(base)?))
        })
        .collect()
}

/// The GUID and age of a PDB, as llvm-pdbutil (not stackscope) reads them: the directory
/// name a symbol store keeps it under (GUID as 32 hex digits, then the age in hex).
pub fn pdb_store_id(pdb: &Path) -> String {
    require("llvm-pdbutil", "llvm");
    let out = Command::new("llvm-pdbutil")
        .args(["dump", "--summary"])
        .arg(pdb)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("llvm-pdbutil printed no {key}:\n{text}"))
    };
    let guid: String = field("GUID:")
        .chars()
        .filter(char::is_ascii_hexdigit)
        .collect::<String>()
        .to_uppercase();
    let age: u32 = field("Age:").parse().unwrap();
    format!("{guid}{age:X}")
}
