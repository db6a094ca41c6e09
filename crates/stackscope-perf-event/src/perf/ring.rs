//! One per-CPU perf ring buffer: mapping it, copying out what the kernel wrote, and finding
//! the records in that copy.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};

use linux_perf_data::linux_perf_event_reader::{
    RawData, RawEventRecord, RecordParseInfo, RecordType,
};

use super::{b, page_size};

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
    /// to the kernel.
    pub fn drain_into(&mut self, out: &mut Vec<u8>) {
        let head = self.head().load(Ordering::Acquire);
        let tail = self.tail().load(Ordering::Relaxed);
        // The kernel never writes past our tail, so this is at most the ring size; clamp anyway
        // so a corrupt control page cannot make us read out of bounds.
        let len = (head.wrapping_sub(tail) as usize).min(self.data_size);
        out.clear();
        out.resize(len, 0);
        let dst = out.as_mut_slice();
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
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
    }
}

/// The record at byte `at` of a drained copy, laid out as `layout` says, and its size in
/// bytes. None past the last whole record, or at a header too damaged to frame one.
pub(crate) fn record_at(
    copy: &[u8],
    at: usize,
    layout: RecordParseInfo,
) -> Option<(RawEventRecord<'_>, usize)> {
    let header = copy.get(at..at.checked_add(8)?)?;
    let kind = u32::from_ne_bytes(header[0..4].try_into().ok()?);
    let misc = u16::from_ne_bytes(header[4..6].try_into().ok()?);
    let size = usize::from(u16::from_ne_bytes(header[6..8].try_into().ok()?));
    let body = copy.get(at + 8..at.checked_add(size)?)?;
    let record = RawEventRecord::new(RecordType(kind), misc, RawData::Single(body), layout);
    Some((record, size))
}
