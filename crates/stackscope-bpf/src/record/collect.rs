//! The end of a recording: the counted stacks read back from the BPF maps into the stack table,
//! named into a [`stackscope_profile::Profile`] as the perf_event source names its own, with hints for what the
//! maps could not hold.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use stackscope_process::target;
use stackscope_profile::format::summary::missed_stacks;
use stackscope_profile::{Metadata, Thread};
use stackscope_stacks::table::{RawFrame, Sampled, StackTable, Tally};
use stackscope_stacks::walk::{lookup_address, lookup_addresses, WalkEnd};
use stackscope_stacks::{BpfFigures, Hint, ProgramCost, Recording, SourceFigures, Storage};
use stackscope_symbols::Symbolizer;

use super::live::LiveDrain;
use super::{memory, BpfConfig, TimeProfile};
use crate::layout::{self, CountKey};
use crate::probe::Plan;
use crate::processes::Processes;
use crate::program::{self, ProfileSkel};
use crate::tables::NotLoaded;

/// Reads the counted stacks and symbolizes them, with what the maps could not hold and what
/// the program `cost`. Threads still off the CPU when counting stopped (`ended`, on the
/// program's clock) are counted up to then. A live recording's last counts join the stacks
/// `live` has handed over and named as it went.
#[allow(clippy::too_many_arguments)]
pub(super) fn collect(
    skel: &ProfileSkel<'_>,
    config: &BpfConfig,
    processes: &mut Processes,
    mut meta: Metadata,
    plan: &Plan,
    ended: u64,
    cost: ProgramCost,
    live: Option<LiveDrain>,
) -> Recording {
    let counts = final_counts(skel, config, plan, ended);
    let (dropped, user_full) = program::drops(skel);
    meta.lost_samples = dropped;
    let (mut profile, tally, lost, keys) = match live {
        Some(live) => live.finish(skel, config, processes, plan, &counts, meta),
        None => {
            let mut counter = Counter::new(plan);
            counter.count(skel, config, processes, &counts, plan);
            let thread = counter.namer();
            let lost = counter.lost();
            let mut symbolizer = Symbolizer::new();
            let (profile, tally) = counter.table.into_profile(&mut symbolizer, meta, &thread);
            (profile, tally, lost, counts.len())
        }
    };
    // Counts in the kernel carry no CPU.
    for sample in &mut profile.samples {
        sample.cpu = None;
    }
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
    Recording {
        profile,
        figures: Some(SourceFigures::Bpf(BpfFigures {
            storage,
            cost,
            lead_in: None,
        })),
        hints,
        ..Recording::default()
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

/// Each (pid, tid)'s command name as the kernel saw it, shared with the naming thread of a
/// live recording.
type Comms = Arc<Mutex<HashMap<(u32, u32), String>>>;

/// Counted keys turned into frames in a stack table, each stack id read once; a live
/// recording counts into one across its refreshes, taking the table each time.
pub(super) struct Counter {
    pub table: StackTable,
    comms: Comms,
    read: ReadBack,
    markers: Vec<&'static str>,
}

/// Why the stack of one side (user or kernel) of a counted key is missing, from the stack id
/// the program stored in its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// Another stack held its hash bucket in the kernel's stack map, which keeps one stack
    /// per bucket: collisions come long before the map is full.
    Collided,
    /// The stack storage was full.
    Full,
    /// Not for lack of room: the kernel refused the stack for another reason, or a stored
    /// stack could not be read back.
    Unread,
}

impl Loss {
    /// The loss an error id (any id below 0 but [`layout::NO_STACK`], which is no stack at
    /// all) stands for.
    fn of(id: i64) -> Loss {
        match id {
            layout::STACK_COLLISION => Loss::Collided,
            layout::KERNEL_STACKS_FULL | layout::STACK_STORAGE_FULL => Loss::Full,
            _ => Loss::Unread,
        }
    }
}

/// Stacks shown as missing (one per side of a counted key), by [`Loss`], and the kernel
/// stacks stored in all.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Lost {
    collided: u64,
    full: u64,
    unread: u64,
    kernel_stored: u64,
}

impl Lost {
    fn count(&mut self, loss: Loss) {
        match loss {
            Loss::Collided => self.collided += 1,
            Loss::Full => self.full += 1,
            Loss::Unread => self.unread += 1,
        }
    }
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

/// User stacks kept read between a live recording's refreshes: past this many, they are read
/// anew (each is a few hundred bytes, and a whole system under a build meets ever new ones).
const USER_STACKS_KEPT: usize = 1 << 16;

impl Counter {
    pub fn new(plan: &Plan) -> Counter {
        Counter {
            table: StackTable::default(),
            comms: Comms::default(),
            read: ReadBack::default(),
            markers: event_markers(plan),
        }
    }

    /// Turns each counted key's stack ids into frames, reading every stack once; with several
    /// events, each stack's root is its event's marker. A count is its weight in the profile
    /// and, of memory, the allocations it counts.
    pub fn count(
        &mut self,
        skel: &ProfileSkel<'_>,
        config: &BpfConfig,
        processes: &mut Processes,
        counts: &[(CountKey, u64, u64)],
        plan: &Plan,
    ) {
        if self.read.user.len() > USER_STACKS_KEPT {
            self.read.user.clear();
        }
        let (table, read) = (&mut self.table, &mut self.read);
        let mut comms = self.comms.lock().unwrap_or_else(|e| e.into_inner());
        let mut frames = Vec::new();
        for (key, weight, objects) in counts {
            frames.clear();
            comms
                .entry((key.pid, key.tid))
                .or_insert_with(|| key.comm.clone());
            if config.kernel {
                read.kernel(skel, key.kernel_stack_id, &mut frames);
            }
            let mut end = WalkEnd::NoStack;
            if config.user {
                let leaf = Leaf::of(plan, key.event);
                end = read.user(skel, table, processes, (key, leaf), &mut frames);
            }
            if let Some(marker) = self.markers.get(key.event as usize) {
                frames.push(RawFrame::Event(marker));
            }
            if *weight > 0 {
                let sampled = Sampled {
                    pid: key.pid,
                    tid: key.tid,
                    cpu: 0,
                    names: None,
                };
                table.count_objects(sampled, &frames, end, *weight, *objects);
            }
        }
    }

