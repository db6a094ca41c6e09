//! The kernel side of sampling: what this source adds to the software `cpu-clock` event's
//! `perf_event_attr` (opened by `stackscope_process::cpu_clock`, shared with the eBPF source),
//! its ioctls, mapping and draining the per-CPU ring buffers, and how the records our attr
//! asks for are laid out (for the one decoder, `crate::decode`).
//!
//! Records are copied out of the ring into one buffer before decoding, so a record that wraps
//! around the end of the ring reads like any other.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use byteorder::NativeEndian;
use linux_perf_data::linux_perf_event_reader::{Endianness, PerfEventAttr, RecordParseInfo};
use perf_event_open_sys as sys;
use stackscope_process::cpu_clock::{self, Rate};
use stackscope_stacks::arch::Arch;
use sys::bindings as b;

mod regs;
mod ring;

pub(crate) use regs::{arch_of_mask, by_number, running_arch};
pub(crate) use ring::{record_at, Ring};

/// What every event we open asks the kernel for. All events of one sampler share it, so all
/// records in all rings have the same layout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventRequest {
    pub rate: Rate,
    /// Follow new threads and children of the task the event is opened on.
    pub inherit: bool,
    /// Start counting when the task calls exec (for a launched command).
    pub enable_on_exec: bool,
    /// Ask for the kernel part of the callchain.
    pub kernel_callchain: bool,
    /// Ask for the user part of the callchain (frame-pointer mode).
    pub user_callchain: bool,
    /// Copy the user registers a walk starts from, of this architecture (the running
    /// kernel's), and `stack_bytes` of user stack (DWARF mode); 0 = no stack copy.
    pub user_regs: Option<Arch>,
    pub stack_bytes: u32,
    /// Do not sample while the CPU is in kernel mode (unprivileged fallback).
    pub exclude_kernel: bool,
    /// Ask for GNU build-ids in mmap records (Linux 5.12+).
    pub build_id: bool,
    /// Wake a poller once this many bytes are waiting in the ring.
    pub wakeup_bytes: u32,
}

/// Largest `sample_stack_user` the kernel accepts: below 64 KiB and a multiple of 8.
pub(crate) const MAX_STACK_BYTES: u32 = 65528;

impl EventRequest {
    fn sample_type(&self) -> u64 {
        let mut t = b::PERF_SAMPLE_IP
            | b::PERF_SAMPLE_TID
            | b::PERF_SAMPLE_TIME
            | b::PERF_SAMPLE_CPU
            | b::PERF_SAMPLE_PERIOD
            | b::PERF_SAMPLE_CALLCHAIN;
        if self.user_regs.is_some() {
            t |= b::PERF_SAMPLE_REGS_USER;
            if self.stack_bytes > 0 {
                t |= b::PERF_SAMPLE_STACK_USER;
            }
        }
        t as u64
    }

    /// How records produced with this spec are laid out, read from the attr the kernel is
    /// given, so the decoder reads what the kernel writes.
    pub fn record_layout(&self) -> io::Result<RecordParseInfo> {
        let attr = self.attr();
        // SAFETY: perf_event_attr is plain integers without padding; its bytes are what the
        // kernel reads too.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                std::ptr::addr_of!(attr).cast::<u8>(),
                std::mem::size_of::<b::perf_event_attr>(),
            )
        };
        let (attr, _) = PerfEventAttr::parse::<_, NativeEndian>(bytes)?;
        Ok(RecordParseInfo::new(&attr, Endianness::NATIVE))
    }

    pub fn attr(&self) -> b::perf_event_attr {
        let mut attr = cpu_clock::attr(self.rate);
        attr.sample_type = self.sample_type();
        attr.set_inherit(self.inherit as u64);
        attr.set_enable_on_exec(self.enable_on_exec as u64);
        attr.set_exclude_kernel(self.exclude_kernel as u64);
        attr.set_exclude_hv(1);
        attr.set_exclude_callchain_kernel((!self.kernel_callchain || self.exclude_kernel) as u64);
        attr.set_exclude_callchain_user((!self.user_callchain) as u64);
        attr.set_mmap(1);
        attr.set_mmap2(1);
        attr.set_comm(1);
        attr.set_comm_exec(1);
        attr.set_task(1);
        attr.set_sample_id_all(1);
        attr.set_build_id(self.build_id as u64);
        // Times on the clock the eBPF program reads, so a handover between the two sources
        // falls between two samples.
        attr.set_use_clockid(1);
        attr.clockid = libc::CLOCK_MONOTONIC;
        attr.set_watermark(1);
        attr.__bindgen_anon_2.wakeup_watermark = self.wakeup_bytes.max(1);
        if let Some(arch) = self.user_regs {
            attr.sample_regs_user = regs::mask(arch);
            attr.sample_stack_user = self.stack_bytes;
        }
        attr
    }
}

/// Sends the records of `fd` into the ring buffer mapped on `ring_fd` (same CPU).
pub(crate) fn set_output(fd: &OwnedFd, ring_fd: RawFd) -> io::Result<()> {
    // SAFETY: plain ioctl on descriptors we own.
    if unsafe { sys::ioctls::SET_OUTPUT(fd.as_raw_fd(), ring_fd) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn enable(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: plain ioctl on a descriptor we own; it also applies to inherited child events.
    if unsafe { sys::ioctls::ENABLE(fd.as_raw_fd(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn disable(fd: &OwnedFd) {
    // SAFETY: as in `enable`. Failure only means the event is already gone.
    unsafe { sys::ioctls::DISABLE(fd.as_raw_fd(), 0) };
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}
