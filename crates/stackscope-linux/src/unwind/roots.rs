//! The outer frames of deep stacks, remembered per thread. A stack copy of at most 64 KiB
//! cannot hold a thread whose stack top lies further from the sampled frame, but the part of
//! a thread's stack above a live frame does not change while that frame lives: an earlier
//! walk of the same thread that passed the same frame (the same stack address and the same
//! code address) found its callers, and they are its callers still.
//!
//! Samples whose walk ran out where no earlier walk passed wait, a bounded number per
//! thread, until the thread exits, execs or the recording ends: a later sample may have
//! passed there since.

use std::collections::HashMap;

use stackscope_stacks::walk::{Trail, MAX_FRAMES};

use super::UnwindEnd;

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

/// What one thread's walks found.
struct Thread<T> {
    /// The caller of each frame passed.
    callers: HashMap<Spot, Spot>,
    /// How walks ended at the outermost frames they reached.
    ends: HashMap<Spot, UnwindEnd>,
    waiting: Vec<T>,
}

impl<T> Default for Thread<T> {
    fn default() -> Self {
        Thread {
            callers: HashMap::new(),
            ends: HashMap::new(),
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
    /// Remembers what a walk of thread `tid` found: each frame's caller, and how the chain
    /// ended past its outermost frame unless the copy ran out there.
    pub(crate) fn learn(&mut self, tid: u32, trail: &Trail, end: &UnwindEnd) {
        let thread = self.threads.entry(tid).or_default();
        if thread.callers.len() + trail.addrs.len() > SPOTS_PER_THREAD {
            thread.callers.clear();
            thread.ends.clear();
        }
        let spots = trail.sps.iter().zip(&trail.addrs);
        let spots: Vec<Spot> = spots.map(|(&sp, &addr)| Spot { sp, addr }).collect();
        for pair in spots.windows(2) {
            thread.callers.insert(pair[0], pair[1]);
        }
        if let (Some(&last), false) = (spots.last(), *end == UnwindEnd::Truncated) {
            thread.ends.insert(last, end.clone());
        }
    }

    /// Appends to `out` the callers of thread `tid`'s frame `from` that earlier walks found,
    /// outward, until `room` frames are added. Returns how the chain ends when it reaches
    /// an end an earlier walk met, `None` when the stack goes on beyond what is known.
    pub(crate) fn recover(
        &self,
        tid: u32,
        from: Spot,
        room: usize,
        out: &mut Vec<u64>,
    ) -> Option<UnwindEnd> {
        let thread = self.threads.get(&tid)?;
        let mut at = from;
        for _ in 0..room.min(MAX_FRAMES) {
            if let Some(end) = thread.ends.get(&at) {
                return Some(end.clone());
            }
            let next = *thread.callers.get(&at)?;
            // Callers sit higher on the stack: anything else is not this stack.
            if next.sp <= at.sp {
                return None;
            }
            out.push(next.addr);
            at = next;
        }
        thread.ends.get(&at).cloned()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn trail(frames: &[(u64, u64)]) -> Trail {
        Trail {
            sps: frames.iter().map(|f| f.0).collect(),
            addrs: frames.iter().map(|f| f.1).collect(),
            stop: None,
        }
    }

    #[test]
    fn callers_found_by_earlier_walks_complete_a_cut_stack() {
        let mut roots: Roots<()> = Roots::default();
        // A shallow sample reached the thread's entry; a deeper one ran out at 0x7000.
        roots.learn(
            1,
            &trail(&[(0x7000, 0xa3), (0x8000, 0xa2), (0x9000, 0xa1)]),
            &UnwindEnd::Complete,
        );
        roots.learn(
            1,
            &trail(&[(0x5000, 0xa5), (0x6000, 0xa4), (0x7000, 0xa3)]),
            &UnwindEnd::Truncated,
        );
        let mut out = Vec::new();
        let end = roots.recover(
            1,
            Spot {
                sp: 0x7000,
                addr: 0xa3,
            },
            100,
            &mut out,
        );
        assert_eq!((end, out), (Some(UnwindEnd::Complete), vec![0xa2, 0xa1]));

        // Another thread, another code address at that stack address, or no room: not known.
        let mut out = Vec::new();
        assert_eq!(
            roots.recover(
                2,
                Spot {
                    sp: 0x7000,
                    addr: 0xa3
                },
                100,
                &mut out
            ),
            None
        );
        assert_eq!(
            roots.recover(
                1,
                Spot {
                    sp: 0x7000,
                    addr: 0xb3
                },
                100,
                &mut out
            ),
            None
        );
        assert_eq!(
            roots.recover(
                1,
                Spot {
                    sp: 0x7000,
                    addr: 0xa3
                },
                1,
                &mut out
            ),
            None
        );
        assert_eq!(out, [0xa2]);

        // A sample that ran out deeper still chains through what the second walk found.
        let mut out = Vec::new();
        let end = roots.recover(
            1,
            Spot {
                sp: 0x5000,
                addr: 0xa5,
            },
            100,
            &mut out,
        );
        assert_eq!(
            (end, out),
            (Some(UnwindEnd::Complete), vec![0xa4, 0xa3, 0xa2, 0xa1])
        );

        roots.forget(1);
        let mut out = Vec::new();
        assert_eq!(
            roots.recover(
                1,
                Spot {
                    sp: 0x5000,
                    addr: 0xa5
                },
                100,
                &mut out
            ),
            None
        );
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
