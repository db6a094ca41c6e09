//! `record --off-cpu` and `--wall`: time off the CPU counted at the scheduler's switch on the
//! eBPF source, checked against what the blocking program (tests/workloads/blocking.c) measured
//! of itself: the wall time its sleeps took and the CPU time its burning took. A sleep's time off
//! the CPU lies within the wall time the program measured around it, whatever the load.

mod common;

use common::*;
use stackscope_profile::{CountUnit, Frame, FrameKind, Profile};
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// The program's own account, its last line: `nap 123 burn 456` as (name, number) pairs.
fn account(stdout: &str) -> Vec<(String, u64)> {
    let line = stdout.lines().last();
    account_pairs(line.unwrap_or_else(|| panic!("the program printed nothing: {stdout:?}")))
}

/// Microseconds (the counts of a profile of time) of the stacks `pred` picks.
fn micros(profile: &Profile, pred: impl Fn(&[&Frame]) -> bool) -> u64 {
    counts_where(profile, pred)
}

fn user_has(frames: &[&Frame], name: &str) -> bool {
    user_names(frames).contains(&name)
}

fn rooted(frames: &[&Frame], event: &str) -> bool {
    frames
        .first()
        .is_some_and(|f| f.kind == FrameKind::Marker && f.name == event)
}

fn blocking() -> std::path::PathBuf {
    workload("blocking")
}

