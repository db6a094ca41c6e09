//! The drop-in shims run with the command lines cargo-flamegraph passes, read by the consumers
//! that read the real tools' output (inferno's perf and dtrace collapsers, cargo-flamegraph
//! itself), and `stackscope diff` on real recordings.

#![cfg(target_os = "linux")]

mod common;

use common::*;
use inferno::collapse::Collapse;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const PERF_RECORD: [&str; 8] = [
    "record",
    "-F",
    "997",
    "--call-graph",
    "dwarf,64000",
    "-g",
    "-o",
    "perf.data",
];
const DTRACE_SCRIPT: &str = "profile-997 /pid == $target/ { @[ustack(100)] = count(); }";

fn perf_bin() -> &'static str {
    env!("CARGO_BIN_EXE_stackscope-perf")
}

fn dtrace_bin() -> &'static str {
    env!("CARGO_BIN_EXE_stackscope-dtrace")
}

/// Runs `bin ARGS` in `dir` to its end, with the deadline of every stackscope run.
fn run_in<S: AsRef<OsStr>>(bin: &str, dir: &Path, args: &[S]) -> Run {
    let mut cmd = Command::new(bin);
    cmd.current_dir(dir).args(args);
    run_with_deadline(cmd)
}

/// Folded text (`stack count` lines) as a map, equal stacks added up.
fn folded_map(text: &str) -> BTreeMap<String, u64> {
    let mut map = BTreeMap::new();
    for (frames, count) in parse_folded(text) {
        *map.entry(frames.join(";")).or_default() += count;
    }
    map
}

fn collapse_perf(text: &str) -> BTreeMap<String, u64> {
    let mut folder =
        inferno::collapse::perf::Folder::from(inferno::collapse::perf::Options::default());
    let mut out = Vec::new();
    folder
        .collapse(text.as_bytes(), &mut out)
        .expect("inferno's perf collapser reads the text");
    folded_map(&String::from_utf8(out).unwrap())
}

/// inferno's dtrace collapser, with the `module`` prefix of each frame dropped (our folded
/// lines name functions only).
fn collapse_dtrace(text: &str) -> BTreeMap<String, u64> {
    let mut folder =
        inferno::collapse::dtrace::Folder::from(inferno::collapse::dtrace::Options::default());
    let mut out = Vec::new();
    folder
        .collapse(text.as_bytes(), &mut out)
        .expect("inferno's dtrace collapser reads the text");
    let mut map = BTreeMap::new();
    for (frames, count) in parse_folded(&String::from_utf8(out).unwrap()) {
        let stack: Vec<&str> = frames
            .iter()
            .map(|f| f.split_once('`').map_or(f.as_str(), |(_, name)| name))
            .collect();
        *map.entry(stack.join(";")).or_default() += count;
    }
    map
}

/// `stackscope report FILE --format FORMAT -o -`: what our own writer prints.
fn report_as(dir: &Path, file: &str, format: &str) -> String {
    let run = stackscope(dir, ["report", file, "--format", format, "-o", "-"]);
    run.assert_ok();
    run.stdout
}

fn total(map: &BTreeMap<String, u64>) -> u64 {
    map.values().sum()
}

/// The shim's `perf record` with cargo-flamegraph's options (into `perf.data`) on `command`,
/// in `dir`.
fn shim_perf_record(dir: &Path, command: &[&OsStr]) -> Run {
    let mut args: Vec<&OsStr> = PERF_RECORD.iter().map(OsStr::new).collect();
    args.extend_from_slice(command);
    run_in(perf_bin(), dir, &args)
}

/// `perf script --force -i perf.data` by the shim in `dir`, which must succeed, folded by
/// inferno's perf collapser; then our own folded writer's reading of the same file. Returns the
/// script's run, their folding and ours.
fn script_folds(dir: &Path) -> (Run, BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let script = run_in(perf_bin(), dir, &["script", "--force", "-i", "perf.data"]);
    script.assert_ok();
    let theirs = collapse_perf(&script.stdout);
    let ours = folded_map(&report_as(dir, "perf.data", "folded"));
    (script, theirs, ours)
}

