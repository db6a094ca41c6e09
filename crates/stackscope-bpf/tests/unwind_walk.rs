//! The in-kernel user-stack walker (unwind.bpf.h over the tables of tables.rs) on real
//! programs, through the BPF recorder: a signal handler (the walk crosses the signal frame), a
//! binary without unwind tables (frame pointers there, tables again in libc), and a Rust
//! recursion deeper than the walker's frame limit. Needs root, BTF and kernel >= 5.17.

#![cfg(target_os = "linux")]

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use stackscope_bpf::{record, BpfConfig, Rate};
use stackscope_process::target::Target;
use stackscope_profile::Profile;
use stackscope_stacks::{Recording, SourceFigures};

/// One BPF recording at a time: they share the machine's CPUs and the tests count samples.
static SERIAL: Mutex<()> = Mutex::new(());

/// Spends ~1.5 s of CPU in a SIGUSR1 handler, entered from raise() under busy().
const SIGNAL_C: &str = r#"
#include <signal.h>
#include <time.h>
static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
volatile unsigned long sink;
__attribute__((noipa)) void in_handler(void) {
    double start = cpu();
    while (cpu() - start < 1.5)
        for (int i = 0; i < 100000; i++) sink++;
}
__attribute__((noipa)) void handler(int sig) { (void)sig; in_handler(); sink++; }
__attribute__((noipa)) void busy(void) { raise(SIGUSR1); sink++; }
int main(void) { signal(SIGUSR1, handler); busy(); return 0; }
"#;

/// leaf under middle under main for ~1.5 s of CPU; built with frame pointers and no unwind
/// tables at all.
const FRAME_POINTER_C: &str = r#"
#include <time.h>
static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
volatile unsigned long sink;
__attribute__((noipa)) void leaf(void) { for (int i = 0; i < 100000; i++) sink += i; }
__attribute__((noipa)) void middle(void) { leaf(); sink++; }
int main(void) {
    double start = cpu();
    while (cpu() - start < 1.5) middle();
    return 0;
}
"#;

/// SHA-256 and SHA-512 from libcrypto for ~1.5 s of CPU: its hand-written assembly realigns
/// the stack and describes the caller's frame with `*(rsp + n) + 8`.
const SHA_C: &str = r#"
#include <stddef.h>
#include <time.h>
unsigned char *SHA256(const unsigned char *d, size_t n, unsigned char *md);
unsigned char *SHA512(const unsigned char *d, size_t n, unsigned char *md);
static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
static unsigned char buf[1 << 16], md[64];
__attribute__((noipa)) void hash(void) {
    SHA256(buf, sizeof buf, md);
    SHA512(buf, sizeof buf, md);
    buf[0] = md[0];
}
int main(void) {
    double start = cpu();
    while (cpu() - start < 1.5) hash();
    return 0;
}
"#;

/// Recursion 300 deep, then ~1.5 s of CPU at the bottom.
const DEEP_RS: &str = r#"
use std::hint::black_box;
use std::time::{Duration, Instant};
#[inline(never)]
fn spin() -> u64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_millis(1500) {
        for _ in 0..10_000 { n = black_box(n + 1); }
    }
    n
}
#[inline(never)]
fn recurse(depth: u32) -> u64 {
    let mut buf = [0u8; 24];
    buf[0] = depth as u8;
    black_box(&mut buf);
    if depth == 0 { return spin(); }
    black_box(recurse(black_box(depth - 1))) + buf[0] as u64
}
fn main() { std::process::exit((recurse(300) & 1) as i32) }
"#;

fn run(exe: std::path::PathBuf) -> Recording {
    run_with(exe, |_| {})
}

/// `run` with the config changed by `set`.
fn run_with(exe: std::path::PathBuf, set: impl FnOnce(&mut BpfConfig)) -> Recording {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut config = BpfConfig::new(Target::Command(vec![exe.into()]), Rate::Frequency(499));
    set(&mut config);
    let stop = AtomicBool::new(false);
    let rec = record(config, &stop, || {}).expect("BPF recording failed");
    let verified = match &rec.figures {
        Some(SourceFigures::Bpf(figures)) => Some(&figures.cost.verified_insns),
        _ => None,
    };
    eprintln!("instructions verified: {verified:?}");
    assert!(
        rec.exit_status.is_some(),
        "the workload did not finish: {:?}",
        rec.exit_status
    );
    rec
}

/// Stacks, root first, as frame names, with their counts.
fn stacks(profile: &Profile) -> Vec<(Vec<&str>, u64)> {
    profile
        .samples
        .iter()
        .map(|s| {
            let names = profile
                .stack(s.stack)
                .frames
                .iter()
                .map(|&f| profile.frame(f).name.as_str())
                .collect();
            (names, s.count)
        })
        .collect()
}

fn top(stacks: &[(Vec<&str>, u64)]) -> String {
    let mut sorted: Vec<_> = stacks.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.1));
    sorted
        .iter()
        .take(6)
        .map(|(names, count)| format!("\n  {} {count}", names.join(";")))
        .collect()
}

/// Asserts at least 99% of the samples in `leaf` went through `path` (outermost first,
/// not necessarily adjacent) and down to `_start`; at least `min` such samples.
fn assert_whole(profile: &Profile, leaf: &str, path: &[&str], min: u64) {
    let stacks = stacks(profile);
    let in_leaf: Vec<_> = stacks.iter().filter(|s| s.0.contains(&leaf)).collect();
    let all: u64 = in_leaf.iter().map(|s| s.1).sum();
    assert!(all >= min, "only {all} samples in {leaf}:{}", top(&stacks));
    let whole: u64 = in_leaf
        .iter()
        .filter(|(names, _)| {
            let mut rest = names.iter().skip_while(|n| **n != "_start");
            rest.next().is_some() && path.iter().all(|p| rest.any(|n| n == p))
        })
        .map(|s| s.1)
        .sum();
    assert!(
        whole * 100 >= all * 99,
        "{whole} of {all} samples in {leaf} unwound from _start through {path:?}:{}",
        top(&stacks)
    );
}

