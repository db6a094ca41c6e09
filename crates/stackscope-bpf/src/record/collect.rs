//! The end of a recording: the counted stacks read back from the BPF maps into the stack table,
//! named into a [`stackscope_profile::Profile`] as the perf_event source names its own, with hints for what the
//! maps could not hold.

use std::collections::HashMap;

use stackscope_linux::target;
use stackscope_profile::format::summary::missed_stacks;
use stackscope_profile::{Metadata, Thread};
use stackscope_stacks::table::{RawFrame, StackTable, Tally, UserEnd};
use stackscope_stacks::walk::lookup_addresses;
use stackscope_stacks::{Hint, Recording, Storage};
use stackscope_symbols::Symbolizer;

use super::{BpfConfig, TimeProfile};
use crate::layout::{self, CountKey};
use crate::probe::Plan;
use crate::processes::Processes;
use crate::program::{self, ProfileSkel};
use crate::tables::NotLoaded;

/// Reads the counted stacks and symbolizes them, with what the maps could not hold. Threads
/// still off the CPU when counting stopped (`ended`, on the program's clock) are counted up to
/// then.
pub(super) fn collect(
    skel: &ProfileSkel<'_>,
    config: &BpfConfig,
    processes: &mut Processes,
    mut meta: Metadata,
    plan: &Plan,
    ended: u64,
) -> Recording {
    let mut counts = program::counts(skel);
    if plan.off_cpu.is_some() {
        counts.extend(still_blocked(skel, config, ended));
    }
    let (dropped, user_full) = program::drops(skel);
    let markers = event_markers(plan);
    let Counted {
        table,
        comms,
        collisions,
    } = count_stacks(skel, config, processes, &counts, &markers, plan);

    meta.lost_samples = dropped;
    let thread = |pid: u32, tid: u32| thread_of(&comms, pid, tid);
    let mut symbolizer = Symbolizer::new();
    let (mut profile, tally) = table.into_profile(&mut symbolizer, meta, &thread);
    // Counts in the kernel carry no CPU.
    for sample in &mut profile.samples {
        sample.cpu = None;
    }
    let missed = missed_stacks(&profile);
    let mut hints = hints(config, processes, &tally, dropped, missed, user_full);
    let skipped = program::switch_misses(skel);
    if skipped > 0 {
        hints.push(Hint::Said(format!(
            "the kernel skipped {skipped} runs of the off-CPU program (another BPF program was running on that CPU): time off the CPU around those switches is missing or counted under the stack before"
        )));
    }
    let storage = Storage {
        stacks_full: collisions,
        counts_full: dropped > 0 || counts.len() as u64 >= u64::from(config.hash_storage_size),
        dropped_samples: dropped,
        missed_stacks: missed,
    };
    Recording {
        profile,
        storage: Some(storage),
        hints,
        ..Recording::default()
    }
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

/// The count map read into a stack table.
struct Counted {
    table: StackTable,
    /// Each (pid, tid)'s command name as the kernel saw it.
    comms: HashMap<(u32, u32), String>,
    /// Some stack id was lost to a full stack storage or a taken hash bucket.
    collisions: bool,
}

/// Each event's root frame by its index, with several events (none with one). Leaked: the
/// stack table names markers by `&'static str`, and a run counts a few events.
fn event_markers(plan: &Plan) -> Vec<&'static str> {
    if !plan.marks_events() {
        return Vec::new();
    }
    plan.names
        .iter()
        .map(|name| &*Box::leak(name.clone().into_boxed_str()))
        .collect()
}

