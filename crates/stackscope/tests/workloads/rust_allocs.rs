//! The allocations workload in Rust, on the system allocator (glibc's malloc family; the
//! jemalloc_allocs package runs it on tikv-jemallocator): four
//! sites allocate known bytes a number of times given on the command line, every third block
//! is kept to the end (never freed) and the rest dropped, then the program prints its own account so a test
//! compares a memory profile with it. Sizes vary with the seed.
//! usage: rust_allocs SEED CALLS
//! Prints `SITE_bytes N SITE_calls N SITE_held N SITE_held_calls N ...` for every site.

use std::hint::black_box;

/// Bytes and calls a site asked for, and what it kept.
#[derive(Default)]
struct Account {
    bytes: u64,
    calls: u64,
    held: u64,
    held_calls: u64,
}

struct Sizes(u64);

impl Sizes {
    fn next(&mut self) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        8 + (self.0 >> 33) as usize % 3000
    }
}

/// `Vec::with_capacity`: malloc(n).
#[inline(never)]
fn site_vec(n: usize) -> Vec<u8> {
    black_box(Vec::with_capacity(n))
}

/// `vec![0; n]`: calloc(n, 1).
#[inline(never)]
fn site_zeroed(n: usize) -> Vec<u8> {
    black_box(vec![0u8; n])
}

/// A boxed array: malloc(256).
#[inline(never)]
fn site_boxed(fill: u64) -> Box<[u64; 32]> {
    black_box(Box::new([fill; 32]))
}

/// A vector filled to `a` bytes, then grown by `b` exactly: malloc(a), then realloc(a + b).
#[inline(never)]
fn site_grow(a: usize, b: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(a);
    v.resize(a, 1u8);
    v.reserve_exact(b);
    black_box(v)
}

impl Account {
    /// A call of `bytes` (or two, `calls`); its block of `holds` bytes kept when `keep`.
    fn count(&mut self, bytes: usize, calls: u64, holds: usize, keep: bool) {
        self.bytes += bytes as u64;
        self.calls += calls;
        if keep {
            self.held += holds as u64;
            self.held_calls += 1;
        }
    }
}

/// Public so that jemalloc_allocs runs the same sites on another allocator.
pub fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: rust_allocs SEED CALLS");
        std::process::exit(2);
    }
    let mut sizes = Sizes(args[1].parse().expect("SEED"));
    let calls: usize = args[2].parse().expect("CALLS");
    let names = ["site_vec", "site_zeroed", "site_boxed", "site_grow"];
    let [mut vec, mut zeroed, mut boxed, mut grow] = [(); 4].map(|_| Account::default());
    // Room for every kept block up front: these vectors grow no more.
    let mut kept: Vec<Vec<u8>> = Vec::with_capacity(3 * calls);
    let mut kept_boxes: Vec<Box<[u64; 32]>> = Vec::with_capacity(calls);
    for i in 0..calls {
        let keep = i % 3 == 0;
        let n = sizes.next();
        let block = site_vec(n);
        vec.count(n, 1, n, keep);
        let m = sizes.next();
        let zeros = site_zeroed(m);
        zeroed.count(m, 1, m, keep);
        let array = site_boxed(i as u64);
        boxed.count(256, 1, 256, keep);
        // malloc(a), then realloc to a + b: a + (a + b) bytes in two calls, a + b held.
        let (a, b) = (sizes.next(), sizes.next());
        let grown = site_grow(a, b);
        grow.count(2 * a + b, 2, a + b, keep);
        if keep {
            kept.extend([block, zeros, grown]);
            kept_boxes.push(array);
        }
    }
    let mut line = String::new();
    for (name, a) in names.iter().zip([&vec, &zeroed, &boxed, &grow]) {
        line.push_str(&format!(
            "{name}_bytes {} {name}_calls {} {name}_held {} {name}_held_calls {} ",
            a.bytes, a.calls, a.held, a.held_calls
        ));
    }
    println!("{line}");
    // Held to the end: the kept blocks are never freed.
    std::mem::forget(black_box((kept, kept_boxes)));
}
