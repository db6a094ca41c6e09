//! The sources' hints worded for the command line: each names the flags that would help, so
//! the sources never do. The words are the ones the profile's hints have always carried.

use stackscope_stacks::{Hint, Recording};

/// One hint as the profile carries it.
pub(crate) fn sentence(hint: &Hint) -> String {
    match hint {
        Hint::StackCopyShort { share, bytes, max } => format!(
            "{share:.1}% of stacks were deeper than the {bytes}-byte stack copy: raise --stack-size (at most {max})"
        ),
        Hint::ShortChains { share } => format!(
            "{share:.1}% of frame-pointer stacks stop short of their entry point: the code was built without frame pointers; use --unwind dwarf (the default)"
        ),
        Hint::RingFull { lost } => format!(
            "{lost} samples were lost because the ring buffer was full: lower -F or --stack-size"
        ),
        Hint::CountMapFull { dropped, entries } => format!(
            "{dropped} samples were not counted because the count map was full: raise --hash-storage-size (it is {entries})"
        ),
        Hint::StackStorageFull { missed, entries } => format!(
            "{missed} stack traces could not be stored because the kernel's stack storage was full: raise `stackscope profile --stack-storage-size` (it is {entries})"
        ),
        Hint::StackCollisions {
            missed,
            stored,
            buckets,
        } => format!(
            "{missed} stack traces could not be stored because another stack held their hash bucket: the kernel's stack storage keeps one stack per bucket, so {stored} stacks in {buckets} buckets collide now and then long before it is full; a larger `stackscope profile --stack-storage-size` makes it rarer"
        ),
        Hint::Said(text) => text.clone(),
    }
}

/// Words the recording's hints into its profile, where the summary and every output format
/// find them.
pub(crate) fn word_hints(recording: &mut Recording) {
    let worded = recording.hints.iter().map(sentence);
    recording.profile.meta.hints.extend(worded);
}
