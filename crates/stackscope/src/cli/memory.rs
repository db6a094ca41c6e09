//! `record`'s memory flags: bytes allocated (`--alloc`) or still held (`--in-use`) by the
//! stacks that allocated them, instead of CPU samples.

use std::time::Duration;

use clap::Args;

use super::flags::seconds;

#[derive(Args)]
pub struct MemoryArgs {
    /// Count memory instead of CPU samples: the bytes each stack allocated, and its
    /// allocations, at the allocator's entry points (glibc's malloc, calloc, realloc,
    /// reallocarray, posix_memalign, aligned_alloc, memalign, valloc, pvalloc; anonymous
    /// mmap; jemalloc's under tikv-jemallocator's `_rjem_` prefix and mimalloc's where the
    /// program links them). A realloc counts as a new allocation. Counted in the kernel, each
    /// call exactly (or sampled: --sample-bytes): the probes cost the program a few microseconds per allocation. eBPF
    /// backend (root, or CAP_BPF+CAP_PERFMON); user stacks only. pprof: alloc_objects/count
    /// and alloc_space/bytes.
    #[arg(long, hide_short_help = true, conflicts_with = "in_use")]
    pub alloc: bool,

    /// Count the memory still held when recording ends: each allocation is kept (address,
    /// size, stack, time) until it is freed, and what is left at the end is folded by the
    /// stack that allocated it. A realloc frees its old block and allocates a new one;
    /// allocations made before recording began are not seen, and their frees count nothing.
    /// pprof: inuse_objects/count and inuse_space/bytes.
    #[arg(long, hide_short_help = true)]
    pub in_use: bool,

    /// With --in-use: leave out blocks younger than SECS seconds at the end (leak candidates:
    /// what was allocated long ago and is still held).
    #[arg(long, value_name = "SECS", value_parser = seconds, hide_short_help = true)]
    pub min_age: Option<Duration>,

    /// With --in-use: live allocations kept at once (default: as many as a sixteenth of the
    /// machine's memory holds, at 160 bytes each). When full, newer allocations are not
    /// tracked: the summary says how many and their bytes.
    #[arg(long, value_name = "N", hide_short_help = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_live: Option<u32>,

    /// With --alloc or --in-use: count at an allocator of the program's own too (an arena's),
    /// FILE:ALLOC or FILE:ALLOC,FREE (repeatable). ALLOC takes the size as its first argument
    /// and returns the block; FREE, probed with --in-use, takes the block as its first
    /// argument. FILE as for `-e uprobe:FILE:FUNC`. Allocator calls inside ALLOC count once,
    /// as ALLOC.
    #[arg(long = "alloc-fn", value_name = "FILE:ALLOC[,FREE]", value_parser = parse_alloc_fn,
          hide_short_help = true)]
    pub alloc_fns: Vec<AllocFnArg>,

    /// With --alloc (not yet --in-use): sample instead of counting every call, one allocation per N
    /// bytes allocated on average (N as 524288, 512K, 4M or 1G), for programs that allocate
    /// millions of times a second. Sample points fall on the bytes at random, one per N on
    /// average, as Go's and jemalloc's heap profilers sample; an allocation holding k points
    /// counts as k*N bytes and k*N/size allocations, so each stack's bytes and allocations
    /// are unbiased estimates, a stack's bytes within a few sqrt(bytes*N) of the truth (about
    /// bytes/N samples). Allocations of 16*N bytes or more are counted exactly. Decided in the
    /// kernel: unsampled calls take no stack. The probes still trap at every call.
    #[arg(long, value_name = "N", value_parser = parse_sample_bytes, hide_short_help = true)]
    pub sample_bytes: Option<u64>,
}

/// `--sample-bytes`: a byte count, with an optional K, M or G (powers of 1024).
fn parse_sample_bytes(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is no byte count: give N, NK, NM or NG (as 512K), at least 1");
    let (digits, shift) = match s.char_indices().last() {
        Some((at, 'k' | 'K')) => (&s[..at], 10),
        Some((at, 'm' | 'M')) => (&s[..at], 20),
        Some((at, 'g' | 'G')) => (&s[..at], 30),
        _ => (s, 0),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    match n.checked_mul(1 << shift) {
        Some(0) => Err(bad()),
        // Bounded so that the kernel's gap arithmetic (N times a 22-bit logarithm) stays in
        // 64 bits.
        Some(bytes) if bytes <= MAX_SAMPLE_BYTES => Ok(bytes),
        _ => Err(format!("--sample-bytes {s}: at most 1024G")),
    }
}

/// The largest --sample-bytes.
const MAX_SAMPLE_BYTES: u64 = 1 << 40;

/// An `--alloc-fn` as the eBPF source takes it.
#[cfg(target_os = "linux")]
pub type AllocFnArg = stackscope_bpf::AllocFn;
/// An `--alloc-fn` where there is no eBPF: its words, refused before sampling.
#[cfg(not(target_os = "linux"))]
pub type AllocFnArg = String;

fn parse_alloc_fn(s: &str) -> Result<AllocFnArg, String> {
    s.parse::<AllocFnArg>().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_bytes_reads_counts_with_binary_suffixes_and_refuses_the_rest() {
        assert_eq!(parse_sample_bytes("4096"), Ok(4096));
        assert_eq!(parse_sample_bytes("512K"), Ok(512 * 1024));
        assert_eq!(parse_sample_bytes("4m"), Ok(4 << 20));
        assert_eq!(parse_sample_bytes("1G"), Ok(1 << 30));
        for bad in ["", "0", "K", "-1", "1.5M", "12Q", "2048G"] {
            let err = parse_sample_bytes(bad).unwrap_err();
            assert!(err.contains(bad) && !err.contains('\n'), "{bad}: {err}");
        }
    }
}
