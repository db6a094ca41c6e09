//! Inputs that must be refused, or read, without a panic, a hang or unbounded memory, through
//! the real `stackscope report`, `stackscope diff` and `stackscope-perf script -i`: perf.data
//! files recorded here by `perf record` with one record damaged, a FIFO, a pipe, `/dev/zero`,
//! and folded stacks whose counts approach 2^64, written in every format.

#![cfg(target_os = "linux")]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::*;
use stackscope_profile::format::Format;

fn perf_bin() -> &'static str {
    env!("CARGO_BIN_EXE_stackscope-perf")
}

/// A real recording of the split workload with frame-pointer callchains.
fn recording(dir: &Path) -> Vec<u8> {
    let prog = workload("split_fp");
    // Without perf's build-id cache (-N) or build-ids (-B): other recordings on this machine
    // may be writing the cache at once, which makes perf abort.
    let data = perf_record(dir, &["-N", "-B", "-F", "999", "-g"], &[prog.as_os_str()]);
    std::fs::read(data).expect("read perf.data")
}

/// A record of a perf.data file's data section: where it starts, its type and misc field.
struct Record {
    at: usize,
    kind: u32,
    misc: u16,
}

/// The records of a (little-endian) perf.data file, walked by their headers' sizes.
fn records(bytes: &[u8]) -> Vec<Record> {
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    let (start, size) = (word(40), word(48));
    let mut found = Vec::new();
    let mut at = start;
    while at + 8 <= start + size {
        let kind = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let misc = u16::from_le_bytes(bytes[at + 4..at + 6].try_into().unwrap());
        let len = u16::from_le_bytes(bytes[at + 6..at + 8].try_into().unwrap()) as usize;
        assert!(len >= 8, "perf wrote a record of {len} bytes at {at}");
        found.push(Record { at, kind, misc });
        at += len;
    }
    found
}

/// Asserts that `report`, `diff` (the damaged file second) and `stackscope-perf script -i` all
/// refuse `damaged` with one line naming it and each of `words`, and write nothing.
fn refused_everywhere(dir: &Path, damaged: &Path, words: &[&str]) {
    let name = damaged.file_name().unwrap().to_str().unwrap();
    let mut all = vec![name];
    all.extend_from_slice(words);
    let out = dir.join("out.folded");
    report(dir, damaged, &out).assert_one_line_error(&all);
    assert!(!out.exists(), "report wrote output from {name}");

    let diff = dir.join("diff.svg");
    let run = stackscope(
        dir,
        [
            os("diff"),
            dir.join("perf.data").as_os_str(),
            damaged.as_os_str(),
            os("-o"),
            diff.as_os_str(),
        ],
    );
    run.assert_one_line_error(&all);
    assert!(!diff.exists(), "diff wrote output from {name}");

    let mut cmd = Command::new(perf_bin());
    cmd.current_dir(dir)
        .args([os("script"), os("-i"), damaged.as_os_str()]);
    let run = run_with_deadline(cmd);
    run.assert_one_line_error(&all);
    assert!(run.stdout.is_empty(), "script printed: {}", run.stdout);
}

#[test]
fn mmap2_build_id_flag_set_on_a_record_without_one_is_refused_at_its_offset() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let mut bytes = recording(d);
    // perf writes MMAP2 records with device and inode numbers; the build-id flag makes the
    // parser read the low byte of the major device number as the build-id's length.
    let mmap2 = records(&bytes)
        .into_iter()
        .find(|r| r.kind == 10 && r.misc & (1 << 14) == 0 && bytes[r.at + 40] > 20)
        .expect("an MMAP2 record whose device number is more than 20");
    bytes[mmap2.at + 5] |= 0x40;
    let damaged = d.join("build-id-flag.data");
    std::fs::write(&damaged, &bytes).unwrap();
    refused_everywhere(d, &damaged, &[&format!("byte {}", mmap2.at), "MMAP2"]);
}

#[test]
fn a_record_turned_into_auxtrace_is_refused_at_its_offset() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let mut bytes = recording(d);
    // A sample's first word (its instruction pointer) becomes the trace data's size.
    let sample = records(&bytes)
        .into_iter()
        .find(|r| r.kind == 9)
        .expect("a sample record");
    bytes[sample.at..sample.at + 4].copy_from_slice(&71u32.to_le_bytes());
    let damaged = d.join("auxtrace.data");
    std::fs::write(&damaged, &bytes).unwrap();
    refused_everywhere(d, &damaged, &[&format!("byte {}", sample.at), "AUXTRACE"]);
}

