//! The BPF program as user space handles it: settings written into its read-only data and map
//! sizes before loading, the verifier's verdict, the cpu-clock events it runs on, the filter
//! maps, and reading the counted stacks back.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Mutex;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, PrintLevel};
use stackscope_process::cpu_clock;
use stackscope_process::SampleError;
use stackscope_stacks::ProgramCost;

use crate::error::BpfError;
use crate::layout::{self, CountKey, UserStack};
use crate::Rate;

#[allow(
    clippy::all,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    unused_imports
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/profile.skel.rs"));
}
pub(crate) use skel::ProfileSkel;
use skel::{OpenProfileSkel, ProfileSkelBuilder};

/// Which samples the program keeps (profile.h's `enum filter_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filter {
    None = 0,
    Pids = 1,
    Tids = 2,
}

/// Everything fixed before the program is loaded.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub filter: Filter,
    pub include_idle: bool,
    pub user: bool,
    pub kernel: bool,
    /// Device and inode of the caller's pid namespace.
    pub pid_ns: Option<(u64, u64)>,
    pub hold_loads: bool,
    pub stack_storage_size: u32,
    pub hash_storage_size: u32,
    pub table_files: u32,
    /// Frames kept per user stack, at most [`MAX_USER_FRAMES`].
    pub max_frames: u32,
    /// Load the program probes attach to (uprobes, kprobes, USDT).
    pub probes: bool,
    /// Load the program tracepoints attach to.
    pub tracepoints: bool,
    /// Count off-CPU time: at the scheduler's switch, under this event index, blocks of at
    /// least `min_block_ns`.
    pub off_cpu: Option<OffCpuHook>,
    /// Count memory at the allocator's entry points (`record --alloc`, `--in-use`).
    pub alloc: Option<AllocHook>,
}

/// How memory is counted (see [`Settings::alloc`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllocHook {
    /// The count key's event of allocations.
    pub event: u32,
    /// Keep each live block, up to this many at once (`--in-use`); `None`: totals by stack.
    pub max_live: Option<u32>,
    /// One allocation per this many bytes on average is counted (`--sample-bytes`); 0: all.
    pub sample_bytes: u64,
}

/// How off-CPU time is counted (see [`Settings::off_cpu`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OffCpuHook {
    pub event: u32,
    pub min_block_ns: u64,
    /// The BTF tracepoint (typed arguments) when the kernel's BTF has its type, else the raw
    /// tracepoint.
    pub btf: bool,
}

impl OffCpuHook {
    /// Whether the kernel's BTF describes the sched_switch tracepoint, as a BTF tracepoint
    /// program needs.
    pub fn kernel_has_btf_switch() -> bool {
        libbpf_rs::btf::Btf::from_vmlinux().is_ok_and(|btf| {
            btf.type_by_name::<libbpf_rs::btf::BtfType<'_>>("btf_trace_sched_switch")
                .is_some()
        })
    }
}

/// `MAX_USER_FRAMES`: the middle's limit.
pub(crate) const MAX_USER_FRAMES: u32 = stackscope_stacks::walk::MAX_FRAMES as u32;

/// What libbpf said while loading, kept for the error message when the verifier says no.
static LIBBPF_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn keep_libbpf_message(_level: PrintLevel, msg: String) {
    if let Ok(mut log) = LIBBPF_LOG.lock() {
        log.extend(msg.lines().map(str::to_string));
    }
}

/// Opens and loads the program. `storage` holds the object for as long as the program lives.
pub(crate) fn load<'a>(
    storage: &'a mut MaybeUninit<OpenObject>,
    settings: &Settings,
) -> Result<ProfileSkel<'a>, BpfError> {
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(BpfError::NoBtf);
    }
    LIBBPF_LOG.lock().map(|mut l| l.clear()).ok();
    libbpf_rs::set_print(Some((PrintLevel::Info, keep_libbpf_message)));
    let mut open = ProfileSkelBuilder::default()
        .open(storage)
        .map_err(|e| BpfError::bpf("open the BPF program", e))?;
    set_read_only_data(&mut open, settings)?;
    choose_programs(&mut open, settings);
    size_maps(&mut open, settings)?;
    let loaded = open.load();
    libbpf_rs::set_print(None);
    loaded.map_err(load_error)
}

