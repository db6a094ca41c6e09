//! The command line as a newcomer first meets it: `record ./prog ARGS` without `--`, with the
//! program's flags left to the program.

#![cfg(target_os = "linux")]

mod common;

use common::*;

#[test]
fn record_runs_a_program_named_without_a_double_dash_with_its_arguments() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "800");
    let out = dir.path().join("p.json");
    let mut args = vec![os("record"), os("-o"), out.as_os_str()];
    args.extend(split.command());
    let run = stackscope(dir.path(), &args);
    run.assert_ok();
    // The program wrote its truth file: the arguments reached it.
    assert!(split.truth.exists(), "split did not get its arguments");
    let profile = read_json(&out);
    assert_share_at_least(&profile, "func_b", 0.3);
}

#[test]
fn flags_after_the_program_are_the_programs_own() {
    let _serial = serial();
    let dir = tempdir();
    let out = dir.path().join("p.json");
    let split = workload("split_nofp");
    // The shell prints the arguments it got, then becomes the workload; `-d 1` after it is the
    // shell's, not a duration for stackscope.
    let script = "echo \"args: $*\"; exec \"$0\" 400";
    let args = [
        os("record"),
        os("-o"),
        out.as_os_str(),
        os("/bin/sh"),
        os("-c"),
        os(script),
        split.as_os_str(),
        os("-d"),
        os("1"),
    ];
    let run = stackscope(dir.path(), args);
    run.assert_ok();
    assert!(
        run.stdout.contains("args: -d 1"),
        "the program did not get `-d 1`:\n{}",
        run.stdout
    );
    assert!(
        !run.stderr.contains("for 1 s"),
        "stackscope took the program's -d 1:\n{}",
        run.stderr
    );
    assert_share_at_least(&read_json(&out), "func_b", 0.3);
}

#[test]
fn flags_before_the_program_are_stackscopes() {
    let _serial = serial();
    let dir = tempdir();
    let spin = workload("spin");
    let args = [
        os("record"),
        os("-d"),
        os("1"),
        os("-o"),
        os("x.json"),
        spin.as_os_str(),
        os("100"),
    ];
    let run = stackscope(dir.path(), args);
    // The duration ended the recording and stackscope ended the program (SIGTERM, 128 + 15).
    run.assert_exit(143, "the spinning program ended by stackscope after -d 1");
    assert!(
        run.wall.as_secs() < 20,
        "-d 1 was not taken: {:?}",
        run.wall
    );
    assert_share_at_least(&read_json(&dir.path().join("x.json")), "spin_work", 0.8);
}

#[test]
fn a_double_dash_before_the_program_still_works() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "800");
    let (_, profile) = record_json(dir.path(), &[], &split.command());
    assert!(split.truth.exists(), "split did not get its arguments");
    assert_share_at_least(&profile, "func_b", 0.3);
}

/// A small saved profile, as folded stacks, in `dir/p.folded`.
fn saved_profile(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("p.folded");
    std::fs::write(&path, "prog;main;hot 90\nprog;main;cold 10\n").expect("write p.folded");
    path
}

#[test]
fn an_output_extension_stackscope_does_not_write_is_refused_with_those_it_does() {
    let dir = tempdir();
    let input = saved_profile(dir.path());
    for name in ["x.png", "x.html"] {
        let run = stackscope(
            dir.path(),
            [os("report"), input.as_os_str(), os("-o"), os(name)],
        );
        run.assert_one_line_error(&[
            name.trim_start_matches('x'),
            ".svg",
            ".folded",
            ".json",
            "--format",
        ]);
        assert!(!dir.path().join(name).exists(), "{name} was written");
    }
}

