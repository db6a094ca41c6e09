//! What gets sampled and where samples are attributed: threads, forked children, a library
//! loaded after start-up, attaching by pid and tid, and one CPU of the whole system.
//! Ground truth from perf 6.1 on the same programs: threads 33/67 by tid, forker 1/3 per
//! process, lib_hot_function (libhot.so) in 99.9% of dlopen_main's samples.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use stackscope_profile::Profile;
use std::process::Command;
use std::time::{Duration, Instant};

/// Share of samples taken on threads satisfying `pred`.
fn thread_share(profile: &Profile, pred: impl Fn(&stackscope_profile::Thread) -> bool) -> f64 {
    let total = profile.total_samples() as f64;
    let hit: u64 = profile
        .samples
        .iter()
        .filter(|s| pred(profile.thread(s.thread)))
        .map(|s| s.count)
        .sum();
    hit as f64 / total
}

/// Asserts every sample whose stack holds `function` was taken on a thread matching `pred`.
fn assert_function_only_on(
    profile: &Profile,
    function: &str,
    pred: impl Fn(&stackscope_profile::Thread) -> bool,
) {
    for s in &profile.samples {
        let thread = profile.thread(s.thread);
        if profile.stack_frames(s.stack).any(|f| f.name == function) {
            assert!(
                pred(thread),
                "{function} sampled on the wrong thread {thread:?}"
            );
        }
    }
}

#[test]
fn threads_are_attributed_to_their_own_tid_and_comm() {
    let _serial = serial();
    let dir = tempdir();
    let threads = Measured::new(dir.path(), "threads", "2000");
    let (_, profile) = record_json(dir.path(), &[], &threads.command());
    assert_min_samples(&profile, 500);

    let a = profile.threads.iter().find(|t| t.comm == "worker_a");
    let b = profile.threads.iter().find(|t| t.comm == "worker_b");
    let (Some(a), Some(b)) = (a, b) else {
        panic!("no worker_a/worker_b threads: {:?}", profile.threads);
    };
    assert_ne!(a.tid, b.tid, "both workers on one tid");
    assert_eq!(a.pid, b.pid, "workers in different processes");
    assert_ne!(a.tid, a.pid, "worker_a reported as the main thread");
    assert_eq!(a.process_name, "threads", "process name of {a:?}");

    assert_function_only_on(&profile, "thread_a_work", |t| t.comm == "worker_a");
    assert_function_only_on(&profile, "thread_b_work", |t| t.comm == "worker_b");
    // Each worker's share of the samples is the share of CPU time it measured in its
    // function (about 1/3 and 2/3, as their work is).
    let truth = threads.truth();
    assert_split_profile(&profile, &truth);
    truth.assert_matches(
        profile.total_samples(),
        |name| match name {
            "thread_a_work" => thread_share(&profile, |t| t.tid == a.tid),
            _ => thread_share(&profile, |t| t.tid == b.tid),
        },
        || top_stacks(&profile, 6),
    );
}

#[test]
fn forked_children_are_attributed_to_their_own_pid() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("forker");
    let (run, profile) = record_json(dir.path(), &[], &[prog.as_os_str()]);
    assert_min_samples(&profile, 500);

    // The workload prints `parent PID`, `child1 PID`, `child2 PID`; stackscope passes the
    // command's stdout through.
    let pid_of = |role: &str| -> u32 {
        run.printed_pid(role).unwrap_or_else(|| {
            panic!(
                "no `{role} PID` line in the command's stdout:\n{}",
                run.stdout
            )
        })
    };
    let (parent, one, two) = (pid_of("parent "), pid_of("child1 "), pid_of("child2 "));

    assert_function_only_on(&profile, "parent_work", |t| t.pid == parent);
    assert_function_only_on(&profile, "child_one_work", |t| t.pid == one);
    assert_function_only_on(&profile, "child_two_work", |t| t.pid == two);
    for (function, pid) in [
        ("parent_work", parent),
        ("child_one_work", one),
        ("child_two_work", two),
    ] {
        assert_share(&profile, function, 1.0 / 3.0, 0.03);
        let by_pid = thread_share(&profile, |t| t.pid == pid);
        assert!(
            (by_pid - 1.0 / 3.0).abs() <= 0.03,
            "pid {pid} ({function}) has {by_pid:.3} of samples"
        );
    }
    assert_share_at_least(&profile, "main", 0.99);
}

#[test]
fn library_loaded_with_dlopen_is_named_with_its_module() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("dlopen_main");
    let lib = workload("libhot.so");
    let (_, profile) = record_json(dir.path(), &[], &[prog.as_os_str(), lib.as_os_str()]);
    assert_min_samples(&profile, 500);

    let in_lib = share(&profile, |frames| {
        frames
            .iter()
            .any(|f| f.name == "lib_hot_function" && f.module.as_deref() == Some("libhot.so"))
    });
    assert!(
        in_lib >= 0.97,
        "lib_hot_function (module libhot.so) in only {:.1}% of samples\n{}",
        in_lib * 100.0,
        top_stacks(&profile, 6)
    );
    // The library has no frame pointers: reaching main needs its CFI, found after dlopen.
    assert_share_at_least(&profile, "main", 0.99);
}

