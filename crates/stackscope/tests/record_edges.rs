//! Edges of `stackscope record`: stacks deeper than the stack copy, JIT code named from a
//! perf map, targets that go away mid-run (an attached process exiting, a launched command
//! killed), and an output path that cannot be written.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use stackscope_profile::{FrameKind, Profile};
use std::process::Command;
use std::time::{Duration, Instant};

const TRUNCATED: &str = "[truncated]";

/// Samples (by count) whose stack holds a `[truncated]` frame anywhere.
fn truncated_samples(profile: &Profile) -> u64 {
    profile
        .samples
        .iter()
        .filter(|s| profile.stack_frames(s.stack).any(|f| f.name == TRUNCATED))
        .map(|s| s.count)
        .sum()
}

#[test]
fn short_stack_copy_marks_truncated_stacks_at_the_root() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("rust_deep");
    // About a second of work per run.
    let command = [prog.as_os_str(), os("2000")];

    // 61 frames of recursion need well over 1 KiB of stack: every sample is cut short.
    let (_, short) = record_json(dir.path(), &["--stack-size", "1024"], &command);
    assert_min_samples(&short, 300);
    let at_root = share(&short, |frames| {
        frames
            .first()
            .is_some_and(|f| f.name == TRUNCATED && f.kind == FrameKind::Marker)
    });
    assert!(
        at_root >= 0.9,
        "only {:.1}% of samples start with a `[truncated]` marker frame\n{}",
        at_root * 100.0,
        top_stacks(&short, 5)
    );
    // The marker stands for the missing callers: it is never anywhere but at the root.
    let elsewhere = share(&short, |frames| {
        frames.iter().skip(1).any(|f| f.name == TRUNCATED)
    });
    assert_eq!(
        elsewhere,
        0.0,
        "`[truncated]` below the root\n{}",
        top_stacks(&short, 5)
    );
    // What was copied still unwinds: the leaves are there.
    let leaves = share(&short, |frames| {
        has_frame(frames, "rust_deep::leaf_a") || has_frame(frames, "rust_deep::leaf_b")
    });
    assert!(
        leaves >= 0.95,
        "the leaves are in only {:.1}% of truncated samples\n{}",
        leaves * 100.0,
        top_stacks(&short, 5)
    );
    assert_eq!(
        short.meta.unwind.truncated,
        truncated_samples(&short),
        "meta.unwind.truncated against samples with the marker\n{}",
        top_stacks(&short, 5)
    );
    assert!(short.meta.unwind.truncated > 0);
    assert!(
        short.meta.hints.iter().any(|h| h.contains("--stack-size")),
        "no hint names --stack-size: {:?}",
        short.meta.hints
    );

    // The default copy holds the whole stack.
    let (_, whole) = record_json(dir.path(), &[], &command);
    assert_min_samples(&whole, 300);
    assert_eq!(
        truncated_samples(&whole),
        0,
        "`[truncated]` with the default stack size\n{}",
        top_stacks(&whole, 5)
    );
    assert!(
        !whole.frames.iter().any(|f| f.name == TRUNCATED),
        "a `[truncated]` frame with the default stack size"
    );
    assert_eq!(whole.meta.unwind.truncated, 0, "{:?}", whole.meta.unwind);
    assert_share_at_least(&whole, "rust_deep::main", 0.99);
}

#[test]
fn jit_code_is_named_from_the_perf_map_and_unwinds_to_main() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("jit");
    let out = dir.path().join("profile.json");
    let run = record(dir.path(), &out, &[], &[prog.as_os_str(), os("4000")]);
    // The workload prints `pid PID` before writing its map; clean up before any assertion.
    let pid = run.printed_pid("pid ");
    let map = PerfMap(pid.map(|p| format!("/tmp/perf-{p}.map").into()));
    let pid = pid.unwrap_or_else(|| {
        panic!(
            "no `pid PID` line in the command's stdout:\n{}\nstderr:\n{}",
            run.stdout, run.stderr
        )
    });
    run.assert_ok();
    let map_path = map.0.as_ref().unwrap();
    assert!(
        map_path.exists(),
        "the workload wrote no {}",
        map_path.display()
    );

    let profile = read_json(&out);
    assert_min_samples(&profile, 300);
    assert!(
        profile.threads.iter().all(|t| t.pid == pid),
        "samples from other processes: {:?}",
        profile.threads
    );
    assert_share_at_least(&profile, "jit_hot_loop", 0.9);
    // The JIT code has no unwind info: past it, only its frame pointer leads on, through
    // run_jit, to main.
    let through = share(&profile, |frames| {
        let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
        let main = names.iter().position(|&n| n == "main");
        let run_jit = names.iter().position(|&n| n == "run_jit");
        let jit = names.iter().position(|&n| n == "jit_hot_loop");
        matches!((main, run_jit, jit), (Some(m), Some(r), Some(j)) if m < r && r < j)
    });
    assert!(
        through >= 0.9,
        "only {:.1}% of samples run main -> run_jit -> jit_hot_loop\n{}",
        through * 100.0,
        top_stacks(&profile, 8)
    );
}

