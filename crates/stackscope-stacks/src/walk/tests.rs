use std::collections::HashMap;

use super::*;

/// A frame-pointer chain on a stack at 0x1000: two callers, the outermost frame pointer 0.
fn chain() -> HashMap<u64, u64> {
    HashMap::from([
        (0x1010, 0x1030),
        (0x1018, 0x5005),
        (0x1030, 0),
        (0x1038, 0x6006),
    ])
}

const REGS: RegsX86_64 = RegsX86_64 {
    ip: 0x4000,
    sp: 0x1000,
    bp: 0x1010,
};

fn walk_chain(
    leaf: Leaf,
    regs: RegsX86_64,
    read: impl FnMut(u64) -> Result<u64, Unread<&'static str>>,
) -> (Result<WalkEnd, &'static str>, Vec<u64>) {
    let unwinder = UnwinderX86_64::<SectionData>::new();
    let mut cache = CacheX86_64::new();
    let mut out = vec![1, 2, 3];
    let end = walk(&unwinder, &mut cache, regs, leaf, |_| true, read, &mut out);
    (end, out)
}

#[test]
fn without_unwind_info_the_walk_follows_frame_pointers() {
    let memory = chain();
    let read = |addr| memory.get(&addr).copied().ok_or(Unread::Unreadable);
    for leaf in [Leaf::Rules, Leaf::FramePointer] {
        let (end, out) = walk_chain(leaf, REGS, read);
        assert_eq!(end, Ok(WalkEnd::Complete));
        assert_eq!(out, [0x4000, 0x5004, 0x6005]);
    }
}

#[test]
fn a_zero_frame_pointer_ends_the_walk_only_where_tables_cover_the_code() {
    let memory = chain();
    let unwinder = UnwinderX86_64::<SectionData>::new();
    let mut cache = CacheX86_64::new();
    let mut trail = Trail::default();
    for (code, end) in [
        (Code::Tabled, WalkEnd::Complete),
        (Code::Untabled, WalkEnd::stopped(Stop::NoTable)),
    ] {
        let read = |addr| memory.get(&addr).copied().ok_or(Unread::<()>::Unreadable);
        let walked = walk_trail(
            &unwinder,
            &mut cache,
            (REGS, Leaf::Rules),
            |_| code,
            read,
            &mut trail,
        );
        assert_eq!(walked, Ok(end));
        assert_eq!(trail.addrs, [0x4000, 0x5004, 0x6005]);
        // Each caller's stack pointer is just above the frame record it was found in.
        assert_eq!(trail.sps, [0x1000, 0x1020, 0x1040]);
    }
}

#[test]
fn a_short_copy_truncates_and_a_failed_read_is_passed_on() {
    let memory = chain();
    let short = |addr| match addr {
        0x1030.. => Err(Unread::PastCopy),
        _ => memory.get(&addr).copied().ok_or(Unread::Unreadable),
    };
    let (end, out) = walk_chain(Leaf::Rules, REGS, short);
    assert_eq!(end, Ok(WalkEnd::Truncated));
    assert_eq!(out, [0x4000, 0x5004]);

    let lost = |_| Err(Unread::Failed("connection lost"));
    for leaf in [Leaf::Rules, Leaf::FramePointer] {
        assert_eq!(walk_chain(leaf, REGS, lost).0, Err("connection lost"));
    }
}

#[test]
fn a_frame_pointer_leaf_ends_at_a_null_or_bogus_frame_pointer() {
    let none = |_| Err(Unread::Unreadable);
    let outermost = RegsX86_64 { bp: 0, ..REGS };
    assert_eq!(
        walk_chain(Leaf::FramePointer, outermost, none),
        (Ok(WalkEnd::Complete), vec![0x4000])
    );
    let below_sp = RegsX86_64 { bp: 0x800, ..REGS };
    assert_eq!(
        walk_chain(Leaf::FramePointer, below_sp, none),
        (Ok(WalkEnd::stopped(Stop::NoTable)), vec![0x4000])
    );
}

#[test]
fn callchains_step_back_into_each_call() {
    let chain = [0x4000, 0x5005, 0x6006];
    assert_eq!(
        lookup_addresses(&chain).collect::<Vec<_>>(),
        [0x4000, 0x5004, 0x6005]
    );
}
