//! Turning a source's events into counted raw stacks: each process's comm and mappings are
//! tracked from the events, every sample's user stack is unwound (or taken from its
//! frame-pointer callchain), and the stacks are counted, then named into a profile. Stacks
//! deeper than their copy wait for their outer frames in `outer`.

use std::collections::HashMap;
use std::sync::Arc;

use stackscope_profile::{Metadata, Thread};
use stackscope_stacks::arch::Regs;
use stackscope_stacks::table::{BackgroundFold, RawFrame, Sampled, StackTable, UNREADABLE};
use stackscope_stacks::{AddressSpace, Recording, Unnamed};
use stackscope_symbols::Symbolizer;

use super::hints;
use crate::event::{Event, SampleEvent};
use crate::sampler::{SamplerConfig, StackMode};
use crate::unwind::roots::{Copy, Room, Roots, Spot};
use crate::unwind::ProcessUnwinders;
use outer::Waiting;
use stackscope_process::maps::read_proc_maps;
use stackscope_stacks::walk::{lookup_addresses, Stop, Trail, WalkEnd};

/// Unique frames a stack table holds before it is named and merged by function: a few MiB of
/// table.
const FOLD_AT_NODES: usize = 1 << 16;

/// What is known about one process.
#[derive(Default)]
struct Process {
    maps: AddressSpace,
    /// The maps of the program it ran before its last exec: until execve returns, its thread
    /// still holds that program's registers.
    before_exec: Option<AddressSpace>,
    /// True once the maps were read or built from events, so an unknown pid is looked up once.
    known: bool,
}

/// Turns sampler events into counted raw stacks; shared by live recording and the replay of a
/// perf.data file.
///
/// Only live tasks are tracked: a process's maps and a thread's name are dropped at its exit,
/// so memory follows what runs at once, not how many processes came and went.
pub(crate) struct Collector {
    processes: HashMap<u32, Process>,
    /// Thread names, by tid.
    comms: HashMap<u32, Arc<str>>,
    unwinder: ProcessUnwinders,
    table: StackTable,
    /// Names and merges full tables while sampling goes on; started at the first full table.
    fold: Option<BackgroundFold>,
    lost: u64,
    user: bool,
    kernel: bool,
    stack_bytes: Option<u32>,
    trail: Trail,
    frames: Vec<RawFrame>,
    /// The outer frames of each live thread's deep stacks, and its samples waiting for them.
    roots: Roots<Waiting>,
    /// What ran the stack copies out.
    pub(super) room: Room,
    /// False when replaying a saved file: its pids are no longer the live ones, so /proc must
    /// not fill in what the file lacks, and the hints speak of perf record's options.
    live: bool,
    /// Read the rest of a stack deeper than its copy from the live thread.
    read_on: bool,
    /// A copy extended with what was read beyond it.
    extended: Vec<u8>,
}

impl Collector {
    pub(crate) fn new(config: &SamplerConfig) -> Self {
        Collector {
            processes: HashMap::new(),
            comms: HashMap::new(),
            unwinder: ProcessUnwinders::new(),
            table: StackTable::default(),
            fold: None,
            lost: 0,
            user: config.user,
            kernel: config.kernel,
            stack_bytes: match config.stack_mode {
                StackMode::Dwarf { stack_bytes } => Some(stack_bytes),
                StackMode::FramePointer => None,
            },
            trail: Trail::default(),
            frames: Vec::new(),
            roots: Roots::default(),
            room: Room::default(),
            live: true,
            read_on: false,
            extended: Vec::new(),
        }
    }

    /// A collector that reads the rest of a stack deeper than its copy from the live thread
    /// when `read_on`.
    pub(crate) fn reading_on(mut self, read_on: bool) -> Self {
        self.read_on = read_on && self.live;
        self
    }

    /// A collector that hands its table to `fold` whenever asked ([`Collector::hand_over`]),
    /// for a live view.
    pub(crate) fn handing_to(mut self, fold: BackgroundFold) -> Self {
        self.fold = Some(fold);
        self
    }

    /// A collector for events read back from a file rather than from live processes.
    pub(crate) fn replaying(mut self) -> Self {
        self.live = false;
        self
    }

