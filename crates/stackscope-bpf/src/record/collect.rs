//! The end of a recording: the counted stacks read back from the BPF maps into the stack table
//! (`counter`), named into a [`stackscope_profile::Profile`] as the perf_event source names
//! its own, with hints for what the maps could not hold.

use stackscope_process::target;
use stackscope_profile::format::summary::missed_stacks;
use stackscope_profile::{Metadata, Thread};
use stackscope_stacks::table::Tally;
use stackscope_stacks::{BpfFigures, Hint, ProgramCost, Recording, SourceFigures, Storage};
use stackscope_symbols::Symbolizer;

use super::counter::{Counter, Lost};
use super::live::LiveDrain;
use super::{lead_in, memory, BpfConfig, TimeProfile};
use crate::layout::CountKey;
use crate::probe::Plan;
use crate::processes::Processes;
use crate::program::{self, ProfileSkel};
use crate::tables::NotLoaded;

/// Reads the counted stacks and symbolizes them, with what the maps could not hold and what
/// the program `cost`. Threads still off the CPU when counting stopped (`ended`, on the
/// program's clock) are counted up to then. A live recording's last counts join the stacks
/// `live` has handed over and named as it went.
pub(super) fn collect(
    skel: &ProfileSkel<'_>,
    config: &BpfConfig,
    processes: &mut Processes,
    plan: &Plan,
    (mut meta, ended, cost): (Metadata, u64, ProgramCost),
    live: Option<LiveDrain>,
    lead: Option<Recording>,
) -> Recording {
    let counts = final_counts(skel, config, plan, ended);
    let (dropped, user_full) = program::drops(skel);
    meta.lost_samples = dropped;
    // The lead-in's stacks are named by the same symbolizer, each file parsed once for both.
    let mut symbolizer = match lead.is_some() {
        true => Symbolizer::new().keeping(LEAD_IN_KEPT_BINARIES),
        false => Symbolizer::new(),
    };
    let (mut profile, tally, lost, keys) = match live {
        Some(live) => live.finish(skel, config, processes, plan, &counts, meta),
        None => {
            let mut counter = Counter::new(plan);
            counter.count(skel, config, processes, &counts, plan);
            let lost = counter.lost();
            let (profile, tally) =
                counter
                    .table
                    .into_profile(&mut symbolizer, meta, &unnamed_thread);
            (profile, tally, lost, counts.len())
        }
    };
    let missed = missed_stacks(&profile);
    let mut hints = hints(config, processes, &tally, dropped, &lost);
    if let Some(memory) = &config.memory {
        hints.extend(memory::hints(skel, memory, config.sample_bytes));
    }
    let skipped = program::switch_misses(skel);
    if skipped > 0 {
        hints.push(Hint::Said(format!(
            "the kernel skipped {skipped} runs of the off-CPU program (another BPF program was running on that CPU): time off the CPU around those switches is missing or counted under the stack before"
        )));
    }
    let storage = Storage {
        stacks_full: lost.collided + lost.full > 0 || user_full > 0,
        counts_full: dropped > 0 || keys as u64 >= u64::from(config.hash_storage_size),
        dropped_samples: dropped,
        missed_stacks: missed,
        count_entries: config.hash_storage_size,
    };
    let mut bpf = BpfFigures {
        storage,
        cost,
        lead_in: None,
    };
    let lead = lead.and_then(|lead| lead_in::named(lead, &mut symbolizer, &mut bpf, &mut hints));
    if let Some(lead) = lead {
        profile = profile.merged(&lead);
    }
    // Counts in the kernel carry no CPU; the lead-in's are counted as they are.
    for sample in &mut profile.samples {
        sample.cpu = None;
    }
    Recording {
        profile,
        figures: Some(SourceFigures::Bpf(bpf)),
        hints,
        ..Recording::default()
    }
}

/// How many parsed binaries naming keeps between the program's stacks and the lead-in's: a
/// launched command's files, each parsed once for both.
const LEAD_IN_KEPT_BINARIES: usize = 64;

/// Names for a thread counted without them. Every count here carries its thread's names, so
/// this is never asked; the table wants an answer all the same.
pub(super) fn unnamed_thread(pid: u32, tid: u32) -> Thread {
    Thread {
        pid,
        tid,
        comm: format!("[pid {tid}]"),
        process_name: format!("[pid {pid}]"),
    }
}

/// What the maps count at the end, each key with its weight in the profile and, of memory,
/// the allocations it counts.
fn final_counts(
    skel: &ProfileSkel<'_>,
    config: &BpfConfig,
    plan: &Plan,
    ended: u64,
) -> Vec<(CountKey, u64, u64)> {
    let mut counts = program::counts(skel);
    if plan.off_cpu.is_some() {
        counts.extend(still_blocked(skel, config, ended));
    }
    let mut counts = weighed(plan, counts);
    if let Some(memory) = &config.memory {
        counts.extend(memory::counts(skel, memory, ended));
    }
    counts
}

/// Each count with its weight in the profile.
pub(super) fn weighed(plan: &Plan, counts: Vec<(CountKey, u64)>) -> Vec<(CountKey, u64, u64)> {
    counts
        .into_iter()
        .map(|(key, count)| {
            let weight = plan.weight(key.event, count);
            (key, weight, 0)
        })
        .collect()
}

