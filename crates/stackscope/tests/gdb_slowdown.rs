//! What `stackscope gdb` costs the guest, measured by the guest: the x86-64 test kernel's
//! counter (the TSC, which QEMU holds while the guest is stopped) against the host's clock
//! says how much of the time the guest was stopped, with the units of work it did as its own
//! progress. `--max-slowdown` must keep the guest stopped no more than it says, the summary
//! must not claim less than the guest saw, and a rate it cannot allow is refused.

#![cfg(target_os = "linux")]

mod common;
mod qemu;

use common::*;
use qemu::{follow_reports, rate_of, Kernel, Qemu, Report, Stub};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the guest runs unprofiled to learn its counter's rate, and how long it is
/// sampled; reports come five times a second of guest time, so each window has a dozen or
/// more per vCPU.
const QUIET: Duration = Duration::from_millis(2500);
const SECS: &str = "5";
/// Reports this close to the start of stackscope's run are left out: connecting and reading
/// the target description stop the guest too, but are no round.
const EDGE: Duration = Duration::from_millis(700);

/// The number after `word` in `line`.
fn number_after(line: &str, word: &str) -> f64 {
    let rest = &line[line.find(word).expect("the word") + word.len()..];
    let token: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    token
        .parse()
        .unwrap_or_else(|_| panic!("no number after {word:?}: {line}"))
}

/// The seconds sampled and the longest pause (seconds), from the summary's rounds line.
fn sampled_and_longest(run: &Run) -> (f64, f64) {
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains(" rounds/s, ") && l.contains(" longest "))
        .unwrap_or_else(|| panic!("no rounds line on stderr:\n{}", run.stderr));
    (
        number_after(line, " stacks in "),
        number_after(line, " longest ") / 1e3,
    )
}

/// The figures of the summary's first line: fresh stacks/s and the share of the time the
/// guest was stopped, in percent.
fn paid(run: &Run) -> (f64, f64) {
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains(" fresh stacks/s ") && l.contains("guest slowed "))
        .unwrap_or_else(|| panic!("no fresh stacks and slowdown on stderr:\n{}", run.stderr));
    let fresh = line
        .split(" fresh stacks/s")
        .next()
        .and_then(|head| head.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no fresh stacks/s in {line}"));
    (fresh, number_after(line, "guest slowed "))
}

/// The share of the time (percent) the guest's counter stood still in `profiled` against its
/// rate in `quiet`, and the guest's progress (percent of its unprofiled rate), per vCPU.
fn stopped_and_progress(quiet: &[Report], profiled: &[Report]) -> Vec<(f64, f64)> {
    (0..2)
        .map(|cpu| {
            let counter = |r: &Report| r.counter;
            let units = |r: &Report| r.units;
            let ran = rate_of(profiled, cpu, counter) / rate_of(quiet, cpu, counter);
            let progress = rate_of(profiled, cpu, units) / rate_of(quiet, cpu, units);
            ((1.0 - ran) * 100.0, progress * 100.0)
        })
        .collect()
}

