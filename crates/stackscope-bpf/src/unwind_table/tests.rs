//! Checks tables built from real binaries (gcc programs with and without frame pointers, the
//! system's libc) row by row against `readelf --debug-dump=frames-interp`, and the per-process
//! assembly against the addresses of a running program.

use std::path::{Path, PathBuf};
use std::process::Command;

use stackscope_testkit::Running;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use stackscope_testkit::compile;

use super::*;
use stackscope_process::maps::read_proc_maps;

const PROGRAM_C: &str = r#"
#include <stdio.h>
#include <unistd.h>
volatile unsigned long spins;
__attribute__((noipa)) int leaf(int x) {
    char buf[64];
    snprintf(buf, sizeof buf, "%d", x);
    for (int i = 0; i < 1000; i++) spins += buf[i & 7];
    return x + 1;
}
__attribute__((noipa)) int middle(int x) { return leaf(x * 3) + 2; }
int main(int argc, char **argv) {
    (void)argv;
    puts("ready");
    fflush(stdout);
    for (;;) middle(argc);
}
"#;

fn gcc(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    compile(
        "gcc",
        dir,
        (&format!("{name}.c"), PROGRAM_C),
        args,
        &[],
        name,
    )
}

/// The libc this test process runs with.
fn libc_path() -> PathBuf {
    let maps = read_proc_maps(std::process::id()).unwrap();
    let m = maps
        .iter()
        .find(|m| m.path.contains("/libc.so") || m.path.contains("/libc-"))
        .expect("libc is mapped");
    PathBuf::from(&*m.path)
}

/// One `.eh_frame` or `.debug_frame` FDE as readelf interprets it.
pub(super) struct ReadelfFde {
    pub start: u64,
    pub end: u64,
    /// (address, CFA column, frame pointer column, ra column)
    pub rows: Vec<(u64, String, Option<String>, String)>,
}

/// The FDEs of `path`, with the column of the frame pointer named `fp` (`rbp`, `x29`).
pub(super) fn readelf_fdes(path: &Path, fp: &str) -> Vec<ReadelfFde> {
    let out = Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(path)
        .output()
        .expect("readelf runs (binutils)");
    // readelf exits 1 when it also follows a debug link to a file with NOBITS sections; the
    // dump of the file itself is complete all the same.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Contents of the .eh_frame section"),
        "readelf shows no .eh_frame for {}",
        path.display()
    );
    let mut fdes = Vec::new();
    let mut columns: Vec<String> = Vec::new();
    let mut in_cfi = false;
    for line in text.lines() {
        if line.starts_with("Contents of the ") {
            in_cfi = line.starts_with("Contents of the .eh_frame section")
                || line.starts_with("Contents of the .debug_frame section");
            continue;
        }
        if !in_cfi {
            continue;
        }
        // A register rule reads `r10 (r10)`: one column, two words.
        let mut words: Vec<&str> = Vec::new();
        for w in line.split_whitespace() {
            if w.starts_with('(') && !words.is_empty() {
                continue;
            }
            words.push(w);
        }
        if words.get(3) == Some(&"FDE") {
            let range = words
                .iter()
                .find_map(|w| w.strip_prefix("pc="))
                .expect("FDE line has pc=");
            let (s, e) = range.split_once("..").unwrap();
            fdes.push(ReadelfFde {
                start: u64::from_str_radix(s, 16).unwrap(),
                end: u64::from_str_radix(e, 16).unwrap(),
                rows: Vec::new(),
            });
            columns.clear();
        } else if words.get(3) == Some(&"CIE") || words.get(1) == Some(&"ZERO") {
            fdes.push(ReadelfFde {
                start: 0,
                end: 0,
                rows: Vec::new(),
            });
            columns.clear();
        } else if words.first() == Some(&"LOC") {
            columns = words.iter().map(|w| w.to_string()).collect();
        } else if !words.is_empty() && !columns.is_empty() {
            let Ok(addr) = u64::from_str_radix(words[0], 16) else {
                continue;
            };
            let col = |name: &str| {
                let i = columns.iter().position(|c| c == name)?;
                words.get(i).map(|w| w.to_string())
            };
            let fde = fdes.last_mut().unwrap();
            fde.rows.push((
                addr,
                col("CFA").unwrap(),
                col(fp),
                col("ra").unwrap_or_else(|| "none".into()),
            ));
        }
    }
    fdes.retain(|f| f.end > f.start);
    fdes
}

