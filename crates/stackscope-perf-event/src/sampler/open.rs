//! Opening a sampler: the event settings a configuration asks for, the CPUs to sample, and
//! one event per (task, CPU) redirected into that CPU's ring, with the fallbacks an
//! unprivileged user or an older kernel needs.

use std::collections::HashSet;
use std::io;
use std::os::fd::AsRawFd;

use linux_perf_data::linux_perf_event_reader::RecordParseInfo;

use super::{Kind, Sampler, SamplerConfig, StackMode};
use crate::decode::Decoder;
use crate::perf::{self, EventRequest, Ring};
use stackscope_process::cpu_clock::{self, Rate};
use stackscope_process::kernel::{choose_cpus, read_sysctl};
use stackscope_process::target::{self, HeldChild, Target};
use stackscope_process::SampleError;

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
        let layout = spec.record_layout().map_err(|source| SampleError::Io {
            what: "cannot read back the perf_event_attr the sampler asks for".into(),
            source,
        })?;
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
        let mut sampler = Sampler::new(target, config, spec, layout, data_pages);
        sampler.attach(target, &cpus)?;
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
            match cpu_clock::open(&self.spec.attr(), task.tid, cpu as i32) {
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

    fn new(
        target: &Target,
        config: &SamplerConfig,
        spec: EventRequest,
        layout: RecordParseInfo,
        data_pages: usize,
    ) -> Self {
        Sampler {
            kind: match target {
                Target::Command(_) => Kind::Command,
                Target::Pids(_) => Kind::Pids,
                Target::Tids(_) => Kind::Tids,
                Target::System => Kind::System,
            },
            layout,
            decoder: Decoder::new(spec.user_regs),
            spec: EventRequest {
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
        }
    }

    /// Opens the events of every task the target names, on every CPU in `cpus`.
    fn attach(&mut self, target: &Target, cpus: &[u32]) -> Result<(), SampleError> {
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
                self.child = Some(child);
                for &cpu in cpus {
                    self.open_event(task, cpu)?;
                }
            }
            Target::Pids(pids) => {
                for &pid in pids {
                    // A thread id names its whole process, as with `perf record -p`.
                    let pid =
                        target::process_of(pid).map_err(|_| SampleError::NoSuchProcess(pid))?;
                    if !self.watched.contains(&pid) {
                        self.attach_process(pid, cpus)?;
                        self.watched.push(pid);
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
                    for &cpu in cpus {
                        self.open_event(task, cpu)?;
                    }
                }
                self.watched = tids.clone();
            }
            Target::System => {
                let task = Task { tid: -1, named: 0 };
                for &cpu in cpus {
                    self.open_event(task, cpu)?;
                }
            }
        }
        Ok(())
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
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

fn event_spec(target: &Target, config: &SamplerConfig) -> Result<EventRequest, SampleError> {
    let rate = match (config.frequency, config.period) {
        (Some(_), Some(_)) => {
            return Err(SampleError::InvalidConfig(
                "both a frequency and a period were given; give one".into(),
            ))
        }
        (Some(hz), None) => Rate::Frequency(hz),
        (None, Some(ns)) => Rate::Period(ns),
        (None, None) => Rate::Frequency(99),
    }
    .check()?;
    let (user_regs, stack_bytes, user_callchain) = match config.stack_mode {
        StackMode::Dwarf { stack_bytes } => (
            config.user.then(perf::running_arch).flatten(),
            stack_bytes
                .div_ceil(8)
                .saturating_mul(8)
                .min(perf::MAX_STACK_BYTES),
            false,
        ),
        StackMode::FramePointer => (None, 0, config.user),
    };
    let launching = matches!(target, Target::Command(_));
    Ok(EventRequest {
        rate,
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
