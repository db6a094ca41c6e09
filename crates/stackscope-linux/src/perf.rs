//! The kernel side of sampling: building the `perf_event_attr` for the software `cpu-clock`
//! event, `perf_event_open` and its ioctls, mapping and draining the per-CPU ring buffers, and
//! decoding the records that our attr asks for.
//!
//! Records are copied out of the ring into an 8-byte aligned buffer before decoding, so a
//! record that wraps around the end of the ring reads like any other and callchains can be
//! handed out as `&[u64]` without copying them again.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};

use perf_event_open_sys as sys;
use sys::bindings as b;

/// What every event we open asks the kernel for. All events of one sampler share it, so all
/// records in all rings have the same layout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventSpec {
    pub frequency: Option<u64>,
    pub period: Option<u64>,
    /// Follow new threads and children of the task the event is opened on.
    pub inherit: bool,
    /// Start counting when the task calls exec (for a launched command).
    pub enable_on_exec: bool,
    /// Ask for the kernel part of the callchain.
    pub kernel_callchain: bool,
    /// Ask for the user part of the callchain (frame-pointer mode).
    pub user_callchain: bool,
    /// Copy user registers and this many bytes of user stack (DWARF mode); 0 = no stack copy.
    pub user_regs: bool,
    pub stack_bytes: u32,
    /// Do not sample while the CPU is in kernel mode (unprivileged fallback).
    pub exclude_kernel: bool,
    /// Ask for GNU build-ids in mmap records (Linux 5.12+).
    pub build_id: bool,
    /// Wake a poller once this many bytes are waiting in the ring.
    pub wakeup_bytes: u32,
}

/// Registers copied per sample, in the bit order the kernel writes them: frame pointer, stack
/// pointer, instruction pointer.
#[cfg(target_arch = "x86_64")]
const USER_REGS_MASK: u64 =
    (1 << b::PERF_REG_X86_BP) | (1 << b::PERF_REG_X86_SP) | (1 << b::PERF_REG_X86_IP);
/// x29 (frame pointer), sp, pc.
#[cfg(target_arch = "aarch64")]
const USER_REGS_MASK: u64 = (1 << 29) | (1 << 31) | (1 << 32);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const USER_REGS_MASK: u64 = 0;

/// Largest `sample_stack_user` the kernel accepts: below 64 KiB and a multiple of 8.
pub(crate) const MAX_STACK_BYTES: u32 = 65528;

impl EventSpec {
    fn sample_type(&self) -> u64 {
        let mut t = b::PERF_SAMPLE_IP
            | b::PERF_SAMPLE_TID
            | b::PERF_SAMPLE_TIME
            | b::PERF_SAMPLE_CPU
            | b::PERF_SAMPLE_PERIOD
            | b::PERF_SAMPLE_CALLCHAIN;
        if self.user_regs && USER_REGS_MASK != 0 {
            t |= b::PERF_SAMPLE_REGS_USER;
            if self.stack_bytes > 0 {
                t |= b::PERF_SAMPLE_STACK_USER;
            }
        }
        t as u64
    }

    /// How records produced with this spec are laid out.
    pub fn format(&self) -> SampleFormat {
        let t = self.sample_type();
        SampleFormat {
            regs: if t & b::PERF_SAMPLE_REGS_USER as u64 != 0 {
                USER_REGS_MASK.count_ones() as usize
            } else {
                0
            },
            stack: t & b::PERF_SAMPLE_STACK_USER as u64 != 0,
        }
    }

    pub fn attr(&self) -> b::perf_event_attr {
        let mut attr = b::perf_event_attr {
            type_: b::PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<b::perf_event_attr>() as u32,
            config: b::PERF_COUNT_SW_CPU_CLOCK as u64,
            sample_type: self.sample_type(),
            ..Default::default()
        };
        match (self.frequency, self.period) {
            (Some(hz), _) => {
                attr.__bindgen_anon_1.sample_freq = hz;
                attr.set_freq(1);
            }
            (None, Some(ns)) => attr.__bindgen_anon_1.sample_period = ns,
            (None, None) => {
                attr.__bindgen_anon_1.sample_freq = 99;
                attr.set_freq(1);
            }
        }
        attr.set_disabled(1);
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
        attr.set_watermark(1);
        attr.__bindgen_anon_2.wakeup_watermark = self.wakeup_bytes.max(1);
        if self.user_regs {
            attr.sample_regs_user = USER_REGS_MASK;
            attr.sample_stack_user = self.stack_bytes;
        }
        attr
    }
}