/// The program's settings, in its read-only data: fixed before the verifier sees them.
fn set_read_only_data(open: &mut OpenProfileSkel<'_>, settings: &Settings) -> Result<(), BpfError> {
    let data = open
        .maps
        .rodata_data
        .as_deref_mut()
        .ok_or_else(|| BpfError::bpf("set up the BPF program", "no read-only data section"))?;
    data.filter = settings.filter as u32;
    data.include_idle = settings.include_idle;
    data.want_user = settings.user;
    data.want_kernel = settings.kernel;
    if let Some((dev, ino)) = settings.pid_ns {
        data.ns_dev = dev;
        data.ns_ino = ino;
    }
    data.hold_loads = settings.hold_loads;
    data.max_frames = settings.max_frames.clamp(1, MAX_USER_FRAMES);
    if crate::unwind_table::WALKER_ARCH == Some(stackscope_stacks::arch::Arch::Aarch64) {
        data.unwind_code_mask = stackscope_stacks::walk::AARCH64_USER_CODE_MASK;
    }
    if let Some(hook) = settings.off_cpu {
        data.off_cpu_event = hook.event;
        data.min_block_ns = hook.min_block_ns;
    }
    if let Some(hook) = settings.alloc {
        data.alloc_event = hook.event;
        data.count_live = hook.max_live.is_some();
        data.sample_bytes = hook.sample_bytes;
    }
    Ok(())
}

/// Which programs load and which attach with the others.
fn choose_programs(open: &mut OpenProfileSkel<'_>, settings: &Settings) {
    // Programs no event uses are not loaded: the verifier's time is not spent on them.
    open.progs.on_probe.set_autoload(settings.probes);
    open.progs.on_tracepoint.set_autoload(settings.tracepoints);
    let hook = settings.off_cpu;
    open.progs
        .on_switch
        .set_autoload(hook.is_some_and(|h| h.btf));
    open.progs
        .on_switch_raw
        .set_autoload(hook.is_some_and(|h| !h.btf));
    let alloc = settings.alloc;
    open.progs.on_alloc.set_autoload(alloc.is_some());
    open.progs.on_alloc_return.set_autoload(alloc.is_some());
    // Attached with the timer, not with the process-tracking tracepoints.
    open.progs.on_switch.set_autoattach(false);
    open.progs.on_switch_raw.set_autoattach(false);
    open.progs.on_alloc.set_autoattach(false);
    open.progs.on_alloc_return.set_autoattach(false);
}

/// Each map sized for what this recording counts.
fn size_maps(open: &mut OpenProfileSkel<'_>, settings: &Settings) -> Result<(), BpfError> {
    let alloc = settings.alloc;
    // Deep stacks take values of max_frames frames; with fewer frames the map stays unused.
    let deep_frames = (settings.max_frames as usize)
        .clamp(layout::MAX_STACK_FRAMES + 1, MAX_USER_FRAMES as usize);
    open.maps
        .deep_stacks
        .set_value_size(layout::user_stack_size(deep_frames) as u32)
        .map_err(|e| BpfError::bpf("size the BPF maps", e))?;
    let sizes = [
        (&mut open.maps.stack_traces, settings.stack_storage_size),
        (&mut open.maps.user_stacks, settings.stack_storage_size),
        (&mut open.maps.deep_stacks, settings.stack_storage_size),
        (&mut open.maps.counts, settings.hash_storage_size),
        // Preallocated: room only when off-CPU time is counted.
        (
            &mut open.maps.blocked,
            match settings.off_cpu {
                Some(_) => settings.hash_storage_size,
                None => 1,
            },
        ),
        (&mut open.maps.unwind_tables, settings.table_files),
        (
            &mut open.maps.alloc_totals,
            match alloc {
                Some(AllocHook { max_live: None, .. }) => settings.hash_storage_size,
                _ => 1,
            },
        ),
        (
            &mut open.maps.live_allocs,
            alloc.and_then(|a| a.max_live).unwrap_or(1),
        ),
    ];
    for (map, size) in sizes {
        map.set_max_entries(size.max(1))
            .map_err(|e| BpfError::bpf("size the BPF maps", e))?;
    }
    Ok(())
}

