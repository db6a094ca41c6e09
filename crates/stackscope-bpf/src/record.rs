//! One recording with the BPF program: resolve the target (launching a command held until its
//! tables are loaded), load the program, sample until the duration ends, the target exits or
//! the caller asks to stop, follow the processes' execs and library loads meanwhile, then read the
//! counted stacks and symbolize them into a [`Profile`] through the same stack table as the
//! perf_event source.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use libbpf_rs::RingBufferBuilder;
use stackscope_linux::record::lookup_addresses;
use stackscope_linux::sampler::SampleError;
use stackscope_linux::target::{self, HeldChild, Target};
use stackscope_profile::{Metadata, Profile, Thread};
use stackscope_stacks::table::{RawFrame, StackTable, UserEnd};
use stackscope_symbols::Symbolizer;

use crate::error::BpfError;
use crate::layout::{self, CountKey, Event};
use crate::processes::{Processes, SYSTEM_LOADER};
use crate::program::{self, Filter, ProfileSkel, Sampling, Settings};

/// bcc profile's default sampling frequency.
pub const DEFAULT_FREQUENCY: u64 = 49;
/// bcc profile's default stack storage: unique stacks kept (`--stack-storage-size`).
pub const DEFAULT_STACK_STORAGE: u32 = 16384;
/// bcc profile's default count map size: (pid, tid, stacks) keys kept (`--hash-storage-size`).
pub const DEFAULT_HASH_STORAGE: u32 = 40960;

/// What to record, with bcc profile's defaults from [`BpfConfig::new`].
#[derive(Debug, Clone)]
pub struct BpfConfig {
    pub target: Target,
    /// Sample only this CPU (`-C`).
    pub cpu: Option<u32>,
    /// Samples per second per CPU (`-F`); when neither this nor `period` is set, 49 Hz.
    pub frequency: Option<u64>,
    /// Nanoseconds of cpu-clock per sample (`-c`).
    pub period: Option<u64>,
    /// Take user stacks (off with `-K`).
    pub user: bool,
    /// Take kernel stacks (off with `-U`).
    pub kernel: bool,
    /// Keep samples of the idle task (`-I`).
    pub include_idle: bool,
    /// Entries of the kernel and of the user stack maps (`--stack-storage-size`).
    pub stack_storage_size: u32,
    /// Entries of the count map (`--hash-storage-size`).
    pub hash_storage_size: u32,
    /// Stop after this long; `None` runs until the target exits or `stop` is set.
    pub duration: Option<Duration>,
    /// The command line shown in the profile's metadata.
    pub command: Vec<String>,
    /// Have the kernel time the sampling program ([`BpfRecording::sampler_cost`]). While on,
    /// every BPF program on the machine pays for two clock reads per run.
    pub measure_cost: bool,
}

impl BpfConfig {
    pub fn new(target: Target) -> Self {
        BpfConfig {
            target,
            cpu: None,
            frequency: None,
            period: None,
            user: true,
            kernel: true,
            include_idle: false,
            stack_storage_size: DEFAULT_STACK_STORAGE,
            hash_storage_size: DEFAULT_HASH_STORAGE,
            duration: None,
            command: Vec::new(),
            measure_cost: false,
        }
    }
}

/// What a recording produced.
#[derive(Debug)]
pub struct BpfRecording {
    pub profile: Profile,
    /// The launched command's exit status, when it exited during the recording.
    pub exit_status: Option<std::process::ExitStatus>,
    pub child_pid: Option<u32>,
    /// True when the recording ended because `stop` was set.
    pub interrupted: bool,
    /// Count-map keys times sides (user, kernel) whose stack could not be stored, as bcc
    /// counts them for its warning.
    pub missed_stacks: u64,
    /// Some of those failed because the stack storage was full or its hash bucket taken.
    pub stack_collisions: bool,
    /// The count map reached `hash_storage_size` entries.
    pub hash_full: bool,
    /// Samples not counted because the count map was full.
    pub dropped_samples: u64,
    /// Instructions the kernel's verifier walked for each BPF program.
    pub verified_insns: Vec<(String, u32)>,
    /// What the sampling program cost, as the kernel timed it (with `measure_cost`, when the
    /// kernel allows it).
    pub sampler_cost: Option<program::ProgramCost>,
}

