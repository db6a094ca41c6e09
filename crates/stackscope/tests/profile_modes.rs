//! bcc profile's modes and layouts on syscalls.c, which spends most of its time in read() of
//! /dev/zero (perf 6.1: kernel frames in 96% of samples, main in all): kernel-only (-K),
//! user-only (-U), the user/kernel delimiter (-d) and kernel annotations (-a) in folded and
//! text output, the banner, and Ctrl-C ending a run that has no duration.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KERNEL_SUFFIX: &str = "_[k]";

fn is_marker(frame: &str) -> bool {
    frame.starts_with('[') && frame.ends_with(']')
}

/// `profile ARGS -p PID 3` on a running syscalls.c.
fn profile_syscalls(args: &[&str]) -> (Run, u32) {
    let dir = tempdir();
    let target = start_workload("syscalls", &["100000000"], None);
    let pid = target.pid().to_string();
    let mut all = args.to_vec();
    all.extend_from_slice(&["-F", "499", "-p", &pid, "3"]);
    let run = profile(dir.path(), &all);
    run.assert_ok();
    (run, target.pid())
}

#[test]
fn kernel_stacks_only() {
    let _serial = serial();
    let (run, _) = profile_syscalls(&["-K", "-a", "-f"]);
    let lines = parse_folded(&run.stdout);
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert!(total >= 300, "{}", top_folded(&lines, 5));
    for (frames, _) in &lines {
        assert!(
            frames[1..]
                .iter()
                .all(|f| f.ends_with(KERNEL_SUFFIX) || is_marker(f)),
            "a user frame under -K: {frames:?}"
        );
    }
    let kernel = folded_share(&lines, |f| f.len() > 1);
    assert!(
        kernel >= 0.85,
        "kernel stacks in {kernel:.3} of samples\n{}",
        top_folded(&lines, 5)
    );
    let read = folded_share(&lines, |f| f.iter().any(|x| x == "ksys_read_[k]"));
    assert!(
        read >= 0.80,
        "ksys_read in {read:.3} of samples\n{}",
        top_folded(&lines, 5)
    );
}

#[test]
fn user_stacks_only() {
    let _serial = serial();
    let (run, _) = profile_syscalls(&["-U", "-a", "-f"]);
    let lines = parse_folded(&run.stdout);
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert!(total >= 300, "{}", top_folded(&lines, 5));
    assert!(
        !run.stdout.contains(KERNEL_SUFFIX),
        "a kernel frame under -U:\n{}",
        top_folded(&lines, 5)
    );
    assert!(
        folded_share_of(&lines, "main") >= 0.99 && folded_share_of(&lines, "kernel_work") >= 0.99,
        "user stacks not whole:\n{}",
        top_folded(&lines, 5)
    );
}

#[test]
fn delimited_annotated_folded() {
    let _serial = serial();
    let (run, _) = profile_syscalls(&["-adf"]);
    let lines = parse_folded(&run.stdout);
    let mut both = 0;
    for (frames, count) in &lines {
        let delimiters = frames.iter().filter(|f| *f == "-").count();
        let kernel = frames.iter().filter(|f| f.ends_with(KERNEL_SUFFIX)).count();
        let user_side: Vec<&String> = frames[1..]
            .iter()
            .take_while(|f| !f.ends_with(KERNEL_SUFFIX) && *f != "-")
            .collect();
        let has_user = user_side.iter().any(|f| !is_marker(f));
        if kernel > 0 && has_user {
            // comm;user root..leaf;-;kernel root..leaf
            assert_eq!(delimiters, 1, "one `-` between user and kernel: {frames:?}");
            let at = frames.iter().position(|f| f == "-").unwrap();
            assert!(
                frames[at + 1..].iter().all(|f| f.ends_with(KERNEL_SUFFIX)),
                "only kernel frames after `-`: {frames:?}"
            );
            assert!(
                frames[1..at].iter().all(|f| !f.ends_with(KERNEL_SUFFIX)),
                "no kernel frame before `-`: {frames:?}"
            );
            both += count;
        } else {
            assert_eq!(
                delimiters, 0,
                "`-` only where a stack has both halves: {frames:?}"
            );
        }
    }
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert!(
        both as f64 >= 0.80 * total as f64,
        "only {both} of {total} samples have user and kernel frames\n{}",
        top_folded(&lines, 5)
    );
}