/// The time of the threads still off the CPU at `ended`, as counts of their keys; blocks
/// shorter than the minimum are left out as the program leaves them. A thread that no longer
/// lives is not off the CPU but gone: its entry is one whose switch back the program did not
/// see (a run the kernel skipped), and counting it up to the end would add time it never
/// waited.
fn still_blocked(
    skel: &ProfileSkel<'_>,
    config: &BpfConfig,
    ended: u64,
) -> impl Iterator<Item = (CountKey, u64)> {
    let min_block = match config.time {
        Some(TimeProfile::OffCpu { min_block_ns }) => min_block_ns,
        _ => 0,
    };
    program::still_blocked(skel)
        .into_iter()
        .filter(|(_, key)| target::is_alive(key.tid))
        .map(move |(since, key)| (key, ended.saturating_sub(since)))
        .filter(move |&(_, ns)| ns > 0 && ns >= min_block)
}

/// What the user can do about stacks and samples the maps could not hold, and about stacks
/// that broke off.
fn hints(
    config: &BpfConfig,
    processes: &Processes,
    tally: &Tally,
    dropped: u64,
    lost: &Lost,
) -> Vec<Hint> {
    let mut hints = Vec::new();
    if dropped > 0 {
        hints.push(Hint::CountMapFull {
            dropped,
            entries: config.hash_storage_size,
        });
    }
    hints.extend(storage_hints(lost, config.stack_storage_size));
    let broken: u64 = tally.broken_in.values().sum();
    let stats = &tally.stats;
    if stats.user_stacks > 0 && broken * 100 >= stats.user_stacks {
        let mut worst: Vec<_> = tally.broken_in.iter().collect();
        worst.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        hints.push(Hint::Said(format!(
            "{:.1}% of user stacks broke off, most in {}: it may lack unwind info (.eh_frame), or run JIT code",
            broken as f64 * 100.0 / stats.user_stacks as f64,
            worst[0].0
        )));
    }
    hints.extend(stackscope_stacks::naming_hints(tally));
    if let Some(not_loaded) = processes.tables_not_loaded() {
        hints.push(Hint::Said(tables_not_loaded(not_loaded)));
    }
    if let Some(e) = &processes.load_error {
        hints.push(Hint::Said(format!("some unwind tables could not be loaded ({e}): those stacks were walked by frame pointers")));
    }
    if let Some(e) = &processes.loader_error {
        hints.push(Hint::Said(format!("library loads could not be watched ({e}): libraries opened during the run were walked by frame pointers until their first samples")));
    }
    hints
}

/// What `lost` says about the stack storage of `entries` stacks: a full storage or hash
/// collisions, which more room helps, apart from stacks lost for another reason, which it
/// does not.
fn storage_hints(lost: &Lost, entries: u32) -> Vec<Hint> {
    let mut hints = Vec::new();
    if lost.full > 0 {
        hints.push(Hint::StackStorageFull {
            missed: lost.full,
            entries,
        });
    }
    if lost.collided > 0 {
        hints.push(Hint::StackCollisions {
            missed: lost.collided,
            stored: lost.kernel_stored,
            // The kernel rounds the stack map's buckets up to a power of two.
            buckets: u64::from(entries.max(1)).next_power_of_two(),
        });
    }
    if lost.unread > 0 {
        hints.push(Hint::Said(format!(
            "{} stack traces could not be taken or read back from the kernel, not for lack of room in its stack storage: they show as [Missed User Stack] or [Missed Kernel Stack]",
            lost.unread
        )));
    }
    hints
}

/// "the unwind tables of 2 files (2587332 rows) could not be loaded (...): ... libLLVM.so, ...".
fn tables_not_loaded(not_loaded: &NotLoaded) -> String {
    const NAMED: usize = 3;
    let files = &not_loaded.files;
    let mut names: Vec<&str> = files.iter().take(NAMED).map(|f| &*f.0).collect();
    if files.len() > NAMED {
        names.push("...");
    }
    format!(
        "the unwind tables of {} files ({} rows) could not be loaded into the kernel ({}): stacks through them were walked by frame pointers and may break there: {}",
        files.len(),
        not_loaded.rows(),
        not_loaded.reason,
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_full_or_colliding_storage_hints_at_its_size() {
        let storage_hint = |h: &Hint| {
            matches!(
                h,
                Hint::StackStorageFull { .. } | Hint::StackCollisions { .. }
            )
        };
        let unread = Lost {
            unread: 3,
            ..Lost::default()
        };
        let hints = storage_hints(&unread, 16384);
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert!(!storage_hint(&hints[0]), "{hints:?}");

        let collided = Lost {
            collided: 1,
            kernel_stored: 150,
            ..Lost::default()
        };
        assert_eq!(
            storage_hints(&collided, 10000),
            [Hint::StackCollisions {
                missed: 1,
                stored: 150,
                buckets: 16384
            }]
        );
        let full = Lost {
            full: 2,
            ..Lost::default()
        };
        assert_eq!(
            storage_hints(&full, 16),
            [Hint::StackStorageFull {
                missed: 2,
                entries: 16
            }]
        );
        assert!(storage_hints(&Lost::default(), 16).is_empty());
    }
}
