//! Counted keys read back into a stack table: each key's kernel and user stack ids turned
//! into frames, every stack read from the program's maps once, and the stacks the maps could
//! not hold shown as missing, by why. A live recording counts into one table across its
//! refreshes.

use std::collections::HashMap;

use stackscope_stacks::table::{RawFrame, Sampled, StackTable};
use stackscope_stacks::walk::{lookup_address, lookup_addresses, WalkEnd};

use super::BpfConfig;
use crate::layout::{self, CountKey};
use crate::probe::Plan;
use crate::processes::Processes;
use crate::program::{self, ProfileSkel};

/// Counted keys turned into frames in a stack table, each stack id read once; a live
/// recording counts into one across its refreshes, taking the table each time.
pub(super) struct Counter {
    pub table: StackTable,
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
    pub collided: u64,
    pub full: u64,
    pub unread: u64,
    pub kernel_stored: u64,
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
        let mut frames = Vec::new();
        let mut process_names = ProcessNames::new(counts);
        for (key, weight, objects) in counts {
            frames.clear();
            let process = process_names.of(key, processes);
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
                // A process that execs is another program before and after: its keys say which.
                let sampled = Sampled {
                    pid: key.pid,
                    tid: key.tid,
                    cpu: 0,
                    names: Some((&key.comm, &process)),
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

/// The name of each counted thread's process: the thread's own where it is the main thread
/// (the name it had when counted), else the main thread's as the process has it now or had
/// when last seen, else as the main thread's counts say.
struct ProcessNames<'a> {
    counted: HashMap<u32, &'a str>,
    known: HashMap<u32, String>,
}

impl<'a> ProcessNames<'a> {
    fn new(counts: &'a [(CountKey, u64, u64)]) -> Self {
        let counted = (counts.iter())
            .filter(|(key, ..)| key.pid == key.tid)
            .map(|(key, ..)| (key.pid, key.comm.as_str()))
            .collect();
        ProcessNames {
            counted,
            known: HashMap::new(),
        }
    }

    fn of(&mut self, key: &CountKey, processes: &Processes) -> String {
        if key.pid == key.tid {
            return key.comm.clone();
        }
        let counted = self.counted.get(&key.pid).copied();
        (self.known.entry(key.pid))
            .or_insert_with(|| {
                (processes.name(key.pid))
                    .or_else(|| counted.map(str::to_string))
                    .unwrap_or_else(|| key.comm.clone())
            })
            .clone()
    }
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
}