/// `perf_event_open(attr, pid, cpu, -1, CLOEXEC)`.
pub(crate) fn open(attr: &b::perf_event_attr, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    let mut attr = *attr;
    // SAFETY: `attr` is a fully initialised perf_event_attr whose `size` matches its type.
    let fd = unsafe {
        sys::perf_event_open(
            &mut attr,
            pid,
            cpu,
            -1,
            b::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just handed us this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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

/// One mmap'd perf ring buffer: a control page followed by `2^n` data pages.
pub(crate) struct Ring {
    fd: OwnedFd,
    base: *mut u8,
    map_len: usize,
    data_offset: usize,
    data_size: usize,
}

// SAFETY: the mapping is only touched through `&mut self` (or read-only atomics through `&self`),
// and the kernel side is designed for concurrent access through head/tail.
unsafe impl Send for Ring {}

impl Ring {
    /// Maps `data_pages` (a power of two) data pages for the event `fd`. On failure the
    /// descriptor is handed back so the caller can retry with fewer pages.
    pub fn map(fd: OwnedFd, data_pages: usize) -> Result<Ring, (OwnedFd, io::Error)> {
        let page = page_size();
        let map_len = (data_pages + 1) * page;
        // SAFETY: mapping a perf event descriptor; the kernel validates the length.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err((fd, io::Error::last_os_error()));
        }
        let base = base as *mut u8;
        // SAFETY: the first page of the mapping is the kernel's perf_event_mmap_page.
        let (off, size) = unsafe {
            let meta = base as *const b::perf_event_mmap_page;
            (
                std::ptr::read_volatile(std::ptr::addr_of!((*meta).data_offset)),
                std::ptr::read_volatile(std::ptr::addr_of!((*meta).data_size)),
            )
        };
        // Kernels before 4.1 leave these zero; the data then starts right after the first page.
        let (data_offset, data_size) = if size == 0 {
            (page, data_pages * page)
        } else {
            (off as usize, size as usize)
        };
        Ok(Ring {
            fd,
            base,
            map_len,
            data_offset,
            data_size,
        })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn head(&self) -> &AtomicU64 {
        // SAFETY: data_head is an aligned u64 in the control page, written by the kernel.
        unsafe {
            let meta = self.base as *const b::perf_event_mmap_page;
            &*(std::ptr::addr_of!((*meta).data_head) as *const AtomicU64)
        }
    }

    fn tail(&self) -> &AtomicU64 {
        // SAFETY: data_tail is an aligned u64 in the control page, written by us.
        unsafe {
            let meta = self.base as *const b::perf_event_mmap_page;
            &*(std::ptr::addr_of!((*meta).data_tail) as *const AtomicU64)
        }
    }

    /// True when records are waiting to be read.
    pub fn has_data(&self) -> bool {
        self.head().load(Ordering::Acquire) != self.tail().load(Ordering::Relaxed)
    }

    /// Copies every waiting record to `out` (replacing its contents), then gives the space back
    /// to the kernel. Returns the number of bytes copied; `out` holds them as aligned words.
    pub fn drain_into(&mut self, out: &mut Vec<u64>) -> usize {
        let head = self.head().load(Ordering::Acquire);
        let tail = self.tail().load(Ordering::Relaxed);
        // The kernel never writes past our tail, so this is at most the ring size; clamp anyway
        // so a corrupt control page cannot make us read out of bounds.
        let len = (head.wrapping_sub(tail) as usize).min(self.data_size);
        out.clear();
        out.resize(len.div_ceil(8), 0);
        let dst = words_as_bytes_mut(out);
        let start = (tail as usize) % self.data_size;
        let first = len.min(self.data_size - start);
        // SAFETY: both ranges lie inside the data area of the mapping and `dst` holds `len` bytes.
        unsafe {
            let data = self.base.add(self.data_offset);
            std::ptr::copy_nonoverlapping(data.add(start), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(data, dst.as_mut_ptr().add(first), len - first);
        }
        // Our reads of the data must complete before the kernel may overwrite it.
        fence(Ordering::SeqCst);
        self.tail()
            .store(tail.wrapping_add(len as u64), Ordering::Release);
        len
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
    }
}

pub(crate) fn words_as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u8 has no alignment or validity requirements.
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 8) }
}

fn words_as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: as above; the borrow is unique.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, words.len() * 8) }
}

