//! `record --alloc` and `--in-use`: memory counted by stack at the allocator's entry points,
//! checked against what the allocating programs say they asked for (tests/workloads/allocs.c,
//! glibc's whole family and anonymous mmap from C built without frame pointers; rust_allocs.rs,
//! Rust's system allocator; jemalloc_allocs, the same on tikv-jemallocator). Every call is
//! counted, so bytes and calls per site are exact however loaded the machine.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use stackscope_profile::{CountUnit, Frame, Profile};
use stackscope_testkit::peers::go_pprof;
use stackscope_testkit::truth::SIGMAS;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const C_SITES: [&str; 6] = [
    "site_malloc",
    "site_calloc",
    "site_realloc",
    "site_memalign",
    "site_aligned",
    "site_mmap",
];
const RUST_SITES: [&str; 4] = ["site_vec", "site_zeroed", "site_boxed", "site_grow"];

/// A seed and a number of calls that differ from run to run, so no fixed number can pass by
/// chance.
fn varied() -> (String, String) {
    let pid = u64::from(std::process::id());
    (pid.to_string(), (200 + pid % 97).to_string())
}

/// The program's own account: `site_malloc_bytes 1000 site_malloc_calls 10 ...`.
fn account(stdout: &str) -> Vec<(String, u64)> {
    let line = stdout
        .lines()
        .find(|l| l.contains("_bytes "))
        .unwrap_or_else(|| panic!("the program printed no account: {stdout:?}"));
    account_pairs(line)
}

/// Whether a stack passes through `site` (a C function, or a Rust one by its last path
/// segment) with its whole chain down to main.
fn at_site(frames: &[&Frame], site: &str) -> bool {
    let user = user_names(frames);
    let is_site = |f: &&str| *f == site || f.ends_with(&format!("::{site}"));
    user.iter().any(is_site) && user.contains(&"main")
}

/// (bytes, allocations) the profile counts at `site`.
fn counted_at(profile: &Profile, site: &str) -> (u64, u64) {
    profile
        .samples
        .iter()
        .filter(|s| {
            let frames: Vec<&Frame> = profile.stack_frames(s.stack).collect();
            at_site(&frames, site)
        })
        .fold((0, 0), |(b, n), s| (b + s.count, n + s.objects))
}

/// Asserts that each site's bytes and allocations are the program's own, `kind` naming which
/// (`` for allocated, `_held` for still held).
fn assert_sites(profile: &Profile, account: &[(String, u64)], sites: &[&str], kind: &str) {
    let top = top_stacks(profile, 12);
    for site in sites {
        let expected = (
            said(account, &format!("{site}{kind}")),
            said(
                account,
                &format!("{site}{}_calls", kind.trim_end_matches("_bytes")),
            ),
        );
        assert!(expected.1 > 0, "{site} counted nothing of its own");
        assert_eq!(
            counted_at(profile, site),
            expected,
            "{site}: (bytes, allocations){kind} against the program's own account:\n{top}"
        );
    }
}

#[test]
fn alloc_counts_each_c_sites_bytes_and_calls_exactly_with_stacks_to_main() {
    let dir = tempdir();
    let prog = workload("allocs");
    let (seed, calls) = varied();
    let command = [prog.as_os_str(), os(&seed), os(&calls), os("0")];
    let (run, profile) = record_json(dir.path(), &["--alloc"], &command);
    let account = account(&run.stdout);
    assert_eq!(profile.meta.count_unit, CountUnit::Bytes);
    assert_eq!(profile.meta.event, "alloc");
    // glibc's whole family, realloc as an allocation, memalign and aligned_alloc (one
    // function, two names) once per call.
    assert_sites(&profile, &account, &C_SITES, "_bytes");
    assert_sites(&profile, &account, &["site_old"], "_bytes");
    let (bytes, objects) = profile
        .samples
        .iter()
        .fold((0, 0), |(b, n), s| (b + s.count, n + s.objects));
    assert!(
        run.stderr
            .contains(&format!("{bytes} bytes in {objects} allocations in ")),
        "the summary says bytes and allocations: {}",
        run.stderr
    );
    assert_user_stacks_complete(&profile);

    // The unit stays through report, into pprof as go tool pprof reads a heap profile.
    let pprof = dir.path().join("mem.pb.gz");
    report(dir.path(), &dir.path().join("profile.json"), &pprof).assert_ok();
    let top = go_pprof(&["-sample_index=alloc_space", "-unit=B", "-top"], &pprof);
    assert!(top.contains("Type: alloc_space"), "{top}");
    let malloc_bytes = said(&account, "site_malloc_bytes");
    assert!(
        top.lines().any(|l| l.trim_end().ends_with(" site_malloc")
            && l.trim_start().starts_with(&format!("{malloc_bytes}B "))),
        "site_malloc's {malloc_bytes} bytes in pprof:\n{top}"
    );
}