fn gcc(dir: &std::path::Path, name: &str, text: &str, args: &[&str]) -> std::path::PathBuf {
    stackscope_testkit::compile("gcc", dir, (&format!("{name}.c"), text), args, &[], name)
}

#[test]
fn walk_crosses_a_signal_frame() {
    let dir = tempfile::tempdir().unwrap();
    let exe = gcc(
        dir.path(),
        "signal",
        SIGNAL_C,
        &["-O2", "-g", "-fomit-frame-pointer"],
    );
    let rec = run(exe);
    assert_whole(
        &rec.profile,
        "in_handler",
        &["main", "busy", "handler", "in_handler"],
        200,
    );
}

#[test]
fn code_without_unwind_tables_is_walked_by_frame_pointers() {
    let dir = tempfile::tempdir().unwrap();
    let exe = gcc(
        dir.path(),
        "fp",
        FRAME_POINTER_C,
        &[
            // -O0: gcc sets up no frame in a leaf that needs no stack at -O1 and above, and
            // no frame-pointer walk can see such a leaf's caller.
            "-O0",
            "-fno-omit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
    );
    let rec = run(exe);
    assert_whole(&rec.profile, "leaf", &["main", "middle", "leaf"], 200);
}

#[test]
fn walk_leaves_openssl_realigned_frames() {
    let libcrypto = [
        "/usr/lib/x86_64-linux-gnu/libcrypto.so.3",
        "/usr/lib64/libcrypto.so.3",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libcrypto.so.3 (libssl3) is installed");
    let dir = tempfile::tempdir().unwrap();
    let exe = stackscope_testkit::compile(
        "gcc",
        dir.path(),
        ("sha.c", SHA_C),
        &["-O2", "-fomit-frame-pointer"],
        &[libcrypto],
        "sha",
    );
    let rec = run(exe);
    let stacks = stacks(&rec.profile);
    let all: u64 = stacks.iter().map(|s| s.1).sum();
    let in_hash: u64 = stacks
        .iter()
        .filter(|s| s.0.contains(&"hash"))
        .map(|s| s.1)
        .sum();
    // A stack that broke off in libcrypto would not reach hash.
    assert!(
        in_hash * 100 >= all * 95,
        "{in_hash} of {all} samples reached hash:{}",
        top(&stacks)
    );
    assert_whole(&rec.profile, "hash", &["main", "hash"], 200);
}

fn deep_rs(dir: &std::path::Path) -> std::path::PathBuf {
    stackscope_testkit::compile(
        "rustc",
        dir,
        ("deep.rs", DEEP_RS),
        &["-O", "-C", "debuginfo=line-tables-only"],
        &[],
        "deep",
    )
}

/// The most `recurse` frames in one stack.
fn deepest(stacks: &[(Vec<&str>, u64)]) -> usize {
    stacks
        .iter()
        .map(|(names, _)| names.iter().filter(|n| n.contains("recurse")).count())
        .max()
        .unwrap_or(0)
}

#[test]
fn deep_rust_recursion_reaches_main_past_127_frames() {
    let dir = tempfile::tempdir().unwrap();
    let rec = run(deep_rs(dir.path()));
    let stacks = stacks(&rec.profile);
    // spin, 301 recurse frames, main and the entry: past bcc's 127 by the default limit.
    let in_spin: Vec<_> = stacks
        .iter()
        .filter(|s| s.0.iter().any(|n| n.contains("spin")))
        .collect();
    let all: u64 = in_spin.iter().map(|s| s.1).sum();
    let whole: u64 = in_spin
        .iter()
        .filter(|(names, _)| {
            names.contains(&"main") && names.iter().filter(|n| n.contains("recurse")).count() == 301
        })
        .map(|s| s.1)
        .sum();
    // spin runs 1.5 s of wall time: a loaded machine gives it fewer samples.
    assert!(all >= 50, "{all} samples in spin:{}", top(&stacks));
    assert!(
        whole * 100 >= all * 95,
        "{whole} of {all} samples in spin have 301 recurse frames under main:{}",
        top(&stacks)
    );
    assert_eq!(deepest(&stacks), 301, "{}", top(&stacks));
}

#[test]
fn deep_rust_recursion_stops_at_the_frame_limit() {
    let dir = tempfile::tempdir().unwrap();
    let rec = run_with(deep_rs(dir.path()), |c| c.max_frames = 127);
    let stacks = stacks(&rec.profile);
    let deepest = deepest(&stacks);
    // 127 user frames at most: spin and ~125 of the 301 recurse frames, never main.
    assert!(
        (110..=127).contains(&deepest),
        "{deepest} recurse frames in the deepest stack:{}",
        top(&stacks)
    );
    let in_spin: Vec<_> = stacks
        .iter()
        .filter(|s| s.0.iter().any(|n| n.contains("spin")))
        .collect();
    assert!(!in_spin.is_empty(), "no samples in spin:{}", top(&stacks));
    assert!(
        in_spin.iter().all(|(names, _)| !names.contains(&"main")),
        "a stack deeper than the frame limit reached main:{}",
        top(&stacks)
    );
}
