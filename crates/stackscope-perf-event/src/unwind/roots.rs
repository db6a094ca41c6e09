//! The outer frames of deep stacks, remembered per thread. A stack copy of at most 64 KiB
//! cannot hold a thread whose stack top lies further from the sampled frame, but the part of
//! a thread's stack above a live frame does not change while that frame lives: an earlier
//! walk of the same thread that passed the same visit of the frame (the same stack address,
//! the same code address, and the same first bytes of the frame) found its callers, and they
//! are its callers still. Each step outward is taken the same way, from the walk that passed
//! the caller's visit. Where no walk passed that visit, the step is taken from the latest
//! walk that passed the same frame at the same stack address: the same function called
//! from the same place at the same depth, whose callers are, but for a program that reaches
//! one frame at one depth through different callers, the same.
//!
//! Samples whose walk ran out where no earlier walk passed wait, a bounded number per
//! thread, until the thread exits, execs or the recording ends: a later sample may have
//! passed there since.

use std::collections::HashMap;

use stackscope_stacks::walk::{Trail, WalkEnd, MAX_FRAMES};

/// Bytes of a frame, from its stack pointer up, that tell one visit of the frame from another:
/// its lowest locals and saved registers.
const PRINT_BYTES: u64 = 64;

/// Frames remembered per thread before its memory is started afresh: a few MiB at most for a
/// thread whose stacks keep changing.
const SPOTS_PER_THREAD: usize = 1 << 16;

/// Samples kept waiting per thread before they are settled with what is known.
const WAITING_PER_THREAD: usize = 4096;

/// One frame as a walk found it: the stack pointer in it and its address to symbolize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Spot {
    pub sp: u64,
    pub addr: u64,
}

impl Spot {
    /// The outermost frame a walk reached.
    pub(crate) fn outermost(trail: &Trail) -> Option<Spot> {
        Some(Spot {
            sp: *trail.sps.last()?,
            addr: *trail.addrs.last()?,
        })
    }
}

/// The stack memory a sample copied: `bytes` from address `sp` up.
#[derive(Clone, Copy)]
pub(crate) struct Copy<'a> {
    pub sp: u64,
    pub bytes: &'a [u8],
}

impl Copy<'_> {
    /// A digest of the first [`PRINT_BYTES`] of the frame whose stack pointer is `sp`, when
    /// the copy holds them.
    pub(crate) fn print(&self, sp: u64) -> Option<u64> {
        let start = usize::try_from(sp.checked_sub(self.sp)?).ok()?;
        let bytes = self.bytes.get(start..start + PRINT_BYTES as usize)?;
        // FNV-1a: the digest only tells visits of one frame apart; nothing relies on it
        // resisting anyone.
        let digest = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        Some(digest)
    }
}

/// What walks found past frames, by visit and by frame: one frame visited through other
/// callers, or again later, is another visit. The visit's own finding is taken where a walk
/// passed that visit; else the latest one at that frame.
struct Found<V> {
    visits: HashMap<(Spot, u64), V>,
    frames: HashMap<Spot, V>,
}

impl<V: Clone> Found<V> {
    fn insert(&mut self, spot: Spot, print: Option<u64>, value: V) {
        if let Some(print) = print {
            self.visits.insert((spot, print), value.clone());
        }
        self.frames.insert(spot, value);
    }

    fn get(&self, spot: Spot, print: Option<u64>) -> Option<&V> {
        let visit = print.and_then(|print| self.visits.get(&(spot, print)));
        visit.or_else(|| self.frames.get(&spot))
    }

    fn len(&self) -> usize {
        self.visits.len() + self.frames.len()
    }

    fn clear(&mut self) {
        self.visits.clear();
        self.frames.clear();
    }
}

impl<V> Default for Found<V> {
    fn default() -> Self {
        Found {
            visits: HashMap::new(),
            frames: HashMap::new(),
        }
    }
}

/// What one thread's walks found.
struct Thread<T> {
    /// The caller of each frame passed, with the caller's print when the copy held it.
    callers: Found<(Spot, Option<u64>)>,
    /// How walks ended past the outermost frames they reached.
    ends: Found<WalkEnd>,
    waiting: Vec<T>,
}

impl<T> Default for Thread<T> {
    fn default() -> Self {
        Thread {
            callers: Found::default(),
            ends: Found::default(),
            waiting: Vec::new(),
        }
    }
}

/// The frames every live thread's walks passed, and the samples waiting for them (`T`).
pub(crate) struct Roots<T> {
    threads: HashMap<u32, Thread<T>>,
}

impl<T> Default for Roots<T> {
    fn default() -> Self {
        Roots {
            threads: HashMap::new(),
        }
    }
}