#[test]
fn a_child_the_command_starts_is_counted_exactly_from_its_start() {
    // sh forks a child that execs the program: its probes go in at the fork, and it is held
    // at its first library load until they are in, so not one of its allocations is missed.
    let dir = tempdir();
    let prog = workload("allocs");
    let (seed, calls) = varied();
    let command = in_a_child_of_sh(&[prog.as_os_str(), os(&seed), os(&calls), os("0")]);
    for memory in [&["--alloc"][..], &["--in-use"]] {
        let (run, profile) = record_json(dir.path(), memory, &command);
        let account = account(&run.stdout);
        let kind = if memory == ["--alloc"] {
            "_bytes"
        } else {
            "_held"
        };
        assert_sites(&profile, &account, &C_SITES, kind);
        // The child is sh until it execs, then the program, in a process of its own.
        let child = profile.threads.iter().find(|t| t.comm == "allocs");
        let shell = |c: &stackscope_profile::Thread| {
            (profile.threads.iter()).any(|t| t.comm == "sh" && t.pid != c.pid)
        };
        assert!(
            child.is_some_and(shell),
            "the program counted in a process of its own: {:?}",
            profile.threads
        );
    }
}

#[test]
fn in_use_holds_exactly_what_was_not_freed_and_min_age_keeps_the_old() {
    let dir = tempdir();
    let prog = workload("allocs");
    let (seed, calls) = varied();
    // site_old's blocks are allocated 1.5 s before the rest, which the program exits right
    // after allocating.
    let command = [prog.as_os_str(), os(&seed), os(&calls), os("1500")];
    let (run, profile) = record_json(dir.path(), &["--in-use"], &command);
    let account = account(&run.stdout);
    assert_eq!(profile.meta.event, "in-use");
    assert_sites(&profile, &account, &C_SITES, "_held");
    assert_sites(&profile, &account, &["site_old"], "_held");
    assert!(
        run.stderr.contains("allocations still held at the end in "),
        "{}",
        run.stderr
    );

    // Blocks younger than a second at the end are left out: only site_old's are that old.
    let pprof = dir.path().join("old.pb.gz");
    let run = record(
        dir.path(),
        &pprof,
        &["--in-use", "--min-age", "1"],
        &command,
    );
    run.assert_ok();
    let account = self::account(&run.stdout);
    let top = go_pprof(&["-sample_index=inuse_space", "-unit=B", "-top"], &pprof);
    assert!(top.contains("Type: inuse_space"), "{top}");
    let old = said(&account, "site_old_held");
    assert!(
        top.contains(&format!("Total samples = {old}B")),
        "only site_old's {old} bytes are a second old:\n{top}"
    );
    assert!(top.contains(" site_old"), "{top}");
}

#[test]
fn rust_sites_are_counted_exactly_allocated_and_held() {
    rust_sites_counted_exactly("rust_allocs");
}

/// The same sites on tikv-jemallocator, linked into the program: counted at its `_rjem_`
/// entry points, which the program itself defines.
#[test]
fn jemalloc_sites_are_counted_exactly_allocated_and_held() {
    rust_sites_counted_exactly("jemalloc_allocs");
}

/// `workload` (rust_allocs's sites, on some allocator) counted by `--alloc` and `--in-use`
/// exactly as it says, with whole stacks.
fn rust_sites_counted_exactly(workload: &str) {
    let dir = tempdir();
    let prog = common::workload(workload);
    let (seed, calls) = varied();
    let command = [prog.as_os_str(), os(&seed), os(&calls)];
    let (run, profile) = record_json(dir.path(), &["--alloc"], &command);
    assert_sites(&profile, &account(&run.stdout), &RUST_SITES, "_bytes");
    let (run, profile) = record_json(dir.path(), &["--in-use"], &command);
    assert_sites(&profile, &account(&run.stdout), &RUST_SITES, "_held");
    assert_user_stacks_complete(&profile);
}