/// The rule readelf's columns mean, in our model.
fn expected_rule(cfa: &str, rbp: Option<&str>, ra: &str) -> Option<Rule> {
    if ra == "u" {
        return Some(Rule::Stop);
    }
    if ra != "c-8" {
        return Some(Rule::Unsupported);
    }
    let rbp_offset = match rbp {
        None | Some("u") | Some("s") => None,
        Some(c) => match c.strip_prefix('c').and_then(|n| n.parse::<i16>().ok()) {
            Some(n) if n % 8 == 0 => Some(n),
            _ => return Some(Rule::Unsupported),
        },
    };
    let (base, offset) = if let Some(n) = cfa.strip_prefix("rsp+") {
        (CfaBase::Sp, n)
    } else if let Some(n) = cfa.strip_prefix("rbp+") {
        (CfaBase::Fp, n)
    } else if cfa == "exp" {
        // A PLT expression or something unsupported: told apart by the caller.
        return None;
    } else {
        return Some(Rule::Unsupported);
    };
    Some(Rule::Cfa {
        base,
        offset: offset.parse().ok()?,
        fp_offset: rbp_offset.map(i32::from),
        ra_offset: Some(-8),
    })
}

/// Every row readelf prints must look up to the same rule in our table; every FDE end not
/// covered by another FDE must look up to `End`. Returns how many `exp` CFA rows were PLT rows.
fn assert_agrees_with_readelf(path: &Path, table: &UnwindTable) -> usize {
    let fdes = readelf_fdes(path, "rbp");
    assert!(
        !fdes.is_empty(),
        "readelf shows no FDE in {}",
        path.display()
    );
    let mut checked = 0;
    let mut plt_rows = 0;
    for fde in &fdes {
        for (i, (addr, cfa, rbp, ra)) in fde.rows.iter().enumerate() {
            let got = table
                .lookup(*addr)
                .unwrap_or_else(|| panic!("no row for {addr:#x} in {}", path.display()))
                .rule();
            match expected_rule(cfa, rbp.as_deref(), ra) {
                // The signal trampoline's rules are all expressions.
                _ if got == Rule::Signal && cfa == "exp" && ra == "exp" => {}
                Some(want) => assert_eq!(
                    got,
                    want,
                    "{} at {addr:#x}: readelf says CFA={cfa} rbp={rbp:?} ra={ra}",
                    path.display()
                ),
                None => {
                    assert!(
                        matches!(
                            got,
                            Rule::Plt { .. } | Rule::CfaDeref { .. } | Rule::Unsupported
                        ),
                        "{} at {addr:#x}: expression CFA read as {got:?}",
                        path.display()
                    );
                    plt_rows += usize::from(matches!(got, Rule::Plt { .. }));
                }
            }
            // The row also holds up to its end (next row or FDE end).
            let last = fde.rows.get(i + 1).map_or(fde.end, |r| r.0) - 1;
            assert_eq!(
                table.lookup(last).map(Row::rule),
                Some(got),
                "{} {last:#x} row {addr:#x} fde {:#x}..{:#x}",
                path.display(),
                fde.start,
                fde.end
            );
            checked += 1;
        }
    }
    let mut ranges: Vec<(u64, u64)> = fdes.iter().map(|f| (f.start, f.end)).collect();
    ranges.sort_unstable();
    for &(_, end) in &ranges {
        let covered = ranges.iter().any(|&(s, e)| s <= end && end < e);
        if !covered {
            assert_eq!(
                table.lookup(end).map(|r| r.kind),
                Some(RowKind::End),
                "{}: gap after FDE ending at {end:#x}",
                path.display()
            );
        }
    }
    assert!(checked > 0);
    plt_rows
}

