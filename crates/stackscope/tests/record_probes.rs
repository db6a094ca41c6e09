//! `record --event`: stacks counted at probes on the eBPF source, checked against what the
//! probed program says it did (tests/workloads/probes.c prints how often it called each
//! thing). Every hit is one count, so the counts are exact, however loaded the machine.

mod common;

use common::*;
use stackscope_profile::FrameKind;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn probes_program(dir: &Path) -> PathBuf {
    let source = std::fs::read_to_string(workloads_src().join("probes.c")).expect("probes.c");
    stackscope_testkit::compile(
        "gcc",
        dir,
        ("probes.c", &source),
        &["-O2", "-g"],
        &[],
        "probes",
    )
}

/// Counts that differ from run to run, so no fixed number can pass by chance.
fn varied(base: u64) -> u64 {
    base + u64::from(std::process::id()) % 997
}

/// The program's own account: `site_a 1000 site_b 2500 parses 9 ...` as (name, count) pairs.
fn account(stdout: &str) -> Vec<(String, u64)> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("site_a "))
        .unwrap_or_else(|| panic!("the program printed no account: {stdout:?}"));
    account_pairs(line)
}

#[test]
fn malloc_uprobe_counts_each_call_site_exactly() {
    let dir = tempdir();
    let prog = probes_program(dir.path());
    let (a, b) = (varied(1000), varied(2500) + 7);
    let (a_arg, b_arg) = (a.to_string(), b.to_string());
    let command = [
        prog.as_os_str(),
        os(&a_arg),
        os(&b_arg),
        os("0"),
        os("0"),
        os("0"),
        os("0"),
    ];
    let (run, profile) = record_json(dir.path(), &["--event", "uprobe:libc:malloc"], &command);
    let account = account(&run.stdout);
    assert_eq!((said(&account, "site_a"), said(&account, "site_b")), (a, b));

    let at = |site: &str| {
        counts_where(&profile, |frames| {
            // The site is malloc's caller: the user frame just above the leaf.
            let user = user_names(frames);
            user.len() >= 2 && user[user.len() - 2] == site
        })
    };
    let top = top_stacks(&profile, 5);
    assert_eq!(
        at("alloc_site_a"),
        a,
        "hits of malloc from alloc_site_a:\n{top}"
    );
    assert_eq!(
        at("alloc_site_b"),
        b,
        "hits of malloc from alloc_site_b:\n{top}"
    );
    assert_eq!(profile.meta.event, "uprobe:libc:malloc");
    assert_eq!(profile.meta.frequency_hz, None);
    assert!(
        run.stderr.contains("at uprobe:libc:malloc"),
        "the announcement names the probe: {}",
        run.stderr
    );
    let summary = format!(
        "{} samples of uprobe:libc:malloc in ",
        profile.total_samples()
    );
    assert!(
        run.stderr.contains(&summary),
        "the summary names the event: {}",
        run.stderr
    );
    // The flamegraph names the event in its title (and its subtitle).
    let svg = dir.path().join("allocs.svg");
    record(dir.path(), &svg, &["-e", "uprobe:libc:malloc"], &command).assert_ok();
    let svg = std::fs::read_to_string(&svg).expect("svg written");
    let title = format!(
        "stackscope: {} {a} {b} 0 0 0 0 (uprobe:libc:malloc)",
        prog.display()
    );
    assert!(svg.contains(&title), "no title {title:?} in the SVG");
}

#[test]
fn a_uprobe_counts_a_child_the_command_starts_exactly() {
    // sh forks a child that execs the program: a uprobe attached to sh alone would not see it.
    let dir = tempdir();
    let prog = probes_program(dir.path());
    let (a, b) = (varied(1000), varied(2500) + 7);
    let (a_arg, b_arg) = (a.to_string(), b.to_string());
    let zero = os("0");
    let command = in_a_child_of_sh(&[
        prog.as_os_str(),
        os(&a_arg),
        os(&b_arg),
        zero,
        zero,
        zero,
        zero,
    ]);
    let probe = format!("uprobe:{}:alloc_site_a", prog.display());
    let (run, profile) = record_json(dir.path(), &["--event", &probe], &command);
    let account = account(&run.stdout);
    assert_eq!(said(&account, "site_a"), a);
    let hits = counts_where(&profile, |frames| user_names(frames).contains(&"main"));
    assert_eq!(
        (hits, profile.total_samples()),
        (a, a),
        "hits of alloc_site_a in the child:\n{}",
        top_stacks(&profile, 5)
    );
}

