//! Deep recursion (60 frames, non-tail) ending in two leaves that share the work, leaf_a about
//! 30% and leaf_b about 70% of it, in slices of pseudo-random length. The leaves call
//! `#[inline(always)]` helpers with distinctive names, so a profiler that reads inline debug
//! info shows them as inlined frames.
//!
//! Usage: rust_deep [ROUNDS [TRUTH_FILE]], as split.c: ROUNDS scales the work (default 4000,
//! about 2 s of CPU); with TRUTH_FILE, the thread CPU time each leaf measured itself, and all
//! since main started, is written there (at start, every 100 ms or so of CPU and at exit) as
//! `NAME NS` lines, `NAME` being the leaf's path as a profiler names it, then `cpu NS`.
//! Built with plain `rustc`, no crates: the clock is declared here.

use std::hint::black_box;

const DEPTH: u32 = 60;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

unsafe extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// The calling thread's CPU time in ns. Always inlined, so that the leaves read the clock
/// from their own frames and the time the read takes is sampled in them.
#[inline(always)]
fn thread_cpu_ns() -> u64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is Linux's thread CPU clock.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Thread CPU time spent in leaf_a and leaf_b, in ns (atomics only so that a static needs no
/// `unsafe`; one thread updates them).
static SPENT: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

fn spent(leaf: usize) -> u64 {
    SPENT[leaf].load(std::sync::atomic::Ordering::Relaxed)
}

#[inline(always)]
fn deep_helper_mix(n: u64, mut seed: u64) -> u64 {
    for _ in 0..n {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed ^= seed >> 29;
    }
    seed
}

#[inline(never)]
fn leaf_a(n: u64, seed: u64) -> u64 {
    let start = thread_cpu_ns();
    let seed = deep_helper_mix(black_box(n), seed);
    SPENT[0].fetch_add(
        thread_cpu_ns() - start,
        std::sync::atomic::Ordering::Relaxed,
    );
    seed
}

#[inline(never)]
fn leaf_b(n: u64, seed: u64) -> u64 {
    let start = thread_cpu_ns();
    // The xor keeps leaf_b's code distinct from leaf_a's, so the two are not merged.
    let seed = deep_helper_mix(black_box(n), seed ^ 0x5bd1_e995);
    SPENT[1].fetch_add(
        thread_cpu_ns() - start,
        std::sync::atomic::Ordering::Relaxed,
    );
    seed
}

/// A slice length between half and one and a half times `n`, pseudo-random (xorshift), so
/// that no steady sampling rate falls into step with the alternation of the two leaves.
fn slice_len(state: &mut u64, n: u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    n * (512 + (*state >> 54)) / 1024
}

/// Recurses `depth` times; the addition after the call keeps it from being a tail call.
#[inline(never)]
fn descend(depth: u32, n: u64, seed: u64, lengths: &mut u64) -> u64 {
    if depth == 0 {
        let s = leaf_a(3 * slice_len(lengths, n), seed);
        return leaf_b(7 * slice_len(lengths, n), s).wrapping_add(1);
    }
    descend(black_box(depth - 1), n, seed, lengths).wrapping_add(depth as u64)
}

/// Replaces `path` with the current totals: written aside, then renamed, so a reader never
/// sees half of it.
fn write_truth(path: &str, main_start: u64) {
    let text = format!(
        "{}::leaf_a {}\n{}::leaf_b {}\ncpu {}\n",
        module_path!(),
        spent(0),
        module_path!(),
        spent(1),
        thread_cpu_ns() - main_start
    );
    let tmp = format!("{path}.tmp");
    if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)) {
        eprintln!("rust_deep: cannot write {path}: {e}");
        std::process::exit(2);
    }
}

fn main() {
    let main_start = thread_cpu_ns();
    let mut args = std::env::args().skip(1);
    let rounds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(4000);
    let truth = args.next();
    if let Some(path) = &truth {
        write_truth(path, main_start);
    }
    let n = black_box(30_000u64);
    let (mut seed, mut lengths, mut written) = (1u64, 0x9e37_79b9_7f4a_7c15u64, 0u64);
    for _ in 0..rounds {
        seed = descend(DEPTH, n, seed, &mut lengths);
        if let Some(path) = &truth {
            if spent(0) + spent(1) - written >= 100_000_000 {
                written = spent(0) + spent(1);
                write_truth(path, main_start);
            }
        }
    }
    if let Some(path) = &truth {
        write_truth(path, main_start);
    }
    black_box(seed);
}
