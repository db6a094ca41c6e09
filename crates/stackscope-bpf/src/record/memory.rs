//! Memory by stack (`record --alloc`, `--in-use`): what to count, and the counts read back at
//! the end, as bytes and allocations per key: the totals the program kept, or the blocks still
//! live folded by the stacks that allocated them.

use std::collections::HashMap;
use std::fmt;

use stackscope_profile::{ALLOC_EVENT, IN_USE_EVENT};
use stackscope_stacks::Hint;

use libbpf_rs::{MapCore, MapFlags};

use crate::layout::{self, CountKey};
use crate::program::{self, ProfileSkel};

/// Bytes rather than samples: what `record --alloc` and `--in-use` count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryProfile {
    /// Every allocation's bytes, by the stack that made it.
    Allocated,
    /// The bytes still held when recording ends (allocated while it ran, not freed), by the
    /// stack that allocated them, left out when younger than `min_age_ns`; at most `max_live`
    /// blocks are kept at once.
    InUse { min_age_ns: u64, max_live: u32 },
}

impl MemoryProfile {
    /// The profile's event: [`ALLOC_EVENT`] or [`IN_USE_EVENT`].
    pub fn event(&self) -> &'static str {
        match self {
            MemoryProfile::Allocated => ALLOC_EVENT,
            MemoryProfile::InUse { .. } => IN_USE_EVENT,
        }
    }
}

impl fmt::Display for MemoryProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemoryProfile::Allocated => "bytes allocated",
            MemoryProfile::InUse { .. } => "bytes in use",
        })
    }
}

/// Bytes a live block takes in the kernel's map, key, value and the map's own header: what
/// [`default_max_live`] divides by.
const LIVE_ENTRY_BYTES: u64 = 160;

/// Live blocks kept at once unless told: as many as a sixteenth of the machine's memory holds
/// (no fewer than 65,536, no more than 16 Mi). The map takes room as blocks come, so this is a
/// bound, not what it costs.
pub fn default_max_live() -> u32 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(1 << 30, |kib| kib * 1024);
    (total / 16 / LIVE_ENTRY_BYTES).clamp(1 << 16, 1 << 24) as u32
}

/// Bytes and allocations by key: the program's totals (`--alloc`), or the blocks still live
/// at `ended` (bpf_ktime_get_ns) and at least `min_age_ns` old, folded by key (`--in-use`).
pub(super) fn counts(
    skel: &ProfileSkel<'_>,
    memory: &MemoryProfile,
    ended: u64,
) -> Vec<(CountKey, u64, u64)> {
    // With -a the probes go into stackscope too, whose own allocations (reading maps,
    // loading tables, detaching) are not the system's.
    let own = std::process::id();
    let MemoryProfile::InUse { min_age_ns, .. } = *memory else {
        let mut totals = alloc_totals(skel);
        totals.retain(|(key, _, _)| key.pid != own);
        return totals;
    };
    let mut by_key: HashMap<CountKey, (u64, u64)> = HashMap::new();
    for (size, since, milli, key) in live_blocks(skel) {
        if key.pid == own || ended.saturating_sub(since) < min_age_ns {
            continue;
        }
        let held = by_key.entry(key).or_insert((0, 0));
        held.0 += size;
        held.1 += milli;
    }
    by_key
        .into_iter()
        .map(|(key, (bytes, milli))| (key, bytes, allocations(milli)))
        .collect()
}

/// Allocations from the thousandths the program counts them in (a sampled allocation stands
/// for a fraction of one or several), rounded; exact when every call is counted.
fn allocations(milli: u64) -> u64 {
    (milli + 500) / 1000
}

/// That the counts are estimates, when sampled (`sample_bytes`), and what a full live map
/// left out: never a silent undercount.
pub(super) fn hints(
    skel: &ProfileSkel<'_>,
    memory: &MemoryProfile,
    sample_bytes: Option<u64>,
) -> Vec<Hint> {
    let mut hints = Vec::new();
    if let Some(n) = sample_bytes {
        hints.push(Hint::Said(format!(
            "bytes and allocations are estimates: about one allocation per {n} bytes was sampled (--sample-bytes), each weighed as the bytes it stands for, so a stack's B bytes are within a few sqrt(B*{n}) of its own; allocations of {} bytes or more are counted exactly",
            16 * n
        )));
    }
    let MemoryProfile::InUse { max_live, .. } = *memory else {
        return hints;
    };
    let (blocks, bytes) = live_drops(skel);
    if blocks > 0 {
        hints.push(Hint::Said(format!(
            "the live-allocation map was full ({max_live} blocks): {blocks} newer allocations ({bytes} bytes) were not tracked, so what they still hold is missing; --max-live can keep more"
        )));
    }
    hints
}

/// Bytes and allocations counted by key (`--alloc`).
fn alloc_totals(skel: &ProfileSkel<'_>) -> Vec<(CountKey, u64, u64)> {
    let map = &skel.maps.alloc_totals;
    map.keys()
        .filter_map(|key| {
            let value = map.lookup(&key, MapFlags::ANY).ok()??;
            let bytes = layout::words(&value).next()?;
            let milli = layout::words(&value).nth(1)?;
            Some((CountKey::from_bytes(&key)?, bytes, allocations(milli)))
        })
        .collect()
}

/// The blocks still live (`--in-use`): the bytes each stands for, when allocated
/// (bpf_ktime_get_ns), the thousandths of an allocation it stands for, and the key of the
/// stacks that allocated it.
fn live_blocks(skel: &ProfileSkel<'_>) -> Vec<(u64, u64, u64, CountKey)> {
    let map = &skel.maps.live_allocs;
    map.keys()
        .filter_map(|key| {
            let value = map.lookup(&key, MapFlags::ANY).ok()??;
            let mut words = layout::words(&value);
            let (size, since, milli) = (words.next()?, words.next()?, words.next()?);
            Some((size, since, milli, CountKey::from_bytes(value.get(24..)?)?))
        })
        .collect()
}

/// Allocations the live map had no room for, and their bytes.
fn live_drops(skel: &ProfileSkel<'_>) -> (u64, u64) {
    (
        program::drop_counter(skel, layout::DROP_LIVE_FULL),
        program::drop_counter(skel, layout::DROP_LIVE_FULL_BYTES),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_live_bound_stays_within_its_limits() {
        let n = default_max_live();
        assert!((1 << 16..=1 << 24).contains(&n), "{n}");
    }
}
