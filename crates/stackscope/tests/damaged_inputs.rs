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

/// An 8-byte record (its header alone) of a type no reader knows: the smallest record there is,
/// and the one a parser spends the most bookkeeping on per byte.
const TINY_RECORD: [u8; 8] = [0x00, 0x70, 0, 0, 0, 0, 8, 0];

/// The peak memory of reading a short recording however its records unpack: a few tens of
/// MiB for the profile, and room.
const READING_PEAK_KIB: u64 = 256 << 10;

/// `mib` MiB of `pattern` repeated, as one zstd frame, compressed as it streams.
fn zstd_frame(pattern: &[u8], mib: usize) -> Vec<u8> {
    use zstd_safe::{CCtx, InBuffer, OutBuffer};
    let chunk = pattern.repeat((1 << 20) / pattern.len());
    let mut cctx = CCtx::create();
    let mut frame = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..mib {
        let mut input = InBuffer::around(&chunk);
        while input.pos() < chunk.len() {
            let mut output = OutBuffer::around(&mut buf[..]);
            cctx.compress_stream(&mut output, &mut input)
                .expect("zstd compresses");
            let n = output.pos();
            frame.extend_from_slice(&buf[..n]);
        }
    }
    loop {
        let mut output = OutBuffer::around(&mut buf[..]);
        let left = cctx.end_stream(&mut output).expect("zstd ends the frame");
        let n = output.pos();
        frame.extend_from_slice(&buf[..n]);
        if left == 0 {
            return frame;
        }
    }
}

/// PERF_RECORD_COMPRESSED records holding `data`, as perf cuts its stream into records.
fn compressed_records(data: &[u8]) -> Vec<u8> {
    let mut records = Vec::new();
    for piece in data.chunks(64000) {
        records.extend_from_slice(&81u32.to_le_bytes());
        records.extend_from_slice(&0u16.to_le_bytes());
        records.extend_from_slice(&(8 + piece.len() as u16).to_le_bytes());
        records.extend_from_slice(piece);
    }
    records
}

/// A (little-endian) perf.data file with `records` added at the end of its data section, and
/// where they start; the header's feature sections, after it, move along.
fn with_records_appended(bytes: &[u8], records: &[u8]) -> (Vec<u8>, usize) {
    let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (start, size) = (word(bytes, 40), word(bytes, 48));
    let end = (start + size) as usize;
    let added = records.len() as u64;
    let mut out = bytes[..end].to_vec();
    out.extend_from_slice(records);
    out.extend_from_slice(&bytes[end..]);
    out[48..56].copy_from_slice(&(size + added).to_le_bytes());
    let features: u32 = (0..4).map(|i| word(bytes, 72 + i * 8).count_ones()).sum();
    for i in 0..features as usize {
        let at = end + records.len() + i * 16;
        let moved = word(&out, at) + added;
        out[at..at + 8].copy_from_slice(&moved.to_le_bytes());
    }
    (out, end)
}

/// Asserts that `report` and `stackscope-perf script -i` read `partial` only as far as a
/// record in `added` (the bytes added to `whole`, the recording it was made from), each saying
/// so in one line naming the file and where, in bounded memory, and give the profile of `whole`.
fn read_up_to(
    dir: &Path,
    partial: &Path,
    whole: &Path,
    added: std::ops::Range<usize>,
    peak_kib: u64,
) {
    let name = partial.file_name().unwrap().to_str().unwrap();
    let said = |run: &Run| {
        let lines = run.stderr_lines();
        let stop: Vec<_> = lines.iter().filter(|l| l.contains(name)).collect();
        assert_eq!(stop.len(), 1, "one line naming {name}:\n{}", run.stderr);
        assert!(
            stop[0].contains("more than stackscope reads"),
            "no bound in {}",
            stop[0]
        );
        let at: usize = stop[0]
            .split("up to byte ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no byte offset in {}", stop[0]));
        assert!(
            added.contains(&at),
            "stopped at byte {at}, not in {added:?}"
        );
        assert!(
            run.peak_kib < peak_kib,
            "peak memory {} KiB reading {name}",
            run.peak_kib
        );
    };
    let before = report_stdout(dir, whole);
    before.assert_ok();
    let run = report_stdout(dir, partial);
    run.assert_ok();
    said(&run);
    eprintln!(
        "{name}: peak {} KiB, against {} KiB for the file it was made from",
        run.peak_kib, before.peak_kib
    );
    assert_eq!(parse_folded(&run.stdout), parse_folded(&before.stdout));

    let mut cmd = Command::new(perf_bin());
    cmd.current_dir(dir)
        .args([os("script"), os("-i"), partial.as_os_str()]);
    let run = run_with_deadline(cmd);
    run.assert_ok();
    said(&run);
    assert!(
        run.stdout.contains("func_b"),
        "script printed:\n{}",
        run.stdout
    );
}

#[test]
fn compressed_records_unpacking_to_gigabytes_end_the_reading_with_the_profile_before_them() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let bytes = recording(d);
    // Four frames, each 512 MiB of the smallest records, about 50 KB compressed. (A recording
    // perf compressed itself leaves its zstd frame open: a new frame could not follow it.)
    let frame = compressed_records(&zstd_frame(&TINY_RECORD, 512));
    let (bomb, at) = with_records_appended(&bytes, &frame.repeat(4));
    let bomb_path = d.join("bomb.data");
    std::fs::write(&bomb_path, &bomb).unwrap();
    assert!(
        bomb.len() < bytes.len() + (256 << 10),
        "{} bytes",
        bomb.len()
    );
    // The first record unpacked crosses the bounds.
    read_up_to(
        d,
        &bomb_path,
        &d.join("perf.data"),
        at..at + 1,
        READING_PEAK_KIB,
    );
}

#[test]
fn records_without_rounds_past_what_the_sorter_may_hold_end_the_reading() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let bytes = recording(d);
    // 64 MiB of the smallest records and no FINISHED_ROUND: the parser would hold them all,
    // 1.3 GB. It may hold what the bound allows, with the reading's own beside it.
    let (flood, at) = with_records_appended(&bytes, &TINY_RECORD.repeat(8 << 20));
    let flood_path = d.join("flood.data");
    std::fs::write(&flood_path, &flood).unwrap();
    let peak_kib = (stackscope_perf_event::perf_data::MAX_HELD >> 10) + READING_PEAK_KIB;
    read_up_to(
        d,
        &flood_path,
        &d.join("perf.data"),
        at..flood.len(),
        peak_kib,
    );
}

#[test]
fn a_compressed_record_of_zeros_is_refused_before_it_is_unpacked() {
    let _serial = serial();
    let dir = tempdir();
    let d = dir.path();
    let bytes = recording(d);
    // 1 GiB of zeros: records that say they are 0 bytes long.
    let zeros = compressed_records(&zstd_frame(&[0], 1024));
    let (damaged, at) = with_records_appended(&bytes, &zeros);
    let damaged_path = d.join("zeros.data");
    std::fs::write(&damaged_path, &damaged).unwrap();
    let run = report(d, &damaged_path, &d.join("zeros.folded"));
    assert!(
        run.peak_kib < READING_PEAK_KIB,
        "peak memory {} KiB",
        run.peak_kib
    );
    refused_everywhere(
        d,
        &damaged_path,
        &[&format!("byte {at}"), "compressed record"],
    );
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
    for name in Format::ALL.map(|f| f.name()) {
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
