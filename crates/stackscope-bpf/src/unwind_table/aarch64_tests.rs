//! Checks aarch64 tables (programs cross-built by Debian's aarch64 gcc, plain and signing
//! their return addresses, and the arm64 libc it links against) row by row against
//! `readelf --debug-dump=frames-interp`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::tests::readelf_fdes;
use super::*;

const PROGRAM_C: &str = r#"
#include <stdio.h>
volatile unsigned long spins;
__attribute__((noipa)) int leaf(int x) { for (int i = 0; i < 1000; i++) spins += i; return x + 1; }
__attribute__((noipa)) int middle(int x) {
    char buf[64];
    snprintf(buf, sizeof buf, "%d", x);
    return leaf(buf[0]) + 2;
}
__attribute__((noipa)) int big(int x) {
    char buf[5000];
    snprintf(buf, sizeof buf, "%d", x);
    return middle(buf[1]) + 2;
}
int main(int argc, char **argv) { (void)argv; return big(argc); }
"#;

/// The arm64 libc of Debian's cross toolchain.
const CROSS_LIBC: &str = "/usr/aarch64-linux-gnu/lib/libc.so.6";

fn cross_gcc(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let source = dir.join(format!("{name}.c"));
    std::fs::write(&source, PROGRAM_C).unwrap();
    let exe = dir.join(name);
    let status = Command::new("aarch64-linux-gnu-gcc")
        .args(args)
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .status()
        .expect("aarch64-linux-gnu-gcc runs (apt gcc-aarch64-linux-gnu: scripts/install-deps.sh)");
    assert!(status.success(), "aarch64-linux-gnu-gcc {args:?} failed");
    exe
}

/// A saved register's offset from the CFA (`c-24`); `Err` for any other rule.
fn slot(rule: Option<&str>) -> Result<Option<i32>, ()> {
    match rule {
        None | Some("u") | Some("s") | Some("none") => Ok(None),
        Some(r) => r
            .strip_prefix('c')
            .and_then(|n| n.parse().ok())
            .map(Some)
            .ok_or(()),
    }
}

/// The rule readelf's columns mean in our model; `None` for one outside it. readelf shows a
/// register no rule has touched yet as `u`, as it shows an undefined one, so an `u` return
/// address is the outermost frame or still in x30 (`_start`'s is checked apart).
fn expected_rules(cfa: &str, x29: Option<&str>, ra: &str) -> Option<[Rule; 2]> {
    let (base, offset) = match cfa.split_once('+') {
        Some(("sp", n)) => (CfaBase::Sp, n.parse().ok()?),
        Some(("x29", n)) => (CfaBase::Fp, n.parse().ok()?),
        _ => return None,
    };
    let (ra_offset, fp_offset) = (slot(Some(ra)).ok()?, slot(x29).ok()?);
    if fp_offset.is_some() && fp_offset.map(|f| f + 8) != ra_offset {
        return None;
    }
    let rule = Rule::Cfa {
        base,
        offset,
        fp_offset,
        ra_offset,
    };
    Some([rule, if ra == "u" { Rule::Stop } else { rule }])
}

/// Every row readelf prints looks up to its rule, or to `Unsupported` where the rule is
/// outside the model or too far from the CFA; every FDE end no other FDE covers is `End`.
/// Returns the rows checked and how many of them were unsupported.
fn assert_agrees_with_readelf(path: &Path, table: &UnwindTable) -> (usize, usize) {
    let fdes = readelf_fdes(path, "x29");
    let (mut checked, mut unsupported) = (0, 0);
    for fde in &fdes {
        for (addr, cfa, x29, ra) in &fde.rows {
            let got = table
                .lookup(*addr)
                .unwrap_or_else(|| panic!("no row for {addr:#x} in {}", path.display()))
                .rule();
            let want = expected_rules(cfa, x29.as_deref(), ra);
            let context = format!(
                "{} at {addr:#x}: CFA={cfa} x29={x29:?} ra={ra}",
                path.display()
            );
            checked += 1;
            if got == Rule::Unsupported {
                // Only what 16 bits of CFA offset and 8 bits of words cannot reach, what
                // no model holds, or a CIE naming another return address column (glibc
                // has one, of column 15), which readelf shows no column for.
                let far = |o: Option<i32>| o.is_some_and(|o| o < -1024);
                assert!(
                    ra == "none"
                        || match want {
                            Some(
                                [Rule::Cfa {
                                    offset,
                                    ra_offset,
                                    fp_offset,
                                    ..
                                }, _],
                            ) => {
                                i16::try_from(offset).is_err() || far(ra_offset) || far(fp_offset)
                            }
                            _ => want.is_none(),
                        },
                    "{context}: read as unsupported"
                );
                unsupported += 1;
            } else {
                assert!(
                    want.is_some_and(|w| w.contains(&got)),
                    "{context}: read as {got:?}, expected one of {want:?}"
                );
            }
        }
    }
    for fde in &fdes {
        let end = fde.end;
        if !fdes.iter().any(|f| f.start <= end && end < f.end) {
            assert_eq!(
                table.lookup(end).map(|r| r.kind),
                Some(RowKind::End),
                "{}: the FDE ending at {end:#x} runs on",
                path.display()
            );
        }
    }
    assert!(checked > 0, "readelf shows no rows in {}", path.display());
    (checked, unsupported)
}

