//! Every flag that takes seconds, in every command, refuses what is no duration (not finite,
//! negative, zero where zero means nothing, more than a year) with one clear line, before
//! anything runs, and never panics.

#![cfg(target_os = "linux")]

mod common;

use common::*;

/// Runs stackscope with `args`, asserts a usage error (exit 2) naming the flag and `why`.
fn assert_refused(args: &[&str], flag: &str, why: &str) {
    let dir = tempdir();
    let run = stackscope(dir.path(), args);
    assert!(
        !run.stderr.contains("panicked"),
        "{args:?} panicked:\n{}",
        run.stderr
    );
    assert_eq!(
        run.code(),
        Some(2),
        "{args:?}: exit code; stderr:\n{}",
        run.stderr
    );
    let error = run
        .stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("{args:?}: no error line:\n{}", run.stderr));
    assert!(
        error.contains(flag) && error.contains(why),
        "{args:?}: the error does not name {flag:?} and say {why:?}: {error}"
    );
}

#[test]
fn too_large_durations_are_refused_not_a_panic() {
    let year = "more than a year";
    assert_refused(&["record", "-d", "2e19", "--", "true"], "--duration", year);
    assert_refused(
        &["record", "--backend", "bpf", "-d", "1e300", "--", "true"],
        "--duration",
        year,
    );
    let gdb = ["gdb", "--kernel", "/bin/true"];
    for (flag, value) in [
        ("--duration", "1e300"),
        ("--interval", "1e300"),
        ("--timeout", "2e19"),
        ("--timeout", "31536001"),
    ] {
        let mut args = gdb.to_vec();
        args.extend([flag, value]);
        assert_refused(&args, flag, year);
    }
}

#[test]
fn non_finite_negative_and_zero_durations_are_refused() {
    for (value, why) in [
        ("-d inf", "finite"),
        ("-d NaN", "finite"),
        ("--duration=-1", "negative"),
        ("-d 0", "more than zero"),
        // Rounds to no time at all.
        ("-d 1e-300", "more than zero"),
        ("-d soon", "not a number"),
    ] {
        let mut args = vec!["record"];
        args.extend(value.split(' '));
        args.extend(["--", "true"]);
        assert_refused(&args, "--duration", why);
    }
    let gdb = ["gdb", "--kernel", "/bin/true"];
    for (flag, value, why) in [
        ("--timeout", "0", "more than zero"),
        ("--timeout", "inf", "finite"),
        ("--interval", "-0.5", "negative"),
        ("--duration", "nan", "finite"),
    ] {
        let mut args = gdb.to_vec();
        let arg = format!("{flag}={value}");
        args.push(&arg);
        assert_refused(&args, flag, why);
    }
}
