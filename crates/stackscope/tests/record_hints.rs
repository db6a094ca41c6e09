//! What limits a first recording, said after its summary with the fix, and only when it
//! applies: a program of one's own built without debug info (named, with how to build it
//! with), a stripped program (its functions shown as module+address: debug packages or
//! debuginfod), and a target that slept most of the time (`--off-cpu`, `--wall`); a program
//! built with `-g` that keeps a CPU busy gets none of them.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// About a second of CPU.
const ROUNDS: &str = "2000";

/// The `hint: ` lines of a recording's summary.
fn hints(run: &Run) -> Vec<&str> {
    run.stderr
        .lines()
        .filter_map(|l| l.strip_prefix("hint: "))
        .collect()
}

fn debug_info_hint<'r>(hints: &[&'r str]) -> Option<&'r str> {
    hints.iter().copied().find(|h| h.contains("no debug info"))
}

fn symbols_hint<'r>(hints: &[&'r str]) -> Option<&'r str> {
    hints
        .iter()
        .copied()
        .find(|h| h.contains("no symbol names"))
}

fn off_cpu_hint<'r>(hints: &[&'r str]) -> Option<&'r str> {
    hints.iter().copied().find(|h| h.contains("--off-cpu"))
}

/// The split workload built without debug info, copied to `dir` (a temporary directory, where
/// no distribution installs files, whatever holds the build).
fn without_debug_info(dir: &Path) -> PathBuf {
    let prog = dir.join("split_nodebug");
    std::fs::copy(workload("split_nodebug"), &prog).expect("copy the workload");
    prog
}

/// The backends `record` samples with.
const BACKENDS: [&str; 2] = ["perf", "bpf"];

/// Records `command` in `dir` with `options`, with no debug file found anywhere but in the
/// binaries themselves: no debug directory, no debuginfod server.
fn record_alone(dir: &Path, options: &[&str], command: &[&std::ffi::OsStr]) -> Run {
    let out = dir.join("profile.json");
    let mut cmd = record_command(dir, &out, options, command);
    cmd.env(
        "STACKSCOPE_DEBUG_FILE_DIRECTORY",
        dir.join("no-debug-files"),
    )
    .env_remove("DEBUGINFOD_URLS");
    let run = run_with_deadline(cmd);
    run.assert_ok();
    run
}

#[test]
fn a_program_built_without_debug_info_is_named_with_how_to_build_it_with() {
    let _serial = serial();
    let dir = tempdir();
    let prog = without_debug_info(dir.path());
    let split = Measured::of(prog.clone(), dir.path(), ROUNDS);
    for backend in BACKENDS {
        let run = record_alone(dir.path(), &["--backend", backend], &split.command());
        let hints = hints(&run);
        let hint = debug_info_hint(&hints)
            .unwrap_or_else(|| panic!("no hint with {backend}:\n{}", run.stderr));
        assert!(
            hint.contains(&format!("{}, which has no debug info", prog.display())),
            "{hint}"
        );
        for fix in ["debug = \"line-tables-only\"", "cargo stackscope", "-g"] {
            assert!(hint.contains(fix), "no {fix:?} in {hint}");
        }
        // Its functions have names: it is not stripped.
        assert_eq!(symbols_hint(&hints), None, "{}", run.stderr);
    }
}

#[test]
fn a_stripped_program_is_pointed_to_debug_packages_and_debuginfod() {
    let _serial = serial();
    let dir = tempdir();
    let prog = dir.path().join("split_stripped");
    stackscope_testkit::shipped::strip("--strip-all", &without_debug_info(dir.path()), &prog);
    let split = Measured::of(prog.clone(), dir.path(), ROUNDS);
    let run = record_alone(dir.path(), &[], &split.command());
    let hints = hints(&run);
    let hint = symbols_hint(&hints).unwrap_or_else(|| panic!("no hint:\n{}", run.stderr));
    assert!(hint.contains(&prog.display().to_string()), "{hint}");
    for fix in ["-dbgsym", "-debuginfo", "DEBUGINFOD_URLS"] {
        assert!(hint.contains(fix), "no {fix:?} in {hint}");
    }
    // One hint for what its names lack, not two.
    assert_eq!(debug_info_hint(&hints), None, "{}", run.stderr);
}

#[test]
fn a_command_that_sleeps_is_pointed_to_off_cpu_and_wall() {
    let _serial = serial();
    let dir = tempdir();
    for backend in BACKENDS {
        let command = [os("sh"), os("-c"), os("sleep 2")];
        let run = record_alone(dir.path(), &["--backend", backend], &command);
        let hints = hints(&run);
        let hint = off_cpu_hint(&hints)
            .unwrap_or_else(|| panic!("no hint with {backend}:\n{}", run.stderr));
        assert!(hint.contains("--wall"), "{hint}");
    }
}

#[test]
fn a_busy_program_with_debug_info_gets_none_of_these_hints() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", ROUNDS);
    let out = dir.path().join("profile.json");
    let run = record(dir.path(), &out, &[], &split.command());
    run.assert_ok();
    let hints = hints(&run);
    assert_eq!(debug_info_hint(&hints), None, "{}", run.stderr);
    assert_eq!(symbols_hint(&hints), None, "{}", run.stderr);
    // The program measured its own CPU time: when it had a CPU half the time recorded or
    // more, it did not spend most of it off the CPU. (A machine loaded past that leaves it
    // waiting for a CPU, which the hint rightly counts off it.)
    let profile = read_json(&out);
    let on_cpu = split.truth().cpu_ns as f64 / 1e9;
    let recorded = profile.meta.duration_secs;
    if on_cpu >= 0.5 * recorded {
        assert_eq!(off_cpu_hint(&hints), None, "{}", run.stderr);
    } else {
        eprintln!("on a CPU {on_cpu:.2} s of {recorded:.2} s: the machine is too busy to say");
    }
}