#[test]
fn an_output_without_an_extension_is_svg_and_a_format_given_wins_over_the_name() {
    let dir = tempdir();
    let input = saved_profile(dir.path());
    stackscope(
        dir.path(),
        [os("report"), input.as_os_str(), os("-o"), os("flame")],
    )
    .assert_ok();
    let svg = std::fs::read_to_string(dir.path().join("flame")).expect("flame written");
    assert!(
        svg.starts_with("<?xml"),
        "not SVG: {}",
        &svg[..svg.len().min(80)]
    );
    let args = ["report", "p.folded", "-o", "x.html", "--format", "folded"];
    stackscope(dir.path(), args).assert_ok();
    let folded = std::fs::read_to_string(dir.path().join("x.html")).expect("x.html written");
    assert!(folded.contains("prog;main;hot 90"), "not folded: {folded}");
}

#[test]
fn a_reader_that_closes_standard_output_early_ends_stackscope_quietly_with_status_0() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempdir();
    // Far more than a pipe holds, so stackscope is still writing when the reader goes.
    let input = dir.path().join("big.folded");
    let lines: String = (0..100_000)
        .map(|i| format!("prog;main;f{i} {}\n", i + 1))
        .collect();
    std::fs::write(&input, lines).expect("write big.folded");
    let stderr = dir.path().join("stderr");
    for format in ["folded", "json", "svg"] {
        let mut child = Command::new(stackscope_bin())
            .args([os("report"), input.as_os_str(), os("-o"), os("-")])
            .args(["--format", format])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("create stderr file"))
            .spawn()
            .expect("spawn stackscope");
        // As `| head -1`: one line, then the pipe is closed.
        let mut first = String::new();
        let stdout = child.stdout.take().expect("stdout piped");
        BufReader::new(stdout)
            .read_line(&mut first)
            .expect("read a line");
        assert!(!first.is_empty(), "{format}: nothing written");
        let status = wait_until(&format!("{format}: stackscope did not end"), || {
            child.try_wait().expect("wait for stackscope")
        });
        let said = std::fs::read_to_string(&stderr).expect("read stderr");
        assert_eq!(status.code(), Some(0), "{format}: status; stderr:\n{said}");
        assert!(
            said.is_empty(),
            "{format}: stackscope said something about the closed pipe:\n{said}"
        );
    }
}

/// The rows of a `--top` table: (self %, total %, samples, module, function).
fn top_rows(table: &str) -> Vec<(f64, f64, u64, String, String)> {
    let mut lines = table.lines();
    assert!(
        lines.next().is_some_and(|l| l.starts_with("# ")),
        "no summary line:\n{table}"
    );
    assert!(
        lines.next().is_some_and(|l| l.contains("Self%")),
        "no header:\n{table}"
    );
    lines
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let percent = |f: &str| -> f64 {
                let number = f.strip_suffix('%').unwrap_or_else(|| panic!("{line}"));
                number.parse().unwrap_or_else(|_| panic!("{line}"))
            };
            (
                percent(fields[0]),
                percent(fields[1]),
                fields[2].parse().unwrap_or_else(|_| panic!("{line}")),
                fields[3].to_string(),
                fields[4..].join(" "),
            )
        })
        .collect()
}

#[test]
fn report_top_prints_the_hottest_functions_with_self_and_total_shares() {
    let _serial = serial();
    let dir = tempdir();
    let split = Measured::new(dir.path(), "split_nofp", "2000");
    let (_, profile) = record_json(dir.path(), &[], &split.command());
    let run = stackscope(dir.path(), ["report", "profile.json", "--top", "5"]);
    run.assert_ok();
    let rows = top_rows(&run.stdout);
    assert_eq!(rows.len(), 5, "not 5 rows:\n{}", run.stdout);
    // func_b does about 70% of the work, func_a 30%, each in its own frame.
    let functions: Vec<&str> = rows.iter().map(|r| r.4.as_str()).collect();
    assert_eq!(&functions[..2], ["func_b", "func_a"], "{}", run.stdout);
    assert_eq!(rows[0].3, "split_nofp", "func_b's module:\n{}", run.stdout);
    assert!(rows[0].0 > 50.0 && rows[0].1 >= rows[0].0, "{}", run.stdout);
    let self_sum: f64 = rows.iter().map(|r| r.0).sum();
    assert!(self_sum <= 100.05, "self shares add to {self_sum}%");
    // The samples are func_b's own, and its share is of all the profile's samples.
    let share = rows[0].2 as f64 * 100.0 / profile.total_samples() as f64;
    assert!(
        (share - rows[0].0).abs() < 0.1,
        "{share} against {}",
        rows[0].0
    );
    // main is on every stack and is no leaf.
    let main = rows.iter().find(|r| r.4 == "main");
    if let Some(main) = main {
        assert!(main.0 < 1.0 && main.1 > 99.0, "{}", run.stdout);
    }

    // `--top` alone shows at most its default rows; `--format top` is the same table.
    let all = stackscope(dir.path(), ["report", "profile.json", "--top"]);
    all.assert_ok();
    assert!(top_rows(&all.stdout).len() <= 20);
    let format = stackscope(dir.path(), ["report", "profile.json", "--format", "top"]);
    format.assert_ok();
    assert_eq!(format.stdout, all.stdout);
}