/// The optional parts of our sample records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SampleFormat {
    /// Number of user registers per sample (0: none requested).
    pub regs: usize,
    /// Whether a user stack copy follows the registers.
    pub stack: bool,
}

/// Size of the `sample_id_all` trailer of non-sample records: pid/tid, time, cpu/reserved.
const ID_TRAILER: usize = 24;

/// A record header: type, misc, size (in bytes, including the header).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub kind: u32,
    pub misc: u16,
    pub size: usize,
}

pub(crate) fn header(bytes: &[u8], at: usize) -> Option<Header> {
    let h = bytes.get(at..at + 8)?;
    Some(Header {
        kind: u32::from_ne_bytes(h[0..4].try_into().ok()?),
        misc: u16::from_ne_bytes(h[4..6].try_into().ok()?),
        size: u16::from_ne_bytes(h[6..8].try_into().ok()?) as usize,
    })
}

/// Time stamp of a record (every record carries one: samples in the body, the rest in the
/// `sample_id_all` trailer).
pub(crate) fn record_time(rec: &[u8], h: Header) -> Option<u64> {
    let at = if h.kind == b::PERF_RECORD_SAMPLE {
        8 + 8 + 8 // header, ip, pid/tid
    } else {
        rec.len().checked_sub(ID_TRAILER)? + 8
    };
    Some(u64::from_ne_bytes(rec.get(at..at + 8)?.try_into().ok()?))
}

/// A decoded record. Borrowed slices point into the aligned copy of the ring.
#[derive(Debug)]
pub(crate) enum Record<'a> {
    Sample(RawSample<'a>),
    Mmap {
        pid: u32,
        tid: u32,
        start: u64,
        len: u64,
        pgoff: u64,
        exec: bool,
        build_id: Option<&'a [u8]>,
        path: &'a [u8],
    },
    Comm {
        pid: u32,
        tid: u32,
        comm: &'a [u8],
        exec: bool,
    },
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
    },
    Exit {
        pid: u32,
        tid: u32,
    },
    Lost {
        count: u64,
    },
    /// Throttling and other records we do not use.
    Other,
}

#[derive(Debug)]
pub(crate) struct RawSample<'a> {
    pub misc: u16,
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub cpu: u32,
    pub period: u64,
    /// The callchain as the kernel wrote it, with PERF_CONTEXT_* markers.
    pub callchain: &'a [u64],
    /// Registers in `USER_REGS_MASK` bit order; None when the kernel had no user registers.
    pub regs: Option<&'a [u64]>,
    pub stack: &'a [u8],
}

/// Reads a record at an 8-aligned offset of an aligned buffer.
struct Cursor<'a> {
    words: &'a [u64],
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn u64(&mut self) -> Option<u64> {
        let v = u64::from_ne_bytes(self.bytes.get(self.pos..self.pos + 8)?.try_into().ok()?);
        self.pos += 8;
        Some(v)
    }

    fn u32_pair(&mut self) -> Option<(u32, u32)> {
        let s = self.bytes.get(self.pos..self.pos + 8)?;
        self.pos += 8;
        Some((
            u32::from_ne_bytes(s[0..4].try_into().ok()?),
            u32::from_ne_bytes(s[4..8].try_into().ok()?),
        ))
    }

    fn words(&mut self, n: usize) -> Option<&'a [u64]> {
        debug_assert_eq!(self.pos % 8, 0);
        let w = self
            .words
            .get(self.pos / 8..(self.pos / 8).checked_add(n)?)?;
        self.pos += n * 8;
        Some(w)
    }

    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    /// A NUL-terminated string padded to 8 bytes, ending before the sample_id trailer.
    fn c_string(&mut self, end: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..end)?;
        let n = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        self.pos = end;
        Some(&s[..n])
    }
}