/// `--sample-bytes N`: each site's bytes are an estimate made of whole sample points (a
/// multiple of N: every call counted would almost never give one), within [`SIGMAS`] standard
/// errors of the program's own count. The points on a site's B bytes are Poisson with mean
/// B/N, so the estimate's standard error is sqrt(B*N).
#[test]
fn sampled_bytes_per_site_are_within_what_their_sample_count_allows() {
    let dir = tempdir();
    let prog = workload("rust_allocs");
    let pid = u64::from(std::process::id());
    // Sites allocate 8 to 3008 bytes a call, far below 16*N: every call is sampled, none
    // counted exactly.
    let n = 2048 + pid % 2048;
    let (seed, calls) = (pid.to_string(), (3000 + pid % 500).to_string());
    let command = [prog.as_os_str(), os(&seed), os(&calls)];
    let sample = ["--sample-bytes".to_string(), n.to_string()];
    let (mode, kind) = ("--alloc", "_bytes");
    let options = [mode, sample[0].as_str(), sample[1].as_str()];
    let (run, profile) = record_json(dir.path(), &options, &command);
    let account = account(&run.stdout);
    assert!(
        run.stderr.contains("bytes and allocations are estimates"),
        "the summary says the counts are sampled: {}",
        run.stderr
    );
    let top = top_stacks(&profile, 12);
    for site in RUST_SITES {
        let truth = said(&account, &format!("{site}{kind}"));
        let (estimate, allocations) = counted_at(&profile, site);
        let sigma = ((truth * n) as f64).sqrt();
        assert!(
            (estimate as f64 - truth as f64).abs() <= SIGMAS * sigma,
            "{mode} {site}: estimated {estimate} bytes, the program counted {truth}: \
             more than {SIGMAS} standard errors ({sigma:.0}) apart at N = {n}\n{top}"
        );
        assert_eq!(
            estimate % n,
            0,
            "{mode} {site}: {estimate} is no whole number of samples of {n} bytes"
        );
        assert!(allocations > 0, "{mode} {site}: no allocations estimated");
    }
    assert_user_stacks_complete(&profile);
}

