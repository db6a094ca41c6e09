//! One recording with the BPF program: resolve the target (launching a command held until its
//! tables are loaded), load the program, sample until the duration ends, the target exits or
//! the caller asks to stop, follow the processes' execs and library loads meanwhile, then read the
//! counted stacks and symbolize them into a profile through the same stack table as the
//! perf_event source (a live view's counts are drained every refresh: `live`).

mod collect;
mod command;
mod counter;
mod follow;
mod lead_in;
mod live;
mod memory;
pub(crate) mod sampled;

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use libbpf_rs::{RingBuffer, RingBufferBuilder};
use stackscope_process::cpu_clock::monotonic_ns;
use stackscope_process::kernel;
use stackscope_process::target::{HeldChild, Target};
use stackscope_profile::{CountUnit, Metadata};
use stackscope_stacks::table::Live;
use stackscope_stacks::{ProgramCost, Recording};

use crate::error::BpfError;
use crate::layout::Event;
use crate::probe::{AllocFn, EventSpec, Plan, Probes};
use crate::processes::{Processes, SYSTEM_LOADER};
use crate::program::{self, AllocHook, OffCpuHook, ProfileSkel, Sampling, Settings};
use follow::{handle_events, sample_until_end, Counting};
pub use lead_in::LeadIn;
use live::LiveDrain;
pub use memory::{default_max_live, MemoryProfile};
use sampled::Targets;

/// bcc profile's default stack storage: unique stacks kept.
pub const DEFAULT_STACK_STORAGE: u32 = 16384;
/// bcc profile's default count map size: (pid, tid, stacks) keys kept.
pub const DEFAULT_HASH_STORAGE: u32 = 40960;
/// Frames kept per user stack unless told otherwise: a compiler's query stacks run to a few
/// hundred.
pub const DEFAULT_MAX_FRAMES: u32 = 512;
/// Files whose unwind tables the kernel holds at once: more than a busy machine maps.
pub const DEFAULT_TABLE_FILES: u32 = 16384;

/// How often each CPU is sampled: the cpu-clock event's rate, as the perf_event source's.
pub use stackscope_process::cpu_clock::Rate;

/// Time rather than samples or hits: what `record --off-cpu` and `--wall` count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeProfile {
    /// The time threads spend off the CPU, at the stack where they left it; blocks shorter
    /// than `min_block_ns` are not counted.
    OffCpu { min_block_ns: u64 },
    /// On-CPU time (each timer sample weighs its period) and off-CPU time, every stack rooted
    /// in `on-cpu` or `off-cpu`.
    Wall,
}

impl std::fmt::Display for TimeProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimeProfile::OffCpu { .. } => "off-CPU time",
            TimeProfile::Wall => "wall-clock time",
        })
    }
}

/// What to record, with bcc profile's storage sizes from [`BpfConfig::new`].
#[derive(Debug, Clone)]
pub struct BpfConfig {
    pub target: Target,
    /// Sample only this CPU.
    pub cpu: Option<u32>,
    pub rate: Rate,
    /// Take user stacks.
    pub user: bool,
    /// Take kernel stacks.
    pub kernel: bool,
    /// Keep samples of the idle task.
    pub include_idle: bool,
    /// Entries of the kernel and of the user stack maps.
    pub stack_storage_size: u32,
    /// Entries of the count map.
    pub hash_storage_size: u32,
    /// Files whose unwind tables the kernel holds at once (each file's table is sized to it).
    pub table_files: u32,
    /// Frames kept per user stack (1 to [`stackscope_stacks::walk::MAX_FRAMES`]); a deeper stack ends in
    /// `[truncated]`.
    pub max_frames: u32,
    /// Stop after this long; `None` runs until the target exits or `stop` is set.
    pub duration: Option<Duration>,
    /// The command line shown in the profile's metadata.
    pub command: Vec<String>,
    /// Have the kernel time the sampling program ([`stackscope_stacks::BpfFigures::cost`]).
    /// While on, every BPF program on the machine pays for two clock reads per run.
    pub measure_cost: bool,
    /// What to count stacks at; none: the cpu-clock timer at `rate`. A timer event
    /// (`profile:hz:N`) runs at `rate` too: the caller sets `rate` from it.
    pub events: Vec<EventSpec>,
    /// Count time instead: off-CPU, or on- and off-CPU (the timer then runs at `rate`). Counts
    /// are then microseconds.
    pub time: Option<TimeProfile>,
    /// Count memory instead, at the allocator's entry points: counts are then bytes, user
    /// stacks only.
    pub memory: Option<MemoryProfile>,
    /// The program's own allocators to count memory at too (`--alloc-fn`).
    pub alloc_fns: Vec<AllocFn>,
    /// Sample one allocation per this many bytes on average, weighed as the bytes it stands
    /// for (`--sample-bytes`); `None`: every call counted.
    pub sample_bytes: Option<u64>,
}