#[test]
fn a_short_flag_in_the_wrong_case_gets_a_tip_naming_the_right_one() {
    let dir = tempdir();
    for (command, wrong, right) in [("record", "-f", "'-F'"), ("profile", "-l", "'-L'")] {
        let run = stackscope(dir.path(), [command, wrong, "99", "true"]);
        run.assert_exit(2, "a usage error");
        let error = run.stderr.lines().next().unwrap_or_default();
        assert!(error.contains(wrong), "{command}: {}", run.stderr);
        assert!(
            run.stderr
                .contains(&format!("similar argument exists: {right}")),
            "{command} {wrong}: no tip naming {right}:\n{}",
            run.stderr
        );
    }
}

/// `bin ARGS` on an 80-column terminal: its standard output, having exited 0.
fn help_text(bin: &str, args: &[&str]) -> String {
    let dir = tempdir();
    let mut cmd = std::process::Command::new(bin);
    cmd.current_dir(dir.path()).args(args).env("COLUMNS", "80");
    let run = run_with_deadline(cmd);
    run.assert_ok();
    run.stdout
}

#[test]
fn each_short_help_fits_a_screen_and_names_the_flags_a_first_recording_needs() {
    let cargo = env!("CARGO_BIN_EXE_cargo-stackscope");
    for (bin, args) in [
        (stackscope_bin(), &["-h"][..]),
        (stackscope_bin(), &["record", "-h"]),
        (cargo, &["-h"]),
    ] {
        let text = help_text(bin, args);
        let lines = text.lines().count();
        assert!(lines <= 40, "{args:?}: {lines} lines:\n{text}");
        for flag in ["-o", "-F", "-d", "-p"] {
            let named = text
                .split(|c: char| c.is_whitespace() || c == ',')
                .any(|word| word == flag);
            assert!(named, "{bin} {args:?} does not name {flag}:\n{text}");
        }
    }
}

#[test]
fn long_help_still_names_every_flag() {
    use clap::CommandFactory;
    let command = stackscope::cli::Cli::command();
    let record = command.find_subcommand("record").expect("a record command");
    let text = help_text(stackscope_bin(), &["record", "--help"]);
    let short = help_text(stackscope_bin(), &["record", "-h"]);
    let mut hidden_from_short = 0;
    for arg in record.get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long) = arg.get_long() else { continue };
        let flag = format!("--{long}");
        assert!(text.contains(&flag), "record --help lacks {flag}");
        hidden_from_short += usize::from(!short.contains(&flag));
    }
    assert!(
        hidden_from_short > 10,
        "-h hides only {hidden_from_short} flags"
    );
    // The examples and the paragraphs after them are --help's too.
    for words in [
        "uprobe:libc:malloc",
        "perf_event_paranoid",
        "STACKSCOPE_DEBUG_FILE_DIRECTORY",
    ] {
        assert!(text.contains(words), "record --help lacks {words}");
    }
    let cargo = help_text(env!("CARGO_BIN_EXE_cargo-stackscope"), &["--help"]);
    for flag in [
        "--features",
        "--manifest-path",
        "--offline",
        "--profile",
        "--stack-size",
    ] {
        assert!(cargo.contains(flag), "cargo stackscope --help lacks {flag}");
    }
}