/// The lines of `stackscope diff` in folded form: each stack with its count before and after.
fn diff_counts(text: &str) -> Vec<(String, u64, u64)> {
    text.lines()
        .map(|line| {
            let mut fields = line.rsplitn(3, ' ');
            let after = fields.next().and_then(|n| n.parse().ok());
            let before = fields.next().and_then(|n| n.parse().ok());
            match (fields.next(), before, after) {
                (Some(stack), Some(before), Some(after)) => (stack.to_string(), before, after),
                _ => panic!("diff line is not `STACK BEFORE AFTER`: {line:?}"),
            }
        })
        .collect()
}

#[test]
fn perf_record_and_script_fold_as_stackscope_folds() {
    let _guard = serial();
    let dir = tempdir();
    let prog = workload("rust_deep");
    shim_perf_record(dir.path(), &[prog.as_os_str()]).assert_exit(0, "the command's exit code");
    let profile = read_json(&dir.path().join("perf.data"));
    assert_min_samples(&profile, 100);

    let (script, theirs, ours) = script_folds(dir.path());
    assert_eq!(theirs, ours, "inferno's perf collapser folds other stacks");
    assert_eq!(total(&theirs), profile.total_samples());
    // Inlined frames come through (the leaves' helper is #[inline(always)]).
    assert!(
        theirs
            .keys()
            .any(|s| s.contains("leaf_a;rust_deep::deep_helper_mix")),
        "no inlined frame under leaf_a:\n{}",
        top_stacks(&profile, 5)
    );
    // `-i` defaults to perf.data, as in perf.
    let default_input = run_in(perf_bin(), dir.path(), &["script"]);
    default_input.assert_ok();
    assert_eq!(default_input.stdout, script.stdout);
}

#[test]
fn perf_script_no_inline_drops_inlined_frames() {
    let _guard = serial();
    let dir = tempdir();
    let prog = workload("rust_deep");
    shim_perf_record(dir.path(), &[prog.as_os_str(), OsStr::new("2000")]).assert_ok();
    let profile = read_json(&dir.path().join("perf.data"));

    let script = run_in(
        perf_bin(),
        dir.path(),
        &["script", "--force", "--no-inline", "-i", "perf.data"],
    );
    script.assert_ok();
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for sample in &profile.samples {
        let mut names = vec![profile.thread(sample.thread).comm.clone()];
        names.extend(
            profile
                .stack_frames(sample.stack)
                .filter(|f| !f.inlined)
                .map(|f| f.name.clone()),
        );
        *expected.entry(names.join(";")).or_default() += sample.count;
    }
    let theirs = collapse_perf(&script.stdout);
    assert_eq!(theirs, expected);
    assert!(!theirs.keys().any(|s| s.contains("deep_helper_mix")));
    assert!(theirs.keys().any(|s| s.ends_with("leaf_b")));
}

#[test]
fn perf_record_returns_the_commands_exit_code() {
    let _guard = serial();
    let dir = tempdir();
    let run = run_in(
        perf_bin(),
        dir.path(),
        &["record", "-o", "perf.data", "false"],
    );
    run.assert_exit(1, "`false` exits 1");
    // A command killed by SIGINT: 128 + 2, as perf returns it.
    let run = run_in(
        perf_bin(),
        dir.path(),
        &[
            "record",
            "-F",
            "997",
            "-g",
            "sh",
            "-c",
            "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; kill -INT $$",
        ],
    );
    run.assert_exit(130, "the shell killed itself with SIGINT");
    // No `--`: options after the command are the command's.
    let run = run_in(
        perf_bin(),
        dir.path(),
        &["record", "-o", "x.json", "sh", "-c", "exit 7", "-o", "y"],
    );
    run.assert_exit(7, "sh's exit code");
}

