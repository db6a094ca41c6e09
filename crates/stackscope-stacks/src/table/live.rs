//! A live recording's tables, folded as they are handed over: each new address is named once
//! across all of them (not once per table), every table's stacks join the profile so far, and
//! each table's own stacks are given back as an [`Interval`] for a live view (`top`).

use std::time::Duration;

use stackscope_profile::{Metadata, Profile, StackId, Thread, ThreadId};
use stackscope_symbols::Symbolizer;

use super::names::Names;
use super::{Folded, StackTable, Tally};

/// Raw frames named before the names are let go and built anew: a whole-system view over
/// hours meets ever new addresses, and a name costs little to find again.
const NAMES_AT_MOST: usize = 1 << 18;

/// Binaries kept parsed between tables: a view of a whole system under a build meets some
/// tens of binaries each refresh (the compilers, their libraries, the kernel's modules), and
/// parsing them again every refresh was most of its cost (keeping 16 cost half as much again
/// as keeping 64 under a cargo build).
const BINARIES_KEPT: usize = 64;

/// A live view's part in a recording, whatever its source: every `every`, what was counted
/// since is named and folded on a thread of its own ([`super::BackgroundFold::start_live`]),
/// and `observe` sees the profile so far and what came in.
pub struct Live {
    pub every: Duration,
    pub observe: Observer,
}

/// What sees the profile so far and each hand-over's stacks, on the naming thread.
pub type Observer = Box<dyn FnMut(&LiveFold, &Interval) + Send>;

/// Distinct stacks the profile so far keeps: a whole system under a build meets a new stack
/// at almost every sample, and each costs its frames (three times: the profile's, its index's
/// and the view's). Past them a new stack is counted as its leaf alone, marked, so that every
/// function's own time stays whole.
pub const STACKS_KEPT: usize = 1 << 15;

/// What one handed-over table held, in the numbering of the profile so far.
#[derive(Debug, Default, Clone)]
pub struct Interval {
    /// Each stack counted, with its thread and count.
    pub stacks: Vec<(ThreadId, StackId, u64)>,
    /// Samples the source lost while the table filled.
    pub lost: u64,
}

/// The profile so far of a live recording, and the one naming step that feeds it.
pub struct LiveFold {
    symbolizer: Symbolizer,
    names: Names,
    folded: Folded,
    thread: Box<dyn Fn(u32, u32) -> Thread + Send>,
}

impl LiveFold {
    /// `thread` names a (pid, tid) pair whose samples were counted without names.
    pub fn new(thread: impl Fn(u32, u32) -> Thread + Send + 'static) -> Self {
        LiveFold {
            symbolizer: Symbolizer::new().keeping(BINARIES_KEPT),
            names: Names::default(),
            folded: Folded::keeping_stacks(STACKS_KEPT),
            thread: Box::new(thread),
        }
    }

    /// Names the addresses of `table` not named before, adds its stacks to the profile so
    /// far, and gives them back. Every table handed over must come from one
    /// [`StackTable::take`] chain, so that its modules keep their numbers.
    pub fn fold(&mut self, table: &StackTable) -> Interval {
        if self.names.len() >= NAMES_AT_MOST {
            self.names = Names::default();
        }
        self.names
            .extend(table, &mut self.symbolizer, &mut self.folded.builder);
        let mut interval = Interval {
            stacks: Vec::new(),
            lost: table.lost,
        };
        table.add_named(&self.names, &mut self.folded, &*self.thread, |t, s, n| {
            interval.stacks.push((t, s, n))
        });
        interval
    }

    /// The profile so far (its metadata is the caller's to set).
    pub fn so_far(&self) -> &Profile {
        self.folded.so_far()
    }

    /// How whole the user stacks came out so far.
    pub fn tally(&self) -> &Tally {
        self.folded.tally()
    }

    /// Everything folded, to finish as a recording's profile.
    pub fn into_folded(self) -> Folded {
        self.folded
    }

