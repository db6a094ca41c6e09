//! `stackscope report perf.data` on files the installed `perf record` writes in the test:
//! DWARF and frame-pointer recordings of split.c (func_a/func_b about 30/70 as the program
//! measures it, main in every stack),
//! several events in one file, a system-wide recording, an optimised Rust program whose
//! inlined helper must come out as an inlined frame, a binary rebuilt or gone since the
//! recording (read from perf's build-id cache), and damaged files.

#![cfg(target_os = "linux")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use stackscope_profile::Profile;

/// `stackscope report DATA -o DIR/NAME`, which must succeed; returns the output's path.
fn report_ok(dir: &Path, data: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    report(dir, data, &out).assert_ok();
    out
}

fn report_folded(dir: &Path, data: &Path) -> Vec<(Vec<String>, u64)> {
    let out = report_ok(dir, data, "x.folded");
    parse_folded(&std::fs::read_to_string(out).expect("folded output"))
}

fn report_json(dir: &Path, data: &Path) -> Profile {
    read_json(&report_ok(dir, data, "x.json"))
}

/// Asserts the split the program measured (when it is testable: see [`until_testable`]) and
/// main under every split sample, among the lines of `comm`.
fn assert_split(lines: &[(Vec<String>, u64)], comm: &str, truth: &Truth) {
    let own: Vec<(Vec<String>, u64)> = lines.iter().filter(|l| l.0[0] == comm).cloned().collect();
    let total: u64 = own.iter().map(|l| l.1).sum();
    assert!(
        total >= 500,
        "only {total} samples of {comm}\n{}",
        top_folded(lines, 8)
    );
    if truth.testable() {
        assert_split_folded(&own, truth);
    }
    let main = folded_share_of(&own, "main");
    let detail = top_folded(&own, 8);
    assert!(main >= 0.99, "main in only {main:.3} of samples\n{detail}");
}

#[test]
fn dwarf_recording_gives_the_split_with_whole_stacks() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "4000");
    let data = perf_record(
        dir.path(),
        &["-F", "999", "--call-graph", "dwarf"],
        &split.command(),
    );
    assert_split(
        &report_folded(dir.path(), &data),
        "split_nofp",
        &split.truth(),
    );

    let profile = report_json(dir.path(), &data);
    let meta = &profile.meta;
    assert_eq!(meta.source, "perf.data");
    assert_eq!(meta.frequency_hz, Some(999), "meta.frequency_hz");
    assert!(!meta.event.is_empty(), "no event name");
    assert!(
        meta.command.first().is_some_and(|c| c.ends_with("perf"))
            && meta.command.iter().any(|a| a == "dwarf"),
        "command from the header: {:?}",
        meta.command
    );
    assert!(meta.duration_secs > 0.5, "duration {}", meta.duration_secs);
    assert_user_stacks_complete(&profile);
    frame_with_source(&profile, "func_b", "split_nofp", "split.c");
}

#[test]
fn frame_pointer_recording_gives_the_split_with_whole_stacks() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_fp", "4000");
    let data = perf_record(dir.path(), &["-F", "999", "-g"], &split.command());
    assert_split(
        &report_folded(dir.path(), &data),
        "split_fp",
        &split.truth(),
    );
}

#[test]
fn of_several_events_the_cpu_clock_one_is_reported() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_fp", "4000");
    let data = perf_record(
        dir.path(),
        &["-e", "task-clock", "-e", "cpu-clock", "-F", "999", "-g"],
        &split.command(),
    );
    let profile = report_json(dir.path(), &data);
    assert_eq!(profile.meta.event, "cpu-clock");
    assert_split_profile(&profile, &split.truth());
    assert_share_at_least(&profile, "main", 0.99);
}

#[test]
fn system_wide_recording_holds_the_workload_among_other_tasks() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_fp", "4000");
    let data = perf_record(dir.path(), &["-a", "-F", "999", "-g"], &split.command());
    let lines = report_folded(dir.path(), &data);
    assert_split(&lines, "split_fp", &split.truth());
    // Two CPUs, one busy with the workload: the other ran something else or idled.
    assert!(
        lines.iter().any(|l| l.0[0] != "split_fp"),
        "a system-wide recording with the workload alone\n{}",
        top_folded(&lines, 8)
    );
}