#[test]
fn perf_record_ctrl_c_keeps_the_profile() {
    let _guard = serial();
    let dir = tempdir();
    let spin = workload("spin");
    let mut cmd = Command::new(perf_bin());
    cmd.current_dir(dir.path())
        .args(PERF_RECORD)
        .arg(&spin)
        .arg("60")
        // A process group of its own stands in for the terminal's foreground group, which
        // Ctrl-C signals as a whole (cargo-flamegraph ignores SIGINT itself).
        .process_group(0);
    let start = Instant::now();
    let child = spawn_piped(&mut cmd);
    let pid = child.id();
    // Whichever of the shim's threads started it.
    let spin_pid = wait_until("the profiled command never started", || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        let children: Vec<String> = tasks
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
            .collect();
        children
            .iter()
            .flat_map(|c| c.split_whitespace())
            .find_map(|c| {
                let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).ok()?;
                (comm.trim() == "spin").then(|| c.to_string())
            })
    });
    // Let it collect something; how much does not matter.
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling the process group we created above.
    assert_eq!(unsafe { libc::kill(-(pid as i32), libc::SIGINT) }, 0);
    let run = wait_output(child, start);
    // As perf record: the profile is written, then the shim ends by the signal it got, which
    // cargo-flamegraph takes for an interruption (an exit code 130 would read as a failure).
    assert_eq!(
        run.status.signal(),
        Some(libc::SIGINT),
        "stackscope-perf did not end by SIGINT: {:?}\nstderr:\n{}",
        run.status,
        run.stderr
    );
    assert!(
        !Path::new(&format!("/proc/{spin_pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{spin_pid}/comm"))
                .map_or(true, |c| c.trim() != "spin"),
        "the command outlived the recording"
    );
    let profile = read_json(&dir.path().join("perf.data"));
    assert_share_at_least(&profile, "spin_work", 0.5);
}

#[test]
fn perf_record_says_truthfully_that_its_perf_data_is_stackscope_json() {
    let _guard = serial();
    let dir = tempdir();
    let spin = workload("spin");
    let run = run_in(
        perf_bin(),
        dir.path(),
        &[os("record"), os("-g"), spin.as_os_str(), os("1")],
    );
    run.assert_ok();
    let wrote = run
        .stderr_lines()
        .into_iter()
        .find(|l| l.contains("wrote"))
        .unwrap_or_else(|| panic!("no line says what was written:\n{}", run.stderr))
        .to_string();
    for words in [
        "perf.data",
        "stackscope JSON",
        "stackscope report",
        "not `perf report`",
    ] {
        assert!(wrote.contains(words), "{wrote:?} does not say {words:?}");
    }
    read_json(&dir.path().join("perf.data"));
}

#[test]
fn perf_and_dtrace_stand_ins_answer_help_with_their_usage() {
    let dir = tempdir();
    let asks: [(&str, &[&str]); 6] = [
        (perf_bin(), &["--help"]),
        (perf_bin(), &["-h"]),
        (perf_bin(), &["record", "--help"]),
        (perf_bin(), &["script", "-h"]),
        (dtrace_bin(), &["--help"]),
        // dtrace's own -h writes a header file; only --help is help there.
        (dtrace_bin(), &["--help", "-n", "x"]),
    ];
    for (bin, args) in asks {
        let run = run_in(bin, dir.path(), args);
        run.assert_exit(0, "help is not an error");
        assert!(
            run.stdout.starts_with("usage: stackscope-"),
            "{bin} {args:?}: no usage on standard output:\n{}{}",
            run.stdout,
            run.stderr
        );
    }
    assert!(!dir.path().join("perf.data").exists());
}

#[test]
fn perf_rejects_what_it_does_not_do() {
    let _guard = serial();
    let dir = tempdir();
    run_in(perf_bin(), dir.path(), &["record", "--bogus", "true"])
        .assert_one_line_error(&["--bogus"]);
    run_in(
        perf_bin(),
        dir.path(),
        &["record", "--call-graph", "lbr", "true"],
    )
    .assert_one_line_error(&["lbr"]);
    // What perf itself refuses, in perf's words where it has them.
    for (value, words) in [
        ("dwarf,999999999999", &["dwarf,999999999999", "65528"][..]),
        ("fp,dwarf,lbr", &["fp,dwarf,lbr", "refused"][..]),
        ("dwarf,0", &["dwarf,0", "65528"][..]),
    ] {
        run_in(
            perf_bin(),
            dir.path(),
            &["record", "--call-graph", value, "true"],
        )
        .assert_one_line_error(words);
    }
    run_in(perf_bin(), dir.path(), &["stat", "true"]).assert_one_line_error(&["stat"]);
    run_in(perf_bin(), dir.path(), &["script", "-F", "ip"]).assert_one_line_error(&["-F"]);
    run_in(perf_bin(), dir.path(), &["script", "-i", "missing.data"])
        .assert_one_line_error(&["missing.data"]);
    assert!(!dir.path().join("perf.data").exists());
}