    pub(crate) fn handle(&mut self, event: Event<'_>) {
        match event {
            Event::Sample(sample) => self.sample(&sample),
            Event::Mmap { pid, mapping, .. } => {
                let process = self.processes.entry(pid).or_default();
                process.maps.insert(mapping);
                process.known = true;
            }
            Event::Comm {
                pid,
                tid,
                comm,
                exec,
            } => {
                if exec {
                    // The thread's old stack is gone with the old program.
                    self.settle(tid);
                    self.roots.forget(tid);
                    let process = self.processes.entry(pid).or_default();
                    process.before_exec = Some(std::mem::take(&mut process.maps));
                    process.known = true;
                    self.unwinder.forget(pid);
                }
                self.comms.insert(tid, comm.into());
            }
            Event::Fork {
                pid,
                ppid,
                tid,
                ptid,
            } => {
                if let Some(comm) = self.comms.get(&ptid).cloned() {
                    self.comms.insert(tid, comm);
                }
                if pid != ppid {
                    // A new process starts with a copy of its parent's address space.
                    let maps = self
                        .processes
                        .get(&ppid)
                        .map(|p| p.maps.clone())
                        .unwrap_or_default();
                    self.processes.insert(
                        pid,
                        Process {
                            maps,
                            before_exec: None,
                            known: true,
                        },
                    );
                }
            }
            Event::Exit { pid, tid } => {
                self.settle(tid);
                self.roots.forget(tid);
                self.comms.remove(&tid);
                if pid == tid {
                    self.processes.remove(&pid);
                    self.unwinder.forget(pid);
                }
            }
            Event::Lost { count } => {
                self.lost += count;
                self.table.lose(count);
            }
        }
    }

    fn sample(&mut self, sample: &SampleEvent<'_>) {
        self.frames.clear();
        if self.kernel {
            let addrs = lookup_addresses(sample.kernel_stack);
            self.frames.extend(addrs.map(RawFrame::Kernel));
        }
        let end = if self.user && sample.pid != 0 {
            self.user_stack(sample)
        } else {
            WalkEnd::NoStack
        };
        if self.frames.is_empty() {
            return;
        }
        let comm = self.comm(sample.pid, sample.tid);
        let process = self.comm(sample.pid, sample.pid);
        if end == WalkEnd::Truncated {
            let Some(spot) = Spot::outermost(&self.trail) else {
                self.frames.push(RawFrame::Truncated);
                let names = (&*comm, &*process);
                self.count((sample.pid, sample.tid), names, sample.cpu, end);
                return;
            };
            return self.count_ran_out(sample, spot, (comm, process));
        }
        let names = (&*comm, &*process);
        let (pid, tid, cpu) = (sample.pid, sample.tid, sample.cpu);
        self.count((pid, tid), names, cpu, end);
    }

    /// Counts one sample of `self.frames`.
    fn count(&mut self, (pid, tid): (u32, u32), names: (&str, &str), cpu: u32, end: WalkEnd) {
        let sampled = Sampled {
            pid,
            tid,
            cpu,
            names: Some(names),
        };
        self.table.count(sampled, &self.frames, end, 1);
        if self.table.nodes() >= FOLD_AT_NODES {
            self.fold_table();
        }
    }

    /// Hands the table over to be named and merged by function, and starts a new one: the
    /// addresses of a long whole-system recording would otherwise grow without end.
    fn fold_table(&mut self) {
        if self.fold.is_none() {
            // Without a thread, the table grows on and is named at the end.
            self.fold = BackgroundFold::start(thread_names(self.live)).ok();
        }
        self.hand_over();
    }

    /// Hands what was counted since the last hand-over to the fold, when there is one.
    pub(crate) fn hand_over(&mut self) {
        if let Some(fold) = &self.fold {
            fold.fold(self.table.take());
        }
    }

    /// A thread's name now; looked up in /proc once when no event named it.
    fn comm(&mut self, pid: u32, tid: u32) -> Arc<str> {
        if let Some(comm) = self.comms.get(&tid) {
            return comm.clone();
        }
        let comm: Arc<str> = thread_comm(pid, tid, self.live).into();
        self.comms.insert(tid, comm.clone());
        comm
    }

    /// Unwinds the sample's user stack onto `self.frames`; says how the unwinding ended.
    fn user_stack(&mut self, sample: &SampleEvent<'_>) -> WalkEnd {
        let pid = sample.pid;
        self.know_process(pid);
        let end = match (self.stack_bytes, sample.user_regs) {
            (Some(_), Some(regs)) if sample.user_stack.is_empty() => {
                return self.sampled_instruction(pid, regs.pc);
            }
            (Some(bytes), Some(regs)) => self.unwind_copy(sample, regs, bytes),
            (None, _) if !sample.user_callchain.is_empty() => {
                self.trail.addrs.clear();
                let chain = lookup_addresses(sample.user_callchain);
                self.trail.addrs.extend(chain);
                WalkEnd::FramePointerChain
            }
            // A kernel thread, or a sample without user state.
            _ => return WalkEnd::NoStack,
        };
        if self.trail.addrs.is_empty() {
            return WalkEnd::NoStack;
        }
        let maps = self.processes.get(&pid).map(|p| &p.maps);
        for &addr in &self.trail.addrs {
            let mapping = maps.and_then(|m| m.find(addr));
            self.frames.push(self.table.user_frame(pid, addr, mapping));
        }
        if let Some(maps) = maps {
            self.table.note_jitdump(pid, maps);
        }
        if matches!(
            end,
            WalkEnd::Stopped {
                why: Some(Stop::FrameLimit),
                ..
            }
        ) {
            self.frames.push(RawFrame::Truncated);
        }
        end
    }