/// bcc's text layout: per stack, kernel frames leaf first, `--` under -d, user frames leaf
/// first, `    -                comm (pid)`, `        COUNT`, a blank line.
#[test]
fn delimited_text_layout_and_banner() {
    let _serial = serial();
    let (run, pid) = profile_syscalls(&["-d"]);
    let banner =
        format!("Sampling at 499 Hertz of PID [{pid}] by user + kernel stack for 3 secs.\n\n");
    assert!(
        run.stdout.starts_with(&banner),
        "stdout does not start with the banner and a blank line {banner:?}:\n{}",
        &run.stdout[..run.stdout.len().min(500)]
    );
    let who = format!("    -                syscalls ({pid})");
    let (mut total, mut delimited, mut counts) = (0u64, 0u64, Vec::new());
    for block in run.stdout[banner.len()..]
        .split("\n\n")
        .filter(|b| !b.is_empty())
    {
        let lines: Vec<&str> = block.lines().collect();
        assert!(lines.len() >= 2, "short block:\n{block}");
        let count_line = lines[lines.len() - 1];
        assert!(
            count_line.starts_with("        ") && count_line.trim().parse::<u64>().is_ok(),
            "count line {count_line:?} in:\n{block}"
        );
        let count: u64 = count_line.trim().parse().unwrap();
        assert_eq!(
            lines[lines.len() - 2],
            who,
            "the `- comm (pid)` line in:\n{block}"
        );
        let frames = &lines[..lines.len() - 2];
        assert!(
            frames
                .iter()
                .all(|l| l.starts_with("    ") && !l[4..].starts_with(' ')),
            "frames are indented by four spaces:\n{block}"
        );
        if let Some(at) = frames.iter().position(|l| *l == "    --") {
            delimited += count;
            // User frames, leaf first, end at the root: main sits below the delimiter.
            assert!(
                frames[at + 1..].iter().any(|l| l.trim() == "main"),
                "main is not among the user frames after `--`:\n{block}"
            );
            assert!(
                frames[..at].iter().all(|l| l.trim() != "main"),
                "main among the kernel frames before `--`:\n{block}"
            );
        }
        total += count;
        counts.push(count);
    }
    assert!(total >= 300, "only {total} samples:\n{}", run.stdout);
    assert!(
        counts.windows(2).all(|w| w[0] <= w[1]),
        "blocks not sorted by ascending count: {counts:?}"
    );
    assert!(
        delimited as f64 >= 0.80 * total as f64,
        "only {delimited} of {total} samples delimited:\n{}",
        &run.stdout[..run.stdout.len().min(3000)]
    );
}

#[test]
fn banners_name_rate_filter_stacks_and_cpu() {
    let _serial = serial();
    let dir = tempdir();
    let run = profile(dir.path(), &["-F", "99", "-U", "-C", "0", "-I", "1"]);
    run.assert_ok();
    assert!(
        run.stdout.starts_with(
            "Sampling at 99 Hertz of all threads by user stack on CPU#0 for 1 secs.\n\n"
        ),
        "{}",
        run.stdout
    );
    let run = profile(dir.path(), &["-c", "5000000", "-K", "-L", "1", "1"]);
    run.assert_ok();
    assert!(
        run.stdout.starts_with(
            "Sampling at every 5000000 events of TID [1] by kernel stack for 1 secs.\n\n"
        ),
        "{}",
        run.stdout
    );
}

/// Without a duration, profile samples until Ctrl-C, then prints what it collected and exits 0.
#[test]
fn ctrl_c_ends_sampling_and_prints_the_profile() {
    let _serial = serial();
    let dir = tempdir();
    let target = start_workload("split_nofp", &["40000"], None);
    let pid = target.pid().to_string();
    let out_path = dir.path().join("stdout");
    let mut child = Command::new(stackscope_bin())
        .args(["profile", "-F", "499", "-p", &pid])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stackscope");
    let banner = format!(
        "Sampling at 499 Hertz of PID [{pid}] by user + kernel stack... Hit Ctrl-C to end.\n"
    );
    // Ends stackscope past the deadline, returning its status and stderr.
    let finish = |mut child: std::process::Child, started: Instant| {
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!("stackscope did not finish within {DEADLINE:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
        (status, stderr)
    };
    let started = Instant::now();
    while !std::fs::read_to_string(&out_path)
        .unwrap_or_default()
        .starts_with(&banner)
    {
        if started.elapsed() > Duration::from_secs(60) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let (_, stderr) = finish(child, started);
            panic!(
                "no banner; stdout {:?}, stderr:\n{stderr}",
                std::fs::read_to_string(&out_path)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) on a child we started and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let (status, stderr) = finish(child, Instant::now());
    assert!(
        status.success(),
        "exit status {status:?} after Ctrl-C; stderr:\n{stderr}"
    );
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let body = stdout.strip_prefix(&banner).unwrap();
    assert!(
        body.starts_with('\n'),
        "a blank line after sampling, as bcc:\n{stdout}"
    );
    assert!(
        body.contains(&format!("    -                split_nofp ({pid})\n"))
            && body.contains("    func_b\n"),
        "the profile collected before Ctrl-C:\n{stdout}"
    );
}