/// `perf script` on a perf.data written by the real perf: the same text as on our recording.
#[test]
fn perf_script_reads_a_real_perf_data() {
    let _guard = serial();
    let dir = tempdir();
    let prog = workload("split_nofp");
    let real = Command::new("perf")
        .current_dir(dir.path())
        .args(PERF_RECORD)
        .arg(&prog)
        .arg("1000")
        .output()
        .expect("run perf (the test needs the installed perf)");
    assert!(
        real.status.success(),
        "perf record failed: {}",
        String::from_utf8_lossy(&real.stderr)
    );
    let (_, theirs, ours) = script_folds(dir.path());
    assert_eq!(theirs, ours);
    assert!(theirs.keys().any(|s| s.ends_with("main;func_b")));

    // diff reads a real perf.data too: against itself, both columns are its folded counts.
    let run = stackscope(
        dir.path(),
        [
            "diff",
            "perf.data",
            "perf.data",
            "--format",
            "folded",
            "-o",
            "-",
        ],
    );
    run.assert_ok();
    let mut same = BTreeMap::new();
    for (stack, before, after) in diff_counts(&run.stdout) {
        assert_eq!(before, after, "{stack}");
        same.insert(stack, after);
    }
    assert_eq!(same, ours);
}

/// The dtrace writer against our folded writer on one recording, through inferno's dtrace
/// collapser: every stack arrives (the first one too), with its count.
#[test]
fn dtrace_text_folds_as_stackscope_folds() {
    let _guard = serial();
    let dir = tempdir();
    let (_, profile) = record_json(
        dir.path(),
        &["--backend", "perf", "-U", "-F", "997"],
        &[workload("split_nofp").as_os_str(), os("1500")],
    );
    let text = report_as(dir.path(), "profile.json", "dtrace");
    assert!(text.starts_with('\n'), "no leading blank line");
    let mut ours: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, count) in folded_map(&report_as(dir.path(), "profile.json", "folded")) {
        // Aggregations on ustack() have no thread: drop the comm.
        let frames = stack
            .split_once(';')
            .map_or("", |(_, rest)| rest)
            .to_string();
        *ours.entry(frames).or_default() += count;
    }
    let theirs = collapse_dtrace(&text);
    assert_eq!(theirs, ours);
    assert_eq!(total(&theirs), profile.total_samples());
}

