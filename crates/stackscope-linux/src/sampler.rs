//! The sampler: opens software `cpu-clock` perf events for a [`Target`], one ring buffer per
//! CPU, and turns what the kernel writes into [`Event`]s — samples with their kernel callchain
//! and user registers/stack (or user callchain), plus the mmap, comm, fork and exit records
//! needed to know what each process had mapped.
//!
//! Per-thread events with `inherit` cannot be mapped with `cpu = -1`, so one event is opened
//! per (task, CPU) and all events of a CPU are redirected into that CPU's ring.
//!
//! Descendants of a launched command are tracked through the kernel's fork records (new
//! processes are added, exits of their main thread remove them) and, because records can be
//! lost, a process also counts as gone once `/proc` shows it missing or a zombie.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

pub use crate::error::SampleError;
pub use crate::event::{Event, SampleEvent, UserRegs};
use crate::maps::{Mapping, ProcessMaps};
use crate::perf::{self, EventSpec, Ring, SampleFormat};
use crate::target::{self, HeldChild, Target};

/// How user stacks are captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackMode {
    /// Copy `stack_bytes` of user stack + user regs (ip, sp, bp) per sample; kernel callchain
    /// from the kernel (exclude_callchain_user=1).
    Dwarf { stack_bytes: u32 },
    /// Kernel-provided callchain for both kernel and user (frame pointers), no stack copy.
    FramePointer,
}

/// How to sample.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Only this CPU (`-C`).
    pub cpu: Option<u32>,
    /// Samples per second per thread (`-F`). Exactly one of `frequency` and `period` is Some.
    pub frequency: Option<u64>,
    /// Nanoseconds of CPU time between samples (`-c`).
    pub period: Option<u64>,
    /// Capture user stacks (false under `-K`).
    pub user: bool,
    /// Capture kernel stacks (false under `-U`). Samples are taken in both modes either way;
    /// only the unwanted part of the stack is left out.
    pub kernel: bool,
    pub stack_mode: StackMode,
    /// Keep samples of the idle task (pid 0) (`-I`).
    pub include_idle: bool,
    /// Ring buffer data pages per CPU (rounded up to a power of two); 0 = a default that fits
    /// the stack mode.
    pub buffer_pages: usize,
}

/// Opens, then closes, a cpu-clock sampling event on this process (its kernel side too when
/// `kernel`), asking what recording asks: whether recording can start on this machine, and
/// the kernel's errno when it cannot.
pub fn probe_cpu_clock(kernel: bool) -> io::Result<()> {
    let spec = perf::EventSpec {
        frequency: Some(99),
        period: None,
        inherit: false,
        enable_on_exec: false,
        kernel_callchain: kernel,
        user_callchain: false,
        user_regs: true,
        stack_bytes: 8,
        exclude_kernel: !kernel,
        build_id: false,
        wakeup_bytes: 1,
    };
    perf::open(&spec.attr(), 0, -1).map(drop)
}

/// `kernel.NAME` from /proc/sys, when readable and a number.
pub fn read_sysctl(name: &str) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Command,
    Pids,
    Tids,
    System,
}

/// Pre-existing state read from `/proc`, delivered before any ring record.
enum Synthetic {
    Comm { pid: u32, tid: u32, comm: String },
    Mmap { pid: u32, mapping: Mapping },
}

/// A running perf_event sampling session for one target.
pub struct Sampler {
    kind: Kind,
    spec: EventSpec,
    format: SampleFormat,
    /// One ring per CPU, owned by the first event opened on that CPU.
    rings: Vec<(u32, Ring)>,
    /// Events whose records go to their CPU's ring.
    others: Vec<OwnedFd>,
    /// Raw fds of every event, with whether poll(2) has reported it hung up (task gone).
    polled: Vec<(i32, bool)>,
    /// Aligned copies of each ring's pending records.
    buffers: Vec<Vec<u64>>,
    /// (time, ring, offset) of every record of the current batch.
    order: Vec<(u64, u32, u32)>,
    child: Option<HeldChild>,
    /// Attached pids (Pids) or tids (Tids).
    watched: Vec<u32>,
    /// Processes forked by a launched command's tree that have not been seen exiting.
    descendants: HashSet<u32>,
    synthetic: Vec<Synthetic>,
    data_pages: usize,
    include_idle: bool,
    kernel_excluded: bool,
    started: bool,
}