#[test]
fn the_guest_is_stopped_no_more_than_max_slowdown_by_its_own_clock() {
    let _serial = serial();
    let dir = tempdir();
    let qemu = Qemu::boot(Kernel::Cfi, 2, Stub::Tcp, dir.path());
    let start = Instant::now();
    let quiet = follow_reports(&qemu.serial, || start.elapsed() < QUIET);
    let out = dir.path().join("guest.folded");
    let kernel = Kernel::Cfi.path();
    let mut cmd = Command::new(stackscope_bin());
    cmd.current_dir(dir.path())
        .args(["gdb", "--remote", &qemu.remote, "--kernel"])
        .arg(&kernel)
        .args(["--interval", "0", "-d", SECS, "-o"])
        .arg(&out);
    let start = Instant::now();
    let child = spawn_piped(&mut cmd);
    let secs = Duration::from_secs(SECS.parse().expect("whole seconds"));
    // Sampling ends a little after `secs` from here, once connected: what comes in until
    // then, past the connection, is all rounds.
    let all = follow_reports(&qemu.serial, || start.elapsed() < secs);
    let run = wait_output(child, start);
    run.assert_ok();
    let profiled: Vec<Report> = all.into_iter().filter(|r| r.at > start + EDGE).collect();
    let (fresh, slowed) = paid(&run);
    let by_guest = stopped_and_progress(&quiet, &profiled);
    eprintln!(
        "stackscope: {fresh} fresh stacks/s, guest slowed {slowed}%; the guest's counter: stopped, progress per vCPU (%): {by_guest:?}"
    );
    // The budget bounds the time stopped to 5% of the time sampled plus what 50 ms saved and
    // the last round, which may be the longest (a host that stalls QEMU's threads for tens
    // of milliseconds); half a point more for the rounding of the figures.
    let (sampled, longest) = sampled_and_longest(&run);
    let bound = 5.0 + (0.05 * 0.050 + longest) / sampled * 100.0 + 0.5;
    assert!(
        slowed <= bound,
        "stackscope stopped the guest {slowed}% of the time, more than {bound:.2}%:\n{}",
        run.stderr
    );
    assert!(
        slowed >= 2.0,
        "--interval 0 samples as often as the slowdown allows, yet the guest was stopped only {slowed}% of the time:\n{}",
        run.stderr
    );
    for (cpu, &(stopped, _)) in by_guest.iter().enumerate() {
        // What QEMU held the guest's clock for is within stackscope's pause (from its
        // interrupt to its resume); the counter's rate is read within about a point.
        assert!(
            stopped <= slowed + 1.5,
            "vCPU {cpu}'s counter stood still {stopped:.2}% of the time, stackscope says {slowed}%:\n{}",
            run.stderr
        );
    }
    let folded = std::fs::read_to_string(&out).expect("the profile was written");
    let counted: u64 = parse_folded(&folded).iter().map(|l| l.1).sum();
    // Fresh stacks/s is given to a tenth, over the time sampled (which ends early when the
    // next round the budget allows would come after the duration).
    let expected = fresh * sampled;
    assert!(
        counted > 0 && (counted as f64 - expected).abs() <= 0.5 + 0.07 * counted as f64,
        "{counted} stacks written, {fresh} fresh stacks/s for {sampled} s:\n{}",
        run.stderr
    );
}

#[test]
fn a_rate_above_what_max_slowdown_allows_is_refused_with_the_rate_it_allows() {
    let _serial = serial();
    let dir = tempdir();
    let qemu = Qemu::boot(Kernel::Cfi, 2, Stub::Tcp, dir.path());
    let out = dir.path().join("guest.svg");
    let kernel = Kernel::Cfi.path();
    let kernel = kernel.to_str().expect("UTF-8 path");
    let gdb = |args: &[&str]| {
        let mut all = vec!["gdb", "--remote", &qemu.remote, "--kernel", kernel];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-d", "5", "-o", out.to_str().unwrap()]);
        stackscope(dir.path(), &all)
    };
    // A round takes far more than 0.5 µs, so 5% of the time allows far fewer than 100,000.
    let run = gdb(&["-F", "100000"]);
    run.assert_exit(1, "a refused rate");
    let last = run.stderr_lines().last().copied().unwrap_or_default();
    assert!(
        last.starts_with("stackscope: error: -F 100000 would stop the guest more than --max-slowdown 5% of the time: a round pauses it ")
            && last.ends_with(" at most (or raise --max-slowdown)"),
        "{}",
        run.stderr
    );
    let allowed: u64 = last
        .split("so -F ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rate allowed in {last}"));
    assert!((1..100_000).contains(&allowed), "{last}");
    assert!(!out.exists(), "a refused run writes nothing");
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    // The guest was let go: it runs and reports on.
    let start = Instant::now();
    let after = follow_reports(&qemu.serial, || start.elapsed() < Duration::from_secs(1));
    assert!(
        !after.is_empty(),
        "the guest stopped reporting after the refusal"
    );

    let run = gdb(&["--interval", "0.000001", "--max-slowdown", "2.5"]);
    run.assert_exit(1, "a refused interval");
    let last = run.stderr_lines().last().copied().unwrap_or_default();
    assert!(
        last.starts_with("stackscope: error: --interval 0.000001 would stop the guest more than --max-slowdown 2.5% of the time")
            && last.ends_with(" at least (or raise --max-slowdown)"),
        "{}",
        run.stderr
    );
    let least: f64 = last
        .split("so --interval ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no interval allowed in {last}"));
    assert!(least > 0.000001, "{last}");

    for (bad, why) in [
        ("0", "is not above 0 and at most 100"),
        ("101", "is not above 0 and at most 100"),
        ("much", "is not a percentage"),
    ] {
        let run = gdb(&["--max-slowdown", bad]);
        assert_eq!(run.code(), Some(2), "{}", run.stderr);
        assert!(
            run.stderr.contains(why) && !run.stderr.contains("panicked"),
            "{bad}: {}",
            run.stderr
        );
    }
}
