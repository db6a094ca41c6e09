//! `stackscope profile -f -p PID` (bcc's command line, eBPF source) on programs without frame
//! pointers, where bcc's frame-pointer stacks break: split.c (func_a/func_b about 30/70, main
//! in every stack) and rust_deep (leaf_a/leaf_b about 30/70 under 61 frames of recursion),
//! each checked against the split the program measured over the attach window. And
//! `record --backend bpf` and `record` each give the split their own run measured.

#![cfg(target_os = "linux")]

mod common;

use common::*;

/// `profile -f -F 999 -p PID SECS` on a running split workload: its folded lines, and the
/// split it measured from just before stackscope started to just after it ended.
fn profile_folded(name: &str, rounds: &str, secs: &str) -> (Vec<(Vec<String>, u64)>, Truth) {
    let dir = tempdir();
    let measured = Measured::new(dir.path(), name, rounds);
    let target = start_workload(name, &measured.args(), None);
    let pid = target.pid().to_string();
    let before = measured.wait_truth();
    let run = profile(dir.path(), &["-f", "-F", "999", "-p", &pid, secs]);
    let truth = measured.truth().since(&before);
    run.assert_ok();
    assert!(
        !run.stdout.starts_with("Sampling"),
        "-f prints no banner:\n{}",
        run.stdout
    );
    let lines = parse_folded(&run.stdout);
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert!(
        total >= 500,
        "only {total} samples:\n{}",
        top_folded(&lines, 5)
    );
    assert!(
        lines.iter().all(|l| l.0[0] == name),
        "every line starts with the comm {name}:\n{}",
        run.stdout
    );
    // bcc's order: ascending counts.
    assert!(
        lines.windows(2).all(|w| w[0].1 <= w[1].1),
        "lines are not sorted by ascending count:\n{}",
        run.stdout
    );
    (lines, truth)
}

fn assert_folded_at_least(lines: &[(Vec<String>, u64)], name: &str, min: f64) {
    let got = folded_share_of(lines, name);
    assert!(
        got >= min,
        "share of {name}: {:.2}%, expected at least {:.0}%\n{}",
        got * 100.0,
        min * 100.0,
        top_folded(lines, 8)
    );
}

#[test]
fn c_without_frame_pointers_split_and_whole_stacks() {
    let _serial = serial();
    let (lines, truth) = profile_folded("split_nofp", "100000", "8");
    assert_split_folded(&lines, &truth);
    assert_folded_at_least(&lines, "main", 0.99);
}

#[test]
fn rust_release_split_and_whole_stacks() {
    let _serial = serial();
    let (lines, truth) = profile_folded("rust_deep", "100000", "8");
    assert_split_folded(&lines, &truth);
    assert_folded_at_least(&lines, "rust_deep::main", 0.99);
    let full_depth = folded_share(&lines, |frames| {
        frames.iter().filter(|f| *f == "rust_deep::descend").count() == 61
    });
    assert!(
        full_depth >= 0.99,
        "only {:.1}% of samples hold all 61 descend frames\n{}",
        full_depth * 100.0,
        top_folded(&lines, 3)
    );
}

#[test]
fn record_backend_bpf_matches_record() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "4000");
    let (_, perf) = record_json(dir.path(), &["-F", "999"], &split.command());
    let perf_truth = split.truth();
    let (run, bpf) = record_json(
        dir.path(),
        &["-F", "999", "--backend", "bpf"],
        &split.command(),
    );
    let bpf_truth = split.truth();

    assert_eq!(bpf.meta.source, "ebpf", "meta.source");
    assert_eq!(bpf.meta.command, split.command_line(), "meta.command");
    assert!(
        run.stderr.contains("stackscope: sampling"),
        "record announces sampling:\n{}",
        run.stderr
    );
    assert_min_samples(&bpf, 500);
    // The kernel timed the sampling program: it ran at least once per sample counted, and
    // took some time doing so.
    let cost = run
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("in-kernel sampling: "))
        .unwrap_or_else(|| panic!("no in-kernel cost line:\n{}", run.stderr));
    let runs: u64 = cost
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no run count in {cost:?}"));
    let samples: u64 = bpf.samples.iter().map(|s| s.count).sum();
    assert!(
        runs >= samples && !cost.contains(" 0.00 µs each"),
        "{samples} samples, but the kernel timed: {cost}"
    );
    // Each run against the split it measured: the two runs need not spend the same.
    assert_split_profile(&bpf, &bpf_truth);
    assert_split_profile(&perf, &perf_truth);
    assert_share_at_least(&bpf, "main", 0.99);
}

#[test]
fn record_backend_bpf_writes_every_format_and_keeps_the_exit_code() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("crasher");
    // crasher dies of SIGSEGV: stackscope exits 128 + 11, as with the perf backend.
    let out = dir.path().join("c.folded");
    let run = record(dir.path(), &out, &["--backend", "bpf"], &[prog.as_os_str()]);
    run.assert_exit(139, "128 + SIGSEGV");
    assert!(
        std::fs::read_to_string(&out).is_ok_and(|t| t.contains("crash_work")),
        "the profile of the crashed command names crash_work"
    );

    let split = workload("split_nofp");
    for name in ["p.svg", "p.txt", "p.folded", "p.json"] {
        let text = record_text(
            dir.path(),
            name,
            &["--backend", "bpf"],
            &[split.as_os_str()],
        );
        assert!(
            text.contains("func_b"),
            "{name} does not name func_b:\n{}",
            &text[..text.len().min(2000)]
        );
    }
}