/// Turns a failed load into the error that says why.
fn load_error(err: libbpf_rs::Error) -> BpfError {
    let log = LIBBPF_LOG.lock().map(|l| l.clone()).unwrap_or_default();
    let euid = unsafe { libc::geteuid() };
    if euid != 0
        && err.kind() == libbpf_rs::ErrorKind::PermissionDenied
        && !log.iter().any(|l| l.contains("BEGIN PROG LOAD LOG"))
    {
        return BpfError::NotPermitted { euid };
    }
    // libbpf prints the verifier's log between these marks, with the program's name before.
    if let Some(begin) = log.iter().position(|l| l.contains("BEGIN PROG LOAD LOG")) {
        let end = log[begin..]
            .iter()
            .position(|l| l.contains("END PROG LOAD LOG"))
            .map_or(log.len(), |i| begin + i);
        let program = log[..begin]
            .iter()
            .rev()
            .find_map(|l| l.split("prog '").nth(1)?.split('\'').next())
            .unwrap_or("on_sample")
            .to_string();
        let body: Vec<&str> = log[begin + 1..end]
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .collect();
        let tail = body[body.len().saturating_sub(3)..].join(" | ");
        return BpfError::Verifier { program, log: tail };
    }
    let last = log.iter().rev().find(|l| !l.trim().is_empty());
    BpfError::bpf(
        "load the BPF program",
        match last {
            Some(line) => format!("{err} ({})", line.trim()),
            None => err.to_string(),
        },
    )
}

/// Counts only timer samples taken at or after `at_ns` (CLOCK_MONOTONIC, the program's
/// clock); 0 counts them all. The program reads it at every sample, so it takes effect at once.
pub(crate) fn count_timer_from(skel: &mut ProfileSkel<'_>, at_ns: u64) -> Result<(), BpfError> {
    let bss = skel
        .maps
        .bss_data
        .as_deref_mut()
        .ok_or_else(|| BpfError::bpf("set up the BPF program", "no writable data section"))?;
    // SAFETY: the section is mapped shared with the kernel; a volatile write of an aligned u64
    // is what the program's volatile read sees whole.
    unsafe { std::ptr::write_volatile(&mut bss.timer_from_ns, at_ns) };
    Ok(())
}

/// How many instructions the verifier walked for each program (kernel 5.16+), for reports.
pub(crate) fn verified_insns(skel: &ProfileSkel<'_>) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for prog in skel.object().progs().filter(|p| p.autoload()) {
        if let Some(info) = prog_info(&prog) {
            out.push((
                prog.name().to_string_lossy().into_owned(),
                info.verified_insns,
            ));
        }
    }
    out
}

/// Has the kernel time every BPF program's runs until the returned descriptor is closed
/// (`BPF_ENABLE_STATS`, kernel 5.8+); `None` when the kernel refuses.
pub(crate) fn time_programs() -> Option<OwnedFd> {
    // SAFETY: a plain bpf(2) command; on success it returns a new descriptor we then own.
    let fd = unsafe { libbpf_sys::bpf_enable_stats(libbpf_sys::BPF_STATS_RUN_TIME) };
    // SAFETY: `fd` is a new, open descriptor owned by no one else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The counting programs' runs and time so far (timer samples and probe hits), as the kernel
/// timed them.
pub(crate) fn sampler_cost(skel: &ProfileSkel<'_>) -> Option<ProgramCost> {
    let progs = &skel.progs;
    let infos: Vec<_> = [
        &progs.on_sample,
        &progs.on_probe,
        &progs.on_tracepoint,
        &progs.on_switch,
        &progs.on_switch_raw,
        &progs.on_alloc,
        &progs.on_alloc_return,
    ]
    .into_iter()
    .filter(|p| p.autoload())
    .filter_map(prog_info)
    .collect();
    (!infos.is_empty()).then(|| ProgramCost {
        runs: infos.iter().map(|i| i.run_cnt).sum(),
        run_time_ns: infos.iter().map(|i| i.run_time_ns).sum(),
        verified_insns: Vec::new(),
    })
}

/// Runs of the off-CPU programs the kernel skipped because a BPF program already ran on that
/// CPU (its recursion guard).
pub(crate) fn switch_misses(skel: &ProfileSkel<'_>) -> u64 {
    [&skel.progs.on_switch, &skel.progs.on_switch_raw]
        .into_iter()
        .filter(|p| p.autoload())
        .filter_map(prog_info)
        .map(|info| info.recursion_misses)
        .sum()
}

/// The kernel's information on one loaded program.
fn prog_info(prog: &impl AsFd) -> Option<libbpf_sys::bpf_prog_info> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of_val(&info) as u32;
    // SAFETY: `info` is a zeroed bpf_prog_info of `len` bytes; the kernel fills it.
    let r = unsafe {
        libbpf_sys::bpf_prog_get_info_by_fd(prog.as_fd().as_raw_fd(), &mut info, &mut len)
    };
    (r == 0).then_some(info)
}

