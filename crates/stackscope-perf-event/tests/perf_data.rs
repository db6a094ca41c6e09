//! The perf.data reader against files the installed `perf record` writes here: a small C
//! program that forks, its parent spinning in user code and its child copying from /dev/zero
//! in the kernel, recorded with DWARF stacks; the reading's progress; damaged files.

#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::Command;

use stackscope_perf_event::perf_data::{is_perf_data, read_perf_data, Progress};
use stackscope_profile::{FrameKind, Profile};
use stackscope_stacks::{Hint, Recording};
use stackscope_testkit::compile;

const FORKING_C: &str = r#"
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double cpu_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}

__attribute__((noinline)) static void spin_in_user(double seconds) {
    double start = cpu_seconds();
    while (cpu_seconds() - start < seconds)
        for (int i = 0; i < 100000; i++) sink += i;
}

__attribute__((noinline)) static void copy_in_kernel(double seconds) {
    static char buf[1 << 16];
    int fd = open("/dev/zero", O_RDONLY);
    double start = cpu_seconds();
    while (cpu_seconds() - start < seconds)
        for (int i = 0; i < 16; i++) sink += read(fd, buf, sizeof buf);
    close(fd);
}

int main(void) {
    pid_t child = fork();
    if (child == 0) {
        copy_in_kernel(0.8);
        return 0;
    }
    spin_in_user(0.8);
    waitpid(child, 0, 0);
    return 0;
}
"#;

fn perf_record(dir: &Path, options: &[&str], prog: &Path) -> PathBuf {
    let data = dir.join("perf.data");
    // -N: perf aborts when another recording writes its build-id cache at the same moment.
    let out = Command::new("perf")
        .args(["record", "-N"])
        .args(options)
        .arg("-o")
        .arg(&data)
        .arg("--")
        .arg(prog)
        .output()
        .expect("run perf record");
    assert!(
        out.status.success(),
        "perf record failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

/// Builds forking.c in `dir` with `-O2 -g` and the frame-pointer flag `frame_pointers`, and
/// records it with `perf record OPTIONS`; returns the perf.data path.
fn record_forking(dir: &Path, frame_pointers: &str, options: &[&str]) -> PathBuf {
    let prog = compile(
        "gcc",
        dir,
        ("forking.c", FORKING_C),
        &["-O2", "-g", frame_pointers],
        &[],
        "forking",
    );
    perf_record(dir, options, &prog)
}

/// Share of samples whose stack has a frame named `name` (of `kind`, when given).
fn share(profile: &Profile, pred: impl Fn(&str, FrameKind) -> bool) -> f64 {
    let total = profile.total_samples() as f64;
    let hit: u64 = profile
        .samples
        .iter()
        .filter(|s| profile.stack_frames(s.stack).any(|f| pred(&f.name, f.kind)))
        .map(|s| s.count)
        .sum();
    hit as f64 / total
}

#[test]
fn dwarf_recording_of_a_forking_program_replays_both_processes() {
    let dir = tempfile::tempdir().unwrap();
    let data = record_forking(
        dir.path(),
        "-fomit-frame-pointer",
        &["-F", "999", "--call-graph", "dwarf"],
    );
    let head = std::fs::read(&data).unwrap();
    assert!(is_perf_data(&head[..8]));

    let mut seen: Vec<Progress> = Vec::new();
    let profile = read_perf_data(&data, &mut |p| seen.push(p))
        .expect("read perf.data")
        .profile;
    let size = head.len() as u64;
    assert!(
        seen.windows(2).all(|w| w[0].done <= w[1].done) && seen.iter().all(|p| p.total == size),
        "progress: {seen:?}"
    );
    assert_eq!(
        seen.last().map(|p| p.done),
        Some(size),
        "progress ends at the file's end"
    );

    assert!(
        profile.total_samples() >= 800,
        "{} samples",
        profile.total_samples()
    );
    let pids: std::collections::BTreeSet<u32> = profile
        .threads
        .iter()
        .filter(|t| t.comm == "forking")
        .map(|t| t.pid)
        .collect();
    assert_eq!(pids.len(), 2, "threads: {:?}", profile.threads);

    let user = share(&profile, |n, _| n == "spin_in_user");
    let kernel = share(&profile, |n, _| n == "copy_in_kernel");
    assert!(
        user > 0.3 && kernel > 0.3,
        "spin {user:.2}, copy {kernel:.2}"
    );
    // The child's stacks, unwound from its own copy of the parent's mappings, reach main.
    let rooted = share(&profile, |n, _| n == "main");
    assert!(rooted >= 0.95, "main in only {rooted:.2} of samples");
    // Kernel callchains of the child's reads, named from kallsyms.
    let in_kernel_named = share(&profile, |n, k| {
        k == FrameKind::Kernel && n != "[unknown]" && n.contains("read")
    });
    assert!(
        in_kernel_named > 0.2,
        "named kernel read frames in only {in_kernel_named:.2} of samples"
    );
    assert_eq!(profile.meta.source, "perf.data");
    assert_eq!(profile.meta.frequency_hz, Some(999));
}

#[test]
fn damaged_files_are_errors_naming_the_file_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let data = record_forking(dir.path(), "-fno-omit-frame-pointer", &["-F", "999", "-g"]);
    let bytes = std::fs::read(&data).unwrap();
    for (name, cut) in [
        ("header.data", 100),
        ("half.data", bytes.len() / 2),
        ("last-byte.data", bytes.len() - 1),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let err = read_perf_data(&path, &mut |_| {}).expect_err("a truncated file reads");
        let text = err.to_string();
        assert!(
            text.contains(name) && text.contains("byte") && !text.contains('\n'),
            "{text}"
        );
    }
    // A data section larger than the file, as a damaged header would state it.
    let mut huge = bytes.clone();
    huge[48..56].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let path = dir.path().join("huge.data");
    std::fs::write(&path, &huge).unwrap();
    let text = read_perf_data(&path, &mut |_| {})
        .expect_err("a file with a data section past its end reads")
        .to_string();
    assert!(
        text.contains("huge.data") && text.contains("data section") && text.contains("byte 40"),
        "{text}"
    );
}

#[test]
fn a_kernel_moved_since_the_recording_is_hinted_at() {
    let dir = tempfile::tempdir().unwrap();
    let data = record_forking(dir.path(), "-fno-omit-frame-pointer", &["-F", "999", "-g"]);
    let moved_hint = |r: &Recording| {
        r.hints
            .iter()
            .any(|h| matches!(h, Hint::Said(h) if h.contains("running kernel")))
    };
    let same = read_perf_data(&data, &mut |_| {}).expect("read perf.data");
    assert!(!moved_hint(&same), "hints: {:?}", same.hints);

    // perf's kernel mapping record: header, pid/tid, start, len, pgoff (the text address), path.
    let mut bytes = std::fs::read(&data).unwrap();
    let path_at = bytes
        .windows(22)
        .position(|w| w == b"[kernel.kallsyms]_text")
        .expect("a kernel mapping record");
    let pgoff = path_at - 8;
    let text = u64::from_le_bytes(bytes[pgoff..path_at].try_into().unwrap());
    bytes[pgoff..path_at].copy_from_slice(&(text + 0x20_0000).to_le_bytes());
    let moved = dir.path().join("moved.data");
    std::fs::write(&moved, &bytes).unwrap();
    let other = read_perf_data(&moved, &mut |_| {}).expect("read perf.data");
    assert!(moved_hint(&other), "hints: {:?}", other.hints);
}
