//! The sampler: opens software `cpu-clock` perf events for a [`Target`](crate::target::Target), one ring buffer per
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
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use linux_perf_data::linux_perf_event_reader::RecordParseInfo;

use crate::decode::{self, Decoder};
pub use crate::event::{Event, SampleEvent};
use crate::perf::{self, EventRequest, Ring};
use stackscope_process::cpu_clock::{self, Rate};
use stackscope_process::target::{self, HeldChild};
use stackscope_process::SampleError;

mod open;
mod synthetic;

use synthetic::Synthetic;

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
    /// Only this CPU.
    pub cpu: Option<u32>,
    /// Samples per second per thread. Exactly one of `frequency` and `period` is Some.
    pub frequency: Option<u64>,
    /// Nanoseconds of CPU time between samples.
    pub period: Option<u64>,
    /// Capture user stacks.
    pub user: bool,
    /// Capture kernel stacks. Samples are taken in both modes either way;
    /// only the unwanted part of the stack is left out.
    pub kernel: bool,
    pub stack_mode: StackMode,
    /// Keep samples of the idle task (pid 0).
    pub include_idle: bool,
    /// Ring buffer data pages per CPU (rounded up to a power of two); 0 = a default that fits
    /// the stack mode.
    pub buffer_pages: usize,
}

/// Opens, then closes, a cpu-clock sampling event on this process (its kernel side too when
/// `kernel`), asking what recording asks: whether recording can start on this machine, and
/// the kernel's errno when it cannot.
pub fn probe_cpu_clock(kernel: bool) -> io::Result<()> {
    let spec = perf::EventRequest {
        rate: Rate::Frequency(99),
        inherit: false,
        enable_on_exec: false,
        kernel_callchain: kernel,
        user_callchain: false,
        user_regs: perf::running_arch(),
        stack_bytes: 8,
        exclude_kernel: !kernel,
        build_id: false,
        wakeup_bytes: 1,
    };
    cpu_clock::open(&spec.attr(), 0, -1).map(drop)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Command,
    Pids,
    Tids,
    System,
}

/// A running perf_event sampling session for one target.
pub struct Sampler {
    kind: Kind,
    spec: EventRequest,
    /// How the records in every ring are laid out (all events share the spec's).
    layout: RecordParseInfo,
    decoder: Decoder,
    /// One ring per CPU, owned by the first event opened on that CPU.
    rings: Vec<(u32, Ring)>,
    /// Events whose records go to their CPU's ring.
    others: Vec<OwnedFd>,
    /// Raw fds of every event, with whether poll(2) has reported it hung up (task gone).
    polled: Vec<(i32, bool)>,
    /// Copies of each ring's pending records.
    buffers: Vec<Vec<u8>>,
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

impl Sampler {
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
            layout,
            decoder,
            descendants,
            include_idle,
            kind,
            ..
        } = self;
        for &(_, ring, at) in order.iter() {
            let Some((record, _)) = perf::record_at(&buffers[ring as usize], at as usize, *layout)
            else {
                continue;
            };
            // A record that cannot be decoded is skipped: the ring holds nothing else of it.
            let Ok(parsed) = decode::parse(&record) else {
                continue;
            };
            let Some(event) = decoder.event(&parsed) else {
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
            ring.drain_into(&mut self.buffers[i]);
            let mut at = 0;
            while let Some((record, size)) = perf::record_at(&self.buffers[i], at, self.layout) {
                order.push((record.timestamp().unwrap_or(0), i as u32, at as u32));
                at += size;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_can_move_to_another_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Sampler>();
    }
}