impl<T> Roots<T> {
    /// Remembers what a walk of thread `tid` over `copy` found: each frame's caller, and how
    /// the chain ended past its outermost frame unless the copy ran out there. A thread is
    /// remembered from its first walk that ran out of copy on: its stacks that run out before
    /// the walks that complete them wait for those.
    pub(crate) fn learn(&mut self, tid: u32, copy: Copy<'_>, trail: &Trail, end: &WalkEnd) {
        // Only threads whose stacks outgrew a copy are remembered: the others never ask.
        if *end != WalkEnd::Truncated && !self.threads.contains_key(&tid) {
            return;
        }
        let thread = self.threads.entry(tid).or_default();
        if thread.callers.len() + trail.addrs.len() > SPOTS_PER_THREAD {
            thread.callers.clear();
            thread.ends.clear();
        }
        let spots = trail.sps.iter().zip(&trail.addrs);
        let spots: Vec<Spot> = spots.map(|(&sp, &addr)| Spot { sp, addr }).collect();
        for pair in spots.windows(2) {
            let caller = (pair[1], copy.print(pair[1].sp));
            thread
                .callers
                .insert(pair[0], copy.print(pair[0].sp), caller);
        }
        if let (Some(&last), false) = (spots.last(), *end == WalkEnd::Truncated) {
            thread.ends.insert(last, copy.print(last.sp), end.clone());
        }
    }

    /// Appends to `out` the callers of thread `tid`'s frame `from` that earlier walks found,
    /// outward, until `room` frames are added. `print` is the frame's print in the sample's
    /// own copy. Returns how the chain ends when it reaches an end an earlier walk met, `None`
    /// when the stack goes on beyond what is known.
    pub(crate) fn recover(
        &self,
        tid: u32,
        (from, print): (Spot, Option<u64>),
        room: usize,
        out: &mut Vec<u64>,
    ) -> Option<WalkEnd> {
        let thread = self.threads.get(&tid)?;
        let (mut at, mut print) = (from, print);
        for _ in 0..room.min(MAX_FRAMES) {
            if let Some(end) = thread.ends.get(at, print) {
                return Some(end.clone());
            }
            let &(caller, caller_print) = thread.callers.get(at, print)?;
            // Callers sit higher on the stack: anything else is not this stack.
            if caller.sp <= at.sp {
                return None;
            }
            out.push(caller.addr);
            (at, print) = (caller, caller_print);
        }
        thread.ends.get(at, print).cloned()
    }

    /// Keeps `sample` of thread `tid` waiting for walks to come; when the thread's waiting
    /// room is full, hands back everything waiting, to be settled now.
    pub(crate) fn wait(&mut self, tid: u32, sample: T) -> Vec<T> {
        let thread = self.threads.entry(tid).or_default();
        thread.waiting.push(sample);
        if thread.waiting.len() >= WAITING_PER_THREAD {
            std::mem::take(&mut thread.waiting)
        } else {
            Vec::new()
        }
    }

    /// The samples of thread `tid` still waiting; they are no longer kept.
    pub(crate) fn take_waiting(&mut self, tid: u32) -> Vec<T> {
        self.threads
            .get_mut(&tid)
            .map(|t| std::mem::take(&mut t.waiting))
            .unwrap_or_default()
    }

    /// Every thread with samples waiting.
    pub(crate) fn waiting_threads(&self) -> Vec<u32> {
        let waiting = self.threads.iter().filter(|(_, t)| !t.waiting.is_empty());
        waiting.map(|(&tid, _)| tid).collect()
    }

    /// Forgets thread `tid`'s stack: it exited or exec'd. Take its waiting samples first.
    pub(crate) fn forget(&mut self, tid: u32) {
        self.threads.remove(&tid);
    }
}

/// What ran the stack copies out: one frame larger than the copy, or a stack top far from
/// the sampled frame across many frames.
#[derive(Debug, Default)]
pub(crate) struct Room {
    /// Walks that ran out of stack copy, and did not go on over the live thread's memory.
    pub truncated: u64,
    /// Of those, the ones whose first frame alone outgrew the copy.
    pub leaf_larger: u64,
    /// Frames the other truncated walks found, in all.
    pub frames: u64,
    /// The largest frame met in a truncated walk, in bytes.
    pub largest_frame: u64,
    /// Samples whose outer frames were taken from the thread's other walks.
    pub recovered: u64,
    /// Samples whose walk went on over the live thread's memory above the copy.
    pub read_on: u64,
}

