//! A live view's share of a recording (`stackscope top --backend bpf`): every refresh the
//! count map is drained (each key taken out as it is read) into one stack table, which goes to
//! the naming thread as the perf_event source hands over its own, so the view sees what was
//! counted since. User stacks are taken out of their maps once read, as their ids are hashes
//! of their frames; kernel stacks stay, as theirs are the stack map's buckets.

use std::time::{Duration, Instant};

use stackscope_profile::{Metadata, Profile};
use stackscope_stacks::table::{BackgroundFold, Live, Tally};

use super::collect::{unnamed_thread, weighed};
use super::counter::{Counter, Lost};
use super::BpfConfig;
use crate::error::BpfError;
use crate::layout::{self, CountKey};
use crate::probe::Plan;
use crate::processes::Processes;
use crate::program::{self, ProfileSkel};

/// The counts drained so far and the naming thread they go to.
pub(crate) struct LiveDrain {
    every: Duration,
    last: Instant,
    fold: BackgroundFold,
    counter: Counter,
    /// Samples the count map dropped, as handed over so far.
    dropped: u64,
    /// The most keys one drain took: how full the count map came.
    most_keys: usize,
}

impl LiveDrain {
    /// Starts the naming thread `live` observes.
    pub fn start(live: Live, plan: &Plan) -> Result<LiveDrain, BpfError> {
        let counter = Counter::new(plan);
        let fold = BackgroundFold::start_live(unnamed_thread, live.observe)
            .map_err(|e| BpfError::bpf("start the naming thread", e))?;
        Ok(LiveDrain {
            every: live.every,
            last: Instant::now(),
            fold,
            counter,
            dropped: 0,
            most_keys: 0,
        })
    }

    /// Drains the count map when a refresh is due.
    pub fn when_due(
        &mut self,
        skel: &ProfileSkel<'_>,
        config: &BpfConfig,
        processes: &mut Processes,
        plan: &Plan,
    ) {
        if self.last.elapsed() < self.every {
            return;
        }
        self.last = Instant::now();
        let counts = weighed(plan, take_counts(skel));
        self.count(skel, config, processes, plan, &counts);
        for id in user_stack_ids(&counts) {
            forget_user_stack(skel, id);
        }
        self.fold.fold(self.counter.table.take());
    }

    /// Counts `counts` into the table, with the samples dropped since the last time.
    fn count(
        &mut self,
        skel: &ProfileSkel<'_>,
        config: &BpfConfig,
        processes: &mut Processes,
        plan: &Plan,
        counts: &[(CountKey, u64, u64)],
    ) {
        self.most_keys = self.most_keys.max(counts.len());
        self.counter.count(skel, config, processes, counts, plan);
        let (dropped, _) = program::drops(skel);
        self.counter
            .table
            .lose(dropped.saturating_sub(self.dropped));
        self.dropped = dropped;
    }

    /// Adds the last `counts` and names everything: the profile with `meta`, how whole its
    /// user stacks came out, the stacks shown as missing and the most keys one drain took.
    pub fn finish(
        mut self,
        skel: &ProfileSkel<'_>,
        config: &BpfConfig,
        processes: &mut Processes,
        plan: &Plan,
        counts: &[(CountKey, u64, u64)],
        meta: Metadata,
    ) -> (Profile, Tally, Lost, usize) {
        self.count(skel, config, processes, plan, counts);
        let lost = self.counter.lost();
        self.fold.fold(self.counter.table.take());
        let (profile, tally) = self.fold.finish().finish(meta);
        (profile, tally, lost, self.most_keys)
    }
}

/// Every counted key, with its count, each taken out of the map as it is read, so that the
/// map holds only what came since. The keys are listed first: deleting while walking a hash
/// map's keys starts the walk over.
fn take_counts(skel: &ProfileSkel<'_>) -> Vec<(CountKey, u64)> {
    use libbpf_rs::MapCore;
    let map = &skel.maps.counts;
    let keys: Vec<Vec<u8>> = map.keys().collect();
    keys.into_iter()
        .filter_map(|key| {
            let value = map.lookup_and_delete(&key).ok()??;
            let count = u64::from_ne_bytes(<[u8; 8]>::try_from(&value[..]).ok()?);
            Some((CountKey::from_bytes(&key)?, count))
        })
        .collect()
}

/// The user stacks `counts` name, each once.
fn user_stack_ids(counts: &[(CountKey, u64, u64)]) -> Vec<i64> {
    let mut ids: Vec<i64> = counts
        .iter()
        .map(|(key, _, _)| key.user_stack_id)
        .filter(|&id| id >= 0)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Takes a user stack, read already, out of its map: the program stores it again under the
/// same id when it comes again, and the map keeps room for new ones.
fn forget_user_stack(skel: &ProfileSkel<'_>, id: i64) {
    use libbpf_rs::MapCore;
    let map = match id & layout::DEEP_STACK_ID {
        0 => &skel.maps.user_stacks,
        _ => &skel.maps.deep_stacks,
    };
    // Gone already when no sample stored it again since it was last taken out.
    let _ = map.delete(&id.to_ne_bytes());
}
