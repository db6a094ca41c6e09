//! Samples whose walk ran out of stack copy: their outer frames taken from the thread's other
//! walks, at once where an earlier walk found them, else held until a later one does or the
//! thread ends, then marked `[truncated]` where none did.

use std::sync::Arc;

use stackscope_stacks::table::RawFrame;
use stackscope_stacks::walk::{WalkEnd, MAX_FRAMES};

use super::Collector;
use crate::event::SampleEvent;
use crate::unwind::roots::{Copy, Spot};

impl Collector {
    /// Counts a sample whose walk ran out of stack copy at `spot`, the outermost frame it
    /// reached: with the outer frames the thread's walks already found, else held for them.
    pub(super) fn count_ran_out(
        &mut self,
        sample: &SampleEvent<'_>,
        spot: Spot,
        names: (Arc<str>, Arc<str>),
    ) {
        let copy = Copy {
            sp: sample.user_regs.map_or(0, |r| r.sp),
            bytes: sample.user_stack,
        };
        let from = (spot, copy.print(spot.sp));
        if let Some(end) = self.outer_frames(sample.pid, sample.tid, from, false) {
            let names = (&*names.0, &*names.1);
            self.count((sample.pid, sample.tid), names, sample.cpu, end);
            return;
        }
        let waiting = Waiting {
            pid: sample.pid,
            tid: sample.tid,
            cpu: sample.cpu,
            names,
            frames: self.frames.clone(),
            from,
        };
        for waiting in self.roots.wait(sample.tid, waiting) {
            self.count_waiting(waiting);
        }
    }

    /// Counts the samples of thread `tid` that wait for their outer frames, with what its
    /// walks found.
    pub(super) fn settle(&mut self, tid: u32) {
        for waiting in self.roots.take_waiting(tid) {
            self.count_waiting(waiting);
        }
    }

    /// Counts a sample whose walk ran out of stack copy, its outer frames taken from the
    /// thread's other walks where they found them, else marked `[truncated]`.
    fn count_waiting(&mut self, waiting: Waiting) {
        let Waiting {
            pid,
            tid,
            cpu,
            names,
            frames,
            from,
        } = waiting;
        self.frames = frames;
        let end = self.outer_frames(pid, tid, from, true);
        let end = end.unwrap_or(WalkEnd::Truncated);
        self.count((pid, tid), (&names.0, &names.1), cpu, end);
    }

    /// Appends the outer frames of a stack whose walk ran out at `from`, as far as the
    /// thread's walks found them; says how the stack ends. Unless this is the `last` chance,
    /// a stack whose end is not known yet is left as it was and `None` returned; at the last
    /// one, it ends in `[truncated]`.
    fn outer_frames(
        &mut self,
        pid: u32,
        tid: u32,
        from: (Spot, Option<u64>),
        last: bool,
    ) -> Option<WalkEnd> {
        let user = self
            .frames
            .iter()
            .filter(|f| !matches!(f, RawFrame::Kernel(_)));
        let room = MAX_FRAMES.saturating_sub(user.count());
        let mut outer = Vec::new();
        let end = self.roots.recover(tid, from, room, &mut outer);
        if end.is_none() && !last {
            return None;
        }
        let maps = self.processes.get(&pid).map(|p| &p.maps);
        for &addr in &outer {
            let frame = self
                .table
                .user_frame(pid, addr, maps.and_then(|m| m.find(addr)));
            self.frames.push(frame);
        }
        Some(match end {
            Some(end) => {
                self.room.recovered += 1;
                end
            }
            None => {
                self.frames.push(RawFrame::Truncated);
                WalkEnd::Truncated
            }
        })
    }
}

/// A sample whose walk ran out of stack copy, waiting for the thread's outer frames.
pub(super) struct Waiting {
    pid: u32,
    tid: u32,
    cpu: u32,
    /// The thread's and its process's names when sampled.
    names: (Arc<str>, Arc<str>),
    /// Its frames, leaf first, as far as the walk went.
    frames: Vec<RawFrame>,
    /// The outermost frame the walk reached, with its print in the sample's copy.
    from: (Spot, Option<u64>),
}