/// A task to open events on: the pid argument of perf_event_open (-1 = every task).
#[derive(Debug, Clone, Copy)]
struct Task {
    tid: i32,
    /// The pid or tid the user named, for errors.
    named: u32,
}

impl Sampler {
    /// Opens the events (disabled) for the target. For Command, forks the child (stopped before
    /// exec, waiting on a pipe) and opens events with enable_on_exec; an exec failure is
    /// reported as a SampleError from `start`, not as a child exit code. A command that cannot
    /// be found in PATH is reported here already.
    pub fn open(target: &Target, config: &SamplerConfig) -> Result<Sampler, SampleError> {
        let spec = event_spec(target, config)?;
        let cpus = choose_cpus(config.cpu)?;
        let data_pages = match (config.buffer_pages, config.stack_mode) {
            (0, StackMode::Dwarf { stack_bytes }) if config.user => dwarf_ring_pages(
                config
                    .frequency
                    .or(config.period.map(|ns| 1_000_000_000 / ns.max(1))),
                stack_bytes,
            ),
            (0, _) => 128,
            (n, _) => n.next_power_of_two(),
        };
        let mut sampler = Sampler {
            kind: match target {
                Target::Command(_) => Kind::Command,
                Target::Pids(_) => Kind::Pids,
                Target::Tids(_) => Kind::Tids,
                Target::System => Kind::System,
            },
            format: spec.format(),
            spec: EventSpec {
                wakeup_bytes: (data_pages * perf::page_size() / 4) as u32,
                ..spec
            },
            rings: Vec::new(),
            others: Vec::new(),
            polled: Vec::new(),
            buffers: Vec::new(),
            order: Vec::new(),
            child: None,
            watched: Vec::new(),
            descendants: HashSet::new(),
            synthetic: Vec::new(),
            data_pages,
            include_idle: config.include_idle,
            kernel_excluded: false,
            started: false,
        };
        match target {
            Target::Command(argv) => {
                if let Some(path) = argv.first().and_then(|a| target::resolve_command(a).ok()) {
                    if let Some(why) = target::privileged_exec(&path) {
                        return Err(SampleError::PrivilegedExec {
                            command: path.display().to_string(),
                            why,
                        });
                    }
                }
                let child = HeldChild::spawn(argv)?;
                let task = Task {
                    tid: child.pid as i32,
                    named: child.pid,
                };
                sampler.child = Some(child);
                for &cpu in &cpus {
                    sampler.open_event(task, cpu)?;
                }
            }
            Target::Pids(pids) => {
                for &pid in pids {
                    // A thread id names its whole process, as with `perf record -p`.
                    let pid =
                        target::process_of(pid).map_err(|_| SampleError::NoSuchProcess(pid))?;
                    if !sampler.watched.contains(&pid) {
                        sampler.attach_process(pid, &cpus)?;
                        sampler.watched.push(pid);
                    }
                }
            }
            Target::Tids(tids) => {
                for &tid in tids {
                    target::process_of(tid).map_err(|_| SampleError::NoSuchThread(tid))?;
                    let task = Task {
                        tid: tid as i32,
                        named: tid,
                    };
                    for &cpu in &cpus {
                        sampler.open_event(task, cpu)?;
                    }
                }
                sampler.watched = tids.clone();
            }
            Target::System => {
                let task = Task { tid: -1, named: 0 };
                for &cpu in &cpus {
                    sampler.open_event(task, cpu)?;
                }
            }
        }
        sampler.buffers = vec![Vec::new(); sampler.rings.len()];
        Ok(sampler)
    }

