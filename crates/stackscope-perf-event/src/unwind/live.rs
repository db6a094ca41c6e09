//! The rest of a live thread's stack, read when the user allows it: a stack deeper than the
//! copy taken with the sample goes on in the thread's memory, and while the thread has not
//! returned past the end of the copy, what lies above it is what lay there when sampled.
//! That holds when the end of the copy, from the outermost frame the walk reached on, still
//! matches the thread's memory; the read is used only then.

use super::ProcessUnwinders;
use stackscope_stacks::arch::Regs;
use stackscope_stacks::walk::{Trail, WalkEnd};
use stackscope_stacks::AddressSpace;

/// Bytes at the end of the copy that must still match the thread's memory, at least: all of
/// the outermost frame the walk reached that the copy holds is checked.
const CHECKED: usize = 256;

/// The first read beyond the copy; each further one doubles, up to [`MOST`] in all.
const FIRST: usize = 64 << 10;
const MOST: usize = 8 << 20;

impl ProcessUnwinders {
    /// Unwinds a sample of the live process `pid` as [`ProcessUnwinders::unwind`] does, and
    /// when the copy `stack` runs out, again over the copy extended with the thread's stack
    /// memory above it, read now, for as long as the walk runs out and the memory goes on.
    /// `scratch` is left holding the extended copy, or empty when the copy was not extended.
    pub fn unwind_reading_on(
        &mut self,
        (pid, maps): (u32, &AddressSpace),
        regs: Regs,
        stack: &[u8],
        out: &mut Trail,
        scratch: &mut Vec<u8>,
    ) -> WalkEnd {
        scratch.clear();
        let mut end = self.unwind(pid, maps, regs, stack, out);
        if end != WalkEnd::Truncated || stack.len() < CHECKED {
            return end;
        }
        let within = out.clone();
        scratch.extend_from_slice(stack);
        // The outermost frame reached: the thread must not have left it since.
        let outermost = out.sps.last().map_or(0, |&sp| sp.saturating_sub(regs.sp));
        let mut checked = stack.len() - usize::try_from(outermost).unwrap_or(0).min(stack.len());
        let mut want = FIRST;
        while end == WalkEnd::Truncated && scratch.len() < MOST {
            let read = read_on(pid, regs.sp, scratch, (checked.max(CHECKED), want));
            checked = 0;
            if read == 0 {
                break;
            }
            end = self.unwind(pid, maps, regs, scratch, out);
            if read < want {
                break;
            }
            want *= 2;
        }
        if matches!(end, WalkEnd::Stopped { .. }) {
            // A walk that breaks off in memory read later most likely met a thread that had
            // moved on after all: the copy's own walk stands, and the outer frames are left
            // to the thread's other samples.
            *out = within;
            scratch.clear();
            return WalkEnd::Truncated;
        }
        end
    }
}

/// Appends to `stack`, the copy of thread memory from `sp` up, the next `want` bytes of
/// process `pid`'s memory, provided the copy's last `checked` bytes still match it.
/// Returns the bytes appended: fewer than `want` where the memory ends, 0 when the thread
/// has moved on or cannot be read.
fn read_on(pid: u32, sp: u64, stack: &mut Vec<u8>, (checked, want): (usize, usize)) -> usize {
    let have = stack.len();
    let checked = checked.min(have);
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return 0;
    };
    let mut buf = vec![0u8; checked + want];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: (sp as usize + have - checked) as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, which lives and is writable for the call; the remote
    // range is only read, in the other process, by the kernel, which checks it.
    let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    let Some(read) = usize::try_from(read).ok().filter(|&n| n > checked) else {
        return 0;
    };
    if buf[..checked] != stack[have - checked..] {
        return 0;
    }
    stack.extend_from_slice(&buf[checked..read]);
    read - checked
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
        assert_eq!(read_on(me, sp, &mut copy, (256, 8192)), 8192);
        assert_eq!(copy, memory[..4096 + 8192]);

        // The thread moved on: the end of the copy no longer matches.
        let mut stale = memory[..4096].to_vec();
        stale[4000] ^= 1;
        assert_eq!(read_on(me, sp, &mut stale, (256, 8192)), 0);
        assert_eq!(stale.len(), 4096);
    }
}
