//! The peer tools the tests read stackscope's files with, run as a user runs them.

use std::path::Path;
use std::process::Command;

/// `go tool pprof ARGS FILE`'s stdout; fails the test with pprof's stderr. pprof keeps a cache
/// of fetched profiles under $HOME, so it is pointed at the file's directory instead.
pub fn go_pprof(args: &[&str], file: &Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("PPROF_TMPDIR", file.parent().unwrap_or(Path::new(".")))
        .output()
        .expect(
            "run `go tool pprof` (Debian package golang-go; scripts/install-deps.sh installs it)",
        );
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("pprof's output is UTF-8")
}