/// Attaches the tracepoint programs that follow processes (fork, exec, exit); the loader
/// uprobe is attached per dynamic loader as processes show them.
pub(crate) fn attach_tracepoints(skel: &mut ProfileSkel<'_>) -> Result<(), BpfError> {
    skel.attach()
        .map_err(|e| BpfError::bpf("attach the process-tracking tracepoints", e))
}

/// The sampling program's links to its cpu-clock events, one per CPU. A link owns its event:
/// dropping the link detaches the program and closes the event.
pub(crate) struct Sampling {
    links: Vec<Link>,
}

impl Sampling {
    /// Opens a cpu-clock event on each CPU and attaches the sampling program (which enables
    /// it).
    pub fn start(skel: &ProfileSkel<'_>, cpus: &[u32], rate: Rate) -> Result<Sampling, BpfError> {
        let attr = cpu_clock::attr(rate);
        let mut links = Vec::with_capacity(cpus.len());
        for &cpu in cpus {
            let fd = cpu_clock::open(&attr, -1, cpu as i32).map_err(|source| {
                BpfError::Sample(SampleError::Perf {
                    what: format!("CPU {cpu}"),
                    source,
                })
            })?;
            let link = skel
                .progs
                .on_sample
                .attach_perf_event(fd.as_raw_fd())
                .map_err(|e| BpfError::bpf(format!("attach the BPF program to CPU {cpu}"), e))?;
            // The link closes the event when it is dropped.
            let _ = fd.into_raw_fd();
            links.push(link);
        }
        Ok(Sampling { links })
    }

    /// No timer: the events are probes only.
    pub fn none() -> Sampling {
        Sampling { links: Vec::new() }
    }

    /// Attaches the off-CPU program to the scheduler's switch, when it was loaded.
    pub fn switches(&mut self, skel: &ProfileSkel<'_>) -> Result<(), BpfError> {
        for prog in [&skel.progs.on_switch, &skel.progs.on_switch_raw] {
            if prog.autoload() {
                let link = prog
                    .attach()
                    .map_err(|e| BpfError::bpf("attach to the scheduler's switch tracepoint", e))?;
                self.links.push(link);
            }
        }
        Ok(())
    }

    /// Stops sampling: the program is detached from every event.
    pub fn stop(&mut self) {
        self.links.clear();
    }
}

fn put_id(map: &dyn MapCore, id: u32, what: &str) -> Result<(), BpfError> {
    map.update(&id.to_ne_bytes(), &[1u8], MapFlags::ANY)
        .map_err(|e| BpfError::bpf(format!("add {what} {id} to the BPF filter"), e))
}

/// Adds pids or tids (FILTER_PIDS / FILTER_TIDS) to sample.
pub(crate) fn add_filter_id(skel: &ProfileSkel<'_>, id: u32) -> Result<(), BpfError> {
    put_id(&skel.maps.filter_ids, id, "id")
}

/// Adds a process whose exec, library loads and exit should be reported.
pub(crate) fn add_followed_process(skel: &ProfileSkel<'_>, pid: u32) -> Result<(), BpfError> {
    put_id(&skel.maps.filter_procs, pid, "process")
}

/// Every counted key, with its count.
pub(crate) fn counts(skel: &ProfileSkel<'_>) -> Vec<(CountKey, u64)> {
    let map = &skel.maps.counts;
    let mut out = Vec::new();
    for key in map.keys() {
        let Some(key_struct) = CountKey::from_bytes(&key) else {
            continue;
        };
        if let Ok(Some(value)) = map.lookup(&key, MapFlags::ANY) {
            if let Ok(bytes) = <[u8; 8]>::try_from(&value[..]) {
                out.push((key_struct, u64::from_ne_bytes(bytes)));
            }
        }
    }
    out
}