    /// The stacks shown as missing so far, and the kernel stacks stored.
    pub fn lost(&self) -> Lost {
        Lost {
            kernel_stored: self.read.kernel.values().filter(|s| s.is_some()).count() as u64,
            ..self.read.lost.clone()
        }
    }

    /// Names a sampled thread by the command names the kernel recorded.
    pub fn namer(&self) -> impl Fn(u32, u32) -> Thread + Send + 'static {
        let comms = self.comms.clone();
        move |pid, tid| thread_of(&comms.lock().unwrap_or_else(|e| e.into_inner()), pid, tid)
    }
}

/// The stacks read back from the program's stack maps, each id once, and the ones shown as
/// missing.
#[derive(Default)]
struct ReadBack {
    kernel: HashMap<i32, Option<Vec<u64>>>,
    user: HashMap<i64, Option<layout::UserStack>>,
    lost: Lost,
}

impl ReadBack {
    /// Appends the kernel stack stored under `id` (leaf first), or a marker where it is
    /// missing.
    fn kernel(&mut self, skel: &ProfileSkel<'_>, id: i32, frames: &mut Vec<RawFrame>) {
        match id {
            id if id >= 0 => {
                let stack = self
                    .kernel
                    .entry(id)
                    .or_insert_with(|| program::kernel_stack(skel, id));
                match stack {
                    Some(addrs) => frames.extend(lookup_addresses(addrs).map(RawFrame::Kernel)),
                    None => {
                        self.lost.count(Loss::Unread);
                        frames.push(RawFrame::Marker(MISSED_KERNEL));
                    }
                }
            }
            id if i64::from(id) == layout::NO_STACK => {}
            id => {
                self.lost.count(Loss::of(id.into()));
                frames.push(RawFrame::Marker(MISSED_KERNEL));
            }
        }
    }

    /// Appends the user stack of `key` (leaf first), or a marker where it is missing, and
    /// says how its walk ended.
    fn user(
        &mut self,
        skel: &ProfileSkel<'_>,
        table: &mut StackTable,
        processes: &mut Processes,
        (key, leaf): (&CountKey, Leaf),
        frames: &mut Vec<RawFrame>,
    ) -> WalkEnd {
        match key.user_stack_id {
            id if id >= 0 => {
                let stack = self
                    .user
                    .entry(id)
                    .or_insert_with(|| program::user_stack(skel, id));
                match stack {
                    Some(stack) => {
                        return user_frames(table, processes, (key, leaf), stack, frames)
                    }
                    None => {
                        // Read again when named again: a live recording takes user stacks
                        // out of their map, and one may be stored anew.
                        self.user.remove(&id);
                        self.lost.count(Loss::Unread);
                        frames.push(RawFrame::Marker(MISSED_USER));
                    }
                }
            }
            layout::NO_STACK => {}
            id => {
                self.lost.count(Loss::of(id));
                frames.push(RawFrame::Marker(MISSED_USER));
            }
        }
        WalkEnd::NoStack
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

const MISSED_USER: &str = stackscope_profile::MISSED_USER_STACK;
const MISSED_KERNEL: &str = stackscope_profile::MISSED_KERNEL_STACK;

/// What a user stack's leaf address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leaf {
    /// The instruction the sample or probe stopped at.
    Instruction,
    /// A return address: the stack was taken just after a return (a uretprobe, an
    /// allocation), so the leaf is named, as every caller is, by its call.
    Return,
}

impl Leaf {
    fn of(plan: &Plan, event: u32) -> Leaf {
        match plan.taken_at_return(event) {
            true => Leaf::Return,
            false => Leaf::Instruction,
        }
    }
}

/// Appends a user stack's frames (leaf first) and says how its walk ended.
fn user_frames(
    table: &mut StackTable,
    processes: &mut Processes,
    (key, leaf): (&CountKey, Leaf),
    stack: &layout::UserStack,
    frames: &mut Vec<RawFrame>,
) -> WalkEnd {
    let maps = processes.maps(key.pid);
    let mut last_module = None;
    let leaf_at_call = stack.ips.first().filter(|_| leaf == Leaf::Return);
    let addrs = lookup_addresses(&stack.ips)
        .enumerate()
        .map(|(i, addr)| match (i, leaf_at_call) {
            (0, Some(&ret)) => lookup_address(ret),
            _ => addr,
        });
    for addr in addrs {
        let mapping = maps.and_then(|m| m.find(addr));
        last_module = mapping.map(|m| m.path.clone());
        frames.push(table.user_frame(key.pid, addr, mapping));
    }
    if let Some(maps) = maps {
        table.note_jitdump(key.pid, maps);
    }
    let end = stack.end.clone().in_module(|| last_module);
    if end == WalkEnd::Truncated {
        frames.push(RawFrame::Truncated);
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stack_id_error_is_lost_for_its_own_reason() {
        assert_eq!(Loss::of(layout::STACK_COLLISION), Loss::Collided);
        assert_eq!(Loss::of(layout::KERNEL_STACKS_FULL), Loss::Full);
        assert_eq!(Loss::of(layout::STACK_STORAGE_FULL), Loss::Full);
        assert_eq!(Loss::of(-i64::from(libc::EINVAL)), Loss::Unread);
    }

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