#[test]
fn rust_dwarf_recording_has_inlined_frames() {
    let _serial = serial();
    let dir = tempdir();
    let deep = Measured::new(dir.path(), "rust_deep", "1500");
    let data = perf_record(
        dir.path(),
        &["-F", "999", "--call-graph", "dwarf,32000"],
        &deep.command(),
    );
    let profile = report_json(dir.path(), &data);
    assert_min_samples(&profile, 200);
    assert_split_profile(&profile, &deep.truth());
    assert_inlined_helper_under_leaves(&profile, 0.9);
}

#[test]
fn damaged_perf_data_is_a_one_line_error_naming_the_file() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let prog = workload("split_fp");
    let data = perf_record(d, &["-F", "999", "-g"], &[prog.as_os_str()]);
    let bytes = std::fs::read(&data).unwrap();
    let data_offset = u64::from_le_bytes(bytes[40..48].try_into().unwrap()) as usize;

    let mut zeroed = bytes.clone();
    // A record header of size 0 where the first record should be.
    zeroed[data_offset..data_offset + 64].fill(0);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated.data", bytes[..bytes.len() / 2].to_vec()),
        ("magic-only.data", b"PERFILE2".to_vec()),
        ("zeroed.data", zeroed),
    ];
    for (name, content) in cases {
        let input = d.join(name);
        std::fs::write(&input, content).unwrap();
        let out = d.join(format!("{name}.folded"));
        report(d, &input, &out).assert_one_line_error(&[name, "byte"]);
        assert!(!out.exists(), "output written from damaged {name}");
    }
}

#[test]
fn other_profiles_still_read_as_before() {
    let dir = tempdir();
    let d = dir.path();
    let input = d.join("in.folded");
    std::fs::write(&input, "prog;main;work 7\nprog;main;rest 3\n").unwrap();
    let out = report_ok(d, &input, "out.folded");
    let lines = parse_folded(&std::fs::read_to_string(out).unwrap());
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert_eq!(total, 10, "{lines:?}");
    assert!(
        (folded_share_of(&lines, "work") - 0.7).abs() < 1e-9,
        "{lines:?}"
    );
}

/// Builds split.c into `prog` with a build-id no other binary in perf's cache has, so that the
/// cache's entry for it is this file's.
fn build_with_own_build_id(prog: &Path) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    stackscope_testkit::run(
        Command::new("gcc")
            .current_dir(workloads_src())
            .args(["-O2", "-g", "-fomit-frame-pointer", "split.c"])
            .arg(format!(
                "-Wl,--build-id=0x{:08x}{nanos:032x}",
                std::process::id()
            ))
            .arg("-o")
            .arg(prog),
    );
}

#[test]
fn a_binary_rebuilt_since_the_recording_is_read_from_perfs_build_id_cache() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let prog = d.join("split_rebuilt");
    // The workload runs again when the machine's load left its truth too loose to test
    // against; each run is a build of its own, recorded, then rebuilt.
    let (data, truth) = until_testable(|| {
        build_with_own_build_id(&prog);
        let split = Measured::of(prog.clone(), d, "4000");
        let data =
            perf_record_caching(d, &["-F", "999", "--call-graph", "dwarf"], &split.command());
        // Rebuilt differently: other code at other addresses, another build-id.
        stackscope_testkit::run(
            Command::new("gcc")
                .current_dir(workloads_src())
                .args(["-O0", "-g", "split.c", "-o"])
                .arg(&prog),
        );
        (data, split.truth())
    });
    assert_split(&report_folded(d, &data), "split_rebuilt", &truth);
    let profile = report_json(d, &data);
    let func_b = frame_named(&profile, "func_b");
    assert_eq!(
        func_b.module.as_deref(),
        Some("split_rebuilt"),
        "{func_b:?}"
    );
}