    /// The profile so far as a writer takes it, with `meta`.
    pub fn snapshot(&self, meta: Metadata) -> Profile {
        self.folded.snapshot(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Sampled, PAST_KEPT_STACKS};
    use crate::walk::WalkEnd;
    use crate::Mapping;
    use stackscope_profile::FrameId;

    /// This test's own program, a real file for the symbolizer, mapped at 0x1000.
    fn this_program() -> Mapping {
        let exe = std::env::current_exe().unwrap();
        Mapping {
            start: 0x1000,
            end: 0x100_0000,
            offset: 0,
            path: exe.to_string_lossy().as_ref().into(),
            build_id: None,
        }
    }

    const SAMPLED: Sampled = Sampled {
        pid: 7,
        tid: 7,
        cpu: 0,
        names: Some(("prog", "prog")),
    };

    #[test]
    fn stacks_past_those_kept_are_counted_as_their_leaf_under_a_marker() {
        let program = this_program();
        let table = || {
            let mut table = StackTable::default();
            let root = table.user_frame(7, 0x3000, Some(&program));
            let leaf = table.user_frame(7, 0x2000, Some(&program));
            let other = table.user_frame(7, 0x4000, Some(&program));
            table.count(SAMPLED, &[leaf, root], WalkEnd::Complete, 3);
            table.count(SAMPLED, &[other, leaf, root], WalkEnd::Complete, 2);
            table
        };
        let thread = |pid, tid| Thread {
            pid,
            tid,
            ..Thread::default()
        };
        let mut symbolizer = Symbolizer::new();
        let mut kept = Folded::keeping_stacks(1);
        table().fold_into(&mut symbolizer, &mut kept, &thread);
        let mut all = Folded::default();
        table().fold_into(&mut symbolizer, &mut all, &thread);
        let (kept, tally) = kept.finish(Metadata::default());
        let (all, _) = all.finish(Metadata::default());

        assert_eq!(all.stacks.len(), 2);
        assert_eq!(kept.stacks.len(), 2, "one kept, one marked");
        assert_eq!(kept.total_samples(), 5, "no sample is lost");
        let marked = kept
            .stacks
            .iter()
            .find(|s| kept.frame(s.frames[0]).name == PAST_KEPT_STACKS)
            .expect("a stack under the marker");
        assert_eq!(marked.frames.len(), 2, "the marker and the leaf alone");
        let stack_total = |p: &Profile, frames: &[FrameId]| {
            p.samples
                .iter()
                .filter(|s| p.stack(s.stack).frames == frames)
                .map(|s| s.count)
                .sum::<u64>()
        };
        // Which of the two stacks came past the one kept is the table's order: the marked
        // one's leaf and count are that stack's, whichever it is (the two leaves may be one
        // function of this program, as its layout falls).
        let leaf_name = &kept.frame(marked.frames[1]).name;
        let marked_total = stack_total(&kept, &marked.frames);
        assert!(
            all.stacks.iter().any(|s| {
                &all.frame(*s.frames.last().unwrap()).name == leaf_name
                    && stack_total(&all, &s.frames) == marked_total
            }),
            "the marked stack is not one of the table's, by leaf and count"
        );
        assert_eq!(tally.past_kept_stacks, marked_total);
    }

    #[test]
    fn an_address_is_named_once_across_the_tables_of_a_chain_and_keeps_its_frames() {
        let program = this_program();
        let sampled = SAMPLED;
        let mut live = LiveFold::new(|pid, tid| Thread {
            pid,
            tid,
            ..Thread::default()
        });
        let mut table = StackTable::default();
        let leaf = table.user_frame(7, 0x2000, Some(&program));
        let root = table.user_frame(7, 0x3000, Some(&program));
        table.count(sampled, &[leaf, root], WalkEnd::Complete, 3);
        let first = live.fold(&table.take());
        let named = live.names.len();

        // The next table of the chain: the same addresses again, and one new.
        let again = table.user_frame(7, 0x2000, Some(&program));
        assert_eq!(
            again, leaf,
            "the successor table numbers the module as before"
        );
        table.count(sampled, &[leaf, root], WalkEnd::Complete, 2);
        let new = table.user_frame(7, 0x4000, Some(&program));
        table.lose(5);
        table.count(sampled, &[new, root], WalkEnd::Complete, 1);
        let second = live.fold(&table.take());

        assert_eq!(
            live.names.len(),
            named + 1,
            "only the new address was named"
        );
        assert_eq!(first.stacks.len(), 1);
        let same = second.stacks.iter().find(|s| s.1 == first.stacks[0].1);
        assert_eq!(same.map(|s| s.2), Some(2), "{second:?}");
        assert_eq!(second.stacks.len(), 2);
        assert_eq!((first.lost, second.lost), (0, 5));
        // The profile so far holds both tables' samples.
        assert_eq!(live.snapshot(Default::default()).total_samples(), 6);
    }
}