impl BpfConfig {
    pub fn new(target: Target, rate: Rate) -> Self {
        BpfConfig {
            target,
            cpu: None,
            rate,
            user: true,
            kernel: true,
            include_idle: false,
            stack_storage_size: DEFAULT_STACK_STORAGE,
            hash_storage_size: DEFAULT_HASH_STORAGE,
            table_files: DEFAULT_TABLE_FILES,
            max_frames: DEFAULT_MAX_FRAMES,
            duration: None,
            command: Vec::new(),
            measure_cost: false,
            events: Vec::new(),
            time: None,
            memory: None,
            alloc_fns: Vec::new(),
            sample_bytes: None,
        }
    }
}

/// How often the loop wakes to check the clock, the stop flag and the target.
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How often the followed processes' maps are read again for code mapped without an event.
pub(super) const MAPS_INTERVAL: Duration = Duration::from_millis(250);

/// Records until the duration ends, the target exits, or `stop` is set. `on_start` runs once
/// sampling has begun (for a launched command: just before it is let go into exec, which
/// fails only in rare cases its path lookup did not foresee).
pub fn record(
    config: BpfConfig,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
) -> Result<Recording, BpfError> {
    record_led_in(config, stop, on_start, None)
}

/// [`record`]; a launched command whose timer samples alone are counted is sampled by
/// `lead_in`, when given, from its exec until the program takes over, rather than held.
pub fn record_led_in(
    config: BpfConfig,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
    lead_in: Option<&mut dyn LeadIn>,
) -> Result<Recording, BpfError> {
    record_with(config, stop, on_start, lead_in, None)
}

/// [`record`], with a live view fed every `live.every` with what was counted since. Only the
/// timer's samples are shown live: time and memory are counted up to the end.
pub fn record_live(
    config: BpfConfig,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
    live: Live,
) -> Result<Recording, BpfError> {
    let probes = config.events.iter().any(|e| !e.is_timer());
    if config.time.is_some() || config.memory.is_some() || probes {
        return Err(BpfError::bpf(
            "show the counts live",
            "only the timer's samples are drained live so far (not --event, --off-cpu, --wall, --alloc or --in-use)",
        ));
    }
    record_with(config, stop, on_start, None, Some(live))
}