    /// Opens events on every thread of `pid`. Threads started while we open are picked up by
    /// listing the threads again until no new one shows up; later ones are inherited.
    fn attach_process(&mut self, pid: u32, cpus: &[u32]) -> Result<(), SampleError> {
        let mut done: HashSet<u32> = HashSet::new();
        for _ in 0..8 {
            let tids = target::threads_of(pid).map_err(|_| SampleError::NoSuchProcess(pid))?;
            let new: Vec<u32> = tids.into_iter().filter(|t| !done.contains(t)).collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                done.insert(tid);
                let task = Task {
                    tid: tid as i32,
                    named: pid,
                };
                for &cpu in cpus {
                    match self.open_event(task, cpu) {
                        // The thread exited meanwhile; the process may live on.
                        Err(SampleError::NoSuchProcess(_)) if tid != pid => break,
                        r => r?,
                    }
                }
            }
        }
        Ok(())
    }

    /// Opens one event for `task` on `cpu` and attaches it to the CPU's ring (mapping the ring
    /// if it is the first event there). Falls back to user-only sampling when an unprivileged
    /// user may not sample the kernel, and to no build-ids on kernels that lack them.
    fn open_event(&mut self, task: Task, cpu: u32) -> Result<(), SampleError> {
        let fd = loop {
            match perf::open(&self.spec.attr(), task.tid, cpu as i32) {
                Ok(fd) => break fd,
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(0);
                    if (errno == libc::EACCES || errno == libc::EPERM)
                        && self.kind != Kind::System
                        && !self.spec.exclude_kernel
                        && euid() != 0
                    {
                        self.spec.exclude_kernel = true;
                        self.kernel_excluded = true;
                        continue;
                    }
                    if (errno == libc::EINVAL || errno == libc::E2BIG) && self.spec.build_id {
                        self.spec.build_id = false;
                        continue;
                    }
                    return Err(self.open_error(task, cpu, e));
                }
            }
        };
        self.polled.push((fd.as_raw_fd(), false));
        if let Some((_, ring)) = self.rings.iter().find(|(c, _)| *c == cpu) {
            perf::set_output(&fd, ring.fd().as_raw_fd()).map_err(|source| SampleError::Perf {
                what: format!(
                    "{} on CPU {cpu} (redirecting to the CPU's buffer)",
                    task_name(self.kind, task)
                ),
                source,
            })?;
            self.others.push(fd);
            return Ok(());
        }
        let mut fd = fd;
        loop {
            match Ring::map(fd, self.data_pages) {
                Ok(ring) => {
                    self.rings.push((cpu, ring));
                    return Ok(());
                }
                Err((back, source)) => {
                    let errno = source.raw_os_error();
                    // Locked-memory limits: retry smaller before giving up.
                    if matches!(errno, Some(libc::EPERM) | Some(libc::ENOMEM))
                        && self.data_pages > 1
                    {
                        self.data_pages /= 2;
                        fd = back;
                        continue;
                    }
                    return Err(SampleError::Mmap {
                        kib: (self.data_pages + 1) * perf::page_size() / 1024,
                        source,
                    });
                }
            }
        }
    }

    fn open_error(&self, task: Task, cpu: u32, source: io::Error) -> SampleError {
        match source.raw_os_error() {
            Some(libc::ESRCH) => match self.kind {
                Kind::Tids => SampleError::NoSuchThread(task.named),
                _ => SampleError::NoSuchProcess(task.named),
            },
            Some(libc::EACCES) | Some(libc::EPERM) => SampleError::PermissionDenied {
                what: task_name(self.kind, task),
                system: self.kind == Kind::System,
                paranoid: read_sysctl("perf_event_paranoid").map(|p| p as i32),
                euid: euid(),
            },
            _ => SampleError::Perf {
                what: format!("{} on CPU {cpu}", task_name(self.kind, task)),
                source,
            },
        }
    }

    /// Enables sampling (and lets a launched command exec). Synthesized Comm/Mmap events for
    /// pre-existing processes are delivered by the first `poll` call, before any sample.
    pub fn start(&mut self) -> Result<(), SampleError> {
        if self.started {
            return Ok(());
        }
        self.started = true;
        if let Some(child) = &mut self.child {
            // enable_on_exec turns the events on at exec.
            return child.release();
        }
        for (_, ring) in &self.rings {
            perf::enable(ring.fd()).map_err(|source| self.enable_error(source))?;
        }
        for fd in &self.others {
            perf::enable(fd).map_err(|source| self.enable_error(source))?;
        }
        // Read /proc only now that events are on, so a mapping made meanwhile is not missed
        // (one seen twice is harmless).
        self.synthesize();
        Ok(())
    }

    fn enable_error(&self, source: io::Error) -> SampleError {
        SampleError::Io {
            what: "cannot enable the perf events".into(),
            source,
        }
    }

    fn synthesize(&mut self) {
        let processes: Vec<(u32, Vec<u32>)> = match self.kind {
            Kind::Command => Vec::new(),
            Kind::Pids => self
                .watched
                .iter()
                .map(|&pid| (pid, target::threads_of(pid).unwrap_or_default()))
                .collect(),
            Kind::Tids => {
                let mut by_pid: Vec<(u32, Vec<u32>)> = Vec::new();
                for &tid in &self.watched {
                    let Ok(pid) = target::process_of(tid) else {
                        continue;
                    };
                    match by_pid.iter_mut().find(|(p, _)| *p == pid) {
                        Some((_, tids)) => tids.push(tid),
                        None => by_pid.push((pid, vec![tid])),
                    }
                }
                by_pid
            }
            Kind::System => target::all_pids()
                .unwrap_or_default()
                .into_iter()
                .map(|pid| (pid, target::threads_of(pid).unwrap_or_default()))
                .collect(),
        };
        for (pid, tids) in processes {
            for tid in tids {
                if let Some(comm) = target::thread_comm(pid, tid) {
                    self.synthetic.push(Synthetic::Comm { pid, tid, comm });
                }
            }
            // Unreadable maps (a process that just exited, or kernel threads) simply add nothing.
            if let Ok(maps) = ProcessMaps::from_proc(pid) {
                for mapping in maps.iter() {
                    self.synthetic.push(Synthetic::Mmap {
                        pid,
                        mapping: mapping.clone(),
                    });
                }
            }
        }
    }

    /// Waits up to `timeout` for data, then hands every pending event to `f`, in time order
    /// across CPUs within this batch. Never blocks past timeout; a signal ends the wait early.
    pub fn poll(
        &mut self,
        timeout: Duration,
        f: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), SampleError> {
        let mut timeout = timeout;
        if !self.synthetic.is_empty() {
            for s in self.synthetic.drain(..) {
                match s {
                    Synthetic::Comm { pid, tid, comm } => f(Event::Comm {
                        pid,
                        tid,
                        comm: &comm,
                        exec: false,
                    }),
                    Synthetic::Mmap { pid, mapping } => f(Event::Mmap {
                        pid,
                        tid: pid,
                        mapping,
                    }),
                }
            }
            timeout = Duration::ZERO;
        }
        self.wait(timeout)?;
        self.drain(f);
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), SampleError> {
        if timeout.is_zero() {
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = self
            .polled
            .iter()
            .filter(|(_, hung)| !hung)
            .map(|&(fd, _)| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            // Every task is gone: nothing will wake us, but do not let a caller spin.
            std::thread::sleep(timeout);
            return Ok(());
        }
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(SampleError::Io {
                what: "waiting for perf events (poll)".into(),
                source: e,
            });
        }
        for p in &fds {
            if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                if let Some(entry) = self.polled.iter_mut().find(|(fd, _)| *fd == p.fd) {
                    entry.1 = true;
                }
            }
        }
        Ok(())
    }

    /// Copies every ring's pending records, orders them by time and hands them out.
    fn drain(&mut self, f: &mut dyn FnMut(Event<'_>)) {
        self.order_records();
        let Sampler {
            buffers,
            order,
            format,
            descendants,
            include_idle,
            kind,
            ..
        } = self;
        for &(_, ring, at) in order.iter() {
            let words = &buffers[ring as usize];
            let at = at as usize;
            let Some(h) = perf::header(perf::words_as_bytes(words), at) else {
                continue;
            };
            let Some(event) = perf::parse(words, at, h, *format) else {
                continue;
            };
            match event {
                Event::Sample(s) if s.pid == 0 && !*include_idle => continue,
                Event::Fork { pid, ppid, .. } if *kind == Kind::Command && pid != ppid => {
                    descendants.insert(pid);
                }
                Event::Exit { pid, tid } if pid == tid => {
                    descendants.remove(&pid);
                }
                _ => {}
            }
            f(event);
        }
    }

    /// Copies every ring's pending records into its buffer and lists them by time.
    fn order_records(&mut self) {
        let order = &mut self.order;
        order.clear();
        for (i, (_, ring)) in self.rings.iter_mut().enumerate() {
            let len = ring.drain_into(&mut self.buffers[i]);
            let bytes = perf::words_as_bytes(&self.buffers[i]);
            let mut at = 0;
            while at + 8 <= len {
                let Some(h) = perf::header(bytes, at) else {
                    break;
                };
                if h.size < 8 || at + h.size > len {
                    break;
                }
                let time = perf::record_time(&bytes[at..at + h.size], h).unwrap_or(0);
                order.push((time, i as u32, at as u32));
                at += h.size;
            }
        }
        // Stable: records of one ring with equal times keep their order.
        order.sort_by_key(|&(time, _, _)| time);
    }

    /// True once the target is gone: the launched child exited (reaped, status kept) and all
    /// its descendants exited, or every attached pid/tid exited. Always false for System.
    pub fn target_finished(&mut self) -> bool {
        match self.kind {
            Kind::System => false,
            Kind::Pids | Kind::Tids => self.watched.iter().all(|&id| !target::is_alive(id)),
            Kind::Command => {
                let Some(child) = &mut self.child else {
                    return true;
                };
                if !child.wait(false) {
                    return false;
                }
                descendants_gone(&self.rings, &mut self.descendants)
            }
        }
    }

    /// Ends a launched command still running when recording stops (see [`HeldChild::end`]),
    /// waiting for its descendants too, as `target_finished` does.
    pub fn end_child(&mut self, interrupted: bool) {
        let Sampler {
            child,
            rings,
            descendants,
            ..
        } = self;
        if let Some(child) = child {
            child.end(interrupted, |child| {
                child.wait(false) && descendants_gone(rings, descendants)
            });
        }
    }

    /// Disables the events; a final `poll` with zero timeout then drains what is left.
    pub fn stop(&mut self) {
        for (_, ring) in &self.rings {
            perf::disable(ring.fd());
        }
        for fd in &self.others {
            perf::disable(fd);
        }
    }

    /// The launched command's exit status, once it has exited (waitpid result).
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.child.as_ref()?.status.map(ExitStatus::from_raw)
    }

    /// Pid of the launched child.
    pub fn child_pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.pid)
    }

    /// Forwards a signal to the launched child (e.g. on Ctrl-C if it did not get it).
    pub fn kill_child(&self, signal: i32) {
        if let Some(child) = &self.child {
            child.kill(signal);
        }
    }

    /// True when the kernel refused kernel-mode sampling (unprivileged user) and only user
    /// mode is sampled: time spent in the kernel is then missing from the profile.
    pub fn kernel_excluded(&self) -> bool {
        self.kernel_excluded
    }

    /// Data pages per CPU ring actually mapped (smaller than asked when memory limits forced it).
    pub fn buffer_pages(&self) -> usize {
        self.data_pages
    }
}

