//! Code objects of live CPython interpreters read from their memory: each one's qualified
//! name, file and first line as the interpreter itself gives them, and the line of every
//! instruction as its `co_positions()` says; and each interpreter's version, from the one file
//! it maps that exports one (its executable, or its libpython). Debian's python3.11 always (a static
//! interpreter); the shared-libpython 3.11 and 3.12 builds pyenv has, where it has them.

#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use stackscope_symbols::elf::ElfFile;
use stackscope_symbols::python_code::{CodeLayout, PyCode, PyVersion};

/// Prints, per code object, `id qualname filename firstlineno index:line...` (tab-separated),
/// then `done`, and waits for its stdin to close.
const SCRIPT: &str = r#"import sys
def fünf():
    return 5
def 函数():
    return "x"
class Box:
    def method(self):
        x = 1
        for i in range(3):
            x += i
        return x
def outer():
    def inner():
        return [i * 2
                for i in range(4)]
    return inner
codes = [fünf.__code__, 函数.__code__, Box.method.__code__, outer().__code__,
         outer.__code__, sys._getframe().f_code]
for c in codes:
    lines = " ".join(f"{i}:{p[0]}" for i, p in enumerate(c.co_positions()) if p[0] is not None)
    print(id(c), c.co_qualname, c.co_filename, c.co_firstlineno, lines, sep="\t", flush=True)
print("done", flush=True)
sys.stdin.read()
"#;

/// The interpreters to check: Debian's, and pyenv's 3.11 and 3.12 where pyenv has them.
fn interpreters() -> Vec<PathBuf> {
    let debian = PathBuf::from("/usr/bin/python3.11");
    assert!(
        debian.exists(),
        "/usr/bin/python3.11 is needed: install the apt package python3.11"
    );
    let mut found = vec![debian];
    for version in ["3.11", "3.12"] {
        let prefix = latest_pyenv(version).and_then(|installed| {
            let out = Command::new("pyenv").args(["prefix", &installed]).output();
            out.ok().filter(|o| o.status.success())
        });
        if let Some(out) = prefix {
            let prefix = String::from_utf8_lossy(&out.stdout).trim().to_string();
            found.push(PathBuf::from(prefix).join(format!("bin/python{version}")));
        } else {
            eprintln!("pyenv has no CPython {version}: only the interpreters found are checked");
        }
    }
    found
}

/// The newest `version.N` pyenv has installed.
fn latest_pyenv(version: &str) -> Option<String> {
    let out = Command::new("pyenv")
        .args(["versions", "--bare"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|v| {
            v.strip_prefix(version)
                .is_some_and(|rest| rest.starts_with('.'))
        })
        .filter(|v| v[version.len() + 1..].bytes().all(|b| b.is_ascii_digit()))
        .max_by_key(|v| v[version.len() + 1..].parse::<u32>().unwrap_or(0))
        .map(str::to_string)
}

/// Reads `buf.len()` bytes of process `pid` at `addr`.
fn read_memory(pid: i32, addr: u64, buf: &mut [u8]) -> bool {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` covers `buf`, which lives across the call.
    let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    read == buf.len() as isize
}

#[test]
fn code_objects_read_from_live_interpreters_name_and_number_as_the_interpreter_does() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("codes.py");
    std::fs::write(&script, SCRIPT).unwrap();
    for python in interpreters() {
        let minor = if python.to_string_lossy().ends_with("3.12") {
            12
        } else {
            11
        };
        let layout = CodeLayout::of(3, minor).unwrap();
        let mut child = Command::new(&python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
        let pid = child.id() as i32;
        let mut checked = 0;
        let mut lines_checked = 0;
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            if line == "done" {
                break;
            }
            let fields: Vec<&str> = line.split('\t').collect();
            let [id, qualname, filename, first, positions] = fields[..] else {
                panic!("{}: unexpected line {line:?}", python.display());
            };
            let addr: u64 = id.parse().unwrap();
            let code = PyCode::read(addr, &layout, |at, buf| read_memory(pid, at, buf))
                .unwrap_or_else(|| panic!("{}: code object {qualname} unread", python.display()));
            assert_eq!(code.qualname, qualname, "{}", python.display());
            assert_eq!(code.filename, filename);
            assert_eq!(code.firstlineno.to_string(), first);
            for pair in positions.split(' ').filter(|p| !p.is_empty()) {
                let (index, want) = pair.split_once(':').unwrap();
                assert_eq!(
                    code.line(index.parse().unwrap()).to_string(),
                    want,
                    "{} {qualname}: instruction {index}",
                    python.display()
                );
                lines_checked += 1;
            }
            checked += 1;
        }
        drop(child.stdin.take().map(|mut stdin| stdin.flush()));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(checked, 6, "{}: code objects checked", python.display());
        assert!(
            lines_checked > 50,
            "{}: {lines_checked} lines",
            python.display()
        );
        eprintln!("{}: {lines_checked} instruction lines", python.display());
    }
}

#[test]
fn an_interpreters_version_is_read_from_the_one_file_it_maps_that_says_it() {
    for python in interpreters() {
        let mut child = Command::new(&python)
            .args([
                "-c",
                "import sys; print(*sys.version_info[:3], sep='.', flush=True); sys.stdin.read()",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
        let mut said = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut said)
            .unwrap();
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let mut files: Vec<&str> = maps
            .lines()
            .filter_map(|line| line.split_whitespace().nth(5))
            .filter(|path| path.starts_with('/'))
            .collect();
        files.dedup();
        let versions: Vec<(&str, PyVersion)> = files
            .iter()
            .filter_map(|path| {
                Some((
                    *path,
                    PyVersion::of_file(&ElfFile::open(path.as_ref()).ok()?)?,
                ))
            })
            .collect();
        let [(file, version)] = versions[..] else {
            panic!("{}: files giving a version: {versions:?}", python.display());
        };
        assert_eq!(version.to_string(), said.trim(), "{file}");
        assert!(version.code_layout().is_some(), "{file}: {version}");
    }
    // A 3.13 has no layout here: its frames are to stay native.
    let unknown = PyVersion {
        major: 3,
        minor: 13,
        micro: 0,
    };
    assert_eq!(unknown.code_layout(), None);
}
