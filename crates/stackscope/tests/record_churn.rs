//! Whole-system recording while thousands of short processes start, run and exit: each is
//! named and unwound from the kernel's own records, and the samples caught inside execve are
//! neither "truncated" nor blamed on the stack copy size.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use stackscope_profile::{FrameKind, Profile};
use std::process::Command;

/// Runs of the churn workload the shell loop starts, each ~10 ms of CPU in `churn_work`:
/// more than the recording sees, so it churns until the end.
const RUNS: u32 = 3000;

/// Records the whole system for a few seconds while a shell starts the churn workload over
/// and over.
fn record_churn(dir: &std::path::Path) -> (Run, Profile) {
    let prog = workload("churn");
    let script = format!(
        "i=0; while [ $i -lt {RUNS} ]; do {} 10; i=$((i+1)); done",
        prog.display()
    );
    let _churn = Background::spawn(Command::new("bash").arg("-c").arg(script));
    record_json(dir, &["-a", "-d", "5"], &[])
}

/// Samples of threads named `comm`, and of those the ones whose stack satisfies `pred`.
fn samples_of(
    profile: &Profile,
    comm: &str,
    pred: impl Fn(&[&stackscope_profile::Frame]) -> bool,
) -> (u64, u64) {
    let mut all = 0;
    let mut matching = 0;
    for s in &profile.samples {
        if profile.thread(s.thread).comm != comm {
            continue;
        }
        let frames: Vec<_> = profile.stack_frames(s.stack).collect();
        all += s.count;
        if pred(&frames) {
            matching += s.count;
        }
    }
    (all, matching)
}

#[test]
fn short_lived_processes_are_named_and_unwound_to_main() {
    let _serial = serial();
    let dir = tempdir();
    let (_, profile) = record_churn(dir.path());

    let (churn, hot) = samples_of(&profile, "churn", |f| has_frame(f, "churn_work"));
    assert!(
        churn >= 300,
        "only {churn} samples of the churn processes\n{}",
        top_stacks(&profile, 10)
    );
    // The rest of a run is the dynamic loader and exit: about a millisecond of the ten.
    assert!(
        hot as f64 >= 0.85 * churn as f64,
        "only {hot} of {churn} samples of the churn processes are in churn_work\n{}",
        top_stacks(&profile, 10)
    );
    let (_, rooted) = samples_of(&profile, "churn", |f| {
        has_frame(f, "churn_work") && has_frame(f, "main")
    });
    assert!(
        rooted as f64 >= 0.98 * hot as f64,
        "only {rooted} of {hot} churn_work samples reach main\n{}",
        top_stacks(&profile, 10)
    );
    // Before it execs, the forked child is still the shell: its samples are the shell's.
    let (_, shell_code) = samples_of(&profile, "churn", |f| has_frame(f, "execute_command"));
    assert_eq!(
        shell_code,
        0,
        "shell code counted as the churn program's\n{}",
        top_stacks(&profile, 10)
    );
}

#[test]
fn samples_inside_execve_are_unreadable_not_truncated() {
    let _serial = serial();
    let dir = tempdir();
    let (run, profile) = record_churn(dir.path());

    let in_exec = |frames: &[&stackscope_profile::Frame]| {
        frames
            .iter()
            .any(|f| f.kind == FrameKind::Kernel && f.name.starts_with("do_execveat_common"))
    };
    let exec_samples = share(&profile, in_exec);
    assert!(
        exec_samples > 0.0,
        "no sample inside execve\n{}",
        top_stacks(&profile, 10)
    );
    // The shell's and the churn program's stacks are shallow: none can be deeper than the
    // stack copy, so none of theirs may be counted truncated.
    for comm in ["churn", "bash"] {
        let (_, truncated) = samples_of(&profile, comm, |f| has_frame(f, "[truncated]"));
        assert_eq!(
            truncated,
            0,
            "{comm}: samples marked [truncated]\n{}",
            top_stacks(&profile, 10)
        );
    }
    let cut_in_exec = share(&profile, |f| in_exec(f) && has_frame(f, "[truncated]"));
    assert_eq!(cut_in_exec, 0.0, "execve samples marked [truncated]");
    // A stack caught in execve has no user memory left to copy: it says so, and the
    // summary counts it apart.
    let unreadable = share(&profile, |f| {
        in_exec(f) && has_frame(f, "[stack unreadable]")
    });
    assert!(
        unreadable > 0.0,
        "no execve sample is marked [stack unreadable]\n{}",
        top_stacks(&profile, 10)
    );
    assert!(
        profile.meta.unwind.unreadable > 0,
        "{:?}",
        profile.meta.unwind
    );
    assert!(
        run.stderr.contains("% unreadable"),
        "the summary does not count unreadable stacks:\n{}",
        run.stderr
    );
}