fn assert_well_formed(table: &UnwindTable) {
    let rows = table.rows();
    assert!(!rows.is_empty());
    for w in rows.windows(2) {
        assert!(w[0].addr < w[1].addr, "rows not sorted: {w:?}");
        assert!(!w[0].same_rule(&w[1]), "redundant row: {w:?}");
    }
    assert_eq!(rows.last().unwrap().kind, RowKind::End);
}

/// Address of a symbol in an ELF file.
fn symbol(path: &Path, name: &str) -> u64 {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no {name} in {}", path.display()))
        .address()
}

fn section_address(path: &Path, name: &str) -> Option<u64> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.section_by_name(name).map(|s| s.address())
}

/// What a build without frame pointers gives: leaf's CFA is rsp-based on entry, and _start says
/// the return address is undefined, the end of every stack.
fn assert_leaf_on_rsp_and_start_stops(exe: &Path, table: &UnwindTable) {
    assert_eq!(
        table.lookup(symbol(exe, "leaf")).unwrap().rule(),
        Rule::Cfa {
            base: CfaBase::Sp,
            offset: 8,
            fp_offset: None,
            ra_offset: Some(-8)
        },
        "leaf's rule on entry"
    );
    assert_eq!(
        table.lookup(symbol(exe, "_start")).unwrap().kind,
        RowKind::Stop,
        "_start's row"
    );
}

#[test]
fn table_without_frame_pointers_agrees_with_readelf() {
    let dir = tempfile::tempdir().unwrap();
    let exe = gcc(dir.path(), "nofp", &["-O2", "-g", "-fomit-frame-pointer"]);
    let table = UnwindTable::from_path(&exe).unwrap();
    assert_well_formed(&table);
    let plt_rows = assert_agrees_with_readelf(&exe, &table);
    assert!(plt_rows > 0, "the PLT expression was not recognised");
    assert_leaf_on_rsp_and_start_stops(&exe, &table);
    // No frame pointer: rbp is never a CFA base.
    assert!(!table.rows().iter().any(|r| r.kind == RowKind::CfaRbp));
    // The PLT's lazy-binding stubs (after the 16-byte PLT0) use the standard expression.
    let plt = section_address(&exe, ".plt").expect("a .plt section");
    assert_eq!(
        table.lookup(plt + 16).unwrap().rule(),
        Rule::Plt {
            offset: 8,
            threshold: 11
        }
    );
}

#[test]
fn table_with_frame_pointers_agrees_with_readelf() {
    let dir = tempfile::tempdir().unwrap();
    let exe = gcc(dir.path(), "fp", &["-O1", "-fno-omit-frame-pointer"]);
    let table = UnwindTable::from_path(&exe).unwrap();
    assert_well_formed(&table);
    assert_agrees_with_readelf(&exe, &table);
    // After `push rbp; mov rbp, rsp`, leaf's CFA is rbp+16 with rbp saved at CFA-16.
    let leaf = symbol(&exe, "leaf");
    let body = table
        .rows()
        .iter()
        .find(|r| u64::from(r.addr) > leaf && r.kind == RowKind::CfaRbp)
        .expect("an rbp-based row in leaf");
    assert_eq!(
        body.rule(),
        Rule::Cfa {
            base: CfaBase::Fp,
            offset: 16,
            fp_offset: Some(-16),
            ra_offset: Some(-8)
        }
    );
}