#[test]
fn uretprobe_tracepoint_and_usdt_stacks_reach_main_apart() {
    let dir = tempdir();
    let prog = probes_program(dir.path());
    let prog_s = prog.to_string_lossy().into_owned();
    let (parses, writes, ticks) = (varied(100), varied(200) + 3, varied(300) + 5);
    let args: Vec<String> = [0, 0, parses, 0, writes, ticks]
        .iter()
        .map(u64::to_string)
        .collect();
    let mut command = vec![prog.as_os_str()];
    command.extend(args.iter().map(|a| os(a)));
    let uret = format!("uretprobe:{prog_s}:parse_number");
    let write = "tracepoint:syscalls:sys_enter_write";
    let usdt = format!("usdt:{prog_s}:stackscope_test:tick");
    let guarded = format!("usdt:{prog_s}:stackscope_test:guarded");
    let options = ["-e", &uret, "-e", write, "-e", &usdt, "-e", &guarded];
    let (run, profile) = record_json(dir.path(), &options, &command);
    let account = account(&run.stdout);
    let top = top_stacks(&profile, 8);

    // Several events: every stack is rooted in its event's marker.
    let under = |event: &str, pred: &dyn Fn(&[&str]) -> bool| {
        counts_where(&profile, |frames| {
            let root = frames.first().expect("a frame");
            root.kind == FrameKind::Marker && root.name == event && pred(&user_names(frames))
        })
    };
    let all = |event: &str| under(event, &|_| true);
    assert_eq!(
        all(&uret) + all(write) + all(&usdt) + all(&guarded),
        profile.total_samples(),
        "every stack is rooted in its event:\n{top}"
    );
    // A uretprobe's stack is the caller's: main is its leaf.
    let returns_to_main = under(&uret, &|user| {
        user.last() == Some(&"main") && !user.contains(&"parse_number")
    });
    assert_eq!(
        returns_to_main,
        said(&account, "parses"),
        "returns of parse_number:\n{top}"
    );
    let writes_seen = under(write, &|user| {
        user.windows(2).any(|w| w == ["main", "write_lines"])
    });
    assert_eq!(
        writes_seen,
        said(&account, "writes"),
        "writes of write_lines:\n{top}"
    );
    let ticks_seen = under(&usdt, &|user| user.ends_with(&["main", "tick"]));
    assert_eq!(
        ticks_seen,
        said(&account, "ticks"),
        "ticks of the USDT probe:\n{top}"
    );
    // A probe behind a semaphore fires only while the semaphore is up: stackscope raised it
    // from before the program ran, so every pass fired and was counted.
    assert_eq!(said(&account, "guarded"), ticks, "the semaphore was not up");
    let guarded_seen = under(&guarded, &|user| user.ends_with(&["main", "guarded_tick"]));
    assert_eq!(
        guarded_seen, ticks,
        "hits of the guarded USDT probe:\n{top}"
    );
    assert_eq!(
        profile.meta.event,
        format!("{uret}, {write}, {usdt}, {guarded}"),
        "the metadata names every event"
    );
    // The event's root frame does not hide that each stack is whole.
    let unwind = &profile.meta.unwind;
    assert_eq!(unwind.complete, unwind.user_stacks, "{}", run.stderr);
}

/// Starts `probes loop` and waits (bounded) until it says it runs.
fn looping(prog: &Path) -> Child {
    let mut child = Command::new(prog)
        .arg("loop")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start probes loop");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    // read_line returns at the first line or when the program ends: no wait on speed.
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "looping", "probes loop did not start");
    child
}

