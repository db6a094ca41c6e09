//! The test programs builder shared by stackscope's test suites: writes a C, C++ or Rust
//! program into a test's directory, compiles it, and fails the test loudly, with the command
//! and the compiler's errors, when that does not work. A dev-dependency only; not part of
//! stackscope. [`truth`] reads what the split workloads measure of themselves and compares
//! profiles with it; [`peers`] runs the peer tools that read stackscope's files.

pub mod pe;
pub mod peers;
pub mod shipped;
pub mod truth;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `cmd` to its end; panics with the command and its stderr unless it exits 0.
pub fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `text` to `dir/src_name`, runs `compiler ARGS -o dir/out_name dir/src_name LIBS`
/// and returns the canonical path of the output. `libs` come after the source because the
/// linker only takes from a library what the files before it need.
pub fn compile(
    compiler: &str,
    dir: &Path,
    (src_name, text): (&str, &str),
    args: &[&str],
    libs: &[&str],
    out_name: &str,
) -> PathBuf {
    let src = dir.join(src_name);
    std::fs::write(&src, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", src.display()));
    let out = dir.join(out_name);
    run(Command::new(compiler)
        .args(args)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .args(libs));
    out.canonicalize()
        .unwrap_or_else(|e| panic!("{compiler} wrote no {}: {e}", out.display()))
}

/// The start of a kernel function of at least 4 KiB that no other symbol shares, from the
/// running kernel's symbols.
pub fn big_kernel_function() -> u64 {
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").expect("read /proc/kallsyms");
    let mut symbols: Vec<(u64, bool)> = kallsyms
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let addr = u64::from_str_radix(words.next()?, 16).ok()?;
            let kind = words.next()?;
            (addr != 0).then_some((addr, kind == "T" || kind == "t"))
        })
        .collect();
    symbols.sort_unstable();
    symbols
        .windows(3)
        .find(|w| w[1].1 && w[0].0 < w[1].0 && w[2].0 - w[1].0 >= 4096)
        .map(|w| w[1].0)
        .expect("a kernel function of 4 KiB (kallsyms needs root)")
}

/// A launched test program, killed and reaped on drop, so that a failing test leaves no
/// process behind.
pub struct Running(pub std::process::Child);

impl Running {
    /// Runs `cmd` with its output piped and waits for the "ready" line the test programs write
    /// once their code of interest is about to run.
    pub fn ready(cmd: &mut Command) -> Running {
        use std::io::BufRead;
        let mut child = Running(
            cmd.stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}")),
        );
        let mut line = String::new();
        let out = child.0.stdout.take().expect("piped stdout");
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("cannot read from {cmd:?}: {e}"));
        assert_eq!(line, "ready\n", "{cmd:?} did not start");
        child
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
