//! Deep stacks of big frames on a thread with a large stack, through a shared object with a
//! large `.eh_frame`: what a compiler's query stacks look like to a profiler. A thread of its
//! own, with a 64 MiB stack, runs `descend` 205 levels down and back up, again and again;
//! each level holds 8 KiB of locals and calls the next through one of the thousands of
//! functions of `libbigeh.so` (each level its own), and works on the way down and on the way
//! up, in slices of pseudo-random length, so that samples land at every depth. A stack copy
//! of at most 64 KiB holds a handful of the 410 frames.
//!
//! Usage: big_deep ROUNDS: the deep thread goes down and up ROUNDS times (about 0.15 s of
//! CPU each), a fixed amount of work however loaded the machine. Built with plain `rustc`,
//! linked against `libbigeh.so`, whose `bigeh_pass(level)` gives the function for a level: it
//! calls `next(level + 1, seed)`.

use std::hint::black_box;

const DEPTH: i64 = 205;
/// 8 KiB of locals per level.
const LOCAL_WORDS: usize = 1024;

type Next = extern "C" fn(i64, u64) -> u64;
type Pass = extern "C" fn(Next, i64, u64) -> u64;

#[link(name = "bigeh")]
unsafe extern "C" {
    fn bigeh_pass(level: i64) -> Pass;
}

/// A slice of work of pseudo-random length, 0.1 to 0.6 ms or so.
#[inline(never)]
fn work(seed: u64) -> u64 {
    let rounds = 60_000 + (seed >> 40) % 300_000;
    let mut x = seed | 1;
    for _ in 0..rounds {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    black_box(x)
}

fn next_seed(seed: u64) -> u64 {
    seed.wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407)
}

/// One level: big locals, work, the next level through the shared object, work again.
extern "C" fn descend(level: i64, seed: u64) -> u64 {
    let mut locals = [0u64; LOCAL_WORDS];
    for (i, word) in locals.iter_mut().enumerate().step_by(61) {
        *word = seed ^ i as u64;
    }
    black_box(&mut locals);
    let mut acc = work(seed);
    if level < DEPTH {
        // SAFETY: the shared object gives a valid function for every level.
        let pass = unsafe { bigeh_pass(level) };
        acc ^= pass(descend, level, next_seed(seed));
        acc ^= work(acc ^ seed);
    }
    black_box(&locals);
    acc ^ locals[(seed % LOCAL_WORDS as u64) as usize]
}

fn main() {
    let rounds: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let worker = std::thread::Builder::new()
        .name("deep".into())
        .stack_size(64 << 20)
        .spawn(move || {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            let mut acc = 0;
            for _ in 0..rounds {
                acc ^= descend(0, seed);
                seed = next_seed(seed ^ acc);
            }
            acc
        })
        .expect("spawn the deep thread");
    black_box(worker.join().expect("the deep thread"));
}