#[test]
fn wall_profile_shows_the_measured_split_of_sleeping_and_burning() {
    let dir = tempdir();
    let prog = blocking();
    let (run, profile) = record_json(
        dir.path(),
        &["--wall"],
        &[prog.as_os_str(), os("wall"), os("300")],
    );
    let account = account(&run.stdout);
    let (napped_ns, burnt_ns) = (said(&account, "nap"), said(&account, "burn"));
    let top = top_stacks(&profile, 8);

    assert_eq!(profile.meta.event, "on-cpu, off-cpu");
    assert_eq!(profile.meta.count_unit, CountUnit::Microseconds);
    assert_eq!(
        profile.meta.frequency_hz, None,
        "counts are time, not samples"
    );
    let roots = micros(&profile, |f| rooted(f, "on-cpu") || rooted(f, "off-cpu"));
    assert_eq!(
        roots,
        profile.total_samples(),
        "every stack is rooted in its kind:\n{top}"
    );

    // Burning is on the CPU, sleeping off it; the time a busy machine preempts the burning
    // is off the CPU under burn, which the program counts as neither.
    let on = micros(&profile, |f| rooted(f, "on-cpu") && user_has(f, "burn"));
    let off = micros(&profile, |f| rooted(f, "off-cpu") && user_has(f, "nap"));
    let asleep_on_cpu = micros(&profile, |f| rooted(f, "on-cpu") && user_has(f, "nap"));
    let measured = burnt_ns as f64 / (burnt_ns + napped_ns) as f64;
    let sampled = on as f64 / (on + off) as f64;
    let figures = format!(
        "measured: burn {:.3} s of CPU, nap {:.3} s asleep ({:.1}% burning); profile: on-cpu in burn {:.3} s, off-cpu in nap {:.3} s ({:.1}%)\n{}\n{top}",
        burnt_ns as f64 / 1e9,
        napped_ns as f64 / 1e9,
        measured * 100.0,
        on as f64 / 1e6,
        off as f64 / 1e6,
        sampled * 100.0,
        run.stderr
    );
    eprintln!("{figures}");
    // At 999 Hz, 0.6 s of burning (300 turns of 2 ms) is about 600 samples: 4 standard errors of its share are
    // under 3 points, so 5 points is the bound, not chance.
    assert!(on >= 300_000, "too little on-CPU time to judge: {figures}");
    assert!(
        (sampled - measured).abs() <= 0.05,
        "split off by more than 5 points: {figures}"
    );
    // The units are right: the time off the CPU in nap is the time the program slept, less
    // only what the sleep's own system call ran on the CPU.
    let napped_us = napped_ns / 1000;
    assert!(
        off <= napped_us + 1000 && off * 10 >= napped_us * 9,
        "off-cpu time in nap is not the time the program slept: {figures}"
    );
    assert!(
        asleep_on_cpu * 50 < off,
        "nap is hardly on the CPU: {figures}"
    );
    assert!(
        run.stderr.contains(" s of time (on-cpu "),
        "the summary says the time of each: {}",
        run.stderr
    );

    // pprof: one value of time, and an event label on each sample.
    let message = stackscope_profile::format::pprof::to_message(&profile);
    let string = |i: i64| message.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = message
        .sample_type
        .iter()
        .map(|t| (string(t.r#type), string(t.unit)))
        .collect();
    assert_eq!(types, [("wall", "nanoseconds")]);
    let labelled: Vec<&str> = message
        .sample
        .iter()
        .filter_map(|s| {
            s.label
                .iter()
                .find(|l| string(l.key) == "event")
                .map(|l| string(l.str))
        })
        .collect();
    assert_eq!(
        labelled.len(),
        message.sample.len(),
        "a sample without its event"
    );
    assert!(labelled.contains(&"on-cpu") && labelled.contains(&"off-cpu"));

    // Every writer takes a profile of time.
    let json = dir.path().join("profile.json");
    for format in stackscope_profile::format::Format::ALL.map(|f| f.name()) {
        let out = dir.path().join(format!("wall.{format}"));
        let args = [
            os("report"),
            json.as_os_str(),
            os("-o"),
            out.as_os_str(),
            os("--format"),
            os(format),
        ];
        let written = stackscope(dir.path(), args);
        written.assert_ok();
        let len = std::fs::metadata(&out).map_or(0, |m| m.len());
        assert!(len > 0, "{format}: nothing written: {}", written.stderr);
    }
}

/// `blocking blocks ROUNDS 100 30000 MIN_US`: short sleeps of 100 µs, long ones of 30 ms.
fn blocks_command<'a>(prog: &'a Path, rounds: &'a str, min_us: &'a str) -> Vec<&'a OsStr> {
    vec![
        prog.as_os_str(),
        os("blocks"),
        os(rounds),
        os("100"),
        os("30000"),
        os(min_us),
    ]
}

#[test]
fn off_cpu_stack_names_the_blocking_call_and_reaches_main() {
    let dir = tempdir();
    let prog = blocking();
    let (run, profile) = record_json(
        dir.path(),
        &["--off-cpu"],
        &blocks_command(&prog, "30", "5000"),
    );
    let account = account(&run.stdout);
    let top = top_stacks(&profile, 6);
    assert_eq!(profile.meta.event, "off-cpu");
    assert_eq!(profile.meta.count_unit, CountUnit::Microseconds);

    let long = micros(&profile, |f| user_has(f, "long_nap"));
    let whole = micros(&profile, |f| {
        let names: Vec<&str> = f.iter().map(|f| f.name.as_str()).collect();
        user_names(f).windows(2).any(|w| w == ["main", "long_nap"])
            && names.iter().any(|n| n.contains("nanosleep"))
            && f.iter()
                .any(|f| f.kind == FrameKind::Kernel && f.name == "schedule")
    });
    assert!(long > 0, "no time in long_nap:\n{top}");
    assert_eq!(
        whole, long,
        "long_nap's time is under main and the sleep's call into the scheduler:\n{top}"
    );
    let measured = said(&account, "long") / 1000;
    assert!(
        long <= measured + 1000 && long * 10 >= measured * 9,
        "long_nap off the CPU {long} µs, the program measured {measured} µs asleep:\n{top}"
    );
    let short = micros(&profile, |f| user_has(f, "short_nap"));
    assert!(
        short * 2 >= said(&account, "short") / 1000,
        "every short sleep counts without --min-block: {short} µs against {} measured:\n{top}",
        said(&account, "short") / 1000
    );
    assert!(
        run.stderr.contains(" s of off-cpu time in "),
        "the summary says the time: {}",
        run.stderr
    );
}

#[test]
fn min_block_leaves_out_shorter_blocks() {
    let dir = tempdir();
    let prog = blocking();
    // 10 ms: the long sleeps pass it, the 100 µs ones do not unless the machine stretches them
    // that far, which the program counts.
    let (run, profile) = record_json(
        dir.path(),
        &["--off-cpu", "--min-block", "10000"],
        &blocks_command(&prog, "30", "10000"),
    );
    let account = account(&run.stdout);
    let top = top_stacks(&profile, 6);
    let short = micros(&profile, |f| user_has(f, "short_nap"));
    let over = said(&account, "short_over") / 1000;
    assert!(
        short <= over + 100,
        "{short} µs of short sleeps counted, only {over} µs of them took 10 ms or more:\n{top}"
    );
    let long = micros(&profile, |f| user_has(f, "long_nap"));
    let measured = said(&account, "long") / 1000;
    assert!(
        long * 10 >= measured * 9,
        "long sleeps pass --min-block: {long} µs counted of {measured} µs:\n{top}"
    );
    assert!(
        run.stderr.contains("in blocks of 10000 µs or more"),
        "the announcement says the minimum: {}",
        run.stderr
    );

    // The flamegraph names the unit in its title and its counts.
    let svg = dir.path().join("blocked.svg");
    record(
        dir.path(),
        &svg,
        &["--off-cpu"],
        &blocks_command(&prog, "3", "10000"),
    )
    .assert_ok();
    let svg = std::fs::read_to_string(&svg).expect("svg written");
    assert!(svg.contains("(off-cpu time, µs)"), "no unit in the title");
    assert!(svg.contains(" µs, "), "no unit in the frames' counts");
}

/// `blocking loop`, running until dropped.
fn looping(prog: &Path) -> stackscope_testkit::Running {
    stackscope_testkit::Running::ready(Command::new(prog).arg("loop"))
}

/// Checks `pid`'s time asleep: with `-p` or `-L` (`only`), under main and nap, and nothing but
/// `pid`'s; with `-a`, in the kernel's nanosleep (a process running before the recording has
/// its first stacks walked by frame pointers until its unwind tables are loaded, which under
/// `-a` can take a good part of a second: see README).
fn check_attached(profile: &Profile, pid: u32, only: bool, context: &str) {
    let top = top_stacks(profile, 5);
    let of_pid = |s: &stackscope_profile::Sample| profile.thread(s.thread).pid == pid;
    let asleep: u64 = profile
        .samples
        .iter()
        .filter(|s| of_pid(s))
        .filter(|s| {
            let frames: Vec<&Frame> = profile.stack_frames(s.stack).collect();
            match only {
                true => user_names(&frames).windows(2).any(|w| w == ["main", "nap"]),
                false => frames
                    .iter()
                    .any(|f| f.kind == FrameKind::Kernel && f.name == "do_nanosleep"),
            }
        })
        .map(|s| s.count)
        .sum();
    // Asleep about 80% of a second, less the share a loaded machine keeps it waiting.
    assert!(asleep >= 200_000, "{context}: {asleep} µs asleep:\n{top}");
    if only {
        let all: u64 = profile
            .samples
            .iter()
            .filter(|s| of_pid(s))
            .map(|s| s.count)
            .sum();
        assert_eq!(
            all,
            profile.total_samples(),
            "{context}: other threads:\n{top}"
        );
    }
}

#[test]
fn off_cpu_follows_every_attached_target() {
    let dir = tempdir();
    let prog = blocking();
    let target = looping(&prog);
    let pid = target.0.id();
    let id = pid.to_string();
    for (options, only) in [
        (vec!["-p", &id], true),
        (vec!["-L", &id], true),
        (vec!["-a"], false),
    ] {
        let mut options = options.clone();
        options.extend(["--off-cpu", "-d", "1"]);
        let out = dir.path().join("attached.json");
        let run = record(dir.path(), &out, &options, &[]);
        run.assert_ok();
        check_attached(&read_json(&out), pid, only, &format!("{options:?}"));
    }
}

#[test]
fn what_does_not_combine_is_refused_in_one_line() {
    let dir = tempdir();
    let spin = workload("spin");
    let cases: [(&[&str], &str); 7] = [
        (&["--off-cpu", "--backend", "perf"], "eBPF backend only"),
        (&["--wall", "--backend", "perf"], "eBPF backend only"),
        (&["--wall", "--off-cpu"], "not both"),
        (&["--min-block", "100"], "--min-block is for --off-cpu"),
        (
            &["--wall", "--min-block", "100"],
            "--wall counts every block",
        ),
        (&["--off-cpu", "-F", "99"], "takes no timer"),
        (
            &["--off-cpu", "-e", "uprobe:libc:malloc"],
            "record them apart",
        ),
    ];
    for (options, expected) in cases {
        let out = dir.path().join("never.json");
        let run = record(dir.path(), &out, options, &[spin.as_os_str(), os("1")]);
        run.assert_one_line_error(&[expected]);
        assert!(!out.exists(), "{options:?}");
    }
}