#[test]
fn uprobe_goes_into_the_target_process_only() {
    let dir = tempdir();
    let prog = probes_program(dir.path());
    let mut target = looping(&prog);
    let mut bystander = looping(&prog);
    let pid = target.id().to_string();
    let out = dir.path().join("profile.json");
    let run = record(
        dir.path(),
        &out,
        &["-e", "uprobe:libc:malloc", "-p", &pid, "-d", "1"],
        &[],
    );
    for child in [&mut target, &mut bystander] {
        let _ = child.kill();
        let _ = child.wait();
    }
    run.assert_ok();
    let profile = read_json(&out);
    let top = top_stacks(&profile, 5);
    assert!(profile.total_samples() > 0, "no hits:\n{}", run.stderr);
    assert!(
        profile.threads.iter().all(|t| t.pid == target.id()),
        "hits of another process:\n{top}"
    );
    let at_site = counts_where(&profile, |frames| {
        user_names(frames)
            .windows(2)
            .any(|w| w == ["main", "alloc_site_a"])
    });
    assert_eq!(at_site, profile.total_samples(), "{top}");
    // The probe program ran only for the target's calls: the bystander, calling the same
    // malloc as fast, never hit it (its runs would outnumber the counts).
    let runs: u64 = run
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("in-kernel sampling: "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no program cost: {}", run.stderr));
    assert_eq!(runs, profile.total_samples(), "{}", run.stderr);
}

/// Whether this kernel can make kprobes (a kernel built without CONFIG_KPROBES cannot).
fn kernel_has_kprobes() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe").exists()
        || ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .iter()
            .any(|d| Path::new(d).join("kprobe_events").exists())
}

#[test]
fn kprobe_stacks_reach_main_or_the_kernel_says_it_has_none() {
    let dir = tempdir();
    let prog = probes_program(dir.path());
    let opens = varied(50).to_string();
    let command = [
        prog.as_os_str(),
        os("0"),
        os("0"),
        os("0"),
        os(&opens),
        os("0"),
        os("0"),
    ];
    let out = dir.path().join("profile.json");
    let run = record(dir.path(), &out, &["-e", "kprobe:do_sys_openat2"], &command);
    if !kernel_has_kprobes() {
        assert_ne!(run.code(), Some(0), "{}", run.stderr);
        assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
        assert!(run.stderr.contains("CONFIG_KPROBES"), "{}", run.stderr);
        assert!(
            run.stdout.is_empty(),
            "the program must not run: {}",
            run.stdout
        );
        return;
    }
    run.assert_ok();
    let profile = read_json(&out);
    let account = account(&run.stdout);
    let opened = counts_where(&profile, |frames| {
        let user = user_names(frames);
        user.contains(&"main") && user.contains(&"open_files")
    });
    assert_eq!(
        opened,
        said(&account, "opens"),
        "opens under open_files:\n{}",
        top_stacks(&profile, 5)
    );
}

#[test]
fn probes_that_cannot_attach_are_one_line_with_near_matches() {
    let dir = tempdir();
    let prog = probes_program(dir.path());
    let prog_s = prog.to_string_lossy().into_owned();
    let misspelt_function = format!("uprobe:{prog_s}:parse_numbr");
    let misspelt_usdt = format!("usdt:{prog_s}:stackscope_test:tik");
    let cases = [
        (vec!["-e", "uprobe:libc:mallocc"], "did you mean malloc"),
        (vec!["-e", &misspelt_function], "did you mean parse_number"),
        (
            vec!["-e", &misspelt_usdt],
            "did you mean stackscope_test:tick",
        ),
        (
            vec!["-e", "tracepoint:syscalls:sys_enter_writ"],
            "did you mean syscalls:sys_enter_write",
        ),
        (
            vec!["-e", "uprobe:libnothere_at_all:malloc"],
            "no library libnothere_at_all",
        ),
        (vec!["-e", "uprobe:libc"], "give FILE:FUNC"),
        (
            vec!["--backend", "perf", "-e", "uprobe:libc:malloc"],
            "eBPF backend only",
        ),
        (vec!["-e", "profile:hz:99", "-F", "99"], "not both"),
    ];
    for (options, expected) in &cases {
        let out = dir.path().join("never.json");
        let run = record(dir.path(), &out, options, &[prog.as_os_str(), os("1")]);
        let context = format!("{options:?}: {}", run.stderr);
        assert_ne!(run.code(), Some(0), "{context}");
        // One line says it (a malformed spelling gets clap's pointer to --help after it).
        let errors: Vec<&str> = run.stderr.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{context}");
        assert!(errors[0].contains(expected), "{context}");
        assert!(run.stdout.is_empty(), "the program ran: {context}");
        assert!(!out.exists(), "{context}");
    }
}

#[test]
fn the_timer_spelled_out_is_the_default_event() {
    let dir = tempdir();
    let spin = workload("spin");
    let (_, profile) = record_json(
        dir.path(),
        &["-e", "profile:hz:199"],
        &[spin.as_os_str(), os("1")],
    );
    assert_eq!(profile.meta.event, "cpu-clock");
    assert_eq!(profile.meta.frequency_hz, Some(199));
    assert_min_samples(&profile, 1);
}