/// Decodes the record at byte `at` of `words` (which must start 8-aligned). None when the
/// record is cut short or malformed.
pub(crate) fn parse(words: &[u64], at: usize, h: Header, fmt: SampleFormat) -> Option<Record<'_>> {
    if !at.is_multiple_of(8) || h.size < 8 {
        return None;
    }
    let all = words_as_bytes(words);
    let end = at.checked_add(h.size)?;
    let rec_words = words.get(at / 8..end.div_ceil(8))?;
    let rec_bytes = all.get(at..end)?;
    let mut c = Cursor {
        words: rec_words,
        bytes: rec_bytes,
        pos: 8,
    };
    let trailer = h.size.checked_sub(ID_TRAILER);
    Some(match h.kind {
        b::PERF_RECORD_SAMPLE => {
            let _ip = c.u64()?;
            let (pid, tid) = c.u32_pair()?;
            let time = c.u64()?;
            let (cpu, _) = c.u32_pair()?;
            let period = c.u64()?;
            let nr = c.u64()? as usize;
            let callchain = c.words(nr)?;
            let mut regs = None;
            if fmt.regs > 0 {
                let abi = c.u64()?;
                if abi != b::PERF_SAMPLE_REGS_ABI_NONE as u64 {
                    regs = Some(c.words(fmt.regs)?);
                }
            }
            let mut stack: &[u8] = &[];
            if fmt.stack {
                let size = c.u64()? as usize;
                if size > 0 {
                    let data = c.bytes(size)?;
                    let dyn_size = c.u64()? as usize;
                    stack = &data[..dyn_size.min(size)];
                }
            }
            Record::Sample(RawSample {
                misc: h.misc,
                pid,
                tid,
                time,
                cpu,
                period,
                callchain,
                regs,
                stack,
            })
        }
        b::PERF_RECORD_MMAP2 | b::PERF_RECORD_MMAP => {
            let (pid, tid) = c.u32_pair()?;
            let start = c.u64()?;
            let len = c.u64()?;
            let pgoff = c.u64()?;
            let mut exec = h.misc as u32 & b::PERF_RECORD_MISC_MMAP_DATA == 0;
            let mut build_id = None;
            if h.kind == b::PERF_RECORD_MMAP2 {
                let ids = c.bytes(24)?;
                if h.misc as u32 & b::PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
                    let n = (ids[0] as usize).min(20);
                    build_id = Some(&ids[4..4 + n]);
                }
                let (prot, _flags) = c.u32_pair()?;
                exec = prot & libc::PROT_EXEC as u32 != 0;
            }
            let path = c.c_string(trailer?)?;
            Record::Mmap {
                pid,
                tid,
                start,
                len,
                pgoff,
                exec,
                build_id,
                path,
            }
        }
        b::PERF_RECORD_COMM => {
            let (pid, tid) = c.u32_pair()?;
            let comm = c.c_string(trailer?)?;
            Record::Comm {
                pid,
                tid,
                comm,
                exec: h.misc as u32 & b::PERF_RECORD_MISC_COMM_EXEC != 0,
            }
        }
        b::PERF_RECORD_FORK | b::PERF_RECORD_EXIT => {
            let (pid, ppid) = c.u32_pair()?;
            let (tid, ptid) = c.u32_pair()?;
            if h.kind == b::PERF_RECORD_FORK {
                Record::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                }
            } else {
                Record::Exit { pid, tid }
            }
        }
        b::PERF_RECORD_LOST => {
            let _id = c.u64()?;
            Record::Lost { count: c.u64()? }
        }
        _ => Record::Other,
    })
}