#[test]
fn attached_process_exiting_ends_the_recording() {
    let _serial = serial();
    let dir = tempdir();
    let spin = workload("spin");
    // Spins until the second boundary after next: between 1 and 2 s.
    let target = Background::spawn(Command::new(&spin).arg("2"));
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let (run, profile) = record_json(
        dir.path(),
        &["-p", &target.pid().to_string(), "-d", "10"],
        &[],
    );
    let wall = start.elapsed();
    assert!(
        wall < Duration::from_secs(5),
        "stackscope took {wall:?} with -d 10 for a target that exits within 2 s\n{}",
        run.stderr
    );
    assert!(
        profile.meta.duration_secs < 4.0,
        "duration_secs {} for a target that exits within 2 s",
        profile.meta.duration_secs
    );
    assert_min_samples(&profile, 200);
    assert_share_at_least(&profile, "spin_work", 0.99);
}

/// The pid of the child of `parent` whose `comm` is `comm` (after exec), once there is one.
fn wait_for_child(parent: u32, comm: &str) -> u32 {
    wait_until(&format!("no child `{comm}` of {parent} appeared"), || {
        let mut entries = std::fs::read_dir("/proc").expect("read /proc").flatten();
        entries.find_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let (head, rest) = stat.rsplit_once(") ")?;
            let name = head.split_once(" (").map(|h| h.1);
            let ppid = rest.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok());
            (ppid == Some(parent) && name == Some(comm)).then_some(pid)
        })
    })
}

#[test]
fn command_killed_by_sigkill_gives_a_profile_and_exit_137() {
    let _serial = serial();
    let dir = tempdir();
    let spin = workload("spin");
    let out = dir.path().join("profile.json");
    let start = Instant::now();
    let child = spawn_piped(&mut record_command(
        dir.path(),
        &out,
        &[],
        &[spin.as_os_str(), os("30")],
    ));
    let target = wait_for_child(child.id(), "spin");
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: kill(2) on the pid of the workload stackscope launched, still its unreaped child.
    let rc = unsafe { libc::kill(target as i32, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill {target}: {}", std::io::Error::last_os_error());
    let run = wait_output(child, start);

    assert!(
        run.wall < Duration::from_secs(10),
        "stackscope took {:?} to stop after its command was killed",
        run.wall
    );
    run.assert_exit(137, "128 + SIGKILL");
    let profile = read_json(&out);
    assert_min_samples(&profile, 300);
    assert!(
        profile.threads.iter().all(|t| t.pid == target),
        "samples from other processes than the killed {target}: {:?}",
        profile.threads
    );
    assert_share_at_least(&profile, "spin_work", 0.99);
}

#[test]
fn output_into_a_missing_directory_fails_before_the_command_runs() {
    let _serial = serial();
    let dir = tempdir();
    let missing = dir.path().join("no-such-dir");
    let out = missing.join("out.json");
    let marker = dir.path().join("command-ran");
    let run = record(dir.path(), &out, &[], &[os("touch"), marker.as_os_str()]);
    run.assert_one_line_error(&["no-such-dir"]);
    assert!(
        !marker.exists(),
        "the command ran although the output could not be written"
    );
    assert!(
        !missing.exists(),
        "stackscope created {}",
        missing.display()
    );
}

#[test]
fn perf_backend_flags_are_refused_with_the_bpf_backend() {
    let dir = tempdir();
    for (flag, value) in [("--unwind", "fp"), ("--stack-size", "4096")] {
        let run = stackscope(
            dir.path(),
            [
                "record",
                "--backend",
                "bpf",
                flag,
                value,
                "-o",
                "x.svg",
                "--",
                "true",
            ],
        );
        run.assert_one_line_error(&[flag, "--backend perf"]);
    }
    assert!(!dir.path().join("x.svg").exists());
}