#[test]
fn a_binary_gone_since_the_recording_is_read_from_perfs_build_id_cache() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let prog = d.join("split_gone");
    // As a file recorded on another machine is read with that machine's cache: the binary is
    // nowhere on this one but in the cache, found by the build-id the file's header lists.
    let (data, truth) = until_testable(|| {
        build_with_own_build_id(&prog);
        let split = Measured::of(prog.clone(), d, "4000");
        let data =
            perf_record_caching(d, &["-F", "999", "--call-graph", "dwarf"], &split.command());
        std::fs::remove_file(&prog).unwrap();
        (data, split.truth())
    });
    assert_split(&report_folded(d, &data), "split_gone", &truth);
    let profile = report_json(d, &data);
    let func_a = frame_named(&profile, "func_a");
    assert_eq!(func_a.module.as_deref(), Some("split_gone"), "{func_a:?}");
}

#[test]
fn lost_samples_are_counted_as_perf_counts_them() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("split_nofp");
    // Two pages of ring buffer for 4 KB stack copies at 4 kHz: perf falls behind and loses some.
    let data = perf_record(
        dir.path(),
        &["-m", "2", "-F", "4000", "--call-graph", "dwarf,4000"],
        &[prog.as_os_str()],
    );
    let mut cmd = Command::new("perf");
    cmd.arg("script")
        .arg("--show-lost-events")
        .arg("-F")
        .arg("tid")
        .arg("-i")
        .arg(&data);
    let script = run_with_deadline(cmd);
    let perf_lost: u64 = script
        .stdout
        .lines()
        .filter(|l| l.contains("PERF_RECORD_LOST "))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum();
    // perf keeps a second count, the event's own (LOST_SAMPLES), which `perf report --stats`
    // shows last, under the event; perf counts the larger of the two, as stackscope does.
    let mut cmd = Command::new("perf");
    cmd.args(["report", "--stats", "-i"]).arg(&data);
    let stats = run_with_deadline(cmd);
    let event_lost: u64 = stats
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("LOST_SAMPLES events:"))
        .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
        .next_back()
        .unwrap_or(0);
    let profile = report_json(dir.path(), &data);
    assert_eq!(
        profile.meta.lost_samples,
        perf_lost.max(event_lost),
        "lost samples (perf: {perf_lost} in LOST records, {event_lost} as the event counted)"
    );
    if perf_lost > 0 {
        assert!(
            profile.meta.hints.iter().any(|h| h.contains("lost")),
            "no hint on lost samples: {:?}",
            profile.meta.hints
        );
    }
}

#[test]
fn compressed_recording_gives_the_split() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_fp", "4000");
    // cargo-flamegraph's --compression-level passes -z to perf record.
    let data = perf_record(dir.path(), &["-z", "-F", "999", "-g"], &split.command());
    assert_split(
        &report_folded(dir.path(), &data),
        "split_fp",
        &split.truth(),
    );
}

#[test]
fn recording_written_to_a_pipe_gives_the_split() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let (data, truth) = until_testable(|| {
        let split = Measured::new(d, "split_fp", "4000");
        let data = d.join("pipe.data");
        let out = std::fs::File::create(&data).expect("create pipe.data");
        // What `perf record -o - ... | ...` writes: the pipe layout, whose records describe
        // the events.
        let status = Command::new("perf")
            .current_dir(d)
            .args(["record", "-N", "-F", "999", "-g", "-o", "-", "--"])
            .args(split.command())
            .stdout(out)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run perf record");
        assert!(status.success(), "perf record -o - failed: {status:?}");
        (data, split.truth())
    });
    let bytes = std::fs::read(&data).expect("read pipe.data");
    assert_eq!(bytes[8..16], 16u64.to_le_bytes(), "not the pipe layout");
    assert_split(&report_folded(d, &data), "split_fp", &truth);
    let profile = report_json(d, &data);
    assert_eq!(profile.meta.event, "cpu-clock");
    assert_eq!(profile.meta.frequency_hz, Some(999), "meta.frequency_hz");
    assert!(
        profile.meta.command.iter().any(|a| a == "-"),
        "command from the stream: {:?}",
        profile.meta.command
    );
}