/// Functions whose frames are larger than 16 bits of offset, as rustc's that hold its whole
/// context (530 KiB), saving callee-saved registers rbp among them.
const BIG_FRAMES_C: &str = r#"
#include <string.h>
volatile unsigned long sink;
__attribute__((noipa)) unsigned long big(unsigned long n) {
    volatile char buf[600000];
    memset((char *)buf, (int)n, sizeof buf);
    unsigned long a = n, b = n * 3, c = n * 5, d = n * 7, e = n * 11, f = n * 13;
    for (unsigned long i = 0; i < n; i++) { a += buf[i % sizeof buf] * b; b ^= c + i; c += d * e; d -= f; e ^= a; f += b; }
    return a + b + c + d + e + f;
}
int main(int argc, char **argv) { (void)argv; sink = big((unsigned long)argc * 1000); return 0; }
"#;

#[test]
fn frames_over_32_kib_have_exact_rules() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(
        "gcc",
        dir.path(),
        ("big.c", BIG_FRAMES_C),
        &["-O2", "-fomit-frame-pointer", "-fno-stack-clash-protection"],
        &[],
        "big",
    );
    let table = UnwindTable::from_path(&exe).unwrap();
    assert_well_formed(&table);
    assert_agrees_with_readelf(&exe, &table);
    let large: Vec<Rule> = table
        .rows()
        .iter()
        .filter(|r| r.kind == RowKind::CfaRspLarge)
        .map(Row::rule)
        .collect();
    assert!(
        large
            .iter()
            .any(|r| matches!(r, Rule::Cfa { offset, .. } if *offset > 1 << 19)),
        "no rule for big's 600000-byte frame: {large:?}"
    );
}

#[test]
fn table_from_debug_frame_agrees_with_readelf() {
    let dir = tempfile::tempdir().unwrap();
    // Without asynchronous unwind tables gcc puts the program's CFI in .debug_frame; the C
    // runtime's stays in .eh_frame.
    let exe = gcc(
        dir.path(),
        "debug_frame",
        &[
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
        ],
    );
    assert!(section_address(&exe, ".debug_frame").is_some());
    let table = UnwindTable::from_path(&exe).unwrap();
    assert_well_formed(&table);
    assert_agrees_with_readelf(&exe, &table);
    assert!(table.stats().debug_frame_fdes >= 3, "{:?}", table.stats());
    assert_leaf_on_rsp_and_start_stops(&exe, &table);
}

#[test]
fn rust_release_table_agrees_with_readelf() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(
        "rustc",
        dir.path(),
        (
            "prog.rs",
            "fn main() { let v: Vec<u64> = (0..100).collect(); println!(\"{}\", v.iter().sum::<u64>()); }",
        ),
        &["-O"],
        &[],
        "prog",
    );
    let table = UnwindTable::from_path(&exe).unwrap();
    assert_well_formed(&table);
    assert_agrees_with_readelf(&exe, &table);
    assert!(table.stats().fdes > 100, "{:?}", table.stats());
}

#[test]
fn openssl_realigned_frames_are_deref_rows() {
    let Some(libcrypto) = [
        "/usr/lib/x86_64-linux-gnu/libcrypto.so.3",
        "/usr/lib64/libcrypto.so.3",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists()) else {
        panic!("libcrypto.so.3 not found: install libssl3 (scripts/install-deps.sh)");
    };
    let table = UnwindTable::from_path(libcrypto).unwrap();
    assert_well_formed(&table);
    assert_agrees_with_readelf(libcrypto, &table);
    // readelf prints these as "exp": check their offsets against the raw CFI dump.
    let out = Command::new("readelf")
        .arg("--debug-dump=frames")
        .arg(libcrypto)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut offsets: Vec<i16> = text
        .lines()
        .filter_map(|l| {
            let n = l
                .split("DW_CFA_def_cfa_expression (DW_OP_breg7 (rsp): ")
                .nth(1)?
                .strip_suffix("; DW_OP_deref; DW_OP_plus_uconst: 8)")?;
            n.parse().ok()
        })
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert!(
        !offsets.is_empty(),
        "no realigned frames in {}",
        libcrypto.display()
    );
    let mut ours: Vec<i16> = table
        .rows()
        .iter()
        .filter_map(|r| match r.rule() {
            Rule::CfaDeref { offset, .. } => Some(offset),
            _ => None,
        })
        .collect();
    ours.sort_unstable();
    ours.dedup();
    assert_eq!(ours, offsets);
}