#[test]
fn attach_to_running_processes_by_pid_for_a_duration() {
    let _serial = serial();
    let dir = tempdir();
    let spin = workload("spin");
    let first = Background::spawn(Command::new(&spin).arg("30"));
    let second = Background::spawn(Command::new(&spin).arg("30"));
    // Let both get past exec, so their maps name the spin binary.
    std::thread::sleep(Duration::from_millis(300));
    let pids = format!("{},{}", first.pid(), second.pid());
    let start = Instant::now();
    let (run, profile) = record_json(dir.path(), &["-p", &pids, "-d", "2"], &[]);
    let wall = start.elapsed();
    assert!(
        wall < Duration::from_secs(15),
        "-d 2 took {wall:?} to stop\n{}",
        run.stderr
    );
    assert!(
        (1.5..=5.0).contains(&profile.meta.duration_secs),
        "duration_secs {} for -d 2",
        profile.meta.duration_secs
    );
    assert_min_samples(&profile, 300);
    for pid in [first.pid(), second.pid()] {
        let share = thread_share(&profile, |t| t.pid == pid);
        assert!(share >= 0.25, "pid {pid} has only {share:.3} of samples");
    }
    assert!(
        profile
            .threads
            .iter()
            .all(|t| t.pid == first.pid() || t.pid == second.pid()),
        "samples from other processes: {:?}",
        profile.threads
    );
    assert_share_at_least(&profile, "spin_work", 0.99);
    assert_share_at_least(&profile, "main", 0.99);
}

/// The tid of the thread of `pid` named `comm`, once it exists.
/// The CPU time a thread has had, from its schedstat.
fn thread_cpu_ns(pid: u32, tid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).unwrap();
    stat.split_whitespace().next().unwrap().parse().unwrap()
}

fn wait_for_thread(pid: u32, comm: &str) -> u32 {
    wait_until(&format!("thread {comm} of {pid} never appeared"), || {
        let mut tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten();
        tasks.find_map(|task| {
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            (name.trim() == comm).then(|| task.file_name().to_string_lossy().parse().unwrap())
        })
    })
}

#[test]
fn attach_to_one_thread_by_tid() {
    let _serial = serial();
    let dir = tempdir();
    let prog = workload("threads");
    // Many rounds: runs far longer than the recording; killed on drop.
    let target = Background::spawn(Command::new(&prog).arg("100000"));
    let tid = wait_for_thread(target.pid(), "worker_b");
    let before = thread_cpu_ns(target.pid(), tid);
    let (_, profile) = record_json(
        dir.path(),
        &["-L", &tid.to_string(), "-d", "1", "-F", "499"],
        &[],
    );
    // The thread's own CPU time over the whole command (start-up included) bounds what could
    // be sampled; on a loaded machine it gets a fraction of a CPU.
    let ran = (thread_cpu_ns(target.pid(), tid) - before) as f64 / 1e9;
    let expected = ran * 499.0;
    let least = (0.5 * expected - 3.0 * expected.sqrt()).max(20.0);
    assert_min_samples(&profile, least as u64);
    assert!(
        profile
            .threads
            .iter()
            .all(|t| t.tid == tid && t.pid == target.pid() && t.comm == "worker_b"),
        "samples from threads other than worker_b ({tid}): {:?}",
        profile.threads
    );
    assert_share_at_least(&profile, "thread_b_work", 0.99);
}

#[test]
fn whole_system_on_one_cpu() {
    let _serial = serial();
    let dir = tempdir();
    let spin = workload("spin");
    // Pinned to CPU 0 so the recording of CPU 0 is sure to see it.
    let target = Background::spawn(
        Command::new("taskset")
            .arg("-c")
            .arg("0")
            .arg(&spin)
            .arg("30"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let (began, before) = (Instant::now(), thread_cpu_ns(target.pid(), target.pid()));
    let (_, profile) = record_json(dir.path(), &["-a", "-C", "0", "-d", "1"], &[]);
    // The share of CPU 0 the spinner had over the whole command, the recording's start-up
    // included. Its share of CPU 0's samples follows it, loosely: on a loaded machine other
    // tasks come and go, so its share in the recorded second can be a fraction of the whole
    // run's; only where it had most of CPU 0 is a share asked of it.
    let ran = (thread_cpu_ns(target.pid(), target.pid()) - before) as f64;
    let had = ran / began.elapsed().as_nanos() as f64;

    assert_min_samples(&profile, 100);
    let off_cpu: Vec<_> = profile
        .samples
        .iter()
        .filter(|s| s.cpu != Some(0))
        .collect();
    assert!(off_cpu.is_empty(), "samples not on CPU 0: {off_cpu:?}");
    assert!(
        profile.threads.iter().all(|t| t.tid != 0),
        "idle task sampled without -I: {:?}",
        profile.threads
    );
    let spin_share = thread_share(&profile, |t| t.pid == target.pid());
    assert!(
        spin_share > 0.0 && (had < 0.5 || spin_share >= 0.25 * had),
        "the spinner pinned to CPU 0 had {had:.3} of it but only {spin_share:.3} of its samples\n{}",
        top_stacks(&profile, 6)
    );
    let spin_work = share(&profile, |f| f.iter().any(|x| x.name == "spin_work"));
    assert!(
        spin_work >= 0.9 * spin_share,
        "spin_work in only {spin_work:.3} of samples, the spinner in {spin_share:.3}"
    );
}