#[test]
fn attaching_sees_only_what_was_allocated_since_and_frees_of_older_blocks_count_nothing() {
    let dir = tempdir();
    let prog = workload("allocs");
    let (seed, calls) = varied();
    let mut program = Command::new(&prog)
        .args([&seed, &calls, "wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start allocs");
    let mut out = BufReader::new(program.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("ready");
    assert_eq!(line, "ready\n", "site_old's blocks are allocated");

    // Attached while the program holds site_old's blocks; it frees half of them later.
    let json = dir.path().join("held.json");
    let pid = program.id().to_string();
    let mut cmd = record_command(dir.path(), &json, &["--in-use", "-p", &pid], &[]);
    let mut recorder = cmd
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start stackscope");
    let mut said_so = BufReader::new(recorder.stderr.take().expect("stderr"));
    let mut announcement = String::new();
    said_so.read_line(&mut announcement).expect("announcement");
    assert!(
        announcement.contains("counting"),
        "stackscope did not start: {announcement}"
    );
    let mut input = program.stdin.take().expect("stdin");
    input.write_all(b"go\n").expect("let the program go on");
    drop(input);
    let mut rest = String::new();
    out.read_line(&mut rest).expect("the account");
    program.wait().expect("the program ends");
    let status = recorder.wait().expect("stackscope ends");
    let mut summary = String::new();
    for line in said_so.lines().map_while(Result::ok) {
        summary.push_str(&line);
        summary.push('\n');
    }
    assert!(status.success(), "stackscope failed: {summary}");
    let profile = read_json(&json);
    let account = account(&rest);
    assert_sites(&profile, &account, &C_SITES, "_held");
    // site_old's blocks came before: neither they nor their frees count.
    assert_eq!(counted_at(&profile, "site_old"), (0, 0));
    let held: u64 = C_SITES
        .iter()
        .map(|site| said(&account, &format!("{site}_held")))
        .sum();
    // Besides the sites: at most the stdin and stdout buffers glibc allocates once.
    let total = profile.total_samples();
    assert!(
        (held..=held + 2 * 4096).contains(&total),
        "{total} bytes held in all, {held} at the sites:\n{}",
        top_stacks(&profile, 10)
    );
}

#[test]
fn memory_flags_beside_what_they_cannot_count_with_are_refused_in_one_line() {
    let dir = tempdir();
    let out = dir.path().join("x.svg");
    let cases: [(&[&str], &str); 6] = [
        (&["--alloc", "--backend", "perf"], "eBPF backend only"),
        (&["--alloc", "-e", "uprobe:libc:free"], "record them apart"),
        (&["--in-use", "--off-cpu"], "record them apart"),
        (&["--alloc", "-F", "99"], "-F/-c"),
        (&["--alloc", "-K"], "user stacks only"),
        (&["--alloc", "--in-use"], "cannot be used with"),
    ];
    for (options, said) in cases {
        let run = record(dir.path(), &out, options, &[os("true")]);
        assert!(!run.status.success(), "{options:?} was taken");
        assert!(run.stderr.contains(said), "{options:?}: {}", run.stderr);
        assert!(!out.exists(), "{options:?} wrote a profile");
    }
    // --min-age and --max-live belong to --in-use; --sample-bytes to --alloc, not yet to
    // --in-use.
    for options in [
        &["--sample-bytes", "4K"][..],
        &["--in-use", "--sample-bytes", "4K"],
    ] {
        let run = record(dir.path(), &out, options, &[os("true")]);
        assert!(
            run.stderr.contains("give --alloc"),
            "{options:?}: {}",
            run.stderr
        );
    }
    let run = record(
        dir.path(),
        &out,
        &["--alloc", "--sample-bytes", "4Q"],
        &[os("true")],
    );
    assert!(
        run.stderr.contains("`4Q` is no byte count"),
        "{}",
        run.stderr
    );
    for flag in ["--min-age", "--max-live"] {
        let run = record(dir.path(), &out, &["--alloc", flag, "5"], &[os("true")]);
        assert!(run.stderr.contains("--in-use"), "{flag}: {}", run.stderr);
    }
}

#[test]
fn a_full_live_map_says_how_many_allocations_and_bytes_it_left_out() {
    let dir = tempdir();
    let prog = workload("allocs");
    let (seed, calls) = varied();
    let command = [prog.as_os_str(), os(&seed), os(&calls), os("0")];
    let (run, profile) = record_json(dir.path(), &["--in-use", "--max-live", "50"], &command);
    let hint = run
        .stderr
        .lines()
        .find(|l| l.contains("the live-allocation map was full (50 blocks)"))
        .unwrap_or_else(|| panic!("no word of the full map: {}", run.stderr));
    // site_old alone allocates more than 50 blocks before freeing any.
    // `hint: the live-allocation map was full (50 blocks): N newer allocations ...`
    let left_out: u64 = hint
        .split(": ")
        .nth(2)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {hint}"));
    let calls: u64 = calls.parse().unwrap();
    assert!(left_out >= calls - 50, "{hint}");
    assert!(profile.samples.iter().map(|s| s.objects).sum::<u64>() <= 50);
    assert!(profile.meta.hints.iter().any(|h| h.contains("--max-live")));
}

#[test]
fn an_allocator_of_the_programs_own_counts_as_itself_once() {
    let dir = tempdir();
    let prog = workload("allocs");
    let prog_s = prog.to_string_lossy().into_owned();
    let (seed, calls) = varied();
    let command = [
        prog.as_os_str(),
        os(&seed),
        os(&calls),
        os("0"),
        os("arena"),
    ];
    // arena_alloc mallocs each block with a header: counted once, as arena_alloc, at the size
    // asked; arena_free frees it by the address arena_alloc returned.
    let arena = format!("{prog_s}:arena_alloc,arena_free");
    let (run, profile) = record_json(dir.path(), &["--in-use", "--alloc-fn", &arena], &command);
    let account = account(&run.stdout);
    assert_sites(&profile, &account, &["site_arena"], "_held");
    assert_sites(&profile, &account, &C_SITES, "_held");

    let typo = format!("{prog_s}:arena_aloc");
    let out = dir.path().join("x.json");
    let run = record(
        dir.path(),
        &out,
        &["--alloc", "--alloc-fn", &typo],
        &command,
    );
    assert!(!run.status.success());
    assert!(
        run.stderr.contains("no function arena_aloc") && run.stderr.contains("arena_alloc"),
        "{}",
        run.stderr
    );
}
