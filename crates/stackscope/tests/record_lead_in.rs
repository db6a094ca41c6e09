//! `stackscope record -- PROG` with the default eBPF backend: the launched command runs at once,
//! its first samples taken by the perf source while the kernel verifies the sampling program,
//! and handed over to the program without a sample lost or counted twice. split.c measures the
//! CPU time it took (its truth): the samples must be that time at the rate, whole, and split as
//! it measured.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use stackscope_profile::Profile;

/// The rate the tests sample at, and the CPU time one sample stands for.
const HZ: u64 = 999;

/// Records `split` with the default backend, launched by a shell that forks it when
/// `forked`; `None` (said why) where eBPF does not run here.
fn record_default(dir: &std::path::Path, split: &Measured, forked: bool) -> Option<(Run, Profile)> {
    let script = r#""$@"; true"#;
    let mut command = vec![os("sh"), os("-c"), os(script), os("sh")];
    command.extend(split.command());
    let command = if forked { command } else { split.command() };
    let (run, profile) = record_json(dir, &["-F", "999"], &command);
    if !run.stderr.contains("sampled with eBPF") {
        eprintln!(
            "not tested: the default backend is not eBPF here:\n{}",
            run.stderr
        );
        return None;
    }
    Some((run, profile))
}

/// The samples the perf source took before the handover, as the summary says, and whether
/// the command ended before the program was ready (they are then all its samples).
fn lead_in_samples(run: &Run) -> (u64, bool) {
    const ENDED: &str = "stackscope: the command ended before the eBPF program was ready: its ";
    run.stderr
        .lines()
        .find_map(|line| {
            let (rest, whole_run) = match line.strip_prefix(ENDED) {
                Some(rest) => (rest, true),
                None => (line.strip_prefix("stackscope: the first ")?, false),
            };
            Some((rest.split(' ').next()?.parse().ok()?, whole_run))
        })
        .unwrap_or_else(|| panic!("no line on the first samples:\n{}", run.stderr))
}

/// Asserts that the profile holds the samples the measured CPU time makes at [`HZ`]: a
/// cpu-clock sample fires each period of the thread's own CPU time, so the count strays only by
/// the time before main (the dynamic loader) and a few periods cut at the ends; a handover that
/// counted the same moment twice, or neither, shows as a surplus or a shortfall.
fn assert_samples_match_cpu_time(profile: &Profile, truth: &Truth) {
    let expected = truth.cpu_ns as f64 * HZ as f64 / 1e9;
    let got = profile.total_samples() as f64;
    let slack = SIGMAS_FOR_COUNT * expected.sqrt() + 5.0;
    assert!(
        (got - expected).abs() <= slack,
        "{got} samples, {expected:.0} expected from {} ms of measured CPU (±{slack:.0})\n{}",
        truth.cpu_ns / 1_000_000,
        top_stacks(profile, 8)
    );
}

/// Standard deviations of a Poisson count the sample total may stray by: the timer's own
/// jitter on a loaded machine is well inside it.
const SIGMAS_FOR_COUNT: f64 = 4.0;

#[test]
fn a_command_shorter_than_the_programs_start_gets_its_samples_whole_under_the_default_backend() {
    let _serial = serial();
    let dir = tempdir();
    // 100 rounds: about 50 ms of CPU, well under what verifying the program takes.
    let split = Measured::new(dir.path(), "split_nofp", "100");
    let Some((run, profile)) = record_default(dir.path(), &split, false) else {
        return;
    };
    let truth = split.truth();
    let (before, whole_run) = lead_in_samples(&run);
    assert!(before > 0, "{}", run.stderr);
    // Ended before the program was ready (as it does unless the machine is quiet), the
    // recording is the perf source's alone.
    let source = match whole_run {
        true => {
            assert_eq!(before, profile.total_samples(), "{}", run.stderr);
            "perf_event"
        }
        false => "ebpf",
    };
    assert_eq!(profile.meta.source, source, "{}", run.stderr);
    assert_samples_match_cpu_time(&profile, &truth);
    assert_user_stacks_complete(&profile);
    // Only the dynamic loader's few samples before main may lack it.
    assert_share_at_least(&profile, "main", 0.9);
}

#[test]
fn samples_across_the_handover_are_counted_once_and_split_as_measured() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "2000");
    // Under a shell that forks it, as a wrapper script runs a program: the process sampled
    // is one the launched command started before the program took over.
    let attempt = || match record_default(dir.path(), &split, true) {
        Some(recorded) => (Some(recorded), split.truth()),
        None => (None, split.truth()),
    };
    let (recorded, truth) = until_testable(attempt);
    let Some((run, profile)) = recorded else {
        return;
    };
    let (before, whole_run) = lead_in_samples(&run);
    assert!(
        !whole_run && before > 0 && before < profile.total_samples(),
        "the perf source took {before} of {} samples: no handover\n{}",
        profile.total_samples(),
        run.stderr
    );
    assert_samples_match_cpu_time(&profile, &truth);
    assert_user_stacks_complete(&profile);
    assert_share_at_least(&profile, "main", 0.97);
    if truth.testable() {
        assert_split_profile(&profile, &truth);
    }
}