    /// Marks `pid` known, reading its maps once when no event told them (it raced our start).
    fn know_process(&mut self, pid: u32) {
        let process = self.processes.entry(pid).or_default();
        if !process.known {
            if self.live {
                process.maps = read_proc_maps(pid).unwrap_or_default();
            }
            process.known = true;
        }
    }

    /// Nothing to unwind: the sampled instruction `pc` alone, in the program the thread runs
    /// or, inside execve, in the one it is leaving, and the stack marked unreadable.
    fn sampled_instruction(&mut self, pid: u32, pc: u64) -> WalkEnd {
        let process = self.processes.entry(pid).or_default();
        let maps = match &process.before_exec {
            Some(old) if process.maps.find(pc).is_none() => old,
            _ => &process.maps,
        };
        let frame = self.table.user_frame(pid, pc, maps.find(pc));
        self.frames.push(frame);
        self.frames.push(RawFrame::Marker(UNREADABLE));
        WalkEnd::Unreadable
    }

    /// Unwinds the sample's copy of `bytes` of user stack into `self.trail` (reading on from
    /// the live thread where asked), and learns from it what the thread's deeper walks need.
    fn unwind_copy(&mut self, sample: &SampleEvent<'_>, regs: Regs, bytes: u32) -> WalkEnd {
        let pid = sample.pid;
        let maps = &self.processes.entry(pid).or_default().maps;
        let mut stack = sample.user_stack;
        let end = if self.read_on {
            let (space, out) = ((pid, maps), &mut self.trail);
            let end = self
                .unwinder
                .unwind_reading_on(space, regs, stack, out, &mut self.extended);
            if !self.extended.is_empty() && end != WalkEnd::Truncated {
                stack = &self.extended;
                self.room.read_on += 1;
            }
            end
        } else {
            self.unwinder
                .unwind(pid, maps, regs, stack, &mut self.trail)
        };
        let copy = Copy {
            sp: regs.sp,
            bytes: stack,
        };
        self.roots.learn(sample.tid, copy, &self.trail, &end);
        if end == WalkEnd::Truncated {
            self.room.measure(&self.trail, bytes);
        }
        end
    }

    /// What was counted, unnamed, for another source's naming step to name.
    pub(crate) fn finish_unnamed(mut self, mut meta: Metadata) -> Unnamed {
        self.settle_all();
        meta.lost_samples = self.lost;
        Unnamed {
            table: self.table,
            meta,
            recovered: self.room.recovered + self.room.read_on,
        }
    }

    /// Counts the stacks still waiting for a later sample of their thread.
    fn settle_all(&mut self) {
        for tid in self.roots.waiting_threads() {
            self.settle(tid);
        }
    }

    pub(crate) fn finish(
        mut self,
        mut meta: Metadata,
        config: &SamplerConfig,
        kernel_excluded: bool,
    ) -> Recording {
        self.settle_all();
        meta.lost_samples = self.lost;
        let missing = self.unwinder.modules_without_unwind_info();
        // What unwinding needed (parsed unwind tables, mapped sections, the live processes'
        // maps) is let go before naming, the recording's peak of memory.
        let Collector {
            processes,
            comms,
            unwinder,
            table,
            fold,
            ..
        } = self;
        drop((processes, comms, unwinder));
        let (mut profile, tally) = match fold {
            Some(fold) => {
                fold.fold(table);
                fold.finish().finish(meta)
            }
            None => {
                let mut symbolizer = Symbolizer::new();
                table.into_profile(&mut symbolizer, meta, &thread_names(self.live))
            }
        };
        let hints = hints::hints(&hints::Outcome {
            missing: &missing,
            stack_bytes: self.stack_bytes,
            live: self.live,
            tally: &tally,
            room: &self.room,
            lost: self.lost,
            kernel_excluded: kernel_excluded && config.kernel,
        });
        profile.meta.unwind.recovered = self.room.recovered + self.room.read_on;
        Recording {
            profile,
            hints,
            ..Recording::default()
        }
    }
}

/// Names for a (pid, tid) pair counted without them. Every sample here is counted with its
/// thread's names, so this is never asked; the table wants an answer all the same.
pub(crate) fn thread_names(live: bool) -> impl Fn(u32, u32) -> Thread + Send + 'static {
    move |pid, tid| Thread {
        pid,
        tid,
        comm: thread_comm(pid, tid, live),
        process_name: thread_comm(pid, pid, live),
    }
}

/// The name of a thread no event named: read from /proc while it lives.
fn thread_comm(pid: u32, tid: u32, live: bool) -> String {
    if pid == u32::MAX {
        // The kernel reports pid -1 for a task sampled after its pid was released, at the
        // very end of its exit.
        return "[exited]".to_string();
    }
    if !live {
        // perf names the idle task as the kernel does.
        return if tid == 0 {
            "swapper".to_string()
        } else {
            format!("[pid {tid}]")
        };
    }
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| format!("[pid {tid}]"))
}

mod outer;
#[cfg(test)]
mod tests;