impl Room {
    /// Measures a walk that ran out of a copy of `bytes`.
    pub(crate) fn measure(&mut self, trail: &Trail, bytes: u32) {
        self.truncated += 1;
        if trail.sps.len() <= 1 {
            self.leaf_larger += 1;
            self.largest_frame = self.largest_frame.max(u64::from(bytes));
            return;
        }
        self.frames += trail.sps.len() as u64;
        let sizes = trail.sps.windows(2).map(|w| w[1].saturating_sub(w[0]));
        self.largest_frame = self.largest_frame.max(sizes.max().unwrap_or(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack at 0x1000 of four frames of 0x100 bytes, each frame's bytes filled with `fill`.
    fn stack(fill: u8) -> Vec<u8> {
        vec![fill; 0x400]
    }

    fn trail(frames: &[(u64, u64)]) -> Trail {
        Trail {
            sps: frames.iter().map(|f| f.0).collect(),
            addrs: frames.iter().map(|f| f.1).collect(),
        }
    }

    fn from(copy: Copy<'_>, sp: u64, addr: u64) -> (Spot, Option<u64>) {
        (Spot { sp, addr }, copy.print(sp))
    }

    #[test]
    fn callers_found_by_earlier_walks_complete_a_cut_stack() {
        let bytes = stack(1);
        let whole = Copy {
            sp: 0x1000,
            bytes: &bytes,
        };
        let mut roots: Roots<()> = Roots::default();
        // A shallow sample reached the thread's entry; a deeper one ran out at 0x1100. Walks
        // are remembered from the thread's first that ran out on.
        let shallow = trail(&[(0x1100, 0xa3), (0x1200, 0xa2), (0x1300, 0xa1)]);
        roots.learn(1, whole, &shallow, &WalkEnd::Complete);
        let mut out = Vec::new();
        let from_a3 = from(whole, 0x1100, 0xa3);
        assert_eq!(roots.recover(1, from_a3, 100, &mut out), None);
        let deep = trail(&[(0x1000, 0xa4), (0x1100, 0xa3)]);
        roots.learn(1, whole, &deep, &WalkEnd::Truncated);
        roots.learn(1, whole, &shallow, &WalkEnd::Complete);
        let mut out = Vec::new();
        let end = roots.recover(1, from(whole, 0x1100, 0xa3), 100, &mut out);
        assert_eq!((end, out), (Some(WalkEnd::Complete), vec![0xa2, 0xa1]));

        // Another thread, another code address at that stack address, or no room: not known.
        let mut out = Vec::new();
        assert_eq!(
            roots.recover(2, from(whole, 0x1100, 0xa3), 100, &mut out),
            None
        );
        assert_eq!(
            roots.recover(1, from(whole, 0x1100, 0xb3), 100, &mut out),
            None
        );
        assert_eq!(
            roots.recover(1, from(whole, 0x1100, 0xa3), 1, &mut out),
            None
        );
        assert_eq!(out, [0xa2]);

        // A sample that ran out deeper still chains through what the second walk found.
        let mut out = Vec::new();
        let end = roots.recover(1, from(whole, 0x1000, 0xa4), 100, &mut out);
        assert_eq!(
            (end, out),
            (Some(WalkEnd::Complete), vec![0xa3, 0xa2, 0xa1])
        );

        roots.forget(1);
        let mut out = Vec::new();
        assert_eq!(
            roots.recover(1, from(whole, 0x1000, 0xa4), 100, &mut out),
            None
        );
    }

    #[test]
    fn a_visit_takes_the_callers_its_own_walks_found_else_the_latest() {
        let (one, two, three) = (stack(1), stack(2), stack(3));
        let one = Copy {
            sp: 0x1000,
            bytes: &one,
        };
        let two = Copy {
            sp: 0x1000,
            bytes: &two,
        };
        let three = Copy {
            sp: 0x1000,
            bytes: &three,
        };
        let mut roots: Roots<()> = Roots::default();
        // Two visits of the frame 0xa3 at 0x1100, through different callers, after a walk
        // that ran out.
        let deep = trail(&[(0x1000, 0xa4), (0x1100, 0xa3)]);
        roots.learn(1, one, &deep, &WalkEnd::Truncated);
        roots.learn(
            1,
            one,
            &trail(&[(0x1100, 0xa3), (0x1200, 0xa2)]),
            &WalkEnd::Complete,
        );
        roots.learn(
            1,
            two,
            &trail(&[(0x1100, 0xa3), (0x1200, 0xb2)]),
            &WalkEnd::Complete,
        );
        let callers = |copy| {
            let mut out = Vec::new();
            let end = roots.recover(1, from(copy, 0x1100, 0xa3), 100, &mut out);
            (end, out)
        };
        assert_eq!(callers(one), (Some(WalkEnd::Complete), vec![0xa2]));
        assert_eq!(callers(two), (Some(WalkEnd::Complete), vec![0xb2]));
        // A visit no walk passed takes the latest walk's.
        assert_eq!(callers(three), (Some(WalkEnd::Complete), vec![0xb2]));
    }

    #[test]
    fn waiting_samples_are_handed_back_when_the_room_is_full() {
        let mut roots: Roots<usize> = Roots::default();
        for i in 0..WAITING_PER_THREAD - 1 {
            assert!(roots.wait(3, i).is_empty());
        }
        assert_eq!(roots.waiting_threads(), [3]);
        assert_eq!(roots.wait(3, 0).len(), WAITING_PER_THREAD);
        assert!(roots.take_waiting(3).is_empty());
    }
}