const FOLDED: &str = "prog;main;work 7\nprog;main;rest 3\n";

/// The folded text `report` writes for `input` on standard output, within the deadline.
fn report_stdout(dir: &Path, input: &Path) -> Run {
    stackscope(
        dir,
        [
            os("report"),
            input.as_os_str(),
            os("--format"),
            os("folded"),
            os("-o"),
            os("-"),
        ],
    )
}

fn assert_folded_whole(run: &Run) {
    run.assert_ok();
    let lines = parse_folded(&run.stdout);
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert_eq!(total, 10, "{}", run.stdout);
    assert!(
        lines
            .iter()
            .any(|l| l.0 == ["prog", "main", "work"] && l.1 == 7),
        "{}",
        run.stdout
    );
}

#[test]
fn a_fifo_is_read_once_and_whole() {
    let dir = tempdir();
    let d = dir.path();
    let fifo = d.join("in.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    // The writer opens the FIFO once and writes the profile once, as `cmd > fifo` does.
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().write(true).open(fifo).unwrap();
            f.write_all(FOLDED.as_bytes()).unwrap();
        })
    };
    let run = report_stdout(d, &fifo);
    writer.join().unwrap();
    assert_folded_whole(&run);
}

/// `report /dev/fd/N` on a pipe another process writes, as `report <(cat p.folded)` does.
fn report_from_pipe(dir: &Path, source: &Path) -> Run {
    let script = format!(
        "cat {} | {} report /dev/stdin --format folded -o -",
        shell_quote(source),
        shell_quote(Path::new(stackscope_bin()))
    );
    let mut cmd = Command::new("sh");
    cmd.current_dir(dir).args(["-c", &script]);
    run_with_deadline(cmd)
}

fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}

#[test]
fn a_pipe_is_read_whole() {
    let dir = tempdir();
    let d = dir.path();
    let input = d.join("p.folded");
    std::fs::write(&input, FOLDED).unwrap();
    assert_folded_whole(&report_from_pipe(d, &input));
}

#[test]
fn perf_data_from_a_pipe_reads_as_from_its_file() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    recording(d);
    let from_file = report_stdout(d, &d.join("perf.data"));
    from_file.assert_ok();
    let from_pipe = report_from_pipe(d, &d.join("perf.data"));
    from_pipe.assert_ok();
    assert_eq!(
        parse_folded(&from_pipe.stdout),
        parse_folded(&from_file.stdout)
    );
}

#[test]
fn dev_zero_is_refused_from_its_first_bytes() {
    let dir = tempdir();
    let d = dir.path();
    let started = Instant::now();
    let out = d.join("out.folded");
    report(d, Path::new("/dev/zero"), &out).assert_one_line_error(&[
        "/dev/zero",
        "not a profile",
        "offset 0",
    ]);
    assert!(started.elapsed() < DEADLINE);
    assert!(!out.exists());
}

/// Counts whose sum is u64::MAX: the largest a profile holds.
fn huge_folded(dir: &Path) -> PathBuf {
    let big = u64::MAX - 10;
    let input = dir.join("huge.folded");
    std::fs::write(
        &input,
        format!("prog;main;work {big}\nprog;main;rest 7\nother;idle 3\n"),
    )
    .unwrap();
    input
}

#[test]
fn counts_near_2_64_are_written_or_refused_by_every_writer() {
    let dir = tempdir();
    let d = dir.path();
    let input = huge_folded(d);
    for &name in Format::NAMES {
        let out = d.join(format!("out.{name}"));
        let run = stackscope(
            d,
            [
                os("report"),
                input.as_os_str(),
                os("--format"),
                os(name),
                os("-o"),
                out.as_os_str(),
            ],
        );
        assert!(!run.stderr.contains("panicked"), "{name}: {}", run.stderr);
        if run.status.success() {
            let len = std::fs::metadata(&out).unwrap().len();
            assert!(len < 1 << 20, "{name} wrote {len} bytes");
            if name == "folded" {
                let text = std::fs::read_to_string(&out).unwrap();
                assert!(
                    text.contains(&format!("prog;main;work {}", u64::MAX - 10)),
                    "{text}"
                );
            }
        } else {
            run.assert_one_line_error(&[name]);
        }
    }
}
