//! One recording: runs the sampler until the duration ends, the target exits or the caller
//! asks to stop, tracks each process's comm and mappings from the sampler's events, unwinds
//! every sample's user stack, counts raw stacks, and symbolizes them into a [`Profile`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stackscope_profile::{Metadata, Profile, Thread};
use stackscope_symbols::Symbolizer;

use crate::maps::ProcessMaps;
use crate::sampler::{Event, SampleError, SampleEvent, Sampler, SamplerConfig, StackMode};
use crate::target::Target;
use crate::unwind::{UnwindEnd, Unwinder};
use stackscope_stacks::table::{BackgroundFold, RawFrame, StackTable, UserEnd, UNREADABLE};

/// What to record and when to stop.
pub struct RecordOptions {
    pub target: Target,
    pub sampler: SamplerConfig,
    /// Stop after this long; `None` runs until the target exits or `stop` is set.
    pub duration: Option<Duration>,
    /// Set (e.g. from a SIGINT handler) to stop and keep what was collected.
    pub stop: Arc<AtomicBool>,
    /// The command line shown in the profile's metadata.
    pub command: Vec<String>,
}

/// What a recording produced: the one result type every source hands back.
pub use stackscope_stacks::Recording;

/// The most user stack a perf_event sample can carry: the whole sample must fit in 64 KiB.
pub const MAX_STACK_COPY: u32 = crate::perf::MAX_STACK_BYTES;

/// Unique frames a stack table holds before it is named and merged by function: a few MiB of
/// table.
const FOLD_AT_NODES: usize = 1 << 16;

/// How often the loop wakes to check the clock, the stop flag and the target.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Records until the duration ends, the target exits, or `options.stop` is set. `on_start`
/// runs once sampling has begun (the target exists and the events are enabled), so the caller
/// announces nothing for a target that failed to start.
pub fn record(options: RecordOptions, on_start: impl FnOnce()) -> Result<Recording, SampleError> {
    let mut sampler = Sampler::open(&options.target, &options.sampler)?;
    let mut collector = Collector::new(&options.sampler);
    sampler.start()?;
    on_start();
    let started = Instant::now();
    let mut interrupted = false;
    let mut failure = None;
    loop {
        if let Err(e) = sampler.poll(POLL_INTERVAL, &mut |event| collector.handle(event)) {
            failure = Some(e);
            break;
        }
        if options.stop.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        if options.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if sampler.target_finished() {
            break;
        }
    }
    sampler.stop();
    if failure.is_none() {
        // What the kernel wrote before the events were disabled is still in the buffers.
        if let Err(e) = sampler.poll(Duration::ZERO, &mut |event| collector.handle(event)) {
            failure = Some(e);
        }
    }
    let elapsed = started.elapsed();
    if sampler.child_pid().is_some() && sampler.exit_status().is_none() {
        end_child(&mut sampler, interrupted);
    }
    let meta = Metadata {
        source: "perf_event".into(),
        event: "cpu-clock".into(),
        frequency_hz: options.sampler.frequency,
        period: options.sampler.period,
        duration_secs: elapsed.as_secs_f64(),
        command: options.command.clone(),
        ..Metadata::default()
    };
    let kernel_excluded = sampler.kernel_excluded();
    let profile = collector.finish(meta, &options.sampler, kernel_excluded);
    Ok(Recording {
        profile,
        exit_status: sampler.exit_status(),
        interrupted,
        failure: failure.map(|e| e.to_string()),
        ..Recording::default()
    })
}