/// Splits a kernel callchain into its kernel and user parts, markers removed.
pub(crate) fn split_callchain(chain: &[u64]) -> (&[u64], &[u64]) {
    let mut kernel: &[u64] = &[];
    let mut user: &[u64] = &[];
    let mut i = 0;
    while i < chain.len() {
        let context = chain[i];
        if context < b::PERF_CONTEXT_MAX {
            // Entries before any marker: not produced by our kernels; skip them.
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut end = start;
        while end < chain.len() && chain[end] < b::PERF_CONTEXT_MAX {
            end += 1;
        }
        if context == b::PERF_CONTEXT_KERNEL {
            kernel = &chain[start..end];
        } else if context == b::PERF_CONTEXT_USER {
            user = &chain[start..end];
        }
        i = end;
    }
    (kernel, user)
}

pub(crate) fn misc_is_user(misc: u16) -> bool {
    misc as u32 & b::PERF_RECORD_MISC_CPUMODE_MASK == b::PERF_RECORD_MISC_USER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callchain_split_drops_markers() {
        let k = b::PERF_CONTEXT_KERNEL;
        let u = b::PERF_CONTEXT_USER;
        let chain = [
            k,
            0xffff_ffff_8100_0000,
            0xffff_ffff_8100_0010,
            u,
            0x401000,
            0x401100,
        ];
        let (kernel, user) = split_callchain(&chain);
        assert_eq!(kernel, &[0xffff_ffff_8100_0000, 0xffff_ffff_8100_0010]);
        assert_eq!(user, &[0x401000, 0x401100]);
        let only_user = [u, 0x401000];
        let (kernel, user) = split_callchain(&only_user);
        assert!(kernel.is_empty());
        assert_eq!(user, &[0x401000]);
        assert_eq!(split_callchain(&[]), (&[][..], &[][..]));
    }

    /// Builds a comm record the way the kernel lays it out.
    fn comm_record(pid: u32, tid: u32, name: &[u8], time: u64) -> Vec<u64> {
        let mut bytes = Vec::new();
        let name_len = (name.len() + 1).div_ceil(8) * 8;
        let size = 8 + 8 + name_len + ID_TRAILER;
        bytes.extend_from_slice(&b::PERF_RECORD_COMM.to_ne_bytes());
        bytes.extend_from_slice(&(b::PERF_RECORD_MISC_COMM_EXEC as u16).to_ne_bytes());
        bytes.extend_from_slice(&(size as u16).to_ne_bytes());
        bytes.extend_from_slice(&pid.to_ne_bytes());
        bytes.extend_from_slice(&tid.to_ne_bytes());
        bytes.extend_from_slice(name);
        bytes.resize(16 + name_len, 0);
        bytes.extend_from_slice(&pid.to_ne_bytes());
        bytes.extend_from_slice(&tid.to_ne_bytes());
        bytes.extend_from_slice(&time.to_ne_bytes());
        bytes.extend_from_slice(&[0; 8]);
        bytes
            .chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn parses_comm_record_and_its_trailer_time() {
        let words = comm_record(42, 43, b"busy-loop", 123_456);
        let bytes = words_as_bytes(&words);
        let h = header(bytes, 0).unwrap();
        assert_eq!(h.size, bytes.len());
        assert_eq!(record_time(bytes, h), Some(123_456));
        let fmt = SampleFormat {
            regs: 0,
            stack: false,
        };
        match parse(&words, 0, h, fmt).unwrap() {
            Record::Comm {
                pid,
                tid,
                comm,
                exec,
            } => {
                assert_eq!((pid, tid, comm, exec), (42, 43, &b"busy-loop"[..], true));
            }
            other => panic!("not a comm record: {other:?}"),
        }
    }

    #[test]
    fn truncated_record_is_rejected() {
        let words = comm_record(1, 1, b"x", 5);
        let bytes = words_as_bytes(&words);
        let h = header(bytes, 0).unwrap();
        let fmt = SampleFormat {
            regs: 0,
            stack: false,
        };
        assert!(parse(&words[..2], 0, h, fmt).is_none());
    }
}
