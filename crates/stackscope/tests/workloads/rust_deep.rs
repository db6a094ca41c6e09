//! Deep recursion (60 frames, non-tail) ending in two leaves that share the work 30/70.
//! The leaves call `#[inline(always)]` helpers with distinctive names, so a profiler that
//! reads inline debug info shows them as inlined frames.

use std::hint::black_box;

const DEPTH: u32 = 60;

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
    deep_helper_mix(black_box(n), seed)
}

#[inline(never)]
fn leaf_b(n: u64, seed: u64) -> u64 {
    // The xor keeps leaf_b's code distinct from leaf_a's, so the two are not merged.
    deep_helper_mix(black_box(n), seed ^ 0x5bd1_e995)
}

/// Recurses `depth` times; the addition after the call keeps it from being a tail call.
#[inline(never)]
fn descend(depth: u32, n: u64, seed: u64) -> u64 {
    if depth == 0 {
        let s = leaf_a(3 * n, seed);
        return leaf_b(7 * n, s).wrapping_add(1);
    }
    descend(black_box(depth - 1), n, seed).wrapping_add(depth as u64)
}

fn main() {
    let rounds: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4000);
    let n = black_box(30_000u64);
    let mut seed = 1u64;
    for _ in 0..rounds {
        seed = descend(DEPTH, n, seed);
    }
    black_box(seed);
}
