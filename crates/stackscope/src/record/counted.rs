//! What a recording counts other than CPU samples, from record's flags: time off the CPU
//! (`--off-cpu`) or on and off it (`--wall`), and memory (`--alloc`, `--in-use`), each refused
//! beside the flags it cannot be counted with.

use anyhow::{bail, Result};
use stackscope_bpf::{default_max_live, MemoryProfile, TimeProfile};

use crate::cli::RecordArgs;

/// `--off-cpu` or `--wall`, refused beside what they cannot be counted with.
pub(super) fn time_profile(args: &RecordArgs) -> Result<Option<TimeProfile>> {
    let flag = match (args.off_cpu, args.wall) {
        (true, true) => bail!(
            "--wall counts off-CPU time already (beside on-CPU time): give --wall or --off-cpu, not both"
        ),
        (true, false) => "--off-cpu",
        (false, true) => "--wall",
        (false, false) => {
            if args.min_block.is_some() {
                bail!("--min-block is for --off-cpu: it leaves out blocks shorter than it");
            }
            return Ok(None);
        }
    };
    if let Some(event) = args.events.first() {
        bail!("{flag} counts time and --event {event} counts hits: record them apart");
    }
    if args.wall && args.min_block.is_some() {
        bail!("--min-block is for --off-cpu: --wall counts every block, so that a thread's on- and off-CPU times add up to its wall-clock time");
    }
    let timer = args.rate.frequency.frequency.is_some() || args.rate.count.is_some();
    if args.off_cpu && timer {
        bail!("--off-cpu takes no timer: -F/-c set the on-CPU sampling of --wall");
    }
    Ok(Some(match args.wall {
        true => TimeProfile::Wall,
        false => TimeProfile::OffCpu {
            min_block_ns: args.min_block.unwrap_or(0).saturating_mul(1000),
        },
    }))
}

/// `--alloc` or `--in-use`, refused beside what they cannot be counted with.
pub(super) fn memory_profile(args: &RecordArgs) -> Result<Option<MemoryProfile>> {
    let memory = &args.memory;
    if !memory.in_use && !memory.alloc && !memory.alloc_fns.is_empty() {
        bail!("--alloc-fn adds an allocator to --alloc or --in-use: give one of them");
    }
    if !memory.alloc && memory.sample_bytes.is_some() {
        // Sampled held bytes came out above what a program held, past their error, in one
        // loaded test run: refused until that is understood, rather than a wrong estimate.
        bail!(
            "--sample-bytes samples the allocations of --alloc (with --in-use its estimate is not yet trusted): give --alloc"
        );
    }
    if !memory.in_use {
        if let Some(flag) = [
            (memory.min_age.is_some(), "--min-age"),
            (memory.max_live.is_some(), "--max-live"),
        ]
        .iter()
        .find_map(|&(given, flag)| given.then_some(flag))
        {
            bail!("{flag} is for --in-use: it applies to the allocations still held at the end");
        }
    }
    let (flag, profile) = match (memory.alloc, memory.in_use) {
        (true, _) => ("--alloc", MemoryProfile::Allocated),
        (false, true) => (
            "--in-use",
            MemoryProfile::InUse {
                min_age_ns: memory.min_age.map_or(0, |age| age.as_nanos() as u64),
                max_live: memory.max_live.unwrap_or_else(default_max_live),
            },
        ),
        (false, false) => return Ok(None),
    };
    if let Some(event) = args.events.first() {
        bail!("{flag} counts bytes and --event {event} counts hits: record them apart");
    }
    if args.off_cpu || args.wall {
        bail!("{flag} counts bytes and --off-cpu/--wall count time: record them apart");
    }
    if args.rate.frequency.frequency.is_some() || args.rate.count.is_some() {
        bail!("{flag} counts every allocation: -F/-c set a timer it does not use");
    }
    if args.stacks.kernel_stacks_only {
        bail!("{flag} takes user stacks only: an allocation's kernel stack is the probe's own");
    }
    Ok(Some(profile))
}

/// What a memory profile counts, in the title's and the announcement's words.
pub(super) fn memory_words(memory: &Option<MemoryProfile>) -> &'static str {
    match memory {
        Some(MemoryProfile::InUse { .. }) => "bytes still held at the end",
        _ => "bytes allocated",
    }
}
