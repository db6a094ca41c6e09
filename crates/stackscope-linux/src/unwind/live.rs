//! The rest of a live thread's stack, read when the user allows it: a stack deeper than the
//! copy taken with the sample goes on in the thread's memory, and while the thread has not
//! returned past the end of the copy, what lies above it is what lay there when sampled.
//! That holds when the end of the copy still matches the thread's memory; the read is used
//! only then.

use super::{UnwindEnd, Unwinder, UserRegs};
use crate::maps::ProcessMaps;
use stackscope_stacks::walk::Trail;

/// Bytes at the end of the copy that must still match the thread's memory.
const CHECKED: usize = 256;

/// The first read beyond the copy; each further one doubles, up to [`MOST`] in all.
const FIRST: usize = 64 << 10;
const MOST: usize = 8 << 20;

impl Unwinder {
    /// Unwinds a sample of the live process `pid` as [`Unwinder::unwind`] does, and when the
    /// copy `stack` runs out, again over the copy extended with the thread's stack memory
    /// above it, read now, for as long as the walk runs out and the memory goes on. `scratch`
    /// is left holding the extended copy, or empty when the copy was not extended.
    pub fn unwind_reading_on(
        &mut self,
        (pid, maps): (u32, &ProcessMaps),
        regs: UserRegs,
        stack: &[u8],
        out: &mut Trail,
        scratch: &mut Vec<u8>,
    ) -> UnwindEnd {
        scratch.clear();
        let mut end = self.unwind(pid, maps, regs, stack, out);
        if end != UnwindEnd::Truncated || stack.len() < CHECKED {
            return end;
        }
        scratch.extend_from_slice(stack);
        let mut want = FIRST;
        while end == UnwindEnd::Truncated && scratch.len() < MOST {
            let read = read_on(pid, regs.sp, scratch, want);
            if read == 0 {
                break;
            }
            end = self.unwind(pid, maps, regs, scratch, out);
            if read < want {
                break;
            }
            want *= 2;
        }
        end
    }
}

/// Appends to `stack`, the copy of thread memory from `sp` up, the next `want` bytes of
/// process `pid`'s memory, provided the copy's last [`CHECKED`] bytes still match it.
/// Returns the bytes appended: fewer than `want` where the memory ends, 0 when the thread
/// has moved on or cannot be read.
fn read_on(pid: u32, sp: u64, stack: &mut Vec<u8>, want: usize) -> usize {
    let have = stack.len();
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return 0;
    };
    let mut buf = vec![0u8; CHECKED + want];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: (sp as usize + have - CHECKED) as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, which lives and is writable for the call; the remote
    // range is only read, in the other process, by the kernel, which checks it.
    let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    let Some(read) = usize::try_from(read).ok().filter(|&n| n > CHECKED) else {
        return 0;
    };
    if buf[..CHECKED] != stack[have - CHECKED..] {
        return 0;
    }
    stack.extend_from_slice(&buf[CHECKED..read]);
    read - CHECKED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_beyond_a_copy_is_read_only_while_the_copy_still_matches() {
        let memory: Vec<u8> = (0..1 << 16).map(|i| (i % 251) as u8).collect();
        let sp = memory.as_ptr() as u64;
        let me = std::process::id();
        let mut copy = memory[..4096].to_vec();
        assert_eq!(read_on(me, sp, &mut copy, 8192), 8192);
        assert_eq!(copy, memory[..4096 + 8192]);

        // The thread moved on: the end of the copy no longer matches.
        let mut stale = memory[..4096].to_vec();
        stale[4000] ^= 1;
        assert_eq!(read_on(me, sp, &mut stale, 8192), 0);
        assert_eq!(stale.len(), 4096);
    }
}