/// True once every known descendant of a launched command has exited.
fn descendants_gone(rings: &[(u32, Ring)], descendants: &mut HashSet<u32>) -> bool {
    // Fork records still in the rings may name descendants we do not know yet.
    if rings.iter().any(|(_, r)| r.has_data()) {
        return false;
    }
    descendants.retain(|&pid| target::is_alive(pid));
    descendants.is_empty()
}

fn task_name(kind: Kind, task: Task) -> String {
    match kind {
        Kind::System => "all processes".into(),
        Kind::Tids => format!("tid {}", task.named),
        Kind::Command => format!("the launched command (pid {})", task.named),
        Kind::Pids => format!("pid {}", task.named),
    }
}

/// Default ring size per CPU with stack copies: an eighth of a second of one CPU's samples at
/// `frequency` (each about `stack_bytes` long), so that a recorder kept off the CPU for a
/// while by a busy system loses nothing; at least 2 MiB, at most 8 MiB (4 KiB pages).
fn dwarf_ring_pages(frequency: Option<u64>, stack_bytes: u32) -> usize {
    const SAMPLE_HEADER_BYTES: u64 = 256;
    let per_second = frequency
        .unwrap_or(99)
        .saturating_mul(u64::from(stack_bytes) + SAMPLE_HEADER_BYTES);
    let pages = usize::try_from(per_second / 8 / 4096).unwrap_or(usize::MAX);
    pages.clamp(512, 2048).next_power_of_two()
}