/// The threads still off the CPU: since when (bpf_ktime_get_ns) and the key their time goes
/// to.
pub(crate) fn still_blocked(skel: &ProfileSkel<'_>) -> Vec<(u64, CountKey)> {
    let map = &skel.maps.blocked;
    map.keys()
        .filter_map(|tid| map.lookup(&tid, MapFlags::ANY).ok()?)
        .filter_map(|value| {
            let since = u64::from_ne_bytes(value.get(..8)?.try_into().ok()?);
            Some((since, CountKey::from_bytes(&value[8..])?))
        })
        .collect()
}

/// A kernel stack, leaf first.
pub(crate) fn kernel_stack(skel: &ProfileSkel<'_>, id: i32) -> Option<Vec<u64>> {
    let value = skel
        .maps
        .stack_traces
        .lookup(&(id as u32).to_ne_bytes(), MapFlags::ANY)
        .ok()??;
    Some(layout::words(&value).take_while(|&a| a != 0).collect())
}

/// A user stack, leaf first, with how its walk ended.
pub(crate) fn user_stack(skel: &ProfileSkel<'_>, id: i64) -> Option<UserStack> {
    let map = if id & layout::DEEP_STACK_ID != 0 {
        &skel.maps.deep_stacks
    } else {
        &skel.maps.user_stacks
    };
    let value = map.lookup(&id.to_ne_bytes(), MapFlags::ANY).ok()??;
    UserStack::from_bytes(&value)
}

/// The per-CPU drop counters, summed: (count map full, user-stack map full).
pub(crate) fn drops(skel: &ProfileSkel<'_>) -> (u64, u64) {
    (
        drop_counter(skel, layout::DROP_COUNT_MAP_FULL),
        drop_counter(skel, layout::DROP_USER_STACK_FULL),
    )
}

/// One per-CPU drop counter, summed.
pub(crate) fn drop_counter(skel: &ProfileSkel<'_>, which: u32) -> u64 {
    skel.maps
        .drops
        .lookup_percpu(&which.to_ne_bytes(), MapFlags::ANY)
        .ok()
        .flatten()
        .map(|per_cpu| {
            per_cpu
                .iter()
                .filter_map(|v| v.get(..8)?.try_into().ok().map(u64::from_ne_bytes))
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Both switch programs load and count this thread's sleeps as time off the CPU: the BTF
    /// tracepoint, and the raw one it falls back to where the kernel's BTF lacks its type.
    /// Needs root.
    #[test]
    fn both_switch_programs_count_time_off_the_cpu() {
        for btf in [true, false] {
            let settings = Settings {
                filter: Filter::Tids,
                include_idle: false,
                user: true,
                kernel: true,
                pid_ns: crate::record::sampled::caller_pid_namespace(),
                hold_loads: false,
                stack_storage_size: 1024,
                hash_storage_size: 1024,
                table_files: 16,
                max_frames: 127,
                probes: false,
                tracepoints: false,
                off_cpu: Some(OffCpuHook {
                    event: 1,
                    min_block_ns: 0,
                    btf,
                }),
                alloc: None,
            };
            let mut storage = MaybeUninit::uninit();
            let skel = load(&mut storage, &settings).expect("the program loads");
            eprintln!(
                "btf {btf}: instructions verified: {:?}",
                verified_insns(&skel)
            );
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            add_filter_id(&skel, tid).expect("filter");
            let mut sampling = Sampling::none();
            sampling.switches(&skel).expect("attach");
            let started = Instant::now();
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(5));
            }
            let slept = started.elapsed().as_nanos() as u64;
            sampling.stop();
            let off: u64 = counts(&skel)
                .iter()
                .filter(|(key, _)| key.tid == tid && key.event == 1)
                .map(|(_, ns)| ns)
                .sum();
            // Twenty sleeps of 5 ms at least, within the time the loop took.
            assert!(
                (100_000_000..=slept).contains(&off),
                "btf {btf}: {off} ns off the CPU in {slept} ns of 20 sleeps of 5 ms"
            );
        }
    }
}