fn record_with(
    config: BpfConfig,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
    lead_in: Option<&mut dyn LeadIn>,
    live: Option<Live>,
) -> Result<Recording, BpfError> {
    let (config, cpus, targets, plan) = check(config)?;
    let mut live = live.map(|live| LiveDrain::start(live, &plan)).transpose()?;

    // A launched command waits before exec until it is filtered for and traced, or sampled by
    // the lead-in; spawning it first reports a missing program before anything is loaded.
    let mut on_start = Some(on_start);
    let (mut child, mut lead_in) = command::launch(&config, &plan, lead_in, &mut on_start)?;
    let mut storage = MaybeUninit::uninit();
    let mut skel = program::load(&mut storage, &settings(&config, &targets, &plan))?;
    let verified_insns = program::verified_insns(&skel);
    if lead_in.is_some() {
        lead_in::hold_counting(&mut skel)?;
    }
    program::attach_tracepoints(&mut skel)?;
    let mut processes = follow(&skel, &config, &targets, child.as_ref())?;
    let events: RefCell<Vec<Event>> = RefCell::new(Vec::new());
    let ring = event_ring(&skel, &events)?;

    // Timing starts before the first sample and is read after the last.
    let timing = config.measure_cost.then(program::time_programs).flatten();
    let (mut sampling, mut probes) = start_counting(&skel, &config, &plan, &cpus, child.as_ref())?;
    // Announced before a launched command runs, so its output comes after the banner.
    if let Some(announce) = on_start.take() {
        announce();
    }
    if let Some(held) = child.as_mut() {
        let lead = lead_in.as_deref_mut();
        if let Err(e) = command::start(held, lead, &mut skel, &mut processes, config.user) {
            sampling.stop();
            probes.stop();
            return Err(e);
        }
    }
    let started = Instant::now();
    let mut counting = Counting {
        skel: &skel,
        plan: &plan,
        processes: &mut processes,
        probes: &mut probes,
    };
    let interrupted = sample_until_end(
        (&config, stop),
        (&ring, &events),
        &mut counting,
        child.as_mut(),
        live.as_mut(),
    );
    // The end, before detaching: detaching uprobes waits for the kernel (tens of ms each), and
    // a live block's age or a block's time off the CPU runs to when recording stopped.
    let ended = monotonic_ns();
    let elapsed = started.elapsed();
    sampling.stop();
    counting.probes.stop();
    let cost = program_cost(&skel, timing, verified_insns);
    let _ = ring.consume();
    handle_events(&mut events.borrow_mut(), &mut counting, config.user);
    let follow_hint = counting.probes.follow_hint();
    processes.release_all();
    let exit_status = child
        .as_mut()
        .and_then(|child| command::reap(child, interrupted));

    let end = (metadata(&config, &plan, elapsed), ended, cost);
    let lead = lead_in.and_then(|lead| lead.counted());
    let mut counted = collect::collect(&skel, &config, &mut processes, &plan, end, live, lead);
    counted.hints.extend(follow_hint);
    Ok(Recording {
        exit_status,
        interrupted,
        ..counted
    })
}

/// What the program cost: the instructions the verifier checked, and its runs' time when
/// `timing` (the kernel's statistics, on while it counted) was had.
fn program_cost(
    skel: &ProfileSkel<'_>,
    timing: Option<OwnedFd>,
    verified_insns: Vec<(String, u32)>,
) -> ProgramCost {
    let sampler_cost = timing.and_then(|_timing| program::sampler_cost(skel));
    ProgramCost {
        verified_insns,
        ..sampler_cost.unwrap_or_default()
    }
}

/// Checks what `config` asks before anything starts: the CPUs to sample, the targets, and the
/// plan of what is counted; the config as it is recorded.
fn check(config: BpfConfig) -> Result<(BpfConfig, Vec<u32>, Targets, Plan), BpfError> {
    config.rate.check()?;
    sampled::check_max_frames(config.max_frames)?;
    let cpus = kernel::choose_cpus(config.cpu)?;
    let targets = sampled::resolve(&config.target)?;
    let plan = Plan::new(&config.events, &config.target, &timer_name(config.rate))?
        .with_time(config.time.as_ref(), config.rate)?
        .with_memory(config.memory.as_ref(), &config.target, &config.alloc_fns)?;
    // An allocation's kernel stack is the uprobe's own handling.
    let config = BpfConfig {
        kernel: config.kernel && config.memory.is_none(),
        ..config
    };
    Ok((config, cpus, targets, plan))
}

/// Starts what counts stacks: the cpu-clock timer on each of `cpus` when the plan has one,
/// the off-CPU switch hooks, and the probes.
fn start_counting(
    skel: &ProfileSkel<'_>,
    config: &BpfConfig,
    plan: &Plan,
    cpus: &[u32],
    child: Option<&HeldChild>,
) -> Result<(Sampling, Probes), BpfError> {
    let mut sampling = match plan.timer {
        true => Sampling::start(skel, cpus, config.rate)?,
        false => Sampling::none(),
    };
    sampling.switches(skel)?;
    let probes = Probes::attach(skel, plan, &probed_pids(&config.target, child))?;
    Ok((sampling, probes))
}

/// What the program is loaded with.
fn settings(config: &BpfConfig, targets: &Targets, plan: &Plan) -> Settings {
    Settings {
        filter: targets.filter,
        include_idle: config.include_idle,
        user: config.user,
        kernel: config.kernel,
        pid_ns: sampled::caller_pid_namespace(),
        hold_loads: matches!(config.target, Target::Command(_)) && config.user,
        stack_storage_size: config.stack_storage_size,
        hash_storage_size: config.hash_storage_size,
        table_files: config.table_files,
        max_frames: config.max_frames,
        probes: plan.has_probes(),
        tracepoints: plan.has_tracepoints(),
        off_cpu: plan.off_cpu.map(|event| OffCpuHook {
            event,
            min_block_ns: match config.time {
                Some(TimeProfile::OffCpu { min_block_ns }) => min_block_ns,
                _ => 0,
            },
            btf: OffCpuHook::kernel_has_btf_switch(),
        }),
        alloc: plan.alloc.as_ref().map(|alloc| AllocHook {
            event: alloc.event,
            max_live: alloc.max_live,
            sample_bytes: config.sample_bytes.unwrap_or(0),
        }),
    }
}