fn choose_cpus(only: Option<u32>) -> Result<Vec<u32>, SampleError> {
    let online = target::online_cpus().map_err(|source| SampleError::Io {
        what: "cannot read the online CPUs from /sys/devices/system/cpu/online".into(),
        source,
    })?;
    match only {
        None => Ok(online),
        Some(cpu) if online.contains(&cpu) => Ok(vec![cpu]),
        Some(cpu) => Err(SampleError::InvalidCpu {
            cpu,
            online: std::fs::read_to_string("/sys/devices/system/cpu/online")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
        }),
    }
}

fn event_spec(target: &Target, config: &SamplerConfig) -> Result<EventSpec, SampleError> {
    match (config.frequency, config.period) {
        (Some(_), Some(_)) => {
            return Err(SampleError::InvalidConfig(
                "both a frequency (-F) and a period (-c) were given; use one".into(),
            ))
        }
        (Some(0), _) => {
            return Err(SampleError::InvalidConfig(
                "the sampling frequency must be at least 1 Hz".into(),
            ))
        }
        (_, Some(0)) => {
            return Err(SampleError::InvalidConfig(
                "the sampling period must be at least 1 ns".into(),
            ))
        }
        (Some(hz), None) => {
            if let Some(max) = read_sysctl("perf_event_max_sample_rate") {
                if max > 0 && hz > max as u64 {
                    return Err(SampleError::FrequencyTooHigh {
                        requested: hz,
                        max: max as u64,
                    });
                }
            }
        }
        _ => {}
    }
    let (user_regs, stack_bytes, user_callchain) = match config.stack_mode {
        StackMode::Dwarf { stack_bytes } => (
            config.user,
            stack_bytes
                .div_ceil(8)
                .saturating_mul(8)
                .min(perf::MAX_STACK_BYTES),
            false,
        ),
        StackMode::FramePointer => (false, 0, config.user),
    };
    let launching = matches!(target, Target::Command(_));
    Ok(EventSpec {
        frequency: config.frequency,
        period: config.period,
        inherit: matches!(target, Target::Command(_) | Target::Pids(_)),
        enable_on_exec: launching,
        kernel_callchain: config.kernel,
        user_callchain,
        user_regs,
        stack_bytes,
        exclude_kernel: false,
        build_id: true,
        wakeup_bytes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_can_move_to_another_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Sampler>();
    }
}