/// Ends a launched command that is still running when recording stops: SIGINT after Ctrl-C
/// (when the terminal did not already deliver it), SIGTERM after the duration, SIGKILL if it
/// has not gone two seconds later. Reaps it so its exit status is known.
fn end_child(sampler: &mut Sampler, interrupted: bool) {
    let first = if interrupted {
        libc::SIGINT
    } else {
        libc::SIGTERM
    };
    for (signal, grace) in [(first, 2000), (libc::SIGKILL, 1000)] {
        sampler.kill_child(signal);
        let until = Instant::now() + Duration::from_millis(grace);
        while Instant::now() < until {
            if sampler.target_finished() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What is known about one process.
#[derive(Default)]
struct Process {
    maps: ProcessMaps,
    /// The maps of the program it ran before its last exec: until execve returns, its thread
    /// still holds that program's registers.
    before_exec: Option<ProcessMaps>,
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
    unwinder: Unwinder,
    table: StackTable,
    /// Names and merges full tables while sampling goes on; started at the first full table.
    fold: Option<BackgroundFold>,
    lost: u64,
    user: bool,
    kernel: bool,
    stack_bytes: Option<u32>,
    addrs: Vec<u64>,
    frames: Vec<RawFrame>,
    /// False when replaying a saved file: its pids are no longer the live ones, so /proc must
    /// not fill in what the file lacks, and the hints speak of perf record's options.
    live: bool,
}

impl Collector {
    pub(crate) fn new(config: &SamplerConfig) -> Self {
        Collector {
            processes: HashMap::new(),
            comms: HashMap::new(),
            unwinder: Unwinder::new(),
            table: StackTable::default(),
            fold: None,
            lost: 0,
            user: config.user,
            kernel: config.kernel,
            stack_bytes: match config.stack_mode {
                StackMode::Dwarf { stack_bytes } => Some(stack_bytes),
                StackMode::FramePointer => None,
            },
            addrs: Vec::new(),
            frames: Vec::new(),
            live: true,
        }
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
                self.comms.remove(&tid);
                if pid == tid {
                    self.processes.remove(&pid);
                    self.unwinder.forget(pid);
                }
            }
            Event::Lost { count } => self.lost += count,
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
            UserEnd::NoStack
        };
        if self.frames.is_empty() {
            return;
        }
        let comm = self.comm(sample.pid, sample.tid);
        let process = self.comm(sample.pid, sample.pid);
        self.table.add_named(
            (sample.pid, sample.tid),
            (&comm, &process),
            sample.cpu,
            &self.frames,
            end,
        );
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
        if let Some(fold) = &self.fold {
            fold.fold(std::mem::take(&mut self.table));
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
    fn user_stack(&mut self, sample: &SampleEvent<'_>) -> UserEnd {
        let pid = sample.pid;
        let process = self.processes.entry(pid).or_default();
        if !process.known {
            // A process we have no events for (it raced our start): read its maps once.
            if self.live {
                process.maps = ProcessMaps::from_proc(pid).unwrap_or_default();
            }
            process.known = true;
        }
        let end = match (self.stack_bytes, sample.user_regs) {
            (Some(_), Some(regs)) if sample.user_stack.is_empty() => {
                // Nothing to unwind; the sampled instruction is still known, in the program
                // the thread runs or, inside execve, in the one it is leaving.
                let maps = match &process.before_exec {
                    Some(old) if process.maps.find(regs.ip).is_none() => old,
                    _ => &process.maps,
                };
                let frame = self.table.user_frame(pid, regs.ip, maps.find(regs.ip));
                self.frames.push(frame);
                self.frames.push(RawFrame::Marker(UNREADABLE));
                return UserEnd::Unreadable;
            }
            (Some(_), Some(regs)) => match self.unwinder.unwind(
                pid,
                &process.maps,
                regs,
                sample.user_stack,
                &mut self.addrs,
            ) {
                UnwindEnd::Complete => UserEnd::Complete,
                UnwindEnd::Truncated => UserEnd::Truncated,
                UnwindEnd::Broken { module } => {
                    UserEnd::Broken(module.unwrap_or_else(|| stackscope_profile::UNKNOWN.into()))
                }
            },
            (None, _) if !sample.user_callchain.is_empty() => {
                self.addrs.clear();
                self.addrs.extend(lookup_addresses(sample.user_callchain));
                UserEnd::Unjudged
            }
            // A kernel thread, or a sample without user state.
            _ => return UserEnd::NoStack,
        };
        if self.addrs.is_empty() {
            return UserEnd::NoStack;
        }
        for &addr in &self.addrs {
            let frame = self.table.user_frame(pid, addr, process.maps.find(addr));
            self.frames.push(frame);
        }
        if end == UserEnd::Truncated {
            self.frames.push(RawFrame::Truncated);
        }
        end
    }

    pub(crate) fn finish(
        self,
        mut meta: Metadata,
        config: &SamplerConfig,
        kernel_excluded: bool,
    ) -> Profile {
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
        let stats = &tally.stats;
        let mut hints = Vec::new();
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|p| &**p).take(3).collect();
            hints.push(format!(
                "{} binaries have no unwind info ({}{}): build with debug info or -C force-frame-pointers=yes",
                missing.len(),
                names.join(", "),
                if missing.len() > 3 { ", ..." } else { "" }
            ));
        }
        if let Some(bytes) = self.stack_bytes {
            let share = percent(stats.truncated, stats.user_stacks);
            if share >= 1.0 && !self.live {
                hints.push(format!(
                    "{share:.1}% of stacks were deeper than the {bytes}-byte stack copy: record with a larger perf record --call-graph dwarf,SIZE"
                ));
            } else if share >= 1.0 && bytes < MAX_STACK_COPY {
                hints.push(format!(
                    "{share:.1}% of stacks were deeper than the {bytes}-byte stack copy: raise --stack-size (at most {MAX_STACK_COPY})"
                ));
            } else if share >= 1.0 {
                hints.push(format!(
                    "{share:.1}% of stacks were deeper than the largest stack copy perf_event allows ({MAX_STACK_COPY} bytes): their outermost frames are cut and marked [truncated]"
                ));
            }
        }
        let unreadable = percent(stats.unreadable, stats.user_stacks);
        if unreadable >= 1.0 {
            let rest = if tally.unreadable_in_exec == stats.unreadable {
                ""
            } else {
                "; the others mostly in a page fault on the stack itself"
            };
            hints.push(format!(
                "{unreadable:.1}% of user stacks could not be read when sampled ({} inside execve, where the kernel has already replaced the old program's memory while the thread still holds its registers{rest}): they show only the sampled instruction, above {UNREADABLE}, and are not counted as truncated",
                tally.unreadable_in_exec
            ));
        }
        let broken: u64 = tally.broken_in.values().sum();
        if percent(broken, stats.user_stacks) >= 1.0 {
            let mut worst: Vec<(&Arc<str>, &u64)> = tally.broken_in.iter().collect();
            worst.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            hints.push(format!(
                "{:.1}% of stacks broke off, most in {}: it may lack unwind info, or run JIT code without a /tmp/perf-PID.map",
                percent(broken, stats.user_stacks),
                worst[0].0
            ));
        }
        let short = percent(tally.short_chains, stats.user_stacks);
        if short >= 10.0 {
            hints.push(format!(
                "{short:.1}% of frame-pointer stacks stop short of their entry point: the code was built without frame pointers; use --unwind dwarf (the default)"
            ));
        }
        if self.lost > 0 && !self.live {
            hints.push(format!(
                "{} samples were lost while recording: record with a lower perf record -F or a larger -m",
                self.lost
            ));
        } else if self.lost > 0 {
            hints.push(format!(
                "{} samples were lost because the ring buffer was full: lower -F or --stack-size",
                self.lost
            ));
        }
        if kernel_excluded && config.kernel {
            hints.push(
                "kernel stacks were not sampled: kernel.perf_event_paranoid forbids it for this user; run as root, grant CAP_PERFMON, or set kernel.perf_event_paranoid=1".into(),
            );
        }
        profile.meta.hints = hints;
        profile
    }
}

/// The addresses to symbolize for a callchain, leaf first: the sampled instruction itself, then
/// each return address stepped back into its call instruction (it points after the call, which
/// may already be the next function or the next inlined range).
pub fn lookup_addresses(chain: &[u64]) -> impl Iterator<Item = u64> + '_ {
    chain
        .iter()
        .enumerate()
        .map(|(i, &addr)| if i == 0 { addr } else { addr.saturating_sub(1) })
}