#[test]
fn dtrace_shim_runs_cargo_flamegraphs_command_line() {
    let _guard = serial();
    let dir = tempdir();
    // A path with a space: cargo-flamegraph escapes it as `\ ` inside -c.
    let bin_dir = dir.path().join("my bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let prog = bin_dir.join("split");
    std::fs::copy(workload("split_nofp"), &prog).unwrap();
    let c = format!("{} 1500", prog.display().to_string().replace(' ', "\\ "));
    let run = run_in(
        dtrace_bin(),
        dir.path(),
        &[
            "-x",
            "ustackframes=100",
            "-n",
            DTRACE_SCRIPT,
            "-o",
            "cargo-flamegraph.stacks",
            "-c",
            &c,
        ],
    );
    run.assert_exit(0, "the command's exit code");
    let text = std::fs::read_to_string(dir.path().join("cargo-flamegraph.stacks")).unwrap();
    assert!(text.starts_with('\n'), "no leading blank line");
    let stacks = collapse_dtrace(&text);
    let whole = |leaf: &str| -> u64 {
        stacks
            .iter()
            .filter(|(s, _)| s.starts_with("_start;") && s.ends_with(&format!("main;{leaf}")))
            .map(|(_, n)| n)
            .sum()
    };
    assert!(
        whole("func_a") > 0 && whole("func_b") > whole("func_a"),
        "{stacks:#?}"
    );
    // ustack() is user stacks only.
    assert!(
        !stacks.keys().any(|s| s.contains("asm_sysvec")),
        "{stacks:#?}"
    );

    // The script's frame limit: ustack(2) keeps the two innermost frames.
    let run = run_in(
        dtrace_bin(),
        dir.path(),
        &[
            "-n",
            "profile-499 /pid == $target/ { @[ustack(2)] = count(); }",
            "-o",
            "two.stacks",
            "-c",
            &c,
        ],
    );
    run.assert_ok();
    let two = collapse_dtrace(&std::fs::read_to_string(dir.path().join("two.stacks")).unwrap());
    assert!(two.keys().all(|s| s.split(';').count() <= 2), "{two:#?}");
    assert!(two.contains_key("main;func_b"), "{two:#?}");

    let run = run_in(
        dtrace_bin(),
        dir.path(),
        &["-n", DTRACE_SCRIPT, "-o", "f", "-c", "false"],
    );
    run.assert_exit(1, "`false` exits 1");
    run_in(
        dtrace_bin(),
        dir.path(),
        &["-n", "tick-1s { exit(0); }", "-c", "true"],
    )
    .assert_one_line_error(&["profile-"]);
}

#[test]
fn dtrace_shim_attaches_with_p() {
    let _guard = serial();
    let dir = tempdir();
    let target = start_workload("spin", &["3"], None);
    let pid = target.pid().to_string();
    let run = run_in(
        dtrace_bin(),
        dir.path(),
        &["-n", DTRACE_SCRIPT, "-o", "out.stacks", "-p", &pid],
    );
    run.assert_ok();
    let stacks = collapse_dtrace(&std::fs::read_to_string(dir.path().join("out.stacks")).unwrap());
    assert!(
        stacks.keys().any(|s| s.ends_with("main;spin_work")),
        "{stacks:#?}"
    );
}

fn cargo_flamegraph() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("cargo-flamegraph"))
            .find(|p| p.is_file())
    });
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    on_path
        .or_else(|| {
            cargo_home
                .map(|h| h.join("bin/cargo-flamegraph"))
                .filter(|p| p.is_file())
        })
        .expect("cargo-flamegraph is not installed: run scripts/install-deps.sh")
}