/// The address range of a function of an ELF file.
fn function(path: &Path, name: &str) -> std::ops::Range<u64> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no {name} in {}", path.display()));
    sym.address()..sym.address() + sym.size()
}

/// The rules a program's own functions must have, built either way.
fn assert_program_rules(exe: &Path, table: &UnwindTable) {
    assert_eq!(table.arch(), Arch::Aarch64);
    let at = |name: &str, delta: u64| {
        let start = function(exe, name).start;
        table.lookup(start + delta).unwrap().rule()
    };
    // On entry every function's return address is still in x30.
    for name in ["leaf", "middle", "big"] {
        assert_eq!(
            at(name, 0),
            Rule::Cfa {
                base: CfaBase::Sp,
                offset: 0,
                fp_offset: None,
                ra_offset: None
            },
            "{name} on entry"
        );
    }
    assert_eq!(
        table
            .lookup(function(exe, "_start").start + 4)
            .unwrap()
            .kind,
        RowKind::Stop,
        "_start's return address is undefined"
    );
    // big's frame of 5 KiB keeps x30 at its bottom, reached from sp.
    let big_rows: Vec<Row> = table
        .rows()
        .iter()
        .filter(|r| function(exe, "big").contains(&u64::from(r.addr)))
        .copied()
        .collect();
    assert!(
        big_rows
            .iter()
            .any(|r| matches!(r.kind, RowKind::CfaSpLowA64 | RowKind::CfaSpLowRecordA64)),
        "big saves x30 far below its CFA: {big_rows:?}"
    );
}

#[test]
fn aarch64_tables_agree_with_readelf_signed_or_not_with_frame_pointers_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let builds: [(&str, &[&str]); 3] = [
        ("nofp", &["-O2", "-fomit-frame-pointer"]),
        ("fp", &["-O2", "-fno-omit-frame-pointer"]),
        (
            "pac",
            &[
                "-O2",
                "-fomit-frame-pointer",
                "-mbranch-protection=standard",
            ],
        ),
    ];
    for (name, args) in builds {
        let exe = cross_gcc(dir.path(), name, args);
        let table = UnwindTable::from_path(&exe).unwrap();
        let (checked, unsupported) = assert_agrees_with_readelf(&exe, &table);
        assert_eq!(unsupported, 0, "{name}: every rule of gcc's expressible");
        assert!(checked >= 10, "{name}: only {checked} rows");
        assert_program_rules(&exe, &table);
    }
}

#[test]
fn the_arm64_libc_table_agrees_with_readelf() {
    let libc = Path::new(CROSS_LIBC);
    assert!(
        libc.is_file(),
        "no {CROSS_LIBC} (apt libc6-dev-arm64-cross: scripts/install-deps.sh)"
    );
    let table = UnwindTable::from_path(libc).unwrap();
    assert_eq!(table.arch(), Arch::Aarch64);
    let (checked, unsupported) = assert_agrees_with_readelf(libc, &table);
    assert!(checked > 5000, "only {checked} rows in libc");
    assert!(
        unsupported * 1000 < checked,
        "{unsupported} of {checked} libc rows unsupported"
    );
}