/// How often the loop wakes to check the clock, the stop flag and the target.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The caller's pid namespace as the kernel's pid helper wants it, unless it is the initial
/// one (where every pid is already what the caller sees, and no translation is needed).
fn caller_pid_namespace() -> Option<(u64, u64)> {
    /// PROC_PID_INIT_INO: the inode number of the initial pid namespace.
    const INIT_PID_NS: u64 = 0xEFFF_FFFC;
    let meta = std::fs::metadata("/proc/self/ns/pid").ok()?;
    use std::os::unix::fs::MetadataExt;
    if meta.ino() == INIT_PID_NS {
        return None;
    }
    // The kernel compares against its own dev_t encoding: major << 20 | minor.
    let dev = meta.dev();
    let kernel_dev = (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev));
    Some((kernel_dev, meta.ino()))
}

fn check_frequency(hz: u64) -> Result<(), SampleError> {
    let max = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match max {
        Some(max) if hz > max => Err(SampleError::FrequencyTooHigh { requested: hz, max }),
        _ => Ok(()),
    }
}

fn cpus_to_sample(cpu: Option<u32>) -> Result<Vec<u32>, BpfError> {
    let online = target::online_cpus().map_err(|source| BpfError::Io {
        what: "cannot read the online CPUs from /sys/devices/system/cpu/online".into(),
        source,
    })?;
    match cpu {
        None => Ok(online),
        Some(c) if online.contains(&c) => Ok(vec![c]),
        Some(c) => Err(SampleError::InvalidCpu {
            cpu: c,
            online: std::fs::read_to_string("/sys/devices/system/cpu/online")
                .unwrap_or_default()
                .trim()
                .to_string(),
        }
        .into()),
    }
}

/// Records until the duration ends, the target exits, or `stop` is set. `on_start` runs once
/// sampling has begun (for a launched command: just before it is let go into exec, which
/// fails only in rare cases its path lookup did not foresee).
pub fn record(
    config: BpfConfig,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
) -> Result<BpfRecording, BpfError> {
    if config.frequency.is_some() && config.period.is_some() {
        return Err(
            SampleError::InvalidConfig("give a frequency or a period, not both".into()).into(),
        );
    }
    if config.period == Some(0) || config.frequency == Some(0) {
        return Err(
            SampleError::InvalidConfig("the frequency or period must be above 0".into()).into(),
        );
    }
    if config.period.is_none() {
        check_frequency(config.frequency.unwrap_or(DEFAULT_FREQUENCY))?;
    }
    let cpus = cpus_to_sample(config.cpu)?;

    // Check the targets exist before anything is loaded.
    let (filter, filter_ids, followed_procs) = match &config.target {
        Target::Command(_) => (Filter::Pids, Vec::new(), Vec::new()),
        Target::Pids(pids) => {
            for &pid in pids {
                if !target::is_alive(pid) {
                    return Err(SampleError::NoSuchProcess(pid).into());
                }
            }
            (Filter::Pids, pids.clone(), pids.clone())
        }
        Target::Tids(tids) => {
            let mut owners = Vec::new();
            for &tid in tids {
                match target::process_of(tid) {
                    Ok(pid) if target::is_alive(tid) => owners.push(pid),
                    _ => return Err(SampleError::NoSuchThread(tid).into()),
                }
            }
            owners.sort_unstable();
            owners.dedup();
            (Filter::Tids, tids.clone(), owners)
        }
        Target::System => (Filter::None, Vec::new(), Vec::new()),
    };

    // A launched command waits before exec until it is filtered for and traced; spawning it
    // first reports a missing program before anything is loaded.
    let mut child = match &config.target {
        Target::Command(argv) => Some(HeldChild::spawn(argv)?),
        _ => None,
    };
    let settings = Settings {
        filter,
        include_idle: config.include_idle,
        user: config.user,
        kernel: config.kernel,
        pid_ns: caller_pid_namespace(),
        hold_loads: matches!(config.target, Target::Command(_)) && config.user,
        stack_storage_size: config.stack_storage_size,
        hash_storage_size: config.hash_storage_size,
    };
    let mut storage = MaybeUninit::uninit();
    let mut skel = program::load(&mut storage, &settings)?;
    let verified_insns = program::verified_insns(&skel);
    program::attach_tracepoints(&mut skel)?;
    for &id in &filter_ids {
        program::add_filter_id(&skel, id)?;
    }
    for &pid in &followed_procs {
        program::add_followed_process(&skel, pid)?;
    }

    let mut processes = Processes::new(&skel);
    if config.user {
        for &pid in &followed_procs {
            processes.load(&skel, pid);
        }
        if config.target == Target::System {
            processes.watch_loader(&skel, std::path::Path::new(SYSTEM_LOADER));
        }
    }

    if let Some(child) = &child {
        program::add_filter_id(&skel, child.pid)?;
        program::add_followed_process(&skel, child.pid)?;
    }

    let events: RefCell<Vec<Event>> = RefCell::new(Vec::new());
    let mut ring = RingBufferBuilder::new();
    ring.add(&skel.maps.events, |data: &[u8]| {
        if let Some(ev) = Event::from_bytes(data) {
            events.borrow_mut().push(ev);
        }
        0
    })
    .map_err(|e| BpfError::bpf("read the BPF event ring buffer", e))?;
    let ring = ring
        .build()
        .map_err(|e| BpfError::bpf("read the BPF event ring buffer", e))?;

    // Timing starts before the first sample and is read after the last.
    let timing = config.measure_cost.then(program::time_programs).flatten();
    let mut sampling = Sampling::start(&skel, &cpus, config.frequency, config.period)?;
    // Announced before a launched command runs, so its output comes after the banner.
    on_start();
    if let Some(child) = child.as_mut() {
        if let Err(e) = start_command(child, &skel, &mut processes, config.user) {
            sampling.stop();
            return Err(e);
        }
    }
    let started = Instant::now();
    let mut interrupted = false;
    loop {
        // An error here is EINTR from a signal (Ctrl-C): the stop flag below tells.
        let _ = ring.poll(POLL_INTERVAL);
        handle_events(&mut events.borrow_mut(), &skel, &mut processes, config.user);
        if stop.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        if config.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if target_finished(&config.target, child.as_mut()) {
            break;
        }
    }
    sampling.stop();
    let elapsed = started.elapsed();
    let sampler_cost = timing.and_then(|_timing| program::sampler_cost(&skel));
    let _ = ring.consume();
    handle_events(&mut events.borrow_mut(), &skel, &mut processes, config.user);
    processes.release_all();
    if let Some(child) = child.as_mut() {
        if !child.wait(false) {
            end_child(child, interrupted);
        }
    }

    let meta = Metadata {
        source: "ebpf".into(),
        event: "cpu-clock".into(),
        frequency_hz: if config.period.is_some() {
            None
        } else {
            Some(config.frequency.unwrap_or(DEFAULT_FREQUENCY))
        },
        period: config.period,
        duration_secs: elapsed.as_secs_f64(),
        command: config.command.clone(),
        ..Metadata::default()
    };
    let mut result = collect(&skel, &config, &mut processes, meta);
    result.exit_status = child
        .as_ref()
        .and_then(|c| c.status)
        .map(std::process::ExitStatus::from_raw);
    result.child_pid = child.as_ref().map(|c| c.pid);
    result.interrupted = interrupted;
    result.verified_insns = verified_insns;
    result.sampler_cost = sampler_cost;
    Ok(result)
}