#[test]
fn libc_table_agrees_with_readelf() {
    let libc = libc_path();
    let table = UnwindTable::from_path(&libc).unwrap();
    assert_well_formed(&table);
    assert_agrees_with_readelf(&libc, &table);
    let stats = table.stats();
    eprintln!(
        "{}: {} rows, {} bytes, {stats:?}",
        libc.display(),
        table.rows().len(),
        table.size_bytes()
    );
    assert_eq!(stats.debug_frame_fdes, 0);
    assert!(stats.fdes > 1000, "{stats:?}");
    // __restore_rt, where signal handlers return to.
    assert!(table.rows().iter().any(|r| r.kind == RowKind::Signal));
    // Hand-written assembly (signal return, vfork) is rare; a few rows, not hundreds.
    assert!(stats.unsupported_rows < 100, "{stats:?}");
}

/// Load bias of `path` in `pid`, computed from the lowest mapping and the first PT_LOAD,
/// independently of how the cache does it.
fn bias_of(pid: u32, path: &Path) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let lowest = maps
        .lines()
        .filter(|l| l.ends_with(path.to_str().unwrap()))
        .filter_map(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
        .min()
        .unwrap();
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let first = file.segments().map(|s| s.address()).min().unwrap();
    lowest - (first & !0xfff)
}

#[test]
fn process_tables_place_each_file_and_share_tables() {
    let dir = tempfile::tempdir().unwrap();
    let exe = gcc(dir.path(), "proc", &["-O2", "-fomit-frame-pointer"]);
    let a = Running::ready(&mut Command::new(&exe));
    let b = Running::ready(&mut Command::new(&exe));
    let mut cache = TableCache::new();
    let pa = cache.process(a.0.id(), &read_proc_maps(a.0.id()).unwrap());
    let pb = cache.process(b.0.id(), &read_proc_maps(b.0.id()).unwrap());

    let exe_str = exe.to_str().unwrap();
    let find = |p: &ProcessTables, path: &str| {
        p.mappings
            .iter()
            .find(|m| &*m.path == path)
            .unwrap_or_else(|| panic!("{path} not in {:?}", p.mappings))
            .clone()
    };
    let ma = find(&pa, exe_str);
    let mb = find(&pb, exe_str);
    let (ida, ta) = ma.table.clone().expect("the executable has a table");
    assert_eq!(ida, mb.table.as_ref().unwrap().0, "one table per file");
    assert!(std::sync::Arc::ptr_eq(&ta, &mb.table.unwrap().1));
    assert_eq!(ma.bias, bias_of(a.0.id(), &exe));

    // leaf's runtime address maps back to leaf's row.
    let leaf = symbol(&exe, "leaf");
    let runtime = bias_of(a.0.id(), &exe) + leaf;
    assert!(ma.start <= runtime && runtime < ma.end);
    assert_eq!(
        ta.lookup(runtime.wrapping_sub(ma.bias)),
        ta.lookup(leaf),
        "bias"
    );

    let libc = libc_path();
    let ml = find(&pa, libc.to_str().unwrap());
    assert!(ml.table.is_some());
    assert_eq!(ml.bias, bias_of(a.0.id(), &libc));
    let vdso = find(&pa, "[vdso]");
    let (vdso_id, vt) = vdso.table.expect("the vDSO has a table");
    assert!(!vt.rows().is_empty());
    assert_eq!(find(&pb, "[vdso]").table.unwrap().0, vdso_id);
}