/// Names for a (pid, tid) pair counted without them. Every sample here is counted with its
/// thread's names, so this is never asked; the table wants an answer all the same.
fn thread_names(live: bool) -> impl Fn(u32, u32) -> Thread + Send + 'static {
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

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples at ever new addresses, as a long whole-system recording gives, must not keep
    /// a table entry per address: the table is named and merged by function once full.
    #[test]
    fn a_table_of_ever_new_addresses_is_folded_as_it_fills() {
        let config = SamplerConfig {
            cpu: None,
            frequency: Some(999),
            period: None,
            user: false,
            kernel: true,
            stack_mode: StackMode::FramePointer,
            include_idle: false,
            buffer_pages: 0,
        };
        let mut collector = Collector::new(&config);
        let function = stackscope_testkit::big_kernel_function();
        let samples = 3 * FOLD_AT_NODES as u64;
        let mut largest = 0;
        for i in 0..samples {
            // Two frames in one function, each pair of addresses new: leaf first. A caller's
            // address is looked up one byte back, so it is never the function's first.
            let stack = [function + i % 4096, function + 1 + (i / 4096) % 4095];
            collector.handle(Event::Sample(SampleEvent {
                pid: 1 + (i % 3) as u32,
                tid: 1 + (i % 3) as u32,
                cpu: (i % 2) as u32,
                time: i,
                period: 1_000_000,
                kernel_stack: &stack,
                user_callchain: &[],
                user_regs: None,
                user_stack: &[],
                in_user: false,
            }));
            largest = largest.max(collector.table.nodes());
        }
        assert!(
            largest <= FOLD_AT_NODES,
            "the table grew to {largest} frames (bound {FOLD_AT_NODES})"
        );
        assert!(collector.fold.is_some(), "no table was folded");
        let profile = collector.finish(Metadata::default(), &config, false);
        assert_eq!(profile.total_samples(), samples);
        // Every address lies in one function: one frame, one stack per (thread, cpu).
        assert_eq!(profile.frames.len(), 1, "{:?}", profile.frames);
        assert_eq!(profile.stacks.len(), 1);
        assert_eq!(profile.samples.len(), 3 * 2);
    }
}