/// Lets a held command exec, stops it right after exec (ptrace) to load the tables of the
/// program and its dynamic loader, then lets it run. Libraries the loader maps later stop it
/// again at the loader's debugger hook (a uprobe), until their tables are in too.
fn start_command(
    child: &mut HeldChild,
    skel: &ProfileSkel<'_>,
    processes: &mut Processes,
    user: bool,
) -> Result<(), BpfError> {
    let pid = child.pid as i32;
    // SAFETY: plain ptrace on our own child, which is blocked on a pipe read before exec.
    let seized = user
        && unsafe {
            libc::ptrace(
                libc::PTRACE_SEIZE,
                pid,
                0,
                (libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_EXITKILL) as libc::c_ulong,
            )
        } == 0;
    child.release()?;
    if !seized {
        return Ok(());
    }
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child's ptrace stop.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r == pid {
            break;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return Ok(());
        }
    }
    if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        child.status = Some(status);
        return Ok(());
    }
    processes.load(skel, child.pid);
    // SAFETY: detaching our own stopped tracee; it resumes where it stopped.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
    Ok(())
}

fn handle_events(
    events: &mut Vec<Event>,
    skel: &ProfileSkel<'_>,
    processes: &mut Processes,
    user: bool,
) {
    for event in events.drain(..) {
        match event {
            Event::Loaded { pid, held: true } => {
                processes.note_held(pid);
                processes.release_held(skel, pid);
            }
            // A sample taken as a process exits finds its tables gone: it needs none.
            Event::NoTables { pid } | Event::Loaded { pid, .. } if processes.has_exited(pid) => {}
            Event::Fork { pid, .. } => {
                processes.note_started(pid);
                if user {
                    processes.load(skel, pid);
                }
            }
            Event::NoTables { pid } | Event::Exec { pid } | Event::Loaded { pid, .. } => {
                if user {
                    processes.load(skel, pid);
                }
            }
            Event::Exit { pid } => processes.forget(skel, pid),
        }
    }
}

