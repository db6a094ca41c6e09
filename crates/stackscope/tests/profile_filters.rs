//! What `stackscope profile` keeps: only the given processes (-p) and CPU (-C) while other
//! busy processes run, and, when the kernel's stack storage overflows, bcc's markers and
//! warning with a count that matches what is shown.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use std::collections::HashMap;

/// Samples per `(comm, pid)` in bcc text output.
fn samples_by_process(text: &str) -> HashMap<(String, u32), u64> {
    let mut by = HashMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("    -                ") else {
            continue;
        };
        let (comm, pid) = rest.rsplit_once(" (").expect("`comm (pid)`");
        let pid: u32 = pid.trim_end_matches(')').parse().expect("pid");
        let count: u64 = lines[i + 1].trim().parse().expect("count line");
        *by.entry((comm.to_string(), pid)).or_default() += count;
    }
    by
}

#[test]
fn pid_filter_excludes_other_busy_processes() {
    let _serial = serial();
    let dir = tempdir();
    let wanted = start_workload("split_nofp", &["40000"], None);
    let other = start_workload("spin", &["60"], None);
    let run = profile(
        dir.path(),
        &["-F", "499", "-p", &wanted.pid().to_string(), "3"],
    );
    run.assert_ok();
    let by = samples_by_process(&run.stdout);
    let mine = by
        .get(&("split_nofp".to_string(), wanted.pid()))
        .copied()
        .unwrap_or(0);
    assert!(mine >= 50, "only {mine} samples of the wanted pid: {by:?}");
    assert_eq!(
        by.len(),
        1,
        "samples of other processes (spin is {}): {by:?}",
        other.pid()
    );

    // Both, as a comma list.
    let both = format!("{},{}", wanted.pid(), other.pid());
    let run = profile(dir.path(), &["-F", "499", "-p", &both, "3"]);
    run.assert_ok();
    assert!(
        run.stdout.starts_with(&format!(
            "Sampling at 499 Hertz of PID [{}, {}] by user + kernel stack for 3 secs.",
            wanted.pid(),
            other.pid()
        )),
        "{}",
        run.stdout
    );
    let by = samples_by_process(&run.stdout);
    assert_eq!(by.len(), 2, "{by:?}");
    assert!(
        by.contains_key(&("spin".to_string(), other.pid())),
        "{by:?}"
    );
}

#[test]
fn cpu_filter_keeps_one_cpu() {
    let _serial = serial();
    let dir = tempdir();
    let on0 = start_workload("spin", &["60"], Some(0));
    let on1 = start_workload("split_nofp", &["40000"], Some(1));
    let pids = format!("{},{}", on0.pid(), on1.pid());
    for (cpu, kept, dropped) in [("1", "split_nofp", "spin"), ("0", "spin", "split_nofp")] {
        let run = profile(
            dir.path(),
            &["-f", "-F", "499", "-C", cpu, "-p", &pids, "3"],
        );
        run.assert_ok();
        let lines = parse_folded(&run.stdout);
        let kept_samples: u64 = lines.iter().filter(|l| l.0[0] == kept).map(|l| l.1).sum();
        assert!(
            kept_samples >= 50,
            "-C {cpu}: only {kept_samples} samples of {kept}\n{}",
            top_folded(&lines, 5)
        );
        assert!(
            lines.iter().all(|l| l.0[0] != dropped),
            "-C {cpu}: samples of {dropped}, pinned to the other CPU\n{}",
            top_folded(&lines, 5)
        );
    }

    // The whole system on one CPU: the process pinned elsewhere never shows.
    let run = profile(dir.path(), &["-f", "-F", "499", "-C", "1", "3"]);
    run.assert_ok();
    let lines = parse_folded(&run.stdout);
    assert!(
        lines.iter().any(|l| l.0[0] == "split_nofp") && lines.iter().all(|l| l.0[0] != "spin"),
        "-C 1 on the whole system\n{}",
        top_folded(&lines, 8)
    );
}

/// The `WARNING: N stack traces could not be displayed.` line and its N, if any.
fn missed_warning(stderr: &str) -> Option<(u64, &str)> {
    stderr.lines().find_map(|l| {
        let rest = l.strip_prefix("WARNING: ")?;
        let (n, tail) = rest.split_once(" stack traces could not be displayed.")?;
        Some((n.parse().ok()?, tail))
    })
}

