//! A `BPF_F_MMAPABLE` array map written through shared memory: a million rows are a memcpy,
//! not a million syscalls.

use std::os::fd::AsRawFd;

use libbpf_rs::MapCore;

use super::TableError;

/// A `BPF_F_MMAPABLE` array map, mapped shared into our memory.
pub(super) struct MappedArray {
    ptr: *mut u8,
    bytes: usize,
    stride: usize,
    pub(super) len: u32,
}

// SAFETY: the mapping is owned by this value and only written through `&mut self`.
unsafe impl Send for MappedArray {}

impl MappedArray {
    pub(super) fn new(
        map: &dyn MapCore,
        name: &'static str,
        value_size: usize,
    ) -> Result<Self, TableError> {
        let len = map.max_entries();
        // Array elements are laid out 8-byte aligned.
        let stride = value_size.next_multiple_of(8);
        let page = 4096;
        let bytes = (len as usize * stride).next_multiple_of(page);
        // SAFETY: a shared mapping of the map's fd, of the size the kernel allocated for it;
        // checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(TableError::Mmap {
                map: name,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(MappedArray {
            ptr: ptr.cast(),
            bytes,
            stride,
            len,
        })
    }

    pub(super) fn write(&mut self, index: u32, value: &[u8]) {
        assert!(index < self.len && value.len() <= self.stride);
        // SAFETY: index is in bounds (checked above) and the value fits its slot.
        unsafe {
            std::ptr::copy_nonoverlapping(
                value.as_ptr(),
                self.ptr.add(index as usize * self.stride),
                value.len(),
            );
        }
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what new() mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}