fn target_finished(target: &Target, child: Option<&mut HeldChild>) -> bool {
    match (target, child) {
        (Target::Command(_), Some(child)) => child.wait(false),
        (Target::Pids(ids), _) | (Target::Tids(ids), _) => {
            !ids.iter().any(|&id| target::is_alive(id))
        }
        _ => false,
    }
}

/// Ends a launched command still running when recording stops: SIGINT after Ctrl-C (when the
/// terminal did not already deliver it), SIGTERM after the duration, SIGKILL if it has not
/// gone two seconds later.
fn end_child(child: &mut HeldChild, interrupted: bool) {
    let first = if interrupted {
        libc::SIGINT
    } else {
        libc::SIGTERM
    };
    for (signal, grace) in [(first, 2000), (libc::SIGKILL, 1000)] {
        child.kill(signal);
        let until = Instant::now() + Duration::from_millis(grace);
        while Instant::now() < until {
            if child.wait(false) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Reads the counted stacks and symbolizes them.
fn collect(
    skel: &ProfileSkel<'_>,
    config: &BpfConfig,
    processes: &mut Processes,
    mut meta: Metadata,
) -> BpfRecording {
    let counts = program::counts(skel);
    let (dropped, user_full) = program::drops(skel);
    let mut table = StackTable::default();
    let mut comms: HashMap<(u32, u32), String> = HashMap::new();
    let mut kernel_stacks: HashMap<i32, Option<Vec<u64>>> = HashMap::new();
    let mut user_stacks: HashMap<i64, Option<layout::UserStack>> = HashMap::new();
    let mut missed = 0;
    let mut collisions = false;
    let mut frames = Vec::new();
    for (key, count) in &counts {
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
                    missed += 1;
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
                    missed += 1;
                    collisions |= id == layout::STACK_COLLISION || id == layout::STACK_STORAGE_FULL;
                    frames.push(RawFrame::Marker(MISSED_USER));
                }
            }
        }
        table.add_count(key.pid, key.tid, 0, &frames, end, *count);
    }

    meta.lost_samples = dropped;
    let thread = |pid: u32, tid: u32| {
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
    };
    let mut symbolizer = Symbolizer::new();
    let (mut profile, tally) = table.into_profile(&mut symbolizer, meta, &thread);
    // Counts in the kernel carry no CPU.
    for sample in &mut profile.samples {
        sample.cpu = None;
    }
    let mut hints = Vec::new();
    if dropped > 0 {
        hints.push(format!(
            "{dropped} samples were not counted because the count map was full: raise --hash-storage-size (it is {})",
            config.hash_storage_size
        ));
    }
    if missed > 0 || user_full > 0 {
        hints.push(format!(
            "{missed} stack traces could not be stored: raise --stack-storage-size (it is {})",
            config.stack_storage_size
        ));
    }
    let broken: u64 = tally.broken_in.values().sum();
    let stats = &tally.stats;
    if stats.user_stacks > 0 && broken * 100 >= stats.user_stacks {
        let mut worst: Vec<_> = tally.broken_in.iter().collect();
        worst.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        hints.push(format!(
            "{:.1}% of user stacks broke off, most in {}: it may lack unwind info (.eh_frame), or run JIT code",
            broken as f64 * 100.0 / stats.user_stacks as f64,
            worst[0].0
        ));
    }
    if let Some(e) = &processes.load_error {
        hints.push(format!("some unwind tables could not be loaded ({e}): those stacks were walked by frame pointers"));
    }
    if let Some(e) = &processes.loader_error {
        hints.push(format!("library loads could not be watched ({e}): libraries opened during the run were walked by frame pointers until their first samples"));
    }
    profile.meta.hints = hints;
    BpfRecording {
        profile,
        exit_status: None,
        child_pid: None,
        interrupted: false,
        missed_stacks: missed,
        stack_collisions: collisions,
        hash_full: dropped > 0 || counts.len() as u64 >= u64::from(config.hash_storage_size),
        dropped_samples: dropped,
        verified_insns: Vec::new(),
        sampler_cost: None,
    }
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
        layout::UserEnd::Complete => UserEnd::Complete,
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