/// Turns each counted key's stack ids into frames, reading every stack once; with several
/// events, each stack's root is its event's marker.
fn count_stacks(
    skel: &ProfileSkel<'_>,
    config: &BpfConfig,
    processes: &mut Processes,
    counts: &[(CountKey, u64)],
    markers: &[&'static str],
    plan: &Plan,
) -> Counted {
    let mut table = StackTable::default();
    let mut comms: HashMap<(u32, u32), String> = HashMap::new();
    let mut kernel_stacks: HashMap<i32, Option<Vec<u64>>> = HashMap::new();
    let mut user_stacks: HashMap<i64, Option<layout::UserStack>> = HashMap::new();
    let mut collisions = false;
    let mut frames = Vec::new();
    for (key, count) in counts {
        frames.clear();
        comms
            .entry((key.pid, key.tid))
            .or_insert_with(|| key.comm.clone());
        if config.kernel {
            match key.kernel_stack_id {
                id if id >= 0 => {
                    let stack = kernel_stacks
                        .entry(id)
                        .or_insert_with(|| program::kernel_stack(skel, id));
                    match stack {
                        Some(addrs) => frames.extend(lookup_addresses(addrs).map(RawFrame::Kernel)),
                        None => frames.push(RawFrame::Marker(MISSED_KERNEL)),
                    }
                }
                id if i64::from(id) == layout::NO_STACK => {}
                id => {
                    collisions |= i64::from(id) == layout::STACK_COLLISION;
                    frames.push(RawFrame::Marker(MISSED_KERNEL));
                }
            }
        }
        let mut end = UserEnd::NoStack;
        if config.user {
            match key.user_stack_id {
                id if id >= 0 => {
                    let stack = user_stacks
                        .entry(id)
                        .or_insert_with(|| program::user_stack(skel, id));
                    match stack {
                        Some(stack) => {
                            end = user_frames(&mut table, processes, key, stack, &mut frames)
                        }
                        None => frames.push(RawFrame::Marker(MISSED_USER)),
                    }
                }
                layout::NO_STACK => {}
                id => {
                    collisions |= id == layout::STACK_COLLISION || id == layout::STACK_STORAGE_FULL;
                    frames.push(RawFrame::Marker(MISSED_USER));
                }
            }
        }
        if let Some(marker) = markers.get(key.event as usize) {
            frames.push(RawFrame::Event(marker));
        }
        let weight = plan.weight(key.event, *count);
        if weight > 0 {
            table.add_count(key.pid, key.tid, 0, &frames, end, weight);
        }
    }

    Counted {
        table,
        comms,
        collisions,
    }
}

/// A sampled thread, named by the command names the kernel recorded (for the process, its main
/// thread's; else the one the process has now).
fn thread_of(comms: &HashMap<(u32, u32), String>, pid: u32, tid: u32) -> Thread {
    let comm = comms
        .get(&(pid, tid))
        .cloned()
        .unwrap_or_else(|| format!("[pid {tid}]"));
    let process_name = comms
        .get(&(pid, pid))
        .cloned()
        .or_else(|| target::thread_comm(pid, pid))
        .unwrap_or_else(|| comm.clone());
    Thread {
        pid,
        tid,
        comm,
        process_name,
    }
}

/// What the user can do about stacks and samples the maps could not hold, and about stacks
/// that broke off.
fn hints(
    config: &BpfConfig,
    processes: &Processes,
    tally: &Tally,
    dropped: u64,
    missed: u64,
    user_full: u64,
) -> Vec<Hint> {
    let mut hints = Vec::new();
    if dropped > 0 {
        hints.push(Hint::CountMapFull {
            dropped,
            entries: config.hash_storage_size,
        });
    }
    if missed > 0 || user_full > 0 {
        hints.push(Hint::StackStorageFull {
            missed,
            entries: config.stack_storage_size,
        });
    }
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

const MISSED_USER: &str = stackscope_profile::MISSED_USER_STACK;
const MISSED_KERNEL: &str = stackscope_profile::MISSED_KERNEL_STACK;

/// Appends a user stack's frames (leaf first) and says how its walk ended.
fn user_frames(
    table: &mut StackTable,
    processes: &mut Processes,
    key: &CountKey,
    stack: &layout::UserStack,
    frames: &mut Vec<RawFrame>,
) -> UserEnd {
    let maps = processes.maps(key.pid);
    let mut last_module = None;
    for addr in lookup_addresses(&stack.ips) {
        let mapping = maps.and_then(|m| m.find(addr));
        last_module = mapping.map(|m| m.path.clone());
        frames.push(table.user_frame(key.pid, addr, mapping));
    }
    match stack.end {
        // The program ends a walk at a zero return address or frame pointer as well as where
        // the tables mark the end: judged by its outermost frame.
        layout::UserEnd::Complete => {
            UserEnd::Broken(last_module.unwrap_or_else(|| stackscope_profile::UNKNOWN.into()))
        }
        layout::UserEnd::Truncated => {
            frames.push(RawFrame::Truncated);
            UserEnd::Truncated
        }
        layout::UserEnd::Broken => {
            UserEnd::Broken(last_module.unwrap_or_else(|| stackscope_profile::UNKNOWN.into()))
        }
        layout::UserEnd::FramePointer => UserEnd::Unjudged,
    }
}
