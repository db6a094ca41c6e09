//! What a source tells the user about stacks that are not whole or samples that are missing,
//! in the source's own terms: the figures and what ran short. The caller words each hint with
//! its own options (a command line's flags), so no source names them.

/// One thing the user could change to get whole stacks or every sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Hint {
    /// `share` percent of user stacks were deeper than the `bytes` of stack copied per
    /// sample, which can be raised up to `max` bytes.
    StackCopyShort { share: f64, bytes: u32, max: u32 },
    /// `share` percent of frame-pointer stacks stop short of their entry point: the code was
    /// built without frame pointers, and unwinding with DWARF would walk it.
    ShortChains { share: f64 },
    /// `lost` samples were lost because the ring buffer was full: sampling less often or
    /// copying less stack per sample would keep them.
    RingFull { lost: u64 },
    /// `dropped` samples were not counted because the count map, of `entries`, was full.
    CountMapFull { dropped: u64, entries: u32 },
    /// `missed` stacks could not be stored because the stack storage, of `entries` stacks,
    /// was full.
    StackStorageFull { missed: u64, entries: u32 },
    /// `missed` stacks could not be stored because another stack held their hash bucket in
    /// the kernel's stack storage, which keeps one stack per bucket: with `stored` stacks in
    /// `buckets` buckets, two share one long before the storage is full. More buckets make it
    /// rarer.
    StackCollisions {
        missed: u64,
        stored: u64,
        buckets: u64,
    },
    /// A hint that names none of the caller's options, worded by the source.
    Said(String),
}