/// A real `cargo flamegraph` with stackscope-perf as its perf, on a cargo project of its own.
#[test]
fn cargo_flamegraph_runs_on_stackscope_perf() {
    let _guard = serial();
    let dir = tempdir();
    let project = dir.path().join("burner");
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::write(
        project.join("Cargo.toml"),
        "[package]\nname = \"burner\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [profile.release]\ndebug = true\n",
    )
    .unwrap();
    std::fs::write(
        project.join("src/main.rs"),
        r#"use std::hint::black_box;

#[inline(never)]
fn burn_alpha(n: u64) -> u64 {
    let mut s = 1u64;
    for i in 0..n {
        s = black_box(s.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    s
}

#[inline(never)]
fn burn_beta(n: u64) -> u64 {
    let mut s = 7u64;
    for i in 0..n {
        s = black_box((s ^ i).wrapping_mul(1442695040888963407));
    }
    s
}

fn main() {
    let rounds: u64 = std::env::args().nth(1).map_or(10, |a| a.parse().unwrap());
    let mut t = 0;
    for _ in 0..rounds {
        t ^= burn_alpha(black_box(20_000_000));
        t ^= burn_beta(black_box(40_000_000));
    }
    println!("{t}");
}
"#,
    )
    .unwrap();
    let cargo_flamegraph = |svg: &str, args: &[&str]| {
        let mut cmd = Command::new(cargo_flamegraph());
        cmd.current_dir(&project)
            .args(["flamegraph", "--bin", "burner", "-o", svg])
            .args(args)
            .env("PERF", perf_bin())
            .env("CARGO", env!("CARGO"))
            .env("CARGO_TARGET_DIR", dir.path().join("target"))
            .env("CARGO_NET_OFFLINE", "true")
            // Tuning meant for the outer build does not belong in the project's.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET");
        cmd
    };
    let run = run_with_deadline(cargo_flamegraph("flamegraph.svg", &[]));
    assert!(
        run.status.success(),
        "cargo flamegraph failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
    let svg = std::fs::read_to_string(project.join("flamegraph.svg")).unwrap();
    for name in ["burner::burn_alpha", "burner::burn_beta", "burner::main"] {
        assert!(svg.contains(name), "flamegraph.svg does not name {name}");
    }
    // The recording was stackscope's: its JSON stands where perf.data would.
    read_json(&project.join("perf.data"));

    // Ctrl-C in the terminal (SIGINT to the foreground group) while the program runs: the
    // flamegraph of what was sampled so far is still drawn.
    let mut cmd = cargo_flamegraph("interrupted.svg", &["--", "1000000"]);
    cmd.process_group(0);
    let start = Instant::now();
    let child = spawn_piped(&mut cmd);
    let group = child.id();
    wait_until("the program never started under cargo flamegraph", || {
        std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .find_map(|entry| {
                let pid = entry.file_name();
                let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                // The process group is the 3rd field after the parenthesised comm.
                let pgrp = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(2)?
                    .to_string();
                (comm.trim() == "burner" && pgrp == group.to_string()).then_some(pid)
            })
    });
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling the process group created above.
    assert_eq!(unsafe { libc::kill(-(group as i32), libc::SIGINT) }, 0);
    let run = wait_output(child, start);
    assert!(
        run.status.success(),
        "cargo flamegraph failed after Ctrl-C: {:?}\nstderr:\n{}",
        run.status,
        run.stderr
    );
    let svg = std::fs::read_to_string(project.join("interrupted.svg")).unwrap();
    assert!(
        svg.contains("burner::burn_alpha"),
        "interrupted.svg does not name burn_alpha"
    );
}

/// Two real recordings of different programs: with --no-normalize each column is exactly the
/// folded counts of its profile; normalized, the first column is scaled to the second's total.
#[test]
fn diff_of_two_recordings() {
    let _guard = serial();
    let dir = tempdir();
    let before = dir.path().join("before.json");
    let after = dir.path().join("after.json");
    record(
        dir.path(),
        &before,
        &["-F", "499"],
        &[workload("split_nofp").as_os_str(), os("1000")],
    )
    .assert_ok();
    record(
        dir.path(),
        &after,
        &["-F", "997"],
        &[workload("spin").as_os_str(), os("1")],
    )
    .assert_ok();
    let ours_before = folded_map(&report_as(dir.path(), "before.json", "folded"));
    let ours_after = folded_map(&report_as(dir.path(), "after.json", "folded"));

    let run = stackscope(
        dir.path(),
        [
            "diff",
            "before.json",
            "after.json",
            "--no-normalize",
            "-o",
            "-",
            "--format",
            "folded",
        ],
    );
    run.assert_ok();
    let mut col1 = BTreeMap::new();
    let mut col2 = BTreeMap::new();
    for (stack, a, b) in diff_counts(&run.stdout) {
        if a > 0 {
            col1.insert(stack.clone(), a);
        }
        if b > 0 {
            col2.insert(stack, b);
        }
    }
    assert_eq!(col1, ours_before);
    assert_eq!(col2, ours_after);

    let run = stackscope(
        dir.path(),
        ["diff", "before.json", "after.json", "-o", "d.folded"],
    );
    run.assert_ok();
    let text = std::fs::read_to_string(dir.path().join("d.folded")).unwrap();
    let counts = diff_counts(&text);
    let sum1: u64 = counts.iter().map(|c| c.1).sum();
    let sum2: u64 = counts.iter().map(|c| c.2).sum();
    let lines = counts.len() as u64;
    assert_eq!(sum2, total(&ours_after));
    // Each scaled count is rounded down.
    assert!(sum1 <= sum2 && sum1 + lines >= sum2, "{sum1} vs {sum2}");

    let run = stackscope(
        dir.path(),
        ["diff", "before.json", "after.json", "-o", "diff.svg"],
    );
    run.assert_ok();
    let svg = std::fs::read_to_string(dir.path().join("diff.svg")).unwrap();
    assert!(svg.starts_with("<?xml"));
    // Frames are drawn at their width after the change: only the second profile's show.
    assert!(
        svg.contains("spin_work"),
        "diff.svg does not name spin_work"
    );
    assert!(
        !svg.contains("func_a"),
        "diff.svg draws a stack that is gone"
    );
    stackscope(
        dir.path(),
        ["diff", "before.json", "after.json", "-o", "d.txt"],
    )
    .assert_one_line_error(&["svg or folded"]);
    stackscope(dir.path(), ["diff", "before.json", "nothing.json"])
        .assert_one_line_error(&["nothing.json"]);
}