/// The processes uprobes go into: the launched command, the processes or threads asked for,
/// or every process (-1).
fn probed_pids(target: &Target, child: Option<&HeldChild>) -> Vec<i32> {
    match (target, child) {
        (_, Some(child)) => vec![child.pid as i32],
        (Target::Pids(ids) | Target::Tids(ids), _) => ids.iter().map(|&id| id as i32).collect(),
        _ => vec![-1],
    }
}

/// The timer's name when no `profile:hz:N` names it.
fn timer_name(rate: Rate) -> String {
    match rate {
        Rate::Frequency(hz) => format!("profile:hz:{hz}"),
        Rate::Period(ns) => format!("cpu-clock every {ns} ns"),
    }
}

/// Puts the ids to sample into the program's filter and loads the tables of the processes
/// followed from the start (or, for the whole system, watches its dynamic loader).
fn follow(
    skel: &ProfileSkel<'_>,
    config: &BpfConfig,
    targets: &Targets,
    child: Option<&HeldChild>,
) -> Result<Processes, BpfError> {
    for &id in &targets.filter_ids {
        program::add_filter_id(skel, id)?;
    }
    for &pid in &targets.followed_procs {
        program::add_followed_process(skel, pid)?;
    }

    let mut processes = Processes::new(skel);
    if config.user {
        for &pid in &targets.followed_procs {
            processes.load(skel, pid);
        }
        if config.target == Target::System {
            processes.watch_loader(skel, std::path::Path::new(SYSTEM_LOADER));
        }
    }

    if let Some(child) = child {
        program::add_filter_id(skel, child.pid)?;
        program::add_followed_process(skel, child.pid)?;
    }
    Ok(processes)
}

/// The ring the program reports forks, execs, exits and library loads on, gathered into
/// `events` as it is polled.
fn event_ring<'a>(
    skel: &ProfileSkel<'_>,
    events: &'a RefCell<Vec<Event>>,
) -> Result<RingBuffer<'a>, BpfError> {
    let mut ring = RingBufferBuilder::new();
    ring.add(&skel.maps.events, |data: &[u8]| {
        if let Some(ev) = Event::from_bytes(data) {
            events.borrow_mut().push(ev);
        }
        0
    })
    .map_err(|e| BpfError::bpf("read the BPF event ring buffer", e))?;
    ring.build()
        .map_err(|e| BpfError::bpf("read the BPF event ring buffer", e))
}

/// The profile's metadata: what was sampled, how often, for how long. The timer alone is the
/// cpu-clock event, as the perf_event source names it; probes are named as written.
fn metadata(config: &BpfConfig, plan: &Plan, elapsed: Duration) -> Metadata {
    let only_timer = plan.probes.is_empty() && plan.off_cpu.is_none() && plan.alloc.is_none();
    let event = match only_timer {
        true => "cpu-clock".to_string(),
        false => plan.counted().collect::<Vec<_>>().join(", "),
    };
    // A rate says what one count stands for: only when every count is a timer sample (pprof
    // turns counts into time by it).
    let timer = |rate| (plan.timer && only_timer).then_some(rate).flatten();
    Metadata {
        source: "ebpf".into(),
        event,
        frequency_hz: timer(match config.rate {
            Rate::Frequency(hz) => Some(hz),
            Rate::Period(_) => None,
        }),
        period: timer(match config.rate {
            Rate::Period(ns) => Some(ns),
            Rate::Frequency(_) => None,
        }),
        duration_secs: elapsed.as_secs_f64(),
        command: config.command.clone(),
        count_unit: match (plan.off_cpu, &plan.alloc) {
            (Some(_), _) => CountUnit::Microseconds,
            (None, Some(_)) => CountUnit::Bytes,
            (None, None) => CountUnit::Samples,
        },
        ..Metadata::default()
    }
}