#[test]
fn stack_storage_overflow_is_marked_and_counted() {
    let _serial = serial();
    let dir = tempdir();
    let target = start_workload("manystacks", &["60"], None);
    let pid = target.pid().to_string();

    // Hundreds of distinct stacks, room for 16: most cannot be stored.
    let run = profile(
        dir.path(),
        &["-F", "999", "--stack-storage-size", "16", "-p", &pid, "3"],
    );
    run.assert_ok();
    let markers = run
        .stdout
        .lines()
        .filter(|l| *l == "    [Missed User Stack]" || *l == "    [Missed Kernel Stack]")
        .count() as u64;
    let Some((n, tail)) = missed_warning(&run.stderr) else {
        panic!("no storage warning; stderr:\n{}", run.stderr);
    };
    assert!(markers > 0, "no [Missed ...] entries:\n{}", run.stdout);
    assert_eq!(
        n, markers,
        "the warning's count is the number of [Missed ...] entries shown"
    );
    assert_eq!(
        tail, " Consider increasing --stack-storage-size.",
        "{}",
        run.stderr
    );

    // Folded: the same count of markers, each where its half of the stack would be.
    let run = profile(
        dir.path(),
        &[
            "-f",
            "-F",
            "999",
            "--stack-storage-size",
            "16",
            "-p",
            &pid,
            "3",
        ],
    );
    run.assert_ok();
    let lines = parse_folded(&run.stdout);
    let mut marked = 0;
    for (frames, _) in &lines {
        for (i, frame) in frames.iter().enumerate() {
            match frame.as_str() {
                "[Missed User Stack]" => assert_eq!(i, 1, "user marker at the root: {frames:?}"),
                "[Missed Kernel Stack]" => {
                    assert_eq!(i, frames.len() - 1, "kernel marker at the leaf: {frames:?}")
                }
                _ => continue,
            }
            marked += 1;
        }
    }
    assert!(marked > 0, "{}", top_folded(&lines, 5));
    assert_eq!(
        missed_warning(&run.stderr).map(|w| w.0),
        Some(marked),
        "{}",
        run.stderr
    );

    // With bcc's default storage the same stacks all fit: no marker, no warning.
    let run = profile(dir.path(), &["-F", "999", "-p", &pid, "3"]);
    run.assert_ok();
    assert!(!run.stdout.contains("[Missed"), "{}", run.stdout);
    assert!(missed_warning(&run.stderr).is_none(), "{}", run.stderr);
    assert!(run.stdout.contains("    down_a\n"), "{}", run.stdout);
}

#[test]
fn count_map_overflow_keeps_what_fits_and_warns() {
    let _serial = serial();
    let dir = tempdir();
    let target = start_workload("manystacks", &["60"], None);
    let pid = target.pid().to_string();

    // Hundreds of distinct stacks, room for 8 counted keys: the first 8 keys are counted, the
    // samples of every other stack are dropped, and bcc's warning says so.
    let run = profile(
        dir.path(),
        &[
            "-f",
            "-F",
            "999",
            "--hash-storage-size",
            "8",
            "-p",
            &pid,
            "3",
        ],
    );
    run.assert_ok();
    let lines = parse_folded(&run.stdout);
    assert!(
        !lines.is_empty() && lines.len() <= 8,
        "{} folded lines from a count map of 8 keys:\n{}",
        lines.len(),
        top_folded(&lines, 10)
    );
    let counted: u64 = lines.iter().map(|l| l.1).sum();
    assert!(
        run.stderr
            .contains("WARNING: hash table full. Consider increasing --hash-storage-size."),
        "no hash table warning; stderr:\n{}",
        run.stderr
    );

    // With bcc's default size every stack is counted: more lines, more samples, no warning.
    let run = profile(dir.path(), &["-f", "-F", "999", "-p", &pid, "3"]);
    run.assert_ok();
    let all = parse_folded(&run.stdout);
    let all_counted: u64 = all.iter().map(|l| l.1).sum();
    assert!(
        all.len() > 8 && all_counted > counted,
        "default storage: {} lines, {all_counted} samples; with 8 keys: {counted} samples",
        all.len()
    );
    assert!(!run.stderr.contains("hash table full"), "{}", run.stderr);
}
