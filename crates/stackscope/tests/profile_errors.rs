//! `stackscope profile` refuses what bcc profile refuses (conflicting or malformed flags, with
//! a usage error and exit code 2, as argparse does) and ids that name nothing (one line, exit
//! code 1), before sampling anything.

#![cfg(target_os = "linux")]

mod common;

use common::*;

/// A usage error: exit code 2, an `error:` line naming `word`, nothing on stdout.
fn assert_usage_error(args: &[&str], word: &str) {
    let dir = tempdir();
    let mut all = vec!["profile"];
    all.extend_from_slice(args);
    let run = stackscope(dir.path(), &all);
    run.assert_exit(2, &format!("usage error for {args:?}"));
    assert!(
        run.stderr.contains("error:") && run.stderr.contains(word),
        "stderr for {args:?} does not name {word:?}:\n{}",
        run.stderr
    );
    assert!(run.stdout.is_empty(), "stdout for {args:?}: {}", run.stdout);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

#[test]
fn exclusive_flags_conflict_as_in_bcc() {
    assert_usage_error(&["-p", "1", "-L", "1"], "--tid");
    assert_usage_error(&["-U", "-K"], "--kernel-stacks-only");
    assert_usage_error(&["-F", "99", "-c", "1000"], "--count");
}

#[test]
fn malformed_values_are_refused() {
    assert_usage_error(&["-p", "12x"], "12x");
    assert_usage_error(&["-p", "1,,2"], "--pid");
    assert_usage_error(&["-F", "fast"], "fast");
    assert_usage_error(&["0"], "duration");
    assert_usage_error(&["-5"], "-5");
    assert_usage_error(&["--stack-storage-size", "0"], "--stack-storage-size");
    assert_usage_error(&["--hash-storage-size", "0"], "--hash-storage-size");
    assert_usage_error(&["--format", "pdf"], "pdf");
    assert_usage_error(&["--no-such-flag"], "--no-such-flag");
}

#[test]
fn missing_pid_or_tid_is_one_line() {
    let dir = tempdir();
    // pid_max is at most 2^22, so this id never names a process.
    let missing = "4194999";
    let run = stackscope(dir.path(), ["profile", "-p", missing, "1"]);
    run.assert_one_line_error(&[missing, "/proc"]);
    assert!(run.stdout.is_empty(), "nothing announced: {}", run.stdout);

    let run = stackscope(dir.path(), ["profile", "-L", &format!("1,{missing}"), "1"]);
    run.assert_one_line_error(&[missing, "thread"]);
}

#[test]
fn bad_cpu_and_output_are_one_line() {
    let dir = tempdir();
    let run = stackscope(dir.path(), ["profile", "-C", "-2", "1"]);
    run.assert_one_line_error(&["-C", "-2"]);

    let run = stackscope(dir.path(), ["profile", "-o", "no/such/dir/out.folded", "1"]);
    run.assert_one_line_error(&["no/such/dir", "does not exist"]);
}
