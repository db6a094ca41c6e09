//! What distributions do to the binaries they ship, done to a test's own binary: its debug info
//! split off into a separate file, found by build-id or by a debug link, the binary stripped,
//! and (as Fedora does) its static functions' symbols kept in an xz-compressed
//! `.gnu_debugdata` section.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run;

/// `strip STRIP_FLAG -o out binary`.
pub fn strip(strip_flag: &str, binary: &Path, out: &Path) {
    run(Command::new("strip")
        .arg(strip_flag)
        .arg("-o")
        .arg(out)
        .arg(binary));
}

/// Copies the debug sections of `binary` into `out`.
pub fn keep_debug(binary: &Path, out: &Path) {
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(binary)
        .arg(out));
}

/// Adds to `binary` (in place) a `.gnu_debuglink` naming `debug`'s file name, with its CRC.
pub fn add_debug_link(binary: &Path, debug: &Path) {
    run(Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(binary));
}

/// Where a debug file for build-id `hex` goes under the debug directory `dir`.
pub fn build_id_path(dir: &Path, hex: &str) -> PathBuf {
    dir.join(".build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]))
}

/// Adds to the stripped `stripped` (in place) the MiniDebugInfo of its unstripped `binary`:
/// the symbols of the functions `.dynsym` does not name, in a symbol-only ELF file compressed
/// with xz, as Fedora's build does.
pub fn add_mini_debuginfo(binary: &Path, stripped: &Path) {
    let work = stripped.with_extension("minidebuginfo");
    std::fs::create_dir_all(&work).expect("create MiniDebugInfo work dir");
    let dynamic = defined_symbols(binary, true, |_| true);
    let functions = defined_symbols(binary, false, |kind| matches!(kind, "T" | "t"));
    let keep: Vec<&String> = functions.difference(&dynamic).collect();
    assert!(
        !keep.is_empty(),
        "{} has no static functions",
        binary.display()
    );
    let keep_list = work.join("keep_symbols");
    let text: String = keep.iter().map(|name| format!("{name}\n")).collect();
    std::fs::write(&keep_list, text).expect("write the symbols to keep");
    let debug = work.join("debug");
    keep_debug(binary, &debug);
    let mini = work.join("mini_debuginfo");
    run(Command::new("objcopy")
        .args(["-S", "--remove-section", ".gdb_index", "--remove-section"])
        .arg(".comment")
        .arg(format!("--keep-symbols={}", keep_list.display()))
        .arg(&debug)
        .arg(&mini));
    run(Command::new("xz").arg("-f").arg(&mini));
    run(Command::new("objcopy")
        .arg(format!(
            "--add-section=.gnu_debugdata={}.xz",
            mini.display()
        ))
        .arg(stripped));
}

/// The names `nm` lists as defined in `binary` (its dynamic symbols when `dynamic`) whose
/// one-letter kind `kind` accepts.
fn defined_symbols(binary: &Path, dynamic: bool, kind: impl Fn(&str) -> bool) -> BTreeSet<String> {
    listed_by_nm(binary, dynamic)
        .into_iter()
        .filter(|(_, k, _)| kind(k))
        .map(|(name, _, _)| name)
        .collect()
}

/// The address `nm` gives the defined function `name` of `binary` (a `T` or `t` symbol).
pub fn function_address(binary: &Path, name: &str) -> u64 {
    listed_by_nm(binary, false)
        .into_iter()
        .find(|(n, kind, _)| n == name && matches!(kind.as_str(), "T" | "t"))
        .map(|(_, _, address)| address)
        .unwrap_or_else(|| panic!("nm lists no function {name} in {}", binary.display()))
}

/// Every symbol `nm` lists as defined in `binary` (its dynamic symbols when `dynamic`): name,
/// one-letter kind, address.
fn listed_by_nm(binary: &Path, dynamic: bool) -> Vec<(String, String, u64)> {
    let mut nm = Command::new("nm");
    if dynamic {
        nm.arg("-D");
    }
    let out = nm
        .args(["--format=posix", "--defined-only"])
        .arg(binary)
        .output()
        .expect("run nm (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?.to_string();
            let kind = words.next()?.to_string();
            let address = words.next().and_then(|a| u64::from_str_radix(a, 16).ok());
            Some((name, kind, address.unwrap_or(0)))
        })
        .collect()
}
